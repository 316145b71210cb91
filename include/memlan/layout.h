/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * memlan/layout.h - the bytes memlan keeps in shared memory: its ABI between processes.
 *
 * Everything that two processes read and write in common is declared here and nowhere else.
 * Fields have fixed widths; positions are offsets from the start of the segment, never
 * pointers; each hot index sits alone on a 64-byte line.  A process never trusts a value it reads
 * from here: the peer may be buggy or hostile, so every index, length and offset is checked
 * against the private copy of the geometry taken when the segment was mapped.  Bump
 * ML_LAYOUT_VERSION on any change that a reader of the other version would misread (a field
 * that an older library never touched, and whose 0 means what it did without it, needs none);
 * a reader refuses a version it does not know.
 *
 * This header is not part of the public API (include <memlan.h> for that); it is shipped so that
 * tools and other implementations can read a fabric.
 */
#ifndef MEMLAN_LAYOUT_H
#define MEMLAN_LAYOUT_H

#include <stdint.h>
#include <stddef.h>

#define ML_SEG_MAGIC       0x47534e414c4d454dull /* "MEMLANSG" little-endian */
#define ML_LAYOUT_VERSION  6u /* 2: tripwire words are sets of waiter kinds; 3: message records
                                 * carry publication words (src/ring.h); 4: a direction names up
                                 * to ML_EVQ_REFS event queues (struct ml_chan_refs); 5: a stream
                                 * ring may grow into a region (ml_chan_hdr.grow_size); 6: a
                                 * data tripwire's ML_WAIT_SIGIO outlives wake-ups */
#define ML_CACHELINE       64
#define ML_TOKEN_HEX       32 /* a token is 128 random bits written as lowercase hex */

/* Segment kinds. */
#define ML_KIND_RAW     1u /* memlan_segment_export(): a user region */
#define ML_KIND_CHANNEL 2u /* two rings and their tripwires */
#define ML_KIND_EVQ     3u /* an event queue */
#define ML_KIND_PROC    4u /* a memlan process's list of connections (for memlan stat) */

/* Segment states (ml_seg_hdr.state). */
#define ML_SEG_LIVE    1u
#define ML_SEG_REVOKED 2u

/* Liveness bytes: each live user of a file holds an OFD write lock on its byte. */
#define ML_LOCK_OWNER    0 /* the process that created the file */
#define ML_LOCK_ATTACHER 1 /* a channel's second side */
/* A side carried across exec: the exec'ing process cannot hand its write lock on (it lives in
 * mappings that exec takes away), so before exec it takes a read lock on the side's bridge byte
 * through a new open file that survives exec, and the new image maps the channel from it.  A
 * side is alive while either byte is held. */
#define ML_LOCK_BRIDGE(b) ((b) + 2)

/* Every fabric file starts with this header: 128 bytes. */
struct ml_seg_hdr {
    uint64_t magic;            /* ML_SEG_MAGIC */
    uint32_t version;          /* ML_LAYOUT_VERSION */
    uint32_t hdr_size;         /* sizeof(struct ml_seg_hdr) */
    uint64_t total_size;       /* size of the file, bytes */
    uint32_t kind;             /* ML_KIND_* */
    uint32_t mode;             /* MEMLAN_MODE_RO or MEMLAN_MODE_RW */
    uint64_t body_off;         /* offset of the kind's body */
    uint64_t body_size;        /* bytes of body */
    int32_t owner_pid;         /* informational: the owner's liveness is its lock, not this */
    uint32_t owner_uid;
    uint64_t created_ns;       /* CLOCK_REALTIME at creation, informational */
    _Atomic uint32_t state;    /* ML_SEG_LIVE / ML_SEG_REVOKED */
    _Atomic uint32_t ready;    /* 1 once the creator finished the header (release) */
    uint8_t reserved[128 - 72];
};

