/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * ports.h - the syntax of a port list (MEMLAN_PORTS, MEMLAN_NO_PORTS, memlan run --ports):
 * "80,8000-8100", ports 1 to 65535, ranges low-high, a space allowed after a comma.  Shared by the
 * preload, which says when a list in its environment is bad, and the CLI, which refuses one.
 */
#ifndef MEMLAN_PRELOAD_PORTS_H
#define MEMLAN_PRELOAD_PORTS_H

#include <stdbool.h>
#include <stdlib.h>

static inline bool mlp_ports_valid(const char *s)
{
    for (const char *p = s;;) {
        char *end;
        if (*p < '0' || *p > '9')
            return false;
        long a = strtol(p, &end, 10), b = a;
        if (*end == '-') {
            if (end[1] < '0' || end[1] > '9')
                return false;
            b = strtol(end + 1, &end, 10);
        }
        if (a < 1 || b > 65535 || a > b)
            return false;
        if (*end == ' ')
            end++;
        if (!*end)
            return true;
        if (*end != ',')
            return false;
        p = end + 1;
        while (*p == ' ')
            p++;
    }
}

#endif
