/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-fork-close: a fork child that closes the event queue it inherited (memlan_evq_close on its
 * copy of the parent's handle) lets go of its own copies only: the queue's file and doorbell are
 * the parent's, whose queue goes on waking it, by memlan_evq_wait and by its doorbell fd.
 * Before: the child's close unlinked seg-TOKEN and bell-TOKEN and marked the queue revoked, so
 * the parent's files were gone from the fabric under it (issue 20). */
#include "test.h"

#include <poll.h>

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_channel_t *c, *p;
    ASSERT_OK(memlan_channel_create(fab, NULL, &c));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(c), &p));
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, 64, &q));
    ASSERT_OK(memlan_evq_add(q, c, MEMLAN_EV_READ, c));
    int before = ml_test_count_files(); /* the channel, the queue and its doorbell */
    ASSERT_EQ(before, 3);
    for (int k = 0; k < 3; k++) {
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            ml_test_watchdog(30);
            memlan_evq_close(q); /* our copy: the queue is the parent's */
            _exit(0);
        }
        ASSERT_EQ(ml_test_wait_child(pid), 0);
        int now = ml_test_count_files();
        if (now != before)
            fprintf(stderr, "round %d: the child's close left %d of the parent's %d files\n", k,
                    now, before);
        ASSERT_EQ(now, before);
        /* the parent's queue still works: a post wakes memlan_evq_wait ... */
        ASSERT_EQ(memlan_send(p, "x", 1, 0), 1);
        struct memlan_event ev[4];
        ASSERT_EQ(memlan_evq_wait(q, ev, 4, 5000), 1);
        char buf[8];
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), 1);
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN); /* re-arms */
        /* ... and its doorbell */
        int fd = memlan_evq_fd(q);
        ASSERT_TRUE(fd >= 0);
        ASSERT_EQ(memlan_evq_arm(q), 0);
        ASSERT_EQ(memlan_send(p, "y", 1, 0), 1);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ASSERT_EQ(poll(&pfd, 1, 5000), 1);
        ASSERT_EQ(memlan_evq_wait(q, ev, 4, 0), 1);
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), 1);
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    }
    memlan_evq_close(q);
    memlan_channel_close(p);
    memlan_channel_close(c);
    ml_test_fabric_empty(fab);
    printf("evq-fork-close: ok, the parent's queue and doorbell outlive 3 children's closes\n");
    return 0;
}
