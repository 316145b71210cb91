/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * watchhole: what another wait, a signal handler or a fork meets while epoll_wait spins with
 * its level-triggered readers watched, neither armed nor on the ready list (design.md,
 * "epoll_wait watches its members while it spins").  Plain POSIX; run over kernel TCP and
 * under `memlan run` with a long spin (MEMLAN_SPIN_US=300000) by tests/py/test_preload.py,
 * whose outputs must match.
 *
 * usage: watchhole PORT handler | blocked | fork | mod | del | close | dup2 | disconnect |
 *                  peerclose | peerkill
 *
 * Each mode: one connection from a forked client, in a level-triggered EPOLLIN set, three
 * ping-pongs through epoll_wait (the member is on the set's ready list, as a reported
 * level-triggered member is); then the server sends "g" and waits in epoll_wait (5 s), and
 * 5 ms into that wait (its spin, under memlan):
 *   handler: a SIGALRM handler calls epoll_wait on the same set (3 s); the client sends one byte
 *     50 ms after "g".  Over kernel TCP the handler's wait reports it ("handler: the handler's
 *     wait got 1 event").
 *   blocked: the SIGALRM handler lets another thread into epoll_wait on the same set (3 s) and
 *     waits until that wait returns; the client sends one byte 50 ms after "g".  Over kernel
 *     TCP the other thread's wait reports it ("blocked: the other thread's wait got 1 event").
 *   fork: another thread forks; the child closes the connection and lives 3 s, the parent's
 *     other thread closes it too.  Both copies are closed: the client reads end-of-file within
 *     2 s, as over kernel TCP ("fork: the client read EOF").
 *   mod, del, close, dup2, disconnect: another thread, 5 ms into the wait (500 ms), changes the
 *     member: MOD to EPOLLIN|EPOLLET, DEL (then the main thread adds it back and waits 1 s),
 *     close, a dup2 of a second connection over its fd, or connect(AF_UNSPEC).  For mod and
 *     del the client sends one byte 50 ms after "g"; for the others it waits 150 ms for the
 *     end of the connection, then sends one byte 50 ms later (and on the second connection).
 *     Printed: what the waits got ("MODE: the wait got R (events E), then R2"), and for close,
 *     dup2 and disconnect what the client read and what its send did; lines in either order.
 *   peerclose, peerkill: the client closes, or is killed by SIGKILL, 50 ms after "g"; the wait
 *     (3 s) reports the end as the kernel's does.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
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

static struct sockaddr_in addr;
static int ep, conn, p1[2], p2[2];
static volatile int other_got = -2;

static void msleep(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

/* One byte, waiting up to ms; 1, 0 at EOF, -1 when nothing came. */
static int get1(int s, char *c, int ms)
{
    struct pollfd p = {s, POLLIN, 0};
    for (;;) {
        int r = poll(&p, 1, ms);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        ssize_t k = recv(s, c, 1, 0);
        if (k == 1)
            return 1;
        if (k == 0)
            return 0;
        if (errno != EINTR && errno != EAGAIN)
            return 0; /* a reset: the end too */
    }
}

static void put1(int s, char c)
{
    while (send(s, &c, 1, MSG_NOSIGNAL) != 1)
        if (errno != EINTR && errno != EAGAIN)
            die("send");
}

static void on_nested(int sig)
{
    (void)sig;
    struct epoll_event ev;
    int saved = errno;
    other_got = epoll_wait(ep, &ev, 1, 3000);
    errno = saved;
}

static void on_blocked(int sig)
{
    (void)sig;
    int saved = errno;
    char c = 'x';
    if (write(p1[1], &c, 1) != 1)
        _exit(3);
    struct pollfd p = {p2[0], POLLIN, 0};
    if (poll(&p, 1, 4000) == 1 && read(p2[0], &c, 1) != 1)
        _exit(3);
    errno = saved;
}

static void *other_wait(void *a)
{
    (void)a;
    char c;
    if (read(p1[0], &c, 1) != 1)
        return NULL;
    struct epoll_event ev;
    other_got = epoll_wait(ep, &ev, 1, 3000);
    if (write(p2[1], "y", 1) != 1)
        _exit(3);
    return NULL;
}

static int conn2 = -1;
static const char *ctl_mode;

/* mod, del, close, dup2: another thread changes the member 5 ms into the wait. */
static void *changer(void *a)
{
    (void)a;
    char c;
    if (read(p1[0], &c, 1) != 1)
        return NULL;
    msleep(5);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = conn};
    int r = 0;
    if (!strcmp(ctl_mode, "mod"))
        r = epoll_ctl(ep, EPOLL_CTL_MOD, conn, &ev);
    else if (!strcmp(ctl_mode, "del"))
        r = epoll_ctl(ep, EPOLL_CTL_DEL, conn, NULL);
    else if (!strcmp(ctl_mode, "close"))
        r = close(conn);
    else if (!strcmp(ctl_mode, "dup2"))
        r = dup2(conn2, conn) == conn ? 0 : -1;
    else if (!strcmp(ctl_mode, "disconnect")) {
        struct sockaddr sa = {.sa_family = AF_UNSPEC};
        r = connect(conn, &sa, sizeof sa);
    }
    /* peerclose, peerkill: the client closes, or is killed, 50 ms into the wait */
    if (r != 0)
        die(ctl_mode);
    return NULL;
}

