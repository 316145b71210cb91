/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * interpose.c - the exported libc functions (the list is calls.h).
 *
 * Every interposer has one shape: make sure start-up ran, pass straight to the real function when
 * we are inside our own code or the fd is not ours, otherwise dispatch to the handler and turn its
 * negative errno into -1 and errno.  Only this file sets errno; a call that succeeds leaves errno
 * as the application left it.
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <linux/sockios.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <linux/prctl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

void mlp_stat_tcp_closed(int fd);

#define MLP_INIT()                                                                             \
    do {                                                                                       \
        if (ml_unlikely(!mlp_ready))                                                           \
            mlp_init();                                                                        \
    } while (0)

/* The fd's accelerated connection, or NULL to pass the call through. */
static inline struct mlp_sock *mlp_conn(int fd)
{
    if (ml_unlikely(!mlp_ready))
        mlp_init();
    if (mlp_inside)
        return NULL;
    mlp_received_look(fd); /* a connection passed to us: its ioctl, options, flags are ours */
    struct mlp_sock *s = mlp_get(fd);
    if (ml_likely(!s))
        return NULL;
    if (s->type != MLP_CONN) {
        mlp_put(s);
        return NULL;
    }
    return s;
}

/* mlp_conn for a call that may block or take a direction's lock: its reference is named in c,
 * whose cleanup gives it back if the call is left by a jump or a cancellation (sock.c,
 * mlp_call_begin).  NULL: pass the call through (c is off again). */
static inline struct mlp_sock *mlp_conn_call(int fd, struct mlp_call *c)
{
    if (ml_unlikely(!mlp_ready))
        mlp_init();
    if (mlp_inside)
        return NULL;
    /* The record can go between the look and the reference: a close under way, which marks it
     * first.  Looked at again, the mark is waited for (its kernel close), so the call reaches
     * the closed fd (EBADF) or what the number names by then, never the kernel socket under the
     * channel: closesend lost a send's bytes so in 6 runs of 100 (of 100 rounds each) before. */
    for (int tries = 0; tries < 4; tries++) {
        if (ml_likely(!mlp_fd_is_ours_call(fd)))
            return NULL;
        mlp_call_begin(c);
        struct mlp_sock *s = mlp_get_slot(fd, &c->s);
        if (ml_likely(s != NULL) && ml_likely(s->type == MLP_CONN))
            return s;
        mlp_call_end(c);
        if (s)
            return NULL; /* a listener or an undecided kind: the kernel's call */
    }
    return NULL;
}

/* The fast path first (sock.c, mlp_send_fast): MLP_PASS when fd is none of ours (the kernel's
 * call), MLP_SLOW when the regular path must make the call, else its result (-1 with errno
 * set: a receive's spin ended by a handler). */
#define MLP_PASS (MLP_SLOW - 1)
static inline bool mlp_fast_ours(int fd)
{
    if (ml_unlikely(!mlp_ready))
        mlp_init();
    return !mlp_inside && ml_unlikely(mlp_fd_is_ours_call(fd));
}

static inline ssize_t mlp_fast_tx(int fd, const struct iovec *v, int n, int flags)
{
    return mlp_fast_ours(fd) ? mlp_send_fast(fd, v, n, flags) : MLP_PASS;
}

static inline ssize_t mlp_fast_rx(int fd, const struct iovec *v, int n, int flags)
{
    return mlp_fast_ours(fd) ? mlp_recv_fast(fd, v, n, flags) : MLP_PASS;
}

/* The same for sendmsg and recvmsg: the header is read only for an fd of ours (the kernel says
 * EFAULT for a bad one on any other), and a NULL one is the regular path's. */
static inline ssize_t mlp_fast_msg(int fd, struct msghdr *msg, int flags, bool tx)
{
    if (!mlp_fast_ours(fd))
        return MLP_PASS;
    if (!msg || msg->msg_iovlen > IOV_MAX)
        return MLP_SLOW;
    return tx ? mlp_send_fast(fd, msg->msg_iov, (int)msg->msg_iovlen, flags)
              : mlp_recv_fast(fd, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

static inline ssize_t mlp_ret(ssize_t r)
{
    if (r < 0) {
        errno = (int)-r;
        return -1;
    }
    return r;
}

/* ---- connection set-up ------------------------------------------------------------------- */

static void mlp_fd_released(int fd, char *offer);

/*
 * connect(fd, AF_UNSPEC) on one of our sockets: TCP's disconnect.  The kernel resets the
 * connection and the fd may connect again; memlan's record stayed, so the peer read no reset, a
 * send went into the old ring, and after a new connect the bytes went to the old channel (the
 * new connection's server never got them: tests/preload/disconnect.c).  Once the kernel has
 * disconnected, the socket is the kernel's again: its end is published as a reset (as a close
 * with SO_LINGER 0 publishes it), its epoll memberships go to the kernel, and every fd naming it
 * loses its record, as at a close that leaves the fds open; a connect after it makes a new
 * offer.  A listener stops listening in the kernel the same way, and its record goes.
 */
static int mlp_disconnect(int fd, const struct sockaddr *addr, socklen_t len)
{
    struct mlp_sock *s = mlp_get(fd);
    /* Undecided: settled first, as a close settles it.  What the program wrote before the
     * disconnect the kernel had sent; in the ring it was lost with the reset (the first server
     * read ECONNRESET where kernel TCP gives it the bytes first: tests/preload/dissolve.c). */
    if (s && s->type == MLP_CONN && s->ch && s->state == MLP_UNDECIDED)
        mlp_before_last_close(s, fd);
    int r = mlp_real_connect(fd, addr, len);
    if (r != 0 || !s) {
        if (s)
            mlp_put(s);
        return r;
    }
    int saved = errno;
    /* Calls other threads are inside (a blocked recv, a poll) end as the kernel's end them:
     * recv with EPIPE, poll with the kernel socket's POLLERR|POLLHUP, not as at the peer's
     * end-of-file (tests/preload/disconnectwait.c). */
    atomic_store(&s->disconnected, true);
    if (s->type == MLP_CONN && s->me)
        atomic_fetch_or(&s->me->flags, ML_SOCK_LINGER0);
    /* No peek at the kernel socket for a split stream as the last record goes: it would take
     * the disconnect's ECONNRESET, which the program's next call reports. */
    atomic_store(&s->split_told, true);
    mlp_epoll_sock_to_kernel(s);
    for (int f = mlp_fdrec_next(0, INT32_MAX); f >= 0; f = mlp_fdrec_next(f + 1, INT32_MAX)) {
        struct mlp_sock *o = mlp_get(f);
        if (o == s) {
            /* The fd stays open, and so do the kernel's entries for it (noted as the program's
             * plain entries): a connect that makes it ours again takes them over. */
            struct mlp_fdrec *rec = mlp_fdrec(f);
            int kep = atomic_load(&rec->kep);
            uint32_t kev = atomic_load(&rec->kep_events);
            uint64_t kdata = atomic_load(&rec->kep_data);
            mlp_fd_released(f, NULL);
            atomic_store(&rec->kep_events, kev);
            atomic_store(&rec->kep_data, kdata);
            atomic_store(&rec->kep, kep);
        }
        if (o)
            mlp_put(o);
    }
    mlp_put(s);
    errno = saved;
    return r;
}

/* connect is async-signal-safe, and a handler may connect: the kernel's call alone there, plain
 * TCP, said in the log.  The negotiation takes locks (the listener records', malloc's) that the
 * thread the handler interrupted may hold, in a connect of its own: it waited on itself for ever
 * (tests/preload/sigconnect.c).  A handler installed by sysv_signal or sigset is not seen as one
 * (signals.c). */
static int mlp_connect_in_handler(int fd, const struct sockaddr *addr, socklen_t len)
{
    int r = mlp_real_connect(fd, addr, len), saved = errno, type = 0;
    socklen_t tl = sizeof type;
    if ((r == 0 || saved == EINPROGRESS) && addr && len >= sizeof(sa_family_t) &&
        (addr->sa_family == AF_INET || addr->sa_family == AF_INET6) &&
        syscall(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM)
        mlp_log(1, "fd %d: TCP (connected in a signal handler: memlan makes no offer there)", fd);
    errno = saved;
    return r;
}

MLP_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    MLP_INIT();
    if (mlp_inside || mlp_cfg.off)
        return mlp_real_connect(fd, addr, len);
    if (ml_unlikely(mlp_sig_in_handler()))
        return mlp_connect_in_handler(fd, addr, len);
    if (addr && len >= sizeof(sa_family_t) && addr->sa_family == AF_UNSPEC &&
        mlp_fd_is_ours(fd) && !mlp_vfork_child())
        return mlp_disconnect(fd, addr, len);
    int saved = errno;
    void *tok;
    mlp_on_connect_start(fd, addr, len, &tok);
    int r = mlp_real_connect(fd, addr, len);
    int err = r < 0 ? errno : 0;
    mlp_on_connect_done(fd, addr, len, tok, r, err);
    if (ml_unlikely(fd <= 2))
        mlp_stdio_adopt(fd, false);
    errno = r < 0 ? err : saved;
    return r;
}

/* A socket bound to a port is published before the kernel's listen: a client that connects as
 * soon as the port answers (one that polls for it, as a test harness or a supervisor does) found
 * no record in the moment between the kernel's listen and ours, and stayed on TCP.  Published
 * first, a client that finds the record and connects before the kernel listens gets the kernel's
 * ECONNREFUSED, as it would anyway.  A listen that fails takes the publication back; an unbound
 * socket (listen binds it to a port of the kernel's choosing) is published after. */
MLP_EXPORT int listen(int fd, int backlog)
{
    MLP_INIT();
    bool pre = false, refused = false;
    int saved = errno;
    if (ml_unlikely(mlp_sig_in_handler()) && !mlp_inside && !mlp_cfg.off) {
        /* listen is async-signal-safe; publishing takes the negotiation's lock and allocates,
         * which the thread the handler interrupted may hold or be doing: the kernel's alone. */
        int r = mlp_real_listen(fd, backlog);
        int err = errno;
        if (r == 0 && !mlp_fd_is_ours(fd))
            mlp_log(1, "listen fd %d: not published (it listened in a signal handler): its "
                       "clients stay on TCP", fd);
        errno = r < 0 ? err : saved;
        return r;
    }
    if (!mlp_inside && !mlp_cfg.off && !mlp_fd_is_ours(fd)) {
        refused = mlp_on_listen(fd, true) > 0;
        pre = mlp_fd_is_ours(fd);
        /* A client looks the record up, then connects: one whose look-up just missed the
         * publication and whose connect came just after the kernel's listen stayed on TCP (4 of
         * 20 in a test that retries connect without a pause).  The kernel listens 200 us after
         * the record is out, longer than a running client's look-up takes: a client would now
         * have to lose its cpu between the two.  A signal cuts the pause short.  The raw
         * system call: glibc's clock_nanosleep is a cancellation point, and listen is not. */
        if (pre) {
            struct timespec d = {0, 200000};
            (void)syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &d, NULL);
        }
    }
    errno = saved;
    int r = mlp_real_listen(fd, backlog);
    int err = errno;
    if (r < 0 && pre) {
        struct mlp_sock *s = mlp_uninstall(fd);
        if (s)
            mlp_put(s);
    } else if (r == 0 && pre) {
        mlp_on_listened(fd);
    } else if (r == 0 && !pre && !refused && !mlp_inside && !mlp_cfg.off) {
        /* (a publication refused before the kernel's listen was said once: the log said
         * "cannot publish" twice for each of proftpd's passive-mode ports) */
        mlp_on_listen(fd, false);
    }
    errno = r < 0 ? err : saved;
    return r;
}

/* Once the kernel's accept has taken a connection, the program gets it: glibc acts on no
 * cancellation after its accept returned one, and our work on it is no cancellation point
 * either (the wait for the client's offer sleeps on a futex and looks at the socket by the
 * system calls themselves, negotiate.c's mlp_peer_closed; its libc poll was one, and a thread
 * cancelled there lost the connection: a review's program got 4 of 5).  Not by turning
 * cancellation off around it: a handler's siglongjmp out of the wait left it off for good. */
static int mlp_accept_common(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    int r = mlp_real_accept4(fd, addr, len, flags);
    /* A listener received over SCM_RIGHTS is published at its first accept (negotiate.c) */
    if (r >= 0 && !mlp_inside && ml_unlikely(!mlp_fd_is_ours(fd))) {
        int saved = errno;
        mlp_accept_received(fd);
        errno = saved;
    }
    if (r >= 0 && !mlp_inside && mlp_fd_is_ours(fd)) {
        int saved = errno;
        mlp_on_accept(fd, r, flags);
        if (ml_unlikely(r <= 2))
            mlp_stdio_adopt(r, false);
        errno = saved;
    }
    return r;
}

MLP_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    MLP_INIT();
    return mlp_accept_common(fd, addr, len, 0);
}

