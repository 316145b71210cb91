/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* bad-input: every public function, given NULL, bad sizes, bad modes, bad tokens or used out of
 * turn, returns a clear negative errno (and never crashes). */
#include "test.h"

int main(void)
{
    ml_test_watchdog(30);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_segment_t *seg = NULL;
    memlan_channel_t *ch = NULL;
    memlan_evq_t *q = NULL;
    char buf[16];
    const void *cp;
    void *p;

    ASSERT_EQ(memlan_fabric_open(NULL, NULL), -EINVAL);
    ASSERT_EQ(memlan_fabric_open("/proc/version", (memlan_fabric_t **)&p), -ENOTDIR);
    ASSERT_EQ(memlan_fabric_clean(NULL), -EINVAL);
    ASSERT_TRUE(memlan_fabric_path(NULL) == NULL);
    memlan_fabric_close(NULL);

    ASSERT_EQ(memlan_segment_export(NULL, 10, MEMLAN_MODE_RW, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_export(fab, 0, MEMLAN_MODE_RW, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_export(fab, (size_t)1 << 50, MEMLAN_MODE_RW, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_export(fab, 10, 7, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_export(fab, 10, MEMLAN_MODE_RW, NULL), -EINVAL);
    ASSERT_EQ(memlan_segment_import(NULL, "0123456789abcdef0123456789abcdef", MEMLAN_MODE_RO, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_import(fab, NULL, MEMLAN_MODE_RO, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_import(fab, "0123456789abcdef0123456789abcdef0", MEMLAN_MODE_RO, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_import(fab, "0123456789abcdef0123456789abcdef", 0, &seg), -EINVAL);
    ASSERT_EQ(memlan_segment_check(NULL), -EINVAL);
    ASSERT_EQ(memlan_segment_revoke(NULL), -EINVAL);
    ASSERT_TRUE(memlan_segment_ptr(NULL) == NULL);
    ASSERT_EQ(memlan_segment_size(NULL), 0);
    ASSERT_TRUE(memlan_segment_token(NULL) == NULL);
    memlan_segment_close(NULL);

    struct memlan_channel_opts o = {.kind = 9};
    ASSERT_EQ(memlan_channel_create(fab, &o, &ch), -EINVAL);
    o = (struct memlan_channel_opts){.kind = MEMLAN_STREAM, .ring_size = 100};
    ASSERT_EQ(memlan_channel_create(fab, &o, &ch), -EINVAL);
    o.ring_size = (size_t)1 << 31;
    ASSERT_EQ(memlan_channel_create(fab, &o, &ch), -EINVAL);
    ASSERT_EQ(memlan_channel_create(NULL, NULL, &ch), -EINVAL);
    ASSERT_EQ(memlan_channel_create(fab, NULL, NULL), -EINVAL);
    ASSERT_EQ(memlan_channel_attach(fab, "zz", &ch), -EINVAL);
    ASSERT_EQ(memlan_channel_attach(fab, "0123456789abcdef0123456789abcdef", &ch), -ENOENT);
    ASSERT_EQ(memlan_send(NULL, buf, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_recv(NULL, buf, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_reserve(NULL, &p, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_commit(NULL, 1), -EINVAL);
    ASSERT_EQ(memlan_peek(NULL, &cp, 0), -EINVAL);
    ASSERT_EQ(memlan_release(NULL, 1), -EINVAL);
    ASSERT_EQ(memlan_shutdown(NULL, MEMLAN_SHUT_WR), -EINVAL);
    ASSERT_EQ(memlan_channel_poll(NULL), -EINVAL);
    ASSERT_EQ(memlan_channel_wait_peer(NULL, 0), -EINVAL);
    ASSERT_TRUE(memlan_channel_token(NULL) == NULL);
    ASSERT_EQ(memlan_channel_max_msg(NULL), 0);
    memlan_channel_close(NULL);

    /* A live channel used wrongly. */
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, NULL, &a));
    ASSERT_EQ(memlan_channel_wait_peer(a, 10), -ETIMEDOUT);
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    ASSERT_EQ(memlan_channel_attach(fab, memlan_channel_token(a), &ch), -EBUSY);
    ASSERT_EQ(memlan_send(a, NULL, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_recv(b, NULL, 1, 0), -EINVAL);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(memlan_peek(b, &cp, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(memlan_reserve(a, &p, (size_t)1 << 30, 0), -EMSGSIZE);
    ASSERT_EQ(memlan_commit(a, 5), -EINVAL); /* nothing reserved */
    ASSERT_EQ(memlan_release(b, 5), -EINVAL); /* nothing peeked */
    ASSERT_EQ(memlan_shutdown(a, 0), -EINVAL);
    ASSERT_EQ(memlan_shutdown(a, 4), -EINVAL);
    ASSERT_EQ(memlan_send(a, buf, 0, 0), 0);

    ASSERT_EQ(memlan_evq_create(NULL, 0, &q), -EINVAL);
    ASSERT_EQ(memlan_evq_create(fab, 1u << 30, &q), -EINVAL);
    ASSERT_OK(memlan_evq_create(fab, 1, &q));
    ASSERT_EQ(memlan_evq_add(q, a, 0, NULL), -EINVAL);
    ASSERT_EQ(memlan_evq_add(q, a, 0x100, NULL), -EINVAL);
    ASSERT_EQ(memlan_evq_add(NULL, a, MEMLAN_EV_READ, NULL), -EINVAL);
    ASSERT_EQ(memlan_evq_del(q, a), -ENOENT);
    ASSERT_OK(memlan_evq_add(q, a, MEMLAN_EV_READ, NULL));
    ASSERT_EQ(memlan_evq_add(q, a, MEMLAN_EV_READ, NULL), -EEXIST);
    struct memlan_event ev[4];
    ASSERT_EQ(memlan_evq_wait(NULL, ev, 4, 0), -EINVAL);
    ASSERT_EQ(memlan_evq_wait(q, NULL, 4, 0), -EINVAL);
    ASSERT_EQ(memlan_evq_wait(q, ev, 0, 0), -EINVAL);
    ASSERT_EQ(memlan_evq_fd(NULL), -EINVAL);
    ASSERT_EQ(memlan_evq_arm(NULL), -EINVAL);
    memlan_evq_close(NULL);
    memlan_evq_close(q);

    memlan_channel_close(b);
    memlan_channel_close(a);
    ml_test_fabric_empty(fab);
    printf("bad-input: ok\n");
    return 0;
}
