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
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ml_evq_slot {
    struct memlan_channel *ch;
    void *udata;
    uint32_t events;
    uint32_t next_free;
};

/*
 * A queue is one segment in a private fabric.  In a shared one, its bitmaps and waiter word are
 * words its posters write, and a poster that may clear another's bits (or the waiter word, so
 * that the next poster does not ring) makes us miss that wake-up.  So the queue is in parts,
 * each a segment of the same geometry, and a channel's peer posts to the part that only the
 * users who may write that channel's file may write (design.md, "Event queues"): part 0 is ours
 * alone (0600; channels between two processes of our user), a part per set of other users
 * (0600 and their ACL), and a group-wide part (0666) for group-wide channels.  Whoever can clear
 * a wake-up in a part could stall those channels anyway, by writing their own pages.  The parts
 * share one doorbell FIFO (a hard link per part, so that a poster finds it by its part's token);
 * a FIFO only adds wake-ups for whoever may write it but not read it.
 */
/* Part 0 and up to 32 others: bounded, as each part costs a file, a mapping and a look at its
 * summary words per wait and per arm, and the doorbell's ACL names each part's users (at most
 * 60 there).  Past it memlan_evq_add says -ENOSPC, and the first time a process meets it, it is
 * said (__ml_say_once): under memlan run such sockets are looked at every 1 ms.  (It was 8
 * others, silently.) */
#define ML_EVQ_PARTS 33
struct ml_evq_part {
    struct memlan_segment *seg;  /* NULL: a free slot */
    struct ml_evq_hdr *h;
    _Atomic uint64_t *leaf, *sum;
    bool wide;                   /* any member of the fabric may write it */
    struct ml_access users;      /* else who besides us (and root) may */
    uint32_t refs;               /* channels registered in it */
    uint64_t idle_ns;            /* when refs last fell to 0 */
    _Atomic bool live;           /* published: seg, h, leaf, sum are set and stay (see below) */
};
#define ML_EVQ_PART_IDLE_NS (5ull * 1000000000u) /* an idle part goes at an add after this */

struct memlan_evq {
    struct memlan_segment *seg; /* part 0's */
    struct ml_evq_hdr *h;
    _Atomic uint64_t *leaf, *sum;
    struct ml_evq_part part[ML_EVQ_PARTS];
    uint32_t nparts;            /* slots in use or used: part[0..nparts) */
    /* memlan_evq_arm runs in any thread, beside the adds (which the caller serialises with
     * collecting) that make and drop parts: it counts itself here around its look at the
     * parts, and a drop unpublishes a part (live), then waits for no reader before unmapping. */
    _Atomic uint32_t readers;
    uint32_t uid;               /* the owner of part 0's file */
    int32_t pid;                /* the creator: its files are not a fork child's to remove */
    uint32_t capacity;
    int bell;                 /* FIFO read end (opened O_RDWR so it always has a writer) */
    struct ml_evq_slot *slots;
    uint32_t free_head, used;
    /* Every slot ever handed out is below it (it only grows): honest posts and the sweep set
     * bits there only, so a spin's look (__ml_evq_quiet_hint) reads the summary words that
     * cover it (one word per 4,096 slots), not all of them.  Written by memlan_evq_add, read
     * without a lock. */
    _Atomic uint32_t hi;
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

/* Import tok's queue into the cache (NULL and *err on failure).  Caller holds the lock for
 * writing. */
static struct ml_evq_import *ml_evq_cache_import(memlan_fabric_t *fab, const char *tok, int *err)
{
    ml_evq_cache_sweep();
    struct memlan_segment *seg;
    if ((*err = __ml_seg_import(fab, tok, ML_KIND_EVQ, true, &seg)) < 0)
        return NULL;
    *err = -EPROTO;
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
 * sleep on each other on every wake-up they sent.  -EACCES or -EPERM: the queue's file is out of
 * our reach (credentials changed, by this thread alone perhaps: setfsuid, a raw system call; a
 * sandbox); 0 otherwise, whether posted or not. */
static int ml_evq_post_copy(memlan_fabric_t *fab, const struct ml_evq_ref *copy, uint32_t *hint);

int __ml_evq_post_ref(memlan_fabric_t *fab, const struct ml_evq_ref *shared, uint32_t *hint)
{
    /* Copy the reference out of shared memory once, then check it: the peer may write it. */
    struct ml_evq_ref ref;
    memcpy(&ref, shared, sizeof ref);
    int r = ml_evq_post_copy(fab, &ref, hint);
    return r > 0 ? 0 : r;
}

/* A registration's tag (struct ml_sock_side, reach): a byte of a hash of the queue it names
 * (token and endpoint), never 0.  Computed from a private copy. */
uint32_t __ml_evq_ref_tag(const struct ml_evq_ref *copy)
{
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < MEMLAN_TOKEN_LEN; i++)
        h = (h ^ (uint8_t)copy->token[i]) * 16777619u;
    for (uint32_t i = 0; i < 4; i++)
        h = (h ^ ((copy->index >> (8 * i)) & 0xffu)) * 16777619u;
    h = (h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24)) & 0xffu;
    return h ? h : 1u;
}

