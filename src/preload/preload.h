/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * preload.h - the LD_PRELOAD layer's private view: configuration, the fd table, accelerated
 * sockets and the real libc functions.
 *
 * Names: mlp_* for everything in this layer; mlp_real_NAME is the real libc NAME found with
 * dlsym(RTLD_NEXT), so a call to the real function is never mistaken for an interposed one.
 * Internal functions return a negative errno; only the interposers in interpose.c set errno.
 *
 * Lock order (outermost first): a socket's tx lock, then its rx lock (both in the socket's own
 * lock page, sock.c), then mlp_sock.mu (process-local state changes), then the fd table's
 * free-list mutex.  Nothing here is held across a call into the application, and no direction
 * lock across a sleep (sock.c, "waiting").
 */
#ifndef MEMLAN_PRELOAD_H
#define MEMLAN_PRELOAD_H

#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/resource.h>
#include <sys/uio.h>

#include "channel.h"
#include "internal.h"

#define MLP_EXPORT __attribute__((visibility("default")))

/* The real functions. */
#define MLP_CALL(ret, name, params, args) extern ret(*mlp_real_##name) params;
#include "calls.h"
#undef MLP_CALL

/* ---- configuration (init.c), read once from the environment ------------------------------- */

struct mlp_config {
    bool off;                 /* MEMLAN_OFF=1 or MEMLAN=off: pass everything through */
    int log_level;            /* MEMLAN_LOG_LEVEL: 0 errors, 1 decisions (default when logging), 2 debug */
    int log_fd;               /* MEMLAN_LOG=stderr|PATH; -1 = no log */
    int accept_wait_ms;       /* MEMLAN_ACCEPT_WAIT_MS: how long a client offer waits for a
                               * memlan acceptor, from the server's accept */
    int accept_queue_ms;      /* MEMLAN_ACCEPT_QUEUE_MS: how long, from the offer, it waits in
                               * all (mlp_accept_wait_over) */
    int server_wait_ms;       /* how long accept waits for a client still posting its offer */
    size_t ring_size;         /* MEMLAN_RING_KB: ring per direction unless SO_*BUF says more */
    size_t ring_grow;         /* MEMLAN_RING_GROW_KB: the region a full ring grows into (0: none) */
    char ports[256];          /* MEMLAN_PORTS: only these server ports ("" = all) */
    char no_ports[256];       /* MEMLAN_NO_PORTS: never these */
    /* Read with the rest at start-up, not when the fabric is first opened: a daemon that clears
     * its environment before its first socket call (exim's keep_environment) opened the default
     * fabric instead of the one named, and its clients found no listener there.  Used when the
     * environment has none by then: a program's own setenv before its first socket still
     * counts (negotiate.c, mlp_fabric_dir). */
    char fabric[4096];        /* MEMLAN_FABRIC ("": the default, or too long: read when used) */
    bool groupwide;           /* MEMLAN_FABRIC_GROUPWIDE=1 */
};
/* Our network namespace (the inode of /proc/self/ns/net, in hex), part of every rendezvous
 * name: read at start-up and again after an unshare or setns of the network namespace (init.c,
 * interpose.c); out must hold 24 bytes. */
void mlp_netns(char *out);
void mlp_netns_refresh(void);
extern struct mlp_config mlp_cfg;
extern memlan_fabric_t *mlp_fab;     /* NULL when the fabric could not be opened (reason logged) */
extern char mlp_fab_error[128];
extern char mlp_carry_fabric[4096]; /* exec.c: the fabric of the connections carried to us */
extern bool mlp_carry_explicit, mlp_fab_explicit; /* named, not a uid's default */
extern uid_t mlp_carry_owner, mlp_fab_owner;      /* a default's owner */
extern _Atomic int mlp_pid;          /* getpid(), kept current across fork */

void mlp_init(void);                 /* idempotent; every interposer calls it via MLP_ENTER */
extern _Atomic int mlp_ready;        /* 0 before the real functions are resolved */
extern __thread int mlp_inside;      /* re-entry guard: our own libc calls pass straight through */

void mlp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * Say it on stderr (unless MEMLAN_QUIET) and in the log.  topic is one MLP_SAID_* bit: callers say
 * each topic at most once per process image, and an image that an ancestor's exec started with
 * MEMLAN_SAID naming the topic only logs it (a shell script under memlan run execs dozens of
 * programs; the user needs to read a bad setting once, not once per program).
 */
#define MLP_SAID_ENV "MEMLAN_SAID"
enum { MLP_SAID_CONFIG = 1, MLP_SAID_FABRIC = 2, MLP_SAID_FULL = 4, MLP_SAID_EVQ = 8,
       MLP_SAID_SECURE = 16, MLP_SAID_PASS = 32, MLP_SAID_REACH = 64, MLP_SAID_STALL = 128,
       MLP_SAID_OOB = 256, MLP_SAID_ZEROCOPY = 512, MLP_SAID_ASYNC = 1024,
       MLP_SAID_SPLIT = 2048 };
