/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * slotsfull: more processes wait on one connection than a direction has event-queue
 * registration slots (8, layout.h ML_EVQ_REFS).  Eight fork children poll the client end, all
 * alive, so that every slot is claimed; then the parent, a ninth process, waits on the same end
 * with epoll and with poll.  The server sends one byte: every waiter must report it, as over
 * kernel TCP.  A waiter that cannot claim a slot must look again by itself (nap), since no post
 * can reach it: before, the parent's epoll member left the ready list unarmed and was never
 * reported (epoll_wait timed out with the byte in the ring), and its poll heard of the byte
 * only at its liveness interval.
 *
 * usage: slotsfull PORT
 *
 * Every wait is bounded (epoll_wait 2 s, poll 2 s, the children's poll 4 s, an alarm of 20 s).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIDS 8

static struct sockaddr_in addr;
static int lfd;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

/* A settled pair: c the client end, s the accepted end. */
static void pair(int *c, int *s)
{
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (*c < 0 || connect(*c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    *s = accept(lfd, NULL, NULL);
    char b[2];
    if (*s < 0 || send(*s, "hi", 2, 0) != 2 || recv(*c, b, 2, MSG_WAITALL) != 2 ||
        send(*c, "ok", 2, 0) != 2 || recv(*s, b, 2, MSG_WAITALL) != 2)
        die("settle");
}

/* Fork KIDS children that poll c and stay alive (holding their registrations) until killed. */
static void kids(int c, pid_t *pid, int ready)
{
    for (int k = 0; k < KIDS; k++) {
        if ((pid[k] = fork()) < 0)
            die("fork");
        if (pid[k] == 0) {
            alarm(10);
            struct pollfd p = {c, POLLIN, 0};
            if (write(ready, "r", 1) != 1)
                _exit(2);
            int n = poll(&p, 1, 4000);
            if (write(ready, n == 1 ? "y" : "n", 1) != 1)
                _exit(2);
            for (;;)
                pause(); /* alive, its registration kept */
        }
    }
}

static void reap(pid_t *pid)
{
    for (int k = 0; k < KIDS; k++) {
        kill(pid[k], SIGKILL);
        waitpid(pid[k], NULL, 0);
    }
}

/* Read n of the children's answers: how many saw the byte. */
static int answers(int rd, int n, char want)
{
    int got = 0;
    for (int i = 0; i < n; i++) {
        char b;
        if (read(rd, &b, 1) != 1)
            die("read answers");
        got += b == want;
    }
    return got;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    alarm(20);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 8) < 0)
        die("listen");
    /* Another connection, polled first: the parent has a queue of its own before it forks. */
    int c0, s0;
    pair(&c0, &s0);
    struct pollfd p0 = {c0, POLLIN, 0};
    (void)poll(&p0, 1, 20);
    for (int round = 0; round < 2; round++) {
        const char *how = round == 0 ? "epoll" : "poll";
        int c, s, rp[2];
        pair(&c, &s);
        if (pipe(rp) < 0)
            die("pipe");
        pid_t pid[KIDS];
        kids(c, pid, rp[1]);
        if (answers(rp[0], KIDS, 'r') != KIDS)
            die("children");
        usleep(200000); /* every child asleep in its poll, its slot claimed */
        pid_t snd = fork();
        if (snd == 0) {
            usleep(300000); /* the ninth waiter asleep too */
            _exit(send(s, "x", 1, 0) == 1 ? 0 : 1);
        }
        int n;
        if (round == 0) {
            int ep = epoll_create1(0);
            struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
            if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0)
                die("epoll");
            struct epoll_event out[2];
            n = epoll_wait(ep, out, 2, 2000);
            close(ep);
        } else {
            struct pollfd p = {c, POLLIN, 0};
            n = poll(&p, 1, 2000);
        }
        waitpid(snd, NULL, 0);
        int kids_saw = answers(rp[0], KIDS, 'y');
        char b;
        ssize_t r = recv(c, &b, 1, MSG_DONTWAIT);
        printf("%s: the ninth waiter reported %d; %d of %d children saw the byte; recv %zd\n",
               how, n, kids_saw, KIDS, r);
        reap(pid);
        close(rp[0]);
        close(rp[1]);
        close(c);
        close(s);
    }
    close(c0);
    close(s0);
    printf("done\n");
    return 0;
}