/* Post to the queue shared names, as __ml_evq_post_ref does, and say which: its tag when the
 * post reached the queue (0 when nothing was posted: a slot free or being claimed, a handler's
 * post skipped), or -EACCES/-EPERM. */
int __ml_evq_prime_ref(memlan_fabric_t *fab, const struct ml_evq_ref *shared, uint32_t *hint)
{
    struct ml_evq_ref ref;
    memcpy(&ref, shared, sizeof ref);
    int r = ml_evq_post_copy(fab, &ref, hint);
    return r > 0 ? (int)__ml_evq_ref_tag(&ref) : r;
}

/* 1 posted, 0 not (nothing named, or skipped), or -EACCES/-EPERM. */
static int ml_evq_post_copy(memlan_fabric_t *fab, const struct ml_evq_ref *copy, uint32_t *hint)
{
    struct ml_evq_ref ref = *copy;
    char tok[MEMLAN_TOKEN_LEN + 1];
    memcpy(tok, ref.token, MEMLAN_TOKEN_LEN);
    tok[MEMLAN_TOKEN_LEN] = '\0';
    if (ref.valid != 1 || !__ml_token_valid(tok))
        return 0;
    pthread_once(&ml_evq_cache_once, ml_evq_cache_atfork);
    /* A signal handler that sends while this thread is inside (send is async-signal-safe) must
     * not wait for itself: it takes the lock only if it is free for readers, and otherwise
     * skips the post (the interrupted thread may be half-way through an import); the waiter
     * then finds the event at its next look, within the liveness interval. */
    bool reentered = ml_evq_cache_depth != 0 || __ml_sig_depth != 0; /* or any handler: an
                                                   * import allocates, under the write lock */
    if (reentered) {
        if (pthread_rwlock_tryrdlock(&ml_evq_cache_lock) != 0)
            return 0;
    } else {
        pthread_rwlock_rdlock(&ml_evq_cache_lock);
    }
    ml_evq_cache_depth++;
    int err = 0, posted = 0;
    struct ml_evq_import *e = ml_evq_cache_find(tok, hint);
    if (!e && reentered) {
        ml_evq_cache_depth--;
        pthread_rwlock_unlock(&ml_evq_cache_lock);
        return 0;
    }
    if (!e) {
        pthread_rwlock_unlock(&ml_evq_cache_lock);
        pthread_rwlock_wrlock(&ml_evq_cache_lock);
        e = ml_evq_cache_find(tok, hint); /* another thread may have imported it meanwhile */
        if (!e)
            e = ml_evq_cache_import(fab, tok, &err);
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
            posted = 1;
        }
    }
    pthread_rwlock_unlock(&ml_evq_cache_lock);
    ml_evq_cache_depth--;
    return err == -EACCES || err == -EPERM ? err : posted;
}

/* ---- the queue's owner ------------------------------------------------------------------- */

/* Make the segment of part p: the queue's geometry, writable by us and, in a shared fabric,
 * by any member (wide) or by users only (none: ours alone). */
