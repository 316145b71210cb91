/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* asym-barrier: the asymmetric barrier (design.md, "The asymmetric barrier").
 *   mode    where the kernel offers membarrier's global expedited barrier the process registers
 *           at its first channel; step by step (an event queue's arming runs the policy), a
 *           receiver that sleeps for each message never declares the barrier, one that took
 *           100 messages since its last sleep declares it at its next, the sender acknowledges
 *           each change at its next publication, and a receiver that never sleeps declares
 *           within 64 receives; a receiver of bursts in another process declares too.  With
 *           MEMLAN_FENCE=1 (a child that sets it before its first channel) nothing registers
 *           and nothing is declared.
 *   late    messages in bursts and at irregular paces to a receiver that never spins (every
 *           empty look arms and sleeps), through a small ring (the sender waits for room too):
 *           each carries its send time, and none may arrive 90 ms or more after it was sent,
 *           unless the machine's scheduling explains it.  A lost wake-up leaves its waiter
 *           asleep until its liveness look (100 ms at first), and that look finding what it
 *           waited for, with no wake-up call made meanwhile, is what the test calls one (the
 *           channel's wait_found_late); a message is excused only when the time the two sides
 *           spent runnable but off a cpu since it was sent (their run delays, from
 *           /proc/thread-self/schedstat) covers its delay past 90 ms (late_kind).  A failure
 *           prints what each late episode was.  "asym-barrier N late RUNS" runs only these
 *           streams, RUNS times (a reproduction under load); ASYM_RX_CPU=k pins the receiver.
 *   litmus  the store-buffering pattern on a channel's own words, both processes released
 *           together n times: the producer publishes with ml_ring_produce(nofence) and loads
 *           the consumer's tripwire; the consumer, its declaration on, arms, fences, makes the
 *           barrier (__ml_mb_wait_barrier) and looks for the bytes.  Neither seeing the other's
 *           store is a lost wake-up: it must never happen.  The same without the consumer's
 *           barrier runs first as a control and is only reported: how often it happens there
 *           says how sharp the test is on this machine (2 to 7 in 200,000 on the project's VM:
 *           a barrier that stopped working would most likely show in the rounds with it). */
#include "test.h"
#include "channel.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define LATE_NS (90ull * 1000 * 1000)

static bool kernel_offers(void)
{
    long q = syscall(SYS_membarrier, 0, 0, 0);
    return q > 0 && (q & 2) && (q & 4);
}

/* Zeroed memory this process and its fork children share. */
static void *shared(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(p != MAP_FAILED);
    return p;
}

static void spin_ns(uint64_t ns)
{
    uint64_t end = ml_test_now_ns() + ns;
    while (ml_test_now_ns() < end)
        ;
}

/* The calling thread's run delay (time spent runnable, waiting for a cpu), ns, from the second
 * field of /proc/thread-self/schedstat (fd); -1 where the kernel does not keep it. */
static int64_t run_delay_ns(int fd)
{
    char b[96];
    if (fd < 0)
        return -1;
    ssize_t k = pread(fd, b, sizeof b - 1, 0);
    if (k <= 0)
        return -1;
    b[k] = 0;
    char *e;
    (void)strtoull(b, &e, 10);
    return (int64_t)strtoull(e, NULL, 10);
}

/* A side's run delay over time: samples (when, run delay so far), in time order, the last cap
 * of them (cap a power of two). */
struct rd_line {
    uint64_t *t;
    int64_t *rd;
    long n, cap;
    int fd; /* /proc/thread-self/schedstat */
};

static void rd_open(struct rd_line *l, long cap)
{
    *l = (struct rd_line){.t = calloc((size_t)cap, sizeof *l->t),
                          .rd = calloc((size_t)cap, sizeof *l->rd), .cap = cap};
    ASSERT_TRUE(l->t && l->rd);
    l->fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
}

static void rd_close(struct rd_line *l)
{
    if (l->fd >= 0)
        close(l->fd);
    free(l->t);
    free(l->rd);
}

/* A sample now (the time taken after the read, so that the sample never claims more than had
 * accrued by its time); its index, or -1 where the kernel keeps no run delay. */
static long rd_take(struct rd_line *l)
{
    int64_t rd = run_delay_ns(l->fd);
    if (rd < 0)
        return -1;
    l->t[l->n & (l->cap - 1)] = ml_test_now_ns();
    l->rd[l->n & (l->cap - 1)] = rd;
    return l->n++;
}

/* The run delay accrued from the last sample taken at or before t to sample k: an upper bound
 * on what accrued from t to sample k, loose by what accrued between that sample and t (at most
 * a few hundred quick calls, or the part of a stall that came before t).  -1: unknown. */
static int64_t rd_since(const struct rd_line *l, uint64_t t, long k)
{
    long lo = l->n > l->cap ? l->n - l->cap : 0, hi = k + 1;
    if (k < lo || l->t[lo & (l->cap - 1)] > t)
        return -1;
    while (hi - lo > 1) { /* t[lo] <= t: the last such */
        long m = lo + (hi - lo) / 2;
        if (l->t[m & (l->cap - 1)] <= t)
            lo = m;
        else
            hi = m;
    }
    return l->rd[k & (l->cap - 1)] - l->rd[lo & (l->cap - 1)];
}

/* A side's calls that slept, made a wake-up call or took long: the span, the futex sleeps, how
 * many ran out, whether the wait found what it waited for only at the look after one that ran
 * out (wait_found_late), the wake-up calls made, and the run-delay sample taken after it. */
struct call_rec {
    uint64_t t0, t1;
    uint32_t slept, ran_out, found_late, woke;
    long sample;
};

struct call_ctrs {
    uint64_t sleeps, timeouts, found_late, wakeups;
};

static struct call_ctrs ctrs(const memlan_channel_t *ch)
{
    return (struct call_ctrs){ch->sleeps, ch->wait_timeouts, ch->wait_found_late, ch->wakeups};
}

/* After a call [t0, t1] of ch whose counters were s0 before it: logged in v (n of cap) and
 * sampled if it slept, woke the peer or took long (a sample costs about 0.5 us). */
static struct call_rec *log_call(struct call_rec *v, int *n, int cap, struct rd_line *l,
                                 const memlan_channel_t *ch, struct call_ctrs s0, uint64_t t0,
                                 uint64_t t1)
{
    if (ch->sleeps == s0.sleeps && ch->wakeups == s0.wakeups && t1 - t0 < 200000)
        return NULL;
    if (*n == cap)
        return NULL;
    struct call_rec *c = &v[(*n)++];
    *c = (struct call_rec){.t0 = t0, .t1 = t1, .slept = (uint32_t)(ch->sleeps - s0.sleeps),
                           .ran_out = (uint32_t)(ch->wait_timeouts - s0.timeouts),
                           .found_late = (uint32_t)(ch->wait_found_late - s0.found_late),
                           .woke = (uint32_t)(ch->wakeups - s0.wakeups), .sample = rd_take(l)};
    return c;
}

/* The logged call of v that started at t0, or NULL. */
static const struct call_rec *log_find(const struct call_rec *v, int n, uint64_t t0)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (v[m].t0 < t0)
            lo = m + 1;
        else
            hi = m;
    }
    return lo < n && v[lo].t0 == t0 ? &v[lo] : NULL;
}

