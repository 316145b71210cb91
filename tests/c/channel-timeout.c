/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* channel-timeout: memlan_channel_set_timeout bounds the blocking calls as SO_RCVTIMEO and
 * SO_SNDTIMEO bound a socket's.  A recv or peek on a peer that sends nothing, and a send or
 * reserve into a ring the peer does not read, return -ETIMEDOUT after the bound (and not before
 * it), on stream and message channels; a stream's send returns what it moved first; data that
 * arrives within the bound is received; -1 lifts the bound; bad values are refused.  Before, a
 * native program had no way to bound a blocking call: a peer that went silent, or whose message
 * the chaos suite's vandal spoiled, held it for as long as the peer lived (issue 20). */
#include "test.h"

#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void one_kind(memlan_fabric_t *fab, int kind)
{
    struct memlan_channel_opts o = {.kind = kind, .ring_size = 4096};
    memlan_channel_t *c, *p;
    ASSERT_OK(memlan_channel_create(fab, &o, &c));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(c), &p));
    ASSERT_EQ(memlan_channel_set_timeout(c, 150, 120), 0);
    char buf[8192];

    /* nothing to read: recv and peek give up after the bound */
    double t0 = now_ms();
    ASSERT_EQ(memlan_recv(c, buf, sizeof buf, 0), -ETIMEDOUT);
    double took = now_ms() - t0;
    ASSERT_TRUE(took >= 149);
    const void *ptr;
    ASSERT_EQ(memlan_peek(c, &ptr, 0), -ETIMEDOUT);
    /* what comes is received as before */
    ASSERT_EQ(memlan_send(p, "abc", 3, 0), 3);
    ASSERT_EQ(memlan_recv(c, buf, sizeof buf, 0), 3);
    ASSERT_TRUE(memcmp(buf, "abc", 3) == 0);

    /* fill the ring the peer does not read: send and reserve give up after the bound */
    memset(buf, 'x', sizeof buf);
    size_t step = kind == MEMLAN_MSG ? 256 : sizeof buf;
    ssize_t n;
    int sends = 0;
    t0 = now_ms();
    while ((n = memlan_send(c, buf, step, 0)) > 0 && sends < 1000)
        sends++;
    took = now_ms() - t0;
    if (kind == MEMLAN_STREAM) {
        /* the first send moved what fitted, then waited out the bound */
        ASSERT_GE(sends, 1);
    }
    ASSERT_EQ(n, -ETIMEDOUT);
    ASSERT_TRUE(took >= 119);
    void *room;
    ASSERT_EQ(memlan_reserve(c, &room, kind == MEMLAN_MSG ? 256 : 1, 0), -ETIMEDOUT);

    /* -1 lifts the bound: with MEMLAN_DONTWAIT the answer is -EAGAIN, as always */
    ASSERT_EQ(memlan_channel_set_timeout(c, -1, -1), 0);
    ASSERT_EQ(memlan_send(c, buf, step, MEMLAN_DONTWAIT), -EAGAIN);
    /* the peer's side has no bound of its own: drain it with DONTWAIT */
    while (memlan_recv(p, buf, sizeof buf, MEMLAN_DONTWAIT) > 0)
        ;
    memlan_channel_close(c);
    ASSERT_EQ(memlan_recv(p, buf, sizeof buf, 0), 0);
    memlan_channel_close(p);
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_channel_t *c;
    ASSERT_OK(memlan_channel_create(fab, NULL, &c));
    ASSERT_EQ(memlan_channel_set_timeout(NULL, 1, 1), -EINVAL);
    ASSERT_EQ(memlan_channel_set_timeout(c, 0, -1), -EINVAL);
    ASSERT_EQ(memlan_channel_set_timeout(c, -1, 0), -EINVAL);
    ASSERT_EQ(memlan_channel_set_timeout(c, -2, -1), -EINVAL);
    memlan_channel_close(c);
    one_kind(fab, MEMLAN_STREAM);
    one_kind(fab, MEMLAN_MSG);
    ml_test_fabric_empty(fab);
    printf("channel-timeout: ok, stream and message channels\n");
    return 0;
}
