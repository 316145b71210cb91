/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkshare: one connection shared by a process, its fork child and its grandchild, each moving
 * bytes on it at the same time, against a checking peer, as over kernel TCP.  Whoever takes a
 * direction after another process had it must start from where that one left the ring: a
 * process that kept its own stale position would send over bytes not yet read (the peer then
 * reads a writer's bytes twice or never) or read bytes another already took.
 *   tx      three writers (the grandchild on a dup2'd fd); each byte says its writer (top two
 *           bits) and that writer's count (low six): the peer checks every writer's bytes come
 *           whole and in order, however the writes interleave
 *   rx      the peer sends bytes i % 251; three readers take them: each checks that every
 *           read it gets is a run of the stream, and their counts add up to what was sent
 *   both    two processes, each with a writing and a reading thread, both directions at once
 *   undec   the fork comes right after connect, before the server accepted (the socket is
 *           not yet decided); then tx as above
 *   late    the connection is made after the process forked another child (which exits at
 *           once), then shared with a fork child: tx as above
 * Every wait is bounded (SO_RCVTIMEO/SO_SNDTIMEO 10 s); a hang prints "timeout".
 *
 * usage: forkshare PORT [CASE]   (CASE: only that one, twice)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define NTX (3u << 20) /* bytes each writer sends */
#define NRX (8u << 20) /* bytes the peer sends */

static struct sockaddr_in addr;

static void tmo(int fd)
{
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int listener(void)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(l, 8) < 0) {
        perror("listen");
        exit(1);
    }
    return l;
}

static int dial(void)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) < 0) {
        perror("connect");
        exit(1);
    }
    tmo(c);
    return c;
}

/* Writer w's n bytes, in writes of 1 to 8192 bytes (its own sizes); 0, or -1 on an error. */
static int write_as(int fd, unsigned w, unsigned n)
{
    static char buf[8192];
    uint32_t x = 2463534242u * (w + 1);
    for (unsigned k = 0; k < n;) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        unsigned len = 1 + x % sizeof buf;
        if (len > n - k)
            len = n - k;
        for (unsigned i = 0; i < len; i++)
            buf[i] = (char)((w << 6) | ((k + i) & 63));
        for (unsigned off = 0; off < len;) {
            ssize_t r = send(fd, buf + off, len - off, MSG_NOSIGNAL);
            if (r <= 0)
                return -1;
            off += (unsigned)r;
        }
        k += len;
    }
    return 0;
}

/* The peer's side of tx: every writer's bytes whole and in order, until EOF. */
static void check_tx(int s, unsigned nw, const char *name)
{
    unsigned cnt[4] = {0}, bad = 0;
    static char buf[65536];
    ssize_t r;
    while ((r = recv(s, buf, sizeof buf, 0)) > 0)
        for (ssize_t i = 0; i < r; i++) {
            unsigned b = (unsigned char)buf[i], w = b >> 6;
            if (w >= nw || (cnt[w] & 63) != (b & 63))
                bad++;
            if (w < 4)
                cnt[w]++;
        }
    int e = errno;
    unsigned ok = 0;
    for (unsigned w = 0; w < nw; w++)
        ok += cnt[w] == NTX;
    printf("%s: %s, writers whole %u of %u, bad bytes %s\n", name,
           r == 0 ? "eof" : e == EAGAIN ? "timeout" : strerror(e), ok, nw, bad ? "some" : "none");
}

/* A reader: every read a run of the stream i % 251; its count and bad reads to fd out. */
static void read_stream(int fd, int out)
{
    static char buf[65536];
    unsigned long got = 0, bad = 0;
    ssize_t r;
    while ((r = recv(fd, buf, 1 + (unsigned)rand() % sizeof buf, 0)) > 0) {
        for (ssize_t i = 1; i < r; i++)
            if ((unsigned char)buf[i] != ((unsigned char)buf[i - 1] + 1) % 251)
                bad++;
        got += (unsigned long)r;
    }
    unsigned long v[3] = {got, bad, r == 0 ? 0 : 1};
    (void)!write(out, v, sizeof v);
}

static void send_stream(int s)
{
    static char buf[65536];
    for (unsigned k = 0; k < NRX;) {
        unsigned len = NRX - k < sizeof buf ? NRX - k : sizeof buf;
        for (unsigned i = 0; i < len; i++)
            buf[i] = (char)((k + i) % 251);
        ssize_t r = send(s, buf, len, MSG_NOSIGNAL);
        if (r <= 0) {
            printf("peer send: %s\n", strerror(errno));
            return;
        }
        k += (unsigned)r;
    }
}

