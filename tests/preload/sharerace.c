/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sharerace: two threads' first sends on a connection that another process holds (a fork
 * child, while this process exec'd itself): each send takes the direction's mutex, and the first
 * makes the socket's shared lock page.  Driven by tests/py (under gdb): thread A is stopped right
 * after it read which locks the socket uses (its private ones, no page yet), thread B then sends
 * (making the page), and A goes on.  A must take the page's mutex, not the private one that B
 * and every later holder no longer take.  Run alone it is a plain test: "peer read 2".
 *
 * usage: sharerace PORT
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "twoends.h"

static int c;

static void *thr(void *a)
{
    usleep(a ? 300000 : 100000); /* A first, then B */
    if (send(c, a ? "B" : "A", 1, 0) != 1)
        die("send");
    getppid(); /* where gdb stops B */
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    alarm(60);
    if (argc == 4) { /* exec'd: the connection's ends on argv[2] and argv[3] */
        getpgrp(); /* where gdb begins */
        c = atoi(argv[2]);
        int s = atoi(argv[3]);
        pthread_t ta, tb;
        pthread_create(&ta, NULL, thr, NULL);
        pthread_create(&tb, NULL, thr, (void *)1);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        char b[2];
        struct timeval tv = {5, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ssize_t n = recv(s, b, 2, MSG_WAITALL);
        printf("peer read %zd\n", n);
        return 0;
    }
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = listen_backlog(atoi(argv[1]), 4, &a), s;
    c = settled_pair(l, &a, &s);
    fcntl(l, F_SETFD, FD_CLOEXEC);
    pid_t p = fork(); /* holds both ends while we exec */
    if (p < 0)
        die("fork");
    if (p == 0) {
        sleep(3);
        _exit(0);
    }
    char cs[16], ss[16];
    snprintf(cs, sizeof cs, "%d", c);
    snprintf(ss, sizeof ss, "%d", s);
    execl("/proc/self/exe", argv[0], "-", cs, ss, (char *)NULL);
    die("exec");
}