static int ml_evq_part_make(struct memlan_evq *q, memlan_fabric_t *fab, struct ml_evq_part *p,
                            bool wide, const struct ml_access *users)
{
    uint32_t capacity = q->capacity;
    uint32_t lw = capacity / 64, sw = (lw + 63) / 64;
    uint64_t body_off = sizeof(struct ml_seg_hdr);
    uint64_t leaf_off = body_off + sizeof(struct ml_evq_hdr);
    uint64_t sum_off = leaf_off + (uint64_t)lw * 8;
    uint64_t body_size = sum_off + (uint64_t)sw * 8 - body_off;
    struct memlan_segment *seg;
    int r = wide ? __ml_seg_create(fab, ML_KIND_EVQ, MEMLAN_MODE_RW, body_off, body_size, 0, &seg)
                 : __ml_seg_create_private(fab, ML_KIND_EVQ, MEMLAN_MODE_RW, body_off, body_size,
                                           0, &seg);
    if (r < 0)
        return r;
    if (!wide && users && users->n > 0 &&
        (r = __ml_acl_private(seg->fd, users->uids, (int)users->n)) < 0) {
        __ml_seg_destroy(seg);
        return r;
    }
    /* A part beyond 0 is made inside an add, where nobody relocates its descriptor: the
     * preload keeps it out of the application's way (part 0's is relocated by its creator,
     * __ml_evq_fds). */
    if (p != &q->part[0] && __ml_fd_keep)
        __ml_fd_keep(&seg->fd);
    struct ml_evq_hdr *h = (struct ml_evq_hdr *)(seg->base + body_off);
    h->capacity = capacity;
    h->leaf_words = lw;
    h->sum_words = sw;
    h->leaf_off = leaf_off;
    h->sum_off = sum_off;
    /* field by field: live is read by other threads (it stays false until published) */
    p->seg = seg;
    p->h = h;
    p->wide = wide;
    p->users = users ? *users : (struct ml_access){0};
    p->refs = 0;
    p->idle_ns = 0;
    p->leaf = (_Atomic uint64_t *)(seg->base + leaf_off);
    p->sum = (_Atomic uint64_t *)(seg->base + sum_off);
    return 0;
}

/* Forget an unpublished part's fields (live is false and stays so). */
static void ml_evq_part_clear(struct ml_evq_part *p)
{
    p->seg = NULL;
    p->h = NULL;
    p->leaf = p->sum = NULL;
    p->refs = 0;
    p->users.n = 0;
}

/* Who may ring the doorbell: the users of the parts there are, write only (a reader could take
 * rings away from us), and everyone when a group-wide part is there.  Written whole, so that a
 * dropped part's users go too. */
static int ml_evq_bell_acl(struct memlan_evq *q)
{
    uint32_t u[ML_EVQ_PARTS * ML_ACCESS_MAX] = {0};
    int n = 0;
    bool wide = false;
    for (uint32_t k = 1; k < q->nparts; k++) {
        struct ml_evq_part *p = &q->part[k];
        if (!p->seg)
            continue;
        wide |= p->wide;
        for (uint32_t i = 0; !p->wide && i < p->users.n; i++) {
            int j = 0;
            while (j < n && u[j] < p->users.uids[i])
                j++;
            if (j < n && u[j] == p->users.uids[i])
                continue;
            memmove(&u[j + 1], &u[j], (size_t)(n - j) * sizeof u[0]);
            u[j] = p->users.uids[i];
            n++;
        }
    }
    int r = __ml_acl_bell(q->bell, u, n, wide);
    if (r == -EOPNOTSUPP && n == 0) /* no ACLs here: the mode says it */
        r = __ml_sys_fchmod(q->bell, wide ? 0622 : 0600);
    return r;
}

/* Undo a part other than 0: its doorbell name, then its file.  false: readers kept coming (it
 * stays, published, for a later add to try again). */