MLP_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    MLP_INIT();
    return mlp_accept_common(fd, addr, len, flags);
}

/* ---- close and duplicates ---------------------------------------------------------------- */

/*
 * A vfork child shares our memory but has its own fd table: whatever it closes or duplicates is
 * its own, and the parent's records must stay as they are.  Detected by its pid (mlp_pid is ours,
 * kept current across fork); asked only on the slow paths, where an fd has a record.
 */
bool mlp_vfork_child(void) { return (int)__ml_sys_getpid() != mlp_pid; }

/* fd stops naming what it named (close, close_range, closefrom, the target of dup2/dup3, the
 * number a dup lands on): its record goes back to empty.  *offer: a client offer to unlink after
 * the kernel's close (NULL: now). */
static void mlp_fd_released(int fd, char *offer)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (ml_likely(!mlp_fdrec_busy(r)))
        return;
    mlp_bufhint_clear(fd);
    mlp_defer_offer_unlink = offer;
    struct mlp_sock *s = mlp_uninstall(fd);
    if (s) {
        if (atomic_load(&s->nfds) == 0) {
            mlp_epoll_sock_gone(s);
            mlp_before_last_close(s, fd);
            mlp_keep_file(s, fd);
        } else if (s->type == MLP_CONN && s->ch && s->ch->sock_fd == fd) {
            mlp_sock_fd_moved(s, fd);
        }
        mlp_put(s);
    }
    mlp_defer_offer_unlink = NULL;
    mlp_epoll_forget_fd(fd);
    mlp_stat_tcp_closed(fd);
}

/* A close's mark on rec: this thread's id.  A mark already there (another thread's close of the
 * same fd, or a close of what was opened at its number since the first close's kernel close) is
 * written over, and its waiters are woken to look again: a plain store lost their flag, and
 * neither close's end woke them (they slept for ever). */
static void mlp_close_mark(struct mlp_fdrec *rec)
{
    if (ml_unlikely(atomic_exchange(&rec->closing, mlp_thread_id()) & MLP_CLOSING_WAITERS)) {
        int saved = errno;
        (void)__ml_sys_futex_wake(&rec->closing, INT_MAX);
        errno = saved;
    }
}

/* The end of a close's mark: cleared, its waiters woken, if it is still this thread's (a later
 * close's mark over it is that close's to clear). */
static void mlp_close_unmark(void *arg)
{
    struct mlp_fdrec *rec = arg;
    uint32_t me = mlp_thread_id(), c = atomic_load(&rec->closing);
    while ((c & ~MLP_CLOSING_WAITERS) == me)
        if (atomic_compare_exchange_weak(&rec->closing, &c, 0)) {
            if (c & MLP_CLOSING_WAITERS) {
                int saved = errno;
                (void)__ml_sys_futex_wake(&rec->closing, INT_MAX);
                errno = saved;
            }
            return;
        }
}

/* close(fd) with its record: the record first, the kernel's close, then the offer's name.  A
 * connection of ours is marked closing meanwhile (fdtable.c, mlp_fd_is_ours_call): a data call
 * of another thread waits for the kernel's close instead of using the kernel socket under the
 * channel.  (A connection on TCP is its kernel socket: no mark.)  A close that never ends (a
 * cancellation, which glibc's close acts on before the kernel's; a handler's siglongjmp out of
 * the teardown's wait) clears the mark by its cleanup: it stayed, and every later data call of
 * another thread on that fd number waited for ever for a thread that had gone. */
static int mlp_close_one(int fd)
{
    int saved = errno;
    char offer[sizeof ((struct mlp_sock *)0)->offer];
    offer[0] = 0;
    /* A connection passed to us and never used: taken up, so that its close ends it as the
     * kernel's would (the peer reads the end at once, the passer's record goes); a look of
     * another thread's under way ends first, so that it installs nothing on a number closed. */
    mlp_received_look(fd);
    errno = saved;
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    struct mlp_sock *s = rec ? atomic_load(&rec->sock) : NULL;
    bool mark = s && s->type == MLP_CONN && atomic_load(&s->state) != MLP_TCP;
    struct _pthread_cleanup_buffer left;
    if (mark) {
        mlp_close_mark(rec);
        mlp_left_push(&left, mlp_close_unmark, rec);
    }
    if (s)
        mlp_epoll_fd_closing(fd); /* while fd still names the socket */
    mlp_fd_released(fd, offer);
    errno = saved;
    int r = mlp_real_close(fd);
    if (mark) {
        mlp_left_pop(&left);
        mlp_close_unmark(rec);
    }
    if (ml_unlikely(offer[0])) {
        saved = errno;
        mlp_offer_unlink_name(offer);
        errno = saved;
    }
    if (mark && !mlp_sig_in_handler())
        mlp_pass_tick(); /* keeps errno; memory only unless this process passed connections */
    return r;
}

static int mlp_close_call(int fd)
{
    MLP_INIT();
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (ml_likely(!rec) || mlp_inside)
        return mlp_real_close(fd);
    if (ml_unlikely(atomic_load_explicit(&rec->owner, memory_order_relaxed)))
        return 0; /* ours, which the program saw listed in /proc/self/fd: "closed", kept */
    if (!mlp_fdrec_busy(rec) || mlp_vfork_child())
        return mlp_real_close(fd);
    return mlp_close_one(fd);
}

MLP_EXPORT int close(int fd)
{
    return mlp_close_call(fd);
}

static void mlp_dup_to(int fd, int nfd)
{
    if (mlp_fdrec_busy(mlp_fdrec(nfd)))
        mlp_fd_released(nfd, NULL); /* left behind by a close we did not see (a raw syscall) */
    mlp_received_look(fd); /* a connection passed to us: both names are ours */
    struct mlp_sock *s = mlp_get(fd);
    if (s) {
        mlp_install(nfd, s);
        mlp_put(s);
        if (ml_unlikely(nfd <= 2))
            mlp_stdio_adopt(nfd, true);
    } else {
        mlp_epoll_dup(fd, nfd); /* an epoll fd: both name one set, as one kernel file */
    }
}

