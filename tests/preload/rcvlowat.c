/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * rcvlowat: SO_RCVLOWAT on a connection, as poll, select, epoll (level and edge) and recv see it.
 * Over kernel TCP a socket with SO_RCVLOWAT = N is readable only once N bytes are queued (or at
 * the end of the stream), and a blocking recv of len bytes waits for min(N, len) of them; a
 * nonblocking one returns what is there.  Run once over kernel TCP and once under `memlan run`:
 * the outputs must be equal (tests/py/test_preload.py).  Under memlan, before, any byte made an
 * accelerated socket readable and a blocking recv returned it.
 *
 * usage: rcvlowat PORT
 * Three connections: SO_RCVLOWAT 10 set on the listener before the connection came (an accepted
 * socket inherits it), on the accepted socket, and on the client's socket before its connect
 * (the client then reads).  On each the reader runs the same script, telling the writer (the other
 * process) what to send; then lowers the mark while a thread sleeps in poll, which must wake.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOWAT 10

struct cmd {
    char op; /* 'w': write a; 'd': answer, then write a after ms, b after ms more; 'h': write a,
              * then SHUT_WR; 'q' */
    int a, b, ms;
};

static int down[2], up[2]; /* commands: main to peer, peer to main; one byte answers back */

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static void put_bytes(int fd, int n)
{
    char b[256];
    memset(b, 'a', sizeof b);
    if (n > (int)sizeof b || send(fd, b, (size_t)n, 0) != n)
        die("send");
}

/* The writer: runs the commands that come on cin, answering each on aout, until 'q'. */
static void writer(int fd, int cin, int aout)
{
    struct cmd c;
    while (read(cin, &c, sizeof c) == sizeof c && c.op != 'q') {
        if (c.op == 'd') { /* the reader is asleep with nothing queued when the bytes come */
            if (write(aout, ".", 1) != 1)
                die("answer");
            usleep((useconds_t)c.ms * 1000);
            put_bytes(fd, c.a);
            usleep((useconds_t)c.ms * 1000);
            if (c.b)
                put_bytes(fd, c.b);
            continue;
        }
        put_bytes(fd, c.a);
        if (c.op == 'h' && shutdown(fd, SHUT_WR) < 0)
            die("shutdown");
        if (write(aout, ".", 1) != 1)
            die("answer");
    }
    close(fd);
}

static int cout, ain; /* the reader's end of the command pipes */

static void tell(char op, int a, int b, int ms)
{
    struct cmd c = {op, a, b, ms};
    char m;
    if (write(cout, &c, sizeof c) != sizeof c || read(ain, &m, 1) != 1)
        die("writer");
}

static void looks(const char *tag, int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    int r = poll(&p, 1, 100);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    struct timeval tv = {0, 100000};
    int sr = select(fd + 1, &rs, NULL, NULL, &tv);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP}, out[2];
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        die("epoll");
    int er = epoll_wait(ep, out, 2, 100);
    close(ep);
    printf("  %s: poll %d %#x, select %d, epoll %d %#x\n", tag, r, r == 1 ? p.revents : 0, sr, er,
           er == 1 ? out[0].events : 0);
}

static int fd_; /* the reader's socket, for the waiter thread */

struct waiter {
    int ep;             /* epoll_wait on this set, or poll when -1 */
    unsigned rev;       /* what it reported, or -1 */
    struct timespec at; /* when */
};

static void *waiter(void *a)
{
    struct waiter *w = a;
    if (w->ep >= 0) {
        struct epoll_event ev;
        w->rev = epoll_wait(w->ep, &ev, 1, 2000) == 1 ? ev.events : (unsigned)-1;
    } else {
        struct pollfd p = {.fd = fd_, .events = POLLIN};
        w->rev = poll(&p, 1, 2000) == 1 ? (unsigned)p.revents : (unsigned)-1;
    }
    clock_gettime(CLOCK_MONOTONIC, &w->at);
    return NULL;
}

/* A thread asleep in poll or epoll_wait with 3 bytes queued; the mark comes down to 2: it wakes,
 * at once (memlan's liveness timer, which would end the sleep anyway, comes 180 ms later). */
static void lowered(int fd, bool epoll)
{
    char b[16];
    tell('w', 3, 0, 0);
    fd_ = fd;
    struct waiter w = {.ep = -1};
    if (epoll) {
        w.ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN};
        if (w.ep < 0 || epoll_ctl(w.ep, EPOLL_CTL_ADD, fd, &ev) < 0)
            die("epoll");
    }
    pthread_t t;
    if (pthread_create(&t, NULL, waiter, &w) != 0)
        die("thread");
    usleep(120000);
    int v = 2;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
    pthread_join(t, NULL);
    long ms = (w.at.tv_sec - t0.tv_sec) * 1000 + (w.at.tv_nsec - t0.tv_nsec) / 1000000;
    printf("  %s asleep, the mark lowered to 2 with 3 queued: %#x, woken within 50 ms: %s\n",
           epoll ? "epoll_wait" : "poll", w.rev, ms < 50 ? "yes" : "no");
    if (epoll)
        close(w.ep);
    printf("  recv: %zd\n", recv(fd, b, sizeof b, 0));
    v = LOWAT;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
}

