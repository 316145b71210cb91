/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* sendv: memlan_sendv gathers its pieces into the ring as one buffer of their total length.
 * 1. A stream's small vector (three pieces, one of them empty) is one publication, and the
 *    reader gets the bytes in order (before, the preload sent each piece with its own
 *    memlan_send: a publication and a wake-up check each, and a reader could take the header
 *    without its payload: tests/preload/writevwhole.c).
 * 2. A vector longer than the ring, sent blocking to a reader in a child: every byte in order,
 *    published a chunk at a time (as many publications as one buffer of that length needs, not
 *    one per piece).
 * 3. Nonblocking into a nearly full ring: the count that fitted, and the rest follows in order.
 * 4. A message channel: one message of the pieces' total; too long: -EMSGSIZE.
 * 5. Bad vectors: -EINVAL, nothing sent.
 */
#include "test.h"
#include "channel.h"

#include <limits.h>
#include <sys/uio.h>

#define RING (64u * 1024u)

static uint8_t pat(uint64_t i) { return (uint8_t)(i * 13 + (i >> 8) + 1); }

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = RING};
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    static uint8_t src[4 * RING], in[4 * RING];
    for (uint64_t i = 0; i < sizeof src; i++)
        src[i] = pat(i);

    /* 1. */
    struct iovec v[3] = {{src, 16}, {src + 16, 0}, {src + 16, 48}};
    uint64_t ops = a->tx.ops;
    ASSERT_EQ(memlan_sendv(a, v, 3, 0), 64);
    ASSERT_EQ(a->tx.ops - ops, 1);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), 64);
    ASSERT_TRUE(memcmp(in, src, 64) == 0);

    /* 2. Pieces of 10,000 bytes, 4 rings' worth, blocking; the child reads and checks. */
    enum { PIECE = 10000 };
    int np = (int)(sizeof src / PIECE);
    struct iovec big[sizeof src / PIECE];
    for (int i = 0; i < np; i++)
        big[i] = (struct iovec){src + (size_t)i * PIECE, PIECE};
    size_t total = (size_t)np * PIECE;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        size_t got = 0;
        while (got < total) {
            ssize_t r = memlan_recv(b, in + got, total - got, 0);
            if (r <= 0)
                _exit(1);
            got += (size_t)r;
        }
        _exit(memcmp(in, src, total) == 0 ? 0 : 2);
    }
    ops = a->tx.ops;
    ASSERT_EQ(memlan_sendv(a, big, np, 0), (ssize_t)total);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    uint64_t pubs = a->tx.ops - ops, chunk = RING / 4;
    ASSERT_GE(pubs, (total + chunk - 1) / chunk);
    ASSERT_TRUE(pubs < (uint64_t)np); /* per piece would be np, or more */
    /* The child's reads moved the shared tail; ours is behind: use a fresh pair. */
    memlan_channel_close(b);
    memlan_channel_close(a);
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));

    /* 3. */
    ASSERT_EQ(memlan_send(a, src, RING - 100, 0), RING - 100);
    struct iovec w[3] = {{src + 1000, 60}, {src + 2000, 60}, {src + 3000, 60}};
    ASSERT_EQ(memlan_sendv(a, w, 3, MEMLAN_DONTWAIT), 100);
    ASSERT_EQ(memlan_sendv(a, w, 3, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(memlan_recv(b, in, RING - 100, 0), RING - 100);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, 0), 100);
    ASSERT_TRUE(memcmp(in, src + 1000, 60) == 0 && memcmp(in + 60, src + 2000, 40) == 0);
    struct iovec rest[2] = {{src + 2040, 20}, {src + 3000, 60}};
    ASSERT_EQ(memlan_sendv(a, rest, 2, MEMLAN_DONTWAIT), 80);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, 0), 80);
    ASSERT_TRUE(memcmp(in, src + 2040, 20) == 0 && memcmp(in + 20, src + 3000, 60) == 0);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 4. */
    struct memlan_channel_opts mo = {.kind = MEMLAN_MSG, .ring_size = RING};
    ASSERT_OK(memlan_channel_create(fab, &mo, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_EQ(memlan_sendv(a, v, 3, 0), 64);
    ASSERT_EQ(memlan_sendv(a, v, 0, 0), 0); /* an empty message */
    ASSERT_EQ(memlan_recv(b, in, sizeof in, 0), 64);
    ASSERT_TRUE(memcmp(in, src, 64) == 0);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), 0);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), -EAGAIN);
    size_t max = memlan_channel_max_msg(a);
    struct iovec over[2] = {{src, max}, {src, 1}};
    ASSERT_EQ(memlan_sendv(a, over, 2, 0), -EMSGSIZE);
    over[0].iov_len = max - 1;
    ASSERT_EQ(memlan_sendv(a, over, 2, 0), (ssize_t)max);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, 0), (ssize_t)max);
    ASSERT_TRUE(memcmp(in, src, max - 1) == 0 && in[max - 1] == src[0]);

    /* 5. */
    struct iovec huge[2] = {{src, SSIZE_MAX}, {src, 2}};
    struct iovec nul[1] = {{NULL, 1}};
    ASSERT_EQ(memlan_sendv(NULL, v, 3, 0), -EINVAL);
    ASSERT_EQ(memlan_sendv(a, v, -1, 0), -EINVAL);
    ASSERT_EQ(memlan_sendv(a, v, IOV_MAX + 1, 0), -EINVAL);
    ASSERT_EQ(memlan_sendv(a, NULL, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_sendv(a, nul, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_sendv(a, huge, 2, 0), -EINVAL);
    ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), -EAGAIN);
    memlan_channel_close(b);
    memlan_channel_close(a);
    ml_test_fabric_empty(fab);
    printf("sendv: ok\n");
    return 0;
}
