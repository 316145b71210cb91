/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * rawclose: connections closed by syscall(SYS_close, fd), as libuv (Node.js) closes every fd on
 * Linux, and new fds opened at the numbers they leave: a connection, a pipe, and a connection
 * again after a raw close_range.  Each must work as over kernel TCP, and the peer of a raw-closed
 * connection reads end-of-file.
 *
 * Under memlan the raw close left the fd's record: the next socket at that number was taken for
 * the old connection (its connect "succeeded" without a connection, its send said EPIPE), and
 * a pipe's read there went to the old channel.
 *
 * usage: rawclose PORT
 */
#include "twoends.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *what(ssize_t r, const char *want, const char *b)
{
    static char s[96];
    if (r < 0)
        snprintf(s, sizeof s, "-1 %s", strerror(errno));
    else if (r == (ssize_t)strlen(want) && memcmp(b, want, (size_t)r) == 0)
        snprintf(s, sizeof s, "ok");
    else
        snprintf(s, sizeof s, "%zd bytes, not \"%s\"", r, want);
    return s;
}

/* A round over a pair: a message each way; says what each receive got. */
static void round_trip(const char *name, int c, int s)
{
    char b[32];
    ssize_t r = send(c, "ping", 4, MSG_NOSIGNAL);
    printf("%s: client send: %s\n", name, r == 4 ? "ok" : strerror(errno));
    struct pollfd p = {.fd = s, .events = POLLIN};
    r = poll(&p, 1, 3000) == 1 ? recv(s, b, sizeof b, MSG_DONTWAIT) : -2;
    printf("%s: server recv: %s\n", name, r == -2 ? "nothing in 3 s" : what(r, "ping", b));
    r = send(s, "pong", 4, MSG_NOSIGNAL);
    printf("%s: server send: %s\n", name, r == 4 ? "ok" : strerror(errno));
    p.fd = c;
    r = poll(&p, 1, 3000) == 1 ? recv(c, b, sizeof b, MSG_DONTWAIT) : -2;
    printf("%s: client recv: %s\n", name, r == -2 ? "nothing in 3 s" : what(r, "pong", b));
}

static int fresh_pair(int l, struct sockaddr_in *a, int *s, int want_c)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0)
        die("socket");
    printf("new socket at the old number: %s\n", c == want_c ? "yes" : "no");
    if (connect(c, (struct sockaddr *)a, sizeof *a) != 0)
        printf("connect: %s\n", strerror(errno));
    if ((*s = accept(l, NULL, NULL)) < 0)
        die("accept");
    return c;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    int c = settled_pair(l, &a, &s);
    round_trip("first", c, s);

    /* The client closes raw: its peer reads end-of-file; then the server closes raw too. */
    syscall(SYS_close, c);
    struct pollfd p = {.fd = s, .events = POLLIN};
    char b[32];
    ssize_t r = poll(&p, 1, 3000) == 1 ? recv(s, b, sizeof b, MSG_DONTWAIT) : -2;
    printf("the peer of a raw close reads: %s\n",
           r == 0 ? "end-of-file" : r == -2 ? "nothing in 3 s" : what(r, "", b));
    int old_c = c, old_s = s;
    syscall(SYS_close, s);

    /* A new connection at the numbers (the lowest free: the client's, then the server's). */
    c = fresh_pair(l, &a, &s, old_c);
    printf("accepted at the old number: %s\n", s == old_s ? "yes" : "no");
    round_trip("second", c, s);

    /* A pipe at numbers that held connections closed raw. */
    old_c = c;
    old_s = s;
    syscall(SYS_close, c);
    syscall(SYS_close, s);
    int pp[2];
    if (pipe(pp) != 0)
        die("pipe");
    printf("the pipe at the old numbers: %s\n",
           (pp[0] == old_c || pp[0] == old_s) && (pp[1] == old_c || pp[1] == old_s) ? "yes"
                                                                                  : "no");
    r = write(pp[1], "pipe", 4);
    printf("pipe write: %s\n", r == 4 ? "ok" : strerror(errno));
    r = read(pp[0], b, sizeof b);
    printf("pipe read: %s\n", what(r, "pipe", b));
    close(pp[0]);
    close(pp[1]);

    /* A raw close_range over a connection, then a connection at its numbers. */
    c = fresh_pair(l, &a, &s, old_c);
    round_trip("third", c, s);
    old_c = c;
    int lo = c < s ? c : s, hi = c < s ? s : c;
    if (syscall(SYS_close_range, (unsigned)lo, (unsigned)hi, 0) != 0)
        printf("close_range: %s\n", strerror(errno));
    c = fresh_pair(l, &a, &s, old_c);
    round_trip("fourth", c, s);
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
