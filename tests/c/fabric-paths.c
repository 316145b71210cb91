/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* fabric-paths: how the fabric's directory is found, checked and shared.
 *
 * 1. MEMLAN_FABRIC naming a missing directory is -ENOENT and creates nothing, unless
 *    MEMLAN_FABRIC_CREATE=1.
 * 2. (root) The private mode: a directory 0733, searchable but not listable.  A user who cannot
 *    read it opens it as a fabric and serves a name; a second user connects (the channel is
 *    private to the two: memlan_connect grants the server's user); the server registers the
 *    channel with an event queue, whose part for the second user lets that user write (not
 *    read) the doorbell despite a umask of 077, and nobody else (no bits for others).
 * 3. (root) The default fabric, /dev/shm/memlan-UID, for an unused uid: a symlink (even to a
 *    directory of that user's) is refused with -ELOOP and a message that says so; a directory of
 *    someone else's, or open to others, with -EACCES; the user's own 0700 directory works.
 * Parts 2 and 3 switch uid in children and are skipped when not root. */
#include "test.h"
#include "channel.h"

#include <fcntl.h>
#include <sys/types.h>

static int as_user(uid_t uid)
{
    umask(077);
    if (setgid(uid) < 0 || setuid(uid) < 0) {
        perror("setuid");
        return -1;
    }
    return 0;
}

static void part_missing(void)
{
    char dir[64] = "/tmp/memlan-missing-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    ASSERT_OK(rmdir(dir));
    setenv("MEMLAN_FABRIC", dir, 1);
    unsetenv("MEMLAN_FABRIC_CREATE");
    memlan_fabric_t *fab = NULL;
    ASSERT_EQ(memlan_fabric_open(NULL, &fab), -ENOENT);
    struct stat st;
    ASSERT_EQ(stat(dir, &st), -1); /* nothing created */
    char why[128];
    __ml_fabric_explain(-ENOENT, why, sizeof why);
    printf("missing MEMLAN_FABRIC: %s\n", why);
    ASSERT_TRUE(strstr(why, "MEMLAN_FABRIC_CREATE"));
    setenv("MEMLAN_FABRIC_CREATE", "1", 1);
    ASSERT_OK(memlan_fabric_open(NULL, &fab));
    ASSERT_OK(stat(dir, &st));
    memlan_fabric_close(fab);
    unsetenv("MEMLAN_FABRIC_CREATE");
    unsetenv("MEMLAN_FABRIC");
    ASSERT_OK(rmdir(dir));
}

static void part_private(void)
{
    char dir[64] = "/dev/shm/memlan-private-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    ASSERT_OK(chmod(dir, 0733));
    int tok[2], done[2];
    ASSERT_OK(pipe(tok));
    ASSERT_OK(pipe(done));
    pid_t owner = fork();
    if (owner == 0) {
        if (as_user(65534) < 0)
            _exit(1);
        memlan_fabric_t *fab;
        memlan_listener_t *l;
        memlan_channel_t *ch;
        memlan_evq_t *q;
        ASSERT_OK(memlan_fabric_open(dir, &fab));
        ASSERT_OK(memlan_listen(fab, "p", 0, &l));
        ASSERT_EQ(write(tok[1], "ready\n", 6), 6);
        ASSERT_OK(memlan_accept(l, 10000, &ch));
        ASSERT_OK(memlan_evq_create(fab, 64, &q));
        ASSERT_OK(memlan_evq_add(q, ch, MEMLAN_EV_READ, NULL));
        char name[600];
        int *segfd, *bellfd;
        __ml_evq_fds((struct memlan_evq *)q, &segfd, &bellfd);
        snprintf(name, sizeof name, "/proc/self/fd/%d", *bellfd);
        struct stat st;
        ASSERT_OK(stat(name, &st));
        printf("doorbell mode under umask 077: %04o\n", (unsigned)(st.st_mode & 07777));
        ASSERT_EQ(st.st_mode & 07, 0); /* the peer's user may write it by its ACL, no other */
        /* the bell's name is bell-TOKEN of the queue's segment: find it by the fd's link */
        char link[600];
        ssize_t n = readlink(name, link, sizeof link - 1);
        ASSERT_GE(n, 1);
        link[n] = 0;
        char msg[700];
        snprintf(msg, sizeof msg, "%s\n", link);
        ASSERT_EQ(write(tok[1], msg, strlen(msg)), (ssize_t)strlen(msg));
        char c;
        ASSERT_EQ(read(done[0], &c, 1), 1);
        char buf[8];
        ASSERT_EQ(memlan_recv(ch, buf, sizeof buf, 0), 2); /* the other user's bytes */
        memlan_evq_close(q);
        memlan_channel_close(ch);
        memlan_listener_close(l);
        memlan_fabric_close(fab);
        _exit(0);
    }
    close(tok[1]); /* a child that fails ends our read */
    close(done[0]);
    char msg[8];
    ssize_t n = read(tok[0], msg, 6);
    if (n != 6)
        rmdir(dir);
    ASSERT_EQ(n, 6);
    pid_t peer = fork();
    if (peer == 0) {
        if (as_user(65533) < 0)
            _exit(1);
        memlan_fabric_t *fab;
        memlan_channel_t *ch;
        ASSERT_OK(memlan_fabric_open(dir, &fab));
        ASSERT_OK(memlan_connect(fab, "p", NULL, 5000, &ch));
        char bell[700];
        size_t k = 0;
        while (k < sizeof bell - 1 && read(tok[0], &bell[k], 1) == 1 && bell[k] != '\n')
            k++;
        bell[k] = 0;
        ASSERT_GE(k, 1);
        ASSERT_EQ(memlan_send(ch, "hi", 2, 0), 2);
        int fd = open(bell, O_WRONLY | O_NONBLOCK);
        if (fd < 0)
            fprintf(stderr, "another user cannot open the doorbell %s: %s\n", bell,
                    strerror(errno));
        ASSERT_GE(fd, 0);
        close(fd);
        memlan_channel_close(ch);
        memlan_fabric_close(fab);
        _exit(0);
    }
    int pst = ml_test_wait_child(peer);
    ASSERT_EQ(write(done[1], "x", 1), 1);
    int ost = ml_test_wait_child(owner);
    DIR *d = opendir(dir);
    int left = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        left += e->d_name[0] != '.';
    if (d)
        closedir(d);
    rmdir(dir);
    ASSERT_EQ(pst, 0);
    ASSERT_EQ(ost, 0);
    ASSERT_EQ(left, 0);
    printf("private fabric (0733): two users connected through it\n");
}

/* memlan_fabric_open(NULL) as uid, with the default directory as the caller left it. */
static int open_default_as(uid_t uid, char *why, size_t len)
{
    int p[2];
    ASSERT_OK(pipe(p));
    pid_t pid = fork();
    if (pid == 0) {
        if (as_user(uid) < 0)
            _exit(99);
        unsetenv("MEMLAN_FABRIC");
        memlan_fabric_t *fab;
        int r = memlan_fabric_open(NULL, &fab);
        char buf[160];
        if (r < 0)
            __ml_fabric_explain(r, buf, sizeof buf);
        else
            snprintf(buf, sizeof buf, "opened");
        (void)write(p[1], buf, strlen(buf));
        if (r == 0)
            memlan_fabric_close(fab);
        _exit(-r);
    }
    close(p[1]);
    ssize_t n = read(p[0], why, len - 1);
    why[n > 0 ? n : 0] = 0;
    close(p[0]);
    return -ml_test_wait_child(pid);
}

static void part_default(void)
{
    uid_t uid = 54000 + (uid_t)(getpid() % 1000);
    char def[64], target[64] = "/dev/shm/memlan-paths-XXXXXX", why[160];
    snprintf(def, sizeof def, "/dev/shm/memlan-%u", (unsigned)uid);
    struct stat st;
    if (lstat(def, &st) == 0) {
        printf("default-fabric part skipped: %s exists\n", def);
        return;
    }
    ASSERT_TRUE(mkdtemp(target));
    ASSERT_OK(chown(target, uid, uid));
    ASSERT_OK(symlink(target, def));
    int r = open_default_as(uid, why, sizeof why);
    printf("default fabric a symlink: %d, %s\n", r, why);
    unlink(def);
    rmdir(target);
    ASSERT_EQ(r, -ELOOP);
    ASSERT_TRUE(strstr(why, "symlink"));

    ASSERT_OK(mkdir(def, 0700)); /* root's */
    r = open_default_as(uid, why, sizeof why);
    printf("default fabric another user's: %d, %s\n", r, why);
    ASSERT_EQ(r, -EACCES);
    ASSERT_OK(chown(def, uid, uid));
    ASSERT_OK(chmod(def, 0755));
    r = open_default_as(uid, why, sizeof why);
    printf("default fabric open to others: %d, %s\n", r, why);
    ASSERT_EQ(r, -EACCES);
    ASSERT_OK(chmod(def, 0700));
    r = open_default_as(uid, why, sizeof why);
    rmdir(def);
    ASSERT_EQ(r, 0);
}

int main(void)
{
    ml_test_watchdog(60);
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *only = getenv("MEMLAN_TEST_PART"); /* one part alone: missing, private, default */
    if (!only || !strcmp(only, "missing"))
        part_missing();
    if (geteuid() != 0) {
        printf("fabric-paths: the parts that switch users skipped (not root)\n");
        return 0;
    }
    if (!only || !strcmp(only, "private"))
        part_private();
    if (!only || !strcmp(only, "default"))
        part_default();
    printf("fabric-paths: ok\n");
    return 0;
}
