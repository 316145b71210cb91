/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* ring-stress-multiproc: two processes, both directions at once, random sizes, a checksum per
 * message and a running sequence number, random pauses on both sides (so that both tripwires are
 * armed and tripped many times): no loss, no duplication, no reordering, no hang.
 * Usage: ring-stress-multiproc [messages per direction] (default 1,000,000; MEMLAN_STRESS_N). */
#include "test.h"

#include <pthread.h>

struct rec {
    uint64_t seq;
    uint32_t len;
    uint32_t sum;
};

static uint32_t checksum(const uint8_t *p, size_t n, uint64_t seq)
{
    uint32_t h = 2166136261u ^ (uint32_t)seq;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static uint64_t N;

static void pause_sometimes(uint64_t *seed)
{
    uint64_t r = ml_test_rand(seed);
    if ((r & 0xffff) == 0)
        usleep((useconds_t)(r >> 40) % 2000);       /* long enough for the peer to sleep */
    else if ((r & 0xfff) == 1)
        sched_yield();
}

/* Message channel: each message carries its own header. */
static void *msg_sender(void *arg)
{
    memlan_channel_t *ch = arg;
    uint64_t seed = (uint64_t)getpid() * 31 + 1;
    uint8_t buf[2048];
    for (uint64_t i = 0; i < N; i++) {
        struct rec h = {.seq = i, .len = (uint32_t)(ml_test_rand(&seed) % (sizeof buf - sizeof h))};
        for (uint32_t k = 0; k < h.len; k++)
            buf[sizeof h + k] = (uint8_t)(i + k * 7);
        h.sum = checksum(buf + sizeof h, h.len, i);
        memcpy(buf, &h, sizeof h);
        ssize_t r = memlan_send(ch, buf, sizeof h + h.len, 0);
        if (r != (ssize_t)(sizeof h + h.len)) {
            fprintf(stderr, "send %" PRIu64 ": %zd\n", i, r);
            exit(1);
        }
        pause_sometimes(&seed);
    }
    return NULL;
}

static void msg_receiver(memlan_channel_t *ch)
{
    uint64_t seed = (uint64_t)getpid() * 17 + 3;
    uint8_t buf[2048];
    for (uint64_t i = 0; i < N; i++) {
        ssize_t r;
        if (i & 1) {
            r = memlan_recv(ch, buf, sizeof buf, 0);
        } else {
            const void *p;
            r = memlan_peek(ch, &p, 0);
            if (r > 0)
                memcpy(buf, p, (size_t)r);
            if (r >= 0)
                ASSERT_OK(memlan_release(ch, 0));
        }
        struct rec h;
        ASSERT_GE(r, (ssize_t)sizeof h);
        memcpy(&h, buf, sizeof h);
        ASSERT_EQ(h.seq, i);
        ASSERT_EQ(r, (ssize_t)(sizeof h + h.len));
        ASSERT_EQ(h.sum, checksum(buf + sizeof h, h.len, i));
        pause_sometimes(&seed);
    }
}

/* Stream channel: records split arbitrarily by the stream; the receiver reassembles. */
static void *stream_sender(void *arg)
{
    memlan_channel_t *ch = arg;
    uint64_t seed = (uint64_t)getpid() * 13 + 5;
    uint8_t buf[4096];
    for (uint64_t i = 0; i < N; i++) {
        struct rec h = {.seq = i, .len = (uint32_t)(ml_test_rand(&seed) % 1500)};
        for (uint32_t k = 0; k < h.len; k++)
            buf[sizeof h + k] = (uint8_t)(i * 3 + k);
        h.sum = checksum(buf + sizeof h, h.len, i);
        memcpy(buf, &h, sizeof h);
        ASSERT_EQ(memlan_send(ch, buf, sizeof h + h.len, 0), (ssize_t)(sizeof h + h.len));
        pause_sometimes(&seed);
    }
    return NULL;
}

static void stream_receiver(memlan_channel_t *ch)
{
    uint64_t seed = (uint64_t)getpid() * 11 + 9;
    uint8_t buf[4096];
    for (uint64_t i = 0; i < N; i++) {
        struct rec h;
        ASSERT_EQ(memlan_recv(ch, &h, sizeof h, MEMLAN_WAITALL), (ssize_t)sizeof h);
        ASSERT_EQ(h.seq, i);
        ASSERT_LE(h.len, 1500);
        ASSERT_EQ(memlan_recv(ch, buf, h.len, MEMLAN_WAITALL), (ssize_t)h.len);
        ASSERT_EQ(h.sum, checksum(buf, h.len, i));
        pause_sometimes(&seed);
    }
}

static void run(memlan_fabric_t *fab, int kind)
{
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = kind, .ring_size = 16384};
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0) {
        memlan_channel_t *c = ch;
        pthread_t t;
        pthread_create(&t, NULL, kind == MEMLAN_MSG ? msg_sender : stream_sender, c);
        if (kind == MEMLAN_MSG)
            msg_receiver(c);
        else
            stream_receiver(c);
        pthread_join(t, NULL);
        memlan_channel_close(c);
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    pthread_t t;
    pthread_create(&t, NULL, kind == MEMLAN_MSG ? msg_sender : stream_sender, ch);
    if (kind == MEMLAN_MSG)
        msg_receiver(ch);
    else
        stream_receiver(ch);
    pthread_join(t, NULL);
    /* Nothing extra arrives: the peer closes, we see EOF exactly. */
    uint8_t x;
    ASSERT_EQ(memlan_recv(ch, &x, 1, 0), 0);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    memlan_channel_close(ch);
}

int main(int argc, char **argv)
{
    const char *e = getenv("MEMLAN_STRESS_N");
    N = argc > 1 ? strtoull(argv[1], NULL, 0) : e ? strtoull(e, NULL, 0) : 1000000;
    ml_test_watchdog(600);
    memlan_fabric_t *fab = ml_test_fabric();
    uint64_t t0 = ml_test_now_ns();
    run(fab, MEMLAN_MSG);
    run(fab, MEMLAN_STREAM);
    ml_test_fabric_empty(fab);
    printf("ring-stress-multiproc: ok, %" PRIu64 " messages each way per mode, %.1f s\n", N,
           (double)(ml_test_now_ns() - t0) / 1e9);
    return 0;
}