extern _Atomic unsigned mlp_said;     /* topics said by us or an ancestor: passed on at exec */
void mlp_say(unsigned topic, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool mlp_port_allowed(int port, const char **why);
/* sigbus.c: SIGBUS for src/guard.c (a fabric file shrunk under us) and the program's own. */
void mlp_sigbus_init(void);
int mlp_sigbus_sigaction(const struct sigaction *act, struct sigaction *old);
int mlp_sigaction_real(int sig, const struct sigaction *act, struct sigaction *old); /* signals.c */

/* ---- accelerated sockets (sock.c) -------------------------------------------------------- */

enum { MLP_LISTENER = 1, MLP_CONN = 2 };
enum { MLP_UNDECIDED = 0, MLP_ACCEL = 1, MLP_TCP = 2 };

struct mlp_lrec;
struct mlp_member;
struct mlp_ep;

/* A socket's direction locks (sock.c).  Each direction's lock and its published ring position (the channel's tx head, rx tail:
 * __ml_chan_pub_share) share 128 bytes of their own: a thread that sends and another that
 * receives on the same socket never write each other's lines (128: the pair of lines an
 * adjacent-line prefetcher fetches together).  Issue 21: both mutexes and both positions were
 * in two lines that every send and every receive wrote.  The socket's file status flags, which
 * every call reads and fcntl writes, sit on lines of their own after them.  These are the
 * robust mutexes that a socket shared with fork children takes; one never forked takes the
 * fast words in struct mlp_sock instead (sock.c, mlp_lock_dir). */
#define MLP_LOCKDIR_BYTES 128
struct mlp_locks {
    pthread_mutex_t tx;
    _Atomic uint64_t pub_tx;
    _Atomic uint64_t pub_grow;    /* the tx ring's switch as its holder last published it */
    char pad_tx[MLP_LOCKDIR_BYTES - sizeof(pthread_mutex_t) - 2 * sizeof(uint64_t)];
    pthread_mutex_t rx;
    _Atomic uint64_t pub_rx;
    char pad_rx[MLP_LOCKDIR_BYTES - sizeof(pthread_mutex_t) - sizeof(uint64_t)];
    _Atomic uint32_t fl;          /* MLP_FL_NONBLOCK: O_NONBLOCK of the open file, which fork
                                   * children share with us (never in the channel, which the peer
                                   * can write: a peer that set or cleared our O_NONBLOCK there
                                   * decided whether our calls block) */
};
_Static_assert(offsetof(struct mlp_locks, rx) == MLP_LOCKDIR_BYTES, "rx lock on lines of its own");
_Static_assert(offsetof(struct mlp_locks, fl) == 2 * MLP_LOCKDIR_BYTES, "flags on lines of their own");
#define MLP_FL_NONBLOCK 1u
#define MLP_FL_MOVED    2u        /* own_locks only: the flags moved to the shared page */

struct mlp_sock {
    _Atomic int refs;             /* fd table entries + calls in progress */
    _Atomic int nfds;             /* fd table entries (dup) */
    int type;                     /* MLP_LISTENER or MLP_CONN */
    _Atomic int state;            /* MLP_CONN: MLP_UNDECIDED (client offer out), ACCEL, TCP */
    int side;                     /* channel side: 0 = we connected (created), 1 = we accepted */
    memlan_channel_t *ch;
    struct ml_sock_side *me;      /* our side's shared block in the channel */
    uint64_t offer_ns;            /* client: when the offer went out */
    uint64_t peek_ns;             /* client: when we last peeked the kernel socket, undecided */
    uint64_t hs_ns;               /* client: when we last asked whether the server's kernel
                                   * completed our handshake (mlp_handshake_open) */
    _Atomic uint64_t queued_ns;   /* client: when we last saw our connection in the server's
                                   * accept queue (mlp_accept_wait_over) */
    _Atomic uint64_t qlook_ns;    /* client: when we last looked for that */
    _Atomic uint64_t acc_ns;      /* client: when a look first saw it accepted, 0 if none */
    char offer[160];              /* client: the offer's name in the fabric, "" once gone */
    struct ml_listen_rec *lmap;   /* client, undecided: the listener's record (held: see
                                   * mlp_lmap_hold), whose no_offer tells us to withdraw at once */
    bool cred_primed;             /* cred.c: its peer's queues were posted to (and so mapped)
                                   * before a credential change */
    /* SO_PEEK_OFF on a channel (sock.c, mlp_peek_off): the kernel socket keeps the offset; the
     * channel's receive position when it was last written, bytes taken since coming off it. */
    uint64_t peek_base;
    bool peek_based;
    int slot;                     /* our line in the process's stat segment, -1 if none */
    int stat_fd;                  /* the fd that line names */
    _Atomic bool stat_owed;       /* a fork child's: its parent listed it, we have not yet
                                   * (negotiate.c, mlp_stat_inherited) */
    unsigned fork_gen;            /* last fork this socket was counted in (holders) */
    _Atomic bool exit_let_go;     /* exit() gave our holders count back (sock.c, mlp_at_exit) */
    _Atomic bool forked;          /* it was in the table at a fork: another process may
                                   * hold it and move its ring positions (sock.c, mlp_lock_dir) */
    _Atomic bool tmo_synced;      /* SO_RCVTIMEO/SO_SNDTIMEO copied from the kernel socket */
    _Atomic bool split_told;      /* bytes found on the idle kernel socket were reported */
    _Atomic bool stall_told;      /* a send stalled with both rings full was reported */
    _Atomic bool zerocopy_looked; /* its first send with MSG_ZEROCOPY asked the kernel's flag */
    _Atomic bool zc_on;           /* ... which was on (from its listener): completions owed */
    _Atomic uint64_t zc_pend;     /* MSG_ZEROCOPY sends on the channel: the next id << 32 |
                                   * how many completions wait (negotiate.c) */
    _Atomic bool async_told;      /* O_ASYNC asked for: said once how SIGIO comes for the
                                   * channel's bytes, or why it cannot (mlp_async) */
    int sio_fd, sio_wfd;          /* O_ASYNC: our SIGIO FIFO's read end (one of our fds), and a
                                   * write end that keeps it from losing its last writer; -1 if
                                   * none; kept until the socket goes (mlp_async) */
    int urg_fd, urg_wfd;          /* an owner set (F_SETOWN): our SIGURG FIFO's, the same way
                                   * (mlp_sio_owner) */
    _Atomic int sio_busy;         /* their set-up's lock (a try-lock: never waited for long) */
    _Atomic bool passed;          /* accelerated, it was passed to another process over
                                   * SCM_RIGHTS (negotiate.c, mlp_passed; sock.c, mlp_at_exit) */
    _Atomic bool sent;            /* sent to another process over SCM_RIGHTS, which holds the
                                   * file now: a parked epoll entry goes at our close of it
                                   * (epoll.c, mlp_epoll_fd_closing) */
    _Atomic bool shut_owed;       /* shut down (SHUT_WR) while undecided: the kernel socket's
                                   * shutdown waits for the settle (mlp_shut_owed_pay) */
    _Atomic bool disconnected;    /* connect(AF_UNSPEC) made it the kernel's (mlp_disconnect):
                                   * calls still inside it answer as the kernel does */
    _Atomic bool lock_broken;     /* a direction lock said ENOTRECOVERABLE (said once) */
    _Atomic bool locks_tried;     /* its shared lock page was made, or could not be
                                   * (mlp_locks_share: once per socket) */
    struct mlp_member *epm;       /* its epoll memberships (epoll.c, under its lock) */
    struct mlp_pwreg *pw;         /* threads asleep in poll/select on it (pqueue.c, mlp_pw_mu) */
    _Atomic int lent;             /* references lent to a thread's waiter (mlp_pwait.held) by
                                   * polls asleep on its futex (pqueue.c, mlp_poll_fork_drop) */
    struct mlp_ep *_Atomic home_ep; /* epoll.c: the one epoll set it is in, whose own queue it
                                     * should post to; NULL: the process's queue (mlp_epmu) */
    struct mlp_ep *qep;           /* epoll.c: the set whose queue its channel is in now, NULL for
                                   * the process's queue or none (mlp_home_mu) */
    _Atomic uint64_t fin_ns;      /* when its kernel socket's FIN came, the peer still alive */
    _Atomic uint64_t passed_ns;   /* the last ask of a passed peer's lock (poll.c,
                                   * mlp_peer_passed_gone) */
    _Atomic uint64_t look_ns;     /* the last look at the kernel socket by a call that must not
                                   * wait (poll.c, mlp_look_due; the coarse clock) */
    _Atomic uint32_t eagains;     /* nonblocking receives in a row that found the ring empty */
    _Atomic uint64_t drained_ns;  /* the coarse clock at the last receive that got bytes after
                                   * an empty one (sock.c, mlp_eagain_look) */
    pthread_mutex_t mu;           /* state changes: withdrawal, close */
    struct mlp_locks *_Atomic locks; /* sock.c: the direction locks and the file status flags:
                                      * own_locks until the socket is forked, then a page only
                                      * fork children share (mlp_locks_share) */
    struct mlp_locks own_locks;   /* private: a socket never forked, or one whose page could
                                   * not be made */
    int cred_fd;                  /* cred.c: the channel's file kept open before a credential
                                   * change, for exec's bridge when the name is refused; 0: none */
    int keep_fd;                  /* a duplicate of the kernel socket kept while calls are in
                                   * progress after its last fd was closed (0: none; see
                                   * mlp_keep_file), closed with the last reference */
    _Atomic bool keep_taken;      /* one thread makes keep_fd (two dup2s over the last fd) */
    /* Listener: its port and rendezvous record (an accepted connection: its local port, for
     * mlp_after_pass, which must not ask the kernel: the passer may be sandboxed). */
    int port;
    struct mlp_lrec *rec;
    struct mlp_sock *next_free;
    _Atomic bool finish_pending;  /* its last reference went while this thread held a fast word
                                   * beneath a handler: the word's give-back finishes it */
    /* The fast words (sock.c), each on lines of its own: 0, or the holder's thread id with a
     * waiters bit.  Never cleared by reuse (mlp_sock_new): a call that holds one holds the
     * socket without a reference (mlp_fast_begin), so a stale pointer's word stays a lock. */
    char fast_pad0[MLP_LOCKDIR_BYTES];
    _Atomic uint32_t ftx;
    char fast_pad1[MLP_LOCKDIR_BYTES - sizeof(uint32_t)];
    _Atomic uint32_t frx;
    char fast_pad2[MLP_LOCKDIR_BYTES - sizeof(uint32_t)];
};

/*
 * The per-fd record (fdtable.c): everything memlan keeps about an fd number, in one place with
 * one life cycle.  It is reset (mlp_fd_released, interpose.c) wherever the kernel releases the fd:
 * close, close_range, closefrom, dup2/dup3 over it, and before dup/F_DUPFD put a new file there;
 * exec starts the new image with an empty table.  A record exists only once its chunk was needed;
 * an fd without one has nothing of ours.
 */
struct mlp_fdrec {
    _Atomic(struct mlp_sock *) sock; /* accelerated socket or memlan listener, else NULL */
    int *_Atomic owner;              /* one of our own fds: where its number is kept */
    _Atomic uint32_t bufhint[2];     /* SO_SNDBUF, SO_RCVBUF as set by the program (ring sizes) */
    _Atomic uint8_t linger0;         /* SO_LINGER 0 set before the connection existed */
    _Atomic uint8_t epfd;            /* an epoll fd the program made */
    _Atomic int tcp_slot;            /* memlan stat line of a plain TCP connection + 1, or 0 */
    _Atomic uint64_t tcp_pending;    /* a connect in progress (EINPROGRESS, EINTR) decided TCP:
                                      * its socket's inode; the connect that completes it, on
                                      * that socket still, decides nothing again */
    _Atomic uint8_t received;        /* came over SCM_RIGHTS (MLP_RCV_*): a connection passed to
                                      * us is taken up at its first call (mlp_take_passed); a
                                      * listening TCP socket is published at its first accept
                                      * (mlp_accept_received) */
    _Atomic uint32_t rcvlowat;       /* SO_RCVLOWAT set (above 1), for a channel to come */
    _Atomic uint32_t closing;        /* a close of our connection on fd is between its record's
                                      * release and the kernel's close: its thread's id
                                      * (mlp_thread_id), | MLP_CLOSING_WAITERS (interpose.c) */
    /* A plain fd the program put in an epoll set (a socket not yet connected, say): that set's
     * fd + 1, or -1 for more than one, and the events and data it asked for; a connect that
     * makes it ours takes that entry over (epoll.c, mlp_epoll_adopt). */
    _Atomic int kep;
    _Atomic uint32_t kep_events;
    _Atomic uint64_t kep_data;
};
#define MLP_CLOSING_WAITERS 0x80000000u
#define MLP_RCV_NEW    1   /* received, not looked at (odd: a look is due or under way) */
#define MLP_RCV_LOOKED 2   /* looked at: no connection passed with it */
#define MLP_RCV_TAKING 3   /* a thread looks now */
/* The fd table (fdtable.c): a top level sized by RLIMIT_NOFILE's hard limit (reserved, not
 * committed), whose entries point to chunks of MLP_FDCHUNK records, mapped the first time an fd
 * in them needs a record and never unmapped (a thread may hold a pointer into one).  An fd whose
 * chunk does not exist has no record: nothing of ours, one load.  Inline: every data call looks. */
#define MLP_FDCHUNK_SHIFT 10
#define MLP_FDCHUNK (1 << MLP_FDCHUNK_SHIFT)
extern struct mlp_fdrec *_Atomic *mlp_fdtop;
extern int mlp_nfds;
/* NULL: no record, nothing of ours. */
static inline struct mlp_fdrec *mlp_fdrec(int fd)
{
    if ((unsigned)fd >= (unsigned)mlp_nfds || __builtin_expect(!mlp_fdtop, 0))
        return NULL;
    struct mlp_fdrec *c = atomic_load_explicit(&mlp_fdtop[fd >> MLP_FDCHUNK_SHIFT],
                                               memory_order_acquire);
    return c ? &c[fd & (MLP_FDCHUNK - 1)] : NULL;
}
struct mlp_fdrec *mlp_fdrec_make(int fd); /* NULL only past the table or out of memory */
bool mlp_take_passed(int fd);
/* A descriptor received over SCM_RIGHTS that no call has looked at yet: look now (memory only
 * for every other fd). */
static inline void mlp_received_look(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (__builtin_expect(r != NULL && (atomic_load_explicit(&r->received, memory_order_relaxed) & 1), 0))
        (void)mlp_take_passed(fd);
}
int mlp_fdrec_next(int fd, int max);      /* next fd >= fd that may have a record, or -1 */
bool mlp_fdrec_busy(const struct mlp_fdrec *r);
bool mlp_vfork_child(void);               /* a vfork child: touch no memlan state */
/* syscall(SYS_clone, flags without CLONE_VM, NULL, ...) or syscall(SYS_fork): call runs it
 * with fork's handlers around it (init.c) */
long mlp_raw_fork(long (*call)(long, long, long, long, long, long, long), long n, long a, long b,
                  long c, long d, long e, long f);
/* The head of clone3's struct clone_args (linux/sched.h, its first version: 64 bytes). */
struct mlp_clone_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

/* fd table (fdtable.c).  get() takes a reference that put() drops; NULL = not ours. */
struct mlp_sock *mlp_sock_new(int type);
void mlp_locks_init(struct mlp_sock *s);
struct mlp_sock *mlp_get(int fd);
void mlp_put(struct mlp_sock *s);
void mlp_sock_finish(struct mlp_sock *s);      /* its teardown, then the free list */
void *mlp_spin_lend(void);                     /* sock.c: a handler starts (signals.c) */
void mlp_spin_unlend(void *w);                 /* sock.c: and returns */
bool mlp_fast_defer(struct mlp_sock *s);       /* sock.c: its finish waits for our fast word */
int mlp_install(int fd, struct mlp_sock *s);   /* the table takes a reference */
struct mlp_sock *mlp_uninstall(int fd);        /* returns the table's reference, or NULL */
void mlp_fork_gate_close(void);                /* prepare handler: installs wait (fdtable.c) */
void mlp_fork_gate_open(bool child);
bool mlp_fd_is_ours(int fd);                   /* quick test without a reference */
bool mlp_fd_is_ours_call(int fd);              /* the same for a data call (waits out a close) */
uint32_t mlp_thread_id(void);                  /* sock.c: this thread's id of ours, never 0 */
void mlp_kept_tick(void);                     /* sock.c: at a sleep's wake-up: idle regions */
bool mlp_holds_lock(void);                     /* sock.c: this thread holds a lock of ours */
int mlp_fd_max(void);
void mlp_fdtable_init(void);
void mlp_sock_destroy(struct mlp_sock *s);     /* sock.c: when the last reference goes */

/* A cleanup that glibc runs for the frames a longjmp, a siglongjmp or a cancellation's unwinding
 * passes (pqueue.c, "waits left by a jump or a cancellation"); nothing without glibc's. */
extern void _pthread_cleanup_push(struct _pthread_cleanup_buffer *b, void (*fn)(void *), void *a)
    __attribute__((weak));
extern void _pthread_cleanup_pop(struct _pthread_cleanup_buffer *b, int execute)
    __attribute__((weak));

static inline void mlp_left_push(struct _pthread_cleanup_buffer *b, void (*fn)(void *), void *a)
{
    if (_pthread_cleanup_push && _pthread_cleanup_pop)
        _pthread_cleanup_push(b, fn, a);
}

static inline void mlp_left_pop(struct _pthread_cleanup_buffer *b)
{
    if (_pthread_cleanup_push && _pthread_cleanup_pop)
        _pthread_cleanup_pop(b, 0);
}

/* A call on a connection (read, recv, write, send and their kin, splice, sendfile, shutdown):
 * the interposer's reference to the socket, and the direction locks the call takes, are given
 * back by its cleanup when a handler's siglongjmp or a cancellation leaves the call (sock.c). */
struct mlp_call {
    struct _pthread_cleanup_buffer buf;
    struct mlp_sock *volatile s; /* the call's reference (NULL: given back) */
    struct mlp_sock *volatile fast; /* or the socket whose fast word it holds (mlp_fast_begin) */
    unsigned nheld;              /* the direction locks this thread held as the call began */
};
void mlp_call_begin(struct mlp_call *c);  /* the cleanup on; then the reference (mlp_get_slot) */
void mlp_call_end(struct mlp_call *c);    /* the reference put, then the cleanup off */
struct mlp_sock *mlp_get_slot(int fd, struct mlp_sock *volatile *slot); /* fdtable.c */
/* Our own fds (segments, records, the log) live at high numbers and are remembered. */
void mlp_own_fd(int *fdp, bool cloexec);
void mlp_disown_fd(int fd);
bool mlp_is_internal_fd(int fd);
int mlp_evict_fd(int fd);
void mlp_own_fd_cloexec(int fd, bool cloexec);

/* The connection life cycle (negotiate.c). */
/* SO_RCVBUF/SO_SNDBUF set by the program size the rings (negotiate.c). */
void mlp_note_bufsize(int fd, int name);
void mlp_note_linger(int fd, const void *val, socklen_t len); /* SO_LINGER, before connecting */
int mlp_ulp_set(struct mlp_sock *s, int fd); /* setsockopt(TCP_ULP): 0 for the kernel's call */
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
void mlp_zerocopy_before(void);           /* setsockopt(SO_ZEROCOPY), before the kernel's call */
bool mlp_zerocopy_send(struct mlp_sock *s, int fd); /* MSG_ZEROCOPY on a channel: owes one? */
void mlp_zerocopy_done(struct mlp_sock *s);    /* ... sent: its completion queued */
void mlp_zerocopy_off(struct mlp_sock *s);     /* setsockopt(SO_ZEROCOPY, 0) */
int mlp_oob_settle(struct mlp_sock *s, int fd); /* MSG_OOB while undecided: withdrawn */
int mlp_zerocopy_settle(struct mlp_sock *s, int fd); /* ... on an undecided client: the state */
ssize_t mlp_zerocopy_read(struct mlp_sock *s, int fd, struct msghdr *m, int flags);
int mlp_zerocopy_set(struct mlp_sock *s, int fd); /* ... turned on, on a connection: -EOPNOTSUPP */
void mlp_note_defer(int fd); /* TCP_DEFER_ACCEPT set: a listener's clients will not offer */
void mlp_note_lowat(int fd, const void *val, socklen_t len);  /* SO_RCVLOWAT, for a channel */
/* sock.c: SO_PEEK_OFF set by the program on fd (the kernel took it); its value on a channel */
void mlp_peek_off_set(struct mlp_sock *s);
int mlp_peek_off_get(struct mlp_sock *s, int fd, int *val);
uint32_t mlp_lowat_value(const void *val);                    /* SO_RCVLOWAT as the kernel's */
struct ml_sock_side *mlp_side_block(memlan_channel_t *ch, int side);
/* sock.c: 0 none, 1 a reset to report, 2 reported; probe: ask whether the peer died (syscalls) */
int mlp_reset_state(struct mlp_sock *s, bool probe);
int mlp_reset_take(struct mlp_sock *s, bool probe, bool by_recv); /* its errno, once */
void mlp_bufhint_clear(int fd);
void mlp_lowat_inherited(int fd); /* a socket carried across exec: its SO_RCVLOWAT counts */
int mlp_on_listen(int fd, bool before); /* before: ahead of the kernel's listen (bound sockets only);
                                        * 1: the fabric refused the record (said) */
extern bool mlp_listen_carried; /* exec.c: mlp_on_listen of a listener carried across exec */
void mlp_on_listened(int fd); /* after the kernel's listen of a socket published before it */
struct msghdr;
void mlp_mark_received(const struct msghdr *m);
void mlp_mark_received_one(int fd);
void mlp_accept_received(int fd);
void mlp_publish_received(void);
void mlp_on_connect_start(int fd, const struct sockaddr *addr, socklen_t len, void **token);
void mlp_on_connect_done(int fd, const struct sockaddr *addr, socklen_t len, void *token, int rc,
                         int err);
void mlp_on_accept(int lfd, int fd, int flags);
int mlp_decide(struct mlp_sock *s, int fd, bool wait);  /* client: settle an undecided socket */
/* the same, waiting, or -EINTR, or -EAGAIN at the deadline (SO_RCVTIMEO/SNDTIMEO; 0: none) */
int mlp_decide_call(struct mlp_sock *s, int fd, uint64_t deadline, bool rx);
void mlp_shut_owed_pay(struct mlp_sock *s, int fd); /* sock.c: the kernel shutdown owed */
void mlp_claimed_at_close(struct mlp_sock *s, int fd); /* negotiate.c: a close found it claimed */
void mlp_offer_gone(struct mlp_sock *s);
/* Across exec (exec.c): what the old image tells the new one about a socket besides its channel. */
#define MLP_CARRY_RD_EOF  1u
#define MLP_CARRY_SHUT_RD 2u
#define MLP_CARRY_PASSED  4u /* taken up after a pass: the side's ML_SOCK_PASSED goes */
void mlp_adopt_conn(const int *fds, int n, int bridge, int side, const char *token,
                    unsigned flags, const char *how);
void mlp_exec_adopt(void);  /* constructor: take up what the image before us carried */
void mlp_vfork_note_dup(int fd, int fd2); /* a vfork child's dup2/dup3 of our fd (exec.c) */
bool mlp_vfork_noted(int fd);              /* fd: a vfork child's dup of ours (exec.c) */
void mlp_fabric_preopen(void);     /* negotiate.c: open the fabric now, silently (before chroot) */
void mlp_exec_env_snapshot(void); /* LD_PRELOAD and MEMLAN_* as at start-up, for exec */
extern __thread char *mlp_defer_offer_unlink; /* a buffer of sizeof mlp_sock.offer, or NULL */
void mlp_offer_unlink_name(const char *name);
void mlp_lrec_release(struct mlp_lrec *r);
bool mlp_lmap_hold(struct ml_listen_rec *m);
void mlp_lmap_put(struct ml_listen_rec *m);
void mlp_stat_conn(struct mlp_sock *s, int fd, const char *why);  /* record in memlan stat */
void mlp_stat_tcp(int fd, const char *why);
void mlp_stat_clear(struct mlp_sock *s);
void mlp_stat_owner(uid_t uid); /* root: our stat entry becomes uid's (cred.c) */
void mlp_stat_prepare(void);         /* create our memlan stat entry now, if there is a fabric */
/* sendmsg's SCM_RIGHTS (negotiate.c, "Passing a connection"): before the kernel's call, the
 * accelerated connections among the descriptors are left to the receiver (NULL: none); after
 * it, kept (ok) or undone.  mlp_pass_tick: a passer looks whether its receivers took them. */
void *mlp_pass_prepare(const struct msghdr *m, int sfd, int *carries);
void mlp_pass_finish(const struct msghdr *m, void *made, bool ok, int sfd, int *carries);
void mlp_pass_tick(void);
bool mlp_take_passed(int fd);   /* a descriptor received over SCM_RIGHTS: true once ours */
bool mlp_received_pending(void); /* some fd may carry a received mark not looked at */
extern _Atomic bool mlp_had_accel; /* a channel was set up in this process image */
void mlp_note_confined(void);   /* a seccomp filter was installed through us */
void mlp_exit_unname(void);     /* negotiate.c: _exit's part of mlp_at_exit */
void mlp_sock_exit_now(void);   /* sock.c: _exit's look at the connections */
void mlp_stat_unname(void);     /* negotiate.c: our stat entry's name goes (_exit) */
struct memlan_segment *mlp_stat_seg(void); /* negotiate.c: our stat entry, or NULL */
bool mlp_family_first(uid_t eu, bool exec); /* init.c: first of the fork family to say it */
bool mlp_sandboxed(void);       /* negotiate.c: a seccomp filter may kill for a call */
bool mlp_log_closed_to_exec(void); /* init.c: an exec'd image could not open the log */
bool mlp_known_confined(void);  /* memory only: a filter is known (mlp_note_confined, or looked) */
int *mlp_lrec_cred_exec(const uint8_t *kept, int *n, bool mark, bool own); /* before exec */
bool mlp_lrec_cred_back(void); /* back in reach: ML_NO_OFFER_CRED we set, cleared; false: busy */
void mlp_lrec_cred_undo(const int *ports, int n);      /* the exec failed: set again */
bool mlp_lrec_blind_mark(struct mlp_sock *s); /* before an exec into a blind image */
void mlp_lrec_blind_undo(int port);           /* the exec failed */
bool mlp_lrec_oob_mark(int port);             /* urgent data refused: port's later clients
                                               * stay on TCP (ML_NO_OFFER_OOB) */
void mlp_lrec_grant(uid_t uid);      /* a shared fabric: uid may accept on our ports (cred.c) */
void mlp_sock_liveness(memlan_channel_t *ch, int fd); /* the kernel socket under a channel */

/* Credentials (cred.c).  A process whose credential change put the fabric out of its reach says
 * so once, flags the records of the ports it listens on (clients stop offering), and makes every
 * new connection plain TCP at once; its accelerated connections go on. */
void mlp_rlimit_changing(int res, const struct rlimit *rl); /* init.c: before setrlimit */
void mlp_nofile_note(unsigned long long cur); /* pqueue.c: RLIMIT_NOFILE's soft limit now */
long mlp_nofile_now(void);                    /* as last noted (start-up, setrlimit, prlimit) */
void mlp_poll_prepare_thread(void); /* pqueue.c: this thread's wake-up, made before a sandbox */
bool mlp_cred_lost(bool at_accept);  /* true: no new connection of ours may use the fabric */
bool mlp_cred_lost_here(bool at_accept); /* the same, for this thread's connect or accept */
bool mlp_cred_out_here(void);        /* the fabric is out of this thread's reach (no payment) */
bool mlp_cred_nr(long n);            /* syscall(): a set*id, setgroups or capset number */
int mlp_cred_syscall(long n, long a, long b, long c); /* ... made as the libc call is */
void mlp_stat_inherited(struct mlp_sock *s); /* a fork child's first use */
void mlp_cred_kept_closed(void);  /* a socket's cred_fd closed (sock.c) */
void mlp_cred_adopted_out(void);  /* exec.c: took connections up in a fabric out of reach */
int mlp_fd_to_high(int fd);       /* fd moved to our high numbers (closed), or -1 */
int mlp_hold_file(int fd, int *slot); /* fd's file, held for a call (fdtable.c) */
void mlp_hold_release(int slot);
int mlp_held_fd_now(int slot, int fd); /* the held fd if still ours, else fd */
void mlp_hold_after_fork(void);
void mlp_own_fd_at(int *fdp);     /* one of ours, already high */
bool mlp_fabric_out(void);            /* the same, as last found: no system call */
extern const char *mlp_cred_why;     /* why, for our own connections' log lines and memlan stat */
void mlp_cred_fabric_opened(void);   /* negotiate.c: the credentials the fabric was opened with */
void mlp_fabric_refused(const char *what, int err); /* a create failed: EACCES/EPERM count */

/* Data path (sock.c).  All return bytes or -errno. */
/* A send or receive on a socket never forked, by its fast word alone (no reference): bytes, or
 * MLP_SLOW before anything moved (the regular path's turn: waits, errors, the end), or (a
 * receive whose spin a handler ended) -1 with errno EINTR. */
#define MLP_SLOW (-100000)
ssize_t mlp_send_fast(int fd, const struct iovec *iov, int n, int flags);
ssize_t mlp_recv_fast(int fd, const struct iovec *iov, int n, int flags);
ssize_t mlp_send(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags);
ssize_t mlp_sendmsg(struct mlp_sock *s, int fd, const struct msghdr *m, int flags);
ssize_t mlp_recv(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags);
ssize_t mlp_readv(struct mlp_sock *s, int fd, const struct iovec *iov, int n);
ssize_t mlp_recvmsg(struct mlp_sock *s, int fd, struct msghdr *m, int flags);
ssize_t mlp_sendfile(struct mlp_sock *s, int fd, int in, off_t *off, size_t count);
ssize_t mlp_splice_from(struct mlp_sock *s, int fd, int pipe, size_t len, unsigned flags);
ssize_t mlp_splice_to(struct mlp_sock *s, int fd, int pipe, size_t len, unsigned flags);
int mlp_shutdown(struct mlp_sock *s, int fd, int how);
void mlp_async(struct mlp_sock *s, int fd, bool on); /* O_ASYNC set or cleared */
void mlp_sio_owner(struct mlp_sock *s, int fd); /* F_SETOWN(_EX), F_SETSIG: to our FIFOs too */
void mlp_sio_missed(struct memlan_channel *ch, bool urg, int err); /* a peer's FIFO: said */
void mlp_sio_at_exit(struct mlp_sock *s); /* our FIFOs' names, where we hold the side alone */
void mlp_sock_fd_moved(struct mlp_sock *s, int fd); /* ch->sock_fd to another of s's fds */
void mlp_urg_premake(struct mlp_sock *s); /* before a credential change: the SIGURG FIFO */
bool mlp_wait_is_recv(void); /* this thread waits in a blocking receive (channel.c's hook) */
int mlp_ioctl(struct mlp_sock *s, int fd, unsigned long req, void *arg, bool *handled);
void mlp_set_nonblock(struct mlp_sock *s, bool on);
bool mlp_nonblock(struct mlp_sock *s);
int mlp_setsockopt(struct mlp_sock *s, int level, int name, const void *val, socklen_t len);
int mlp_getsockopt(struct mlp_sock *s, int fd, int level, int name, void *val, socklen_t *len,
                   bool *handled);
void mlp_after_fork_child(void);
void mlp_before_fork(void);   /* pthread_atfork prepare: the child-to-be holds our sockets */
void mlp_fork_failed(void);
void mlp_before_last_close(struct mlp_sock *s, int fd);
void mlp_keep_file(struct mlp_sock *s, int fd);
void mlp_keep_file_early(int fd);
int mlp_tcp_catch_up(struct mlp_sock *s, int fd, bool block);
void mlp_at_exit(void);
/* A table of ours in memory from mmap that points at records from malloc (the fd table's chunks,
 * the epoll sets' table): shown to LeakSanitizer as a root, where a host built with it runs us.
 * exit() frees nothing of ours (sock.c), and LeakSanitizer scans no mmap'd memory of its own
 * accord: without this the records would be reported as leaks and the host's exit status
 * changed (its default: 23).  The runtime's symbol is weak: without a sanitizer, nothing. */
void __lsan_register_root_region(const void *p, size_t size) __attribute__((weak));
static inline void mlp_lsan_root(const void *p, size_t size)
{
    if (__lsan_register_root_region)
        __lsan_register_root_region(p, size);
}
bool mlp_exiting(void); /* exit() has begun: make nothing that outlives the process (sock.c) */
void mlp_epoll_at_exit(void); /* epoll.c: the sets' queues lose their names */
void mlp_poll_at_exit(void);  /* pqueue.c: the process's queue loses its names */
void mlp_stdio_adopt(int fd, bool wait); /* stdio.c: a connection now at fd 0, 1 or 2 */

/* A blocking wait on an accelerated socket sleeps on the ring's futex only for this long (a
 * request and its answer, where a wake-up's cost matters), then where the kernel socket can wake
 * it too (mlp_sock_sleep, mlp_poll's ppoll): see sock.c, mlp_wait_dir, and poll.c. */
#define MLP_SLICE_NS 10000000ull

/* Readiness (poll.c): poll(2) semantics of one socket now; revents in POLL* bits. */
short mlp_sock_revents(struct mlp_sock *s, int fd, short events);
int mlp_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask);
int mlp_sock_sleep(struct mlp_sock *s, int dir, uint64_t want, uint64_t deadline, int64_t *live);
struct mlp_sock *mlp_sleep_lending(void); /* the socket this thread's mlp_sock_sleep lends */
bool mlp_end_look(struct mlp_sock *s);
/* poll.c: the liveness interval a wait starts from (the one the thread's last quiet wait
 * reached), and the wait's end (ret: 0 when nothing of ours was in its answer). */
