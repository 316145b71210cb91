/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * passconn PORT [N [MODE [BATCH]]]: an acceptor that hands each accepted connection to another
 * process over SCM_RIGHTS and closes its own copy, as Node.js's cluster module does by default on
 * Linux (its primary accepts and sends each connection to a worker, round robin) and as pre-fork
 * servers with an accepting parent do.  The worker (a fork child) reads "ping I\n" from the
 * connection and answers "pong I\n"; a client (another fork child) makes N connections, BATCH at
 * a time (default 1: one after another), and prints one line each: "connection I ok" or
 * "connection I failed (why)".  Every wait is bounded (5 s per connection).  Exits 0 when it ran
 * to the end, whatever the connections did.
 *
 * MODE, the worker's first call on a connection it received: "poll" (default: poll, then one-byte
 * reads), "read" (a blocking read), "epoll" (epoll_ctl ADD, epoll_wait, then reads), "fionread"
 * (ioctl FIONREAD until bytes are there, then reads), "thread" (two
 * threads: one in a blocking read while the other polls), "keep" (as poll, the acceptor keeping
 * its copy open until the end), "sandbox" (as poll, the worker under a seccomp filter that kills
 * no call of ours but is a filter: memlan may not take a connection up there).
 */
#include "fdpass.h"
#include "twoends.h"
#include "seccompkill.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <stdbool.h>
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

static const char *mode = "poll";

/* Read a line with a blocking read first (the worker's first call on the connection). */
static int readline_blocking(int fd, char *buf, size_t cap)
{
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t k = read(fd, buf, cap - 1);
    if (k <= 0)
        return k == 0 ? -EPIPE : -errno;
    buf[k] = 0;
    if (!strchr(buf, '\n')) {
        int r = readline_tmo(fd, buf + k, cap - (size_t)k, 5000);
        if (r < 0)
            return r;
    }
    return (int)strlen(buf);
}

static int readline_epoll(int fd, char *buf, size_t cap)
{
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd}, out;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        return -errno;
    int r = epoll_wait(ep, &out, 1, 5000);
    close(ep);
    if (r == 0)
        return -ETIMEDOUT;
    return r < 0 ? -errno : readline_tmo(fd, buf, cap, 5000);
}

struct polling {
    int fd;
    int r;
};

static void *poll_thread(void *arg)
{
    struct polling *p = arg;
    struct pollfd pf = {p->fd, POLLIN, 0};
    p->r = poll(&pf, 1, 5000);
    return NULL;
}


static void worker(int sp)
{
    if (!strcmp(mode, "sandbox") && seccomp_kill_for(__NR_kexec_load))
        _exit(3);
    for (;;) {
        int fd = fdpass_recv(sp, 0);
        if (fd < 0)
            _exit(0); /* the acceptor closed its end: done */
        char line[64], out[64];
        int got;
        if (!strcmp(mode, "thread")) {
            got = 0;
        } else if (!strcmp(mode, "fionread")) { /* how much is there, asked until some is */
            int avail = 0;
            for (int t = 0; t < 5000 && (ioctl(fd, FIONREAD, &avail) < 0 || avail <= 0); t++)
                usleep(1000);
            got = avail > 0 ? readline_tmo(fd, line, sizeof line, 5000) : -ETIMEDOUT;
        } else if (!strcmp(mode, "read")) {
            got = readline_blocking(fd, line, sizeof line);
        } else if (!strcmp(mode, "epoll")) {
            got = readline_epoll(fd, line, sizeof line);
        } else {
            got = readline_tmo(fd, line, sizeof line, 5000);
        }
        pthread_t t;
        struct polling p = {fd, -1};
        bool threads = !strcmp(mode, "thread");
        if (threads) { /* the first calls: a poll in one thread, a blocking read in another */
            pthread_create(&t, NULL, poll_thread, &p);
            got = readline_blocking(fd, line, sizeof line);
        }
        if (got > 0) {
            int i = -1;
            if (sscanf(line, "ping %d", &i) == 1) {
                int k = snprintf(out, sizeof out, "pong %d\n", i);
                (void)!write(fd, out, (size_t)k);
            }
        }
        if (threads)
            pthread_join(t, NULL); /* the poll saw the line, or waits for the client's end */
        close(fd);
    }
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static void client(int port, int n, int batch)
{
    for (int i0 = 0; i0 < n; i0 += batch) {
        int fds[64], m = n - i0 < batch ? n - i0 : batch;
        for (int j = 0; j < m; j++) { /* connected and asked, then all answers awaited */
            int i = i0 + j;
            char req[32];
            int k = snprintf(req, sizeof req, "ping %d\n", i);
            fds[j] = dial(port);
            if (fds[j] < 0)
                printf("connection %d failed (connect: %s)\n", i, strerror(errno));
            else if (write(fds[j], req, (size_t)k) != k)
                printf("connection %d failed (write: %s)\n", i, strerror(errno));
        }
        for (int j = 0; j < m; j++) {
            int i = i0 + j, fd = fds[j];
            if (fd < 0)
                continue;
            char line[64], want[32];
            snprintf(want, sizeof want, "pong %d\n", i);
            int r = readline_tmo(fd, line, sizeof line, 5000);
            if (r < 0)
                printf("connection %d failed (%s)\n", i,
                       r == -ETIMEDOUT ? "no answer within 5 s"
                       : r == -EPIPE   ? "end of stream"
                                       : strerror(-r));
            else if (strcmp(line, want) != 0)
                printf("connection %d failed (wrong answer)\n", i);
            else
                printf("connection %d ok\n", i);
            fflush(stdout);
            close(fd);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]), n = argc > 2 ? atoi(argv[2]) : 6;
    int batch = argc > 4 ? atoi(argv[4]) : 1;
    if (argc > 3)
        mode = argv[3];
    if (batch < 1 || batch > 64)
        batch = 1;
    bool keep = !strcmp(mode, "keep");
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_backlog(port, 64, &a); /* twoends.h */
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
        client(port, n, batch);
        _exit(0);
    }
    int kept[64], nkept = 0;
    for (int i = 0; i < n; i++) {
        struct pollfd p = {l, POLLIN, 0};
        if (poll(&p, 1, 10000) != 1)
            break; /* the client gave up */
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            break;
        if (fdpass_send(sp[0], fd) < 0)
            printf("acceptor: sendmsg failed: %s\n", strerror(errno));
        if (keep && nkept < 64)
            kept[nkept++] = fd;
        else
            close(fd);
    }
    int st;
    waitpid(c, &st, 0);
    for (int i = 0; i < nkept; i++)
        close(kept[i]);
    close(sp[0]);
    waitpid(w, &st, 0);
    printf("done\n");
    return 0;
}
