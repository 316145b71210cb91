/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-dead-owner: a sender keeps posting to the event queue of a peer that was SIGKILLed while
 * it slept on the queue's doorbell (a FIFO).  Nothing the sender does may raise a signal in it:
 * a write into a FIFO whose only reader has died is EPIPE, and SIGPIPE with it, which killed
 * redis-cli when its server was killed.  SIGPIPE keeps its default action here, as in most
 * programs, so the old code dies of it; the test also checks that no SIGPIPE is left pending. */
#include "test.h"

#include <poll.h>

static void owner(memlan_fabric_t *fab, int tokfd, int readyfd)
{
    memlan_channel_t *c;
    memlan_evq_t *q;
    ASSERT_OK(memlan_channel_create(fab, NULL, &c));
    ASSERT_OK(memlan_evq_create(fab, 64, &q));
    ASSERT_OK(memlan_evq_add(q, c, MEMLAN_EV_READ, c));
    ASSERT_EQ(write(tokfd, memlan_channel_token(c), MEMLAN_TOKEN_LEN + 1), MEMLAN_TOKEN_LEN + 1);
    ASSERT_OK(memlan_channel_wait_peer(c, 10000));
    for (;;) { /* the application's own loop: arm, sleep on the doorbell, collect, read */
        if (memlan_evq_arm(q) == 0) {
            char b = 'r';
            ASSERT_EQ(write(readyfd, &b, 1), 1); /* armed: about to sleep */
            struct pollfd p = {.fd = memlan_evq_fd(q), .events = POLLIN};
            (void)poll(&p, 1, -1);
        }
        struct memlan_event ev[8];
        int n = memlan_evq_wait(q, ev, 8, 0);
        for (int i = 0; i < n; i++) {
            char buf[64];
            while (memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT) > 0)
                ;
        }
    }
}

int main(void)
{
    ml_test_watchdog(60);
    signal(SIGPIPE, SIG_DFL);
    memlan_fabric_t *fab = ml_test_fabric();
    int tp[2], rp[2];
    ASSERT_OK(pipe(tp));
    ASSERT_OK(pipe(rp));
    pid_t pid = fork();
    if (pid == 0) {
        owner(fab, tp[1], rp[1]);
        _exit(0);
    }
    char tok[MEMLAN_TOKEN_LEN + 1], b;
    ASSERT_EQ(read(tp[0], tok, sizeof tok), (ssize_t)sizeof tok);
    memlan_channel_t *c;
    ASSERT_OK(memlan_channel_attach(fab, tok, &c));
    /* The first post imports the owner's queue and opens its doorbell while the owner lives. */
    ASSERT_EQ(read(rp[0], &b, 1), 1);
    ASSERT_EQ(memlan_send(c, "a", 1, 0), 1);
    ASSERT_EQ(read(rp[0], &b, 1), 1); /* woken, read it, armed again, asleep */
    kill(pid, SIGKILL);
    ml_test_wait_child(pid);
    /* The owner died armed: our next sends find its tripwire set and ring its doorbell. */
    for (int i = 0; i < 100; i++) {
        ssize_t r = memlan_send(c, "b", 1, MEMLAN_DONTWAIT);
        if (r != 1)
            ASSERT_TRUE(r == -ECONNRESET || r == -EAGAIN || r == -EPIPE);
    }
    sigset_t pending;
    sigemptyset(&pending);
    ASSERT_OK(sigpending(&pending));
    ASSERT_TRUE(!sigismember(&pending, SIGPIPE));
    memlan_channel_close(c);
    ASSERT_GE(memlan_fabric_clean(fab), 1); /* the dead owner's channel, queue and doorbell */
    ml_test_fabric_empty(fab);
    printf("evq-dead-owner: ok, 100 posts to a dead owner's queue, no SIGPIPE\n");
    return 0;
}
