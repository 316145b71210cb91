/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * etsettle: an edge-triggered member (EPOLLIN|EPOLLOUT|EPOLLRDHUP) of a nonblocking client
 * socket added while its connect is in progress: the connect's edge is EPOLLOUT; then the
 * server's first byte, or its close, is an edge that carries the whole mask, EPOLLOUT included,
 * as the kernel's epoll reports every wake-up with everything that is true.  (Only the first
 * event after each step is printed: memlan may add an event the kernel does not make.)
 *
 * Under memlan the socket was undecided at the connect's edge and settled on the channel
 * afterwards; what it reported while undecided was taken out of its first report once settled:
 * "after the server's byte: epoll 1 [IN ]", "after the server's close: epoll 1 [IN RDHUP ]".
 *
 * usage: etsettle PORT
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
    int l = listen_here(atoi(argv[1]), &a);
    for (int k = 0; k < 2; k++) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        int e = ep = epoll_create1(0);
        struct epoll_event v = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET};
        if (c < 0 || e < 0)
            die("socket");
        int r = connect(c, (struct sockaddr *)&a, sizeof a);
        if (r != 0 && errno != EINPROGRESS)
            die("connect");
        if (epoll_ctl(e, EPOLL_CTL_ADD, c, &v) != 0)
            die("epoll_ctl");
        wait_named("the connect", 2000);
        int s = accept(l, NULL, NULL);
        if (s < 0)
            die("accept");
        if (k == 0) {
            if (send(s, "x", 1, 0) != 1)
                die("send");
            wait_named("after the server's byte", 2000);
        } else {
            close(s);
            s = -1;
            wait_named("after the server's close", 2000);
        }
        if (s >= 0)
            close(s);
        close(c);
        close(e);
    }
    close(l);
    printf("done\n");
    return 0;
}
