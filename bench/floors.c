/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * floors.c - the floors every memlan figure is compared with, measured in the same run:
 *
 *   cache line  two processes bounce one value through one shared 64-byte line and nothing
 *               else: the least a round trip through shared memory can cost (on one core each
 *               side yields while it waits, since spinning there only burns the slice the other
 *               side needs)
 *   futex       the same with FUTEX_WAIT/FUTEX_WAKE each way: the least a sleeping round trip
 *               costs, two wake-ups
 *   ring        a minimal single-producer single-consumer ring moving 64 B messages one way:
 *               the floor for a message rate
 *   pipe        the same ring moving 1 MiB messages in 64 KiB pieces: the floor for a stream
 *               that copies twice, copy-in and copy-out overlapping on the two cpus
 *   cma         process_vm_readv of 1 MiB from the other process: what one copy through the
 *               kernel moves (a single-copy bulk path's best)
 *   memcpy      Xt, copying 64 KB blocks from private memory into a shared ring-sized region,
 *               and Xr, out of it; SCILAN's bound X_max = Xt*Xr/(Xt+Xr) follows
 * and the kernel's transports (TCP loopback, Unix socket, pipe) as endpoints for bench.c.
 */
#include "bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A timed loop ends at end once it has LAT_MIN_SAMPLES samples, at hard_end once it has one, and
 * four times as late again whatever it has: on a loaded machine the warm-up alone once took the
 * whole time up to hard_end, and a figure of 0 (no sample) came out as a measurement. */
int bench_enough(long n, uint64_t now, uint64_t end, uint64_t hard_end)
{
    return (now >= end && n >= LAT_MIN_SAMPLES) || (now >= hard_end && n > 0) ||
           now >= hard_end + 4 * (hard_end - end);
}

int bench_cpus(int *cpus, int max)
{
    static cpu_set_t allowed;
    static int known;
    if (!known) {
        CPU_ZERO(&allowed);
        if (sched_getaffinity(0, sizeof allowed, &allowed) < 0)
            return 0;
        known = 1;
    }
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[n++] = c;
    return n;
}

void bench_pin(const char *placement, int child)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (strcmp(placement, "split") == 0) {
        CPU_SET(child && ncpu > 1 ? 1 : 0, &set);
    } else if (strcmp(placement, "same") == 0) {
        CPU_SET(0, &set);
    } else if (strncmp(placement, "pair:", 5) == 0) {
        int cpus[CPU_SETSIZE];
        int n = bench_cpus(cpus, CPU_SETSIZE), k = atoi(placement + 5);
        if (2 * k + 1 >= n)
            return;
        CPU_SET(cpus[2 * k + (child ? 1 : 0)], &set);
    } else {
        /* unpinned: back to every cpu we were allowed at the start */
        int cpus[CPU_SETSIZE];
        int n = bench_cpus(cpus, CPU_SETSIZE);
        if (n == 0)
            return;
        for (int i = 0; i < n; i++)
            CPU_SET(cpus[i], &set);
    }
    sched_setaffinity(0, sizeof set, &set);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void lat_from_samples(struct lat *l, double *us, long n)
{
    memset(l, 0, sizeof *l);
    if (n <= 0)
        return;
    qsort(us, (size_t)n, sizeof *us, cmp_double);
    l->n = n;
    l->med = us[n / 2];
    l->p99 = us[(long)((double)n * 0.99)];
    l->p999 = us[(long)((double)n * 0.999) < n ? (long)((double)n * 0.999) : n - 1];
}

/* ---- shared-memory floors ---------------------------------------------------------------- */

static void *shared_page(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static long fut(_Atomic uint32_t *w, int op, uint32_t v)
{
    struct timespec ts = {0, 100 * 1000 * 1000};
    return syscall(SYS_futex, (uint32_t *)w, op, v, op == FUTEX_WAIT ? &ts : NULL, NULL, 0);
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/*
 * The bare cache line: one 64-byte line, one word in it.  The parent writes odd values, the
 * child answers each with the next even one; the child stops on FLOOR_STOP, read from the same
 * word.  Nothing else is touched while a value is in flight: no second line, no stop flag, no
 * clock (a batch of LAT_BATCH round trips is timed as one; see lat_batch_ns()).
 *
 * Two bare lines (floor_twolines): the same, but the child answers in a word of another line, as
 * a duplex channel (one ring for each direction) must.  Each side then spins on a line it never
 * writes and writes a line it never spins on, where the single line's answer goes back in the
 * line that just came.  On the project's 2-vCPU VM this round trip is 1.2 to 2.1 times the single
 * line's, depending on where the hypervisor runs the two vCPUs (docs/results.md): the floor of
 * any design with a ring for each direction, memlan's included.  A line between the two keeps
 * them out of one 128-byte pair (the adjacent-line prefetch).
 */
#define FLOOR_STOP 0xffffffffu

struct floor_lines {
    _Alignas(64) _Atomic uint32_t ping;
    char pad[124];
    _Alignas(64) _Atomic uint32_t pong; /* used by floor_twolines only */
    char pad2[60];
};

static void floor_bounce_child(_Atomic uint32_t *ping, _Atomic uint32_t *pong, int yield)
{
    for (uint32_t want = 1;; want += 2) {
        uint32_t x;
        while ((x = atomic_load_explicit(ping, memory_order_acquire)) != want) {
            if (x == FLOOR_STOP)
                _exit(0);
            if (yield)
                sched_yield();
            else
                relax();
        }
        atomic_store_explicit(pong, want + 1, memory_order_release);
    }
}

static int floor_bounce(const char *placement, double seconds, struct lat *out, int two)
{
    struct floor_lines *s = shared_page(sizeof *s);
    if (!s)
        return -ENOMEM;
    _Atomic uint32_t *ping = &s->ping, *pong = two ? &s->pong : &s->ping;
    int yield = strcmp(placement, "same") == 0;
    pid_t pid = fork();
    if (pid < 0) {
        munmap(s, sizeof *s);
        return -errno;
    }
    if (pid == 0) {
        bench_pin(placement, 1);
        floor_bounce_child(ping, pong, yield);
    }
    bench_pin(placement, 0);
    long cap = 2000000, n = 0;
    double *us = malloc((size_t)cap * sizeof *us);
    uint64_t start = bench_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    uint64_t hard_end = start + (uint64_t)(5 * seconds * 1e9);
    uint32_t v = 0;
    for (long b = 0; us && n < cap && v < FLOOR_STOP - 4 * LAT_BATCH; b++) {
        uint64_t t0 = bench_now_ns();
        for (int k = 0; k < LAT_BATCH; k++) {
            atomic_store_explicit(ping, ++v, memory_order_release);
            ++v;
            while (atomic_load_explicit(pong, memory_order_acquire) != v) {
                if (yield)
                    sched_yield();
                else
                    relax();
            }
        }
        uint64_t t1 = bench_now_ns();
        if (b >= 8) /* warm-up */
            us[n++] = (double)(t1 - t0) / 1e3 / LAT_BATCH;
        if (bench_enough(n, t1, end, hard_end))
            break;
    }
    atomic_store(ping, FLOOR_STOP);
    waitpid(pid, NULL, 0);
    lat_from_samples(out, us, n);
    free(us);
    munmap(s, sizeof *s);
    bench_pin("none", 0);
    return 0;
}

int floor_cacheline(const char *placement, double seconds, struct lat *out)
{
    return floor_bounce(placement, seconds, out, 0);
}

int floor_twolines(const char *placement, double seconds, struct lat *out)
{
    return floor_bounce(placement, seconds, out, 1);
}

/* The bare futex: the same exchange through two words, each side sleeping in FUTEX_WAIT and
 * woken by FUTEX_WAKE (each round trip timed on its own: a wake-up costs microseconds). */
struct floor_shm {
    _Alignas(64) _Atomic uint32_t ping;
    _Alignas(64) _Atomic uint32_t pong;
    _Alignas(64) _Atomic uint32_t stop;
};

int floor_futex(const char *placement, double seconds, struct lat *out)
{
    struct floor_shm *s = shared_page(sizeof *s);
    if (!s)
        return -ENOMEM;
    pid_t pid = fork();
    if (pid == 0) {
        bench_pin(placement, 1);
        for (uint32_t i = 1;; i++) {
            while (atomic_load_explicit(&s->ping, memory_order_acquire) != i) {
                if (atomic_load_explicit(&s->stop, memory_order_relaxed))
                    _exit(0);
                fut(&s->ping, FUTEX_WAIT, i - 1);
            }
            atomic_store_explicit(&s->pong, i, memory_order_release);
            fut(&s->pong, FUTEX_WAKE, 1);
        }
    }
    bench_pin(placement, 0);
    long cap = 2000000;
    double *us = malloc((size_t)cap * sizeof *us);
    long n = 0;
    uint64_t start = bench_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    uint64_t hard_end = start + (uint64_t)(5 * seconds * 1e9);
    for (uint32_t i = 1; n < cap; i++) {
        uint64_t t0 = bench_now_ns();
        atomic_store_explicit(&s->ping, i, memory_order_release);
        fut(&s->ping, FUTEX_WAKE, 1);
        while (atomic_load_explicit(&s->pong, memory_order_acquire) != i)
            fut(&s->pong, FUTEX_WAIT, i - 1);
        uint64_t t1 = bench_now_ns();
        if (i > 100) /* warm-up */
            us[n++] = (double)(t1 - t0) / 1e3;
        if (bench_enough(n, t1, end, hard_end))
            break;
    }
    atomic_store(&s->stop, 1);
    atomic_store(&s->ping, 0);
    fut(&s->ping, FUTEX_WAKE, 1);
    waitpid(pid, NULL, 0);
    lat_from_samples(out, us, n);
    free(us);
    munmap(s, sizeof *s);
    bench_pin("none", 0);
    return 0;
}

/*
 * The minimal ring: what a 60-line single-producer single-consumer byte ring moves one way
 * between the same two cpus.  head and tail on their own lines, each side caching the other's
 * index and reloading it only when the ring looks full or empty; the producer copies each piece
 * in from a private buffer and publishes it with a release store of head, the consumer copies it
 * out to a private buffer and frees it with a release store of tail.  No wake-ups, no checks, no
 * headers.  With 64 B messages, one piece each: the floor for memlan's message rate
 * (floor_ring).  With 1 MiB messages in 64 KiB pieces through the same 256 KiB ring, as
 * memlan's streams cut them ("Stream chunks" in docs/design.md): the floor for a two-copy
 * stream, copy-in and copy-out overlapping on the two cpus (floor_pipe).
 */
#define RING_SIZE (256u * 1024u)

struct floor_ring {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint32_t stop;  /* producer: head is final */
    _Alignas(64) double MBps;            /* consumer's result */
    _Alignas(4096) uint8_t data[RING_SIZE];
};

/* msg bytes a message, moved in pieces of piece bytes (a divisor of msg and of RING_SIZE). */
static int ring_run(const char *placement, double seconds, size_t msg, size_t piece,
                    double *MBps)
{
    *MBps = 0;
    struct floor_ring *s = shared_page(sizeof *s);
    uint8_t *buf = malloc(msg);
    if (!s || !buf) {
        if (s)
            munmap(s, sizeof *s);
        free(buf);
        return -ENOMEM;
    }
    memset(buf, 7, msg);
    int yield = strcmp(placement, "same") == 0;
    /* The clock every 1024th piece of 64 B, every 16th of 64 KiB: about every 64 KiB-1 MiB. */
    uint64_t every = piece >= 4096 ? 16 : 1024;
    pid_t pid = fork();
    if (pid < 0) {
        munmap(s, sizeof *s);
        free(buf);
        return -errno;
    }
    if (pid == 0) {
        bench_pin(placement, 1);
        uint64_t pos = 0, head = 0, t0 = 0, t1 = 0, n = 0, n1 = 0;
        for (;;) {
            if (pos == head) {
                head = atomic_load_explicit(&s->head, memory_order_acquire);
                if (pos == head) {
                    if (atomic_load_explicit(&s->stop, memory_order_acquire) &&
                        atomic_load_explicit(&s->head, memory_order_acquire) == pos)
                        break;
                    if (yield)
                        sched_yield();
                    else
                        relax();
                    continue;
                }
            }
            if (!t0)
                t0 = bench_now_ns();
            memcpy(buf + pos % msg, s->data + (pos & (RING_SIZE - 1)), piece);
            __asm__ __volatile__("" : : "r"(buf) : "memory");
            pos += piece;
            n++;
            atomic_store_explicit(&s->tail, pos, memory_order_release);
            if ((n & (every - 1)) == 0) {
                t1 = bench_now_ns();
                n1 = n - 1; /* pieces after the first, by t1 */
            }
        }
        if (t1 > t0)
            s->MBps = (double)n1 * (double)piece * 1e3 / (double)(t1 - t0);
        _exit(0);
    }
    bench_pin(placement, 0);
    uint64_t pos = 0, tail = 0;
    uint64_t end = bench_now_ns() + (uint64_t)(seconds * 1e9);
    for (uint64_t i = 1;; i++) {
        while (pos + piece - tail > RING_SIZE) {
            tail = atomic_load_explicit(&s->tail, memory_order_acquire);
            if (pos + piece - tail > RING_SIZE) {
                if (yield)
                    sched_yield();
                else
                    relax();
            }
        }
        memcpy(s->data + (pos & (RING_SIZE - 1)), buf + pos % msg, piece);
        pos += piece;
        atomic_store_explicit(&s->head, pos, memory_order_release);
        if ((i & (every - 1)) == 0 && bench_now_ns() >= end)
            break;
    }
    atomic_store_explicit(&s->stop, 1, memory_order_release);
    int st;
    waitpid(pid, &st, 0);
    *MBps = s->MBps;
    munmap(s, sizeof *s);
    free(buf);
    bench_pin("none", 0);
    return *MBps > 0 ? 0 : -EIO;
}

int floor_ring(const char *placement, double seconds, double *Mps)
{
    double MBps;
    int r = ring_run(placement, seconds, 64, 64, &MBps);
    *Mps = MBps / 64;
    return r;
}

int floor_pipe(const char *placement, double seconds, double *MBps)
{
    return ring_run(placement, seconds, 1u << 20, 64u * 1024u, MBps);
}

/*
 * One copy through the kernel: process_vm_readv of a 1 MiB buffer of the other process (the
 * child, on the other cpu, which wrote it once and then sleeps) into a private one, over and
 * over.  What a single-copy bulk path built on it could move at best: the source is never
 * rewritten, so after the first pass its lines are in both cpus' caches.  -EPERM (or another
 * error) where the kernel refuses (Yama's ptrace_scope, a seccomp filter): the figure is then
 * missing.
 */
int floor_cma(const char *placement, double seconds, double *MBps)
{
    *MBps = 0;
    size_t n = 1u << 20;
    int go[2], back[2];
    if (pipe(go))
        return -errno;
    if (pipe(back)) {
        int e = -errno;
        close(go[0]);
        close(go[1]);
        return e;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = -errno;
        close(go[0]);
        close(go[1]);
        close(back[0]);
        close(back[1]);
        return e;
    }
    if (pid == 0) {
        close(go[1]);
        close(back[0]);
        bench_pin(placement, 1);
        uint8_t *src = malloc(n);
        if (!src)
            _exit(1);
        memset(src, 5, n);
        uintptr_t a = (uintptr_t)src;
        char c;
        if (write(back[1], &a, sizeof a) != (ssize_t)sizeof a)
            _exit(1);
        (void)read(go[0], &c, 1); /* until the parent is done */
        _exit(0);
    }
    close(go[0]);
    close(back[1]);
    bench_pin(placement, 0);
    uintptr_t a = 0;
    int r = 0;
    uint8_t *dst = malloc(n);
    if (read(back[0], &a, sizeof a) != (ssize_t)sizeof a || !dst) {
        r = -EIO;
    } else {
        memset(dst, 0, n);
        struct iovec l = {dst, n}, rem = {(void *)a, n};
        uint64_t t0 = bench_now_ns(), end = t0 + (uint64_t)(seconds * 1e9), t = t0, bytes = 0;
        while (t < end) {
            ssize_t got = process_vm_readv(pid, &l, 1, &rem, 1, 0);
            if (got != (ssize_t)n) {
                r = got < 0 ? -errno : -EIO;
                break;
            }
            bytes += n;
            t = bench_now_ns();
        }
        if (!r && t > t0)
            *MBps = (double)bytes * 1e3 / (double)(t - t0);
    }
    free(dst);
    close(go[1]); /* the child's read ends */
    close(back[0]);
    int st;
    waitpid(pid, &st, 0);
    bench_pin("none", 0);
    return r;
}

void floor_memcpy(double *xt, double *xr, size_t block)
{
    size_t region = 256 * 1024;
    uint8_t *shm = shared_page(region), *priv = malloc(block);
    memset(priv, 1, block);
    memset(shm, 2, region);
    double best_t = 0, best_r = 0;
    for (int rep = 0; rep < 5; rep++) {
        size_t bytes = 0, off = 0;
        uint64_t t0 = bench_now_ns();
        while (bytes < (64u << 20)) {
            memcpy(shm + off, priv, block);
            off = (off + block) % region;
            bytes += block;
        }
        double t = (double)bytes / ((double)(bench_now_ns() - t0) / 1e9) / 1e6;
        bytes = off = 0;
        t0 = bench_now_ns();
        while (bytes < (64u << 20)) {
            memcpy(priv, shm + off, block);
            off = (off + block) % region;
            bytes += block;
        }
        double r = (double)bytes / ((double)(bench_now_ns() - t0) / 1e9) / 1e6;
        if (t > best_t)
            best_t = t;
        if (r > best_r)
            best_r = r;
    }
    *xt = best_t;
    *xr = best_r;
    free(priv);
    munmap(shm, region);
}

/* ---- kernel transports as endpoints ------------------------------------------------------ */

int pair_make(struct pair *p, enum ep_kind kind, memlan_fabric_t *fab, int msg, size_t ring)
{
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->fab = fab;
    p->memlan_msg = msg;
    p->ring = ring;
    p->lfd = -1;
    switch (kind) {
    case EP_MEMLAN: {
        struct memlan_channel_opts o = {.kind = msg ? MEMLAN_MSG : MEMLAN_STREAM,
                                        .ring_size = ring};
        int r = memlan_channel_create(fab, &o, &p->creator);
        if (r < 0)
            return r;
        strcpy(p->token, memlan_channel_token(p->creator));
        return 0;
    }
    case EP_TCP: {
        p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) < 0 ||
            listen(p->lfd, 1) < 0 || getsockname(p->lfd, (struct sockaddr *)&a, &al) < 0)
            return -errno;
        p->port = ntohs(a.sin_port);
        return 0;
    }
    case EP_UNIX:
        return socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p->sv) < 0 ? -errno : 0;
    case EP_PIPE:
        if (pipe(p->p1) < 0 || pipe(p->p2) < 0)
            return -errno;
        return 0;
    }
    return -EINVAL;
}

