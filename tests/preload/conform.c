/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * conform.c - one side of the socket conformance workload (tests/py/test_preload.py runs it).
 *
 *   conform server ADDR PORT SEED [SYNC_IN SYNC_OUT]
 *   conform client ADDR PORT SEED [SYNC_IN SYNC_OUT]
 *   conform pair   ADDR PORT SEED      (forks: the two sides of one run)
 *
 * Both sides derive the same script of operations from SEED and step through it together,
 * synchronising through a pair of pipes that memlan never touches.  Each side prints one line per
 * observable result: return values, errno names, revents, checksums of what arrived.  Only
 * results that are deterministic under kernel TCP are printed (a blocking read loop prints the
 * total and the checksum, not the sizes of its partial reads), so the output over kernel TCP and
 * under memlan must be identical, byte for byte.  The server speaks first in the first step, so a
 * memlan client facing a plain server must notice and stay on TCP without losing a byte.
 */
#include <stdbool.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sockios.h>

static int sync_in = -1, sync_out = -1;
static char role;            /* 'S' or 'C' */
static uint64_t rng, lrng; /* the shared script's generator; this side's own choices */

static uint64_t xs(uint64_t *r)
{
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    return *r;
}
static uint64_t rndn(uint64_t n) { return xs(&rng) % n; }   /* both sides agree */
static uint64_t lrndn(uint64_t n) { return xs(&lrng) % n; } /* this side alone */

static void die(const char *what)
{
    fprintf(stderr, "%c: %s: %s\n", role, what, strerror(errno));
    exit(2);
}

static void sync_step(void)
{
    char c = 1;
    if (write(sync_out, &c, 1) != 1 || read(sync_in, &c, 1) != 1)
        die("sync");
}

static const char *ename(int e)
{
    switch (e) {
    case 0: return "0";
    case EAGAIN: return "EAGAIN";
    case EPIPE: return "EPIPE";
    case ECONNRESET: return "ECONNRESET";
    case EINVAL: return "EINVAL";
    case EBADF: return "EBADF";
    case ENOTCONN: return "ENOTCONN";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    default: return strerror(e);
    }
}

#define LOG(...) (printf("%c ", role), printf(__VA_ARGS__), printf("\n"), fflush(stdout))
#define RES(name, expr)                                                                        \
    do {                                                                                       \
        ssize_t res_ = (expr); /* once: expr may be a send */                                  \
        LOG("%s -> %zd %s", name, res_, res_ < 0 ? ename(errno) : "");                         \
    } while (0)

static uint8_t pattern(uint64_t i, uint64_t salt) { return (uint8_t)((i * 131 + salt * 7) ^ (i >> 9)); }

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Send n bytes of the step's pattern in a random way; returns the total the calls reported. */
static ssize_t send_all(int fd, size_t n, uint64_t salt)
{
    uint8_t *buf = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(i, salt);
    size_t off = 0;
    int how = (int)lrndn(4);
    while (off < n) {
        ssize_t r;
        size_t chunk = n - off;
        if (how == 0) {
            r = write(fd, buf + off, chunk);
        } else if (how == 1) {
            r = send(fd, buf + off, chunk, MSG_NOSIGNAL);
        } else {
            struct iovec v[4];
            int k = 0;
            size_t left = chunk, o = off;
            while (left && k < 4) {
                size_t c = k == 3 ? left : 1 + lrndn(left);
                v[k].iov_base = buf + o;
                v[k].iov_len = c;
                o += c;
                left -= c;
                k++;
            }
            if (how == 2) {
                r = writev(fd, v, k);
            } else {
                struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)k};
                r = sendmsg(fd, &mh, MSG_NOSIGNAL);
            }
        }
        if (r < 0) {
            free(buf);
            return -1;
        }
        off += (size_t)r;
    }
    free(buf);
    return (ssize_t)off;
}

/* Receive exactly n bytes in a random way; returns the total (or the error) and the checksum. */
static ssize_t recv_all(int fd, size_t n, uint64_t *sum)
{
    uint8_t *buf = malloc(n ? n : 1);
    size_t off = 0;
    int how = (int)lrndn(4);
    while (off < n) {
        ssize_t r;
        size_t want = n - off;
        if (how == 0) {
            r = read(fd, buf + off, want);
        } else if (how == 1) {
            r = recv(fd, buf + off, want, MSG_WAITALL);
        } else if (how == 2) {
            struct iovec v[2] = {{buf + off, want / 2}, {buf + off + want / 2, want - want / 2}};
            r = readv(fd, v, 2);
        } else {
            struct iovec v = {buf + off, want};
            struct msghdr mh = {.msg_iov = &v, .msg_iovlen = 1};
            r = recvmsg(fd, &mh, 0);
        }
        if (r <= 0) {
            free(buf);
            return r;
        }
        off += (size_t)r;
    }
    *sum = fnv(1469598103934665603ull, buf, n);
    free(buf);
    return (ssize_t)off;
}

static uint64_t expect_sum(size_t n, uint64_t salt)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = pattern(i, salt);
        h = fnv(h, &b, 1);
    }
    return h;
}

