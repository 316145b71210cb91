/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * ring.h - one direction of a channel: a single-producer single-consumer ring (CLAN's
 * distributed message queue with lazy pointer copies).
 *
 * Protocol.  head and tail are free-running 64-bit byte counts in shared memory.  The producer
 * writes data at head, then publishes it with a release store of head; the consumer reads data up
 * to the head it loaded with acquire, then frees it with a release store of tail.  Each side keeps
 * its own index privately (pos) and a cached copy of the other's (other), and reloads the other's
 * only when the ring looks full or empty, so in steady state each side touches the other's cache
 * line once per batch, not once per operation.
 *
 * The data area is mapped twice, back to back, so every run of up to size bytes starting anywhere
 * in the ring is contiguous in our address space: copies are one memcpy and zero-copy reserve and
 * peek never split.
 *
 * Trust.  The peer can write anything into head, tail and the data.  The size and both private
 * indices are ours; a loaded index is accepted only if it lies between the last value we accepted
 * and our own index (tail) or within size of our own index (head).  Anything else marks the ring
 * corrupt, and every later call on it fails with -EPROTO.  Nothing read from shared memory is ever
 * used as an address before that check.
 */
#ifndef MEMLAN_RING_H
#define MEMLAN_RING_H

#include "internal.h"

#include <string.h>

struct ml_ring {
    struct ml_ring_ctl *ctl;
    uint8_t *data;            /* size bytes, mirrored: data[i] == data[i + size] */
    uint64_t size, mask;
    uint64_t pos;             /* producer: head; consumer: tail (private, authoritative) */
    uint64_t other;           /* cached copy of the other side's index */
    bool corrupt;
    bool msg;                 /* a message ring: records carry publication words (below) */
    /* pos as the holder last published it, for readers that hold nothing (readiness): never the
     * shared copy of our own index, which the peer can overwrite (a garbage tail made a blocked
     * recv's readiness check say "ready" for ever while the locked pass found nothing: a spin).
     * Points at own_pub, or at a word in memory only our fork children share (the socket
     * layer's lock page: __ml_chan_pub_share). */
    _Atomic uint64_t *_Atomic pub;
    _Atomic uint64_t own_pub;
    /* The asymmetric barrier (ml_ring_nofence, channel.c): the other side's declaration as we
     * last read and acknowledged it; our publications on this ring, and their count when we
     * last armed a tripwire of this ring (the declaration policy). */
    uint32_t mb_seen, mb_low;
    uint64_t ops, ops_at_arm;
    /* Growth (below): the region, gsize bytes mapped once (gsize 0: the ring does not
     * grow); cap, the most bytes between tail and head (size + gsize).  The producer's last
     * switch: position swp, from which on its bytes go to the region (swg) or the ring, as it
     * last published it (gpub: own_gpub, or the lock page's word as pub); when it last went
     * into the region. */
    uint8_t *gdata;
    uint64_t gsize, gmask, cap;
    /* producer: the bytes of the ring and of the region it may fill (size and gsize; less for
     * an offer until its server attaches: __ml_chan_offer_limit) */
    uint64_t rlimit, glimit;
    uint64_t swp;
    bool swg;
    bool gsure;               /* producer: we reserved the region's pages and kept them */
    bool gmaybe;              /* producer: the region may hold pages to give back */
    uint32_t gcalls;          /* producer: calls since the last look at gmaybe's pages */
    uint64_t dead_look_ns;    /* producer: the last look at the peer's life at a full region */
    uint64_t grew_ns;
    _Atomic uint64_t *_Atomic gpub;
    _Atomic uint64_t own_gpub;
};

/*
 * Growth (docs/design.md, "Rings grow").  A stream ring of the socket layer that its producer
 * finds full may go on in a region of gsize bytes of the same file, as the kernel grows a TCP
 * socket's buffers: the producer stores the switch, (P << 1) | 1 with P its head, in ctl->grow
 * before the head that passes P, and writes on at P in the region; the consumer reads the ring
 * up to P, then the region.  A producer that finds everything read (tail == head) switches back
 * to the ring at its head the same way ((P << 1) | 0).  Only one switch is outstanding: the next
 * waits until the tail has passed P, so where a position lies follows from the tail, P and the
 * area named, with no other state.  A position x lies at x & mask in the ring, at x & gmask in
 * the region, which is mapped once (a run that passes its end goes on at its start).  Positions
 * are compared with P modulo 2^63.
 */
static inline uint64_t ml_grow_word(uint64_t p, bool region)
{
    return (p << 1) | (region ? 1u : 0u);
}

/* x lies before the switch w: P - x in (0, 2^62) modulo 2^63. */
static inline bool ml_grow_before(uint64_t x, uint64_t w)
{
    return (int64_t)((w & ~(uint64_t)1) - (x << 1)) > 0;
}

