/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* msg-publication: a message ring's records are published by a word in their own header
 * (issue 21; src/ring.h, docs/design.md "Message records").
 *
 * 1. A record whose header carries the word for its position is received before the head that
 *    covers it is published, and the head that then lags behind the reader is not taken for
 *    corruption.
 * 2. Stale bytes at the reader's position, even a header with a plausible length, are not a
 *    record unless their word matches the position.
 * 3. The producer zeroes the header slot after each record it publishes, over whatever was
 *    there, so stale bytes can never sit where the next word is looked for.
 * 4. A header with a matching word and a length larger than the ring is corruption (-EPROTO),
 *    never a read past the ring.
 * 5. The largest message leaves room for that slot: ring - 16 bytes, and it goes through.
 */
#include "test.h"
#include "channel.h"

static struct ml_ring_ctl *ctl(memlan_channel_t *ch, int ring)
{
    return (struct ml_ring_ctl *)(ch->seg->base + (ring ? ML_CHAN_CTL1_OFF : ML_CHAN_CTL0_OFF));
}

/* Ring 0's data (side 0 -> side 1) as side 0 maps it. */
static uint8_t *data0(memlan_channel_t *a) { return a->seg->base + ML_PAGE; }

static void put_hdr(uint8_t *at, uint32_t len, uint32_t flags)
{
    struct ml_msg_hdr h = {.len = len, .flags = flags};
    memcpy(at, &h, sizeof h);
}

static uint32_t tag(uint64_t pos) { return (uint32_t)(pos >> 2) | 1u; }

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 4096};
    char buf[4096];
    memlan_channel_t *a, *b;

    /* 1. Published by its word alone: head stays 0. */
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    memcpy(data0(a) + 8, "hello", 5);
    put_hdr(data0(a), 5, tag(0));
    ASSERT_EQ(atomic_load(&ctl(a, 0)->head), 0);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), 5);
    ASSERT_EQ(memcmp(buf, "hello", 5), 0);
    /* The reader is now at 16 and head still says 0: nothing more, and no corruption. */
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    /* The head that covers it arrives late; then a real send goes through as usual. */
    atomic_store(&ctl(a, 0)->head, 16);
    a->tx.pos = 16;
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(memlan_send(a, "world", 5, 0), 5);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), 5);
    ASSERT_EQ(memcmp(buf, "world", 5), 0);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 2. Stale headers: a word for another position, or none, is no record. */
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    put_hdr(data0(a), 5, tag(4096)); /* the same slot a lap later */
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    put_hdr(data0(a), 5, 0);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    put_hdr(data0(a), 5, tag(0) + 2);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 3. The slot after each record is zeroed over garbage before the record is published. */
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    memset(data0(a), 0xa5, 4096);
    uint64_t pos = 0;
    for (int i = 0; i < 600; i++) { /* several laps of the 4 KiB ring, sizes 0..23 */
        size_t n = (size_t)(i % 24);
        memset(buf, i, n);
        ASSERT_EQ(memlan_send(a, buf, n, 0), (ssize_t)n);
        uint64_t rec = 8 + ((n + 7) & ~(size_t)7);
        uint64_t next;
        memcpy(&next, data0(a) + ((pos + rec) & 4095), 8);
        ASSERT_EQ(next, 0);
        struct ml_msg_hdr h;
        memcpy(&h, data0(a) + (pos & 4095), 8);
        ASSERT_EQ(h.len, n);
        ASSERT_EQ(h.flags, tag(pos));
        char in[32];
        ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), (ssize_t)n);
        for (size_t k = 0; k < n; k++)
            ASSERT_EQ((uint8_t)in[k], (uint8_t)i);
        pos += rec;
    }
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 4. A matching word with a length past the ring: -EPROTO, for recv and for peek. */
    for (int peek = 0; peek < 2; peek++) {
        ASSERT_OK(memlan_channel_create(fab, &o, &a));
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        put_hdr(data0(a), 0xfffffff0u, tag(0));
        const void *p;
        if (peek)
            ASSERT_EQ(memlan_peek(b, &p, MEMLAN_DONTWAIT), -EPROTO);
        else
            ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EPROTO);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }

    /* 5. The largest message, twice (the second starts mid-ring), and one byte more refused. */
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    size_t max = memlan_channel_max_msg(a);
    ASSERT_EQ(max, 4096 - 16);
    ASSERT_EQ(memlan_send(a, buf, max + 1, MEMLAN_DONTWAIT), -EMSGSIZE);
    ASSERT_EQ(memlan_send(a, "x", 1, 0), 1);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 1);
    for (int i = 0; i < 2; i++) {
        memset(buf, 'a' + i, max);
        ASSERT_EQ(memlan_send(a, buf, max, MEMLAN_DONTWAIT), (ssize_t)max);
        ASSERT_EQ(memlan_send(a, "y", 1, MEMLAN_DONTWAIT), -EAGAIN);
        char in[4096];
        ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), (ssize_t)max);
        ASSERT_EQ(in[0], 'a' + i);
        ASSERT_EQ(in[max - 1], 'a' + i);
    }
    memlan_channel_close(b);
    memlan_channel_close(a);

    ml_test_fabric_empty(fab);
    printf("msg-publication: ok\n");
    return 0;
}