static void step_stream(int fd, bool writer, int step)
{
    size_t n = 1 + rndn(rndn(4) == 0 ? 600000 : 5000);
    if (writer) {
        ssize_t r = send_all(fd, n, (uint64_t)step);
        RES("stream send", r);
    } else {
        uint64_t sum = 0;
        ssize_t r = recv_all(fd, n, &sum);
        LOG("stream recv -> %zd %s", r, r == (ssize_t)n && sum == expect_sum(n, (uint64_t)step)
                                            ? "intact" : "CORRUPT");
    }
    sync_step();
}

static void step_peek(int fd, bool writer, int step)
{
    size_t n = 1 + rndn(1000);
    if (writer) {
        RES("peek send", send_all(fd, n, (uint64_t)step));
        sync_step();
        sync_step();
        return;
    }
    sync_step(); /* the bytes are sent */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 5000);
    LOG("poll -> %d revents %#x", r, p.revents);
    p.events = POLLIN | POLLOUT;
    r = poll(&p, 1, 0);
    LOG("poll in|out -> %d revents %#x", r, p.revents);
    int q = -1;
    r = ioctl(fd, FIONREAD, &q);
    LOG("FIONREAD -> %d %d", r, q);
    char buf[1000];
    size_t pk = 1 + lrndn(n);
    ssize_t k = recv(fd, buf, pk, MSG_PEEK);
    LOG("peek %zu -> %zd %s", pk, k, k > 0 && buf[0] == (char)pattern(0, (uint64_t)step) ? "ok" : "");
    uint64_t sum = 0;
    k = recv_all(fd, n, &sum);
    LOG("recv -> %zd %s", k, sum == expect_sum(n, (uint64_t)step) ? "intact" : "CORRUPT");
    q = -1;
    r = ioctl(fd, FIONREAD, &q);
    LOG("FIONREAD -> %d %d", r, q);
    sync_step();
}

static void step_nonblock(int fd, bool writer)
{
    if (!writer) {
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
        RES("recv DONTWAIT", r);
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        r = read(fd, &c, 1);
        RES("read O_NONBLOCK", r);
        fcntl(fd, F_SETFL, fl);
        int on = 1;
        ioctl(fd, FIONBIO, &on);
        r = recv(fd, &c, 1, 0);
        RES("recv FIONBIO", r);
        on = 0;
        ioctl(fd, FIONBIO, &on);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        LOG("poll empty -> %d revents %#x", poll(&p, 1, 0), p.revents);
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(fd, &rs);
        struct timeval tv = {0, 1000};
        LOG("select empty -> %d", select(fd + 1, &rs, NULL, NULL, &tv));
        fd_set ws;
        FD_ZERO(&ws);
        FD_SET(fd, &ws);
        tv = (struct timeval){0, 0};
        LOG("select writable -> %d %d", select(fd + 1, NULL, &ws, NULL, &tv), FD_ISSET(fd, &ws));
        int outq = -1; /* the kernel counts bytes not yet acknowledged: only the call is stable */
        LOG("SIOCOUTQ -> %d %s", ioctl(fd, SIOCOUTQ, &outq), outq >= 0 ? "ok" : "");
    }
    sync_step();
}

static void step_dup(int fd, bool writer, int step)
{
    size_t n = 1 + rndn(20000);
    if (writer) {
        int how = (int)lrndn(3), d;
        if (how == 0)
            d = dup(fd);
        else if (how == 1)
            d = dup2(fd, 100 + (int)lrndn(50));
        else
            d = fcntl(fd, F_DUPFD_CLOEXEC, 60);
        LOG("dup ok %d", d >= 0);
        RES("send via dup", send_all(d, n, (uint64_t)step));
        LOG("close dup -> %d", close(d));
    } else {
        uint64_t sum = 0;
        ssize_t r = recv_all(fd, n, &sum);
        LOG("recv -> %zd %s", r, sum == expect_sum(n, (uint64_t)step) ? "intact" : "CORRUPT");
    }
    sync_step();
}

static void step_fork(int fd, bool writer, int step)
{
    size_t n1 = 1 + rndn(30000), n2 = 1 + rndn(30000);
    if (writer) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            ssize_t r = send_all(fd, n1, (uint64_t)step);
            _exit(r == (ssize_t)n1 ? 0 : 1);
        }
        int st;
        waitpid(p, &st, 0);
        LOG("child sent %zu -> %d", n1, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        RES("parent send", send_all(fd, n2, (uint64_t)step + 1000));
    } else {
        uint64_t s1 = 0, s2 = 0;
        ssize_t r1 = recv_all(fd, n1, &s1), r2 = recv_all(fd, n2, &s2);
        LOG("recv %zu %zu -> %zd %zd %s", n1, n2, r1, r2,
            s1 == expect_sum(n1, (uint64_t)step) && s2 == expect_sum(n2, (uint64_t)step + 1000)
                ? "intact" : "CORRUPT");
    }
    sync_step();
}

