/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollconf: epoll and poll semantics, scripted, printed line by line.  Run once over kernel TCP
 * and once under `memlan run`: the two outputs must be equal (tests/py/test_preload.py).
 *
 * usage: epollconf PORT
 * The parent is the server and watches; a forked child is the client and acts when told, over a
 * pipe, and says when it has acted.  Everything the server prints is deterministic over loopback
 * TCP: a byte the client sent before it answered is already in the server's receive queue.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define NCONN 4

static int to_child[2], to_parent[2];

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

/* ---- the client: one command per line: "s I N" send N bytes on conn I, "w I" shut WR,
 *      "c I" close, "q" quit.  It answers '.' once done. ---- */
static void client(int port)
{
    int c[NCONN];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    for (int i = 0; i < NCONN; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (c[i] < 0 || connect(c[i], (struct sockaddr *)&a, sizeof a) < 0)
            die("connect");
        /* The server speaks first on each connection: it has settled before the script runs. */
        char b;
        if (recv(c[i], &b, 1, MSG_WAITALL) != 1)
            die("hello");
    }
    FILE *in = fdopen(to_child[0], "r");
    char line[64];
    static char buf[1 << 20];
    memset(buf, 'x', sizeof buf);
    while (fgets(line, sizeof line, in)) {
        int i = 0, n = 0;
        if (line[0] == 'q')
            break;
        if (line[0] == 'l' && sscanf(line + 1, "%d %d", &i, &n) == 2) {
            /* late: answer at once, send 50 ms later (the server is asleep by then) */
            if (write(to_parent[1], ".", 1) != 1)
                die("ack");
            usleep(50000);
            if (send(c[i], buf, (size_t)n, 0) != n)
                die("send late");
            continue;
        }
        if (line[0] == 's' && sscanf(line + 1, "%d %d", &i, &n) == 2) {
            for (int off = 0; off < n;) {
                ssize_t w = send(c[i], buf, (size_t)(n - off), 0);
                if (w <= 0)
                    die("send");
                off += (int)w;
            }
        } else if (line[0] == 'w' && sscanf(line + 1, "%d", &i) == 1) {
            shutdown(c[i], SHUT_WR);
        } else if (line[0] == 'c' && sscanf(line + 1, "%d", &i) == 1) {
            close(c[i]);
        } else if (line[0] == 'r' && sscanf(line + 1, "%d %d", &i, &n) == 2) {
            for (int got = 0; got < n;) {
                ssize_t r = recv(c[i], buf, (size_t)(n - got), 0);
                if (r <= 0)
                    die("recv");
                got += (int)r;
            }
        }
        if (write(to_parent[1], ".", 1) != 1)
            die("ack");
    }
    _exit(0);
}

