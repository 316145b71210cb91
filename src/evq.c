/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * evq.c - event queues (CLAN's asynchronous event queue).
 *
 * Many channels post "ready" into one queue, and one waiter blocks once for all of them.  The
 * queue is a segment holding a two-level bitmap (see layout.h): endpoint i posts by setting bit i
 * of a leaf word and then bit i/64 of a summary word, then rings the waiter if it is armed.  The
 * consumer exchanges each non-zero summary word with zero, then each leaf word that it names, and
 * turns the bits into events.  Costs are O(1) per event (plus one summary word per 4096
 * endpoints); posts to an endpoint that is already pending merge into one event; nothing can
 * overflow, so nothing is lost.
 *
 * A channel's tripwire in event-queue mode names the queue's token and the endpoint's index (an
 * ml_evq_ref in the channel's registration slots, one per waiting process: see below).  The sender that trips it imports the queue (once; imports are
 * cached per process) and posts.  The queue's waiter sleeps on a futex (memlan_evq_wait) or on a
 * FIFO doorbell in the fabric (memlan_evq_fd), which any process of the fabric can open and write
 * without passing file descriptors around.
 *
 * Events are edge-triggered, as CLAN's tripwires are: after an event, the next one for that
 * channel comes once the application has seen -EAGAIN from it (which re-arms the tripwire).
 */
#include "channel.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ml_evq_slot {
    struct memlan_channel *ch;
    void *udata;
    uint32_t events;
    uint32_t next_free;
};

struct memlan_evq {
    struct memlan_segment *seg;
    struct ml_evq_hdr *h;
    _Atomic uint64_t *leaf, *sum;
    uint32_t capacity;
    int bell;                 /* FIFO read end (opened O_RDWR so it always has a writer) */
    struct ml_evq_slot *slots;
    uint32_t free_head, used;
    uint32_t sweep;           /* next slot whose peer's liveness the idle sweep checks */
    struct ml_spin spin;
};

#define ML_EVQ_NONE UINT32_MAX
#define ML_EVQ_SWEEP 64u

/* ---- posting ----------------------------------------------------------------------------- */

static void ml_evq_set(_Atomic uint64_t *leaf, _Atomic uint64_t *sum, uint32_t index)
{
    /* Leaf first, then summary: a consumer that clears the summary between the two finds the
     * leaf bit on its next pass, because our summary store comes after. */
    ml_fetch_or(&leaf[index / 64], 1ull << (index % 64));
    ml_fetch_or(&sum[index / 4096], 1ull << ((index / 64) % 64));
}

static void ml_evq_ring(struct ml_evq_hdr *h, int bellfd, bool wronly)
{
    ml_fence(); /* SYNC: pairs with the fence after arming in memlan_evq_wait/memlan_evq_arm */
    if (ml_load_relaxed(&h->waiter) == 0)
        return;
    uint32_t w = ml_xchg(&h->waiter, 0u);
    if (w & ML_EVQ_WAIT_FUTEX)
        __ml_sys_futex_wake(&h->waiter, 1);
    if ((w & ML_EVQ_WAIT_FD) && bellfd >= 0) {
        char b = 1;
        /* EAGAIN: the pipe is full, it rings already.  A doorbell opened for reading too has a
         * reader as long as we hold it, so a write never meets a dead owner's FIFO (EPIPE, and
         * a SIGPIPE that killed redis-cli when its server was killed). */
        if (wronly)
            (void)__ml_sys_write_nosigpipe(bellfd, &b, 1);
        else
            (void)__ml_sys_write(bellfd, &b, 1);
    }
    if (w)
        ml_fetch_add(&h->wakeups, 1u);
}

void __ml_evq_post_local(struct memlan_evq *q, uint32_t index)
{
    ml_evq_set(q->leaf, q->sum, index);
    ml_fetch_add(&q->h->posts, 1u);
    /* We are the queue's own process: its read end of the doorbell can ring it too. */
    ml_evq_ring(q->h, q->bell, false);
}

