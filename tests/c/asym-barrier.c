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
 *           each carries its send time, and none may arrive 90 ms or more after it was sent.
 *           A lost wake-up leaves its waiter asleep until its liveness look (100 ms at first).
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

struct late_sh {
    int late, sleeps;
    uint32_t rx_decl_seq, rx_decl_on_seen;
    uint64_t worst;
};

/* n messages of size bytes a -> b, in bursts of burst with a pause of pause_ns after each, or
 * (burst 1) a random pause below pause_ns after each.  Returns how many arrived late. */
static int stream(memlan_fabric_t *fab, int n, uint32_t ring, int size, int burst, int pause_ns,
                  struct late_sh *out)
{
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = ring};
    struct late_sh *sh = shared(4096);
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0) {
        uint64_t stamp[128];
        for (int i = 0; i < n; i++) {
            ssize_t r = memlan_recv(ch, stamp, sizeof stamp, 0);
            ASSERT_EQ(r, (ssize_t)size);
            uint64_t d = ml_test_now_ns() - stamp[0];
            ASSERT_EQ(stamp[1], (uint64_t)i);
            if (d >= LATE_NS)
                sh->late++;
            if (d > sh->worst)
                sh->worst = d;
            uint32_t decl = ml_load_relaxed(&ch->rx.ctl->rx_mb);
            sh->rx_decl_seq = decl >> 2;
            sh->rx_decl_on_seen |= decl & 1;
        }
        sh->sleeps = (int)ch->sleeps;
        memlan_channel_close(ch);
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    uint64_t seed = 42, stamp[128] = {0};
    for (int i = 0; i < n; i++) {
        stamp[0] = ml_test_now_ns();
        stamp[1] = (uint64_t)i;
        ASSERT_EQ(memlan_send(ch, stamp, (size_t)size, 0), (ssize_t)size);
        if (burst > 1 && (i + 1) % burst == 0)
            spin_ns((uint64_t)pause_ns);
        else if (burst == 1 && pause_ns)
            spin_ns(ml_test_rand(&seed) % (uint64_t)pause_ns);
    }
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);
    *out = *sh;
    munmap(sh, 4096);
    return out->late;
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
    /* Bursts of 200 64 B messages into a 64 KiB ring: the receiver drains each burst, then
     * sleeps, with 200 receives since its last sleep: it declares. */
    late += stream(fab, n, 65536, 64, 200, 2000000 / 20, &r);
    printf("  bursts: %d of %d late, worst %.3f ms, receiver slept %d times, declared %s "
           "(sequence %u)\n", r.late, n, (double)r.worst / 1e6, r.sleeps,
           r.rx_decl_on_seen ? "on" : "never", r.rx_decl_seq);
    ASSERT_EQ(r.rx_decl_on_seen, want_on ? 1u : 0u);
    /* 1 KiB records at irregular paces through a 16 KiB ring (15 records: the sender waits for
     * room too); the publishing store waits behind the payload's lines in the store buffer. */
    for (int k = 0; k < 3; k++) {
        late += stream(fab, n, 16384, 1024, 1, k == 0 ? 0 : k == 1 ? 2000 : 20000, &r);
        printf("  pace %d: %d of %d late, worst %.3f ms, receiver slept %d times\n", k, r.late,
               n, (double)r.worst / 1e6, r.sleeps);
    }
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
