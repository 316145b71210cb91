/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-many-channels: 256 channels from 4 processes post into one event queue; the server waits
 * on it (futex sleeps, and the pollable fd inside poll(2)), drains each ready channel until
 * -EAGAIN, and must receive every message of every channel in order: no event lost (a lost event
 * leaves a channel undrained and the watchdog fires), none duplicated into extra data.  Waits
 * with max = 1 exercise the path that puts back the events that did not fit. */
#include "test.h"

#include <poll.h>

#define NPROC 4
#define PER   64
#define MSGS  2000

int main(void)
{
    ml_test_watchdog(120);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, NPROC * PER, &q));
    memlan_channel_t *ch[NPROC * PER];
    uint32_t next[NPROC * PER] = {0};
    char toks[NPROC * PER][MEMLAN_TOKEN_LEN + 1];
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 4096};
    for (int i = 0; i < NPROC * PER; i++) {
        ASSERT_OK(memlan_channel_create(fab, &o, &ch[i]));
        strcpy(toks[i], memlan_channel_token(ch[i]));
        ASSERT_OK(memlan_evq_add(q, ch[i], MEMLAN_EV_READ, (void *)(intptr_t)i));
    }
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            memlan_channel_t *mine[PER];
            for (int k = 0; k < PER; k++)
                ASSERT_OK(memlan_channel_attach(fab, toks[p * PER + k], &mine[k]));
            uint64_t seed = (uint64_t)p + 1;
            for (uint32_t m = 0; m < MSGS; m++) {
                /* Start each round at a random channel, so channels become ready in a
                 * different order every time. */
                int first = (int)(ml_test_rand(&seed) % PER);
                for (int j = 0; j < PER; j++) {
                    uint32_t v = m;
                    ASSERT_EQ(memlan_send(mine[(first + j) % PER], &v, sizeof v, 0), 4);
                }
                if (ml_test_rand(&seed) % 64 == 0)
                    usleep(500); /* let the server go to sleep */
            }
            for (int k = 0; k < PER; k++)
                memlan_channel_close(mine[k]);
            _exit(0);
        }
    }
    int done = 0, events = 0, polls = 0;
    uint64_t seed = 5;
    while (done < NPROC * PER) {
        struct memlan_event ev[64];
        int max = ml_test_rand(&seed) % 2 ? 1 : 64;
        int n;
        if (ml_test_rand(&seed) % 4 == 0) {
            /* The application's own poll loop. */
            if (memlan_evq_arm(q) == 0) {
                struct pollfd pfd = {.fd = memlan_evq_fd(q), .events = POLLIN};
                ASSERT_GE(poll(&pfd, 1, 5000), 1);
                polls++;
            }
            n = memlan_evq_wait(q, ev, max, 0);
        } else {
            n = memlan_evq_wait(q, ev, max, 5000);
        }
        ASSERT_GE(n, 0);
        ASSERT_LE(n, max);
        events += n;
        for (int e = 0; e < n; e++) {
            int i = (int)(intptr_t)ev[e].udata;
            ASSERT_TRUE(ev[e].events & MEMLAN_EV_READ);
            for (;;) {
                uint32_t v;
                ssize_t r = memlan_recv(ch[i], &v, sizeof v, MEMLAN_DONTWAIT);
                if (r == -EAGAIN)
                    break;
                if (r == 0) { /* EOF: the peer closed after its last message */
                    ASSERT_EQ(next[i], MSGS);
                    memlan_evq_del(q, ch[i]);
                    done++;
                    break;
                }
                ASSERT_EQ(r, 4);
                ASSERT_EQ(v, next[i]);
                next[i]++;
            }
        }
    }
    for (int p = 0; p < NPROC; p++)
        ASSERT_EQ(ml_test_wait_child(pids[p]), 0);
    for (int i = 0; i < NPROC * PER; i++) {
        ASSERT_EQ(next[i], MSGS);
        memlan_channel_close(ch[i]);
    }
    memlan_evq_close(q);
    ml_test_fabric_empty(fab);
    printf("evq-many-channels: ok, %d events, %d poll wake-ups, %d messages\n", events, polls,
           NPROC * PER * MSGS);
    return 0;
}
