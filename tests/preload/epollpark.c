/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollpark: epoll_ctl's answers and epoll_wait's events around a member deleted and added back,
 * both ends in this process, printed line by line over kernel TCP and under memlan
 * (tests/py/test_preload.py).  Under memlan a DEL of a member leaves the kernel's entry in place
 * (the member parked: src/preload/epoll.c, "Parked members") and an ADD takes it back, MOD and
 * DEL without a system call: the answers the kernel would give (EEXIST, ENOENT, EINVAL), what
 * happened on the socket while it was out of the set (bytes, the peer's shutdown), one-shot and
 * edge-triggered members, EPOLLEXCLUSIVE, and the fd closed while parked must all be the kernel's.
 *
 * usage: epollpark PORT
 */
#include "twoends.h"

#include "epollprint.h"

#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int peer, c = settled_pair(l, &a, &peer);
    char b[8];
    if ((ep = epoll_create1(0)) < 0)
        die("epoll_create1");

    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN);
    ctl("add again", EPOLL_CTL_ADD, c, EPOLLIN);
    wait_("wait, nothing yet", 0);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    ctl("del again", EPOLL_CTL_DEL, c, 0);
    ctl("mod after del", EPOLL_CTL_MOD, c, EPOLLIN);
    if (send(peer, "x", 1, 0) != 1)
        die("send");
    wait_("wait, a byte came while deleted", 100);
    ctl("add back", EPOLL_CTL_ADD, c, EPOLLIN);
    wait_("wait, level", 100);
    wait_("wait, level again", 100);
    printf("read: %zd\n", recv(c, b, sizeof b, 0));
    wait_("wait, read", 0);

    ctl("mod out", EPOLL_CTL_MOD, c, EPOLLOUT);
    wait_("wait, out", 100);
    ctl("mod in|out", EPOLL_CTL_MOD, c, EPOLLIN | EPOLLOUT);
    wait_("wait, in|out", 100);

    ctl("del", EPOLL_CTL_DEL, c, 0);
    ctl("add edge", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLET);
    wait_("wait, edge, nothing", 0);
    if (send(peer, "y", 1, 0) != 1)
        die("send");
    wait_("wait, edge, a byte", 100);
    wait_("wait, edge, the same byte", 0);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    ctl("add back, the byte unread", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLET);
    wait_("wait, edge after add", 100);
    printf("read: %zd\n", recv(c, b, sizeof b, 0));

    ctl("mod oneshot", EPOLL_CTL_MOD, c, EPOLLOUT | EPOLLONESHOT);
    wait_("wait, oneshot", 100);
    wait_("wait, oneshot spent", 0);
    ctl("del spent oneshot", EPOLL_CTL_DEL, c, 0);
    ctl("mod after", EPOLL_CTL_MOD, c, EPOLLOUT);
    ctl("add oneshot back", EPOLL_CTL_ADD, c, EPOLLOUT | EPOLLONESHOT);
    wait_("wait, oneshot again", 100);
    ctl("del", EPOLL_CTL_DEL, c, 0);

    ctl("add exclusive", EPOLL_CTL_ADD, c, EPOLLOUT | EPOLLEXCLUSIVE);
    ctl("mod exclusive", EPOLL_CTL_MOD, c, EPOLLOUT);
    wait_("wait, exclusive", 100);
    ctl("del exclusive", EPOLL_CTL_DEL, c, 0);
    ctl("add plain", EPOLL_CTL_ADD, c, EPOLLOUT);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    ctl("add exclusive over it", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLEXCLUSIVE);
    ctl("del", EPOLL_CTL_DEL, c, 0);

    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLRDHUP);
    ctl("del", EPOLL_CTL_DEL, c, 0);
    if (shutdown(peer, SHUT_WR) != 0)
        die("shutdown");
    wait_("wait, the peer shut down while deleted", 100);
    ctl("add back", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLRDHUP);
    wait_("wait, the end", 1000);
    printf("read: %zd\n", recv(c, b, sizeof b, 0));

    ctl("del", EPOLL_CTL_DEL, c, 0);
    close(c);
    ctl("add the closed fd", EPOLL_CTL_ADD, c, EPOLLIN);
    ctl("del the closed fd", EPOLL_CTL_DEL, c, 0);
    wait_("wait, empty set", 0);

    /* A new connection on the number the parked one had. */
    int peer2, c2 = settled_pair(l, &a, &peer2);
    printf("same number: %s\n", c2 == c ? "yes" : "no");
    ctl("add the new socket", EPOLL_CTL_ADD, c2, EPOLLOUT);
    wait_("wait, the new socket", 100);
    ctl("del", EPOLL_CTL_DEL, c2, 0);
    close(c2);
    close(peer2);
    close(peer);
    close(ep);
    close(l);
    printf("done\n");
    return 0;
}