static bool ml_evq_part_drop(struct memlan_evq *q, struct ml_evq_part *p, bool closing)
{
    /* SYNC: seq_cst store, then the readers count (seq_cst), paired with memlan_evq_arm's
     * increment, then its load of live: either it sees the part gone or we see it. */
    atomic_store(&p->live, false);
    for (unsigned i = 0; atomic_load(&q->readers) != 0; i++) {
        if (i == 1000 && !closing) {
            atomic_store(&p->live, true);
            return false;
        }
        __ml_brief_wait(i);
    }
    char name[80];
    __ml_fabric_name(name, sizeof name, "bell", p->seg->token);
    __ml_sys_unlinkat(q->seg->fab->dirfd, name, 0);
    ml_store_release(&p->seg->hdr->state, ML_SEG_REVOKED);
    if (__ml_fd_drop)
        __ml_fd_drop(p->seg->fd);
    __ml_seg_destroy(p->seg);
    ml_evq_part_clear(p);
    if (!closing)
        (void)ml_evq_bell_acl(q); /* its users may ring no more */
    return true;
}

/* The part ch's peer posts to (made if need be), or -ENOSPC when every slot holds channels. */
static int ml_evq_part_for(struct memlan_evq *q, const struct memlan_channel *ch)
{
    memlan_fabric_t *fab = q->seg->fab;
    if (!fab->shared)
        return 0;
    /* Parts whose channels have all gone, long enough ago, go: a user that stopped connecting
     * keeps no file and mapping of ours (a part is made again for its next connection). */
    uint64_t now = __ml_now_ns();
    for (uint32_t k = 1; k < q->nparts; k++)
        if (q->part[k].seg && q->part[k].refs == 0 &&
            now - q->part[k].idle_ns > ML_EVQ_PART_IDLE_NS)
            (void)ml_evq_part_drop(q, &q->part[k], false);
    while (q->nparts > 1 && !q->part[q->nparts - 1].seg)
        __atomic_store_n(&q->nparts, q->nparts - 1, __ATOMIC_RELAXED);
    bool wide = !ch->posters_private;
    struct ml_access set = {0};
    for (uint32_t i = 0; !wide && i < ch->posters.n && i < ML_ACCESS_MAX; i++) {
        uint32_t u = ch->posters.uids[i];
        if (u == q->uid || u == 0)
            continue;
        uint32_t j = 0;
        while (j < set.n && set.uids[j] < u)
            j++;
        if (j < set.n && set.uids[j] == u)
            continue;
        memmove(&set.uids[j + 1], &set.uids[j], (set.n - j) * sizeof set.uids[0]);
        set.uids[j] = u;
        set.n++;
    }
    if (!wide && set.n == 0)
        return 0;
    int freeslot = -1;
    for (uint32_t k = 1; k < q->nparts; k++) {
        struct ml_evq_part *p = &q->part[k];
        if (!p->seg || p->refs == 0) {
            if (freeslot < 0)
                freeslot = (int)k;
            continue;
        }
        if (p->wide == wide &&
            (wide || (p->users.n == set.n &&
                      memcmp(p->users.uids, set.uids, set.n * sizeof set.uids[0]) == 0)))
            return (int)k;
    }
    for (uint32_t k = 1; k < q->nparts; k++) { /* an idle part of the same set: reuse it */
        struct ml_evq_part *p = &q->part[k];
        if (p->seg && p->wide == wide &&
            (wide || (p->users.n == set.n &&
                      memcmp(p->users.uids, set.uids, set.n * sizeof set.uids[0]) == 0)))
            return (int)k;
    }
    if (freeslot >= 0 && q->part[freeslot].seg && !ml_evq_part_drop(q, &q->part[freeslot], false))
        freeslot = -1;
    if (freeslot < 0) {
        if (q->nparts == ML_EVQ_PARTS) {
            __ml_say_once(ML_NOTE_EVQ_PARTS,
                          "an event queue of this process serves connections of 32 other sets "
                          "of users, its most: a connection of a further user is not registered "
                          "with it (memlan_evq_add: ENOSPC; under memlan run, poll and epoll "
                          "look at it every 1 ms instead of sleeping)");
            return -ENOSPC;
        }
        freeslot = (int)q->nparts;
        __atomic_store_n(&q->nparts, q->nparts + 1, __ATOMIC_RELAXED);
    }
    struct ml_evq_part *p = &q->part[freeslot];
    int r = ml_evq_part_make(q, fab, p, wide, &set);
    if (r == 0) {
        /* the doorbell by this part's name too: a poster opens bell-TOKEN of the token it has */
        char bell[80], name[80];
        __ml_fabric_name(bell, sizeof bell, "bell", q->seg->token);
        __ml_fabric_name(name, sizeof name, "bell", p->seg->token);
        r = __ml_sys_linkat(fab->dirfd, bell, fab->dirfd, name);
        bool linked = r == 0;
        /* and the part's users may ring it (set on the open FIFO: mknodat's mode went through
         * the umask) */
        if (r == 0)
            r = ml_evq_bell_acl(q);
        if (r < 0) {
            if (linked)
                __ml_sys_unlinkat(fab->dirfd, name, 0);
            __ml_seg_destroy(p->seg);
            ml_evq_part_clear(p);
        }
    }
    if (r < 0)
        return r;
    __ml_seg_drop_fd(p->seg); /* the mapping keeps our lock: no descriptor in the host's way */
    __ml_seg_publish(p->seg);
    ml_store_release(&p->live, true);
    return freeslot;
}

