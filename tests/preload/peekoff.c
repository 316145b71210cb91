/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * peekoff: SO_PEEK_OFF on a settled connection (TCP's since Linux 6.10; before, setsockopt says
 * EOPNOTSUPP, over kernel TCP as under memlan).  Peeks start at the offset and move it on;
 * receives move it back, not below 0; a peek past the bytes there says EAGAIN, and 0 at the
 * end; -1 turns it off.  Every answer is printed, to be compared line for line with the
 * kernel's.
 *
 * Under memlan the option went to the idle kernel socket alone: every peek returned the first
 * bytes again, and getsockopt said the kernel's offset, which no peek moved.
 *
 * usage: peekoff PORT
 */
#include "twoends.h"

#include <unistd.h>

#ifndef SO_PEEK_OFF
#define SO_PEEK_OFF 42
#endif

static int c;

static void set(int v)
{
    int r = setsockopt(c, SOL_SOCKET, SO_PEEK_OFF, &v, sizeof v);
    printf("set %d: %d %s\n", v, r, r < 0 ? strerror(errno) : "");
}

static void get(void)
{
    int v = -7;
    socklen_t l = sizeof v;
    int r = getsockopt(c, SOL_SOCKET, SO_PEEK_OFF, &v, &l);
    printf("  offset: %d (%d)\n", v, r);
}

static void rd(const char *what, size_t len, int flags)
{
    char b[64];
    ssize_t n = recv(c, b, len, flags | MSG_DONTWAIT);
    if (n < 0)
        printf("%s %zu: -1 %s\n", what, len, strerror(errno));
    else
        printf("%s %zu: %zd '%.*s'\n", what, len, n, (int)n, b);
    get();
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    c = settled_pair(l, &a, &s);
    if (send(s, "0123456789abcdef", 16, 0) != 16)
        die("send");
    usleep(50000);
    get();
    set(0);
    rd("peek", 4, MSG_PEEK);
    rd("peek", 4, MSG_PEEK);
    rd("recv", 6, 0);
    rd("peek", 4, MSG_PEEK);
    rd("peek", 60, MSG_PEEK); /* to the end of what is there */
    rd("peek", 4, MSG_PEEK);  /* nothing past the offset */
    if (send(s, "XYZ", 3, 0) != 3)
        die("send 3");
    usleep(50000);
    rd("peek", 60, MSG_PEEK);
    set(3);
    rd("peek", 2, MSG_PEEK);
    rd("recv", 60, 0);
    rd("peek", 4, MSG_PEEK);
    if (send(s, "tail", 4, 0) != 4)
        die("send 4");
    usleep(50000);
    set(-1);
    rd("peek", 2, MSG_PEEK);
    rd("peek", 2, MSG_PEEK);
    set(1);
    rd("peek", 2, MSG_PEEK);
    shutdown(s, SHUT_WR); /* the end: a peek past the bytes there says 0 */
    usleep(50000);
    rd("peek", 8, MSG_PEEK);
    rd("peek", 8, MSG_PEEK);
    rd("recv", 8, 0);
    rd("recv", 8, 0);
    close(s);
    close(c);
    close(l);
    printf("done\n");
    return 0;
}
