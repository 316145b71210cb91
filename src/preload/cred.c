/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * cred.c - credential changes: a guest whose host changes hats.
 *
 * The default fabric is one user's directory (mode 0700).  A process that changes credentials
 * (nginx's workers and rsync's daemon children drop from root to nobody, sshd's privilege-separated
 * child to its own user, some servers drop only their euid for a while) can afterwards neither
 * create nor open a file in it: it could neither take a client's offer nor refuse one, and the
 * client would wait for an acceptor that cannot come.  The rule:
 *   - what was open or mapped before the change keeps its access: accelerated connections go on
 *     (their peer's death is then seen through the kernel socket, since the peer's liveness lock
 *     can no longer be opened by name: see ml_peer_dead() in channel.c);
 *   - before the change, while it still can, the process creates its memlan stat entry;
 *   - after it, when the fabric is out of reach (faccessat with the effective ids), the process
 *     says so once in the log and makes every new connection of its own plain TCP, with the
 *     reason; an accept of its while out of reach refuses the client's offer in the record's
 *     words and sets no_offer in the record, through the mapping it already has (negotiate.c,
 *     mlp_on_accept: the client that offered withdraws, later ones do not offer at all: plain
 *     TCP at kernel speed, decided at once), as does an exec out of reach that keeps a listener
 *     (mlp_lrec_cred_exec).  Not at the drop: a port whose acceptors drop only between their
 *     accepts (Debian's spamd: root children that take each message's user's euid and come
 *     back) would be marked while any of them works, nearly always under load;
 *   - a change made without libc (syscall(2)) is caught at the next accept, which compares
 *     geteuid() with the euid the fabric was opened with;
 *   - a loss that was one thread's own (a change through syscall(), or one found at an accept:
 *     the kernel's credentials are per thread) leaves the other threads their reach: each of
 *     their connects and accepts asks for itself (mlp_cred_thread_in_reach);
 *   - a process that gets its access back (seteuid back to root) uses the fabric again for its
 *     own connections, and the records it flagged take offers again (mlp_lrec_cred_back), as
 *     they do when it execs without a listener on their port (mlp_lrec_cred_exec).
 * A fork inherits all of it; an exec starts again.  A vfork child (which shares our memory)
 * passes straight through.  Every interposer returns exactly what libc returned, errno included.
 *
 * setuid and friends are async-signal-safe, and a handler may call them while its thread holds
 * one of our locks or is inside malloc.  So nothing here waits for a lock: the records are
 * flagged under a lock only tried (when busy, the flagging is owed, and paid by the next
 * mlp_cred_lost, at a connect or accept); inside a handler installed through our sigaction
 * (signals.c keeps the depth) the preparation before the change (it allocates) is skipped and
 * the peers' wake-ups are owed too.  Handlers installed by signal() are not seen as handlers:
 * for them only the locks are safe, not a first allocation.
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Atomic int mlp_cred_gone;          /* 1: the fabric is out of our reach */
static _Atomic uid_t mlp_cred_euid = (uid_t)-1; /* the euid the fabric was opened with */
static char mlp_cred_buf[2][112];
static _Atomic int mlp_cred_cur;
static bool mlp_cred_said;                 /* the log line is written once per process */
#define MLP_OWE_RING 2u
#define MLP_OWE_BACK 4u    /* the marks our accepts set, cleared (mlp_lrec_cred_back) */
#define MLP_OWE_UNFLAG 8u  /* the peers' flags taken back (mlp_cred_unflag_peers) */
static _Atomic unsigned mlp_cred_owed;     /* work a handler or a busy lock left for later */
const char *mlp_cred_why = "this process changed its credentials";

void mlp_cred_fabric_opened(void) { ml_store_relaxed(&mlp_cred_euid, geteuid()); }

/* Is the fabric out of our reach (a credential change, a refused creation)?  No system call. */
bool mlp_fabric_out(void) { return ml_load_acquire(&mlp_cred_gone) != 0; }

static void mlp_cred_ring_peers(bool nopost);
static void mlp_cred_unflag_peers(void);
static void mlp_cred_mark_lost(const char *why);
/* The loss was found by one thread about itself (a set*id made through syscall(), or found at
 * an accept: the kernel's credentials are per thread), not by a libc call that changed all. */
