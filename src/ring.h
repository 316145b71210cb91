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

struct ml_ring {
    struct ml_ring_ctl *ctl;
    uint8_t *data;            /* size bytes, mirrored: data[i] == data[i + size] */
    uint64_t size, mask;
    uint64_t pos;             /* producer: head; consumer: tail (private, authoritative) */
    uint64_t other;           /* cached copy of the other side's index */
    bool corrupt;
    /* pos as the holder last published it, for readers that hold nothing (readiness): never the
     * shared copy of our own index, which the peer can overwrite (a garbage tail made a blocked
     * recv's readiness check say "ready" for ever while the locked pass found nothing: a spin).
     * Points at own_pub, or at a word in memory only our fork children share (the socket
     * layer's lock page: __ml_chan_pub_share). */
    _Atomic uint64_t *_Atomic pub;
    _Atomic uint64_t own_pub;
};

/* Producer: free bytes, reloading tail only when fewer than want are known free.  -1 if corrupt. */
static inline int64_t ml_ring_free(struct ml_ring *r, uint64_t want)
{
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

/* Producer: publish n more bytes. */
static inline void ml_ring_produce(struct ml_ring *r, uint64_t n)
{
    r->pos += n;
    atomic_store_explicit(atomic_load_explicit(&r->pub, memory_order_relaxed), r->pos, memory_order_relaxed); /* before head: never ahead */
    /* SYNC: pairs with the acquire load of head in ml_ring_avail(): the bytes written below the
     * new head are visible to the consumer before the head that covers them.  The store is a
     * seq_cst exchange, a full barrier, so that the load of the consumer's tripwire that follows
     * in __ml_chan_wake_rmw() cannot pass it (the Dekker handshake F1): on x86 one locked
     * instruction instead of a store and an mfence. */
    (void)atomic_exchange_explicit(&r->ctl->head, r->pos, memory_order_seq_cst);
}

/* Consumer: readable bytes, reloading head only when fewer than want are known.  -1 if corrupt. */
static inline int64_t ml_ring_avail(struct ml_ring *r, uint64_t want)
{
    uint64_t avail = r->other - r->pos;
    if (ml_likely(avail >= want))
        return (int64_t)avail;
    /* SYNC: pairs with the release store of head in ml_ring_produce(). */
    uint64_t h = ml_load_acquire(&r->ctl->head);
    if (ml_unlikely(h - r->pos > r->size || h - r->pos < avail)) {
        r->corrupt = true;
        return -1;
    }
    r->other = h;
    return (int64_t)(h - r->pos);
}

/* Consumer: free n bytes. */
static inline void ml_ring_consume(struct ml_ring *r, uint64_t n)
{
    r->pos += n;
    atomic_store_explicit(atomic_load_explicit(&r->pub, memory_order_relaxed), r->pos, memory_order_relaxed); /* ordered by the exchange */
    /* SYNC: pairs with the acquire load of tail in ml_ring_free(); a full barrier too, for the
     * producer's tripwire (see ml_ring_produce()). */
    (void)atomic_exchange_explicit(&r->ctl->tail, r->pos, memory_order_seq_cst);
}

static inline uint8_t *ml_ring_at(const struct ml_ring *r, uint64_t idx)
{
    return r->data + (idx & r->mask);
}

#endif
