/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * shortconn: short connections and idle connections, for bench/conn.py (plain POSIX, no memlan:
 * it runs over kernel TCP and under `memlan run` unchanged).
 *
 *   shortconn server PORT           accept, read 64 B, answer 64 B, close; until killed
 *   shortconn client PORT SECONDS   connect, send 64 B, read the answer, close; for SECONDS
 *                                   prints "conns N seconds S bad B"
 *   shortconn idle-server PORT      accept one connection, answer one message, then wait in
 *                                   epoll_wait for ever
 *   shortconn idle-client PORT      connect, one exchange, print "ready", then block in read
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG 64

static void die(const char *what)
{
    fprintf(stderr, "shortconn: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int full(int fd, char *buf, int n, int writing)
{
    int done = 0;
    while (done < n) {
        ssize_t r = writing ? write(fd, buf + done, (size_t)(n - done))
                            : read(fd, buf + done, (size_t)(n - done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        done += (int)r;
    }
    return 0;
}

static struct sockaddr_in addr(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    return a;
}

static int listener(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = addr(port);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 512) < 0)
        die("listen");
    return s;
}

static int dial(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = addr(port);
    if (s < 0)
        die("socket");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    return s;
}

static void fill(char *buf, unsigned seq)
{
    for (int i = 0; i < MSG; i++)
        buf[i] = (char)(seq * 7 + (unsigned)i);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: shortconn server|client|idle-server|idle-client PORT [SECONDS]\n");
        return 2;
    }
    int port = atoi(argv[2]);
    char buf[MSG], want[MSG];
    if (strcmp(argv[1], "server") == 0) {
        int l = listener(port);
        for (;;) {
            int c = accept(l, NULL, NULL);
            if (c < 0) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                die("accept");
            }
            if (full(c, buf, MSG, 0) == 0) {
                for (int i = 0; i < MSG; i++)
                    buf[i] = (char)~buf[i];
                (void)full(c, buf, MSG, 1);
            }
            close(c);
        }
    }
    if (strcmp(argv[1], "client") == 0 && argc == 4) {
        double secs = atof(argv[3]), t0 = now(), t = t0;
        unsigned long n = 0, bad = 0;
        while (t - t0 < secs && n < 10000000) {
            int s = dial(port);
            fill(buf, (unsigned)n);
            for (int i = 0; i < MSG; i++)
                want[i] = (char)~buf[i];
            if (full(s, buf, MSG, 1) < 0 || full(s, buf, MSG, 0) < 0 || memcmp(buf, want, MSG))
                bad++;
            close(s);
            n++;
            if ((n & 15) == 0)
                t = now();
        }
        t = now();
        printf("conns %lu seconds %.3f bad %lu\n", n, t - t0, bad);
        return bad != 0;
    }
    if (strcmp(argv[1], "idle-server") == 0) {
        int l = listener(port);
        int c = accept(l, NULL, NULL);
        if (c < 0 || full(c, buf, MSG, 0) < 0 || full(c, buf, MSG, 1) < 0)
            die("idle exchange");
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0)
            die("epoll");
        for (;;) {
            int n = epoll_wait(ep, &ev, 1, -1);
            if (n > 0 && (full(c, buf, 1, 0) < 0))
                return 0; /* the client went away */
        }
    }
    if (strcmp(argv[1], "idle-client") == 0) {
        int s = dial(port);
        memset(buf, 1, MSG);
        if (full(s, buf, MSG, 1) < 0 || full(s, buf, MSG, 0) < 0)
            die("idle exchange");
        printf("ready\n");
        fflush(stdout);
        ssize_t r = read(s, buf, 1); /* the server never speaks again */
        return r < 0;
    }
    fprintf(stderr, "shortconn: unknown mode %s\n", argv[1]);
    return 2;
}
