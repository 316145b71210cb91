/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: the scripted calls that show what one end of a connection sees (poll and epoll
 * bits, recv, send, SO_ERROR), printed a line each, for the programs run once over kernel TCP and
 * once under memlan and compared line by line (resetconf, finreset). */
#ifndef MEMLAN_TESTS_CALLSCRIPT_H
#define MEMLAN_TESTS_CALLSCRIPT_H
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* The calls the end under test makes, one letter each: P poll, W epoll_wait, R recv of 3
 * bytes, S send of one byte, E SO_ERROR; shutdown: w SHUT_WR, r SHUT_RD, b SHUT_RDWR. */
static inline void script(int fd, const char *calls)
{
    for (const char *p = calls; *p; p++) {
        char b[8];
        ssize_t r;
        switch (*p) {
        case 'P': {
            struct pollfd q = {.fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP};
            int n = poll(&q, 1, 0);
            printf("  poll %d %#x\n", n, q.revents);
            break;
        }
        case 'W': {
            int ep = epoll_create1(0);
            struct epoll_event e = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP, .data.u64 = 7};
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
            int n = epoll_wait(ep, &e, 1, 0);
            printf("  epoll %d %#x\n", n, n > 0 ? e.events : 0);
            close(ep);
            break;
        }
        case 'R':
            r = recv(fd, b, 3, MSG_DONTWAIT);
            printf("  recv %zd %s\n", r, r < 0 ? strerror(errno) : "");
            break;
        case 'S':
            r = send(fd, "x", 1, MSG_NOSIGNAL);
            printf("  send %zd %s\n", r, r < 0 ? strerror(errno) : "");
            break;
        case 'w':
        case 'r':
        case 'b': {
            int how = *p == 'w' ? SHUT_WR : *p == 'r' ? SHUT_RD : SHUT_RDWR;
            errno = 0;
            int n = shutdown(fd, how);
            printf("  shutdown %c %d %s\n", *p, n, n < 0 ? strerror(errno) : "");
            break;
        }
        case 'E': {
            int v = -1;
            socklen_t l = sizeof v;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
            printf("  so_error %d\n", v);
            break;
        }
        }
    }
}

static inline void settle_close(void)
{
    usleep(50000); /* kernel TCP: the reset or FIN reaches the peer */
}

/* The scripted programs' listener on 127.0.0.1 and the settled pairs they make on it. */
static struct sockaddr_in cs_addr;
static int cs_lfd;

static void cs_die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

/* stdout line-buffered, SIGPIPE ignored, the listener on port. */
static void cs_listen(const char *port)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    cs_addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
    inet_pton(AF_INET, "127.0.0.1", &cs_addr.sin_addr);
    cs_lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(cs_lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(cs_lfd, (struct sockaddr *)&cs_addr, sizeof cs_addr) < 0 || listen(cs_lfd, 8) < 0)
        cs_die("listen");
}

/* A settled pair: *c the client end, *s the accepted end.  linger_client: SO_LINGER 0 set on
 * the client before it connects. */
static void cs_pair(int *c, int *s, int linger_client)
{
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (linger_client) {
        struct linger lg = {1, 0};
        setsockopt(*c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    if (*c < 0 || connect(*c, (struct sockaddr *)&cs_addr, sizeof cs_addr) < 0)
        cs_die("connect");
    *s = accept(cs_lfd, NULL, NULL);
    char b[2];
    if (*s < 0 || send(*s, "hi", 2, 0) != 2 || recv(*c, b, 2, MSG_WAITALL) != 2 ||
        send(*c, "ok", 2, 0) != 2 || recv(*s, b, 2, MSG_WAITALL) != 2)
        cs_die("settle");
}
#endif