/*
 * One direction of a channel: a single-producer single-consumer ring.
 *
 * head and tail are free-running 64-bit byte counts; the data index is count & (size - 1).  The
 * producer alone stores head, the consumer alone stores tail; each keeps its own copy privately
 * and reads the other's only when the ring looks full (producer) or empty (consumer).
 *
 * rx_wait is the consumer's tripwire (it waits for data), tx_wait the producer's (it waits for
 * space).  A set of bits: 0 = not armed, ML_WAIT_FUTEX = a thread sleeps on the word,
 * ML_WAIT_EVQ_REF(i) = post to the event queue that registration slot i of the direction names
 * (struct ml_chan_refs); any of them may be set at once (a thread blocked in recv while another
 * polls the socket, a parent's epoll set and its fork child's poll).  Only the side that waits
 * arms a word, by OR-ing its bit in; the other side clears the whole word (but ML_WAIT_SIGIO)
 * and wakes every waiter it found; a waiter that stops waiting clears its own bit only.
 */
#define ML_WAIT_FUTEX 1u
#define ML_EVQ_REFS   8u                         /* event queues per direction */
#define ML_WAIT_EVQ_REF(i) (2u << (i))            /* slot i's bit */
#define ML_WAIT_EVQ   ML_WAIT_EVQ_REF(0)
#define ML_WAIT_EVQ_ANY (((1u << ML_EVQ_REFS) - 1) << 1)
/* On a data tripwire (rx_wait) only: the consumer's socket asked for SIGIO (O_ASYNC).  The waker
 * leaves this bit set (it clears the rest) and, at each wake-up, writes a byte to the consumer
 * side's FIFO sioS-TOKEN (S its side), whose read end the consumer holds with O_ASYNC and the
 * socket's owner: the kernel raises the signal.  Only the consumer sets and clears it. */
#define ML_WAIT_SIGIO (2u << ML_EVQ_REFS)
/* With ML_WAIT_FUTEX on a data tripwire: the sleeper is a blocking receive, for which the kernel
 * holds SIGIO back (sk_wait_data); no ring then.  Cleared with the rest by the waker. */
#define ML_WAIT_RECV  (4u << ML_EVQ_REFS)

/* An event queue registration.  valid: 0 free, ML_REF_CLAIMING while its claimer writes it,
 * ML_REF_VALID once it names a queue; a process claims a free slot with a compare-and-swap of
 * valid (the processes that share a socket after fork each claim their own) and frees its own. */
#define ML_REF_VALID    1u
#define ML_REF_CLAIMING 2u
struct ml_evq_ref {
    char token[ML_TOKEN_HEX];  /* the event queue segment */
    uint32_t index;            /* the endpoint's bit in it */
    _Atomic uint32_t valid;
};

/* A ring's registrations, in the channel's first page (ML_CHAN_REFS_OFF, ring 0's then ring
 * 1's): rx[] written by the ring's consumer's side, tx[] by its producer's; slot i of rx[] and of
 * tx[] belong to one registration, whose owner claimed rx[i].  The waker posts to slot i when
 * it finds ML_WAIT_EVQ_REF(i) in the matching tripwire word. */
struct ml_chan_refs {
    struct ml_evq_ref rx[ML_EVQ_REFS];
    struct ml_evq_ref tx[ML_EVQ_REFS];
};
#define ML_CHAN_REFS_OFF 2304u

