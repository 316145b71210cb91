/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * guard.c - a fabric file shrunk under our mapping is an error on that channel, never a SIGBUS.
 *
 * Any process that can open a fabric file (the peer, or another process of the fabric's users)
 * can ftruncate it; our next access past the new end faults with SIGBUS (BUS_ADRERR), which would
 * kill the process.  Every mapping of a fabric file is registered here (base and length, in a
 * table a signal handler can read without a lock).  A SIGBUS raised by the kernel for an address
 * inside a registered mapping is recovered: the whole mapping is replaced, at the same address,
 * by private anonymous memory (one mmap with MAP_FIXED), the registration is marked broken, and
 * the faulting access runs again on that memory.  The code that was touching the mapping reads
 * what any hostile peer could have written (every value read from shared memory is checked
 * anyway), and __ml_seg_alive() answers "dead" for a broken mapping, so the channel ends with
 * ECONNRESET at its next liveness check.  The replacement also drops the mapping's reference to
 * the file, and with it our liveness lock: the peer sees us gone.
 *
 * Who installs the handler: the socket layer (src/preload/sigbus.c) keeps its own in the kernel
 * and runs the program's disposition, whatever it is, for every other SIGBUS (see
 * __ml_guard_set_arm).  Without the socket layer (libmemlan in a program of its own), the first
 * registration installs the handler of this file in front of the disposition it finds (unless
 * SIGBUS is ignored): any other SIGBUS then goes to the handler that was there (a sanitizer's, the
 * program's), or gets the default action exactly (the handler restores SIG_DFL and lets the fault
 * happen again, or queues the signal again for one a process sent).  A program that installs its
 * own SIGBUS handler afterwards replaces ours: truncation then kills it, as before.
 *
 * Concurrency: the faulting thread holds a reference to the mapping it touches, so that
 * registration cannot be removed or reused while its handler runs; every slot is read under a
 * sequence count, so a slot being changed by another thread is skipped, never half read.
 */
#include "internal.h"
#include "sys/sys.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ML_GUARD_CHUNK 1024   /* slots per chunk */
#define ML_GUARD_CHUNKS 1024  /* up to a million mappings */

struct ml_guard_slot {
    _Atomic uint64_t seq; /* odd while being written */
    _Atomic uintptr_t base; /* 0: free */
    _Atomic size_t len;
    _Atomic uint32_t broken;
};

static _Atomic(struct ml_guard_slot *) ml_guard_chunks[ML_GUARD_CHUNKS];
static _Atomic int ml_guard_nchunks;
static _Atomic int ml_guard_hint;  /* where the last free slot was found */
static _Atomic int ml_guard_armed; /* 0 not yet, 1 armed, 2 cannot (and said why) */
static _Atomic unsigned long ml_guard_recovered;

static int ml_guard_arm_native(void);
static _Atomic(int (*)(void)) ml_guard_arm_fn = ml_guard_arm_native;

void __ml_guard_set_arm(int (*arm)(void)) { atomic_store(&ml_guard_arm_fn, arm); }

unsigned long __ml_guard_recoveries(void) { return atomic_load(&ml_guard_recovered); }

static struct ml_guard_slot *ml_guard_slot(int i)
{
    struct ml_guard_slot *c = atomic_load_explicit(&ml_guard_chunks[i / ML_GUARD_CHUNK],
                                                   memory_order_acquire);
    return c ? &c[i % ML_GUARD_CHUNK] : NULL;
}

/* A new chunk (mmap: async-signal-safe, so a connect from a signal handler may register). */
static int ml_guard_grow(int have)
{
    if (have >= ML_GUARD_CHUNKS)
        return -ENOMEM;
    void *p;
    int r = __ml_sys_mmap(&p, NULL, ML_GUARD_CHUNK * sizeof(struct ml_guard_slot),
                          PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r < 0)
        return r;
    struct ml_guard_slot *expect = NULL;
    if (!atomic_compare_exchange_strong(&ml_guard_chunks[have], &expect, p))
        __ml_sys_munmap(p, ML_GUARD_CHUNK * sizeof(struct ml_guard_slot)); /* another won */
    int n = have;
    atomic_compare_exchange_strong(&ml_guard_nchunks, &n, have + 1);
    return 0;
}

