/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pqueue.c - the process's event queue (the one every accelerated socket of this process posts
 * to unless an epoll set has its own), and the per-thread wake-ups of poll, select and the
 * blocking calls' long sleeps: each waiting thread's registrations on the sockets it waits for,
 * its eventfd, and what a wait left by a jump or a cancellation gives back.  poll.c and epoll.c
 * sleep on these; readiness.h is what the three share.
 */
#include "preload.h"
#include "readiness.h"
#include "sys/sys.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

memlan_evq_t *mlp_q;
pthread_mutex_t mlp_q_mu = PTHREAD_MUTEX_INITIALIZER;
struct ml_spin mlp_poll_spin;
static pthread_mutex_t mlp_pw_mu = PTHREAD_MUTEX_INITIALIZER; /* every socket's pw list */
unsigned mlp_pw_gen = 1;                                /* bumped in a fork child */
struct mlp_ep;
pthread_mutex_t mlp_home_mu = PTHREAD_MUTEX_INITIALIZER; /* which queue a channel is in */

/* A fork child lets go of its copy of a queue of its parent's (__ml_evq_forget): our copies of
 * its descriptors are closed, the parent's stay. */
void mlp_q_forget(memlan_evq_t *q)
{
    if (!q)
        return;
    int *sfd, *bfd;
    __ml_evq_fds(q, &sfd, &bfd);
    mlp_disown_fd(*sfd);
    mlp_disown_fd(*bfd);
    __ml_evq_forget(q);
}

/* Threads whose eventfd a blocking call's long sleep made (mlp_sock_sleep): at most
 * mlp_sleep_efds(), so that a program with a thread per connection does not get an fd of ours
 * per thread past a share of its limit (its own opens would meet RLIMIT_NOFILE sooner); the
 * others sleep on the futex (sock.c, mlp_wait_long). */
_Atomic int mlp_pw_sleepers;

/* How many: a sixteenth of RLIMIT_NOFILE's soft limit, read at start (mlp_fdtable_init) and
 * noted when the program changes it through libc (setrlimit and prlimit are interposed, and a
 * server that serves a thread per connection raises its limit as it starts: mariadbd to its
 * open_files_limit, the JVM to the hard limit), at least MLP_SLEEP_EFDS_MIN and at most _MAX.
 * A program's own opens then meet the limit no sooner than with a sixteenth of it in use.  A
 * fixed 64 left the threads past it sleeping in 50 ms slices on the futex: 300 threads blocked
 * in recv on idle connections kept 8 % of a cpu busy (tests/preload/idlewake.c). */
static _Atomic long mlp_nofile_cur = 1024;

void mlp_nofile_note(unsigned long long cur)
{
    atomic_store_explicit(&mlp_nofile_cur, cur > (1ull << 30) ? 1L << 30 : (long)cur,
                          memory_order_relaxed);
}

long mlp_nofile_now(void) { return atomic_load_explicit(&mlp_nofile_cur, memory_order_relaxed); }

int mlp_sleep_efds(void)
{
    long n = atomic_load_explicit(&mlp_nofile_cur, memory_order_relaxed) / 16;
    return n < MLP_SLEEP_EFDS_MIN ? MLP_SLEEP_EFDS_MIN
                                  : n > MLP_SLEEP_EFDS_MAX ? MLP_SLEEP_EFDS_MAX : (int)n;
}

void mlp_poll_after_fork(void)
{
    /* The parent's queue is the parent's: its doorbell would wake the parent.  Let go of our
     * copy and make our own on first use. */
    mlp_q_forget(mlp_q);
    mlp_q = NULL;
    pthread_mutex_init(&mlp_q_mu, NULL);
    pthread_mutex_init(&mlp_pw_mu, NULL);
    pthread_mutex_init(&mlp_home_mu, NULL);
    mlp_pw_gen++;
    atomic_store(&mlp_pw_sleepers, 0);
    mlp_epoll_after_fork();
}

void mlp_poll_forget(struct mlp_sock *s)
{
    if (s->type != MLP_CONN || !s->ch || !s->ch->evq)
        return;
    mlp_unhome(s);
}

/* exit() began (mlp_at_exit): a queue made from then on (the process's, or an epoll set's, for
 * a thread that still waits, or for glibc's last flush of stdio meeting a full ring) loses its
 * names as soon as it is made, as the others lost theirs; else it stayed in the fabric after
 * the process (tests/preload/exitrace.c, "flush").  A fork child is not exiting. */
