/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * memlan.h - the public API of libmemlan, memlan's native shared-memory communication library.
 *
 * The model is SHRIMP's and CLAN's memory-mapped communication on today's Linux:
 *
 *   fabric   a directory that the processes of one fabric share (default /dev/shm/memlan-UID)
 *   segment  shared memory exported with an unguessable token and a mode, imported with the
 *            token, revocable by its exporter
 *   channel  a bidirectional connection: two single-producer single-consumer rings (a byte
 *            stream or a message ring), their tripwires and their state
 *   evq      an event queue that many channels post "ready" into, with one waiter
 *
 * Conventions.  Every function that returns int or ssize_t returns a non-negative value on
 * success and a negative errno on failure; none reads or changes errno.  Objects are not
 * thread-safe unless the function says so: a channel may be used by one sending thread and one
 * receiving thread at once (the two directions are independent); anything more needs the
 * caller's lock.  Reference pages are in docs/api/.
 */
#ifndef MEMLAN_H
#define MEMLAN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libmemlan is built with -fvisibility=hidden; what this header declares is its exported API. */
#pragma GCC visibility push(default)

#define MEMLAN_VERSION_MAJOR 0
#define MEMLAN_VERSION_MINOR 1
#define MEMLAN_VERSION_PATCH 0

/* A token: 32 lowercase hex characters (128 random bits) and a NUL. */
#define MEMLAN_TOKEN_LEN 32

/* ---- fabric ------------------------------------------------------------------------------ */

typedef struct memlan_fabric memlan_fabric_t;

/*
 * memlan_fabric_open - open (creating it if needed) a fabric directory.
 * path: NULL for $MEMLAN_FABRIC, or when that is unset /dev/shm/memlan-UID (mode 0700).
 * Returns 0 and *out, or -EINVAL (NULL out, path too long), -ENOTDIR, -EACCES (the directory is
 * another user's or open to others without MEMLAN_FABRIC naming it), or an errno from the kernel.
 * Thread-safe: a fabric may be shared by all threads of a process.
 */
int memlan_fabric_open(const char *path, memlan_fabric_t **out);

/* memlan_fabric_close - release the fabric handle (not the objects created through it). */
void memlan_fabric_close(memlan_fabric_t *fab);

/* memlan_fabric_path - the directory's path; valid until memlan_fabric_close(). */
const char *memlan_fabric_path(const memlan_fabric_t *fab);

/*
 * memlan_fabric_clean - reclaim the files of owners that are dead.  Never touches a file whose
 * owner lives.  Returns the number of files removed, or a negative errno.  Thread-safe.
 */
int memlan_fabric_clean(memlan_fabric_t *fab);

/* ---- segments ---------------------------------------------------------------------------- */

typedef struct memlan_segment memlan_segment_t;

#define MEMLAN_MODE_RO 1 /* importers may only read */
#define MEMLAN_MODE_RW 3 /* importers may read and write */

/*
 * memlan_segment_export - create size bytes of zeroed shared memory that others may import with
 * the token (memlan_segment_token()) in at most the given mode.
 * Returns 0 and *out; -EINVAL for NULL arguments, size 0 or above 1 TiB, or an unknown mode;
 * -ENOSPC or -ENOMEM when the fabric is full.
 */
int memlan_segment_export(memlan_fabric_t *fab, size_t size, int mode, memlan_segment_t **out);

/*
 * memlan_segment_import - map the segment named by token.  mode is MEMLAN_MODE_RO or
 * MEMLAN_MODE_RW.  Returns 0 and *out; -EINVAL for a NULL or malformed token; -ENOENT when no
 * segment has that token (never existed, revoked, or its owner died and it was reclaimed);
 * -EACCES when RW is asked of a read-only export; -EPROTO for a malformed header or a wrong kind;
 * -EPROTONOSUPPORT for an unknown layout version.
 */
int memlan_segment_import(memlan_fabric_t *fab, const char *token, int mode,
                          memlan_segment_t **out);

