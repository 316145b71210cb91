/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* truncate-guard: a fabric file shrunk under its mappings (by anyone who can open it) is an error
 * on that channel or segment, never a SIGBUS; and every other SIGBUS keeps its default action,
 * the fault's and a sent one's, exactly as without memlan. */
#include "test.h"

#include <fcntl.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define BOUND_MS 3000 /* the liveness check runs every 100 ms to 1 s; a loaded machine */

static void shrink(const char *token, off_t to)
{
    char path[512];
    snprintf(path, sizeof path, "%s/seg-%s", ml_test_dir, token);
    int fd = open(path, O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, to), 0);
    close(fd);
}

/* Both ends of a channel whose file is cut to nothing mid-stream end with ECONNRESET. */
static void channel_case(memlan_fabric_t *fab, off_t to)
{
    memlan_channel_t *c;
    int sync[2];
    ASSERT_EQ(pipe(sync), 0);
    pid_t pid = ml_test_fork_peer(fab, NULL, &c);
    if (pid == 0) { /* the attacher: streams until its channel breaks */
        close(sync[0]);
        uint8_t buf[4096] = {1};
        ssize_t r;
        bool told = false;
        while ((r = memlan_send(c, buf, sizeof buf, 0)) > 0) {
            if (!told) {
                ASSERT_EQ(write(sync[1], "x", 1), 1);
                told = true;
            }
        }
        _exit(r == -ECONNRESET || r == -EPROTO ? 0 : 10);
    }
    close(sync[1]);
    char x;
    ASSERT_EQ(read(sync[0], &x, 1), 1); /* streaming */
    char tok[MEMLAN_TOKEN_LEN + 1];
    memcpy(tok, memlan_channel_token(c), sizeof tok);
    shrink(tok, to);
    uint64_t t0 = ml_test_now_ns();
    uint8_t buf[8192];
    ssize_t r;
    uint64_t got = 0;
    while ((r = memlan_recv(c, buf, sizeof buf, 0)) > 0)
        got += (uint64_t)r;
    /* reset (the peer's lock went with its mapping) or a protocol error (the rings read as
     * zeros): either is the end of this channel, as for any hostile peer */
    ASSERT_TRUE(r == -ECONNRESET || r == -EPROTO);
    ASSERT_LE((ml_test_now_ns() - t0) / 1000000, BOUND_MS);
    ssize_t w = memlan_send(c, "x", 1, 0);
    ASSERT_TRUE(w == -ECONNRESET || w == -EPROTO);
    /* The peer may still be waiting for room in the ring (its view may not have faulted): our
     * close releases our liveness lock, and it sees the connection end. */
    memlan_channel_close(c);
    t0 = ml_test_now_ns();
    ASSERT_EQ(ml_test_wait_child(pid), 0); /* not 128 + SIGBUS */
    ASSERT_LE((ml_test_now_ns() - t0) / 1000000, BOUND_MS);
    close(sync[0]);
}

/* An importer of a shrunk raw segment reads private memory and is told. */
static void segment_case(memlan_fabric_t *fab)
{
    memlan_segment_t *ex, *im;
    ASSERT_OK(memlan_segment_export(fab, 3 * 4096, MEMLAN_MODE_RW, &ex));
    memset(memlan_segment_ptr(ex), 0x5a, 3 * 4096);
    ASSERT_OK(memlan_segment_import(fab, memlan_segment_token(ex), MEMLAN_MODE_RW, &im));
    ASSERT_OK(memlan_segment_check(im));
    shrink(memlan_segment_token(ex), 0);
    volatile unsigned char *p = memlan_segment_ptr(im);
    unsigned char v = p[2 * 4096]; /* would be SIGBUS */
    (void)v;
    p[100] = 7; /* writable, privately */
    ASSERT_EQ(memlan_segment_check(im), -EIO);
    volatile unsigned char *q = memlan_segment_ptr(ex);
    q[0] = 1; /* the exporter's mapping too */
    ASSERT_EQ(memlan_segment_check(ex), -EIO);
    memlan_segment_close(im);
    memlan_segment_close(ex);
}

/* A SIGBUS that is not memlan's: the default action, as without memlan (or, in a sanitizer's
 * build, whose handler was there first, that handler's: it reports and aborts). */
static bool was_default;

static void foreign_fault_case(memlan_fabric_t *fab)
{
    int expect = was_default ? 128 + SIGBUS : 128 + SIGABRT;
    memlan_segment_t *armed; /* a registration: the handler is installed from here on */
    ASSERT_OK(memlan_segment_export(fab, 4096, MEMLAN_MODE_RW, &armed));
    struct sigaction cur;
    ASSERT_EQ(sigaction(SIGBUS, NULL, &cur), 0);
    ASSERT_TRUE((cur.sa_flags & SA_SIGINFO) != 0); /* ours is there: the case means something */
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/not-memlan", ml_test_dir);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, 8192) < 0)
            _exit(20);
        volatile unsigned char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            _exit(21);
        unlink(path);
        m[0] = 1;
        if (ftruncate(fd, 0) < 0)
            _exit(22);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        m[4096] = 1; /* SIGBUS, the default action */
        _exit(23);
    }
    ASSERT_EQ(ml_test_wait_child(pid), expect);

    pid = fork(); /* one sent by a process: the default action too */
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        kill(getpid(), SIGBUS);
        _exit(24);
    }
    ASSERT_EQ(ml_test_wait_child(pid), was_default ? 128 + SIGBUS : expect);
    memlan_segment_close(armed);
}

int main(void)
{
    ml_test_watchdog(60);
    struct sigaction first;
    ASSERT_EQ(sigaction(SIGBUS, NULL, &first), 0);
    was_default = !(first.sa_flags & SA_SIGINFO) && first.sa_handler == SIG_DFL;
    memlan_fabric_t *fab = ml_test_fabric();
    channel_case(fab, 0);
    channel_case(fab, 4096 * 2); /* the header page stays: the rings go */
    segment_case(fab);
    foreign_fault_case(fab);
    memlan_fabric_close(fab);
    ml_test_rmdir();
    printf("truncate-guard: ok, 2 channels and a segment shrunk under both ends, no signal\n");
    return 0;
}
