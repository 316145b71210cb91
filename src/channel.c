/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * channel.c - a bidirectional connection: two rings, their tripwires, and both sides' state.
 *
 * Side 0 creates the channel's segment and hands its token to side 1, which attaches.  Ring 0
 * carries side 0's bytes to side 1, ring 1 the reverse.  Each side's liveness is an OFD lock on
 * its own byte of the segment file (see fabric.c), which the kernel drops when it dies; a side
 * blocked on the channel looks at its peer's byte after ML_LIVENESS_NS, then at doubling intervals
 * up to ML_LIVENESS_MAX_NS, so a peer killed with SIGKILL is noticed within that bound.
 *
 * Tripwires (SCILAN's interrupt flag, CLAN's tripwire).  A waiter spins for its budget, then
 * stores its mode into the ring's wait word, issues a full fence, checks the ring once more, and
 * only then sleeps.  The other side, after publishing, issues a full fence and reads the word; it
 * makes a system call only if the word is armed, and clears it with an exchange so that however
 * many sends follow, the sleeper is woken once.  The two fences make the store-then-load pairs of
 * the two sides a Dekker handshake: at least one side sees the other's store, so no wake-up is
 * lost.
 *
 * Threads: one sending thread and one receiving thread may use a channel at once.
 */
#include "channel.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ML_DEFAULT_RING (256u * 1024u)
#define ML_MIN_RING     ML_PAGE
#define ML_MAX_RING     (1u << 30)
#define ML_STREAM_CHUNK (64u * 1024u)

/* Readable bytes at our receive position.  A message ring's fast paths (recv, peek, spinning)
 * leave head alone (head_too false): see ml_ring_msg_avail. */
static inline int64_t ml_rx_avail(struct memlan_channel *ch, bool head_too)
{
    return ch->kind == MEMLAN_MSG ? ml_ring_msg_avail(&ch->rx, head_too)
                                  : ml_ring_avail(&ch->rx, 1);
}

static uint64_t ml_pow2_up(uint64_t v)
{
    uint64_t p = ML_MIN_RING;
    while (p < v)
        p <<= 1;
    return p;
}

/* Our madvise calls (a region's reservation and its give-back) are made only where no seccomp
 * filter may kill for them: 0 not known yet, 1 none (read once per image, at the first that
 * needs to know: the filter outlives fork and exec), -1 a filter (then no region is reserved,
 * and pages already reserved stay until the file goes).  A filter that comes later through a
 * call the preload sees sets -1 (__ml_madvise_off). */
static _Atomic int ml_madv;

void __ml_madvise_off(void) { ml_store_relaxed(&ml_madv, -1); }

static bool ml_madv_ok(void)
{
    int v = ml_load_relaxed(&ml_madv);
    if (ml_unlikely(v == 0)) {
        int want = __ml_sys_seccomp_mode() == 0 ? 1 : -1;
        (void)ml_cas(&ml_madv, &v, want);
        v = ml_load_relaxed(&ml_madv);
    }
    return v > 0;
}

/* ---- the asymmetric barrier (design.md, "The asymmetric barrier") ------------------------- */

#ifndef MEMBARRIER_CMD_QUERY
#define MEMBARRIER_CMD_QUERY 0
#endif
#define ML_MB_GLOBAL_EXPEDITED          (1 << 1)
#define ML_MB_REGISTER_GLOBAL_EXPEDITED (1 << 2)

/* 0: not tried; 1: registered (ring.h); -1: off (preload, MEMLAN_FENCE=1, refused). */
_Atomic int __ml_mb_on;

/* The preload never makes the barrier: it lives in programs that may confine themselves with a
 * seccomp filter that kills for membarrier (sshd's), and it cannot know when they will. */
void __ml_mb_off(void) { ml_store_relaxed(&__ml_mb_on, -1); }

/* Whether this process may skip the publisher's barrier: decided once, at the first channel.
 * MEMLAN_FENCE=1 makes no system call at all (a program confined by a filter that kills for
 * membarrier sets it).  No lock: two threads that race here both query and register (a second
 * registration is harmless) and the first to publish its answer wins, so a fork in the middle
 * leaves the child nothing held.  Registration belongs to the address space and a fork child
 * inherits it (exec drops it, and our state with it), so a child registers nothing again: one
 * that confined itself after its parent's first channel must not be killed for a call it does
 * not need. */
static bool ml_mb_enable(void)
{
    int v = ml_load_relaxed(&__ml_mb_on);
    if (ml_likely(v != 0))
        return v > 0;
    const char *e = getenv("MEMLAN_FENCE");
    if (e && *e && strcmp(e, "0") != 0 && strcmp(e, "1") != 0)
        __ml_env_say_bad(ML_ENV_FENCE, "MEMLAN_FENCE", e, "0 or 1",
                         "0 (the asymmetric barrier where the kernel offers it)");
    v = -1;
    if (!(e && strcmp(e, "1") == 0)) {
        int q = __ml_sys_membarrier(MEMBARRIER_CMD_QUERY);
        if (q > 0 && (q & ML_MB_GLOBAL_EXPEDITED) && (q & ML_MB_REGISTER_GLOBAL_EXPEDITED) &&
            __ml_sys_membarrier(ML_MB_REGISTER_GLOBAL_EXPEDITED) == 0)
            v = 1;
    }
    int z = 0;
    if (!atomic_compare_exchange_strong(&__ml_mb_on, &z, v))
        return z > 0; /* decided meanwhile (another thread, or the preload's -1) */
    return v > 0;
}

/*
 * A waiter's declaration for one tripwire: (sequence << 2) | (after_on << 1) | on.
 *   on        our arming of it makes the barrier; the publisher may leave out its own.
 *   after_on  off, and the value before it was on: until the publisher has acknowledged this
 *             value, a publication that read the "on" may still come without a barrier, so
 *             our arming still makes the barrier.  An off that follows an off needs no
 *             acknowledgement: every publication since read an off.
 * Every change bumps the sequence, with a compare-and-swap (an event queue's arming in another
 * thread may change it too), so that a value is never put back: an acknowledgement of an
 * earlier value never passes for this one.  We declare on only once the publisher has
 * acknowledged something (a first "off" value, the probe): a peer whose library predates these
 * words never acknowledges, always publishes with the full barrier, and must never cost us one.
 */
#define ML_MB_ON       1u
#define ML_MB_AFTER_ON 2u
#define ML_MB_NEXT(d, bits) (((((d) >> 2) + 1) << 2) | (bits))

/* Turn the declaration on (or write the probe, if the peer never acknowledged anything yet),
 * or off.  If another writer changed it first, theirs stands. */
static void ml_mb_set(_Atomic uint32_t *decl, _Atomic uint32_t *ack, bool on)
{
    uint32_t d = ml_load_relaxed(decl);
    if (on == (bool)(d & ML_MB_ON))
        return;
    uint32_t want;
    if (on)
        want = ml_load_acquire(ack) != 0 ? ML_MB_NEXT(d, ML_MB_ON)
               : d == 0 ? ML_MB_NEXT(d, 0u) /* the probe */ : d;
    else
        want = ML_MB_NEXT(d, ML_MB_AFTER_ON);
    if (want != d)
        (void)atomic_compare_exchange_strong(decl, &d, want);
}

/* The policy, when we are about to arm a tripwire of ring r (decl and ack: its words).  On once
 * the ring moved at least ML_MB_OPS_PER_ARM of our operations since we last armed one of its
 * tripwires (a stream of messages, where the barrier the peer leaves out per publication costs
 * more than ours per sleep); off after ML_MB_LOW_ARMS arms in a row with fewer than
 * ML_MB_FEW_OPS each (one message per sleep, as a request and its reply: a barrier per sleep
 * would cost each round trip a system call on each side).  Between the two, as it was: a
 * receiver that keeps up with a stream sleeps after a few messages at times, and flipping at
 * each such sleep made 2,673 changes in 5 M messages.  Nothing where this process may not make
 * the barrier (the preload, MEMLAN_FENCE=1), which also keeps the preload's waiters, which hold
 * no lock, from writing the ring's private counters. */
#define ML_MB_OPS_PER_ARM 16u
#define ML_MB_FEW_OPS     4u
#define ML_MB_LOW_ARMS    4u

static void ml_mb_policy(struct memlan_channel *ch, struct ml_ring *r, _Atomic uint32_t *decl,
                         _Atomic uint32_t *ack)
{
    if (ml_load_relaxed(&__ml_mb_on) <= 0)
        return;
    uint64_t n = r->ops - r->ops_at_arm;
    r->ops_at_arm = r->ops;
    bool on = ml_load_relaxed(decl) & ML_MB_ON;
    if (n >= ML_MB_OPS_PER_ARM) {
        on = true;
        r->mb_low = 0;
    } else if (n < ML_MB_FEW_OPS) {
        if (++r->mb_low >= ML_MB_LOW_ARMS)
            on = false;
    } else {
        r->mb_low = 0;
    }
    if (ml_load_relaxed(&ch->mb_lost))
        on = false;
    ml_mb_set(decl, ack, on);
}

/* Between sleeps, every 64 operations on ring r: a side that moves messages without arming
 * (a spinning receiver of a stream never sleeps; nor does a request and reply whose answers
 * come within the spin) declares on as soon as it has made ML_MB_OPS_PER_ARM of them since it
 * last armed.  Its sends and receives then leave out the barrier, and each of its rare sleeps
 * makes one.  Turning on is safe at any time: from then on our waits make the barrier. */
static inline void ml_mb_busy(struct memlan_channel *ch, struct ml_ring *r, _Atomic uint32_t *decl,
                              _Atomic uint32_t *ack)
{
    if (ml_likely((r->ops & 63) != 0) || r->ops - r->ops_at_arm < ML_MB_OPS_PER_ARM ||
        ml_load_relaxed(&__ml_mb_on) <= 0 || ml_load_relaxed(&ch->mb_lost))
        return;
    ml_mb_set(decl, ack, true);
}

/* Whether our arming of a tripwire (decl, ack: its words) must make the barrier: the
 * declaration is on, or off after an on that the publisher has not acknowledged yet.  Never
 * where this process may not make it: the words are the peer's to write too, and a peer's "on"
 * must never make the preload (or MEMLAN_FENCE=1) call membarrier (a review killed such a
 * victim with SIGSYS). */
static bool ml_mb_needed(_Atomic uint32_t *decl, _Atomic uint32_t *ack)
{
    if (ml_load_relaxed(&__ml_mb_on) <= 0)
        return false;
    uint32_t d = ml_load_relaxed(decl);
    /* SYNC: pairs with the release store of the acknowledgement in ml_ring_nofence(). */
    return (d & ML_MB_ON) || ((d & ML_MB_AFTER_ON) && ml_load_acquire(ack) != d);
}

/* The barrier, for the declarations decl and decl2 (NULL: none), with their acks: 0, or -1 when
 * the re-check alone cannot be trusted (the kernel refused it: a seccomp filter installed
 * since, with an error): the channel never declares again, and its sleeps are bounded (1 ms)
 * until the publisher acknowledges the off. */
static int ml_mb_barrier(struct memlan_channel *ch, _Atomic uint32_t *decl, _Atomic uint32_t *ack,
                         _Atomic uint32_t *decl2, _Atomic uint32_t *ack2)
{
    __atomic_add_fetch(&ch->mb_barriers, 1, __ATOMIC_RELAXED);
    if (!ml_load_relaxed(&ch->mb_lost) && __ml_sys_membarrier(ML_MB_GLOBAL_EXPEDITED) == 0)
        return 0;
    ml_store_relaxed(&ch->mb_lost, true);
    if (decl)
        ml_mb_set(decl, ack, false);
    if (decl2)
        ml_mb_set(decl2, ack2, false);
    return -1;
}

int __ml_mb_wait_barrier(struct memlan_channel *ch, _Atomic uint32_t *decl, _Atomic uint32_t *ack)
{
    return ml_mb_needed(decl, ack) ? ml_mb_barrier(ch, decl, ack, NULL, NULL) : 0;
}

/* The producer's switch from the word w (a new side's, or the next holder's after fork or
 * exec): P is taken as the position within 2^63 behind our head, where an honest word's is.  A
 * word that lies costs only the producer's own direction: its bytes land where the consumer will
 * not look (ml_ring_free_grow marks the ring corrupt where they would not fit). */
static void ml_grow_take(struct ml_ring *r, uint64_t w)
{
    uint64_t behind = ((r->pos << 1) - (w & ~(uint64_t)1)) >> 1;
    r->swp = r->pos - behind;
    r->swg = r->gsize && (w & 1);
    r->gsure = false; /* another holder may have let the pages go, or kept them: */
    if (w != 0 && !r->gmaybe) { /* (a word never stored: no switch, no pages) */
        /* looked at by the trim a second from now, not at once: a sibling may have kept them
         * for its next growth (set at every resync, a forked socket's trim punched an empty
         * region every 64th send for ever) */
        r->gmaybe = true;
        r->grew_ns = __ml_now_ns();
    }
    /* Only our own copy: the channel's is where every holder stores first, so it is never
     * behind ours, and a store of it here (the value just loaded) would undo a switch that a
     * holder of another process made in between (one that shares no lock page with us: a
     * process that took the socket up after exec, or over SCM_RIGHTS, while the first sends). */
    atomic_store_explicit(atomic_load_explicit(&r->gpub, memory_order_relaxed),
                          ml_grow_word(r->swp, r->swg), memory_order_release);
}

/* Whether our producer's offer limits (__ml_chan_offer_limit) hold still: set, and the peer
 * not attached. */
static bool ml_limited(const struct memlan_channel *ch)
{
    return ml_unlikely(ch->tx.glimit < ch->tx.gsize || ch->tx.rlimit < ch->tx.size) &&
           ch->side == 0 && ml_load_acquire(&ch->hdr->attached) != 1;
}

/* The bytes of the region, and of the ring, our producer may fill: all of each once the peer
 * attached; an offer's limits before. */
static uint64_t ml_glimit(const struct memlan_channel *ch)
{
    return ml_limited(ch) ? ch->tx.glimit : ch->tx.gsize;
}

static uint64_t ml_rlimit(const struct memlan_channel *ch)
{
    return ml_limited(ch) ? ch->tx.rlimit : ch->tx.size;
}

/* Whether our direction may switch into its region now: it grows, nothing refused it, and no
 * switch is outstanding (the tail t has passed the last one, at swp).  An offer's ring grows
 * before the server attaches, as the kernel's buffers take bytes before an accept, up to its
 * limit (__ml_chan_offer_limit): a withdrawn offer's bytes are read back from both areas
 * (__ml_chan_unsent) and must all fit in the kernel's buffers then. */
static bool ml_growable(const struct memlan_channel *ch, uint64_t t, uint64_t swp)
{
    return ch->tx.gsize && !ml_load_relaxed(&ch->grow_off) && (int64_t)(t - swp) >= 0 &&
           ml_glimit(ch) > 0;
}

/*
 * An offer (the socket layer's client side before its server attaches) fills at most `bytes`
 * of ring and region together: what a withdrawal must send over TCP at once, which the kernel's
 * buffers take only up to about tcp_wmem's maximum.  Past that a send waits for the decision,
 * as it does at a full ring.  Without the limit a program told that 4.25 MiB were sent had the
 * rest stuck in the region after a fall to TCP: nobody flushed it while it polled for input,
 * and close, exit and exec waited for its server to read (a review).  Lifted once the server
 * attaches (ml_grow).  Call before the first send.
 */
void __ml_chan_offer_limit(struct memlan_channel *ch, uint64_t bytes)
{
    struct ml_ring *r = &ch->tx;
    if (!r->gsize || (ch->side == 0 && ml_load_acquire(&ch->hdr->attached) == 1))
        return; /* a ring that does not grow is its own limit (SO_SNDBUF sized it) */
    uint64_t g = bytes <= r->size ? 0 : bytes - r->size < r->gsize ? bytes - r->size : r->gsize;
    uint64_t rl = bytes < r->size ? bytes : r->size;
    if (g < r->glimit) /* only ever lowered (SO_SNDBUF after connect), until the lift */
        r->glimit = g;
    if (rl < r->rlimit)
        r->rlimit = rl;
}

static void ml_chan_bind(struct memlan_channel *ch, struct memlan_segment *seg, int side)
{
    struct ml_chan_hdr *c = (struct ml_chan_hdr *)(seg->base + seg->body_off);
    ch->seg = seg;
    ch->hdr = c;
    ch->side = side;
    ch->size = seg->mirror;
    struct ml_ring_ctl *ctl[2] = {
        (struct ml_ring_ctl *)(seg->base + ML_CHAN_CTL0_OFF),
        (struct ml_ring_ctl *)(seg->base + ML_CHAN_CTL1_OFF),
    };
    uint8_t *data[2] = {seg->base + ML_PAGE, seg->base + ML_PAGE + 2 * seg->mirror};
    /* The regions (segment.c maps them once each, after the rings' second views). */
    uint64_t g = ch->kind == MEMLAN_STREAM ? seg->grow : 0;
    uint8_t *gdata[2] = {seg->base + ML_PAGE + 4 * seg->mirror,
                         seg->base + ML_PAGE + 4 * seg->mirror + seg->grow};
    struct ml_ring *rings[2] = {&ch->tx, &ch->rx};
    struct ml_chan_refs *refs = (struct ml_chan_refs *)(seg->base + ML_CHAN_REFS_OFF);
    ch->tx_refs = &refs[side];
    ch->rx_refs = &refs[1 - side];
    for (int i = 0; i < 2; i++) {
        int idx = i == 0 ? side : 1 - side; /* tx is ring[side] */
        struct ml_ring *r = rings[i];
        r->ctl = ctl[idx];
        r->data = data[idx];
        r->size = seg->mirror;
        r->mask = seg->mirror - 1;
        r->gdata = g ? gdata[idx] : NULL;
        r->gsize = r->glimit = g;
        r->rlimit = seg->mirror;
        r->gmask = g ? g - 1 : 0;
        r->cap = seg->mirror + g;
        r->corrupt = false;
        r->msg = ch->kind == MEMLAN_MSG;
    }
    /* Our private indices start from what the shared memory says now (zero for a new channel);
     * they are the only values we trust from here on. */
    ch->tx.pos = ml_load_acquire(&ch->tx.ctl->head);
    ch->tx.other = ml_load_acquire(&ch->tx.ctl->tail);
    ch->rx.pos = ml_load_acquire(&ch->rx.ctl->tail);
    ch->rx.other = ch->rx.pos;
    if (ch->tx.pos - ch->tx.other > ch->tx.cap)
        ch->tx.corrupt = true;
    for (int i = 0; i < 2; i++) {
        rings[i]->pub = &rings[i]->own_pub;
        atomic_store_explicit(&rings[i]->own_pub, rings[i]->pos, memory_order_relaxed);
        rings[i]->gpub = &rings[i]->own_gpub;
    }
    ml_grow_take(&ch->tx, g ? ml_load_acquire(&ch->tx.ctl->grow) : 0);
    /* A message ring's records start on 8-byte boundaries, and our positions only ever move by
     * whole records: a position taken from shared memory that is not aligned was written by a
     * broken or hostile peer (reading a record header there would be a misaligned access). */
    if (ch->kind == MEMLAN_MSG) {
        if (ch->tx.pos & (ML_MSG_ALIGN - 1))
            ch->tx.corrupt = true;
        if (ch->rx.pos & (ML_MSG_ALIGN - 1))
            ch->rx.corrupt = true;
    }
    /* Say where we are from the start: the peer's first wait then knows whether spinning could
     * help (on our cpu it cannot: we would need the core it spins on). */
    uint32_t cpu = (uint32_t)(__ml_getcpu() + 1);
    ml_note_cpu(&ch->rx.ctl->rx_cpu, cpu);
    ml_note_cpu(&ch->tx.ctl->tx_cpu, cpu);
    /* The asymmetric barrier: register the process (once), and start with our declarations
     * off, acknowledged by nobody yet (a new or reset file holds zeros, which match). */
    (void)ml_mb_enable();
}

/* A new channel's header, once its segment exists: the geometry and our side. */
static void ml_chan_init(struct memlan_channel *ch, struct memlan_segment *seg, int kind,
                         uint64_t rs)
{
    struct ml_chan_hdr *c = (struct ml_chan_hdr *)(seg->base + seg->body_off);
    c->chan_kind = kind == MEMLAN_MSG ? ML_CHAN_MSG : ML_CHAN_STREAM;
    c->ring_size = (uint32_t)rs;
    c->grow_size = (uint32_t)seg->grow;
    c->ctl_off[0] = ML_CHAN_CTL0_OFF;
    c->ctl_off[1] = ML_CHAN_CTL1_OFF;
    c->data_off[0] = ML_PAGE;
    c->data_off[1] = ML_PAGE + rs;
    c->side_pid[0] = (int32_t)__ml_pid();
    ch->kind = (uint32_t)kind;
    ml_chan_bind(ch, seg, 0);
}

/* A channel file's body: the first page and two rings, and, where the rings grow (g, 0: not),
 * the two regions (segment.c, ml_seg_grow_of). */
static uint64_t ml_chan_body(uint64_t rs, uint64_t g)
{
    return ML_PAGE - sizeof(struct ml_seg_hdr) + 2 * rs + 2 * g;
}

static int ml_chan_new_seg(memlan_fabric_t *fab, uint64_t rs, uint64_t g,
                           struct memlan_segment **seg)
{
    int r = __ml_seg_create(fab, ML_KIND_CHANNEL, MEMLAN_MODE_RW, sizeof(struct ml_seg_hdr),
                            ml_chan_body(rs, g), rs, seg);
    if (r == 0)
        __ml_seg_drop_fd(*seg); /* the lock lives on in the mappings */
    return r;
}

static int ml_chan_new_private(memlan_fabric_t *fab, uint64_t rs, uint64_t g,
                               const struct ml_access *acc, struct memlan_segment **seg);

int memlan_channel_create(memlan_fabric_t *fab, const struct memlan_channel_opts *opts,
                          memlan_channel_t **out)
{
    return __ml_chan_create_for(fab, opts, NULL, out);
}

/*
 * A native channel.  In a shared fabric its file is private to its two ends, as the socket
 * layer's are: created 0600 (never widened), and acc's users (sorted, unique, neither the
 * creator's euid nor root; NULL: none) granted read-write by an ACL before anyone can learn the
 * token.  memlan_connect() names the server's user there; a channel made by
 * memlan_channel_create() is attached by processes of its creator's user (and root) only.
 * (Before, the file was 0666: any member that learnt the token could read and write the
 * connection.)
 */
int __ml_chan_create_for(memlan_fabric_t *fab, const struct memlan_channel_opts *opts,
                         const struct ml_access *acc, memlan_channel_t **out)
{
    if (!fab || !out || (acc && acc->n > ML_ACCESS_MAX))
        return -EINVAL;
    *out = NULL;
    int kind = opts && opts->kind ? opts->kind : MEMLAN_STREAM;
    size_t want = opts && opts->ring_size ? opts->ring_size : ML_DEFAULT_RING;
    if ((kind != MEMLAN_STREAM && kind != MEMLAN_MSG) || want < ML_MIN_RING ||
        want > ML_MAX_RING)
        return -EINVAL;
    uint64_t rs = ml_pow2_up(want);
    struct memlan_channel *ch = calloc(1, sizeof *ch);
    if (!ch)
        return -ENOMEM;
    struct memlan_segment *seg;
    static const struct ml_access none;
    int r = fab->shared ? ml_chan_new_private(fab, rs, 0, acc ? acc : &none, &seg)
                        : ml_chan_new_seg(fab, rs, 0, &seg);
    if (r < 0) {
        __ml_free(ch);
        return r;
    }
    ml_chan_init(ch, seg, kind, rs);
    if (fab->shared) { /* its writers: us and acc's users (evq.c's parts) */
        ch->posters_private = true;
        ch->posters = acc ? *acc : none;
    }
    ch->attach_by = __ml_now_ns() + ML_ATTACH_WAIT_NS;
    __ml_seg_publish(seg);
    *out = ch;
    return 0;
}

