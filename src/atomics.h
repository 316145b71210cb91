/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * atomics.h - the one place memlan spells its memory orderings.
 *
 * Every lock-free access in the core goes through these macros so that a reader can grep for
 * each synchronisation point.  Each acquire or release at a call site carries a "SYNC:" comment
 * naming the access it pairs with; docs/design.md lists them all.
 */
#ifndef MEMLAN_ATOMICS_H
#define MEMLAN_ATOMICS_H

#include <stdatomic.h>
#include <stdint.h>

#define ml_load_relaxed(p)     atomic_load_explicit((p), memory_order_relaxed)
#define ml_load_acquire(p)     atomic_load_explicit((p), memory_order_acquire)
#define ml_store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define ml_store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define ml_xchg(p, v)          atomic_exchange_explicit((p), (v), memory_order_acq_rel)
#define ml_fetch_or(p, v)      atomic_fetch_or_explicit((p), (v), memory_order_acq_rel)
#define ml_fetch_and(p, v)     atomic_fetch_and_explicit((p), (v), memory_order_acq_rel)
#define ml_fetch_add(p, v)     atomic_fetch_add_explicit((p), (v), memory_order_acq_rel)
#define ml_cas(p, expp, v)                                                                     \
    atomic_compare_exchange_strong_explicit((p), (expp), (v), memory_order_acq_rel,            \
                                            memory_order_acquire)
/* A full fence: the store-then-load (Dekker) ordering that the tripwire protocol needs. */
#define ml_fence()             atomic_thread_fence(memory_order_seq_cst)

/* Say which cpu we wait on (1 + cpu; a hint for the peer's spin policy).  Written only when it
 * changed: the word shares the line of our tripwire, which the peer reads after every publish,
 * and each store would take that line away from it. */
static inline void ml_note_cpu(_Atomic uint32_t *word, uint32_t cpu)
{
    if (ml_load_relaxed(word) != cpu)
        ml_store_relaxed(word, cpu);
}

static inline void ml_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

#endif
