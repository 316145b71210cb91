/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tripwire-cleared: the receiver's tripwire word lives in the peer's page.  A peer that keeps
 * clearing it (our "I am asleep" bit) and waking it made a blocked recv look again and again,
 * at the peer's pace, never asleep for long and never asking whether the peer lives.  The
 * waiter must nap after a bounded number of such rounds: here the peer clears and wakes the
 * word for a second, then sends one byte; the receiver gets it, having gone round its wait a
 * bounded number of times and used a small part of that second's CPU time.
 * The event queue's waiter the same: a poster (every peer can write the queue) that clears and
 * wakes the waiter word and sets summary bits naming no channel kept memlan_evq_wait going
 * round, past its own deadline; now it returns at its deadline having slept. */
#include "test.h"
#include "channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>

/* Each side on a core of its own when there are two: the peer must be clearing while we run. */
static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
    memlan_channel_t *ch;
    pid_t pid = ml_test_fork_peer(fab, &o, &ch);
    if (pid == 0) {
        pin(0);
        /* Side 1 sends on ring 1, whose rx_wait is the creator's tripwire. */
        _Atomic uint32_t *w = &ch->tx.ctl->rx_wait;
        uint64_t end = ml_test_now_ns() + 1000000000u;
        while (ml_test_now_ns() < end)
            for (int i = 0; i < 100; i++) {
                atomic_store(w, 0u);
                syscall(SYS_futex, w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
            }
        if (memlan_send(ch, "x", 1, 0) != 1)
            _exit(1);
        memlan_channel_close(ch);
        _exit(0);
    }
    pin(1);
    ASSERT_OK(memlan_channel_wait_peer(ch, 10000));
    char c;
    uint64_t t0 = ml_test_now_ns(), c0 = cpu_ns();
    ssize_t r = memlan_recv(ch, &c, 1, 0);
    uint64_t wall = ml_test_now_ns() - t0, cpu = cpu_ns() - c0;
    printf("recv %zd after %" PRIu64 " ms, %" PRIu64 " ms of CPU, %" PRIu64 " rounds\n", r,
           wall / 1000000u, cpu / 1000000u, ch->sleeps);
    ASSERT_EQ(r, 1);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    ASSERT_TRUE(wall > 500000000u);      /* it did wait for the peer's byte */
    ASSERT_TRUE(ch->sleeps < 500);       /* 64 rounds at most per liveness interval */
    ASSERT_TRUE(cpu < wall / 5);         /* asleep, not looking again and again */
    memlan_channel_close(ch);

    /* The event queue. */
    memlan_evq_t *q;
    ASSERT_OK(memlan_evq_create(fab, 64, &q));
    struct ml_evq_hdr *h = NULL;
    uint8_t *segm = NULL;
    DIR *d = opendir(ml_test_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && !h) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", ml_test_dir, e->d_name);
        int fd = strncmp(e->d_name, "seg-", 4) == 0 ? open(path, O_RDWR) : -1;
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            if (fd >= 0)
                close(fd);
            continue;
        }
        uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        struct ml_seg_hdr *sh = (struct ml_seg_hdr *)m;
        if (m != MAP_FAILED && sh->kind == ML_KIND_EVQ) {
            segm = m;
            h = (struct ml_evq_hdr *)(m + sh->body_off);
        }
    }
    if (d)
        closedir(d);
    ASSERT_TRUE(h != NULL);
    _Atomic uint64_t *sum = (_Atomic uint64_t *)(segm + h->sum_off);
    pid = fork();
    if (pid == 0) {
        pin(0);
        uint64_t end = ml_test_now_ns() + 1500000000u;
        while (ml_test_now_ns() < end)
            for (int i = 0; i < 100; i++) {
                atomic_store(&sum[0], 2u); /* leaf word 1: there is none (capacity 64) */
                atomic_store(&h->waiter, 0u);
                syscall(SYS_futex, &h->waiter, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
            }
        _exit(0);
    }
    struct memlan_event ev[4];
    t0 = ml_test_now_ns();
    c0 = cpu_ns();
    int n = memlan_evq_wait(q, ev, 4, 1000);
    wall = ml_test_now_ns() - t0;
    cpu = cpu_ns() - c0;
    printf("evq wait %d after %" PRIu64 " ms, %" PRIu64 " ms of CPU\n", n, wall / 1000000u,
           cpu / 1000000u);
    ASSERT_EQ(n, 0);
    ASSERT_EQ(ml_test_wait_child(pid), 0);
    ASSERT_TRUE(wall < 1400000000u);     /* its own deadline, not the peer's */
    ASSERT_TRUE(cpu < wall / 20);        /* asleep (the old loop: 13-18% of a core here) */
    memlan_evq_close(q);
    ml_test_fabric_empty(fab);
    printf("tripwire-cleared: ok\n");
    return 0;
}