/* Wake-up calls in v made in [a, b] (a call's wake-up comes at its end: after its publication
 * or release, which follows any wait). */
static int log_woke(const struct call_rec *v, int n, uint64_t a, uint64_t b)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v[i].woke && v[i].t1 >= a && v[i].t1 <= b)
            k++;
    return k;
}

/* A late message, as the receiver saw it; the sender's side is filled in after the run. */
enum late_kind { LATE_RX_SCHED, LATE_TX_SCHED, LATE_LOST_RX, LATE_LOST_TX, LATE_UNEXPLAINED };
static const char *const late_kind_name[] = {
    "scheduling: the receiver was runnable, waiting for a cpu",
    "scheduling: the sender (with the receiver) was runnable, waiting for a cpu",
    "LOST WAKE-UP: the receiver found the data at its liveness look, no wake-up made",
    "LOST WAKE-UP: the sender found room at its liveness look, no wake-up made",
    "unexplained",
};

struct late_msg {
    int i;
    enum late_kind kind;
    uint64_t stamp, delay;  /* its send time; receive time - send time */
    struct call_rec rx;     /* the recv call that returned it (zero counters: a quick one) */
    int64_t rx_rd, tx_rd;   /* each side's run delay since its last sample before the send */
    struct call_rec tx;     /* the send call that sent it (zero: a quick one) */
    int tx_woke, rx_woke;   /* wake-up calls each side made during the other's call */
};

