/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* brief-wait: the wait for a briefly held lock or count (__ml_brief_wait, spin.c) never calls
 * sched_yield where no wait may yield.  Each case runs 200 rounds of it in a fork child confined
 * by a seccomp filter that kills the process for sched_yield:
 *   - MEMLAN_SPIN_US=0 (design.md tells a native program that confines itself to set it): exits
 *     0; before, rounds past 32 yielded and the filter killed it;
 *   - the preload's setting (__ml_yield_off): exits 0;
 *   - the default (a native program, spin unset): killed by SIGSYS, the control that shows the
 *     filter and the rounds reach sched_yield. */
#include "test.h"
#include "internal.h"
#include "../preload/seccompkill.h"

#include <signal.h>
#include <sys/syscall.h>

/* How the child ended: its exit code, or 128 + the signal that killed it. */
static int run_case(const char *spin_us, bool yield_off)
{
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        if (spin_us)
            setenv("MEMLAN_SPIN_US", spin_us, 1);
        else
            unsetenv("MEMLAN_SPIN_US");
        if (yield_off)
            __ml_yield_off();
        if (seccomp_kill_process_for(SYS_sched_yield) != 0)
            _exit(3);
        for (unsigned i = 0; i < 200; i++)
            __ml_brief_wait(i);
        _exit(0);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(void)
{
    ml_test_watchdog(60);
    ASSERT_EQ(run_case("0", false), 0);
    ASSERT_EQ(run_case("20", false), 0);
    ASSERT_EQ(run_case(NULL, true), 0);
    ASSERT_EQ(run_case(NULL, false), 128 + SIGSYS);
    printf("brief-wait: ok, no sched_yield with MEMLAN_SPIN_US set or in the preload (the "
           "default's yield killed by the filter)\n");
    return 0;
}
