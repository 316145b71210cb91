/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * disconnect: TCP's disconnect, connect(fd, {AF_UNSPEC}), on an accelerated client, and a new
 * connection made on the same fd.  Over kernel TCP the peer gets a reset (POLLERR|POLLHUP,
 * ECONNRESET), the disconnected socket reports ECONNRESET once and then ENOTCONN, an epoll set
 * that holds it reports what the kernel's socket says, and the new connection carries its bytes.
 *
 * Under memlan the fd kept its record: the peer read end-of-file (no reset), a send still went
 * into the old ring, and after the new connect the bytes went to the old channel: the new
 * connection's server never got them ("server2 recv: nothing in 2 s").
 *
 * usage: disconnect PORT
 */
#include "twoends.h"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

static void said(const char *what, ssize_t r)
{
    printf("%s: %zd %s\n", what, r, r < 0 ? strerror(errno) : "");
}

/* A byte from fd within 2 s, or what happened instead. */
static void one_byte(const char *what, int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b = '-';
    if (poll(&p, 1, 2000) != 1) {
        printf("%s: nothing in 2 s\n", what);
        return;
    }
    ssize_t r = recv(fd, &b, 1, MSG_DONTWAIT);
    printf("%s: %zd %s%c\n", what, r, r < 0 ? strerror(errno) : "", r == 1 ? b : ' ');
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    int c = settled_pair(l, &a, &s);
    int e = epoll_create1(0);
    struct epoll_event v = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP, .data.u64 = 7};
    if (e < 0 || epoll_ctl(e, EPOLL_CTL_ADD, c, &v) != 0)
        die("epoll");
    int n = epoll_wait(e, &v, 1, 0);
    printf("epoll before: %d %#x\n", n, n == 1 ? v.events : 0);

    struct sockaddr u = {.sa_family = AF_UNSPEC};
    said("connect(AF_UNSPEC)", connect(c, &u, sizeof u));
    struct pollfd p = {.fd = s, .events = POLLIN | POLLRDHUP};
    n = poll(&p, 1, 2000);
    printf("the peer's poll: %d %#x\n", n, n == 1 ? p.revents : 0);
    char b;
    said("the peer's recv", recv(s, &b, 1, MSG_DONTWAIT));
    n = epoll_wait(e, &v, 1, 0);
    printf("epoll after: %d %#x %llu\n", n, n == 1 ? v.events : 0,
           n == 1 ? (unsigned long long)v.data.u64 : 0ull);
    close(e);
    said("send after", send(c, "x", 1, MSG_NOSIGNAL));
    said("send again", send(c, "x", 1, MSG_NOSIGNAL));
    said("recv after", recv(c, &b, 1, MSG_DONTWAIT));
    close(s);

    /* A new connection on the same fd: its bytes reach its own server, both ways. */
    said("connect again", connect(c, (struct sockaddr *)&a, sizeof a));
    int s2 = accept(l, NULL, NULL);
    if (s2 < 0)
        die("accept");
    said("send on the new connection", send(c, "n", 1, MSG_NOSIGNAL));
    one_byte("server2 recv", s2);
    said("server2 send", send(s2, "m", 1, MSG_NOSIGNAL));
    one_byte("client recv", c);
    close(s2);
    one_byte("client recv at the server's close", c);
    close(c);
    close(l);
    printf("done\n");
    return 0;
}