/* The producer's first position of the area its head is in (bytes before it, from the tail on,
 * lie in the other area). */
static inline uint64_t ml_grow_base(const struct ml_ring *r, uint64_t t)
{
    return (int64_t)(t - r->swp) < 0 ? r->swp : t;
}

/* The producer's copy of its switch for a reader that holds nothing (readiness, the next
 * holder): the newer of the published word and our own, as ml_ring_pub. */
static inline uint64_t ml_ring_gpub(const struct ml_ring *r)
{
    _Atomic uint64_t *w = atomic_load_explicit(&r->gpub, memory_order_acquire);
    uint64_t p = atomic_load_explicit(w, memory_order_acquire);
    if (ml_unlikely(w != &r->own_gpub)) {
        uint64_t o = atomic_load_explicit(&r->own_gpub, memory_order_acquire);
        if ((int64_t)((o & ~(uint64_t)1) - (p & ~(uint64_t)1)) > 0)
            p = o;
    }
    return p;
}

/* pos as its holder last published it, for a reader that holds nothing (readiness) and for the
 * next holder's resync.  Where the word is the lock page's (__ml_chan_pub_share), the newer of it
 * and our own: a fast word's holder that loaded the pointer just before the switch stores its
 * last publication in our own word, and the page's is then one publish behind until the next (a
 * fork that gave up waiting for a holder, or one made from a handler on top of a send).  Both
 * only grow and neither is the peer's to write, so the newer is never past the truth. */
static inline uint64_t ml_ring_pub(const struct ml_ring *r, memory_order mo)
{
    _Atomic uint64_t *w = atomic_load_explicit(&r->pub, memory_order_acquire);
    uint64_t p = atomic_load_explicit(w, mo);
    if (ml_unlikely(w != &r->own_pub)) {
        uint64_t o = atomic_load_explicit(&r->own_pub, mo);
        if ((int64_t)(o - p) > 0)
            p = o;
    }
    return p;
}

/* Producer of a growing ring: free bytes in the area of its head (ml_ring_free). */
static inline int64_t ml_ring_free_grow(struct ml_ring *r, uint64_t want)
{
    uint64_t sz = r->swg ? r->glimit : r->rlimit;
    uint64_t used = r->pos - ml_grow_base(r, r->other);
    if (ml_likely(used <= sz && sz - used >= want))
        return (int64_t)(sz - used);
    /* SYNC: as in ml_ring_free(). */
    uint64_t t = ml_load_acquire(&r->ctl->tail);
    if (ml_unlikely(t - r->other > r->pos - r->other)) {
        r->corrupt = true;
        return -1;
    }
    r->other = t;
    used = r->pos - ml_grow_base(r, t);
    if (ml_unlikely(used > (r->swg ? r->gsize : r->size))) { /* a switch taken from shared
                                                               * memory (resync) that lies */
        r->corrupt = true;
        return -1;
    }
    /* past an offer's limit: a fork sibling whose copy was lifted filled more */
    return used >= sz ? 0 : (int64_t)(sz - used);
}

/* Producer: free bytes (in the area of its head, for a growing ring), reloading tail only when
 * fewer than want are known free.  -1 if corrupt. */
static inline int64_t ml_ring_free(struct ml_ring *r, uint64_t want)
{
    if (r->gsize)
        return ml_ring_free_grow(r, want);
    uint64_t used = r->pos - r->other;
    if (ml_likely(r->size - used >= want))
        return (int64_t)(r->size - used);
    /* SYNC: pairs with the release store of tail in ml_ring_consume(): the consumer has finished
     * reading the bytes below tail before we overwrite them. */
    uint64_t t = ml_load_acquire(&r->ctl->tail);
    if (ml_unlikely(t - r->other > r->pos - r->other)) {
        r->corrupt = true;
        return -1;
    }
    r->other = t;
    return (int64_t)(r->size - (r->pos - t));
}

/*
 * The asymmetric barrier (docs/design.md, "The asymmetric barrier").  > 0: this process is
 * registered for membarrier's global expedited barrier, so a waiter that makes that barrier
 * after arming orders our publishing store before our later load of its tripwire, and a
 * publication toward such a waiter needs no full barrier of its own.  0 or < 0: every
 * publication makes one (the preload sets it < 0, and so does MEMLAN_FENCE=1: channel.c).
 */
extern _Atomic int __ml_mb_on;