struct ml_ring_ctl {
    _Alignas(ML_CACHELINE) _Atomic uint64_t head;     /* producer's line */
    _Atomic uint32_t rx_mb_ack;  /* the producer's copy of the last rx_mb it read (see rx_mb) */
    /* A growing stream ring (grow_size != 0): (P << 1) | r, the producer's last switch: from
     * position P (mod 2^63) on, bytes are in the region (r = 1) or in the ring (r = 0); before
     * P, in the other.  Stored before the head that passes P (src/ring.h, "Growth"). */
    _Atomic uint64_t grow;
    _Alignas(ML_CACHELINE) _Atomic uint64_t tail;     /* consumer's line */
    _Atomic uint32_t tx_mb_ack;  /* the consumer's copy of the last tx_mb it read */
    _Alignas(ML_CACHELINE) _Atomic uint32_t rx_wait;  /* consumer's tripwire */
    _Atomic uint32_t rx_cpu;                          /* consumer's cpu when it last waited */
    /* The consumer's declaration: (sequence << 1) | on.  on: it makes a membarrier (global,
     * expedited) after arming rx_wait and before its re-check, so the producer may publish
     * without a full barrier; off: it does not, once the producer has acknowledged this value
     * in rx_mb_ack ("The asymmetric barrier" in docs/design.md).  0 in a new file, and in one
     * an older library wrote, which keeps the barrier. */
    _Atomic uint32_t rx_mb;
    uint32_t unused_rx[9];    /* was the one event-queue reference (version 3): ml_chan_refs */
    _Alignas(ML_CACHELINE) _Atomic uint32_t tx_wait;  /* producer's tripwire */
    _Atomic uint32_t tx_cpu;                          /* producer's cpu when it last waited */
    _Atomic uint32_t tx_mb;   /* the same for the producer's arming of tx_wait (room) */
    uint32_t unused_tx[9];
    /* Counters, written only by their own side; for memlan stat. */
    _Alignas(ML_CACHELINE) _Atomic uint64_t wakeups;  /* system calls made to wake the consumer */
    _Atomic uint64_t sleeps;                          /* times the consumer went to sleep */
    _Atomic uint64_t spin_hits;                       /* waits the consumer ended by spinning */
};

/* Channel side states (ml_chan_hdr.side_state[]); side 0 created the channel, side 1 attached. */
#define ML_SIDE_OPEN     0u
#define ML_SIDE_SHUT_WR  1u /* will send no more: the peer reads what is left, then EOF */
#define ML_SIDE_CLOSED   2u /* gone: sends to it fail with EPIPE */

#define ML_CHAN_STREAM 1u
#define ML_CHAN_MSG    2u

struct ml_chan_hdr {
    uint32_t chan_kind;        /* ML_CHAN_STREAM or ML_CHAN_MSG */
    uint32_t ring_size;        /* bytes in each ring's data area, a power of two */
    uint64_t ctl_off[2];       /* ring 0 carries side 0 -> side 1, ring 1 the reverse */
    uint64_t data_off[2];
    _Atomic uint32_t attached; /* 0 -> 1 by the one process allowed to attach (CAS), or
                                * 0 -> ML_ATTACH_WITHDRAWN by the creator taking its offer back */
    _Atomic uint32_t side_state[2];
    int32_t side_pid[2];
    _Atomic uint32_t generation; /* bumped each time the creator reuses the file for a new
                                  * connection (src/channel.c, the pool); an offer names it */
    uint32_t grow_size;        /* 0, or each direction's region (a power of two above
                                * ring_size): the file is [page][ring 0][ring 1][region 0]
                                * [region 1], and a stream ring may go on in its region once
                                * full (docs/design.md, "Rings grow") */
    _Atomic uint32_t attacher_uid1; /* the attacher's euid + 1 as it attached (0: not said), for
                                     * the creator to judge whether the attacher may remove the
                                     * file's name (src/channel.c, ml_chan_name_left) */
    uint32_t unused[14];
};

#define ML_ATTACH_WITHDRAWN 2u

/*
 * The socket layer's per-side block (src/preload), one line each at ML_CHAN_SOCK_OFF in a
 * channel's first page.  It is shared by every process that holds that side's socket (after fork):
 * holders counts them so that only the last close ends the connection, flags mirrors the file
 * status flags (O_NONBLOCK) that the kernel keeps per open file description.  An honest peer
 * never writes our block; it reads our flags and our urgent mark (urg, below).  No lock lives
 * here: the peer can write this page, and nothing it writes may decide whether or how long we
 * wait (the send and receive locks live in memory only our side's processes can reach,
 * src/preload/sock.c).  The first 16
 * bytes held lock words and owner pids once; they are unused and never read.
 */