static void tcp_tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int pair_parent(struct pair *p, struct ep *e)
{
    memset(e, 0, sizeof *e);
    e->kind = p->kind;
    switch (p->kind) {
    case EP_MEMLAN:
        e->ch = p->creator;
        return memlan_channel_wait_peer(e->ch, 10000);
    case EP_TCP:
        e->rfd = e->wfd = accept(p->lfd, NULL, NULL);
        int err = errno;
        close(p->lfd);
        if (e->rfd < 0)
            return -err;
        tcp_tune(e->rfd);
        return 0;
    case EP_UNIX:
        close(p->sv[1]);
        e->rfd = e->wfd = p->sv[0];
        return 0;
    case EP_PIPE:
        close(p->p1[0]);
        close(p->p2[1]);
        e->wfd = p->p1[1];
        e->rfd = p->p2[0];
        return 0;
    }
    return -EINVAL;
}

int pair_child(struct pair *p, struct ep *e)
{
    memset(e, 0, sizeof *e);
    e->kind = p->kind;
    switch (p->kind) {
    case EP_MEMLAN:
        return memlan_channel_attach(p->fab, p->token, &e->ch);
    case EP_TCP: {
        close(p->lfd);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
            return -errno;
        tcp_tune(fd);
        e->rfd = e->wfd = fd;
        return 0;
    }
    case EP_UNIX:
        close(p->sv[0]);
        e->rfd = e->wfd = p->sv[1];
        return 0;
    case EP_PIPE:
        close(p->p1[1]);
        close(p->p2[0]);
        e->rfd = p->p1[0];
        e->wfd = p->p2[1];
        return 0;
    }
    return -EINVAL;
}