/* memlan_segment_token - the token (NUL-terminated), valid while the handle lives. */
const char *memlan_segment_token(const memlan_segment_t *seg);

/* memlan_segment_ptr / memlan_segment_size - the user region.  The pointer stays valid until
 * memlan_segment_close(), even after a revoke (then it holds stale data). */
void *memlan_segment_ptr(const memlan_segment_t *seg);
size_t memlan_segment_size(const memlan_segment_t *seg);

/*
 * memlan_segment_check - 0 while the segment is live, -ECONNABORTED once its exporter revoked it,
 * -EOWNERDEAD when its exporter died, -EIO once its file was shrunk under the mapping (by anyone
 * who could open it: the access that found it did not fault, but the region is private memory
 * from then on, shared with no one).  Importers call it before trusting the contents.
 */
int memlan_segment_check(const memlan_segment_t *seg);

/*
 * memlan_segment_revoke - exporter only (-EPERM otherwise): no new imports, and importers see
 * -ECONNABORTED from memlan_segment_check().  Existing mappings stay valid memory.
 */
int memlan_segment_revoke(memlan_segment_t *seg);

/* memlan_segment_close - unmap; an exporter's close also revokes and removes the file.  In a fork
 * child, on a handle it inherited, it frees the child's copies only (mapping, descriptor, memory):
 * the export stays the parent's. */
void memlan_segment_close(memlan_segment_t *seg);

/* ---- channels ---------------------------------------------------------------------------- */

typedef struct memlan_channel memlan_channel_t;

#define MEMLAN_STREAM 1 /* a byte stream, like TCP */
#define MEMLAN_MSG    2 /* variable-size messages whose boundaries are kept */

struct memlan_channel_opts {
    int kind;          /* MEMLAN_STREAM (default when 0) or MEMLAN_MSG */
    size_t ring_size;  /* bytes per direction, rounded up to a power of two; 0 = 256 KiB */
};

/* Flags for send, recv, reserve and peek. */
#define MEMLAN_DONTWAIT 0x1 /* never block: -EAGAIN instead */
#define MEMLAN_WAITALL  0x2 /* stream recv: block until len bytes, EOF or an error */

/*
 * memlan_channel_create - create a channel; hand memlan_channel_token() to the one peer that may
 * attach.  opts may be NULL.  Returns 0 and *out, -EINVAL for bad options (ring_size below 4 KiB
 * or above 1 GiB, unknown kind), or an errno from the fabric.  A peer that never attaches does
 * not keep the creator waiting for ever: a blocking send, recv, reserve or peek that still waits
 * for one 10 s after creation (up to a second later) withdraws the channel (a late attach fails
 * with -EBUSY) and fails with -ENOTCONN, as every later call does.  To wait longer, or for ever,
 * call memlan_channel_wait_peer() first.  In a fabric shared by a group the channel's file is
 * private to the creator's user (mode 0600): only processes of that user (and root) can attach
 * (another member gets -EACCES, even with the token); a channel between two users is made by
 * memlan_connect(), which grants the server's user alone.
 */
int memlan_channel_create(memlan_fabric_t *fab, const struct memlan_channel_opts *opts,
                          memlan_channel_t **out);

/*
 * memlan_channel_attach - attach to a channel created by another process (or thread).
 * Returns 0 and *out; -EINVAL, -ENOENT, -EPROTO, -EPROTONOSUPPORT as for segment import;
 * -EBUSY when another side has already attached; -ECONNREFUSED when the creator closed it.
 */
int memlan_channel_attach(memlan_fabric_t *fab, const char *token, memlan_channel_t **out);

/* memlan_channel_token - the token to hand to the peer (NUL-terminated), or NULL for NULL. */
const char *memlan_channel_token(const memlan_channel_t *ch);

