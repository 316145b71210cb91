/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: how often a thread went to sleep (its voluntary context switches, from /proc),
 * for the tests that count wake-ups. */
#ifndef MEMLAN_TESTS_SWITCHES_H
#define MEMLAN_TESTS_SWITCHES_H
#include <stdio.h>
#include <sys/types.h>

/* Voluntary context switches of thread tid of this process (0: the calling thread); -1 if its
 * status cannot be read. */
static inline long thread_switches(pid_t tid)
{
    char path[64], line[256];
    if (tid)
        snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    else
        snprintf(path, sizeof path, "/proc/thread-self/status");
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
            break;
    fclose(f);
    return v;
}
#endif
