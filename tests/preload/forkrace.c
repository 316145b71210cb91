/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkrace: fork() racing with connect, accept and close in other threads (issue 19: 14).  Two
 * threads make short connections to ourselves (connect, accept, a request and its echo, close
 * in either order) while the main thread forks children that use none of them and exit.  Every
 * echo must be right, every connection must end with EOF at the other end (a holders count left
 * wrong by a socket installed during fork's count would leave one waiting), and nothing may
 * hang.  Bounded: 300 forks and 100 connections, or 10 s; an alarm at 30 s.
 *
 * usage: forkrace PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int lfd, port;
static atomic_bool stop;
static atomic_int conns, bad;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *acceptor(void *a)
{
    (void)a;
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0)
            continue;
        char b[8];
        ssize_t r = recv(c, b, sizeof b, MSG_WAITALL);
        if (r == 0 && atomic_load(&stop)) { /* the last connection, which says nothing */
            close(c);
            return NULL;
        }
        if (r == (ssize_t)sizeof b)
            send(c, b, sizeof b, MSG_NOSIGNAL);
        else
            atomic_fetch_add(&bad, 1);
        /* The client closes first on odd rounds: we must read its EOF. */
        struct timeval tv = {3, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (r == (ssize_t)sizeof b && recv(c, b, 1, 0) != 0)
            atomic_fetch_add(&bad, 1);
        close(c);
    }
    return NULL;
}

static void *connector(void *a)
{
    (void)a;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; !atomic_load(&stop); i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&sa, sizeof sa) < 0) {
            atomic_fetch_add(&bad, 1);
            close(c);
            continue;
        }
        char b[16], e[8];
        snprintf(b, sizeof b, "%07d", i % 10000000); /* 7 digits and the NUL: 8 bytes */
        if (send(c, b, sizeof e, MSG_NOSIGNAL) != (ssize_t)sizeof e ||
            recv(c, e, sizeof e, MSG_WAITALL) != (ssize_t)sizeof e || memcmp(b, e, sizeof e))
            atomic_fetch_add(&bad, 1);
        close(c);
        atomic_fetch_add(&conns, 1);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    port = atoi(argv[1]);
    alarm(30);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 64) < 0) {
        perror("listen");
        return 1;
    }
    pthread_t ta, tc;
    pthread_create(&ta, NULL, acceptor, NULL);
    pthread_create(&tc, NULL, connector, NULL);
    /* Until both sides did enough to have raced (connections are slower while forks go on
     * back to back: each fork holds installs for its duration), or 10 s. */
    double end = now() + 10;
    int forks = 0, failed = 0;
    for (; (forks < 300 || atomic_load(&conns) < 100) && now() < end; forks++) {
        pid_t p = fork();
        if (p == 0)
            exit(0); /* exit handlers run: the child gives back what it held */
        if (p < 0 || waitpid(p, NULL, 0) != p)
            failed++;
    }
    atomic_store(&stop, true);
    pthread_join(tc, NULL);
    /* Wake the acceptor with one last connection that says nothing. */
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&sa, sizeof sa) == 0)
        close(c);
    pthread_join(ta, NULL);
    printf("forks %s, connections %s, bad %d, failed forks %d\n", forks > 20 ? "many" : "few",
           atomic_load(&conns) > 20 ? "many" : "few", atomic_load(&bad), failed);
    return 0;
}
