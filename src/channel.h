/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * channel.h - the private view of a channel, shared by channel.c and evq.c.
 */
#ifndef MEMLAN_CHANNEL_H
#define MEMLAN_CHANNEL_H

#include "internal.h"
#include "ring.h"

#include <sys/uio.h>

/* Where the two ring control blocks sit in a channel segment's first page. */
#define ML_CHAN_CTL0_OFF 256u
#define ML_CHAN_CTL1_OFF 640u
_Static_assert(ML_CHAN_CTL0_OFF >= sizeof(struct ml_seg_hdr) + sizeof(struct ml_chan_hdr),
               "ring 0 control after the headers");
_Static_assert(ML_CHAN_CTL1_OFF >= ML_CHAN_CTL0_OFF + sizeof(struct ml_ring_ctl),
               "ring 1 control after ring 0's");
_Static_assert(ML_CHAN_CTL1_OFF + sizeof(struct ml_ring_ctl) <= ML_CHAN_SOCK_OFF,
               "controls before the socket blocks");
_Static_assert(ML_CHAN_SOCK_OFF + 2 * sizeof(struct ml_sock_side) <= ML_CHAN_OFFER_OFF,
               "socket blocks before the offer");
_Static_assert(ML_CHAN_OFFER_OFF + sizeof(struct ml_offer_blk) <= ML_CHAN_REFS_OFF,
               "the offer before the registrations");
_Static_assert(ML_CHAN_REFS_OFF % ML_CACHELINE == 0 &&
               ML_CHAN_REFS_OFF + 2 * sizeof(struct ml_chan_refs) <= ML_PAGE, "all in page 0");

