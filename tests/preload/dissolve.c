/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * dissolve: connect(AF_UNSPEC) dissolves a connection, and the same socket connects again, to
 * another server.  Over kernel TCP the first server reads what was sent before the dissolve,
 * then ECONNRESET, and what the client sends then reaches the second server.
 *
 * With "undecided" the client writes and dissolves before the first server accepts: under
 * memlan its bytes were in the ring of an offer nobody had taken, and the disconnect lost them
 * (the first server read ECONNRESET at once).  Without, the connection is settled first (a byte
 * each way; tests/preload/disconnect.c looks at that case closely).
 *
 * usage: dissolve PORT [undecided]
 */
#include "twoends.h"

#include <poll.h>
#include <stdbool.h>
#include <unistd.h>

/* recv on fd within 1 s: what came, or why nothing did. */
static void show(const char *who, int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 1000) != 1) {
        printf("%s: nothing within 1 s\n", who);
        return;
    }
    char b[64];
    ssize_t n = recv(fd, b, sizeof b - 1, MSG_DONTWAIT);
    if (n < 0)
        printf("%s: recv: %s\n", who, strerror(errno));
    else
        printf("%s: %zd bytes \"%.*s\"\n", who, n, (int)n, b);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    bool undecided = argc > 2;
    struct sockaddr_in a, b;
    int la = listen_here(atoi(argv[1]), &a);
    socklen_t bl = sizeof b;
    int lb = socket(AF_INET, SOCK_STREAM, 0);
    b = a;
    b.sin_port = 0;
    if (lb < 0 || bind(lb, (struct sockaddr *)&b, sizeof b) || listen(lb, 1) ||
        getsockname(lb, (struct sockaddr *)&b, &bl))
        die("listen b");
    int c = socket(AF_INET, SOCK_STREAM, 0), sa = -1;
    if (undecided) {
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
            die("connect a");
        if (send(c, "old", 3, 0) != 3)
            die("send old");
    } else {
        c = settled_pair(la, &a, &sa);
    }
    struct sockaddr un = {.sa_family = AF_UNSPEC};
    printf("connect(AF_UNSPEC): %s\n", connect(c, &un, sizeof un) == 0 ? "0" : strerror(errno));
    int r = connect(c, (struct sockaddr *)&b, sizeof b);
    printf("connect to the second server: %s\n", r == 0 ? "0" : strerror(errno));
    if (r != 0)
        return 1;
    int sb = accept(lb, NULL, NULL);
    if (sb < 0)
        die("accept b");
    ssize_t w = send(c, "new", 3, MSG_NOSIGNAL);
    printf("send: %s\n", w == 3 ? "3" : strerror(errno));
    show("second server", sb);
    if (undecided)
        sa = accept(la, NULL, NULL);
    if (sa >= 0)
        show("first server", sa);
    close(c);
    close(sb);
    if (sa >= 0)
        close(sa);
    close(la);
    close(lb);
    printf("done\n");
    return 0;
}
