/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* attach-word: the channel's attached word is the peer's to write, and must never decide that we
 * wait for ever.
 *
 * 1. A peer attaches, then writes 0 over the word and dies: the creator, blocked in recv, must
 *    still see it die (-ECONNRESET) within the liveness bound; the old code took "0" to mean
 *    "nobody attached yet" and waited for ever.
 * 2. A value the protocol never writes (neither 0, 1 nor withdrawn) is a broken channel: waiting
 *    for the peer says -EPROTO, a withdrawal gives up on it (-EPROTO: the socket layer then stays
 *    on TCP instead of trying again for ever), a blocked recv ends.
 * 3. Nobody ever attaches (issue 20: a peer that died before attaching, or whose open of the
 *    file failed): the creator's blocking recv and send give up 10 s after creation with
 *    -ENOTCONN (the old code waited for ever), the offer is withdrawn so that a late attacher
 *    is refused, and memlan_channel_wait_peer() still waits for as long as it is told. */
#include "test.h"
#include "channel.h"

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
    char buf[64];

    /* 1 */
    memlan_channel_t *a;
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    int go[2];
    ASSERT_OK(pipe(go));
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        memlan_channel_t *b;
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
        char c;
        if (read(go[0], &c, 1) != 1)
            _exit(1);
        atomic_store(&b->hdr->attached, 0u); /* "nobody here" */
        raise(SIGKILL);
    }
    ASSERT_OK(memlan_channel_wait_peer(a, 10000));
    ASSERT_EQ(write(go[1], "x", 1), 1);
    uint64_t t0 = ml_test_now_ns();
    ssize_t r = memlan_recv(a, buf, sizeof buf, 0);
    uint64_t ms = (ml_test_now_ns() - t0) / 1000000u;
    printf("creator's recv after the peer died: %zd after %" PRIu64 " ms\n", r, ms);
    ASSERT_EQ(r, -ECONNRESET);
    ASSERT_EQ(ml_test_wait_child(pid), 128 + SIGKILL);
    memlan_channel_close(a);

    /* 2 */
    static const uint32_t garbage[] = {3, 0xffffffffu, 0x100};
    for (unsigned i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        ASSERT_OK(memlan_channel_create(fab, &o, &a));
        atomic_store(&a->hdr->attached, garbage[i]);
        ASSERT_EQ(memlan_channel_wait_peer(a, 1000), -EPROTO);
        ASSERT_EQ(__ml_chan_withdraw(a), -EPROTO);
        memlan_channel_t *b;
        ASSERT_EQ(memlan_channel_attach(fab, memlan_channel_token(a), &b), -EBUSY);
        ASSERT_EQ(memlan_recv(a, buf, sizeof buf, 0), -ECONNRESET);
        memlan_channel_close(a);
    }

    /* 3 */
    memlan_channel_t *snd; /* made at the same time, for the send below (one 10 s wait) */
    ASSERT_OK(memlan_channel_create(fab, &o, &snd));
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    t0 = ml_test_now_ns();
    ASSERT_EQ(memlan_channel_wait_peer(a, 300), -ETIMEDOUT); /* its own bound, nothing more */
    ASSERT_EQ(atomic_load(&a->hdr->attached), 0u);
    r = memlan_recv(a, buf, sizeof buf, 0);
    ms = (ml_test_now_ns() - t0) / 1000000u;
    printf("creator's recv with nobody attached: %zd after %" PRIu64 " ms\n", r, ms);
    ASSERT_EQ(r, -ENOTCONN);
    ASSERT_GE(ms, 9900);
    ASSERT_EQ(memlan_recv(a, buf, sizeof buf, 0), -ENOTCONN); /* and at once from then on */
    memlan_channel_t *late;
    ASSERT_EQ(memlan_channel_attach(fab, memlan_channel_token(a), &late), -EBUSY);
    memlan_channel_close(a);
    /* A blocked send (ring full) ends the same way. */
    static char big[8192];
    ASSERT_EQ(memlan_send(snd, big, sizeof big, MEMLAN_DONTWAIT), 4096);
    ASSERT_EQ(memlan_send(snd, big, sizeof big, 0), -ENOTCONN);
    memlan_channel_close(snd);
    ml_test_fabric_empty(fab);
    printf("attach-word: ok\n");
    return 0;
}