static void act(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void act(const char *fmt, ...)
{
    char line[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    line[n++] = '\n';
    if (write(to_child[1], line, (size_t)n) != n)
        die("tell");
    if (line[0] == 'q')
        return;
    char ack;
    if (read(to_parent[0], &ack, 1) != 1)
        die("wait ack");
    usleep(2000); /* kernel TCP: the FIN of a close reaches the peer's socket */
}

static int conn[NCONN];

/* Print what one epoll_wait returns: events masked to the bits both paths define, and which
 * connection (data.u64 = 1000 + index). */
static void show(const char *what, int ep, int max, int tmo)
{
    struct epoll_event ev[16];
    int n = epoll_wait(ep, ev, max, tmo);
    printf("%s: n=%d", what, n);
    for (int i = 0; i < n; i++)
        printf(" [%llu %s%s%s%s%s]", (unsigned long long)ev[i].data.u64,
               ev[i].events & EPOLLIN ? "IN " : "", ev[i].events & EPOLLOUT ? "OUT " : "",
               ev[i].events & EPOLLRDHUP ? "RDHUP " : "", ev[i].events & EPOLLHUP ? "HUP " : "",
               ev[i].events & EPOLLERR ? "ERR" : "");
    printf("\n");
}

static void add(int ep, int op, int i, uint32_t events)
{
    struct epoll_event e = {.events = events, .data.u64 = 1000 + (uint64_t)i};
    int r = epoll_ctl(ep, op, conn[i], &e);
    printf("ctl op=%d conn=%d events=%x: %d%s%s\n", op, i, events, r, r ? " " : "",
           r ? strerror(errno) : "");
}

static int drain_quiet;

static void drain(int i, int n)
{
    static char buf[1 << 20];
    int got = 0;
    while (got < n) {
        ssize_t r = recv(conn[i], buf, (size_t)(n - got), MSG_DONTWAIT);
        if (r <= 0)
            break;
        got += (int)r;
    }
    if (!drain_quiet)
        printf("read conn=%d %d\n", i, got);
}

struct excl_arg {
    int ep, n;
};

static void *excl_wait(void *p)
{
    struct excl_arg *a = p;
    struct epoll_event ev[4];
    a->n = epoll_wait(a->ep, ev, 4, 1500);
    return NULL;
}

static void exclusive_case(void)
{
    struct excl_arg a[2];
    pthread_t t[2];
    for (int k = 0; k < 2; k++) {
        a[k].ep = epoll_create1(0);
        struct epoll_event e = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = 4000 + (uint64_t)k};
        int r = epoll_ctl(a[k].ep, EPOLL_CTL_ADD, conn[2], &e);
        printf("ctl exclusive %d: %d\n", k, r);
    }
    struct epoll_event e = {.events = EPOLLIN | EPOLLEXCLUSIVE};
    int r = epoll_ctl(a[0].ep, EPOLL_CTL_MOD, conn[2], &e);
    printf("mod exclusive: %d %s\n", r, r ? strerror(errno) : "");
    for (int k = 0; k < 2; k++)
        pthread_create(&t[k], NULL, excl_wait, &a[k]);
    usleep(300000); /* both asleep (past any spin) before the byte comes */
    act("s 2 1");
    int woke = 0;
    for (int k = 0; k < 2; k++) {
        pthread_join(t[k], NULL);
        woke += a[k].n;
    }
    printf("exclusive: %d of 2 sets reported it\n", woke);
    drain(2, 1);
    for (int k = 0; k < 2; k++)
        close(a[k].ep);
}


/* A thread asleep on a set that has no member yet: a socket added meanwhile, then data. */
struct addwait_arg {
    int ep, n;
    uint64_t data;
};

static void *addwait_wait(void *p)
{
    struct addwait_arg *a = p;
    struct epoll_event ev[4];
    a->n = epoll_wait(a->ep, ev, 4, 3000);
    a->data = a->n > 0 ? ev[0].data.u64 : 0;
    return NULL;
}

static void added_while_waiting(void)
{
    struct addwait_arg a = {.ep = epoll_create1(0)};
    pthread_t t;
    pthread_create(&t, NULL, addwait_wait, &a);
    usleep(100000); /* asleep in the set, which holds nothing yet */
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 5000};
    printf("ctl add while waiting: %d\n", epoll_ctl(a.ep, EPOLL_CTL_ADD, conn[2], &e));
    act("l 2 6");
    pthread_join(t, NULL);
    printf("added while waiting: n=%d data=%llu\n", a.n, (unsigned long long)a.data);
    drain(2, 6);
    close(a.ep);
}

/* A set whose socket of ours left, holding a pipe now: while the process's other set sleeps and
 * is woken by its socket, this set must report nothing but the pipe, whatever its kernel set
 * held of ours. */
static void emptied_set(int ep)
{
    int p[2];
    if (pipe(p) < 0)
        die("pipe");
    int ep3 = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 6000};
    printf("ctl ep3 add: %d\n", epoll_ctl(ep3, EPOLL_CTL_ADD, conn[0], &e));
    show("ep3 member idle", ep3, 8, 0);
    printf("ctl ep3 del: %d\n", epoll_ctl(ep3, EPOLL_CTL_DEL, conn[0], NULL));
    e.data.u64 = 6001;
    printf("ctl ep3 pipe: %d\n", epoll_ctl(ep3, EPOLL_CTL_ADD, p[0], &e));
    for (int k = 0; k < 3; k++) {
        act("l 0 2");
        show("set 1 woken late", ep, 8, 1000);
        drain(0, 2);
        show("ep3 nothing", ep3, 8, 20);
    }
    if (write(p[1], "p", 1) != 1)
        die("write pipe");
    show("ep3 pipe", ep3, 8, 1000);
    close(ep3);
    close(p[0]);
    close(p[1]);
}