MLP_EXPORT int dup(int fd)
{
    MLP_INIT();
    if (mlp_is_internal_fd(fd) && !mlp_inside) {
        errno = EBADF;
        return -1;
    }
    int r = mlp_real_dup(fd);
    if (r >= 0 && !mlp_inside && (mlp_fdrec(fd) || mlp_fdrec(r) || mlp_vfork_noted(fd))) {
        int saved = errno;
        if (!mlp_vfork_child())
            mlp_dup_to(fd, r);
        else if (mlp_fdrec(fd) || mlp_vfork_noted(fd))
            mlp_vfork_note_dup(fd, r); /* a step of a chain toward 0, 1 or 2 (its exec) */
        errno = saved;
    }
    return r;
}

static int mlp_dup23(int fd, int fd2, int flags, bool three)
{
    if (mlp_inside)
        return three ? mlp_real_dup3(fd, fd2, flags) : mlp_real_dup2(fd, fd2);
    if (mlp_is_internal_fd(fd)) {
        errno = EBADF;
        return -1;
    }
    if (!mlp_fdrec(fd) && !mlp_fdrec(fd2) && !mlp_vfork_noted(fd))
        return three ? mlp_real_dup3(fd, fd2, flags) : mlp_real_dup2(fd, fd2);
    bool child = mlp_vfork_child();
    int saved = errno;
    if (mlp_is_internal_fd(fd2) && fd != fd2 && !child)
        (void)mlp_evict_fd(fd2);
    if (fd != fd2 && !child && mlp_fdrec(fd2)) {
        mlp_received_look(fd2); /* a connection passed to us closed unused: as close() */
        mlp_keep_file_early(fd2); /* the real call closes fd2 before its record can go */
        mlp_epoll_fd_closing(fd2);
    }
    errno = saved;
    int r = three ? mlp_real_dup3(fd, fd2, flags) : mlp_real_dup2(fd, fd2);
    if (r >= 0 && fd != fd2 && child && (mlp_fdrec(fd) || mlp_vfork_noted(fd))) {
        saved = errno;
        mlp_vfork_note_dup(fd, fd2); /* for its exec: the table is the parent's */
        errno = saved;
    }
    if (r >= 0 && fd != fd2 && !child) {
        saved = errno;
        mlp_fd_released(fd2, NULL);
        mlp_dup_to(fd, fd2);
        errno = saved;
    }
    return r;
}

MLP_EXPORT int dup2(int fd, int fd2)
{
    MLP_INIT();
    return mlp_dup23(fd, fd2, 0, false);
}

MLP_EXPORT int dup3(int fd, int fd2, int flags)
{
    MLP_INIT();
    return mlp_dup23(fd, fd2, flags, true);
}

/*
 * close_range and closefrom.  The kernel would close our own fds in the range too (varnishd
 * calls close_range(3, ~0U, 0) first thing, and memlan's log and fabric went with it): the range
 * is closed in pieces around them, and every fd in it with a record is closed through its record
 * first, as close() would.  CLOSE_RANGE_CLOEXEC marks the pieces, and a socket's channel file
 * follows its socket's flag (records stay: the fds stay open); CLOSE_RANGE_UNSHARE is done by a
 * probe before anything else (below).  Bounded: one pass over the chunks of the table that
 * exist.
 */
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

static int mlp_sys_close_range(unsigned first, unsigned last, int flags)
{
    /* Not through syscall(), which is interposed below: the instruction itself. */
    long r = __ml_sys_raw(SYS_close_range, first, last, flags, 0, 0, 0);
    if (r < 0) {
        errno = (int)-r;
        return -1;
    }
    return (int)r;
}

static int mlp_close_range_call(unsigned first, unsigned last, int flags)
{
    MLP_INIT();
    if (mlp_inside || first > last || (flags & ~(CLOSE_RANGE_CLOEXEC | CLOSE_RANGE_UNSHARE)))
        return mlp_sys_close_range(first, last, flags); /* the kernel's answer, errors too */
    /* The kernel's verdict first, before anything of ours changes: a call it refuses (a seccomp
     * filter's EPERM or ENOSYS, a kernel before 5.9) must leave every fd and every record as
     * they were.  The probe closes nothing (fd ~0U cannot be open) and is judged by the same
     * syscall with the same flags; with CLOSE_RANGE_UNSHARE it unshares the fd table, all of it,
     * as the real call would before closing, so that what we close below, one fd at a time and
     * in pieces, is closed in the unshared table alone, as the kernel's call would have. */
    int saved = errno;
    if (mlp_sys_close_range(~0U, ~0U, flags) < 0)
        return -1; /* errno: the kernel's */
    errno = saved;
    bool child = mlp_vfork_child();
    int max = first > (unsigned)INT32_MAX ? -1 : (int)(last > (unsigned)INT32_MAX ? INT32_MAX : last);
    unsigned lo = first;
    int rc = 0;
    /* Pieces between our own fds. */
    for (int fd = mlp_fdrec_next((int)first, max); fd >= 0; fd = mlp_fdrec_next(fd + 1, max)) {
        struct mlp_fdrec *rec = mlp_fdrec(fd);
        if (!mlp_fdrec_busy(rec))
            continue;
        if (atomic_load_explicit(&rec->owner, memory_order_relaxed)) {
            if ((unsigned)fd > lo && mlp_sys_close_range(lo, (unsigned)fd - 1, flags) < 0)
                rc = -1;
            lo = (unsigned)fd + 1;
            continue;
        }
        if (child)
            continue; /* the parent's records: its fds are still open */
        if (flags & CLOSE_RANGE_CLOEXEC) {
            /* Only marked: the fd stays open, and so does its record. */
            struct mlp_sock *s = mlp_get(fd);
            if (s) {
                if (s->ch)
                    mlp_own_fd_cloexec(s->ch->seg->fd, true);
                mlp_put(s);
            }
        } else {
            /* The record, then the kernel's close, as close(): what an undecided or withdrawn
             * socket still owes its peer goes out over TCP while the fd is open. */
            (void)mlp_close_one(fd);
        }
        /* CLOSE_RANGE_UNSHARE alone: the records go after the kernel's close (below), which
         * closes in a table of the calling thread's own once there are other threads: their
         * calls in progress keep the file in theirs, so no keep-alive duplicate is needed (one
         * taken here would be copied into both tables, and one copy never closed). */
    }
    if (lo >= first && lo <= last && mlp_sys_close_range(lo, last, flags) < 0)
        rc = -1;
    if (rc == 0)
        errno = saved;
    return rc;
}

MLP_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    return mlp_close_range_call(first, last, flags);
}

/* ---- network namespaces: the rendezvous names carry ours, read again after a move ---- */

/* chroot: a process that chroots before its first connect would find no fabric by its path
 * afterwards; opened now, it is used through its descriptor (negotiate.c).  Not in a handler or
 * a vfork child (whose state is its parent's), and the call itself is always the C library's. */
MLP_EXPORT int chroot(const char *path)
{
    MLP_INIT();
    if (!mlp_inside && !mlp_cfg.off && !mlp_sig_in_handler() && !mlp_vfork_child()) {
        int saved = errno;
        mlp_fabric_preopen();
        errno = saved;
    }
    return mlp_real_chroot ? mlp_real_chroot(path) : (errno = ENOSYS, -1);
}

MLP_EXPORT int unshare(int flags)
{
    MLP_INIT();
    int r = mlp_real_unshare(flags);
    if (r == 0 && (flags & CLONE_NEWNET)) {
        int saved = errno;
        mlp_netns_refresh();
        errno = saved;
    }
    return r;
}

MLP_EXPORT int setns(int fd, int nstype)
{
    MLP_INIT();
    int r = mlp_real_setns(fd, nstype);
    if (r == 0 && (nstype == 0 || (nstype & CLONE_NEWNET))) {
        int saved = errno;
        mlp_netns_refresh();
        errno = saved;
    }
    return r;
}

/* ---- resource limits: only noted (RLIMIT_FSIZE and memlan's log, init.c) ---- */

static void mlp_rlimit_note(pid_t pid, int res, rlim_t cur)
{
    if (pid == 0 || pid == mlp_pid) {
        struct rlimit rl = {.rlim_cur = cur, .rlim_max = cur};
        mlp_rlimit_changing(res, &rl);
    }
}

/* After the call: RLIMIT_NOFILE's new soft limit, where the kernel took it (pqueue.c,
 * mlp_sleep_efds).  A vfork child's limit, its own, lands in our memory too: only a share of
 * eventfds off, where asking whether we are one (getpid) is a system call a filter installed
 * before the setrlimit may kill for (review).  r is the call's result; errno is left as the call
 * left it. */
static int mlp_rlimit_took(int r, pid_t pid, int res, unsigned long long cur)
{
    if (r == 0 && res == RLIMIT_NOFILE && (pid == 0 || pid == mlp_pid))
        mlp_nofile_note(cur);
    return r;
}

MLP_EXPORT int setrlimit(__rlimit_resource_t res, const struct rlimit *rl)
{
    MLP_INIT();
    const struct rlimit *volatile p = rl; /* declared nonnull, but a NULL must be EFAULT, not a crash */
    if (p)
        mlp_rlimit_note(0, (int)res, p->rlim_cur);
    int r = mlp_real_setrlimit(res, rl);
    return p ? mlp_rlimit_took(r, 0, (int)res, (unsigned long long)p->rlim_cur) : r;
}

MLP_EXPORT int setrlimit64(__rlimit_resource_t res, const struct rlimit64 *rl)
{
    MLP_INIT();
    const struct rlimit64 *volatile p = rl;
    if (p)
        mlp_rlimit_note(0, (int)res, (rlim_t)p->rlim_cur);
    int r = mlp_real_setrlimit64(res, rl);
    return p ? mlp_rlimit_took(r, 0, (int)res, (unsigned long long)p->rlim_cur) : r;
}

