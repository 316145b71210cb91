/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * fdtable.c - which file descriptors are accelerated sockets (or memlan listeners).
 *
 * An array indexed by fd holds a pointer to the socket's state; fds that are not ours hold NULL,
 * so every interposed call on an ordinary fd costs one load and a branch.  dup() makes two
 * entries point at one mlp_sock; each entry and each call in progress holds a reference.
 *
 * Socket objects are type-stable: once allocated they are never returned to malloc, only to a
 * free list, so a thread that loads a pointer just as another thread closes the fd can still
 * take (and then, seeing the entry changed, drop) a reference without touching freed memory.
 *
 * Our own descriptors (segment files, listener records, the log) are moved to high numbers and
 * remembered in a bitmap, so that dup2() onto one of them by the application moves ours away first
 * and close() of one it never opened fails with EBADF as it would without us.
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

static _Atomic(struct mlp_sock *) *mlp_fds;
static int mlp_nfds;                       /* table size */
static _Atomic int mlp_maxfd = -1;         /* highest fd ever installed */
static _Atomic uint64_t *mlp_internal;     /* bitmap of our own fds */
static int *_Atomic *mlp_owner;
static int mlp_high_base = 64;
static pthread_mutex_t mlp_free_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mlp_sock *mlp_free_list;

void mlp_fdtable_init(void)
{
    struct rlimit rl;
    rlim_t n = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max > n)
            n = rl.rlim_max;
        if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 2 > 64)
            mlp_high_base = (int)(rl.rlim_cur / 2);
    }
    if (n > (1u << 22))
        n = 1u << 22;
    /* Reserved, not committed: pages appear only where fds are used. */
    void *p;
    if (__ml_sys_mmap(&p, NULL, n * sizeof(void *), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) < 0)
        return;
    void *q;
    if (__ml_sys_mmap(&q, NULL, n / 8 + 8, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) < 0)
        return;
    mlp_internal = q;
    void *o;
    if (__ml_sys_mmap(&o, NULL, n * sizeof(int *), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) < 0)
        return;
    mlp_owner = o;
    mlp_fds = p;
    mlp_nfds = (int)n;
}

int mlp_fd_max(void) { return mlp_maxfd; }

bool mlp_fd_is_ours(int fd)
{
    return fd >= 0 && fd < mlp_nfds && atomic_load_explicit(&mlp_fds[fd], memory_order_relaxed);
}

struct mlp_sock *mlp_get(int fd)
{
    if (fd < 0 || fd >= mlp_nfds || !mlp_fds)
        return NULL;
    for (;;) {
        struct mlp_sock *s = atomic_load_explicit(&mlp_fds[fd], memory_order_acquire);
        if (ml_likely(!s))
            return NULL;
        atomic_fetch_add(&s->refs, 1);
        if (atomic_load(&mlp_fds[fd]) == s)
            return s;
        mlp_put(s); /* the fd changed under us: try again */
    }
}

void mlp_put(struct mlp_sock *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    mlp_sock_destroy(s);
    pthread_mutex_lock(&mlp_free_mu);
    s->next_free = mlp_free_list;
    mlp_free_list = s;
    pthread_mutex_unlock(&mlp_free_mu);
}