#define ML_SOCK_NONBLOCK   1u  /* unused: O_NONBLOCK lives in the lock page, out of the peer's reach */
#define ML_SOCK_LINGER0    2u  /* SO_LINGER on with a zero time: close aborts */
#define ML_SOCK_RESET      4u  /* closed with unread bytes (or LINGER0): the peer gets a reset */
#define ML_SOCK_RESET_TOLD 8u  /* the peer's reset was reported (once, as the kernel's sk_err) */
#define ML_SOCK_WROTE_LATE 16u /* we wrote once after the peer closed: TCP would get a reset */
#define ML_SOCK_NOPOST     32u /* we changed credentials and may not reach the peer's event queue
                                * (a file we would have to open by name): the peer must not sleep
                                * on its queue for us, but look again every millisecond */
#define ML_SOCK_UNNAMED    64u /* our process called exit() and took the channel file's name away
                                * while the connection still works: our liveness is no longer our
                                * lock (the peer cannot open the file by name to ask it) but our
                                * kernel socket, which the process holds until it is gone */
#define ML_SOCK_LATE_FIN  128u /* we shut down after ML_SOCK_UNNAMED without shutting the kernel
                                * socket down: its FIN, when it comes, is the process's end */
#define ML_SOCK_RESET_AFTER_FIN 256u /* with ML_SOCK_RESET: we had shut down writing before (our FIN
                                * came first): the peer's recv reads the end, not the reset, and
                                * its error is EPIPE, as the kernel's reset in CLOSE_WAIT */
#define ML_SOCK_PASSED   512u /* our process passed its socket to another over SCM_RIGHTS: its
                                * kernel socket's FIN may never come (the receiver holds it), so
                                * the peer's poll and epoll ask our lock at each liveness interval */
#define ML_SOCK_NAME_LEFT 1024u /* the creator's side let go of the channel file while the
                                 * attacher's side was open, and left it the file's name: the
                                 * attacher's last close removes it (src/channel.c) */
#define ML_SOCK_EXITING 2048u /* our process is ending (exit, _exit) with this side open and
                               * ours alone: its end comes by the kernel socket's FIN, which no
                               * code of ours announces here; the peer's blocking calls watch
                               * that socket rather than the ring's futex alone */
#define ML_SOCK_SIO    8192u  /* our side made its SIGIO or SIGURG FIFO (sioS-TOKEN, urgS-TOKEN):
                               * whoever removes the channel's file removes them too */
#define ML_SOCK_PASSED_GONE 16384u /* we took the peer's passed side (ML_SOCK_PASSED) for ended:
                               * its lock stayed free past our grace (ml_passed_grace); a
                               * receiver that takes that side up later finds this, and says
                               * the connection lost rather than write to us unread */
#define ML_SOCK_SIGURG 4096u  /* our socket has an owner (F_SETOWN): the peer's urgent send
                               * rings our FIFO urgS-TOKEN, which raises SIGURG for it, as the
                               * kernel raises it when TCP's urgent pointer comes (design.md,
                               * "SIGIO"); 0 from an older library: no SIGURG, as before */

/* Urgent data (src/preload/sock.c, "Urgent data"; design.md): urg is this side's latest urgent
 * byte, its position in this side's sending ring + 1 (0: none yet), stored (release) before the
 * byte is published; urg_byte its value, stored before urg.  The peer's receive stops before
 * that position, and reads the byte there in line or past it as SO_OOBINLINE says; written by
 * its sender alone, so the peer's reads treat them as hostile input (a bad position cuts or
 * skips a byte of that sender's own stream, never makes a reader wait).  urg_skip..urg_skip_end:
 * the urgent bytes (positions + 1) that later ones replaced while the peer's reads stood at them,
 * which Linux's TCP drops where they are not read in line (tcp_check_urg).  urg_taken is the
 * receiving side's own (shared by its fork children).  All are 0 in a block that an older
 * library wrote, which sent no urgent data on a channel: no version change. */
