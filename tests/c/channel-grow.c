/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* channel-grow: a stream ring that its producer finds full goes on in its region (ring.h,
 * "Growth"; design.md, "Rings grow").  A sender whose reader does not read gets the ring's and
 * the region's bytes accepted, no more; the reader gets every byte in order across each switch
 * (into the region and back to the ring once everything was read), through recv, peek and the
 * runs' peek (the region, mapped once, cut at its end); readiness says "writable" at a full ring
 * that may still grow and not at a full region; a channel made without a region never grows, and
 * one whose peer has not attached does, up to its offer's limit, its bytes read back whole if it
 * is withdrawn, and its region's pages given back then; a send across a region's end is one
 * publication; and a peer that writes garbage into the switch word gets a corrupt ring (EPROTO) or
 * bytes, never a crash or a read outside the rings; a sender's close leaves its unread region to
 * its reader, and a pooled file's reuse starts with empty regions. */
#include "test.h"
#include "channel.h"

#include <fcntl.h>
#include <sys/mman.h>

#define RING 4096u
#define REGION 65536u

static uint8_t pat(uint64_t i) { return (uint8_t)(i * 131u + (i >> 9) * 7u + 1u); }

/* Send n bytes of the pattern from *at without waiting; the bytes the channel took. */
static size_t send_some(memlan_channel_t *a, uint64_t *at, size_t n)
{
    static uint8_t buf[1 << 17];
    ASSERT_LE(n, sizeof buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = pat(*at + i);
    ssize_t r = memlan_send(a, buf, n, MEMLAN_DONTWAIT);
    if (r == -EAGAIN)
        return 0;
    ASSERT_TRUE(r > 0);
    *at += (uint64_t)r;
    return (size_t)r;
}

/* Receive everything readable, checking the pattern from *at; the bytes read. */
static size_t recv_all(memlan_channel_t *b, uint64_t *at, size_t chunk)
{
    static uint8_t buf[1 << 17];
    size_t got = 0;
    for (;;) {
        ssize_t r = memlan_recv(b, buf, chunk, MEMLAN_DONTWAIT);
        if (r == -EAGAIN || r == 0) /* nothing yet, or the end */
            return got;
        ASSERT_TRUE(r > 0);
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != pat(*at + (uint64_t)i)) {
                fprintf(stderr, "byte %llu: %u, not %u\n", (unsigned long long)(*at + (uint64_t)i),
                        buf[i], pat(*at + (uint64_t)i));
                ASSERT_TRUE(0);
            }
        *at += (uint64_t)r;
        got += (size_t)r;
    }
}

/* Region pages present in memory (mincore). */
static size_t resident(const void *p, size_t len)
{
    static unsigned char v[REGION / 4096];
    ASSERT_OK(mincore((void *)p, len, v));
    size_t n = 0;
    for (size_t i = 0; i < len / 4096; i++)
        n += v[i] & 1;
    return n;
}

/* Another holder of side 0's socket that shares no lock page with the first (an exec'd image,
 * a receiver over SCM_RIGHTS): the channel adopted from its file. */
static memlan_channel_t *other_holder(memlan_fabric_t *fab, memlan_channel_t *a)
{
    long fd = __ml_seg_reopen(a->seg, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    memlan_channel_t *e;
    ASSERT_OK(__ml_chan_adopt(fab, memlan_channel_token(a), (int)fd, 0, &e));
    return e;
}

static void let_go(memlan_channel_t *e) /* that holder's copy goes; the side stays open */
{
    e->seg->owner = false;
    __ml_seg_destroy(e->seg);
    free(e);
}

static void pair(memlan_fabric_t *fab, memlan_channel_t **a, memlan_channel_t **b)
{
    char tok[MEMLAN_TOKEN_LEN + 1];
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, a));
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(*a));
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(*a), b));
}