/* ---- the pool ---------------------------------------------------------------------------- */

/*
 * A connection's set-up pays to create, size, map and lock its channel file, and its close pays
 * to unmap and free it: most of what a short connection costs.  A channel made with
 * __ml_chan_create_pooled() (the socket layer's client side) instead goes to its fabric's pool
 * when it closes, still mapped, and a later connection reuses it once its old peer has gone:
 *   - Our side must be closed in every process: a fork since the channel was made rules it out
 *     (a child may still hold it).
 *   - The attacher must be gone.  We take a write lock on bytes 1..3 (the attacher's liveness
 *     byte and both bridge bytes) through a new open file: it succeeds only when nobody holds
 *     them, and while we hold it no acceptor can take its byte, so none attaches mid-reset.
 *   - The reset zeroes both rings' controls, the socket layer's blocks and the bytes the old
 *     connection left in the rings (a new peer must not read an old one's data), and bumps the
 *     generation.  An offer names the generation and the attacher checks it under its lock, so a
 *     late acceptor of the old connection fails instead of joining the new one.
 *   - Closing the lock's file lets the new connection's acceptor in.
 * Our liveness lock stays in the mappings all along: to the new peer we are as alive as ever.
 * A child drops the pool it inherited at fork (its mappings would keep our liveness lock alive
 * after we die); exit, exec and memlan_fabric_close() give the files back.
 */
static _Atomic unsigned ml_forks;
static memlan_fabric_t *ml_pool_fabs[4];
static pthread_mutex_t ml_pool_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ml_pool_once = PTHREAD_ONCE_INIT;

static void ml_pool_prepare(void)
{
    atomic_fetch_add(&ml_forks, 1u);
    pthread_mutex_lock(&ml_pool_reg_mu);
    for (int i = 0; i < 4; i++)
        if (ml_pool_fabs[i])
            pthread_mutex_lock(&ml_pool_fabs[i]->pool_mu);
}

static void ml_pool_parent(void)
{
    for (int i = 0; i < 4; i++)
        if (ml_pool_fabs[i])
            pthread_mutex_unlock(&ml_pool_fabs[i]->pool_mu);
    pthread_mutex_unlock(&ml_pool_reg_mu);
}

static void ml_pool_child(void)
{
    for (int i = 0; i < 4; i++) {
        memlan_fabric_t *fab = ml_pool_fabs[i];
        if (!fab)
            continue;
        pthread_mutex_init(&fab->pool_mu, NULL);
        for (int k = 0; k < fab->npool; k++) {
            fab->pool[k]->owner = false; /* the parent's files: unmap, do not unlink */
            __ml_seg_destroy(fab->pool[k]);
        }
        fab->npool = 0;
    }
    pthread_mutex_init(&ml_pool_reg_mu, NULL);
}

static void ml_pool_atfork(void) { pthread_atfork(ml_pool_prepare, ml_pool_parent, ml_pool_child); }

/* Reset a pooled channel for a new connection (we hold the attacher's bytes: see above). */
static void ml_chan_reset(struct memlan_segment *seg)
{
    uint8_t *b = seg->base;
    struct ml_chan_hdr *c = (struct ml_chan_hdr *)(b + seg->body_off);
    struct ml_ring_ctl *ctl[2] = {(struct ml_ring_ctl *)(b + ML_CHAN_CTL0_OFF),
                                  (struct ml_ring_ctl *)(b + ML_CHAN_CTL1_OFF)};
    /* Where the old attacher ran is kept as a hint: the next one is most likely the same
     * server, and a creator that waits for it must not spin on the core it needs. */
    uint32_t peer_rx_cpu = ml_load_relaxed(&ctl[0]->rx_cpu);
    uint32_t peer_tx_cpu = ml_load_relaxed(&ctl[1]->tx_cpu);
    for (int i = 0; i < 2; i++) {
        uint64_t used = ml_load_relaxed(&ctl[i]->head);
        memset(b + ML_PAGE + 2 * (uint64_t)i * seg->mirror, 0,
               used < seg->mirror ? used : seg->mirror);
        memset(ctl[i], 0, sizeof *ctl[i]);
    }
    /* The regions' pages go back to the file system (and their bytes with them). */
    if (seg->grow && ml_madv_ok())
        (void)__ml_sys_madvise(b + ML_PAGE + 4 * seg->mirror, 2 * seg->grow, MADV_REMOVE);
    ml_store_relaxed(&ctl[0]->rx_cpu, peer_rx_cpu);
    ml_store_relaxed(&ctl[1]->tx_cpu, peer_tx_cpu);
    memset(b + ML_CHAN_SOCK_OFF, 0, 2 * sizeof(struct ml_sock_side));
    memset(b + ML_CHAN_OFFER_OFF, 0, sizeof(struct ml_offer_blk)); /* no longer offered */
    memset(b + ML_CHAN_REFS_OFF, 0, 2 * sizeof(struct ml_chan_refs));
    ml_store_relaxed(&c->side_state[0], ML_SIDE_OPEN);
    ml_store_relaxed(&c->side_state[1], ML_SIDE_OPEN);
    c->side_pid[1] = 0;
    ml_store_relaxed(&c->attacher_uid1, 0u);
    ml_store_relaxed(&c->attached, 0u);
    /* SYNC: the acceptor reads the generation under its lock, which it can take only after we
     * close ours (a system call on both sides orders the stores before its loads). */
    ml_store_release(&c->generation, ml_load_relaxed(&c->generation) + 1);
}

/* A lock taken within about 100 ms, or not: the drain runs at exit and exec, which a signal
 * handler may call (exec is async-signal-safe, and programs call exit there: uWSGI's graceful
 * reload), on top of this very thread's section under the lock: it waited for itself for ever
 * (tests/preload/exithandler.c).  A drain that cannot lock leaves the parked files to the sweep. */
static bool ml_lock_bounded(pthread_mutex_t *mu)
{
    for (int i = 0; i < 100; i++) {
        if (pthread_mutex_trylock(mu) == 0)
            return true;
        struct timespec ms = {0, 1000000};
        (void)nanosleep(&ms, NULL);
    }
    return false;
}

/* The pool is a saving, never worth a wait that may not end: a connect or a close that a signal
 * handler makes (both are async-signal-safe) on top of this thread's own section under the lock
 * would wait for itself.  A few tries, giving the cpu to a holder that may be on ours
 * (__ml_brief_wait); then no pooled channel (a new one is made) or no parking (the file goes). */
static bool ml_lock_brief(pthread_mutex_t *mu)
{
    for (unsigned i = 0; i < 96; i++) {
        if (pthread_mutex_trylock(mu) == 0)
            return true;
        __ml_brief_wait(i);
    }
    return false;
}

/*
 * The creator of a socket channel lets go of its file (its close destroys it; exit drains the
 * pool, _exit unnames it, the pool evicts it): while the attacher's side is open, the file's
 * name stays for it, since the attacher reopens the file by name to carry the connection across
 * an exec or to pass it over SCM_RIGHTS, and without it the ring's bytes were lost.  A one-shot
 * client that sent a line, closed and exited before an inetd-style server's child exec'd its
 * program lost its line (a review: 2 to 4 of 10; kernel TCP delivers all).  The attacher's last
 * close removes the name then (ML_SOCK_NAME_LEFT, __ml_chan_end).  The flag goes first, then
 * the attacher's state is read (seq_cst, as the attacher's store of its own and read of ours):
 * one of the two sees the other, and an attacher closed already leaves the name to us.  True:
 * the name is left (the caller's unlink is not made).  Peer-writable: a flag that lies only
 * makes the attacher remove this channel's own name.
 */
static bool ml_chan_name_left(struct memlan_segment *seg)
{
    uint8_t *b = seg->base;
    struct ml_chan_hdr *c = (struct ml_chan_hdr *)(b + seg->body_off);
    if (ml_load_acquire(&c->attached) != 1)
        return false;
    /* In a fabric shared by several users the directory is sticky: only the file's owner (we)
     * or root may remove its name.  An attacher of another user could not, and every such
     * connection whose client closed first left its file for good (nginx's workers as www-data,
     * a client of another user: 2.5 GB of channel files in 15 s, an explorer).  There the name
     * goes with our close; the attacher's carry across an exec after it opens its file by name
     * no more (see design.md).  The word is the attacher's to write: a lie keeps or removes
     * this channel's own name only. */
    uint32_t a = ml_load_relaxed(&c->attacher_uid1);
    if (seg->fab && seg->fab->shared && a != 0 && a != 1u && a - 1u != (uint32_t)geteuid())
        return false;
    struct ml_sock_side *sides = (struct ml_sock_side *)(b + ML_CHAN_SOCK_OFF);
    atomic_fetch_or(&sides[0].flags, ML_SOCK_NAME_LEFT);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&c->side_state[1]) == ML_SIDE_CLOSED)
        return false;
    /* An attacher gone without its close (exit() or a signal, as a shut-down `cat` behind
     * stunnel's exec service ends) would never take the name: its lock says (a look by name,
     * only for a side that is not closed; one that cannot tell keeps the name). */
    return __ml_seg_alive(seg, ML_LOCK_ATTACHER) != 0;
}

static struct memlan_segment *ml_pool_take(memlan_fabric_t *fab, uint64_t rs, uint64_t g,
                                          const struct ml_access *acc)
{
    struct memlan_segment *got = NULL;
    int me = (int)__ml_sys_getpid();
    if (!ml_lock_brief(&fab->pool_mu))
        return NULL;
    for (int i = 0, tries = 0; i < fab->npool && tries < 2; i++) {
        struct memlan_segment *seg = fab->pool[i];
        if (seg->park_pid != me) {
            /* Parked by the process we were forked from without glibc's fork (a raw clone
             * runs no pthread_atfork handler: ml_pool_child): its file, which it may take up
             * again, never ours to reuse or remove (a review: a raw fork child's exit removed
             * the file of its parent's live connection). */
            memmove(&fab->pool[i], &fab->pool[i + 1], (size_t)(fab->npool - i - 1) * sizeof seg);
            fab->npool--;
            seg->owner = false;
            __ml_seg_destroy(seg);
            i--;
            continue;
        }
        /* A private channel is reused only for the same acceptor users: a user its ACL granted
         * may have opened it by name and may keep that descriptor; the next connection on the
         * file must be one that user may read anyway.  (Rewriting the ACL would not close an
         * open file.) */
        if (seg->mirror != rs || seg->grow != g || memcmp(&seg->access, acc, sizeof *acc) != 0)
            continue;
        tries++;
        long fd = __ml_seg_reopen(seg, O_RDWR);
        bool gone = fd == -ENOENT || fd == -ESTALE; /* removed by hand, say: not ours now */
        if (fd >= 0 && __ml_sys_lock_range((int)fd, ML_LOCK_ATTACHER, 3) < 0) {
            __ml_sys_close((int)fd);
            continue; /* the old peer is still there */
        }
        if (fd < 0 && !gone)
            continue;
        memmove(&fab->pool[i], &fab->pool[i + 1], (size_t)(fab->npool - i - 1) * sizeof seg);
        fab->npool--;
        if (gone) {
            seg->owner = false;
            __ml_seg_destroy(seg);
            i--;
            continue;
        }
        ml_chan_reset(seg);
        /* unlocked, not only closed: a fork or vfork by another thread meanwhile holds a copy
         * of fd, and the acceptor's lock failed while it lived (the acceptor read "withdrawn",
         * and a client in the same process waited for ever: an explorer's strace) */
        (void)__ml_sys_unlock_range((int)fd, ML_LOCK_ATTACHER, 3);
        __ml_sys_close((int)fd);
        if (__ml_guard_broken(seg->guard)) { /* shrunk while parked: the reset found it */
            __ml_seg_destroy(seg);
            i--;
            continue;
        }
        got = seg;
        break;
    }
    pthread_mutex_unlock(&fab->pool_mu);
    return got;
}

/* Keep a closed channel's file (our side already CLOSED).  False: the caller destroys it. */
static bool ml_pool_park(struct memlan_channel *ch)
{
    memlan_fabric_t *fab = ch->seg->fab;
    if (!ch->poolable || ch->side != 0 || !ch->seg->owner || ch->forks != ml_forks)
        return false;
    /* Not in a vfork child (its pid is not the one we cached: no fork handler runs for vfork),
     * whose pool is its parent's: the exec's look at the sockets there may drop the last
     * reference of one that another thread of the parent closed meanwhile, and parked under
     * the child's pid, the file was later dropped without its name (CPython's subprocess
     * vforks: a thread spawning while another made and closed connections left about 130
     * files in 3,000).  Destroyed, its name goes now. */
    int me = (int)__ml_sys_getpid();
    if (me != (int)__ml_pid())
        return false;
    if (__ml_guard_broken(ch->seg->guard))
        return false; /* shrunk under us (guard.c): private memory now, never lent again */
    /* A parked file gives our region's pages back once the peer has read all of it (the
     * channel's head and tail: a process we passed the socket to publishes only there); bytes
     * it has still to read stay until the reset (a sender that closed with its region unread
     * lost them to a punch here), and so does the region the peer writes (it may be copying
     * into it still: a page it had to take again on a full fabric would be its SIGBUS). */
    if (ch->tx.gsize && ml_madv_ok() &&
        ml_load_acquire(&ch->tx.ctl->tail) == ml_load_acquire(&ch->tx.ctl->head))
        (void)__ml_sys_madvise(ch->tx.gdata, ch->tx.gsize, MADV_REMOVE);
    bool ok = false;
    if (!ml_lock_brief(&ml_pool_reg_mu))
        return false;
    int free_slot = -1;
    for (int i = 0; i < 4 && !ok; i++) {
        if (ml_pool_fabs[i] == fab)
            ok = true;
        else if (!ml_pool_fabs[i] && free_slot < 0)
            free_slot = i;
    }
    if (!ok && free_slot >= 0) {
        ml_pool_fabs[free_slot] = fab;
        ok = true;
    }
    pthread_mutex_unlock(&ml_pool_reg_mu);
    if (!ok)
        return false;
    struct memlan_segment *evict = NULL;
    if (!ml_lock_brief(&fab->pool_mu))
        return false;
    if (fab->npool == ML_POOL_MAX) { /* keep the newest: drop the oldest */
        evict = fab->pool[0];
        memmove(&fab->pool[0], &fab->pool[1], (ML_POOL_MAX - 1) * sizeof evict);
        fab->npool--;
    }
    ch->seg->park_pid = me;
    fab->pool[fab->npool++] = ch->seg;
    pthread_mutex_unlock(&fab->pool_mu);
    if (evict && evict->owner && ml_chan_name_left(evict))
        evict->owner = false;
    __ml_seg_destroy(evict);
    return true;
}

void __ml_chan_pool_drain(memlan_fabric_t *fab)
{
    if (!fab || !ml_lock_bounded(&ml_pool_reg_mu))
        return;
    for (int i = 0; i < 4; i++)
        if (ml_pool_fabs[i] == fab)
            ml_pool_fabs[i] = NULL;
    pthread_mutex_unlock(&ml_pool_reg_mu);
    if (!ml_lock_bounded(&fab->pool_mu))
        return;
    int n = fab->npool, me = (int)__ml_sys_getpid();
    struct memlan_segment *segs[ML_POOL_MAX];
    memcpy(segs, fab->pool, (size_t)n * sizeof segs[0]);
    fab->npool = 0;
    pthread_mutex_unlock(&fab->pool_mu);
    for (int i = 0; i < n; i++) {
        if (segs[i]->park_pid != me || (segs[i]->owner && ml_chan_name_left(segs[i])))
            segs[i]->owner = false; /* a raw fork's parent's (ml_pool_take); or left */
        __ml_seg_destroy(segs[i]);
    }
}

/* _exit (the socket layer's): the parked files lose their names, as the drain at exit() removes
 * them; no memory is freed and no lock waited for (system calls only: async-signal-safe, and a
 * thread that holds the lock leaves them to the next sweep). */
void __ml_chan_pool_unname(memlan_fabric_t *fab)
{
    if (!fab || pthread_mutex_trylock(&fab->pool_mu) != 0)
        return;
    int me = (int)__ml_sys_getpid();
    for (int i = 0; i < fab->npool; i++)
        if (fab->pool[i]->park_pid == me && /* not a raw fork's parent's (ml_pool_take) */
            !(fab->pool[i]->owner && ml_chan_name_left(fab->pool[i])))
            __ml_seg_unname(fab->pool[i]);
    pthread_mutex_unlock(&fab->pool_mu);
}

/*
 * A private channel's file (acl.c): created 0600 even in a shared fabric, then given one ACL
 * entry per acceptor user before anyone can know its name.  A file system without ACLs gives
 * -EOPNOTSUPP (the file goes): the caller decides (design.md, "Fabric").
 */
static int ml_chan_new_private(memlan_fabric_t *fab, uint64_t rs, uint64_t g,
                               const struct ml_access *acc, struct memlan_segment **seg)
{
    int r = __ml_seg_create_private(fab, ML_KIND_CHANNEL, MEMLAN_MODE_RW,
                                    sizeof(struct ml_seg_hdr), ml_chan_body(rs, g), rs, seg);
    if (r < 0)
        return r;
    if (acc->n > 0 && (r = __ml_acl_private((*seg)->fd, acc->uids, (int)acc->n)) < 0) {
        __ml_seg_destroy(*seg); /* ours: unlinked */
        *seg = NULL;
        return r;
    }
    (*seg)->access = *acc;
    __ml_seg_drop_fd(*seg);
    return 0;
}

/* A stream channel for the socket layer: from the pool when one is free, else new. */
int __ml_chan_create_pooled(memlan_fabric_t *fab, size_t ring_size, size_t grow,
                            memlan_channel_t **out)
{
    return __ml_chan_create_pooled_for(fab, ring_size, grow, NULL, out);
}

/* grow: each ring's region (rounded up to a power of two; none unless above the ring's size). */
int __ml_chan_create_pooled_for(memlan_fabric_t *fab, size_t ring_size, size_t grow,
                                const struct ml_access *acc, memlan_channel_t **out)
{
    *out = NULL;
    if (!fab || ring_size < ML_MIN_RING || ring_size > ML_MAX_RING ||
        (acc && acc->n > ML_ACCESS_MAX) || grow > ML_MAX_GROW)
        return -EINVAL;
    /* No set given: the file is made as memlan_channel_create() makes it (group-wide in a
     * shared fabric).  A set given, even empty: private. */
    static const struct ml_access none;
    struct ml_access key = acc ? *acc : none;
    if (acc && fab->shared)
        key.n |= 0x80000000u; /* pooled apart from group-wide files */
    pthread_once(&ml_pool_once, ml_pool_atfork);
    uint64_t rs = ml_pow2_up(ring_size);
    uint64_t g = grow ? ml_pow2_up(grow) : 0;
    if (g <= rs)
        g = 0;
    struct memlan_channel *ch = calloc(1, sizeof *ch);
    if (!ch)
        return -ENOMEM;
    struct memlan_segment *seg = ml_pool_take(fab, rs, g, &key);
    if (!seg) {
        int r = acc && fab->shared ? ml_chan_new_private(fab, rs, g, acc, &seg)
                                   : ml_chan_new_seg(fab, rs, g, &seg);
        if (r == 0)
            seg->access = key;
        if (r < 0) {
            __ml_free(ch);
            return r;
        }
    }
    ml_chan_init(ch, seg, MEMLAN_STREAM, rs);
    ch->poolable = true;
    if (acc && fab->shared) { /* 0600 and the acceptors' ACL: they (and we) may write it */
        ch->posters_private = true;
        ch->posters = *acc;
    }
    ch->forks = ml_forks;
    __ml_seg_publish(seg);
    *out = ch;
    return 0;
}

uint32_t __ml_chan_generation(const struct memlan_channel *ch)
{
    return ml_load_relaxed(&ch->hdr->generation);
}

/* Is the channel still offered under name?  (Our attacher lock keeps a reuse out.) */
static bool ml_offered_as(const struct memlan_segment *seg, const char *name)
{
    const struct ml_offer_blk *ob = (const void *)(seg->base + ML_CHAN_OFFER_OFF);
    size_t n = strlen(name);
    uint32_t len = ml_load_relaxed((_Atomic uint32_t *)&ob->name_len);
    return len == n && n < sizeof ob->name && memcmp(ob->name, name, n) == 0;
}

/* Attach to an imported channel.  gen >= 0: only that generation; name: only if offered so. */
static int ml_chan_attach_seg(struct memlan_segment *seg, int64_t gen, const char *name,
                              memlan_channel_t **out)
{
    struct ml_chan_hdr *c = (struct ml_chan_hdr *)(seg->base + seg->body_off);
    /* The geometry was validated by the import; the kind is read once, here. */
    uint32_t kind = c->chan_kind;
    if ((kind != ML_CHAN_STREAM && kind != ML_CHAN_MSG) || c->ring_size != seg->mirror) {
        __ml_seg_destroy(seg);
        return -EPROTO;
    }
    /* Only one process may be side 1: the lock byte settles races between processes, the flag
     * the (rarer) race between two threads of one process that opened the file twice. */
    if (__ml_sys_lock_byte(seg->fd, ML_LOCK_ATTACHER, 0) < 0) {
        __ml_seg_destroy(seg);
        return -EBUSY;
    }
    /* A pooled channel: the offer was for this generation (checked under our lock, which the
     * creator needs to reuse the file). */
    if ((gen >= 0 && ml_load_acquire(&c->generation) != (uint32_t)gen) ||
        (name && !ml_offered_as(seg, name))) {
        __ml_seg_destroy(seg);
        return -ESTALE;
    }
    uint32_t zero = 0;
    if (!ml_cas(&c->attached, &zero, 1u)) {
        __ml_seg_destroy(seg);
        return -EBUSY;
    }
    if (ml_load_acquire(&c->side_state[0]) == ML_SIDE_CLOSED) {
        __ml_seg_destroy(seg);
        return -ECONNREFUSED;
    }
    struct memlan_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        __ml_seg_destroy(seg);
        return -ENOMEM;
    }
    c->side_pid[1] = (int32_t)__ml_pid();
    ml_store_relaxed(&c->attacher_uid1, (uint32_t)geteuid() + 1u);
    /* Who may write the file, for our event queue (evq.c): its owner and ACL say; a file the
     * group may write, or one we cannot read the ACL of, counts as the group's. */
    if (seg->fab->shared && seg->fd >= 0)
        ch->posters_private = __ml_acl_writers(seg->fd, &ch->posters) == 0;
    __ml_seg_drop_fd(seg); /* the lock lives on in the mappings */
    ch->kind = kind == ML_CHAN_MSG ? MEMLAN_MSG : MEMLAN_STREAM;
    ml_chan_bind(ch, seg, 1);
    /* Tell a creator that may be waiting in memlan_channel_wait_peer(): it waits on the producer
     * tripwire of its own sending ring, which is our receiving ring. */
    __ml_chan_wake(ch, &ch->rx.ctl->tx_wait, ch->rx_refs->tx);
    *out = ch;
    return 0;
}

#define ML_ANY_UID UINT32_MAX

