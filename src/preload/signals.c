/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * signals.c - which handlers were installed without SA_RESTART, so that a blocking call on an
 * accelerated socket restarts or fails with EINTR exactly as the kernel's would.
 *
 * We sleep in FUTEX_WAIT with a timeout (the liveness interval), which the kernel never restarts:
 * after any handler it returns EINTR.  The kernel's blocking recv and send restart after a handler
 * installed with SA_RESTART and fail with EINTR after one without.  So a handler installed through
 * sigaction() without SA_RESTART is installed behind a trampoline that counts its runs on the
 * calling thread (one thread-local increment, async-signal-safe) and then calls it with the
 * arguments the kernel gave; ml_wait() restarts an interrupted sleep when the count did not move.
 * sigaction() reports the application's own handler and flags back, never the trampoline.
 * signal() and bsd_signal() install with SA_RESTART (glibc's BSD semantics): nothing to count.
 * siginterrupt(sig, 1), sysv_signal (signal() in strict ISO C) and sigset install without it
 * through glibc's internals, where no count can be kept: they are interposed only to note it,
 * and every interrupted wait then fails with EINTR (below).  A raw rt_sigaction is not seen:
 * calls its handlers interrupt restart.  glibc's own (cancellation, setxid) are installed with
 * SA_RESTART or act by themselves.
 */
#include "preload.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>

#define MLP_NSIG 65

static __thread unsigned mlp_nores_runs __attribute__((tls_model("initial-exec")));

/* The application's handler behind the trampoline, per signal; siginfo: it takes three
 * arguments.  Written before the kernel's disposition changes, so a delivery in between finds
 * a handler the application asked for, the old or the new. */
static struct {
    _Atomic(void *) fn;
    _Atomic int flags;
} mlp_app[MLP_NSIG];

/* A handler without SA_RESTART installed where we cannot count it (siginterrupt(sig, 1),
 * sysv_signal and signal() in strict ISO C, which is __sysv_signal; sigset): from then on every
 * interrupted wait fails with EINTR, as before the counting, rather than restart where the
 * kernel's call would fail (a program whose alarm() timeout never fired would hang). */
static _Atomic bool mlp_sig_uncounted;

static void mlp_sig_set_uncounted(void)
{
    atomic_store(&mlp_sig_uncounted, true);
    atomic_store(&__ml_intr_blind, true); /* channel.c: no spinning where a run can go unseen */
}

/* sigbus.c runs the program's SIGBUS handler from its own: counted the same way. */
void mlp_sig_note_run(void) { mlp_nores_runs++; }

/* The runs counted on this thread, nothing else (channel.c reads it while spinning). */
unsigned mlp_sig_runs(void) { return mlp_nores_runs; }

unsigned mlp_sig_nores_count(void)
{
    static __thread unsigned salt __attribute__((tls_model("initial-exec")));
    if (atomic_load_explicit(&mlp_sig_uncounted, memory_order_relaxed))
        return mlp_nores_runs + ++salt; /* never the same twice: an interruption is EINTR (the
                                         * count itself unchanged: mlp_sig_runs reads it) */
    return mlp_nores_runs;
}

static void *mlp_sig_next(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

MLP_EXPORT int siginterrupt(int sig, int flag)
{
    int (*real)(int, int) = mlp_real_siginterrupt ? mlp_real_siginterrupt
                                                  : (int (*)(int, int))mlp_sig_next("siginterrupt");
    if (flag)
        mlp_sig_set_uncounted();
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(sig, flag);
}

#define MLP_SIG_UNCOUNTED(name)                                                                \
    MLP_EXPORT __sighandler_t name(int sig, __sighandler_t h)                                  \
    {                                                                                          \
        __sighandler_t (*real)(int, __sighandler_t) =                                          \
            mlp_real_##name ? mlp_real_##name                                                  \
                            : (__sighandler_t(*)(int, __sighandler_t))mlp_sig_next(#name);     \
        if (h != SIG_DFL && h != SIG_IGN)                                                      \
            mlp_sig_set_uncounted();                                            \
        if (!real) {                                                                           \
            errno = ENOSYS;                                                                    \
            return SIG_ERR;                                                                    \
        }                                                                                      \
        return real(sig, h);                                                                   \
    }
MLP_SIG_UNCOUNTED(sysv_signal)
MLP_SIG_UNCOUNTED(__sysv_signal)
MLP_SIG_UNCOUNTED(sigset)

static void mlp_trampoline(int sig, siginfo_t *si, void *uc)
{
    mlp_nores_runs++;
    if (sig <= 0 || sig >= MLP_NSIG)
        return;
    void *fn = atomic_load(&mlp_app[sig].fn);
    int flags = atomic_load(&mlp_app[sig].flags);
    if (fn == (void *)SIG_DFL || fn == (void *)SIG_IGN || !fn)
        return; /* cannot happen: only real handlers are installed behind us */
    if (flags & SA_SIGINFO)
        ((void (*)(int, siginfo_t *, void *))fn)(sig, si, uc);
    else
        ((void (*)(int))fn)(sig);
}

int mlp_sigaction_real(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!mlp_real_sigaction) {
        void *f = dlsym(RTLD_NEXT, "sigaction");
        if (!f) {
            errno = ENOSYS;
            return -1;
        }
        mlp_real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))f;
    }
    return mlp_real_sigaction(sig, act, old);
}

MLP_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (sig == SIGBUS) /* sigbus.c keeps its own handler in the kernel, for the guard */
        return mlp_sigbus_sigaction(act, old);
    struct sigaction mine;
    void *prev_fn = NULL;
    int prev_flags = 0;
    bool wrap = act && sig > 0 && sig < MLP_NSIG && !(act->sa_flags & SA_RESTART) &&
                act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
    if (sig > 0 && sig < MLP_NSIG) {
        prev_fn = atomic_load(&mlp_app[sig].fn);
        prev_flags = atomic_load(&mlp_app[sig].flags);
    }
    if (wrap) {
        mine = *act;
        mine.sa_flags |= SA_SIGINFO;
        mine.sa_sigaction = mlp_trampoline;
        void *fn = (act->sa_flags & SA_SIGINFO) ? (void *)act->sa_sigaction
                                                : (void *)act->sa_handler;
        /* (a delivery between the two stores may call the new handler with the old
         * convention only if the application changes SA_SIGINFO on a live handler) */
        atomic_store(&mlp_app[sig].flags, act->sa_flags);
        atomic_store(&mlp_app[sig].fn, fn);
        act = &mine;
    }
    int r = mlp_sigaction_real(sig, act, old);
    int e = errno;
    if (r < 0 && wrap) {
        atomic_store(&mlp_app[sig].fn, prev_fn);
        atomic_store(&mlp_app[sig].flags, prev_flags);
    }
    if (r == 0 && old && old->sa_sigaction == mlp_trampoline && (old->sa_flags & SA_SIGINFO)) {
        /* What the application installed, not our trampoline. */
        if (prev_flags & SA_SIGINFO) {
            old->sa_sigaction = (void (*)(int, siginfo_t *, void *))prev_fn;
        } else {
            old->sa_flags &= ~SA_SIGINFO;
            old->sa_handler = (void (*)(int))prev_fn;
        }
    }
    errno = e;
    return r;
}