void mlp_queue_made(memlan_evq_t *q)
{
    atomic_thread_fence(memory_order_seq_cst); /* the queue is published before we look */
    if (mlp_exiting())
        __ml_evq_unname(q);
}

/* exit(): the queue's files lose their names; the queue stays for the threads that still wait
 * on it until the process is gone (mlp_at_exit, after mlp_exiting() says so: a queue made
 * meanwhile is its maker's to unname, mlp_queue_made). */
void mlp_poll_at_exit(void) { __ml_evq_unname(__atomic_load_n(&mlp_q, __ATOMIC_ACQUIRE)); }

/* A failed creation (a process that changed its credentials cannot create files in the fabric)
 * is said once per process and tried again at most once a second, not at every poll. */
static uint64_t mlp_q_failed_ns;
static bool mlp_q_failure_said;

/* A handler that interrupted its thread while it made the queue (under mlp_q_mu) gets none
 * rather than wait for itself: tests/preload/pollsig hung so, its handler's epoll_ctl waiting
 * for the lock its thread's first poll held (a loaded machine makes the creation slow). */
static memlan_evq_t *mlp_queue_make(void);
static __thread bool mlp_q_making __attribute__((tls_model("initial-exec")));

memlan_evq_t *mlp_queue(void)
{
    /* Not in a handler, even one made already: adding a socket to it and draining it take
     * locks (mlp_home_mu, mlp_q_mu, the epoll sets') that the interrupted thread may hold; a
     * poll there looks again every little while instead. */
    if (mlp_sig_in_handler())
        return NULL;
    if (mlp_q || !mlp_fab)
        return mlp_q;
    if (mlp_q_failed_ns && mlp_now_ns() - mlp_q_failed_ns < 1000000000u)
        return NULL;
    if (mlp_q_making)
        return NULL;
    mlp_q_making = true;
    memlan_evq_t *r = mlp_queue_make();
    mlp_q_making = false;
    return r;
}

static memlan_evq_t *mlp_queue_make(void)
{
    pthread_mutex_lock(&mlp_q_mu);
    if (!mlp_q) {
        memlan_evq_t *q;
        int e = memlan_evq_create(mlp_fab, 65536, &q);
        if (e == 0) {
            int *sfd, *bfd;
            __ml_evq_fds(q, &sfd, &bfd);
            mlp_own_fd(sfd, true);
            mlp_own_fd(bfd, true);
            __atomic_store_n(&mlp_q, q, __ATOMIC_RELEASE);
            mlp_queue_made(q);
        } else {
            mlp_q_failed_ns = mlp_now_ns();
            if (!mlp_q_failure_said)
                mlp_log(0, "cannot create the event queue (%s): poll falls back to 1 ms naps",
                        strerror(-e));
            mlp_q_failure_said = true;
        }
        pthread_mutex_unlock(&mlp_q_mu);
        if (e < 0)
            mlp_fabric_refused("the event queue", e); /* a sandbox refuses what we open */
        return mlp_q;
    }
    pthread_mutex_unlock(&mlp_q_mu);
    return mlp_q;
}

/* ---- per-thread wake-ups for poll and select ---------------------------------------------- */

/*
 * The doorbell is the process's, and any thread's arm or drain takes what another thread was
 * woken for: a thread that drained a post for a socket it does not wait on left the thread that
 * does asleep (8 threads ping-ponging through poll hung).  So each thread that sleeps in poll or
 * select has an eventfd of its own and registers on each accelerated socket it waits on; whoever
 * drains the queue rings the eventfds of the threads registered on each socket it names
 * (mlp_mark_sock), as it puts the socket's epoll memberships on their ready lists.
 *
 * No wake-up is lost: the sleeper registers, clears its eventfd (read, then rung = 0), arms the
 * tripwires and checks readiness, then sleeps.  A post that the check missed comes after it, and
 * so does the drain that handles it, which finds the registration and rung == 0 and writes.
 */
/* struct mlp_pwreg and struct mlp_pwait: readiness.h */

static pthread_key_t mlp_pw_key;
static pthread_once_t mlp_pw_once = PTHREAD_ONCE_INIT;
__thread struct mlp_pwait *mlp_pw_self __attribute__((tls_model("initial-exec")));

/* ---- waits left by a jump or a cancellation ------------------------------------------------ */