struct late_sh {
    _Atomic int ready;        /* the receiver is ready to measure */
    int late, sleeps, nrx, unexcused, by_kind[5];
    uint32_t rx_decl_seq, rx_decl_on_seen;
    uint64_t worst, rx_found_late, tx_found_late;
    struct late_msg *msgs;    /* in this mapping, after the receiver's log */
    struct call_rec rx[];     /* the receiver's log */
};

/* What made message m late.  A lost wake-up: a side waited for what the other had already made
 * (data, or room) and found it only at the look after its sleep ran out (the liveness
 * interval), with no wake-up call from the other side meanwhile; never excused.  The machine's
 * scheduling: the time the receiver, and the sender in the call that sent m, spent runnable but
 * off a cpu (their run delays, each measured from its last sample before m was sent) covers the
 * delay past the bound; the two are added, as in a message sent into a full ring while the
 * receiver is held off a cpu, whose sender then waits for a cpu once woken.  Anything else is
 * unexplained, and counts as late as before. */
static enum late_kind late_kind(const struct late_msg *m)
{
    uint64_t over = m->delay - LATE_NS;
    if (m->rx.found_late)
        return m->tx_woke ? LATE_UNEXPLAINED : LATE_LOST_RX;
    if (m->tx.found_late && !m->rx_woke)
        return LATE_LOST_TX;
    if (m->rx_rd < 0 || m->tx_rd < 0)
        return LATE_UNEXPLAINED; /* no run delay kept here: as before */
    if ((uint64_t)m->rx_rd >= over)
        return LATE_RX_SCHED;
    if ((uint64_t)(m->rx_rd + m->tx_rd) >= over)
        return LATE_TX_SCHED;
    return LATE_UNEXPLAINED;
}

static void late_print(const struct late_msg *m, int run)
{
    printf("    late from #%d (%d in a row), %.3f ms: %s\n"
           "      recv call %.3f ms, slept %u, ran out %u, found late %u; receiver runnable "
           "%.3f ms since the send; sender's wake-ups meanwhile %d\n"
           "      send call %.3f ms, slept %u, ran out %u, found late %u; sender runnable "
           "%.3f ms since the send; receiver's wake-ups meanwhile %d\n",
           m->i, run, (double)m->delay / 1e6, late_kind_name[m->kind],
           (double)(m->rx.t1 - m->rx.t0) / 1e6, m->rx.slept, m->rx.ran_out, m->rx.found_late,
           (double)m->rx_rd / 1e6, m->tx_woke, (double)(m->tx.t1 - m->tx.t0) / 1e6,
           m->tx.slept, m->tx.ran_out, m->tx.found_late, (double)m->tx_rd / 1e6, m->rx_woke);
}

/* The late messages of a run, told by the first of each run of them in a row of one kind, at
 * most 8. */
static void late_report(const struct late_sh *r)
{
    if (!r->late)
        return;
    printf("    late: %d by the receiver's scheduling, %d by the sender's, %d lost wake-ups "
           "(receiver), %d (sender), %d unexplained; liveness looks that found what they "
           "waited for: receiver %llu, sender %llu\n",
           r->by_kind[LATE_RX_SCHED], r->by_kind[LATE_TX_SCHED], r->by_kind[LATE_LOST_RX],
           r->by_kind[LATE_LOST_TX], r->by_kind[LATE_UNEXPLAINED],
           (unsigned long long)r->rx_found_late, (unsigned long long)r->tx_found_late);
    int shown = 0;
    for (int k = 0; k < r->late && shown < 8; k++) {
        const struct late_msg *m = &r->msgs[k];
        if (k > 0 && r->msgs[k - 1].i == m->i - 1 && r->msgs[k - 1].kind == m->kind)
            continue;
        int run = 1;
        while (k + run < r->late && r->msgs[k + run].i == m->i + run &&
               r->msgs[k + run].kind == m->kind)
            run++;
        late_print(m, run);
        shown++;
    }
}