static __thread bool mlp_cred_thread_only __attribute__((tls_model("initial-exec")));
static _Atomic bool mlp_cred_thread_loss;
static void mlp_cred_keep_files(void);

static void mlp_cred_check(const char *what)
{
    /* The log, too: said here, once, in the process that changed, so that the children it
     * forks and execs inherit that it was said (at the exec alone, each fork child said it) */
    if (!mlp_sig_in_handler())
        (void)mlp_log_closed_to_exec();
    if (!mlp_fab)
        return; /* if it is ever opened, it is opened with the new credentials */
    uid_t e = geteuid();
    /* Write and search on the directory, with the effective ids, groups and capabilities: what
     * creating and opening its files needs (not read: a private shared fabric, mode 3730, is
     * searchable but not listable).  A refused check counts as out of reach. */
    if (faccessat(mlp_fab->dirfd, ".", W_OK | X_OK, AT_EACCESS) == 0) {
        ml_store_relaxed(&mlp_cred_euid, e);
        if (ml_load_relaxed(&mlp_cred_gone)) {
            ml_store_release(&mlp_cred_gone, 0);
            /* Once per process, as the loss is: smbd changes its euid around every request,
             * and said so 49 times for one short session. */
            static _Atomic bool again_said;
            if (!atomic_exchange(&again_said, true))
                mlp_log(1, "credentials changed again (%s): the fabric is in reach again (said "
                           "once)", what);
            /* The marks our accepts set go (or are owed) */
            if (mlp_sig_in_handler() || !mlp_lrec_cred_back())
                atomic_fetch_or(&mlp_cred_owed, MLP_OWE_BACK);
            /* And our peers may sleep on their queues for us again */
            if (mlp_sig_in_handler())
                atomic_fetch_or(&mlp_cred_owed, MLP_OWE_UNFLAG);
            else
                mlp_cred_unflag_peers();
        }
        return;
    }
    char why[sizeof mlp_cred_buf[0]];
    snprintf(why, sizeof why,
             "this process changed its credentials (%s, euid %u): fabric out of reach", what,
             (unsigned)e);
    mlp_cred_mark_lost(why);
}

/* The fabric refused us a file we create (a sandbox that denies open, credentials changed
 * without libc): the same rule as a credential change that put it out of reach. */
void mlp_fabric_refused(const char *what, int err)
{
    if (!mlp_fab || ml_load_acquire(&mlp_cred_gone) || (err != -EACCES && err != -EPERM))
        return;
    char why[sizeof mlp_cred_buf[0]];
    snprintf(why, sizeof why, "the fabric refuses this process (%s: %s)", what, strerror(-err));
    mlp_cred_mark_lost(why);
}

static void mlp_cred_mark_lost(const char *why)
{
    int k = 1 - ml_load_relaxed(&mlp_cred_cur); /* a reader may be reading the other one */
    snprintf(mlp_cred_buf[k], sizeof mlp_cred_buf[k], "%s", why);
    ml_store_relaxed(&mlp_cred_cur, k);
    mlp_cred_why = mlp_cred_buf[k];
    ml_store_relaxed(&mlp_cred_thread_loss, mlp_cred_thread_only);
    ml_store_release(&mlp_cred_gone, 1);
    if (!mlp_cred_said) {
        mlp_cred_said = true;
        mlp_log(0, "%s (%s): its new connections stay on TCP, its accelerated ones go on, and "
                   "its accepts refuse offers while it is out of reach",
                mlp_cred_why, mlp_fab->path);
    }
    /* The ports we listen on are not marked here: another process, or another thread (a change
     * through syscall() is the thread's own), may accept on them with credentials in reach,
     * and we may come back before our next accept.  An accept out of reach marks its port
     * (mlp_on_accept), and refuses the offer of the client that did not see the mark. */
    if (mlp_sig_in_handler())
        atomic_fetch_or(&mlp_cred_owed, MLP_OWE_RING);
    else
        mlp_cred_ring_peers(true);
}

