/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-write-only: a channel registered for MEMLAN_EV_WRITE alone, not writable, while its peer
 * sends it data.  The data is not an event it asked for: evq_wait must time out (not spin on a
 * bit it keeps re-posting, not report READ), and must report WRITE once the peer drains. */
#include "test.h"

int main(void)
{
    ml_test_watchdog(20);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_channel_t *a, *b;
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    static char buf[8192];
    /* b's sending ring full: b is not writable. */
    ASSERT_EQ(memlan_send(b, buf, sizeof buf, MEMLAN_DONTWAIT), 4096);
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, 64, &q));
    ASSERT_OK(memlan_evq_add(q, b, MEMLAN_EV_WRITE, b));
    struct memlan_event ev[4];
    ASSERT_EQ(memlan_evq_wait(q, ev, 4, 0), 0);
    ASSERT_EQ(memlan_send(b, buf, 1, MEMLAN_DONTWAIT), -EAGAIN); /* arms WRITE */
    /* Data for b: readable, but b did not ask for READ. */
    ASSERT_EQ(memlan_send(a, "data", 4, 0), 4);
    uint64_t t0 = ml_test_now_ns();
    ASSERT_EQ(memlan_evq_wait(q, ev, 4, 200), 0);
    ASSERT_GE((ml_test_now_ns() - t0) / 1000000, 150); /* it slept: a timeout, not a spin */
    /* a drains b's ring: now b is writable, and that is reported. */
    ASSERT_EQ(memlan_recv(a, buf, sizeof buf, 0), 4096);
    int n = memlan_evq_wait(q, ev, 4, 5000);
    ASSERT_EQ(n, 1);
    ASSERT_TRUE(ev[0].udata == b);
    ASSERT_TRUE(ev[0].events & MEMLAN_EV_WRITE);
    memlan_evq_close(q);
    memlan_channel_close(b);
    memlan_channel_close(a);
    ml_test_fabric_empty(fab);
    printf("evq-write-only: ok\n");
    return 0;
}
