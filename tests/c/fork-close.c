/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* fork-close: a fork child that closes the segments and channels it inherited
 * (memlan_segment_close, memlan_channel_close on its copies of the parent's handles) lets go of
 * its own copies only, as memlan_evq_close does (evq-fork-close.c) and as a socket's close in a
 * fork child leaves the parent's connection alone.  The parent's exported segment stays live and
 * importable, and both ends of the parent's channel go on, with no end published to either.
 * Before: the child's segment close revoked the parent's export and removed its file, and its
 * channel close published the parent's side as closed (the peer read EOF) and removed the
 * channel's file (issue 20). */
#include "test.h"

#include <string.h>

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_segment_t *seg, *imp;
    ASSERT_OK(memlan_segment_export(fab, 4096, MEMLAN_MODE_RW, &seg));
    ASSERT_OK(memlan_segment_import(fab, memlan_segment_token(seg), MEMLAN_MODE_RW, &imp));
    memlan_channel_t *c, *p;
    ASSERT_OK(memlan_channel_create(fab, NULL, &c));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(c), &p));
    int before = ml_test_count_files(); /* the segment and the channel */
    ASSERT_EQ(before, 2);
    for (int k = 0; k < 3; k++) {
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            ml_test_watchdog(30);
            /* our copies of every handle: the exporter's, an importer's, both channel ends */
            memlan_segment_close(seg);
            memlan_segment_close(imp);
            memlan_channel_close(c);
            memlan_channel_close(p);
            _exit(0);
        }
        ASSERT_EQ(ml_test_wait_child(pid), 0);
        int now = ml_test_count_files();
        if (now != before)
            fprintf(stderr, "round %d: the child's closes left %d of the parent's %d files\n", k,
                    now, before);
        ASSERT_EQ(now, before);
        /* the export is live, still importable, and its memory still shared */
        ASSERT_EQ(memlan_segment_check(seg), 0);
        ASSERT_EQ(memlan_segment_check(imp), 0);
        memlan_segment_t *again;
        ASSERT_OK(memlan_segment_import(fab, memlan_segment_token(seg), MEMLAN_MODE_RW, &again));
        ((char *)memlan_segment_ptr(seg))[k] = (char)('a' + k);
        ASSERT_EQ(((char *)memlan_segment_ptr(again))[k], 'a' + k);
        memlan_segment_close(again);
        /* neither end of the channel sees an end, and bytes go both ways */
        ASSERT_EQ(memlan_channel_poll(c) & (MEMLAN_EV_HUP | MEMLAN_EV_ERR | MEMLAN_EV_READ), 0);
        ASSERT_EQ(memlan_channel_poll(p) & (MEMLAN_EV_HUP | MEMLAN_EV_ERR | MEMLAN_EV_READ), 0);
        char buf[16];
        ASSERT_EQ(memlan_send(c, "ping", 4, 0), 4);
        ASSERT_EQ(memlan_recv(p, buf, sizeof buf, MEMLAN_DONTWAIT), 4);
        ASSERT_TRUE(memcmp(buf, "ping", 4) == 0);
        ASSERT_EQ(memlan_send(p, "pong", 4, 0), 4);
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), 4);
        ASSERT_TRUE(memcmp(buf, "pong", 4) == 0);
        ASSERT_EQ(memlan_recv(c, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    }
    /* the parent's own closes still end things as before: EOF to the peer, files removed */
    memlan_channel_close(c);
    char b;
    ASSERT_EQ(memlan_recv(p, &b, 1, 0), 0);
    memlan_channel_close(p);
    memlan_segment_close(imp);
    memlan_segment_close(seg);
    ml_test_fabric_empty(fab);
    printf("fork-close: ok, the parent's segment and channel outlive 3 children's closes\n");
    return 0;
}
