/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* ring-wraparound: streams and messages of every size cross the end of a small ring many times,
 * through copying send/recv and zero-copy reserve/commit and peek/release; bytes and boundaries
 * arrive exactly. */
#include "test.h"

/* The byte at stream offset o. */
#define BYTE_AT(o) ((uint8_t)(((o) * 2654435761u) >> 13))

static void stream_case(memlan_fabric_t *fab)
{
    memlan_channel_t *a, *b;
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_OK(memlan_channel_wait_peer(a, 0));
    uint64_t seed = 1;
    static uint8_t buf[8192], out[8192];
    uint64_t sent = 0, got = 0, total = 4u << 20;
    while (got < total) {
        /* Send a random amount, nonblocking, by copy or by reserve/commit. */
        if (sent < total) {
            size_t n = 1 + ml_test_rand(&seed) % 3000;
            if (n > total - sent)
                n = total - sent;
            for (size_t i = 0; i < n; i++)
                buf[i] = BYTE_AT(sent + i);
            ssize_t w;
            if (ml_test_rand(&seed) & 1) {
                w = memlan_send(a, buf, n, MEMLAN_DONTWAIT);
            } else {
                void *p;
                w = memlan_reserve(a, &p, 1, MEMLAN_DONTWAIT);
                if (w > 0) {
                    if ((size_t)w > n)
                        w = (ssize_t)n;
                    memcpy(p, buf, (size_t)w);
                    ASSERT_OK(memlan_commit(a, (size_t)w));
                }
            }
            if (w == -EAGAIN)
                w = 0;
            ASSERT_GE(w, 0);
            sent += (uint64_t)w;
        }
        /* Receive a random amount. */
        size_t m = 1 + ml_test_rand(&seed) % 5000;
        ssize_t r;
        if (ml_test_rand(&seed) & 1) {
            r = memlan_recv(b, out, m, MEMLAN_DONTWAIT);
            if (r == -EAGAIN)
                continue;
            ASSERT_GE(r, 1);
        } else {
            const void *p;
            r = memlan_peek(b, &p, MEMLAN_DONTWAIT);
            if (r == -EAGAIN)
                continue;
            ASSERT_GE(r, 1);
            ASSERT_LE(r, 4096);
            if ((size_t)r > m)
                r = (ssize_t)m;
            memcpy(out, p, (size_t)r);
            ASSERT_OK(memlan_release(b, (size_t)r));
        }
        for (ssize_t i = 0; i < r; i++)
            ASSERT_EQ(out[i], BYTE_AT(got + (uint64_t)i));
        got += (uint64_t)r;
    }
    ASSERT_EQ(sent, total);
    /* EOF after shutdown, once the data is read. */
    ASSERT_OK(memlan_send(a, "xyz", 3, 0));
    ASSERT_OK(memlan_shutdown(a, MEMLAN_SHUT_WR));
    ASSERT_EQ(memlan_send(a, "x", 1, 0), -EPIPE);
    ASSERT_EQ(memlan_recv(b, out, sizeof out, 0), 3);
    ASSERT_EQ(memlan_recv(b, out, sizeof out, 0), 0);
    ASSERT_EQ(memlan_recv(b, out, sizeof out, MEMLAN_DONTWAIT), 0);
    /* The other direction still works after a half-close. */
    ASSERT_EQ(memlan_send(b, "back", 4, 0), 4);
    ASSERT_EQ(memlan_recv(a, out, sizeof out, 0), 4);
    ASSERT_EQ(memcmp(out, "back", 4), 0);
    memlan_channel_close(b);
    ASSERT_EQ(memlan_send(a, "x", 1, 0), -EPIPE);
    memlan_channel_close(a);
}

static void msg_case(memlan_fabric_t *fab)
{
    memlan_channel_t *a, *b;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 4096};
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    size_t max = memlan_channel_max_msg(a);
    ASSERT_EQ(max, 4096 - 16); /* a record and the next header slot */
    static uint8_t buf[8192], out[8192];
    ASSERT_EQ(memlan_send(a, buf, max + 1, 0), -EMSGSIZE);
    /* Every size from 0 to max, interleaved with zero-copy, each checked whole. */
    uint64_t seed = 7;
    size_t next_rx = 0;
    for (size_t n = 0; n <= max; n++) {
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)(n + i);
        ssize_t w;
        for (;;) {
            if (n & 1) {
                w = memlan_send(a, buf, n, MEMLAN_DONTWAIT);
            } else {
                void *p;
                w = memlan_reserve(a, &p, n, MEMLAN_DONTWAIT);
                if (w >= 0) {
                    ASSERT_EQ(w, n);
                    memcpy(p, buf, n);
                    ASSERT_OK(memlan_commit(a, n));
                }
            }
            if (w != -EAGAIN)
                break;
            /* Full: drain one message. */
            ssize_t r;
            if (ml_test_rand(&seed) & 1) {
                r = memlan_recv(b, out, sizeof out, 0);
            } else {
                const void *p;
                r = memlan_peek(b, &p, 0);
                ASSERT_GE(r, 0);
                memcpy(out, p, (size_t)r);
                ASSERT_OK(memlan_release(b, 0));
            }
            ASSERT_EQ(r, next_rx);
            for (size_t i = 0; i < next_rx; i++)
                ASSERT_EQ(out[i], (uint8_t)(next_rx + i));
            next_rx++;
        }
        ASSERT_EQ(w, n);
    }
    while (next_rx <= max) {
        ssize_t r = memlan_recv(b, out, sizeof out, MEMLAN_DONTWAIT);
        ASSERT_EQ(r, next_rx);
        next_rx++;
    }
    ASSERT_EQ(memlan_recv(b, out, sizeof out, MEMLAN_DONTWAIT), -EAGAIN);
    /* A message longer than the buffer is truncated, the rest dropped. */
    ASSERT_EQ(memlan_send(a, "hello world", 11, 0), 11);
    ASSERT_EQ(memlan_send(a, "next", 4, 0), 4);
    ASSERT_EQ(memlan_recv(b, out, 5, 0), 5);
    ASSERT_EQ(memcmp(out, "hello", 5), 0);
    ASSERT_EQ(memlan_recv(b, out, sizeof out, 0), 4);
    ASSERT_EQ(memcmp(out, "next", 4), 0);
    memlan_channel_close(a);
    /* After the peer closed: EOF, and sends fail. */
    ASSERT_EQ(memlan_recv(b, out, sizeof out, 0), 0);
    ASSERT_EQ(memlan_send(b, "x", 1, 0), -EPIPE);
    memlan_channel_close(b);
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    stream_case(fab);
    msg_case(fab);
    ml_test_fabric_empty(fab);
    printf("ring-wraparound: ok\n");
    return 0;
}