/* A per-process cache of imported queues: a sender imports each queue it posts to once. */
struct ml_evq_import {
    char token[MEMLAN_TOKEN_LEN + 1];
    struct memlan_segment *seg;
    int bell;
    bool bell_wronly;         /* opened write-only: its reader may go, a write could raise SIGPIPE */
};
#define ML_EVQ_CACHE 256
static struct ml_evq_import ml_evq_cache[ML_EVQ_CACHE];
static unsigned ml_evq_cache_n, ml_evq_cache_next;
static pthread_rwlock_t ml_evq_cache_lock = PTHREAD_RWLOCK_INITIALIZER;
static __thread unsigned ml_evq_cache_depth __attribute__((tls_model("initial-exec")));
static pthread_once_t ml_evq_cache_once = PTHREAD_ONCE_INIT;

/* fork() while another thread posts or imports: the child must not inherit a held lock or a
 * half-made entry, so fork waits for the cache to be still. */
static void ml_evq_cache_prepare(void) { pthread_rwlock_wrlock(&ml_evq_cache_lock); }
static void ml_evq_cache_parent(void) { pthread_rwlock_unlock(&ml_evq_cache_lock); }
static void ml_evq_cache_child(void) { pthread_rwlock_init(&ml_evq_cache_lock, NULL); }
static void ml_evq_cache_atfork(void)
{
    pthread_atfork(ml_evq_cache_prepare, ml_evq_cache_parent, ml_evq_cache_child);
}

void (*__ml_fd_keep)(int *fdp);
void (*__ml_fd_drop)(int fd);

static void ml_evq_cache_free(struct ml_evq_import *e)
{
    if (__ml_fd_drop) {
        __ml_fd_drop(e->seg->fd);
        if (e->bell >= 0)
            __ml_fd_drop(e->bell);
    }
    __ml_seg_destroy(e->seg);
    if (e->bell >= 0)
        __ml_sys_close(e->bell);
    e->seg = NULL;
    e->bell = -1;
}

/* Before importing another queue: let go of the queues whose owners have gone (their files are
 * unlinked already; we would hold them, and an fd each, for ever).  Caller holds the lock. */
static void ml_evq_cache_sweep(void)
{
    for (unsigned i = 0; i < ml_evq_cache_n;) {
        struct ml_evq_import *e = &ml_evq_cache[i];
        if (__ml_seg_alive(e->seg, ML_LOCK_OWNER) != 0) {
            i++;
            continue;
        }
        ml_evq_cache_free(e);
        *e = ml_evq_cache[--ml_evq_cache_n];
        ml_evq_cache[ml_evq_cache_n].seg = NULL;
    }
}

/* Is a queue of cap events with its bitmaps at lo (leaf) and so (summary) inside seg?  The one
 * rule for both import and post time (a post re-reads the peer-writable header). */
static bool ml_evq_fits(const struct memlan_segment *seg, uint64_t cap, uint64_t lo, uint64_t so)
{
    if (cap == 0 || cap % 64 || cap > (1u << 24))
        return false;
    uint64_t lw = cap / 64, sw = (lw + 63) / 64;
    uint64_t end = seg->body_off + seg->body_size;
    /* written so that no sum can wrap: lo and so are the peer's, any 64-bit value */
    return lo % 8 == 0 && so % 8 == 0 && lo >= seg->body_off && so >= seg->body_off &&
           lo <= end && so <= end && lw * 8 <= end - lo && sw * 8 <= end - so;
}

/* The header itself must lie inside the body, on a line of its own (waiter is 64-aligned in
 * it): the body offset comes from the peer-writable segment header. */
static bool ml_evq_hdr_fits(const struct memlan_segment *seg)
{
    return seg->body_off % ML_CACHELINE == 0 && seg->body_size >= sizeof(struct ml_evq_hdr);
}

static bool ml_evq_geometry_ok(const struct memlan_segment *seg, const struct ml_evq_hdr *c)
{
    if (!ml_evq_hdr_fits(seg))
        return false;
    uint64_t cap = c->capacity, lw = c->leaf_words, sw = c->sum_words;
    return lw == cap / 64 && sw == (lw + 63) / 64 && ml_evq_fits(seg, cap, c->leaf_off, c->sum_off);
}

/* The entry for tok, or NULL; *hint says where to look first and learns where it was.  Caller
 * holds the lock (either way). */