/* n messages of size bytes a -> b, in bursts of burst with a pause of pause_ns after each, or
 * (burst 1) a random pause below pause_ns after each.  Returns how many arrived late that the
 * machine's scheduling does not explain (late_kind); *out tells the rest. */
static int stream(memlan_fabric_t *fab, int n, uint32_t ring, int size, int burst, int pause_ns,
                  struct late_sh *out, struct late_msg **msgs)
{
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = ring};
    size_t shsz = sizeof(struct late_sh) + (size_t)n * sizeof(struct call_rec) +
                  (size_t)n * sizeof(struct late_msg);
    struct late_sh *sh = shared(shsz);
    struct late_msg *lm = (struct late_msg *)(void *)&sh->rx[n];
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0) {
        uint64_t stamp[128];
        /* ASYM_RX_CPU=k (a reproduction's placement): the receiver on cpu k only. */
        const char *pin = getenv("ASYM_RX_CPU");
        if (pin && *pin) {
            cpu_set_t cs;
            CPU_ZERO(&cs);
            CPU_SET(atoi(pin), &cs);
            ASSERT_OK(sched_setaffinity(0, sizeof cs, &cs));
        }
        struct rd_line rl;
        rd_open(&rl, 8192);
        (void)rd_take(&rl);
        atomic_store(&sh->ready, 1);
        for (int i = 0; i < n; i++) {
            struct call_ctrs c0 = ctrs(ch);
            uint64_t t0 = ml_test_now_ns();
            ssize_t r = memlan_recv(ch, stamp, sizeof stamp, 0);
            uint64_t t1 = ml_test_now_ns();
            ASSERT_EQ(r, (ssize_t)size);
            uint64_t d = t1 - stamp[0];
            ASSERT_EQ(stamp[1], (uint64_t)i);
            const struct call_rec *c = log_call(sh->rx, &sh->nrx, n, &rl, ch, c0, t0, t1);
            if ((i & 255) == 0 && !c)
                (void)rd_take(&rl); /* samples at most a few hundred quick calls apart */
            if (d >= LATE_NS) {
                long k = c ? c->sample : rd_take(&rl);
                lm[sh->late++] = (struct late_msg){
                    .i = i, .stamp = stamp[0], .delay = d,
                    .rx = c ? *c : (struct call_rec){.t0 = t0, .t1 = t1},
                    .rx_rd = k >= 0 ? rd_since(&rl, stamp[0], k) : -1, .tx_rd = -1};
            }
            if (d > sh->worst)
                sh->worst = d;
            uint32_t decl = ml_load_relaxed(&ch->rx.ctl->rx_mb);
            sh->rx_decl_seq = decl >> 2;
            sh->rx_decl_on_seen |= decl & 1;
        }
        sh->sleeps = (int)ch->sleeps;
        sh->rx_found_late = ch->wait_found_late;
        memlan_channel_close(ch);
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    while (!atomic_load(&sh->ready))
        sched_yield();
    struct rd_line rl;
    long cap = 1;
    while (cap < 2 * (long)n + 16)
        cap *= 2;
    rd_open(&rl, cap);
    (void)rd_take(&rl);
    struct call_rec *txv = calloc((size_t)n, sizeof *txv);
    ASSERT_TRUE(txv != NULL);
    int ntx = 0;
    uint64_t seed = 42, stamp[128] = {0};
    for (int i = 0; i < n; i++) {
        struct call_ctrs c0 = ctrs(ch);
        stamp[0] = ml_test_now_ns();
        stamp[1] = (uint64_t)i;
        ASSERT_EQ(memlan_send(ch, stamp, (size_t)size, 0), (ssize_t)size);
        bool logged = log_call(txv, &ntx, n, &rl, ch, c0, stamp[0], ml_test_now_ns()) != NULL;
        uint64_t p = 0;
        if (burst > 1 && (i + 1) % burst == 0)
            p = (uint64_t)pause_ns;
        else if (burst == 1 && pause_ns)
            p = ml_test_rand(&seed) % (uint64_t)pause_ns;
        uint64_t end = ml_test_now_ns() + p;
        if (p)
            spin_ns(p);
        /* Samples a few hundred quick calls apart, and after a pause that ran long (we were
         * held off a cpu there, before the next message was stamped). */
        if (((i & 255) == 0 && !logged) || ml_test_now_ns() - end > 1000000)
            (void)rd_take(&rl);
    }
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    sh->tx_found_late = ch->wait_found_late;
    memlan_channel_close(ch);
    for (int k = 0; k < sh->late; k++) {
        struct late_msg *m = &lm[k];
        const struct call_rec *t = log_find(txv, ntx, m->stamp);
        if (t) {
            m->tx = *t;
            m->tx_rd = t->sample >= 0 ? rd_since(&rl, m->stamp, t->sample) : -1;
            m->rx_woke = log_woke(sh->rx, sh->nrx, t->t0, t->t1);
        } else {
            m->tx_rd = 0; /* a quick call: sent at once */
        }
        m->tx_woke = log_woke(txv, ntx, m->rx.t0, m->rx.t1);
        m->kind = late_kind(m);
        /* Behind a lost wake-up in the ring: lost with it. */
        if (m->kind == LATE_UNEXPLAINED && k > 0 && lm[k - 1].i == m->i - 1 &&
            (lm[k - 1].kind == LATE_LOST_RX || lm[k - 1].kind == LATE_LOST_TX))
            m->kind = lm[k - 1].kind;
        sh->by_kind[m->kind]++;
        if (m->kind != LATE_RX_SCHED && m->kind != LATE_TX_SCHED)
            sh->unexcused++;
    }
    rd_close(&rl);
    free(txv);
    *out = *sh;
    *msgs = NULL;
    if (sh->late) {
        *msgs = malloc((size_t)sh->late * sizeof **msgs);
        ASSERT_TRUE(*msgs != NULL);
        memcpy(*msgs, lm, (size_t)sh->late * sizeof **msgs);
    }
    out->msgs = *msgs;
    munmap(sh, shsz);
    return out->unexcused;
}