MLP_EXPORT int prlimit(pid_t pid, enum __rlimit_resource res, const struct rlimit *nl,
                       struct rlimit *ol)
{
    MLP_INIT();
    if (nl)
        mlp_rlimit_note(pid, (int)res, nl->rlim_cur);
    int r = mlp_real_prlimit(pid, res, nl, ol);
    return nl ? mlp_rlimit_took(r, pid, (int)res, (unsigned long long)nl->rlim_cur) : r;
}

MLP_EXPORT int prlimit64(pid_t pid, enum __rlimit_resource res, const struct rlimit64 *nl,
                         struct rlimit64 *ol)
{
    MLP_INIT();
    if (nl)
        mlp_rlimit_note(pid, (int)res, (rlim_t)nl->rlim_cur);
    int r = mlp_real_prlimit64(pid, res, nl, ol);
    return nl ? mlp_rlimit_took(r, pid, (int)res, (unsigned long long)nl->rlim_cur) : r;
}

MLP_EXPORT void closefrom(int lowfd)
{
    MLP_INIT();
    unsigned lo = lowfd < 0 ? 0u : (unsigned)lowfd;
    int saved = errno;
    if (mlp_close_range_call(lo, ~0U, 0) == 0) {
        errno = saved;
        return;
    }
    /* A kernel before 5.9 (ENOSYS), or a sandbox that refuses close_range (EPERM): glibc then
     * closes fd by fd, and so must we, or every fd of the host stays open across the exec that
     * usually follows.  One close per fd up to the limit (glibc walks /proc/self/fd). */
    struct rlimit rl;
    long top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (long)rl.rlim_cur : (1L << 20);
    for (long fd = lo; fd < top; fd++)
        if (!mlp_is_internal_fd((int)fd))
            (void)mlp_close_call((int)fd);
    errno = saved;
}

#if ML_SYS_RAW
/*
 * syscall(): libuv (Node.js) closes every fd by syscall(SYS_close, fd).  Unseen, the close left
 * the fd's record, and the next socket, pipe or file the kernel gave that number was taken for
 * the old connection (a connect that "succeeded" unconnected, a pipe's write that raised SIGPIPE:
 * tests/preload/rawclose.c).  SYS_close and SYS_close_range take the paths of close() and
 * close_range(); SYS_io_uring_setup is refused (below); every other number goes to libc's
 * syscall() unchanged (or, before start-up has found it, to the kernel).  memlan's own closes
 * never come here (__ml_sys_raw).
 */
#ifdef SYS_io_uring_setup
/*
 * io_uring_setup is refused with ENOSYS while memlan is on, as a kernel without io_uring or
 * Docker's default seccomp profile (EPERM there) refuses it: the operations an io_uring carries
 * (epoll_ctl, recv, send, poll on a socket) never reach our interposers, and on an accelerated
 * socket they act on the idle kernel socket.  libuv 1.45 and later (uvloop, Node.js's own
 * builds) adds every socket to its epoll set through an io_uring (IORING_OP_EPOLL_CTL) when it
 * can: the set never heard of the accelerated socket, and uvloop's server and client under
 * memlan hung at their first message (tests/preload/uringctl.c); refused, libuv calls
 * epoll_ctl, as it does on such kernels.  Only what goes through libc's syscall() can be seen:
 * liburing makes its own system calls (design.md, "Not supported").  Logged once per process.
 */
static _Atomic bool mlp_uring_told;

static long mlp_uring_refuse(void)
{
    MLP_INIT();
    if (mlp_cfg.off)
        return 1;
    if (!atomic_exchange(&mlp_uring_told, true))
        mlp_log(1, "io_uring_setup refused (ENOSYS): memlan cannot see what an io_uring does on "
                   "its sockets (libuv then calls epoll_ctl itself)");
    errno = ENOSYS;
    return -1;
}
#endif

#ifdef SYS_clone3
/* clone3 as a fork (LXC makes its children so, for CLONE_INTO_CGROUP and CLONE_PIDFD): the
 * arguments readable (at least the first version's 64 bytes, read through the kernel, so that a
 * bad pointer stays the kernel's EFAULT to give and never our fault; not in a known sandbox,
 * which may kill for that read), no stack of its own, and none of the flags that share our
 * memory, files or signal handlers. */
static bool mlp_clone3_forks(long a, long size)
{
    if (a == 0 || size < (long)sizeof(struct mlp_clone_args) || size > 4096 ||
        mlp_known_confined())
        return false;
    struct mlp_clone_args ca;
    struct iovec l = {&ca, sizeof ca}, r = {(void *)a, sizeof ca};
    if (__ml_sys_raw(SYS_process_vm_readv, __ml_sys_getpid(), (long)&l, 1, (long)&r, 1, 0) !=
        (long)sizeof ca)
        return false;
    return ca.stack == 0 && ca.stack_size == 0 &&
           !(ca.flags & (CLONE_VM | CLONE_VFORK | CLONE_THREAD | CLONE_FILES | CLONE_SIGHAND |
                         CLONE_SETTLS));
}
#endif

MLP_EXPORT long syscall(long n, ...)
{
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (n == SYS_close)
        return mlp_close_call((int)a);
    if (n == SYS_close_range)
        return mlp_close_range_call((unsigned)a, (unsigned)b, (int)c);
#ifdef SYS_io_uring_setup
    if (n == SYS_io_uring_setup && !mlp_inside && mlp_uring_refuse() < 0)
        return -1;
#endif
    if (ml_unlikely(mlp_cred_nr(n)))
        return mlp_cred_syscall(n, a, b, c); /* (cred.c: samba changes its euid so) */
    long (*real)(long, long, long, long, long, long, long) = mlp_real_syscall;
    long r;
    /* A new process without fork's handlers (vsftpd's sessions): see mlp_raw_fork.  A clone
     * with a stack of its own (b) or that shares our memory, fd table or signal handlers is
     * not a fork; s390's clone takes its arguments in another order. */
#if !defined(__s390__) && !defined(__s390x__)
    if (ml_unlikely(((n == SYS_clone && b == 0 &&
                      !(a & (CLONE_VM | CLONE_VFORK | CLONE_THREAD | CLONE_FILES |
                             CLONE_SIGHAND | CLONE_SETTLS))) ||
#ifdef SYS_fork
                     n == SYS_fork ||
#endif
#ifdef SYS_clone3
                     (n == SYS_clone3 && mlp_clone3_forks(a, b)) ||
#endif
                     false) &&
                    real != NULL))
        return mlp_raw_fork(real, n, a, b, c, d, e, f);
#endif
    if (ml_likely(real != NULL)) {
        r = real(n, a, b, c, d, e, f);
    } else {
        r = __ml_sys_raw(n, a, b, c, d, e, f);
        if (r < 0 && r > -4096) {
            errno = (int)-r;
            r = -1;
        }
    }
    if (ml_unlikely(r == 0 && (n == SYS_seccomp || (n == SYS_prctl && a == PR_SET_SECCOMP))))
        mlp_note_confined(); /* libseccomp installs its filters so */
    return r;
}
#endif

/* prctl: a seccomp filter installed (PR_SET_SECCOMP) is noted, so that memlan makes no call of
 * its own there that it can avoid (negotiate.c, mlp_confined). */
MLP_EXPORT int prctl(int option, ...)
{
    va_list ap;
    va_start(ap, option);
    unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
    unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
    va_end(ap);
    int r;
    if (ml_likely(mlp_real_prctl != NULL)) {
        r = mlp_real_prctl(option, a2, a3, a4, a5);
    } else {
        long k = __ml_sys_raw(SYS_prctl, option, (long)a2, (long)a3, (long)a4, (long)a5, 0);
        r = k < 0 && k > -4096 ? (errno = (int)-k, -1) : (int)k;
    }
    if (r == 0 && option == PR_SET_SECCOMP)
        mlp_note_confined();
    return r;
}

static int mlp_fcntl_common(int (*real)(int, int, long), int fd, int cmd, long arg)
{
    if (mlp_inside)
        return real(fd, cmd, arg);
    if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && mlp_is_internal_fd(fd)) {
        errno = EBADF;
        return -1;
    }
    int r = real(fd, cmd, arg);
    if (r < 0)
        return r;
    int saved = errno;
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
        if ((mlp_fdrec(fd) || mlp_fdrec(r)) && !mlp_vfork_child())
            mlp_dup_to(fd, r);
        else if ((mlp_fdrec(fd) || mlp_vfork_noted(fd)) && mlp_vfork_child())
            mlp_vfork_note_dup(fd, r); /* a step of a chain toward 0, 1 or 2 (its exec) */
    } else if (cmd == F_SETOWN || cmd == F_SETOWN_EX || cmd == F_SETSIG) {
        struct mlp_sock *s = mlp_conn(fd);
        if (s) { /* the signal O_ASYNC raises goes where the socket's would (mlp_async) */
            mlp_sio_owner(s, fd);
            mlp_put(s);
        }
    } else if (cmd == F_SETFL || cmd == F_SETFD) {
        struct mlp_sock *s = mlp_conn(fd);
        if (s) {
            if (cmd == F_SETFL && s->me)
                mlp_set_nonblock(s, (arg & O_NONBLOCK) != 0);
            if (cmd == F_SETFL)
                mlp_async(s, fd, (arg & O_ASYNC) != 0);
            if (cmd == F_SETFD && s->ch)
                mlp_own_fd_cloexec(s->ch->seg->fd, (arg & FD_CLOEXEC) != 0);
            mlp_put(s);
        }
    }
    errno = saved;
    return r;
}

