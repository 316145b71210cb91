/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-parts-limit: in a fabric shared on purpose, root serves a name and registers each
 * accepted channel with one event queue; 33 clients connect, each as a user of its own, so the
 * queue needs a part per user.  The first 32 are registered (each client's byte is then
 * reported by the queue), the 33rd gets -ENOSPC, and the process is told so once on stderr.
 * Before: 8 parts besides part 0, so the 9th user's add failed, and nothing was said.
 * Needs root (switches uid); skipped otherwise. */
#include "test.h"

#include <fcntl.h>

#define USERS 33
#define UID0 42000

int main(void)
{
    if (geteuid() != 0) {
        printf("evq-parts-limit: skipped (not root)\n");
        return 0;
    }
    ml_test_watchdog(120);
    unsetenv("MEMLAN_QUIET");
    memlan_fabric_t *priv = ml_test_fabric();
    ASSERT_EQ(chmod(ml_test_dir, 01777), 0); /* shared on purpose */
    memlan_fabric_t *fab;
    ASSERT_OK(memlan_fabric_open(ml_test_dir, &fab));
    memlan_listener_t *l;
    ASSERT_OK(memlan_listen(fab, "parts", 0, &l));
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, 256, &q));
    /* what the library says on stderr goes to a file we read afterwards */
    char errpath[300];
    snprintf(errpath, sizeof errpath, "%s.stderr", ml_test_dir);
    int ef = open(errpath, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(ef >= 0);
    int saved = dup(2);
    int go[2], fin[2];
    ASSERT_OK(pipe(go));
    ASSERT_OK(pipe(fin));
    pid_t kids[USERS];
    memlan_channel_t *chs[USERS];
    int added = 0, nospc = 0;
    for (int i = 0; i < USERS; i++) {
        kids[i] = fork();
        ASSERT_TRUE(kids[i] >= 0);
        if (kids[i] == 0) {
            close(go[1]);
            close(fin[1]);
            if (setgid(UID0 + i) || setuid(UID0 + i))
                _exit(2);
            memlan_fabric_t *f;
            memlan_channel_t *ch;
            if (memlan_fabric_open(ml_test_dir, &f) < 0 ||
                memlan_connect(f, "parts", NULL, 10000, &ch) < 0)
                _exit(3);
            char c;
            if (read(go[0], &c, 1) != 1) /* the parent has registered us all */
                _exit(4);
            if (memlan_send(ch, "x", 1, 0) != 1)
                _exit(5);
            (void)read(fin[0], &c, 1); /* until the parent closes its end */
            memlan_channel_close(ch);
            memlan_fabric_close(f);
            _exit(0);
        }
        ASSERT_OK(memlan_accept(l, 10000, &chs[i]));
        ASSERT_EQ(dup2(ef, 2), 2);
        int r = memlan_evq_add(q, chs[i], MEMLAN_EV_READ, chs[i]);
        ASSERT_EQ(dup2(saved, 2), 2);
        if (r == 0)
            added++;
        else if (r == -ENOSPC)
            nospc++;
        else
            ASSERT_OK(r);
    }
    printf("evq-parts-limit: %d users registered, %d refused with ENOSPC\n", added, nospc);
    ASSERT_EQ(added, 32);
    ASSERT_EQ(nospc, 1);
    /* every registered user's post reaches the queue through its own part */
    char ones[USERS];
    memset(ones, 'g', sizeof ones);
    ASSERT_EQ(write(go[1], ones, USERS), USERS);
    int seen = 0;
    uint64_t end = ml_test_now_ns() + 10000000000ull;
    while (seen < 32 && ml_test_now_ns() < end) {
        struct memlan_event ev[8];
        int n = memlan_evq_wait(q, ev, 8, 1000);
        ASSERT_GE(n, 0);
        for (int k = 0; k < n; k++) {
            char b;
            if (memlan_recv(ev[k].udata, &b, 1, MEMLAN_DONTWAIT) == 1)
                seen++;
        }
    }
    printf("evq-parts-limit: %d of 32 users' bytes reported by the queue\n", seen);

    ASSERT_EQ(seen, 32);
    /* said once, in words */
    char said[4096] = {0};
    ASSERT_TRUE(pread(ef, said, sizeof said - 1, 0) >= 0);
    close(ef);
    unlink(errpath);
    printf("evq-parts-limit: said: %s", said);
    ASSERT_TRUE(strstr(said, "32 other sets of users") != NULL);
    ASSERT_TRUE(strstr(said, "ENOSPC") != NULL);
    ASSERT_TRUE(strstr(strstr(said, "ENOSPC") + 1, "ENOSPC") == NULL); /* once */
    close(go[1]);
    close(fin[1]);
    for (int i = 0; i < USERS; i++)
        ASSERT_EQ(ml_test_wait_child(kids[i]), 0);
    memlan_evq_close(q);
    for (int i = 0; i < USERS; i++)
        memlan_channel_close(chs[i]);
    memlan_listener_close(l);
    memlan_fabric_close(fab);
    (void)memlan_fabric_clean(priv); /* the clients' stat-less leftovers: none expected */
    ASSERT_EQ(chmod(ml_test_dir, 0700), 0);
    ml_test_fabric_empty(priv);
    printf("evq-parts-limit: ok\n");
    return 0;
}