struct memlan_channel {
    struct memlan_segment *seg;
    struct ml_chan_hdr *hdr;
    int side;                 /* 0 created, 1 attached */
    uint32_t kind;            /* MEMLAN_STREAM or MEMLAN_MSG, private copy */
    uint64_t size;            /* ring size, private copy */
    struct ml_ring tx, rx;
    struct ml_chan_refs *tx_refs, *rx_refs; /* the registrations of each ring (layout.h) */
    struct ml_spin spin_rx, spin_tx;
    /* ns the socket layer's receive spun holding its direction before it took the regular
     * path's wait (__ml_chan_spin_rx_ro), which spins that much less (relaxed: a lost or
     * stolen count only changes how long a spin is) */
    _Atomic uint64_t rx_spun_ns;
    uint64_t tx_want;         /* free bytes the sender waits for */
    uint64_t reserved;        /* bytes given by the last reserve */
    uint64_t peeked;          /* bytes (record) given by the last peek */
    uint64_t rx_tmo_ns, tx_tmo_ns; /* blocking recv / send give up after these (0 = never):
                                    * memlan_channel_set_timeout, or the socket layer's
                                    * SO_RCVTIMEO / SO_SNDTIMEO for its own waits */
    /* The kernel refused the asymmetric barrier once: we never declare it again, and a sleep
     * that still needs it is bounded (channel.c, __ml_mb_wait_barrier). */
    _Atomic bool mb_lost;
    uint32_t rx_lowat;        /* the socket layer's SO_RCVLOWAT: the bytes that make the
                               * receive side ready to a waiter (0 or 1: any byte) */
    bool shut_rd, shut_wr, peer_dead;
    bool dead_before_fin;     /* socket layer: at our shutdown(SHUT_WR) the peer, shut down
                               * with our bytes unread, was already dead: its kernel's reset
                               * came first (EPIPE kept, see mlp_peer_aborted) */
    bool peer_seen;           /* creator: the attached word once read 1 (see ml_peer_dead) */
    bool split;               /* the peer talks over the kernel socket: it decided TCP */
    uint64_t split_ns;        /* when bytes were first seen on the kernel socket (0: none) */
    /* when we first found the lock of a peer side passed over SCM_RIGHTS (ML_SOCK_PASSED) free,
     * its receiver not yet in (0: not so at the last look); see ml_peer_dead */
    _Atomic uint64_t passed_free_ns;
    _Atomic uint32_t passed_gen; /* the peer side's pass count (`passes`) at that look */
    _Atomic bool passed_busy;    /* a thread of ours is in ml_passed_grace's look */
    bool unattached;          /* creator: nobody attached within attach_by; withdrawn */
    uint64_t attach_by;       /* creator (native API): a blocking call gives up waiting for an
                               * attacher at this time (ns, 0 = never; see ml_attach_expired) */
    bool rd_eof_when_empty;   /* socket SHUT_RD: queued bytes, then end of stream */
    bool poolable;            /* the file goes to the fabric's pool when we close */
    unsigned forks;           /* __ml_chan_forks when created: a fork since means no pool */
    /* Event queue registration (evq.c). */
    struct memlan_evq *evq;
    uint32_t evq_index, evq_events;
    /* Counts the times a send found the ring short of room (its EAGAIN, a short nonblocking
     * write, a wait for room) or an edge-triggered member armed for room: the room that comes
     * after one is an edge (the kernel's SOCK_NOSPACE), room that was always there is not. */
    _Atomic uint32_t tx_short;
    uint32_t evq_ref;         /* the registration slot we claimed (valid while evq is set) */
    int32_t evq_pid;          /* who claimed it: a fork child's copy never frees its parent's */
    uint32_t peer_evq_hint[ML_EVQ_REFS]; /* where each peer queue last sat in our import cache */
    /* We set ML_SOCK_NOPOST in our side because a post was refused (ml_chan_nopost), not the
     * socket layer for a credential change (which clears this): a send tries the posts again
     * at most once a second (nopost_try_ns) and takes the flag back when none is refused. */
    _Atomic bool nopost_mine;
    /* The tag of each peer registration our last priming posts reached (0: not reached), which
     * a credential change publishes (__ml_chan_publish_reach). */
    uint8_t reach_tag[ML_EVQ_REFS];
    uint8_t tried_tag[ML_EVQ_REFS]; /* the tag of each registration that priming saw (0: none) */
    _Atomic uint64_t nopost_try_ns;
    uint32_t evq_part;        /* the part of our queue the peer posts to (evq.c) */
    /* Who may write the channel's file, besides root (evq.c registers the channel in a part of
     * its queue that only they and we may write): posters_private false means any member of a
     * shared fabric (group-wide files, and whatever could not be told). */
    bool posters_private;
    struct ml_access posters;
    void *udata;
    /* The kernel socket under the channel (set by the socket layer; sock_ino 0: none).  Asked
     * about the peer's death when its liveness lock cannot be, and whether bytes arrived on it
     * (the peer decided TCP: see ml_peer_dead()). */
    int sock_fd;
    uint64_t sock_ino;
    /* Urgent data (the socket layer's, layout.h ml_sock_side.urg): the socket's SO_OOBINLINE as
     * the socket layer last set or asked it (urg_inline_known), and the peer's urg value whose
     * byte a recv(MSG_OOB) took (0: none). */
    bool urg_inline, urg_inline_known;
    uint64_t urg_inline_u;    /* the peer's urg when urg_inline was last asked */
    uint64_t peek_skip;       /* bytes before the last peek's that its release takes too */
    uint64_t rx_skip_seen;    /* the bytes the last peek passed over (its wait wants more) */
    /* Counters for memlan stat and the bench. */
    uint64_t bytes_tx, bytes_rx, msgs_tx, msgs_rx, wakeups, sleeps, spin_hits;
    uint64_t mb_barriers;     /* asymmetric barriers our armings made (channel.c, ml_mb_barrier) */
    uint64_t wait_timeouts;   /* futex sleeps of a blocking call that ran out (the liveness
                               * interval, a deadline or a slice) rather than being woken */
    uint64_t wait_found_late; /* waits that found what they waited for at the look after such a
                               * sleep: never, from an honest peer, unless it was held off a cpu
                               * (a wake-up lost, or one that came a liveness interval late) */
    /* The receiving thread's own (the native face's, one receiving thread at a time): its last
     * wait ended by spinning, so its next empty ring is looked at a few more times before the
     * wait (ml_rx_quick); and the waits that look ended, for memlan stat's spin_hits. */
    bool rx_spin_first;
    uint64_t rx_quick_hits;
    /* Our direction may not grow (again): its region could not be reserved (a full fabric, a
     * kernel without MADV_POPULATE_WRITE, a sandbox); read by readiness, so atomic. */
    _Atomic bool grow_off;
    uint64_t grows;           /* times our direction went into its region (memlan stat) */
    uint64_t sio_rings;       /* bytes written to the peer's SIGIO or SIGURG FIFO (atomic) */
    uint64_t sio_missed;      /* rings that could not open it, or write to it */
    int sio_ring_fd[2];       /* our fd on the peer's SIGIO [0] and SIGURG [1] FIFO, from the
                               * first ring on, valid where sio_ring_st is 2 (__ml_chan_sig_ring):
                               * 0 none, 1 being opened, 2 open, 3 dropped (the channel ends) */
    int sio_ring_st[2];
    bool sio_ring_rd[2];      /* ... opened read-write: the ring reads its byte back */
    uint32_t grow_slot;       /* the socket layer's: its slot in the list of idle regions + 1 */
};

