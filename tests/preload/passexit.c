/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * passexit PORT MODE: a client hands its connection to another process over SCM_RIGHTS and
 * then ends, as pgbouncer's online restart (`pgbouncer -R`) does: the new process takes every
 * client and server connection from the old one (SHOW FDS), and the old one exits.  MODE says
 * how the server waits and how the passer ends: "epoll", "poll" or "read" (the server's wait),
 * each with exit(); "epoll-close" (the passer closes its copy, then exits); "epoll-_exit" and
 * "poll-_exit" (the passer leaves by _exit, as a killed one would: no exit handler runs); and
 * with "-sandbox" after any of these, the taker is under a seccomp filter, where memlan takes
 * no connection up.
 *
 * The server (a fork child) answers each "ping I\n" with "pong I\n".  The passer (the parent)
 * connects, makes one round trip, passes the socket to the taker (a fork child made before the
 * connection, so that it shares nothing of it) and ends.  The taker sends "ping 2\n" on what it
 * received and waits 5 s for a line.  Over kernel TCP the taker gets "pong 2" (the connection
 * follows its descriptor); under memlan too, the taker taking the channel up (design.md,
 * "Passing a connection").  A sandboxed taker cannot: the connection is lost, but both ends must
 * see it end, not wait for ever (before: the server slept on, and the taker's request waited
 * unread in the server's kernel socket: a pgbouncer client's query hung until it was killed).
 * Prints what each end saw, and
 * "server: no end within 5 s" when it saw nothing.  Exits 0 when it ran to the end.
 */
#include "fdpass.h"
#include "twoends.h"
#include "seccompkill.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *mode;

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Wait up to ms for fd to be readable, the way MODE says; 1 ready, 0 not, -1 error. */
static int wait_in(int fd, int ms)
{
    if (strncmp(mode, "epoll", 5) == 0) {
        static int ep = -1;
        if (ep < 0) {
            ep = epoll_create1(0);
            struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
            if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
                return -1;
        }
        struct epoll_event out;
        return epoll_wait(ep, &out, 1, ms);
    }
    if (strncmp(mode, "poll", 4) == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        return poll(&p, 1, ms);
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000}; /* "read": a blocking read, bounded */
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 ? 1 : -1;
}

/* One line from fd within ms: its length, 0 at end of stream, -errno, or -ETIMEDOUT. */
static int readline_tmo(int fd, char *buf, size_t cap, int ms)
{
    size_t n = 0;
    int64_t end = now_ms() + ms;
    while (n + 1 < cap) {
        int64_t left = end - now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        int r = wait_in(fd, (int)left);
        if (r == 0)
            continue;
        if (r < 0)
            return -errno;
        ssize_t k = read(fd, buf + n, 1);
        if (k == 0)
            return 0;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            continue; /* SO_RCVTIMEO ran out */
        if (k < 0)
            return -errno;
        if (buf[n++] == '\n')
            break;
    }
    buf[n] = 0;
    return (int)n;
}

static void server(int l)
{
    int fd = accept(l, NULL, NULL);
    close(l);
    if (fd < 0)
        _exit(1);
    char line[64], out[64];
    for (;;) {
        int r = readline_tmo(fd, line, sizeof line, 5000);
        if (r == -ETIMEDOUT) {
            printf("server: no end within 5 s\n");
            break;
        }
        if (r <= 0) {
            printf("server: the connection ended (%s)\n", r == 0 ? "end of stream" : strerror(-r));
            break;
        }
        int i = -1;
        if (sscanf(line, "ping %d", &i) == 1) {
            int k = snprintf(out, sizeof out, "pong %d\n", i);
            (void)!write(fd, out, (size_t)k);
        }
    }
    close(fd);
    _exit(0);
}

static void taker(int sp)
{
    if (strstr(mode, "-sandbox") && seccomp_kill_for(__NR_kexec_load))
        _exit(1); /* a filter: memlan takes nothing up here */
    int fd = fdpass_recv(sp, 0);
    if (fd < 0)
        _exit(1);
    (void)!write(fd, "ping 2\n", 7);
    mode = "poll";
    char line[64];
    int r = readline_tmo(fd, line, sizeof line, 5000);
    if (r > 0)
        printf("taker: %s", line);
    else if (r == -ETIMEDOUT)
        printf("taker: no answer within 5 s\n");
    else
        printf("taker: the connection ended\n"); /* EOF or a reset: both say it is gone */
    close(fd);
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    int port = atoi(argv[1]);
    mode = argv[2];
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_backlog(port, 8, &a); /* twoends.h */
    pid_t s = fork();
    if (s == 0)
        server(l);
    close(l);
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
        return 1;
    pid_t t = fork();
    if (t == 0) {
        close(sp[0]);
        taker(sp[1]);
    }
    close(sp[1]);
    /* The passer, in a child of its own, so that the parent can wait for all three. */
    pid_t p = fork();
    if (p == 0) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
            _exit(1);
        char line[64];
        const char *save = mode;
        mode = "poll";
        (void)!write(fd, "ping 1\n", 7);
        int r = readline_tmo(fd, line, sizeof line, 5000);
        mode = save;
        printf("passer: %s", r > 0 ? line : "no answer\n");
        if (fdpass_send(sp[0], fd) < 0)
            printf("passer: sendmsg failed: %s\n", strerror(errno));
        if (strcmp(mode, "epoll-close") == 0)
            close(fd);
        if (strstr(mode, "-_exit")) {
            fflush(stdout);
            _exit(0);
        }
        exit(0);
    }
    close(sp[0]);
    int st;
    waitpid(p, &st, 0);
    waitpid(t, &st, 0);
    waitpid(s, &st, 0);
    printf("done\n");
    return 0;
}