/*
 * memlan_channel_wait_peer - creator: wait up to timeout_ms (-1 = forever) for the peer to
 * attach.  0 when attached, -ETIMEDOUT, -ECONNRESET if the channel was revoked, -ECONNREFUSED
 * once it was withdrawn (see memlan_channel_create), -EPROTO if the channel's shared state is
 * corrupt (the peer wrote garbage over it).
 */
int memlan_channel_wait_peer(memlan_channel_t *ch, int timeout_ms);

/*
 * memlan_send - copy len bytes into the ring.  Stream: blocks until all are sent unless
 * MEMLAN_DONTWAIT, then returns what fitted (-EAGAIN if nothing).  Message: sends one message,
 * whole or not at all; -EMSGSIZE if len exceeds memlan_channel_max_msg().
 * Errors: -EPIPE after the peer closed or after our own shutdown; -ECONNRESET when the peer died
 * or the channel was revoked; -ENOTCONN when no peer attached in time (memlan_channel_create);
 * -EPROTO when the shared indices are corrupt; -ETIMEDOUT when a send timeout
 * (memlan_channel_set_timeout) passed with nothing sent (a stream returns what it sent before).
 */
ssize_t memlan_send(memlan_channel_t *ch, const void *buf, size_t len, int flags);

/*
 * memlan_sendv - memlan_send of the iovcnt buffers of iov taken as one, in order (writev's
 * gather).  A stream publishes them as it would one buffer of their total length, so a header
 * and its payload cost the consumer one wake-up check, not one each; a message channel sends
 * them as one message.  -EINVAL if iovcnt is below 0 or above IOV_MAX, or the lengths' sum
 * exceeds SSIZE_MAX.  Otherwise as memlan_send.
 */
ssize_t memlan_sendv(memlan_channel_t *ch, const struct iovec *iov, int iovcnt, int flags);

/*
 * memlan_recv - copy out up to len bytes (stream) or one message (message; a message longer than
 * len is truncated to len and the rest dropped, like a datagram).  Returns the count, 0 at end of
 * stream (the peer shut down or closed and everything it sent has been read), -EAGAIN with
 * MEMLAN_DONTWAIT when nothing is there, -ECONNRESET when the peer died with nothing left to
 * read, -ENOTCONN when no peer attached in time (memlan_channel_create), -EPROTO on corrupt
 * indices or records, -ETIMEDOUT when a receive timeout (memlan_channel_set_timeout) passed with
 * nothing there.  On a message channel a zero-length message also
 * returns 0: when that matters, tell it from end of stream with memlan_channel_poll(), which
 * reports MEMLAN_EV_HUP once the peer is done.
 */
ssize_t memlan_recv(memlan_channel_t *ch, void *buf, size_t len, int flags);

/* One message of memlan_recv_msgs: buf and len are the caller's (where to copy it, and how much
 * room there is); got is set to the bytes copied (the message's length, or len if it was longer:
 * the rest is dropped, as memlan_recv drops it). */
struct memlan_msg {
    void *buf;
    size_t len;
    size_t got;
};

/*
 * memlan_recv_msgs - receive up to n messages of a message channel in one call (recvmmsg's
 * batch): every message already there, up to n, copied into v[0], v[1], ... in order, and freed
 * to the sender with one publication and one wake-up check for all of them, where memlan_recv
 * makes one of each per message.  It waits (unless MEMLAN_DONTWAIT) only for the first message.
 * Returns how many it received (1 to n; a zero-length message counts, with got 0), 0 at end of
 * stream or when n is 0, or what memlan_recv returns for the first message (-EAGAIN, -ECONNRESET,
 * -ENOTCONN, -EPROTO, -ETIMEDOUT); a corrupt record after the first ends the batch before it,
 * and the next call reports it.  -EINVAL on a stream channel (memlan_recv already takes every
 * byte there is, up to len) or for a NULL v with n > 0.
 */
int memlan_recv_msgs(memlan_channel_t *ch, struct memlan_msg *v, unsigned n, int flags);

