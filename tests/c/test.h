/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * test.h - assertion macros and helpers for the C tests.
 *
 * Each test is one program: exit 0 pass, 1 fail, 77 skip.  Assertions print both values with the
 * file and line.  Every test runs in a fabric directory of its own (ml_test_fabric()), and checks
 * at the end that it left no file behind (ml_test_fabric_empty()).
 */
#ifndef MEMLAN_TEST_H
#define MEMLAN_TEST_H

#include <errno.h>
#include <dirent.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memlan.h"

#define ASSERT_EQ(a, b)                                                                        \
    do {                                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                                    \
        if (a_ != b_) {                                                                        \
            fprintf(stderr, "%s:%d: ASSERT_EQ(%s, %s) failed: %lld != %lld\n", __FILE__,       \
                    __LINE__, #a, #b, a_, b_);                                                 \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define ASSERT_NE(a, b)                                                                        \
    do {                                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                                    \
        if (a_ == b_) {                                                                        \
            fprintf(stderr, "%s:%d: ASSERT_NE(%s, %s) failed: both %lld\n", __FILE__,          \
                    __LINE__, #a, #b, a_);                                                     \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define ASSERT_GE(a, b)                                                                        \
    do {                                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                                    \
        if (a_ < b_) {                                                                         \
            fprintf(stderr, "%s:%d: ASSERT_GE(%s, %s) failed: %lld < %lld\n", __FILE__,        \
                    __LINE__, #a, #b, a_, b_);                                                 \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define ASSERT_LE(a, b) ASSERT_GE(b, a)
#define ASSERT_TRUE(c)                                                                         \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "%s:%d: ASSERT_TRUE(%s) failed\n", __FILE__, __LINE__, #c);        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define ASSERT_OK(expr)                                                                        \
    do {                                                                                       \
        long long r_ = (long long)(expr);                                                      \
        if (r_ < 0) {                                                                          \
            fprintf(stderr, "%s:%d: %s failed: %lld (%s)\n", __FILE__, __LINE__, #expr, r_,    \
                    strerror((int)-r_));                                                       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static char ml_test_dir[256];

static inline void ml_test_rmdir(void)
{
    rmdir(ml_test_dir); /* only if empty: a leak stays visible */
}

/* A fresh fabric directory for this test, removed at exit if empty. */
static inline memlan_fabric_t *ml_test_fabric(void)
{
    const char *base = getenv("MEMLAN_TEST_TMP");
    snprintf(ml_test_dir, sizeof ml_test_dir, "%s/memlan-test-XXXXXX",
             base && *base ? base : "/dev/shm");
    if (!mkdtemp(ml_test_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    setenv("MEMLAN_FABRIC", ml_test_dir, 1);
    atexit(ml_test_rmdir);
    memlan_fabric_t *fab;
    ASSERT_OK(memlan_fabric_open(ml_test_dir, &fab));
    return fab;
}

static inline int ml_test_count_files(void)
{
    DIR *d = opendir(ml_test_dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            n++;
            fprintf(stderr, "  fabric file: %s\n", e->d_name);
        }
    closedir(d);
    return n;
}

/* Assert that the fabric holds no file, then remove it. */
static inline void ml_test_fabric_empty(memlan_fabric_t *fab)
{
    ASSERT_EQ(ml_test_count_files(), 0);
    memlan_fabric_close(fab);
    rmdir(ml_test_dir);
}

static inline uint64_t ml_test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The k-th cpu (0, 1, ...) this process may run on, as its affinity was when first asked (a
 * container's cpuset may leave cpu 0 out); -1 if it may run on k or fewer. */
static inline int ml_test_cpu(int k)
{
    static cpu_set_t allowed;
    static int asked;
    if (!asked) {
        asked = 1;
        if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
            CPU_ZERO(&allowed);
    }
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed) && k-- == 0)
            return c;
    return -1;
}

/* Keep the calling thread (and what it forks or starts after) on one cpu: 0, or -1. */
static inline int ml_test_pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set);
}

/* xorshift64*: a reproducible stream of test data. */
static inline uint64_t ml_test_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Fail the test (not hang it) if it runs past its time. */
static inline void ml_test_watchdog(unsigned seconds) { alarm(seconds); }

/*
 * Create a channel and fork.  The parent gets the child's pid and, in *ch, the channel it created;
 * the child gets 0 and, in *ch, the channel attached from its side (the test fails if it cannot
 * attach).  The parent still calls memlan_channel_wait_peer() if it must know the child is there.
 */
static inline pid_t ml_test_fork_peer(memlan_fabric_t *fab, const struct memlan_channel_opts *o,
                                      memlan_channel_t **ch)
{
    memlan_channel_t *created;
    ASSERT_OK(memlan_channel_create(fab, o, &created));
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(created), ch));
        return 0;
    }
    *ch = created;
    return pid;
}

/* The start of a test of the spin policy's defaults: MEMLAN_SPIN_US unset, this process on the
 * first cpu it may use (the forked peer starts there too), *fab a fabric of its own, and a
 * message channel to a forked peer, as ml_test_fork_peer makes it. */
static inline pid_t ml_test_same_cpu_peer(memlan_fabric_t **fab, memlan_channel_t **ch)
{
    unsetenv("MEMLAN_SPIN_US");
    ASSERT_EQ(ml_test_pin(ml_test_cpu(0)), 0);
    *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG};
    return ml_test_fork_peer(*fab, &o, ch);
}

static inline int ml_test_wait_child(pid_t pid)
{
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

#endif
