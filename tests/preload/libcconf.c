/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * libcconf: the libc entry points beyond read/write/recv/send on a connected socket, printed line
 * by line.  Run once over kernel TCP and once under `memlan run`: the two outputs must be equal
 * (tests/py/test_preload.py).  Built like every tests/preload program with -O2, and fortified
 * here (_FORTIFY_SOURCE=2), as Debian builds its packages: read, recv, recvfrom, poll and ppoll
 * on buffers of known size compile to __read_chk, __recv_chk, __recvfrom_chk, __poll_chk and
 * __ppoll_chk, which a preload library must interpose as well.
 *
 * usage: libcconf PORT [CASES]   (CASES: letters of f m s u t w, default all)
 * Cases: the fortified calls (and the abort of one whose length exceeds its buffer),
 * recvmmsg/sendmmsg, preadv2/pwritev2, splice both ways and the kernel's refusals of splice, tee
 * and copy_file_range on a socket; a blocking write of 1 MiB while the connection is still being
 * set up; SO_RCVTIMEO/SO_SNDTIMEO set before connect and on the listener; MSG_WAITALL on a
 * nonblocking call.  Every blocking call is bounded by SO_RCVTIMEO or alarm(): an interposer
 * missing sends the call to the idle kernel socket, and that must show as a different line or a
 * failed run, never a hang.
 */
#undef _FORTIFY_SOURCE
#define _FORTIFY_SOURCE 2
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
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_in addr;
static int lfd;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static const char *en(ssize_t r) { return r < 0 ? strerror(errno) : ""; }

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void rcvtimeo(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* A settled pair in this process: *c the client end, *s the accepted end, with 2 s receive
 * timeouts so that a call that reads the idle kernel socket returns instead of hanging. */
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
    rcvtimeo(*c, 2000);
    rcvtimeo(*s, 2000);
}

/* Wait until fd has n bytes to read (FIONREAD is answered from the channel under memlan). */
static void await_bytes(int fd, int n)
{
    for (int i = 0; i < 2000; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 10);
        char b[8192];
        ssize_t k = recv(fd, b, sizeof b < (size_t)n ? sizeof b : (size_t)n, MSG_PEEK | MSG_DONTWAIT);
        if (k >= n)
            return;
        usleep(1000);
    }
}

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void fortified(void)
{
    int c, s;
    pair(&c, &s);
    printf("fortified\n");
    char buf[64];
    volatile size_t len = 10; /* not a constant: the _chk call, not a compile-time check */
    send(c, "0123456789abcdefghij", 20, 0);
    struct pollfd p[1] = {{.fd = s, .events = POLLIN}};
    volatile nfds_t one = 1;
    int r = poll(p, one, 2000); /* __poll_chk */
    printf("poll -> %d %#x\n", r, p[0].revents);
    struct timespec ts = {2, 0};
    r = ppoll(p, one, &ts, NULL); /* __ppoll_chk */
    printf("ppoll -> %d %#x\n", r, p[0].revents);
    await_bytes(s, 20);
    ssize_t k = read(s, buf, len); /* __read_chk */
    printf("read -> %zd %s %.*s\n", k, en(k), k > 0 ? (int)k : 0, buf);
    k = recv(s, buf, len / 2, 0); /* __recv_chk */
    printf("recv -> %zd %s %.*s\n", k, en(k), k > 0 ? (int)k : 0, buf);
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    k = recvfrom(s, buf, len, 0, (struct sockaddr *)&from, &fl); /* __recvfrom_chk */
    printf("recvfrom -> %zd %s %.*s\n", k, en(k), k > 0 ? (int)k : 0, buf);
    k = read(s, buf, len); /* nothing left: the channel's timeout, not the kernel's */
    printf("read empty -> %zd %s\n", k, en(k));
    /* A length beyond the buffer: glibc's check aborts before any byte moves. */
    send(c, "z", 1, 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGABRT, SIG_DFL);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2); /* "*** buffer overflow detected ***" */
        volatile size_t big = sizeof buf + 1;
        char small[64];
        (void)!read(s, small, big);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    printf("read past the buffer -> %s %d\n", WIFSIGNALED(st) ? "signal" : "exit",
           WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    k = recv(s, buf, 1, 0);
    printf("the byte is still there -> %zd %.1s\n", k, buf);
    close(c);
    close(s);
}

