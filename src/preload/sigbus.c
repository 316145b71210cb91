/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sigbus.c - the socket layer's SIGBUS handler: src/guard.c's recovery of a fabric file shrunk
 * under our mapping first, then the program's own disposition for every other SIGBUS, exactly.
 *
 * The handler is installed when the first fabric mapping is registered (never in a process that
 * accelerates nothing), and only over a default or handled disposition: a program that ignores
 * SIGBUS keeps SIG_IGN in the kernel (an exec must pass the ignored disposition on), unguarded.
 * From then on the kernel holds our handler, with the program's mask and flags (SA_RESETHAND
 * aside, which we carry out ourselves), and the program's disposition lives in a record here:
 *   - sigaction(SIGBUS, ...) sets and reports the record (and installs SIG_IGN for real);
 *   - a SIGBUS that is not a recovered fault runs the record: its handler with the arguments the
 *     kernel gave, or the default action exactly (guard.c: SIG_DFL again, then the fault runs
 *     again or the sent signal is queued again);
 *   - a disposition installed behind our back (signal(), which glibc routes internally, or a raw
 *     rt_sigaction) replaces ours: sigaction() sees it in the kernel and reports it, and the
 *     guard is off until the program installs a disposition through sigaction() again.
 * The record is written under a sequence count and read by the handler without a lock; its
 * writers (sigaction(SIGBUS) and the arming) take a flag that a handler interrupting them cannot
 * wait on: one that finds it taken passes through to the kernel (arming retries later).
 */
#include "preload.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>

static struct sigaction mlp_bus_app; /* the program's disposition, when ours is in the kernel */
static _Atomic unsigned mlp_bus_seq;
static _Atomic int mlp_bus_ours;     /* our handler is (as far as we know) in the kernel */
static _Atomic int mlp_bus_wanted;   /* a fabric mapping exists: guard when we may */
static _Atomic int mlp_bus_busy;

void mlp_sig_note_run(void); /* signals.c: a handler without SA_RESTART ran on this thread */

static int mlp_bus_real(const struct sigaction *act, struct sigaction *old)
{
    return mlp_sigaction_real(SIGBUS, act, old);
}

static bool mlp_bus_lock(void)
{
    for (unsigned i = 0; i < 1000; i++) {
        if (!atomic_exchange_explicit(&mlp_bus_busy, 1, memory_order_acquire))
            return true;
        __ml_brief_wait(i);
    }
    return false; /* held by the very thread a handler interrupted, or stuck: pass through */
}

static void mlp_bus_unlock(void) { atomic_store_explicit(&mlp_bus_busy, 0, memory_order_release); }

static void mlp_bus_set(const struct sigaction *a)
{
    atomic_fetch_add_explicit(&mlp_bus_seq, 1, memory_order_acq_rel);
    memcpy(&mlp_bus_app, a, sizeof *a);
    atomic_fetch_add_explicit(&mlp_bus_seq, 1, memory_order_release);
}

static void mlp_bus_get(struct sigaction *a)
{
    for (int i = 0; i < 100; i++) {
        unsigned q = atomic_load_explicit(&mlp_bus_seq, memory_order_acquire);
        if (q & 1)
            continue;
        memcpy(a, &mlp_bus_app, sizeof *a);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&mlp_bus_seq, memory_order_relaxed) == q)
            return;
    }
    memcpy(a, &mlp_bus_app, sizeof *a); /* a writer interrupted by this very handler */
}

static void *mlp_bus_fn(const struct sigaction *a)
{
    return (a->sa_flags & SA_SIGINFO) ? (void *)a->sa_sigaction : (void *)a->sa_handler;
}

