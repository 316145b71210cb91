/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkwake: a parent waiting on a socket is woken when its peer sends, whatever a fork child did
 * with the same socket before (issue 18, item 4: any number of waiters per direction, across
 * forked processes).  Run once over kernel TCP and once under `memlan run`: the outputs must be
 * equal (tests/py/test_preload.py).
 *
 * usage: forkwake PORT
 * A peer process connects and sends one byte when told.  Each round the parent forks a child
 * that polls the shared socket once (it times out: nothing has come) and then exits, or stays
 * asleep until the round ends; then the parent waits in epoll_wait (a set made before the fork)
 * or in poll, and the peer sends 30 ms later.  The parent must be woken by that byte: one event,
 * POLLIN, the byte read, and in most rounds within 90 ms of the wait's start (memlan's liveness
 * timer, which ends a wait whose wake-up was lost, looks first after 100 ms; the time itself is
 * not printed).  Under memlan the child's poll rewrote the direction's one event-queue reference
 * with its own queue, and its exit took the registration away: the parent's epoll set was never
 * posted again (its waits ran out with nothing), and its poll was woken only by that timer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 6
#define WAIT_MS 2000

static int to_peer[2], from_peer[2];

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

/* The peer: "l" answers at once and sends one byte 30 ms later (the parent is asleep by then);
 * "q" quits. */
static void peer(int port)
{
    alarm(60); /* bounded, whatever becomes of the parent */
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    char b;
    if (recv(c, &b, 1, MSG_WAITALL) != 1) /* the server speaks first: it has settled */
        die("hello");
    while (read(to_peer[0], &b, 1) == 1 && b == 'l') {
        if (write(from_peer[1], ".", 1) != 1)
            die("ack");
        usleep(30000);
        if (send(c, "d", 1, 0) != 1)
            die("send");
    }
    close(c);
    exit(0);
}

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* One round: a child polls s once, then exits (stay 0) or sleeps until killed (stay 1); then we
 * wait on s (in ep, or in poll when ep < 0) while the peer sends. */
static bool round_(int s, int ep, int stay, int k)
{
    int ready[2];
    if (pipe(ready) < 0)
        die("pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        alarm(30); /* not inherited: a parent that fails must not leave us asleep for ever */
        struct pollfd pf = {.fd = s, .events = POLLIN};
        int r = poll(&pf, 1, 20);
        char m = r == 0 ? '.' : 'x';
        if (write(ready[1], &m, 1) != 1)
            _exit(3);
        if (stay)
            for (;;)
                pause();
        exit(0);
    }
    char m = 0;
    if (read(ready[0], &m, 1) != 1)
        die("child");
    if (!stay) {
        int st;
        waitpid(pid, &st, 0);
    }
    if (write(to_peer[1], "l", 1) != 1 || read(from_peer[0], &m, 1) != 1)
        die("peer");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int n, rev = 0;
    if (ep >= 0) {
        struct epoll_event ev[4];
        n = epoll_wait(ep, ev, 4, WAIT_MS);
        if (n == 1)
            rev = (int)ev[0].events;
    } else {
        struct pollfd pf = {.fd = s, .events = POLLIN};
        n = poll(&pf, 1, WAIT_MS);
        rev = pf.revents;
    }
    long ms = ms_since(&t0);
    char b = 0;
    ssize_t got = recv(s, &b, 1, MSG_DONTWAIT);
    printf("%s child %s, round %d: child's poll %c, woken %d events %x, read %zd %c\n",
           ep >= 0 ? "epoll" : "poll", stay ? "sleeps" : "exits", k, m, n, rev, got,
           got == 1 ? b : '-');
    if (stay) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    close(ready[0]);
    close(ready[1]);
    /* Woken by the byte, 30 ms after the wait began, rather than by memlan's liveness timer (its
     * first look after 100 ms); on a loaded machine a round may be late, so the caller asks
     * this of most rounds, not all. */
    return n == 1 && ms < 90;
}

static void variant(int s, int ep, int stay)
{
    int prompt = 0;
    for (int k = 0; k < ROUNDS; k++)
        prompt += round_(s, ep, stay, k);
    printf("%s child %s: woken by the byte in most rounds: %s\n", ep >= 0 ? "epoll" : "poll",
           stay ? "sleeps" : "exits", 2 * prompt > ROUNDS ? "yes" : "no");
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    alarm(60);
    int port = atoi(argv[1]);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0)
        die("listen");
    if (pipe(to_peer) < 0 || pipe(from_peer) < 0)
        die("pipe");
    pid_t pp = fork();
    if (pp < 0)
        die("fork");
    if (pp == 0) {
        close(l);
        peer(port);
    }
    int s = accept(l, NULL, NULL);
    if (s < 0 || send(s, "h", 1, 0) != 1)
        die("accept");
    /* poll first, while the socket is in no epoll set (it then posts to the process's queue,
     * which a poll and the child's poll both use), then epoll (the set's own queue). */
    for (int stay = 0; stay < 2; stay++)
        variant(s, -1, stay);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 7};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0)
        die("epoll");
    for (int stay = 0; stay < 2; stay++)
        variant(s, ep, stay);
    if (write(to_peer[1], "q", 1) != 1)
        die("quit");
    waitpid(pp, NULL, 0);
    printf("done\n");
    return 0;
}