struct ml_sock_side {
    /* What this side's process reaches of the peer's event queues while it is out of the
     * fabric's reach (ML_SOCK_NOPOST): byte i of reach (little-endian over the two words) is
     * the tag (__ml_evq_ref_tag, never 0) of the peer's registration in slot i that it posted
     * to before its credential change, and so keeps mapped; 0: none.  The peer sleeps on its
     * queue for a flagged side only if its own registration's tag is there (src/preload/poll.c,
     * mlp_peer_nopost).  A post refused later zeroes the byte.  Were lock words: an older
     * library neither reads nor writes them (0: nothing reached). */
    _Alignas(ML_CACHELINE) _Atomic uint32_t reach[2];
    uint32_t unused[2];
    _Atomic uint32_t holders;
    _Atomic uint32_t flags;
    _Atomic uint64_t urg;
    _Atomic uint32_t urg_byte;
    /* How many times this side was passed over SCM_RIGHTS (its passer counts each pass, before
     * it sets ML_SOCK_PASSED): the peer's grace for a passed side starts again when it moves
     * (src/channel.c, ml_passed_grace).  0 from an older library, which never counted. */
    _Atomic uint32_t passes;
    _Atomic uint64_t urg_skip, urg_skip_end;
    _Atomic uint64_t urg_taken; /* the peer's urg whose byte our recv(MSG_OOB) took */
};
#define ML_CHAN_SOCK_OFF 1024u

/*
 * The socket layer's offer (src/preload/negotiate.c), at ML_CHAN_OFFER_OFF in a channel's first
 * page.  A client offers its channel by giving the channel's file a second name, the offer's
 * (cx-NETNS-CLIENT-SERVER), after writing that name here.  The acceptor opens the offer's name,
 * which is the channel itself, and attaches only if, under its attacher lock, the channel is
 * still offered under that name: a pooled file reused for another connection has another name
 * here (the reuse clears it under the lock the acceptor takes).  token lets the acceptor name the
 * file as the creator does (seg-TOKEN).
 */
struct ml_offer_blk {
    char token[ML_TOKEN_HEX];
    uint32_t name_len;
    char name[188];
};
#define ML_CHAN_OFFER_OFF 2048u

/*
 * Transparent sockets' rendezvous (src/preload/negotiate.c).
 *
 * ls-NETNS-PORT: a listener record, one page.  Every memlan process listening on PORT in network
 * namespace NETNS holds an OFD read lock on its byte 0, so "is some memlan process listening?" is
 * "would a write lock on byte 0 conflict?".  pending counts clients between the start of
 * connect() and the posting of their offer; an acceptor that finds no offer waits for it to fall.
 *
 * cx-NETNS-CLIENT-SERVER: an offer, named by the connection's two addresses and ports.  A memlan
 * client creates it exclusively and writes its channel's token (ML_TOKEN_HEX bytes) and the
 * channel's generation (8 hex digits); an acceptor that gives up first creates it exclusively
 * holding "R" (refused), which the client then finds.  A client that finds no_offer set in the
 * record does not offer at all.
 */
#define ML_LREC_MAGIC 0x434552504c4d454dull /* "MEMLPREC" */
#define ML_LREC_REFUSED 64u
#define ML_LREC_LSOCKS 15u /* with lsock_full: one line */

