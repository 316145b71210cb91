/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-quiet-hint: the two answers to "was anything posted?" that the socket layer asks without a
 * lock.  A queue of 8,192 slots (two summary words) with one channel (slot 0): a bit a peer
 * wrote in the second summary word, over slots never handed out, is seen by __ml_evq_quiet and
 * by memlan_evq_arm (pending), not by __ml_evq_quiet_hint (epoll_wait's spin looks only at the
 * words over slots ever handed out); one collect clears it, and then neither answer, nor the
 * arm, sees anything.  The drains that follow an arm's "pending" ask the full answer: had they
 * asked the hint, the garbage bit would never be collected and such a loop would go round for
 * ever.  A real post to slot 0 is seen by all three and collected as one event. */
#include "test.h"
#include "channel.h"

#include <sys/mman.h>
#include <sys/stat.h>

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, 8192, &q));
    memlan_channel_t *a, *b;
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_OK(memlan_evq_add(q, b, MEMLAN_EV_READ, b));
    ASSERT_TRUE(__ml_evq_quiet(q));
    ASSERT_TRUE(__ml_evq_quiet_hint(q));

    /* The queue's file, as a poster maps it: its header says where the summary words are. */
    int *segfd, *bellfd;
    __ml_evq_fds(q, &segfd, &bellfd);
    struct stat st;
    ASSERT_OK(fstat(*segfd, &st));
    uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, *segfd, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    struct ml_evq_hdr *h = (struct ml_evq_hdr *)(m + sizeof(struct ml_seg_hdr));
    ASSERT_EQ(h->sum_words, 2);
    _Atomic uint64_t *sum = (_Atomic uint64_t *)(m + h->sum_off);
    atomic_store(&sum[1], 1); /* leaf word 64: slots 4096-4159, never handed out */

    ASSERT_TRUE(!__ml_evq_quiet(q));
    ASSERT_TRUE(__ml_evq_quiet_hint(q));
    ASSERT_EQ(memlan_evq_arm(q), 1);
    struct memlan_event ev[8];
    ASSERT_EQ(memlan_evq_wait(q, ev, 8, 0), 0); /* it names no channel: no event */
    ASSERT_TRUE(__ml_evq_quiet(q));
    ASSERT_EQ(memlan_evq_arm(q), 0);

    /* A real post: a's send trips b's read tripwire, in queue mode. */
    ASSERT_EQ(memlan_send(a, "x", 1, 0), 1);
    ASSERT_TRUE(!__ml_evq_quiet(q));
    ASSERT_TRUE(!__ml_evq_quiet_hint(q));
    ASSERT_EQ(memlan_evq_wait(q, ev, 8, 0), 1);
    ASSERT_TRUE(ev[0].udata == b);
    ASSERT_TRUE(__ml_evq_quiet(q) && __ml_evq_quiet_hint(q));

    munmap(m, (size_t)st.st_size);
    memlan_channel_close(b);
    memlan_channel_close(a);
    memlan_evq_close(q);
    ml_test_fabric_empty(fab);
    printf("evq-quiet-hint: ok, a bit over slots never handed out is left to the full look and "
           "cleared by one collect\n");
    return 0;
}
