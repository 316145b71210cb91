/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: a seccomp filter that kills for a few system calls and allows every other. */
#ifndef MEMLAN_TESTS_SECCOMPKILL_H
#define MEMLAN_TESTS_SECCOMPKILL_H
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

/* 0 once the filter is on (with no_new_privs), else nonzero.  n: at most 8 calls.  ret: what
 * the filter answers them (SECCOMP_RET_KILL: the thread; SECCOMP_RET_KILL_PROCESS). */
static inline int seccomp_ret_for_all(const unsigned *nrs, int n, unsigned ret)
{
    struct sock_filter f[2 + 8 * 2];
    int k = 0;
    if (n > 8)
        return -1;
    f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                          offsetof(struct seccomp_data, nr));
    for (int i = 0; i < n; i++) {
        f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nrs[i], 0, 1);
        f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
    }
    f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog p = {(unsigned short)k, f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p);
}

static inline int seccomp_kill_for_all(const unsigned *nrs, int n)
{
    return seccomp_ret_for_all(nrs, n, SECCOMP_RET_KILL);
}

static inline int seccomp_kill_for(unsigned nr) { return seccomp_kill_for_all(&nr, 1); }

/* The whole process killed (Linux 4.14 and later), not the calling thread alone. */
static inline int seccomp_kill_process_for(unsigned nr)
{
    return seccomp_ret_for_all(&nr, 1, SECCOMP_RET_KILL_PROCESS);
}
#endif