int memlan_evq_create(memlan_fabric_t *fab, unsigned capacity, memlan_evq_t **out)
{
    if (!fab || !out || capacity > (1u << 24))
        return -EINVAL;
    *out = NULL;
    if (capacity == 0)
        capacity = 4096;
    capacity = (capacity + 63) & ~63u;
    struct memlan_evq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->slots = calloc(capacity, sizeof *q->slots);
    if (!q->slots) {
        __ml_free(q);
        return -ENOMEM;
    }
    q->capacity = capacity;
    /* Part 0 is ours alone, even in a shared fabric (other users post to parts of their own). */
    int r = ml_evq_part_make(q, fab, &q->part[0], false, NULL);
    if (r < 0)
        goto fail;
    q->nparts = 1;
    q->seg = q->part[0].seg;
    atomic_store(&q->part[0].live, true);
    struct stat st;
    q->uid = __ml_sys_fstat(q->seg->fd, &st) == 0 ? (uint32_t)st.st_uid : (uint32_t)fab->uid;
    char name[80];
    __ml_fabric_name(name, sizeof name, "bell", q->seg->token);
    /* Ours alone at first, even in a shared fabric: each part's users are let in to write
     * (never read) as the part is made (ml_evq_part_for). */
    r = __ml_sys_mknodat(fab->dirfd, name, S_IFIFO | 0600);
    if (r < 0)
        goto fail_seg;
    long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NONBLOCK | O_NOFOLLOW, 0);
    if (fd < 0) {
        r = (int)fd;
        __ml_sys_unlinkat(fab->dirfd, name, 0);
        goto fail_seg;
    }
    q->bell = (int)fd;
    q->pid = (int32_t)__ml_pid();
    q->h = q->part[0].h;
    q->leaf = q->part[0].leaf;
    q->sum = q->part[0].sum;
    for (uint32_t i = 0; i < capacity; i++)
        q->slots[i].next_free = i + 1 < capacity ? i + 1 : ML_EVQ_NONE;
    q->free_head = 0;
    __ml_seg_publish(q->seg);
    *out = q;
    return 0;
fail_seg:
    __ml_seg_destroy(q->seg);
fail:
    __ml_free(q->slots);
    __ml_free(q);
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

/* Claim a free slot and name (the part token of q, index) in it, both ways; -EBUSY when none is
 * free. */