static struct ml_evq_import *ml_evq_cache_find(const char *tok, uint32_t *hint)
{
    uint32_t h = ml_load_relaxed((_Atomic uint32_t *)hint);
    if (h < ml_evq_cache_n && memcmp(ml_evq_cache[h].token, tok, MEMLAN_TOKEN_LEN) == 0)
        return &ml_evq_cache[h];
    for (unsigned i = 0; i < ml_evq_cache_n; i++)
        if (memcmp(ml_evq_cache[i].token, tok, MEMLAN_TOKEN_LEN) == 0) {
            ml_store_relaxed((_Atomic uint32_t *)hint, i);
            return &ml_evq_cache[i];
        }
    return NULL;
}

/* Import tok's queue into the cache.  Caller holds the lock for writing. */
static struct ml_evq_import *ml_evq_cache_import(memlan_fabric_t *fab, const char *tok)
{
    ml_evq_cache_sweep();
    struct memlan_segment *seg;
    if (__ml_seg_import(fab, tok, ML_KIND_EVQ, true, &seg) < 0)
        return NULL;
    struct ml_evq_hdr *c = (struct ml_evq_hdr *)(seg->base + seg->body_off);
    if (!ml_evq_geometry_ok(seg, c)) {
        __ml_seg_destroy(seg);
        return NULL;
    }
    struct ml_evq_import *e;
    if (ml_evq_cache_n < ML_EVQ_CACHE) {
        e = &ml_evq_cache[ml_evq_cache_n++];
    } else { /* evict round-robin */
        e = &ml_evq_cache[ml_evq_cache_next++ % ML_EVQ_CACHE];
        ml_evq_cache_free(e);
    }
    memcpy(e->token, tok, sizeof e->token);
    e->seg = seg;
    char name[80];
    __ml_fabric_name(name, sizeof name, "bell", tok);
    /* Read-write when we may (the same user): we are then a reader of the FIFO ourselves. */
    long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NONBLOCK | O_NOFOLLOW, 0);
    e->bell_wronly = false;
    if (fd == -EACCES) {
        fd = __ml_sys_open(fab->dirfd, name, O_WRONLY | O_NONBLOCK | O_NOFOLLOW, 0);
        e->bell_wronly = true;
    }
    e->bell = fd >= 0 ? (int)fd : -1;
    if (__ml_fd_keep) {
        __ml_fd_keep(&seg->fd);
        if (e->bell >= 0)
            __ml_fd_keep(&e->bell);
    }
    return e;
}

/* Post to a peer's queue.  Senders in many threads post at once: they share the cache under a
 * read lock (an entry is neither moved nor freed while anyone holds it), and only an import,
 * which also sweeps and evicts, takes it for writing.  A mutex here put pgbench's two threads to
 * sleep on each other on every wake-up they sent. */