/* What a handler or a busy lock left undone, done now (tried again later if still busy). */
static void mlp_cred_pay(void)
{
    unsigned owed = atomic_load(&mlp_cred_owed);
    if (!owed || mlp_sig_in_handler())
        return;
    /* Marks owed back are cleared even if we are gone again since: they are our accepts', and
     * our next accept out of reach sets its port's again (a spamd child that dropped again
     * before paying would not accept out of reach, and its mark would have stayed). */
    if ((owed & MLP_OWE_BACK) && mlp_lrec_cred_back())
        atomic_fetch_and(&mlp_cred_owed, ~MLP_OWE_BACK);
    if (!ml_load_acquire(&mlp_cred_gone)) {
        if ((owed & MLP_OWE_UNFLAG) &&
            (atomic_fetch_and(&mlp_cred_owed, ~MLP_OWE_UNFLAG) & MLP_OWE_UNFLAG))
            mlp_cred_unflag_peers();
        return;
    }
    atomic_fetch_and(&mlp_cred_owed, ~MLP_OWE_UNFLAG); /* gone again since: the flags stay */
    if ((owed & MLP_OWE_RING) && (atomic_fetch_and(&mlp_cred_owed, ~MLP_OWE_RING) & MLP_OWE_RING))
        mlp_cred_ring_peers(true);
}

/*
 * Is the fabric in this thread's reach, though the process's is lost?  Only where the loss was
 * one thread's own (mlp_cred_thread_loss): a server thread that changes its euid through
 * syscall() (samba's way) put every other thread's connects and accepts on TCP, and its port
 * marked at their accepts, while they kept root (a review's smbd-like program).  One faccessat,
 * with this thread's ids; not in a handler (a handler's accept refuses anyway), nor in a seccomp
 * sandbox, which may kill for it.
 */
static bool mlp_cred_thread_in_reach(void)
{
    if (!ml_load_relaxed(&mlp_cred_thread_loss) || !mlp_fab || mlp_sig_in_handler() ||
        mlp_sandboxed())
        return false;
    int saved = errno;
    bool in = faccessat(mlp_fab->dirfd, ".", W_OK | X_OK, AT_EACCESS) == 0;
    errno = saved;
    return in;
}

/* Is the fabric out of this thread's reach?  No payment of what is owed (a vfork child may ask). */
bool mlp_cred_out_here(void) { return mlp_fabric_out() && !mlp_cred_thread_in_reach(); }

/* mlp_cred_lost, for a connect or an accept of this thread's (closes and peeks keep to the
 * process's state: no more system calls of ours there). */
bool mlp_cred_lost_here(bool at_accept)
{
    return mlp_cred_lost(at_accept) && !mlp_cred_thread_in_reach();
}

bool mlp_cred_lost(bool at_accept)
{
    if (ml_load_acquire(&mlp_cred_gone)) {
        if (ml_unlikely(atomic_load_explicit(&mlp_cred_owed, memory_order_relaxed)))
            mlp_cred_pay();
        return true;
    }
    if (ml_unlikely(atomic_load_explicit(&mlp_cred_owed, memory_order_relaxed)))
        mlp_cred_pay();
    if (at_accept && mlp_fab && geteuid() != ml_load_relaxed(&mlp_cred_euid)) {
        mlp_cred_thread_only = true; /* what this thread's geteuid says is its own */
        mlp_cred_check("found at accept");
        mlp_cred_thread_only = false;
        return ml_load_acquire(&mlp_cred_gone) != 0;
    }
    return false;
}

/*
 * Our accelerated connections' peers may sleep on their event queues, which we reach by opening
 * their files by name: after the change we may no longer.  Before it, one post to each peer's
 * queue keeps the queue mapped in our cache (and wakes the peer for nothing, which is allowed);
 * after it, when the fabric is out of reach, ML_SOCK_NOPOST in our side block tells each peer
 * not to sleep on its queue for us (a queue it makes later we could not reach), and a second
 * post wakes the ones asleep now, through the cache, to see it.
 */