/* The end: one side half-closes, the other answers and closes with data in flight. */
static void step_end(int fd, bool first, int step)
{
    size_t n = 1 + rndn(200000);
    char c;
    if (first) {
        LOG("shutdown WR -> %d", shutdown(fd, SHUT_WR));
        ssize_t r = send(fd, "x", 1, MSG_NOSIGNAL);
        RES("send after SHUT_WR", r);
        uint64_t sum = 0;
        r = recv_all(fd, n, &sum);
        LOG("recv answer -> %zd %s", r, sum == expect_sum(n, (uint64_t)step) ? "intact" : "CORRUPT");
        r = recv(fd, &c, 1, 0);
        RES("recv at EOF", r);
        r = recv(fd, &c, 1, 0);
        RES("recv at EOF again", r);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        LOG("poll at EOF -> %d revents %#x", poll(&p, 1, 0), p.revents & (POLLIN | POLLHUP));
        LOG("close -> %d", close(fd));
    } else {
        ssize_t r = recv(fd, &c, 1, 0);
        RES("recv EOF", r);
        struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
        LOG("poll after FIN -> %d revents %#x", poll(&p, 1, 0), p.revents);
        RES("send answer", send_all(fd, n, (uint64_t)step));
        LOG("close -> %d", close(fd)); /* with the answer perhaps still unread */
    }
}

static void run(int fd, int steps)
{
    /* The server speaks first. */
    if (role == 'S')
        RES("hello", send(fd, "hello", 5, 0));
    else {
        char b[5];
        uint64_t s;
        (void)s;
        ssize_t r = recv(fd, b, 5, MSG_WAITALL);
        LOG("hello -> %zd %.*s", r, r > 0 ? (int)r : 0, b);
    }
    sync_step();
    for (int i = 0; i < steps; i++) {
        int kind = (int)rndn(5);
        bool c_writes = rndn(2) == 0;
        bool writer = (role == 'C') == c_writes;
        LOG("step %d kind %d", i, kind);
        switch (kind) {
        case 0: step_stream(fd, writer, i); break;
        case 1: step_peek(fd, writer, i); break;
        case 2: step_nonblock(fd, writer); break;
        case 3: step_dup(fd, writer, i); break;
        case 4: step_fork(fd, writer, i); break;
        }
    }
    bool c_first = rndn(2) == 0;
    step_end(fd, (role == 'C') == c_first, steps);
}

static socklen_t mkaddr(const char *a, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *s4 = (void *)ss;
    struct sockaddr_in6 *s6 = (void *)ss;
    if (inet_pton(AF_INET, a, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        return sizeof *s4;
    }
    if (inet_pton(AF_INET6, a, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        return sizeof *s6;
    }
    fprintf(stderr, "bad address %s\n", a);
    exit(2);
}

static int side(char r, const char *addr, int port, int lfd)
{
    role = r;
    lrng ^= (uint64_t)r * 0x9e3779b97f4a7c15ull;
    int steps = 12;
    struct sockaddr_storage ss;
    socklen_t l = mkaddr(addr, port, &ss);
    int fd;
    if (r == 'S') {
        fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            die("accept");
        close(lfd);
    } else {
        fd = socket(ss.ss_family, SOCK_STREAM, 0);
        int nb = lrndn(2) == 0; /* nonblocking connect half the time */
        if (nb)
            fcntl(fd, F_SETFL, O_NONBLOCK);
        int c = connect(fd, (struct sockaddr *)&ss, l);
        if (c < 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 5000);
            int err = -1;
            socklen_t el = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            c = err ? -1 : 0;
        }
        if (c < 0)
            die("connect");
        if (nb)
            fcntl(fd, F_SETFL, 0);
        LOG("connected");
    }
    run(fd, steps);
    return 0;
}

static int listener(const char *addr, int port)
{
    struct sockaddr_storage ss;
    socklen_t l = mkaddr(addr, port, &ss);
    int fd = socket(ss.ss_family, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, l) < 0 || listen(fd, 16) < 0)
        die("listen");
    return fd;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: conform server|client|pair ADDR PORT SEED [SYNC_IN SYNC_OUT]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *mode = argv[1], *addr = argv[2];
    int port = atoi(argv[3]);
    uint64_t seed = strtoull(argv[4], NULL, 10);
    rng = seed * 2654435761u + 1;
    lrng = seed * 0x2545f4914f6cdd1dull + 7;
    if (strcmp(mode, "pair") == 0) {
        int a[2], b[2];
        if (pipe(a) < 0 || pipe(b) < 0)
            die("pipe");
        int lfd = listener(strcmp(addr, "mapped") == 0 ? "::" : addr, port);
        if (strcmp(addr, "mapped") == 0)
            addr = "::ffff:127.0.0.1";
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            close(lfd);
            sync_in = a[0];
            sync_out = b[1];
            side('C', addr, port, -1);
            _exit(0);
        }
        sync_in = b[0];
        sync_out = a[1];
        side('S', addr, port, lfd);
        int st;
        waitpid(p, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    if (argc < 7)
        return 2;
    sync_in = atoi(argv[5]);
    sync_out = atoi(argv[6]);
    if (strcmp(mode, "server") == 0)
        return side('S', addr, port, listener(addr, port));
    return side('C', addr, port, -1);
}
