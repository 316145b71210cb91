/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* spin-peer-cpu: the spin policy reads the peer's cpu from a word the peer writes (cpu + 1, 0
 * when unknown).  A peer on our cpu means no spin (it cannot run while we spin); any other
 * value, garbage included, leaves the normal budget, and no value may be undefined behaviour:
 * (int)0x80000000 - 1 overflowed, which the ASan+UBSan run of this test reports (the chaos
 * vandal found it writing that value into a channel's cpu word). */
#include "test.h"
#include "internal.h"
#include "sys/sys.h"

#include <sched.h>

int main(void)
{
    ml_test_watchdog(30);
    unsetenv("MEMLAN_SPIN_US");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* Pin ourselves so that our cpu does not change between the policy's look and ours. */
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "spin-peer-cpu: cannot pin to cpu 0: skipped\n");
        return 0;
    }
    int me = __ml_getcpu();
    ASSERT_EQ(me, 0);
    uint32_t odd[] = {0x80000000u, 0x80000001u, 0xffffffffu, 0x7fffffffu, 0xfffffffeu, 2u, 0u};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        struct ml_spin sp = {0};
        uint64_t b = __ml_spin_budget_ns(&sp, odd[i]);
        if (ncpu >= 2)
            ASSERT_NE(b, 0); /* not our cpu: the normal budget */
        else
            ASSERT_EQ(b, 0); /* one cpu: never spin */
    }
    struct ml_spin sp = {0};
    ASSERT_EQ(__ml_spin_budget_ns(&sp, (uint32_t)me + 1u), 0); /* the peer is on our cpu */
    printf("spin-peer-cpu: ok\n");
    return 0;
}