static void mlp_bus_handler(int sig, siginfo_t *si, void *uc)
{
    siginfo_t *given = si; /* what the program's handler gets, as the kernel would give it */
    if (!__ml_guard_has_siginfo(sig, mlp_sigaction_real))
        si = NULL; /* put back by signal() without SA_SIGINFO: si is stack garbage */
    if (__ml_guard_recover(si))
        return;
    struct sigaction app;
    mlp_bus_get(&app);
    void *fn = mlp_bus_fn(&app);
    if (fn == (void *)SIG_IGN) {
        if (si && si->si_code <= 0)
            return; /* sent, and ignored */
        __ml_guard_default(sig, si); /* a fault: the kernel forces the default on an ignored one */
        return;
    }
    if (fn == (void *)SIG_DFL || !fn) {
        __ml_guard_default(sig, si);
        return;
    }
    if ((app.sa_flags & SA_RESETHAND) &&
        !atomic_exchange_explicit(&mlp_bus_busy, 1, memory_order_acquire)) {
        /* the kernel's one-shot: the default from now on (unless a sigaction() on another
         * thread holds the record: it is replacing the disposition anyway) */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        mlp_bus_set(&dfl);
        mlp_bus_unlock();
    }
    if (!(app.sa_flags & SA_RESTART))
        mlp_sig_note_run();
    if (app.sa_flags & SA_SIGINFO)
        ((void (*)(int, siginfo_t *, void *))fn)(sig, given, uc);
    else
        ((void (*)(int))fn)(sig);
}

/* Ours, with or without SA_SIGINFO (a program that saved signal()'s answer and put it back
 * installed our handler without it: still ours, standing for the record). */
static bool mlp_bus_is_ours(const struct sigaction *k)
{
    return k->sa_sigaction == mlp_bus_handler;
}

/* Ours into the kernel standing for the program's disposition app (lock held). */
static int mlp_bus_install(const struct sigaction *app)
{
    struct sigaction mine = *app;
    mine.sa_sigaction = mlp_bus_handler;
    mine.sa_flags = (app->sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    mlp_bus_set(app); /* first: a SIGBUS from now on finds what the program asked for */
    if (mlp_bus_real(&mine, NULL) < 0)
        return -errno;
    atomic_store(&mlp_bus_ours, 1);
    return 0;
}

/* guard.c's arming, at the first registered mapping: 0, -EAGAIN (retry later), or why not. */
static int mlp_bus_arm(void)
{
    int saved = errno;
    atomic_store(&mlp_bus_wanted, 1);
    if (!mlp_bus_lock()) {
        errno = saved;
        return -EAGAIN;
    }
    int r = 0;
    struct sigaction cur;
    if (mlp_bus_real(NULL, &cur) < 0)
        r = -errno;
    else if (mlp_bus_is_ours(&cur))
        atomic_store(&mlp_bus_ours, 1);
    else if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
        r = -EPERM; /* ignored by the program: left so (see the top of this file) */
    else
        r = mlp_bus_install(&cur);
    mlp_bus_unlock();
    if (r < 0 && r != -EAGAIN)
        mlp_log(1, "a fabric file shrunk under this process would kill it: SIGBUS %s",
                r == -EPERM ? "is ignored by the program" : "handler not installed");
    errno = saved;
    return r;
}

int mlp_sigbus_sigaction(const struct sigaction *act, struct sigaction *old)
{
    if (!mlp_bus_lock())
        return mlp_bus_real(act, old);
    int r;
    struct sigaction k;
    if (atomic_load(&mlp_bus_ours) && mlp_bus_real(NULL, &k) == 0 && !mlp_bus_is_ours(&k))
        atomic_store(&mlp_bus_ours, 0); /* replaced behind our back: the kernel's is the truth */
    if (!atomic_load(&mlp_bus_ours)) {
        r = mlp_bus_real(act, old);
        int e = errno;
        if (r == 0 && act && atomic_load(&mlp_bus_wanted) &&
            !(!(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_IGN))
            mlp_bus_install(act); /* guarded again; on failure the program's stays, unguarded */
        mlp_bus_unlock();
        errno = e;
        return r;
    }
    struct sigaction prev;
    mlp_bus_get(&prev);
    r = 0;
    if (act) {
        if (!(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_IGN) {
            mlp_bus_set(act);
            r = mlp_bus_real(act, NULL); /* ignored for real: an exec must inherit it */
            if (r == 0)
                atomic_store(&mlp_bus_ours, 0);
            else
                mlp_bus_set(&prev);
        } else if (mlp_bus_install(act) < 0) {
            int e = errno;
            mlp_bus_set(&prev);
            mlp_bus_unlock();
            errno = e;
            return -1;
        }
    }
    if (r == 0 && old)
        *old = prev;
    int e = errno;
    mlp_bus_unlock();
    errno = e;
    return r;
}

/* From start-up (init.c), before anything is mapped. */
void mlp_sigbus_init(void) { __ml_guard_set_arm(mlp_bus_arm); }
