/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* recvmsgs: memlan_recv_msgs takes every message already in a message ring, up to n, in one call.
 * 1. Six messages there (lengths 0, 1, 7, 64, 200, 3000), batches of 4 then 4: 4 and 2, in
 *    order, each whole; the zero-length one counts (got 0); one shorter buffer truncates its
 *    message and the rest of it is dropped, as memlan_recv drops it.  Then -EAGAIN.
 * 2. The shared tail moves over exactly the records taken, and the sender sees the room.
 * 3. A corrupt record after two good ones: the two come back, the next call says -EPROTO.
 * 4. A child sends 20,000 messages (lengths 1-300, sequence-numbered) through a 16 KiB ring,
 *    blocking when it is full; batches of up to 64, blocking for the first: all in order, and
 *    at least one batch took more than one (the point of the call).
 * 5. End of stream: 0.  Bad calls: a stream channel, a NULL vector, n 0.
 */
#include "test.h"
#include "channel.h"

#include <sys/wait.h>

static uint8_t pat(uint64_t i, uint64_t j) { return (uint8_t)(i * 31 + j * 7 + 3); }

static void fill(uint8_t *b, size_t len, uint64_t i)
{
    for (size_t j = 0; j < len; j++)
        b[j] = pat(i, j);
}

static bool same(const uint8_t *b, size_t len, uint64_t i)
{
    for (size_t j = 0; j < len; j++)
        if (b[j] != pat(i, j))
            return false;
    return true;
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 64 * 1024};
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    static uint8_t src[4096], bufs[8][4096];
    struct memlan_msg v[8];
    for (int i = 0; i < 8; i++)
        v[i] = (struct memlan_msg){bufs[i], sizeof bufs[i], 12345};

    /* 1. */
    const size_t lens[6] = {0, 1, 7, 64, 200, 3000};
    for (int i = 0; i < 6; i++) {
        fill(src, lens[i], (uint64_t)i);
        ASSERT_EQ(memlan_send(a, src, lens[i], 0), (ssize_t)lens[i]);
    }
    uint64_t tail0 = ml_load_relaxed(&b->rx.ctl->tail);
    ASSERT_EQ(memlan_recv_msgs(b, v, 4, MEMLAN_DONTWAIT), 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(v[i].got, lens[i]);
        ASSERT_TRUE(same(bufs[i], lens[i], (uint64_t)i));
    }
    /* 2. Four records: 8-byte headers, payloads padded to 8. */
    uint64_t recs = 0;
    for (int i = 0; i < 4; i++)
        recs += 8 + ((lens[i] + 7) & ~(size_t)7);
    ASSERT_EQ(ml_load_relaxed(&b->rx.ctl->tail) - tail0, recs);
    ASSERT_EQ(b->rx.pos - tail0, recs);
    v[1].len = 100; /* 200 bytes into 100 */
    ASSERT_EQ(memlan_recv_msgs(b, v, 4, MEMLAN_DONTWAIT), 2);
    ASSERT_EQ(v[0].got, 200);
    ASSERT_TRUE(same(bufs[0], 200, 4));
    ASSERT_EQ(v[1].got, 100);
    ASSERT_TRUE(same(bufs[1], 100, 5));
    v[1].len = sizeof bufs[1];
    ASSERT_EQ(memlan_recv_msgs(b, v, 4, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(ml_load_relaxed(&b->rx.ctl->tail), b->rx.pos); /* all of it handed back */

    /* 3. Three messages; the third's header made to claim more than the ring. */
    for (int i = 0; i < 3; i++) {
        fill(src, 16, (uint64_t)i);
        ASSERT_EQ(memlan_send(a, src, 16, 0), 16);
    }
    uint64_t third = b->rx.pos + 2 * (8 + 16);
    uint32_t huge = 1u << 30;
    memcpy(ml_ring_at(&b->rx, third), &huge, sizeof huge);
    ASSERT_EQ(memlan_recv_msgs(b, v, 8, MEMLAN_DONTWAIT), 2);
    ASSERT_TRUE(same(bufs[0], 16, 0) && same(bufs[1], 16, 1));
    ASSERT_EQ(memlan_recv_msgs(b, v, 8, MEMLAN_DONTWAIT), -EPROTO);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 4. */
    o.ring_size = 16 * 1024;
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    enum { N = 20000 };
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        uint8_t m[300];
        for (uint64_t i = 0; i < N; i++) {
            size_t len = 1 + (size_t)(i * 37 % 300);
            fill(m, len, i);
            if (memlan_send(a, m, len, 0) != (ssize_t)len)
                _exit(1);
        }
        memlan_shutdown(a, MEMLAN_SHUT_WR);
        _exit(0);
    }
    static uint8_t many[64][300];
    struct memlan_msg w[64];
    uint64_t next = 0, batches = 0, most = 0;
    while (next < N) {
        for (int i = 0; i < 64; i++)
            w[i] = (struct memlan_msg){many[i], sizeof many[i], 0};
        int k = memlan_recv_msgs(b, w, 64, 0);
        ASSERT_GE(k, 1);
        for (int i = 0; i < k; i++, next++) {
            ASSERT_EQ(w[i].got, 1 + (size_t)(next * 37 % 300));
            ASSERT_TRUE(same(many[i], w[i].got, next));
        }
        batches++;
        if ((uint64_t)k > most)
            most = (uint64_t)k;
    }
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    ASSERT_GE(most, 2);
    ASSERT_TRUE(batches < N);

    /* 5. */
    ASSERT_EQ(memlan_recv_msgs(b, w, 64, 0), 0);
    ASSERT_EQ(memlan_recv_msgs(b, w, 0, 0), 0);
    ASSERT_EQ(memlan_recv_msgs(b, NULL, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_recv_msgs(NULL, w, 1, 0), -EINVAL);
    memlan_channel_close(b);
    memlan_channel_close(a);
    struct memlan_channel_opts so = {.kind = MEMLAN_STREAM};
    ASSERT_OK(memlan_channel_create(fab, &so, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_EQ(memlan_recv_msgs(b, w, 1, MEMLAN_DONTWAIT), -EINVAL);
    memlan_channel_close(b);
    memlan_channel_close(a);
    ml_test_fabric_empty(fab);
    printf("recvmsgs: %llu messages in %llu batches, the largest %llu: ok\n",
           (unsigned long long)N, (unsigned long long)batches, (unsigned long long)most);
    return 0;
}