static void reader(const char *name, int fd)
{
    printf("%s:\n", name);
    int v = 0;
    socklen_t l = sizeof v;
    getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &l);
    printf("  SO_RCVLOWAT %d\n", v);
    char b[256];
    tell('w', 4, 0, 0);
    usleep(20000);
    looks("4 bytes queued", fd);
    printf("  nonblocking peek: %zd\n", recv(fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT));
    tell('w', 6, 0, 0);
    usleep(20000);
    looks("10 bytes queued", fd);
    printf("  recv: %zd\n", recv(fd, b, sizeof b, 0));

    struct timespec t0;
    tell('d', 4, 6, 40);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ssize_t n = recv(fd, b, sizeof b, 0);
    printf("  recv of 256, 4 then 6 bytes come: %zd, waited for the 6: %s\n", n,
           ms_since(&t0) >= 60 ? "yes" : "no");
    tell('d', 10, 0, 40);
    n = recv(fd, b, 5, 0);
    printf("  recv of 5, 10 bytes come: %zd\n", n);
    printf("  nonblocking recv of the rest: %zd\n", recv(fd, b, sizeof b, MSG_DONTWAIT));
    tell('w', 6, 0, 0);
    usleep(20000);
    printf("  recv of 5, 6 bytes queued: %zd\n", recv(fd, b, 5, 0));
    printf("  nonblocking recv of the rest: %zd\n", recv(fd, b, sizeof b, MSG_DONTWAIT));
    tell('w', 2, 0, 0);
    usleep(20000);
    n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    printf("  nonblocking recv, 2 bytes queued: %zd\n", n);

    tell('d', 4, 6, 40);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = poll(&p, 1, 2000);
    printf("  poll, 4 then 6 bytes come: %d %#x, waited for the 6: %s\n", r, p.revents,
           ms_since(&t0) >= 60 ? "yes" : "no");
    printf("  recv: %zd\n", recv(fd, b, sizeof b, 0));

    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET}, out[2];
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        die("epoll");
    tell('w', 4, 0, 0);
    int e1 = epoll_wait(ep, out, 2, 100);
    tell('w', 6, 0, 0);
    int e2 = epoll_wait(ep, out, 2, 1000);
    uint32_t ev2 = e2 == 1 ? out[0].events : 0;
    int e3 = epoll_wait(ep, out, 2, 100);
    close(ep);
    printf("  edge-triggered, 4 then 6 bytes: %d, %d %#x, then %d\n", e1, e2, ev2, e3);
    printf("  recv: %zd\n", recv(fd, b, sizeof b, 0));

    lowered(fd, false);
    lowered(fd, true);

    tell('h', 3, 0, 0);
    usleep(20000);
    looks("3 bytes then the end", fd);
    n = recv(fd, b, sizeof b, 0);
    printf("  recv: %zd, then %zd\n", n, recv(fd, b, sizeof b, 0));
    struct cmd q = {'q', 0, 0, 0};
    if (write(cout, &q, sizeof q) != sizeof q)
        die("quit");
    close(fd);
}

static int lowat_fd(int fd)
{
    int v = LOWAT;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) < 0)
        die("SO_RCVLOWAT");
    return fd;
}

static int dial(int port, bool lowat)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (c < 0 || (lowat && lowat_fd(c) < 0) || connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    /* The server speaks first: it has settled.  Not a blocking recv: with the mark set, the
     * kernel's would sleep until the mark's bytes came (only a nonblocking one takes fewer). */
    char h;
    int k = 0;
    while (recv(c, &h, 1, MSG_DONTWAIT) != 1)
        if (errno != EAGAIN || ++k > 5000)
            die("hello");
        else
            usleep(1000);
    return c;
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
    lowat_fd(l); /* inherited by the first connection (made from the listener as it comes) */
    if (pipe(down) < 0 || pipe(up) < 0)
        die("pipe");
    pid_t pp = fork();
    if (pp < 0)
        die("fork");
    if (pp == 0) { /* the peer: writes on the first two connections, reads on the third */
        close(l);
        alarm(60);
        for (int k = 0; k < 2; k++)
            writer(dial(port, false), down[0], up[1]);
        cout = up[1];
        ain = down[0];
        reader("set on the client's socket before connect", dial(port, true));
        exit(0);
    }
    cout = down[1];
    ain = up[0];
    for (int k = 0; k < 3; k++) {
        int s = accept(l, NULL, NULL);
        if (s < 0 || send(s, "h", 1, 0) != 1)
            die("accept");
        if (k == 0) {
            /* The peer connects again only once this connection's script is done. */
            int v = 1;
            setsockopt(l, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
            reader("set on the listener before the connection", s);
        } else if (k == 1) {
            reader("set on the accepted socket", lowat_fd(s));
        } else {
            writer(s, up[0], down[1]);
        }
    }
    int st;
    waitpid(pp, &st, 0);
    printf("done, peer %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}