void __ml_evq_post_ref(memlan_fabric_t *fab, const struct ml_evq_ref *shared, uint32_t *hint)
{
    /* Copy the reference out of shared memory once, then check it: the peer may write it. */
    struct ml_evq_ref ref;
    memcpy(&ref, shared, sizeof ref);
    char tok[MEMLAN_TOKEN_LEN + 1];
    memcpy(tok, ref.token, MEMLAN_TOKEN_LEN);
    tok[MEMLAN_TOKEN_LEN] = '\0';
    if (ref.valid != 1 || !__ml_token_valid(tok))
        return;
    pthread_once(&ml_evq_cache_once, ml_evq_cache_atfork);
    /* A signal handler that sends while this thread is inside (send is async-signal-safe) must
     * not wait for itself: it takes the lock only if it is free for readers, and otherwise
     * skips the post (the interrupted thread may be half-way through an import); the waiter
     * then finds the event at its next look, within the liveness interval. */
    bool reentered = ml_evq_cache_depth != 0;
    if (reentered) {
        if (pthread_rwlock_tryrdlock(&ml_evq_cache_lock) != 0)
            return;
    } else {
        pthread_rwlock_rdlock(&ml_evq_cache_lock);
    }
    ml_evq_cache_depth++;
    struct ml_evq_import *e = ml_evq_cache_find(tok, hint);
    if (!e && reentered) {
        ml_evq_cache_depth--;
        pthread_rwlock_unlock(&ml_evq_cache_lock);
        return;
    }
    if (!e) {
        pthread_rwlock_unlock(&ml_evq_cache_lock);
        pthread_rwlock_wrlock(&ml_evq_cache_lock);
        e = ml_evq_cache_find(tok, hint); /* another thread may have imported it meanwhile */
        if (!e)
            e = ml_evq_cache_import(fab, tok);
        if (e)
            ml_store_relaxed((_Atomic uint32_t *)hint, (uint32_t)(e - ml_evq_cache));
    }
    if (e) {
        struct ml_evq_hdr *h = (struct ml_evq_hdr *)(e->seg->base + e->seg->body_off);
        /* Geometry was checked at import; the peer may have changed the shared copy since, so
         * use the values re-validated now, read once each. */
        uint32_t cap = __atomic_load_n(&h->capacity, __ATOMIC_RELAXED);
        uint64_t lo = __atomic_load_n(&h->leaf_off, __ATOMIC_RELAXED);
        uint64_t so = __atomic_load_n(&h->sum_off, __ATOMIC_RELAXED);
        if (ref.index < cap && ml_evq_fits(e->seg, cap, lo, so)) {
            ml_evq_set((_Atomic uint64_t *)(e->seg->base + lo),
                       (_Atomic uint64_t *)(e->seg->base + so), ref.index);
            ml_fetch_add(&h->posts, 1u);
            /* where the poster runs: a waiter on that same cpu must not spin for it */
            ml_store_relaxed(&h->post_cpu, (uint32_t)(__ml_getcpu() + 1));
            ml_evq_ring(h, e->bell, e->bell_wronly);
        }
    }
    pthread_rwlock_unlock(&ml_evq_cache_lock);
    ml_evq_cache_depth--;
}

/* ---- the queue's owner ------------------------------------------------------------------- */

int memlan_evq_create(memlan_fabric_t *fab, unsigned capacity, memlan_evq_t **out)
{
    if (!fab || !out || capacity > (1u << 24))
        return -EINVAL;
    *out = NULL;
    if (capacity == 0)
        capacity = 4096;
    capacity = (capacity + 63) & ~63u;
    uint32_t lw = capacity / 64, sw = (lw + 63) / 64;
    uint64_t body_off = sizeof(struct ml_seg_hdr);
    uint64_t leaf_off = body_off + sizeof(struct ml_evq_hdr);
    uint64_t sum_off = leaf_off + (uint64_t)lw * 8;
    uint64_t body_size = sum_off + (uint64_t)sw * 8 - body_off;
    struct memlan_evq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->slots = calloc(capacity, sizeof *q->slots);
    if (!q->slots) {
        free(q);
        return -ENOMEM;
    }
    int r = __ml_seg_create(fab, ML_KIND_EVQ, MEMLAN_MODE_RW, body_off, body_size, 0, &q->seg);
    if (r < 0)
        goto fail;
    char name[80];
    __ml_fabric_name(name, sizeof name, "bell", q->seg->token);
    r = __ml_sys_mknodat(fab->dirfd, name, S_IFIFO | (fab->shared ? 0622 : 0600));
    if (r < 0)
        goto fail_seg;
    long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NONBLOCK | O_NOFOLLOW, 0);
    if (fd < 0) {
        r = (int)fd;
        __ml_sys_unlinkat(fab->dirfd, name, 0);
        goto fail_seg;
    }
    /* mknodat's mode went through the umask (0022 or 0077 make it 0600): in a shared fabric
     * another user's peer must be able to ring the bell, so set it on the open FIFO itself. */
    if (fab->shared && (r = __ml_sys_fchmod((int)fd, 0622)) < 0) {
        __ml_sys_close((int)fd);
        __ml_sys_unlinkat(fab->dirfd, name, 0);
        goto fail_seg;
    }
    q->bell = (int)fd;
    q->h = (struct ml_evq_hdr *)(q->seg->base + body_off);
    q->h->capacity = capacity;
    q->h->leaf_words = lw;
    q->h->sum_words = sw;
    q->h->leaf_off = leaf_off;
    q->h->sum_off = sum_off;
    q->leaf = (_Atomic uint64_t *)(q->seg->base + leaf_off);
    q->sum = (_Atomic uint64_t *)(q->seg->base + sum_off);
    q->capacity = capacity;
    for (uint32_t i = 0; i < capacity; i++)
        q->slots[i].next_free = i + 1 < capacity ? i + 1 : ML_EVQ_NONE;
    q->free_head = 0;
    __ml_seg_publish(q->seg);
    *out = q;
    return 0;