/* Attach to token's channel; uid other than ML_ANY_UID: only if its file belongs to uid. */
static int ml_chan_attach(memlan_fabric_t *fab, const char *token, int64_t gen, uint32_t uid,
                          memlan_channel_t **out)
{
    if (!fab || !out)
        return -EINVAL;
    *out = NULL;
    struct memlan_segment *seg;
    int r = __ml_seg_import(fab, token, ML_KIND_CHANNEL, true, &seg);
    if (r < 0)
        return r;
    struct stat st;
    if (uid != ML_ANY_UID &&
        ((r = __ml_sys_fstat(seg->fd, &st)) < 0 || (uint32_t)st.st_uid != uid)) {
        __ml_seg_destroy(seg);
        return r < 0 ? r : -EACCES;
    }
    /* In a shared fabric the named endpoint's server takes only a channel its two ends alone
     * may write: a file the group, others or a third user may write would hand our side of the
     * connection to them (a client of an older libmemlan made 0666 files). */
    if (uid != ML_ANY_UID && fab->shared) {
        struct ml_access w;
        int k = __ml_acl_writers(seg->fd, &w);
        uint32_t me = (uint32_t)geteuid();
        for (uint32_t i = 0; k == 0 && i < w.n; i++)
            if (w.uids[i] != uid && w.uids[i] != me)
                k = 1;
        if (k != 0) {
            __ml_seg_destroy(seg);
            return k < 0 ? k : -EACCES;
        }
    }
    return ml_chan_attach_seg(seg, gen, NULL, out);
}

/* The named endpoint's server (endpoint.c): attach only a channel whose file belongs to uid,
 * the user the kernel says is at the other end of the rendezvous socket (SO_PEERCRED); a token
 * another user's process created is refused with -EACCES before anything of it is touched. */
int __ml_chan_attach_uid(memlan_fabric_t *fab, const char *token, uint32_t uid,
                         memlan_channel_t **out)
{
    return ml_chan_attach(fab, token, -1, uid, out);
}

/*
 * The socket layer's acceptor: fd is the channel's file opened by the offer's name (a second
 * name the client gave it; the fd is taken, closed on failure), st its fstat (or NULL).  The token comes from the offer
 * block, which the peer wrote: a wrong one names no file of ours, and every later look-up by
 * name checks the file's identity.
 */
int __ml_chan_attach_offer(memlan_fabric_t *fab, int fd, int fdb, const struct stat *st,
                           const char *name, memlan_channel_t **out)
{
    if (!fab || !out || fd < 0 || !name || !st) {
        if (fd >= 0)
            __ml_sys_close(fd);
        if (fdb >= 0)
            __ml_sys_close(fdb);
        return -EINVAL;
    }
    *out = NULL;
    struct memlan_segment *seg;
    int r = __ml_seg_import_cached(fab, fd, fdb, st, &seg);
    if (r < 0)
        return r;
    const struct ml_offer_blk *ob = (const void *)(seg->base + ML_CHAN_OFFER_OFF);
    memcpy(seg->token, ob->token, ML_TOKEN_HEX);
    seg->token[ML_TOKEN_HEX] = 0;
    if (!__ml_token_valid(seg->token)) {
        __ml_seg_destroy(seg);
        return -ESTALE; /* not offered (cleared by a reuse), or not a memlan client's */
    }
    return ml_chan_attach_seg(seg, -1, name, out);
}

int memlan_channel_attach(memlan_fabric_t *fab, const char *token, memlan_channel_t **out)
{
    return ml_chan_attach(fab, token, -1, ML_ANY_UID, out);
}

int __ml_chan_attach_gen(memlan_fabric_t *fab, const char *token, uint32_t gen,
                         memlan_channel_t **out)
{
    return ml_chan_attach(fab, token, (int64_t)gen, ML_ANY_UID, out);
}

/* ---- across exec (src/preload/exec.c) ----------------------------------------------------- */

/*
 * Before exec: a new open file of the channel, without close-on-exec, holding a read lock on our
 * side's bridge byte (see layout.h).  Exec takes our mappings and with them our liveness lock;
 * this file keeps the side alive until the new image maps the channel from it.  The fd, or
 * -errno; the caller closes it if exec fails.
 */
int __ml_chan_exec_bridge(struct memlan_channel *ch, int kept)
{
    long fd = __ml_seg_reopen(ch->seg, O_RDWR);
    /* Refused by name (credentials changed since: the preload kept the file open before the
     * change, cred.c): a duplicate of that open, without close-on-exec.  It shares that open's
     * locks, so a failed exec's close of it leaves the bridge byte held until the kept fd's
     * close at the socket's; the side is alive then anyway. */
    if ((fd == -EACCES || fd == -EPERM) && kept > 0)
        fd = __ml_sys_fcntl_dupfd(kept, 0, false);
    if (fd < 0)
        return (int)fd;
    int r = __ml_sys_lock_byte_shared((int)fd, ML_LOCK_BRIDGE(ch->side));
    if (r < 0) {
        __ml_sys_close((int)fd);
        return r;
    }
    return (int)fd;
}

/* A connection passed to us over SCM_RIGHTS (the preload's mlp_take_passed): the channel's file
 * opened by its token, with a read lock on side's bridge byte, as __ml_chan_exec_bridge's for
 * __ml_chan_adopt. */
int __ml_chan_bridge_open(memlan_fabric_t *fab, const char *token, int side)
{
    if (!fab || (side != 0 && side != 1) || !__ml_token_valid(token))
        return -EINVAL;
    char name[80];
    __ml_fabric_name(name, sizeof name, "seg", token);
    long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0)
        return fd == -ELOOP ? -EPROTO : (int)fd;
    int r = __ml_sys_lock_byte_shared((int)fd, ML_LOCK_BRIDGE(side));
    if (r < 0) {
        __ml_sys_close((int)fd);
        return r;
    }
    return (int)fd;
}

/* After exec: side's channel again, mapped from the bridge file fd (taken: closed on failure;
 * on success the mapping keeps the file and its bridge lock). */
int __ml_chan_adopt(memlan_fabric_t *fab, const char *token, int fd, int side,
                    memlan_channel_t **out)
{
    *out = NULL;
    if (side != 0 && side != 1) {
        __ml_sys_close(fd);
        return -EINVAL;
    }
    struct memlan_segment *seg;
    int r = __ml_seg_import_fd(fab, token, fd, ML_KIND_CHANNEL, true, NULL, &seg);
    if (r < 0)
        return r;
    struct ml_chan_hdr *c = (struct ml_chan_hdr *)(seg->base + seg->body_off);
    uint32_t kind = c->chan_kind;
    if ((kind != ML_CHAN_STREAM && kind != ML_CHAN_MSG) || c->ring_size != seg->mirror ||
        ml_load_acquire(&c->attached) != 1) {
        __ml_seg_destroy(seg);
        return -EPROTO;
    }
    struct memlan_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        __ml_seg_destroy(seg);
        return -ENOMEM;
    }
    seg->owner = side == 0; /* the creator's side removes the name when it closes */
    if (fab->shared) /* as at attach: who may write the file (evq.c) */
        ch->posters_private = __ml_acl_writers(seg->fd, &ch->posters) == 0;
    __ml_seg_drop_fd(seg);
    ch->peer_seen = true; /* attached was 1 (checked above) */
    ch->kind = kind == ML_CHAN_MSG ? MEMLAN_MSG : MEMLAN_STREAM;
    ml_chan_bind(ch, seg, side);
    uint32_t mine = ml_load_relaxed(&c->side_state[side]);
    ch->shut_wr = mine != ML_SIDE_OPEN;
    *out = ch;
    return 0;
}

const char *memlan_channel_token(const memlan_channel_t *ch) { return ch ? ch->seg->token : NULL; }

size_t memlan_channel_max_msg(const memlan_channel_t *ch)
{
    if (!ch)
        return 0;
    /* A record, and the next record's header slot, which the producer keeps zeroed (ring.h). */
    return ch->kind == MEMLAN_MSG ? ch->size - 2 * sizeof(struct ml_msg_hdr) : ch->size;
}

int memlan_channel_kind(const memlan_channel_t *ch)
{
    return ch ? (int)ch->kind : -EINVAL;
}

int memlan_channel_set_timeout(memlan_channel_t *ch, int recv_ms, int send_ms)
{
    if (!ch || recv_ms < -1 || recv_ms == 0 || send_ms < -1 || send_ms == 0)
        return -EINVAL;
    ch->rx_tmo_ns = recv_ms < 0 ? 0 : (uint64_t)recv_ms * 1000000u;
    ch->tx_tmo_ns = send_ms < 0 ? 0 : (uint64_t)send_ms * 1000000u;
    return 0;
}

/* ---- liveness and state ------------------------------------------------------------------ */

static uint32_t ml_peer_state(const struct memlan_channel *ch)
{
    /* SYNC: pairs with the release store of side_state in ml_set_state(): every byte the peer
     * produced before it shut down is visible once we see the state. */
    return ml_load_acquire(&ch->hdr->side_state[1 - ch->side]);
}

/*
 * The peer's side was passed over SCM_RIGHTS (ML_SOCK_PASSED) and its lock is free: the passer is
 * gone, and the receiver, which holds the kernel socket, may not have taken the side up yet (it
 * takes it at its first call on the descriptor: one that waits for its passer's end first, as
 * tests/preload/passend.c passerexit, looks a moment after the lock went).  The passer keeps its
 * record for such a receiver when the pass is younger than ML_LIVENESS_MAX_NS (src/preload,
 * "Passing a connection"), so the side is given as long from the first look since its last pass
 * that finds its lock free, on our own clock, unless its receiver is seen writing to the kernel
 * socket.  True while that lasts (the caller then does not take the peer for dead).  Before, the
 * first look after the passer's end declared the side dead, and a receiver that took it up a
 * moment later wrote to a peer that read the end of stream: its bytes were lost without a word
 * (1 run in 7 of passerexit).  A peer that sets the flag, or counts passes, without passing gains
 * no more than it would by holding its lock: nothing here loops or waits.
 */
static bool ml_passed_grace(struct memlan_channel *ch, struct ml_sock_side *sides)
{
    struct ml_sock_side *peer = &sides[1 - ch->side];
    /* (open, or shut down for writing: its receiver may still read; never closed here) */
    if (!(ml_load_relaxed(&peer->flags) & ML_SOCK_PASSED)) {
        ml_store_relaxed(&ch->passed_free_ns, 0);
        return false;
    }
    /* Bytes on the kernel socket: the receiver writes there, so it did not take the side up and
     * never will (a seccomp sandbox, another user's record, a program without memlan). */
    if (ch->sock_ino && __ml_sys_socket_data(ch->sock_fd, ch->sock_ino) == 1)
        return false;
    /* One thread of ours at a time (another's look meanwhile is no death: it looks again at its
     * next interval): the clock and the count move together, and the end, once decided, is
     * ch->peer_dead before another thread could take the flag below back (a review). */
    if (atomic_exchange(&ch->passed_busy, true))
        return true;
    bool grace = true;
    /* Counted from the first free look since the side's last pass: a receiver that took it up
     * and passed it on between two of our looks (up to a second apart) gets its own second, not
     * what was left of its passer's (a review: the chain's second receiver, 0.9 s after its
     * passer's end, was read as the end). */
    uint32_t gen = ml_load_relaxed(&peer->passes);
    uint64_t t = ml_load_relaxed(&ch->passed_free_ns), now = __ml_now_ns();
    if (!t || gen != ml_load_relaxed(&ch->passed_gen)) {
        ml_store_relaxed(&ch->passed_gen, gen);
        ml_store_relaxed(&ch->passed_free_ns, now ? now : 1);
    } else if (now - t >= ML_LIVENESS_MAX_NS) {
        /* Ended, as far as our side is concerned, where our process holds it alone: said in our
         * side first, then the lock asked once more.  A receiver that takes the side up later
         * finds the flag and says the connection lost (src/preload, mlp_adopt_conn), rather than
         * write to us unread; one that took it up meanwhile holds the lock, and the flag goes
         * back.  seq_cst, and the receiver's lock is taken before it reads the flag: one of the
         * two sees the other.  A side other processes share (fork children) is not ended for
         * them by our look: no flag then, our end alone (a review: a child's timed-out recv
         * ended the connection for its parent, which read the end where kernel TCP gave it the
         * receiver's bytes). */
        bool alone = ml_load_relaxed(&sides[ch->side].holders) <= 1;
        if (alone)
            atomic_fetch_or(&sides[ch->side].flags, ML_SOCK_PASSED_GONE);
        atomic_thread_fence(memory_order_seq_cst);
        if (__ml_seg_alive(ch->seg, ch->side == 0 ? ML_LOCK_ATTACHER : ML_LOCK_OWNER) == 1) {
            if (alone)
                atomic_fetch_and(&sides[ch->side].flags, ~ML_SOCK_PASSED_GONE);
            ml_store_relaxed(&ch->passed_free_ns, 0);
        } else {
            ch->peer_dead = true;
            grace = false;
        }
    }
    atomic_store(&ch->passed_busy, false);
    return grace;
}

/* In a fork child, whose only thread is the one that forked: a thread of the parent's that was
 * inside ml_passed_grace's look (a few microseconds between its exchange and its store) left
 * the flag set, and the child's every look would answer "in grace" for good. */
void __ml_chan_after_fork(struct memlan_channel *ch) { atomic_store(&ch->passed_busy, false); }

/* Is the peer gone (died, or the segment was torn down)?  Makes a system call: slow path only. */
static bool ml_peer_dead(struct memlan_channel *ch)
{
    if (ch->peer_dead)
        return true;
    if (ml_load_acquire(&ch->seg->hdr->state) != ML_SEG_LIVE) {
        ch->peer_dead = true;
        return true;
    }
    /* The attached word is the peer's to write, so it is believed once: after it has read 1 a
     * peer that writes 0 over it cannot hide its death from us (we would wait for ever).  Any
     * value but 0, 1 and ML_ATTACH_WITHDRAWN cannot come from the protocol (attach is a CAS from
     * 0): the channel is broken. */
    if (ch->side == 0 && !ch->peer_seen) {
        uint32_t at = ml_load_acquire(&ch->hdr->attached);
        if (at == 0)
            return false; /* nobody attached yet: nothing to be dead */
        if (at != 1 && at != ML_ATTACH_WITHDRAWN) {
            ch->peer_dead = true;
            return true;
        }
        ch->peer_seen = true;
    }
    int alive = __ml_seg_alive(ch->seg, ch->side == 0 ? ML_LOCK_ATTACHER : ML_LOCK_OWNER);
    /* A socket's peer that called exit() took the file's name away with its connections still
     * working (ML_SOCK_UNNAMED, set while its side is open, or shut down with ours shut down or
     * closed too, when nothing here depends on its liveness): a missing name is no death then,
     * its kernel socket tells (below).  So too when our own process did (our flag): its
     * other threads and glibc's last flush of stdio still send and wait after that, and a look
     * by name would take a live peer for dead (tests/preload/exitrace.c, "flush").  A hostile
     * peer that sets either flag gains nothing: it decides when its kernel socket ends anyway. */
    struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
    bool unnamed = alive == 0 && ch->sock_ino &&
                   ((ml_load_relaxed(&sides[1 - ch->side].flags) |
                     ml_load_relaxed(&sides[ch->side].flags)) &
                    ML_SOCK_UNNAMED);
    if (unnamed)
        alive = -1;
    if (alive == 0 && ml_peer_state(ch) != ML_SIDE_CLOSED && !ml_passed_grace(ch, sides))
        ch->peer_dead = true;
    if (alive != 0)
        ml_store_relaxed(&ch->passed_free_ns, 0);
    /* The lock cannot be asked: the file must be opened by name, which a process that changed
     * its credentials (EACCES) or sandboxed itself (seccomp) may no longer do.  The kernel
     * socket under the channel tells instead: the peer's process holds its end as long as it
     * lives, so a FIN or reset from a peer that never shut down over the channel is its death
     * (a peer that shuts down or closes says so in its side state first). */
    uint32_t ps = ml_peer_state(ch);
    if (alive < 0 && ch->sock_ino &&
        (ps == ML_SIDE_OPEN ||
         /* it shut down after it took the name, and left the kernel socket's FIN to its end
          * (whether we found no name or could not ask: credentials, a sandbox) */
         (ps == ML_SIDE_SHUT_WR &&
          (ml_load_relaxed(&sides[1 - ch->side].flags) & ML_SOCK_LATE_FIN))) &&
        /* after our own SHUT_RD poll says RDHUP for it: the connection's state tells */
        (ch->rd_eof_when_empty ? __ml_sys_socket_peer_fin(ch->sock_fd, ch->sock_ino)
                               : __ml_sys_socket_hup(ch->sock_fd, ch->sock_ino)) == 1)
        ch->peer_dead = true;
    /* Bytes on the kernel socket under an accelerated connection: nothing of memlan's ever
     * writes there, so the peer talks TCP (it settled on TCP while we read the ring: a split
     * made by garbage in the attached word, or a peer process without memlan writing to the
     * socket).  Waiting for the ring would be for ever on both sides; the connection is
     * broken, as a reset (the bytes stay in the kernel socket, never read out of order).  Only
     * once the bytes have been there for a second with the peer's side still open: a peer that
     * wrote a stray byte there and then closed ends by its close, as it did before. */
    if (!ch->peer_dead && ch->sock_ino && ml_peer_state(ch) == ML_SIDE_OPEN) {
        if (__ml_sys_socket_data(ch->sock_fd, ch->sock_ino) != 1) {
            ch->split_ns = 0;
        } else {
            uint64_t now = __ml_now_ns();
            if (!ch->split_ns) {
                ch->split_ns = now;
            } else if (now - ch->split_ns >= ML_LIVENESS_MAX_NS) {
                ch->split = true;
                ch->peer_dead = true;
            }
        }
    }
    return ch->peer_dead;
}

/*
 * The peer's queue is out of our reach (its file refused us: this thread changed its credentials
 * alone, with setfsuid or a raw system call that no interposer sees, or another thread changed
 * them back while this one kept the old ones): our posts cannot wake it, so it must not sleep on
 * its queue for us.  ML_SOCK_NOPOST says so, as a credential change seen by the preload does
 * (src/preload/cred.c), and the peer's sleep, at most its liveness interval, finds it.  Before,
 * the peer slept its whole liveness interval (100 ms to 1 s) for every wake-up we owed it.
 */
static void ml_chan_nopost(struct memlan_channel *ch)
{
    struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
    if (!(ml_load_relaxed(&sides[ch->side].flags) & ML_SOCK_NOPOST) &&
        !(atomic_fetch_or(&sides[ch->side].flags, ML_SOCK_NOPOST) & ML_SOCK_NOPOST)) {
        ml_store_relaxed(&ch->nopost_try_ns, __ml_now_ns());
        ml_store_relaxed(&ch->nopost_mine, true);
    }
}

/*
 * The flag ml_chan_nopost set is taken back once our posts reach the peer's queues again (the
 * thread whose fsuid changed changed it back, or another thread imports them): a peer told
 * ML_SOCK_NOPOST naps every millisecond, and its process's epoll waits with it, for as long as
 * the flag stands (about 900 wake-ups a second, for good, after one refused post: a review).
 * The peer no longer arms its queue for us, so no wake-up of ours would try again: a send does,
 * at most once a second, posting to every queue the peer registered (a wake-up for nothing is
 * allowed).  One refused: the flag stays.  A handler's send does not (an import allocates).
 */
void __ml_chan_nopost_retry(struct memlan_channel *ch)
{
    uint64_t now = __ml_now_ns(), t = ml_load_relaxed(&ch->nopost_try_ns);
    if (now - t < 1000000000u || __ml_sig_depth != 0 ||
        !atomic_compare_exchange_strong(&ch->nopost_try_ns, &t, now))
        return;
    for (uint32_t i = 0; i < ML_EVQ_REFS; i++)
        if (__ml_evq_post_ref(ch->seg->fab, &ch->tx_refs->rx[i], &ch->peer_evq_hint[i]) < 0 ||
            __ml_evq_post_ref(ch->seg->fab, &ch->rx_refs->tx[i], &ch->peer_evq_hint[i]) < 0)
            return;
    if (atomic_exchange(&ch->nopost_mine, false)) {
        struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
        atomic_fetch_and(&sides[ch->side].flags, ~ML_SOCK_NOPOST);
    }
}

/* ---- SIGIO (O_ASYNC) for a channel's bytes (design.md, "SIGIO") ----------------------- */

/* The socket layer's: whether this thread's wait is a blocking receive's (ML_WAIT_RECV); a hook,
 * so that the library keeps no thread-local storage of its own (it needs nothing but libc). */
bool (*__ml_wait_recv)(void);

/* A blocking receive is over, however it ended: its ML_WAIT_RECV goes (left by a sleep that
 * ended without the waker, a timeout or a slice's end, it held back the next signal: the third
 * review).  Another receive asleep on the word loses it too: a signal it would not have had. */
void __ml_chan_recv_awake(struct memlan_channel *ch)
{
    if (ml_load_relaxed(&ch->rx.ctl->rx_wait) & ML_WAIT_RECV)
        ml_fetch_and(&ch->rx.ctl->rx_wait, ~ML_WAIT_RECV);
}

/* sioS-TOKEN: side S's FIFO for SIGIO (O_ASYNC); urgS-TOKEN: for SIGURG (an owner set). */
static void ml_sio_name(char *buf, size_t len, const struct memlan_channel *ch, int side, bool urg)
{
    static const char *const pre[2][2] = {{"sio0", "sio1"}, {"urg0", "urg1"}};
    __ml_fabric_name(buf, len, pre[urg][side != 0], ch->seg->token);
}

/* The preload's: a ring that could not reach the peer's FIFO (-errno), said once per process. */
void (*__ml_sio_missed)(struct memlan_channel *ch, bool urg, int err);

static void ml_sio_miss(struct memlan_channel *ch, bool urg, int err)
{
    __atomic_fetch_add(&ch->sio_missed, 1, __ATOMIC_RELAXED);
    if (__ml_sio_missed)
        __ml_sio_missed(ch, urg, err);
}

/* The peer's FIFO (urg: its SIGURG one), opened by name: read-write where we may (its user, or
 * one its ACL names), so that we read our byte back and it never fills; write-only else. */