struct litmus_sh {
    _Alignas(64) _Atomic int go;
    _Alignas(64) _Atomic int done;
    _Alignas(64) _Atomic int ack, cleared;
    _Alignas(64) int seen; /* the consumer's look at iteration done */
};

/* How many iterations ended with neither side seeing the other's store. */
static int litmus(memlan_fabric_t *fab, int n, bool barrier)
{
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
    struct litmus_sh *sh = shared(sizeof *sh);
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0) {
        /* Declared on, as a receiver of a stream of messages would be. */
        ml_store_relaxed(&ch->rx.ctl->rx_mb, 5u); /* sequence 1, on */
        for (int i = 1; i <= n; i++) {
            while (atomic_load(&sh->go) != i)
                ;
            ml_fetch_or(&ch->rx.ctl->rx_wait, ML_WAIT_FUTEX);
            ml_fence();
            if (barrier)
                ASSERT_EQ(__ml_mb_wait_barrier(ch, &ch->rx.ctl->rx_mb, &ch->rx.ctl->rx_mb_ack),
                          0);
            /* This iteration's 8 bytes, as a waiter's re-check looks (head reloaded when the
             * cached one does not cover them); whatever is there is consumed, so an earlier
             * iteration's late bytes never count for a later one. */
            uint64_t want = 8 * (uint64_t)i - ch->rx.pos;
            int64_t a = ml_ring_avail(&ch->rx, want);
            ASSERT_GE(a, 0);
            sh->seen = (uint64_t)a >= want;
            atomic_store(&sh->done, i);
            /* The tripwire stays armed until the producer has looked at it, as a sleeper's
             * does. */
            while (atomic_load(&sh->ack) != i)
                ;
            ml_store_relaxed(&ch->rx.ctl->rx_wait, 0u);
            if (a > 0)
                ml_ring_consume(&ch->rx, (uint64_t)a, false);
            atomic_store(&sh->cleared, i);
        }
        memlan_channel_close(ch);
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    int both = 0;
    for (int i = 1; i <= n; i++) {
        ASSERT_GE(ml_ring_free(&ch->tx, 8), 8);
        atomic_store(&sh->go, i);
        /* Delays spread over the consumer's reaction time to go, so that the two sides'
         * stores and loads overlap in some iterations (a bare store-buffering test on this
         * VM found the pattern most often with this spread). */
        for (volatile int k = 0; k < (i * 7) % 800; k++)
            ;
        ml_ring_produce(&ch->tx, 8, true);
        uint32_t armed = atomic_load_explicit(&ch->tx.ctl->rx_wait, memory_order_seq_cst);
        while (atomic_load(&sh->done) != i)
            ;
        if (!armed && !sh->seen)
            both++;
        atomic_store(&sh->ack, i);
        while (atomic_load(&sh->cleared) != i)
            ;
    }
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);
    munmap(sh, sizeof *sh);
    return both;
}

