/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sock.c - the stream-socket calls on an accelerated socket, with the kernel's semantics.
 *
 * The bytes go through the channel; the kernel socket underneath stays connected and idle.  What
 * the kernel answers for a TCP socket, we answer for the channel: partial writes on a nonblocking
 * socket, EAGAIN, EOF after the peer's shutdown, EPIPE and SIGPIPE unless MSG_NOSIGNAL, EINTR
 * exactly when a handler without SA_RESTART interrupts a blocking call, or any handler one with
 * SO_RCVTIMEO/SO_SNDTIMEO (the kernel never restarts our futex wait, which has a timeout: we
 * restart it ourselves unless signals.c saw a handler without SA_RESTART run; see ml_wait()),
 * and a blocking call is a cancellation point.  A peer that dies is a peer that closed: EOF, or a reset
 * where the kernel would have sent one (it closed with our bytes unread or with SO_LINGER 0, or
 * we wrote once after it closed), reported once as the kernel's sk_err is.
 *
 * Concurrency: each direction has a lock in a page of our own that only fork children inherit
 * (never in the channel, which the peer can write), so the threads of one process and the
 * processes that share the socket after fork take turns; whoever takes it after another process
 * had it reloads the ring index it owns (__ml_chan_resync_*).
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ML_INT_MAX_IO 0x7ffff000 /* the most one read or write moves on Linux */

int mlp_flush_unsent(struct mlp_sock *s, int fd, bool block);
void mlp_negotiate_after_fork(void);
void mlp_poll_after_fork(void);
void mlp_poll_forget(struct mlp_sock *s);
void mlp_poll_fork_drop(struct mlp_sock *s);
void mlp_negotiate_at_exit(void);

/* ---- locks ------------------------------------------------------------------------------- */

/*
 * The direction locks serialise the threads of this process and the processes that share the
 * socket after fork.  A socket never forked takes the fast words in its record (mlp_lock_dir)
 * and needs nothing else: its file status flags and published ring positions stay in private
 * memory (own_locks, and the channel's own words).  When it is forked (the prepare handler, or
 * a socket carried across exec that another process still holds) its locks move to a page of
 * their own, mapped MAP_SHARED|MAP_ANONYMOUS: fork children inherit it, and nothing else can
 * reach it (it has no name; the peer, which can write every byte of the channel, cannot map
 * it).  So nothing the peer writes decides whether or how long we wait for a lock.  They are
 * robust process-shared mutexes: a holder that dies (SIGKILL in the middle of a send) is seen by
 * the kernel's robust list, never by a pid, and the next locker takes over (EOWNERDEAD) and
 * reloads the ring index the dead one owned; its half-done operation is lost.  If the page
 * cannot be made (no memory, no mappings left) the socket uses process-private mutexes instead
 * (its fork children are then not serialised with us, the only cost).  Exec leaves the page
 * behind: a socket carried across exec gets a new one, and the exec'd image is not serialised
 * with a process that still holds the socket from before (design.md, Limits).
 *
 * The page is made only then, not with every connection (f08d1f7 made one at a socket's first
 * call: an mmap of shared memory, two signal-mask calls and an munmap at close on both ends, which
 * took short connections on one core from 0.68x to 0.48x kernel TCP; docs/results.md).
 */
/*
 * The page also holds the channel's published ring positions (our tx head and rx tail as their
 * holder last stored them: __ml_chan_pub_share), read by whoever asks about readiness without a
 * lock and by the next process to take a lock after fork, in place of the channel's shared
 * copies, which the peer can overwrite.  A fast word's holder may still publish into the
 * channel's own word once after the switch (it loaded the pointer before): the page's copy is
 * then one step behind until its next store, and a resync takes the newer of it and the
 * channel's (__ml_chan_resync_*), as after any holder.  The file status flags move with one
 * exchange that marks the private word (MLP_FL_MOVED): a setter that finds the mark sets them
 * again in the page.  Page makers take turns (mlp_locks_making), with signals blocked, since a
 * handler of the same thread could want a page too (once per forked socket: two system calls
 * beside the mmap).
 */
static atomic_flag mlp_locks_making = ATOMIC_FLAG_INIT;

/* Error-checking, so that a thread can ask whether it holds one (EDEADLK: see mlp_lock). */
static void mlp_dir_locks_init(struct mlp_locks *l, bool shared)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
    if (shared) {
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    }
    pthread_mutex_init(&l->tx, &a);
    pthread_mutex_init(&l->rx, &a);
    pthread_mutexattr_destroy(&a);
}

/* A new record (mlp_sock_new, which has cleared it): its private locks, no system call. */
void mlp_locks_init(struct mlp_sock *s)
{
    mlp_dir_locks_init(&s->own_locks, false);
    atomic_store_explicit(&s->locks, &s->own_locks, memory_order_release);
}

static inline struct mlp_locks *mlp_locks_of(struct mlp_sock *s)
{
    return atomic_load_explicit(&s->locks, memory_order_acquire);
}

/* The socket is (about to be) shared with another process: its locks move to the shared page,
 * once.  Nobody takes a direction's mutex before this has run (mlp_lock_dir calls it first). */
static struct mlp_locks *mlp_locks_share(struct mlp_sock *s)
{
    struct mlp_locks *l = mlp_locks_of(s);
    if (ml_likely(l != &s->own_locks))
        return l;
    /* The pointer read again once the flag is seen: a maker stores the page's pointer before
     * the flag, and a thread that read the private pointer just before that store and the flag
     * just after it took the private mutex while every other holder took the page's: two
     * holders of one direction at once (tests/preload/sharerace.c, stopped there by gdb). */
    if (atomic_load(&s->locks_tried))
        return mlp_locks_of(s);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (atomic_flag_test_and_set_explicit(&mlp_locks_making, memory_order_acquire))
        ml_cpu_relax();
    l = mlp_locks_of(s);
    if (l == &s->own_locks && !atomic_load(&s->locks_tried)) {
        struct mlp_locks *n = mmap(NULL, sizeof *n, PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (n != MAP_FAILED) {
            mlp_dir_locks_init(n, true);
            if (s->ch)
                __ml_chan_pub_share(s->ch, &n->pub_tx, &n->pub_rx, &n->pub_grow);
            uint32_t f = atomic_fetch_or(&s->own_locks.fl, MLP_FL_MOVED);
            atomic_store_explicit(&n->fl, f & MLP_FL_NONBLOCK, memory_order_relaxed);
            atomic_store_explicit(&s->locks, n, memory_order_release);
            l = n;
        }
        atomic_store(&s->locks_tried, true);
    }
    atomic_flag_clear_explicit(&mlp_locks_making, memory_order_release);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return l;
}

/* A fork child: a page maker of another thread of the parent's does not exist here. */
static void mlp_locks_after_fork(void) { atomic_flag_clear(&mlp_locks_making); }

/* Its page goes with the socket's last reference (no thread holds a lock then); the record's
 * private locks stay, for a thread that still holds a stale pointer to it. */
static void mlp_locks_free(struct mlp_sock *s)
{
    struct mlp_locks *l = atomic_exchange(&s->locks, &s->own_locks);
    if (l && l != &s->own_locks) {
        if (s->ch)
            __ml_chan_pub_share(s->ch, NULL, NULL, NULL); /* the channel outlives the page a little */
        munmap(l, sizeof *l);
    }
}

/*
 * The locks this thread holds or is taking, newest last.  A signal handler that calls into a
 * socket its own thread has locked (recv, send and poll are async-signal-safe) would wait for
 * itself for ever: it finds the lock here and fails at once instead, with what the kernel could
 * have said (EAGAIN on a nonblocking call, EINTR on a blocking one; the handler interrupted a
 * call that was in the middle of using the socket).  An entry goes in before the lock is taken
 * and out after it is released, so a handler that runs in between also fails rather than waits.
 * A thread cancelled in a blocking wait releases what it holds here (mlp_wait_hook).
 */
#define MLP_HELD_MAX 8
/* A lock: a direction's fast word, its robust process-shared mutex, or a private mutex (the
 * fall-back without a page); a receive's spin's word borrowed by a handler on top of it, or lent
 * back to the socket while one runs (mlp_spin_lend: not held, and matched by no lock or unlock). */
enum { MLP_LK_FAST, MLP_LK_ROBUST, MLP_LK_PRIVATE, MLP_LK_BORROWED, MLP_LK_LENT };
static __thread void *mlp_held[MLP_HELD_MAX] __attribute__((tls_model("initial-exec")));
static __thread unsigned char mlp_held_kind[MLP_HELD_MAX] __attribute__((tls_model("initial-exec")));
static __thread uintptr_t mlp_held_sp[MLP_HELD_MAX] __attribute__((tls_model("initial-exec")));
static __thread unsigned mlp_nheld __attribute__((tls_model("initial-exec")));
/* The fast word this thread holds while its blocking receive spins for bytes (mlp_rx_hold_spin),
 * NULL otherwise.  The spin reads shared memory only, so a handler that runs on top of it may
 * use the direction: it borrows the word (an entry of kind MLP_LK_BORROWED, given back to the
 * spin, not to the socket), as it would have taken it had the receive waited without it. */
static __thread void *volatile mlp_spin_word __attribute__((tls_model("initial-exec")));
/* The mutex this thread is inside pthread_mutex_lock or _unlock of (NULL: none).  A jump out of
 * those leaves a robust mutex half-done (taken but not on the thread's robust list, or off the
 * list but not released), and unlocking it then walks the list for it: a SIGSEGV in glibc
 * (seen: lockhole's jmplock, 2 runs in 8).  See mlp_lockop_repair. */
static __thread pthread_mutex_t *volatile mlp_lockop __attribute__((tls_model("initial-exec")));

static int mlp_mutex_lock(pthread_mutex_t *m)
{
    mlp_lockop = m;
    int r = pthread_mutex_lock(m);
    mlp_lockop = NULL;
    return r;
}

static void mlp_mutex_unlock(pthread_mutex_t *m)
{
    mlp_lockop = m;
    (void)pthread_mutex_unlock(m);
    mlp_lockop = NULL;
}

/*
 * The fast word (a socket never forked, design.md "A socket never forked takes a fast word"): 0
 * when free, else its holder's id, with MLP_FAST_WAITERS when a thread may be asleep on it.
 * Taking it is one compare-and-swap, giving it back one exchange (and a wake-up only when
 * somebody sleeps).  It serialises the threads of one process only: a holder dies only with its
 * process, and a jump out of a take or a give-back leaves the word whole (one atomic step each),
 * so neither a robust list nor mlp_lockop is needed.  The words live in the socket's record
 * (struct mlp_sock), private memory; the futex calls are the shared kind all the same (it works
 * on private memory too).
 */
#define MLP_FAST_WAITERS 0x80000000u
#define MLP_FAST_TID     0x3fffffffu
/* This thread's id for the words: its kernel thread id, unique among the live threads of the
 * machine, read without a system call (gettid is one, and a sandbox may kill for it: sshd's
 * pre-authentication filter does).  glibc keeps it in its thread descriptor and writes it into a
 * mutex it locks (__data.__owner, which mlp_call_left reads already); a fork child's thread has a
 * new one (mlp_after_fork_child forgets the cache).  Elsewhere: a number of ours from a counter.
 * Not a counter with glibc: 2^30 threads made over a server's life would wrap it, and a new
 * thread could take the id of a live one that holds a word. */
static __thread uint32_t mlp_tid_cache __attribute__((tls_model("initial-exec")));

static __attribute__((noinline)) uint32_t mlp_tid_slow(void)
{
    uint32_t t = 0;
#ifdef __GLIBC__
    pthread_mutex_t m;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&m, &a);
    pthread_mutexattr_destroy(&a);
    if (pthread_mutex_lock(&m) == 0) {
        t = (uint32_t)m.__data.__owner & MLP_FAST_TID;
        pthread_mutex_unlock(&m);
    }
    pthread_mutex_destroy(&m);
#endif
    if (t == 0) {
        static _Atomic uint32_t next = 1u << 22; /* above pid_max: never a kernel id */
        do
            t = (atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) + 1) & MLP_FAST_TID;
        while (t < (1u << 22));
    }
    mlp_tid_cache = t;
    return t;
}

static inline uint32_t mlp_tid(void)
{
    uint32_t t = mlp_tid_cache;
    return ml_likely(t != 0) ? t : mlp_tid_slow();
}

uint32_t mlp_thread_id(void) { return mlp_tid(); }

/* This thread holds a lock of ours (a fast word, a direction's mutex): a handler on top of a call
 * of ours, or a section a jump abandoned. */
bool mlp_holds_lock(void) { return mlp_nheld != 0; }

static inline bool mlp_fast_mine(_Atomic uint32_t *w)
{
    return (atomic_load_explicit(w, memory_order_relaxed) & MLP_FAST_TID) == mlp_tid();
}

/* The process has one thread (glibc's __libc_single_threaded, 2.32 and later; never read as
 * such elsewhere).  Then no other thread can hold, wait for or take a fast word, and taking and
 * giving one back are a plain load and store, with no locked instruction (design.md "A socket
 * never forked takes a fast word").  Only this thread can make a second one, with
 * pthread_create, which is not async-signal-safe and so not called from a handler on top of a
 * take; threads made by a raw clone are not told of (glibc's own stdio locks rely on the same
 * variable).  Once false it stays false, in a fork child too (glibc 2.36 keeps it false there;
 * one that set it true would do so where the child has one thread). */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
#include <sys/single_threaded.h>
static inline bool mlp_one_thread(void) { return __libc_single_threaded != 0; }
#else
static inline bool mlp_one_thread(void) { return false; }
#endif

/* 0: taken; EDEADLK: this thread holds it already (a section a jump abandoned). */
static int mlp_fast_lock_any(_Atomic uint32_t *w);

static inline int mlp_fast_lock(_Atomic uint32_t *w)
{
    /* The take that finds the word free, inline (the rest: mlp_fast_lock_any). */
    uint32_t me = mlp_tid_cache;
    if (ml_likely(me != 0)) {
        uint32_t v = 0;
        if (ml_likely(mlp_one_thread())) {
            /* One thread: nobody else changes the word.  A handler on top of us between the
             * load and the store finds it free and, if it takes it, gives it back before we go
             * on. */
            if (ml_likely(atomic_load_explicit(w, memory_order_relaxed) == 0)) {
                atomic_store_explicit(w, me, memory_order_relaxed);
                atomic_signal_fence(memory_order_seq_cst); /* before the section, and the look
                                                            * at the forked flag: a handler's
                                                            * fork is the only other party */
                return 0;
            }
        } else if (ml_likely(atomic_compare_exchange_strong(w, &v, me))) {
            return 0;
        }
    }
    return mlp_fast_lock_any(w);
}

/* The word found held (by this thread: a section a jump abandoned; by another: a thread of ours,
 * or, with one thread, a fork child's copy of a word a parent's thread held), or this thread's id
 * not read yet: the compare-and-swap's way, with one thread too. */
static int mlp_fast_lock_any(_Atomic uint32_t *w)
{
    uint32_t me = mlp_tid(), v = 0;
    /* seq_cst: the take comes before the look at the socket's forked flag (mlp_lock_dir). */
    if (ml_likely(atomic_compare_exchange_strong(w, &v, me)))
        return 0;
    if ((v & MLP_FAST_TID) == me)
        return EDEADLK;
    int saved = errno;
    for (unsigned spin = 0;; spin++) {
        v = atomic_load_explicit(w, memory_order_relaxed);
        if (v == 0) {
            /* After a sleep the word may have other sleepers: taken with the flag, so that our
             * give-back wakes the next one. */
            if (atomic_compare_exchange_strong(w, &v, spin < 64 ? me : me | MLP_FAST_WAITERS))
                break;
            continue;
        }
        if (spin < 64) {
            ml_cpu_relax(); /* most holders give it back within a copy (sendfile's file read and
                             * splice's pipe read are the long ones: then the futex) */
            continue;
        }
        if (!(v & MLP_FAST_WAITERS) &&
            !atomic_compare_exchange_strong(w, &v, v | MLP_FAST_WAITERS))
            continue;
        (void)__ml_sys_futex_wait(w, v | MLP_FAST_WAITERS, -1);
    }
    errno = saved;
    return 0;
}

static void mlp_fast_unlock(_Atomic uint32_t *w)
{
    if (ml_likely(mlp_one_thread()) &&
        ml_likely(!(atomic_load_explicit(w, memory_order_relaxed) & MLP_FAST_WAITERS))) {
        atomic_signal_fence(memory_order_seq_cst); /* the section's accesses before the store */
        atomic_store_explicit(w, 0, memory_order_release);
        return;
    }
    if (ml_unlikely(atomic_exchange_explicit(w, 0, memory_order_release) & MLP_FAST_WAITERS)) {
        int saved = errno;
        (void)__ml_sys_futex_wake(w, 1);
        errno = saved;
    }
}

/* Wait until no thread other than this one holds the fast word; give up at the deadline
 * (CLOCK_MONOTONIC ns; 0: never).  False: given up.  A give-back wakes one sleeper, and that
 * may be this waiter, which takes nothing and so gives nothing back: a taker asleep behind it
 * slept on for ever (the fork's drain, asleep first, took the wake-up of a sender that came
 * after it: tests/preload/forkdrain.c).  A waiter that slept passes a wake-up on as it leaves
 * (one too many wakes a taker that looks and sleeps again). */
static bool mlp_fast_drain(_Atomic uint32_t *w, uint64_t deadline)
{
    uint32_t me = mlp_tid();
    bool slept = false, done;
    int saved = errno;
    for (;;) {
        uint32_t v = atomic_load(w);
        if (v == 0 || (v & MLP_FAST_TID) == me) {
            done = true;
            break;
        }
        uint64_t now = mlp_now_ns();
        if (deadline && now >= deadline) {
            done = false;
            break;
        }
        if (!(v & MLP_FAST_WAITERS) &&
            !atomic_compare_exchange_strong(w, &v, v | MLP_FAST_WAITERS))
            continue;
        (void)__ml_sys_futex_wait(w, v | MLP_FAST_WAITERS,
                                  deadline ? (int64_t)(deadline - now) : -1);
        slept = true;
    }
    if (slept)
        (void)__ml_sys_futex_wake(w, 1);
    errno = saved;
    return done;
}

/* A socket's last reference went (mlp_put) while this thread holds one of its fast words: a
 * handler closed it on top of a call of ours that holds the socket by its word alone
 * (mlp_fast_begin).  Its teardown waits for that call's give-back (mlp_fast_finish_check). */
bool mlp_fast_defer(struct mlp_sock *s)
{
    if (ml_likely(!mlp_fast_mine(&s->ftx) && !mlp_fast_mine(&s->frx)))
        return false;
    atomic_store(&s->finish_pending, true);
    return true;
}

static void mlp_fast_finish_check(struct mlp_sock *s)
{
    if (ml_likely(!atomic_load_explicit(&s->finish_pending, memory_order_relaxed)))
        return;
    if (mlp_fast_mine(&s->ftx) || mlp_fast_mine(&s->frx))
        return; /* a call of ours beneath still holds the other */
    if (atomic_exchange(&s->finish_pending, false))
        mlp_sock_finish(s);
}

/*
 * An entry of ours for m was found: a handler re-entered a section of this thread's that is in
 * progress beneath it, or a handler siglongjmp()ed out of a section (out of its copy, or out of
 * the wait for the lock) and left the entry, and the lock if it had it, behind: then every later
 * call of this thread on that direction failed with EINTR and the other threads waited for ever.
 * Which it is, the stack says.  A section in progress beneath us is on our stack above us, by
 * at least the kernel's signal frame (over a kilobyte); one we left by a jump is not beneath us
 * any more: the call that finds its entry runs at or above where that section took the lock
 * (the same loop calling again: the same depth).  A handler on the alternate signal stack may
 * sit anywhere: there the entry is taken as a section in progress (the old answer, EINTR).
 * sp: where this call takes the lock.  True: the entry is stale (the section was abandoned).
 */
#define MLP_SIGFRAME_MIN 512

/* Entry i out of the list, which closes over it (newest last). */
static void mlp_held_drop(unsigned i)
{
    unsigned n = mlp_nheld, top = n < MLP_HELD_MAX ? n : MLP_HELD_MAX;
    for (; i + 1 < top; i++) {
        mlp_held[i] = mlp_held[i + 1];
        mlp_held_kind[i] = mlp_held_kind[i + 1];
        mlp_held_sp[i] = mlp_held_sp[i + 1];
    }
    mlp_nheld = n - 1;
}

static bool mlp_held_stale(unsigned i, uintptr_t sp)
{
    if (sp + MLP_SIGFRAME_MIN <= mlp_held_sp[i])
        return false; /* well beneath it: a handler on top of it, or a deeper call */
    stack_t ss;
    if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK))
        return false;
    return true;
}

/* 1: the lock was taken over from a dead holder, or from a section of this thread's that a
 * longjmp abandoned (the ring index must be reloaded either way); 0: taken; -1: this thread
 * already holds it (a handler re-entered us): not taken; -2: the lock cannot be taken any more
 * (see below). */
/*
 * A robust mutex this thread was inside a lock or unlock operation of when a handler jumped out
 * (mlp_lockop).  Its state is one of: not taken (before the lock's CAS, or after the unlock's
 * release), taken and on the thread's robust list (the usual state of a held lock), or taken
 * and off the list (between the lock's CAS and its enqueue, or between the unlock's dequeue and
 * its release): glibc's unlock of that last one walks the list for it and faults.  The list is
 * the kernel's robust-futex ABI (get_robust_list: nodes linked by next, the lock word at
 * futex_offset from a node), and the lock word is the kernel's (owner TID, FUTEX_WAITERS): a
 * lock taken and off the list is released here as glibc's unlock would have finished it (owner
 * 0, the word 0, waiters woken).  After this the lock is in one of the two sound states.
 * False: the list could not be read (the old answer then: the lock is left alone).
 */
static bool mlp_lockop_repair(pthread_mutex_t *m)
{
    struct robust_list_head *head = NULL;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &len) != 0 || !head)
        return false;
    _Atomic int *word = (_Atomic int *)(void *)&m->__data.__lock;
    char *node = (char *)&m->__data.__lock - head->futex_offset;
    bool on = false;
    struct robust_list *e = head->list.next;
    for (int k = 0; e != &head->list; k++) {
        if (k == 4096 || !e)
            return false;
        if ((char *)e == node) {
            on = true;
            break;
        }
        e = (struct robust_list *)((uintptr_t)e->next & ~(uintptr_t)1);
    }
    int tid = (int)mlp_tid(); /* no system call: a sandbox may kill for gettid */
    int w = atomic_load(word);
    if ((w & FUTEX_TID_MASK) == tid && !on) {
        m->__data.__owner = 0;
        if (atomic_exchange(word, 0) & FUTEX_WAITERS)
            (void)syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
    } else if ((w & FUTEX_TID_MASK) == tid && m->__data.__owner == 0) {
        /* Taken and on the list, but left before glibc's lock wrote its owner (its last step):
         * written now, as it would have, or the cleanup, which unlocks only a mutex whose
         * owner is this thread, left it taken for good (tests/preload/callleft.c's storm: a
         * nonblocking recv of another thread stuck for ever, 2 runs in 25). */
        m->__data.__owner = tid;
        m->__data.__nusers++;
    }
    mlp_lockop = NULL;
    return true;
}

/* Take m, of the kind given: 0, EOWNERDEAD, EDEADLK (this thread holds it) or the mutex's
 * error. */
static inline int mlp_take(void *m, int kind)
{
    if (kind == MLP_LK_FAST)
        return mlp_fast_lock(m);
    return mlp_mutex_lock(m);
}

static inline void mlp_give(void *m, int kind)
{
    if (kind == MLP_LK_FAST)
        mlp_fast_unlock(m);
    else
        mlp_mutex_unlock(m);
}

static int mlp_lock_any(void *m, int kind)
{
    bool robust = kind == MLP_LK_ROBUST;
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    unsigned n = mlp_nheld;
    for (unsigned i = 0; i < n && i < MLP_HELD_MAX; i++)
        if (mlp_held[i] == m && mlp_held_kind[i] != MLP_LK_LENT) {
            if (!mlp_held_stale(i, sp)) {
                if (m != mlp_spin_word || n >= MLP_HELD_MAX)
                    return -1; /* in progress beneath us */
                /* A receive's spin beneath us, between two looks: borrowed until our
                 * mlp_unlock, and not lent again meanwhile. */
                mlp_spin_word = NULL;
                mlp_held[n] = m;
                mlp_held_kind[n] = MLP_LK_BORROWED;
                mlp_held_sp[n] = sp;
                mlp_nheld = n + 1;
                return 0;
            }
            if (m == mlp_spin_word)
                mlp_spin_word = NULL; /* the spin was abandoned too */
            if (mlp_lockop == m && (!robust || !mlp_lockop_repair(m)))
                return -1; /* left half-done inside glibc, and not repairable */
            /* Abandoned: the entry is ours again.  Its section may have held the lock (EDEADLK:
             * we still do) or been waiting for it. */
            mlp_held_sp[i] = sp;
            int saved = errno;
            int r = mlp_take(m, kind);
            if (ml_unlikely(r == EOWNERDEAD))
                (void)pthread_mutex_consistent(m);
            errno = saved;
            if (r == 0 || r == EOWNERDEAD || r == EDEADLK)
                return 1;
            mlp_held_drop(i);
            return -2;
        }
    if (n < MLP_HELD_MAX) {
        mlp_held[n] = m;
        mlp_held_kind[n] = (unsigned char)kind;
        mlp_held_sp[n] = sp;
    }
    mlp_nheld = n + 1; /* after the slot: a handler sees the entry complete */
    if (ml_likely(kind == MLP_LK_FAST)) {
        if (ml_likely(mlp_fast_lock(m) == 0))
            return 0;
        /* This thread holds it and it has no entry (past the list's room): a section in
         * progress beneath us, as far as we can tell.  Not taken. */
        mlp_nheld = n;
        return -1;
    }
    int saved = errno;
    int r = mlp_mutex_lock(m);
    if (ml_unlikely(r == EOWNERDEAD))
        (void)pthread_mutex_consistent(m); /* its holder died: ours now */
    errno = saved;
    if (ml_unlikely(r != 0 && r != EOWNERDEAD)) {
        /* ENOTRECOVERABLE: a holder that died was taken over and the mutex released without
         * being made consistent, which our code never does (only a program writing over our
         * page could).  Going on unlocked could let two threads move one ring index; the
         * socket is broken instead (mlp_lock_dir): not taken, its entry out again. */
        mlp_nheld = n;
        return -2;
    }
    return r == EOWNERDEAD;
}