/*
 * A thread may never come back from one of our waits: a signal handler that siglongjmp()s out of
 * it (over kernel TCP the kernel's call had returned before the handler ran, and nothing of it
 * remains), or pthread_cancel in one of its cancellation points (ppoll, the futex wait's hook).
 * What the wait holds must then go as the thread leaves it, not at the thread's next wait, which
 * may never come: an abandoned poll's reference kept a closed socket open (its peer never read
 * EOF) and a sleeper count kept an epoll set's eventfd rung (every later wait on it spun).  glibc
 * runs the cleanup buffers of _pthread_cleanup_push for the frames that a longjmp or siglongjmp
 * (__pthread_cleanup_upto) or a cancellation's unwinding passes, so each wait (mlp_poll,
 * mlp_sock_sleep, mlp_epoll_wait) registers one over its whole loop, naming in a record of its
 * own what it holds at each moment (its waiter, its own socket references, its heap arrays, an
 * epoll set's counts).  The record's fields are written before the thing they name is taken
 * and cleared before it is given back, so that a jump at any instruction gives back at most
 * what is held (a leak at worst, never a second put).  The cleanup runs in the jumping
 * handler's context: our locks are free there unless the handler interrupted our own code
 * inside one of them (a nested call of a handler, itself left by a jump), so the two locks a
 * cleanup takes are taken only when this thread does not hold them (mlp_lock_left), and what
 * it cannot give back now is marked (mlp_pwait.left) for the thread's next take.  Without
 * _pthread_cleanup_push (not glibc), a cancellation still runs the same cleanup (the -fexceptions
 * pthread_cleanup_push) and a jump leaves the wait for the thread's next take or its end.
 * (mlp_left_push, preload.h; the calls that wait, recv and send, do the same: sock.c's
 * mlp_call_begin.)
 */
/* Lock m from a cleanup: false if this very thread holds it (see above). */
bool mlp_lock_left(pthread_mutex_t *m)
{
    if (pthread_mutex_trylock(m) == 0)
        return true;
#ifdef __GLIBC__
    if (m->__data.__owner == (int)mlp_thread_id()) /* no gettid: sshd's sandbox kills for it */
        return false;
#endif
    pthread_mutex_lock(m);
    return true;
}

/* Unlink every registration of w and drop their references, and the one lent to it.  left: from
 * a cleanup (false: this thread holds mlp_pw_mu, nothing was done). */
static bool mlp_pw_unregister_some(struct mlp_pwait *w, bool left)
{
    struct mlp_sock *h = w->held;
    if (h)
        atomic_fetch_sub(&h->lent, 1); /* before held goes (mlp_poll_fork_drop) */
    w->held = NULL; /* first: a jump between the two leaks it, never puts it twice */
    if (h)
        mlp_put(h); /* outside mlp_pw_mu: the last put may destroy the socket */
    if (!w->nregs)
        return true;
    if (left ? !mlp_lock_left(&mlp_pw_mu) : pthread_mutex_lock(&mlp_pw_mu) != 0)
        return false;
    for (int i = 0; i < w->nregs; i++) {
        struct mlp_pwreg *r = &w->regs[i];
        if (!r->s)
            continue;
        for (struct mlp_pwreg **pp = &r->s->pw; *pp; pp = &(*pp)->next)
            if (*pp == r) {
                *pp = r->next;
                break;
            }
    }
    pthread_mutex_unlock(&mlp_pw_mu);
    for (int i = 0; i < w->nregs; i++) {
        struct mlp_sock *s = w->regs[i].s;
        w->regs[i].s = NULL; /* first: a jump between the two leaks it, never puts it twice */
        if (s)
            mlp_put(s); /* after the lock: the last put may destroy the socket */
    }
    w->nregs = 0;
    return true;
}

void mlp_pw_unregister_all(struct mlp_pwait *w) { (void)mlp_pw_unregister_some(w, false); }

/* A cleanup gives back what w's call held (or marks it for the next take). */
void mlp_pw_left(struct mlp_pwait *w)
{
    w->left = true;
    if (mlp_pw_unregister_some(w, true)) {
        w->busy = 0;
        w->left = false;
    }
}

/* One socket leaves (it fell to TCP during the call). */
void mlp_pw_unregister(struct mlp_pwait *w, struct mlp_sock *s)
{
    struct mlp_sock *put = NULL;
    pthread_mutex_lock(&mlp_pw_mu);
    for (int i = 0; i < w->nregs; i++) {
        struct mlp_pwreg *r = &w->regs[i];
        if (r->s != s)
            continue;
        for (struct mlp_pwreg **pp = &s->pw; *pp; pp = &(*pp)->next)
            if (*pp == r) {
                *pp = r->next;
                break;
            }
        r->s = NULL;
        put = s;
        break;
    }
    pthread_mutex_unlock(&mlp_pw_mu);
    if (put)
        mlp_put(put);
}

