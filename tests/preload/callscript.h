/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: the scripted calls that show what one end of a connection sees (poll and epoll
 * bits, recv, send, SO_ERROR), printed a line each, for the programs run once over kernel TCP and
 * once under memlan and compared line by line (resetconf, finreset). */
#ifndef MEMLAN_TESTS_CALLSCRIPT_H
#define MEMLAN_TESTS_CALLSCRIPT_H
#include <errno.h>
#include <poll.h>
#include <stdio.h>
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
#endif
