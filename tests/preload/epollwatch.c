/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollwatch: an epoll server (level-triggered EPOLLIN) and a forked client, for the members an
 * epoll_wait watches while it spins instead of arming them (design.md, "epoll_wait watches its
 * members while it spins").  Plain POSIX; run over kernel TCP and under `memlan run`
 * (tests/py/test_preload.py), with the spin budget set by the test.
 *
 * usage: epollwatch PORT count N | gaps N | jump
 *
 * count N: one connection, N ping-pongs of 64 bytes, the server in epoll_wait before each read
 *   (server and client pinned to two cpus when there are two).
 *   It prints "count: N echoed", then waits for its stdin to end before it closes (the test
 *   reads the server's event queues' posts meanwhile: `memlan stat`).
 * gaps N: three connections in one set served by two threads (each reads and echoes under the
 *   connection's lock, nonblocking), and N pings, each on a connection and after a gap (0 to
 *   120 us, busy) drawn from a fixed seed, so that the data lands before, in and after the
 *   server's spin.  The client waits 5 s at most for each echo: a member that was neither armed
 *   nor on the ready list when its data came would never be reported ("gaps: stalled").
 * jump: after 50 ping-pongs (the server in epoll_wait before each read), a SIGALRM handler
 *   leaves the server's epoll_wait by siglongjmp 20 times, 2 ms into each wait, with nothing to
 *   read; then one ping comes and one epoll_wait of 5 s must report it
 *   ("jump: 20 jumps, then 1 event").  A jump out of the spin must put the members it watched
 *   back where the next wait finds them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "twoends.h"

#define NCONN 3

static struct sockaddr_in addr;

static int dial(void)
{
    int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0)
        die("connect");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
}

/* All of n bytes, waiting at most 5 s for each piece; 0 at EOF, -1 on a stall. */
static int get(int s, char *b, size_t n)
{
    size_t g = 0;
    while (g < n) {
        struct pollfd p = {s, POLLIN, 0};
        int r = poll(&p, 1, 5000);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        ssize_t k = recv(s, b + g, n - g, 0);
        if (k == 0)
            return 0;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            die("recv");
        }
        g += (size_t)k;
    }
    return 1;
}

static void put(int s, const char *b, size_t n)
{
    size_t g = 0;
    while (g < n) {
        ssize_t k = send(s, b + g, n - g, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            die("send");
        }
        g += (size_t)k;
    }
}

static void spin_us(unsigned us)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < (long)us * 1000);
}

/* ---- count ---- */

static int count_mode(int ls, long n)
{
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        int s = dial();
        char b[64];
        for (long i = 0; i < n; i++) {
            memset(b, (int)(i & 0x7f), sizeof b);
            put(s, b, sizeof b);
            if (get(s, b, sizeof b) != 1 || b[0] != (char)(i & 0x7f)) {
                printf("count: bad echo at %ld\n", i);
                _exit(1);
            }
        }
        _exit(0);
    }
    pin(0);
    int s = accept(ls, NULL, NULL), one = 1;
    if (s < 0)
        die("accept");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) != 0)
        die("epoll_ctl");
    long done = 0;
    char b[64];
    while (done < n) {
        int r = epoll_wait(ep, &ev, 1, 5000);
        if (r == 0) {
            printf("count: stalled at %ld\n", done);
            return 1;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        if (get(s, b, sizeof b) != 1)
            die("server get");
        put(s, b, sizeof b);
        done++;
    }
    int st;
    waitpid(pid, &st, 0);
    printf("count: %ld echoed\n", done);
    fflush(stdout);
    while (read(0, b, sizeof b) > 0) /* the test looks at our queues now */
        ;
    close(s);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* ---- gaps ---- */

static int conns[NCONN];
static pthread_mutex_t conn_mu[NCONN] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                         PTHREAD_MUTEX_INITIALIZER};
static int gap_ep, ended; /* ended: connections at EOF, under end_mu */
static pthread_mutex_t end_mu = PTHREAD_MUTEX_INITIALIZER;
static int at_eof[NCONN];

static void *gap_server(void *a)
{
    (void)a;
    for (;;) {
        pthread_mutex_lock(&end_mu);
        int e = ended;
        pthread_mutex_unlock(&end_mu);
        if (e == NCONN)
            return NULL;
        struct epoll_event ev[4];
        int r = epoll_wait(gap_ep, ev, 4, 100);
        if (r < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < r; i++) {
            int k = (int)ev[i].data.u32;
            pthread_mutex_lock(&conn_mu[k]);
            char b[4096];
            for (;;) {
                ssize_t g = recv(conns[k], b, sizeof b, 0);
                if (g > 0) {
                    put(conns[k], b, (size_t)g);
                    continue;
                }
                if (g == 0 && !at_eof[k]) {
                    at_eof[k] = 1;
                    epoll_ctl(gap_ep, EPOLL_CTL_DEL, conns[k], NULL);
                    pthread_mutex_lock(&end_mu);
                    ended++;
                    pthread_mutex_unlock(&end_mu);
                }
                if (g < 0 && errno != EAGAIN && errno != EINTR)
                    die("server recv");
                break;
            }
            pthread_mutex_unlock(&conn_mu[k]);
        }
    }
}