/* Edge-triggered with input and output: output is reported once, not on every wait; new data is
 * a new edge, reported with output as the kernel does. */
static void et_in_out(int ep)
{
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN | EPOLLOUT | EPOLLET);
    show("et in+out", ep, 8, 0);
    show("et in+out no new edge", ep, 8, 0);
    show("et in+out still none", ep, 8, 20);
    act("s 0 3");
    show("et in+out data", ep, 8, 1000);
    show("et in+out data no new edge", ep, 8, 0);
    drain(0, 3);
    show("et in+out drained", ep, 8, 0);
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN);
}

/* maxevents smaller than the ready sockets of ours, and a kernel fd ready in the same set: every
 * ready fd is reported within a bounded number of waits (the kernel's ready list is a queue). */
static void no_starvation(int ep)
{
    int p[2];
    if (pipe(p) < 0)
        die("pipe");
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 7000};
    printf("ctl pipe: %d\n", epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &e));
    if (write(p[1], "p", 1) != 1)
        die("write pipe");
    act("s 0 1");
    act("s 2 1");
    act("s 3 1");
    int seen = 0, calls = 0;
    for (; calls < 100000 && seen != 0xf; calls++) {
        struct epoll_event ev[1];
        int n = epoll_wait(ep, ev, 1, 1000);
        for (int i = 0; i < n; i++)
            seen |= ev[i].data.u64 == 7000 ? 1 << 1 : 1 << (int)(ev[i].data.u64 - 1000);
    }
    printf("max=1, three sockets and a pipe ready: all seen %s\n", seen == 0xf ? "yes" : "no");
    drain_quiet = 1;
    drain(0, 1);
    drain(2, 1);
    drain(3, 1);
    drain_quiet = 0;
    epoll_ctl(ep, EPOLL_CTL_DEL, p[0], NULL);
    close(p[0]);
    close(p[1]);
}

/* Two waiters on one socket: a thread blocked in recv and another in poll.  The data wakes both
 * (two bytes: the reader takes one, the poller still sees the other). */
static void *rp_poll(void *p)
{
    struct pollfd pf = {.fd = conn[3], .events = POLLIN};
    int r = poll(&pf, 1, 3000);
    *(int *)p = r == 1 ? pf.revents : -r - 100;
    return NULL;
}

static void *rp_recv(void *p)
{
    char b;
    *(int *)p = (int)recv(conn[3], &b, 1, 0);
    return NULL;
}

static void recv_and_poll(void)
{
    int pr = 0, rr = 0;
    pthread_t tp, tr;
    pthread_create(&tp, NULL, rp_poll, &pr);
    usleep(100000); /* the poller sleeps first; the reader arms after it */
    pthread_create(&tr, NULL, rp_recv, &rr);
    usleep(100000);
    act("l 3 2");
    pthread_join(tp, NULL);
    pthread_join(tr, NULL);
    printf("recv and poll on one socket: recv %d, poll revents %x\n", rr, pr);
    drain(3, 1);
}

/* An epoll fd duplicated (dup, F_DUPFD_CLOEXEC, dup2 over another set), used after the original
 * closed, and asked by poll and select (how GLib, Qt and libuv embed one loop in another): each
 * names the kernel's one set, with its members.  conn 0 is in ep, level-triggered input. */