/* The usual case inline: this thread holds no lock of ours, so nothing of its own can be in
 * progress beneath it or abandoned, and a fast word is taken as mlp_lock_any takes it (the entry
 * first, complete before the count).  The entry's stack position is the caller's frame, a
 * little above where mlp_lock_any's would be: a handler's call sits a signal frame (over a
 * kilobyte) below it, and a later call at the caller's depth within MLP_SIGFRAME_MIN of it
 * (mlp_held_stale). */
static inline __attribute__((always_inline)) int mlp_lock(void *m, int kind)
{
    if (ml_likely(kind == MLP_LK_FAST) && ml_likely(mlp_nheld == 0)) {
        mlp_held[0] = m;
        mlp_held_kind[0] = MLP_LK_FAST;
        mlp_held_sp[0] = (uintptr_t)__builtin_frame_address(0);
        mlp_nheld = 1;
        if (ml_likely(mlp_fast_lock(m) == 0))
            return 0;
        mlp_nheld = 0; /* held already, with no entry: in progress beneath us (as below) */
        return -1;
    }
    return mlp_lock_any(m, kind);
}

static void mlp_unlock_any(void *m, int kind)
{
    int saved = errno;
    /* Usually the newest entry (a handler's calls end before the call they interrupted goes
     * on); the list closes over it, newest last. */
    unsigned n = mlp_nheld;
    unsigned top = n < MLP_HELD_MAX ? n : MLP_HELD_MAX, i = top;
    while (i > 0 && (mlp_held[i - 1] != m || mlp_held_kind[i - 1] == MLP_LK_LENT))
        i--;
    if (i > 0 && mlp_held_kind[i - 1] == MLP_LK_BORROWED) {
        /* Borrowed from a receive's spin beneath us: back to it, not to the socket. */
        mlp_held_drop(i - 1);
        mlp_spin_word = m;
        errno = saved;
        return;
    }
    mlp_give(m, kind);
    if (n > 0) {
        /* Only m's own entry goes: the search once stopped at entry 0 whatever it held, and
         * removed another lock's entry (a later re-entry then went undetected).  An m past
         * the list's room was never entered: nothing to remove but the count. */
        if (i > 0)
            mlp_held_drop(i - 1);
        else
            mlp_nheld = n - 1;
    }
    errno = saved;
}

/* The usual case inline: m is this thread's newest entry, a fast word it took itself.  As
 * mlp_unlock_any (the word given back, then its entry dropped), without the search; the
 * give-back keeps errno itself. */
static inline void mlp_unlock(void *m, int kind)
{
    unsigned top = mlp_nheld - 1u;
    if (ml_likely(kind == MLP_LK_FAST) && ml_likely(top < MLP_HELD_MAX) && mlp_held[top] == m &&
        ml_likely(mlp_held_kind[top] == MLP_LK_FAST)) {
        mlp_fast_unlock(m);
        mlp_nheld = top;
        return;
    }
    mlp_unlock_any(m, kind);
}

/*
 * A handler that runs on top of a receive's spin (mlp_rx_hold_spin) may run for as long as it
 * likes: it may block, in a receive of its own or anywhere else.  Held all that while, the
 * spin's word kept every other thread's call on the direction waiting, a nonblocking receive
 * and the socket's close too, where the kernel's socket lock is never held across a handler
 * (tests/preload/spinheld.c: the other thread's MSG_DONTWAIT receive waited for the handler, and
 * the handler for a byte that thread was to send: a hang).  So the trampoline (signals.c) lends
 * the word back to the socket for the handler's run: the socket held by a reference meanwhile
 * (its record is never freed, so the take is safe; none is taken from 0: a teardown under way
 * waits for the spin, as before), the spin's entry marked lent (no lock or unlock of ours
 * matches it: the handler's own calls take the word as any thread's do), the word given back.
 * Once the handler returns the word is taken again (another thread's holder gives it back
 * within a copy or a spin), the entry is the spin's again and the reference goes (its last:
 * the teardown waits for our give-back, mlp_fast_defer).  The spin reads shared memory only
 * and looks at the socket again before it copies (fd record, forked flag, state).  A jump out
 * of the handler leaves the entry lent: the call's cleanup puts the reference, and gives the
 * word back if it had been taken again.  A handler installed behind our back (signal(), a raw
 * rt_sigaction) is not seen here: it borrows the held word as before (mlp_lock).
 */
static struct mlp_sock *mlp_frx_sock(void *w)
{
    return (struct mlp_sock *)(void *)((char *)w - offsetof(struct mlp_sock, frx));
}

void *mlp_spin_lend(void)
{
    void *w = mlp_spin_word;
    if (ml_likely(!w))
        return NULL;
    unsigned n = mlp_nheld, top = n < MLP_HELD_MAX ? n : MLP_HELD_MAX, i = top;
    while (i > 0 && (mlp_held[i - 1] != w || mlp_held_kind[i - 1] != MLP_LK_FAST))
        i--;
    if (i == 0 || !mlp_fast_mine(w))
        return NULL;
    struct mlp_sock *s = mlp_frx_sock(w);
    int v = atomic_load_explicit(&s->refs, memory_order_relaxed);
    do {
        if (v == 0)
            return NULL;
    } while (!atomic_compare_exchange_weak(&s->refs, &v, v + 1));
    mlp_held_kind[i - 1] = MLP_LK_LENT;
    mlp_spin_word = NULL;
    atomic_signal_fence(memory_order_seq_cst);
    mlp_fast_unlock(w);
    return w;
}

void mlp_spin_unlend(void *w)
{
    if (ml_likely(!w))
        return;
    int saved = errno;
    (void)mlp_fast_lock(w); /* 0, or EDEADLK: held already */
    unsigned n = mlp_nheld, top = n < MLP_HELD_MAX ? n : MLP_HELD_MAX, i = top;
    while (i > 0 && (mlp_held[i - 1] != w || mlp_held_kind[i - 1] != MLP_LK_LENT))
        i--;
    if (i > 0)
        mlp_held_kind[i - 1] = MLP_LK_FAST;
    mlp_spin_word = w;
    atomic_signal_fence(memory_order_seq_cst);
    mlp_put(mlp_frx_sock(w));
    errno = saved;
}

/* A lent entry left by a cancellation: the word, if taken again, and the reference. */
static void mlp_lent_left(void *w)
{
    if (mlp_fast_mine(w))
        mlp_fast_unlock(w);
    mlp_put(mlp_frx_sock(w));
}

/* Cancellation (pthread_cancel) acts in a blocking wait: every lock the thread holds goes. */
static void mlp_release_held(void *unused)
{
    (void)unused;
    mlp_spin_word = NULL;
    while (mlp_nheld > 0) {
        unsigned i = --mlp_nheld;
        if (i < MLP_HELD_MAX && mlp_held_kind[i] == MLP_LK_BORROWED) {
            continue; /* the spin's own entry, beneath, gives the word back */
        } else if (i < MLP_HELD_MAX && mlp_held_kind[i] == MLP_LK_LENT) {
            mlp_lent_left(mlp_held[i]);
        } else if (i < MLP_HELD_MAX) {
            if (mlp_held_kind[i] == MLP_LK_FAST) {
                if (mlp_fast_mine(mlp_held[i]))
                    mlp_fast_unlock(mlp_held[i]);
            } else if (mlp_held[i] != mlp_lockop) {
                (void)pthread_mutex_unlock(mlp_held[i]);
            }
        }
    }
}

/*
 * A call on a connection that never returns: a signal handler siglongjmp()s out of it (wherever
 * it was: asleep, waiting for a direction's lock, or copying with the lock held), or the thread is
 * cancelled in one of its waits (recv, read, send and write are cancellation points).  Over
 * kernel TCP the interrupted system call had ended before the handler ran, and nothing of it
 * remained; here the call holds its reference to the socket (so the program's close did not end
 * the connection: the peer never read EOF) and perhaps a direction's lock (every other thread,
 * and every process sharing the socket after fork, then waited for it for ever).  The
 * interposer registers a cleanup over the call (mlp_call_begin: glibc's _pthread_cleanup_push,
 * whose buffers a longjmp's __pthread_cleanup_upto and a cancellation's unwinding run for the
 * frames they pass) that gives back the locks the call took and then its reference.  A lock
 * the call holds is given back as a section left by a jump is taken over (mlp_lock): the ring
 * position it may have moved without publishing is reloaded (the copy it was making is
 * abandoned, its bytes stay in the ring), then it is released.  A lock the jump caught inside
 * glibc's lock or unlock is repaired first when it can be (mlp_lockop_repair), else its entry is
 * left for this thread's next call, as before.  The cleanup runs in the handler's context; what it
 * touches is this thread's own list, the lock words and the socket's reference count.
 */
static void mlp_call_left(void *arg)
{
    struct mlp_call *c = arg;
    struct mlp_sock *s = c->s ? c->s : c->fast;
    if (!s)
        return;
    void *lent[MLP_HELD_MAX];
    unsigned nlent = 0;
#ifdef __GLIBC__
    int tid = -1;
    while (mlp_nheld > c->nheld) {
        unsigned i = mlp_nheld - 1;
        if (i < MLP_HELD_MAX && mlp_held_kind[i] == MLP_LK_BORROWED) {
            /* Borrowed from a receive's spin beneath (which a jump past it leaves next: its
             * own cleanup gives the word back): the position we may have moved is reloaded,
             * and the word goes back to the spin. */
            if (s->ch && mlp_held[i] == &s->frx)
                __ml_chan_resync_rx(s->ch);
            mlp_spin_word = mlp_held[i];
        } else if (i < MLP_HELD_MAX && mlp_held_kind[i] == MLP_LK_LENT) {
            /* A jump out of a handler on top of the spin: the word, if taken again, now; the
             * reference last (its put may be the socket's last: nothing of it is read after) */
            if (mlp_fast_mine(mlp_held[i]))
                mlp_fast_unlock(mlp_held[i]);
            lent[nlent++] = mlp_held[i];
        } else if (i < MLP_HELD_MAX && mlp_held_kind[i] == MLP_LK_FAST) {
            /* One atomic step each way: never half-done. */
            _Atomic uint32_t *w = mlp_held[i];
            if (mlp_fast_mine(w)) {
                if (s->ch && w == &s->ftx)
                    __ml_chan_resync_tx(s->ch);
                else if (s->ch && w == &s->frx)
                    __ml_chan_resync_rx(s->ch);
                if (mlp_spin_word == w)
                    mlp_spin_word = NULL; /* a jump out of the spin itself */
                mlp_fast_unlock(w);
            }
        } else if (i < MLP_HELD_MAX) {
            pthread_mutex_t *m = mlp_held[i];
            struct mlp_locks *l = atomic_load_explicit(&s->locks, memory_order_acquire);
            bool robust = mlp_held_kind[i] == MLP_LK_ROBUST;
            if (mlp_lockop == m && (!robust || !mlp_lockop_repair(m)))
                break; /* half-done inside glibc: left to this thread's next call (mlp_lock) */
            if (tid < 0)
                tid = (int)mlp_tid();
            if (m->__data.__owner == tid) {
                if (l && s->ch && m == &l->tx)
                    __ml_chan_resync_tx(s->ch);
                else if (l && s->ch && m == &l->rx)
                    __ml_chan_resync_rx(s->ch);
                (void)pthread_mutex_unlock(m); /* mlp_lockop may name an outer call's */
            }
        }
        mlp_nheld = i;
    }
#endif
    if (c->s) {
        c->s = NULL; /* first: a jump between the two leaks the reference, never puts it twice */
        mlp_put(s);
    } else {
        mlp_fast_finish_check(s);
        c->fast = NULL;
    }
    while (nlent > 0)
        mlp_put(mlp_frx_sock(lent[--nlent]));
}

/* The record goes on before the reference is taken and comes off after it is put, and names it
 * only while it is held: a jump anywhere leaves at most the instruction between the count and
 * the record's word (mlp_get_slot, and here) undone, a leak, never a second put. */
void mlp_call_begin(struct mlp_call *c)
{
    c->s = NULL;
    c->fast = NULL;
    c->nheld = mlp_nheld;
    mlp_left_push(&c->buf, mlp_call_left, c);
}

void mlp_call_end(struct mlp_call *c)
{
    struct mlp_sock *s = c->s;
    c->s = NULL;
    if (s)
        mlp_put(s);
    mlp_left_pop(&c->buf);
}

/* ml_wait() calls this before each sleep and after an interrupted one (channel.c): a blocking
 * call on an accelerated socket is a cancellation point, as the kernel's is, and the count of
 * handlers without SA_RESTART that ran here decides whether an interrupted call restarts. */
/*
 * Regions kept while their sender sends nothing (design.md, "Rings grow").  A sender's region
 * pages go back when it next finds everything read a second after its growth, at its next send;
 * one that stopped sending after a burst (a keep-alive server after a large response) kept them
 * until its close.  So each growth lists the socket here (its fd; a free slot taken by CAS,
 * nothing that a handler cannot do; a full list leaves the socket out, as before), and the
 * wake-ups that every sleep of ours makes anyway (the liveness interval's, at most a second
 * apart: blocking calls, poll, select, epoll) walk the list once it is due: each socket's send
 * lock tried (never waited for: a send in progress does the same itself), its producer's idle
 * look made (__ml_chan_grow_settle), signals blocked meanwhile (a handler's send on the socket
 * would find the lock held by its own thread; a jump out of the handler would leave it held).
 * Sockets shared after fork (a robust lock) are left to their sends and their close.
 */
#define MLP_KEPT_MAX 1024u
static _Atomic int mlp_kept[MLP_KEPT_MAX]; /* fd + 1; 0: free */
static _Atomic uint32_t mlp_kept_next;
static _Atomic uint64_t mlp_kept_due;      /* CLOCK_MONOTONIC ns of the next walk; 0: none */