MLP_EXPORT int fcntl(int fd, int cmd, ...)
{
    MLP_INIT();
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return mlp_fcntl_common(mlp_real_fcntl, fd, cmd, arg);
}

MLP_EXPORT int fcntl64(int fd, int cmd, ...)
{
    MLP_INIT();
    va_list ap;
    va_start(ap, cmd);
    long arg = va_arg(ap, long);
    va_end(ap);
    return mlp_fcntl_common(mlp_real_fcntl64 ? mlp_real_fcntl64 : mlp_real_fcntl, fd, cmd, arg);
}

MLP_EXPORT int ioctl(int fd, unsigned long req, ...)
{
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    struct mlp_sock *s = mlp_conn(fd);
    if (!s)
        return mlp_real_ioctl(fd, req, arg);
    bool handled;
    int r = mlp_ioctl(s, fd, req, arg, &handled);
    if (handled) {
        mlp_put(s);
        return (int)mlp_ret(r);
    }
    r = mlp_real_ioctl(fd, req, arg);
    if (r == 0 && req == FIOASYNC) { /* the kernel read it: a valid int */
        int saved = errno;
        mlp_async(s, fd, *(const int *)arg != 0);
        errno = saved;
    }
    /* A connection settled on TCP keeps our copy of O_NONBLOCK too: what its ring still held at
     * the fall goes out at its next call, blocking or not as the program asked last (Python's
     * setblocking is this ioctl: a send after setblocking(False) blocked for ever on the stale
     * copy, and a blocking sendall said EAGAIN: a review). */
    if (r == 0 && req == FIONBIO)
        mlp_set_nonblock(s, *(const int *)arg != 0);
    if (r == 0 && (req == FIOSETOWN || req == SIOCSPGRP)) { /* F_SETOWN's ioctls */
        int saved = errno;
        mlp_sio_owner(s, fd);
        errno = saved;
    }
    mlp_put(s);
    return r;
}

/* ---- data -------------------------------------------------------------------------------- */

static ssize_t mlp_read_call(int fd, void *buf, size_t len)
{
    struct iovec v = {buf, len};
    ssize_t f = mlp_fast_rx(fd, &v, 1, 0);
    if (ml_likely(f == MLP_PASS))
        return mlp_real_read(fd, buf, len);
    if (f != MLP_SLOW)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_read(fd, buf, len);
    /* A read of nothing is 0 at once on a socket, whatever it waits for (sock_read_iter): an
     * undecided one's waited for the decision, and one on TCP blocked in recvmsg (a review). */
    ssize_t r = len ? mlp_recv(s, fd, &v, 1, 0) : 0;
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
    return mlp_read_call(fd, buf, len);
}

static ssize_t mlp_write_call(int fd, const void *buf, size_t len)
{
    struct iovec v = {(void *)buf, len};
    ssize_t f = mlp_fast_tx(fd, &v, 1, 0);
    if (ml_likely(f == MLP_PASS))
        return mlp_real_write(fd, buf, len);
    if (f != MLP_SLOW)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_write(fd, buf, len);
    ssize_t r = mlp_send(s, fd, &v, 1, 0);
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    return mlp_write_call(fd, buf, len);
}

MLP_EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
    ssize_t f = n < 0 || n > IOV_MAX ? MLP_SLOW : mlp_fast_rx(fd, iov, n, 0);
    if (f != MLP_SLOW && f != MLP_PASS)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_readv(fd, iov, n);
    ssize_t r = n < 0 || n > IOV_MAX ? -EINVAL : mlp_readv(s, fd, iov, n);
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
    ssize_t f = n < 0 || n > IOV_MAX ? MLP_SLOW : mlp_fast_tx(fd, iov, n, 0);
    if (f != MLP_SLOW && f != MLP_PASS)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_writev(fd, iov, n);
    ssize_t r = n < 0 || n > IOV_MAX ? -EINVAL : mlp_send(s, fd, iov, n, 0);
    mlp_call_end(&c);
    return mlp_ret(r);
}

static ssize_t mlp_recv_call(int fd, void *buf, size_t len, int flags)
{
    struct iovec v = {buf, len};
    ssize_t f = mlp_fast_rx(fd, &v, 1, flags);
    if (ml_likely(f == MLP_PASS))
        return mlp_real_recv(fd, buf, len, flags);
    if (f != MLP_SLOW)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_recv(fd, buf, len, flags);
    ssize_t r = mlp_recv(s, fd, &v, 1, flags);
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    return mlp_recv_call(fd, buf, len, flags);
}

static ssize_t mlp_fastopen(int fd, const struct sockaddr *addr, socklen_t alen,
                            const struct msghdr *msg, int flags, bool *done);

MLP_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    if (ml_unlikely(flags & MSG_FASTOPEN)) { /* no address: the kernel's answer on ours too */
        MLP_INIT();
        struct iovec fv = {(void *)buf, len};
        struct msghdr m = {.msg_iov = &fv, .msg_iovlen = 1};
        bool done;
        ssize_t r = mlp_fastopen(fd, NULL, 0, &m, flags & ~MSG_FASTOPEN, &done);
        if (done)
            return r;
    }
    struct iovec v = {(void *)buf, len};
    ssize_t f = mlp_fast_tx(fd, &v, 1, flags);
    if (ml_likely(f == MLP_PASS))
        return mlp_real_send(fd, buf, len, flags);
    if (f != MLP_SLOW)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_send(fd, buf, len, flags);
    ssize_t r = mlp_send(s, fd, &v, 1, flags);
    mlp_call_end(&c);
    return mlp_ret(r);
}

static ssize_t mlp_recvfrom_call(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
                            socklen_t *alen)
{
    struct iovec v = {buf, len};
    ssize_t f = mlp_fast_rx(fd, &v, 1, flags);
    if (ml_likely(f == MLP_PASS))
        return mlp_real_recvfrom(fd, buf, len, flags, addr, alen);
    if (f != MLP_SLOW) {
        if (f >= 0 && addr && alen)
            *alen = 0; /* a connected TCP socket reports no source address */
        return f; /* -1 with errno: a blocking receive's spin ended by a handler (EINTR) */
    }
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_recvfrom(fd, buf, len, flags, addr, alen);
    ssize_t r = mlp_recv(s, fd, &v, 1, flags);
    if (r >= 0 && addr && alen && s->state != MLP_TCP)
        *alen = 0; /* a connected TCP socket reports no source address */
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
                            socklen_t *alen)
{
    return mlp_recvfrom_call(fd, buf, len, flags, addr, alen);
}

/*
 * TCP Fast Open's implicit connect: sendto or sendmsg with MSG_FASTOPEN and an address on a TCP
 * socket not yet connected (unbound's upstream queries with tcp-upstream, as Debian builds it;
 * curl --tcp-fastopen) connects and sends in one call.  The kernel made that connection without
 * us: plain TCP, said nowhere, and the server read "the client is not memlan (no offer)".  Now
 * it is our connect, then the send, as the kernel does it when it has no cookie for the server
 * (its first connection to it): a blocking socket connects and then sends everything; a
 * non-blocking one answers EINPROGRESS with nothing sent, and the program sends again once the
 * socket is writable (as every TFO client must).  A connect that fails gives its errno, as the
 * kernel's TFO connect does.  Anything else (connected already, not TCP, AF_UNSPEC, a handler,
 * a vfork child): the kernel's call.  *done is false where the caller makes the kernel's call.
 */
/* Does the kernel make TFO connects (net.ipv4.tcp_fastopen's client bit, 1, Linux's default)?
 * Read once; unreadable: the default.  Where it does not, its call answers EOPNOTSUPP, and so
 * do we (the kernel's call). */
static bool mlp_tfo_client(void)
{
    static _Atomic int known = -1;
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        char b[16] = {0};
        long f = __ml_sys_open(AT_FDCWD, "/proc/sys/net/ipv4/tcp_fastopen", O_RDONLY, 0);
        v = 1;
        if (f >= 0) {
            if (__ml_sys_read((int)f, b, sizeof b - 1) > 0)
                v = (int)(strtol(b, NULL, 0) & 1);
            __ml_sys_close((int)f);
        }
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v == 1;
}

