/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * spin.c - the spin-then-sleep policy (Damianakis et al.; ORL's "poll, then one interrupt").
 *
 * A waiter first polls for about the cost of one wake-up, then arms its tripwire and sleeps.
 * Every waiter spins in the one loop here (__ml_spin_run), with its own look at readiness.  On
 * this kind of machine a cross-core futex wake costs tens of microseconds, so spinning that long
 * before sleeping at most doubles the cost of a wait that would have slept anyway, and saves the
 * whole wake-up whenever the peer answers in time.
 *
 * MEMLAN_SPIN_US fixes the budget (0 = never spin).  Unset, the policy adapts:
 *  - it never spins on a machine with one cpu online, or when the peer last waited on the cpu
 *    we are on now: the peer cannot make progress while we hold its core;
 *  - after a run of spins that ended in sleep anyway it cuts the budget to an eighth, probing
 *    with the full budget every 32nd wait, and restores it on the first spin that succeeds.
 *
 * A MEMLAN_SPIN_US that is not a whole number from 0 to 1000000 is said once on stderr with the
 * default used, the adaptive policy ("Nothing silent" in docs/design.md), unless MEMLAN_QUIET is
 * set or the preload library, which checks and reports the whole environment itself, is loaded
 * (LD_PRELOAD names it; its own copy of the core is told by __ml_env_reported): __ml_env_say_bad
 * in fabric.c.
 */
#include "internal.h"
#include "sys/sys.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ML_SPIN_DEFAULT_NS (50u * 1000u)
#define ML_SPIN_FAILS_BEFORE_CUT 8u

static _Atomic int ml_spin_fixed_us = -2; /* -2 unread, -1 adaptive, >= 0 fixed */
static _Atomic int ml_ncpu;

static int ml_spin_config(void)
{
    int v = ml_load_relaxed(&ml_spin_fixed_us);
    if (ml_likely(v != -2))
        return v;
    const char *s = getenv("MEMLAN_SPIN_US");
    v = -1;
    if (s && *s) {
        char *end;
        long l = strtol(s, &end, 10);
        if (*end == '\0' && l >= 0 && l <= 1000000)
            v = (int)l;
        else
            __ml_env_say_bad(ML_ENV_SPIN_US, "MEMLAN_SPIN_US", s, "0 to 1000000", "adaptive");
    }
    ml_store_relaxed(&ml_spin_fixed_us, v);
    return v;
}

int memlan_spin_us(void)
{
    int v = ml_spin_config();
    return v >= 0 ? v : (int)(ML_SPIN_DEFAULT_NS / 1000);
}

/* The cpus online; a machine with one never spins.  Asked once, at start-up (__ml_spin_init):
 * glibc's sysconf(_SC_NPROCESSORS_ONLN) reads /sys or calls sched_getaffinity, which a seccomp
 * sandbox installed later (sshd's privilege-separated child) kills the process for. */
static int ml_online_cpus(void)
{
    int n = ml_load_relaxed(&ml_ncpu);
    if (ml_unlikely(n == 0)) {
        long l = sysconf(_SC_NPROCESSORS_ONLN);
        n = l > 0 ? (int)l : 1;
        ml_store_relaxed(&ml_ncpu, n);
    }
    return n;
}

void __ml_spin_init(void)
{
    (void)ml_spin_config();
    (void)ml_online_cpus();
}

uint64_t __ml_spin_budget_ns(struct ml_spin *sp, uint32_t peer_cpu)
{
    int fixed = ml_spin_config();
    if (fixed >= 0)
        return (uint64_t)fixed * 1000u;
    if (ml_online_cpus() < 2)
        return 0;
    /* peer_cpu is the peer's word (cpu + 1, 0 when unknown): any value may be there, so it is
     * compared unsigned (a signed peer_cpu - 1 overflowed for 0x80000000). */
    int me = __ml_getcpu();
    if (peer_cpu != 0 && me >= 0 && peer_cpu - 1u == (uint32_t)me)
        return 0;
    /* Relaxed atomics: the socket layer's waiters share one predictor per direction and hold
     * no lock while they wait (a lost count only shifts the guess). */
    uint32_t f = __atomic_load_n(&sp->fails, __ATOMIC_RELAXED);
    if (f >= ML_SPIN_FAILS_BEFORE_CUT && (f & 31) != 0)
        return ML_SPIN_DEFAULT_NS / 8;
    return ML_SPIN_DEFAULT_NS;
}

/* -1: the preload's copy of the core, which never yields */
static _Atomic int ml_yield_on = 1;

void __ml_yield_off(void) { ml_store_relaxed(&ml_yield_on, -1); }

/* Round `round` (0, 1, ...) of a wait for a holder that keeps a lock or a count for a few
 * instructions or system calls.  The first 32 rounds pause.  Then the holder may be off its cpu
 * (preempted, perhaps on ours), and the cpu is given away: with sched_yield, except where no
 * wait may yield (the preload, which a seccomp filter may kill for it, OpenSSH's does; a native
 * program with MEMLAN_SPIN_US set, as design.md tells one so confined): there every 16th round
 * sleeps 10 us on a futex word of its own (futex is what glibc's own locks call, so a filter
 * that lets a program have threads lets it; one that refuses it gets the same 10 us as a nap in
 * __ml_sys_futex_wait, whose 1 ms is only its longest), the others pause.  1,000 rounds are
 * about 4 ms of it at most here. */
void __ml_brief_wait(unsigned round)
{
    if (round < 32) {
        ml_cpu_relax();
        return;
    }
    if (ml_load_relaxed(&ml_yield_on) > 0 && ml_spin_config() == -1) {
        (void)__ml_sys_sched_yield();
        return;
    }
    if (round % 16 != 15) {
        ml_cpu_relax();
        return;
    }
    _Atomic uint32_t word = 0;
    (void)__ml_sys_futex_wait(&word, 0, 10000);
}

/* The peer last waited on our cpu, or we have only one: a spin would hold the cpu the peer needs,
 * but a sched_yield gives it to the peer at once, and its answer then comes without a futex
 * wake-up on either side (a request and its reply on one core: two context switches a round
 * trip instead of two futex waits and wakes).  The same budget as a spin, but none at all after
 * yields that ended in sleep anyway (a peer that is not runnable: sched_yield then returns at
 * once, and the yields are a spin) or found the answer late (below).  None where the spin is
 * fixed (MEMLAN_SPIN_US: 0 turns both off) and none in the preload. */
uint64_t __ml_yield_budget_ns(struct ml_spin *sp, uint32_t peer_cpu)
{
    if (ml_spin_config() != -1 || ml_load_relaxed(&ml_yield_on) <= 0)
        return 0;
    if (ml_online_cpus() >= 2) {
        int me = __ml_getcpu();
        if (peer_cpu == 0 || me < 0 || peer_cpu - 1u != (uint32_t)me)
            return 0; /* the peer waits elsewhere: the spin's case */
    }
    /* After a run of yields that ended in sleep anyway, or found the answer only after the
     * budget (the peer kept the cpu after answering: nothing wakes a yielding wait, and the
     * answer waited for the end of the peer's time slice, ms, where a sleep's wake-up would
     * have come at once), sleep at once, as before yields were made: a shorter budget would
     * still give a slice away at its first yield.  Such a wait is told as one more failure, so
     * that every 32nd probes with the full budget. */
    uint32_t f = __atomic_load_n(&sp->fails, __ATOMIC_RELAXED);
    if (f >= ML_SPIN_FAILS_BEFORE_CUT && (f & 31) != 0) {
        __ml_spin_result(sp, false);
        return 0;
    }
    return ML_SPIN_DEFAULT_NS;
}

void __ml_spin_result(struct ml_spin *sp, bool success)
{
    uint32_t f = __atomic_load_n(&sp->fails, __ATOMIC_RELAXED);
    if (success) {
        if (f != 0)
            __atomic_store_n(&sp->fails, 0u, __ATOMIC_RELAXED);
    } else if (f < UINT32_MAX) {
        __atomic_store_n(&sp->fails, f + 1, __ATOMIC_RELAXED);
    }
}

/* The one spin loop (internal.h).  Every caller used to have a copy of its own (the channel's
 * waits, the event queue, poll, epoll, the RPC server). */
int __ml_spin_run(struct ml_spinning *s)
{
    if (!s->budget)
        return 0;
    /* No clock yet: a wait's answer often comes within the first rounds, and a clock reading
     * (about 20 ns under a hypervisor) on entry was on a round trip's path.  The budget counts
     * from the first tick's reading; the rounds before it are every pauses at most. */
    /* A yield is a system call, and may give the cpu away for a whole time slice of a peer
     * that keeps it (ms): its budget counts from before the first, so that the wait, which
     * nothing can wake while it yields, yields at most once past its budget. */
    s->start = s->yield ? __ml_now_ns() : 0;
    s->found = false;
    for (s->round = 1;; s->round++) {
        int r = s->look(s, s->arg);
        if (r > 0) {
            /* A yield found its answer after the budget: told as a failure (see
             * __ml_yield_budget_ns) */
            __ml_spin_result(s->sp, !s->yield || __ml_now_ns() - s->start < s->budget);
            return r;
        }
        if (s->yield)
            (void)sched_yield();
        else
            ml_cpu_relax();
        if (!s->yield && (s->round & (s->every - 1)) != 0)
            continue;
        if (s->tick && (r = s->tick(s, s->arg)) != 0) {
            if (r > 0)
                __ml_spin_result(s->sp, s->found);
            return r;
        }
        /* start only moves to a clock reading taken before this one (ml_spin_found) */
        uint64_t now = __ml_now_ns();
        if (!s->start)
            s->start = now;
        else if (now - s->start >= s->budget)
            break;
    }
    __ml_spin_result(s->sp, s->found);
    return 0;
}

/* For memlan bench: change the policy within one process (-1 = adaptive). */
void __ml_spin_set_us(int us) { ml_store_relaxed(&ml_spin_fixed_us, us < 0 ? -1 : us); }