static long ml_sio_open_peer(struct memlan_channel *ch, bool urg, bool *rd)
{
    char name[80];
    ml_sio_name(name, sizeof name, ch, 1 - ch->side, urg);
    int dirfd = ch->seg->fab->dirfd;
    long fd = __ml_sys_open(dirfd, name, O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
    *rd = fd >= 0;
    if (fd == -EACCES)
        fd = __ml_sys_open(dirfd, name, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
    return fd;
}

/* The peer asked for SIGIO (its ML_WAIT_SIGIO; or SIGURG, ML_SOCK_SIGURG, for an urgent
 * byte): a byte to its FIFO raises it, through the kernel, with the owner and signal its socket
 * has.  The FIFO is opened at the first ring and kept (one of our fds, ch->sio_ring_fd, once
 * sio_ring_st is 2; a ring while another thread opens it opens one of its own), so that a
 * ring costs a write and the read that takes the byte back (a kernel before 5.14 signals only a
 * write into an empty pipe), and a process that changed its credentials or reached its fd limit
 * since still rings.  Where it cannot be opened, said once per process (__ml_sio_missed).  The
 * word is the peer's to write: a peer that sets the bit without a FIFO costs itself our failed
 * opens, nothing else. */
void __ml_chan_sig_ring(struct memlan_channel *ch, bool urg)
{
    int fd = -1, own = -1;
    bool rd = false;
    int st = __atomic_load_n(&ch->sio_ring_st[urg], __ATOMIC_ACQUIRE), zero = 0;
    /* (3: dropped, the channel ending: a last ring opens one of its own, kept nowhere) */
    if (st == 0 && __atomic_compare_exchange_n(&ch->sio_ring_st[urg], &zero, 1, false,
                                               __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        long f = ml_sio_open_peer(ch, urg, &rd);
        if (f < 0) {
            __atomic_store_n(&ch->sio_ring_st[urg], 0, __ATOMIC_RELEASE); /* tried again */
            ml_sio_miss(ch, urg, (int)-f);
            return;
        }
        ch->sio_ring_rd[urg] = rd;
        ch->sio_ring_fd[urg] = (int)f;
        if (__ml_fd_keep) /* at our high numbers, ours (where it moves, the field follows) */
            __ml_fd_keep(&ch->sio_ring_fd[urg]);
        __atomic_store_n(&ch->sio_ring_st[urg], 2, __ATOMIC_RELEASE);
        st = 2;
    }
    if (st == 2) {
        fd = __atomic_load_n(&ch->sio_ring_fd[urg], __ATOMIC_RELAXED);
        rd = ch->sio_ring_rd[urg];
    }
    if (fd < 0) { /* another thread opens it: one of our own this time */
        long f = ml_sio_open_peer(ch, urg, &rd);
        if (f < 0) {
            ml_sio_miss(ch, urg, (int)-f);
            return;
        }
        own = fd = (int)f;
    }
    char b = 1, back[64];
    ssize_t n = __ml_sys_write_nosigpipe(fd, &b, 1);
    if (n == 1)
        __atomic_fetch_add(&ch->sio_rings, 1, __ATOMIC_RELAXED);
    else
        ml_sio_miss(ch, urg, (int)-n);
    if (rd)
        (void)__ml_sys_read(fd, back, sizeof back);
    if (own >= 0)
        __ml_sys_close(own);
}

/* Our fds on the peer's FIFOs, kept from the first ring, go with the channel. */
void __ml_chan_sio_drop(struct memlan_channel *ch)
{
    for (int i = 0; i < 2; i++) {
        /* 3: no ring after this keeps an fd (the end's own wake-up rang after the drop, and
         * kept an fd whose record pointed into the freed channel: a review) */
        int st = __atomic_exchange_n(&ch->sio_ring_st[i], 3, __ATOMIC_ACQ_REL);
        int fd = st == 2 ? ch->sio_ring_fd[i] : -1;
        if (fd >= 0) {
            if (__ml_fd_drop)
                __ml_fd_drop(fd);
            __ml_sys_close(fd);
        }
    }
}

/* Our socket asked for SIGIO (or has an owner, for SIGURG: urg): our FIFO, made, or taken as it
 * is where the name holds a FIFO of our user's (another holder of our side made it: a process
 * that execs, a fork child's system(), a receiver over SCM_RIGHTS; replaced, the others' read
 * ends were left on an unnamed FIFO that the peer no longer rang: a review); its read end is
 * returned (the caller gives it the socket's owner and O_ASYNC, then arms), with a write end
 * in *wfd for the caller to keep as long, or -errno.  The peer may write and read it (its user
 * and the users the channel's file names; everyone where the file is group-wide); nobody
 * else. */
int __ml_chan_sio_open(struct memlan_channel *ch, bool urg, int *wfd)
{
    *wfd = -1;
    memlan_fabric_t *fab = ch->seg->fab;
    char name[80];
    ml_sio_name(name, sizeof name, ch, ch->side, urg);
    bool made = true;
    int r = __ml_sys_mknodat(fab->dirfd, name, S_IFIFO | 0600);
    if (r == -EEXIST) {
        struct stat st;
        made = false;
        r = __ml_sys_fstatat(fab->dirfd, name, &st, AT_SYMLINK_NOFOLLOW);
        if (r == 0 && (!S_ISFIFO(st.st_mode) || st.st_uid != geteuid())) {
            /* not ours: replaced where we may (the directory's sticky bit keeps others' own) */
            made = true;
            r = __ml_sys_unlinkat(fab->dirfd, name, 0);
            if (r == 0)
                r = __ml_sys_mknodat(fab->dirfd, name, S_IFIFO | 0600);
        }
    }
    if (r < 0)
        return r;
    struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
    ml_fetch_or(&sides[ch->side].flags, ML_SOCK_SIO);
    /* The read end (its signal), and a write end of ours that keeps the FIFO from ever losing
     * its last writer: a ringer's close would otherwise raise a second signal (the pipe's
     * release signals a reader left without writers), and a read end opened read-write would
     * get POLL_OUT's signal at every read-back.  Seen: two signals per ring. */
    long fd = __ml_sys_open(fab->dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
    long w = fd < 0 ? fd
                    : __ml_sys_open(fab->dirfd, name,
                                    O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
    if (w < 0 && fd >= 0) {
        __ml_sys_close((int)fd);
        fd = w;
    }
    *wfd = fd < 0 ? -1 : (int)w;
    struct stat st;
    if (fd >= 0 && made && fab->shared && __ml_sys_fstat((int)fd, &st) == 0) {
        uint32_t u[ML_ACCESS_MAX];
        int n = 0;
        for (uint32_t i = 0; ch->posters_private && i < ch->posters.n; i++)
            if (ch->posters.uids[i] != (uint32_t)st.st_uid)
                u[n++] = ch->posters.uids[i];
        r = ch->posters_private ? __ml_acl_private((int)fd, u, n) : -EOPNOTSUPP;
        if (r == -EOPNOTSUPP && (!ch->posters_private || n == 0))
            r = __ml_sys_fchmod((int)fd, ch->posters_private ? 0600 : 0666);
        if (r < 0) {
            __ml_sys_close((int)fd);
            __ml_sys_close(*wfd);
            *wfd = -1;
            fd = r;
        }
    }
    if (fd < 0 && made)
        (void)__ml_sys_unlinkat(fab->dirfd, name, 0);
    return (int)fd;
}

/* The channel's file loses its name (our close, our exit, the pool): its sides' FIFOs go with
 * it, where a side made one (its flags say so: no system call for a channel without). */
void __ml_chan_sio_names_gone(struct memlan_channel *ch)
{
    struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
    for (int side = 0; side < 2; side++) {
        uint32_t f = ml_load_relaxed(&sides[side].flags);
        for (int urg = 0; urg < 2; urg++)
            if (f & (ML_SOCK_SIO | ML_SOCK_SIGURG)) {
                char name[80];
                ml_sio_name(name, sizeof name, ch, side, urg);
                (void)__ml_sys_unlinkat(ch->seg->fab->dirfd, name, 0);
            }
    }
}

/* Arm (or disarm) our data tripwire's SIGIO bit: the peer rings our FIFO at each publication
 * from now on (until disarmed).  Disarmed, a pending ring for room goes too. */
void __ml_chan_sio_arm(struct memlan_channel *ch, bool on)
{
    if (on) {
        ml_fetch_or(&ch->rx.ctl->rx_wait, ML_WAIT_SIGIO);
    } else if (ml_load_relaxed(&ch->rx.ctl->rx_wait) & ML_WAIT_SIGIO) { /* (F_SETFL's calls) */
        ml_fetch_and(&ch->rx.ctl->rx_wait, ~ML_WAIT_SIGIO);
        if (ml_load_relaxed(&ch->tx.ctl->tx_wait) & ML_WAIT_SIGIO)
            ml_fetch_and(&ch->tx.ctl->tx_wait, ~ML_WAIT_SIGIO);
    }
}

/* Our own FIFO rung by us: room came between our send's "full" and the arming below. */
static void ml_sio_ring_own(struct memlan_channel *ch)
{
    char name[80], b = 1, back[64];
    ml_sio_name(name, sizeof name, ch, ch->side, false);
    long fd = __ml_sys_open(ch->seg->fab->dirfd, name,
                            O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        ml_sio_miss(ch, false, (int)-fd);
        return;
    }
    ssize_t n = __ml_sys_write_nosigpipe((int)fd, &b, 1);
    if (n == 1)
        (void)__ml_sys_read((int)fd, back, sizeof back);
    else
        ml_sio_miss(ch, false, (int)-n);
    __ml_sys_close((int)fd);
}

/* Room worth POLL_OUT's signal, as the kernel's (sk_stream_is_writeable: free space half of
 * what is queued, or more) gives it for a read of a few percent of a full buffer, but not for
 * the one of 100 bytes (a ring at every release sent a signal per read: a review): 64 KiB, or
 * half a smaller ring.  Counted against the ring and its region (a grown ring's 4 MiB: half of
 * the ring alone held the signal back until all but 128 KiB were read: the second review). */
static uint64_t ml_sio_room_want(const struct ml_ring *r)
{
    return r->size / 2 < (64u << 10) ? r->size / 2 : (64u << 10);
}

/* ... from the consumer's side: what it has not read yet, against the ring's capacity */
static bool ml_sio_roomy_rx(const struct memlan_channel *ch)
{
    int64_t a = __ml_chan_rx_avail_ro(ch);
    return a >= 0 && (uint64_t)a + ml_sio_room_want(&ch->rx) <= ch->rx.cap;
}

/* Both sides open for writing (after our shutdown the kernel raises no POLL_OUT; a side that
 * ends has its end's signal already). */
static bool ml_sio_sides_open(const struct memlan_channel *ch)
{
    return ml_load_acquire(&ch->hdr->side_state[0]) == ML_SIDE_OPEN &&
           ml_load_acquire(&ch->hdr->side_state[1]) == ML_SIDE_OPEN;
}

/* The socket layer's nonblocking send (its program's: O_NONBLOCK or MSG_DONTWAIT; not the passes
 * of a blocking send, which the kernel does not signal for here) found the ring full (EAGAIN, or
 * cut short) on a socket with O_ASYNC (our data tripwire's SIGIO bit): as the kernel's
 * sk_stream_wait_memory sets SOCKWQ_ASYNC_NOSPACE, so that room made later raises SIGIO (POLL_OUT)
 * once, the same bit in our room tripwire has the consumer's release ring our FIFO once there is
 * room worth it (ml_sio_room_want; __ml_chan_wake_slow).  Without it a program that waits for
 * SIGIO to write on waited for ever.  Room made before the bit could be seen: we ring ourselves.
 * O_ASYNC cleared meanwhile: the bit is taken back (a review saw 3 to 11 signals in 1000 races
 * after the clear). */
void __ml_chan_sio_room(struct memlan_channel *ch)
{
    if (ml_likely(!(ml_load_relaxed(&ch->rx.ctl->rx_wait) & ML_WAIT_SIGIO)) || ch->shut_wr ||
        !ml_sio_sides_open(ch))
        return;
    ml_mb_policy(ch, &ch->tx, &ch->tx.ctl->tx_mb, &ch->tx.ctl->tx_mb_ack);
    ml_fetch_or(&ch->tx.ctl->tx_wait, ML_WAIT_SIGIO);
    ml_fence(); /* SYNC: pairs with the fence in __ml_chan_wake() */
    if (ml_mb_needed(&ch->tx.ctl->tx_mb, &ch->tx.ctl->tx_mb_ack))
        (void)ml_mb_barrier(ch, NULL, &ch->rx.ctl->rx_mb_ack, &ch->tx.ctl->tx_mb,
                            &ch->tx.ctl->tx_mb_ack);
    bool off = !(ml_load_relaxed(&ch->rx.ctl->rx_wait) & ML_WAIT_SIGIO);
    int64_t fr = __ml_chan_tx_free_ro(ch);
    if ((off || (fr >= 0 && (uint64_t)fr >= ml_sio_room_want(&ch->tx))) &&
        (ml_fetch_and(&ch->tx.ctl->tx_wait, ~ML_WAIT_SIGIO) & ML_WAIT_SIGIO) && !off)
        ml_sio_ring_own(ch); /* (not the consumer's ring: it took the bit first) */
}

/* Our side's last holder lets go: the FIFO's name goes (the fabric's sweep removes it too, once
 * the channel's file is gone). */
void __ml_chan_sio_unlink(struct memlan_channel *ch, bool urg)
{
    if (!urg)
        __ml_chan_sio_arm(ch, false);
    char name[80];
    ml_sio_name(name, sizeof name, ch, ch->side, urg);
    (void)__ml_sys_unlinkat(ch->seg->fab->dirfd, name, 0);
}

/* A post to slot i was refused: the peer must not sleep on that queue for us any more. */
static void ml_chan_unreach(struct memlan_channel *ch, uint32_t i)
{
    struct ml_sock_side *me = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF) + ch->side;
    if (ml_load_relaxed(&me->reach[i / 4]) & (0xffu << (8 * (i % 4))))
        ml_fetch_and(&me->reach[i / 4], ~(0xffu << (8 * (i % 4))));
}

void __ml_chan_wake_slow(struct memlan_channel *ch, _Atomic uint32_t *word,
                         const struct ml_evq_ref *refs)
{
    /* The word is a set of waiters: threads blocked in the library (futex) and the event queues
     * that poll and epoll sleep on, one bit per registration slot, can all wait on one direction
     * (a blocked recv and a poll of the same socket from another thread; a parent's epoll set
     * and its fork child's poll); each gets its wake-up.  Bits past the slots (a peer's
     * garbage) name nothing. */
    /* The data tripwire's SIGIO bit is the consumer's own to clear; the room tripwire's
     * (__ml_chan_sio_room) rings once, when there is room worth it (kept till then: a ring at
     * every release sent a signal per read of the peer's, each met by EAGAIN: a review), and
     * not once either side stopped writing. */
    bool room = true, txw = word == &ch->rx.ctl->tx_wait;
    if (txw && (ml_load_relaxed(word) & ML_WAIT_SIGIO))
        room = !ml_sio_sides_open(ch) || ml_sio_roomy_rx(ch);
    uint32_t w = ml_fetch_and(word, txw && room ? 0 : ML_WAIT_SIGIO);
    if (txw && (w & ML_WAIT_SIGIO) && !ml_sio_sides_open(ch))
        w &= ~ML_WAIT_SIGIO;
    if (w & ML_WAIT_FUTEX) {
        __ml_sys_futex_wake(word, INT32_MAX);
        ch->wakeups++;
    }
    /* A blocking receive asleep on the word (ML_WAIT_RECV; not a poll's or select's sleep on
     * it, which the kernel signals: the third review) takes what comes without a signal, as the
     * kernel's sk_wait_data holds it back (SOCKWQ_ASYNC_WAITDATA); the bit goes with this very
     * wake-up, so a receive that never came back (a longjmp out of a handler, a cancellation)
     * holds back one signal, not all the later ones (the second review). */
    if ((w & ML_WAIT_SIGIO) && !(w & ML_WAIT_RECV) && room)
        __ml_chan_sig_ring(ch, false);
    if (w & ML_WAIT_EVQ_ANY) {
        for (uint32_t i = 0; i < ML_EVQ_REFS; i++)
            if ((w & ML_WAIT_EVQ_REF(i)) &&
                __ml_evq_post_ref(ch->seg->fab, &refs[i], &ch->peer_evq_hint[i]) < 0) {
                ml_chan_unreach(ch, i);
                ml_chan_nopost(ch);
            }
        ch->wakeups++;
    }
}

/* Post to every queue the peer registered, armed or not (src/preload/cred.c: before a
 * credential change, so that each stays mapped in our cache, and after it, to wake a peer that
 * must look at the flag).  prime: note, privately, the tag of each slot whose queue both posts
 * reached (0 for the others), for __ml_chan_publish_reach. */
void __ml_chan_post_peer_refs(struct memlan_channel *ch, bool prime)
{
    for (uint32_t i = 0; i < ML_EVQ_REFS; i++) {
        struct ml_evq_ref r;
        memcpy(&r, &ch->tx_refs->rx[i], sizeof r);
        uint8_t seen = r.valid == ML_REF_VALID ? (uint8_t)__ml_evq_ref_tag(&r) : 0;
        int a = __ml_evq_prime_ref(ch->seg->fab, &ch->tx_refs->rx[i], &ch->peer_evq_hint[i]);
        int b = __ml_evq_prime_ref(ch->seg->fab, &ch->rx_refs->tx[i], &ch->peer_evq_hint[i]);
        if (prime) { /* relaxed atomics: two threads' changes at once */
            __atomic_store_n(&ch->reach_tag[i], a > 0 && a == b ? (uint8_t)a : 0,
                             __ATOMIC_RELAXED);
            __atomic_store_n(&ch->tried_tag[i], seen, __ATOMIC_RELAXED);
        }
    }
}

/* Has the peer registered a queue since our last priming (ssh's client waited for sshd's
 * banner in a blocking read, with no queue, when sshd's first change primed)?  A priming again
 * posts to every registration, and wakes the peer for nothing once.  A registration that
 * priming tried and could not reach (a dead queue's; a peer's garbage) is not tried again at
 * every change: a server that toggles its euid per request would open its file each time. */
bool __ml_chan_peer_refs_new(struct memlan_channel *ch)
{
    for (uint32_t i = 0; i < ML_EVQ_REFS; i++) {
        struct ml_evq_ref r;
        memcpy(&r, &ch->tx_refs->rx[i], sizeof r);
        if (r.valid == ML_REF_VALID &&
            __ml_evq_ref_tag(&r) != __atomic_load_n(&ch->tried_tag[i], __ATOMIC_RELAXED))
            return true;
    }
    return false;
}

/*
 * Say in our side block which of the peer's registrations our primed posts reached
 * (struct ml_sock_side, reach), before ML_SOCK_NOPOST goes up (the caller's): the peer sleeps on
 * a queue of those, which we keep mapped, and naps for the others.  none: say nothing (back in
 * reach).  A wrong tag (the peer claimed the slot again since, for another queue whose tag is the
 * same byte; our cache let the queue go; a fork sibling sharing the side posts from a process
 * that never mapped the queue) costs the peer one wake-up, at most its liveness interval late:
 * the refused post zeroes the byte (ml_chan_unreach), and the peer's next look naps.
 */
void __ml_chan_publish_reach(struct memlan_channel *ch, bool none)
{
    struct ml_sock_side *me = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF) + ch->side;
    for (uint32_t w = 0; w < 2; w++) {
        uint32_t v = 0;
        for (uint32_t j = 0; j < 4 && !none; j++)
            v |= (uint32_t)__atomic_load_n(&ch->reach_tag[4 * w + j], __ATOMIC_RELAXED)
                 << (8 * j);
        ml_store_release(&me->reach[w], v);
    }
}


static void ml_set_state(struct memlan_channel *ch, uint32_t st)
{
    /* SYNC: pairs with the acquire load in ml_peer_state(). */
    ml_store_release(&ch->hdr->side_state[ch->side], st);
    /* Wake the peer whichever way it waits: for data on our tx ring, for space on our rx ring. */
    __ml_chan_wake(ch, &ch->tx.ctl->rx_wait, ch->tx_refs->rx);
    __ml_chan_wake(ch, &ch->rx.ctl->tx_wait, ch->rx_refs->tx);
}

/* ---- waiting ----------------------------------------------------------------------------- */

/*
 * Wait until ready(ch, arg) or the deadline (ns, 0 = none).  word is our tripwire on ring r; cpu is where
 * we publish the cpu we wait on; peer_cpu where the peer publishes its own.  Returns 0 when ready,
 * -ETIMEDOUT, or -ECONNRESET when the peer died (the caller still takes what is left first).
 */
/* Set by an embedder that tracks signal handlers (the preload library): called before each
 * sleep (a cancellation point) and after an interrupted one, it returns how many handlers
 * without SA_RESTART have run on this thread; NULL: every interruption is EINTR. */
unsigned (*__ml_wait_hook)(void);
/* Set by the same embedder: the count alone (no cancellation point, no side effect), read while
 * spinning and before each sleep, so that a handler without SA_RESTART that ran while we were
 * not in the kernel ends the wait with EINTR as it would have ended the kernel's.  NULL: none. */
unsigned (*__ml_intr_count)(void);
/* The same for every handler, SA_RESTART too: with a deadline (SO_RCVTIMEO/SO_SNDTIMEO) any
 * handler ends the wait with EINTR, as sock_intr_errno does in the kernel. */
unsigned (*__ml_intr_any)(void);
/* Set by the embedder when handlers it cannot count may run (siginterrupt(sig, 1) and the like):
 * a wait then never spins, so that such a handler can only find us in the kernel's sleep, whose
 * EINTR we see. */
_Atomic bool __ml_intr_blind;

static bool ml_attached(struct memlan_channel *ch, uint64_t unused);

/* A native creator's blocking call on a channel nobody has attached to gives up at attach_by:
 * the offer is withdrawn (a late attach fails with -EBUSY; one that won the race is kept) and
 * the call fails with -ENOTCONN, as every later one does.  Waiting for the attacher itself
 * (memlan_channel_wait_peer) is bounded by its own timeout instead. */
static bool ml_attach_expired(struct memlan_channel *ch,
                              bool (*ready)(struct memlan_channel *, uint64_t))
{
    if (ch->side != 0 || ch->peer_seen || !ch->attach_by || ready == ml_attached ||
        __ml_now_ns() < ch->attach_by)
        return false;
    if (ml_load_acquire(&ch->hdr->attached) != 0 || __ml_chan_withdraw(ch) != 0)
        return false; /* attached (or broken: ml_peer_dead says so) */
    ch->unattached = true;
    ch->peer_dead = true;
    return true;
}

static int ml_dead_err(const struct memlan_channel *ch)
{
    return ch->unattached ? -ENOTCONN : -ECONNRESET;
}

#define ML_WAIT_SPURIOUS 64u

/* ml_wait's spin (__ml_spin_run): readiness as the spin reads it, and, every 32 rounds, a
 * cancellation point (every 1024) and the handlers that ran while we spun. */
struct ml_wait_spin {
    struct memlan_channel *ch;
    bool (*spin_ready)(struct memlan_channel *, uint64_t);
    uint64_t arg;
    unsigned (*count)(void);
    unsigned runs0;
    uint64_t deadline;        /* the wait's (0: none): a yielding spin stops there */
};

static int ml_wait_spin_look(struct ml_spinning *s, void *a)
{
    struct ml_wait_spin *w = a;
    return w->spin_ready(w->ch, w->arg) ? 1 : 0;
}

static int ml_wait_spin_tick(struct ml_spinning *s, void *a)
{
    struct ml_wait_spin *w = a;
    if (__ml_wait_hook && (s->round & 1023) == 0)
        (void)__ml_wait_hook(); /* a cancellation point while spinning too */
    if (w->count && w->count() != w->runs0 && !w->spin_ready(w->ch, w->arg))
        return -EINTR; /* a handler ran: the kernel's call would have ended */
    /* A yield may give the cpu away for a whole time slice of a peer that keeps it (ms): the
     * deadline is looked at after each (a spin's rounds are ns, its budget 50 us: none). */
    if (s->yield && w->deadline && __ml_now_ns() >= w->deadline && !w->spin_ready(w->ch, w->arg))
        return -ETIMEDOUT;
    return 0;
}

/* The same tick for a spin that holds its direction (__ml_chan_spin_rx_ro): no cancellation
 * point there (a cancelled holder would keep the direction from every other thread). */
static int ml_hold_spin_tick(struct ml_spinning *s, void *a)
{
    (void)s;
    struct ml_wait_spin *w = a;
    if (w->count && w->count() != w->runs0 && !w->spin_ready(w->ch, w->arg))
        return -EINTR;
    return 0;
}

static int ml_wait(struct memlan_channel *ch, _Atomic uint32_t *word, _Atomic uint32_t *cpu,
                   _Atomic uint32_t *peer_cpu, struct ml_spin *sp,
                   bool (*ready)(struct memlan_channel *, uint64_t),
                   bool (*spin_ready)(struct memlan_channel *, uint64_t), uint64_t arg,
                   uint64_t deadline, uint64_t slice, bool *spun_out)
{
    int me = __ml_getcpu();
    ml_note_cpu(cpu, (uint32_t)(me + 1));
    unsigned (*count)(void) = deadline && __ml_intr_any ? __ml_intr_any : __ml_intr_count;
    unsigned runs0 = count ? count() : 0;
    uint64_t budget = __ml_spin_budget_ns(sp, ml_load_relaxed(peer_cpu));
    if (budget && atomic_load_explicit(&__ml_intr_blind, memory_order_relaxed))
        budget = 0;
    if (ml_unlikely(sp == &ch->spin_rx && ml_load_relaxed(&ch->rx_spun_ns))) {
        /* The receive spun that much already, holding the direction (__ml_chan_spin_rx_ro). */
        uint64_t spun = atomic_exchange_explicit(&ch->rx_spun_ns, 0, memory_order_relaxed);
        budget = budget > spun ? budget - spun : 0;
    }
    bool yield = false;
    if (!budget && !atomic_load_explicit(&__ml_intr_blind, memory_order_relaxed)) {
        /* The peer waits on our cpu: give it the cpu rather than sleep at once (spin.c). */
        budget = __ml_yield_budget_ns(sp, ml_load_relaxed(peer_cpu));
        yield = budget != 0;
    }
    struct ml_wait_spin ws = {ch, spin_ready, arg, count, runs0, deadline};
    struct ml_spinning spin = {.sp = sp, .budget = budget, .every = 32, .look = ml_wait_spin_look,
                               .tick = ml_wait_spin_tick, .arg = &ws, .yield = yield};
    int sr = __ml_spin_run(&spin);
    if (sr < 0)
        return sr;
    if (sr > 0) {
        /* Relaxed atomics: the socket layer's waiters hold no lock (see __ml_chan_wait_ro). */
        uint64_t hits = __atomic_add_fetch(&ch->spin_hits, 1, __ATOMIC_RELAXED);
        if (spun_out && !yield) { /* the native receive's: its thread's count of quick looks is ours to read */
            *spun_out = true;
            hits += ch->rx_quick_hits;
        }
        if (word == &ch->rx.ctl->rx_wait)
            ml_store_relaxed(&ch->rx.ctl->spin_hits, hits);
        return 0;
    }
    int64_t every = ML_LIVENESS_NS;
    /* Rounds in a row that ended without data, a timeout or a signal: woken, our bit taken, or
     * the word changed under the futex.  An honest waker does that only when it published
     * something, which ends the wait; a peer that keeps clearing or waking the word (it is in
     * the peer's page) kept us looking, at its pace, never asleep and never asking whether it
     * lives.  Past ML_WAIT_SPURIOUS of them we nap out the liveness interval on a word of our
     * own instead, then ask, as a timeout would. */
    unsigned spurious = 0;
    _Atomic uint32_t nap_word = 0;
    /* The asymmetric barrier of this tripwire: our declaration for it and the peer's
     * acknowledgement (a wait for data on our receiving ring, or for room on our sending one). */
    bool rxw = word == &ch->rx.ctl->rx_wait;
    struct ml_ring *mr = rxw ? &ch->rx : &ch->tx;
    _Atomic uint32_t *decl = rxw ? &ch->rx.ctl->rx_mb : &ch->tx.ctl->tx_mb;
    _Atomic uint32_t *ack = rxw ? &ch->rx.ctl->rx_mb_ack : &ch->tx.ctl->tx_mb_ack;
    ml_mb_policy(ch, mr, decl, ack);
    bool ran_out = false; /* our last sleep ran out */
    /* Our bits: the futex's, and a blocking receive's (the socket layer says so: its SIGIO is
     * held back while it sleeps, see __ml_chan_wake_slow). */
    uint32_t mine = ML_WAIT_FUTEX | (rxw && __ml_wait_recv && __ml_wait_recv() ? ML_WAIT_RECV : 0);
    for (;;) {
        /* Arm, fence, re-check: see the header comment.  Our bit only: an event-queue waiter
         * (poll or epoll in another thread) may be armed on the same word. */
        ml_fetch_or(word, mine);
        ml_fence(); /* SYNC: pairs with the fence in __ml_chan_wake() */
        /* SYNC: F1', for a peer that publishes without a barrier */
        bool bounded = __ml_mb_wait_barrier(ch, decl, ack) < 0;
        if (ready(ch, arg)) {
            ml_fetch_and(word, ~mine);
            if (ran_out)
                __atomic_fetch_add(&ch->wait_found_late, 1, __ATOMIC_RELAXED);
            return 0;
        }
        ran_out = false;
        uint64_t now = __ml_now_ns();
        /* A wait in slices sleeps to the slice's end: its caller makes the liveness looks at
         * their own pace across the slices (sock.c, mlp_wait_long), and a look of ours in the
         * middle of each slice woke a long wait twice a slice, not once (idlewake). */
        int64_t tmo = slice ? INT64_MAX : every;
        if (ml_unlikely(bounded) && tmo > 1000000)
            tmo = 1000000; /* see __ml_mb_wait_barrier() */
        if (every < (int64_t)ML_LIVENESS_MAX_NS)
            every = every * 2 < (int64_t)ML_LIVENESS_MAX_NS ? every * 2 : ML_LIVENESS_MAX_NS;
        if (deadline) {
            if (now >= deadline) {
                ml_fetch_and(word, ~mine);
                return -ETIMEDOUT;
            }
            if (deadline - now < (uint64_t)tmo)
                tmo = (int64_t)(deadline - now);
        }
        if (slice) {
            /* The slice's end leaves our bit set: another thread (or process) may be asleep on
             * the same word, and clearing the bit that all futex waiters share would take its
             * next wake-up (it slept on to its own timeout: found in review).  A stale bit costs
             * the peer one futex wake that finds nobody. */
            if (now >= slice)
                return ready(ch, arg) ? 0 : -ETIME;
            if (slice - now < (uint64_t)tmo)
                tmo = (int64_t)(slice - now);
        }
        __atomic_fetch_add(&ch->sleeps, 1, __ATOMIC_RELAXED);
        /* Sleep while the word still holds our bit, whatever else it holds (a waker clears the
         * whole word; a poller that arms meanwhile changes it, and we look again). */
        uint32_t cur = ml_load_relaxed(word);
        if (!(cur & ML_WAIT_FUTEX) && ++spurious < ML_WAIT_SPURIOUS)
            continue;
        bool nap = spurious >= ML_WAIT_SPURIOUS;
        unsigned intr0 = __ml_wait_hook ? __ml_wait_hook() : 0; /* a cancellation point */
        if (count && count() != runs0) { /* a handler ran while we were not asleep */
            ml_fetch_and(word, ~mine);
            return ready(ch, arg) ? 0 : -EINTR;
        }
        int r = nap ? __ml_sys_futex_wait(&nap_word, 0, tmo) : __ml_sys_futex_wait(word, cur, tmo);
        ran_out = r == -ETIMEDOUT;
        if (ran_out)
            __atomic_fetch_add(&ch->wait_timeouts, 1, __ATOMIC_RELAXED);
        if (nap)
            spurious = 0;
        else if (r == 0 || r == -EAGAIN)
            spurious++;
        if (r == -ETIMEDOUT && slice && __ml_now_ns() >= slice) {
            /* The slice's end, not the liveness interval's: the caller looks on its own way
             * (our bit stays set, as above). */
            return ready(ch, arg) ? 0 : -ETIME;
        }
        if (r == -ETIMEDOUT && (ml_peer_dead(ch) || ml_attach_expired(ch, ready))) {
            ml_fetch_and(word, ~mine);
            return ready(ch, arg) ? 0 : ml_dead_err(ch);
        }
        if (r == -EINTR) {
            /* A handler ran.  The kernel never restarts a futex wait with a timeout, SA_RESTART
             * or not (ERESTART_RESTARTBLOCK becomes EINTR), so the decision is ours: a blocking
             * socket call is restarted after a handler installed with SA_RESTART and fails with
             * EINTR after one without; with SO_RCVTIMEO/SO_SNDTIMEO (a deadline) it always fails
             * (sock_intr_errno).  The hook counts the runs of handlers without SA_RESTART on
             * this thread; without one we cannot tell, and fail as before. */
            ml_fetch_and(word, ~mine);
            if (ready(ch, arg))
                return 0;
            if (deadline || !__ml_wait_hook || __ml_wait_hook() != intr0)
                return -EINTR;
            continue;
        }
    }
}

static uint64_t ml_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? 0 : __ml_now_ns() + (uint64_t)timeout_ms * 1000000u + 1;
}

static bool ml_rx_ready(struct memlan_channel *ch, uint64_t unused)
{
    (void)unused;
    if (ml_rx_avail(ch, true) != 0) /* data, or corrupt (-1): either way, go and look */
        return true;
    return ml_peer_state(ch) != ML_SIDE_OPEN || ch->peer_dead || ch->shut_rd ||
           ch->rd_eof_when_empty ||
           ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

/* The same while spinning: a message ring's consumer looks at the record header only, never at
 * head, so that the producer keeps head's line (the check after arming looks at both). */
static bool ml_rx_ready_spin(struct memlan_channel *ch, uint64_t unused)
{
    if (ch->kind != MEMLAN_MSG)
        return ml_rx_ready(ch, unused);
    if (ml_ring_msg_avail(&ch->rx, false) != 0)
        return true;
    return ml_peer_state(ch) != ML_SIDE_OPEN || ch->peer_dead || ch->shut_rd ||
           ch->rd_eof_when_empty ||
           ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

static bool ml_tx_ready(struct memlan_channel *ch, uint64_t unused)
{
    (void)unused;
    int64_t f = ml_ring_free(&ch->tx, ch->tx_want);
    if (f < 0 || (uint64_t)f >= ch->tx_want)
        return true;
    return ml_peer_state(ch) == ML_SIDE_CLOSED || ch->peer_dead ||
           ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

/*
 * Readiness, read-only.  Whoever asks whether a direction is ready (poll, epoll, the event
 * queue's collect, the arming of a tripwire, a blocked call's wait) may not hold that direction:
 * another thread, or another process after fork, may be inside recv or send on it.  So readiness
 * never touches the private state (pos, other), which only the holder of the direction may read
 * or write, and writes nothing: not the cached index, not tx_want, not the corrupt flag.  It is
 * the peer's index from shared memory (head of the ring we read, tail of the ring we write)
 * against our own index as its holder last published it in memory the peer cannot write
 * (ring->pub: a word of our own, or of the lock page our fork children share), never the shared
 * copy of our own index: the peer can overwrite that, and a garbage copy made readiness say
 * "ready" for ever while the locked pass found nothing (a blocked recv spun at 100% CPU; poll
 * said POLLIN).  A pair that does not fit the ring (a peer's garbage, or a holder that moved
 * between our two loads) is read again a few times and then answered with -1, "go and look":
 * the call that looks holds the direction, checks against its private state and marks the ring
 * corrupt if it is (its own index it trusts, so garbage there is the peer's own, and final).
 */
int64_t __ml_chan_rx_avail_ro(const struct memlan_channel *ch)
{
    for (int k = 0; k < 4; k++) {
        uint64_t t = ml_ring_pub(&ch->rx, memory_order_acquire);
        /* SYNC: pairs with the release (seq_cst) store of head in ml_ring_produce(). */
        uint64_t h = ml_load_acquire(&ch->rx.ctl->head);
        if (h - t <= ch->rx.cap) {
            /* An exec'd holder of our side publishes only in the channel: its reads count
             * when the shared tail is ahead of ours and not past head (__ml_chan_resync_rx).
             * It can only say less than ours: never the "ready for ever" above. */
            uint64_t st = ml_load_acquire(&ch->rx.ctl->tail);
            if ((int64_t)(st - t) > 0 && h - st <= ch->rx.cap)
                t = st;
            return (int64_t)(h - t);
        }
        /* A message ring's reader takes a record by its publication word, and may be ahead of
         * a head not yet stored (up to one ring): nothing new, not "go and look" (which woke
         * the waiter for nothing until head caught up). */
        if (ch->kind == MEMLAN_MSG && t - h <= ch->rx.size)
            return 0;
    }
    return -1;
}

int64_t __ml_chan_tx_free_ro(const struct memlan_channel *ch)
{
    for (int k = 0; k < 4; k++) {
        /* SYNC: pairs with the release (seq_cst) store of tail in ml_ring_consume(). */
        uint64_t t = ml_load_acquire(&ch->tx.ctl->tail);
        uint64_t h = ml_ring_pub(&ch->tx, memory_order_acquire);
        if (!ch->tx.gsize) {
            if (h - t <= ch->tx.size)
                return (int64_t)(ch->tx.size - (h - t));
            continue;
        }
        /* A growing ring: the room in the area of the head, by the switch as its producer
         * published it where the peer cannot write (never ctl->grow); at a full ring that may
         * still grow, the region's (the send switches: POLLOUT, as the kernel's below its
         * buffer's maximum). */
        uint64_t w = ml_ring_gpub(&ch->tx);
        uint64_t p = h - (((h << 1) - (w & ~(uint64_t)1)) >> 1);
        uint64_t used = h - ((int64_t)(t - p) < 0 ? p : t);
        uint64_t lim = ml_glimit(ch);
        uint64_t sz = (w & 1) ? lim : ml_rlimit(ch);
        if (h - t > ch->tx.cap || used > ((w & 1) ? ch->tx.gsize : ch->tx.size))
            continue;
        if (!(w & 1) && ml_growable(ch, t, p))
            return (int64_t)lim;
        return used > sz ? 0 : (int64_t)(sz - used);
    }
    return -1;
}

/*
 * Are there bytes to read at the receive mark (the socket layer's SO_RCVLOWAT), or can we not
 * tell (go and look)?  Read-only.  As the kernel's TCP: a socket is readable to poll, select and
 * epoll, and a blocked recv is woken, only once the mark's bytes are queued (or at the end of the
 * stream, which the callers look at); a recv that finds some returns them (sock.c).  The mark is
 * at most the ring: a full ring is readable, since its sender can add nothing (the kernel grows
 * its receive buffer for the mark instead, and wakes a reader when it cannot).
 */
static uint64_t ml_rx_urg_skip_ro(struct memlan_channel *ch, uint64_t a);

bool __ml_chan_rx_at_mark_ro(const struct memlan_channel *ch)
{
    int64_t a = __ml_chan_rx_avail_ro(ch);
    if (a <= 0)
        return a != 0;
    uint64_t mark = ch->rx_lowat < ch->rx.size ? ch->rx_lowat : ch->rx.size;
    return (uint64_t)a >= mark;
}

/* The same for poll, select and epoll: not counting the bytes a receive passes over (an urgent
 * byte out of line), as TCP's poll adds the urgent byte to its target there (tcp_poll).  A
 * blocking receive's wait counts them (__ml_chan_rx_at_mark_ro): woken, the receive passes
 * over them, as TCP's blocked reader does when the byte comes. */
bool __ml_chan_rx_inband_ro(const struct memlan_channel *ch)
{
    int64_t a = __ml_chan_rx_avail_ro(ch);
    if (a <= 0)
        return a != 0;
    a -= (int64_t)ml_rx_urg_skip_ro((struct memlan_channel *)ch, (uint64_t)a);
    if (a <= 0)
        return false;
    uint64_t mark = ch->rx_lowat < ch->rx.size ? ch->rx_lowat : ch->rx.size;
    return (uint64_t)a >= mark;
}

static bool ml_rx_end_ro(struct memlan_channel *ch)
{
    return ml_peer_state(ch) != ML_SIDE_OPEN || ch->peer_dead || ch->shut_rd ||
           ch->rd_eof_when_empty || ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

/* Readiness to a look that does not read (the event queue's, poll's, epoll's): not for the bytes
 * a receive passes over alone (__ml_chan_rx_inband_ro); a telnet client that selected on its
 * connection while an urgent byte, out of line as it read it, was all there was found it
 * posted again at each arm and spun (an explorer). */
static bool ml_rx_ready_ro(struct memlan_channel *ch)
{
    if (__ml_chan_rx_inband_ro(ch)) /* data, or cannot tell: either way, go and look */
        return true;
    return ml_rx_end_ro(ch);
}

static bool ml_tx_ready_ro(struct memlan_channel *ch)
{
    if (__ml_chan_tx_free_ro(ch) != 0)
        return true;
    return ml_peer_state(ch) == ML_SIDE_CLOSED || ch->peer_dead ||
           ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

static bool ml_attached(struct memlan_channel *ch, uint64_t unused)
{
    (void)unused;
    return ml_load_acquire(&ch->hdr->attached) != 0 ||
           ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

int memlan_channel_wait_peer(memlan_channel_t *ch, int timeout_ms)
{
    if (!ch)
        return -EINVAL;
    if (ch->side == 1)
        return 0;
    /* The attacher wakes our tx_wait word when it arrives.  Where it runs is unknown until then,
     * so whether a spin pays is learnt across all the channels of the process (a client making
     * short connections to a server on its own core would otherwise spin the whole budget on
     * every one, on the core the server needs to accept it). */
    static struct ml_spin attach_spin;
    int r = ml_wait(ch, &ch->tx.ctl->tx_wait, &ch->tx.ctl->tx_cpu, &ch->tx.ctl->rx_cpu,
                    &attach_spin, ml_attached, ml_attached, 0, ml_deadline(timeout_ms), 0, NULL);
    if (r < 0)
        return r;
    if (ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE)
        return -ECONNRESET;
    uint32_t at = ml_load_acquire(&ch->hdr->attached);
    if (at == 1) {
        ch->peer_seen = true;
        return 0;
    }
    return at == ML_ATTACH_WITHDRAWN ? -ECONNREFUSED : -EPROTO; /* withdrawn, or garbage */
}

static uint64_t ml_deadline_ns(uint64_t tmo_ns)
{
    return tmo_ns ? __ml_now_ns() + tmo_ns : 0;
}

int __ml_chan_wait_rx(struct memlan_channel *ch, int flags)
{
    (void)flags;
    bool spun = false;
    int r = ml_wait(ch, &ch->rx.ctl->rx_wait, &ch->rx.ctl->rx_cpu, &ch->tx.ctl->rx_cpu,
                    &ch->spin_rx, ml_rx_ready, ml_rx_ready_spin, 0,
                    ml_deadline_ns(ch->rx_tmo_ns), 0, &spun);
    ch->rx_spin_first = spun;
    return r; /* -ETIMEDOUT at memlan_channel_set_timeout's bound */
}

int __ml_chan_wait_tx(struct memlan_channel *ch, uint64_t want)
{
    ch->tx_want = want;
    int r = ml_wait(ch, &ch->tx.ctl->tx_wait, &ch->tx.ctl->tx_cpu, &ch->rx.ctl->tx_cpu,
                    &ch->spin_tx, ml_tx_ready, ml_tx_ready, 0, ml_deadline_ns(ch->tx_tmo_ns), 0,
                    NULL);
    return r;
}

/* The peer's urgent byte is here, ahead of us or where we stand: a receive that waits for more
 * (SO_RCVLOWAT) takes what comes before it and ends at it, as TCP's wakes for it (tcp_urg:
 * sk_data_ready) and ends at the mark. */
static bool ml_rx_urg_at_ro(struct memlan_channel *ch)
{
    uint8_t b;
    return ch->sock_ino && ch->kind == MEMLAN_STREAM &&
           ml_load_relaxed(&((struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF) +
                             (1 - ch->side))->urg) != 0 &&
           (__ml_chan_urg_state(ch, &b, NULL, false) & ML_URG_HERE) != 0;
}

/* Read-only readiness for waiters that hold no direction (see __ml_chan_wait_ro).  want > 1:
 * that many bytes at least (a peek that passes over an urgent byte waits for one more than it
 * passed over: socket layer), or the end. */
static bool ml_rx_ready_unlocked(struct memlan_channel *ch, uint64_t want)
{
    if (want <= 1) /* a receive's wait: every byte, which it reads or passes over */
        return __ml_chan_rx_at_mark_ro(ch) || ml_rx_end_ro(ch) || ml_rx_urg_at_ro(ch);
    int64_t a = __ml_chan_rx_avail_ro(ch);
    if (a < 0 || (uint64_t)a >= want)
        return true;
    return ml_rx_end_ro(ch);
}

static bool ml_tx_ready_unlocked(struct memlan_channel *ch, uint64_t want)
{
    int64_t f = __ml_chan_tx_free_ro(ch);
    if (f < 0 || (uint64_t)f >= want)
        return true;
    return ml_peer_state(ch) == ML_SIDE_CLOSED || ch->peer_dead || ch->shut_wr ||
           ml_load_acquire(&ch->hdr->side_state[ch->side]) != ML_SIDE_OPEN ||
           ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE;
}

/*
 * The socket layer's wait (src/preload): it holds no lock on the direction while it sleeps, so
 * readiness is computed from the shared indices alone (as poll's), and nothing private to the
 * direction's holder is read or written.  Waits until the direction may have moved: dir 0 for
 * bytes to read (or the end), dir 1 for want bytes of room (or an error); deadline in ns on
 * __ml_now_ns's clock, 0 = none.  0: look again (under the lock: another thread may have taken
 * what came); -EAGAIN at the deadline; -EINTR; -ECONNRESET: the peer died (look again too).
 */
/* What __ml_chan_wait_ro waits for, looked at once. */
bool __ml_chan_ready_ro(struct memlan_channel *ch, int dir, uint64_t want)
{
    if (dir == 0 && want == 0) /* poll's and epoll's readiness (see __ml_chan_rx_inband_ro) */
        return ml_rx_ready_ro(ch);
    return dir == 0 ? ml_rx_ready_unlocked(ch, want) : ml_tx_ready_unlocked(ch, want ? want : 1);
}

int __ml_chan_wait_ro(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline)
{
    return __ml_chan_wait_ro_slice(ch, dir, want, deadline, 0);
}

/* The same, giving up with -ETIME at slice (ns on the same clock, 0 = never) when nothing came:
 * unlike a deadline, a slice changes nothing of what a signal does to the wait (SA_RESTART).
 * The socket layer sleeps on the futex for a short slice, then where the kernel socket can wake
 * it too (see mlp_wait_dir in src/preload/sock.c). */
static bool ml_rx_ready_first(struct memlan_channel *ch, uint64_t unused);
static bool ml_tx_ready_first(struct memlan_channel *ch, uint64_t want);

/* first: the socket layer's first slice (__ml_chan_wait_ro_first, below). */
static int ml_wait_ro(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline,
                      uint64_t slice, bool first)
{
    int r;
    if (dir == 0)
        r = ml_wait(ch, &ch->rx.ctl->rx_wait, &ch->rx.ctl->rx_cpu, &ch->tx.ctl->rx_cpu,
                    &ch->spin_rx, first ? ml_rx_ready_first : ml_rx_ready_unlocked,
                    ml_rx_ready_unlocked, want, deadline, slice, NULL);
    else
        r = ml_wait(ch, &ch->tx.ctl->tx_wait, &ch->tx.ctl->tx_cpu, &ch->rx.ctl->tx_cpu,
                    &ch->spin_tx, first ? ml_tx_ready_first : ml_tx_ready_unlocked,
                    ml_tx_ready_unlocked, want ? want : 1, deadline, slice, NULL);
    return r == -ETIMEDOUT ? -EAGAIN : r;
}

int __ml_chan_wait_ro_slice(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline,
                            uint64_t slice)
{
    return ml_wait_ro(ch, dir, want, deadline, slice, false);
}

/*
 * The socket layer's: the peer's process is ending with its side open and its own alone
 * (ML_SOCK_EXITING, src/preload/sock.c, mlp_exiting_say): its end will be its kernel socket's
 * FIN, which no code of its announces over the channel.  A peer that sets the flag for nothing
 * only moves our blocking calls from the ring's futex to a sleep that watches the kernel socket
 * too, which the ring's wake-ups still end.
 */
bool __ml_chan_peer_exiting(struct memlan_channel *ch)
{
    if (!ch->sock_ino)
        return false;
    struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
    return (ml_load_relaxed(&sides[1 - ch->side].flags) & ML_SOCK_EXITING) != 0;
}

/* Wake the peer whichever way it waits (for data on our tx ring, room on our rx ring), as a
 * change of our side's state does, for a change it must look at (ML_SOCK_EXITING). */
void __ml_chan_wake_peer(struct memlan_channel *ch)
{
    __ml_chan_wake(ch, &ch->tx.ctl->rx_wait, ch->tx_refs->rx);
    __ml_chan_wake(ch, &ch->rx.ctl->tx_wait, ch->rx_refs->tx);
}

static bool ml_rx_ready_first(struct memlan_channel *ch, uint64_t unused)
{
    return ml_rx_ready_unlocked(ch, unused) || __ml_chan_peer_exiting(ch);
}

static bool ml_tx_ready_first(struct memlan_channel *ch, uint64_t want)
{
    return ml_tx_ready_unlocked(ch, want) || __ml_chan_peer_exiting(ch);
}

/* __ml_chan_wait_ro_slice, for the socket layer's first slice on the futex: it ends too when
 * the peer says that its process is ending (0: look again), after which the caller sleeps where
 * the kernel socket's FIN wakes it.  Its spin looks at the ring alone. */
int __ml_chan_wait_ro_first(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline,
                            uint64_t slice)
{
    return ml_wait_ro(ch, dir, want, deadline, slice, true);
}

bool __ml_chan_rx_nothing(struct memlan_channel *ch)
{
    return ch->kind == MEMLAN_STREAM && !ch->rx.corrupt && ml_ring_avail(&ch->rx, 1) == 0;
}

/* The spin of a socket layer's blocking receive that holds its direction (sock.c,
 * mlp_recv_fast: the ring was empty).  Readiness as the regular wait reads it, read-only: a
 * handler that runs on top of the spin may borrow the direction and move its position.  No
 * cancellation point and no sleep: the holder gives the direction back within cap_ns, the spin
 * policy's budget at most (none where the policy spins none: the peer on our cpu, one cpu,
 * MEMLAN_SPIN_US=0, or a SO_RCVTIMEO shorter than the spin).  1: ready (bytes, the end, an
 * error: the holder looks); 0: the budget ran out (the regular wait then spins that much
 * less); -EINTR: a handler without SA_RESTART ran (with a timeout: any handler) and nothing
 * is ready, where the kernel's receive would have ended. */
int __ml_chan_spin_rx_ro(struct memlan_channel *ch, uint64_t cap_ns)
{
    unsigned (*count)(void) = ch->rx_tmo_ns && __ml_intr_any ? __ml_intr_any : __ml_intr_count;
    uint64_t budget = __ml_spin_budget_ns(&ch->spin_rx, ml_load_relaxed(&ch->tx.ctl->rx_cpu));
    if (budget > cap_ns)
        budget = cap_ns;
    if (!budget || (ch->rx_tmo_ns && ch->rx_tmo_ns <= budget) ||
        atomic_load_explicit(&__ml_intr_blind, memory_order_relaxed))
        return 0;
    if (ml_load_relaxed(&ch->rx_spun_ns)) /* an earlier spin's, whose wait never came */
        ml_store_relaxed(&ch->rx_spun_ns, 0);
    ml_note_cpu(&ch->rx.ctl->rx_cpu, (uint32_t)(__ml_getcpu() + 1));
    struct ml_wait_spin ws = {ch, ml_rx_ready_unlocked, 0, count, count ? count() : 0, 0};
    struct ml_spinning spin = {.sp = &ch->spin_rx, .budget = budget, .every = 32,
                               .look = ml_wait_spin_look, .tick = ml_hold_spin_tick, .arg = &ws};
    int r = __ml_spin_run(&spin);
    if (r == 0)
        atomic_store_explicit(&ch->rx_spun_ns, budget, memory_order_relaxed);
    return r;
}

/* Wake our own waiters for room: a shutdown of our writing side ends their wait (EPIPE). */
void __ml_chan_kick_tx(struct memlan_channel *ch)
{
    if (ml_fetch_and(&ch->tx.ctl->tx_wait, ~ML_WAIT_FUTEX) & ML_WAIT_FUTEX)
        __ml_sys_futex_wake(&ch->tx.ctl->tx_wait, INT32_MAX);
}

/* Arm the tripwires in event-queue mode after an -EAGAIN (see evq.c); returns true if the
 * channel became ready meanwhile and the caller must post the event itself. */
bool __ml_chan_arm_evq(struct memlan_channel *ch, uint32_t events)
{
    if (!ch->evq)
        return false;
    /* Our bit only: a thread blocked in recv or send may sleep on the same word, and other
     * processes sharing the socket (fork) arm their own registration slots' bits. */
    uint32_t bit = ML_WAIT_EVQ_REF(ch->evq_ref);
    if (events & MEMLAN_EV_READ) {
        ml_mb_policy(ch, &ch->rx, &ch->rx.ctl->rx_mb, &ch->rx.ctl->rx_mb_ack);
        ml_fetch_or(&ch->rx.ctl->rx_wait, bit);
    }
    if (events & MEMLAN_EV_WRITE) {
        ml_mb_policy(ch, &ch->tx, &ch->tx.ctl->tx_mb, &ch->tx.ctl->tx_mb_ack);
        ml_fetch_or(&ch->tx.ctl->tx_wait, bit);
    }
    ml_fence(); /* SYNC: pairs with the fence in __ml_chan_wake() */
    /* SYNC: F1', for a peer that publishes without a barrier.  A refused barrier (-1) cannot be
     * made up for here: the event queue's waiter sleeps on its own terms (a known gap, in
     * design.md). */
    bool mr = (events & MEMLAN_EV_READ) && ml_mb_needed(&ch->rx.ctl->rx_mb, &ch->rx.ctl->rx_mb_ack);
    bool mw = (events & MEMLAN_EV_WRITE) && ml_mb_needed(&ch->tx.ctl->tx_mb, &ch->tx.ctl->tx_mb_ack);
    if (mr || mw) /* one barrier orders both tripwires */
        (void)ml_mb_barrier(ch, mr ? &ch->rx.ctl->rx_mb : NULL, &ch->rx.ctl->rx_mb_ack,
                            mw ? &ch->tx.ctl->tx_mb : NULL, &ch->tx.ctl->tx_mb_ack);
    /* Read-only: the arming thread need not hold the directions (see __ml_chan_rx_avail_ro). */
    return ((events & MEMLAN_EV_READ) && ml_rx_ready_ro(ch)) ||
           ((events & MEMLAN_EV_WRITE) && ml_tx_ready_ro(ch));
}

/* Our side's readiness changed in a way only we can see (a write that drew the peer's reset,
 * sock.c): our own event queue hears of it, as it hears of the peer's changes from the peer's
 * posts.  Lock-free (a signal handler's send may come here). */
void __ml_chan_post_self(struct memlan_channel *ch)
{
    struct memlan_evq *q = ch->evq;
    if (q)
        __ml_evq_post_local(q, ch->evq_index);
}

static void ml_eagain(struct memlan_channel *ch, uint32_t ev)
{
    if (ev & MEMLAN_EV_WRITE)
        atomic_fetch_add_explicit(&ch->tx_short, 1, memory_order_relaxed);
    if (ch->evq && (ch->evq_events & ev) && __ml_chan_arm_evq(ch, ev))
        __ml_evq_post_local(ch->evq, ch->evq_index);
}

/* ---- send -------------------------------------------------------------------------------- */

/* Why can we not send?  0 if we can. */
static int ml_tx_error(struct memlan_channel *ch)
{
    if (ml_unlikely(ch->tx.corrupt))
        return -EPROTO;
    if (ch->shut_wr)
        return -EPIPE;
    /* Our side is shared with the processes that hold the socket after fork: one that shut it
     * down for writing (or closed it) stopped the writes of all, as the kernel's shutdown of a
     * shared socket does. */
    if (ml_unlikely(ml_load_acquire(&ch->hdr->side_state[ch->side]) != ML_SIDE_OPEN)) {
        ch->shut_wr = true;
        return -EPIPE;
    }
    if (ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE)
        return -ECONNRESET;
    uint32_t ps = ml_peer_state(ch);
    if (ps == ML_SIDE_CLOSED)
        return -EPIPE;
    if (ch->peer_dead)
        return ml_dead_err(ch);
    return 0;
}

static inline void ml_tx_publish(struct memlan_channel *ch, uint64_t n)
{
    ml_ring_produce(&ch->tx, n, ml_ring_nofence(&ch->tx, &ch->tx.ctl->rx_mb, &ch->tx.ctl->rx_mb_ack));
    ch->bytes_tx += n;
    __ml_chan_wake_rmw(ch, &ch->tx.ctl->rx_wait, ch->tx_refs->rx);
    ml_mb_busy(ch, &ch->tx, &ch->tx.ctl->tx_mb, &ch->tx.ctl->tx_mb_ack);
}

/* The wake-up check owed for stream bytes published (or released) by ml_ring_produce (or
 * ml_ring_consume) without one: the seq_cst exchange that published them is the barrier F1 needs,
 * and any later seq_cst load of the tripwire still follows it (with nofence, the compiler
 * barrier after the store keeps the load after it, and the waiter's membarrier does the rest:
 * F1'). */
static inline void ml_tx_wake_pending(struct memlan_channel *ch, uint64_t *unwoken)
{
    if (*unwoken) {
        *unwoken = 0;
        __ml_chan_wake_rmw(ch, &ch->tx.ctl->rx_wait, ch->tx_refs->rx);
    }
}

static inline void ml_rx_wake_pending(struct memlan_channel *ch, uint64_t *unwoken)
{
    if (*unwoken) {
        *unwoken = 0;
        __ml_chan_wake_rmw(ch, &ch->rx.ctl->tx_wait, ch->rx_refs->tx);
    }
}

/* Whether a tripwire check in the middle of a long copy can help (see design.md, "Stream
 * chunks"): the peer last waited on another cpu (0: not known, taken as another), where a woken
 * peer runs while we copy on.  On our cpu it could only take our time slice to find part of what
 * it waits for: a 1 MiB send to a sleeping reader on one core made 1.8 times the context
 * switches of one check per ring.  The word is the peer's to write: it decides only how early
 * a wake-up comes, never whether we wait or for how long. */
static inline bool ml_peer_elsewhere(_Atomic uint32_t *peer_cpu)
{
    uint32_t p = ml_load_relaxed(peer_cpu);
    return p == 0 || (int)p - 1 != __ml_getcpu();
}

/* A stream copy longer than this is cut into pieces, each published (or released) as soon as it
 * is copied: a quarter of the ring, at most 64 KiB. */
static inline uint64_t ml_stream_chunk(const struct memlan_channel *ch)
{
    uint64_t c = ch->size / 4;
    return c < ML_STREAM_CHUNK ? c : ML_STREAM_CHUNK;
}

static ssize_t ml_reserve(memlan_channel_t *ch, void **ptr, size_t min, int flags, bool checked);

/* ---- growth (ring.h, "Growth"; design.md, "Rings grow") -------------------------------------- */

/* A region last grown into this long ago gives its pages back when its producer next finds
 * everything read; one used more recently keeps them for the next growth (reserving 4 MiB costs
 * about a millisecond: a 1 MiB ping-pong on one cpu grows at every message). */
#define ML_GROW_KEEP_NS 1000000000ull

/* The switch, for the consumer (ctl->grow: before the head that passes swp, which
 * ml_ring_produce stores with release) and for readiness and the next holder (gpub). */
static void ml_grow_publish(struct ml_ring *r)
{
    uint64_t w = ml_grow_word(r->swp, r->swg);
    /* SYNC: pairs with the acquire load of head, then of grow, in ml_ring_rd().  The channel's
     * copy first: a next holder takes it (__ml_chan_resync_tx), whatever stopped us after. */
    atomic_store_explicit(&r->ctl->grow, w, memory_order_release);
    atomic_store_explicit(atomic_load_explicit(&r->gpub, memory_order_relaxed), w,
                          memory_order_release);
}

/* A full ring (or region) whose sender will be told to wait: is the peer alive?  One that died
 * does not read, and without this look a nonblocking sender that does not poll (it retries)
 * was told EAGAIN for ever, where kernel TCP reports the reset (a review); a blocking one
 * learns it at its wait's liveness look.  A slow reader's ring fills again and again: one look
 * every 10 ms at the most, and none where a seccomp filter may kill for its system calls (as
 * for madvise). */
static void ml_full_look(struct memlan_channel *ch)
{
    struct ml_ring *r = &ch->tx;
    if (ch->peer_dead || !ml_madv_ok())
        return;
    uint64_t now = __ml_now_ns();
    if (now - r->dead_look_ns >= 10000000u) {
        r->dead_look_ns = now;
        (void)ml_peer_dead(ch);
    }
}

/* The producer found its ring full (its look at the tail was just made): go on in the region, at
 * our head, once its pages are reserved (a fabric that cannot give them leaves the ring as it
 * is, and the direction never grows again: a store to an unreserved page of a full tmpfs would
 * be a SIGBUS).  true: switched. */
static bool ml_grow(struct memlan_channel *ch)
{
    struct ml_ring *r = &ch->tx;
    if (ml_unlikely(r->glimit < r->gsize || r->rlimit < r->size) && !ml_limited(ch)) {
        r->glimit = r->gsize; /* the offer was taken: its limits are lifted */
        r->rlimit = r->size;
        return true; /* more room: look again */
    }
    if (r->swg) {
        ml_full_look(ch);
        return false;
    }
    if (!ml_growable(ch, r->other, r->swp))
        return false;
    if (!ml_madv_ok()) {
        ml_store_relaxed(&ch->grow_off, true);
        return false;
    }
    /* A peer that died does not read: without this look its ring filled and then its region,
     * 4 MiB more accepted and lost before the blocking wait's look found it dead (kernel TCP
     * fails the second send after the peer's end).  A full ring is a slow path, and a switch is
     * made once per region's worth at the most: one look (a lock query) each. */
    if (ml_peer_dead(ch))
        return false;
    if (!r->gsure) {
        if (__ml_sys_madvise(r->gdata, r->gsize, MADV_POPULATE_WRITE) < 0) {
            /* What it did reserve goes back: a full fabric stays as full as it was. */
            (void)__ml_sys_madvise(r->gdata, r->gsize, MADV_REMOVE);
            r->gmaybe = false;
            ml_store_relaxed(&ch->grow_off, true);
            return false;
        }
        r->gsure = r->gmaybe = true;
    }
    r->swp = r->pos;
    r->swg = true;
    r->grew_ns = __ml_now_ns();
    ch->grows++;
    ml_grow_publish(r);
    if (__ml_grow_note)
        __ml_grow_note(ch);
    return true;
}

/* The region's pages go back to the file system (its bytes have all been read). */
static void ml_grow_trim(struct ml_ring *r)
{
    if (ml_madv_ok())
        (void)__ml_sys_madvise(r->gdata, r->gsize, MADV_REMOVE);
    r->gsure = r->gmaybe = false;
}

/* Before a send or a reserve of a growing direction.  In the region: once everything has been
 * read (nothing written since the switch stays put, so that switches only move forward), back to
 * the ring at our head, giving the region's pages back if we grew into it long enough ago.  Back
 * in the ring with pages that may be kept: every 64th call looks whether they are old enough to
 * go (out of the region, it holds no byte to read: the switch back came when all was read). */
/* In the region with everything read: back to the ring at our head.  true: out of the region. */
static bool ml_grow_back(struct ml_ring *r)
{
    if (r->pos == r->swp)
        return false;
    /* SYNC: as in ml_ring_free(): the consumer has finished reading every byte below tail. */
    uint64_t t = ml_load_acquire(&r->ctl->tail);
    if (t != r->pos)
        return false;
    r->other = t;
    r->swp = r->pos;
    r->swg = false;
    ml_grow_publish(r);
    return true;
}

static void ml_grow_idle(struct memlan_channel *ch)
{
    struct ml_ring *r = &ch->tx;
    if (!r->swg) {
        if (r->gmaybe && (++r->gcalls & 63) == 0 &&
            __ml_now_ns() - r->grew_ns >= ML_GROW_KEEP_NS)
            ml_grow_trim(r);
        return;
    }
    if (ml_grow_back(r) && __ml_now_ns() - r->grew_ns >= ML_GROW_KEEP_NS)
        ml_grow_trim(r);
}

void (*__ml_grow_note)(struct memlan_channel *ch);

/*
 * The producer's look while it sends nothing (the socket layer's, under its send lock, at the
 * wake-ups of its sleeps): back to the ring once everything was read, and the region's pages
 * given back once a second has passed since the growth.  Without it a sender that stopped
 * right after a burst kept the region's pages (4 MiB) until its next send or its close: twenty
 * idle keep-alive connections after a 1 MB response each held 92 MB of the fabric.  1: pages
 * may still be kept (look again later); 0: none.
 */
int __ml_chan_grow_settle(struct memlan_channel *ch)
{
    struct ml_ring *r = &ch->tx;
    if (!r->swg && !r->gmaybe)
        return 0;
    if (r->swg && !ml_grow_back(r))
        return r->pos != r->swp; /* unread bytes: later; none written since the switch (a
                                  * sendfile at its file's end): only a send moves it on */
    if (__ml_now_ns() - r->grew_ns < ML_GROW_KEEP_NS)
        return 1;
    ml_grow_trim(r);
    return 0;
}

uint64_t __ml_chan_grow_keep_ns(void) { return ML_GROW_KEEP_NS; }

/* Copy n bytes from the cursor's place in its vector to dst, and move the cursor past them (the
 * caller counted that many there; the bound on the pieces keeps a vector that another thread of
 * the program shortens meanwhile from taking us past its end). */
static void ml_gather(uint8_t *dst, struct ml_iov_cur *c, uint64_t n)
{
    while (n && c->i < c->n) {
        const struct iovec *v = &c->iov[c->i];
        size_t l = v->iov_len - c->off;
        if (l == 0) { /* an empty piece */
            c->i++;
            c->off = 0;
            continue;
        }
        if (l > n)
            l = (size_t)n;
        memcpy(dst, (const uint8_t *)v->iov_base + c->off, l);
        dst += l;
        n -= l;
        c->off += l;
        if (c->off == v->iov_len) {
            c->i++;
            c->off = 0;
        }
    }
}

/* Bytes from the cursor to the end of its vector, or -EINVAL if their sum overflows. */
static ssize_t ml_iov_left(const struct ml_iov_cur *c)
{
    size_t t = 0;
    for (int i = c->i; i < c->n; i++) {
        size_t l = c->iov[i].iov_len - (i == c->i ? c->off : 0);
        if (l > (size_t)SSIZE_MAX - t)
            return -EINVAL;
        t += l;
    }
    return (ssize_t)t;
}

/* A stream send of len bytes: from src (memlan_send), or from the cursor c (memlan_sendv: the
 * bytes of all the vector's pieces go into the ring together, a chunk at a time, so a vector
 * costs the publications and wake-up checks of one buffer of its total length, not one per
 * piece).  One buffer keeps its plain copy: through the cursor, a 64 B send and receive in one
 * thread took 16 ns against 11. */
static ssize_t ml_stream_send(memlan_channel_t *ch, const uint8_t *src, struct ml_iov_cur *c,
                              size_t len, int flags)
{
    int e;
    size_t done = 0;
    /* A whole send (the socket layer's blocking send of up to half a ring) is one publication,
     * as its one reserve and commit were: a reader never sees part of it. */
    const uint64_t chunk = (flags & ML_SEND_WHOLE) ? UINT64_MAX : ml_stream_chunk(ch);
    uint64_t unwoken = 0; /* published since our last look at the consumer's tripwire */
    bool first = true;
    int mid = -1; /* checks in mid-copy: not yet asked */
    if (ml_unlikely(ch->tx.swg || ch->tx.gmaybe))
        ml_grow_idle(ch);
    while (done < len) {
        int64_t fr = ml_ring_free(&ch->tx, 1);
        if (ml_unlikely(fr < 0)) {
            ml_tx_wake_pending(ch, &unwoken);
            return done ? (ssize_t)done : -EPROTO;
        }
        if (fr == 0 && ch->tx.gsize && ml_grow(ch))
            continue;
        if (fr == 0) {
            /* The consumer hears of what we published before we stop or wait: a wait here
             * with its wake-up still owed would be each side waiting for the other. */
            ml_tx_wake_pending(ch, &unwoken);
            if (done && (flags & MEMLAN_DONTWAIT)) {
                atomic_fetch_add_explicit(&ch->tx_short, 1, memory_order_relaxed);
                break;
            }
            ml_full_look(ch);
            if ((e = ml_tx_error(ch)))
                return done ? (ssize_t)done : e;
            if (flags & MEMLAN_DONTWAIT) {
                ml_eagain(ch, MEMLAN_EV_WRITE);
                return -EAGAIN;
            }
            /* Wait for half the ring (or what is left to send), not for one byte: the
             * consumer then wakes us once per batch rather than once per release. */
            uint64_t want = len - done < ch->size / 2 ? len - done : ch->size / 2;
            atomic_fetch_add_explicit(&ch->tx_short, 1, memory_order_relaxed);
            int r = __ml_chan_wait_tx(ch, want);
            if (r < 0 || (e = ml_tx_error(ch)))
                return done ? (ssize_t)done : (e ? e : r);
            continue;
        }
        /* One chunk at a time, each published as soon as it is copied: the consumer copies
         * out the first while we copy in the next (see design.md, "Stream chunks"). */
        uint64_t n = len - done < (uint64_t)fr ? len - done : (uint64_t)fr;
        if (n > chunk)
            n = chunk;
        /* A region's end cuts the copy in two (no second view), not the publication. */
        uint64_t run = ml_ring_wr_run(&ch->tx, n);
        if (c) {
            ml_gather(ml_ring_wr(&ch->tx), c, run);
            if (run < n)
                ml_gather(ch->tx.gdata, c, n - run);
        } else {
            memcpy(ml_ring_wr(&ch->tx), src + done, run);
            if (run < n)
                memcpy(ch->tx.gdata, src + done + run, n - run);
        }
        ml_ring_produce(&ch->tx, n, ml_ring_nofence(&ch->tx, &ch->tx.ctl->rx_mb, &ch->tx.ctl->rx_mb_ack));
        ml_mb_busy(ch, &ch->tx, &ch->tx.ctl->tx_mb, &ch->tx.ctl->tx_mb_ack);
        ch->bytes_tx += n;
        unwoken += n;
        done += n;
        if (done < len && (first || unwoken >= ch->size / 2)) {
            first = false;
            if (mid < 0)
                mid = ml_peer_elsewhere(&ch->tx.ctl->rx_cpu);
            if (mid)
                ml_tx_wake_pending(ch, &unwoken);
        }
    }
    ml_tx_wake_pending(ch, &unwoken);
    return (ssize_t)done;
}

/* A message of len bytes, from src or gathered from the cursor c: whole or not at all. */
static ssize_t ml_msg_send(memlan_channel_t *ch, const void *src, struct ml_iov_cur *c,
                           size_t len, int flags)
{
    if (len > memlan_channel_max_msg(ch))
        return -EMSGSIZE;
    void *p;
    ssize_t r = ml_reserve(ch, &p, len, flags, true);
    if (r < 0)
        return r;
    if (c)
        ml_gather(p, c, len);
    else if (len) /* src may be NULL for an empty message */
        memcpy(p, src, len);
    r = memlan_commit(ch, len);
    return r < 0 ? r : (ssize_t)len;
}

ssize_t memlan_send(memlan_channel_t *ch, const void *buf, size_t len, int flags)
{
    if (!ch || (!buf && len))
        return -EINVAL;
    int e = ml_tx_error(ch);
    if (e)
        return e;
    return ch->kind == MEMLAN_MSG ? ml_msg_send(ch, buf, NULL, len, flags)
                                  : ml_stream_send(ch, buf, NULL, len, flags);
}

ssize_t __ml_chan_sendv(struct memlan_channel *ch, struct ml_iov_cur *c, int flags)
{
    if (ml_unlikely(ml_load_relaxed(&ch->nopost_mine)))
        __ml_chan_nopost_retry(ch);
    ssize_t len = ml_iov_left(c);
    if (len < 0)
        return len;
    int e = ml_tx_error(ch);
    if (e)
        return e;
    if (ch->kind == MEMLAN_MSG)
        return ml_msg_send(ch, NULL, c, (size_t)len, flags);
    if (c->n - c->i == 1) { /* one piece left (a send, a write): the plain copy */
        const uint8_t *src = (const uint8_t *)c->iov[c->i].iov_base + c->off;
        ssize_t r = ml_stream_send(ch, src, NULL, (size_t)len, flags);
        if (r > 0 && (c->off += (size_t)r) == c->iov[c->i].iov_len) {
            c->i++;
            c->off = 0;
        }
        return r;
    }
    return ml_stream_send(ch, NULL, c, (size_t)len, flags);
}

ssize_t memlan_sendv(memlan_channel_t *ch, const struct iovec *iov, int iovcnt, int flags)
{
    if (!ch || iovcnt < 0 || iovcnt > IOV_MAX || (!iov && iovcnt))
        return -EINVAL;
    for (int i = 0; i < iovcnt; i++)
        if (!iov[i].iov_base && iov[i].iov_len)
            return -EINVAL;
    struct ml_iov_cur c = {.iov = iov, .n = iovcnt};
    return __ml_chan_sendv(ch, &c, flags);
}

ssize_t memlan_reserve(memlan_channel_t *ch, void **ptr, size_t min, int flags)
{
    if (!ch || !ptr)
        return -EINVAL;
    return ml_reserve(ch, ptr, min, flags, false);
}

/* checked: the caller has just called ml_tx_error(), which need not be asked again before the
 * first look at the ring. */
static ssize_t ml_reserve(memlan_channel_t *ch, void **ptr, size_t min, int flags, bool checked)
{
    *ptr = NULL;
    uint64_t need = min ? min : 1;
    if (ch->kind == MEMLAN_MSG) {
        if (min > memlan_channel_max_msg(ch))
            return -EMSGSIZE;
        need = ml_msg_rec(min) + sizeof(struct ml_msg_hdr); /* and the next header slot */
    } else if (min > ch->size || (ch->tx.gsize && min > 1)) {
        /* (a growing ring's region has no second view: a reservation there gives the run to
         * its end, which a larger minimum could wait on for ever; __ml_chan_tx_room instead) */
        return -EMSGSIZE;
    } else if (ml_unlikely(ch->tx.swg || ch->tx.gmaybe)) {
        ml_grow_idle(ch);
    }
    for (;;) {
        int e = checked ? 0 : ml_tx_error(ch);
        checked = false;
        if (e)
            return e;
        int64_t fr = ml_ring_free(&ch->tx, need);
        if (ml_unlikely(fr < 0))
            return -EPROTO;
        if ((uint64_t)fr < need && ch->tx.gsize && ml_grow(ch))
            continue;
        if ((uint64_t)fr >= need) {
            uint8_t *p = ml_ring_wr(&ch->tx);
            if (ch->kind == MEMLAN_MSG) {
                ch->reserved = min;
                *ptr = p + sizeof(struct ml_msg_hdr);
                return (ssize_t)min;
            }
            fr = (int64_t)ml_ring_wr_run(&ch->tx, (uint64_t)fr); /* need is 1 when growing */
            ch->reserved = (uint64_t)fr;
            *ptr = p;
            return (ssize_t)fr;
        }
        if (flags & MEMLAN_DONTWAIT) {
            ml_eagain(ch, MEMLAN_EV_WRITE);
            return -EAGAIN;
        }
        atomic_fetch_add_explicit(&ch->tx_short, 1, memory_order_relaxed);
        int r = __ml_chan_wait_tx(ch, need);
        if (r < 0 && (e = ml_tx_error(ch)))
            return e;
        if (r < 0)
            return r;
    }
}

int memlan_commit(memlan_channel_t *ch, size_t len)
{
    if (!ch)
        return -EINVAL;
    if (len > ch->reserved)
        return -EINVAL;
    ch->reserved = 0;
    if (ch->kind == MEMLAN_MSG) {
        if (ml_unlikely(ch->tx.corrupt)) /* tx.pos may be anywhere: write no header there */
            return -EPROTO;
        ml_tx_publish(ch, ml_msg_publish(&ch->tx, (uint32_t)len));
        ch->msgs_tx++;
        return 0;
    }
    if (len)
        ml_tx_publish(ch, len);
    return 0;
}

/* ---- receive ----------------------------------------------------------------------------- */

/* ml_rx_avail less the bytes a receive passes over unread (an urgent byte out of line, which a
 * peek leaves in the ring): "nothing" to the waits below, which would else find it for ever. */
static int64_t ml_rx_avail_inband(struct memlan_channel *ch, bool head_too)
{
    int64_t a = ml_rx_avail(ch, head_too);
    return a > 0 ? a - (int64_t)ml_rx_urg_skip_ro(ch, (uint64_t)a) : a;
}

/* Nothing to read: EOF, an error, -EAGAIN, or 1 = wait and try again. */
static int ml_rx_empty(struct memlan_channel *ch, int flags)
{
    if (ch->shut_rd || ch->rd_eof_when_empty)
        return 0;
    uint32_t ps = ml_peer_state(ch);
    if (ps != ML_SIDE_OPEN) {
        /* The peer's data happened before its state change: look once more. */
        int64_t a = ml_rx_avail_inband(ch, true);
        if (a < 0)
            return -EPROTO;
        return a > 0 ? 1 : 0;
    }
    if (ch->peer_dead || ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE) {
        int64_t a = ml_rx_avail_inband(ch, true);
        return a > 0 ? 1 : ch->peer_dead ? ml_dead_err(ch) : -ECONNRESET;
    }
    if (flags & MEMLAN_DONTWAIT) {
        /* A message ring's recv looked at the record header only: head too, before saying
         * there is nothing (a head that does not fit is found corrupt here). */
        if (ch->kind == MEMLAN_MSG) {
            int64_t a = ml_rx_avail_inband(ch, true);
            if (a != 0)
                return a < 0 ? -EPROTO : 1;
        }
        ml_eagain(ch, MEMLAN_EV_READ);
        return -EAGAIN;
    }
    int r = __ml_chan_wait_rx(ch, flags);
    if (r == -ECONNRESET || r == -ENOTCONN) {
        int64_t a = ml_rx_avail_inband(ch, true);
        return a > 0 ? 1 : r;
    }
    if (r == -EINTR || r == -EAGAIN || r == -ETIMEDOUT)
        return r;
    return 1;
}

/*
 * The quick look (design.md, "A receive looks again before it waits"): a blocking receive that
 * finds the ring empty, when its last wait ended by spinning, looks a few more times, a pause
 * apart, before it takes the wait.  The rounds are the first of the wait's own spin, which reads
 * no clock and asks nothing else before its 32nd (__ml_spin_run): what they leave out is the
 * wait's set-up and, when the answer comes within them, its way out (the cpu words, the
 * policy's bookkeeping, a locked add), which a request and its reply pay on each side of every
 * round trip.  Where the policy does not spin (the peer on our cpu, MEMLAN_SPIN_US=0, one cpu)
 * the last wait did not end by spinning, and nothing changes.  true: something to look at
 * (bytes, a record, or a corrupt ring).
 */
#define ML_RX_QUICK_ROUNDS 31

static bool ml_rx_quick(struct memlan_channel *ch, int flags)
{
    if (!ch->rx_spin_first || (flags & MEMLAN_DONTWAIT))
        return false;
    for (int k = 0; k < ML_RX_QUICK_ROUNDS; k++) {
        ml_cpu_relax();
        if (ml_rx_avail_inband(ch, false) != 0) {
            ch->rx_quick_hits++;
            ml_store_relaxed(&ch->rx.ctl->spin_hits,
                             __atomic_load_n(&ch->spin_hits, __ATOMIC_RELAXED) + ch->rx_quick_hits);
            return true;
        }
    }
    return false;
}

static inline void ml_rx_release(struct memlan_channel *ch, uint64_t n)
{
    ml_ring_consume(&ch->rx, n, ml_ring_nofence(&ch->rx, &ch->rx.ctl->tx_mb, &ch->rx.ctl->tx_mb_ack));
    ch->bytes_rx += n;
    __ml_chan_wake_rmw(ch, &ch->rx.ctl->tx_wait, ch->rx_refs->tx);
    ml_mb_busy(ch, &ch->rx, &ch->rx.ctl->rx_mb, &ch->rx.ctl->rx_mb_ack);
}

/* ---- urgent data (the socket layer's: sock.c, "Urgent data"; design.md) ------------------- */

bool (*__ml_urg_inline_hook)(struct memlan_channel *ch);

static struct ml_sock_side *ml_peer_sock_side(const struct memlan_channel *ch)
{
    return (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF) + (1 - ch->side);
}

static struct ml_sock_side *ml_own_sock_side(const struct memlan_channel *ch)
{
    return (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF) + ch->side;
}

/* SO_OOBINLINE, asked of the socket layer (a system call on the kernel socket) once per urgent
 * byte u met, where a fork sibling may have set it since; one this process sets is noted at
 * once (the socket layer's setsockopt). */
static bool ml_urg_inline(struct memlan_channel *ch, uint64_t u)
{
    if (!ch->urg_inline_known || ch->urg_inline_u != u) {
        ch->urg_inline = __ml_urg_inline_hook && __ml_urg_inline_hook(ch);
        ch->urg_inline_known = true;
        ch->urg_inline_u = u;
    }
    return ch->urg_inline;
}

bool __ml_chan_urg_inline(struct memlan_channel *ch)
{
    uint64_t u = ch->sock_ino ? ml_load_acquire(&ml_peer_sock_side(ch)->urg) : 0;
    return ml_urg_inline(ch, u);
}

/* What a receive at position pos, with a bytes readable (a >= 0), makes of the peer's urgent
 * byte u (its position + 1): skip, the bytes at the front it passes over unread (earlier urgent
 * bytes Linux dropped while the reads stood at them: urg_skip..urg_skip_end; and the urgent byte
 * itself, out of line, at the mark); take, the bytes it may read after them, up to the mark (all,
 * in line at the mark); at, our position is at the mark (after the dropped ones); stop, a receive
 * that has copied bytes ends here (copied), as TCP's tcp_recvmsg ends at the mark. */
struct ml_urg_view {
    uint64_t skip, take, drop; /* drop: of skip, the earlier urgent bytes */
    bool at, stop;
};

static void ml_urg_view(struct memlan_channel *ch, const struct ml_sock_side *ps, uint64_t u,
                        uint64_t pos, uint64_t a, bool copied, struct ml_urg_view *v)
{
    *v = (struct ml_urg_view){0, a, 0, false, false};
    uint64_t lo = ml_load_relaxed(&ps->urg_skip), hi = ml_load_relaxed(&ps->urg_skip_end);
    if (ml_unlikely(lo != 0 && pos + 1 >= lo && pos < hi && hi < u) && !ml_urg_inline(ch, u)) {
        uint64_t n = hi - pos < a ? hi - pos : a;
        v->skip = v->drop = n;
        pos += n;
        a -= n;
    }
    uint64_t d = u - 1 - pos;
    v->at = d == 0;
    if (d == 0 && copied && !v->skip) {
        v->stop = true;
        v->take = 0;
    } else if (d == 0 && a > 0 && !ml_urg_inline(ch, u)) {
        v->skip++;
        v->take = a - 1;
    } else {
        v->take = d > 0 && d < a ? d : a; /* before the mark; or in line at it, or not here */
    }
}

/*
 * The bytes a stream receive at our position may take of the a readable ones (the rx direction
 * held), by ml_urg_view: the bytes it passes over are released here (skipped NULL), or counted
 * in *skipped for a peek, which takes its bytes after them and releases them with its own
 * (memlan_release); *stop: the call ends with what it has.  The mark is read after the head
 * that made a (an acquire, as every look at head is): the sender stores it before it publishes
 * the byte, so a byte seen here is never read past unmarked.  A channel without a kernel socket
 * under it (the native face) has no urgent data.
 */
static int64_t ml_rx_urg_cut(struct memlan_channel *ch, int64_t a, bool copied, bool *stop,
                             uint64_t *skipped)
{
    if (!ch->sock_ino || a <= 0 || ch->kind != MEMLAN_STREAM)
        return a;
    struct ml_sock_side *ps = ml_peer_sock_side(ch);
    uint64_t u = ml_load_acquire(&ps->urg);
    if (ml_likely(u == 0))
        return a;
    /* A mark: the head afresh (a cached head may show fewer bytes than the marks need: a
     * splice that saw half of two dropped bytes spun, a review), then the mark again, after
     * it, as above. */
    int64_t fresh = ml_ring_avail(&ch->rx, ch->rx.cap + 1);
    if (fresh > a) {
        a = fresh;
        u = ml_load_acquire(&ps->urg);
    }
    struct ml_urg_view v;
    ml_urg_view(ch, ps, u, ch->rx.pos, (uint64_t)a, copied, &v);
    if (v.stop) {
        *stop = true;
        return 0;
    }
    if (v.skip) {
        if (skipped)
            *skipped = v.skip;
        else
            ml_rx_release(ch, v.skip);
    }
    return (int64_t)v.take;
}

/* Read-only: of the a bytes readable at our published position, those a receive would pass
 * over unread (readiness counts the rest). */
static uint64_t ml_rx_urg_skip_ro(struct memlan_channel *ch, uint64_t a)
{
    if (!ch->sock_ino || ch->kind != MEMLAN_STREAM)
        return 0;
    struct ml_sock_side *ps = ml_peer_sock_side(ch);
    uint64_t u = ml_load_acquire(&ps->urg);
    if (ml_likely(u == 0))
        return 0;
    struct ml_urg_view v;
    ml_urg_view(ch, ps, u, ml_ring_pub(&ch->rx, memory_order_acquire), a, false, &v);
    return v.skip;
}

/* The rx direction held: how far our position is from the peer's urgent byte, or -1 (none ahead
 * of us).  A receive that waits for more (MSG_WAITALL, SO_RCVLOWAT) ends at 0, as TCP's does. */
int64_t __ml_chan_rx_urg_dist(struct memlan_channel *ch)
{
    if (!ch->sock_ino || ch->kind != MEMLAN_STREAM)
        return -1;
    struct ml_sock_side *ps = ml_peer_sock_side(ch);
    uint64_t u = ml_load_acquire(&ps->urg);
    if (u == 0)
        return -1;
    /* from past the earlier urgent bytes Linux dropped where we stand (ml_urg_view), the head
     * afresh (see ml_rx_urg_cut) */
    int64_t a = ml_ring_avail(&ch->rx, ch->rx.cap + 1);
    struct ml_urg_view v;
    ml_urg_view(ch, ps, u, ch->rx.pos, a > 0 ? (uint64_t)a : 0, true, &v);
    int64_t d = (int64_t)(u - 1 - (ch->rx.pos + v.drop));
    return d < 0 ? -1 : d;
}

/* The rx direction held: release the bytes a receive passes over at our position (an urgent
 * byte out of line, the earlier ones Linux dropped), as a receive that finds them does; for a
 * receive that copies nothing (MSG_TRUNC), whose peeks leave them. */
void __ml_chan_rx_pass_over(struct memlan_channel *ch)
{
    int64_t a = ml_rx_avail(ch, false);
    bool stop = false;
    if (a > 0)
        (void)ml_rx_urg_cut(ch, a, false, &stop, NULL);
}

uint64_t __ml_chan_tx_pos(const struct memlan_channel *ch) { return ch->tx.pos; }
uint64_t __ml_chan_rx_pos_ro(const struct memlan_channel *ch) { return ch->rx.pos; }

/* The peer's position in our sending ring as it last published it (hostile: a hint only). */
uint64_t __ml_chan_tx_peer_pos(const struct memlan_channel *ch)
{
    return ml_load_acquire(&ch->tx.ctl->tail);
}

/*
 * The peer's latest urgent byte against our position, read-only (the socket layer's SIOCATMARK,
 * recv(MSG_OOB), FIONREAD and POLLPRI): 0 when there is none to speak of (none sent, or our
 * reads went past it, as TCP forgets it then); else ML_URG_PENDING, with ML_URG_AT where our
 * position is at it, ML_URG_HERE once it is in the ring, ML_URG_TAKEN once a recv(MSG_OOB) of
 * any holder of our side took it (our side's block: fork children share it), ML_URG_ONLY where
 * every readable byte is one a receive passes over; *byte is its value, *before the bytes a
 * receive may read before it.  take: a recv(MSG_OOB) takes it now, if it is here and untaken.
 */
int __ml_chan_urg_state(struct memlan_channel *ch, uint8_t *byte, int64_t *before, bool take)
{
    if (!ch->sock_ino || ch->kind != MEMLAN_STREAM)
        return 0;
    struct ml_sock_side *ps = ml_peer_sock_side(ch);
    uint64_t u = ml_load_acquire(&ps->urg);
    if (u == 0)
        return 0;
    uint64_t pos = ml_ring_pub(&ch->rx, memory_order_acquire);
    uint64_t h = ml_load_acquire(&ch->rx.ctl->head);
    uint64_t a = h - pos <= ch->rx.cap ? h - pos : 0;
    struct ml_urg_view v;
    ml_urg_view(ch, ps, u, pos, a, false, &v);
    uint64_t m = u - 1;
    if ((int64_t)(m - (pos + v.drop)) < 0)
        return 0; /* read past */
    int st = ML_URG_PENDING | (v.at ? ML_URG_AT : 0);
    if (a > m - pos && m - pos <= ch->rx.cap)
        st |= ML_URG_HERE;
    if (a > 0 && v.skip == a)
        st |= ML_URG_ONLY;
    _Atomic uint64_t *tk = &ml_own_sock_side(ch)->urg_taken;
    if (ml_load_relaxed(tk) == u)
        st |= ML_URG_TAKEN;
    *byte = (uint8_t)ml_load_relaxed(&ps->urg_byte);
    if (before)
        *before = v.at ? 0 : (int64_t)v.take;
    if (take && (st & ML_URG_HERE) && !(st & ML_URG_TAKEN))
        ml_store_relaxed(tk, u);
    return st;
}

/*
 * The next message, validated: *len its payload length, return the record length, 0 if none,
 * -EPROTO if the record is malformed.  The length is read from shared memory exactly once.
 */
static int64_t ml_msg_next(struct memlan_channel *ch, uint64_t avail, const uint8_t **payload,
                           uint64_t *len)
{
    if (avail == 0)
        return 0;
    /* Alignment and room for the header first: only then is the header read. */
    if (avail < sizeof(struct ml_msg_hdr) || (ch->rx.pos & (ML_MSG_ALIGN - 1))) {
        ch->rx.corrupt = true;
        return -EPROTO;
    }
    const struct ml_msg_hdr *h = (const struct ml_msg_hdr *)ml_ring_at(&ch->rx, ch->rx.pos);
    uint32_t l = __atomic_load_n(&h->len, __ATOMIC_RELAXED);
    uint64_t rec = sizeof *h + (((uint64_t)l + ML_MSG_ALIGN - 1) & ~(uint64_t)(ML_MSG_ALIGN - 1));
    if (rec > avail) {
        ch->rx.corrupt = true;
        return -EPROTO;
    }
    *payload = (const uint8_t *)(h + 1);
    *len = l;
    return (int64_t)rec;
}

static ssize_t ml_recv(memlan_channel_t *ch, uint8_t *dst, size_t len, int flags,
                       uint64_t *unwoken);

ssize_t memlan_recv(memlan_channel_t *ch, void *buf, size_t len, int flags)
{
    if (!ch || (!buf && len))
        return -EINVAL;
    uint64_t unwoken = 0;
    ssize_t r = ml_recv(ch, buf, len, flags, &unwoken);
    ml_rx_wake_pending(ch, &unwoken); /* the producer hears of the room before we return */
    return r;
}

/* memlan_recv; *unwoken: stream bytes released with the producer's wake-up still owed. */
static ssize_t ml_recv(memlan_channel_t *ch, uint8_t *dst, size_t len, int flags,
                       uint64_t *unwoken)
{
    size_t done = 0;
    const uint64_t chunk = ml_stream_chunk(ch);
    int mid = -1; /* checks in mid-copy: not yet asked */
    for (;;) {
        if (ml_unlikely(ch->rx.corrupt))
            return done ? (ssize_t)done : -EPROTO;
        if (ch->shut_rd)
            return (ssize_t)done;
        int64_t a = ml_rx_avail(ch, false);
        if (ml_unlikely(a < 0))
            return done ? (ssize_t)done : -EPROTO;
        bool stop = false;
        a = ml_rx_urg_cut(ch, a, done != 0, &stop, NULL);
        if (ml_unlikely(stop))
            return (ssize_t)done; /* at the peer's urgent byte, with bytes before it */
        if (a > 0 && (len || ch->kind == MEMLAN_MSG)) {
            if (ch->kind == MEMLAN_MSG) {
                const uint8_t *p;
                uint64_t l;
                int64_t rec = ml_msg_next(ch, (uint64_t)a, &p, &l);
                if (rec < 0)
                    return rec;
                size_t n = l < len ? (size_t)l : len;
                if (n) /* buf may be NULL when len is 0 */
                    memcpy(dst, p, n);
                ml_rx_release(ch, (uint64_t)rec);
                ch->msgs_rx++;
                return (ssize_t)n;
            }
            /* A chunk at a time, each released as soon as it is copied out: the producer
             * refills the ring behind us.  Its wake-up waits for half a ring's worth (a blocked
             * producer waits for that much room) when it waits on another cpu, else for the
             * end of the call. */
            const uint8_t *src;
            int64_t run = ml_ring_rd(&ch->rx, (uint64_t)a, &src);
            if (ml_unlikely(run < 0))
                return done ? (ssize_t)done : -EPROTO;
            uint64_t n = len - done < (uint64_t)run ? len - done : (uint64_t)run;
            if (n > chunk)
                n = chunk;
            memcpy(dst + done, src, n);
            ml_ring_consume(&ch->rx, n, ml_ring_nofence(&ch->rx, &ch->rx.ctl->tx_mb, &ch->rx.ctl->tx_mb_ack));
            ml_mb_busy(ch, &ch->rx, &ch->rx.ctl->rx_mb, &ch->rx.ctl->rx_mb_ack);
            ch->bytes_rx += n;
            *unwoken += n;
            done += n;
            if (done == len)
                return (ssize_t)done;
            if (*unwoken >= ch->size / 2) {
                if (mid < 0)
                    mid = ml_peer_elsewhere(&ch->rx.ctl->tx_cpu);
                if (mid)
                    ml_rx_wake_pending(ch, unwoken);
            }
            /* Not full yet: take what else is there, what came meanwhile included (the
             * look reloads head once our cached copy is used up), as the kernel's
             * tcp_recvmsg copies on while its queue has data.  Waits only with WAITALL. */
            continue;
        }
        if (len == 0)
            return 0;
        if (done && !(flags & MEMLAN_WAITALL))
            return (ssize_t)done;
        ml_rx_wake_pending(ch, unwoken); /* before any wait: the producer may wait for room */
        if (ml_rx_quick(ch, done ? (flags & ~MEMLAN_DONTWAIT) : flags))
            continue;
        int r = ml_rx_empty(ch, done ? (flags & ~MEMLAN_DONTWAIT) : flags);
        if (r <= 0)
            return done ? (ssize_t)done : r;
    }
}

/* Bytes readable at our position (> 0), waiting for them unless MEMLAN_DONTWAIT; or what the
 * call returns instead: 0 at end of stream, -errno (ml_rx_empty). */
static int64_t ml_rx_wait_avail(struct memlan_channel *ch, int flags, uint64_t *skip)
{
    for (;;) {
        if (ml_unlikely(ch->rx.corrupt))
            return -EPROTO;
        if (ch->shut_rd)
            return 0;
        int64_t a = ml_rx_avail(ch, false);
        if (ml_unlikely(a < 0))
            return -EPROTO;
        bool stop = false;
        *skip = 0;
        a = ml_rx_urg_cut(ch, a, false, &stop, skip); /* bytes after *skip, left in the ring */
        ch->rx_skip_seen = *skip;
        if (a > 0)
            return a;
        if (ml_rx_quick(ch, flags))
            continue;
        int r = ml_rx_empty(ch, flags);
        if (r <= 0)
            return r;
    }
}

int memlan_recv_msgs(memlan_channel_t *ch, struct memlan_msg *v, unsigned n, int flags)
{
    if (!ch || (!v && n) || ch->kind != MEMLAN_MSG)
        return -EINVAL;
    if (n == 0)
        return 0;
    if (n > INT_MAX)
        n = INT_MAX;
    uint64_t skip;
    int64_t a = ml_rx_wait_avail(ch, flags, &skip);
    if (a <= 0)
        return (int)a;
    /* Each record is read where the one before it ended: the position moves on privately, and
     * one release publishes it and tells the sender of the room, for them all.  At most n,
     * whatever the peer publishes meanwhile; a corrupt record after the first ends the batch
     * before it (rx.corrupt stays set: the next call and poll report it). */
    unsigned k = 0;
    uint64_t total = 0;
    for (;;) {
        const uint8_t *p;
        uint64_t l;
        int64_t rec = ml_msg_next(ch, (uint64_t)a, &p, &l);
        if (rec <= 0)
            break;
        size_t c = l < v[k].len ? (size_t)l : v[k].len;
        if (c)
            memcpy(v[k].buf, p, c);
        v[k].got = c;
        k++;
        ch->rx.pos += (uint64_t)rec;
        total += (uint64_t)rec;
        if (k == n || (a = ml_rx_avail(ch, false)) <= 0)
            break;
    }
    if (total) {
        ch->msgs_rx += k;
        ch->rx.ops += k - 1;  /* one a message, as memlan_recv counts (the barrier policy) */
        ch->bytes_rx += total;
        ml_rx_release(ch, 0); /* publishes the position moved above */
    }
    return k ? (int)k : -EPROTO;
}

ssize_t memlan_peek(memlan_channel_t *ch, const void **ptr, int flags)
{
    if (!ch || !ptr)
        return -EINVAL;
    *ptr = NULL;
    uint64_t skip;
    int64_t a = ml_rx_wait_avail(ch, flags, &skip);
    if (a <= 0)
        return (ssize_t)a;
    if (ch->kind == MEMLAN_MSG) {
        const uint8_t *p;
        uint64_t l;
        int64_t rec = ml_msg_next(ch, (uint64_t)a, &p, &l);
        if (rec < 0)
            return rec;
        ch->peeked = (uint64_t)rec;
        *ptr = p;
        return (ssize_t)l;
    }
    const uint8_t *p;
    ch->rx.pos += skip; /* after the bytes a receive passes over (an urgent byte out of line) */
    int64_t run = ml_ring_rd(&ch->rx, (uint64_t)a, &p);
    ch->rx.pos -= skip;
    if (run < 0)
        return -EPROTO;
    ch->peeked = (uint64_t)run;
    ch->peek_skip = skip; /* released with the first byte memlan_release takes */
    *ptr = p;
    return (ssize_t)run;
}

ssize_t __ml_chan_peek_runs(struct memlan_channel *ch, struct iovec *run, int max, int *nrun,
                            int flags)
{
    *nrun = 0;
    /* The head, not our cached copy: a peek that waits for more (MSG_WAITALL) looks again and
     * again, and the cached copy never grew while it was not used up (the wait for the rest
     * of a 60 KB peek whose first half was there went on for ever). */
    if (ch->kind == MEMLAN_STREAM && !ch->rx.corrupt)
        (void)ml_ring_avail(&ch->rx, ch->rx.cap + 1);
    const void *p;
    ssize_t first = memlan_peek(ch, &p, flags);
    if (first <= 0)
        return first;
    run[0] = (struct iovec){(void *)p, (size_t)first};
    *nrun = 1;
    if (ch->kind != MEMLAN_STREAM || !ch->rx.gsize)
        return first;
    /* What follows lies in the other area, or at the region's start: at most the ring's run
     * up to a switch and the region's in two (the producer cannot switch again before we read
     * past the switch: one outstanding). */
    int64_t a = ml_ring_avail(&ch->rx, 1);
    if (a < 0)
        return -EPROTO;
    /* The bytes memlan_peek passed over, then not past the peer's urgent byte. */
    uint64_t sk = ch->peek_skip, at = ch->rx.pos, got = (uint64_t)first;
    a -= (int64_t)sk;
    int64_t d = __ml_chan_rx_urg_dist(ch);
    if (d >= (int64_t)sk && d - (int64_t)sk < a)
        a = d - (int64_t)sk > (int64_t)got ? d - (int64_t)sk : (int64_t)got;
    while (*nrun < max && got < (uint64_t)a) {
        ch->rx.pos = at + sk + got;
        const uint8_t *q;
        int64_t more = ml_ring_rd(&ch->rx, (uint64_t)a - got, &q);
        if (more <= 0)
            break;
        run[(*nrun)++] = (struct iovec){(void *)q, (size_t)more};
        got += (uint64_t)more;
    }
    ch->rx.pos = at;
    if (ch->rx.corrupt)
        return -EPROTO;
    ch->peeked = got;
    return (ssize_t)got;
}

/* A blocking send of at most half a stream ring goes in whole or not at all: the room it needs
 * now (growing the ring into its region when that is what gives it), else -EAGAIN; the caller,
 * who holds the direction, then sends with __ml_chan_sendv(ML_SEND_WHOLE), which finds no
 * less (the peer's reads only add room) unless the ring turns out corrupt. */
ssize_t __ml_chan_tx_room(struct memlan_channel *ch, uint64_t want)
{
    int e = ml_tx_error(ch);
    if (e)
        return e;
    if (ml_unlikely(ch->tx.swg || ch->tx.gmaybe))
        ml_grow_idle(ch);
    int64_t fr = ml_ring_free(&ch->tx, want);
    if (fr >= 0 && (uint64_t)fr < want && ch->tx.gsize && ml_grow(ch))
        fr = ml_ring_free(&ch->tx, want);
    if (fr < 0)
        return -EPROTO;
    if ((uint64_t)fr < want) {
        ml_eagain(ch, MEMLAN_EV_WRITE);
        return -EAGAIN;
    }
    return (ssize_t)fr;
}

int memlan_release(memlan_channel_t *ch, size_t len)
{
    if (!ch)
        return -EINVAL;
    if (ch->kind == MEMLAN_MSG) {
        if (!ch->peeked)
            return -EINVAL;
        ml_rx_release(ch, ch->peeked);
        ch->msgs_rx++;
    } else {
        if (len > ch->peeked)
            return -EINVAL;
        if (len)
            ml_rx_release(ch, len + ch->peek_skip);
    }
    ch->peeked = 0;
    ch->peek_skip = 0;
    return 0;
}

/* ---- state ------------------------------------------------------------------------------- */

int memlan_shutdown(memlan_channel_t *ch, int how)
{
    if (!ch || how < MEMLAN_SHUT_RD || how > MEMLAN_SHUT_RDWR)
        return -EINVAL;
    if (how & MEMLAN_SHUT_RD)
        ch->shut_rd = true;
    if ((how & MEMLAN_SHUT_WR) && !ch->shut_wr) {
        ch->shut_wr = true;
        ml_set_state(ch, ML_SIDE_SHUT_WR);
    }
    return 0;
}

int memlan_channel_poll(memlan_channel_t *ch)
{
    if (!ch)
        return -EINVAL;
    int ev = 0;
    if (ch->rx.corrupt || ch->tx.corrupt)
        return MEMLAN_EV_READ | MEMLAN_EV_WRITE | MEMLAN_EV_ERR;
    if (ml_load_relaxed(&ch->seg->hdr->state) != ML_SEG_LIVE || ch->peer_dead)
        ev |= MEMLAN_EV_ERR | MEMLAN_EV_HUP | MEMLAN_EV_READ | MEMLAN_EV_WRITE;
    uint32_t ps = ml_peer_state(ch);
    /* Read-only (see __ml_chan_rx_avail_ro): the event queue's collect asks this of channels
     * that other threads may be sending or receiving on.  -1: cannot tell, go and look. */
    if (__ml_chan_rx_inband_ro(ch) || ps != ML_SIDE_OPEN || ch->shut_rd) /* (as ml_rx_ready_ro) */
        ev |= MEMLAN_EV_READ;
    if (ps != ML_SIDE_OPEN)
        ev |= MEMLAN_EV_HUP;
    int64_t w = ch->kind == MEMLAN_MSG ? 2 * (int64_t)sizeof(struct ml_msg_hdr) : 1;
    int64_t f = __ml_chan_tx_free_ro(ch);
    if (f < 0 || f >= w || ps == ML_SIDE_CLOSED || ch->shut_wr)
        ev |= MEMLAN_EV_WRITE;
    if (ch->rx.corrupt || ch->tx.corrupt)
        ev |= MEMLAN_EV_ERR;
    return ev;
}

void __ml_chan_end(struct memlan_channel *ch)
{
    if (!ch)
        return;
    if (ch->evq)
        (void)memlan_evq_del(ch->evq, ch);
    ml_set_state(ch, ML_SIDE_CLOSED);
    __ml_chan_sio_drop(ch); /* after the end's wake-up, which may ring */
    /* The creator ended without closing (it died, or exited with processes of its sharing the
     * side, which keep its file's name) and we saw it gone: its file is nobody's now, and the
     * last side to let go removes its name (ml_seg_unlink checks it is still this file).  Only
     * what is known: asking the creator's lock here would cost every close of an acceptor whose
     * client is still open system calls; a creator we did not see die leaves its file to the
     * next sweep, and one that closed removed it itself. */
    if (ch->side == 1 && !ch->seg->owner && ch->peer_dead &&
        ml_peer_state(ch) != ML_SIDE_CLOSED)
        ch->seg->owner = true;
    /* The creator left us the name (ml_chan_name_left): our state first, then its flag. */
    struct ml_sock_side *sides = (struct ml_sock_side *)(ch->seg->base + ML_CHAN_SOCK_OFF);
    atomic_thread_fence(memory_order_seq_cst);
    if (ch->side == 1 && !ch->seg->owner &&
        (atomic_load(&sides[0].flags) & ML_SOCK_NAME_LEFT))
        ch->seg->owner = true;
    if (ch->seg->owner) /* we remove (or park) the file: its FIFOs' names go first */
        __ml_chan_sio_names_gone(ch);
    if (!ml_pool_park(ch)) {
        if (ch->side == 0 && ch->poolable && ch->seg->owner && ml_chan_name_left(ch->seg))
            ch->seg->owner = false;
        __ml_seg_destroy(ch->seg);
    }
    __ml_free(ch);
}

void memlan_channel_close(memlan_channel_t *ch)
{
    if (!ch)
        return;
    if (ch->seg->pid == (int32_t)__ml_pid()) {
        __ml_chan_end(ch);
        return;
    }
    /* A fork child's close of the handle it inherited: our copies go (the queue membership as
     * memlan_evq_del judges it, the mapping, the descriptor, the memory), and nothing else: no
     * end is published, the file stays, nothing is parked in our pool.  The channel is the
     * process's that made the handle, which goes on using it, as a socket's close in a fork
     * child leaves the parent's connection alone. */
    if (ch->evq)
        (void)memlan_evq_del(ch->evq, ch);
    __ml_chan_sio_drop(ch);
    ch->seg->owner = false;
    __ml_seg_destroy(ch->seg);
    __ml_free(ch);
}

int __ml_chan_check_peer(struct memlan_channel *ch) { return ml_peer_dead(ch); }

/* ---- for the socket layer (src/preload) -------------------------------------------------- */

/*
 * The creator takes back an offer nobody attached to: attached goes 0 -> ML_ATTACH_WITHDRAWN, so a
 * late attach fails with -EBUSY.  0 when withdrawn (or already withdrawn), -EBUSY when a peer had
 * attached first, -EPROTO when the word holds a value the protocol never writes (a broken
 * channel: nobody can attach to it either).
 */
int __ml_chan_withdraw(struct memlan_channel *ch)
{
    uint32_t expect = 0;
    if (ml_cas(&ch->hdr->attached, &expect, ML_ATTACH_WITHDRAWN))
        return 0;
    if (expect == ML_ATTACH_WITHDRAWN)
        return 0;
    /* Any other value than 1 was written by no attacher (attach is a CAS from 0, so none can
     * attach now): a broken channel, which the caller abandons as it would a withdrawn one. */
    return expect == 1 ? -EBUSY : -EPROTO;
}

/* A creator that settled on TCP: our side is published closed, so that an attacher that took
 * the offer anyway (the word was overwritten after its claim) ends instead of reading a ring
 * nobody writes.  Harmless when nobody attached: nobody can any more. */
void __ml_chan_abandon(struct memlan_channel *ch)
{
    ml_set_state(ch, ML_SIDE_CLOSED);
}

uint32_t __ml_chan_attach_state(const struct memlan_channel *ch)
{
    /* SYNC: pairs with the CAS in memlan_channel_attach() and __ml_chan_withdraw(). */
    return ml_load_acquire(&ch->hdr->attached);
}

/*
 * After a withdrawal: the bytes we sent that nobody will read, for the caller to send another
 * way.  *ptr gets a contiguous run; __ml_chan_unsent_done() drops n of them.  Only sound once
 * attach is impossible (withdrawn), under the send lock.
 */
size_t __ml_chan_unsent(struct memlan_channel *ch, const void **ptr)
{
    struct ml_ring *r = &ch->tx;
    uint64_t tail = ml_load_acquire(&r->ctl->tail);
    uint64_t n = r->pos - tail;
    if (n > r->cap) /* nobody else stores tail while withdrawn; never trust it anyway */
        n = 0;
    /* An offer's ring grows as an accepted one's (ml_growable): bytes from our last switch on
     * (swp) lie in the area it named, those before it in the other; a run ends at the switch,
     * and at the region's end (no second view there). */
    bool region = r->swg;
    if (r->gsize && (int64_t)(tail - r->swp) < 0) {
        region = !region;
        if (n > r->swp - tail)
            n = r->swp - tail;
    }
    if (!region) {
        if (n > r->size)
            n = r->size;
        *ptr = ml_ring_at(r, tail);
        return (size_t)n;
    }
    uint64_t end = r->gsize - (tail & r->gmask);
    *ptr = r->gdata + (tail & r->gmask);
    return (size_t)(n < end ? n : end);
}

void __ml_chan_unsent_done(struct memlan_channel *ch, size_t n)
{
    struct ml_ring *r = &ch->tx;
    uint64_t tail = ml_load_relaxed(&r->ctl->tail);
    ml_store_release(&r->ctl->tail, tail + n);
    r->other = tail + n;
    /* All out: the region's pages go back now, not a second later at a send's look (the
     * socket sends over TCP from now on, and the idle walk looks only at accelerated ones: a
     * withdrawn offer that grew kept 4 MiB of the fabric until its close). */
    if (r->other == r->pos && (r->swg || r->gmaybe)) {
        if (r->swg && r->pos == r->swp) {
            /* a switch that nothing followed (a sendfile at its file's end): back at once,
             * where ml_grow_back waits for a send after it */
            r->swg = false;
            ml_grow_publish(r);
        }
        if (r->swg)
            (void)ml_grow_back(r);
        if (!r->swg)
            ml_grow_trim(r);
    }
}

/*
 * Several processes share our side of the channel (a socket inherited across fork): each keeps
 * private copies of the indices, so whoever takes a direction's lock reloads the index it owns
 * from shared memory.  Our own index in shared memory is authoritative (we store it on every
 * publish); the cached copy of the peer's is simply refreshed.
 */
/*
 * A holder that exec'd (a socket carried across exec: a shell's `cat file >&3`) has a lock page
 * of its own and publishes its positions only in the channel, where it took them from at exec
 * (__ml_chan_adopt): the published word we share with our fork children then lags behind what
 * it moved.  The channel's copy is taken when it is ahead of the published one and within a
 * ring of the peer's index (the bound our own ring checks hold it to): a parent's next write
 * went at its stale head (a reset: "corrupt indices"), its next read served again the bytes the
 * exec'd image had read.  Whatever the peer writes there moves us only inside that bound, over
 * the bytes of its own direction of the stream, as its own garbage could; behind ours (a holder
 * that died between its two stores) it is not taken.
 */
static uint64_t ml_chan_newer(uint64_t pub, uint64_t shared, uint64_t lo, uint64_t size)
{
    return (int64_t)(shared - pub) > 0 && shared - lo <= size ? shared : pub;
}

void __ml_chan_resync_tx(struct memlan_channel *ch)
{
    uint64_t pub = ml_ring_pub(&ch->tx, memory_order_relaxed);
    ch->tx.other = ml_load_acquire(&ch->tx.ctl->tail);
    ch->tx.pos = ml_chan_newer(pub, ml_load_acquire(&ch->tx.ctl->head), ch->tx.other,
                               ch->tx.cap);
    if (ch->tx.pos - ch->tx.other > ch->tx.cap)
        ch->tx.corrupt = true;
    /* Published as ours from now on: readiness compares the peer's tail with it, and a holder
     * that took the channel's head (one that shares no lock page with the last) still had the
     * head it published when it took the socket up: poll said "writable" and the send EAGAIN,
     * again and again. */
    atomic_store_explicit(atomic_load_explicit(&ch->tx.pub, memory_order_relaxed), ch->tx.pos,
                          memory_order_relaxed);
    /* The switch from the channel, where every holder stores it first: one that does not share
     * our lock page (an exec'd image, a receiver of the socket over SCM_RIGHTS) publishes only
     * there, and a switch moves no head (a sendfile that read nothing after it; our own
     * published copy would then be stale).  A word the peer overwrote moves only where our
     * bytes go for its own reading (ml_ring_free_grow keeps them inside our areas). */
    if (ch->tx.gsize)
        ml_grow_take(&ch->tx, ml_load_acquire(&ch->tx.ctl->grow));
    /* Say where we are from the start: the peer's first wait then knows whether spinning could
     * help (on our cpu it cannot: we would need the core it spins on). */
    uint32_t cpu = (uint32_t)(__ml_getcpu() + 1);
    ml_note_cpu(&ch->rx.ctl->rx_cpu, cpu);
    ml_note_cpu(&ch->tx.ctl->tx_cpu, cpu);
}

void __ml_chan_resync_rx(struct memlan_channel *ch)
{
    uint64_t pub = ml_ring_pub(&ch->rx, memory_order_relaxed);
    uint64_t tail = ml_load_acquire(&ch->rx.ctl->tail), head = ml_load_acquire(&ch->rx.ctl->head);
    /* within a ring below the peer's head: tail is taken when head - tail <= size */
    ch->rx.pos = ml_chan_newer(pub, tail, head - ch->rx.cap, ch->rx.cap);
    ch->rx.other = ch->rx.pos;
    atomic_store_explicit(atomic_load_explicit(&ch->rx.pub, memory_order_relaxed), ch->rx.pos,
                          memory_order_relaxed); /* as for tx */
}

/* Publish our indices in words of the caller's (tx head and rx tail, in memory the peer cannot
 * reach but our fork children share) instead of our own, so that the processes that share a
 * socket after fork read each other's positions (readiness, and __ml_chan_resync_*).  NULL: back
 * to our own (before those words go).  The caller makes sure that nobody holds either direction meanwhile. */
void __ml_chan_pub_share(struct memlan_channel *ch, _Atomic uint64_t *tx, _Atomic uint64_t *rx,
                         _Atomic uint64_t *grow)
{
    struct ml_ring *rings[2] = {&ch->tx, &ch->rx};
    _Atomic uint64_t *words[2] = {tx, rx};
    for (int i = 0; i < 2; i++) {
        _Atomic uint64_t *w = words[i] ? words[i] : &rings[i]->own_pub;
        atomic_store_explicit(w, atomic_load_explicit(rings[i]->pub, memory_order_relaxed),
                              memory_order_relaxed);
        atomic_store_explicit(&rings[i]->pub, w, memory_order_release);
    }
    _Atomic uint64_t *g = grow ? grow : &ch->tx.own_gpub;
    atomic_store_explicit(g, ml_ring_gpub(&ch->tx), memory_order_relaxed);
    atomic_store_explicit(&ch->tx.gpub, g, memory_order_release);
}

/* Bytes sent and not yet consumed by the peer. */

uint64_t __ml_chan_tx_queued(struct memlan_channel *ch)
{
    /* Read-only, from the shared indices: the caller does not hold the direction, and after
     * fork our private head may be behind another process's (see __ml_chan_rx_avail_ro). */
    uint64_t t = ml_load_acquire(&ch->tx.ctl->tail);
    uint64_t q = ml_ring_pub(&ch->tx, memory_order_acquire) - t;
    return q > ch->tx.cap ? 0 : q;
}

/* Did the peer leave bytes we sent unread (the kernel would answer its close with a reset)? */
bool __ml_chan_peer_left_unread(struct memlan_channel *ch) { return __ml_chan_tx_queued(ch) != 0; }

/* Wake a thread of ours blocked in recv (after shutdown(SHUT_RD) from another thread, or a lower
 * SO_RCVLOWAT). */
void __ml_chan_kick_rx(struct memlan_channel *ch)
{
    if (ml_fetch_and(&ch->rx.ctl->rx_wait, ~ML_WAIT_FUTEX) & ML_WAIT_FUTEX)
        __ml_sys_futex_wake(&ch->rx.ctl->rx_wait, INT32_MAX);
}

uint32_t __ml_chan_peer_state(struct memlan_channel *ch) { return ml_peer_state(ch); }
