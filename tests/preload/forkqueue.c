/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkqueue: a process that has polled and epolled a connection (under memlan it then has event
 * queues) forks a child that lives on, and leaves by _exit.  The child must not keep the dead
 * parent's queues alive (tests/py/test_preload.py cleans the fabric while the child lives: the
 * parent's queue files must go; the child's copies of them held their liveness lock).
 *
 * usage: forkqueue PORT    prints "child PID" once the parent is about to leave; the child
 * lives until its stdin closes.
 */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    alarm(60);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0)
        return 1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a) < 0)
        return 1;
    int s = accept(l, NULL, NULL);
    char b;
    if (s < 0 || send(s, "h", 1, 0) != 1 || recv(c, &b, 1, MSG_WAITALL) != 1)
        return 1;
    struct pollfd p = {.fd = s, .events = POLLIN};
    int r = poll(&p, 1, 20); /* nothing comes: it sleeps (on the process's queue) */
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    struct epoll_event out[1];
    if (r != 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0 ||
        epoll_wait(ep, out, 1, 20) != 0) /* the same on the set's own queue */
        return 1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30); /* not inherited: bounded even if nobody closes our stdin */
        while (read(0, &b, 1) > 0)
            ;
        _exit(0);
    }
    printf("child %d\n", (int)pid);
    fflush(stdout);
    _exit(0); /* as if killed: no exit handler of ours runs */
}