static void mmsg(void)
{
    int c, s;
    pair(&c, &s);
    printf("mmsg\n");
    char a[10], b[20], d[30];
    memset(a, 'a', sizeof a);
    memset(b, 'b', sizeof b);
    memset(d, 'd', sizeof d);
    struct iovec iv[3] = {{a, sizeof a}, {b, sizeof b}, {d, sizeof d}};
    struct mmsghdr m[3];
    memset(m, 0, sizeof m);
    for (int i = 0; i < 3; i++) {
        m[i].msg_hdr.msg_iov = &iv[i];
        m[i].msg_hdr.msg_iovlen = 1;
    }
    /* Each side's peer uses the plain calls: a sendmmsg or recvmmsg that took the idle kernel
     * socket would not meet them. */
    int r = sendmmsg(c, m, 3, 0);
    printf("sendmmsg -> %d %s %u %u %u\n", r, en(r), m[0].msg_len, m[1].msg_len, m[2].msg_len);
    char x[100], y[100];
    ssize_t k = recv(s, x, 60, MSG_WAITALL);
    printf("recv -> %zd %s %.60s\n", k, en(k), x);
    send(c, x, 60, 0);
    await_bytes(s, 60);
    struct iovec rv[2] = {{x, 45}, {y, sizeof y}};
    struct mmsghdr rm[2];
    memset(rm, 0, sizeof rm);
    for (int i = 0; i < 2; i++) {
        rm[i].msg_hdr.msg_iov = &rv[i];
        rm[i].msg_hdr.msg_iovlen = 1;
    }
    /* 45 bytes in the first entry, the 15 left in the second, then EAGAIN ends it. */
    r = recvmmsg(s, rm, 2, MSG_WAITFORONE, NULL);
    printf("recvmmsg -> %d %s %u %u %.45s|%.15s\n", r, en(r), rm[0].msg_len, rm[1].msg_len, x,
           y);
    struct timespec tmo = {0, 100000000};
    rm[0].msg_len = 77;
    r = recvmmsg(s, rm, 1, MSG_DONTWAIT, &tmo);
    printf("recvmmsg empty -> %d %s %u\n", r, en(r), rm[0].msg_len);
    /* preadv2/pwritev2 at offset -1 are readv/writev on a socket; any other offset: ESPIPE. */
    struct iovec w = {"vector", 6};
    k = pwritev2(c, &w, 1, -1, 0);
    printf("pwritev2 -> %zd %s\n", k, en(k));
    k = pwritev2(c, &w, 1, 0, 0);
    printf("pwritev2 at 0 -> %zd %s\n", k, en(k));
    k = recv(s, x, 6, MSG_WAITALL);
    printf("recv -> %zd %s %.*s\n", k, en(k), k > 0 ? (int)k : 0, x);
    send(c, "VECTOR", 6, 0);
    await_bytes(s, 6);
    struct iovec rr = {x, sizeof x};
    k = preadv2(s, &rr, 1, -1, 0);
    printf("preadv2 -> %zd %s %.*s\n", k, en(k), k > 0 ? (int)k : 0, x);
    close(c);
    close(s);
}