static int gaps_mode(int ls, long n)
{
    pid_t pid = fork();
    if (pid == 0) {
        int s[NCONN];
        for (int k = 0; k < NCONN; k++)
            s[k] = dial();
        unsigned seed = 12345;
        char b[64];
        for (long i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            int k = (int)((seed >> 16) % NCONN);
            spin_us((seed >> 8) % 121);
            memset(b, (int)(i & 0x7f), sizeof b);
            put(s[k], b, sizeof b);
            int r = get(s[k], b, sizeof b);
            if (r != 1) {
                printf("gaps: %s at %ld\n", r < 0 ? "stalled" : "eof", i);
                fflush(stdout);
                _exit(1);
            }
            if (b[0] != (char)(i & 0x7f) || b[63] != (char)(i & 0x7f)) {
                printf("gaps: bad echo at %ld\n", i);
                _exit(1);
            }
        }
        printf("gaps: %ld rounds echoed\n", n);
        fflush(stdout);
        for (int k = 0; k < NCONN; k++)
            close(s[k]);
        _exit(0);
    }
    gap_ep = epoll_create1(0);
    for (int k = 0; k < NCONN; k++) {
        int one = 1;
        conns[k] = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
        if (conns[k] < 0)
            die("accept");
        setsockopt(conns[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)k};
        if (epoll_ctl(gap_ep, EPOLL_CTL_ADD, conns[k], &ev) != 0)
            die("epoll_ctl");
    }
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, gap_server, NULL);
    int st;
    waitpid(pid, &st, 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* ---- jump ---- */

static sigjmp_buf jb;

static void on_alarm(int sig)
{
    (void)sig;
    siglongjmp(jb, 1);
}

static int jump_mode(int ls)
{
    int go[2];
    if (pipe(go) != 0)
        die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(go[1]);
        int s = dial();
        char b[64] = {1};
        for (int i = 0; i < 50; i++) {
            put(s, b, sizeof b);
            if (get(s, b, sizeof b) != 1)
                _exit(1);
        }
        if (read(go[0], b, 1) != 1)
            _exit(1);
        b[0] = 2;
        put(s, b, sizeof b);
        if (get(s, b, sizeof b) != 1 || b[0] != 2)
            _exit(1);
        close(s);
        _exit(0);
    }
    close(go[0]);
    int s = accept(ls, NULL, NULL), one = 1;
    if (s < 0)
        die("accept");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char b[64];
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) != 0)
        die("epoll_ctl");
    for (int i = 0; i < 50; i++) { /* pings as in count: what the set armed is used up */
        if (epoll_wait(ep, &ev, 1, 5000) != 1 || get(s, b, sizeof b) != 1)
            die("ping");
        put(s, b, sizeof b);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    volatile int jumps = 0, events = 0;
    for (int i = 0; i < 20; i++) {
        if (sigsetjmp(jb, 1) == 0) {
            struct itimerval it = {.it_value = {0, 2000}};
            setitimer(ITIMER_REAL, &it, NULL);
            events += epoll_wait(ep, &ev, 1, 1000);
            struct itimerval off = {{0, 0}, {0, 0}};
            setitimer(ITIMER_REAL, &off, NULL);
        } else {
            jumps++;
        }
    }
    if (write(go[1], "g", 1) != 1)
        die("write");
    int r = epoll_wait(ep, &ev, 1, 5000);
    printf("jump: %d jumps, %d events before, then %d event%s\n", jumps, events, r,
           r == 1 ? "" : "s");
    if (r == 1) {
        if (get(s, b, sizeof b) != 1)
            die("second ping");
        put(s, b, sizeof b);
    }
    int st;
    waitpid(pid, &st, 0);
    close(s);
    return r == 1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: epollwatch PORT count N | gaps N | jump\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ls = listen_backlog(atoi(argv[1]), 8, &addr);
    long n = argc > 3 ? atol(argv[3]) : 0;
    if (!strcmp(argv[2], "count"))
        return count_mode(ls, n);
    if (!strcmp(argv[2], "gaps"))
        return gaps_mode(ls, n);
    if (!strcmp(argv[2], "jump"))
        return jump_mode(ls);
    fprintf(stderr, "unknown mode %s\n", argv[2]);
    return 2;
}