static void *forker(void *a)
{
    (void)a;
    char c;
    if (read(p1[0], &c, 1) != 1)
        return NULL;
    msleep(5);
    pid_t pid = fork();
    if (pid == 0) {
        close(conn);
        msleep(3000);
        _exit(0);
    }
    close(conn);
    int st;
    waitpid(pid, &st, 0);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: watchhole PORT MODE (see the top of watchhole.c)\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[2];
    int one = 1, ls = listen_backlog(atoi(argv[1]), 8, &addr);
    if (!strcmp(mode, "mod") || !strcmp(mode, "del") || !strcmp(mode, "close") ||
        !strcmp(mode, "dup2") || !strcmp(mode, "disconnect") || !strcmp(mode, "peerclose") ||
        !strcmp(mode, "peerkill"))
        ctl_mode = mode;
    pid_t client = fork();
    if (client == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0)
            die("connect");
        if (ctl_mode) { /* a second connection: dup2's */
            conn2 = socket(AF_INET, SOCK_STREAM, 0);
            if (conn2 < 0 || connect(conn2, (struct sockaddr *)&addr, sizeof addr) != 0)
                die("connect");
        }
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char c;
        for (int i = 0; i < 3; i++) {
            put1(s, 'p');
            if (get1(s, &c, 5000) != 1)
                _exit(1);
        }
        if (get1(s, &c, 5000) != 1 || c != 'g')
            _exit(1);
        if (ctl_mode && !strncmp(mode, "peer", 4)) {
            msleep(50);
            if (!strcmp(mode, "peerkill"))
                kill(getpid(), SIGKILL);
            close(s);
            _exit(0);
        }
        if (ctl_mode && strcmp(mode, "mod") && strcmp(mode, "del")) {
            /* close, dup2, disconnect: the end comes at once, as the kernel's file goes */
            int r;
            while ((r = get1(s, &c, 150)) == 1)
                ;
            msleep(50);
            ssize_t k = send(s, "d", 1, MSG_NOSIGNAL);
            printf("%s: the client read %s, then its send %s\n", mode,
                   r == 0 ? "EOF" : "no EOF in 150 ms", k == 1 ? "went" : strerror(errno));
            if (conn2 >= 0)
                put1(conn2, 'd');
            _exit(0);
        }
        if (ctl_mode) {
            msleep(50);
            put1(s, 'd');
            if (get1(s, &c, 2000) != 1 || c != 'e')
                _exit(1);
            _exit(0);
        }
        if (!strcmp(mode, "fork")) {
            int r;
            while ((r = get1(s, &c, 2000)) == 1)
                ;
            printf("fork: the client read %s\n", r == 0 ? "EOF" : "no EOF in 2 s");
            _exit(0);
        }
        msleep(50);
        put1(s, 'd');
        if (get1(s, &c, 10000) != 1)
            _exit(1);
        close(s);
        _exit(0);
    }
    conn = accept(ls, NULL, NULL);
    if (conn < 0 || (ctl_mode && (conn2 = accept(ls, NULL, NULL)) < 0))
        die("accept");
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = conn};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, conn, &ev) != 0)
        die("epoll_ctl");
    char c;
    for (int i = 0; i < 3; i++) {
        if (epoll_wait(ep, &ev, 1, 5000) != 1 || get1(conn, &c, 5000) != 1)
            die("ping");
        put1(conn, 'e');
    }
    if (pipe(p1) != 0 || pipe(p2) != 0)
        die("pipe");
    pthread_t t;
    sigset_t alrm, old;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, &old); /* the other thread never takes SIGALRM */
    if (ctl_mode)
        pthread_create(&t, NULL, changer, NULL);
    else if (!strcmp(mode, "blocked"))
        pthread_create(&t, NULL, other_wait, NULL);
    else if (!strcmp(mode, "fork"))
        pthread_create(&t, NULL, forker, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = !strcmp(mode, "handler") ? on_nested : on_blocked;
    sigaction(SIGALRM, &sa, NULL);
    put1(conn, 'g');
    if (ctl_mode) {
        if (write(p1[1], "x", 1) != 1)
            die("write");
        int r1 = epoll_wait(ep, &ev, 1, !strncmp(mode, "peer", 4) ? 3000 : 500);
        uint32_t e1 = r1 == 1 ? ev.events : 0;
        pthread_join(t, NULL);
        int r2 = 0;
        if (!strcmp(mode, "del")) {
            ev.events = EPOLLIN;
            ev.data.fd = conn;
            if (epoll_ctl(ep, EPOLL_CTL_ADD, conn, &ev) != 0)
                die("add again");
            r2 = epoll_wait(ep, &ev, 1, 1000);
        }
        printf("%s: the wait got %d (events %#x), then %d\n", mode, r1, e1, r2);
        if (!strcmp(mode, "mod") || !strcmp(mode, "del")) {
            if (get1(conn, &c, 5000) != 1 || c != 'd')
                die("last ping");
            put1(conn, 'e');
        }
        int st;
        waitpid(client, &st, 0);
        if (!strcmp(mode, "peerkill"))
            return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? 0 : 1;
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    if (!strcmp(mode, "fork")) {
        if (write(p1[1], "x", 1) != 1)
            die("write");
        (void)epoll_wait(ep, &ev, 1, 1000);
        pthread_join(t, NULL);
        int st;
        waitpid(client, &st, 0);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    struct itimerval it = {.it_value = {0, 5000}};
    setitimer(ITIMER_REAL, &it, NULL);
    int r = epoll_wait(ep, &ev, 1, 5000); /* 1, or -1 (EINTR) as the kernel's */
    (void)r;
    if (!strcmp(mode, "blocked"))
        pthread_join(t, NULL);
    printf("%s: the %s wait got %d event%s\n", mode,
           !strcmp(mode, "handler") ? "handler's" : "other thread's", other_got,
           other_got == 1 ? "" : "s");
    if (get1(conn, &c, 5000) != 1 || c != 'd')
        die("last ping");
    put1(conn, 'e');
    int st;
    waitpid(client, &st, 0);
    close(conn);
    return other_got == 1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
