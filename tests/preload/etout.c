/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * etout: an edge-triggered member (EPOLLIN|EPOLLOUT) of a settled, idle, nonblocking client with
 * room to write.  Its EPOLLOUT comes once when it is added, and no more until something happens
 * that the kernel makes an edge of: the peer's bytes (reported with the whole mask), or room
 * again after a send that found none.  The peer's reads of our bytes, while we always had room,
 * are no edge.  Every wait is printed, so the lines must match the kernel's one for one.
 *
 * Under memlan the registration in the set's queue posted an event for the readiness already
 * there, and armed the room tripwire while there was room: "added, again: epoll 1 [OUT ]", and
 * the peer's read of our bytes posted a wake-up that the set reported as another EPOLLOUT edge.
 *
 * usage: etout PORT
 */
#include "epollprint.h"
#include "twoends.h"

#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    int c = settled_pair(l, &a, &s);
    static char buf[1 << 16];
    if (fcntl(c, F_SETFL, O_NONBLOCK) != 0 || fcntl(s, F_SETFL, O_NONBLOCK) != 0 ||
        (ep = epoll_create1(0)) < 0)
        die("setup");
    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLOUT | EPOLLET);
    wait_named("added", 1000);
    wait_named("added, again", 200);
    wait_named("added, once more", 200);
    /* Our bytes, read by the peer: we always had room. */
    for (int i = 0; i < 3; i++) {
        if (send(c, "0123456789", 10, 0) != 10)
            die("send");
        usleep(20000);
        if (recv(s, buf, sizeof buf, 0) != 10)
            die("recv 10");
        wait_named("the peer read our bytes", 200);
    }
    /* The peer's bytes: an edge, with the whole mask; then nothing new. */
    if (send(s, "hello", 5, 0) != 5)
        die("send 5");
    wait_named("the peer's bytes", 1000);
    wait_named("the peer's bytes, again", 200);
    if (recv(c, buf, sizeof buf, 0) != 5)
        die("recv 5");
    wait_named("we read them", 200);
    /* No room (bounded: 64 MiB at most), then the peer reads everything: room again is an edge,
     * once. */
    long sent = 0;
    for (int i = 0; i < 1024; i++) {
        ssize_t n = send(c, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0)
            die("fill");
        sent += n;
    }
    wait_named("no room", 200);
    long got = 0;
    for (double end = now_s() + 10; got < sent && now_s() < end;) {
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n > 0)
            got += n;
        else if (n < 0 && errno != EAGAIN)
            die("drain");
    }
    printf("the peer read all: %s\n", got == sent ? "yes" : "no");
    wait_named("room again", 1000);
    wait_named("room again, again", 200);
    close(c);
    close(s);
    close(l);
    close(ep);
    printf("done\n");
    return 0;
}