/* Before a publication: the other side's waiter's declaration (decl, in the line of its
 * tripwire, which the wake check reads next anyway), acknowledged in ack (a line of ours) when
 * it changed, and whether this publication may leave out the full barrier: the waiter declared
 * that it makes the barrier, and we are registered.  The acknowledgement is stored before this
 * publication's head or tail and after every earlier publication's stores (release): a waiter
 * that finds its "off" acknowledged knows that every publication made without a barrier is
 * visible to it (a message record's header, stored before, belongs to a publication that read
 * the change and makes the exchange if it read an off).  A
 * peer that declares and does not make the barrier, or acknowledges falsely, only loses its own
 * wake-ups. */
static inline bool ml_ring_nofence(struct ml_ring *r, _Atomic uint32_t *decl, _Atomic uint32_t *ack)
{
    uint32_t d = atomic_load_explicit(decl, memory_order_relaxed);
    if (__builtin_expect(d != r->mb_seen, 0)) {
        r->mb_seen = d;
        atomic_store_explicit(ack, d, memory_order_release);
    }
    return (d & 1) && atomic_load_explicit(&__ml_mb_on, memory_order_relaxed) > 0;
}

/* Producer: publish n more bytes; nofence: see ml_ring_nofence(). */
static inline void ml_ring_produce(struct ml_ring *r, uint64_t n, bool nofence)
{
    r->pos += n;
    r->ops++;
    atomic_store_explicit(atomic_load_explicit(&r->pub, memory_order_relaxed), r->pos, memory_order_relaxed); /* before head: never ahead */
    /* SYNC: pairs with the acquire load of head in ml_ring_avail(): the bytes written below the
     * new head are visible to the consumer before the head that covers them.  Without nofence
     * the store is a seq_cst exchange, a full barrier, so that the load of the consumer's
     * tripwire that follows in __ml_chan_wake_rmw() cannot pass it (the Dekker handshake F1):
     * on x86 one locked instruction instead of a store and an mfence.  With nofence it is a
     * release store, and the compiler barrier keeps that load after it in program order; the
     * consumer's membarrier after arming stands in for the hardware barrier (F1'). */
    if (nofence) {
        atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
        atomic_signal_fence(memory_order_seq_cst);
    } else {
        (void)atomic_exchange_explicit(&r->ctl->head, r->pos, memory_order_seq_cst);
    }
}

/* Consumer: readable bytes, reloading head only when fewer than want are known.  -1 if corrupt. */
static inline int64_t ml_ring_avail(struct ml_ring *r, uint64_t want)
{
    uint64_t avail = r->other - r->pos;
    if (ml_likely(avail >= want))
        return (int64_t)avail;
    /* SYNC: pairs with the release store of head in ml_ring_produce(). */
    uint64_t h = ml_load_acquire(&r->ctl->head);
    if (ml_unlikely(h - r->pos > r->cap || h - r->pos < avail)) {
        /* A message ring's consumer may have taken records by their publication words before
         * the head that covers them reached us: a head at most a ring behind our position is
         * "nothing new" (the producer stores the word of record n+1 only after the head that
         * covers record n, so an honest head lags by one record at most). */
        if (r->msg && avail == 0 && r->pos - h <= r->size)
            return 0;
        r->corrupt = true;
        return -1;
    }
    r->other = h;
    return (int64_t)(h - r->pos);
}

/* Consumer: free n bytes; nofence: see ml_ring_nofence(). */
static inline void ml_ring_consume(struct ml_ring *r, uint64_t n, bool nofence)
{
    r->pos += n;
    r->ops++;
    atomic_store_explicit(atomic_load_explicit(&r->pub, memory_order_relaxed), r->pos, memory_order_relaxed); /* ordered by the exchange */
    /* SYNC: pairs with the acquire load of tail in ml_ring_free(); a full barrier too, for the
     * producer's tripwire (see ml_ring_produce()), unless nofence (F1'). */
    if (nofence) {
        atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_release);
        atomic_signal_fence(memory_order_seq_cst);
    } else {
        (void)atomic_exchange_explicit(&r->ctl->tail, r->pos, memory_order_seq_cst);
    }
}

static inline uint8_t *ml_ring_at(const struct ml_ring *r, uint64_t idx)
{
    return r->data + (idx & r->mask);
}

/* Producer: where its next byte goes. */
static inline uint8_t *ml_ring_wr(const struct ml_ring *r)
{
    return ml_unlikely(r->swg) ? r->gdata + (r->pos & r->gmask) : r->data + (r->pos & r->mask);
}

/* Producer: how many of n bytes go there in a row (a region has no second view: its end cuts
 * a copy in two). */
static inline uint64_t ml_ring_wr_run(const struct ml_ring *r, uint64_t n)
{
    if (ml_likely(!r->swg))
        return n;
    uint64_t end = r->gsize - (r->pos & r->gmask);
    return n < end ? n : end;
}