static void splices(void)
{
    int c, s;
    pair(&c, &s);
    printf("splice\n");
    int pp[2];
    if (pipe(pp) < 0)
        die("pipe");
    static uint8_t big[5000], back[5000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7 + 3);
    if (send(c, big, sizeof big, 0) != (ssize_t)sizeof big)
        die("send");
    await_bytes(s, sizeof big);
    ssize_t k = splice(s, NULL, pp[1], NULL, 65536, 0);
    printf("socket to pipe -> %zd %s\n", k, en(k));
    ssize_t g = k > 0 ? read(pp[0], back, (size_t)k) : 0;
    printf("pipe holds -> %zd %s\n", g, g == (ssize_t)sizeof big && fnv(back, sizeof big) ==
                                            fnv(big, sizeof big) ? "intact" : "CORRUPT");
    k = splice(s, NULL, pp[1], NULL, 100, SPLICE_F_NONBLOCK);
    printf("socket to pipe, nothing there -> %zd %s\n", k, en(k));
    if (write(pp[1], big, 3000) != 3000)
        die("write pipe");
    k = splice(pp[0], NULL, c, NULL, 65536, 0);
    printf("pipe to socket -> %zd %s\n", k, en(k));
    k = recv(s, back, 3000, MSG_WAITALL);
    printf("peer got -> %zd %s\n", k, k == 3000 && fnv(back, 3000) == fnv(big, 3000) ? "intact"
                                                                                 : "CORRUPT");
    k = splice(pp[0], NULL, c, NULL, 100, SPLICE_F_NONBLOCK);
    printf("pipe to socket, empty pipe -> %zd %s\n", k, en(k));
    loff_t off = 0;
    k = splice(s, &off, pp[1], NULL, 100, SPLICE_F_NONBLOCK);
    printf("socket with offset -> %zd %s\n", k, en(k));
    k = splice(pp[0], &off, c, NULL, 100, SPLICE_F_NONBLOCK);
    printf("pipe with offset -> %zd %s\n", k, en(k));
    k = splice(s, NULL, c, NULL, 100, SPLICE_F_NONBLOCK);
    printf("socket to socket -> %zd %s\n", k, en(k));
    k = tee(pp[0], c, 100, SPLICE_F_NONBLOCK);
    printf("tee to socket -> %zd %s\n", k, en(k));
    k = copy_file_range(s, NULL, pp[1], NULL, 100, 0);
    printf("copy_file_range from socket -> %zd %s\n", k, en(k));
    /* Nothing took a wrong path: the next bytes arrive in order. */
    send(c, "end", 3, 0);
    char e[3];
    k = recv(s, e, 3, MSG_WAITALL);
    printf("after -> %zd %.3s\n", k, e);
    close(pp[0]);
    close(pp[1]);
    close(c);
    close(s);
}

/* A blocking write of 1 MiB right after connect, before the server has accepted: the kernel's
 * buffers take all of it at once (about 3 MiB before an accept), and so must memlan's ring while
 * it still waits to know whether the server is memlan (it once returned 262,144: one ring; then
 * it waited for the accept; now the ring grows as the kernel's buffers do).  The server accepts
 * only once the writer has closed: under memlan the connection then goes over TCP ("closed
 * before a memlan acceptor took the offer"), the ring's bytes first. */
static void undecided_write(void)
{
    printf("undecided write\n");
    fflush(stdout);
    size_t n = 1 << 20;
    int sync[2];
    if (pipe(sync) < 0)
        die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        char x;
        close(sync[1]);
        if (read(sync[0], &x, 1) != 1) /* the writer closed (or died: then EOF) */
            _exit(1);
        int s = accept(lfd, NULL, NULL);
        /* Read to the end (one byte of room past the MiB), so that this line comes after the
         * writer's, which closes after it prints: a reader that stopped at the MiB printed
         * first wherever the writer's last copy and the reader's raced (rings that grow). */
        static uint8_t b[(1 << 20) + 1];
        size_t got = 0;
        for (;;) {
            ssize_t k = read(s, b + got, sizeof b - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        printf("server read -> %zu\n", got);
        for (size_t i = 0; i < got; i++)
            if (b[i] != (uint8_t)(i & 0xff)) {
                printf("server data CORRUPT at %zu\n", i);
                break;
            }
        fflush(stdout);
        _exit(0);
    }
    alarm(20);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    static uint8_t b[1 << 20];
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i & 0xff);
    ssize_t k = write(c, b, n);
    printf("write 1 MiB -> %zd %s\n", k, en(k));
    fflush(stdout);
    close(c);
    close(sync[0]);
    if (write(sync[1], "c", 1) != 1)
        die("write sync");
    close(sync[1]);
    int st;
    waitpid(pid, &st, 0);
    alarm(0);
}

