/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* channel-pool: channel files reused by their creator (the pool in channel.c).  A closed pooled
 * channel is reused only once its old peer has gone, comes back empty (no byte of the old
 * connection readable, by the API or in the raw rings), with a new generation that a late
 * acceptor of the old connection cannot attach to; a fork keeps a channel out of the pool; the
 * pool is bounded and its files go when the fabric closes. */
#include "test.h"
#include "channel.h"

#include <dirent.h>
#include <sys/wait.h>

static int count_files(void)
{
    DIR *d = opendir(ml_test_dir);
    ASSERT_TRUE(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, "seg-", 4) == 0;
    closedir(d);
    return n;
}

static void exchange(memlan_channel_t *a, memlan_channel_t *b, const char *what)
{
    char buf[64];
    size_t n = strlen(what);
    ASSERT_EQ(memlan_send(a, what, n, 0), (ssize_t)n);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), (ssize_t)n);
    ASSERT_TRUE(memcmp(buf, what, n) == 0);
    ASSERT_EQ(memlan_send(b, buf, n, 0), (ssize_t)n);
    ASSERT_EQ(memlan_recv(a, buf, sizeof buf, 0), (ssize_t)n);
    ASSERT_TRUE(memcmp(buf, what, n) == 0);
}

static bool zeroed(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    memlan_channel_t *a, *b, *c;
    char tok[MEMLAN_TOKEN_LEN + 1];

    /* 1. Both sides closed: the next channel is the same file, one generation on. */
    ASSERT_OK(__ml_chan_create_pooled(fab, 4096, 0, &a));
    snprintf(tok, sizeof tok, "%s", memlan_channel_token(a));
    uint32_t g0 = __ml_chan_generation(a);
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, g0, &b));
    exchange(a, b, "the first connection's secret");
    memlan_channel_close(b);
    memlan_channel_close(a);
    ASSERT_EQ(count_files(), 1);
    ASSERT_OK(__ml_chan_create_pooled(fab, 4096, 0, &a));
    ASSERT_TRUE(strcmp(memlan_channel_token(a), tok) == 0);
    ASSERT_EQ(__ml_chan_generation(a), g0 + 1);

    /* 2. The old connection's offer no longer attaches; the new one does, and finds it empty. */
    ASSERT_EQ(__ml_chan_attach_gen(fab, tok, g0, &b), -ESTALE);
    ASSERT_OK(__ml_chan_attach_gen(fab, tok, g0 + 1, &b));
    char buf[64];
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    ASSERT_EQ(memlan_recv(a, buf, sizeof buf, MEMLAN_DONTWAIT), -EAGAIN);
    for (int i = 0; i < 2; i++)
        ASSERT_TRUE(zeroed(b->seg->base + ML_PAGE + 2 * (size_t)i * b->size, (size_t)b->size));
    ASSERT_EQ(memlan_channel_poll(a) & (MEMLAN_EV_HUP | MEMLAN_EV_ERR), 0);
    exchange(a, b, "the second connection");

    /* 3. Not reused while the old peer is still attached: it still reads what was sent, then
     * EOF, from the same file. */
    ASSERT_EQ(memlan_send(a, "last words", 10, 0), 10);
    memlan_channel_close(a);
    ASSERT_OK(__ml_chan_create_pooled(fab, 4096, 0, &c));
    ASSERT_TRUE(strcmp(memlan_channel_token(c), tok) != 0);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 10);
    ASSERT_TRUE(memcmp(buf, "last words", 10) == 0);
    ASSERT_EQ(memlan_recv(b, buf, sizeof buf, 0), 0);
    memlan_channel_close(b);
    memlan_channel_close(c);

    /* 4. Another ring size is another file. */
    ASSERT_OK(__ml_chan_create_pooled(fab, 8192, 0, &a));
    ASSERT_TRUE(strcmp(memlan_channel_token(a), tok) != 0);
    memlan_channel_close(a);

    /* 5. A channel made before a fork stays out of the pool (the child may hold it). */
    int before = count_files();
    ASSERT_OK(__ml_chan_create_pooled(fab, 16384, 0, &a));
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0)
        _exit(0);
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    memlan_channel_close(a);
    ASSERT_EQ(count_files(), before);

    /* 6. The pool is bounded (the oldest go), and the fabric's close removes what it holds. */
    memlan_channel_t *many[ML_POOL_MAX + 4];
    for (int i = 0; i < ML_POOL_MAX + 4; i++)
        ASSERT_OK(__ml_chan_create_pooled(fab, 4096, 0, &many[i]));
    for (int i = 0; i < ML_POOL_MAX + 4; i++)
        memlan_channel_close(many[i]);
    ASSERT_EQ(count_files(), ML_POOL_MAX);
    memlan_fabric_close(fab);
    ASSERT_EQ(count_files(), 0);
    printf("channel-pool: ok\n");
    return 0;
}