struct ml_listen_rec {
    uint64_t magic;
    uint32_t version;          /* ML_LAYOUT_VERSION */
    uint32_t port;
    _Alignas(ML_CACHELINE) _Atomic uint32_t pending;
    _Atomic uint32_t waiters;  /* acceptors asleep on pending */
    _Atomic uint32_t ring_hint;/* the largest SO_RCVBUF/SO_SNDBUF a listener set (the kernel's
                                * value), so that clients size their rings to it; 0 = none */
    _Atomic uint32_t swept_s;  /* CLOCK_MONOTONIC second at which a client of this port last
                                * swept the fabric for the dead's files; 0 = never */
    _Atomic uint32_t no_offer; /* nonzero (one of ML_NO_OFFER_*): a process that accepts on this
                                * port cannot take offers (it changed its credentials; or its
                                * listener defers accept until data), so clients do not offer
                                * (plain TCP at once).  Set through the mapping the process made
                                * before any change; it goes with the record, when the last
                                * listener on the port closes, or, when they all died, when the
                                * next one publishes (lsock below); a credential change's is
                                * cleared by its setter's exec where no listener of it on the
                                * port survives (an inetd's child: src/preload/negotiate.c). */
    _Atomic uint32_t xns;      /* nonzero once a client of another network namespace offered
                                * here: only then does an acceptor look up a non-local peer's
                                * link-layer address (rtnetlink) for the offer's name */
    _Atomic uint32_t groupwide;/* nonzero: a listener of the port takes channels that every
                                * member of a shared fabric may open (MEMLAN_FABRIC_GROUPWIDE=1
                                * on its side); a hint for clients, which the acceptor checks
                                * again itself */
    /* Refusals: an acceptor that gave up waiting for a connection's offer writes the hash of
     * the offer's name here (round robin), then looks for the offer once more; a client whose
     * offer is still untaken looks here and withdraws.  No file is made for a refusal.  Peer
     * input: a wrong entry only sends a client to TCP, a missing one makes it wait its
     * MEMLAN_ACCEPT_WAIT_MS (appended to the record: older readers ignore them). */
    _Alignas(ML_CACHELINE) _Atomic uint32_t refused_next;
    _Atomic uint64_t refused[ML_LREC_REFUSED];
    /* The listening sockets published here, by inode (as sock_diag and /proc/net/tcp name
     * them): how a publisher tells a record whose listeners all died without closing from a live
     * one whose holders keep no lock on it (design.md, rendezvous step 1).  A publisher writes
     * its socket's inode into a free (0) slot; one that finds none clears the slots of sockets
     * the kernel no longer lists as listening on the port, and failing that sets lsock_full, and
     * the record is taken for live from then on, as before these slots.  Peer input: a wrong
     * entry keeps a dead record (its clients on TCP) or has a live one removed and made anew,
     * with what vouched for it (its clients on TCP or refused until its listeners publish
     * again); no byte goes astray (appended: older readers ignore it). */
    _Alignas(ML_CACHELINE) _Atomic uint32_t lsock_full;
    _Atomic uint32_t lsock[ML_LREC_LSOCKS];
};
#define ML_NO_OFFER_CRED 1u
#define ML_NO_OFFER_GRANT 2u /* a fabric shared by a group: a listener of the port could not be
                              * named in the record's ACL (its owner's or root's to write), so
                              * clients could not grant it their channels (design.md, Fabric) */
#define ML_NO_OFFER_DEFER 3u /* a listener of the port has TCP_DEFER_ACCEPT: the kernel completes
                              * a handshake only when TCP data arrives, and a memlan client's data
                              * goes into the ring (design.md, "Deferred accept") */
#define ML_NO_OFFER_PASS 4u  /* a process that accepts on the port passed an accelerated connection
                              * to another process over SCM_RIGHTS, which a channel cannot follow
                              * (design.md, "Passing a connection") */
#define ML_NO_OFFER_BLIND 5u /* a process that holds a listener of the port runs without memlan
                              * (an exec kept the listener into an image that does not load it,
                              * or turns it off), and its accepts are the kernel's (design.md, "A
                              * listener that an image without memlan keeps") */