struct mlp_sock *mlp_sock_new(int type)
{
    pthread_mutex_lock(&mlp_free_mu);
    struct mlp_sock *s = mlp_free_list;
    if (s)
        mlp_free_list = s->next_free;
    pthread_mutex_unlock(&mlp_free_mu);
    if (!s && !(s = calloc(1, sizeof *s)))
        return NULL;
    /* refs is never cleared by memset: a thread holding a stale pointer may be incrementing it
     * (it then sees the fd changed and drops its reference).  It is 0 here and 1 for the caller. */
    memset((char *)s + sizeof s->refs, 0, sizeof *s - sizeof s->refs);
    atomic_fetch_add(&s->refs, 1);
    s->type = type;
    s->slot = -1;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

int mlp_install(int fd, struct mlp_sock *s)
{
    if (fd < 0 || fd >= mlp_nfds || !mlp_fds)
        return -EMFILE;
    atomic_fetch_add(&s->refs, 1);
    atomic_fetch_add(&s->nfds, 1);
    struct mlp_sock *old = atomic_exchange(&mlp_fds[fd], s);
    if (old) {
        atomic_fetch_sub(&old->nfds, 1);
        mlp_put(old);
    }
    int m = mlp_maxfd;
    while (fd > m && !atomic_compare_exchange_weak(&mlp_maxfd, &m, fd))
        ;
    return 0;
}

struct mlp_sock *mlp_uninstall(int fd)
{
    if (fd < 0 || fd >= mlp_nfds || !mlp_fds)
        return NULL;
    if (!atomic_load_explicit(&mlp_fds[fd], memory_order_relaxed))
        return NULL;
    struct mlp_sock *s = atomic_exchange(&mlp_fds[fd], NULL);
    if (s)
        atomic_fetch_sub(&s->nfds, 1);
    return s;
}


static void mlp_internal_set(int fd, int *owner)
{
    if (fd < 0 || fd >= mlp_nfds || !mlp_internal)
        return;
    atomic_store(&mlp_owner[fd], owner);
    atomic_fetch_or(&mlp_internal[fd / 64], 1ull << (fd % 64));
}

static void mlp_internal_clear(int fd)
{
    if (fd < 0 || fd >= mlp_nfds || !mlp_internal)
        return;
    atomic_fetch_and(&mlp_internal[fd / 64], ~(1ull << (fd % 64)));
    atomic_store(&mlp_owner[fd], NULL);
}

bool mlp_is_internal_fd(int fd)
{
    return fd >= 0 && fd < mlp_nfds && mlp_internal &&
           (atomic_load_explicit(&mlp_internal[fd / 64], memory_order_relaxed) >> (fd % 64)) & 1;
}

/* *fdp (ours) -> a high number, same open file description (OFD locks stay); remembered as ours. */
void mlp_own_fd(int *fdp, bool cloexec)
{
    int fd = *fdp;
    if (fd < 0)
        return; /* a channel keeps no fd (see __ml_seg_drop_fd) */
    long nfd = __ml_sys_fcntl_dupfd(fd, mlp_high_base, cloexec);
    if (nfd >= 0) {
        __ml_sys_close(fd);
        fd = (int)nfd;
    } else if (!cloexec) {
        __ml_sys_fcntl(fd, F_SETFD, 0);
    }
    *fdp = fd;
    mlp_internal_set(fd, fdp);
}

/* Before closing one of ours. */
void mlp_disown_fd(int fd)
{
    if (fd >= 0)
        mlp_internal_clear(fd);
}

/* The application is about to make fd something else (dup2 onto it): move ours away first. */
int mlp_evict_fd(int fd)
{
    if (!mlp_is_internal_fd(fd))
        return 0;
    int *owner = atomic_load(&mlp_owner[fd]);
    long flags = __ml_sys_fcntl(fd, F_GETFD, 0);
    long nfd = __ml_sys_fcntl_dupfd(fd, mlp_high_base, flags > 0 && (flags & FD_CLOEXEC));
    if (nfd < 0)
        nfd = __ml_sys_fcntl_dupfd(fd, fd + 1, flags > 0 && (flags & FD_CLOEXEC));
    if (nfd < 0)
        return (int)nfd;
    mlp_internal_clear(fd);
    if (owner)
        *owner = (int)nfd;
    mlp_internal_set((int)nfd, owner);
    return 0;
}

/* Set our fd's close-on-exec flag like the application's socket it serves. */
void mlp_own_fd_cloexec(int fd, bool cloexec)
{
    if (fd >= 0 && mlp_is_internal_fd(fd))
        __ml_sys_fcntl(fd, F_SETFD, cloexec ? FD_CLOEXEC : 0);
}