static size_t fill(memlan_channel_t *a, uint64_t *at)
{
    size_t total = 0, k;
    while ((k = send_some(a, at, 1000)) > 0)
        total += k;
    return total;
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_channel_t *a, *b;
    char tok[MEMLAN_TOKEN_LEN + 1];

    /* 1. Unattached: an offer's ring grows as an accepted one's, as the kernel's buffers take
     * bytes before an accept (it did not: a blocking send of 1 MiB waited for the server); a
     * withdrawn offer's bytes come back whole and in order from both areas, the ring's run, the
     * region's to its end and from its start, for the caller to send over TCP. */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    uint64_t sent = 0, read = 0;
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION));
    ASSERT_EQ(a->grows, 1u);
    ASSERT_OK(__ml_chan_withdraw(a));
    size_t runs[8], nruns = 0, n0;
    for (;;) {
        const void *u;
        size_t n = __ml_chan_unsent(a, &u);
        if (n == 0)
            break;
        ASSERT_TRUE(nruns < 8);
        runs[nruns++] = n;
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(((const uint8_t *)u)[i], pat(read + i));
        read += n;
        __ml_chan_unsent_done(a, n);
    }
    ASSERT_EQ(read, sent);
    ASSERT_EQ(nruns, 3u);
    ASSERT_EQ(runs[0], (size_t)RING);
    ASSERT_EQ(runs[1] + runs[2], (size_t)REGION);
    ASSERT_EQ(resident(a->tx.gdata, REGION), 0u); /* all out: the region's pages went back */
    memlan_channel_close(a);

    /* An offer's limit (__ml_chan_offer_limit: what the kernel's buffers take at a withdrawal):
     * the ring and 8 KiB of the region, no more, until the server attaches; then the rest of
     * the region.  A limit within the ring: no growth at all. */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    __ml_chan_offer_limit(a, RING + 8192);
    sent = read = 0;
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + 8192));
    ASSERT_TRUE(!(memlan_channel_poll(a) & MEMLAN_EV_WRITE));
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(a), &b));
    ASSERT_TRUE(memlan_channel_poll(a) & MEMLAN_EV_WRITE);
    ASSERT_EQ(fill(a, &sent), (size_t)(REGION - 8192));
    ASSERT_EQ(recv_all(b, &read, 3000), (size_t)(RING + REGION));
    memlan_channel_close(b);
    memlan_channel_close(a);
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    __ml_chan_offer_limit(a, RING);
    sent = 0;
    ASSERT_EQ(fill(a, &sent), (size_t)RING);
    ASSERT_EQ(a->grows, 0u);
    ASSERT_TRUE(!(memlan_channel_poll(a) & MEMLAN_EV_WRITE));
    memlan_channel_close(a);
    /* Within the ring (SO_SNDBUF made small after connect), and lowered only: 1000 bytes of
     * the ring, then the whole ring and region once the server attached. */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    __ml_chan_offer_limit(a, 1000);
    __ml_chan_offer_limit(a, RING + 8192);
    sent = read = 0;
    ASSERT_EQ(fill(a, &sent), 1000u);
    ASSERT_TRUE(!(memlan_channel_poll(a) & MEMLAN_EV_WRITE));
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(a), &b));
    ASSERT_TRUE(memlan_channel_poll(a) & MEMLAN_EV_WRITE);
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION - 1000));
    ASSERT_EQ(recv_all(b, &read, 3000), (size_t)(RING + REGION));
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* A growth that nothing followed (a reservation at a full ring, committed empty: a sendfile
     * at its file's end), then a withdrawal: the region's pages go back once all is out (they
     * stayed until the close: a review). */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    sent = 0;
    while (sent < RING)
        ASSERT_TRUE(send_some(a, &sent, RING - sent < 1000 ? RING - sent : 1000) > 0);
    void *rp;
    ASSERT_TRUE(memlan_reserve(a, &rp, 1, MEMLAN_DONTWAIT) > 0);
    ASSERT_EQ(a->grows, 1u);
    ASSERT_OK(memlan_commit(a, 0));
    ASSERT_TRUE(resident(a->tx.gdata, REGION) > 0);
    ASSERT_OK(__ml_chan_withdraw(a));
    for (const void *u; (n0 = __ml_chan_unsent(a, &u)) > 0;)
        __ml_chan_unsent_done(a, n0);
    ASSERT_EQ(resident(a->tx.gdata, REGION), 0u);
    memlan_channel_close(a);

    /* The same with the ring's bytes only: they stay in the ring, unattached. */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    sent = read = 0;
    while (sent < RING)
        ASSERT_TRUE(send_some(a, &sent, RING - sent < 1000 ? RING - sent : 1000) > 0);
    ASSERT_EQ(a->grows, 0u);
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(a), &b));

    /* 2. Attached, the reader away: the full ring is writable (it may grow), the send grows it,
     * and the ring's and the region's bytes are taken, no more. */
    ASSERT_TRUE(memlan_channel_poll(a) & MEMLAN_EV_WRITE);
    ASSERT_EQ(fill(a, &sent), (size_t)REGION);
    ASSERT_EQ(a->grows, 1u);
    ASSERT_EQ(sent, (uint64_t)(RING + REGION));
    ASSERT_TRUE(!(memlan_channel_poll(a) & MEMLAN_EV_WRITE));
    ASSERT_EQ(__ml_chan_tx_queued(a), (uint64_t)(RING + REGION));
    ASSERT_TRUE(memlan_channel_poll(b) & MEMLAN_EV_READ);

    /* 3. A peek sees the ring's run; the runs' peek sees all three (the ring's, the region's
     * from the switch at RING to its end, and from its start), as they were sent. */
    const void *p;
    struct iovec run[3];
    int nrun;
    ssize_t r = memlan_peek(b, &p, MEMLAN_DONTWAIT);
    ASSERT_EQ(r, (ssize_t)RING);
    ASSERT_OK(memlan_release(b, 0));
    r = __ml_chan_peek_runs(b, run, 3, &nrun, MEMLAN_DONTWAIT);
    ASSERT_EQ(r, (ssize_t)(RING + REGION));
    ASSERT_EQ(nrun, 3);
    ASSERT_EQ(run[0].iov_len, (size_t)RING);
    ASSERT_EQ(run[1].iov_len, (size_t)(REGION - RING));
    ASSERT_EQ(run[2].iov_len, (size_t)RING);
    ASSERT_TRUE(run[2].iov_base == b->rx.gdata);
    for (uint64_t i = 0, k = 0, off = 0; i < RING + REGION; i++, off++) {
        if (off == run[k].iov_len) {
            k++;
            off = 0;
        }
        ASSERT_EQ(((const uint8_t *)run[k].iov_base)[off], pat(i));
    }
    ASSERT_OK(memlan_release(b, 0));
    r = __ml_chan_peek_runs(b, run, 2, &nrun, MEMLAN_DONTWAIT); /* fewer runs asked: fewer */
    ASSERT_EQ(r, (ssize_t)REGION);
    ASSERT_EQ(nrun, 2);
    ASSERT_OK(memlan_release(b, 0));

    /* 4. Read in odd pieces: every byte in order across the switch. */
    ASSERT_EQ(recv_all(b, &read, 777), (size_t)(RING + REGION));
    ASSERT_EQ(read, sent);

    /* 5. Everything read: the next send goes back to the ring, and a full ring grows again. */
    ASSERT_EQ(send_some(a, &sent, 100), 100u);
    ASSERT_TRUE(!a->tx.swg);
    ASSERT_EQ(recv_all(b, &read, 4096), 100u);
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION));
    ASSERT_EQ(a->grows, 2u);

    /* 6. Reads and writes interleaved at random, the reader sometimes behind by more than the
     * ring: the stream as sent, whatever the switches. */
    uint64_t seed = 12345;
    for (int round = 0; round < 20000; round++) {
        uint64_t x = ml_test_rand(&seed);
        if (x & 1)
            (void)send_some(a, &sent, 1 + (size_t)((x >> 8) % 9000));
        if ((x & 6) == 0)
            (void)recv_all(b, &read, 1 + (size_t)((x >> 24) % 20000));
        ASSERT_LE(sent - read, (uint64_t)(RING + REGION));
    }
    (void)recv_all(b, &read, 65536);
    ASSERT_EQ(read, sent);
    ASSERT_TRUE(a->grows > 2u);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 7. Without a region: the ring's bytes only. */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, 0, &a));
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(a), &b));
    sent = read = 0;
    ASSERT_EQ(fill(a, &sent), (size_t)RING);
    ASSERT_TRUE(!(memlan_channel_poll(a) & MEMLAN_EV_WRITE));
    ASSERT_EQ(recv_all(b, &read, 4096), (size_t)RING);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 8. A hostile producer's switch word: garbage while bytes are readable gives EPROTO or
     * bytes of the rings, never a crash. */
    for (int round = 0; round < 200; round++) {
        ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
        snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
        ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(a), &b));
        sent = 0;
        (void)fill(a, &sent);
        uint64_t w = ml_test_rand(&seed);
        if (round % 4 == 0)
            w = (w & 0xffff) << 1; /* a switch near the stream's start */
        atomic_store(&b->rx.ctl->grow, w);
        static uint8_t buf[1 << 17];
        for (int k = 0; k < 64; k++) {
            r = memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT);
            if (r <= 0)
                break;
        }
        ASSERT_TRUE(r == -EPROTO || r == -EAGAIN || r > 0);
        r = __ml_chan_peek_runs(b, run, 3, &nrun, MEMLAN_DONTWAIT);
        ASSERT_TRUE(r == -EPROTO || r == -EAGAIN || r > 0);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }
    /* 9. A sender that closes with its region unread: the reader still gets every byte (its
     * close parks the file in the pool; the park gave the unread region's pages back, and the
     * bytes were lost).  Then the file's reuse starts with both regions empty. */
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, __ml_chan_generation(a), &b));
    sent = read = 0;
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION));
    uint8_t *region0 = a->tx.gdata;
    memlan_channel_close(a);
    ASSERT_EQ(recv_all(b, &read, 3000), (size_t)(RING + REGION));
    static uint8_t buf[16];
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), 0); /* the end */
    memlan_channel_close(b);
    ASSERT_OK(__ml_chan_create_pooled(fab, RING, REGION, &a));
    ASSERT_TRUE(a->tx.gdata == region0); /* the same file, from the pool */
    for (uint64_t i = 0; i < 2 * (uint64_t)REGION; i++)
        ASSERT_EQ(a->tx.gdata[i], 0); /* region 0, then region 1 */
    memlan_channel_close(a);

    /* 10. Another holder switches at a full ring and writes nothing after (a sendfile at the
     * end of its file: reserve, commit 0); the first holder's next send (its lock's resync)
     * goes where the reader looks.  It took its own stale copy of the switch: every byte
     * after it wrong.  */
    pair(fab, &a, &b);
    sent = read = 0;
    ASSERT_EQ(send_some(a, &sent, RING), (size_t)RING);
    memlan_channel_t *e = other_holder(fab, a);
    void *w;
    ASSERT_TRUE(memlan_reserve(e, &w, 1, MEMLAN_DONTWAIT) > 0);
    ASSERT_TRUE(e->tx.swg);
    ASSERT_OK(memlan_commit(e, 0));
    let_go(e);
    ASSERT_EQ(recv_all(b, &read, 4096), (size_t)RING);
    __ml_chan_resync_tx(a);
    ASSERT_EQ(send_some(a, &sent, 100), 100u);
    ASSERT_EQ(recv_all(b, &read, 4096), 100u);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 11. The two copies of the switch apart, our own saying "region" and the channel's still
     * "ring" (what a holder stopped between the two stores left when it stored its own first;
     * it now stores the channel's first): the next holder goes by the channel's, as the reader
     * does. */
    pair(fab, &a, &b);
    sent = read = 0;
    ASSERT_EQ(send_some(a, &sent, RING), (size_t)RING);
    ASSERT_EQ(recv_all(b, &read, 4096), (size_t)RING);
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION));
    ASSERT_EQ(recv_all(b, &read, 65536), (size_t)(RING + REGION));
    ASSERT_EQ(send_some(a, &sent, 10), 10u); /* back in the ring */
    ASSERT_EQ(recv_all(b, &read, 4096), 10u);
    ASSERT_EQ(send_some(a, &sent, RING), (size_t)RING);
    atomic_store(&a->tx.own_gpub, ml_grow_word(a->tx.pos, true)); /* the first store only */
    ASSERT_EQ(recv_all(b, &read, 4096), (size_t)RING);
    __ml_chan_resync_tx(a);
    ASSERT_EQ(send_some(a, &sent, 1000), 1000u);
    ASSERT_EQ(recv_all(b, &read, 4096), 1000u);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 12. The creator's last close (the pool's park) while a holder it passed the socket to
     * has written past the ring, unread: the reader gets every byte (the park compared the
     * tail with the creator's own stale head, and gave the region's pages back). */
    pair(fab, &a, &b);
    sent = read = 0;
    e = other_holder(fab, a);
    ASSERT_EQ(send_some(e, &sent, RING + 5000), (size_t)(RING + 5000));
    ASSERT_EQ(e->grows, 1u);
    let_go(e);
    memlan_channel_close(a);
    ASSERT_EQ(recv_all(b, &read, 4096), (size_t)(RING + 5000));
    memlan_channel_close(b);

    /* 13. Back in the ring with the region's pages kept: a second after the growth they go,
     * for a holder whose every send is of two chunks (a count of chunks looked at every 64th
     * missed it), and for one that resyncs before each (a fork's sharers: the resync forgot
     * the pages). */
    for (int resync = 0; resync < 2; resync++) {
        pair(fab, &a, &b);
        sent = read = 0;
        ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION));
        ASSERT_EQ(resident(a->tx.gdata, REGION), (size_t)(REGION / 4096));
        ASSERT_EQ(recv_all(b, &read, 65536), (size_t)(RING + REGION));
        ASSERT_EQ(send_some(a, &sent, 10), 10u); /* back in the ring, within the second */
        ASSERT_TRUE(!a->tx.swg);
        ASSERT_EQ(recv_all(b, &read, 4096), 10u);
        ASSERT_TRUE(resident(a->tx.gdata, REGION) > 0);
        struct timespec ts = {1, 200000000};
        nanosleep(&ts, NULL);
        for (int i = 0; i < 300; i++) {
            if (resync)
                __ml_chan_resync_tx(a);
            ASSERT_EQ(send_some(a, &sent, RING / 2), (size_t)(RING / 2)); /* two chunks */
            ASSERT_EQ(recv_all(b, &read, 4096), (size_t)(RING / 2));
        }
        ASSERT_EQ(resident(a->tx.gdata, REGION), 0u);
        memlan_channel_close(b);
        memlan_channel_close(a);
    }

    /* 14. A holder that shares no lock page with the first, in turn after it filled the ring
     * and the region: once its lock's resync has run, readiness no longer says "writable"
     * while its send says EAGAIN (it compared the tail with the head it published when it took
     * the socket up, again and again: a poll loop's spin). */
    pair(fab, &a, &b);
    sent = read = 0;
    e = other_holder(fab, a);
    ASSERT_EQ(fill(a, &sent), (size_t)(RING + REGION));
    __ml_chan_resync_tx(e);
    ASSERT_TRUE(!(memlan_channel_poll(e) & MEMLAN_EV_WRITE));
    ASSERT_EQ(memlan_send(e, buf, 1, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(recv_all(b, &read, 65536), (size_t)(RING + REGION));
    let_go(e);
    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 15. A send that crosses the region's end is one publication (its copy is cut there, the
     * head moves once): the reader never sees its first part alone, as over kernel TCP a
     * small write is never seen in two. */
    pair(fab, &a, &b);
    sent = read = 0;
    ASSERT_EQ(send_some(a, &sent, RING), (size_t)RING);
    ASSERT_EQ(send_some(a, &sent, REGION - RING - 10), (size_t)(REGION - RING - 10));
    ASSERT_TRUE(a->tx.swg);
    uint64_t ops = a->tx.ops;
    ASSERT_EQ(send_some(a, &sent, 32), 32u); /* 10 bytes to the region's end, 22 after */
    ASSERT_EQ(a->tx.ops, ops + 1);
    ASSERT_EQ(recv_all(b, &read, 65536), (size_t)(REGION + 22));
    memlan_channel_close(b);
    memlan_channel_close(a);

    memlan_fabric_close(fab);
    printf("channel-grow: ok\n");
    return 0;
}