/* Consumer of a stream ring with avail bytes readable: where the first lies (*p), and how many of
 * them lie there in a row (the rest are in the other area, or, past the region's end, at its
 * start); -1, the ring corrupt, when more than the area holds would.  The switch is loaded after the head that made avail readable (an honest
 * producer stores it before the head that passes its P). */
static inline int64_t ml_ring_rd(struct ml_ring *r, uint64_t avail, const uint8_t **p)
{
    if (ml_likely(!r->gsize)) {
        *p = ml_ring_at(r, r->pos);
        return (int64_t)avail;
    }
    uint64_t w = atomic_load_explicit(&r->ctl->grow, memory_order_acquire);
    bool region = w & 1;
    uint64_t n = avail;
    if (ml_grow_before(r->pos, w)) {
        region = !region;
        uint64_t d = ((w & ~(uint64_t)1) - (r->pos << 1)) >> 1;
        if (d < n)
            n = d;
    }
    if (ml_unlikely(n > (region ? r->gsize : r->size))) {
        r->corrupt = true;
        return -1;
    }
    if (!region) {
        *p = r->data + (r->pos & r->mask);
        return (int64_t)n;
    }
    uint64_t end = r->gsize - (r->pos & r->gmask); /* no second view: a run ends there */
    *p = r->gdata + (r->pos & r->gmask);
    return (int64_t)(n < end ? n : end);
}

/*
 * Message rings: publication in the data line.  A record's header is [len u32][flags u32]; flags
 * holds the record's publication word, ml_msg_tag(position), which is odd and so never 0.  The
 * producer keeps the header slot at its head zero: before it publishes a record it zeroes the
 * slot after it (its reservation always includes those 8 bytes), then stores the whole header
 * with one 8-byte release store, then publishes head as before.  The consumer, finding nothing
 * in its cached head, reads the header at its tail with one 8-byte acquire load: a matching word
 * means the record is there, with no look at head (whose line then stays with the producer).
 * Stale bytes at the tail cannot match: the slot was zeroed before the release that made the
 * previous record visible to us, and only the producer's next header is written there after.
 */
static inline uint32_t ml_msg_tag(uint64_t pos) { return (uint32_t)(pos >> 2) | 1u; }

static inline uint64_t ml_msg_rec(uint64_t len)
{
    return sizeof(struct ml_msg_hdr) + ((len + ML_MSG_ALIGN - 1) & ~(uint64_t)(ML_MSG_ALIGN - 1));
}

/* Producer: publish the record of len payload bytes at pos (room for it and the next header was
 * reserved).  Returns the record's length. */
static inline uint64_t ml_msg_publish(struct ml_ring *r, uint32_t len)
{
    uint64_t rec = ml_msg_rec(len);
    __atomic_store_n((uint64_t *)(void *)ml_ring_at(r, r->pos + rec), 0, __ATOMIC_RELAXED);
    struct ml_msg_hdr h = {.len = len, .flags = ml_msg_tag(r->pos)};
    uint64_t v;
    memcpy(&v, &h, sizeof v);
    /* SYNC: pairs with the acquire load of the header in ml_ring_msg_avail(): the payload and the
     * zeroed next slot are visible before the word that publishes them.  (S6) */
    __atomic_store_n((uint64_t *)(void *)ml_ring_at(r, r->pos), v, __ATOMIC_RELEASE);
    return rec;
}

/*
 * Consumer of a message ring: bytes known readable at our position, 0 if none, -1 if corrupt.
 * First the cached head; then the record header at our position, by its publication word; then,
 * if head_too, the shared head (a spinning consumer leaves head alone: an honest producer's word
 * is visible whenever its head is).  A header taken by its word is checked as any record: the
 * length once, from the one load, and the record must fit in the ring.
 */
static inline int64_t ml_ring_msg_avail(struct ml_ring *r, bool head_too)
{
    uint64_t avail = r->other - r->pos;
    if (ml_likely(avail != 0))
        return (int64_t)avail;
    if (ml_unlikely(r->pos & (ML_MSG_ALIGN - 1))) {
        r->corrupt = true;
        return -1;
    }
    uint64_t v = __atomic_load_n((const uint64_t *)(const void *)ml_ring_at(r, r->pos),
                                 __ATOMIC_ACQUIRE);
    struct ml_msg_hdr h;
    memcpy(&h, &v, sizeof h);
    if (h.flags == ml_msg_tag(r->pos)) {
        uint64_t rec = ml_msg_rec(h.len);
        if (ml_unlikely(rec > r->size)) {
            r->corrupt = true;
            return -1;
        }
        r->other = r->pos + rec;
        return (int64_t)rec;
    }
    return head_too ? ml_ring_avail(r, 1) : 0;
}

#endif
