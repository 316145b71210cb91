/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* peer-kill: SIGKILL either side mid-stream.  The survivor, blocked in recv or send, first gets
 * every byte the dead side had sent, then -ECONNRESET, within a bounded time; the dead side's
 * fabric files are reclaimed (a creator's once the attacher is gone too), and nothing is left
 * once the survivor closes. */
#include "test.h"

#include <fcntl.h>

#define BOUND_MS 3000 /* the liveness check runs every 100 ms; allow for a loaded machine */

static pid_t spawn_streamer(memlan_fabric_t *fab, const char *tok, int role, int pfd)
{
    pid_t pid = fork();
    if (pid == 0) {
        memlan_channel_t *c;
        if (role == 0) { /* attach and stream forever */
            ASSERT_OK(memlan_channel_attach(fab, tok, &c));
        } else { /* create, publish the token, stream forever */
            ASSERT_OK(memlan_channel_create(fab, NULL, &c));
            ASSERT_EQ(write(pfd, memlan_channel_token(c), MEMLAN_TOKEN_LEN + 1),
                      MEMLAN_TOKEN_LEN + 1);
            ASSERT_OK(memlan_channel_wait_peer(c, 10000));
        }
        uint8_t buf[1000];
        for (uint64_t off = 0;; off += sizeof buf) {
            for (size_t i = 0; i < sizeof buf; i++)
                buf[i] = (uint8_t)(off + i);
            if (memlan_send(c, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
                _exit(3);
        }
    }
    return pid;
}

/* Read until the stream breaks; check every byte; return the final result and time it. */
static void drain_until_reset(memlan_channel_t *c, pid_t victim)
{
    uint8_t buf[4096];
    uint64_t off = 0;
    while (off < (1u << 20)) {
        ssize_t r = memlan_recv(c, buf, sizeof buf, 0);
        ASSERT_GE(r, 1);
        for (ssize_t i = 0; i < r; i++)
            ASSERT_EQ(buf[i], (uint8_t)(off + (uint64_t)i));
        off += (uint64_t)r;
    }
    kill(victim, SIGKILL);
    ml_test_wait_child(victim);
    uint64_t t0 = ml_test_now_ns();
    ssize_t r;
    while ((r = memlan_recv(c, buf, sizeof buf, 0)) > 0) {
        for (ssize_t i = 0; i < r; i++)
            ASSERT_EQ(buf[i], (uint8_t)(off + (uint64_t)i));
        off += (uint64_t)r;
    }
    ASSERT_EQ(r, -ECONNRESET);
    ASSERT_LE((ml_test_now_ns() - t0) / 1000000, BOUND_MS);
    ASSERT_EQ(memlan_send(c, "x", 1, 0), -ECONNRESET);
    ASSERT_TRUE(memlan_channel_poll(c) & MEMLAN_EV_ERR);
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();

    /* 1. The attacher dies; the creator survives. */
    memlan_channel_t *c;
    ASSERT_OK(memlan_channel_create(fab, NULL, &c));
    pid_t pid = spawn_streamer(fab, memlan_channel_token(c), 0, -1);
    drain_until_reset(c, pid);
    memlan_channel_close(c);

    /* 2. The creator dies; the attacher survives: the file stays while the attacher lives (it
     *    may open it by name to carry a connection across an exec), and goes at its close. */
    int p[2];
    ASSERT_OK(pipe(p));
    pid = spawn_streamer(fab, NULL, 1, p[1]);
    char tok[MEMLAN_TOKEN_LEN + 1];
    ASSERT_EQ(read(p[0], tok, sizeof tok), (ssize_t)sizeof tok);
    ASSERT_OK(memlan_channel_attach(fab, tok, &c));
    drain_until_reset(c, pid);
    ASSERT_EQ(memlan_fabric_clean(fab), 0);
    memlan_channel_close(c);
    ASSERT_EQ(ml_test_count_files(), 0); /* the attacher's close took the name */

    /* 3. A blocked sender (ring full, peer not reading) also gets -ECONNRESET in time. */
    pid = ml_test_fork_peer(fab, NULL, &c);
    if (pid == 0) { /* attached, and never reads */
        pause();
        _exit(0);
    }
    ASSERT_OK(memlan_channel_wait_peer(c, 10000));
    static uint8_t big[1 << 20];
    ASSERT_EQ(memlan_send(c, big, sizeof big, MEMLAN_DONTWAIT), 256 * 1024);
    uint64_t t0 = ml_test_now_ns();
    kill(pid, SIGKILL);
    ASSERT_EQ(memlan_send(c, big, sizeof big, 0), -ECONNRESET);
    ASSERT_LE((ml_test_now_ns() - t0) / 1000000, BOUND_MS);
    ml_test_wait_child(pid);
    memlan_channel_close(c);

    ml_test_fabric_empty(fab);
    printf("peer-kill: ok\n");
    return 0;
}