static ssize_t mlp_fastopen(int fd, const struct sockaddr *addr, socklen_t alen,
                            const struct msghdr *msg, int flags, bool *done)
{
    *done = false;
    if (mlp_inside || mlp_cfg.off || mlp_sig_in_handler() || mlp_vfork_child())
        return 0;
    int saved = errno;
    if (!addr) {
        /* MSG_FASTOPEN without an address: on a connected socket the kernel refuses it (its
         * implicit connect finds the socket connected); on ours it must too, not send the bytes
         * through the channel.  Asked of the kernel's socket with nothing to send. */
        if (mlp_fd_is_ours(fd) &&
            mlp_real_sendto(fd, "", 0, MSG_FASTOPEN | MSG_DONTWAIT | MSG_NOSIGNAL, NULL, 0) < 0) {
            *done = true;
            return -1;
        }
        errno = saved;
        return 0;
    }
    if (alen < sizeof(struct sockaddr_in) ||
        (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) || !mlp_tfo_client())
        return 0;
    int type = 0, proto = 0;
    socklen_t tl = sizeof type, pl = sizeof proto;
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_STREAM ||
        mlp_real_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) < 0 ||
        proto != IPPROTO_TCP) {
        errno = saved;
        return 0;
    }
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) == 0 || errno != ENOTCONN) {
        /* Connected: on our connection the kernel's socket says what the kernel would (EISCONN
         * after connect(); a socket its own TFO connect left connecting takes the data), asked
         * with nothing to send; then the data goes our way. */
        if (mlp_fd_is_ours(fd) &&
            mlp_real_sendto(fd, "", 0, MSG_FASTOPEN | MSG_DONTWAIT | MSG_NOSIGNAL, addr, alen) < 0) {
            *done = true;
            return -1;
        }
        errno = saved;
        return 0;
    }
    errno = saved;
    *done = true;
    /* MSG_DONTWAIT makes the kernel's implicit connect non-blocking (EINPROGRESS) on a blocking
     * socket too: ours is made so for the connect, then given its mode back through our fcntl,
     * so that the connection's own idea of its mode follows. */
    int fl = (flags & MSG_DONTWAIT) ? mlp_real_fcntl(fd, F_GETFL, 0) : -1;
    bool temp_nb = fl >= 0 && !(fl & O_NONBLOCK) &&
                   mlp_real_fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
    int cr = connect(fd, addr, alen);
    if (temp_nb) {
        int ce = errno;
        (void)fcntl(fd, F_SETFL, fl);
        errno = ce;
    }
    if (cr < 0)
        return -1; /* EINPROGRESS (non-blocking: nothing sent, as without a cookie), or its error */
    struct msghdr m = *msg;
    m.msg_name = NULL;
    m.msg_namelen = 0;
    m.msg_control = NULL; /* TCP takes no control messages on this path */
    m.msg_controllen = 0;
    return sendmsg(fd, &m, flags);
}

MLP_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags,
                          const struct sockaddr *addr, socklen_t alen)
{
    if (ml_unlikely(flags & MSG_FASTOPEN)) {
        MLP_INIT();
        struct iovec fv = {(void *)buf, len};
        struct msghdr m = {.msg_iov = &fv, .msg_iovlen = 1};
        bool done;
        ssize_t r = mlp_fastopen(fd, addr, alen, &m, flags & ~MSG_FASTOPEN, &done);
        if (done)
            return r;
    }
    struct iovec v = {(void *)buf, len};
    ssize_t f = mlp_fast_tx(fd, &v, 1, flags);
    if (ml_likely(f == MLP_PASS))
        return mlp_real_sendto(fd, buf, len, flags, addr, alen);
    if (f != MLP_SLOW)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_sendto(fd, buf, len, flags, addr, alen);
    ssize_t r = mlp_send(s, fd, &v, 1, flags); /* TCP ignores the address */
    mlp_call_end(&c);
    return mlp_ret(r);
}

/* A kernel recvmsg's control messages: descriptors passed with SCM_RIGHTS are marked, memory
 * only (negotiate.c, mlp_mark_received); a listener among them is published at its first accept.
 * Not in a vfork child, whose records are its parent's.  errno as the call left it. */
static inline void mlp_after_recvmsg(const struct msghdr *msg)
{
    if (ml_unlikely(msg->msg_controllen > 0) && !mlp_inside && !mlp_vfork_child()) {
        int saved = errno;
        mlp_mark_received(msg);
        errno = saved;
    }
}

MLP_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    ssize_t f = mlp_fast_msg(fd, msg, flags, false);
    if (f != MLP_SLOW && f != MLP_PASS) {
        if (f >= 0) {
            msg->msg_namelen = 0; /* on a channel: no name, no control message, no flag */
            msg->msg_controllen = 0;
            msg->msg_flags = 0;
        }
        return f; /* -1 with errno: see mlp_recvfrom_call */
    }
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s)) {
        ssize_t r = mlp_real_recvmsg(fd, msg, flags);
        if (r >= 0)
            mlp_after_recvmsg(msg);
        return r;
    }
    ssize_t r = mlp_recvmsg(s, fd, msg, flags);
    mlp_call_end(&c);
    return mlp_ret(r);
}

/* n bytes of the program's memory at p, copied without a fault: the kernel says EFAULT for memory
 * the program may not read, as its sendmsg would (the kernel's call comes after ours). */
static bool mlp_copy_in(void *buf, const void *p, size_t n)
{
    struct iovec l = {buf, n}, r = {(void *)p, n};
    return __ml_sys_raw(SYS_process_vm_readv, atomic_load(&mlp_pid), (long)&l, 1, (long)&r, 1, 0) ==
           (long)n;
}

/*
 * sendmsg's descriptors passed with SCM_RIGHTS (negotiate.c, "Passing a connection"): an
 * accelerated connection among them is left to the receiver before the kernel's call, which may
 * hand it over at once; a connection passed to us and passed on unused is taken up first
 * (negotiate.c, mlp_pass_prepare_fd).  Looked at only in a process that set up a channel
 * (mlp_had_accel) or holds a received descriptor not looked at yet (mlp_received_pending), and
 * through a copy: the program's header and control buffer are the kernel's to check (EFAULT), not
 * ours to fault on.  Not in a handler of ours; a vfork child is told there, by a system call,
 * only once a connection of ours is found among the descriptors: a sandboxed passer of other
 * descriptors (vsftpd's broker passes its PASV data connections, and its seccomp filter kills for
 * getpid) meets no system call of ours beyond the copy (tests/preload/sandboxpass.c).
 */
struct mlp_sendmsg_pass {
    void *made;
    bool look;      /* the message may pass descriptors: look again after the kernel's call */
    int carries;    /* the socket passes descriptors (a unix one): -1 not asked yet */
};

static inline void mlp_before_sendmsg(int fd, const struct msghdr *msg, struct mlp_sendmsg_pass *p)
{
    p->made = NULL;
    p->look = false;
    p->carries = -1;
    if ((ml_likely(!atomic_load_explicit(&mlp_had_accel, memory_order_relaxed)) &&
         ml_likely(!mlp_received_pending())) || !msg || mlp_inside || mlp_sig_in_handler())
        return;
    if (mlp_known_confined()) { /* no bridge, no copy: looked at after the kernel's call */
        p->look = true;
        return;
    }
    struct msghdr h;
    _Alignas(struct cmsghdr) char ctl[2048];
    if (!mlp_copy_in(&h, msg, sizeof h) || !h.msg_control || h.msg_controllen < sizeof(struct cmsghdr))
        return;
    p->look = true;
    h.msg_controllen = h.msg_controllen < sizeof ctl ? h.msg_controllen : sizeof ctl;
    if (!mlp_copy_in(ctl, h.msg_control, h.msg_controllen))
        return;
    h.msg_control = ctl;
    p->made = mlp_pass_prepare(&h, fd, &p->carries);
}

/* After the kernel's call: r its result.  A message it took passed its descriptors. */
static inline void mlp_after_sendmsg(int fd, const struct msghdr *msg, struct mlp_sendmsg_pass *p,
                                     bool ok)
{
    if (ml_likely(!p->look))
        return;
    mlp_pass_finish(msg, p->made, ok, fd, &p->carries);
}

MLP_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    if (ml_unlikely(flags & MSG_FASTOPEN) && msg) {
        MLP_INIT();
        bool done;
        ssize_t r = mlp_fastopen(fd, msg->msg_name, msg->msg_namelen, msg, flags & ~MSG_FASTOPEN,
                                 &done);
        if (done)
            return r;
    }
    ssize_t f = mlp_fast_msg(fd, (struct msghdr *)msg, flags, true);
    if (f != MLP_SLOW && f != MLP_PASS)
        return f;
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s)) {
        struct mlp_sendmsg_pass p;
        mlp_before_sendmsg(fd, msg, &p);
        ssize_t r = mlp_real_sendmsg(fd, msg, flags);
        if (ml_unlikely(p.look)) {
            int saved = errno;
            mlp_after_sendmsg(fd, msg, &p, r >= 0);
            errno = saved;
        }
        return r;
    }
    ssize_t r = mlp_sendmsg(s, fd, msg, flags);
    mlp_call_end(&c);
    return mlp_ret(r);
}

/* ---- several messages per call: on a stream socket, one recvmsg/sendmsg each, as the kernel
 * loops (___sys_recvmsg per entry, MSG_WAITFORONE turning on MSG_DONTWAIT after the first, the
 * timeout looked at only between entries, the count returned once one entry moved) ---- */

MLP_EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags,
                        struct timespec *tmo)
{
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s)) {
        int r = mlp_real_recvmmsg(fd, v, n, flags, tmo);
        for (int i = 0; i < r; i++)
            mlp_after_recvmsg(&v[i].msg_hdr);
        return r;
    }
    if (n > 1024) /* UIO_MAXIOV, as the kernel caps vlen */
        n = 1024;
    uint64_t end = 0;
    if (tmo) {
        if (tmo->tv_sec < 0 || tmo->tv_nsec < 0 || tmo->tv_nsec >= 1000000000) {
            mlp_call_end(&c);
            errno = EINVAL;
            return -1;
        }
        end = mlp_now_ns() + (uint64_t)tmo->tv_sec * 1000000000u + (uint64_t)tmo->tv_nsec;
    }
    int f = flags & ~MSG_WAITFORONE;
    unsigned got = 0;
    ssize_t r = 0;
    while (got < n) {
        r = mlp_recvmsg(s, fd, &v[got].msg_hdr, f);
        if (r < 0)
            break;
        v[got++].msg_len = (unsigned)r;
        if (flags & MSG_WAITFORONE)
            f |= MSG_DONTWAIT;
        if (tmo) {
            uint64_t now = mlp_now_ns();
            uint64_t left = now < end ? end - now : 0;
            tmo->tv_sec = (time_t)(left / 1000000000u);
            tmo->tv_nsec = (long)(left % 1000000000u);
            if (!left)
                break;
        }
        if (r == 0)
            break; /* end of stream: the kernel's next entry would read 0 again; it stops */
    }
    mlp_call_end(&c);
    if (got)
        return (int)got;
    return (int)mlp_ret(r);
}