/* The declaration policy, step by step in one thread: b is in an event queue, so a receive
 * that finds nothing arms b's tripwire there (as a poller's sleep would) and runs the policy. */
static uint32_t arm_b(memlan_channel_t *b)
{
    char buf[64];
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    return ml_load_relaxed(&b->rx.ctl->rx_mb);
}

static void policy(memlan_fabric_t *fab, bool offered)
{
    memlan_channel_t *a, *b;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 65536};
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, 0, &q));
    ASSERT_OK(memlan_evq_add(q, b, MEMLAN_EV_READ, b));
    char buf[64] = {0};
    _Atomic uint32_t *ack = &b->rx.ctl->rx_mb_ack;
    /* One message per sleep, as a request and its reply: never declared, no barrier. */
    for (int i = 0; i < 100; i++) {
        ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
        ASSERT_EQ(arm_b(b), 0u);
    }
    ASSERT_EQ(b->mb_barriers, 0);
    /* 100 messages between two sleeps: the sender has never acknowledged anything, so the
     * first declaration is the probe (sequence 1, off), which needs no barrier... */
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    uint32_t d = arm_b(b);
    ASSERT_EQ(d, offered ? 4u : 0u);
    ASSERT_EQ(b->mb_barriers, 0);
    /* ...and that the sender acknowledges at its next publication, in its own line. */
    ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
    ASSERT_EQ(ml_load_relaxed(ack), d);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    /* 100 more: on (sequence 2), and the arming makes the barrier. */
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    d = arm_b(b);
    ASSERT_EQ(d, offered ? 9u : 0u);
    ASSERT_EQ(b->mb_barriers, offered ? 1 : 0);
    ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
    ASSERT_EQ(ml_load_relaxed(ack), d);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    /* One message per sleep again: still on for three sleeps (a barrier each), off at the
     * fourth (sequence 3, after an on), which still makes the barrier until the sender has
     * acknowledged it: a publication that read the on may still come without one. */
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(arm_b(b), offered ? 9u : 0u);
        ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    }
    ASSERT_EQ(b->mb_barriers, offered ? 4 : 0);
    d = arm_b(b);
    ASSERT_EQ(d, offered ? 14u : 0u);
    ASSERT_EQ(b->mb_barriers, offered ? 5 : 0);
    if (offered)
        ASSERT_NE(ml_load_relaxed(ack), d);
    ASSERT_EQ(arm_b(b), d); /* not acknowledged yet: the barrier again */
    ASSERT_EQ(b->mb_barriers, offered ? 6 : 0);
    ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
    ASSERT_EQ(ml_load_relaxed(ack), d);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    ASSERT_EQ(arm_b(b), d); /* acknowledged: no barrier */
    ASSERT_EQ(b->mb_barriers, offered ? 6 : 0);
    /* A receiver that never sleeps (a spinning one) declares within 64 receives. */
    for (int i = 0; i < 300; i++) {
        ASSERT_EQ(memlan_send(a, buf, 8, 0), 8);
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 8);
    }
    ASSERT_EQ(ml_load_relaxed(&b->rx.ctl->rx_mb) & 1u, offered ? 1u : 0u);
    /* A peer's words never make a process that may not make the barrier call it: with
     * MEMLAN_FENCE=1 (offered false here) a forged "on" and a forged acknowledgement are
     * ignored (a review killed such a victim under a filter that kills for membarrier). */
    if (!offered) {
        ml_store_relaxed(&b->rx.ctl->rx_mb, 5u);
        ASSERT_EQ(arm_b(b), 5u);
        ml_store_relaxed(&b->rx.ctl->rx_mb, 6u);
        ASSERT_EQ(arm_b(b), 6u);
        ASSERT_EQ(b->mb_barriers, 0);
    }
    memlan_evq_close(q);
    memlan_channel_close(a);
    memlan_channel_close(b);
}

