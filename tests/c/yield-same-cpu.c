/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* yield-same-cpu: a channel's wait whose peer last waited on our cpu gives the cpu away with
 * sched_yield for the spin budget before it sleeps (design.md, "Spin budget").
 * 1. The policy: a yield budget only where the spin has none because the peer is on our cpu (or
 *    there is one cpu); none for a peer elsewhere, none with MEMLAN_SPIN_US fixed (0 or not),
 *    none once the preload's switch is off.
 * 2. A request-and-reply child on our cpu, 2,000 round trips of sequence-numbered 64 B messages:
 *    every reply right, and most waits of both sides end without a futex sleep (the peer ran
 *    when we yielded and answered before we slept).
 * 3. The same with yielding off (as in the preload): every wait sleeps, as before.
 */
#include "test.h"
#include "channel.h"
#include "sys/sys.h"

enum { N = 2000 };

/* The echo on our cpu; exits with its own sleeps, capped. */
static int echo(memlan_channel_t *ch)
{
    ASSERT_EQ(ml_test_pin(ml_test_cpu(0)), 0);
    uint8_t b[64];
    for (;;) {
        ssize_t r = memlan_recv(ch, b, sizeof b, 0);
        if (r == 0)
            break;
        if (r != 64 || memlan_send(ch, b, 64, 0) != 64)
            return 255;
    }
    uint64_t sl = ch->sleeps;
    memlan_channel_close(ch);
    return sl > 250 ? 250 : (int)sl;
}

/* N round trips with a child on our cpu: our sleeps; *child_sleeps the child's (capped). */
static uint64_t round_trips(memlan_fabric_t *fab, int *child_sleeps)
{
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG};
    memlan_channel_t *ch;
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0)
        _exit(echo(ch));
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    uint8_t b[64];
    uint64_t s0 = ch->sleeps;
    for (uint64_t i = 0; i < N; i++) {
        memset(b, (int)(i & 0xff), sizeof b);
        memcpy(b, &i, sizeof i);
        ASSERT_EQ(memlan_send(ch, b, sizeof b, 0), 64);
        uint8_t r[64];
        ASSERT_EQ(memlan_recv(ch, r, sizeof r, 0), 64);
        ASSERT_TRUE(memcmp(r, b, sizeof b) == 0);
    }
    uint64_t slept = ch->sleeps - s0;
    ASSERT_OK(memlan_shutdown(ch, MEMLAN_SHUT_WR));
    ASSERT_EQ(memlan_recv(ch, b, sizeof b, 0), 0);
    *child_sleeps = ml_test_wait_child(pid);
    memlan_channel_close(ch);
    return slept;
}

int main(void)
{
    ml_test_watchdog(60);
    unsetenv("MEMLAN_SPIN_US");
    ASSERT_EQ(ml_test_pin(ml_test_cpu(0)), 0);
    memlan_fabric_t *fab = ml_test_fabric();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    /* 1. */
    int me = __ml_getcpu();
    ASSERT_EQ(me, ml_test_cpu(0));
    uint32_t ours = (uint32_t)me + 1, elsewhere = (uint32_t)me + 2; /* the words: cpu + 1 */
    struct ml_spin sp = {0};
    ASSERT_EQ(__ml_spin_budget_ns(&sp, ours), 0);   /* the peer on our cpu: no spin... */
    ASSERT_NE(__ml_yield_budget_ns(&sp, ours), 0);  /* ...a yield instead */
    if (ncpu >= 2) {
        ASSERT_EQ(__ml_yield_budget_ns(&sp, elsewhere), 0); /* elsewhere: the spin's case */
        ASSERT_EQ(__ml_yield_budget_ns(&sp, 0), 0); /* not known: taken as elsewhere */
        ASSERT_NE(__ml_spin_budget_ns(&sp, elsewhere), 0);
    }
    __ml_spin_set_us(0);
    ASSERT_EQ(__ml_yield_budget_ns(&sp, ours), 0); /* MEMLAN_SPIN_US=0: neither */
    __ml_spin_set_us(20);
    ASSERT_EQ(__ml_yield_budget_ns(&sp, ours), 0); /* a fixed spin is the user's: it spins */
    __ml_spin_set_us(-1);

    /* 2. */
    int child;
    uint64_t slept = round_trips(fab, &child);
    printf("yield-same-cpu: yielding: %" PRIu64 " and %d sleeps in %d round trips\n", slept, child,
           N);
    ASSERT_LE(slept, N / 4);
    ASSERT_LE(child, 100);

    /* 3. */
    __ml_yield_off();
    ASSERT_EQ(__ml_yield_budget_ns(&sp, ours), 0);
    slept = round_trips(fab, &child);
    printf("yield-same-cpu: not yielding: %" PRIu64 " and %d sleeps\n", slept, child);
    ASSERT_GE(slept, N / 2);
    ASSERT_GE(child, 200); /* capped at 250 */

    ml_test_fabric_empty(fab);
    printf("yield-same-cpu: ok\n");
    return 0;
}