int __ml_guard_add(void *base, size_t len)
{
    if (!base || !len)
        return -1;
    int armed = atomic_load_explicit(&ml_guard_armed, memory_order_acquire);
    if (armed == 0) {
        int (*arm)(void) = atomic_load(&ml_guard_arm_fn);
        int r = arm ? arm() : -ENOSYS;
        if (r == 0)
            atomic_store(&ml_guard_armed, 1);
        else if (r != -EAGAIN) /* EAGAIN: busy (a handler interrupted an install): next time */
            atomic_store(&ml_guard_armed, 2);
    }
    for (int tries = 0; tries < 4; tries++) {
        int n = atomic_load(&ml_guard_nchunks);
        int total = n * ML_GUARD_CHUNK;
        int start = total ? atomic_load_explicit(&ml_guard_hint, memory_order_relaxed) % total : 0;
        for (int k = 0; k < total; k++) {
            int i = (start + k) % total;
            struct ml_guard_slot *s = ml_guard_slot(i);
            if (!s)
                continue;
            uintptr_t zero = 0;
            if (atomic_load_explicit(&s->base, memory_order_relaxed) != 0 ||
                !atomic_compare_exchange_strong(&s->base, &zero, (uintptr_t)1))
                continue; /* taken; 1 reserves it while we fill it in */
            atomic_fetch_add(&s->seq, 1); /* odd: being written */
            atomic_store(&s->len, len);
            atomic_store(&s->broken, 0);
            atomic_store(&s->base, (uintptr_t)base);
            atomic_fetch_add(&s->seq, 1);
            atomic_store_explicit(&ml_guard_hint, i + 1, memory_order_relaxed);
            return i;
        }
        if (ml_guard_grow(n) < 0)
            break;
    }
    return -1; /* not guarded: a truncation would fault, as without this file */
}

void __ml_guard_del(int slot)
{
    struct ml_guard_slot *s = slot >= 0 ? ml_guard_slot(slot) : NULL;
    if (!s)
        return;
    atomic_fetch_add(&s->seq, 1);
    atomic_store(&s->len, 0);
    atomic_store(&s->broken, 0);
    atomic_fetch_add(&s->seq, 1);
    atomic_store(&s->base, 0); /* free: last */
    atomic_store_explicit(&ml_guard_hint, slot, memory_order_relaxed);
}

void __ml_guard_del_at(const void *base)
{
    int total = atomic_load(&ml_guard_nchunks) * ML_GUARD_CHUNK;
    for (int i = 0; i < total; i++) {
        struct ml_guard_slot *s = ml_guard_slot(i);
        if (s && atomic_load_explicit(&s->base, memory_order_relaxed) == (uintptr_t)base) {
            __ml_guard_del(i);
            return;
        }
    }
}

bool __ml_guard_broken(int slot)
{
    struct ml_guard_slot *s = slot >= 0 ? ml_guard_slot(slot) : NULL;
    return s && atomic_load_explicit(&s->broken, memory_order_acquire);
}

bool __ml_guard_recover(const siginfo_t *si)
{
    /* Only a fault the kernel raised for an access (BUS_ADRERR: past the end of the file; the
     * other codes are alignment or hardware errors, which replacing memory would not cure). */
    if (!si || si->si_code != BUS_ADRERR)
        return false;
    uintptr_t a = (uintptr_t)si->si_addr;
    int total = atomic_load(&ml_guard_nchunks) * ML_GUARD_CHUNK;
    for (int i = 0; i < total; i++) {
        struct ml_guard_slot *s = ml_guard_slot(i);
        if (!s)
            continue;
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (q & 1)
            continue;
        uintptr_t b = atomic_load(&s->base);
        size_t len = atomic_load(&s->len);
        if (atomic_load_explicit(&s->seq, memory_order_acquire) != q || b <= 1 || a < b ||
            a - b >= len)
            continue;
        /* Ours.  The same address, now private memory: the access runs again and succeeds.
         * (Other pages of the mapping would fault the same way: all of it goes at once.) */
        void *p;
        if (__ml_sys_mmap(&p, (void *)b, len, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) < 0)
            return false; /* no memory for it: the fault stays a fault */
        atomic_store_explicit(&s->broken, 1, memory_order_release);
        atomic_fetch_add(&ml_guard_recovered, 1);
        return true;
    }
    return false;
}

/*
 * A system call we made on mapped fabric memory (a send from a ring, a read into one) failed
 * with EFAULT: the kernel met the same shrunk file that a user-space access would have met with
 * SIGBUS, but a system call gets no signal, only the error, which must not reach the program
 * (its own buffers were not involved).  If [p, p + n) lies inside a registered mapping, the
 * mapping is recovered as the handler would (replaced by private memory, marked broken) and
 * true is returned: the caller ends the connection (ECONNRESET) instead.  False: not ours.
 */
