/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * dl.c - dlopen(RTLD_DEEPBIND): a library loaded so binds its symbols in its own dependencies
 * (libc) before the global scope, where LD_PRELOAD puts us, so none of its socket calls reaches
 * an interposer.  PHP loads every shared extension so (curl.so, sockets.so, ftp.so): the
 * connections they made were on TCP without a word from the client, and a connection that PHP's
 * core made, accelerated, then read by ftp.so through libc's read was an idle kernel socket
 * (ftp_connect timed out after 5 s; socket_import_stream's socket_read got EAGAIN: an explorer).
 * So the flag is taken off, said once in the log; MEMLAN_DEEPBIND=keep keeps it (its libraries
 * then talk past memlan, as before).  PHP itself loads its extensions without the flag in its
 * sanitizer builds, which have the same need, so its extensions are tested that way.
 *
 * dlopen must not be called from here: glibc finds the library's search path (the caller's
 * DT_RUNPATH, $ORIGIN) and namespace from its return address, and a call from this library
 * would name ours.  So dlopen is a few instructions that keep the caller's registers and its
 * return address, ask mlp_dlopen_prep (C) for the real dlopen and the flags, and jump there:
 * the real one returns straight to the program's caller.  Built for x86_64 and aarch64 only;
 * elsewhere dlopen is not interposed (exports.map.in).
 */
#include "preload.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct mlp_dl_prep {
    void *real; /* the next dlopen (libc's) */
    long flags;
};

static void *mlp_dl_none(const char *file, int flags)
{
    (void)file, (void)flags;
    return NULL; /* no dlopen after ours: cannot happen with glibc, but never jump to 0 */
}

static void *mlp_dl_real;

/* Called by the trampoline below with dlopen's own arguments. */
__attribute__((used, visibility("hidden"))) struct mlp_dl_prep mlp_dlopen_prep(const char *file,
                                                                              long flags)
{
    void *real = __atomic_load_n(&mlp_dl_real, __ATOMIC_ACQUIRE);
    if (!real) {
        real = dlsym(RTLD_NEXT, "dlopen");
        if (!real)
            real = (void *)mlp_dl_none;
        __atomic_store_n(&mlp_dl_real, real, __ATOMIC_RELEASE);
    }
    int f = (int)flags;
    if (!(f & RTLD_DEEPBIND))
        return (struct mlp_dl_prep){real, f};
    int saved = errno;
    if (ml_unlikely(!mlp_ready))
        mlp_init();
    const char *keep = getenv("MEMLAN_DEEPBIND");
    if (!mlp_cfg.off && !(keep && strcmp(keep, "keep") == 0)) {
        f &= ~RTLD_DEEPBIND;
        static _Atomic bool said;
        if (!atomic_exchange(&said, true))
            mlp_log(0, "dlopen(%.200s) asks for RTLD_DEEPBIND, which binds the library's socket "
                       "calls to libc past memlan (its connections unseen, and an accelerated "
                       "one read as an idle kernel socket): loaded without it, as this process's "
                       "later ones (MEMLAN_DEEPBIND=keep keeps it; said once)",
                    file ? file : "NULL");
    }
    errno = saved;
    return (struct mlp_dl_prep){real, f};
}

#if defined(__x86_64__)
/* rdi, rsi: dlopen's arguments, kept across the call (two pushes and 8 bytes: the stack 16-byte
 * aligned at the call); the struct comes back in rax (the real dlopen) and rdx (the flags). */
__asm__(".text\n"
        ".globl dlopen\n"
        ".type dlopen, @function\n"
        ".p2align 4\n"
        "dlopen:\n"
#if defined(__CET__)
        "    endbr64\n"
#endif
        "    pushq %rdi\n"
        "    pushq %rsi\n"
        "    subq $8, %rsp\n"
        "    call mlp_dlopen_prep\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    movl %edx, %esi\n"
        "    jmp *%rax\n"
        ".size dlopen, .-dlopen\n");
#elif defined(__aarch64__)
/* x0, x1: dlopen's arguments; x29, x30 (the caller's return address) saved and restored; the
 * struct comes back in x0 (the real dlopen) and x1 (the flags). */
__asm__(".text\n"
        ".globl dlopen\n"
        ".type dlopen, %function\n"
        ".p2align 4\n"
        "dlopen:\n"
#if defined(__ARM_FEATURE_BTI_DEFAULT)
        "    bti c\n"
#endif
        "    stp x29, x30, [sp, #-32]!\n"
        "    mov x29, sp\n"
        "    str x0, [sp, #16]\n"
        "    bl mlp_dlopen_prep\n"
        "    mov x16, x0\n"
        "    ldr x0, [sp, #16]\n"
        "    ldp x29, x30, [sp], #32\n"
        "    br x16\n"
        ".size dlopen, .-dlopen\n");
#endif