void __ml_chan_wake_slow(struct memlan_channel *ch, _Atomic uint32_t *word,
                         const struct ml_evq_ref *refs);
int __ml_chan_sio_open(struct memlan_channel *ch, bool urg, int *wfd); /* our FIFO */
void __ml_chan_sio_arm(struct memlan_channel *ch, bool on);
void __ml_chan_sio_unlink(struct memlan_channel *ch, bool urg);
void __ml_chan_sig_ring(struct memlan_channel *ch, bool urg); /* the peer's FIFO */
void __ml_chan_sio_drop(struct memlan_channel *ch);           /* our fds on it go */
void __ml_chan_sio_room(struct memlan_channel *ch); /* a nonblocking send found it full */
void __ml_chan_sio_names_gone(struct memlan_channel *ch);     /* with the file's name */
void __ml_chan_after_fork(struct memlan_channel *ch);  /* in a fork child: per-thread state */
extern bool (*__ml_wait_recv)(void); /* a blocking receive's wait? (ML_WAIT_RECV) */
void __ml_chan_recv_awake(struct memlan_channel *ch);
extern void (*__ml_sio_missed)(struct memlan_channel *ch, bool urg, int err);

/* After publishing: wake the other side if, and only if, it armed its tripwire. */
static inline void __ml_chan_wake(struct memlan_channel *ch, _Atomic uint32_t *word,
                                  const struct ml_evq_ref *refs)
{
    ml_fence(); /* SYNC: pairs with the fence after arming in ml_wait() and __ml_chan_arm_evq() */
    if (ml_unlikely(ml_load_relaxed(word) != 0))
        __ml_chan_wake_slow(ch, word, refs);
}

/* The same, right after a seq_cst exchange (ring produce/consume), which is already the full
 * barrier the handshake needs. */
static inline void __ml_chan_wake_rmw(struct memlan_channel *ch, _Atomic uint32_t *word,
                                      const struct ml_evq_ref *refs)
{
    /* SYNC: F1; pairs with the fence after arming in ml_wait() and __ml_chan_arm_evq() */
    if (ml_unlikely(atomic_load_explicit(word, memory_order_seq_cst) != 0))
        __ml_chan_wake_slow(ch, word, refs);
}

bool __ml_chan_arm_evq(struct memlan_channel *ch, uint32_t events);
void __ml_mb_off(void);
void __ml_madvise_off(void); /* a seccomp filter came: no more madvise (a ring's growth) */
int __ml_mb_wait_barrier(struct memlan_channel *ch, _Atomic uint32_t *decl, _Atomic uint32_t *ack);
void __ml_chan_post_peer_refs(struct memlan_channel *ch, bool prime);
void __ml_chan_publish_reach(struct memlan_channel *ch, bool none);
bool __ml_chan_peer_refs_new(struct memlan_channel *ch);
void __ml_chan_nopost_retry(struct memlan_channel *ch);
int __ml_chan_check_peer(struct memlan_channel *ch);
/* Growth, for the socket layer: called after each switch into a region (NULL: none); the
 * producer's look while idle, under its send lock (1: pages may still be kept); the time the
 * pages are kept after a growth. */
