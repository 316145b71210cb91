/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: epoll_ctl's answers and epoll_wait's events on the set ep, printed a line each
 * (epollpark, epollpark2, etreset, etsettle: compared line for line between kernel TCP and
 * memlan). */
#ifndef MEMLAN_TESTS_EPOLLPRINT_H
#define MEMLAN_TESTS_EPOLLPRINT_H
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

static int ep;

static inline void ctl(const char *what, int op, int fd, uint32_t events)
{
    struct epoll_event e = {.events = events, .data.u64 = 7};
    int r = epoll_ctl(ep, op, fd, &e);
    printf("%s: %d %s\n", what, r, r < 0 ? strerror(errno) : "");
}

/* What a wait of up to ms says, the events masked to the bits both sides define alike. */
static inline void wait_(const char *what, int ms)
{
    struct epoll_event e[4];
    int r = epoll_wait(ep, e, 4, ms);
    printf("%s: %d", what, r);
    for (int i = 0; i < r; i++)
        printf(" [%llu %#x]", (unsigned long long)e[i].data.u64,
               e[i].events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLHUP | EPOLLERR));
    printf("\n");
}

/* The same with the events by name (etreset, etsettle). */
static inline void wait_named(const char *what, int ms)
{
    struct epoll_event e[4];
    int r = epoll_wait(ep, e, 4, ms);
    printf("%s: epoll %d", what, r);
    for (int i = 0; i < r; i++)
        printf(" [%s%s%s%s%s]", e[i].events & EPOLLIN ? "IN " : "",
               e[i].events & EPOLLOUT ? "OUT " : "", e[i].events & EPOLLRDHUP ? "RDHUP " : "",
               e[i].events & EPOLLHUP ? "HUP " : "", e[i].events & EPOLLERR ? "ERR" : "");
    printf("\n");
}
#endif
