/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * connectpending: a nonblocking connect that cannot complete yet (the listener's accept queue is
 * full and nobody accepts: the kernel drops the SYN and the socket stays in SYN-SENT).  Over
 * kernel TCP poll reports nothing for it (POLLOUT only once connected or failed), getpeername
 * says ENOTCONN and a send says EAGAIN.  Then the listener accepts, and the connection completes
 * after the SYN's retransmission (1 s).
 *
 * Under memlan the connect posted its offer at EINPROGRESS and the socket was undecided at once:
 * poll said POLLOUT at once with SO_ERROR 0 (a program takes that for "connected") while
 * getpeername said ENOTCONN.  (A send there still goes into the ring, as every undecided
 * client's write does: not compared here.)
 *
 * usage: connectpending PORT
 */
#include "twoends.h"

#include <poll.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 0))
        die("listen");
    /* Fill the accept queue (backlog 0 holds one) with connections nobody accepts yet. */
    int fill[2], n = 0;
    for (int i = 0; i < 2; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        (void)connect(fill[i], (struct sockaddr *)&a, sizeof a);
        struct pollfd p = {.fd = fill[i], .events = POLLOUT};
        if (poll(&p, 1, 300) == 1)
            n++;
    }
    printf("queue filled (connections that completed: %d of 2)\n", n);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&a, sizeof a);
    printf("connect: %s\n", r == 0 ? "0" : strerror(errno));
    struct pollfd p = {.fd = c, .events = POLLOUT};
    int pr = poll(&p, 1, 300);
    int err = -1;
    socklen_t el = sizeof err;
    getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el);
    printf("poll for POLLOUT within 300 ms: %d, SO_ERROR %d\n", pr, err);
    struct sockaddr_in pa;
    socklen_t pl = sizeof pa;
    printf("getpeername: %s\n", getpeername(c, (struct sockaddr *)&pa, &pl) == 0 ? "0" : strerror(errno));
    for (int i = 0; i < 2; i++)
        close(fill[i]);
    close(c);
    close(l);
    printf("done\n");
    return 0;
}