/* Register w on the n sockets (NULL entries skipped).  False if there is no room. */
bool mlp_pw_register_all(struct mlp_pwait *w, struct mlp_sock **socks, nfds_t n)
{
    mlp_pw_unregister_all(w); /* left by a call that did not return (cancelled, longjmp) */
    if ((nfds_t)w->cap < n) {
        /* Nothing is linked now, so the array may move. */
        struct mlp_pwreg *p = realloc(w->regs, n * sizeof *p);
        if (!p)
            return false;
        w->regs = p;
        w->cap = (int)n;
    }
    pthread_mutex_lock(&mlp_pw_mu);
    for (nfds_t i = 0; i < n; i++) {
        struct mlp_sock *s = socks[i];
        if (!s)
            continue;
        struct mlp_pwreg *r = &w->regs[w->nregs++];
        atomic_fetch_add(&s->refs, 1); /* the registration's own reference */
        r->w = w;
        r->gen = mlp_pw_gen;
        r->s = s;
        r->next = s->pw;
        __atomic_store_n(&s->pw, r, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mlp_pw_mu);
    return true;
}

static void mlp_pw_free(void *p)
{
    struct mlp_pwait *w = p;
    if (!w)
        return;
    if (w->gen == mlp_pw_gen) {
        if (w->sleeper)
            atomic_fetch_sub(&mlp_pw_sleepers, 1);
        mlp_pw_unregister_all(w);
        __ml_free(w->regs);
        if (w->efd >= 0) {
            mlp_disown_fd(w->efd);
            __ml_sys_close(w->efd);
        }
    } /* else made before a fork: its registrations may still be linked here; leave them */
    if (mlp_pw_self == w)
        mlp_pw_self = NULL;
    if (w->gen == mlp_pw_gen)
        __ml_free(w);
}

static void mlp_pw_key_init(void) { (void)pthread_key_create(&mlp_pw_key, mlp_pw_free); }

/* This thread's waiter, made on first use and anew in a fork child; NULL if it cannot be, and
 * in a signal handler: making it allocates, and using it may reallocate its registrations and
 * takes mlp_pw_mu, on top of a thread that may be inside malloc or hold the lock (a poll there
 * looks again every little while instead: tests/preload/heaphandler.c). */
struct mlp_pwait *mlp_pw_get(void)
{
    if (mlp_sig_in_handler())
        return NULL;
    struct mlp_pwait *w = mlp_pw_self;
    if (w && w->gen == mlp_pw_gen)
        return w;
    if (w) {
        /* Inherited through fork: its eventfd is shared with the parent's thread, and its
         * registrations may still be linked (they are dropped by generation as met); it is
         * left as it is, and a new one made. */
        mlp_disown_fd(w->efd);
        __ml_sys_close(w->efd);
    }
    pthread_once(&mlp_pw_once, mlp_pw_key_init);
    if (!(w = calloc(1, sizeof *w)))
        return NULL;
    long fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        __ml_free(w);
        mlp_pw_self = NULL;
        (void)pthread_setspecific(mlp_pw_key, NULL);
        return NULL;
    }
    w->efd = (int)fd;
    mlp_own_fd(&w->efd, true);
    w->gen = mlp_pw_gen;
    atomic_store(&w->rung, 0);
    mlp_pw_self = w;
    (void)pthread_setspecific(mlp_pw_key, w);
    return w;
}

void mlp_poll_prepare_thread(void) { (void)mlp_pw_get(); }

/*
 * Take the thread's waiter for a call (poll, select, a blocking call's long sleep).  It is busy
 * while a call of this thread uses it: either that call is in progress beneath us (a signal
 * handler interrupted it: we must not touch its registrations, and do without), or a handler
 * left it by siglongjmp, or it was cancelled and this is its thread's destructor's business.
 * The stack tells which, as for a direction lock (sock.c, mlp_held_stale): a call in progress
 * beneath us is above us on our stack by at least the kernel's signal frame; one we left by a
 * jump is not beneath us any more.  On the alternate signal stack the answer is "in progress".
 * An abandoned call's registrations, and the references it lent them, are given back here.
 * With glibc's cleanup buffers an abandoned call has given its waiter back already, or marked it
 * left: then busy and not left is always a call in progress beneath us.
 * sp: where this call takes it; slot: the call's cleanup record, which names w from then on.
 * False: do without (nap).
 */
#define MLP_PW_SIGFRAME_MIN 512