static void report_rx(const char *name, int in, unsigned nr)
{
    unsigned long sum = 0, bad = 0, eof = 0, v[3];
    for (unsigned i = 0; i < nr; i++)
        if (read(in, v, sizeof v) == sizeof v)
            sum += v[0], bad += v[1], eof += v[2] == 0;
    printf("%s: readers at eof %lu of %u, bytes %s, bad reads %s\n", name, eof, nr,
           sum == NRX ? "all" : sum < NRX ? "missing" : "too many", bad ? "some" : "none");
}

static void reap(pid_t p)
{
    int st;
    if (p > 0)
        waitpid(p, &st, 0);
}

/* tx with three writers: this process, a child, and the child's child on a dup2'd fd. */
static void tx_writers(int c)
{
    pid_t p = fork();
    if (p == 0) {
        pid_t g = fork();
        if (g == 0) {
            int d = dup2(c, 77);
            close(c);
            _exit(write_as(d, 2, NTX) ? 1 : 0);
        }
        int r = write_as(c, 1, NTX);
        reap(g);
        _exit(r ? 1 : 0);
    }
    if (write_as(c, 0, NTX))
        printf("writer 0: %s\n", strerror(errno));
    reap(p);
    close(c);
}

static void case_tx(int l, const char *name)
{
    int c = dial(), s = accept(l, NULL, NULL);
    tmo(s);
    pid_t k = fork();
    if (k == 0) {
        close(c);
        check_tx(s, 3, name);
        _exit(0);
    }
    close(s);
    tx_writers(c);
    reap(k);
}

static void case_rx(int l)
{
    int c = dial(), s = accept(l, NULL, NULL);
    pid_t k = fork();
    if (k == 0) {
        close(c);
        send_stream(s);
        close(s);
        _exit(0);
    }
    close(s);
    int pp[2];
    if (pipe(pp) < 0)
        exit(1);
    pid_t p = fork();
    if (p == 0) {
        srand(2);
        pid_t g = fork();
        if (g == 0) {
            srand(3);
            read_stream(c, pp[1]);
            _exit(0);
        }
        read_stream(c, pp[1]);
        reap(g);
        _exit(0);
    }
    srand(1);
    read_stream(c, pp[1]);
    reap(p);
    reap(k);
    close(c);
    report_rx("rx", pp[0], 3);
    close(pp[0]);
    close(pp[1]);
}

struct both { int fd; unsigned w; int r; };

static void *both_writer(void *a)
{
    struct both *b = a;
    b->r = write_as(b->fd, b->w, NTX);
    return NULL;
}

static void *peer_sender(void *a)
{
    send_stream(*(int *)a);
    shutdown(*(int *)a, SHUT_WR);
    return NULL;
}

/* Two processes, each with a thread writing and one reading; the peer checks the writes with
 * one thread and sends the stream with another. */
static void case_both(int l)
{
    int c = dial(), s = accept(l, NULL, NULL);
    tmo(s);
    pid_t k = fork();
    if (k == 0) {
        close(c);
        pthread_t t;
        pthread_create(&t, NULL, peer_sender, &s);
        check_tx(s, 2, "both tx");
        pthread_join(t, NULL);
        _exit(0);
    }
    close(s);
    int pp[2];
    if (pipe(pp) < 0)
        exit(1);
    pid_t p = fork();
    struct both b = {c, p == 0 ? 1u : 0u, 0};
    srand(p == 0 ? 5 : 4);
    pthread_t t;
    pthread_create(&t, NULL, both_writer, &b);
    read_stream(c, pp[1]);
    pthread_join(t, NULL);
    if (p == 0)
        _exit(b.r ? 1 : 0);
    if (b.r)
        printf("writer 0: %s\n", strerror(errno));
    reap(p);
    close(c);
    reap(k);
    report_rx("both rx", pp[0], 2);
    close(pp[0]);
    close(pp[1]);
}

/* The fork comes before the server accepted: the connection is undecided in both processes. */
static void case_undecided(int l)
{
    int c = dial();
    pid_t p = fork();
    if (p == 0) {
        int s = accept(l, NULL, NULL);
        tmo(s);
        close(c);
        check_tx(s, 3, "undec");
        _exit(0);
    }
    tx_writers(c);
    reap(p);
}

/* The connection is made after a fork (a child that exits at once), then shared. */
static void case_late(int l)
{
    pid_t q = fork();
    if (q == 0)
        _exit(0);
    reap(q);
    case_tx(l, "late");
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = listener();
    const char *only = argc > 2 ? argv[2] : NULL;
    for (int round = 0; round < 2; round++) {
        if (!only || !strcmp(only, "undec"))
            case_undecided(l);
        if (!only || !strcmp(only, "tx"))
            case_tx(l, "tx");
        if (!only || !strcmp(only, "rx"))
            case_rx(l);
        if (!only || !strcmp(only, "both"))
            case_both(l);
        if (!only || !strcmp(only, "late"))
            case_late(l);
    }
    close(l);
    printf("done\n");
    return 0;
}