/* From here on membarrier fails with EPERM in this process (a seccomp filter). */
static void refuse_membarrier(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_membarrier, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = {.len = sizeof f / sizeof f[0], .filter = f};
    ASSERT_OK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
    ASSERT_OK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p));
}

struct path_sh {
    _Atomic int probed, acked, sent, drain;
};

/* Each way a waiter arms, with its declaration on, must make the barrier: with membarrier
 * refused from the arming on, the channel records the refusal (mb_lost), its declaration goes
 * off, and the wait still ends with the data (the bounded sleep).  which: 0 a blocking recv's
 * sleep, 1 a blocking send's wait for room, 2 an event queue's arming at EAGAIN. */
static void barrier_path(memlan_fabric_t *fab, int which)
{
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 4096};
    struct path_sh *sh = shared(sizeof *sh);
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    char buf[64] = {0};
    if (pid == 0) {
        memlan_evq_t *q = NULL;
        if (which == 2) {
            ASSERT_OK(memlan_evq_create(fab, 0, &q));
            ASSERT_OK(memlan_evq_add(q, ch, MEMLAN_EV_READ, ch));
        }
        /* The probe, as the policy writes it first, so that the peer's next publication
         * acknowledges something and our declaration may go on (ml_mb_set). */
        ml_store_relaxed(which == 1 ? &ch->tx.ctl->tx_mb : &ch->rx.ctl->rx_mb, 4u);
        if (which == 1)
            ASSERT_EQ(memlan_send(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
        atomic_store(&sh->probed, 1);
        if (which == 1) {
            while (!atomic_load(&sh->acked))
                ;
            ASSERT_EQ(ml_load_relaxed(&ch->tx.ctl->tx_mb_ack), 4u);
            /* Fill our sending ring without waiting: the blocking send below waits for room
             * with every one of those sends since its last wait. */
            int k = 0;
            while (memlan_send(ch, buf, sizeof buf, MEMLAN_DONTWAIT) == (ssize_t)sizeof buf)
                k++;
            ASSERT_GE(k, 20);
        } else {
            /* 40 messages taken without a wait in between. */
            while (!atomic_load(&sh->sent))
                ;
            ASSERT_EQ(ml_load_relaxed(&ch->rx.ctl->rx_mb_ack), 4u);
            for (int i = 0; i < 40; i++)
                ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, MEMLAN_DONTWAIT), (ssize_t)sizeof buf);
        }
        refuse_membarrier();
        atomic_store(&sh->drain, 1);
        if (which == 0) {
            ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
        } else if (which == 1) {
            ASSERT_EQ(memlan_send(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
        } else {
            ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
            struct memlan_event ev;
            ASSERT_EQ(memlan_evq_wait(q, &ev, 1, 5000), 1);
            ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, MEMLAN_DONTWAIT), (ssize_t)sizeof buf);
        }
        ASSERT_TRUE(ml_load_relaxed(&ch->mb_lost));
        _Atomic uint32_t *decl = which == 1 ? &ch->tx.ctl->tx_mb : &ch->rx.ctl->rx_mb;
        ASSERT_EQ(ml_load_relaxed(decl) & 1u, 0u);
        if (q)
            memlan_evq_close(q);
        memlan_channel_close(ch);
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    while (!atomic_load(&sh->probed))
        ;
    if (which == 1) { /* our receive reads the probe and acknowledges it */
        ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
        atomic_store(&sh->acked, 1);
    } else {
        for (int i = 0; i < 40; i++)
            ASSERT_EQ(memlan_send(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
        atomic_store(&sh->sent, 1);
    }
    while (!atomic_load(&sh->drain))
        ;
    usleep(30 * 1000); /* the waiter is asleep by now */
    if (which == 1) {
        for (int i = 0; i < 10; i++)
            ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
    } else {
        ASSERT_EQ(memlan_send(ch, buf, sizeof buf, 0), (ssize_t)sizeof buf);
    }
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);
    munmap(sh, sizeof *sh);
}

static int late_runs(memlan_fabric_t *fab, int n, bool want_on)
{
    int late = 0;
    struct late_sh r;
    struct late_msg *msgs;
    /* Bursts of 200 64 B messages into a 64 KiB ring: the receiver drains each burst, then
     * sleeps, with 200 receives since its last sleep: it declares. */
    late += stream(fab, n, 65536, 64, 200, 2000000 / 20, &r, &msgs);
    printf("  bursts: %d of %d late (%d not the machine's scheduling), worst %.3f ms, receiver "
           "slept %d times (found at a liveness look: %llu, sender: %llu), declared %s (sequence %u)\n", r.late,
           n, r.unexcused, (double)r.worst / 1e6, r.sleeps, (unsigned long long)r.rx_found_late,
           (unsigned long long)r.tx_found_late, r.rx_decl_on_seen ? "on" : "never",
           r.rx_decl_seq);
    late_report(&r);
    free(msgs);
    ASSERT_EQ(r.rx_decl_on_seen, want_on ? 1u : 0u);
    /* 1 KiB records at irregular paces through a 16 KiB ring (15 records: the sender waits for
     * room too); the publishing store waits behind the payload's lines in the store buffer. */
    for (int k = 0; k < 3; k++) {
        late += stream(fab, n, 16384, 1024, 1, k == 0 ? 0 : k == 1 ? 2000 : 20000, &r, &msgs);
        printf("  pace %d: %d of %d late (%d not the machine's scheduling), worst %.3f ms, "
               "receiver slept %d times (found at a liveness look: %llu, sender: %llu)\n", k, r.late, n,
               r.unexcused, (double)r.worst / 1e6, r.sleeps,
               (unsigned long long)r.rx_found_late, (unsigned long long)r.tx_found_late);
        late_report(&r);
        free(msgs);
    }
    fflush(stdout);
    return late;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    setenv("MEMLAN_SPIN_US", "0", 1);
    ml_test_watchdog(240);
    memlan_fabric_t *fab = ml_test_fabric();
    uint64_t t0 = ml_test_now_ns();
    bool offered = kernel_offers();
    if (argc > 2 && strcmp(argv[2], "late") == 0) {
        /* Only the streams, as often as asked (to look for late messages under load). */
        int runs = argc > 3 ? atoi(argv[3]) : 1, bad = 0;
        for (int k = 0; k < runs; k++)
            bad += late_runs(fab, n, offered) != 0;
        printf("asym-barrier late: %d of %d runs had late messages\n", bad, runs);
        ml_test_fabric_empty(fab);
        return bad != 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MEMLAN_FENCE", "1", 1);
        ASSERT_EQ(late_runs(fab, n / 10, false), 0);
        policy(fab, false);
        ASSERT_TRUE(ml_load_relaxed(&__ml_mb_on) < 0);
        printf("  (the above with MEMLAN_FENCE=1)\n");
        fflush(stdout);
        _exit(0);
    }
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    ASSERT_EQ(late_runs(fab, n, offered), 0);
    ASSERT_EQ(ml_load_relaxed(&__ml_mb_on) > 0, offered);
    policy(fab, offered);
    if (offered) {
        for (int w = 0; w < 3; w++)
            barrier_path(fab, w);
        printf("  each arming path made the barrier (recorded its refusal)\n");
        /* The control first, in rounds, until it has found 10 misses or spent 4 s; then the
         * rounds with the barrier, enough that a barrier that did nothing would be expected
         * to miss about 20 times (at most 6 s). */
        long ctl_n = 0, ctl = 0, with_n = 0, with = 0;
        uint64_t t = ml_test_now_ns();
        while (ctl < 10 && ml_test_now_ns() - t < 3000000000ull) {
            ctl += litmus(fab, 20000, false);
            ctl_n += 20000;
        }
        long need = ctl ? 20 * ctl_n / ctl : n;
        t = ml_test_now_ns();
        while (with_n < need && ml_test_now_ns() - t < 6000000000ull) {
            with += litmus(fab, 10000, true);
            with_n += 10000;
        }
        printf("  litmus: without the consumer's barrier %ld of %ld missed each other (a "
               "control), with it %ld of %ld (a barrier that did nothing: about %.0f expected)\n",
               ctl, ctl_n, with, with_n, ctl_n ? (double)with_n * (double)ctl / (double)ctl_n : 0);
        ASSERT_EQ(with, 0);
    }
    ml_test_fabric_empty(fab);
    printf("asym-barrier: ok, barrier %s (%.1f s)\n", offered ? "asymmetric" : "not offered",
           (double)(ml_test_now_ns() - t0) / 1e9);
    return 0;
}
