/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * connrefused: a nonblocking connect to a port that a memlan listener publishes, at an address
 * it does not listen on (the listener is on 127.0.0.1 only; the client tries 127.0.0.2, or ::1
 * first as a client of "localhost" does).  Over kernel TCP the connect says EINPROGRESS, the
 * refusal comes at once, poll says POLLOUT|POLLERR|POLLHUP and SO_ERROR says ECONNREFUSED: the
 * program tries the next address.
 *
 * Under memlan the connect posted an offer at EINPROGRESS (the port has a memlan listener), and
 * the undecided socket's first poll peeked the kernel socket, which took the pending error: poll
 * said POLLOUT|POLLHUP without POLLERR and SO_ERROR 0, "connected", and the send EPIPE.
 *
 * usage: connrefused PORT
 */
#include "twoends.h"

#include <poll.h>
#include <unistd.h>

static void try(const char *what, const struct sockaddr *sa, socklen_t len)
{
    int c = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c < 0) {
        printf("%s: no socket (%s)\n", what, strerror(errno));
        return;
    }
    int r = connect(c, sa, len);
    printf("%s: connect: %s\n", what, r == 0 ? "0" : strerror(errno));
    struct pollfd p = {.fd = c, .events = POLLOUT};
    int pr = poll(&p, 1, 2000);
    printf("%s: poll %d:%s%s%s\n", what, pr, p.revents & POLLOUT ? " OUT" : "",
           p.revents & POLLERR ? " ERR" : "", p.revents & POLLHUP ? " HUP" : "");
    int err = -1;
    socklen_t el = sizeof err;
    getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el);
    printf("%s: SO_ERROR %s\n", what, err ? strerror(err) : "0");
    ssize_t w = send(c, "x", 1, MSG_NOSIGNAL);
    printf("%s: send: %s\n", what, w == 1 ? "1" : strerror(errno));
    close(c);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int port = atoi(argv[1]);
    struct sockaddr_in a;
    int l = listen_here(port, &a);
    struct sockaddr_in b = a;
    b.sin_addr.s_addr = htonl(0x7f000002);
    try("127.0.0.2", (struct sockaddr *)&b, sizeof b);
    struct sockaddr_in6 s6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    s6.sin6_addr = in6addr_loopback;
    try("::1", (struct sockaddr *)&s6, sizeof s6);
    close(l);
    printf("done\n");
    return 0;
}
