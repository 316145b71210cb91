/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* msg-misaligned: a message ring whose indices a peer left unaligned, and empty buffers.
 *
 * Record headers sit on 8-byte boundaries; an attacher takes its starting positions from the
 * shared head and tail, which the creator (or anyone who can write the file) chose.  A position
 * that is not a multiple of 8 must make the channel corrupt (-EPROTO), never a misaligned read or
 * write of a record header (UBSan reports those in the sanitizer build).  A published head that
 * is not aligned must likewise end as -EPROTO.  And a NULL buffer of length 0 is valid for send
 * and recv on both kinds of channel, without memcpy(NULL, ..., 0). */
#include "test.h"
#include "channel.h"

static struct ml_ring_ctl *ctl(memlan_channel_t *ch, int ring)
{
    return (struct ml_ring_ctl *)(ch->seg->base + (ring ? ML_CHAN_CTL1_OFF : ML_CHAN_CTL0_OFF));
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 4096};
    char buf[64] = "hello";

    /* 1. The attacher's receive position (ring 0's tail) and send position (ring 1's head) are
     * unaligned before it attaches. */
    for (uint64_t bad = 1; bad < 8; bad++) {
        memlan_channel_t *a, *b;
        ASSERT_OK(memlan_channel_create(fab, &o, &a));
        atomic_store(&ctl(a, 0)->tail, bad);
        atomic_store(&ctl(a, 0)->head, bad + 24);
        atomic_store(&ctl(a, 1)->head, bad);
        atomic_store(&ctl(a, 1)->tail, bad);
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EPROTO);
        const void *p;
        ASSERT_EQ(memlan_peek(b, &p, MEMLAN_DONTWAIT), -EPROTO);
        ASSERT_EQ(memlan_send(b, buf, 5, MEMLAN_DONTWAIT), -EPROTO);
        void *w;
        ASSERT_EQ(memlan_reserve(b, &w, 5, MEMLAN_DONTWAIT), -EPROTO);
        ASSERT_EQ(memlan_commit(b, 0), -EPROTO);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }

    /* 2. A head published unaligned after a real message: the reader takes the message and then
     * reports the garbage as -EPROTO. */
    {
        memlan_channel_t *a, *b;
        ASSERT_OK(memlan_channel_create(fab, &o, &a));
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        ASSERT_EQ(memlan_send(a, "abc", 3, 0), 3);
        atomic_store(&ctl(a, 0)->head, atomic_load(&ctl(a, 0)->head) + 3);
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), 3);
        ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EPROTO);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }

    /* 3. Empty buffers. */
    for (int kind = MEMLAN_STREAM; kind <= MEMLAN_MSG; kind++) {
        memlan_channel_t *a, *b;
        struct memlan_channel_opts ok = {.kind = kind, .ring_size = 4096};
        ASSERT_OK(memlan_channel_create(fab, &ok, &a));
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        ASSERT_EQ(memlan_send(a, NULL, 0, 0), 0);
        ASSERT_EQ(memlan_send(a, "xy", 2, 0), 2);
        ASSERT_EQ(memlan_recv(b, NULL, 0, MEMLAN_DONTWAIT), 0); /* the empty message, or nothing */
        if (kind == MEMLAN_MSG)
            ASSERT_EQ(memlan_recv(b, NULL, 0, MEMLAN_DONTWAIT), 0); /* "xy", truncated to 0 */
        else
            ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), 2);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }
    ml_test_fabric_empty(fab);
    printf("msg-misaligned: ok\n");
    return 0;
}