static void mlp_cred_ring_peers(bool nopost)
{
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        if (s->type == MLP_CONN && s->ch && s->me && s->state == MLP_ACCEL) {
            memlan_channel_t *ch = s->ch;
            /* Once per connection each way: a server that toggles its euid around every
             * request must not wake all its peers each time.  SYNC: the flag goes before the
             * posts; the woken peer's arm reads it (poll.c).  Before the flag, which of the
             * peer's queues the priming reached (ours, or the parent's we inherited with its
             * cache), those the peer may still sleep on; at each change out of reach, the flag
             * up already or not: the side's last process to go out of reach is the one that
             * posts, most likely (sshd's session child; its preauth child set the flag).  A
             * fork sibling that shares the side and cannot reach one (it did not prime it: a
             * raw system call's change) zeroes its byte at its first refused post (channel.c). */
            if (nopost)
                __ml_chan_publish_reach(ch, false);
            bool post = nopost ? !(atomic_fetch_or(&s->me->flags, ML_SOCK_NOPOST) & ML_SOCK_NOPOST)
                               : !s->cred_primed || __ml_chan_peer_refs_new(ch);
            if (nopost) /* the flag is the credential change's now: never taken back */
                ml_store_relaxed(&ch->nopost_mine, false);
            s->cred_primed = true;
            if (post)
                __ml_chan_post_peer_refs(ch, !nopost);
        }
        mlp_put(s);
    }
}

/*
 * Back in reach (mlp_cred_check): the flags the loss set go, so that our peers sleep on their
 * queues for us again, which we reach by name again.  Before, the flag stayed for the
 * connection's life, and its peer napped every millisecond while idle, for ever: dropbear's
 * session process reads authorized_keys between a seteuid to the user and one back to root, and
 * its idle dbclient woke some 425 times a second (an explorer's).  Only a flag of the loss's
 * (a post refused for another reason is the channel's to take back: nopost_mine), on a side we
 * hold alone (a fork sibling that shares it may still be out of reach).  The peer's next look
 * at its nap sees it; no post is needed.  The priming is owed again: a queue the peer makes from
 * now on is mapped in our cache only by the next change's post (mlp_cred_before), and that
 * change's flag is posted to as the first was.  A server that changes its euid around each
 * request so wakes its peers at each change, where it made them nap for good before.
 */
static void mlp_cred_unflag_peers(void)
{
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        if (s->type == MLP_CONN && s->ch && s->me && s->state == MLP_ACCEL &&
            !ml_load_relaxed(&s->ch->nopost_mine) && atomic_load(&s->me->holders) <= 1 &&
            (atomic_load(&s->me->flags) & ML_SOCK_NOPOST)) {
            atomic_fetch_and(&s->me->flags, ~ML_SOCK_NOPOST);
            __ml_chan_publish_reach(s->ch, true);
            s->cred_primed = false;
        }
        mlp_put(s);
    }
}

/*
 * An exec carries a connection through its channel's file opened anew (exec.c's bridge), by name
 * in the fabric: after a drop the directory may refuse us (an inetd's child that drops to a
 * service's user and execs it with the connection on fds 0 and 1).  So before a change that may
 * put it out of reach (any but a uid call that keeps the euid: groups and capabilities count
 * too), while the name still opens, the file of each accelerated connection is kept open (a
 * protected, close-on-exec fd of ours at our high numbers, s->cred_fd), from which the bridge is
 * made when the name is refused (__ml_chan_exec_bridge).  Used for nothing else: a liveness
 * look through it would be an fcntl, which a sandbox that follows a drop may kill for (the
 * name, refused, sends that look to the kernel socket). At most 16 per process, kept until their
 * sockets go: an fd each, and a server that drops with many connections open, or toggles its euid
 * around every request, must not find its fd limit nearer; the others' exec says it cannot carry
 * them, as before. An fd that cannot go to our high numbers (a soft limit lowered since start-up)
 * is closed, never left at a number the program may think free (a write to a closed stdout landed
 * in the channel's file: a review's reproduction). Two threads changing credentials at once may
 * open the same file: the first to set cred_fd keeps it, the other closes its own.
 */
#define MLP_CRED_KEEP_MAX 16
static _Atomic int mlp_cred_kept; /* the process's kept files (sock.c gives them back) */