static void dup_and_poll_sets(int ep)
{
    int d = dup(ep);
    int d2 = fcntl(ep, F_DUPFD_CLOEXEC, 100);
    act("s 0 4");
    show("dup of set", d, 8, 1000);
    show("F_DUPFD of set", d2, 8, 0);
    show("original", ep, 8, 0);
    drain(0, 4);
    show("dup, read", d, 8, 0);
    close(d);
    close(d2);

    int e1 = epoll_create1(0);
    add(e1, EPOLL_CTL_ADD, 0, EPOLLIN);
    int e2 = dup(e1);
    close(e1);
    act("s 0 3");
    show("dup after close of original", e2, 8, 1000);
    int e3 = epoll_create1(0);
    printf("dup2 over a set: %d\n", dup2(e2, e3) == e3);
    show("dup2 target", e3, 8, 0);
    close(e2);
    show("dup2 target, source closed", e3, 8, 0);
    drain(0, 3);
    show("dup2 target, read", e3, 8, 0);
    close(e3);

    /* poll and select on an epoll fd: readable exactly while a member is ready. */
    int pe = epoll_create1(0);
    add(pe, EPOLL_CTL_ADD, 0, EPOLLIN);
    struct pollfd pf = {.fd = pe, .events = POLLIN};
    int r = poll(&pf, 1, 0);
    printf("poll set idle: %d %x\n", r, pf.revents);
    act("s 0 2");
    r = poll(&pf, 1, 1000);
    printf("poll set, data: %d %x\n", r, pf.revents);
    r = poll(&pf, 1, 0);
    printf("poll set, data again: %d %x\n", r, pf.revents);
    show("set after poll", pe, 8, 0);
    drain(0, 2);
    r = poll(&pf, 1, 0);
    printf("poll set, read: %d %x\n", r, pf.revents);
    act("l 0 1"); /* arrives while poll sleeps */
    r = poll(&pf, 1, 1000);
    printf("poll set, woken: %d %x\n", r, pf.revents);
    drain(0, 1);
    int pd = dup(pe);
    act("s 0 1");
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(pd, &rs);
    struct timeval tv = {1, 0};
    r = select(pd + 1, &rs, NULL, NULL, &tv);
    printf("select dup of set, data: %d %d\n", r, FD_ISSET(pd, &rs) ? 1 : 0);
    drain(0, 1);
    FD_ZERO(&rs);
    FD_SET(pd, &rs);
    tv = (struct timeval){0, 0};
    r = select(pd + 1, &rs, NULL, NULL, &tv);
    printf("select dup of set, read: %d %d\n", r, FD_ISSET(pd, &rs) ? 1 : 0);
    close(pd);
    close(pe);
}

/* fork: parent and child share one connection (small rings: SO_RCVBUF and SO_SNDBUF set before
 * it exists).  The child moves many rings' worth each way on its copy and exits; then the
 * parent's poll must see a healthy connection (output only: no POLLERR), and its send and recv
 * work (no ECONNRESET), as over kernel TCP. */