fail_seg:
    __ml_seg_destroy(q->seg);
fail:
    free(q->slots);
    free(q);
    return r;
}

/* ---- registration slots ------------------------------------------------------------------ */

/*
 * A direction names up to ML_EVQ_REFS queues (layout.h, struct ml_chan_refs): each process that
 * waits on the socket through a queue (a parent's epoll set, its fork child's poll) claims a slot
 * of its own, arms that slot's bit, and frees the slot when it leaves the queue.  (With one
 * reference per direction, a fork child's poll wrote its own queue over the parent's, and its
 * exit took the registration away: the parent's set was never posted again.)  A process killed
 * before it could free its slot leaves it claimed: when every slot is taken, the slots whose
 * queue's owner no longer holds its liveness lock are freed.  The slots are in memory the peer
 * can write: a peer that fills them only costs us the wake-ups (the socket layer then naps). */
static bool ml_ref_queue_dead(memlan_fabric_t *fab, const struct ml_evq_ref *r)
{
    char tok[MEMLAN_TOKEN_LEN + 1], name[80];
    memcpy(tok, r->token, MEMLAN_TOKEN_LEN);
    tok[MEMLAN_TOKEN_LEN] = '\0';
    if (!__ml_token_valid(tok))
        return true;
    __ml_fabric_name(name, sizeof name, "seg", tok);
    long fd = __ml_sys_open(fab->dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW, 0);
    if (fd < 0)
        return fd == -ENOENT;
    int held = __ml_sys_byte_held((int)fd, ML_LOCK_OWNER);
    __ml_sys_close((int)fd);
    return held == 0;
}

static void ml_refs_reclaim(memlan_fabric_t *fab, struct memlan_channel *ch)
{
    for (uint32_t i = 0; i < ML_EVQ_REFS; i++) {
        struct ml_evq_ref *r = &ch->rx_refs->rx[i];
        if (ml_load_acquire(&r->valid) != ML_REF_VALID)
            continue;
        char tok[ML_TOKEN_HEX];
        memcpy(tok, r->token, sizeof tok);
        if (!ml_ref_queue_dead(fab, r))
            continue;
        uint32_t v = ML_REF_VALID;
        if (!atomic_compare_exchange_strong(&r->valid, &v, ML_REF_CLAIMING))
            continue;
        /* Still the dead queue's, not one claimed again meanwhile by another process? */
        bool same = memcmp(tok, r->token, sizeof tok) == 0;
        if (same)
            ml_store_release(&ch->tx_refs->tx[i].valid, 0u);
        ml_store_release(&r->valid, same ? 0u : ML_REF_VALID);
    }
}

/* Claim a free slot and name (q, index) in it, both ways; -EBUSY when none is free. */
static int ml_ref_claim(struct memlan_evq *q, struct memlan_channel *ch, uint32_t index)
{
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < ML_EVQ_REFS; i++) {
            struct ml_evq_ref *rx = &ch->rx_refs->rx[i], *tx = &ch->tx_refs->tx[i];
            uint32_t z = 0;
            if (!atomic_compare_exchange_strong(&rx->valid, &z, ML_REF_CLAIMING))
                continue;
            memcpy(rx->token, q->seg->token, MEMLAN_TOKEN_LEN);
            memcpy(tx->token, q->seg->token, MEMLAN_TOKEN_LEN);
            rx->index = tx->index = index;
            /* SYNC: the poster copies a slot and uses it only if valid read ML_REF_VALID; the
             * tripwire's arming store and fence (__ml_chan_arm_evq) publish both to it. */
            ml_store_release(&tx->valid, ML_REF_VALID);
            ml_store_release(&rx->valid, ML_REF_VALID);
            ch->evq_ref = i;
            ch->evq_pid = (int32_t)__ml_pid();
            return 0;
        }
        if (pass == 0)
            ml_refs_reclaim(q->seg->fab, ch);
    }
    return -EBUSY;
}