/*
 * memlan_reserve / memlan_commit - zero-copy send.  reserve gives *ptr to at least min bytes of
 * contiguous free space in the ring (blocking unless MEMLAN_DONTWAIT) and returns how many bytes
 * may be written there; commit(len) publishes the first len of them (stream) or one message of
 * len bytes (message).  A message channel's reserve returns exactly room for one message.
 * min larger than the ring can ever hold contiguously gives -EMSGSIZE.
 * One loan per direction: a second reserve before commit gives the same space again (the first
 * loan is forgotten), so build one message at a time.  Alignment: a message channel's payload
 * starts 8-byte aligned (records are padded to 8 bytes), so a type that needs more (a
 * _Alignas(16) struct) must be copied out; a stream's loan starts wherever the stream is.
 */
ssize_t memlan_reserve(memlan_channel_t *ch, void **ptr, size_t min, int flags);
int memlan_commit(memlan_channel_t *ch, size_t len);

/*
 * memlan_peek / memlan_release - zero-copy receive.  peek gives *ptr to the contiguous bytes that
 * are readable (stream) or to the next message (message), blocking unless MEMLAN_DONTWAIT, and
 * returns their count (0 at end of stream); release(len) consumes len bytes (stream) or the
 * message (message; len is ignored).  The bytes stay valid until release.  One loan per
 * direction: peek again before release and the same bytes come back.  A message's payload is
 * 8-byte aligned, as for reserve.
 */
ssize_t memlan_peek(memlan_channel_t *ch, const void **ptr, int flags);
int memlan_release(memlan_channel_t *ch, size_t len);

#define MEMLAN_SHUT_RD 1
#define MEMLAN_SHUT_WR 2
#define MEMLAN_SHUT_RDWR 3
/* memlan_shutdown - stop sending (the peer reads the rest, then EOF) and/or receiving. */
int memlan_shutdown(memlan_channel_t *ch, int how);

/* Readiness bits, as memlan_channel_poll() and events report them. */
#define MEMLAN_EV_READ  0x1 /* recv would not block (data, EOF or error) */
#define MEMLAN_EV_WRITE 0x2 /* send would not block */
#define MEMLAN_EV_HUP   0x4 /* the peer closed, shut down its sending side, or died */
#define MEMLAN_EV_ERR   0x8 /* the peer died, the channel was revoked or is corrupt */

/* memlan_channel_poll - the channel's readiness now, without blocking. */
int memlan_channel_poll(memlan_channel_t *ch);

/* memlan_channel_max_msg - the largest message a message channel carries. */
size_t memlan_channel_max_msg(const memlan_channel_t *ch);

/* memlan_channel_kind - MEMLAN_STREAM or MEMLAN_MSG, or -EINVAL for NULL. */
int memlan_channel_kind(const memlan_channel_t *ch);

/*
 * memlan_channel_set_timeout - bound ch's blocking calls, as SO_RCVTIMEO and SO_SNDTIMEO bound a
 * socket's: memlan_recv and memlan_peek wait at most recv_ms for something to read, memlan_send
 * and memlan_reserve at most send_ms for room, then return -ETIMEDOUT (a stream's send or
 * recv returns the count it moved before, if any).  -1: no bound (the default).  A peer that
 * stops sending, or whose bytes were spoiled on the way, otherwise holds a blocking call for as
 * long as the peer lives.  Returns 0; -EINVAL for NULL or a value below -1 or equal to 0 (not
 * to wait at all, pass MEMLAN_DONTWAIT).
 */
int memlan_channel_set_timeout(memlan_channel_t *ch, int recv_ms, int send_ms);

/* memlan_channel_close - close our side: the peer reads what we sent, then EOF.  In a fork child,
 * on a handle it inherited, it frees the child's copies only: no end is published and the channel
 * stays the parent's, as a socket's close in a fork child leaves the parent's connection open. */
void memlan_channel_close(memlan_channel_t *ch);

/* ---- named endpoints --------------------------------------------------------------------- */