static bool mlp_cred_wants_file(const struct mlp_sock *s)
{
    return s->type == MLP_CONN && s->ch && s->me && s->state == MLP_ACCEL &&
           __atomic_load_n(&s->cred_fd, __ATOMIC_RELAXED) <= 0;
}

void mlp_cred_kept_closed(void) { atomic_fetch_sub(&mlp_cred_kept, 1); }

static void mlp_cred_keep_files(void)
{
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max && atomic_load(&mlp_cred_kept) < MLP_CRED_KEEP_MAX; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        /* Our reference keeps s->ch; s->cred_fd is closed at the last one (mlp_sock_destroy).
         * A socket at several fds is kept once: the first sets cred_fd.  The count is reserved
         * first, so that threads changing credentials at once stay within the bound. */
        if (mlp_cred_wants_file(s)) {
            bool room = atomic_fetch_add(&mlp_cred_kept, 1) < MLP_CRED_KEEP_MAX;
            long f = room ? __ml_seg_reopen(s->ch->seg, O_RDWR | O_CLOEXEC) : -1;
            int h = f >= 0 ? mlp_fd_to_high((int)f) : -1;
            int none = 0;
            if (h >= 0 && __atomic_compare_exchange_n(&s->cred_fd, &none, h, false,
                                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                mlp_own_fd_at(&s->cred_fd); /* protected from the program's closes and dups */
            } else {
                if (h >= 0)
                    __ml_sys_close(h);
                atomic_fetch_sub(&mlp_cred_kept, 1);
            }
        }
        mlp_urg_premake(s); /* an owner set after the change gets its SIGURG (sock.c) */
        mlp_put(s);
    }
}

/* An image that took connections up in a fabric it cannot write (negotiate.c, mlp_fabric):
 * their peers must not sleep on queues we cannot post to, as after a drop in this image. */
void mlp_cred_adopted_out(void)
{
    if (ml_load_acquire(&mlp_cred_gone) && !mlp_sig_in_handler())
        mlp_cred_ring_peers(true);
}

/* ---- the interposers --------------------------------------------------------------------- */

/* Before: what needs the fabric and is worth having afterwards, made while we still can.
 * euid: the effective uid the call asks for ((uid_t)-1: none, or not a uid call). */
static void mlp_cred_before(uid_t euid)
{
    if (mlp_fab && !ml_load_relaxed(&mlp_cred_gone)) {
        mlp_stat_prepare();
        if (euid != (uid_t)-1 && euid != 0)
            mlp_stat_owner(euid); /* (root to another euid, in a shared fabric) */
        mlp_cred_ring_peers(false);
        if (euid == (uid_t)-1 || euid != geteuid()) /* not a uid call that keeps the euid */
            mlp_cred_keep_files();
        /* In a fabric shared on purpose the new euid may go on accepting: the records of our
         * ports name it while we still own them (negotiate.c), and clients grant it their
         * channels.  Not for a change the call may refuse: a spare entry is harmless. */
        if (euid != (uid_t)-1 && euid != geteuid())
            mlp_lrec_grant(euid);
    }
    /* A sandbox often follows a drop (sshd's privilege-separated child) and may kill on the
     * eventfd a poll of this thread would make later: make it now. */
    mlp_poll_prepare_thread();
}

#define MLP_CRED(call, what) MLP_CRED_U(call, what, (uid_t)-1)
#define MLP_CRED_U(call, what, euid)                                                           \
    do {                                                                                       \
        if (__builtin_expect(!mlp_ready, 0)) { /* start-up must not change the host's errno */ \
            int init_errno_ = errno;                                                           \
            mlp_init();                                                                        \
            errno = init_errno_;                                                               \
        }                                                                                      \
        if (mlp_inside || mlp_cfg.off || __ml_sys_getpid() != mlp_pid)                         \
            return call; /* our own, off, or a vfork child: its memory is its parent's */     \
        int cred_errno_ = errno;                                                               \
        if (!mlp_sig_in_handler()) /* it allocates and locks: not in a handler */             \
            mlp_cred_before(euid);                                                             \
        errno = cred_errno_;                                                                   \
        int cred_ret_ = call;                                                                  \
        if ((euid) != (uid_t)-1 && !mlp_sig_in_handler()) {                                    \
            cred_errno_ = errno; /* still root (refused, or back): the entry is root's again */ \
            mlp_stat_owner(0);                                                                 \
            errno = cred_errno_;                                                               \
        }                                                                                      \
        if (cred_ret_ == 0) {                                                                  \
            cred_errno_ = errno; /* as libc left it */                                         \
            mlp_cred_check(what);                                                              \
            errno = cred_errno_;                                                               \
        }                                                                                      \
        return cred_ret_;                                                                      \
    } while (0)