/* Disarm our slot's bits so that the peer stops posting, then free the slot.  Only the process
 * that claimed it: a fork child's copy of its parent's registration is the parent's. */
static void ml_ref_free(struct memlan_channel *ch)
{
    if (ch->evq_pid != (int32_t)__ml_pid())
        return;
    uint32_t bit = ML_WAIT_EVQ_REF(ch->evq_ref);
    ml_fetch_and(&ch->rx.ctl->rx_wait, ~bit);
    ml_fetch_and(&ch->tx.ctl->tx_wait, ~bit);
    ml_store_release(&ch->tx_refs->tx[ch->evq_ref].valid, 0u);
    ml_store_release(&ch->rx_refs->rx[ch->evq_ref].valid, 0u);
}

int memlan_evq_add(memlan_evq_t *q, memlan_channel_t *ch, uint32_t events, void *udata)
{
    if (!q || !ch || !(events & (MEMLAN_EV_READ | MEMLAN_EV_WRITE)) ||
        (events & ~(uint32_t)(MEMLAN_EV_READ | MEMLAN_EV_WRITE)))
        return -EINVAL;
    if (ch->evq)
        return -EEXIST;
    if (q->free_head == ML_EVQ_NONE)
        return -ENOSPC;
    uint32_t i = q->free_head;
    /* The registration must be in place before the tripwires are armed in EVQ mode: the arming
     * store and fence in __ml_chan_arm_evq() publish it to the peer's waker. */
    int r = ml_ref_claim(q, ch, i);
    if (r < 0)
        return r;
    q->free_head = q->slots[i].next_free;
    q->slots[i] = (struct ml_evq_slot){.ch = ch, .udata = udata, .events = events};
    q->used++;
    ch->evq = q;
    ch->evq_index = i;
    ch->evq_events = events;
    ch->udata = udata;
    /* Always watch the receive side: HUP and ERR come that way. */
    if (__ml_chan_arm_evq(ch, events | MEMLAN_EV_READ))
        __ml_evq_post_local(q, i);
    return 0;
}

int memlan_evq_del(memlan_evq_t *q, memlan_channel_t *ch)
{
    if (!q || !ch)
        return -EINVAL;
    if (ch->evq != q)
        return -ENOENT;
    uint32_t i = ch->evq_index;
    ml_ref_free(ch);
    q->slots[i] = (struct ml_evq_slot){.next_free = q->free_head};
    q->free_head = i;
    q->used--;
    ch->evq = NULL;
    return 0;
}

/*
 * Turn pending bits into events, at most max.  Bits beyond max are put back.
 *
 * Every word read here is writable by any process that can post to the queue, so every index
 * taken from one is bounded by our private geometry before use: a summary bit names a leaf word
 * below nwords (the last summary word has bits past the end when nwords is not a multiple of
 * 64), and then a leaf bit names an endpoint below capacity.  A bit out of range is dropped.
 */
static int ml_evq_collect(struct memlan_evq *q, struct memlan_event *ev, int max)
{
    int n = 0;
    uint32_t nwords = q->capacity / 64;
    uint32_t sw = (nwords + 63) / 64;
    for (uint32_t s = 0; s < sw; s++) {
        if (ml_load_relaxed(&q->sum[s]) == 0)
            continue;
        uint64_t sbits = ml_xchg(&q->sum[s], 0ull);
        while (sbits) {
            uint32_t lw = s * 64 + (uint32_t)__builtin_ctzll(sbits);
            sbits &= sbits - 1;
            if (lw >= nwords)
                continue; /* no such leaf word: garbage from a peer */
            if (n >= max) { /* no room: put the summary bit back for the next call */
                ml_fetch_or(&q->sum[s], 1ull << (lw % 64));
                continue;
            }
            uint64_t bits = ml_xchg(&q->leaf[lw], 0ull);
            while (bits) {
                uint32_t i = lw * 64 + (uint32_t)__builtin_ctzll(bits);
                bits &= bits - 1;
                if (n >= max) {
                    ml_evq_set(q->leaf, q->sum, i);
                    continue;
                }
                struct ml_evq_slot *sl = &q->slots[i];
                if (!sl->ch)
                    continue; /* deleted since it posted */
                uint32_t want = sl->events | MEMLAN_EV_HUP | MEMLAN_EV_ERR;
                int st = memlan_channel_poll(sl->ch);
                uint32_t got = (uint32_t)(st > 0 ? st : 0) & want;
                if (!got) {
                    /* Spurious (already drained, or ready only in a way the caller did not ask
                     * for): re-arm, then look again, so that a change that raced the re-arm is
                     * reported now rather than lost.  If there is still nothing wanted, the
                     * armed tripwires report the next change; re-posting the bit here would
                     * make the waiter spin on it for ever. */
                    if (!__ml_chan_arm_evq(sl->ch, sl->events | MEMLAN_EV_READ))
                        continue;
                    st = memlan_channel_poll(sl->ch);
                    got = (uint32_t)(st > 0 ? st : 0) & want;
                    if (!got)
                        continue;
                }
                ev[n].udata = sl->udata;
                ev[n].events = got;
                n++;
            }
        }
    }
    return n;
}

