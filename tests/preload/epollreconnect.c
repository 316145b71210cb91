/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollreconnect: an accelerated client in an epoll set is disconnected (connect(fd,
 * {AF_UNSPEC})) and connected again on the same fd, its entry left in the set (unchanged, changed
 * by a MOD, or deleted) across both.  Over kernel TCP the set reports the new connection's bytes
 * with the entry's data; the deleted entry reports nothing.
 *
 * Under memlan the disconnect handed the member to the kernel with the program's events, and the
 * new connection, accelerated again, was never taken back into the set: the kernel's entry
 * watched the kernel socket, the server's byte came in the ring, and the wait said "epoll 0"
 * where the kernel says "epoll 1 [7 0x1]".
 *
 * usage: epollreconnect PORT
 */
#include "twoends.h"

#include "epollprint.h"

#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

/* Disconnect c (whose server end is s), change its entry (op: 0 for none), connect it again to
 * a, and have the new server send a byte: what the set reports (settled: a look before it). */
static void again_(const char *what, int l, struct sockaddr_in *a, int c, int s, int op,
                   uint32_t events, bool settled)
{
    struct sockaddr u = {.sa_family = AF_UNSPEC};
    if (connect(c, &u, sizeof u) != 0)
        die("connect(AF_UNSPEC)");
    close(s);
    if (op)
        ctl("change", op, c, events);
    if (connect(c, (struct sockaddr *)a, sizeof *a) != 0)
        die("connect again");
    int s2 = accept(l, NULL, NULL);
    char b;
    if (s2 < 0 || send(c, "n", 1, 0) != 1 || recv(s2, &b, 1, 0) != 1)
        die("the new connection");
    if (settled)
        wait_("settled", 0); /* the new connection's first byte went out: nothing to read */
    if (send(s2, "m", 1, 0) != 1)
        die("server2 send");
    printf("%s: ", what);
    fflush(stdout);
    wait_("after the server's byte", 2000);
    close(s2);
    close(c);
}

static void round_(const char *what, int l, struct sockaddr_in *a, int op, uint32_t events)
{
    int s;
    int c = settled_pair(l, a, &s);
    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLRDHUP);
    wait_("before", 0);
    again_(what, l, a, c, s, op, events, true);
}

/* A client whose offer no acceptor took within MEMLAN_ACCEPT_QUEUE_MS (the test's 2 s; the wait
 * counts from the connect while the server has not accepted): on TCP, its member
 * handed to the kernel.  The program changes the entry's data (9), disconnects it and connects it
 * again: the set reports the new connection's bytes with data 9. */
static void fell_(int l, struct sockaddr_in *a)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)a, sizeof *a) != 0)
        die("connect");
    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLRDHUP);
    wait_("not accepted for 2.5 s", 2500);
    int s = accept(l, NULL, NULL);
    char b;
    if (s < 0 || send(c, "a", 1, 0) != 1 || recv(s, &b, 1, 0) != 1)
        die("the first exchange");
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = 9};
    printf("change the data: %d\n", epoll_ctl(ep, EPOLL_CTL_MOD, c, &e));
    again_("fell to TCP", l, a, c, s, 0, 0, false);
}

/* A vfork child puts the connected client in a set of its own and leaves; the parent's set
 * keeps its member across a disconnect and a new connect, which is accelerated as the others:
 * the child's entry said nothing of the parent's sets. */
static void vforked_(int l, struct sockaddr_in *a)
{
    int s;
    int c = settled_pair(l, a, &s);
    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN | EPOLLRDHUP);
    pid_t pid = vfork();
    if (pid == 0) {
        int e = epoll_create1(0);
        struct epoll_event v = {.events = EPOLLIN, .data.u64 = 5};
        _exit(e < 0 || epoll_ctl(e, EPOLL_CTL_ADD, c, &v) != 0);
    }
    int st = -1;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || st != 0)
        die("vfork child");
    again_("vforked", l, a, c, s, 0, 0, false);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    if ((ep = epoll_create1(0)) < 0)
        die("epoll_create1");
    round_("kept", l, &a, 0, 0);
    round_("changed", l, &a, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT);
    round_("deleted", l, &a, EPOLL_CTL_DEL, 0);
    fell_(l, &a);
    vforked_(l, &a);
    close(ep);
    close(l);
    printf("done\n");
    return 0;
}