static int ml_ref_claim(struct memlan_evq *q, struct memlan_channel *ch, const char *token,
                        uint32_t index)
{
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < ML_EVQ_REFS; i++) {
            struct ml_evq_ref *rx = &ch->rx_refs->rx[i], *tx = &ch->tx_refs->tx[i];
            uint32_t z = 0;
            if (!atomic_compare_exchange_strong(&rx->valid, &z, ML_REF_CLAIMING))
                continue;
            memcpy(rx->token, token, MEMLAN_TOKEN_LEN);
            memcpy(tx->token, token, MEMLAN_TOKEN_LEN);
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

static int ml_evq_add(memlan_evq_t *q, memlan_channel_t *ch, uint32_t events, void *udata,
                      bool quiet);

int memlan_evq_add(memlan_evq_t *q, memlan_channel_t *ch, uint32_t events, void *udata)
{
    return ml_evq_add(q, ch, events, udata, false);
}

/* The socket layer's add: the registration, and the receive side armed (a HUP or an ERR comes
 * that way), without the event for a readiness already there, and without arming for room.  Its
 * callers arm what they wait for and look at the socket themselves; that event, and the post of
 * a room tripwire armed while there was room (the peer's next read), were edges the kernel does
 * not make: an edge-triggered EPOLLOUT came twice for a new member of a set, and again at reads
 * of the peer (tests/preload/etout.c). */
int __ml_evq_add_quiet(memlan_evq_t *q, memlan_channel_t *ch, uint32_t events, void *udata)
{
    return ml_evq_add(q, ch, events, udata, true);
}

static int ml_evq_add(memlan_evq_t *q, memlan_channel_t *ch, uint32_t events, void *udata,
                      bool quiet)
{
    if (!q || !ch || !(events & (MEMLAN_EV_READ | MEMLAN_EV_WRITE)) ||
        (events & ~(uint32_t)(MEMLAN_EV_READ | MEMLAN_EV_WRITE)))
        return -EINVAL;
    if (ch->evq)
        return -EEXIST;
    if (q->free_head == ML_EVQ_NONE)
        return -ENOSPC;
    int part = ml_evq_part_for(q, ch);
    if (part < 0)
        return part;
    struct ml_evq_part *p = &q->part[part];
    uint32_t i = q->free_head;
    /* The registration must be in place before the tripwires are armed in EVQ mode: the arming
     * store and fence in __ml_chan_arm_evq() publish it to the peer's waker.  It names the part
     * the peer may write (a part just made and left unused goes with the idle ones). */
    int r = ml_ref_claim(q, ch, p->seg->token, i);
    if (r < 0)
        return r;
    p->refs++;
    ch->evq_part = (uint32_t)part;
    q->free_head = q->slots[i].next_free;
    q->slots[i] = (struct ml_evq_slot){.ch = ch, .udata = udata, .events = events};
    q->used++;
    if (i >= ml_load_relaxed(&q->hi))
        ml_store_relaxed(&q->hi, i + 1);
    ch->evq = q;
    ch->evq_index = i;
    ch->evq_events = events;
    ch->udata = udata;
    /* Always watch the receive side: HUP and ERR come that way. */
    if (quiet)
        (void)__ml_chan_arm_evq(ch, MEMLAN_EV_READ);
    else if (__ml_chan_arm_evq(ch, events | MEMLAN_EV_READ))
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
    if (ch->evq_part < q->nparts && q->part[ch->evq_part].refs &&
        --q->part[ch->evq_part].refs == 0)
        q->part[ch->evq_part].idle_ns = __ml_now_ns();
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
static int ml_evq_collect_part(struct memlan_evq *q, struct ml_evq_part *p,
                               struct memlan_event *ev, int n, int max)
{
    uint32_t nwords = q->capacity / 64;
    uint32_t sw = (nwords + 63) / 64;
    _Atomic uint64_t *sum = p->sum, *leaf = p->leaf;
    for (uint32_t s = 0; s < sw; s++) {
        if (ml_load_relaxed(&sum[s]) == 0)
            continue;
        uint64_t sbits = ml_xchg(&sum[s], 0ull);
        while (sbits) {
            uint32_t lw = s * 64 + (uint32_t)__builtin_ctzll(sbits);
            sbits &= sbits - 1;
            if (lw >= nwords)
                continue; /* no such leaf word: garbage from a peer */
            if (n >= max) { /* no room: put the summary bit back for the next call */
                ml_fetch_or(&sum[s], 1ull << (lw % 64));
                continue;
            }
            uint64_t bits = ml_xchg(&leaf[lw], 0ull);
            while (bits) {
                uint32_t i = lw * 64 + (uint32_t)__builtin_ctzll(bits);
                bits &= bits - 1;
                if (n >= max) {
                    ml_evq_set(leaf, sum, i);
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

static int ml_evq_collect(struct memlan_evq *q, struct memlan_event *ev, int max)
{
    int n = 0;
    for (uint32_t k = 0; k < q->nparts; k++)
        if (q->part[k].seg)
            n = ml_evq_collect_part(q, &q->part[k], ev, n, max);
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
    uint32_t np = __atomic_load_n(&q->nparts, __ATOMIC_RELAXED);
    for (uint32_t k = 0; k < np; k++)
        for (uint32_t s = 0; ml_load_acquire(&q->part[k].live) && s < sw; s++)
            if (ml_load_relaxed(&q->part[k].sum[s]))
                return true;
    return false;
}

/* Arm (bits) or disarm (0) the waiter word of every part: a poster rings if its part's is set. */
static void ml_evq_arm_all(struct memlan_evq *q, uint32_t bits)
{
    uint32_t np = __atomic_load_n(&q->nparts, __ATOMIC_RELAXED);
    for (uint32_t k = 0; k < np; k++)
        if (ml_load_acquire(&q->part[k].live)) {
            if (bits)
                ml_fetch_or(&q->part[k].h->waiter, bits);
            else
                ml_xchg(&q->part[k].h->waiter, 0u);
        }
}

/* Read what the doorbell holds (a pipe's read returns what it has: a short read emptied it). */
static void ml_evq_bell_drain(struct memlan_evq *q)
{
    char buf[64];
    while (__ml_sys_read(q->bell, buf, sizeof buf) == (long)sizeof buf)
        ;
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
    /* With parts, a poster can wake only its own part's futex word: we sleep on the doorbell
     * that they all ring instead. */
    bool parts = q->nparts > 1;
    uint32_t mine = parts ? ML_EVQ_WAIT_FD : ML_EVQ_WAIT_FUTEX;
    for (;;) {
        ml_evq_arm_all(q, mine);
        ml_fence(); /* SYNC: pairs with the fence in ml_evq_ring() */
        if (spurious < ML_EVQ_SPURIOUS && ml_evq_pending(q)) {
            ml_evq_arm_all(q, 0);
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
                ml_evq_arm_all(q, 0);
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
        } else if (parts) {
            r = __ml_sys_poll1(q->bell, POLLIN, (int)((tmo + 999999) / 1000000));
            if (r > 0) {
                ml_evq_bell_drain(q);
                spurious++;
                r = 0;
            } else if (r == 0) {
                r = -ETIMEDOUT;
            }
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

/* One part (the queue's own, which lives as long as the queue: no reader count needed), its
 * summary words clear.  With more parts, false: a part may go under a reader that does not
 * count itself (ml_evq_part_drop). */
static bool ml_evq_quiet(struct memlan_evq *q, bool all)
{
    if (__atomic_load_n(&q->nparts, __ATOMIC_RELAXED) != 1)
        return false;
    uint32_t sw = (q->capacity / 64 + 63) / 64,
             hw = (ml_load_relaxed(&q->hi) + 64u * 64u - 1) / (64u * 64u);
    if (!all && hw < sw)
        sw = hw;
    for (uint32_t s = 0; s < sw; s++)
        if (ml_load_relaxed(&q->part[0].sum[s]))
            return false;
    return true;
}

bool __ml_evq_quiet(struct memlan_evq *q) { return ml_evq_quiet(q, true); }

/* The same over the summary words that cover slots ever handed out, only: for a spin's look,
 * which looks again and again.  Bits a peer wrote above those words name no channel and are
 * not seen here; only a collect clears them.  So the drains ask __ml_evq_quiet: their callers
 * loop while memlan_evq_arm (every word) says something is pending, and a drain that skipped
 * its collect on this answer would leave them looping for ever.  A slot handed out meanwhile is
 * this hint's race, as any post's: the next look, or the locked look before a sleep, finds it. */
bool __ml_evq_quiet_hint(struct memlan_evq *q) { return ml_evq_quiet(q, false); }

int memlan_evq_arm(memlan_evq_t *q)
{
    if (!q)
        return -EINVAL;
    ml_evq_bell_drain(q);
    /* Any thread may arm while another adds (and makes or drops a part): count ourselves in
     * (see ml_evq_part_drop). */
    atomic_fetch_add(&q->readers, 1u);
    ml_evq_arm_all(q, ML_EVQ_WAIT_FD);
    ml_fence(); /* SYNC: pairs with the fence in ml_evq_ring() */
    int r = ml_evq_pending(q) ? 1 : 0;
    atomic_fetch_sub(&q->readers, 1u);
    return r;
}

void memlan_evq_close(memlan_evq_t *q)
{
    if (!q)
        return;
    /* A fork child's close of the handle it inherited drops its own copies only: the files, the
     * doorbell, the parts and the registrations are the creator's, whose queue goes on. */
    if (q->pid != (int32_t)__ml_pid()) {
        __ml_evq_forget(q);
        return;
    }
    for (uint32_t i = 0; i < q->capacity; i++)
        if (q->slots[i].ch)
            memlan_evq_del(q, q->slots[i].ch);
    for (uint32_t k = 1; k < q->nparts; k++)
        if (q->part[k].seg)
            (void)ml_evq_part_drop(q, &q->part[k], true);
    char name[80];
    __ml_fabric_name(name, sizeof name, "bell", q->seg->token);
    __ml_sys_unlinkat(q->seg->fab->dirfd, name, 0);
    __ml_sys_close(q->bell);
    ml_store_release(&q->seg->hdr->state, ML_SEG_REVOKED);
    __ml_seg_destroy(q->seg);
    __ml_free(q->slots);
    __ml_free(q);
}

/*
 * exit() in the queue's process: its files and doorbells lose their names, and nothing else
 * changes: other threads may wait on the queue, and peers that imported it may post to it, until
 * the process is gone (the mapping, the descriptors and the registrations go with it).  A peer
 * that would import it from now on finds no name and looks at its channels again every liveness
 * interval instead.  Counted among the parts' readers, as memlan_evq_arm is, so that a part an
 * add drops meanwhile is unmapped only after our look.
 */
void __ml_evq_unname(struct memlan_evq *q)
{
    if (!q || q->pid != (int32_t)__ml_pid())
        return;
    atomic_fetch_add(&q->readers, 1);
    uint32_t np = __atomic_load_n(&q->nparts, __ATOMIC_RELAXED);
    for (uint32_t k = 0; k < np && k < ML_EVQ_PARTS; k++) {
        struct memlan_segment *seg = q->seg;
        if (k > 0) {
            if (!atomic_load(&q->part[k].live))
                continue;
            seg = q->part[k].seg;
        }
        if (!seg || !seg->owner)
            continue;
        char name[80];
        __ml_fabric_name(name, sizeof name, "bell", seg->token);
        __ml_sys_unlinkat(q->seg->fab->dirfd, name, 0);
        __ml_seg_unname(seg);
    }
    atomic_fetch_sub(&q->readers, 1);
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
    for (uint32_t k = 1; k < q->nparts; k++) { /* the parts too: the parent's, not ours */
        struct memlan_segment *ps = q->part[k].seg;
        if (!ps)
            continue;
        if (__ml_fd_drop)
            __ml_fd_drop(ps->fd);
        ps->owner = false;
        __ml_seg_destroy(ps);
    }
    q->seg->owner = false; /* not ours to unlink */
    __ml_seg_destroy(q->seg);
    __ml_free(q->slots);
    __ml_free(q);
}

/* Where q keeps its descriptors, for a caller that relocates them (the preload layer keeps its
 * own fds at high numbers, out of the application's way). */
void __ml_evq_fds(struct memlan_evq *q, int **seg_fd, int **bell_fd)
{
    *seg_fd = &q->seg->fd;
    *bell_fd = &q->bell;
}