extern void (*__ml_grow_note)(struct memlan_channel *ch);
int __ml_chan_grow_settle(struct memlan_channel *ch);
uint64_t __ml_chan_grow_keep_ns(void);
void __ml_evq_post_local(struct memlan_evq *q, uint32_t index);
/* evq.c: memlan_evq_add for the socket layer: no event for a readiness already there, and the
 * receive side alone armed (the caller arms and looks itself). */
int __ml_evq_add_quiet(struct memlan_evq *q, struct memlan_channel *ch, uint32_t events,
                       void *udata);

/* For the socket layer (src/preload): see channel.c. */
int __ml_chan_create_pooled(memlan_fabric_t *fab, size_t ring_size, size_t grow,
                            memlan_channel_t **out);
/* The same, private to the acceptor users acc in a shared fabric (acl.c; -EOPNOTSUPP where the
 * file system has no ACLs); acc NULL: as above. */
struct ml_access;
int __ml_chan_create_pooled_for(memlan_fabric_t *fab, size_t ring_size, size_t grow,
                                const struct ml_access *acc, memlan_channel_t **out);
int __ml_chan_attach_offer(memlan_fabric_t *fab, int fd, int fdb, const struct stat *st,
                           const char *name, memlan_channel_t **out);
int __ml_chan_attach_gen(memlan_fabric_t *fab, const char *token, uint32_t gen,
                         memlan_channel_t **out);
uint32_t __ml_chan_generation(const struct memlan_channel *ch);
/* Close our side as its last holder, whichever process made the handle (the socket layer's
 * close after fork: it counts its holders itself).  memlan_channel_close() is this in the process
 * that made the handle, and in a fork child lets go of the child's copies only. */
void __ml_chan_end(struct memlan_channel *ch);
int __ml_chan_withdraw(struct memlan_channel *ch);
/* kept: the channel's file, opened before (> 0), for when the name is refused; else 0 */
int __ml_chan_exec_bridge(struct memlan_channel *ch, int kept);
int __ml_chan_adopt(memlan_fabric_t *fab, const char *token, int fd, int side,
                    memlan_channel_t **out);
int __ml_chan_bridge_open(memlan_fabric_t *fab, const char *token, int side);
uint32_t __ml_chan_attach_state(const struct memlan_channel *ch);
void __ml_chan_abandon(struct memlan_channel *ch);
/* A native channel private to its creator and acc's users in a shared fabric (endpoint.c). */
struct ml_access;
__attribute__((visibility("default"))) int
__ml_chan_create_for(memlan_fabric_t *fab, const struct memlan_channel_opts *opts,
                     const struct ml_access *acc, memlan_channel_t **out);
int __ml_chan_attach_uid(memlan_fabric_t *fab, const char *token, uint32_t uid,
                         memlan_channel_t **out);
void __ml_chan_offer_limit(struct memlan_channel *ch, uint64_t bytes);
void __ml_chan_pool_unname(memlan_fabric_t *fab);
size_t __ml_chan_unsent(struct memlan_channel *ch, const void **ptr);
void __ml_chan_unsent_done(struct memlan_channel *ch, size_t n);
void __ml_chan_resync_tx(struct memlan_channel *ch);
void __ml_chan_resync_rx(struct memlan_channel *ch);
void __ml_chan_pub_share(struct memlan_channel *ch, _Atomic uint64_t *tx, _Atomic uint64_t *rx,
                         _Atomic uint64_t *grow);
/* MSG_PEEK: the readable bytes as far as the head now (not the cached copy), in up to max runs
 * (*nrun of them: the ring's up to a switch, then the region's, which its end may cut in two);
 * their total, or memlan_peek's answer. */
ssize_t __ml_chan_peek_runs(struct memlan_channel *ch, struct iovec *run, int max, int *nrun,
                            int flags);
