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
 * signal() and bsd_signal() install with SA_RESTART (glibc's BSD semantics): nothing to count,
 * but they are installed through our sigaction all the same (the trampoline lends a spinning
 * receive's word back for the handler's run: sock.c, mlp_spin_lend).
 * siginterrupt(sig, 1), sysv_signal (signal() in strict ISO C) and sigset install without it
 * through glibc's internals, where no count can be kept: they are interposed only to note it,
 * and every interrupted wait then fails with EINTR (below).  A raw rt_sigaction is not seen:
 * calls its handlers interrupt restart.  glibc's own (cancellation, setxid) are installed with
 * SA_RESTART or act by themselves.
 *
 * Every handler installed through sigaction goes behind the trampoline (with SA_RESTART too: only
 * those without it are counted), which also keeps the thread's handler depth, so that code that
 * must not take a lock or allocate inside a handler can tell (cred.c: setuid is
 * async-signal-safe).  The table is written under a spin lock taken with every signal blocked,
 * together with the kernel's disposition, so that two threads installing handlers at once leave
 * the table saying what the kernel does (each wrote its half before: the table could name one
 * thread's handler, with the other's flags, while the kernel had the other's call last); the
 * trampoline reads a handler and its flags as one, by a sequence count.  A vfork child (it shares
 * our memory, not our dispositions) passes straight through and writes nothing of ours.
 */
#include "preload.h"
#include "sys/sys.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define MLP_NSIG 65

static __thread unsigned mlp_nores_runs __attribute__((tls_model("initial-exec")));

/* The application's handler behind the trampoline, per signal; siginfo: it takes three
 * arguments.  Written before the kernel's disposition changes, so a delivery in between finds
 * a handler the application asked for, the old or the new; seq is odd while it is written. */
static struct {
    _Atomic unsigned seq;
    _Atomic(void *) fn;
    _Atomic int flags;
} mlp_app[MLP_NSIG];
static _Atomic int mlp_sig_lock; /* the table and the kernel's dispositions, changed together */

bool mlp_sig_in_handler(void) { return __ml_sig_depth != 0; }

/*
 * A fork child starts outside every handler, even one forked inside a handler that it never
 * leaves: PostgreSQL's postmaster (15 and before) forks the walreceiver and its background
 * workers in its SIGUSR1 handler, and each runs to its end there.  With the depth copied, such
 * a child took itself for a handler for ever, and each connect it made stayed on kernel TCP
 * without a word (a standby's WAL stream: tests/preload/sigfork.c).  What the depth guards
 * against, locks of ours that the interrupted frame may hold, the fork child handlers reset (as
 * for the parent's other threads, which the child lacks too), and glibc resets malloc's.  A
 * child that does return from the handler finds the depth at 0 already: the trampoline does not
 * count it down past 0.
 */
void mlp_sig_after_fork_child(void) { __ml_sig_depth = 0; }

static void mlp_app_get(int sig, void **fn, int *flags)
{
    for (;;) {
        unsigned q = atomic_load(&mlp_app[sig].seq);
        if (!(q & 1)) {
            *fn = atomic_load(&mlp_app[sig].fn);
            *flags = atomic_load(&mlp_app[sig].flags);
            if (atomic_load(&mlp_app[sig].seq) == q)
                return;
        }
        /* A writer on another thread (ours blocks signals while it writes): two stores. */
        ml_cpu_relax();
    }
}

static void mlp_app_set(int sig, void *fn, int flags)
{
    atomic_fetch_add(&mlp_app[sig].seq, 1u);
    atomic_store(&mlp_app[sig].fn, fn);
    atomic_store(&mlp_app[sig].flags, flags);
    atomic_fetch_add(&mlp_app[sig].seq, 1u);
}

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

/* Every handler run through us, SA_RESTART or not: a call with SO_RCVTIMEO or SO_SNDTIMEO fails
 * with EINTR after any handler, as the kernel's does (sock_intr_errno). */
static __thread unsigned mlp_any_runs __attribute__((tls_model("initial-exec")));
unsigned mlp_sig_runs_any(void) { return mlp_any_runs; }

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

/* A vfork child shares our memory, not our dispositions: it must write nothing of ours. */
static bool mlp_sig_vfork_child(void)
{
    return mlp_pid && (int)__ml_sys_getpid() != mlp_pid;
}

static void *mlp_sig_next(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

/* The signals siginterrupt(sig, 1) named last (glibc's own set, _sigintr, mirrored): signal()
 * installs their handlers without SA_RESTART. */
static _Atomic uint64_t mlp_sig_intr_set;

MLP_EXPORT int siginterrupt(int sig, int flag)
{
    int (*real)(int, int) = mlp_real_siginterrupt ? mlp_real_siginterrupt
                                                  : (int (*)(int, int))mlp_sig_next("siginterrupt");
    if (flag && !mlp_sig_vfork_child())
        mlp_sig_set_uncounted();
    if (sig > 0 && sig < MLP_NSIG && !mlp_sig_vfork_child()) {
        uint64_t bit = 1ull << (sig - 1);
        if (flag)
            atomic_fetch_or(&mlp_sig_intr_set, bit);
        else
            atomic_fetch_and(&mlp_sig_intr_set, ~bit);
    }
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
        if (h != SIG_DFL && h != SIG_IGN && !mlp_sig_vfork_child())                            \
            mlp_sig_set_uncounted();                                                           \
        if (!real) {                                                                           \
            errno = ENOSYS;                                                                    \
            return SIG_ERR;                                                                    \
        }                                                                                      \
        return real(sig, h);                                                                   \
    }
MLP_SIG_UNCOUNTED(sysv_signal)
MLP_SIG_UNCOUNTED(__sysv_signal)
MLP_SIG_UNCOUNTED(sigset)

static void mlp_sig_left(void *depth) { __ml_sig_depth = (unsigned)(uintptr_t)depth; }

/* Is our frame (at p) below the interrupted one's stack pointer, as on the thread's own stack or
 * an alternate stack beneath it?  glibc's jump runs the cleanups of the buffers below its
 * target, newest first, and stops at the first that is not: one of ours on an alternate stack
 * above the target stayed linked after its frame was gone, the depth stayed up, and the next
 * handler's buffer, at the same address, linked to itself (pthread_exit's unwinding then looped
 * for ever: a review's altjmp).  Unknown: not pushed (the depth then stays up after a jump). */
static bool mlp_sig_below(void *uc, const void *p)
{
    if (!uc)
        return false;
#if defined(__x86_64__)
    uintptr_t sp = (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    uintptr_t sp = (uintptr_t)((ucontext_t *)uc)->uc_mcontext.sp;
#else
    uintptr_t sp = 0;
#endif
    return (uintptr_t)p < sp;
}

static void mlp_trampoline(int sig, siginfo_t *si, void *uc)
{
    mlp_any_runs++;
    if (sig <= 0 || sig >= MLP_NSIG) {
        mlp_nores_runs++;
        return;
    }
    void *fn;
    int flags;
    mlp_app_get(sig, &fn, &flags);
    if (!(flags & SA_RESTART))
        mlp_nores_runs++;
    if (fn == (void *)SIG_DFL || fn == (void *)SIG_IGN || !fn)
        return; /* cannot happen: only real handlers are installed behind us */
    /* A handler that leaves by siglongjmp (or a cancellation's unwinding) passes our frame: the
     * cleanup puts the depth back as it was, or the thread would count as in a handler for good
     * (its connects on TCP, its frees queued; where glibc runs no cleanup, so it stays). */
    struct _pthread_cleanup_buffer left;
    bool pushed = mlp_sig_below(uc, &left);
    if (pushed)
        mlp_left_push(&left, mlp_sig_left, (void *)(uintptr_t)__ml_sig_depth);
    __ml_sig_depth++;
    /* A receive's spin beneath holds its word: lent back for the handler's run (sock.c) */
    void *lent = mlp_spin_lend();
    if (flags & SA_SIGINFO)
        ((void (*)(int, siginfo_t *, void *))fn)(sig, si, uc);
    else
        ((void (*)(int))fn)(sig);
    mlp_spin_unlend(lent);
    if (pushed)
        mlp_left_pop(&left);
    if (__ml_sig_depth) /* 0 in a fork child that returns from the handler it was forked in */
        __ml_sig_depth--;
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

/* Every signal blocked (glibc's internal ones too: the raw system call) while we hold the lock,
 * so that no handler of this thread can come in and wait for it. */
static void mlp_sig_block(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, saved, _NSIG / 8);
}

static void mlp_sig_unblock(const sigset_t *saved)
{
    (void)syscall(SYS_rt_sigprocmask, SIG_SETMASK, saved, NULL, _NSIG / 8);
}

static void mlp_sig_lock_take(void)
{
    for (unsigned i = 0;; i++) {
        int z = 0;
        if (atomic_compare_exchange_weak(&mlp_sig_lock, &z, 1))
            return;
        __ml_brief_wait(i); /* its holder is between two system calls */
    }
}

MLP_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    bool ok = sig > 0 && sig < MLP_NSIG;
    /* A vfork child shares our memory, not our dispositions: it writes nothing of ours (its
     * handlers go in unwrapped: it is about to exec or _exit). */
    if (mlp_sig_vfork_child()) {
        int r = mlp_sigaction_real(sig, act, old);
        if (r == 0 && ok && old && old->sa_sigaction == mlp_trampoline) {
            void *fn;
            int flags;
            mlp_app_get(sig, &fn, &flags);
            if (flags & SA_SIGINFO) {
                old->sa_sigaction = (void (*)(int, siginfo_t *, void *))fn;
            } else {
                old->sa_flags &= ~SA_SIGINFO;
                old->sa_handler = (void (*)(int))fn;
            }
        }
        return r;
    }
    if (sig == SIGBUS) /* sigbus.c keeps its own handler in the kernel, for the guard */
        return mlp_sigbus_sigaction(act, old);
    struct sigaction mine;
    void *prev_fn = NULL;
    int prev_flags = 0;
    bool wrap = act && ok && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
    sigset_t saved;
    int e0 = errno;
    mlp_sig_block(&saved);
    mlp_sig_lock_take();
    errno = e0;
    if (ok)
        mlp_app_get(sig, &prev_fn, &prev_flags);
    if (wrap) {
        mine = *act;
        mine.sa_flags |= SA_SIGINFO;
        mine.sa_sigaction = mlp_trampoline;
        void *fn = (act->sa_flags & SA_SIGINFO) ? (void *)act->sa_sigaction
                                                : (void *)act->sa_handler;
        mlp_app_set(sig, fn, act->sa_flags);
        act = &mine;
    }
    int r = mlp_sigaction_real(sig, act, old);
    int e = errno;
    if (r < 0 && wrap)
        mlp_app_set(sig, prev_fn, prev_flags);
    atomic_store(&mlp_sig_lock, 0);
    mlp_sig_unblock(&saved);
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

/*
 * signal() and bsd_signal(): glibc installs their handlers through its internal sigaction, past
 * ours, so the trampoline never ran them.  Nothing needed counting (SA_RESTART), but the
 * trampoline also lends a receive's spinning word back to its socket for the handler's run
 * (sock.c, mlp_spin_lend): without it a handler that blocks kept every other thread's call on
 * that direction waiting (tests/preload/spinheld.c, its "signal" run).  So they install through
 * our sigaction, as glibc's do through its own: the signal blocked while its handler runs,
 * SA_RESTART unless siginterrupt(sig, 1) named it.  SIGBUS keeps the old way (sigbus.c: a
 * disposition installed by signal() replaces the guard's handler, as documented there).
 */
static __sighandler_t mlp_bsd_signal(__sighandler_t (*real)(int, __sighandler_t),
                                     const char *name, int sig, __sighandler_t h)
{
    if (sig == SIGBUS || mlp_sig_vfork_child()) {
        if (!real)
            real = (__sighandler_t(*)(int, __sighandler_t))mlp_sig_next(name);
        if (!real) {
            errno = ENOSYS;
            return SIG_ERR;
        }
        return real(sig, h);
    }
    if (h == SIG_ERR || sig <= 0 || sig >= MLP_NSIG) {
        errno = EINVAL;
        return SIG_ERR;
    }
    struct sigaction act = {.sa_handler = h}, old;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    act.sa_flags = (atomic_load(&mlp_sig_intr_set) >> (sig - 1)) & 1 ? 0 : SA_RESTART;
    if (sigaction(sig, &act, &old) < 0)
        return SIG_ERR;
    return old.sa_handler;
}

MLP_EXPORT __sighandler_t signal(int sig, __sighandler_t h)
{
    return mlp_bsd_signal(mlp_real_signal, "signal", sig, h);
}

MLP_EXPORT __sighandler_t bsd_signal(int sig, __sighandler_t h)
{
    return mlp_bsd_signal(mlp_real_bsd_signal, "bsd_signal", sig, h);
}