static void mlp_kept_due_at(uint64_t t)
{
    uint64_t cur = atomic_load_explicit(&mlp_kept_due, memory_order_relaxed);
    while ((cur == 0 || t < cur) &&
           !atomic_compare_exchange_weak_explicit(&mlp_kept_due, &cur, t, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* ml_grow's note, under the socket's send lock (perhaps in a handler). */
static void mlp_grow_note(struct memlan_channel *ch)
{
    int fd = ch->sock_fd;
    if (!ch->sock_ino || fd < 0 || fd == INT32_MAX)
        return;
    uint32_t at = ch->grow_slot;
    if (at && at <= MLP_KEPT_MAX && atomic_load_explicit(&mlp_kept[at - 1], memory_order_relaxed) ==
                                        fd + 1) {
        mlp_kept_due_at(__ml_now_ns() + __ml_chan_grow_keep_ns());
        return;
    }
    uint32_t start = atomic_fetch_add_explicit(&mlp_kept_next, 1, memory_order_relaxed);
    for (uint32_t k = 0; k < MLP_KEPT_MAX; k++) {
        uint32_t i = (start + k) % MLP_KEPT_MAX;
        int none = 0;
        if (atomic_load_explicit(&mlp_kept[i], memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&mlp_kept[i], &none, fd + 1)) {
            ch->grow_slot = i + 1;
            mlp_kept_due_at(__ml_now_ns() + __ml_chan_grow_keep_ns());
            return;
        }
    }
}

/* One listed socket, in slot i (v: its value): its idle look, signals blocked while its send
 * lock is held.  The slot is freed under the lock when no pages are kept (freed after it, a
 * growth in between found its slot still taken and did not list itself again).  true: more to
 * do later. */
static bool mlp_kept_settle(uint32_t i, int v)
{
    struct mlp_sock *s = mlp_get(v - 1);
    bool more = false;
    if (!s || s->type != MLP_CONN || !s->ch || s->state != MLP_ACCEL || atomic_load(&s->forked)) {
        (void)atomic_compare_exchange_strong(&mlp_kept[i], &v, 0); /* not ours to look at */
    } else {
        sigset_t all, old;
        sigfillset(&all);
        uint32_t none = 0;
        if (pthread_sigmask(SIG_BLOCK, &all, &old) != 0) {
            more = true;
        } else {
            if (atomic_compare_exchange_strong(&s->ftx, &none, mlp_tid())) {
                /* A fork prepared meanwhile: its handler set the flag before it waits for us. */
                more = !atomic_load(&s->forked) && __ml_chan_grow_settle(s->ch);
                if (!more) /* freed under the lock: after it, a growth may have listed the
                            * socket anew in the same slot */
                    (void)atomic_compare_exchange_strong(&mlp_kept[i], &v, 0);
                mlp_fast_unlock(&s->ftx);
            } else {
                more = true; /* a send holds it now, or a thread waits for it: again later */
            }
            (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
        }
    }
    if (s)
        mlp_put(s);
    return more;
}

/* At a return of a sleep of ours (or of a poll that did not sleep): the walk, when due. */
void mlp_kept_tick(void)
{
    uint64_t due = atomic_load_explicit(&mlp_kept_due, memory_order_relaxed);
    if (ml_likely(due == 0))
        return;
    int saved = errno;
    uint64_t now = __ml_now_ns();
    if (now < due || mlp_vfork_child() || mlp_sig_in_handler() ||
        !atomic_compare_exchange_strong(&mlp_kept_due, &due, 0)) {
        errno = saved;
        return; /* not yet, or another thread walks */
    }
    bool more = false;
    for (uint32_t i = 0; i < MLP_KEPT_MAX; i++) {
        int v = atomic_load_explicit(&mlp_kept[i], memory_order_relaxed);
        if (v > 0 && mlp_kept_settle(i, v))
            more = true;
    }
    errno = saved;
    if (more)
        mlp_kept_due_at(now + __ml_chan_grow_keep_ns() / 4);
}

static unsigned mlp_wait_hook(void)
{
    mlp_kept_tick();
    pthread_cleanup_push(mlp_release_held, NULL);
    pthread_testcancel();
    pthread_cleanup_pop(0);
    return mlp_sig_nores_count();
}

/* One of our fds other than skip whose record holds s (or, s NULL, a socket on channel ch);
 * -1 if none.  With s given no other socket is looked into. */
static int mlp_chan_fd(const struct mlp_sock *s, const struct memlan_channel *ch, int skip)
{
    int max = mlp_fd_max();
    for (int f = mlp_fdrec_next(0, max); f >= 0; f = mlp_fdrec_next(f + 1, max)) {
        struct mlp_fdrec *r = mlp_fdrec(f);
        struct mlp_sock *o = r ? atomic_load_explicit(&r->sock, memory_order_acquire) : NULL;
        if (f != skip && o && (s ? o == s : o->ch == ch))
            return f;
    }
    return -1;
}

/* fd, the number the channel's liveness looks ask the kernel socket through (ch->sock_fd), no
 * longer names it, and others of ours do (an inetd's child, vsftpd's session: dup2 onto 0, 1 and
 * 2, then a close of the first): the looks go through one of those.  Kept, they asked a number
 * that named another file (vsftpd's log), could not tell the peer's end, and a session whose
 * client was killed, unable to open the channel's file by name (it dropped its privileges),
 * waited in recv for ever (an explorer). */
void mlp_sock_fd_moved(struct mlp_sock *s, int fd)
{
    int f = mlp_chan_fd(s, NULL, fd);
    if (f >= 0)
        s->ch->sock_fd = f;
}

/* The channel's question at an urgent byte (channel.c, ml_urg_inline): the kernel socket's
 * SO_OOBINLINE, set before the connection was ours (on the listener, or before connect); one
 * that setsockopt sets later is noted directly (mlp_setsockopt).  No system call where a filter
 * may kill it: not in line then, TCP's default. */
static bool mlp_urg_inline_ask(struct memlan_channel *ch)
{
    if (!ch->sock_ino || mlp_known_confined() || mlp_cred_lost(false))
        return ch->urg_inline;
    int saved = errno, fd = ch->sock_fd;
    struct stat st;
    if (fd < 0 || __ml_sys_fstat(fd, &st) < 0 || (uint64_t)st.st_ino != ch->sock_ino) {
        /* The connection's first number was moved (dup2 and close, as an inetd's child does)
         * or is another file now: one of ours that holds this channel. */
        fd = mlp_chan_fd(NULL, ch, -1);
    }
    int v = 0;
    socklen_t l = sizeof v;
    bool on = fd >= 0 ? mlp_real_getsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &v, &l) == 0 && v
                      : ch->urg_inline;
    errno = saved;
    return on;
}

__attribute__((constructor)) static void mlp_wait_hook_init(void)
{
    __ml_mb_off(); /* before any channel, whichever of our constructors runs first */
    __ml_yield_off(); /* and no wait gives its cpu away: see __ml_yield_budget_ns() */
    __ml_wait_hook = mlp_wait_hook;
    __ml_grow_note = mlp_grow_note;
    __ml_intr_count = mlp_sig_runs;
    __ml_intr_any = mlp_sig_runs_any;
    __ml_urg_inline_hook = mlp_urg_inline_ask;
}

/* Take a direction's lock: 0, or what the call returns instead: -EAGAIN (nb) or -EINTR when a
 * handler re-entered this thread's holder of it, -ECONNRESET when the lock is broken (said once
 * per socket; every later call on that direction fails the same way, as on a reset).
 *
 * A socket that was never in the table at a fork is used by this process alone: its threads take
 * turns on the fast word.  One that was (its forked flag, set for good by the prepare handler
 * before the fork) may be held by another process, which takes the robust mutex: so does every
 * holder from then on.  The switch: a taker of the fast word looks at the flag after its take
 * (both sequentially consistent), and the prepare handler sets the flag and then waits until
 * nobody else holds the fast word (mlp_fast_drain).  A taker that read the flag clear took the
 * word before the handler set it, and the handler waits for it; one that finds it set gives the
 * word back untouched and takes the mutex.  So after the fork nobody uses the fast word alone.
 * A robust taker still waits for the fast word to be free (a load of a line it has just
 * written): the prepare handler gives up waiting after MLP_FORK_DRAIN_NS (a holder stuck in
 * a pipe read of splice), and that holder must finish before a robust one starts. */
static int mlp_lock_dir(struct mlp_sock *s, bool nb, bool tx)
{
    _Atomic uint32_t *f = tx ? &s->ftx : &s->frx;
    int r;
    if (ml_likely(!atomic_load_explicit(&s->forked, memory_order_relaxed))) {
        r = mlp_lock(f, MLP_LK_FAST);
        if (ml_likely(r == 0) && ml_likely(!atomic_load(&s->forked)))
            return 0;
        if (r == 1 && !atomic_load(&s->forked))
            goto resync; /* a section of ours a jump abandoned: its position may have moved */
        if (r == -1)
            return nb ? -EAGAIN : -EINTR;
        mlp_unlock(f, MLP_LK_FAST); /* a fork is being prepared: the mutex from now on */
    }
    if (ml_unlikely(mlp_fast_mine(f))) {
        /* This thread holds the fast word: a section beneath us that a handler interrupted
         * (not taken, as above), or one a jump abandoned before the fork (its position is
         * reloaded below). */
        if (mlp_lock(f, MLP_LK_FAST) != 1)
            return nb ? -EAGAIN : -EINTR;
        mlp_unlock(f, MLP_LK_FAST);
    }
    if (ml_unlikely(atomic_load_explicit(&s->stat_owed, memory_order_relaxed)))
        mlp_stat_inherited(s); /* a fork child's first use: before any lock of the socket */
    struct mlp_locks *l = mlp_locks_share(s);
    pthread_mutex_t *m = tx ? &l->tx : &l->rx;
    r = mlp_lock(m, l == &s->own_locks ? MLP_LK_PRIVATE : MLP_LK_ROBUST);
    if (r == -1)
        return nb ? -EAGAIN : -EINTR;
    if (r == -2) {
        if (!atomic_exchange(&s->lock_broken, true))
            mlp_log(0, "channel %s: the socket's %s lock is unrecoverable (its page was "
                       "overwritten); reporting a reset", s->ch ? s->ch->seg->token : "?",
                    tx ? "send" : "receive");
        return -ECONNRESET;
    }
    if (ml_unlikely(atomic_load_explicit(f, memory_order_relaxed) != 0))
        (void)mlp_fast_drain(f, 0);
    /* Another process (after fork) or a holder that died may have had it: the ring index it
     * owns may have moved.  (A socket made after the last fork never comes here: a forking
     * server's worker and the connections it accepts skip this resync, which reads the lock
     * page's published positions and the channel's, 3.7 % of a 64 B ping-pong client's cycles
     * under perf, the client having forked its echo child.) */
resync:
    if (tx)
        __ml_chan_resync_tx(s->ch);
    else
        __ml_chan_resync_rx(s->ch);
    return 0;
}

/* Give back what mlp_lock_dir took: the fast word if this thread holds it, else the mutex. */
static void mlp_unlock_dir(struct mlp_sock *s, bool tx)
{
    _Atomic uint32_t *f = tx ? &s->ftx : &s->frx;
    if (ml_likely(mlp_fast_mine(f)))
        mlp_unlock(f, MLP_LK_FAST);
    else {
        struct mlp_locks *l = mlp_locks_of(s);
        mlp_unlock(tx ? &l->tx : &l->rx, l == &s->own_locks ? MLP_LK_PRIVATE : MLP_LK_ROBUST);
    }
}

int mlp_lock_tx(struct mlp_sock *s, bool nb) { return mlp_lock_dir(s, nb, true); }
void mlp_unlock_tx(struct mlp_sock *s) { mlp_unlock_dir(s, true); }
int mlp_lock_rx(struct mlp_sock *s, bool nb) { return mlp_lock_dir(s, nb, false); }
void mlp_unlock_rx(struct mlp_sock *s) { mlp_unlock_dir(s, false); }

/* ---- flags ------------------------------------------------------------------------------- */

bool mlp_nonblock(struct mlp_sock *s)
{
    return (atomic_load_explicit(&mlp_locks_of(s)->fl, memory_order_relaxed) &
            MLP_FL_NONBLOCK) != 0;
}

/* Written only when it changes: every call reads the line.  A private word marked moved sends
 * the setter to the page (mlp_locks_share publishes it right after the mark, signals blocked). */
void mlp_set_nonblock(struct mlp_sock *s, bool on)
{
    for (;;) {
        struct mlp_locks *l = mlp_locks_of(s);
        _Atomic uint32_t *fl = &l->fl;
        uint32_t v = atomic_load_explicit(fl, memory_order_relaxed);
        if (v & MLP_FL_MOVED) {
            while (mlp_locks_of(s) == l)
                ml_cpu_relax();
            continue;
        }
        if (((v & MLP_FL_NONBLOCK) != 0) == on)
            return;
        v = on ? atomic_fetch_or(fl, MLP_FL_NONBLOCK) : atomic_fetch_and(fl, ~MLP_FL_NONBLOCK);
        if (!(v & MLP_FL_MOVED))
            return;
    }
}

/* ---- errors ------------------------------------------------------------------------------ */

/* Did the peer abort, as the kernel would report with a reset?  It closed with bytes we sent
 * unread, or with SO_LINGER set to zero (its block says so), or it died leaving bytes unread. */
/* Did the peer's kernel answer with a reset?  ECONNRESET: it closed (or died) with our bytes
 * unread, or with SO_LINGER 0, a reset instead of a FIN.  EPIPE: it had closed with a FIN and we
 * wrote once more, or it closed with our bytes unread after its FIN (the kernel reports a reset
 * on a socket whose end it already has as EPIPE, and recv never reports it).  0: neither.
 * *after_fin (if asked): the peer's FIN came before the reset, which recv does not report. */
static int mlp_peer_aborted(struct mlp_sock *s, bool probe, bool *after_fin)
{
    uint32_t ps = __ml_chan_peer_state(s->ch);
    bool late = (atomic_load(&s->me->flags) & ML_SOCK_WROTE_LATE) != 0;
    /* A reset after the peer's FIN (it shut down writing, then closed or died with our bytes
     * unread): the kernel has the end already (SOCK_DONE), so recv reads it, never the reset,
     * and the reset's error is EPIPE (CLOSE_WAIT); none at all when we had shut down too (the
     * peer's kernel, with both ends' FINs, closes without a reset).  Apache's lingering close
     * did this to ab's keep-alive connections (tests/preload/finreset.c). */
    bool fin = false;
    int e = 0;
    if (ps == ML_SIDE_CLOSED) {
        uint32_t pf = atomic_load(&mlp_side_block(s->ch, 1 - s->side)->flags);
        fin = (pf & ML_SOCK_RESET_AFTER_FIN) != 0;
        if (pf & ML_SOCK_RESET)
            e = !fin ? ECONNRESET : EPIPE; /* none when we had shut down first: the closer
                                             * set no ML_SOCK_RESET then */
        else
            e = late ? EPIPE : 0;
    } else {
        /* Whether it died: probing its liveness costs system calls, so only error paths probe;
         * readiness and end-of-stream reads use what is known (the kernel FIN sets it). */
        bool dead = probe ? __ml_chan_check_peer(s->ch) != 0 : s->ch->peer_dead;
        if (!dead)
            return 0;
        fin = ps == ML_SIDE_SHUT_WR;
        /* split: it talks TCP, see channel.c; SO_LINGER 0: the kernel's close at its end
         * aborts */
        if (s->ch->split || __ml_chan_peer_left_unread(s->ch) ||
            (atomic_load(&mlp_side_block(s->ch, 1 - s->side)->flags) & ML_SOCK_LINGER0))
            e = !fin || s->ch->split                          ? ECONNRESET
                : s->ch->shut_wr && !s->ch->dead_before_fin ? 0
                                                            : EPIPE;
        else
            e = late ? EPIPE : 0;
    }
    if (after_fin)
        *after_fin = fin;
    return e;
}

/* A write to a peer that has closed (not just shut down its writing side): TCP takes the first
 * one, and the peer's kernel answers it with a reset that the calls after it report.  True if
 * this write is that first one (its bytes are dropped, as the peer's kernel drops them).  The
 * reset makes the socket POLLERR|POLLHUP: our own queue hears of it, so that an edge-triggered
 * member reports that edge, as the kernel's reset wakes its epoll (nobody posted it: the edge
 * never came, tests/preload/etreset.c). */
static bool mlp_write_after_close(struct mlp_sock *s)
{
    if (s->ch->shut_wr || mlp_reset_state(s, true) != 0)
        return false;
    if (__ml_chan_peer_state(s->ch) != ML_SIDE_CLOSED && !__ml_chan_check_peer(s->ch))
        return false;
    if (atomic_fetch_or(&s->me->flags, ML_SOCK_WROTE_LATE) & ML_SOCK_WROTE_LATE)
        return false;
    __ml_chan_post_self(s->ch);
    return true;
}

/* How much of a write that mlp_write_after_close let through TCP takes: what its send buffer
 * holds, the ring's size here.  It took the whole write (a blocking sendall of 10 MiB to a
 * peer that had read everything and closed returned as sent, where TCP fails the next call
 * with EPIPE: CPython's test_sendfile_close_peer_in_the_middle_of_receiving, an explorer's). */
static size_t mlp_late_take(struct mlp_sock *s, size_t want)
{
    size_t cap = s->ch->size ? (size_t)s->ch->size : 1;
    if (cap > ML_INT_MAX_IO)
        cap = ML_INT_MAX_IO;
    return want < cap ? want : cap;
}

/* 0: no reset; 1: a reset not yet reported; 2: reported (the kernel's socket is closed then). */
int mlp_reset_state(struct mlp_sock *s, bool probe)
{
    if (!s->ch || !s->me || !mlp_peer_aborted(s, probe, NULL))
        return 0;
    return (atomic_load(&s->me->flags) & ML_SOCK_RESET_TOLD) ? 2 : 1;
}

/* Report the reset: its errno for the one call that reports it, as the kernel's sk_err is read
 * and cleared once, by whichever thread or process asks first; 0 for every other call.
 * by_recv: recv reports only a reset that came instead of the peer's FIN. */
int mlp_reset_take(struct mlp_sock *s, bool probe, bool by_recv)
{
    if (!s->ch || !s->me || (atomic_load(&s->me->flags) & ML_SOCK_RESET_TOLD))
        return 0;
    bool after_fin = false;
    int e = mlp_peer_aborted(s, probe, &after_fin);
    if (!e || (by_recv && (e != ECONNRESET || after_fin)))
        return 0;
    return (atomic_fetch_or(&s->me->flags, ML_SOCK_RESET_TOLD) & ML_SOCK_RESET_TOLD) ? 0 : e;
}

static ssize_t mlp_rx_error(struct mlp_sock *s, ssize_t r)
{
    /* Disconnected (connect(AF_UNSPEC)) while this call waited: the kernel's blocked recv ends
     * with EPIPE (its sk_disconnects), the reset left for the next call. */
    if ((r == 0 || r == -ECONNRESET) && atomic_load(&s->disconnected))
        return -EPIPE;
    if (r == -ECONNRESET || r == 0) /* the peer died, or its end came: a reset first, once */
        return mlp_reset_take(s, r != 0, true) ? -ECONNRESET : 0;
    if (r == -EPROTO) {
        mlp_log(0, "channel %s: corrupt indices from the peer; reporting a reset",
                s->ch->seg->token);
        return -ECONNRESET;
    }
    return r;
}

static ssize_t mlp_tx_error(struct mlp_sock *s, ssize_t r, int flags)
{
    if (r == -EPROTO) {
        mlp_log(0, "channel %s: corrupt indices from the peer; reporting a reset",
                s->ch->seg->token);
        return -ECONNRESET;
    }
    if ((r == -ECONNRESET || r == -EPIPE) && atomic_load(&s->disconnected)) {
        /* Disconnected (connect(AF_UNSPEC)) while this call waited: as the kernel's send ends
         * then, its socket's pending error (the disconnect's ECONNRESET), read and cleared,
         * else EPIPE.  Left in the kernel socket, the next send reported it again. */
        int e = 0, saved = errno;
        socklen_t el = sizeof e;
        if (mlp_real_getsockopt(s->ch->sock_fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
            e = 0;
        errno = saved;
        r = e ? -e : -EPIPE;
    } else if (r == -ECONNRESET || r == -EPIPE) {
        /* A reset instead of a FIN: ECONNRESET, without SIGPIPE; anything else: EPIPE. */
        r = mlp_reset_take(s, true, false) == ECONNRESET ? -ECONNRESET : -EPIPE;
    }
    if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
        raise(SIGPIPE);
    return r;
}

/* A socket that fell to TCP: send what its ring still holds before anything else.  0 when
 * nothing is left, else the kernel's error (-EAGAIN when nonblocking and full).  The lock is held
 * only while bytes move: a blocking catch-up waits for the kernel socket's room without it. */
/*
 * shutdown(SHUT_WR) on an undecided socket waited for the claim, so that the peer got the
 * ring's bytes before the EOF: up to the accept wait (2 s) and then TCP when the server had not
 * accepted yet, on a nonblocking socket too, where the kernel's shutdown returns at once (an
 * event loop stood still: tests/preload/shutundecided.c).  Now the EOF goes into the ring after
 * the bytes, at once, and the kernel socket's shutdown is owed until the socket settles: at the
 * claim (the peer reads both from the ring, and the kernel socket is shut as an accelerated
 * one's is), or once the ring's bytes are out over TCP (mlp_tcp_catch_up).  Exactly once: the
 * flag is taken by an exchange.  errno is kept.
 */
void mlp_shut_owed_pay(struct mlp_sock *s, int fd)
{
    if (ml_likely(!atomic_load_explicit(&s->shut_owed, memory_order_relaxed)) ||
        !atomic_exchange(&s->shut_owed, false))
        return;
    int saved = errno;
    (void)mlp_real_shutdown(fd, SHUT_WR);
    errno = saved;
}

int mlp_tcp_catch_up(struct mlp_sock *s, int fd, bool block)
{
    const void *p;
    /* The look without the lock reads our own copy of the positions: a fork sibling's may lag
     * behind what another holder put into the ring (it said "nothing unsent", and a child's
     * send went over TCP ahead of its parent's 1 MiB: a review).  A shared socket looks at the
     * head its holders publish (the lock page's word), and takes the lock, which resyncs the
     * copies, only when bytes are there: not at every send and poll of a socket on TCP. */
    if (!s->ch || (atomic_load_explicit(&s->forked, memory_order_relaxed)
                       ? __ml_chan_tx_queued(s->ch) == 0
                       : !__ml_chan_unsent(s->ch, &p))) {
        if (s->ch && s->state == MLP_TCP)
            mlp_shut_owed_pay(s, fd);
        return 0;
    }
    int saved = errno; /* errors are returned; a success leaves errno as it was */
    for (;;) {
        int e = mlp_lock_tx(s, !block);
        if (e < 0)
            return e;
        e = mlp_flush_unsent(s, fd, false);
        mlp_unlock_tx(s);
        if (e == 0 && s->state == MLP_TCP)
            mlp_shut_owed_pay(s, fd); /* after the ring's bytes, the FIN */
        if (e != -EAGAIN || !block) {
            errno = saved;
            return e;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (mlp_real_poll(&pf, 1, 1000) < 0 && errno != EINTR) {
            e = -errno;
            errno = saved;
            return e;
        }
    }
}

/* ---- waiting ----------------------------------------------------------------------------- */

/*
 * Locks are never held across a sleep.  A blocking call takes the direction's lock, moves what
 * it can without waiting, and when it must wait it lets the lock go, sleeps on the channel's
 * shared indices (__ml_chan_wait_ro), and takes the lock again to look afresh: what came may have
 * gone to another thread meanwhile, as in the kernel, whose socket calls release the socket lock
 * while they wait (sk_wait_data, sk_stream_wait_memory).  So a nonblocking call never waits
 * behind a sleeping one, a handler can use the socket its thread was asleep on, and a handler
 * that siglongjmp()s out of the sleep leaves nothing held.  The rule for streams is the kernel's:
 * one recv returns bytes that were contiguous in the stream (one copy under the lock); a
 * blocking send keeps its bytes in order, and another thread's send may land between the pieces
 * of one that had to wait for room (as two blocking sends on a kernel TCP socket do); see
 * design.md, "Threads and locks".
 */

/* The deadline of a blocking call: SO_RCVTIMEO/SO_SNDTIMEO count from its first wait, for the
 * whole call, as the kernel counts its timeout down across the waits of one call. */
static uint64_t mlp_call_deadline(uint64_t *dl, uint64_t tmo_ns)
{
    if (tmo_ns && !*dl) {
        uint64_t now = __ml_now_ns();
        *dl = tmo_ns < UINT64_MAX - now ? now + tmo_ns : 0; /* past the clock's end: none */
    }
    return *dl;
}

/* A SO_RCVTIMEO/SO_SNDTIMEO value in ns, 0 for none; one of 31 years or more counts as 31 years:
 * still a timeout, as the kernel keeps it (any handler ends the call), where the product
 * wrapped round (a tv_sec of 18446744074 fired at 0.29 s: a review). */
static uint64_t mlp_tv_ns(const struct timeval *tv)
{
    if (tv->tv_sec < 0 || tv->tv_usec < 0 || (tv->tv_sec == 0 && tv->tv_usec == 0))
        return 0; /* the kernel refuses a negative one; 0 is none */
    if (tv->tv_sec >= 1000000000)
        return 1000000000ull * 1000000000u;
    return (uint64_t)tv->tv_sec * 1000000000u + (uint64_t)tv->tv_usec * 1000u;
}

/*
 * What kernel TCP's buffers take into a connection before its server accepts it, and so what a
 * blocking send takes there without waiting: the socket's send buffer, which grows to tcp_wmem's
 * default maximum, 4 MiB.  An undecided ring grows into its region as an accepted one does, up
 * to half of that (negotiate.c, mlp_offer_takes: a withdrawal must send it all over TCP at
 * once; lower after SO_SNDBUF); one that cannot grow (a seccomp filter, a full fabric,
 * SO_SNDBUF before connect) holds MEMLAN_RING_KB.  A blocking send that finds it full, or at
 * the offer's limit (a send of 2 to 4 MiB: the kernel would take it at once), waits for the
 * decision: a wait the kernel's call does not have for a call of this size or less, so neither
 * SO_SNDTIMEO nor a handler ends it (a 1 MiB send with a 1 s SO_SNDTIMEO returned 256 KiB, then
 * EAGAIN, where the kernel takes it all at once: a review).  A larger call would wait in the
 * kernel too, and its wait ends as that one would.
 */
#define MLP_KERNEL_TAKES (4u << 20)

/*
 * A send into an undecided socket (mlp_send, sendfile, splice) writes into its ring, to go out
 * over TCP first if the connection falls to it; a blocking one that finds the ring full waits
 * for the decision (MLP_KERNEL_TAKES: a call that can move n bytes; dl, its deadline).  Sendfile
 * and splice used to wait for the decision first, a nonblocking one too, and with SO_SNDTIMEO a
 * blocking one then failed with EAGAIN where the kernel's buffers take the bytes at once (a
 * review).  The state, or -EINTR, -EAGAIN.
 */
static int mlp_tx_decide_full(struct mlp_sock *s, int fd, size_t n, uint64_t *dl)
{
    /* n: what the call can move, not what it asks (a splice of 1 GiB from a pipe that holds
     * 64 KiB, a sendfile past the file's end: the kernel takes those at once, a review). */
    return n > MLP_KERNEL_TAKES
               ? mlp_decide_call(s, fd, mlp_call_deadline(dl, s->ch->tx_tmo_ns), false)
               : mlp_decide(s, fd, true);
}

/* Sleep, holding no lock of the socket, until the direction (0 receive, 1 send: want bytes of
 * room) may have moved.  0: take the lock and look again; -EAGAIN: the timeout ran out; -EINTR. */
/*
 * The end of a connection whose last peer process left without a close of ours (its _exit, a
 * signal, a failed exec after fork, the child of a fork that never closed its copy) is told by
 * no code of the peer's: only the kernel knows, by the FIN of the kernel socket under the
 * channel, which goes when the last process holding it goes, and by the peer's liveness lock.
 * The ring's futex cannot watch a socket, so a blocking call sleeps on the futex only for
 * MLP_SLICE_NS (a request and its answer, where a wake-up's cost matters), then in ppoll with
 * the kernel socket (mlp_sock_sleep, poll.c), where the FIN wakes it at once and the lock then
 * decides.  Before, it learned of such an end only at its next liveness look (100 ms, doubling
 * to 1 s while it waited): about 0.9 s late (tests/preload/forkexit.c).  Where that sleep cannot
 * be (mlp_sock_sleep says -ENOSYS: more threads than it makes eventfds for, no event queue, a
 * vfork child, ...) the call sleeps on the futex in slices, the first of MLP_LOOK_NS, each after
 * doubled up to MLP_LOOK_MAX_NS, and between two looks at the kernel socket (mlp_end_look: an
 * fstat and a zero-timeout ppoll), and at the peer's liveness at the liveness interval's pace as
 * the futex sleep would: so that the end is seen within about 50 ms of a short wait and 200 ms
 * of a long one, rather than 0.9 s (forkexit many-recv: 72 receivers, past the 64 eventfds that
 * a limit of 1024 fds gives).  A long wait costs 5 wake-ups a second (a futex return, two system
 * calls), not the 20 that 50 ms slices cost: 300 threads blocked on idle connections, 236 of
 * them past the eventfds, used 6 % of a cpu so (tests/preload/idlewake.c).
 */
#define MLP_LOOK_NS 50000000ull
#define MLP_LOOK_MAX_NS 200000000ull

/*
 * A blocking send that waits for room while nothing moves either way: our ring full and not
 * drained, the peer's ring to us holding at least half a ring that nobody here reads, and
 * neither index moving for MLP_STALL_NS (10 s: a peer that is only slow, paused or computing,
 * moves within that, as a review found with 2 s).  Both ends writing before they read wait for
 * each other so for ever where kernel TCP's larger buffers may have held the exchange (docs/
 * design.md, "Rings grow"): said once per socket, in the log, and on stderr once per
 * image, with the way out (larger rings), rather than a silent hang.  Read-only looks at the
 * shared indices (a peer's garbage only makes us say it or not); not from a handler, nor in a
 * known sandbox.
 */
#define MLP_STALL_NS 10000000000ull

struct mlp_stall {
    uint64_t t0, tail, head;
};

/* A socket's own (or its peer's) port, 0 if it cannot be told. */
static int mlp_port_of(int fd, bool peer)
{
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    int r = peer ? getpeername(fd, (struct sockaddr *)&ss, &l)
                 : getsockname(fd, (struct sockaddr *)&ss, &l);
    if (r < 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

static void mlp_stall_look(struct mlp_sock *s, struct mlp_stall *st)
{
    if (atomic_load_explicit(&s->stall_told, memory_order_relaxed) || mlp_sig_in_handler() ||
        mlp_known_confined())
        return; /* (a sandbox's filter may kill the calls that name the ports and say it) */
    struct memlan_channel *ch = s->ch;
    int64_t in = __ml_chan_rx_avail_ro(ch);
    uint64_t tail = ml_load_relaxed(&ch->tx.ctl->tail), head = ml_load_relaxed(&ch->rx.ctl->head);
    uint64_t now = mlp_now_ns();
    if (in < (int64_t)(ch->size / 2) || !st->t0 || tail != st->tail || head != st->head) {
        *st = (struct mlp_stall){in < (int64_t)(ch->size / 2) ? 0 : now, tail, head};
        return;
    }
    if (now - st->t0 < MLP_STALL_NS || atomic_exchange(&s->stall_told, true))
        return;
    int saved = errno, inside = mlp_inside;
    mlp_inside = 1; /* the kernel socket's names, past our interposers */
    int lp = mlp_port_of(ch->sock_fd, false), rp = mlp_port_of(ch->sock_fd, true);
    mlp_inside = inside;
    /* The region counts where the ring may still grow or has grown. */
    bool region = ch->tx.gsize && !atomic_load_explicit(&ch->grow_off, memory_order_relaxed);
    mlp_say(MLP_SAID_STALL, "a send from port %d to port %d has waited %llu s for room in its "
            "%llu KiB ring%s%.0llu%s while %lld bytes from the peer wait unread: if both ends "
            "write before they read, they wait for each other, where kernel TCP's larger "
            "buffers may have held it (design.md, \"Rings grow\"); larger rings: "
            "MEMLAN_RING_GROW_KB, MEMLAN_RING_KB, or SO_SNDBUF/SO_RCVBUF before connect", lp, rp,
            (unsigned long long)((now - st->t0) / 1000000000ull),
            (unsigned long long)(ch->size >> 10), region ? " and its " : "",
            region ? (unsigned long long)(ch->tx.gsize >> 10) : 0ull,
            region ? " KiB region" : "", (long long)in);
    errno = saved;
}

static int mlp_wait_long_from(struct mlp_sock *s, int dir, uint64_t want, uint64_t deadline,
                              int64_t *livep);

/* The liveness interval starts where the thread's last quiet wait left it (mlp_live_begin): a
 * receive with SO_RCVTIMEO of a second, again and again on an idle connection, slept 100, 200,
 * 400 and 300 ms in each, four wake-ups a second where kernel TCP has one. */
static int mlp_wait_long(struct mlp_sock *s, int dir, uint64_t want, uint64_t deadline)
{
    int64_t live = mlp_live_begin();
    int r = mlp_wait_long_from(s, dir, want, deadline, &live);
    mlp_live_end(live, r == -EAGAIN ? 0 : 1);
    return r;
}

static int mlp_wait_long_from(struct mlp_sock *s, int dir, uint64_t want, uint64_t deadline,
                              int64_t *livep)
{
    /* As ml_wait does (channel.c): a handler without SA_RESTART, or any with a deadline, ends
     * the wait with EINTR; one with SA_RESTART does not. */
    unsigned (*count)(void) = deadline && __ml_intr_any ? __ml_intr_any : __ml_intr_count;
    unsigned runs0 = count ? count() : 0;
    int64_t flive = ML_LIVENESS_NS;
    uint64_t next_live = 0, look = MLP_LOOK_NS;
    struct mlp_stall stall = {0, 0, 0};
    for (;;) {
        if (__ml_chan_ready_ro(s->ch, dir, want))
            return 0;
        if (dir == 1)
            mlp_stall_look(s, &stall);
        unsigned intr0 = __ml_wait_hook ? __ml_wait_hook() : 0; /* a cancellation point */
        if (count && count() != runs0)
            return __ml_chan_ready_ro(s->ch, dir, want) ? 0 : -EINTR;
        int r = mlp_sock_sleep(s, dir, want, deadline, livep);
        if (r == -ENOSYS) { /* the futex, a slice at a time (above) */
            uint64_t now = mlp_now_ns();
            if (!next_live)
                next_live = now + (uint64_t)flive;
            r = __ml_chan_wait_ro_slice(s->ch, dir, want, deadline, now + look);
            if (r != -ETIME)
                return r;
            look = look * 2 < MLP_LOOK_MAX_NS ? look * 2 : MLP_LOOK_MAX_NS;
            if (mlp_end_look(s))
                return 0; /* the peer is gone: the look under the lock says how */
            if ((now = mlp_now_ns()) >= next_live) {
                /* The liveness look that the futex's own timeout made (a slice never
                 * reaches it). */
                if (__ml_chan_check_peer(s->ch))
                    return 0;
                flive = flive * 2 < (int64_t)ML_LIVENESS_MAX_NS ? flive * 2
                                                                : (int64_t)ML_LIVENESS_MAX_NS;
                next_live = now + (uint64_t)flive;
            }
            continue;
        }
        if (r == -EINTR) {
            if (__ml_chan_ready_ro(s->ch, dir, want))
                return 0;
            if (deadline || !__ml_wait_hook || __ml_wait_hook() != intr0)
                return -EINTR;
            continue;
        }
        if (r < 0)
            return r; /* -EAGAIN: the deadline */
        if (s->ch->peer_dead)
            return 0; /* the look under the lock says how it ended */
    }
}

static int mlp_wait_dir_on(struct mlp_sock *s, int dir, uint64_t want, uint64_t *dl);

static __thread bool mlp_in_recv_wait __attribute__((tls_model("initial-exec")));

bool mlp_wait_is_recv(void) { return mlp_in_recv_wait; } /* channel.c's __ml_wait_recv */

/* A blocking receive's wait is marked (ML_WAIT_RECV: no SIGIO while it sleeps, as the kernel's
 * sk_wait_data), and its mark goes when it is over, however it ended. */
static int mlp_wait_dir(struct mlp_sock *s, int dir, uint64_t want, uint64_t *dl)
{
    if (dir != 0) {
        /* the ring was short of room: the room that comes is an edge (mlp_ep_harvest) */
        atomic_fetch_add_explicit(&s->ch->tx_short, 1, memory_order_relaxed);
        return mlp_wait_dir_on(s, dir, want, dl);
    }
    bool was = mlp_in_recv_wait;
    mlp_in_recv_wait = true;
    int r = mlp_wait_dir_on(s, dir, want, dl);
    mlp_in_recv_wait = was;
    __ml_chan_recv_awake(s->ch);
    return r;
}

static int mlp_wait_dir_on(struct mlp_sock *s, int dir, uint64_t want, uint64_t *dl)
{
    uint64_t tmo = dir == 0 ? s->ch->rx_tmo_ns : s->ch->tx_tmo_ns;
    uint64_t deadline = mlp_call_deadline(dl, tmo);
    int r;
    if (s->state != MLP_ACCEL || !s->ch->sock_ino) {
        r = __ml_chan_wait_ro(s->ch, dir, want, deadline);
    } else if (__ml_chan_peer_exiting(s->ch)) {
        /* its end comes by its kernel socket (mlp_exiting_say): no slice on the futex first */
        r = mlp_wait_long(s, dir, want, deadline);
    } else if (mlp_idle_skip(s)) {
        /* the thread's last wait on it spent its slice and ran out (mlp_idle_note) */
        r = mlp_wait_long(s, dir, want, deadline);
        mlp_idle_note(s, r == -EAGAIN);
    } else {
        /* the slice ends too when the peer says that its process is ending (0: look again) */
        r = __ml_chan_wait_ro_first(s->ch, dir, want, deadline, mlp_now_ns() + MLP_SLICE_NS);
        if (r == -ETIME) {
            r = mlp_wait_long(s, dir, want, deadline);
            mlp_idle_note(s, r == -EAGAIN);
        }
    }
    return r == -ECONNRESET ? 0 : r; /* the peer died: the look under the lock says how */
}

/* Room a blocking sender waits for: half the ring, or what it has left to send (the consumer
 * then wakes it once per batch, not once per release). */
static uint64_t mlp_tx_want(struct mlp_sock *s, size_t left)
{
    uint64_t half = s->ch->size / 2;
    return left < half ? (left ? left : 1) : (half ? half : 1);
}

/* The vector's total, checked as the kernel checks it before it moves a byte (iovec_from_user,
 * then __import_iovec): a length negative as an ssize_t anywhere is -EINVAL, then a piece that
 * cannot be there is -EFAULT (a NULL vector, a NULL base under a length, or pieces past
 * SSIZE_MAX together, which no address space holds).  The kernel finds a NULL base only when
 * it copies (a call that stops before, with no room or no data, or on a closed connection, says
 * EAGAIN or EPIPE first); we say EFAULT at once, except where nothing is copied: a receive
 * with MSG_TRUNC (nocopy) discards the bytes, and TCP takes a NULL buffer for it.  Unchecked,
 * a sum that wrapped sent a short count of a vector the kernel refuses, and a NULL base
 * crashed the copy (tests/preload/iovedge.c). */
static ssize_t mlp_iov_total(const struct iovec *iov, int n, bool nocopy)
{
    if (n == 1 && iov && iov[0].iov_len <= (size_t)SSIZE_MAX &&
        (iov[0].iov_base || !iov[0].iov_len || nocopy))
        return (ssize_t)iov[0].iov_len; /* one piece that passes every check below */
    if (n > 0 && !iov)
        return -EFAULT;
    for (int i = 0; i < n; i++)
        if (iov[i].iov_len > (size_t)SSIZE_MAX)
            return -EINVAL;
    size_t t = 0;
    for (int i = 0; i < n; i++) {
        size_t l = iov[i].iov_len;
        if ((!iov[i].iov_base && l && !nocopy) || l > (size_t)SSIZE_MAX - t)
            return -EFAULT;
        t += l;
    }
    return (ssize_t)t;
}

/* The first ML_INT_MAX_IO bytes of iov (n pieces, at most IOV_MAX) into v: the pieces kept.  One
 * read or write moves at most that on Linux (MAX_RW_COUNT: rw_verify_area and import_iovec cut
 * every call to it), and a program may keep the count in an int. */
static int mlp_iov_cut(const struct iovec *iov, int n, struct iovec *v)
{
    size_t left = ML_INT_MAX_IO;
    int k = 0;
    for (int i = 0; i < n && k < IOV_MAX && left; i++) {
        v[k] = iov[i];
        if (v[k].iov_len > left)
            v[k].iov_len = left;
        left -= v[k++].iov_len;
    }
    return k;
}

/* ---- send -------------------------------------------------------------------------------- */

/* SO_RCVTIMEO and SO_SNDTIMEO live in the kernel socket, which takes every setsockopt: set before
 * connect(), or on the listener (an accepted socket inherits them, in the kernel), they were
 * there before the channel was.  The first ring operation copies them to the channel; later
 * changes reach it through mlp_setsockopt.  Two threads may both copy: the same values. */
static void mlp_sync_timeouts(struct mlp_sock *s, int fd)
{
    if (ml_likely(atomic_load_explicit(&s->tmo_synced, memory_order_acquire)) || !s->ch)
        return;
    int saved = errno;
    struct timeval tv;
    socklen_t l = sizeof tv;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) == 0 && l == sizeof tv)
        s->ch->rx_tmo_ns = mlp_tv_ns(&tv);
    l = sizeof tv;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &l) == 0 && l == sizeof tv)
        s->ch->tx_tmo_ns = mlp_tv_ns(&tv);
    errno = saved;
    atomic_store_explicit(&s->tmo_synced, true, memory_order_release);
}

/*
 * What is left of a call's SO_RCVTIMEO or SO_SNDTIMEO (its deadline dl, 0: none) after its
 * wait for the decision fell to TCP.  The kernel's call that follows counts the whole timeout
 * again from its own start, so the time the decision took is waited for here first, on the
 * kernel socket: 0, go on (ready: the kernel's call will not wait long); -EAGAIN, the timeout ran
 * out, as the kernel's call says then; -EINTR, a handler ran, which ends a call with a timeout
 * whatever its SA_RESTART (sock_intr_errno), as it ends this poll.
 */
static int mlp_tcp_wait_left(int fd, short ev, uint64_t dl)
{
    if (!dl || mlp_sandboxed())
        return 0; /* a filter may kill for the poll (a review: one that kills for ppoll did) */
    int saved = errno, r;
    for (;;) { /* poll's int of ms holds 24.8 days: a longer timeout polls again (a review) */
        uint64_t now = mlp_now_ns(), left = now < dl ? dl - now : 0;
        uint64_t ms = (left + 999999u) / 1000000u;
        struct pollfd p = {.fd = fd, .events = ev};
        r = mlp_real_poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (r != 0 || ms <= INT_MAX)
            break;
    }
    int e = r < 0 ? -errno : r == 0 ? -EAGAIN : 0;
    errno = saved;
    return e;
}

/* Send iov[i..n) from byte off of iov[i] over the kernel socket, blocking, all of it unless
 * an error or a signal stops it (the kernel's blocking send does the same); bytes or -errno. */
static ssize_t mlp_tcp_send_rest(int fd, const struct iovec *iov, int n, int i, size_t off,
                                 int flags)
{
    struct iovec v[IOV_MAX];
    int k = 0;
    for (; i < n && k < IOV_MAX; i++, off = 0)
        if (iov[i].iov_len > off)
            v[k++] = (struct iovec){(char *)iov[i].iov_base + off, iov[i].iov_len - off};
    struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)k};
    ssize_t r = mlp_real_sendmsg(fd, &mh, flags);
    return r < 0 ? -errno : r;
}

/* One pass of a send, the tx lock held: copy from iov[*i] at byte *off on as much as the ring
 * takes now, all the pieces together (one publication per chunk, not one per piece: a header
 * and its payload wake the reader once).  Bytes moved (the position advanced), else the
 * channel's answer (-EAGAIN: full). */
static ssize_t mlp_tx_pass(struct mlp_sock *s, const struct iovec *iov, int n, int *i,
                           size_t *off)
{
    struct ml_iov_cur c = {.iov = iov, .n = n, .i = *i, .off = *off};
    ssize_t r = __ml_chan_sendv(s->ch, &c, MEMLAN_DONTWAIT);
    while (c.i < n && c.off == iov[c.i].iov_len) { /* empty pieces at the end */
        c.i++;
        c.off = 0;
    }
    *i = c.i;
    *off = c.off;
    return r;
}

/* A blocking send of at most half the ring goes in whole or not at all (the tx lock held): it
 * waits for room for all of its bytes, so no other thread's bytes land inside it.  total bytes,
 * else the channel's answer (-EAGAIN: not enough room yet). */
static ssize_t mlp_tx_whole(struct mlp_sock *s, const struct iovec *iov, int n, size_t total)
{
    ssize_t room = __ml_chan_tx_room(s->ch, total);
    if (room < 0)
        return room;
    /* The room is there, and only our peer's reads change it (more room): all of it goes. */
    struct ml_iov_cur c = {.iov = iov, .n = n};
    return total ? __ml_chan_sendv(s->ch, &c, MEMLAN_DONTWAIT | ML_SEND_WHOLE) : 0;
}

static ssize_t mlp_send_on(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags,
                           int st);

/* A send of more than ML_INT_MAX_IO bytes: of the first ML_INT_MAX_IO (off the common path, for
 * its array).  The state's and MSG_ZEROCOPY's work is done by mlp_send already: one call, one
 * completion. */
static __attribute__((noinline)) ssize_t mlp_send_cut(struct mlp_sock *s, int fd,
                                                      const struct iovec *iov, int n, int flags,
                                                      int st)
{
    struct iovec v[IOV_MAX];
    return mlp_send_on(s, fd, v, mlp_iov_cut(iov, n, v), flags, st);
}

/*
 * A send of nothing moves nothing and never waits, but TCP's checks come first
 * (tcp_sendmsg_locked): a socket shut for writing says EPIPE (and raises SIGPIPE), a reset is
 * reported.  A peer that closed is no error for it: no byte goes, so no reset comes back.  It
 * answered 0 in every state.
 */
static ssize_t mlp_send_nothing(struct mlp_sock *s, int flags)
{
    ssize_t r = mlp_lock_tx(s, true);
    if (r < 0)
        return r == -EAGAIN ? 0 : r; /* another thread is sending: the socket is open */
    r = __ml_chan_tx_room(s->ch, 0);
    mlp_unlock_tx(s);
    if (r >= 0 || r == -EAGAIN)
        return 0;
    if (r == -EPIPE && !s->ch->shut_wr && mlp_reset_state(s, true) == 0 &&
        !(s->me && (atomic_load(&s->me->flags) & ML_SOCK_WROTE_LATE)))
        return 0;
    return mlp_tx_error(s, r, flags);
}

/* An undecided connection's urgent data has no place yet (its bytes go into an offer's ring,
 * and the server may still take it over TCP, where the urgency would be lost), and where the
 * offer cannot be withdrawn first (mlp_oob_settle: a handler, a vfork child, a sandbox) the send
 * fails with EOPNOTSUPP, and the first such refusal of the image is said, in the log and on
 * stderr (an explorer met it only as Python's exception).  The server's port is marked, so that
 * its later connections stay on TCP (mlp_lrec_oob_mark): not from a handler, nor in a known
 * sandbox or out of the fabric's reach (the mark opens the port's record by name). */
static ssize_t mlp_send_oob_refused(struct mlp_sock *s, int fd)
{
    bool handler = mlp_sig_in_handler();
    int port = 0;
    if (!handler && !mlp_known_confined() && !mlp_cred_lost(false)) {
        int inside = mlp_inside;
        mlp_inside = 1; /* the kernel socket's names, past our interposers */
        port = mlp_port_of(fd, s->side == 0); /* the server's: ours, or the peer's */
        mlp_inside = inside;
    }
    bool marked = port && mlp_lrec_oob_mark(port);
    const char *fmt = "fd %d: a send of urgent data (MSG_OOB) on a connection not yet accepted "
                      "is refused (EOPNOTSUPP): its server may still take it over TCP, and it "
                      "cannot be settled here (a signal handler, a vfork child, a seccomp "
                      "sandbox); %s%.0d%sMEMLAN_OFF=1, or --no-ports for the port, keeps such "
                      "connections on TCP";
    const char *pre = marked ? "later connections to port " : "", *post = marked ? " stay on "
                                                                                   "TCP; " : "";
    if (!handler && !(atomic_fetch_or(&mlp_said, MLP_SAID_OOB) & MLP_SAID_OOB))
        mlp_say(MLP_SAID_OOB, fmt, fd, pre, marked ? port : 0, post);
    else if (marked)
        mlp_log(0, fmt, fd, pre, port, post);
    return -EOPNOTSUPP;
}

/*
 * Urgent data on a channel (design.md, "Urgent data"), as TCP's send(MSG_OOB): the bytes go
 * into the ring as one send's, and the last of them is the urgent byte.  Its position (+ 1) and
 * value are stored in our side's block first (release), under the send lock, as TCP's urgent
 * pointer goes ahead of the data: the peer's receive stops before the position, and reads the
 * byte there in line or skips it as its SO_OOBINLINE says; its SIOCATMARK, recv(MSG_OOB) and
 * POLLPRI read the mark (channel.c, __ml_chan_urg_state).  A later urgent byte replaces the
 * mark, as TCP's urgent pointer moves: the earlier byte becomes an ordinary one, or is dropped
 * where the peer's reads stand at it (urg_skip, as Linux's tcp_check_urg).  A short send
 * (nonblocking) marks the last byte it took, as TCP does, and one that took none puts the mark
 * back, where nothing was published past it.  The position assumes the send's bytes go in one
 * run: another thread's send in between may take it (TCP interleaves them too).  SIGURG: the
 * peer's owner FIFO is rung once the bytes are in (mlp_urg_setup).
 */
static ssize_t mlp_send_urgent(struct mlp_sock *s, int fd, const struct iovec *iov, int n,
                               int flags)
{
    ssize_t t = mlp_iov_total(iov, n, false);
    if (t <= 0 || t > ML_INT_MAX_IO)
        return mlp_send_on(s, fd, iov, n, flags & ~MSG_OOB, MLP_ACCEL); /* its answer */
    int k = n - 1; /* the last byte's piece: the last non-empty one */
    while (iov[k].iov_len == 0)
        k--;
    /* Read here, where the ring's copy reads it: a bad pointer is the fault that any send of
     * ours from it would be. */
    uint8_t b = *((const volatile uint8_t *)iov[k].iov_base + iov[k].iov_len - 1);
    bool nb = (flags & MSG_DONTWAIT) || mlp_nonblock(s);
    ssize_t r = mlp_lock_tx(s, nb);
    if (r < 0)
        return r;
    uint64_t old = atomic_load_explicit(&s->me->urg, memory_order_relaxed),
             at = __ml_chan_tx_pos(s->ch) + (uint64_t)t; /* the byte's position + 1 */
    /* The mark it replaces, where the peer's reads stand at it (past the bytes dropped so far):
     * TCP drops that byte (not in line) as the new urgent pointer comes, and each next one
     * while the reads stand; the peer's receive does so from urg_skip..urg_skip_end. */
    uint64_t tail = __ml_chan_tx_peer_pos(s->ch),
             lo = atomic_load_explicit(&s->me->urg_skip, memory_order_relaxed),
             hi = atomic_load_explicit(&s->me->urg_skip_end, memory_order_relaxed);
    bool standing = lo && tail == lo - 1 && hi >= lo; /* at a range of dropped bytes */
    if (old && (standing ? hi : tail) == old - 1) {
        if (!standing)
            atomic_store_explicit(&s->me->urg_skip, old, memory_order_relaxed);
        atomic_store_explicit(&s->me->urg_skip_end, old, memory_order_relaxed);
    }
    atomic_store_explicit(&s->me->urg_byte, b, memory_order_relaxed);
    atomic_store_explicit(&s->me->urg, at, memory_order_release);
    mlp_unlock_tx(s);
    r = mlp_send_on(s, fd, iov, n, flags & ~MSG_OOB, MLP_ACCEL);
    if (r < t && mlp_lock_tx(s, false) == 0) {
        /* Short: TCP marks the last byte it took (tcp_mark_urg at the push); none taken, the
         * mark goes back.  Only where nothing was published at the mark meanwhile. */
        if (atomic_load_explicit(&s->me->urg, memory_order_relaxed) == at &&
            __ml_chan_tx_pos(s->ch) < at)
            atomic_store_explicit(&s->me->urg, r > 0 ? at - (uint64_t)(t - r) : old,
                                  memory_order_release);
        mlp_unlock_tx(s);
    }
    /* The peer's socket has an owner: SIGURG for it, as its kernel raises when the urgent
     * pointer comes (mlp_urg_setup) */
    if (r > 0 &&
        (atomic_load_explicit(&mlp_side_block(s->ch, 1 - s->side)->flags, memory_order_relaxed) &
         ML_SOCK_SIGURG))
        __ml_chan_sig_ring(s->ch, true);
    return r;
}

/* sendmsg's and sendmmsg's entry.  On a connection settled on TCP the caller's header goes to
 * the kernel whole, with its control messages: kernel TLS's record type (TLS_SET_RECORD_TYPE,
 * with which OpenSSL sends its alerts and handshake records once the kernel holds the keys)
 * went out as application data through the iovec alone, and a bad message's EINVAL was lost (a
 * review).  On a channel, the data alone: a channel has no control message. */
ssize_t mlp_sendmsg(struct mlp_sock *s, int fd, const struct msghdr *m, int flags)
{
    if (m->msg_iovlen > IOV_MAX)
        return -EMSGSIZE;
    int st = s->state;
    if (m->msg_controllen && st == MLP_UNDECIDED)
        st = mlp_decide(s, fd, false);
    if (ml_likely(!m->msg_controllen) || st != MLP_TCP)
        return mlp_send(s, fd, m->msg_iov, (int)m->msg_iovlen, flags);
    bool nb = (flags & MSG_DONTWAIT) || mlp_nonblock(s);
    int e = mlp_tcp_catch_up(s, fd, !nb);
    if (e < 0)
        return e == -EPIPE && !(flags & MSG_NOSIGNAL) ? (raise(SIGPIPE), e) : e;
    ssize_t r = mlp_real_sendmsg(fd, m, flags);
    return r < 0 ? -errno : r;
}

ssize_t mlp_send(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags)
{
    int st = s->state;
    if (st == MLP_UNDECIDED)
        st = mlp_decide(s, fd, false);
    if (ml_unlikely(flags & MSG_OOB) && st == MLP_UNDECIDED)
        st = mlp_oob_settle(s, fd); /* withdrawn to TCP, unless taken meanwhile */
    if (ml_unlikely(flags & MSG_OOB) && st != MLP_TCP) /* (on TCP: the kernel's, below) */
        return st == MLP_ACCEL ? mlp_send_urgent(s, fd, iov, n, flags)
                               : mlp_send_oob_refused(s, fd);
    /* SO_ZEROCOPY on the kernel socket (negotiate.c): a send that moved bytes on the channel
     * owes its completion, as the kernel's would (one that fell to TCP meanwhile got the
     * kernel's, which numbers its own).  An undecided client is settled first, as for the
     * option itself: on TCP the kernel numbers all its sends (one of ours into the ring before
     * would be numbered by nobody, and a program waited for it for ever: a review). */
    bool zc = ml_unlikely(flags & MSG_ZEROCOPY) && st != MLP_TCP && mlp_zerocopy_send(s, fd);
    if (ml_unlikely(zc) && st == MLP_UNDECIDED) {
        st = mlp_zerocopy_settle(s, fd);
        zc = st != MLP_TCP;
    }
    ssize_t r = mlp_send_on(s, fd, iov, n, flags, st);
    if (ml_unlikely(zc) && r > 0 && s->state == MLP_ACCEL)
        mlp_zerocopy_done(s);
    return r;
}

static ssize_t mlp_send_on(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags,
                           int st)
{
    bool nb = (flags & MSG_DONTWAIT) || mlp_nonblock(s);
    if (st == MLP_TCP) {
        int e = mlp_tcp_catch_up(s, fd, !nb);
        if (e < 0)
            return e == -EPIPE && !(flags & MSG_NOSIGNAL) ? (raise(SIGPIPE), e) : e;
        struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
        ssize_t r = mlp_real_sendmsg(fd, &mh, flags);
        return r < 0 ? -errno : r;
    }
    ssize_t t = mlp_iov_total(iov, n, false);
    if (ml_unlikely(t == 0))
        return mlp_send_nothing(s, flags);
    if (t < 0)
        return t;
    if (ml_unlikely(t > ML_INT_MAX_IO))
        return mlp_send_cut(s, fd, iov, n, flags, st);
    size_t total = (size_t)t;
    mlp_sync_timeouts(s, fd);
    ssize_t done = 0, r;
    int i = 0;
    size_t off = 0;
    uint64_t dl = 0;
    /* A blocking send up to half the ring is one piece, as small sends are in the kernel's
     * socket buffer: two threads' records never mix.  A longer one moves in pieces as room
     * comes, as in the kernel, whose waiting sender lets other senders in (see above). */
    bool whole = !nb && st == MLP_ACCEL && total <= s->ch->size / 2;
    for (;;) {
        /* Every pass is nonblocking: a blocking send waits below, without the lock. */
        if ((r = mlp_lock_tx(s, nb)) < 0)
            return done ? done : r; /* a handler re-entered us, or the lock is broken */
        if (whole) {
            r = mlp_tx_whole(s, iov, n, total);
            if (r > 0)
                i = n;
        } else {
            r = mlp_tx_pass(s, iov, n, &i, &off);
        }
        mlp_unlock_tx(s);
        if (r > 0) {
            done += r;
            /* A blocking send moves everything, as the kernel's does; a timeout or a signal
             * cuts it short, and the count so far is the answer. */
            if (nb || i == n)
                break;
            continue;
        }
        if (r == -EPIPE && st == MLP_UNDECIDED) {
            /* Settled on TCP meanwhile, by another thread or a fork sibling: a settle publishes
             * our side of the channel closed (mlp_decide), which the ring reports as EPIPE.
             * These bytes go over TCP, after the ring's. */
            st = mlp_decide(s, fd, false);
            if (st == MLP_TCP) {
                int e = mlp_tcp_catch_up(s, fd, !nb);
                ssize_t w = e < 0 ? e : mlp_tcp_send_rest(fd, iov, n, i, off, flags);
                if (w < 0)
                    return done ? done : (w == -EPIPE && !(flags & MSG_NOSIGNAL)
                                              ? (raise(SIGPIPE), w) : w);
                return done + w;
            }
            break;
        }
        if (r != -EAGAIN || nb)
            break;
        if (st == MLP_UNDECIDED) {
            /* Undecided: never wait for room, since nobody may ever drain the ring; wait for
             * the decision instead. */
            st = mlp_tx_decide_full(s, fd, total, &dl);
            if (st < 0)
                return done ? done : st; /* a handler ran, or SO_SNDTIMEO ran out */
            if (st == MLP_TCP) {
                /* Fell to TCP: what we took so far is in the ring and goes out first, then the
                 * rest of this call, so a blocking write still moves it all. */
                int e = mlp_tcp_catch_up(s, fd, true);
                if (e < 0)
                    return done ? done : mlp_tx_error(s, e, flags);
                if ((e = mlp_tcp_wait_left(fd, POLLOUT, dl)) < 0)
                    return done ? done : e; /* SO_SNDTIMEO ran out, or a handler ran */
                ssize_t w = mlp_tcp_send_rest(fd, iov, n, i, off, flags);
                if (w < 0)
                    return done ? done : (w == -EPIPE && !(flags & MSG_NOSIGNAL)
                                              ? (raise(SIGPIPE), w) : w);
                return done + w;
            }
            continue;
        }
        size_t left = total - (size_t)done;
        if ((r = mlp_wait_dir(s, 1, mlp_tx_want(s, left), &dl)) < 0)
            break;
    }
    /* The program's nonblocking send found the ring full: SIGIO when room comes, where it
     * asked for SIGIO (design.md, "SIGIO"). */
    if (nb && st == MLP_ACCEL && (done > 0 ? (size_t)done < total : r == -EAGAIN))
        __ml_chan_sio_room(s->ch);
    if (done > 0)
        return done;
    if (r == -EAGAIN && st == MLP_UNDECIDED && nb)
        return -EAGAIN;
    if ((r == -EPIPE || r == -ECONNRESET) && mlp_write_after_close(s))
        return (ssize_t)mlp_late_take(s, (size_t)total);
    return mlp_tx_error(s, r, flags);
}

/* A system call of ours on ring memory (p, n) failed with e: EFAULT there is the ring's file
 * shrunk under us (guard.c recovers the mapping), which the program must see as the
 * connection's end (ECONNRESET), never as EFAULT: its own buffers were not involved. */
static int mlp_ring_fault(int e, const void *p, size_t n)
{
    return e == -EFAULT && __ml_guard_fault_in(p, n) ? -ECONNRESET : e;
}

/* What a sendfile of count bytes from pos can move: no more than a regular file holds there. */
static size_t mlp_file_left(int in, off_t pos, size_t count)
{
    struct stat st;
    if (fstat(in, &st) < 0 || !S_ISREG(st.st_mode))
        return count;
    off_t left = st.st_size > pos ? st.st_size - pos : 0;
    return (uint64_t)left < count ? (size_t)left : count;
}

/* sendfile(2) into an accelerated socket: the file's bytes are read straight into the ring. */
ssize_t mlp_sendfile(struct mlp_sock *s, int fd, int in, off_t *off, size_t count)
{
    uint64_t dl = 0;
    int st = s->state;
    if (st == MLP_UNDECIDED)
        st = mlp_decide(s, fd, false); /* a look: undecided, the bytes go into the ring */
    if (st == MLP_TCP) {
        int e = mlp_tcp_catch_up(s, fd, !mlp_nonblock(s));
        if (e < 0)
            return e;
        ssize_t r = mlp_real_sendfile(fd, in, off, count);
        return r < 0 ? -errno : r;
    }
    bool nb = mlp_nonblock(s);
    mlp_sync_timeouts(s, fd);
    off_t pos = 0;
    if (!off) {
        pos = lseek(in, 0, SEEK_CUR);
        if (pos < 0)
            return -errno;
    } else {
        pos = *off;
    }
    size_t done = 0;
    ssize_t err = 0;
    bool end = false, fell = false;
    while (done < count && !end) {
        if ((err = mlp_lock_tx(s, nb)) < 0) {
            if (done)
                err = 0;
            else
                return err; /* a handler re-entered us, or the lock is broken */
            break;
        }
        while (done < count) {
            void *p;
            ssize_t room = memlan_reserve(s->ch, &p, 1, MEMLAN_DONTWAIT);
            if (room < 0) {
                err = room;
                break;
            }
            size_t want = count - done < (size_t)room ? count - done : (size_t)room;
            ssize_t got = pread(in, p, want, pos + (off_t)done);
            if (got <= 0) {
                (void)memlan_commit(s->ch, 0);
                if (got < 0)
                    err = mlp_ring_fault(-errno, p, want);
                end = true;
                break;
            }
            (void)memlan_commit(s->ch, (size_t)got);
            done += (size_t)got;
            if ((size_t)got < want) {
                end = true; /* end of file */
                break;
            }
        }
        mlp_unlock_tx(s);
        if (end || done >= count || (err != -EAGAIN && err != -EPIPE) || nb)
            break;
        if (st == MLP_UNDECIDED) {
            /* Full, or settled on TCP meanwhile (EPIPE: see mlp_send): the decision. */
            st = err == -EPIPE ? mlp_decide(s, fd, false)
                               : mlp_tx_decide_full(s, fd, mlp_file_left(in, pos, count), &dl);
            if (st < 0) {
                err = st;
                break;
            }
            fell = st == MLP_TCP;
            if (fell || st == MLP_UNDECIDED)
                break;
            continue;
        }
        if (err == -EPIPE)
            break;
        /* Full: a blocking sendfile moves everything, waiting without the lock. */
        if ((err = mlp_wait_dir(s, 1, mlp_tx_want(s, count - done), &dl)) < 0)
            break;
    }
    if (off)
        *off = pos + (off_t)done;
    else if (done)
        (void)lseek(in, pos + (off_t)done, SEEK_SET);
    if (!fell && err == -EPIPE && st == MLP_UNDECIDED)
        fell = mlp_decide(s, fd, false) == MLP_TCP; /* a nonblocking call's: over TCP */
    if (fell) {
        /* Over TCP: what this call put into the ring goes out first (mlp_tcp_catch_up), then
         * the rest from where it stopped (the offset or the file position is past it). */
        int e = mlp_tcp_catch_up(s, fd, !nb);
        if (e < 0)
            return done ? (ssize_t)done : mlp_tx_error(s, e, 0); /* a reset, EPIPE's SIGPIPE */
        e = mlp_tcp_wait_left(fd, POLLOUT, dl);
        if (e < 0 || (done && nb))
            return done ? (ssize_t)done : e;
        ssize_t r = mlp_real_sendfile(fd, in, off, count - done);
        return r < 0 ? (done ? (ssize_t)done : -errno) : (ssize_t)done + r;
    }
    if (done)
        return (ssize_t)done;
    if (err == 0)
        return 0;
    char probe;
    if ((err == -EPIPE || err == -ECONNRESET) && pread(in, &probe, 1, pos) == 0)
        return 0; /* the kernel reads the file first: at its end, nothing to send, no error */
    if ((err == -EPIPE || err == -ECONNRESET) && mlp_write_after_close(s)) {
        /* TCP takes it: the file's bytes up to its end, or as many as the ring holds, are
         * "sent", and the offset moves on. */
        size_t n = mlp_late_take(s, count);
        struct stat fst;
        if (fstat(in, &fst) == 0 && S_ISREG(fst.st_mode)) {
            off_t left = fst.st_size > pos ? fst.st_size - pos : 0;
            if ((uint64_t)left < n)
                n = (size_t)left;
        }
        if (off)
            *off = pos + (off_t)n;
        else if (n)
            (void)lseek(in, pos + (off_t)n, SEEK_SET);
        return (ssize_t)n;
    }
    return err == -EAGAIN ? -EAGAIN : mlp_tx_error(s, err, 0);
}

/* Before a receive: the socket's state once settled (-EAGAIN while still undecided and nb, or
 * when SO_RCVTIMEO ran out first; dl: the call's deadline, counted from the wait's start).
 * Fallen to TCP: what we wrote before the fall goes out before we wait for the answer. */
static int mlp_rx_settle(struct mlp_sock *s, int fd, bool nb, uint64_t *dl)
{
    int st = s->state;
    if (st == MLP_UNDECIDED) {
        if (!nb)
            mlp_sync_timeouts(s, fd);
        st = nb ? mlp_decide(s, fd, false)
                : mlp_decide_call(s, fd, mlp_call_deadline(dl, s->ch->rx_tmo_ns), true);
        if (st < 0)
            return st; /* a handler ran, or SO_RCVTIMEO ran out: still undecided */
        if (st == MLP_UNDECIDED)
            return -EAGAIN;
        if (st == MLP_TCP) {
            (void)mlp_tcp_catch_up(s, fd, !nb);
            int e = nb ? 0 : mlp_tcp_wait_left(fd, POLLIN, *dl);
            return e < 0 ? e : st;
        }
    }
    if (st == MLP_TCP)
        (void)mlp_tcp_catch_up(s, fd, !nb);
    return st;
}

/* No byte ever goes into the kernel socket under an accelerated connection; one that is found
 * there was written by a path memlan does not see (stdio on a FILE it could not route, a direct
 * system call, a program without memlan on the other end's fd), and the stream is split.
 * Looked at where it costs one call: at the end of the stream and at the last close.  It is
 * reported (log level 0, once per socket; the image's first on stderr too, not from a handler),
 * never read: the bytes are not in order.  Only the log said it, and a Python program whose Go
 * library (c-shared, loaded by ctypes) read and wrote a socket Python had connected lost its
 * request and read a reset, with nothing on stderr (an explorer). */
static void mlp_split_check(struct mlp_sock *s, int fd)
{
    if (s->state != MLP_ACCEL || atomic_load(&s->split_told))
        return;
    /* A process that lost the fabric by a credential change may be in a sandbox that kills on
     * recvfrom (sshd's privilege-separated child: the peek killed it with SIGSYS): no check. */
    if (mlp_cred_lost(false))
        return;
    int saved = errno;
    char c;
    ssize_t n = mlp_real_recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    errno = saved;
    if (n > 0 && !atomic_exchange(&s->split_told, true)) {
        int q = 0;
        (void)mlp_real_ioctl(fd, FIONREAD, &q);
        const char *fmt = "fd %d: %d bytes arrived on the kernel socket under an accelerated "
                          "connection: the peer wrote them by a path memlan does not see (stdio "
                          "on a FILE it could not route, a direct system call: Go code, a "
                          "static binary); the stream is split, its bytes lost or out of order "
                          "(MEMLAN_OFF=1, or --no-ports for the port, keeps such connections "
                          "on TCP)";
        if (!mlp_sig_in_handler() &&
            !(atomic_fetch_or(&mlp_said, MLP_SAID_SPLIT) & MLP_SAID_SPLIT))
            mlp_say(MLP_SAID_SPLIT, fmt, fd, q);
        else
            mlp_log(0, fmt, fd, q);
    }
}

/* ---- splice ------------------------------------------------------------------------------ */

/* How much a pipe takes now without blocking: its size less what it holds (a pipe keeps whole
 * pages per write, so this may overstate, and then the write waits as the kernel's splice does). */
static size_t mlp_pipe_room(int pipe)
{
    int cap = mlp_real_fcntl(pipe, F_GETPIPE_SZ, 0), q = 0;
    if (cap <= 0 || mlp_real_ioctl(pipe, FIONREAD, &q) < 0)
        return 4096;
    return q < cap ? (size_t)(cap - q) : 0;
}

/* Wait until a pipe is readable (POLLIN) or writable (POLLOUT); -EAGAIN when nb and it is not. */
static int mlp_pipe_wait(int pipe, short ev, bool nb)
{
    struct pollfd p = {.fd = pipe, .events = ev};
    for (;;) {
        int r = mlp_real_poll(&p, 1, nb ? 0 : -1);
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EAGAIN;
        return p.revents;
    }
}

/* splice(2) from an accelerated socket into a pipe: the bytes are looked at in the ring, written
 * to the pipe, and only what the pipe took is consumed, so nothing is lost or read twice. */
ssize_t mlp_splice_from(struct mlp_sock *s, int fd, int pipe, size_t len, unsigned flags)
{
    bool nb = (flags & SPLICE_F_NONBLOCK) || mlp_nonblock(s);
    uint64_t dl = 0;
    if (len == 0)
        return 0; /* the kernel's splice of nothing, whatever the socket waits for */
    int st = mlp_rx_settle(s, fd, nb, &dl);
    if (st < 0)
        return st;
    if (st == MLP_TCP) {
        ssize_t r = mlp_real_splice(fd, NULL, pipe, NULL, len, flags);
        return r < 0 ? -errno : r;
    }
    mlp_sync_timeouts(s, fd);
    bool pnb = (flags & SPLICE_F_NONBLOCK) != 0;
    ssize_t w;
    for (;;) {
        int e = mlp_lock_rx(s, nb);
        if (e < 0)
            return e;
        const void *p;
        if (__ml_chan_rx_urg_dist(s->ch) == 0) {
            /* At the peer's urgent byte TCP's splice moves nothing (tcp_read_sock stops at
             * urgent data): EAGAIN, or 0 when blocking (tcp_splice_read's answer). */
            mlp_unlock_rx(s);
            return nb ? -EAGAIN : 0;
        }
        ssize_t a = memlan_peek(s->ch, &p, MEMLAN_DONTWAIT);
        if (a <= 0) {
            mlp_unlock_rx(s);
            if (a == -EAGAIN && !nb &&
                (a = mlp_wait_dir(s, 0, 1 + s->ch->rx_skip_seen, &dl)) == 0)
                continue;
            return mlp_rx_error(s, a);
        }
        size_t n = (size_t)a < len ? (size_t)a : len;
        size_t room = mlp_pipe_room(pipe);
        if (room == 0) {
            /* The pipe is full: wait for it without the socket's lock, then look again. */
            (void)memlan_release(s->ch, 0);
            mlp_unlock_rx(s);
            e = mlp_pipe_wait(pipe, POLLOUT, pnb);
            if (e < 0)
                return e;
            if (e & POLLERR) { /* no reader */
                w = -EPIPE;
                break;
            }
            continue;
        }
        /* The write and the release are one step for a handler: one that left us between
         * them (siglongjmp at the write's return) left the bytes both in the pipe and in the
         * ring, and the next splice delivered them twice (a review saw the stream corrupted). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        w = mlp_real_write(pipe, p, n < room ? n : room);
        if (w < 0)
            w = mlp_ring_fault(-errno, p, n < room ? n : room);
        (void)memlan_release(s->ch, w > 0 ? (size_t)w : 0);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        mlp_unlock_rx(s);
        break;
    }
    if (w == -EPIPE)
        raise(SIGPIPE); /* the pipe had no reader: the kernel's splice signals as write does */
    return w;
}

/* splice(2) from a pipe into an accelerated socket: the pipe is read straight into the ring's
 * free space, so what left the pipe is in the ring. */
ssize_t mlp_splice_to(struct mlp_sock *s, int fd, int pipe, size_t len, unsigned flags)
{
    bool nb = (flags & SPLICE_F_NONBLOCK) || mlp_nonblock(s);
    uint64_t dl = 0;
    if (len == 0)
        return 0; /* the kernel's splice of nothing, whatever the socket waits for */
    int st = s->state;
    if (st == MLP_UNDECIDED)
        st = mlp_decide(s, fd, false); /* a look: undecided, the bytes go into the ring */
    if (st == MLP_TCP) {
        int e = mlp_tcp_catch_up(s, fd, !nb);
        if (e < 0)
            return e;
        ssize_t r = mlp_real_splice(pipe, NULL, fd, NULL, len, flags);
        return r < 0 ? -errno : r;
    }
    /* The kernel waits for the pipe first (SPLICE_F_NONBLOCK: EAGAIN), and an empty pipe
     * without writers is the end: 0. */
    int ev = mlp_pipe_wait(pipe, POLLIN, (flags & SPLICE_F_NONBLOCK) != 0);
    if (ev < 0)
        return ev;
    if (!(ev & POLLIN))
        return 0;
    mlp_sync_timeouts(s, fd);
    void *p;
    ssize_t room;
    for (;;) {
        int e = mlp_lock_tx(s, nb);
        if (e < 0)
            return e;
        room = memlan_reserve(s->ch, &p, 1, MEMLAN_DONTWAIT);
        if (room != -EAGAIN || nb)
            break;
        mlp_unlock_tx(s);
        if (st == MLP_UNDECIDED) {
            int q = 0;
            size_t can = mlp_real_ioctl(pipe, FIONREAD, &q) == 0 && q >= 0 && (size_t)q < len
                             ? (size_t)q : len; /* what the pipe holds */
            if ((st = mlp_tx_decide_full(s, fd, can, &dl)) < 0)
                return st;
            if (st == MLP_TCP)
                return mlp_splice_to(s, fd, pipe, len, flags); /* now over TCP */
            continue;
        }
        if ((e = mlp_wait_dir(s, 1, mlp_tx_want(s, len), &dl)) < 0)
            return e;
    }
    if (room < 0) {
        mlp_unlock_tx(s);
        if (room == -EAGAIN)
            return -EAGAIN;
        if (room == -EPIPE && st == MLP_UNDECIDED && mlp_decide(s, fd, false) == MLP_TCP)
            return mlp_splice_to(s, fd, pipe, len, flags); /* fell to TCP meanwhile */
        if ((room == -EPIPE || room == -ECONNRESET) && mlp_write_after_close(s)) {
            /* TCP takes this one write (the peer's kernel answers it with a reset): the
             * bytes leave the pipe and are dropped. */
            char buf[4096];
            ssize_t g = mlp_real_read(pipe, buf, len < sizeof buf ? len : sizeof buf);
            return g < 0 ? -errno : g;
        }
        return mlp_tx_error(s, room, 0);
    }
    size_t want = len < (size_t)room ? len : (size_t)room;
    /* The read and the commit are one step for a handler (see mlp_splice_from): bytes taken
     * from the pipe and not committed would be lost. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    ssize_t got = mlp_real_read(pipe, p, want);
    int e = got < 0 ? mlp_ring_fault(-errno, p, want) : 0;
    (void)memlan_commit(s->ch, got > 0 ? (size_t)got : 0);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    mlp_unlock_tx(s);
    return got < 0 ? e : got;
}

/* ---- receive ----------------------------------------------------------------------------- */

/* A nonblocking receive found the ring empty.  A program that only calls recv (no poll or
 * epoll, which watch the kernel socket) would never learn of an end that no close of the peer's
 * announced (tests/preload/forkexit.c, exit-nb): the kernel socket is looked at (mlp_end_look,
 * at most once a millisecond), from the first empty answer, unless it comes within
 * MLP_DRAIN_NS of a receive that got bytes after an empty one: an event-driven program's
 * recv-until-EAGAIN, which then never pays for the look.  A single nonblocking recv is how a
 * connection pool asks whether an idle connection lives (redis-py's can_read, before it hands a
 * pooled connection out): looked at only from the second empty answer in a row, it answered
 * EAGAIN where kernel TCP says EOF, the pool handed out a dead server's connection and Celery's
 * task failed with "Connection closed by server" (an explorer).  True when the peer is found
 * gone: look again under the lock. */
#define MLP_DRAIN_NS 10000000ull
static bool mlp_eagain_look(struct mlp_sock *s)
{
    if (atomic_fetch_add_explicit(&s->eagains, 1, memory_order_relaxed) == 0) {
        uint64_t d = atomic_load_explicit(&s->drained_ns, memory_order_relaxed);
        if (d && mlp_coarse_ns() - d < MLP_DRAIN_NS)
            return false;
    }
    return mlp_end_look(s);
}

/* A receive got bytes: the next empty answer is the first in a row. */
static inline void mlp_rx_got(struct mlp_sock *s)
{
    if (ml_unlikely(atomic_load_explicit(&s->eagains, memory_order_relaxed))) {
        atomic_store_explicit(&s->eagains, 0, memory_order_relaxed);
        atomic_store_explicit(&s->drained_ns, mlp_coarse_ns(), memory_order_relaxed);
    }
}


/*
 * SO_PEEK_OFF (TCP's since Linux 6.10): a peek starts that many bytes in and moves the offset on
 * by what it copied; a receive moves it back by what it took, not below 0; negative: none.  On a
 * channel the kernel socket keeps the offset (set there by the program's setsockopt, which
 * checks it and says EOPNOTSUPP on an older kernel; shared by every fd and process that holds
 * the socket), and what our receives took since it was last written comes off it when it is read
 * (peek_base: the channel's receive position then), so that a receive costs nothing more.
 * Looked at only in a process that set the option (a sandbox may kill for a getsockopt nobody
 * made).  Before, the option went to the idle kernel socket alone: each peek returned the same
 * first bytes, and getsockopt said the kernel's offset (an explorer's).  A fork sibling's
 * receives are not counted here (each process counts its own).
 */
static _Atomic bool mlp_peek_off_seen;

void mlp_peek_off_set(struct mlp_sock *s)
{
    ml_store_relaxed(&mlp_peek_off_seen, true);
    if (s && s->type == MLP_CONN && s->state == MLP_ACCEL && s->ch &&
        mlp_lock_rx(s, true) == 0) { /* the offset counts from here */
        s->peek_base = __ml_chan_rx_pos_ro(s->ch);
        s->peek_based = true;
        mlp_unlock_rx(s);
    }
}

/* The offset now (negative: none), written back to the kernel socket when receives moved it. */
static int mlp_peek_off(struct mlp_sock *s, int fd)
{
    if (!ml_load_relaxed(&mlp_peek_off_seen))
        return -1;
    int v = -1;
    socklen_t l = sizeof v;
    if (mlp_real_getsockopt(fd, SOL_SOCKET, SO_PEEK_OFF, &v, &l) != 0 || v < 0)
        return -1;
    uint64_t pos = __ml_chan_rx_pos_ro(s->ch);
    uint64_t took = s->peek_based ? pos - s->peek_base : 0;
    s->peek_base = pos;
    s->peek_based = true;
    if (took) {
        v = took >= (uint64_t)v ? 0 : v - (int)took;
        (void)mlp_real_setsockopt(fd, SOL_SOCKET, SO_PEEK_OFF, &v, sizeof v);
    }
    return v;
}

/* getsockopt(SO_PEEK_OFF) of an accelerated socket: 0 and *val, or -1 (the kernel's answers). */
int mlp_peek_off_get(struct mlp_sock *s, int fd, int *val)
{
    if (s->state != MLP_ACCEL || !s->ch || !ml_load_relaxed(&mlp_peek_off_seen) ||
        mlp_lock_rx(s, true) < 0)
        return -1;
    *val = mlp_peek_off(s, fd);
    mlp_unlock_rx(s);
    return 0;
}

/* A peek copied k bytes from offset off: the offset moves on. */
static void mlp_peek_off_fwd(int fd, int off, ssize_t k)
{
    if (off >= 0 && k > 0) {
        int v = (uint64_t)off + (uint64_t)k > INT_MAX ? INT_MAX : off + (int)k;
        (void)mlp_real_setsockopt(fd, SOL_SOCKET, SO_PEEK_OFF, &v, sizeof v);
    }
}

/* MSG_PEEK: copy what is there without consuming it (MSG_WAITALL: wait for all of it), from the
 * peek offset on (SO_PEEK_OFF, above). */
static ssize_t mlp_peek_once(struct mlp_sock *s, int fd, const struct iovec *iov, int n,
                             size_t total, int flags, bool nb, sigset_t *old, bool *masked)
{
    unsigned naps = 0;
    uint64_t dl = 0;
    for (;;) {
        int e = mlp_lock_rx(s, nb);
        if (e < 0)
            return e;
        int poff = mlp_peek_off(s, fd);
        size_t skip = poff > 0 ? (size_t)poff : 0;
        /* Up to three runs where the ring grew (the ring's, then the region's, which its end
         * may cut): a peek sees them all. */
        struct iovec run[3];
        int nrun;
        ssize_t a = __ml_chan_peek_runs(s->ch, run, 3, &nrun, MEMLAN_DONTWAIT);
        if (skip && a > 0 && (size_t)a <= skip) /* nothing past the offset: at the end, 0 */
            a = __ml_chan_peer_state(s->ch) == ML_SIDE_OPEN && !s->ch->peer_dead ? -EAGAIN : 0;
        if (a > 0 && (flags & MSG_WAITALL) && (size_t)a < total + skip && !nb &&
            __ml_chan_peer_state(s->ch) == ML_SIDE_OPEN && !s->ch->peer_dead &&
            __ml_chan_rx_urg_dist(s->ch) != a) { /* (a peek ends at an urgent byte too) */
            /* MSG_PEEK|MSG_WAITALL (rare): the tripwire wakes a waiter for any byte, not for
             * len of them, so look again every 50 us (without the lock) until len are there
             * or the peer is done, checking the peer's liveness (a system call) about every
             * 100 ms.  As the kernel's tcp_recvmsg, which returns what it has copied when
             * SO_RCVTIMEO runs out or a signal comes: a last look then, and what is there.
             * A handler may run anywhere in the loop, not only in the sleep, so signals are
             * blocked but in the sleep (ppoll with the caller's mask): one that comes between
             * two sleeps waits for the next, which then fails with EINTR. */
            (void)memlan_release(s->ch, 0);
            if (++naps % 2000 == 0)
                (void)__ml_chan_check_peer(s->ch);
            mlp_unlock_rx(s);
            int saved = errno;
            if (!*masked) {
                sigset_t all;
                sigfillset(&all);
                *masked = pthread_sigmask(SIG_BLOCK, &all, old) == 0;
            }
            uint64_t d = mlp_call_deadline(&dl, s->ch->rx_tmo_ns);
            struct timespec ts = {0, 50000};
            if ((d && __ml_now_ns() >= d) ||
                (mlp_real_ppoll(NULL, 0, &ts, *masked ? old : NULL) < 0 && errno == EINTR))
                flags &= ~MSG_WAITALL;
            errno = saved;
            continue;
        }
        if (*masked) { /* not in the loop above any more: the caller's mask for the wait */
            (void)pthread_sigmask(SIG_SETMASK, old, NULL);
            *masked = false;
        }
        if (a <= 0) {
            mlp_unlock_rx(s);
            /* (for more than an urgent byte the peek passes over: then for one more) */
            if (a == -EAGAIN && !nb &&
                (a = mlp_wait_dir(s, 0, 1 + skip + s->ch->rx_skip_seen, &dl)) == 0)
                continue;
            return a;
        }
        size_t left = (size_t)a - skip < total ? (size_t)a - skip : total, off = 0;
        if (!(flags & MSG_TRUNC)) { /* TCP's MSG_TRUNC copies nothing, peeking or not */
            struct ml_iov_cur from = {.iov = run, .n = nrun}, to = {.iov = iov, .n = n};
            for (size_t k = skip; k && from.i < from.n;) { /* to the offset */
                size_t m = run[from.i].iov_len - from.off < k ? run[from.i].iov_len - from.off : k;
                k -= m;
                if ((from.off += m) == run[from.i].iov_len) {
                    from.i++;
                    from.off = 0;
                }
            }
            while (left && from.i < from.n && to.i < to.n) {
                const struct iovec *f = &run[from.i], *t = &iov[to.i];
                size_t m = f->iov_len - from.off < t->iov_len - to.off ? f->iov_len - from.off
                                                                       : t->iov_len - to.off;
                if (m > left)
                    m = left;
                memcpy((char *)t->iov_base + to.off, (const char *)f->iov_base + from.off, m);
                off += m;
                left -= m;
                if ((from.off += m) == f->iov_len) {
                    from.i++;
                    from.off = 0;
                }
                if ((to.off += m) == t->iov_len) {
                    to.i++;
                    to.off = 0;
                }
            }
        } else {
            off = left;
        }
        (void)memlan_release(s->ch, 0);
        mlp_peek_off_fwd(fd, poff, (ssize_t)off);
        mlp_unlock_rx(s);
        return (ssize_t)off;
    }
}

/* total: the vector's bytes, as mlp_recv checked them. */
static ssize_t mlp_peek(struct mlp_sock *s, int fd, const struct iovec *iov, int n,
                        size_t total, int flags, bool nb)
{
    sigset_t old;
    bool masked = false;
    ssize_t r = mlp_peek_once(s, fd, iov, n, total, flags, nb, &old, &masked);
    if (masked) {
        int saved = errno;
        (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
        errno = saved;
    }
    return r;
}

/* One pass of a receive, the rx lock held: copy what is there into iov[*i] at byte *off on,
 * never waiting.  Bytes moved (the position advanced), else the channel's answer (0 at the end,
 * -EAGAIN: nothing yet).  MSG_TRUNC discards instead of copying, as TCP's does. */
static ssize_t mlp_rx_pass(struct mlp_sock *s, const struct iovec *iov, int n, int *i,
                           size_t *off, bool trunc)
{
    ssize_t moved = 0;
    for (; *i < n; (*i)++, *off = 0) {
        size_t want = iov[*i].iov_len - *off;
        if (want == 0)
            continue;
        if (moved && __ml_chan_rx_urg_dist(s->ch) == 0)
            return moved; /* at the peer's urgent byte with bytes taken: TCP's receive ends */
        ssize_t r;
        if (trunc) {
            /* A peek sees one run: where the ring grew, the region's bytes are a second.  What
             * a receive passes over goes first, as a receive's (the peeks leave it). */
            if (!moved)
                __ml_chan_rx_pass_over(s->ch);
            r = 0;
            while ((size_t)r < want) {
                const void *p;
                if ((r || moved) && __ml_chan_rx_urg_dist(s->ch) == 0)
                    break; /* (as above) */
                ssize_t k = memlan_peek(s->ch, &p, MEMLAN_DONTWAIT);
                if (k <= 0) {
                    if (r == 0)
                        r = k;
                    break;
                }
                size_t c = (size_t)k < want - (size_t)r ? (size_t)k : want - (size_t)r;
                (void)memlan_release(s->ch, c);
                r += (ssize_t)c;
            }
        } else {
            r = memlan_recv(s->ch, (char *)iov[*i].iov_base + *off, want, MEMLAN_DONTWAIT);
        }
        if (r <= 0)
            return moved ? moved : r;
        moved += r;
        *off += (size_t)r;
        if ((size_t)r < want)
            return moved; /* the ring is empty for now */
    }
    return moved;
}

/* recvmsg's and recvmmsg's entry: on a connection settled on TCP, the kernel's recvmsg with the
 * caller's header, so that the name, control messages and flags it returns are the kernel's
 * (through a header of ours the caller's msg_controllen stayed as it had set it, and a program
 * that walked CMSG_FIRSTHDR read its own uninitialised buffer); on a channel, no name, no control
 * message, no flag. */
static ssize_t mlp_recv_at(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags,
                           uint64_t *dl);

ssize_t mlp_recvmsg(struct mlp_sock *s, int fd, struct msghdr *m, int flags)
{
    if (m->msg_iovlen > IOV_MAX)
        return -EMSGSIZE;
    uint64_t dl = 0; /* SO_RCVTIMEO's deadline, from the first wait (the decision's) */
    if (ml_unlikely(flags & MSG_ERRQUEUE) && (uint32_t)atomic_load_explicit(&s->zc_pend,
                                                                            memory_order_relaxed)) {
        ssize_t r = mlp_zerocopy_read(s, fd, m, flags); /* a completion of ours (negotiate.c) */
        if (r != -EAGAIN)
            return r;
    }
    if ((flags & (MSG_OOB | MSG_ERRQUEUE)) && s->state == MLP_TCP) {
        ssize_t r = mlp_real_recvmsg(fd, m, flags); /* its urgent byte, its error queue */
        return r < 0 ? -errno : r;
    }
    if (!(flags & (MSG_OOB | MSG_ERRQUEUE))) {
        int st = mlp_rx_settle(s, fd, (flags & MSG_DONTWAIT) || mlp_nonblock(s), &dl);
        if (st < 0)
            return st;
        if (st == MLP_TCP) {
            ssize_t r = mlp_real_recvmsg(fd, m, flags);
            return r < 0 ? -errno : r;
        }
    }
    ssize_t r = mlp_recv_at(s, fd, m->msg_iov, (int)m->msg_iovlen, flags, &dl);
    if (r >= 0) {
        m->msg_namelen = 0;
        m->msg_controllen = 0;
        m->msg_flags = flags & MSG_OOB; /* the urgent byte is said so, as TCP's */
    }
    return r;
}

/* A receive into more than ML_INT_MAX_IO bytes: into the first ML_INT_MAX_IO (see mlp_send_cut). */
static __attribute__((noinline)) ssize_t mlp_recv_cut(struct mlp_sock *s, int fd,
                                                      const struct iovec *iov, int n, int flags,
                                                      uint64_t *dl)
{
    struct iovec v[IOV_MAX];
    return mlp_recv_at(s, fd, v, mlp_iov_cut(iov, n, v), flags, dl);
}

ssize_t mlp_recv(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags)
{
    uint64_t dl = 0;
    return mlp_recv_at(s, fd, iov, n, flags, &dl);
}

/* readv, preadv2: a read of nothing is 0 where a recv of nothing waits (sock_read_iter).  It
 * still waits for the decision: the vector is the kernel's to read on TCP, which says EFAULT for
 * a bad one where a look of ours would crash. */
ssize_t mlp_readv(struct mlp_sock *s, int fd, const struct iovec *iov, int n)
{
    uint64_t dl = 0;
    int st = mlp_rx_settle(s, fd, mlp_nonblock(s), &dl);
    if (st < 0)
        return st;
    if (st == MLP_TCP) {
        ssize_t r = mlp_real_readv(fd, iov, n);
        return r < 0 ? -errno : r;
    }
    ssize_t t = mlp_iov_total(iov, n, false);
    if (t <= 0)
        return t;
    return mlp_recv_at(s, fd, iov, n, 0, &dl);
}

/*
 * A recv, recvfrom or recvmsg of nothing, as TCP's (tcp_recvmsg_locked): a byte there, or the
 * end, answers 0 at once (nothing is taken), an error is reported, and an empty socket says
 * EAGAIN nonblocking; blocking, the call waits once, for a byte, the end, its timeout or a
 * signal, and then answers 0 whatever woke it (the kernel's loop ends when no length is left).
 * It answered 0 at once, which a nonblocking caller takes for the end.  A read or readv of
 * nothing is 0 at once (sock_read_iter): mlp_readv.
 */
static ssize_t mlp_recv_nothing(struct mlp_sock *s, int fd, bool nb, uint64_t *dl)
{
    mlp_sync_timeouts(s, fd);
    bool looked = false;
    for (;;) {
        ssize_t r = mlp_lock_rx(s, nb);
        if (r < 0)
            return r;
        const void *p;
        r = memlan_peek(s->ch, &p, MEMLAN_DONTWAIT);
        if (r > 0)
            (void)memlan_release(s->ch, 0);
        mlp_unlock_rx(s);
        if (r > 0)
            return 0;
        if (r == -EAGAIN && nb && !looked && mlp_eagain_look(s)) {
            looked = true; /* the peer's end, found on the kernel socket: look again */
            continue;
        }
        if (r != -EAGAIN || nb) {
            r = mlp_rx_error(s, r);
            if (r == 0)
                mlp_split_check(s, fd);
            return r;
        }
        (void)mlp_wait_dir(s, 0, 1, dl);
        return 0;
    }
}

/*
 * recv(MSG_OOB) on a channel: the peer's urgent byte, from the mark its send left in its side's
 * block (mlp_send_urgent), as TCP's tcp_recv_urg answers: EINVAL with SO_OOBINLINE, with no
 * urgent byte, once it was taken, or once our reads went past it; the byte (1, or 0 into no
 * room), taken unless MSG_PEEK; else 0 at the end, or EAGAIN while it is marked but not in the
 * ring yet.  Never a wait, as TCP's never waits.
 */
static ssize_t mlp_recv_oob(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags)
{
    if (__ml_chan_urg_inline(s->ch)) /* as the receive knows it (mlp_urg_inline_ask) */
        return -EINVAL;
    uint8_t b = 0;
    int st = __ml_chan_urg_state(s->ch, &b, NULL, !(flags & MSG_PEEK));
    if (!(st & ML_URG_PENDING) || (st & ML_URG_TAKEN))
        return -EINVAL;
    if (st & ML_URG_HERE) {
        for (int i = 0; i < n; i++)
            if (iov[i].iov_len) {
                *(volatile uint8_t *)iov[i].iov_base = b;
                return 1;
            }
        return 0;
    }
    if (s->ch->shut_rd || __ml_chan_peer_state(s->ch) != ML_SIDE_OPEN || s->ch->peer_dead)
        return 0;
    return -EAGAIN;
}

/* A receive whose SO_RCVTIMEO counts from *dl once set (a wait for the decision before it). */
static ssize_t mlp_recv_at(struct mlp_sock *s, int fd, const struct iovec *iov, int n, int flags,
                           uint64_t *dl)
{
    if (flags & (MSG_OOB | MSG_ERRQUEUE)) {
        /* Never a wait for the decision: the kernel's answer on a connection settled on TCP
         * (its urgent byte, if one came), else the kernel's answer with none: EINVAL for
         * MSG_OOB, EAGAIN for an empty error queue.  A completion of ours is read with no
         * room for its control message: 0, as the kernel's recv says. */
        if ((flags & MSG_ERRQUEUE) &&
            (uint32_t)atomic_load_explicit(&s->zc_pend, memory_order_relaxed)) {
            struct msghdr none = {0};
            ssize_t r = mlp_zerocopy_read(s, fd, &none, flags);
            if (r != -EAGAIN)
                return r;
        }
        if (s->state == MLP_TCP) {
            struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
            ssize_t r = mlp_real_recvmsg(fd, &mh, flags);
            return r < 0 ? -errno : r;
        }
        int st = s->state;
        if ((flags & MSG_OOB) && st == MLP_UNDECIDED && !mlp_sig_in_handler() &&
            !mlp_vfork_child())
            st = mlp_decide(s, fd, false); /* a look, as FIONREAD's: the server may be there */
        if ((flags & MSG_OOB) && st == MLP_ACCEL)
            return mlp_recv_oob(s, fd, iov, n, flags);
        if ((flags & MSG_OOB) && st == MLP_TCP) {
            struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
            ssize_t r = mlp_real_recvmsg(fd, &mh, flags);
            return r < 0 ? -errno : r;
        }
        return flags & MSG_OOB ? -EINVAL : -EAGAIN;
    }
    bool nb = (flags & MSG_DONTWAIT) || mlp_nonblock(s);
    int st = mlp_rx_settle(s, fd, nb, dl);
    if (st < 0)
        return st;
    if (st == MLP_TCP) {
        struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
        ssize_t r = mlp_real_recvmsg(fd, &mh, flags);
        return r < 0 ? -errno : r;
    }
    ssize_t t = mlp_iov_total(iov, n, (flags & MSG_TRUNC) != 0);
    if (ml_unlikely(t == 0))
        return mlp_recv_nothing(s, fd, nb, dl);
    if (t <= 0)
        return t;
    if (ml_unlikely(t > ML_INT_MAX_IO))
        return mlp_recv_cut(s, fd, iov, n, flags, dl);
    size_t total = (size_t)t;
    mlp_sync_timeouts(s, fd);
    if (flags & MSG_PEEK) {
        /* A nonblocking peek that finds the ring empty looks at the kernel socket at once, not
         * from the second empty answer as a recv does: one such peek is how a connection pool
         * asks whether an idle connection still lives before it reuses it (h2o's socketpool,
         * right after it read a response, so no empty answer came before), and over kernel
         * TCP it answers EOF once the peer's process is gone.  Answering EAGAIN, the pool
         * sent its next request into a dead peer's ring and its client got a 502
         * (test_apps_h2.py).  mlp_end_look makes at most one look a millisecond. */
        ssize_t p = mlp_peek(s, fd, iov, n, total, flags, nb);
        if (p == -EAGAIN && nb && mlp_end_look(s))
            p = mlp_peek(s, fd, iov, n, total, flags, nb);
        return mlp_rx_error(s, p);
    }
    /* MSG_WAITALL waits only on a blocking call: nonblocking (or MSG_DONTWAIT), the kernel
     * returns what is there once some arrived.  Between its waits another thread may read,
     * as in the kernel (sk_wait_data releases the socket lock).  A blocking call returns once
     * it has the bytes of SO_RCVLOWAT (at most len; all of len with MSG_WAITALL), as TCP's
     * (sock_rcvlowat); its waits end as the kernel's do, once the mark's bytes are queued
     * (__ml_chan_rx_at_mark_ro), or at the end, a signal, the timeout (with what it has). */
    bool waitall = (flags & MSG_WAITALL) && !nb;
    size_t target = waitall ? total : s->ch->rx_lowat > 1 ? s->ch->rx_lowat : 1;
    if (target > total)
        target = total;
    ssize_t done = 0, r;
    int i = 0;
    size_t off = 0;
    bool looked = false;
    for (;;) {
        if ((r = mlp_lock_rx(s, nb)) < 0)
            return done ? done : r; /* a handler re-entered us, or the lock is broken */
        if (done && __ml_chan_rx_urg_dist(s->ch) == 0) {
            mlp_unlock_rx(s); /* the peer's urgent byte came where we wait for more: TCP's */
            break;            /* receive ends there with what it has */
        }
        r = mlp_rx_pass(s, iov, n, &i, &off, (flags & MSG_TRUNC) != 0);
        /* More wanted (MSG_WAITALL, SO_RCVLOWAT): not past the peer's urgent byte, as TCP's
         * receive ends there once it has bytes (channel.c, ml_rx_urg_cut). */
        bool more = r > 0 && !nb && i != n && (size_t)(done + r) < target &&
                    __ml_chan_rx_urg_dist(s->ch) != 0;
        mlp_unlock_rx(s);
        if (r > 0) {
            mlp_rx_got(s);
            done += r;
            if (!more)
                break;
            continue;
        }
        if (r == -EAGAIN && nb && !done && !looked && mlp_eagain_look(s)) {
            looked = true; /* the peer's end, found on the kernel socket: look again */
            continue;
        }
        if (r != -EAGAIN || nb || (size_t)done >= target)
            break;
        if ((r = mlp_wait_dir(s, 0, 1, dl)) < 0)
            break;
    }
    if (done > 0)
        return done;
    r = mlp_rx_error(s, r);
    if (r == 0)
        mlp_split_check(s, fd);
    return r;
}

/*
 * A send or a receive that holds the socket by its direction's fast word alone, without a
 * reference: two locked instructions a call fewer (about 13 ns here).  For a socket never
 * forked, settled on the channel, and a call that moves bytes at once: a receive that finds
 * some, a nonblocking send that finds room, a blocking one of at most half the ring that finds
 * room for all of it.  Anything else (an empty ring, a full one, an error, the end, a flag of
 * another kind, SO_RCVLOWAT on a blocking receive) gives the word back before a byte moved and
 * says MLP_SLOW: the regular path makes the call afresh.  The word keeps the socket whole: its
 * teardown takes both words first (mlp_sock_destroy), and one a handler closed on top of us
 * waits for our give-back (mlp_fast_defer).  The fd table is read again once the word is held,
 * so a socket closed and made anew for another fd meanwhile is never used for this one; the
 * words are never cleared by reuse (mlp_sock_new).  A handler's jump out of the copy gives the
 * word back by the call's cleanup (mlp_call_left), its position reloaded.
 */
static struct mlp_sock *mlp_fast_begin(int fd, struct mlp_call *c, bool tx)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (ml_unlikely(!r))
        return NULL;
    struct mlp_sock *s = atomic_load_explicit(&r->sock, memory_order_acquire);
    if (!s || atomic_load_explicit(&s->forked, memory_order_relaxed))
        return NULL;
    _Atomic uint32_t *w = tx ? &s->ftx : &s->frx;
    c->s = NULL;
    c->fast = s;
    c->nheld = mlp_nheld;
    mlp_left_push(&c->buf, mlp_call_left, c);
    int k = mlp_lock(w, MLP_LK_FAST);
    /* The look at forked after the take: see mlp_lock_dir. */
    if (ml_likely(k == 0) && ml_likely(!atomic_load(&s->forked)) &&
        ml_likely(atomic_load_explicit(&r->sock, memory_order_acquire) == s) &&
        s->type == MLP_CONN && s->state == MLP_ACCEL && s->ch)
        return s;
    if (k >= 0) {
        if (k == 1 && s->ch) { /* an abandoned section's hold, ours again: its position */
            if (tx)
                __ml_chan_resync_tx(s->ch);
            else
                __ml_chan_resync_rx(s->ch);
        }
        mlp_unlock(w, MLP_LK_FAST);
    }
    mlp_fast_finish_check(s); /* before c->fast goes: see mlp_fast_end */
    c->fast = NULL;
    mlp_left_pop(&c->buf);
    return NULL;
}

static void mlp_fast_end(struct mlp_sock *s, struct mlp_call *c, bool tx)
{
    mlp_unlock(tx ? &s->ftx : &s->frx, MLP_LK_FAST);
    /* The deferred teardown before c->fast goes: a jump between the two runs the cleanup, whose
     * second look finds nothing pending (an exchange), where a jump after c->fast went and before
     * the look lost the teardown. */
    mlp_fast_finish_check(s);
    c->fast = NULL;
    mlp_left_pop(&c->buf);
}

ssize_t mlp_send_fast(int fd, const struct iovec *iov, int n, int flags)
{
    if (flags & ~(MSG_DONTWAIT | MSG_NOSIGNAL))
        return MLP_SLOW;
    struct mlp_call c;
    struct mlp_sock *s = mlp_fast_begin(fd, &c, true);
    if (!s)
        return MLP_SLOW;
    /* The vector is read only now, the socket known to be on the channel: on one settled on
     * TCP the regular path hands it to the kernel unread, and one the kernel cannot read is
     * EFAULT there, not a SIGSEGV here (tests/preload/iovtcp.c). */
    ssize_t t = mlp_iov_total(iov, n, false);
    ssize_t r = MLP_SLOW;
    if (t <= 0 || t > ML_INT_MAX_IO)
        goto out;
    /* As the regular path's first ring operation: a process that confines itself later may be
     * killed for the getsockopt (sshd's pre-authentication child is, for any). */
    mlp_sync_timeouts(s, fd);
    if ((flags & MSG_DONTWAIT) || mlp_nonblock(s)) {
        int i = 0;
        size_t off = 0;
        r = mlp_tx_pass(s, iov, n, &i, &off);
        if (r > 0 && r < t) /* cut short: the ring is full (none at all: the regular path's) */
            __ml_chan_sio_room(s->ch);
    } else if ((size_t)t <= s->ch->size / 2) {
        r = mlp_tx_whole(s, iov, n, (size_t)t); /* as mlp_send's: whole or nothing */
    }
out:
    mlp_fast_end(s, &c, true);
    return r > 0 ? r : MLP_SLOW;
}

/*
 * A blocking receive on the fast path that found the ring empty spins for its bytes holding the
 * word, up to MLP_HOLD_SPIN_NS (the spin policy's budget at most: none where it spins none),
 * before it gives the word back to take the regular path, whose wait then spins that much less.
 * Before, the answer of a request and reply always came through the regular path: a reference
 * and a second take of the lock, and its wait's two clock readings.  The word is held a few
 * microseconds at most: another thread's receive on the socket, a close or a fork's drain
 * waits that long.  The spin reads shared memory only (__ml_chan_spin_rx_ro), so a handler on
 * top of it borrows the word (mlp_spin_word), and a handler without SA_RESTART ends it with
 * EINTR as it ends the kernel's receive.  Found ready, the socket is looked up again: a handler
 * may have closed it, or a fork made it shared (the mutex from then on).
 */
#define MLP_HOLD_SPIN_NS 20000u

/* 1: found ready, the socket still ours on the fast word; MLP_SLOW: not (the budget ran out,
 * or the socket changed under a handler); -EINTR. */
static int mlp_rx_hold_spin(struct mlp_sock *s, int fd)
{
    void *prev = mlp_spin_word;
    mlp_spin_word = &s->frx;
    atomic_signal_fence(memory_order_seq_cst);
    int k = __ml_chan_spin_rx_ro(s->ch, MLP_HOLD_SPIN_NS);
    atomic_signal_fence(memory_order_seq_cst);
    mlp_spin_word = prev;
    atomic_signal_fence(memory_order_seq_cst);
    if (k < 0)
        return k; /* -EINTR */
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (k == 0 || atomic_load(&s->forked) || !rec ||
        atomic_load_explicit(&rec->sock, memory_order_acquire) != s ||
        s->state != MLP_ACCEL)
        return MLP_SLOW;
    return 1;
}

/* A blocking MSG_WAITALL receive on the fast path: whole or nothing.  Only once the ring holds
 * all of it (after a spin, if need be) does it copy; else MLP_SLOW with nothing moved. */
static ssize_t mlp_rx_whole(struct mlp_sock *s, int fd, const struct iovec *iov, int n,
                            size_t total)
{
    if (total > s->ch->size || __ml_chan_rx_urg_dist(s->ch) >= 0)
        return MLP_SLOW; /* an urgent byte ahead: the regular path stops or skips there */
    int64_t a = __ml_chan_rx_avail_ro(s->ch);
    if (a >= 0 && (uint64_t)a < total) {
        int k = mlp_rx_hold_spin(s, fd);
        if (k != 1)
            return k;
        a = __ml_chan_rx_avail_ro(s->ch);
    }
    if (a < 0 || (uint64_t)a < total)
        return MLP_SLOW; /* cannot tell, or not all of it yet: the regular path waits */
    int i = 0;
    size_t off = 0;
    return mlp_rx_pass(s, iov, n, &i, &off, false);
}

ssize_t mlp_recv_fast(int fd, const struct iovec *iov, int n, int flags)
{
    if (flags & ~(MSG_DONTWAIT | MSG_WAITALL))
        return MLP_SLOW;
    struct mlp_call c;
    struct mlp_sock *s = mlp_fast_begin(fd, &c, false);
    if (!s)
        return MLP_SLOW;
    ssize_t t = mlp_iov_total(iov, n, false); /* read now: see mlp_send_fast */
    ssize_t r = MLP_SLOW;
    if (t <= 0 || t > ML_INT_MAX_IO)
        goto out;
    mlp_sync_timeouts(s, fd); /* see mlp_send_fast */
    bool nb = (flags & MSG_DONTWAIT) || mlp_nonblock(s);
    if (!nb && (flags & MSG_WAITALL)) {
        r = mlp_rx_whole(s, fd, iov, n, (size_t)t);
    } else if (nb || s->ch->rx_lowat <= 1) {
        /* MSG_WAITALL waits only on a blocking call (as the kernel's) */
        int i = 0;
        size_t off = 0;
        /* A blocking receive that finds the ring empty spins at once: the receive's own look
         * would say EAGAIN after its looks at the peer's state, which the spin makes too. */
        r = !nb && __ml_chan_rx_nothing(s->ch) ? -EAGAIN : mlp_rx_pass(s, iov, n, &i, &off, false);
        if (r == -EAGAIN && !nb && (r = mlp_rx_hold_spin(s, fd)) == 1) {
            i = 0;
            off = 0;
            r = mlp_rx_pass(s, iov, n, &i, &off, false);
        }
    }
    if (r > 0)
        mlp_rx_got(s);
out:
    mlp_fast_end(s, &c, false);
    if (r == -EINTR) {
        errno = EINTR;
        return -1;
    }
    return r > 0 ? r : MLP_SLOW;
}

/* ---- shutdown, ioctl, options ------------------------------------------------------------ */

int mlp_shutdown(struct mlp_sock *s, int fd, int how)
{
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return -EINVAL;
    int st = s->state, kernel_how = how;
    if (st == MLP_UNDECIDED && (how == SHUT_WR || how == SHUT_RDWR))
        st = mlp_decide(s, fd, false); /* settled already, perhaps: a look, no wait */
    bool owe = st == MLP_UNDECIDED && how != SHUT_RD;
    /* A reset closes the kernel's socket (TCP_CLOSE), and every shutdown after it fails with
     * ENOTCONN (the shutdown bits are set all the same).  The kernel socket under an accelerated
     * connection never hears of a reset (the bytes left unread were the ring's, so the peer's
     * kernel sent a FIN): the channel says, asked before our own end moves, with a probe of the
     * peer's liveness (a holder killed with our bytes unread; shutdown is no hot path).  Over
     * kernel TCP it returned ENOTCONN, here 0 (tests/preload/shutreset.c). */
    bool reset = st == MLP_ACCEL && mlp_reset_state(s, true) != 0;
    /* What follows wakes our threads that wait on the channel, one of which may close fd and
     * open another socket at its number before the kernel's calls below: they act on the file,
     * held (fdtable.c, mlp_hold_file). */
    int slot = -1;
    if (st != MLP_TCP)
        (void)mlp_hold_file(fd, &slot);
    if (owe) {
        /* The EOF goes into the ring; the kernel's shutdown waits for the settle (see
         * mlp_shut_owed_pay).  Owed first, then settled looked at again: a claim or a withdrawal
         * made meanwhile by another thread may have passed the flag by, and is paid here. */
        atomic_store(&s->shut_owed, true);
        kernel_how = how == SHUT_RDWR ? SHUT_RD : -1;
    }
    if (st == MLP_TCP) {
        if (how != SHUT_RD)
            (void)mlp_tcp_catch_up(s, fd, true);
    } else {
        if (how == SHUT_RD || how == SHUT_RDWR) {
            /* Reads return what is queued, then 0, as Linux does after SHUT_RD. */
            s->ch->rd_eof_when_empty = true;
            __ml_chan_kick_rx(s->ch);
            mlp_poll_kick(s); /* a recv in its long sleep (mlp_sock_sleep) */
        }
        if (how == SHUT_WR || how == SHUT_RDWR) {
            /* A peer that shut down with our bytes unread and then died: its kernel reset us
             * at its death, unless our FIN came first (both FINs: no reset).  Which came first
             * is known only now, so its liveness is probed here, once, in that state alone
             * (tests/preload/finreset.c, "holder killed, client shut after"). */
            if (!s->ch->shut_wr && !s->ch->split &&
                __ml_chan_peer_state(s->ch) == ML_SIDE_SHUT_WR &&
                (__ml_chan_peer_left_unread(s->ch) ||
                 (atomic_load(&mlp_side_block(s->ch, 1 - s->side)->flags) & ML_SOCK_LINGER0))) {
                int e0 = errno;
                if (__ml_chan_check_peer(s->ch) != 0)
                    s->ch->dead_before_fin = true;
                errno = e0;
            }
            /* From a handler that interrupted our own send: only flags change, so unlocked. */
            bool locked = mlp_lock_tx(s, false) == 0;
            (void)memlan_shutdown(s->ch, MEMLAN_SHUT_WR);
            if (locked)
                mlp_unlock_tx(s);
            /* After exit()'s handler took the channel's name (ML_SOCK_UNNAMED): the peer
             * judges our liveness by the kernel socket, whose FIN must then be our process's
             * end, not this shutdown (else the peer, finding no name and a FIN it must take
             * for the shutdown's, never finds us gone, and its sends wait for room for ever:
             * exitrace "lateshut").  The kernel socket keeps its writing; the flag tells the
             * peer (mlp_unname_at_exit: the fence pairs with its own). */
            atomic_thread_fence(memory_order_seq_cst);
            _Atomic uint32_t *fl = s->me ? &s->me->flags : NULL;
            if (fl && (atomic_load(fl) & ML_SOCK_UNNAMED)) {
                atomic_fetch_or(fl, ML_SOCK_LATE_FIN);
                kernel_how = how == SHUT_RDWR ? SHUT_RD : -1;
            }
            __ml_chan_kick_tx(s->ch); /* a send asleep for room ends: EPIPE, as the kernel's */
            mlp_poll_kick(s);
        }
    }
    int kfd = mlp_held_fd_now(slot, fd); /* (another thread's close_range may have taken it) */
    if (owe && s->state == MLP_TCP)
        (void)mlp_tcp_catch_up(s, kfd, true); /* withdrawn meanwhile: the bytes, then the FIN */
    else if (owe && s->state == MLP_ACCEL)
        mlp_shut_owed_pay(s, kfd); /* claimed meanwhile */
    /* The kernel socket too: it keeps ss and the peer's kernel view in step.  Its ENOTCONN is
     * the answer too: it is closed only once both ends' FINs went through, as kernel TCP's
     * would be (a second shutdown after the peer's close), or after a reset. */
    int saved = errno, r = reset ? -ENOTCONN : 0;
    if (kernel_how >= 0 && mlp_real_shutdown(kfd, kernel_how) < 0)
        r = -errno;
    mlp_hold_release(slot);
    errno = saved;
    return r;
}

/*
 * O_ASYNC (fcntl F_SETFL, ioctl FIOASYNC) asks for SIGIO (or F_SETSIG's signal) when data
 * comes.  The kernel raises it for its own socket, which an accelerated connection's bytes never
 * reach (gdb's interrupt, which gdbserver waits for by SIGIO, hung).  So the channel carries it:
 * our side has a FIFO in the fabric (sioS-TOKEN, channel.c; made by its first holder, taken as
 * it is by the others), whose read end each holder keeps with O_ASYNC and the socket's owner
 * and signal, and the peer writes a byte to it at each publication (its bytes, its end) while
 * our tripwire's ML_WAIT_SIGIO stands: the kernel raises the signal (design.md, "SIGIO").
 * Cleared, the bit goes and the FIFO stays until the socket does.  Where it cannot be carried
 * (a handler, a vfork child, a sandbox, no FIFO), said once per connection, in the log and, the
 * image's first time, on stderr.
 */
static bool mlp_sio_lock(struct mlp_sock *s)
{
    for (int i = 0; i < 1000; i++) {
        int z = 0;
        if (atomic_compare_exchange_weak(&s->sio_busy, &z, 1))
            return true;
        sched_yield();
    }
    return false; /* a holder that never lets go (a fork child's copy of a busy word) */
}

/* A FIFO of ours gets the socket's owner and signal (SIGURG for the SIGURG FIFO); a raw fcntl
 * each: a handler may come here. */
static void mlp_fifo_owner(int sf, int fd, bool urg)
{
    struct f_owner_ex o;
    if (__ml_sys_fcntl(fd, F_GETOWN_EX, (long)&o) == 0)
        (void)__ml_sys_fcntl(sf, F_SETOWN_EX, (long)&o);
    long sig = urg ? SIGURG : __ml_sys_fcntl(fd, F_GETSIG, 0);
    if (sig >= 0)
        (void)__ml_sys_fcntl(sf, F_SETSIG, sig);
}

static bool mlp_has_owner(int fd)
{
    struct f_owner_ex o;
    return __ml_sys_fcntl(fd, F_GETOWN_EX, (long)&o) == 0 && o.pid != 0;
}

/* A connection with an owner gets SIGURG from the kernel when TCP's urgent pointer comes
 * (vsftpd's ABOR during a transfer is seen so).  The channel carries it as SIGIO: our side's
 * FIFO urgS-TOKEN, with the socket's owner and SIGURG as its signal, and ML_SOCK_SIGURG in our
 * side's flags, which the peer's urgent send reads (mlp_send_urgent).  Not from a handler, a
 * vfork child or a sandbox; where it cannot be made, said in the log (the connection may never
 * carry urgent data). */
static void mlp_urg_setup(struct mlp_sock *s, int fd)
{
    if (s->type != MLP_CONN || s->state == MLP_TCP || !s->ch || !s->me || s->urg_fd >= 0 ||
        mlp_sig_in_handler() || mlp_vfork_child() || mlp_known_confined() || !mlp_has_owner(fd) ||
        !mlp_sio_lock(s))
        return;
    int w, f = s->urg_fd < 0 ? __ml_chan_sio_open(s->ch, true, &w) : -EEXIST;
    if (f >= 0) {
        s->urg_fd = f;
        s->urg_wfd = w;
        mlp_own_fd(&s->urg_fd, true);
        mlp_own_fd(&s->urg_wfd, true);
        mlp_fifo_owner(s->urg_fd, fd, true);
        long r = __ml_sys_fcntl(s->urg_fd, F_SETFL, O_NONBLOCK | O_ASYNC);
        if (r >= 0)
            atomic_fetch_or(&s->me->flags, ML_SOCK_SIGURG);
        else
            f = (int)r;
    }
    atomic_store(&s->sio_busy, 0);
    if (f < 0 && f != -EEXIST)
        mlp_log(0, "fd %d: an owner is set, for which the kernel raises SIGURG when urgent data "
                   "comes, and this connection's urgent data goes through shared memory: its "
                   "FIFO could not be made (%s), so no SIGURG will come", fd, strerror(-f));
}

/* Before a credential change that may put the fabric out of reach (cred.c): the SIGURG FIFO
 * made now, without an owner (no signal yet), for an owner set after the change (vsftpd's
 * session sets it once it runs as the user: its FIFO could not be made, and its async ABOR was
 * not acted on: an explorer).  An fd of ours more per connection (two with its write end),
 * within cred.c's bound of 16 connections. */
void mlp_urg_premake(struct mlp_sock *s)
{
    if (s->type != MLP_CONN || s->state != MLP_ACCEL || !s->ch || !s->me || s->urg_fd >= 0 ||
        mlp_sig_in_handler() || mlp_vfork_child() || mlp_known_confined() || !mlp_sio_lock(s))
        return;
    int w, f = s->urg_fd < 0 ? __ml_chan_sio_open(s->ch, true, &w) : -1;
    if (f >= 0) {
        s->urg_fd = f;
        s->urg_wfd = w;
        mlp_own_fd(&s->urg_fd, true);
        mlp_own_fd(&s->urg_wfd, true);
        (void)__ml_sys_fcntl(s->urg_fd, F_SETSIG, SIGURG);
        (void)__ml_sys_fcntl(s->urg_fd, F_SETFL, O_NONBLOCK | O_ASYNC);
    }
    atomic_store(&s->sio_busy, 0);
}

/* F_SETOWN, F_SETOWN_EX, F_SETSIG on the socket: its FIFOs follow; a first owner makes the
 * SIGURG one (or finds it made before a credential change) and says so to the peer. */
void mlp_sio_owner(struct mlp_sock *s, int fd)
{
    int sf = s->sio_fd, uf = s->urg_fd;
    if (sf >= 0) {
        mlp_fifo_owner(sf, fd, false);
    } else if (s->type == MLP_CONN && s->ch && s->state != MLP_TCP && !mlp_sig_in_handler() &&
               !mlp_vfork_child()) {
        /* O_ASYNC set by another holder (our fork parent, after the fork): our own read end,
         * with the owner we set (that holder's keeps its own: the old owner is signalled too) */
        long fl = __ml_sys_fcntl(fd, F_GETFL, 0);
        if (fl > 0 && (fl & O_ASYNC))
            mlp_async(s, fd, true);
    }
    if (uf >= 0) {
        mlp_fifo_owner(uf, fd, true);
        if (s->me && mlp_has_owner(fd))
            atomic_fetch_or(&s->me->flags, ML_SOCK_SIGURG);
    } else {
        mlp_urg_setup(s, fd);
    }
}

/* A ring of ours that could not reach a peer's FIFO (channel.c, __ml_chan_sig_ring): that
 * peer's program may wait for a signal that will not come.  Said once per process, not from a
 * handler; a FIFO that is gone (the peer closed) or full (it rings already) is not a miss. */
void mlp_sio_missed(struct memlan_channel *ch, bool urg, int err)
{
    static _Atomic bool told;
    if (err == ENOENT || err == ENXIO || err == EPIPE || err == EAGAIN ||
        mlp_sig_in_handler() || mlp_vfork_child() || atomic_exchange(&told, true))
        return;
    mlp_log(0, "a peer asked for %s, which memlan raises through a FIFO of the peer's in the "
               "fabric, and this process could not open it (%s%s): no %s reaches that peer for "
               "this process's sends",
            urg ? "SIGURG (an owner set on its socket)" : "SIGIO (O_ASYNC)", strerror(err),
            err == EACCES ? ": it changed its credentials, or the fabric's permissions keep it "
                            "out" : err == EMFILE || err == ENFILE ? ": no descriptor left" : "",
            urg ? "SIGURG" : "SIGIO");
    (void)ch;
}

/* At exit, a side we hold alone: our FIFOs' names go (the fds go with the process). */
void mlp_sio_at_exit(struct mlp_sock *s)
{
    if (s->type != MLP_CONN || !s->ch || !s->me || atomic_load(&s->me->holders) > 1)
        return;
    if (s->sio_fd >= 0)
        __ml_chan_sio_unlink(s->ch, false);
    if (s->urg_fd >= 0)
        __ml_chan_sio_unlink(s->ch, true);
}

void mlp_async(struct mlp_sock *s, int fd, bool on)
{
    if (s->type != MLP_CONN || s->state == MLP_TCP || !s->ch)
        return;
    if (!on) { /* the open file's flag, for every holder (as the kernel's is), FIFO or not */
        __ml_chan_sio_arm(s->ch, false);
        return;
    }
    const char *why = NULL;
    int err = 0;
    if (mlp_sig_in_handler() || mlp_vfork_child())
        why = "it was asked in a signal handler or a vfork child";
    else if (mlp_known_confined())
        why = "the process is in a seccomp sandbox";
    else if (!mlp_sio_lock(s))
        why = "another thread held the socket's set-up";
    else {
        if (s->sio_fd < 0) {
            int w, f = __ml_chan_sio_open(s->ch, false, &w);
            if (f >= 0) {
                s->sio_fd = f;
                s->sio_wfd = w;
                mlp_own_fd(&s->sio_fd, true);
                mlp_own_fd(&s->sio_wfd, true);
            } else {
                err = -f;
            }
        }
        if (s->sio_fd >= 0) {
            mlp_fifo_owner(s->sio_fd, fd, false);
            long r = __ml_sys_fcntl(s->sio_fd, F_SETFL, O_NONBLOCK | O_ASYNC);
            if (r < 0)
                err = (int)-r;
            else
                __ml_chan_sio_arm(s->ch, true);
        }
        atomic_store(&s->sio_busy, 0);
        if (err)
            why = "its FIFO could not be made";
        mlp_urg_setup(s, fd); /* the owner O_ASYNC needs raises SIGURG too */
    }
    if (atomic_exchange(&s->async_told, true))
        return;
    if (!why) {
        long sig = __ml_sys_fcntl(fd, F_GETSIG, 0);
        mlp_log(1, "fd %d: O_ASYNC: SIGIO for the connection's bytes is raised through its FIFO "
                   "in the fabric%s", fd,
                sig > 0 ? " (F_SETSIG's si_fd names memlan's descriptor of that FIFO, not the "
                          "socket)" : "");
        return;
    }
    const char *fmt = "fd %d: O_ASYNC asks for SIGIO when data comes, which the kernel raises "
                      "for its socket only, and this connection's bytes go through shared "
                      "memory: no SIGIO comes for them, since %s%s%s (a program that waits for "
                      "it before it reads waits for ever; MEMLAN_OFF=1, or --no-ports for the "
                      "port, keeps such connections on TCP)";
    const char *e1 = err ? ": " : "", *e2 = err ? strerror(err) : "";
    if (!(atomic_fetch_or(&mlp_said, MLP_SAID_ASYNC) & MLP_SAID_ASYNC))
        mlp_say(MLP_SAID_ASYNC, fmt, fd, why, e1, e2);
    else
        mlp_log(0, fmt, fd, why, e1, e2);
}

int mlp_ioctl(struct mlp_sock *s, int fd, unsigned long req, void *arg, bool *handled)
{
    *handled = false;
    if (s->type != MLP_CONN || s->state == MLP_TCP)
        return 0;
    switch (req) {
    case FIONREAD: { /* == SIOCINQ */
        /* An undecided client is settled first, without waiting, as a poll would settle it:
         * the acceptor may have attached and written since our offer, and a count of 0 there
         * (Java's InputStream.available() after a sleep) said no bytes where kernel TCP said
         * 1000.  Fallen to TCP, the kernel's count is the answer. */
        int st = s->state;
        if (st == MLP_UNDECIDED && !mlp_sig_in_handler() && !mlp_vfork_child())
            st = mlp_decide(s, fd, false); /* not from a handler (its lock), nor a vfork child */
        if (st == MLP_TCP)
            return 0;
        *handled = true;
        if (!arg)
            return -EFAULT; /* the kernel's answer, not our fault */
        if (st == MLP_UNDECIDED)
            return *(int *)arg = 0, 0;
        int64_t a = __ml_chan_rx_avail_ro(s->ch); /* we do not hold the direction */
        uint8_t b;
        int64_t before = -1;
        /* Out of line, the bytes before the peer's urgent byte, as TCP's count stops there */
        if (a > 0 && __ml_chan_urg_state(s->ch, &b, &before, false) && before >= 0 &&
            before < a && !__ml_chan_urg_inline(s->ch))
            a = before;
        *(int *)arg = a > 0 ? (a > INT32_MAX ? INT32_MAX : (int)a) : 0;
        return 0;
    }
    case SIOCOUTQ:
    case SIOCOUTQNSD:
        /* Bytes in the ring are the peer's receive queue (its FIONREAD counts them): sent and,
         * for TCP, acknowledged.  Over loopback the kernel's count is 0 too once a send
         * returns, while the peer's receive buffer has room; counting the ring's bytes, a
         * program that waits for its queue to empty (before a close, a shutdown, its next
         * message) waited for the peer program's read instead (1000 bytes sent to a peer not
         * reading yet: 0 over kernel TCP, 1000 here; tests/py/test_preload.py,
         * test_outq_counts_what_loopback_counts).  Past the peer's receive buffer the kernel
         * keeps the rest in our queue; the ring has no such split, and says 0 there too. */
        *handled = true;
        if (!arg)
            return -EFAULT;
        *(int *)arg = 0;
        return 0;
    case SIOCATMARK:
        /* Whether our reads are at the peer's urgent byte (mlp_send_urgent's mark), as TCP's
         * urg_data && urg_seq == copied_seq: the reads stop there.  Read-only (a SIGURG-style
         * handler asks it in mid-read).  Undecided: the kernel's (no mark yet). */
        if (s->state != MLP_ACCEL)
            return 0;
        *handled = true;
        if (!arg)
            return -EFAULT;
        {
            uint8_t b;
            *(int *)arg = (__ml_chan_urg_state(s->ch, &b, NULL, false) & ML_URG_AT) != 0;
        }
        return 0;
    case FIONBIO:
        if (mlp_real_ioctl(fd, req, arg) < 0)
            return *handled = true, -errno;
        mlp_set_nonblock(s, *(int *)arg != 0);
        *handled = true;
        return 0;
    default:
        return 0;
    }
}

int mlp_setsockopt(struct mlp_sock *s, int level, int name, const void *val, socklen_t len)
{
    if (s->type != MLP_CONN || !s->ch || level != SOL_SOCKET)
        return 0;
    if ((name == SO_SNDBUF || name == SO_SNDBUFFORCE) && len >= sizeof(int) &&
        s->state == MLP_UNDECIDED && mlp_lock_tx(s, true) == 0) {
        /* An offer's bytes must all fit in the kernel's buffers at a withdrawal: a send
         * buffer made smaller after connect lowers its limit to twice the size asked, as the
         * kernel doubles it, and 32 KiB of its peer's receive buffer (it took 80 KB for
         * 16 KiB, 324 KB for 128 KiB, measured; the size itself made sends of 40 KB wait for
         * the decision: a third review).  Set higher, the limit stays.  A review: 1 MiB taken
         * into the ring with SO_SNDBUF 16 KiB, and only 80 KB of it reached the server after
         * the fall to TCP. */
        int v = *(const int *)val;
        __ml_chan_offer_limit(s->ch, 2 * (uint64_t)(v > 0 ? v : 0) + (32u << 10));
        mlp_unlock_tx(s);
    }
    if (name == SO_LINGER && len >= sizeof(struct linger) && s->me) {
        const struct linger *lg = val;
        if (lg->l_onoff && lg->l_linger == 0)
            atomic_fetch_or(&s->me->flags, ML_SOCK_LINGER0);
        else
            atomic_fetch_and(&s->me->flags, ~ML_SOCK_LINGER0);
        return 0;
    }
    if (name == SO_OOBINLINE && len >= sizeof(int)) {
        s->ch->urg_inline = *(const int *)val != 0; /* the receive's at an urgent byte */
        s->ch->urg_inline_known = true;
        return 0;
    }
    if (name == SO_RCVLOWAT && len >= sizeof(int)) {
        uint32_t old = s->ch->rx_lowat;
        s->ch->rx_lowat = mlp_lowat_value(val);
        /* Lowered: what is queued may be enough now; the kernel wakes its waiters too
         * (tcp_set_rcvlowat).  Ours: the ring's futex, and whoever waits through our queue. */
        if (s->ch->rx_lowat < old && s->state == MLP_ACCEL && __ml_chan_rx_at_mark_ro(s->ch)) {
            __ml_chan_kick_rx(s->ch);
            if (s->ch->evq)
                __ml_evq_post_local(s->ch->evq, s->ch->evq_index);
        }
        return 0;
    }
    if (len < sizeof(struct timeval))
        return 0;
    if (name == SO_RCVTIMEO || name == SO_SNDTIMEO) {
        uint64_t ns = mlp_tv_ns(val);
        if (name == SO_RCVTIMEO)
            s->ch->rx_tmo_ns = ns;
        else
            s->ch->tx_tmo_ns = ns;
    }
    return 0;
}

/* ---- life cycle -------------------------------------------------------------------------- */

/*
 * The application closes fd, the last of its fds for s in this process.  An undecided offer is
 * withdrawn and whatever went into its ring is sent over TCP before the kernel socket closes
 * (the kernel, too, delivers what was written before close).
 */
void mlp_before_last_close(struct mlp_sock *s, int fd)
{
    if (s->type != MLP_CONN || !s->ch)
        return;
    if (s->state == MLP_UNDECIDED) {
        /* A handler (a close, or exit() at its end) on top of this thread's withdrawal or claim,
         * which holds mu: a lock for ever.  It waits a little for another thread's, then leaves
         * the socket undecided (tests/preload/exithandler.c). */
        bool locked = !mlp_sig_in_handler();
        if (locked)
            pthread_mutex_lock(&s->mu);
        for (int i = 0; !locked && i < 100; i++)
            if (!(locked = pthread_mutex_trylock(&s->mu) == 0))
                (void)nanosleep(&(struct timespec){0, 1000000}, NULL);
        if (!locked)
            return;
        bool claimed = false, withdrew = false;
        if (s->state == MLP_UNDECIDED) {
            int w = __ml_chan_withdraw(s->ch);
            if (w == -EPROTO) {
                /* A broken word (garbage, written by no attacher): nobody can attach any more,
                 * so the ring's bytes go over TCP below, as mlp_withdraw sends them; an acceptor
                 * that claimed before the word was overwritten reads our reset.  Kept on the
                 * ring, they were lost: the server read end-of-file (a review's reproduction). */
                atomic_fetch_or(&s->me->flags, ML_SOCK_RESET);
                __ml_chan_abandon(s->ch);
            }
            s->state = w == 0 || w == -EPROTO ? MLP_TCP : MLP_ACCEL;
            withdrew = w == 0 || w == -EPROTO;
            claimed = w == -EBUSY && __ml_chan_attach_state(s->ch) == 1;
        }
        pthread_mutex_unlock(&s->mu);
        /* Said in the log when the connection ends with us: a process that shares it (a child
         * that settled it before its exec, stunnel's exec service) goes on with it and says for
         * itself what it became. */
        bool alone = !s->me || atomic_load(&s->me->holders) <= 1;
        if (withdrew) {
            /* The connection stayed on TCP (what went into the ring goes out over TCP below),
             * and its log said nothing past "offer posted". */
            mlp_stat_conn(s, fd, "closed before a memlan acceptor took the offer");
            if (alone)
                mlp_log(1, "fd %d: TCP (closed before a memlan acceptor took the offer)", fd);
        } else if (claimed && alone) {
            mlp_claimed_at_close(s, fd);
        }
    }
    if (s->state == MLP_TCP)
        (void)mlp_tcp_catch_up(s, fd, true);
    mlp_split_check(s, fd);
}

/*
 * The last fd of s is being closed while other threads are inside calls on it (recv, send,
 * poll: each holds a reference).  In the kernel those calls hold the file, so the close only
 * removes the fd number: the socket lives on, no FIN goes out, and a byte the peer sends still
 * reaches the blocked recv, until the last call leaves.  So the kernel socket is kept open here by
 * a duplicate of our own until the socket's last reference goes (mlp_sock_destroy); without it
 * the kernel socket's FIN would tell the peer that we are gone while the channel still works.
 */
static void mlp_keep_file_refs(struct mlp_sock *s, int fd, int mine)
{
    if (s->type != MLP_CONN || !s->ch || atomic_load(&s->refs) <= mine ||
        atomic_exchange(&s->keep_taken, true))
        return;
    long k = __ml_sys_fcntl_dupfd(fd, 3, true);
    if (k < 0) {
        atomic_store(&s->keep_taken, false);
        return; /* no fd left: the close goes through as before, the FIN now */
    }
    s->keep_fd = (int)k;
    mlp_own_fd(&s->keep_fd, true);
    s->ch->sock_fd = s->keep_fd; /* the liveness check's view of the kernel socket */
}

/* After fd's last record went (the caller holds the table's reference it had). */
void mlp_keep_file(struct mlp_sock *s, int fd) { mlp_keep_file_refs(s, fd, 1); }

/*
 * Before a kernel call that closes fd before its record can go (dup2/dup3 over it, which close
 * fd2 inside the call and leave it naming another file; close_range with CLOSE_RANGE_UNSHARE
 * alone): if fd is its socket's last and calls are in progress, the keep-alive duplicate is
 * taken now, while fd still names the socket.  Taken afterwards it duplicated the new file (the
 * pipe dup2'd in: its reader never saw EOF), the liveness check looked at that, and the kernel
 * socket's last reference had gone with the dup2: a FIN under the blocked recv.
 */
void mlp_keep_file_early(int fd)
{
    struct mlp_sock *s = mlp_get(fd);
    if (!s)
        return;
    if (atomic_load(&s->nfds) <= 1)
        mlp_keep_file_refs(s, fd, 2); /* the table's reference and ours */
    mlp_put(s);
}

static void mlp_sock_destroy_conn(struct mlp_sock *s);

void mlp_sock_destroy(struct mlp_sock *s)
{
    /* Calls that hold a fast word hold the socket without a reference (mlp_fast_begin): the
     * teardown waits for them, and the words are free again when it is done.  Never ours here:
     * mlp_fast_defer. */
    bool tx = mlp_fast_lock(&s->ftx) == 0, rx = mlp_fast_lock(&s->frx) == 0;
    mlp_sock_destroy_conn(s);
    if (s->cred_fd > 0) {
        mlp_disown_fd(s->cred_fd);
        __ml_sys_close(s->cred_fd);
        s->cred_fd = 0;
        mlp_cred_kept_closed();
    }
    if (s->keep_fd > 0) { /* after the channel's close: the peer reads our end, not a death */
        mlp_disown_fd(s->keep_fd);
        __ml_sys_close(s->keep_fd);
        s->keep_fd = 0;
    }
    if (rx)
        mlp_fast_unlock(&s->frx);
    if (tx)
        mlp_fast_unlock(&s->ftx);
}

/*
 * Channels we let go of while another holder still held our side (sock.c's release, not the last
 * holder: a fork child alive then, which may end by _exit and never close): their names are
 * looked at again later, at most one look per entry per interval (100 ms, doubling to 10 s), a
 * few entries at each later release of this process's (and up to 64 at exit()), so that the
 * file of a connection whose last holder was a pool worker that outlived our close goes once
 * that worker is gone (an explorer's threaded client forking a multiprocessing pool: 179 files
 * left while it ran).  Bounded: 256 entries, the oldest dropped (its file left to a sweep, as
 * before).  A look is the sweep's test for that one file (__ml_seg_id_look).  A fork child starts
 * with none (mlp_later_after_fork); nothing is looked at in a sandbox.
 */
#define MLP_LATER_N 256
struct mlp_later {
    char token[MEMLAN_TOKEN_LEN + 1];
    uint64_t ino, dev, due, wait;
};
static struct mlp_later mlp_later[MLP_LATER_N];
static int mlp_nlater;
static pthread_mutex_t mlp_later_mu = PTHREAD_MUTEX_INITIALIZER;

/* A fork child looks at none of its parent's entries (the parent does: each child that ended
 * by exit() looked at up to 64 of them, a review counted 3,544 opens for 60 children), and its
 * lock may have been held by another thread of the parent at the fork. */
static void mlp_later_after_fork(void)
{
    mlp_nlater = 0;
    pthread_mutex_init(&mlp_later_mu, NULL);
}

static void mlp_later_tick(uint64_t now, int max)
{
    /* Not where a look (an open by name) may be killed for, or refused: a process that
     * sandboxed itself or lost the fabric since it listed them (a review: SIGSYS at the next
     * close after a seccomp filter that kills openat); its entries wait for a sweep. */
    if (!mlp_fab || mlp_sandboxed() || mlp_cred_lost(false))
        return;
    if (pthread_mutex_trylock(&mlp_later_mu) != 0)
        return; /* busy (another thread, or a handler on top of this one): next time */
    for (int i = 0, looks = 0; i < mlp_nlater && looks < max;) {
        struct mlp_later *e = &mlp_later[i];
        if (e->due > now) {
            i++;
            continue;
        }
        looks++;
        if (__ml_seg_id_look(mlp_fab, e->token, e->ino, e->dev)) { /* gone: forgotten */
            mlp_later[i] = mlp_later[--mlp_nlater];
            continue;
        }
        e->wait = e->wait * 2 < 10000000000ull ? e->wait * 2 : 10000000000ull;
        e->due = now + e->wait;
        i++;
    }
    pthread_mutex_unlock(&mlp_later_mu);
}

/* Let go of ch's file (not the last holder of our side): look at once, and later while a side is
 * still held (above; the release's tick, after this). */
static void mlp_let_go_look(struct memlan_channel *ch)
{
    struct mlp_later e = {.ino = ch->seg->ino, .dev = ch->seg->dev};
    memcpy(e.token, ch->seg->token, sizeof e.token);
    uint64_t now = mlp_now_ns();
    if (__ml_seg_let_go_look(ch->seg) == 0 && pthread_mutex_trylock(&mlp_later_mu) == 0) {
        if (mlp_nlater == MLP_LATER_N) /* the oldest goes */
            memmove(&mlp_later[0], &mlp_later[1], (MLP_LATER_N - 1) * sizeof mlp_later[0]);
        e.wait = 100000000ull;
        e.due = now + e.wait;
        mlp_later[mlp_nlater < MLP_LATER_N ? mlp_nlater++ : MLP_LATER_N - 1] = e;
        pthread_mutex_unlock(&mlp_later_mu);
    }
}

static void mlp_sock_destroy_conn(struct mlp_sock *s)
{
    mlp_poll_forget(s);
    mlp_locks_free(s);
    if (s->type == MLP_LISTENER) {
        if (s->rec)
            mlp_lrec_release(s->rec);
        s->rec = NULL;
        return;
    }
    if (s->lmap) {
        mlp_lmap_put(s->lmap);
        s->lmap = NULL;
    }
    /* our SIGIO and SIGURG FIFOs' read ends (mlp_async, mlp_sio_owner); their names go with
     * our side */
    bool had_sio = s->sio_fd >= 0, had_urg = s->urg_fd >= 0;
    int *fifo_fds[] = {&s->sio_fd, &s->sio_wfd, &s->urg_fd, &s->urg_wfd};
    for (size_t i = 0; i < sizeof fifo_fds / sizeof fifo_fds[0]; i++)
        if (*fifo_fds[i] >= 0) {
            mlp_disown_fd(*fifo_fds[i]);
            __ml_sys_close(*fifo_fds[i]);
            *fifo_fds[i] = -1;
        }
    if (!s->ch)
        return;
    if (s->state == MLP_UNDECIDED) {
        pthread_mutex_lock(&s->mu);
        int w = __ml_chan_withdraw(s->ch);
        if (w == -EPROTO) { /* broken: nobody attaches; an acceptor that had reads a reset */
            atomic_fetch_or(&s->me->flags, ML_SOCK_RESET);
            __ml_chan_abandon(s->ch);
        }
        s->state = w == 0 || w == -EPROTO ? MLP_TCP : MLP_ACCEL;
        pthread_mutex_unlock(&s->mu);
    }
    mlp_offer_gone(s);
    mlp_stat_clear(s);
    int fd = s->ch->seg->fd;
    mlp_disown_fd(fd);
    /* Only the last process holding our side ends the connection; the others just let go (as a
     * process that gave a withdrawn offer's count back at exit() has). */
    bool last = !atomic_load(&s->exit_let_go) && atomic_fetch_sub(&s->me->holders, 1) <= 1;
    if (last && had_sio)
        __ml_chan_sio_unlink(s->ch, false);
    if (last && had_urg)
        __ml_chan_sio_unlink(s->ch, true);
    if (last && s->state == MLP_ACCEL) {
        /* Closed with the peer's bytes unread, or SO_LINGER zero: the kernel would send a reset.
         * The flag goes before the close that publishes our end.  None when both sides had shut
         * down writing: the kernel's socket, with both FINs, is closed already (TIME_WAIT or
         * LAST_ACK's end) and its close sends nothing.  Decided here, at the close, and not by
         * the peer when it reads: a peer that shuts down after our reset keeps its EPIPE, as the
         * kernel's pending error is (tests/preload/finreset.c, "client shut after"). */
        bool mine_fin = ml_load_acquire(&s->ch->hdr->side_state[s->ch->side]) != ML_SIDE_OPEN;
        bool peer_fin =
            ml_load_acquire(&s->ch->hdr->side_state[1 - s->ch->side]) != ML_SIDE_OPEN;
        if ((__ml_chan_rx_avail_ro(s->ch) > 0 || (atomic_load(&s->me->flags) & ML_SOCK_LINGER0)) &&
            !(mine_fin && peer_fin))
            atomic_fetch_or(&s->me->flags,
                            ML_SOCK_RESET | (mine_fin ? ML_SOCK_RESET_AFTER_FIN : 0));
        __ml_chan_end(s->ch);
    } else {
        if (s->ch->evq)
            (void)memlan_evq_del(s->ch->evq, s->ch);
        /* Do not unlink: the channel lives on in another process; except a withdrawn offer's
         * (TCP: nobody ever attached), which is ours alone once our last holder goes.  The other
         * holders may all have ended without a close of ours (fork children's _exit): a look by
         * name after ours is gone (__ml_seg_let_go_look), for a connection that was ours to
         * end, where the look can be made (not in a sandbox, nor with the fabric out of reach,
         * nor once exit() let go, nor for a socket passed to another process). */
        bool look = !last && s->state == MLP_ACCEL && !atomic_load(&s->exit_let_go) &&
                    !(atomic_load(&s->me->flags) & ML_SOCK_PASSED) && !mlp_sandboxed() &&
                    !mlp_cred_lost(false);
        if (!(last && s->state == MLP_TCP))
            s->ch->seg->owner = false;
        __ml_chan_sio_drop(s->ch);
        if (look)
            mlp_let_go_look(s->ch);
        else
            __ml_seg_destroy(s->ch->seg);
        __ml_free(s->ch);
    }
    s->ch = NULL;
    if (ml_unlikely(mlp_nlater))
        mlp_later_tick(mlp_now_ns(), 4);
}

/* A child shares every accelerated socket with its parent: it counts as a holder from the moment
 * fork returns, so that a parent that closes its copy at once (a forking server: postgres) does
 * not end the connection under the child.  The count is taken before fork, in the parent, and
 * given back if fork fails.  The child starts with fresh process-local state (its own stat entry,
 * its own poll queue). */
static unsigned mlp_fork_gen;

/* How long a fork waits, in all, for the threads that hold sockets' fast words (mlp_lock_dir). */
#define MLP_FORK_DRAIN_NS 100000000ull

static void mlp_holders_add(int d)
{
    uint64_t drain_until = 0;
    if (d > 0)
        mlp_fork_gen++;
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        if (d > 0 && !atomic_load_explicit(&s->forked, memory_order_relaxed))
            atomic_store(&s->forked, true); /* for good; before the drain below (seq_cst) */
        /* One count per socket, however many fds name it: the stamp says it is counted. */
        if (s->type == MLP_CONN && s->me) {
            if (d > 0) {
                /* Parent and child must share one lock page; nobody of ours may hold a fast
                 * word across the fork (a holder that started before the flag was set). */
                if (!drain_until)
                    drain_until = mlp_now_ns() + MLP_FORK_DRAIN_NS;
                if ((!mlp_fast_drain(&s->ftx, drain_until) ||
                     !mlp_fast_drain(&s->frx, drain_until)))
                    mlp_log(1, "channel %s: fork went on while a thread of ours still moved "
                               "bytes on it (the next holder after the fork waits for it)",
                            s->ch ? s->ch->seg->token : "?");
                (void)mlp_locks_share(s); /* after the drain: the fast words' holders are gone */
            }
            if (d > 0 && s->fork_gen != mlp_fork_gen) {
                s->fork_gen = mlp_fork_gen;
                atomic_fetch_add(&s->me->holders, 1);
            } else if (d < 0 && s->fork_gen == mlp_fork_gen) {
                s->fork_gen = 0;
                atomic_fetch_sub(&s->me->holders, 1);
            }
        }
        mlp_put(s);
    }
}

void mlp_before_fork(void) { mlp_holders_add(1); }
void mlp_fork_failed(void) { mlp_holders_add(-1); }

/* exit() has begun in this process (mlp_at_exit has run or runs): what other threads make
 * from then on would outlive the process in the fabric, where nothing takes its name away: a
 * queue loses its names as it is made (mlp_queue_made), and a connection makes no offer (it
 * stays on TCP: exitrace "lateconn").  A fork child is not exiting. */
static _Atomic bool mlp_exit_began;

bool mlp_exiting(void) { return atomic_load(&mlp_exit_began); }

void mlp_after_fork_child(void)
{
    mlp_tid_cache = 0; /* the parent's thread id was copied with this thread's storage */
    atomic_store(&mlp_exit_began, false);
    mlp_later_after_fork();
    mlp_negotiate_after_fork();
    mlp_poll_after_fork();
    mlp_locks_after_fork();
    mlp_hold_after_fork(); /* files the parent's other threads held for a call */
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        pthread_mutex_init(&s->mu, NULL);
        /* What the parent's other threads' waits lent it (they do not exist here), for a socket
         * we hold (counted above): its only other references are ours, which the fd table
         * keeps, so the puts are never its last. */
        if (s->type == MLP_CONN && s->fork_gen == mlp_fork_gen)
            mlp_poll_fork_drop(s);
        if (atomic_load(&s->locks) == &s->own_locks) {
            /* Private locks are not shared with the parent: a thread of the parent's that held
             * one does not exist here. */
            mlp_dir_locks_init(&s->own_locks, false);
        }
        /* Nor do the holders of its fast words (the parent's, after a drain that gave up):
         * forked, it takes the mutex, but its teardown takes the words. */
        atomic_store_explicit(&s->ftx, 0, memory_order_relaxed);
        atomic_store_explicit(&s->frx, 0, memory_order_relaxed);
        atomic_store_explicit(&s->exit_let_go, false, memory_order_relaxed); /* counted anew */
        /* Nor the parent's thread that was inside the passed side's look (ml_passed_grace): its
         * flag, copied set, would keep our every look "in grace", and a passed side nobody
         * takes up would be waited for without end. */
        if (s->ch)
            __ml_chan_after_fork(s->ch);
        /* Its line was the parent's (our entry is our own, made on first use): listed again,
         * in ours, at our first send or receive on it (mlp_lock_dir), not here, where a child
         * that execs at once or never touches it (redis's BGSAVE) would pay for nothing. */
        if (s->slot >= 0 && s->type == MLP_CONN && s->state == MLP_ACCEL)
            atomic_store_explicit(&s->stat_owed, true, memory_order_relaxed);
        s->slot = -1;
        mlp_put(s);
    }
}

/* At exit: take the name of the channel's file away if the connection is open and ours alone
 * (see mlp_at_exit), saying so first in our side's block (ML_SOCK_UNNAMED): the peer, finding no
 * name, then judges our liveness by the kernel socket, which ends with the process.  A side that
 * fork children share keeps its name and our holders count (below).  A side that shut down has sent its FIN on the kernel socket, which can then no longer tell our
 * end: its name goes only when the peer has shut down or closed too, so that nothing the peer
 * can do still depends on our liveness (its reads end by our state, its writes by its own; the
 * flag keeps it from taking the missing name for our death meanwhile).  One the peer may still
 * write to keeps its name (the lock must answer then) and waits for the next sweep. */
static void mlp_unname_at_exit(struct mlp_sock *s)
{
    struct memlan_channel *ch = s->ch;
    /* The accepting side, ours alone, whose creator closed and left us the name
     * (ML_SOCK_NAME_LEFT, channel.c): nothing depends on our liveness by name any more. */
    if (s->state == MLP_ACCEL && ch && s->me && s->side == 1 && !ch->seg->owner &&
        atomic_load(&s->me->holders) <= 1 && __ml_chan_peer_state(ch) == ML_SIDE_CLOSED &&
        (atomic_load(&mlp_side_block(ch, 0)->flags) & ML_SOCK_NAME_LEFT)) {
        ch->seg->owner = true;
        __ml_chan_sio_names_gone(ch);
        __ml_seg_unname(ch->seg);
        return;
    }
    if (s->state != MLP_ACCEL || !ch || !s->me || s->side != 0 || !ch->seg->owner ||
        !ch->sock_ino)
        return;
    /* Shared with fork children (or images they exec'd) that go on using it: the name stays, as
     * our count does.  The peer's exec opens the file by its name to carry the connection into
     * the new image: a child's exit() that took the name sent git's unpack-objects, run by
     * receive-pack on the connection, to the idle kernel socket, and git push hung
     * (test_git).  The file then goes when the peer closes, finding us all gone (channel.c,
     * __ml_chan_end), or at the next sweep. */
    if (atomic_load(&s->me->holders) > 1)
        return;
    uint32_t mine = ml_load_acquire(&ch->hdr->side_state[ch->side]);
    if (mine != ML_SIDE_OPEN &&
        (mine != ML_SIDE_SHUT_WR || __ml_chan_peer_state(ch) == ML_SIDE_OPEN))
        return;
    atomic_fetch_or(&s->me->flags, ML_SOCK_UNNAMED);
    /* Another thread's shutdown (mlp_shutdown) meanwhile: it either saw the flag, and leaves
     * the kernel socket's FIN to the process's end (ML_SOCK_LATE_FIN), or it did not, and the
     * kernel socket can no longer tell our end: then the name stays, and the flag goes (a
     * missing name is then our death, as the lock says).  seq_cst, both sides: one of the two
     * sees the other. */
    atomic_thread_fence(memory_order_seq_cst);
    if (mine == ML_SIDE_OPEN && ml_load_acquire(&ch->hdr->side_state[ch->side]) != ML_SIDE_OPEN &&
        !(atomic_load(&s->me->flags) & ML_SOCK_LATE_FIN)) {
        atomic_fetch_and(&s->me->flags, ~ML_SOCK_UNNAMED);
        return;
    }
    __ml_chan_sio_names_gone(ch);
    __ml_seg_unname(ch->seg);
}

/*
 * At exit() or _exit(): a connection whose side is ours alone and still open ends with the
 * process, by its kernel socket's FIN, which no code of ours announces over the channel ("exit()
 * ends no connection", below).  The peer's blocking calls slept on the ring's futex for
 * MLP_SLICE_NS before they watched that socket, so each such end came 10 ms late to a blocking
 * reader (an explorer: OCaml's Unix.establish_server, whose grandchild ends by exit without a
 * close: 300 short connections took 5 s, 0.7 s over kernel TCP).  Our side's block says so
 * (ML_SOCK_EXITING) and the peer is woken: from then on its waits watch the kernel socket too
 * (mlp_wait_dir).  Not for a connection passed to another process (its kernel socket lives on
 * there: mlp_passed_at_exit).  Atomic operations and a futex wake only: a handler may be here.
 * Not in a known sandbox: a filter that kills futex calls without FUTEX_PRIVATE_FLAG killed a
 * process at its exit() with the wake (a review; its sends would have died of it too).
 */
static void mlp_exiting_say(struct mlp_sock *s)
{
    struct memlan_channel *ch = s->ch;
    if (s->state != MLP_ACCEL || !ch || !s->me || !ch->sock_ino || atomic_load(&s->passed) ||
        mlp_known_confined() ||
        atomic_load(&s->exit_let_go) || atomic_load(&s->me->holders) > 1 ||
        ml_load_acquire(&ch->hdr->side_state[ch->side]) == ML_SIDE_CLOSED)
        return;
    if (!(atomic_fetch_or(&s->me->flags, ML_SOCK_EXITING) & ML_SOCK_EXITING))
        __ml_chan_wake_peer(ch);
}

/* At exit, a connection this process passed to another over SCM_RIGHTS (mlp_passed) and still
 * holds alone: its end is published now, as a reset.  Nothing else would tell the peer: our end
 * is the kernel socket's FIN ("The end nobody announces"), and that socket lives on in the
 * process that received it, which cannot carry the channel.  pgbouncer's online restart
 * (`pgbouncer -R`) passes every connection so, and the old process exits: the server behind it
 * slept in epoll_wait for ever, and the client's next query, written by the new process to the
 * idle kernel socket, was never answered (tests/preload/passexit.c).  A reset, not an end of
 * stream: the connection is lost, with whatever the receiver wrote to it.  Nothing is freed
 * (other threads may still be in calls on it: their sends now fail as after the peer's reset
 * of a closed socket); the file's name goes as at a close, since with our side closed the peer
 * no longer asks our lock.  _exit and signals skip this: see design.md, "Passing a
 * connection". */
static void mlp_passed_at_exit(struct mlp_sock *s, int fd)
{
    struct memlan_channel *ch = s->ch;
    if (!atomic_load(&s->passed) || s->state != MLP_ACCEL || !ch || !s->me ||
        atomic_load(&s->me->holders) > 1)
        return;
    if (ml_load_acquire(&ch->hdr->side_state[ch->side]) == ML_SIDE_CLOSED)
        return;
    atomic_fetch_or(&s->me->flags, ML_SOCK_RESET);
    __ml_chan_abandon(ch); /* our side closed, and the peer woken whichever way it waits */
    mlp_log(1, "fd %d: a connection passed to another process over SCM_RIGHTS ends with this "
               "process (reset)", fd);
    __ml_chan_sio_names_gone(ch);
    __ml_seg_unname(ch->seg);
}

/* At exit, a withdrawn offer other processes hold too (fork): give our count back, as our close
 * would have, so that the last of them to close removes its file (nobody uses its channel: it
 * is TCP).  Once, whatever closes later. */
static void mlp_let_go_at_exit(struct mlp_sock *s)
{
    if (!atomic_exchange(&s->exit_let_go, true))
        atomic_fetch_sub(&s->me->holders, 1);
}

/* At exit, an offer just withdrawn (mlp_before_last_close), or one withdrawn before: nobody can
 * attach to it any more, and its file's name, which the last holder's close removes, serves
 * nobody.  Ours alone, the name goes now; shared with fork children, our count goes back, so
 * that the last of them removes it.  (Kept, it stayed in the fabric after the process:
 * exitrace "undecided".) */
static void mlp_withdrawn_at_exit(struct mlp_sock *s)
{
    if (s->state != MLP_TCP || !s->ch || !s->me)
        return;
    if (atomic_load(&s->me->holders) > 1)
        mlp_let_go_at_exit(s);
    else
        __ml_seg_unname(s->ch->seg);
}

/*
 * _exit() and _Exit(): no exit handler runs after them, nor any code of ours.  A fork child
 * that ends so without closing its copies (the middle child of a double fork: OCaml's
 * Unix.establish_server, daemons) kept its count in the holders of every connection it shared,
 * for good: the last real holder's close then only let go, and its peer learned of the end by
 * the kernel socket, 10 ms late.  Where this process has one thread (nobody of ours can send
 * or receive on them after this), it gives its counts back, as a close would; a connection ours
 * alone says that its end comes by the kernel socket (mlp_exiting_say).  Not in a vfork child
 * (its parent's sockets, and its parent's counts).
 */
void mlp_sock_exit_now(void)
{
    /* No system call before a connection is found, and none in a known sandbox: a broker whose
     * filter kills getpid died of SIGSYS at its _exit (tests/preload/sandboxpass.c). */
    if (mlp_known_confined())
        return;
    bool one = mlp_one_thread();
    int max = mlp_fd_max(), vf = -1;
    for (int fd = 0; fd <= max; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        if (s->type == MLP_CONN && s->state == MLP_ACCEL && s->ch && s->me &&
            !(vf < 0 ? (vf = mlp_vfork_child()) : vf)) {
            if (one && !atomic_load(&s->passed) && atomic_load(&s->me->holders) > 1)
                mlp_let_go_at_exit(s);
            else
                mlp_exiting_say(s);
        }
        mlp_put(s);
    }
}

/*
 * exit() ends no connection.  The kernel closes a process's sockets only when the process is
 * gone: after the exit handlers, the ELF destructors and glibc's flush of stdio, and all that
 * while the process's other threads still run.  Every byte a send takes until then reaches the
 * peer, and ours do the same: the process's end is the connections' end (the kernel sockets'
 * FIN wakes the peers, whose look at our liveness finds us gone: "The end nobody announces").
 * Taking the connections down here, as this handler did, sent what other threads wrote
 * afterwards to the kernel socket under the channel, where nobody reads it, and unmapped the
 * event queue under threads that polled it (tests/preload/exitrace.c).
 *
 * What goes now is what needs none of the memory other threads may still be using: an offer
 * nobody took is withdrawn (its bytes go over TCP, as a close would send them), listeners' records
 * go (a client from now on connects over TCP), and the files of our connections, our event
 * queue and our stat entry lose their names, so that nothing is left in the fabric once the
 * process is gone (a channel fork children share keeps its name: the peer's close removes it,
 * channel.c's __ml_chan_end).  (_exit and signals skip this: their files wait for the next sweep.)
 *
 * A vfork child that leaves by exit() (after a failed exec: undefined, but common) runs the
 * handlers in its parent's memory, which goes on: nothing here is the child's to do (the
 * parent's listeners lost their records and its "exit() has begun" flag stayed set, so every
 * later connection of the parent stayed on TCP: tests/preload/vforkexit.c).
 */
void mlp_at_exit(void)
{
    if (mlp_vfork_child())
        return;
    /* From now on a new queue loses its names at once, and a new connection stays on TCP. */
    atomic_store(&mlp_exit_began, true);
    atomic_thread_fence(memory_order_seq_cst);
    /* exit() from a signal handler (uWSGI's graceful reload calls it so) may have interrupted
     * this thread inside a section of ours under a lock: what follows takes none it could wait
     * on for ever (bounded tries, or nothing), and listeners keep their records until the
     * process is gone, when their locks say so (tests/preload/exithandler.c). */
    bool in_handler = mlp_sig_in_handler();
    /* Our closed clients' files parked in the pool first: one whose acceptor is a socket of
     * ours still open leaves it the name (ML_SOCK_NAME_LEFT) as it is drained, and that socket's
     * look below then takes the name away.  Drained only after it (mlp_negotiate_at_exit, which
     * drains what other threads park meanwhile), the file stayed in the fabric after a process
     * that had been its own server (a daemon thread still holding the accepted connection: the
     * fast-open test's teardown, 20 runs in 20 with the thread 50 ms late). */
    if (mlp_fab)
        __ml_chan_pool_drain(mlp_fab);
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max; fd++) {
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        if (s->type == MLP_LISTENER && !in_handler) {
            struct mlp_sock *u = mlp_uninstall(fd);
            if (u)
                mlp_put(u);
        } else if (s->type == MLP_CONN) {
            if (s->state != MLP_ACCEL) { /* withdrawn, or taken by an acceptor meanwhile */
                mlp_before_last_close(s, fd);
                mlp_withdrawn_at_exit(s);
            }
            mlp_passed_at_exit(s, fd);
            mlp_sio_at_exit(s);
            mlp_unname_at_exit(s);
            mlp_exiting_say(s);
        }
        mlp_put(s);
    }
    mlp_epoll_at_exit();
    mlp_poll_at_exit();
    mlp_negotiate_at_exit();
    if (mlp_nlater && !in_handler)
        mlp_later_tick(UINT64_MAX, 64); /* a last look, at a few of them */
}
