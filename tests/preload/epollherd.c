/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollherd: a server whose threads each wait in an epoll set of their own (as memcached's
 * workers do), and a client that keeps only one of them busy.  Plain POSIX; run over kernel TCP
 * and under `memlan run` (tests/py/test_preload.py).
 *
 * usage: epollherd THREADS PINGS [nest|poll]
 *
 * The parent is the server: it accepts THREADS connections and gives one to each of THREADS
 * threads, each with its own epoll set (level-triggered EPOLLIN), echoing whatever arrives.  A
 * forked child connects THREADS times and ping-pongs PINGS 64-byte messages over the first
 * connection only, checking each echo, then closes all.  Every server thread counts its
 * epoll_wait returns and its voluntary context switches (each sleep that ended), from the first
 * wait to the end.  It prints one line of JSON:
 *   {"threads":..., "pings":..., "busy_switches":..., "idle_switches":[...],
 *    "idle_returns":[...], "echoed":...}
 * and exits 0 only if every byte came back and every connection closed cleanly.
 *
 * With "nest", one more thread sleeps in a set of its own that holds an eventfd and the busy
 * thread's set, added with EPOLLIN and then modified to no events (as UCX's async thread holds its
 * interfaces' sets): it must never be woken until the eventfd is written at the end.  The line
 * then also has "async_switches" and "async_returns".
 *
 * With "poll", each server thread polls its connection (poll(2), POLLIN) before reading it
 * instead, as thread-per-connection servers and libtirpc's clients do.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "switches.h"
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXT 16

static void die(const char *what)
{
    fprintf(stderr, "epollherd[%d]: %s: %s\n", (int)getpid(), what, strerror(errno));
    exit(2);
}

static long switches(void)
{
    long v = thread_switches(0);
    if (v < 0)
        die("/proc/thread-self/status");
    return v;
}

static bool use_poll; /* "poll": poll(2) on the connection instead of an epoll set */

struct worker {
    pthread_t t;
    int fd;
    int ep;     /* made by main (nest), else -1 */
    long returns, switches, echoed;
    int status; /* 0 ok, 1 error */
};

static void *serve(void *p)
{
    struct worker *w = p;
    int ep = w->ep >= 0 ? w->ep : use_poll ? -1 : epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0 && !use_poll)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = w->fd};
    if (!use_poll && epoll_ctl(ep, EPOLL_CTL_ADD, w->fd, &ev) < 0)
        die("epoll_ctl");
    long s0 = switches();
    char buf[4096];
    for (;;) {
        struct epoll_event out[4];
        struct pollfd pf = {.fd = w->fd, .events = POLLIN};
        int n = use_poll ? poll(&pf, 1, 10000) : epoll_wait(ep, out, 4, 10000);
        w->returns++;
        if (n <= 0) {
            /* nothing for 10 s, or an error: a wake-up was lost */
            fprintf(stderr, "epollherd: thread on fd %d: %s %d: %s\n", w->fd,
                    use_poll ? "poll" : "epoll_wait", n, n ? strerror(errno) : "timed out");
            w->status = 1;
            break;
        }
        ssize_t r = recv(w->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0)
            break;
        if (r < 0) {
            if (errno == EAGAIN)
                continue;
            fprintf(stderr, "epollherd: thread on fd %d: recv: %s\n", w->fd, strerror(errno));
            w->status = 1;
            break;
        }
        ssize_t sent = send(w->fd, buf, (size_t)r, 0);
        if (sent != r) {
            fprintf(stderr, "epollherd: thread on fd %d: send %zd of %zd: %s\n", w->fd, sent, r,
                    sent < 0 ? strerror(errno) : "short");
            w->status = 1;
            break;
        }
        w->echoed += r;
    }
    w->switches = switches() - s0;
    if (ep >= 0)
        close(ep);
    return NULL;
}

/* nest: the thread that holds the busy thread's set with no events, and a stop eventfd. */
struct async {
    pthread_t t;
    int inner, stop;
    long returns, switches;
    int status;
};