/*
 * A server listens on a name in the fabric; a client connects by that name and gets a channel
 * to it.  The channel's token stays the capability: the client creates the channel and hands its
 * token to the server privately, over a Unix seqpacket socket in the fabric directory
 * (ep-NAME.sock, beside ep-NAME, the lock file that says the name is served).  A name is not a
 * capability by itself: the fabric directory's permissions decide who may connect.
 */
typedef struct memlan_listener memlan_listener_t;

/* The longest name, in bytes (without the NUL). */
#define MEMLAN_NAME_MAX 64

/*
 * memlan_listen - serve name on the fabric.  kind is MEMLAN_STREAM or MEMLAN_MSG to accept only
 * channels of that kind (others are refused with -EPROTOTYPE), or 0 for any.  A name left by a
 * server that died is reclaimed.  Returns 0 and *out; -EINVAL for NULL arguments, an empty name,
 * one holding '/' or a control character or ending in ".sock", or an unknown kind;
 * -ENAMETOOLONG for a name longer than MEMLAN_NAME_MAX or one whose socket path would not fit;
 * -EADDRINUSE while a live server serves the name; or an errno from the kernel.  A listener is
 * used by one thread at a time.
 */
int memlan_listen(memlan_fabric_t *fab, const char *name, int kind, memlan_listener_t **out);

/*
 * memlan_accept - the next client's channel, already attached, waiting up to timeout_ms (-1 =
 * forever, 0 = never).  Returns 0 and *out; -EAGAIN when timeout_ms is 0 and no client is
 * waiting; -ETIMEDOUT when the time ran out; -EINVAL for NULL arguments.  A client that gives up,
 * dies or sends garbage is answered (when it can be) and skipped, never returned.
 */
int memlan_accept(memlan_listener_t *l, int timeout_ms, memlan_channel_t **out);

/*
 * memlan_listener_fd - a file descriptor that is readable while memlan_accept(l, 0, ...) may
 * return a channel, for the application's own poll/epoll loop (level-triggered; after it
 * wakes, call memlan_accept with timeout 0 until -EAGAIN).  The fd belongs to l.
 */
int memlan_listener_fd(const memlan_listener_t *l);

/* memlan_listener_name - the name served (NUL-terminated), or NULL for NULL. */
const char *memlan_listener_name(const memlan_listener_t *l);

/* memlan_listener_close - stop serving the name and free l; accepted channels stay open.  In a
 * fork child, closing the copy it inherited frees it and leaves the name to the parent. */
void memlan_listener_close(memlan_listener_t *l);

/*
 * memlan_connect - connect to the server of name: create a channel with opts (NULL: a stream
 * with the default ring), hand its token to the server and wait up to timeout_ms (-1 = forever)
 * for the server to accept it; 0 = try once: -EAGAIN at once when the server's queue is full,
 * else its answer is awaited as long as a server waits for a client's hello (2 s).  The server
 * attaches only a channel created by the user the kernel says connected (SO_PEERCRED), and
 * refuses another's with -EACCES.  In a fabric shared by a group the channel is its two ends'
 * alone: its file is 0600 and the server's user (the one that made the listening socket, by
 * SO_PEERCRED) is granted read-write by a POSIX ACL; no other member can open it (-EACCES), and
 * the server takes no channel a third user may write (-EACCES).  A file system without ACLs
 * gives -EOPNOTSUPP for a server of another user.  Returns 0 and *out, a channel the server has attached; -EINVAL
 * or -ENAMETOOLONG for a bad name, as memlan_listen; -ECONNREFUSED when nobody serves the name;
 * -ETIMEDOUT when the server did not accept in time; -EPROTOTYPE when the server takes only the
 * other kind; an error the server met attaching; or an errno from channel creation.  Thread-safe.
 */
int memlan_connect(memlan_fabric_t *fab, const char *name, const struct memlan_channel_opts *opts,
                   int timeout_ms, memlan_channel_t **out);

