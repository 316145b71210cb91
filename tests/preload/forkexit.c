/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkexit: a fork child that leaves without closing its copies (_exit, SIGKILL, a failed exec
 * then _exit) must not delay the end of the connection: when the last process holding the
 * accepted end goes, the client's waiter (blocking recv, a blocking send, poll, epoll level- and
 * edge-triggered, a nonblocking recv) sees EOF at once, or ECONNRESET when the accepted end was
 * closed with bytes unread, as over kernel TCP (issue 19, item 11).  Run once over kernel TCP and once under
 * `memlan run`: the two outputs must be equal (tests/py/test_preload.py).
 *
 * usage: forkexit PORT [CASE]
 *
 * many-recv (run only when named): 72 connections, each with a thread blocked in recv without
 * SO_RCVTIMEO, more than memlan makes eventfds for (64 under the limit of 1024 fds that it sets
 * first: the others sleep on the ring's futex); a fork child holds the 72 accepted ends, the
 * parent closes its copies, and the child's _exit is the end.  Every receiver must read EOF
 * within 400 ms of it (before: 64 did, the others learned of it at their next liveness look, up
 * to 0.9 s late).
 *
 * The client's waiter starts 1.6 s before the end, so that a waiter that learns of the end only
 * by looking at its peer's liveness (100 ms, doubling to 1 s while it waits) learns it about 0.9 s
 * late; "prompt" is within 300 ms of the end.  Every wait is bounded (5 s).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROMPT_NS 300000000ull
#define BEFORE_US 1600000u

static struct sockaddr_in addr;
static int lfd;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A settled pair: c the client end, s the accepted end; tmo: bound the client's blocking calls. */
static void pair_tmo(int *c, int *s, int tmo)
{
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (*c < 0 || connect(*c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    *s = accept(lfd, NULL, NULL);
    char b[2];
    if (*s < 0 || send(*s, "hi", 2, 0) != 2 || recv(*c, b, 2, MSG_WAITALL) != 2 ||
        send(*c, "ok", 2, 0) != 2 || recv(*s, b, 2, MSG_WAITALL) != 2)
        die("settle");
    if (!tmo)
        return;
    struct timeval tv = {5, 0}; /* bound every blocking wait of the client */
    setsockopt(*c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(*c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static void pair(int *c, int *s) { pair_tmo(c, s, 1); }

/* How the child leaves. */
enum how { EXIT, KILL, EXECFAIL };

static pid_t child(enum how how)
{
    pid_t p = fork();
    if (p < 0)
        die("fork");
    if (p == 0) {
        if (how == KILL) {
            for (int i = 0; i < 100; i++) /* killed long before: bounded anyway */
                usleep(100000);
            _exit(3);
        }
        if (how == EXECFAIL) {
            execl("/nonexistent/forkexit-helper", "helper", (char *)NULL);
            _exit(127);
        }
        _exit(0);
    }
    if (how == KILL) {
        usleep(20000);
        kill(p, SIGKILL);
    }
    int st;
    waitpid(p, &st, 0);
    return p;
}

/* The client's waiter, in a thread. */
enum wait { RECV, POLL, EPOLL_LT, EPOLL_ET, SEND };

struct waiter {
    int fd;
    enum wait kind;
    uint64_t done_ns;
    char what[96];
};

static void *waiter_run(void *arg)
{
    struct waiter *w = arg;
    char b[8];
    ssize_t r;
    if (w->kind == POLL) {
        struct pollfd q = {.fd = w->fd, .events = POLLIN};
        int n = poll(&q, 1, 5000);
        w->done_ns = now_ns();
        r = recv(w->fd, b, sizeof b, MSG_DONTWAIT);
        snprintf(w->what, sizeof w->what, "poll %d %#x, recv %zd %s", n, q.revents, r,
                 r < 0 ? strerrorname_np(errno) : "");
        return NULL;
    }
    if (w->kind == EPOLL_LT || w->kind == EPOLL_ET) {
        int ep = epoll_create1(0);
        struct epoll_event e = {.events = EPOLLIN | (w->kind == EPOLL_ET ? EPOLLET : 0u),
                                .data.u64 = 7};
        epoll_ctl(ep, EPOLL_CTL_ADD, w->fd, &e);
        int n = epoll_wait(ep, &e, 1, 5000);
        w->done_ns = now_ns();
        r = recv(w->fd, b, sizeof b, MSG_DONTWAIT);
        snprintf(w->what, sizeof w->what, "epoll %d %#x, recv %zd %s", n, n > 0 ? e.events : 0,
                 r, r < 0 ? strerrorname_np(errno) : "");
        close(ep);
        return NULL;
    }
    if (w->kind == SEND) { /* blocked for room: the accepted end reads nothing */
        static char big[64 << 20];
        r = send(w->fd, big, sizeof big, MSG_NOSIGNAL);
        w->done_ns = now_ns();
        int e = errno;
        ssize_t r2 = send(w->fd, big, 1, MSG_NOSIGNAL);
        snprintf(w->what, sizeof w->what, "send %s %s, again %zd %s", r > 0 ? ">0" : "-1",
                 r < 0 ? strerrorname_np(e) : "", r2, r2 < 0 ? strerrorname_np(errno) : "");
        return NULL;
    }
    r = recv(w->fd, b, sizeof b, 0);
    w->done_ns = now_ns();
    snprintf(w->what, sizeof w->what, "recv %zd %s", r, r < 0 ? strerrorname_np(errno) : "");
    return NULL;
}

/* One case: a fresh pair; a child shares it and leaves as how says (before the end, or, late,
 * after the parent's close: then the child is the last holder); unread: the client sent bytes
 * the accepted end never reads, so its end is a reset. */
static void one(const char *name, enum how how, enum wait kind, int unread, int late)
{
    int c, s;
    pair(&c, &s);
    if (unread && send(c, "abc", 3, 0) != 3)
        die("send");
    usleep(20000);
    pid_t late_pid = 0;
    if (!late) {
        child(how);
    } else {
        late_pid = fork();
        if (late_pid < 0)
            die("fork");
        if (late_pid == 0) {
            usleep(BEFORE_US);
            _exit(0);
        }
    }
    struct waiter w = {.fd = c, .kind = kind};
    pthread_t t;
    if (pthread_create(&t, NULL, waiter_run, &w) != 0)
        die("thread");
    uint64_t end;
    if (!late) {
        usleep(BEFORE_US);
        end = now_ns();
        close(s);
    } else {
        close(s);
        int st;
        waitpid(late_pid, &st, 0); /* the child's death is the end */
        end = now_ns();
    }
    pthread_join(t, NULL);
    uint64_t lag = w.done_ns > end ? w.done_ns - end : 0;
    printf("%s: %s; %s\n", name, w.what, lag < PROMPT_NS ? "prompt" : "LATE");
    fprintf(stderr, "%s: %.1f ms after the end\n", name, (double)lag / 1e6);
    close(c);
}

/* A nonblocking recv after the end: 0 (or the reset) within the bound, not EAGAIN for ever. */
static void nonblocking(const char *name, enum how how, int unread)
{
    int c, s;
    pair(&c, &s);
    if (unread && send(c, "abc", 3, 0) != 3)
        die("send");
    usleep(20000);
    child(how);
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
    char b[8];
    ssize_t r = recv(c, b, sizeof b, 0); /* nothing yet */
    printf("%s: before %zd %s\n", name, r, r < 0 ? strerrorname_np(errno) : "");
    close(s);
    uint64_t end = now_ns();
    int e = 0;
    for (int i = 0; i < 3000 && now_ns() - end < PROMPT_NS; i++) {
        errno = 0;
        r = recv(c, b, sizeof b, 0);
        e = errno;
        if (!(r < 0 && e == EAGAIN))
            break;
        usleep(200);
    }
    printf("%s: after %zd %s\n", name, r, r < 0 ? strerrorname_np(e) : "");
    fprintf(stderr, "%s: %.1f ms after the end\n", name, (double)(now_ns() - end) / 1e6);
    close(c);
}

/* many-recv: see the top.  No receiver has a timeout: the wait for them is bounded here (5 s),
 * and the process's exit ends any still blocked. */
#define MANY 72
#define MANY_PROMPT_NS 400000000ull

struct many_rx {
    int fd;
    ssize_t r;
    uint64_t done_ns;
};

static _Atomic int many_done;

static void *many_run(void *arg)
{
    struct many_rx *m = arg;
    char b[8];
    m->r = recv(m->fd, b, sizeof b, 0);
    m->done_ns = now_ns();
    atomic_fetch_add(&many_done, 1);
    return NULL;
}

static void many(const char *name)
{
    static struct many_rx m[MANY];
    int s[MANY];
    /* memlan makes an eventfd for a sixteenth of the limit's threads, 64 at least */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 1024) {
        rl.rlim_cur = 1024;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            die("setrlimit");
    }
    for (int i = 0; i < MANY; i++)
        pair_tmo(&m[i].fd, &s[i], 0);
    pid_t p = fork();
    if (p < 0)
        die("fork");
    if (p == 0) { /* holds every accepted end, and leaves without a close */
        usleep(BEFORE_US);
        _exit(0);
    }
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < MANY; i++) {
        pthread_t t;
        if (pthread_create(&t, &at, many_run, &m[i]) != 0)
            die("thread");
    }
    for (int i = 0; i < MANY; i++)
        close(s[i]);
    int st;
    waitpid(p, &st, 0); /* the child's death is the end */
    uint64_t end = now_ns();
    for (int i = 0; i < 500 && atomic_load(&many_done) < MANY; i++)
        usleep(10000);
    int eof = 0, prompt = 0;
    uint64_t worst = 0;
    for (int i = 0; i < MANY; i++) {
        if (!m[i].done_ns)
            continue;
        uint64_t lag = m[i].done_ns > end ? m[i].done_ns - end : 0;
        eof += m[i].r == 0;
        prompt += m[i].r == 0 && lag < MANY_PROMPT_NS;
        worst = lag > worst ? lag : worst;
    }
    int done = atomic_load(&many_done);
    printf("%s: %d of %d read EOF, %d of %d within 400 ms; %s\n", name, eof, MANY, prompt, MANY,
           prompt == MANY ? "prompt" : "LATE");
    fprintf(stderr, "%s: %d returned, worst %.1f ms after the end\n", name, done,
            (double)worst / 1e6);
    if (done < MANY)
        exit(1); /* receivers still blocked: the process's exit ends them */
    for (int i = 0; i < MANY; i++)
        close(m[i].fd);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one_ = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one_, sizeof one_);
    addr = (struct sockaddr_in){.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 128) < 0)
        die("listen");
    const char *only = argc > 2 ? argv[2] : NULL;
    if (only && strcmp(only, "many-recv") == 0) {
        many(only);
        close(lfd);
        printf("done\n");
        return 0;
    }
#define CASE(n, ...) if (!only || strcmp(only, n) == 0) one(n, __VA_ARGS__)
    CASE("exit-recv", EXIT, RECV, 0, 0);
    CASE("kill-recv", KILL, RECV, 0, 0);
    CASE("execfail-recv", EXECFAIL, RECV, 0, 0);
    CASE("exit-poll", EXIT, POLL, 0, 0);
    CASE("exit-epoll-lt", EXIT, EPOLL_LT, 0, 0);
    CASE("kill-epoll-et", KILL, EPOLL_ET, 0, 0);
    CASE("exit-reset-recv", EXIT, RECV, 1, 0);
    CASE("kill-reset-poll", KILL, POLL, 1, 0);
    CASE("exit-send", EXIT, SEND, 0, 0);
    CASE("late-exit-recv", EXIT, RECV, 0, 1);
    CASE("late-exit-epoll-et", EXIT, EPOLL_ET, 0, 1);
#undef CASE
    if (!only || strcmp(only, "nb") == 0) {
        nonblocking("exit-nb", EXIT, 0);
        nonblocking("kill-nb-reset", KILL, 1);
    }
    close(lfd);
    printf("done\n");
    return 0;
}
