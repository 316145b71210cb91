/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-fork-waiters: a channel registered with the parent's event queue, and with a queue of each
 * fork child's own, posts to all of them (issue 18 item 4).  Each round a child drops its copy
 * of the parent's registration (memlan_evq_del), adds the channel to a queue of its own and waits
 * there; the peer sends one byte; the parent's queue and the child's must both report it.  The
 * children are then SIGKILLed holding their registrations: more rounds than a direction has
 * registration slots, so later children get theirs only by freeing the dead ones'.  Before:
 * one reference per direction, which the child's add overwrote and its del cleared: the parent
 * heard nothing from the first round on. */
#include "test.h"

#define ROUNDS 12

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
    struct memlan_event ev[4];
    for (int k = 0; k < ROUNDS; k++) {
        int rp[2];
        ASSERT_OK(pipe(rp));
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            ml_test_watchdog(30); /* alarms are not inherited: a parent that fails leaves us */
            ASSERT_OK(memlan_evq_del(q, c)); /* our copy only: the registration is the parent's */
            memlan_evq_t *mine;
            ASSERT_OK(memlan_evq_create(fab, 64, &mine));
            ASSERT_OK(memlan_evq_add(mine, c, MEMLAN_EV_READ, c));
            char b = 'r';
            ASSERT_EQ(write(rp[1], &b, 1), 1);
            int n = memlan_evq_wait(mine, ev, 4, 5000);
            b = n == 1 ? 'y' : 'n';
            ASSERT_EQ(write(rp[1], &b, 1), 1);
            for (;;)
                pause(); /* killed holding its registration */
        }
        char b;
        ASSERT_EQ(read(rp[0], &b, 1), 1);
        ASSERT_EQ(memlan_send(p, "x", 1, 0), 1);
        int n = memlan_evq_wait(q, ev, 4, 5000);
        if (n != 1)
            fprintf(stderr, "round %d: the parent's queue reported %d events\n", k, n);
        ASSERT_EQ(n, 1);
        ASSERT_EQ(read(rp[0], &b, 1), 1);
        if (b != 'y')
            fprintf(stderr, "round %d: the child's queue reported nothing\n", k);
        ASSERT_EQ(b, 'y');
        char buf[8];
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), 1);
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN); /* re-arms */
        kill(pid, SIGKILL);
        ml_test_wait_child(pid);
        close(rp[0]);
        close(rp[1]);
    }
    memlan_evq_close(q);
    memlan_channel_close(p);
    memlan_channel_close(c);
    ASSERT_GE(memlan_fabric_clean(fab), 1); /* the children's queues and doorbells */
    ml_test_fabric_empty(fab);
    printf("evq-fork-waiters: ok, %d rounds, parent and child woken each time\n", ROUNDS);
    return 0;
}
