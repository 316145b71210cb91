/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * shutundecided: a nonblocking client sends its request and shuts its writing down
 * (shutdown(SHUT_WR), as an HTTP/1.0 client or `nc -N` does) before the server has accepted.
 * Over kernel TCP the shutdown returns at once; the server then reads the request and the end.
 *
 * Under memlan the undecided socket's shutdown waited for the acceptor's claim, or for the
 * accept wait (2 s) and then TCP: an event loop stood still that long, and here, where the
 * same thread accepts, it always did.
 *
 * usage: shutundecided PORT
 */
#include "twoends.h"

#include <poll.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&a, sizeof a);
    struct pollfd p = {.fd = c, .events = POLLOUT};
    if ((r != 0 && errno != EINPROGRESS) || poll(&p, 1, 2000) != 1)
        die("connect");
    if (send(c, "req", 3, 0) != 3)
        die("send");
    double t0 = now_s();
    r = shutdown(c, SHUT_WR);
    double dt = now_s() - t0;
    printf("shutdown: %s, %s\n", r == 0 ? "0" : strerror(errno),
           dt < 0.5 ? "returned within 0.5 s" : "blocked");
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    char b[16];
    size_t got = 0;
    for (int i = 0; i < 100 && got < sizeof b; i++) {
        p = (struct pollfd){.fd = s, .events = POLLIN};
        if (poll(&p, 1, 3000) != 1)
            break;
        ssize_t n = recv(s, b + got, sizeof b - got, 0);
        if (n <= 0) {
            printf("server: \"%.*s\", then %s\n", (int)got, b, n == 0 ? "EOF" : strerror(errno));
            break;
        }
        got += (size_t)n;
    }
    if (send(s, "ans", 3, MSG_NOSIGNAL) != 3)
        die("answer");
    p = (struct pollfd){.fd = c, .events = POLLIN};
    ssize_t n = poll(&p, 1, 3000) == 1 ? recv(c, b, sizeof b, 0) : -1;
    printf("client: %s\n", n == 3 && memcmp(b, "ans", 3) == 0 ? "ans" : "no answer");
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
