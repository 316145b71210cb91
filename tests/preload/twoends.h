/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: what the two-process test programs share: a failure line, pinning to the
 * n-th allowed cpu, a monotonic clock in seconds. */
#ifndef MEMLAN_TESTS_TWOENDS_H
#define MEMLAN_TESTS_TWOENDS_H
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
#endif