void pair_close(struct pair *p, struct ep *e, int parent)
{
    (void)p;
    (void)parent;
    if (e->kind == EP_MEMLAN) {
        memlan_channel_close(e->ch);
        return;
    }
    if (e->rfd >= 0)
        close(e->rfd);
    if (e->wfd >= 0 && e->wfd != e->rfd)
        close(e->wfd);
}

ssize_t ep_send_all(struct ep *e, const void *buf, size_t n)
{
    if (e->kind == EP_MEMLAN)
        return memlan_send(e->ch, buf, n, 0);
    size_t done = 0;
    while (done < n) {
        ssize_t r = write(e->wfd, (const char *)buf + done, n - done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)r;
    }
    return (ssize_t)done;
}

ssize_t ep_recv(struct ep *e, void *buf, size_t n)
{
    if (e->kind == EP_MEMLAN)
        return memlan_recv(e->ch, buf, n, 0);
    ssize_t r;
    do
        r = read(e->rfd, buf, n);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

ssize_t ep_recv_all(struct ep *e, void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = ep_recv(e, (char *)buf + done, n - done);
        if (r <= 0)
            return r;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

void ep_shutdown(struct ep *e)
{
    if (e->kind == EP_MEMLAN)
        memlan_shutdown(e->ch, MEMLAN_SHUT_WR);
    else if (e->kind == EP_PIPE)
        close(e->wfd), e->wfd = -1;
    else
        shutdown(e->wfd, SHUT_WR);
}