MLP_EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s)) {
        /* Each message's passes made before the call (at most the kernel's 1024); those after
         * the count it returns were not sent, and are undone. */
        unsigned m = n > 1024 ? 1024 : n, k = 0;
        struct mlp_sendmsg_pass one[4], *p = one;
        if ((ml_unlikely(atomic_load_explicit(&mlp_had_accel, memory_order_relaxed)) ||
             ml_unlikely(mlp_received_pending())) && v && m) {
            p = m <= 4 ? one : calloc(m, sizeof *p);
            if (!p)
                p = one, m = 0; /* out of memory: none left to the receivers */
            for (k = 0; k < m; k++)
                mlp_before_sendmsg(fd, &v[k].msg_hdr, &p[k]);
        }
        int r = mlp_real_sendmmsg(fd, v, n, flags);
        if (k) {
            int saved = errno;
            for (unsigned i = 0; i < k; i++)
                mlp_after_sendmsg(fd, &v[i].msg_hdr, &p[i], r > 0 && i < (unsigned)r);
            if (p != one)
                __ml_free(p);
            errno = saved;
        }
        return r;
    }
    if (n > 1024)
        n = 1024;
    unsigned sent = 0;
    ssize_t r = 0;
    while (sent < n) {
        const struct msghdr *m = &v[sent].msg_hdr;
        r = mlp_sendmsg(s, fd, m, flags);
        if (r < 0)
            break;
        v[sent++].msg_len = (unsigned)r;
    }
    mlp_call_end(&c);
    if (sent)
        return (int)sent;
    return (int)mlp_ret(r);
}

/* preadv2/pwritev2 with offset -1 are readv/writev with flags (RWF_*): on a socket that is
 * the only form the kernel takes (any other offset: ESPIPE), and RWF_NOWAIT is EOPNOTSUPP for a
 * socket there as here. */
static ssize_t mlp_rwv2(bool wr, int fd, const struct iovec *iov, int n, off64_t off, int flags,
                        bool *handled)
{
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    *handled = s != NULL;
    if (!s)
        return 0;
    ssize_t r;
    if (off != -1)
        r = -ESPIPE;
    else if (n < 0 || n > IOV_MAX)
        r = -EINVAL;
    else if (flags & RWF_NOWAIT)
        r = -EOPNOTSUPP;
    else
        r = wr ? mlp_send(s, fd, iov, n, 0) : mlp_readv(s, fd, iov, n);
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
    bool h;
    ssize_t r = mlp_rwv2(false, fd, iov, n, off, flags, &h);
    return h ? r : mlp_real_preadv2(fd, iov, n, off, flags);
}

MLP_EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
    bool h;
    ssize_t r = mlp_rwv2(true, fd, iov, n, off, flags, &h);
    return h ? r : mlp_real_pwritev2(fd, iov, n, off, flags);
}

MLP_EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int n, off64_t off, int flags)
{
    bool h;
    ssize_t r = mlp_rwv2(false, fd, iov, n, off, flags, &h);
    return h ? r : (mlp_real_preadv64v2 ? mlp_real_preadv64v2 : mlp_real_preadv2)(fd, iov, n, off, flags);
}

MLP_EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int n, off64_t off, int flags)
{
    bool h;
    ssize_t r = mlp_rwv2(true, fd, iov, n, off, flags, &h);
    return h ? r : (mlp_real_pwritev64v2 ? mlp_real_pwritev64v2 : mlp_real_pwritev2)(fd, iov, n, off, flags);
}

/* splice(2) with an accelerated socket at one end and a pipe at the other moves the bytes
 * through the ring (sock.c); anything the kernel refuses (no pipe at the other end, an offset
 * on a socket or a pipe) it refuses here with the kernel's errno.  tee(2) takes pipes only and
 * copy_file_range(2) regular files only: on a socket both fail in the kernel before any byte
 * moves, so they need no interposer. */
MLP_EXPORT ssize_t splice(int in, off64_t *inoff, int out, off64_t *outoff, size_t len,
                          unsigned int flags)
{
    struct mlp_call c;
    struct mlp_sock *si = mlp_conn_call(in, &c);
    struct mlp_sock *so = si ? NULL : mlp_conn_call(out, &c);
    if (ml_likely(!si && !so))
        return mlp_real_splice(in, inoff, out, outoff, len, flags);
    struct stat st;
    int other = si ? out : in;
    ssize_t r;
    int saved = errno;
    if (fstat(other, &st) < 0)
        r = -errno;
    else if (!S_ISFIFO(st.st_mode))
        r = -EINVAL;
    else if (si ? outoff != NULL : inoff != NULL)
        r = -ESPIPE; /* an offset on the pipe end */
    else if (si ? inoff != NULL : outoff != NULL)
        r = -EINVAL; /* on the socket end: it cannot pread/pwrite */
    else
        r = si ? mlp_splice_from(si, in, out, len, flags) : mlp_splice_to(so, out, in, len, flags);
    errno = saved;
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(out, &c);
    if (ml_likely(!s))
        return mlp_real_sendfile(out, in, off, count);
    ssize_t r = mlp_sendfile(s, out, in, off, count);
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t count)
{
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(out, &c);
    if (ml_likely(!s))
        return (mlp_real_sendfile64 ? mlp_real_sendfile64 : mlp_real_sendfile)(out, in, off, count);
    ssize_t r = mlp_sendfile(s, out, in, off, count);
    mlp_call_end(&c);
    return mlp_ret(r);
}

MLP_EXPORT int shutdown(int fd, int how)
{
    struct mlp_call c;
    struct mlp_sock *s = mlp_conn_call(fd, &c);
    if (ml_likely(!s))
        return mlp_real_shutdown(fd, how);
    int r = mlp_shutdown(s, fd, how);
    mlp_call_end(&c);
    return (int)mlp_ret(r);
}

#ifndef TCP_ULP
#define TCP_ULP 31
#endif

MLP_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    MLP_INIT();
    if (ml_unlikely(level == SOL_SOCKET && name == SO_ZEROCOPY) && !mlp_inside)
        mlp_zerocopy_before(); /* a later connect asks the kernel whether its socket has it */
    if (ml_unlikely(level == IPPROTO_TCP && name == TCP_ULP)) {
        struct mlp_call c; /* its settlement may take the send lock and send: a cancellation */
        struct mlp_sock *s = mlp_conn_call(fd, &c); /* a channel's bytes never pass through it */
        if (s) {
            int e = mlp_ulp_set(s, fd);
            mlp_call_end(&c);
            if (e < 0) {
                errno = -e;
                return -1;
            }
        }
    }
    int r = mlp_real_setsockopt(fd, level, name, val, len);
    if (r < 0)
        return r;
    if (level == SOL_SOCKET && (name == SO_SNDBUF || name == SO_RCVBUF ||
                                name == SO_SNDBUFFORCE || name == SO_RCVBUFFORCE)) {
        int saved = errno;
        mlp_note_bufsize(fd, name);
        errno = saved;
    }
    if (level == SOL_SOCKET && name == SO_LINGER)
        mlp_note_linger(fd, val, len);
    if (level == SOL_SOCKET && name == SO_RCVLOWAT)
        mlp_note_lowat(fd, val, len);
    if (level == SOL_SOCKET && name == SO_PEEK_OFF && !mlp_inside) {
        int saved = errno;
        struct mlp_sock *s = mlp_conn(fd);
        mlp_peek_off_set(s);
        if (s)
            mlp_put(s);
        errno = saved;
    }
    if (level == IPPROTO_TCP && name == TCP_DEFER_ACCEPT)
        mlp_note_defer(fd);
    if (level == SOL_SOCKET && name == SO_ZEROCOPY && len >= sizeof(int) && !mlp_inside &&
        *(const int *)val == 0) { /* (the kernel read val: it is readable) */
        struct mlp_sock *s = mlp_conn(fd);
        if (s) {
            mlp_zerocopy_off(s); /* its later MSG_ZEROCOPY sends owe nothing, as the kernel's */
            mlp_put(s);
        }
    }
    if (level == SOL_SOCKET && name == SO_ZEROCOPY && len >= sizeof(int) && !mlp_inside &&
        *(const int *)val != 0) { /* (the kernel read val: it is readable) */
        struct mlp_call c; /* its settlement may take the send lock and send: a cancellation */
        struct mlp_sock *s = mlp_conn_call(fd, &c);
        if (s) {
            int saved = errno, e = mlp_zerocopy_set(s, fd);
            mlp_call_end(&c);
            if (e < 0) {
                int off = 0; /* the kernel's flag goes back off: the call failed, as far as
                              * anyone can see */
                (void)mlp_real_setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &off, sizeof off);
                errno = -e;
                return -1;
            }
            errno = saved;
        }
    }
    struct mlp_sock *s = mlp_conn(fd);
    if (s) {
        mlp_setsockopt(s, level, name, val, len);
        mlp_put(s);
    }
    return r;
}

