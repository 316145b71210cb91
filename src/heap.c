/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * heap.c - frees that a signal handler may ask for.
 *
 * The preload's calls are async-signal-safe where the C library's are (close, dup2, shutdown,
 * exit's handlers in practice): a server's handler closes a connection or a listener, uWSGI's
 * calls exit().  Their teardown frees what the connection held, and the handler may have
 * interrupted its thread inside malloc or free: glibc's per-thread cache and its bins were then
 * half changed, and the free corrupted them ("free(): corrupted unsorted chunks" in one of 150
 * closes from a handler, tests/preload/exithandler.c; every teardown free from a handler,
 * tests/preload/heaphandler.c).  So while a handler runs on this thread (__ml_sig_depth, counted
 * by the preload's trampoline), a free only pushes the block on a list, its first word the link,
 * and the next free outside a handler, on any thread, frees the whole list.  The list is a
 * push-only stack emptied whole by one exchange: no ABA, and a handler that interrupts the
 * emptying pushes on the new, empty list.  Nothing is allocated in a handler: the preload takes
 * no offer there (negotiate.c).
 */
#include "internal.h"

#include <stdlib.h>

__thread unsigned __ml_sig_depth __attribute__((tls_model("initial-exec")));

static void *_Atomic ml_free_later;

void __ml_free_later_run(void)
{
    if (ml_likely(!atomic_load_explicit(&ml_free_later, memory_order_relaxed)) || __ml_sig_depth)
        return;
    void *p = atomic_exchange_explicit(&ml_free_later, NULL, memory_order_acquire);
    while (p) {
        void *next = *(void **)p;
        free(p);
        p = next;
    }
}

void __ml_free(void *p)
{
    if (!p)
        return;
    if (ml_unlikely(__ml_sig_depth)) {
        void *h = atomic_load_explicit(&ml_free_later, memory_order_relaxed);
        do
            *(void **)p = h;
        while (!atomic_compare_exchange_weak_explicit(&ml_free_later, &h, p, memory_order_release,
                                                      memory_order_relaxed));
        return;
    }
    free(p);
    __ml_free_later_run();
}