bool mlp_pw_take(struct mlp_pwait *w, uintptr_t sp, struct mlp_pwait *volatile *slot)
{
    if (w->busy && !w->left) {
        /* With glibc's cleanup buffers a call left by a jump or a cancellation gave the waiter
         * back (or marked it left): busy means in progress beneath us. */
        if (_pthread_cleanup_push && _pthread_cleanup_pop)
            return false;
        if (sp + MLP_PW_SIGFRAME_MIN <= w->busy_sp)
            return false; /* in progress beneath us */
        stack_t ss;
        if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK))
            return false;
    }
    if (w->busy) {
        mlp_pw_unregister_all(w); /* abandoned: what it held goes now */
        w->left = false;
    }
    *slot = w; /* the call's cleanup record names it before it is busy (see above) */
    w->busy = 1;
    w->busy_sp = sp;
    return true;
}

/* Before arming: forget earlier rings (a read first, then rung = 0; see above). */
void mlp_pw_clear(struct mlp_pwait *w)
{
    uint64_t v;
    (void)__ml_sys_read(w->efd, &v, sizeof v);
    atomic_store(&w->rung, 0);
}

static void mlp_pw_ring(struct mlp_pwait *w)
{
    if (atomic_exchange(&w->rung, 1) == 0) {
        uint64_t one = 1;
        (void)__ml_sys_write(w->efd, &one, sizeof one);
    }
}

/* A post named s: wake the threads asleep in poll/select on it.  Registrations inherited through
 * fork belong to threads that do not exist here: dropped. */
void mlp_pw_wake(struct mlp_sock *s)
{
    if (!__atomic_load_n(&s->pw, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&mlp_pw_mu);
    for (struct mlp_pwreg **pp = &s->pw; *pp;) {
        struct mlp_pwreg *r = *pp;
        if (r->gen != mlp_pw_gen) {
            *pp = r->next;
            continue;
        }
        mlp_pw_ring(r->w);
        pp = &r->next;
    }
    pthread_mutex_unlock(&mlp_pw_mu);
}

/*
 * In a fork child (sock.c, mlp_after_fork_child), for each socket the child was counted a holder
 * of: the waits of the parent's other threads (asleep in poll, select or a blocking call's long
 * sleep as it forked) left it registrations and lent references, each a reference to the socket
 * in the child's copy of the parent's memory, which nothing here would ever give back (their
 * threads do not exist here): the child's close of the socket did not end its hold, so the
 * connection did not end when the parent closed too, until the child exited
 * (tests/preload/forkasleep.c).  They go now: the registrations are unlinked from the child's
 * copy of the socket's list and the references put; the parent's own (its threads still asleep,
 * their registrations with the event queue in the channel's shared page) are the parent's and
 * untouched.  The forking thread's own waiter keeps what it has: a handler that forked may have
 * interrupted its own poll, which gives them back when it returns.  Registrations are linked after
 * their reference is taken and unlinked before it is put, and a lent reference is counted in
 * s->lent after it is lent and uncounted before it is taken back, so what is found here is
 * never more than is held: a wait caught in between at the fork leaves a reference behind (as
 * before), never a put too many.
 */
void mlp_poll_fork_drop(struct mlp_sock *s)
{
    struct mlp_pwait *own = mlp_pw_self;
    int drop = 0;
    for (struct mlp_pwreg **pp = &s->pw; *pp;) {
        struct mlp_pwreg *r = *pp;
        if (r->w == own) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        r->s = NULL;
        drop++;
    }
    int mine = (own && own->held == s) + mlp_ep_watch_mine(s) /* and its own spins' */
               + (mlp_sleep_lending() == s);                  /* and its blocking call's */
    int lent = atomic_load(&s->lent) - mine;
    if (lent > 0) {
        atomic_store(&s->lent, mine);
        drop += lent;
    }
    while (drop-- > 0)
        mlp_put(s); /* never the last: the child's fd table holds it */
}

/* Our own shutdown ended what a thread of ours waits for: wake those asleep in poll, select or a
 * blocking call's long sleep (mlp_sock_sleep) on s.  shutdown may come from a handler that
 * interrupted its thread inside mlp_pw_mu: the lock is only tried, and when it is busy the
 * sleepers find the shutdown at their next liveness look. */
void mlp_poll_kick(struct mlp_sock *s)
{
    if (!__atomic_load_n(&s->pw, __ATOMIC_ACQUIRE) || pthread_mutex_trylock(&mlp_pw_mu) != 0)
        return;
    for (struct mlp_pwreg *r = s->pw; r; r = r->next)
        if (r->gen == mlp_pw_gen)
            mlp_pw_ring(r->w);
    pthread_mutex_unlock(&mlp_pw_mu);
}

