/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-capacities: a peer's post reaches a queue of every size, including those whose summary
 * bitmap ends exactly at the end of the segment (65536 events: the size the socket layer uses;
 * a bounds check one word too strict once dropped every post to it, silently). */
#include "test.h"

int main(void)
{
    ml_test_watchdog(30);
    memlan_fabric_t *fab = ml_test_fabric();
    static const unsigned caps[] = {1, 64, 4096, 4160, 65536, 1u << 18, 1u << 20};
    for (unsigned k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        memlan_channel_t *a, *b;
        struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
        ASSERT_OK(memlan_channel_create(fab, &o, &a));
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        memlan_evq_t *q;
        ASSERT_OK(memlan_evq_create(fab, caps[k], &q));
        ASSERT_OK(memlan_evq_add(q, b, MEMLAN_EV_READ, b));
        struct memlan_event ev[4];
        ASSERT_EQ(memlan_evq_wait(q, ev, 4, 0), 0);
        char c;
        ASSERT_EQ(memlan_recv(b, &c, 1, MEMLAN_DONTWAIT), -EAGAIN); /* arms READ */
        ASSERT_EQ(memlan_send(a, "x", 1, 0), 1);                     /* posts through the peer path */
        uint64_t t0 = ml_test_now_ns();
        int n = memlan_evq_wait(q, ev, 4, 3000);
        if (n != 1)
            fprintf(stderr, "capacity %u: %d events after %llu ms\n", caps[k], n,
                    (unsigned long long)((ml_test_now_ns() - t0) / 1000000));
        ASSERT_EQ(n, 1);
        ASSERT_TRUE(ev[0].udata == b);
        ASSERT_TRUE(ev[0].events & MEMLAN_EV_READ);
        memlan_evq_close(q);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }
    ml_test_fabric_empty(fab);
    printf("evq-capacities: ok\n");
    return 0;
}