#define FORK_BYTES (64 * 1024)
static void fork_shared_conn(void)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    setsockopt(l, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0)
        die("fork case listen");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(c, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        die("fork case connect");
    int s = accept(l, NULL, NULL);
    if (s < 0 || send(s, "h", 1, 0) != 1)
        die("fork case accept");
    char b;
    if (recv(c, &b, 1, MSG_WAITALL) != 1)
        die("fork case hello");
    static char buf[FORK_BYTES];
    memset(buf, 'f', sizeof buf);
    int done[2];
    if (pipe(done) < 0)
        die("pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* the child: reads, then writes, many rings' worth on its copy of s */
        for (int got = 0; got < FORK_BYTES;) {
            ssize_t r = recv(s, buf, sizeof buf, 0);
            if (r <= 0)
                _exit(3);
            got += (int)r;
        }
        if (send(s, buf, FORK_BYTES, 0) != FORK_BYTES)
            _exit(4);
        if (write(done[1], ".", 1) != 1)
            _exit(5);
        exit(0);
    }
    if (send(c, buf, FORK_BYTES, 0) != FORK_BYTES)
        die("fork case send");
    int got = 0;
    while (got < FORK_BYTES) {
        ssize_t r = recv(c, buf, sizeof buf, 0);
        if (r <= 0)
            die("fork case recv");
        got += (int)r;
    }
    char d;
    if (read(done[0], &d, 1) != 1)
        die("fork case done");
    int st;
    waitpid(pid, &st, 0);
    printf("fork: child exit %d, parent read %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1, got);
    struct pollfd pf = {.fd = s, .events = POLLIN | POLLOUT};
    int r = poll(&pf, 1, 0);
    printf("fork: parent polls its copy: %d %x\n", r, pf.revents);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = 9000};
    int fe = epoll_create1(0);
    epoll_ctl(fe, EPOLL_CTL_ADD, s, &ev);
    show("fork: parent's epoll", fe, 8, 0);
    ssize_t w = send(s, "abc", 3, 0);
    printf("fork: parent sends: %zd %s\n", w, w < 0 ? strerror(errno) : "");
    ssize_t n = recv(c, buf, sizeof buf, 0);
    printf("fork: peer gets %zd\n", n);
    if (send(c, "xy", 2, 0) != 2)
        die("fork case send 2");
    r = poll(&pf, 1, 1000);
    printf("fork: parent polls, data: %d %x\n", r, pf.revents);
    n = recv(s, buf, sizeof buf, 0);
    printf("fork: parent recv: %zd %s\n", n, n < 0 ? strerror(errno) : "");
    close(fe);
    close(s);
    close(c);
    close(l);
    close(done[0]);
    close(done[1]);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    int port = atoi(argv[1]);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 16) < 0)
        die("listen");
    if (pipe(to_child) < 0 || pipe(to_parent) < 0)
        die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(l);
        client(port);
    }
    for (int i = 0; i < NCONN; i++) {
        conn[i] = accept(l, NULL, NULL);
        if (conn[i] < 0 || send(conn[i], "h", 1, 0) != 1)
            die("accept");
    }
    fork_shared_conn();
    int ep = epoll_create1(EPOLL_CLOEXEC);

    /* Level-triggered input. */
    add(ep, EPOLL_CTL_ADD, 0, EPOLLIN);
    show("lt empty", ep, 8, 0);
    act("s 0 10");
    show("lt data", ep, 8, 1000);
    show("lt again", ep, 8, 0);
    drain(0, 5);
    show("lt half read", ep, 8, 0);
    drain(0, 5);
    show("lt all read", ep, 8, 0);
    show("lt timeout", ep, 8, 30);

    /* Edge-triggered input. */
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN | EPOLLET);
    show("et empty", ep, 8, 0);
    act("s 0 10");
    show("et data", ep, 8, 1000);
    show("et no new edge", ep, 8, 0);
    act("s 0 1");
    show("et new data", ep, 8, 1000);
    drain(0, 11);
    show("et drained", ep, 8, 0);

    /* One-shot. */
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN | EPOLLONESHOT);
    act("s 0 3");
    show("oneshot fires", ep, 8, 1000);
    act("s 0 3");
    show("oneshot disabled", ep, 8, 30);
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN | EPOLLONESHOT);
    show("oneshot rearmed", ep, 8, 0);
    drain(0, 6);

    /* Output, and input with output. */
    add(ep, EPOLL_CTL_MOD, 0, EPOLLOUT);
    show("out", ep, 8, 0);
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN | EPOLLOUT);
    act("s 0 2");
    show("in+out", ep, 8, 0);
    drain(0, 2);

    /* Before any set holds another (which sends every wait of the process our way). */
    et_in_out(ep);
    emptied_set(ep);
    added_while_waiting();
    recv_and_poll();
    dup_and_poll_sets(ep);

    /* Several connections: only the ones with data; maxevents smaller than the ready count. */
    add(ep, EPOLL_CTL_MOD, 0, EPOLLIN);
    for (int i = 1; i < NCONN; i++)
        add(ep, EPOLL_CTL_ADD, i, EPOLLIN);
    add(ep, EPOLL_CTL_ADD, 1, EPOLLIN); /* EEXIST */
    act("s 2 7");
    show("one of four", ep, 8, 1000);
    act("s 3 7");
    act("s 1 7");
    struct epoll_event evs[4];
    int seen = 0;
    drain_quiet = 1; /* the order of equally ready sockets is not specified */
    for (int k = 0; k < 3; k++) {
        int n = epoll_wait(ep, evs, 1, 1000);
        for (int i = 0; i < n; i++)
            seen |= 1 << (int)(evs[i].data.u64 - 1000);
        for (int i = 0; i < n; i++)
            drain((int)(evs[i].data.u64 - 1000), 7);
    }
    drain_quiet = 0;
    printf("max=1 three times: conns seen %x\n", seen);
    show("all read", ep, 8, 0);
    no_starvation(ep);

    /* The same socket in two sets. */
    int ep2 = epoll_create1(0);
    struct epoll_event e2 = {.events = EPOLLIN, .data.u64 = 2001};
    printf("ctl ep2: %d\n", epoll_ctl(ep2, EPOLL_CTL_ADD, conn[1], &e2));
    act("s 1 4");
    show("set 1", ep, 8, 1000);
    show("set 2", ep2, 8, 1000);
    drain(1, 4);
    show("set 2 read", ep2, 8, 0);

    /* An epoll set inside another. */
    int outer = epoll_create1(0);
    struct epoll_event eo = {.events = EPOLLIN, .data.u64 = 3001};
    printf("ctl outer: %d\n", epoll_ctl(outer, EPOLL_CTL_ADD, ep2, &eo));
    show("outer idle", outer, 8, 0);
    act("s 1 4");
    show("outer sees inner", outer, 8, 1000);
    show("inner", ep2, 8, 0);
    drain(1, 4);
    show("inner read", ep2, 8, 0);
    /* Traffic on a socket the inner set does not hold (conn 2 is in the first set only): the
     * inner set must not look readable to the outer one, whether the outer is epoll or poll. */
    act("s 2 3");
    show("outer, other socket", outer, 8, 100);
    struct pollfd po = {.fd = ep2, .events = POLLIN};
    printf("poll inner, other socket: %d %x\n", poll(&po, 1, 100), po.revents);
    show("set 1 has it", ep, 8, 1000);
    drain(2, 3);
    /* Ready, then read behind the outer set's back: no longer readable. */
    act("s 1 2");
    show("outer, inner ready", outer, 8, 1000);
    drain(1, 2);
    show("outer, read meanwhile", outer, 8, 100);
    printf("poll inner, read meanwhile: %d %x\n", poll(&po, 1, 0), po.revents);
    /* A wait on the inner set itself still wakes for its member. */
    act("s 1 5");
    show("inner woken", ep2, 8, 1000);
    drain(1, 5);
    close(outer);

    /* EPOLLEXCLUSIVE: one socket in two sets, a thread asleep on each; one byte wakes one. */
    exclusive_case();

    /* DEL, and a closed fd leaves its sets. */
    add(ep, EPOLL_CTL_DEL, 2, 0);
    add(ep, EPOLL_CTL_DEL, 2, 0); /* ENOENT */
    act("s 2 5");
    show("deleted", ep, 8, 30);
    drain(2, 5);

    /* Half-close by the peer, then our own shutdown, then the peer's close. */
    add(ep, EPOLL_CTL_MOD, 3, EPOLLIN | EPOLLRDHUP);
    act("w 3");
    show("peer shut wr", ep, 8, 1000);
    drain(3, 100);
    shutdown(conn[3], SHUT_WR);
    show("both shut", ep, 8, 1000);
    add(ep, EPOLL_CTL_DEL, 3, 0);

    /* poll on the same sockets. */
    act("s 1 9");
    struct pollfd p[2] = {{.fd = conn[1], .events = POLLIN}, {.fd = conn[2], .events = POLLIN}};
    int pr = poll(p, 2, 1000);
    printf("poll: %d %x %x\n", pr, p[0].revents, p[1].revents);
    drain(1, 9);

    /* Blocking wait woken by the peer, and a close in the set. */
    add(ep, EPOLL_CTL_MOD, 1, EPOLLIN | EPOLLRDHUP);
    act("c 1");
    show("peer closed", ep, 8, 1000);
    close(conn[1]);
    show("closed fd gone", ep, 8, 30);

    act("q");
    int st;
    waitpid(pid, &st, 0);
    printf("client exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}
