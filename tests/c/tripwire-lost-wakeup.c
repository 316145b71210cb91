/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tripwire-lost-wakeup: with spinning off every wait sleeps, so every exchange goes through the
 * arm / re-check / sleep / wake handshake; 100,000 ping-pongs between two processes must finish
 * (a lost wake-up hangs, and the watchdog fails the test).  Then the coalescing rule: a sleeping
 * receiver is woken once however many sends arrive before it runs, and a sender whose receiver
 * is not asleep makes no wake-up call at all.  Last, the event queue's FIFO doorbell: each arm
 * leaves it empty (a doorbell left readable would make every poll return at once), across more
 * rings than the pipe holds. */
#include "test.h"
#include "channel.h"

#include <poll.h>

static void pingpong(memlan_fabric_t *fab, int n)
{
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 4096};
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0) {
        memlan_channel_t *c = ch;
        uint32_t v;
        for (int i = 0; i < n; i++) {
            ASSERT_EQ(memlan_recv(c, &v, sizeof v, 0), 4);
            ASSERT_EQ(v, (uint32_t)i);
            v++;
            ASSERT_EQ(memlan_send(c, &v, sizeof v, 0), 4);
        }
        memlan_channel_close(c);
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    for (uint32_t i = 0; i < (uint32_t)n; i++) {
        uint32_t v = i;
        ASSERT_EQ(memlan_send(ch, &v, sizeof v, 0), 4);
        ASSERT_EQ(memlan_recv(ch, &v, sizeof v, 0), 4);
        ASSERT_EQ(v, i + 1);
    }
    /* Spinning off: the waits really slept. */
    ASSERT_GE(ch->sleeps, 1);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);
}

static void coalesce(memlan_fabric_t *fab)
{
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, NULL, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    /* No one asleep: sends make no wake-up call. */
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(memlan_send(a, "x", 1, 0), 1);
    ASSERT_EQ(a->wakeups, 0);
    char buf[256];
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 100);
    /* The receiver arms its tripwire as it would before sleeping; 1000 sends trip it once. */
    ml_store_relaxed(&b->rx.ctl->rx_wait, ML_WAIT_FUTEX);
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ(memlan_send(a, "y", 1, 0), 1);
    ASSERT_EQ(a->wakeups, 1);
    ASSERT_EQ(ml_load_relaxed(&b->rx.ctl->rx_wait), 0);
    memlan_channel_close(a);
    memlan_channel_close(b);
}

static bool bell_readable(memlan_evq_t *q)
{
    struct pollfd p = {.fd = memlan_evq_fd(q), .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

static void bell_drains(memlan_fabric_t *fab)
{
    memlan_channel_t *a, *b;
    memlan_evq_t *q;
    ASSERT_OK(memlan_channel_create(fab, NULL, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_OK(memlan_evq_create(fab, 0, &q));
    ASSERT_OK(memlan_evq_add(q, b, MEMLAN_EV_READ, b));
    struct memlan_event ev[4];
    char c;
    /* 70,000 one-byte rings: the pipe holds 65,536, so arms that did not drain would show. */
    for (int i = 0; i < 70000; i++) {
        ASSERT_EQ(memlan_evq_arm(q), 0);
        ASSERT_TRUE(!bell_readable(q));
        ASSERT_EQ(memlan_send(a, "z", 1, 0), 1);
        ASSERT_TRUE(bell_readable(q));
        ASSERT_EQ(memlan_evq_wait(q, ev, 4, 0), 1);
        ASSERT_TRUE(ev[0].udata == b);
        ASSERT_EQ(memlan_recv(b, &c, 1, MEMLAN_DONTWAIT), 1);
        ASSERT_EQ(memlan_recv(b, &c, 1, MEMLAN_DONTWAIT), -EAGAIN); /* re-arms the tripwire */
    }
    ASSERT_EQ(memlan_evq_arm(q), 0);
    ASSERT_TRUE(!bell_readable(q));
    memlan_evq_close(q);
    memlan_channel_close(a);
    memlan_channel_close(b);
}

int main(void)
{
    setenv("MEMLAN_SPIN_US", "0", 1);
    ml_test_watchdog(120);
    memlan_fabric_t *fab = ml_test_fabric();
    uint64_t t0 = ml_test_now_ns();
    pingpong(fab, 100000);
    coalesce(fab);
    bell_drains(fab);
    ml_test_fabric_empty(fab);
    printf("tripwire-lost-wakeup: ok (%.1f s)\n", (double)(ml_test_now_ns() - t0) / 1e9);
    return 0;
}