/* The room for a whole send of want bytes, growing the ring if that gives it; -EAGAIN. */
ssize_t __ml_chan_tx_room(struct memlan_channel *ch, uint64_t want);
int64_t __ml_chan_rx_avail_ro(const struct memlan_channel *ch); /* -1: cannot tell, go and look */
int64_t __ml_chan_tx_free_ro(const struct memlan_channel *ch);
uint64_t __ml_chan_tx_queued(struct memlan_channel *ch);
bool __ml_chan_peer_left_unread(struct memlan_channel *ch);
void __ml_chan_kick_rx(struct memlan_channel *ch);
uint32_t __ml_chan_peer_state(struct memlan_channel *ch);
void __ml_evq_fds(struct memlan_evq *q, int **seg_fd, int **bell_fd);
void __ml_evq_forget(struct memlan_evq *q);
void __ml_evq_unname(struct memlan_evq *q);
extern unsigned (*__ml_wait_hook)(void); /* see ml_wait() in channel.c */
extern bool (*__ml_urg_inline_hook)(struct memlan_channel *ch); /* see ml_urg_inline() */
bool __ml_chan_urg_inline(struct memlan_channel *ch);
int64_t __ml_chan_rx_urg_dist(struct memlan_channel *ch);
void __ml_chan_rx_pass_over(struct memlan_channel *ch);
uint64_t __ml_chan_tx_pos(const struct memlan_channel *ch);
uint64_t __ml_chan_tx_peer_pos(const struct memlan_channel *ch);
uint64_t __ml_chan_rx_pos_ro(const struct memlan_channel *ch);
#define ML_URG_PENDING 1
#define ML_URG_AT      2
#define ML_URG_HERE    4
#define ML_URG_TAKEN   8
#define ML_URG_ONLY    16 /* the readable bytes are all ones a read skips */
int __ml_chan_urg_state(struct memlan_channel *ch, uint8_t *byte, int64_t *before, bool take);
extern unsigned (*__ml_intr_count)(void); /* the same */
extern unsigned (*__ml_intr_any)(void);   /* the same */
extern _Atomic bool __ml_intr_blind;      /* the same */
int __ml_chan_wait_rx(struct memlan_channel *ch, int flags);
int __ml_chan_wait_tx(struct memlan_channel *ch, uint64_t want);
int __ml_chan_wait_ro(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline);
bool __ml_chan_ready_ro(struct memlan_channel *ch, int dir, uint64_t want);
int __ml_chan_wait_ro_slice(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline,
                            uint64_t slice);
int __ml_chan_wait_ro_first(struct memlan_channel *ch, int dir, uint64_t want, uint64_t deadline,
                            uint64_t slice);
bool __ml_chan_peer_exiting(struct memlan_channel *ch);
void __ml_chan_wake_peer(struct memlan_channel *ch);
int __ml_chan_spin_rx_ro(struct memlan_channel *ch, uint64_t cap_ns);
/* A stream ring holds nothing at our position (the receive's first look, head reloaded); false
 * when it holds something or cannot tell.  For a holder of the direction. */
bool __ml_chan_rx_nothing(struct memlan_channel *ch);
void __ml_chan_kick_tx(struct memlan_channel *ch);
void __ml_chan_post_self(struct memlan_channel *ch);
bool __ml_chan_rx_at_mark_ro(const struct memlan_channel *ch);
bool __ml_chan_rx_inband_ro(const struct memlan_channel *ch);

/* A place in a vector of buffers: piece i, byte off of it.  __ml_chan_sendv sends from it to the
 * vector's end (memlan_sendv's rules, no argument checks: the caller's vector is known good) and
 * leaves it past what was sent. */
struct ml_iov_cur {
    const struct iovec *iov;
    int n, i;
    size_t off;
};
ssize_t __ml_chan_sendv(struct memlan_channel *ch, struct ml_iov_cur *c, int flags);
/* __ml_chan_sendv's flag for a send that __ml_chan_tx_room found room for: one publication. */
#define ML_SEND_WHOLE 0x40000000

#endif