bool __ml_guard_fault_in(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    int total = atomic_load(&ml_guard_nchunks) * ML_GUARD_CHUNK;
    for (int i = 0; i < total; i++) {
        struct ml_guard_slot *s = ml_guard_slot(i);
        if (!s)
            continue;
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (q & 1)
            continue;
        uintptr_t b = atomic_load(&s->base);
        size_t len = atomic_load(&s->len);
        if (atomic_load_explicit(&s->seq, memory_order_acquire) != q || b <= 1 || a < b ||
            a - b >= len || n > len - (a - b))
            continue;
        if (atomic_load_explicit(&s->broken, memory_order_acquire))
            return true; /* recovered already (by the handler, or another thread) */
        void *m;
        if (__ml_sys_mmap(&m, (void *)b, len, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) < 0)
            return false;
        atomic_store_explicit(&s->broken, 1, memory_order_release);
        atomic_fetch_add(&ml_guard_recovered, 1);
        return true;
    }
    return false;
}

/* Another SIGBUS in a program whose disposition is the default: that default, exactly. */
void __ml_guard_default(int sig, siginfo_t *si)
{
    /* The kernel's struct sigaction (handler, flags, restorer, mask): all zero is SIG_DFL. */
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } dfl = {0};
    int saved = errno;
    syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
    if (!si) {
        /* No siginfo to go by (our handler put back without SA_SIGINFO): send it again; a fault
         * would also fault again, and either kills. */
        syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), sig);
    } else if (si->si_code <= 0 || (sig == SIGBUS && si->si_code == BUS_MCEERR_AO)) {
        /* Sent by a process (kill, sigqueue), or an asynchronous machine-check report: returning
         * would not bring it back.  Queue it to this thread again; it is blocked until the
         * handler returns, then acts. */
        syscall(SYS_rt_tgsigqueueinfo, getpid(), (pid_t)syscall(SYS_gettid), sig, si);
    }
    /* A fault: returning runs the access again, which faults again, now with the default
     * action (and its core dump, at the right address). */
    errno = saved;
}

/* Did the kernel call our handler with a siginfo?  Not when the program put it back without
 * SA_SIGINFO (old = signal(SIGBUS, h); ...; signal(SIGBUS, old)): its si is then whatever was on
 * the stack.  sigaction() is async-signal-safe. */
bool __ml_guard_has_siginfo(int sig, int (*query)(int, const struct sigaction *, struct sigaction *))
{
    struct sigaction k;
    int saved = errno;
    bool yes = query(sig, NULL, &k) == 0 && (k.sa_flags & SA_SIGINFO);
    errno = saved;
    return yes;
}

/* libmemlan alone: the disposition found when the handler went in (chained), read by the
 * handler; written once, before the install. */
static struct sigaction ml_guard_prev;

static void ml_guard_handler(int sig, siginfo_t *si, void *uc)
{
    if (!__ml_guard_has_siginfo(sig, sigaction))
        si = NULL;
    if (__ml_guard_recover(si))
        return;
    void *fn = (ml_guard_prev.sa_flags & SA_SIGINFO) ? (void *)ml_guard_prev.sa_sigaction
                                                     : (void *)ml_guard_prev.sa_handler;
    if (fn == (void *)SIG_DFL || fn == (void *)SIG_IGN || !fn) {
        __ml_guard_default(sig, si);
        return;
    }
    if (ml_guard_prev.sa_flags & SA_SIGINFO)
        ((void (*)(int, siginfo_t *, void *))fn)(sig, si, uc);
    else
        ((void (*)(int))fn)(sig);
}

static int ml_guard_arm_native_(void)
{
    struct sigaction cur, mine;
    if (sigaction(SIGBUS, NULL, &cur) < 0)
        return -errno;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == ml_guard_handler)
        return 0;
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
        return -EPERM; /* ignored: left so (an exec must pass it on) */
    /* The default, or a handler already there (a sanitizer's, the program's): ours goes in
     * front and passes every other SIGBUS to it, with its mask and flags. */
    ml_guard_prev = cur;
    mine = cur;
    mine.sa_sigaction = ml_guard_handler;
    mine.sa_flags = (cur.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    if (sigaction(SIGBUS, &mine, NULL) < 0)
        return -errno;
    struct sigaction check;
    if (sigaction(SIGBUS, NULL, &check) < 0 || !(check.sa_flags & SA_SIGINFO) ||
        check.sa_sigaction != ml_guard_handler)
        return -EPERM; /* refused quietly (a sanitizer keeping its own) */
    return 0;
}

static int ml_guard_arm_native(void)
{
    int saved = errno;
    int r = ml_guard_arm_native_();
    errno = saved;
    return r;
}