MLP_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
    MLP_INIT();
    int r = mlp_real_getsockopt(fd, level, name, val, len);
    if (r == 0 && level == SOL_SOCKET && name == SO_ERROR && len && *len >= sizeof(int) &&
        !mlp_inside) {
        /* An accelerated socket's errors are the channel's: a reset by the peer, reported
         * once as the kernel clears sk_err when it is read.  The idle kernel socket's own
         * (the peer's SO_LINGER 0 resets it too) is read, and so cleared, but not told. */
        struct mlp_sock *s = mlp_conn(fd);
        if (s) {
            if (s->state == MLP_ACCEL)
                *(int *)val = mlp_reset_take(s, true, false);
            mlp_put(s);
        }
    }
    if (r == 0 && level == SOL_SOCKET && name == SO_PEEK_OFF && len && *len >= sizeof(int) &&
        !mlp_inside) {
        /* the receives made on the channel since it was written come off it (sock.c) */
        struct mlp_sock *s = mlp_conn(fd);
        int v;
        if (s) {
            if (mlp_peek_off_get(s, fd, &v) == 0)
                *(int *)val = v;
            mlp_put(s);
        }
    }
    return r;
}

/* ---- readiness --------------------------------------------------------------------------- */

/* An epoll fd whose set has members of ours: poll and select on it take our path. */
static bool mlp_fd_is_epoll_ours(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    return r && atomic_load_explicit(&r->epfd, memory_order_relaxed) && mlp_epoll_has_ours(fd);
}

static bool mlp_any_ours(const struct pollfd *fds, nfds_t n)
{
    if (ml_unlikely(__atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED)))
        return true;
    for (nfds_t i = 0; i < n; i++) {
        mlp_received_look(fds[i].fd);
        if (ml_unlikely(mlp_fd_is_ours(fds[i].fd) || mlp_fd_is_epoll_ours(fds[i].fd)))
            return true;
    }
    return false;
}

static int mlp_poll_call(struct pollfd *fds, nfds_t n, int timeout)
{
    MLP_INIT();
    if (mlp_inside || !mlp_any_ours(fds, n))
        return mlp_real_poll(fds, n, timeout);
    return (int)mlp_ret(mlp_poll(fds, n, timeout < 0 ? -1 : (int64_t)timeout * 1000000, NULL));
}

MLP_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
    return mlp_poll_call(fds, n, timeout);
}

static int mlp_ppoll_call(struct pollfd *fds, nfds_t n, const struct timespec *tmo,
                     const sigset_t *mask)
{
    MLP_INIT();
    if (mlp_inside || !mlp_any_ours(fds, n))
        return mlp_real_ppoll(fds, n, tmo, mask);
    int64_t ns = tmo ? (int64_t)tmo->tv_sec * 1000000000 + tmo->tv_nsec : -1;
    return (int)mlp_ret(mlp_poll(fds, n, ns, mask));
}

MLP_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *tmo,
                     const sigset_t *mask)
{
    return mlp_ppoll_call(fds, n, tmo, mask);
}

/* The same paths for our own FILE streams (stdio.c). */
ssize_t mlp_io_read(int fd, void *buf, size_t len) { return mlp_read_call(fd, buf, len); }
ssize_t mlp_io_write(int fd, const void *buf, size_t len) { return mlp_write_call(fd, buf, len); }
int mlp_io_close(int fd) { return mlp_close_call(fd); }

/* ---- the fortified entry points: glibc's checks, then the same path as the plain call ---- */

/* glibc's own: prints "buffer overflow detected" and aborts, exactly as the real _chk would. */
extern void __chk_fail(void) __attribute__((noreturn));

MLP_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
    if (len > buflen)
        __chk_fail();
    return mlp_read_call(fd, buf, len);
}

MLP_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
    if (len > buflen)
        __chk_fail();
    return mlp_recv_call(fd, buf, len, flags);
}

MLP_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
                                  struct sockaddr *addr, socklen_t *alen)
{
    if (len > buflen)
        __chk_fail();
    return mlp_recvfrom_call(fd, buf, len, flags, addr, alen);
}

MLP_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
    if (fdslen / sizeof *fds < n)
        __chk_fail();
    return mlp_poll_call(fds, n, timeout);
}

MLP_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *tmo,
                           const sigset_t *mask, size_t fdslen)
{
    if (fdslen / sizeof *fds < n)
        __chk_fail();
    return mlp_ppoll_call(fds, n, tmo, mask);
}

static bool mlp_any_ours_set(int n, fd_set *r, fd_set *w, fd_set *e)
{
    if (ml_unlikely(__atomic_load_n(&mlp_nnested, __ATOMIC_RELAXED)))
        return true;
    int max = mlp_fd_max();
    if (max < 0)
        return false;
    for (int fd = 0; fd < n && fd <= max; fd++) {
        if (!((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))))
            continue;
        mlp_received_look(fd);
        if (mlp_fd_is_ours(fd) || mlp_fd_is_epoll_ours(fd))
            return true;
    }
    return false;
}

MLP_EXPORT int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tmo)
{
    MLP_INIT();
    if (mlp_inside || !mlp_any_ours_set(n, r, w, e))
        return mlp_real_select(n, r, w, e, tmo);
    int64_t ns = tmo ? (int64_t)tmo->tv_sec * 1000000000 + (int64_t)tmo->tv_usec * 1000 : -1;
    int64_t left = 0;
    int res = mlp_select(n, r, w, e, ns, NULL, &left);
    if (tmo) { /* Linux reports the time not slept */
        tmo->tv_sec = left / 1000000000;
        tmo->tv_usec = (left % 1000000000) / 1000;
    }
    return (int)mlp_ret(res);
}

MLP_EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *tmo,
                       const sigset_t *mask)
{
    MLP_INIT();
    if (mlp_inside || !mlp_any_ours_set(n, r, w, e))
        return mlp_real_pselect(n, r, w, e, tmo, mask);
    int64_t ns = tmo ? (int64_t)tmo->tv_sec * 1000000000 + tmo->tv_nsec : -1;
    return (int)mlp_ret(mlp_select(n, r, w, e, ns, mask, NULL));
}

MLP_EXPORT int epoll_create(int size)
{
    MLP_INIT();
    int r = mlp_real_epoll_create(size);
    if (r >= 0 && !mlp_vfork_child()) /* a vfork child's set has no record (poll.c, mlp_vf) */
        mlp_epoll_created(r);
    return r;
}

MLP_EXPORT int epoll_create1(int flags)
{
    MLP_INIT();
    int r = mlp_real_epoll_create1(flags);
    if (r >= 0 && !mlp_vfork_child())
        mlp_epoll_created(r);
    return r;
}

MLP_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    MLP_INIT();
    if (mlp_inside)
        return mlp_real_epoll_ctl(epfd, op, fd, ev);
    bool handled;
    int saved = errno;
    if (op != EPOLL_CTL_DEL)
        mlp_received_look(fd); /* a connection passed to us joins as ours */
    int r = mlp_epoll_ctl(epfd, op, fd, ev, &handled);
    if (!handled) {
        errno = saved;
        r = mlp_real_epoll_ctl(epfd, op, fd, ev);
        if (r == 0)
            mlp_epoll_note_plain(epfd, op, fd, ev); /* a connect may make it ours */
        return r;
    }
    if (r == 0)
        errno = saved;
    return (int)mlp_ret(r);
}

MLP_EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int tmo)
{
    MLP_INIT();
    if (mlp_inside || mlp_cfg.off)
        return mlp_real_epoll_wait(epfd, ev, max, tmo);
    return (int)mlp_ret(mlp_epoll_wait(epfd, ev, max, tmo < 0 ? -1 : (int64_t)tmo * 1000000,
                                       NULL));
}

MLP_EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int tmo,
                           const sigset_t *mask)
{
    MLP_INIT();
    if (mlp_inside || mlp_cfg.off)
        return mlp_real_epoll_pwait(epfd, ev, max, tmo, mask);
    return (int)mlp_ret(mlp_epoll_wait(epfd, ev, max, tmo < 0 ? -1 : (int64_t)tmo * 1000000,
                                       mask));
}

MLP_EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max,
                            const struct timespec *tmo, const sigset_t *mask)
{
    MLP_INIT();
    if (mlp_inside || mlp_cfg.off) {
        if (!mlp_real_epoll_pwait2) {
            errno = ENOSYS;
            return -1;
        }
        return mlp_real_epoll_pwait2(epfd, ev, max, tmo, mask);
    }
    int64_t ns = tmo ? (int64_t)tmo->tv_sec * 1000000000 + tmo->tv_nsec : -1;
    mlp_ep_ns = true; /* the program calls epoll_pwait2 itself: we may too */
    int r = (int)mlp_ret(mlp_epoll_wait(epfd, ev, max, ns, mask));
    mlp_ep_ns = false;
    return r;
}

/* ---- _exit: no exit handler runs, so our stat entry's name goes here (negotiate.c) ---- */

static _Noreturn void mlp_exit_now(void (*real)(int), int status)
{
    mlp_sock_exit_now();
    mlp_exit_unname();
    if (real)
        real(status);
    for (;;)
        (void)syscall(SYS_exit_group, status);
}

MLP_EXPORT _Noreturn void _exit(int status) { mlp_exit_now(mlp_real__exit, status); }

MLP_EXPORT _Noreturn void _Exit(int status) { mlp_exit_now(mlp_real__Exit, status); }

/* ---- fork: the holders counted before it are given back if it fails (see sock.c) ---- */

MLP_EXPORT pid_t fork(void)
{
    MLP_INIT();
    /* listeners received over SCM_RIGHTS: published before the children inherit them (not from
     * a signal handler of ours: it may have come inside the locks that publishing takes) */
    if (!mlp_inside && !mlp_vfork_child() && !mlp_sig_in_handler()) {
        int saved = errno;
        mlp_publish_received();
        errno = saved;
    }
    pid_t p = mlp_real_fork();
    if (p < 0) { /* the prepare handler counted the child that was not born */
        int e = errno;
        mlp_fork_failed();
        errno = e;
    }
    return p;
}

