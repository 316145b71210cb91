/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pollthreads: thread-per-connection ping-pong where every read waits in poll() first, as
 * MariaDB's client and server do.  The server forks a client process; each side runs THREADS
 * threads, one connection each, ROUNDS round trips of 1 byte.  Every poll has a 5 s limit: a
 * wake-up taken by another thread of the process shows as a poll that times out.  Prints the
 * same lines over kernel TCP and under memlan when nothing is lost.
 *
 * usage: pollthreads PORT [THREADS [ROUNDS [select]]]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int rounds = 2000, use_select;
static _Atomic int failures;

/* Wait until fd is readable: poll (or select), 5 s at most.  0 when readable. */
static int wait_in(int fd)
{
    if (use_select && fd < FD_SETSIZE) {
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(fd, &rs);
        struct timeval tv = {5, 0};
        int r = select(fd + 1, &rs, NULL, NULL, &tv);
        return r == 1 && FD_ISSET(fd, &rs) ? 0 : -1;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 5000);
    return r == 1 && (p.revents & POLLIN) ? 0 : -1;
}

struct arg {
    int fd, id, client;
};

static void *pingpong(void *p)
{
    struct arg *a = p;
    char b = (char)a->id;
    for (int i = 0; i < rounds; i++) {
        if (a->client && send(a->fd, &b, 1, 0) != 1)
            goto fail;
        if (wait_in(a->fd) < 0 || recv(a->fd, &b, 1, 0) != 1 || b != (char)a->id)
            goto fail;
        if (!a->client && send(a->fd, &b, 1, 0) != 1)
            goto fail;
    }
    return NULL;
fail:
    fprintf(stderr, "%s thread %d: round trip failed: %s\n", a->client ? "client" : "server",
            a->id, strerror(errno));
    failures++;
    return NULL;
}

static int run(int *fds, int n, int client)
{
    pthread_t t[64];
    struct arg a[64];
    for (int i = 0; i < n; i++) {
        a[i] = (struct arg){.fd = fds[i], .id = i + 1, .client = client};
        pthread_create(&t[i], NULL, pingpong, &a[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    return failures;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]);
    int n = argc > 2 ? atoi(argv[2]) : 8;
    rounds = argc > 3 ? atoi(argv[3]) : 2000;
    use_select = argc > 4 && strcmp(argv[4], "select") == 0;
    if (n < 1 || n > 64)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    alarm(120); /* a hang is a failure, not a stuck test */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 64) < 0) {
        perror("listen");
        return 1;
    }
    int fds[64];
    pid_t pid = fork();
    if (pid == 0) {
        close(l);
        for (int i = 0; i < n; i++) {
            fds[i] = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(fds[i], (struct sockaddr *)&sa, sizeof sa) < 0) {
                perror("connect");
                _exit(1);
            }
        }
        _exit(run(fds, n, 1) ? 1 : 0);
    }
    for (int i = 0; i < n; i++)
        if ((fds[i] = accept(l, NULL, NULL)) < 0) {
            perror("accept");
            return 1;
        }
    int bad = run(fds, n, 0);
    int st;
    waitpid(pid, &st, 0);
    printf("server: %d threads, %d round trips each, %s\n", n, rounds, bad ? "FAILED" : "all answered");
    printf("client: %s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "all answered" : "FAILED");
    return bad || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
