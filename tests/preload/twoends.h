/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: what the two-process test programs share: a failure line, pinning to the
 * n-th allowed cpu, a monotonic clock in seconds, a listener on the loopback. */
#ifndef MEMLAN_TESTS_TWOENDS_H
#define MEMLAN_TESTS_TWOENDS_H
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

static inline void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

/* To the cpu-th cpu the process may use, where it may use two or more. */
static inline void pin(int cpu)
{
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0 || CPU_COUNT(&all) < 2)
        return;
    int k = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all) && k++ == cpu) {
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            sched_setaffinity(0, sizeof one, &one);
            return;
        }
}

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A listener on 127.0.0.1:port (SO_REUSEADDR) with that backlog; *a: its address. */
static inline int listen_backlog(int port, int backlog, struct sockaddr_in *a)
{
    *a = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)a, sizeof *a) || listen(l, backlog))
        die("listen");
    return l;
}

/* A listener on 127.0.0.1:port (SO_REUSEADDR); *a: its address, for connect. */
static inline int listen_here(int port, struct sockaddr_in *a)
{
    return listen_backlog(port, 1, a);
}

/* A scripted test's start: stdout unbuffered, a minute's alarm, a listener on 127.0.0.1:port
 * that closes on exec (*a: its address). */
static inline int scripted_listener(const char *port, struct sockaddr_in *a)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    alarm(60);
    int l = listen_backlog(atoi(port), 4, a);
    fcntl(l, F_SETFD, FD_CLOEXEC);
    return l;
}

/* A connection to the listener l at a, a byte each way (under memlan both ends are settled on
 * the channel then): the client's fd; *acc: the accepted one. */
static inline int settled_pair(int l, struct sockaddr_in *a, int *acc)
{
    char b;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)a, sizeof *a) != 0)
        die("connect");
    if ((*acc = accept(l, NULL, NULL)) < 0)
        die("accept");
    if (send(c, "a", 1, 0) != 1 || recv(*acc, &b, 1, 0) != 1 || send(*acc, "b", 1, 0) != 1 ||
        recv(c, &b, 1, 0) != 1)
        die("the first exchange");
    return c;
}
#endif
