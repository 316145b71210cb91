/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: a seccomp filter that kills for one system call and allows every other. */
#ifndef MEMLAN_TESTS_SECCOMPKILL_H
#define MEMLAN_TESTS_SECCOMPKILL_H
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

/* 0 once the filter is on (with no_new_privs), else nonzero. */
static inline int seccomp_kill_for(unsigned nr)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = {sizeof f / sizeof f[0], f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p);
}
#endif