/* ---- event queues ------------------------------------------------------------------------ */

typedef struct memlan_evq memlan_evq_t;

struct memlan_event {
    void *udata;       /* what memlan_evq_add() was given */
    uint32_t events;   /* MEMLAN_EV_* bits that are true now */
};

/*
 * memlan_evq_create - an event queue for up to capacity channels (0 = 4096).
 * Returns 0 and *out, -EINVAL, or an errno from the fabric.
 */
int memlan_evq_create(memlan_fabric_t *fab, unsigned capacity, memlan_evq_t **out);

/*
 * memlan_evq_add - report ch's readiness (MEMLAN_EV_READ and/or MEMLAN_EV_WRITE; HUP and ERR are
 * always reported) through this queue, edge-triggered: an event comes when the channel becomes
 * ready; drain it (recv or send until -EAGAIN) to get the next.  A channel already ready when
 * added gives an event at once.  -EEXIST if ch is in a queue, -ENOSPC when the queue is full
 * or, in a fabric shared by a group, when it already serves channels of 32 other sets of users
 * (each set gets a part of the queue that only they may post to; said once on stderr), -EBUSY
 * when ch's direction already names as many queues as it can (8, across the processes that
 * share it after fork).
 */
int memlan_evq_add(memlan_evq_t *q, memlan_channel_t *ch, uint32_t events, void *udata);

/* memlan_evq_del - stop reporting ch. -ENOENT if it is not in q. */
int memlan_evq_del(memlan_evq_t *q, memlan_channel_t *ch);

/*
 * memlan_evq_wait - up to max events, waiting up to timeout_ms (0 = poll, -1 = forever): spin
 * for the spin budget, then sleep until a sender rings.  Returns the number of events (0 on
 * timeout) or a negative errno.
 */
int memlan_evq_wait(memlan_evq_t *q, struct memlan_event *ev, int max, int timeout_ms);

/*
 * memlan_evq_fd - a file descriptor that becomes readable when events may be waiting, for the
 * application's own poll/epoll loop.  Before sleeping on it call memlan_evq_arm(); after it
 * wakes, call memlan_evq_wait(q, ev, max, 0).  The fd belongs to q.
 */
int memlan_evq_fd(memlan_evq_t *q);

/* memlan_evq_arm - arm the fd doorbell; returns 0 when armed (sleep), 1 when events are already
 * waiting (do not sleep: call memlan_evq_wait with timeout 0). */
int memlan_evq_arm(memlan_evq_t *q);

/* memlan_evq_close - remove every channel from q, close its fd and free it.  In a fork child, on
 * the handle it inherited, it frees the child's copies only (mappings, descriptors, memory): the
 * queue, its files and its registrations stay the creator's, which goes on using them. */
void memlan_evq_close(memlan_evq_t *q);

/* ---- errors ------------------------------------------------------------------------------ */

/*
 * memlan_strerror - a short text for an error that a memlan function returned, in memlan's terms
 * ("peer broke the channel protocol" for -EPROTO, "revoked by its exporter" for -ECONNABORTED,
 * "unknown shared-memory layout version" for -EPROTONOSUPPORT, "the name is taken" for
 * -EADDRINUSE from memlan_listen, ...); an errno memlan gives no
 * meaning of its own gets the C library's text.  err may be the negative value returned or a
 * positive errno.  Returns a string that is never NULL and must not be freed or changed; it stays
 * valid at least until this thread's next call.  Thread-safe.
 */
const char *memlan_strerror(int err);

/* ---- tuning ------------------------------------------------------------------------------ */

/*
 * memlan_spin_us - the spin budget, in microseconds, that blocking calls spend polling before
 * they sleep.  MEMLAN_SPIN_US in the environment sets it; 0 never spins.  Unset: adaptive (about
 * one cross-core wake-up, skipped when the peer last ran on our own core or we may only run on
 * one), and this returns its full budget, 50.
 */
int memlan_spin_us(void);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