/* Idle sweep: look at a few peers' liveness, so that a dead peer is reported in bounded time. */
static void ml_evq_sweep(struct memlan_evq *q)
{
    if (!q->used)
        return;
    for (uint32_t k = 0; k < ML_EVQ_SWEEP && k < q->capacity; k++) {
        uint32_t i = q->sweep++ % q->capacity;
        struct memlan_channel *ch = q->slots[i].ch;
        if (ch && !ch->peer_dead && __ml_chan_check_peer(ch))
            ml_evq_set(q->leaf, q->sum, i);
    }
}

static bool ml_evq_pending(struct memlan_evq *q)
{
    uint32_t sw = (q->capacity / 64 + 63) / 64;
    for (uint32_t s = 0; s < sw; s++)
        if (ml_load_relaxed(&q->sum[s]))
            return true;
    return false;
}

#define ML_EVQ_SPURIOUS 64u

/* memlan_evq_wait's spin (__ml_spin_run): a look at the summary words, and a collect when one
 * is set. */
struct ml_evq_spin {
    struct memlan_evq *q;
    struct memlan_event *ev;
    int max;
};

static int ml_evq_spin_look(struct ml_spinning *s, void *a)
{
    struct ml_evq_spin *w = a;
    return ml_evq_pending(w->q) ? ml_evq_collect(w->q, w->ev, w->max) : 0;
}

int memlan_evq_wait(memlan_evq_t *q, struct memlan_event *ev, int max, int timeout_ms)
{
    if (!q || !ev || max <= 0)
        return -EINVAL;
    int n = ml_evq_collect(q, ev, max);
    if (n || timeout_ms == 0)
        return n;
    uint64_t deadline = timeout_ms < 0 ? 0 : __ml_now_ns() + (uint64_t)timeout_ms * 1000000u;
    /* the peer that posts last ran where we are: spinning would only hold its core */
    struct ml_evq_spin look = {q, ev, max};
    struct ml_spinning spin = {
        .sp = &q->spin, .budget = __ml_spin_budget_ns(&q->spin, ml_load_relaxed(&q->h->post_cpu)),
        .every = 32, .look = ml_evq_spin_look, .arg = &look};
    if ((n = __ml_spin_run(&spin)) > 0)
        return n;
    int64_t every = ML_LIVENESS_NS; /* the sweep's interval, doubling while idle */
    /* Rounds in a row that found nothing: bits set that name no channel, our waiter bit
     * cleared, a wake-up for nothing.  The header and bitmaps are writable by every poster, and
     * one that kept doing that kept us going round at its pace, never asleep and past our
     * deadline (the pending path skipped it).  Past ML_EVQ_SPURIOUS of them we nap out the
     * sweep's interval on a word of our own, then sweep as a timeout would. */
    unsigned spurious = 0;
    _Atomic uint32_t nap_word = 0;
    for (;;) {
        ml_fetch_or(&q->h->waiter, ML_EVQ_WAIT_FUTEX);
        ml_fence(); /* SYNC: pairs with the fence in ml_evq_ring() */
        if (spurious < ML_EVQ_SPURIOUS && ml_evq_pending(q)) {
            ml_xchg(&q->h->waiter, 0u);
            if ((n = ml_evq_collect(q, ev, max)))
                return n;
            if (++spurious < ML_EVQ_SPURIOUS)
                continue;
        }
        int64_t tmo = every;
        if (every < (int64_t)ML_LIVENESS_MAX_NS)
            every = every * 2 < (int64_t)ML_LIVENESS_MAX_NS ? every * 2 : ML_LIVENESS_MAX_NS;
        uint64_t now = __ml_now_ns();
        if (deadline) {
            if (now >= deadline) {
                ml_xchg(&q->h->waiter, 0u);
                return 0;
            }
            if (deadline - now < (uint64_t)tmo)
                tmo = (int64_t)(deadline - now);
        }
        uint32_t w = ml_load_relaxed(&q->h->waiter);
        int r;
        if (spurious >= ML_EVQ_SPURIOUS) {
            r = __ml_sys_futex_wait(&nap_word, 0, tmo);
            spurious = 0;
        } else {
            r = w ? __ml_sys_futex_wait(&q->h->waiter, w, tmo) : 0;
            if (r == 0 || r == -EAGAIN)
                spurious++;
        }
        if (r == -ETIMEDOUT)
            ml_evq_sweep(q);
    }
}

