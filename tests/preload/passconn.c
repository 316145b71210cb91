/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * passconn PORT [N]: an acceptor that hands each accepted connection to another process over
 * SCM_RIGHTS and closes its own copy, as Node.js's cluster module does by default on Linux (its
 * primary accepts and sends each connection to a worker, round robin) and as pre-fork servers
 * with an accepting parent do.  The worker (a fork child) reads "ping I\n" from the connection and
 * answers "pong I\n"; a client (another fork child) makes N connections one after another and
 * prints one line each: "connection I ok" or "connection I failed (why)".  Every wait is bounded
 * (5 s per connection).  Exits 0 when it ran to the end, whatever the connections did.
 */
#include "fdpass.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int readline_tmo(int fd, char *buf, size_t cap, int ms)
{
    size_t n = 0;
    while (n + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, ms);
        if (r == 0)
            return -ETIMEDOUT;
        if (r < 0)
            return -errno;
        ssize_t k = read(fd, buf + n, 1);
        if (k == 0)
            return -EPIPE; /* end of stream before the line */
        if (k < 0)
            return -errno;
        if (buf[n++] == '\n')
            break;
    }
    buf[n] = 0;
    return (int)n;
}

static void worker(int sp)
{
    for (;;) {
        int fd = fdpass_recv(sp, 0);
        if (fd < 0)
            _exit(0); /* the acceptor closed its end: done */
        char line[64], out[64];
        if (readline_tmo(fd, line, sizeof line, 5000) > 0) {
            int i = -1;
            if (sscanf(line, "ping %d", &i) == 1) {
                int k = snprintf(out, sizeof out, "pong %d\n", i);
                (void)!write(fd, out, (size_t)k);
            }
        }
        close(fd);
    }
}

static void client(int port, int n)
{
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
            printf("connection %d failed (connect: %s)\n", i, strerror(errno));
            close(fd);
            continue;
        }
        char req[32], line[64], want[32];
        int k = snprintf(req, sizeof req, "ping %d\n", i);
        snprintf(want, sizeof want, "pong %d\n", i);
        if (write(fd, req, (size_t)k) != k) {
            printf("connection %d failed (write: %s)\n", i, strerror(errno));
            close(fd);
            continue;
        }
        int r = readline_tmo(fd, line, sizeof line, 5000);
        if (r < 0)
            printf("connection %d failed (%s)\n", i,
                   r == -ETIMEDOUT ? "no answer within 5 s" : r == -EPIPE ? "end of stream" : strerror(-r));
        else if (strcmp(line, want) != 0)
            printf("connection %d failed (wrong answer)\n", i);
        else
            printf("connection %d ok\n", i);
        fflush(stdout);
        close(fd);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]), n = argc > 2 ? atoi(argv[2]) : 6;
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 64) < 0) {
        perror("listen");
        return 1;
    }
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
        return 1;
    pid_t w = fork();
    if (w == 0) {
        close(l);
        close(sp[0]);
        worker(sp[1]);
    }
    close(sp[1]);
    pid_t c = fork();
    if (c == 0) {
        close(l);
        close(sp[0]);
        client(port, n);
        _exit(0);
    }
    for (int i = 0; i < n; i++) {
        struct pollfd p = {l, POLLIN, 0};
        if (poll(&p, 1, 10000) != 1)
            break; /* the client gave up */
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            break;
        if (fdpass_send(sp[0], fd) < 0)
            printf("acceptor: sendmsg failed: %s\n", strerror(errno));
        close(fd);
    }
    int st;
    waitpid(c, &st, 0);
    close(sp[0]);
    waitpid(w, &st, 0);
    printf("done\n");
    return 0;
}
