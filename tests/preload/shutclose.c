/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * shutclose: shutdown() while another thread reads the same connection, and that thread, woken
 * by the shutdown's end of stream, closes the fd at once and opens a new connection, which the
 * kernel gives the same number (Boost.Asio's shutdown posted to one io thread while another
 * has a read pending, then the next connection).  Over kernel TCP every shutdown returns 0 and
 * every new connection echoes: the kernel's shutdown acts on the socket's file, which a close
 * by another thread does not take from it.  Under memlan the shutdown woke the reader through
 * the ring first and called the kernel's shutdown by the number afterwards: it failed with
 * EBADF or ENOTCONN, or shut down the new connection, whose send then failed with EPIPE or
 * whose read ended at once.  Prints, for each of SHUT_RD, SHUT_WR and SHUT_RDWR, how many
 * shutdowns returned 0 and how many new connections echoed.  Run once over kernel TCP and once
 * under `memlan run`: the two outputs must be equal (tests/py/test_preload.py).
 *
 * usage: shutclose PORT [ROUNDS]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in sa;
static int cfd, echoed;

static int conn(void)
{
    int f = socket(AF_INET, SOCK_STREAM, 0);
    if (f < 0 || connect(f, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("connect");
        exit(3);
    }
    struct timeval tv = {5, 0}; /* a shut-down echo must not hang the test */
    setsockopt(f, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return f;
}

/* The reader: its recv ends (our SHUT_RD's end, or the server's FIN after our SHUT_WR), then
 * close, a new connection at once, one echo on it. */
static void *reader(void *arg)
{
    (void)arg;
    char b[16];
    int fd = cfd;
    ssize_t n = recv(fd, b, sizeof b, 0);
    if (n != 0)
        fprintf(stderr, "recv %zd (%s)\n", n, strerror(errno));
    close(fd);
    int nf = conn();
    ssize_t w = send(nf, "ping", 4, MSG_NOSIGNAL);
    ssize_t r = w == 4 ? recv(nf, b, 4, MSG_WAITALL) : -1;
    if (w == 4 && r == 4 && memcmp(b, "ping", 4) == 0)
        echoed++;
    close(nf);
    return NULL;
}

/* The server (a fork child): a thread per connection echoes until the end. */
static void *echo(void *arg)
{
    int c = (int)(long)arg;
    char b[4096];
    ssize_t n;
    while ((n = recv(c, b, sizeof b, 0)) > 0)
        if (send(c, b, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    close(c);
    return NULL;
}

static void serve(int l)
{
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            continue;
        pthread_t t;
        if (pthread_create(&t, NULL, echo, (void *)(long)c) == 0)
            pthread_detach(t);
        else
            close(c);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int rounds = argc > 2 ? atoi(argv[2]) : 150;
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)atoi(argv[1]));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(l, 64) != 0) {
        perror("listen");
        return 2;
    }
    pid_t srv = fork();
    if (srv == 0)
        serve(l);
    close(l);
    static const struct {
        const char *name;
        int how;
    } hows[] = {{"SHUT_RD", SHUT_RD}, {"SHUT_WR", SHUT_WR}, {"SHUT_RDWR", SHUT_RDWR}};
    for (unsigned k = 0; k < sizeof hows / sizeof hows[0]; k++) {
        int ok = 0;
        echoed = 0;
        for (int i = 0; i < rounds; i++) {
            cfd = conn();
            pthread_t t;
            pthread_create(&t, NULL, reader, NULL);
            usleep(2000); /* the reader is in its recv */
            if (shutdown(cfd, hows[k].how) == 0)
                ok++;
            else
                fprintf(stderr, "%s: shutdown: %s\n", hows[k].name, strerror(errno));
            pthread_join(t, NULL);
        }
        printf("%s: %d of %d shutdowns returned 0, %d new connections echoed\n", hows[k].name,
               ok, rounds, echoed);
    }
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    return 0;
}
