/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * etreset: an edge-triggered epoll member of a connection whose peer has closed; the program
 * writes once more, and the peer's kernel answers that write with a reset: the member's next
 * edge is EPOLLERR|EPOLLHUP, reported by the next epoll_wait, as over kernel TCP.  Also for a
 * member that asked for EPOLLIN alone; and a poll asleep in another thread, asking for no event,
 * is woken by it.
 *
 * Under memlan the write that drew the reset changed the socket's readiness without anyone
 * posting it: the edge never came ("epoll 0" for 2 s, and ever after).
 *
 * usage: etreset PORT
 */
#include "epollprint.h"
#include "twoends.h"

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

static int C;

/* Another thread asleep in poll for what a reset says (POLLIN is already true: EOF). */
static void *poller(void *v)
{
    (void)v;
    struct pollfd p = {.fd = C, .events = 0};
    int n = poll(&p, 1, 3000);
    *(int *)v = n == 1 && (p.revents & POLLERR) ? 1 : 0;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    const uint32_t want[2] = {EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, EPOLLIN | EPOLLET};
    const char *name[2] = {"in-out-rdhup", "in"};
    for (int k = 0; k < 2; k++) {
        int s, c = settled_pair(l, &a, &s);
        int e = ep = epoll_create1(0);
        struct epoll_event v = {.events = want[k]};
        if (e < 0 || epoll_ctl(e, EPOLL_CTL_ADD, c, &v) != 0)
            die("epoll");
        if (k == 0)
            wait_named("in-out-rdhup: added", 2000);
        close(s);
        printf("%s: ", name[k]);
        wait_named("the peer closed", 2000);
        char b;
        printf("%s: read: %zd\n", name[k], recv(c, &b, 1, 0));
        if (send(c, "x", 1, MSG_NOSIGNAL) != 1)
            die("the write after the peer's close");
        printf("%s: ", name[k]);
        wait_named("our write drew a reset", 2000);
        printf("%s: ", name[k]);
        wait_named("again", 2000);
        close(e);
        close(c);
    }
    /* A poll asleep in another thread, asking for nothing (only an error or a hang-up can end
     * it): the reset wakes it. */
    int s, c = settled_pair(l, &a, &s), woke = -1;
    C = c;
    close(s);
    char b;
    if (recv(c, &b, 1, 0) != 0)
        die("the peer's end");
    pthread_t t;
    if (pthread_create(&t, NULL, poller, &woke) != 0)
        die("pthread_create");
    usleep(200000);
    if (send(c, "x", 1, MSG_NOSIGNAL) != 1)
        die("the write after the peer's close");
    pthread_join(t, NULL);
    printf("poll asleep in another thread: %s\n", woke ? "woken with POLLERR" : "not woken in 3 s");
    close(c);
    close(l);
    printf("done\n");
    return 0;
}