MLP_EXPORT int setuid(uid_t uid) { MLP_CRED_U(mlp_real_setuid(uid), "setuid", uid); }
MLP_EXPORT int seteuid(uid_t uid) { MLP_CRED_U(mlp_real_seteuid(uid), "seteuid", uid); }
MLP_EXPORT int setreuid(uid_t r, uid_t e)
{
    MLP_CRED_U(mlp_real_setreuid(r, e), "setreuid", e);
}
MLP_EXPORT int setresuid(uid_t r, uid_t e, uid_t s)
{
    MLP_CRED_U(mlp_real_setresuid(r, e, s), "setresuid", e);
}
MLP_EXPORT int setgid(gid_t gid) { MLP_CRED(mlp_real_setgid(gid), "setgid"); }
MLP_EXPORT int setegid(gid_t gid) { MLP_CRED(mlp_real_setegid(gid), "setegid"); }
MLP_EXPORT int setregid(gid_t r, gid_t e) { MLP_CRED(mlp_real_setregid(r, e), "setregid"); }
MLP_EXPORT int setresgid(gid_t r, gid_t e, gid_t s)
{
    MLP_CRED(mlp_real_setresgid(r, e, s), "setresgid");
}
MLP_EXPORT int setgroups(size_t n, const gid_t *list)
{
    MLP_CRED(mlp_real_setgroups(n, list), "setgroups");
}
MLP_EXPORT int initgroups(const char *user, gid_t group)
{
    MLP_CRED(mlp_real_initgroups(user, group), "initgroups");
}
/*
 * The same calls made through libc's syscall() (samba's smbd changes its euid around its work so,
 * per thread, in libutil's setid wrappers): seen as the libc ones are.  Unseen, a child that
 * dropped its euid after our stat entry was made never said that its posts may not reach its
 * peers, and a client asleep in epoll_wait never heard its reply (every `smbclient del` waited
 * 20 s and failed: an explorer).  The kernel's call is per thread; the check that follows asks
 * the euid of this thread, the one that changed.
 */
static int mlp_cred_raw(long n, long a, long b, long c)
{
    long r = __ml_sys_raw(n, a, b, c, 0, 0, 0);
    if (r < 0 && r > -4096) {
        errno = (int)-r;
        return -1;
    }
    return (int)r;
}

bool mlp_cred_nr(long n)
{
    return n == SYS_setuid || n == SYS_setgid || n == SYS_setreuid || n == SYS_setregid ||
           n == SYS_setresuid || n == SYS_setresgid || n == SYS_setgroups || n == SYS_capset;
}

static int mlp_cred_syscall_u(long n, long a, long b, long c, uid_t euid)
{
    MLP_CRED_U(mlp_cred_raw(n, a, b, c), "syscall(set*id)", euid);
}

int mlp_cred_syscall(long n, long a, long b, long c)
{
    uid_t euid = n == SYS_setuid ? (uid_t)a
                 : n == SYS_setreuid || n == SYS_setresuid ? (uid_t)b
                                                           : (uid_t)-1;
    mlp_cred_thread_only = true;
    int r = mlp_cred_syscall_u(n, a, b, c, euid);
    mlp_cred_thread_only = false;
    return r;
}

/* Declared by libcap's header, not glibc's: the kernel's two pointers, passed through. */
int capset(void *hdr, void *data);
MLP_EXPORT int capset(void *hdr, void *data) { MLP_CRED(mlp_real_capset(hdr, data), "capset"); }