#define ML_NO_OFFER_OOB 6u   /* a connection of the port sent urgent data (MSG_OOB), which a
                              * channel cannot carry: the send was refused, and later connections
                              * stay on TCP, where the kernel carries it (design.md, "Not
                              * supported") */

/*
 * A memlan process's entry in the fabric (seg-TOKEN of kind ML_KIND_PROC), for memlan stat: one
 * slot per connection it made or accepted, accelerated or not, with the reason when not.
 */
#define ML_PROC_SLOTS 4096u
#define ML_CONN_FREE  0u
#define ML_CONN_ACCEL 1u
#define ML_CONN_TCP   2u
#define ML_CONN_WAIT  3u /* a client's offer not yet taken */

struct ml_proc_conn {
    _Atomic uint32_t state;    /* ML_CONN_* (written last when a slot is filled) */
    int32_t fd;
    char local[48], remote[48];/* "addr:port" */
    char token[ML_TOKEN_HEX];  /* the channel, when accelerated */
    char why[80];              /* why not accelerated; accelerated, ML_CONN_ACCEPTED for the
                                * accepting end (its send ring is ring 1), else "" */
};
#define ML_CONN_ACCEPTED "accepted"

struct ml_proc_hdr {
    int32_t pid;
    uint32_t nslots;
    char cmd[56];              /* the program, informational */
    _Atomic uint64_t accel_total, tcp_total;
};

/*
 * Message ring records: an 8-byte header then the payload, padded to 8 bytes.  With the mirrored
 * mapping no record wraps.  flags is the record's publication word, (uint32_t)(pos >> 2) | 1 for
 * a record at ring position pos (odd, so never 0), stored with the length in one 8-byte release
 * store after the payload; the producer keeps the header slot at its head zero (it zeroes the slot
 * after each record before publishing the record), so a consumer that finds the word matching its
 * own position knows the record is there without reading head (src/ring.h).  A record therefore
 * needs 8 bytes beyond itself free when it is written: the largest message is ring_size - 16.
 */
struct ml_msg_hdr {
    uint32_t len;              /* payload bytes */
    uint32_t flags;            /* publication word (see above) */
};
#define ML_MSG_ALIGN 8u

/*
 * Event queue: a two-level bitmap.  Endpoint i posts by setting bit i of the leaf words, then bit
 * i/64 of the summary words, then checking waiter.  The consumer exchanges summary words with 0,
 * then the leaf words they name with 0.  Many posts before the consumer looks give one event; no
 * post is ever lost and none can overflow the queue.
 */
#define ML_EVQ_WAIT_FUTEX 1u
#define ML_EVQ_WAIT_FD    2u

struct ml_evq_hdr {
    uint32_t capacity;         /* endpoints, a multiple of 64 */
    uint32_t leaf_words;       /* capacity / 64 */
    uint32_t sum_words;        /* ceil(leaf_words / 64) */
    uint32_t pad0;
    uint64_t leaf_off;         /* from the segment start */
    uint64_t sum_off;
    _Alignas(ML_CACHELINE) _Atomic uint32_t waiter;   /* ML_EVQ_WAIT_* bits */
    _Atomic uint32_t post_cpu; /* 1 + the cpu of the latest remote post, 0 = none yet */
    _Atomic uint64_t posts;    /* counters for memlan stat */
    _Atomic uint64_t wakeups;
};

_Static_assert(sizeof(struct ml_seg_hdr) == 128, "segment header is 128 bytes");
_Static_assert(offsetof(struct ml_listen_rec, refused) == 136, "refusals after the first line");
_Static_assert(offsetof(struct ml_listen_rec, lsock_full) == 704 &&
                   sizeof(struct ml_listen_rec) == 768, "listening sockets on a line of their own");
_Static_assert(offsetof(struct ml_seg_hdr, state) == 64, "state offset");
_Static_assert(offsetof(struct ml_ring_ctl, tail) == 64, "tail on its own line");
_Static_assert(offsetof(struct ml_ring_ctl, rx_wait) == 128, "rx tripwire on its own line");
_Static_assert(offsetof(struct ml_ring_ctl, tx_wait) == 192, "tx tripwire on its own line");
_Static_assert(sizeof(struct ml_ring_ctl) == 320, "ring control is five lines");
_Static_assert(sizeof(struct ml_chan_hdr) == 128, "channel header is two lines");
_Static_assert(sizeof(struct ml_sock_side) == 64, "socket side block is one line");
_Static_assert(sizeof(struct ml_msg_hdr) == ML_MSG_ALIGN, "message header");
_Static_assert(offsetof(struct ml_evq_hdr, waiter) == 64, "evq waiter on its own line");
_Static_assert(sizeof(struct ml_evq_ref) == 40, "a registration is 40 bytes");
_Static_assert(ML_EVQ_REFS + 1 <= 32, "every slot has a bit in the tripwire word");

#endif