int64_t mlp_live_begin(void);
void mlp_live_end(int64_t live, int ret);
/* poll.c: skip the brief futex wait on s, whose last wait of this thread spent it for nothing;
 * and say how a wait on s ended (idle: it spent that wait, or skipped it, and ran out). */
bool mlp_idle_skip(const void *s);
void mlp_idle_note(const void *s, bool idle);
bool mlp_look_due(struct mlp_sock *s, uint64_t now);
bool mlp_check_peer(struct mlp_sock *s);
bool mlp_peer_passed_gone(struct mlp_sock *s, bool out, bool ran_out);
void mlp_poll_kick(struct mlp_sock *s);
int mlp_select(int n, fd_set *r, fd_set *w, fd_set *e, int64_t timeout_ns, const sigset_t *mask,
               int64_t *left_ns);
int mlp_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev, bool *handled);
extern __thread bool mlp_ep_ns __attribute__((tls_model("initial-exec")));   /* inside the epoll_pwait2 interposer */
int mlp_epoll_wait(int epfd, struct epoll_event *ev, int max, int64_t timeout_ns,
                   const sigset_t *mask);
void mlp_epoll_forget_fd(int fd);
void mlp_epoll_note_plain(int epfd, int op, int fd, const struct epoll_event *ev);
const char *mlp_epoll_adoptable(int fd); /* NULL, or why fd's entries cannot become ours */
const char *mlp_epoll_adopt(int fd);     /* fd is ours now: its set's entry becomes a member */
void mlp_epoll_sock_gone(struct mlp_sock *s);
void mlp_epoll_sock_to_kernel(struct mlp_sock *s); /* s is the kernel's again, its fds open */
void mlp_epoll_fd_closing(int fd); /* fd stops naming its socket, which another fd still names */
void mlp_epoll_unpark_all(bool fork); /* before fork and exec: parked members leave their sets */
void mlp_epoll_created(int epfd); /* epoll_create: an fd that may go inside another set */
void mlp_epoll_dup(int fd, int nfd); /* nfd (released) now names fd's set, if fd is an epoll fd */
bool mlp_epoll_has_ours(int fd);     /* an epoll set with members of ours: poll needs our path */
extern int mlp_nnested; /* epoll sets inside other sets: every wait must look at them */

/* Locks on the shared socket block (sock.c). */
/* 0, or what the call returns instead (see mlp_lock_dir): never held across a sleep. */
int mlp_lock_tx(struct mlp_sock *s, bool nb);
void mlp_unlock_tx(struct mlp_sock *s);
int mlp_lock_rx(struct mlp_sock *s, bool nb);
void mlp_unlock_rx(struct mlp_sock *s);
unsigned mlp_sig_nores_count(void); /* signals.c: handlers without SA_RESTART run on this thread */
unsigned mlp_sig_runs(void);        /* signals.c: the same count, read without side effects */
unsigned mlp_sig_runs_any(void);    /* signals.c: every handler run through us, on this thread */
bool mlp_sig_in_handler(void);       /* signals.c: this thread runs a handler installed through us */
void mlp_sig_after_fork_child(void); /* signals.c: a fork child is in no handler of ours */

/* Save and restore errno around our own work inside an interposer. */
#define MLP_SAVE_ERRNO int mlp_saved_errno_ = errno
#define MLP_RESTORE_ERRNO errno = mlp_saved_errno_

uint64_t mlp_now_ns(void);
uint64_t mlp_coarse_ns(void);

#endif