int memlan_evq_fd(memlan_evq_t *q) { return q ? q->bell : -EINVAL; }

/* For a waiter that spins over the queue with looks of its own (memlan_svc_run, which must also
 * watch kernel fds): the spin policy of memlan_evq_wait, with the same view of who posted last,
 * and its record of how spins end (for __ml_spin_run). */
uint64_t __ml_evq_spin_budget(struct memlan_evq *q)
{
    return __ml_spin_budget_ns(&q->spin, ml_load_relaxed(&q->h->post_cpu));
}

struct ml_spin *__ml_evq_spin(struct memlan_evq *q) { return &q->spin; }

int memlan_evq_arm(memlan_evq_t *q)
{
    if (!q)
        return -EINVAL;
    char buf[64];
    /* A pipe's read returns what it holds, so a short read emptied it: no second call. */
    while (__ml_sys_read(q->bell, buf, sizeof buf) == (long)sizeof buf)
        ;
    ml_fetch_or(&q->h->waiter, ML_EVQ_WAIT_FD);
    ml_fence(); /* SYNC: pairs with the fence in ml_evq_ring() */
    return ml_evq_pending(q) ? 1 : 0;
}

void memlan_evq_close(memlan_evq_t *q)
{
    if (!q)
        return;
    for (uint32_t i = 0; i < q->capacity; i++)
        if (q->slots[i].ch)
            memlan_evq_del(q, q->slots[i].ch);
    char name[80];
    __ml_fabric_name(name, sizeof name, "bell", q->seg->token);
    __ml_sys_unlinkat(q->seg->fab->dirfd, name, 0);
    __ml_sys_close(q->bell);
    ml_store_release(&q->seg->hdr->state, ML_SEG_REVOKED);
    __ml_seg_destroy(q->seg);
    free(q->slots);
    free(q);
}

/* A fork child's copy of its parent's queue: let go of our copies of it (the mapping, the
 * descriptors, the memory), leaving the queue, its file and its doorbell to the parent; its
 * channels forget it (their registrations are the parent's).  Kept, the copy was memory nobody
 * would free, and its mapping held the parent's liveness lock for as long as the child lived. */
void __ml_evq_forget(struct memlan_evq *q)
{
    if (!q)
        return;
    for (uint32_t i = 0, seen = 0; i < q->capacity && seen < q->used; i++) {
        struct memlan_channel *ch = q->slots[i].ch;
        if (!ch)
            continue;
        seen++;
        if (ch->evq == q)
            ch->evq = NULL;
    }
    if (q->bell >= 0)
        __ml_sys_close(q->bell);
    q->seg->owner = false; /* not ours to unlink */
    __ml_seg_destroy(q->seg);
    free(q->slots);
    free(q);
}

/* Where q keeps its descriptors, for a caller that relocates them (the preload layer keeps its
 * own fds at high numbers, out of the application's way). */
void __ml_evq_fds(struct memlan_evq *q, int **seg_fd, int **bell_fd)
{
    *seg_fd = &q->seg->fd;
    *bell_fd = &q->bell;
}