static void *async_wait(void *p)
{
    struct async *a = p;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = a->stop};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a->stop, &ev) < 0)
        die("async epoll");
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = a->inner};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, a->inner, &ev) < 0)
        die("async epoll_ctl ADD inner");
    ev.events = 0;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, a->inner, &ev) < 0)
        die("async epoll_ctl MOD inner");
    long s0 = switches();
    for (;;) {
        struct epoll_event out[4];
        int n = epoll_wait(ep, out, 4, 30000);
        a->returns++;
        if (n <= 0) {
            fprintf(stderr, "epollherd: async: epoll_wait %d\n", n);
            a->status = 1;
            break;
        }
        if (n == 1 && out[0].data.fd == a->stop)
            break;
        fprintf(stderr, "epollherd: async: reported fd %d, events %#x\n", out[0].data.fd,
                out[0].events);
        a->status = 1;
        break;
    }
    a->switches = switches() - s0;
    close(ep);
    return NULL;
}

static int client(int port, int threads, int pings)
{
    int fds[MAXT];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int k = 0; k < threads; k++) {
        fds[k] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[k] < 0 || connect(fds[k], (struct sockaddr *)&a, sizeof a) < 0)
            die("connect");
        int one = 1;
        setsockopt(fds[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    char msg[64], back[64];
    for (int i = 0; i < pings; i++) {
        for (int j = 0; j < 64; j++)
            msg[j] = (char)(i * 7 + j);
        if (send(fds[0], msg, sizeof msg, 0) != (ssize_t)sizeof msg)
            die("send");
        size_t got = 0;
        while (got < sizeof back) {
            ssize_t r = recv(fds[0], back + got, sizeof back - got, 0);
            if (r <= 0)
                die("recv");
            got += (size_t)r;
        }
        if (memcmp(msg, back, sizeof msg) != 0) {
            fprintf(stderr, "epollherd: echo %d differs\n", i);
            return 1;
        }
    }
    for (int k = 0; k < threads; k++)
        close(fds[k]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 &&
        !(argc == 4 && (strcmp(argv[3], "nest") == 0 || strcmp(argv[3], "poll") == 0)))
        return fprintf(stderr, "usage: epollherd THREADS PINGS [nest|poll]\n"), 2;
    int threads = atoi(argv[1]), pings = atoi(argv[2]);
    bool nest = argc == 4 && strcmp(argv[3], "nest") == 0;
    use_poll = argc == 4 && !nest;
    if (threads < 1 || threads > MAXT || pings < 1)
        return fprintf(stderr, "epollherd: 1..%d threads, pings > 0\n", MAXT), 2;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 64) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0)
        die("listen");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(l);
        _exit(client(ntohs(a.sin_port), threads, pings));
    }
    struct worker w[MAXT] = {0};
    for (int k = 0; k < threads; k++) {
        w[k].ep = -1;
        w[k].fd = accept(l, NULL, NULL);
        if (w[k].fd < 0)
            die("accept");
    }
    struct async as = {.inner = -1, .stop = -1};
    if (nest) {
        if ((w[0].ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
            (as.stop = eventfd(0, EFD_CLOEXEC)) < 0)
            die("nest");
        as.inner = w[0].ep;
        if (pthread_create(&as.t, NULL, async_wait, &as) != 0)
            die("pthread_create");
    }
    /* The client connects in order and its connections are accepted in order: thread 0 has
     * the busy one. */
    for (int k = 0; k < threads; k++)
        if (pthread_create(&w[k].t, NULL, serve, &w[k]) != 0)
            die("pthread_create");
    int bad = 0;
    for (int k = 0; k < threads; k++) {
        pthread_join(w[k].t, NULL);
        bad |= w[k].status;
        close(w[k].fd);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        bad = 1;
    if (nest) {
        uint64_t one = 1;
        if (write(as.stop, &one, sizeof one) != sizeof one)
            die("write stop");
        pthread_join(as.t, NULL);
        bad |= as.status;
    }
    printf("{\"threads\":%d,\"pings\":%d,\"busy_switches\":%ld,\"idle_switches\":[", threads,
           pings, w[0].switches);
    for (int k = 1; k < threads; k++)
        printf("%s%ld", k > 1 ? "," : "", w[k].switches);
    printf("],\"idle_returns\":[");
    for (int k = 1; k < threads; k++)
        printf("%s%ld", k > 1 ? "," : "", w[k].returns);
    printf("],\"echoed\":%ld", w[0].echoed);
    if (nest)
        printf(",\"async_switches\":%ld,\"async_returns\":%ld", as.switches, as.returns);
    printf(",\"ok\":%s}\n", bad ? "false" : "true");
    return bad;
}