static void timeouts(void)
{
    char b[16];
    /* SO_RCVTIMEO set before connect. */
    printf("timeouts\n");
    alarm(20);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    rcvtimeo(c, 200);
    struct timeval tv = {0, 200000};
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    int s = accept(lfd, NULL, NULL);
    if (send(s, "hi", 2, 0) != 2 || recv(c, b, 2, MSG_WAITALL) != 2)
        die("settle");
    uint64_t t0 = now_ms();
    ssize_t k = recv(c, b, sizeof b, 0);
    uint64_t dt = now_ms() - t0;
    printf("recv, SO_RCVTIMEO before connect -> %zd %s waited %s\n", k, en(k),
           dt >= 150 && dt < 1500 ? "about 200 ms" : "WRONG");
    /* SO_SNDTIMEO before connect: the peer never reads; a blocking send returns what it moved. */
    size_t n = 64u << 20;
    uint8_t *big = calloc(1, n);
    t0 = now_ms();
    k = send(c, big, n, MSG_NOSIGNAL);
    dt = now_ms() - t0;
    printf("send, SO_SNDTIMEO before connect -> %s waited %s\n",
           k > 0 && (size_t)k < n ? "partial" : k < 0 ? strerror(errno) : "all",
           dt >= 150 && dt < 1500 ? "about 200 ms" : "WRONG");
    free(big);
    close(c);
    close(s);
    /* On the listener: the accepted socket inherits it, in the kernel. */
    rcvtimeo(lfd, 200);
    c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    s = accept(lfd, NULL, NULL);
    if (send(s, "hi", 2, 0) != 2 || recv(c, b, 2, MSG_WAITALL) != 2)
        die("settle");
    t0 = now_ms();
    k = recv(s, b, sizeof b, 0);
    dt = now_ms() - t0;
    printf("recv, SO_RCVTIMEO on the listener -> %zd %s waited %s\n", k, en(k),
           dt >= 150 && dt < 1500 ? "about 200 ms" : "WRONG");
    rcvtimeo(lfd, 0);
    close(c);
    close(s);
    alarm(0);
}

/* MSG_WAITALL on a nonblocking call returns what arrived. */
static void waitall_nonblocking(void)
{
    int c, s;
    pair(&c, &s);
    printf("waitall nonblocking\n");
    alarm(20);
    char b[100];
    send(c, "0123456789", 10, 0);
    await_bytes(s, 10);
    /* (The 2 s receive timeout of pair() bounds a call that waits for all 100 bytes: it must
     * return at once.) */
    uint64_t t0 = now_ms();
    ssize_t k = recv(s, b, sizeof b, MSG_WAITALL | MSG_DONTWAIT);
    printf("recv WAITALL|DONTWAIT -> %zd %s %.*s %s\n", k, en(k), k > 0 ? (int)k : 0, b,
           now_ms() - t0 < 1000 ? "at once" : "WAITED");
    send(c, "abcdef", 6, 0);
    await_bytes(s, 6);
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    t0 = now_ms();
    k = recv(s, b, sizeof b, MSG_WAITALL);
    printf("recv WAITALL, O_NONBLOCK -> %zd %s %.*s %s\n", k, en(k), k > 0 ? (int)k : 0, b,
           now_ms() - t0 < 1000 ? "at once" : "WAITED");
    k = recv(s, b, sizeof b, MSG_WAITALL);
    printf("recv WAITALL, O_NONBLOCK, empty -> %zd %s\n", k, en(k));
    alarm(0);
    close(c);
    close(s);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 8) < 0)
        die("listen");
    /* Optional second argument: the cases to run, by letter (default all). */
    const char *which = argc > 2 ? argv[2] : "fmsutw";
    if (strchr(which, 'f'))
        fortified();
    if (strchr(which, 'm'))
        mmsg();
    if (strchr(which, 's'))
        splices();
    if (strchr(which, 'u'))
        undecided_write();
    if (strchr(which, 't'))
        timeouts();
    if (strchr(which, 'w'))
        waitall_nonblocking();
    printf("done\n");
    return 0;
}
