/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* quick-look: a native blocking receive whose last wait ended by spinning looks a few more times
 * before it waits (ml_rx_quick, design.md "A receive looks again before it waits").
 * 1. Only then: a fresh channel, a wait that slept (the answer came 20 ms later), spinning off
 *    (MEMLAN_SPIN_US=0): no quick look, and a receive with MEMLAN_DONTWAIT never takes one.
 * 2. A request-and-reply child on another cpu, 3,000 round trips of sequence-numbered messages
 *    of 1 to 200 bytes, received in turn by memlan_recv, memlan_peek + memlan_release and
 *    memlan_recv_msgs: every reply whole and in order; the quick looks that found the reply are
 *    counted in the ring's spin_hits (memlan stat), and on two cpus or more some did.
 * 3. The same over a stream channel, replies read in two pieces (the second with WAITALL).
 * 4. A ring made corrupt 0 to 2 us into a receive (in its quick look, or about): -EPROTO, soon.
 */
#include "test.h"
#include "channel.h"

#include <pthread.h>

static uint8_t pat(uint64_t i, uint64_t j) { return (uint8_t)(i * 13 + j * 5 + 1); }

static size_t len_of(uint64_t i) { return 1 + (size_t)((i * 37) % 200); }

static void fill(uint8_t *b, uint64_t i)
{
    size_t n = len_of(i);
    memcpy(b, &i, sizeof i < n ? sizeof i : n);
    for (size_t j = sizeof i; j < n; j++)
        b[j] = pat(i, j);
}

static bool same(const uint8_t *b, size_t n, uint64_t i)
{
    if (n != len_of(i))
        return false;
    uint8_t want[256];
    fill(want, i);
    return memcmp(b, want, n) == 0;
}

/* The echo: every message back as it came (a stream: every byte), until end of stream. */
static int echo(memlan_channel_t *ch, int cpu)
{
    (void)ml_test_pin(cpu);
    uint8_t b[4096];
    for (;;) {
        ssize_t r = memlan_recv(ch, b, sizeof b, 0);
        if (r == 0) {
            memlan_channel_close(ch); /* the end, as a close: the measurer reads EOF */
            return 0;
        }
        if (r < 0 || memlan_send(ch, b, (size_t)r, 0) != r)
            return 3;
    }
}

static memlan_fabric_t *fab;

struct spoil {
    memlan_channel_t *ch;
    uint64_t after_ns;
    int cpu;
    _Atomic int ready, go;
};

/* The peer's head, made to claim more than the ring holds. */
static void *spoil_head(void *arg)
{
    struct spoil *s = arg;
    /* not the receiver's cpu: it spins, and the write must come while it does */
    (void)ml_test_pin(s->cpu);
    ml_store_release(&s->ready, 1);
    while (!ml_load_acquire(&s->go))
        ;
    uint64_t t0 = ml_test_now_ns();
    while (ml_test_now_ns() - t0 < s->after_ns)
        ;
    ml_store_release(&s->ch->rx.ctl->head, s->ch->rx.pos + 10 * s->ch->size);
    return NULL;
}

static void *late_send(void *arg)
{
    usleep(20000);
    ASSERT_EQ(memlan_send(arg, "x", 1, 0), 1);
    return NULL;
}

int main(void)
{
    ml_test_watchdog(120);
    unsetenv("MEMLAN_SPIN_US");
    fab = ml_test_fabric();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint8_t buf[4096];

    /* 1. */
    struct memlan_channel_opts mo = {.kind = MEMLAN_MSG, .ring_size = 64 * 1024};
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, &mo, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_TRUE(!b->rx_spin_first);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, late_send, a), 0);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 1); /* spun 50 us, then slept */
    pthread_join(t, NULL);
    ASSERT_TRUE(!b->rx_spin_first);
    b->rx_spin_first = true; /* as if it had spun: DONTWAIT still says at once */
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(b->rx_quick_hits, 0);
    __ml_spin_set_us(0);
    ASSERT_EQ(pthread_create(&t, NULL, late_send, a), 0);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 1); /* the quick look, then a sleep */
    pthread_join(t, NULL);
    ASSERT_TRUE(!b->rx_spin_first); /* no spin: no quick look next time */
    ASSERT_EQ(b->rx_quick_hits, 0);
    __ml_spin_set_us(-1);
    memlan_channel_close(a);
    memlan_channel_close(b);

    /* 2. */
    /* two cpus of ours where we may have them (a cpuset may leave cpu 0 out) */
    int c0 = ml_test_cpu(0), other = ml_test_cpu(1) >= 0 ? ml_test_cpu(1) : c0;
    memlan_channel_t *ch;
    pid_t pid = ml_test_fork_peer(fab, &mo, &ch);
    if (pid == 0)
        _exit(echo(ch, other));
    (void)ml_test_pin(c0);
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    const uint64_t N = 3000;
    for (uint64_t i = 0; i < N; i++) {
        fill(buf, i);
        ASSERT_EQ(memlan_send(ch, buf, len_of(i), 0), (ssize_t)len_of(i));
        switch (i % 3) {
        case 0: {
            ssize_t r = memlan_recv(ch, buf, sizeof buf, 0);
            ASSERT_TRUE(r > 0 && same(buf, (size_t)r, i));
            break;
        }
        case 1: {
            const void *p;
            ssize_t r = memlan_peek(ch, &p, 0);
            ASSERT_TRUE(r > 0 && same(p, (size_t)r, i));
            ASSERT_OK(memlan_release(ch, (size_t)r));
            break;
        }
        default: {
            struct memlan_msg v[2] = {{buf, sizeof buf, 0}, {buf + 2048, 2048, 0}};
            ASSERT_EQ(memlan_recv_msgs(ch, v, 2, 0), 1);
            ASSERT_TRUE(same(buf, v[0].got, i));
        }
        }
    }
    uint64_t quick = ch->rx_quick_hits;
    uint64_t stat = ml_load_relaxed(&ch->rx.ctl->spin_hits);
    /* every quick hit is in the published count, with the waits that spun to their answer
     * (published at the last of either) */
    ASSERT_GE(stat, quick);
    ASSERT_LE(stat, quick + __atomic_load_n(&ch->spin_hits, __ATOMIC_RELAXED));
    if (other != c0)
        ASSERT_GE(quick, 1); /* of 3,000 replies from another cpu, some within 31 pauses */
    printf("quick-look: message ring: %" PRIu64 " of %" PRIu64 " replies found by the quick look "
           "(%ld cpus)\n", quick, N, ncpu);
    ASSERT_OK(memlan_shutdown(ch, MEMLAN_SHUT_WR));
    ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 0);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);

    /* 3. */
    struct memlan_channel_opts so = {.kind = MEMLAN_STREAM, .ring_size = 64 * 1024};
    pid = ml_test_fork_peer(fab, &so, &ch);
    if (pid == 0)
        _exit(echo(ch, other));
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    for (uint64_t i = 0; i < N; i++) {
        uint8_t in[256];
        size_t n = len_of(i);
        fill(buf, i);
        ASSERT_EQ(memlan_send(ch, buf, n, 0), (ssize_t)n);
        size_t first = n / 2 ? n / 2 : n;
        ssize_t r = memlan_recv(ch, in, first, 0);
        ASSERT_TRUE(r > 0 && (size_t)r <= first);
        if ((size_t)r < n)
            ASSERT_EQ(memlan_recv(ch, in + r, n - (size_t)r, MEMLAN_WAITALL),
                      (ssize_t)(n - (size_t)r));
        ASSERT_TRUE(same(in, n, i));
    }
    printf("quick-look: stream ring: %" PRIu64 " quick hits\n", ch->rx_quick_hits);
    ASSERT_OK(memlan_shutdown(ch, MEMLAN_SHUT_WR));
    ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 0);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);

    /* 4. A hostile head, written 0 to 2 us into a receive that may be in its quick look: the
     * receive fails with -EPROTO wherever it finds it (first look, quick look or wait), and
     * soon: a quick look never waits on what the peer writes. */
    struct memlan_channel_opts ro = {.kind = MEMLAN_STREAM, .ring_size = 64 * 1024};
    uint64_t seed = 7;
    for (int k = 0; k < (other != c0 ? 200 : 5); k++) { /* one cpu: no spin, each a 100 ms sleep */
        ASSERT_OK(memlan_channel_create(fab, &ro, &a));
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        b->rx_spin_first = true;
        struct spoil sp = {b, ml_test_rand(&seed) % 2000, other, 0, 0};
        ASSERT_EQ(pthread_create(&t, NULL, spoil_head, &sp), 0);
        while (!ml_load_acquire(&sp.ready))
            sched_yield();
        /* the peer waits on the other cpu (both ends are ours, and creating them noted our
         * cpu as the peer's, which would keep the receive from spinning at all) */
        ml_store_relaxed(&b->tx.ctl->rx_cpu, (uint32_t)other + 1);
        uint64_t t0 = ml_test_now_ns();
        ml_store_release(&sp.go, 1);
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), -EPROTO);
        ASSERT_TRUE(ml_test_now_ns() - t0 < 1000000000ull);
        pthread_join(t, NULL);
        memlan_channel_close(a);
        memlan_channel_close(b);
    }

    ml_test_fabric_empty(fab);
    printf("quick-look: ok\n");
    return 0;
}
