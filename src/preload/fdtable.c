/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * fdtable.c - the per-fd record (struct mlp_fdrec, preload.h): which file descriptors are
 * accelerated sockets (or memlan listeners) or our own, and what the program set on them.
 *
 * A two-level table indexed by fd holds the records; an fd whose chunk was never needed has no
 * record, and a record's socket pointer is NULL for fds that are not ours, so every interposed
 * call on an ordinary fd costs a load or two and a branch.  dup() makes two
 * entries point at one mlp_sock; each entry and each call in progress holds a reference.
 *
 * Socket objects are type-stable: once allocated they are never returned to malloc, only to a
 * free list, so a thread that loads a pointer just as another thread closes the fd can still
 * take (and then, seeing the entry changed, drop) a reference without touching freed memory.
 *
 * Our own descriptors (segment files, listener records, the log) are moved to high numbers and
 * remembered in their records, so that dup2() onto one of them by the application moves ours away
 * first, and close() of one succeeds and leaves it open: a program that closes every fd that
 * /proc/self/fd lists (chromium; systemd's close loop asserts that no close says EBADF) sees each
 * close it made succeed, as each fd it listed was open.
 */
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <time.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* The table (preload.h, mlp_fdrec, which reads these two inline). */
struct mlp_fdrec *_Atomic *mlp_fdtop;
int mlp_nfds; /* fds the table can hold */
static _Atomic int mlp_maxfd = -1;         /* highest fd that ever had a record */
static int mlp_high_base = 64;
static pthread_mutex_t mlp_free_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mlp_sock *mlp_free_list;

void mlp_fdtable_init(void)
{
    struct rlimit rl;
    rlim_t n = 1u << 20;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        mlp_nofile_note(rl.rlim_cur);
        if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > n)
            n = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 30 : rl.rlim_max;
        if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 2 > 64)
            mlp_high_base = (int)(rl.rlim_cur / 2);
    }
    if (n > ((rlim_t)1 << 30)) /* the kernel's nr_open ceiling */
        n = (rlim_t)1 << 30;
    size_t ntop = ((size_t)n + MLP_FDCHUNK - 1) >> MLP_FDCHUNK_SHIFT;
    void *p;
    if (__ml_sys_mmap(&p, NULL, ntop * sizeof(void *), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) < 0)
        return;
    mlp_fdtop = p;
    mlp_nfds = (int)(ntop << MLP_FDCHUNK_SHIFT);
}

struct mlp_fdrec *mlp_fdrec_make(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (r || (unsigned)fd >= (unsigned)mlp_nfds || !mlp_fdtop)
        goto out;
    void *p;
    if (__ml_sys_mmap(&p, NULL, MLP_FDCHUNK * sizeof(struct mlp_fdrec), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) < 0)
        return NULL;
    struct mlp_fdrec *want = NULL;
    if (!atomic_compare_exchange_strong(&mlp_fdtop[fd >> MLP_FDCHUNK_SHIFT], &want,
                                        (struct mlp_fdrec *)p))
        __ml_sys_munmap(p, MLP_FDCHUNK * sizeof(struct mlp_fdrec)); /* another thread's won */
    else
        mlp_lsan_root(p, MLP_FDCHUNK * sizeof(struct mlp_fdrec));
    r = mlp_fdrec(fd);
out:
    if (r) {
        int m = mlp_maxfd;
        while (fd > m && !atomic_compare_exchange_weak(&mlp_maxfd, &m, fd))
            ;
    }
    return r;
}

/* The next fd at or after fd, up to max, that may have a record (chunks that exist). */
int mlp_fdrec_next(int fd, int max)
{
    if (max > mlp_maxfd)
        max = mlp_maxfd;
    while (fd >= 0 && fd <= max) {
        if (mlp_fdrec(fd))
            return fd;
        fd = ((fd >> MLP_FDCHUNK_SHIFT) + 1) << MLP_FDCHUNK_SHIFT;
    }
    return -1;
}

bool mlp_fdrec_busy(const struct mlp_fdrec *r)
{
    return r && (atomic_load_explicit(&r->sock, memory_order_relaxed) ||
                 atomic_load_explicit(&r->owner, memory_order_relaxed) ||
                 atomic_load_explicit(&r->linger0, memory_order_relaxed) ||
                 atomic_load_explicit(&r->epfd, memory_order_relaxed) ||
                 atomic_load_explicit(&r->bufhint[0], memory_order_relaxed) ||
                 atomic_load_explicit(&r->bufhint[1], memory_order_relaxed) ||
                 atomic_load_explicit(&r->tcp_slot, memory_order_relaxed) ||
                 atomic_load_explicit(&r->tcp_pending, memory_order_relaxed) ||
                 atomic_load_explicit(&r->received, memory_order_relaxed) ||
                 atomic_load_explicit(&r->rcvlowat, memory_order_relaxed) ||
                 atomic_load_explicit(&r->kep, memory_order_relaxed));
}

int mlp_fd_max(void) { return mlp_maxfd; }

bool mlp_fd_is_ours(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    return r && atomic_load_explicit(&r->sock, memory_order_relaxed);
}

/*
 * For a data call (read, write, send, recv and their kin): does fd name one of our sockets?  A
 * close of one of our connections releases the fd's record before the kernel's close (so that a
 * number the kernel gives again is never taken for ours), and a call another thread started in
 * between saw no record and went to the kernel socket under the channel: its bytes went into a
 * socket nobody reads (the stream split, and a blocking send then waited for ever), or it read
 * from one nobody writes.  The close marks the record (closing) first; a call that finds it so
 * waits for the kernel's close and then looks again: the fd is closed (the kernel says EBADF, as
 * to a call after a close) or names what was opened there since.  A handler on top of the close
 * of its own thread does not wait (the call is after the close, as far as it can know), nor one
 * on top of a call of ours that holds a lock (below).
 */
#define MLP_CLOSING_WAIT_NS 2000000000ull

bool mlp_fd_is_ours_call(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (!r)
        return false;
    if (ml_likely(atomic_load_explicit(&r->sock, memory_order_acquire) != NULL))
        return true;
    uint32_t c = atomic_load_explicit(&r->closing, memory_order_acquire);
    if (ml_likely(c == 0)) {
        /* received over SCM_RIGHTS and not looked at yet: a connection passed to us? */
        if (ml_unlikely(atomic_load_explicit(&r->received, memory_order_relaxed) & 1))
            return mlp_take_passed(fd);
        return false;
    }
    /* Nor does a handler on top of a call of ours that holds a lock (a fast word): the close
     * may be waiting for that very lock (its teardown takes the words, mlp_sock_destroy), and
     * the handler's thread cannot give it back before the handler returns. */
    if (mlp_holds_lock())
        return false;
    /* And never for ever: a close can wait for a lock this thread holds that no list of ours
     * counts (a handler on top of a section under mlp_epmu or a socket's mu, while the close
     * needs it).  Past MLP_CLOSING_WAIT_NS the call goes on as before the mark existed: to the
     * kernel socket (design.md, Limits). */
    uint32_t me = mlp_thread_id();
    uint64_t until = 0;
    while (c != 0 && (c & ~MLP_CLOSING_WAITERS) != me) {
        if (!(c & MLP_CLOSING_WAITERS) &&
            !atomic_compare_exchange_strong(&r->closing, &c, c | MLP_CLOSING_WAITERS))
            continue;
        uint64_t now = mlp_now_ns();
        if (!until)
            until = now + MLP_CLOSING_WAIT_NS;
        else if (now >= until)
            return false;
        int saved = errno;
        (void)__ml_sys_futex_wait(&r->closing, c | MLP_CLOSING_WAITERS, (int64_t)(until - now));
        errno = saved;
        c = atomic_load_explicit(&r->closing, memory_order_acquire);
    }
    return atomic_load_explicit(&r->sock, memory_order_acquire) != NULL;
}

/* A reference to fd's socket (NULL: none).  slot (mlp_get_slot): the cleanup record of a call,
 * written right after the count, so that a jump leaves at most the instruction between the two
 * (a leak at worst, never a put of a reference not taken). */
static inline struct mlp_sock *mlp_get_into(int fd, struct mlp_sock *volatile *slot)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (ml_likely(!r))
        return NULL;
    for (;;) {
        struct mlp_sock *s = atomic_load_explicit(&r->sock, memory_order_acquire);
        if (ml_likely(!s))
            return NULL;
        /* Never up from 0: a socket whose last reference went is being torn down (a thread
         * that loaded it just before its close and added after the teardown's put would put it
         * a second time: two teardowns).  Its record is gone by then: look again. */
        int v = atomic_load_explicit(&s->refs, memory_order_relaxed);
        do {
            if (v == 0)
                break;
        } while (!atomic_compare_exchange_weak(&s->refs, &v, v + 1));
        if (v == 0)
            continue;
        if (slot)
            *slot = s;
        if (atomic_load(&r->sock) == s)
            return s;
        if (slot)
            *slot = NULL;
        mlp_put(s); /* the fd changed under us: try again */
    }
}

struct mlp_sock *mlp_get(int fd) { return mlp_get_into(fd, NULL); }

struct mlp_sock *mlp_get_slot(int fd, struct mlp_sock *volatile *slot)
{
    return mlp_get_into(fd, slot);
}

void mlp_put(struct mlp_sock *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (mlp_fast_defer(s))
        return;
    mlp_sock_finish(s);
}

/* Records a close from a signal handler finished while the free list's lock was held, perhaps by
 * the very thread the handler interrupted (in mlp_sock_new: it waited for itself for ever,
 * tests/preload/exithandler.c close).  Pushed without a lock; taken in one exchange under the
 * lock by the next mlp_sock_new (a push-only stack emptied whole has no ABA). */
static struct mlp_sock *_Atomic mlp_free_pending;

void mlp_sock_finish(struct mlp_sock *s)
{
    mlp_sock_destroy(s);
    if (mlp_sig_in_handler() && pthread_mutex_trylock(&mlp_free_mu) != 0) {
        struct mlp_sock *h = atomic_load(&mlp_free_pending);
        do
            s->next_free = h;
        while (!atomic_compare_exchange_weak(&mlp_free_pending, &h, s));
        return;
    } else if (!mlp_sig_in_handler()) {
        pthread_mutex_lock(&mlp_free_mu);
    }
    s->next_free = mlp_free_list;
    mlp_free_list = s;
    pthread_mutex_unlock(&mlp_free_mu);
}

struct mlp_sock *mlp_sock_new(int type)
{
    __ml_free_later_run(); /* what handlers freed (a server that closes only in them) */
    pthread_mutex_lock(&mlp_free_mu);
    if (ml_unlikely(atomic_load_explicit(&mlp_free_pending, memory_order_relaxed))) {
        struct mlp_sock *p = atomic_exchange(&mlp_free_pending, NULL);
        while (p) {
            struct mlp_sock *next = p->next_free;
            p->next_free = mlp_free_list;
            mlp_free_list = p;
            p = next;
        }
    }
    struct mlp_sock *s = mlp_free_list;
    if (s)
        mlp_free_list = s->next_free;
    pthread_mutex_unlock(&mlp_free_mu);
    if (!s && !(s = calloc(1, sizeof *s)))
        return NULL;
    /* refs is never cleared by memset: a thread holding a stale pointer may be incrementing it
     * (it then sees the fd changed and drops its reference).  It is 0 here and 1 for the caller.
     * Nor are the fast words, which such a thread may hold or wait for (sock.c). */
    memset((char *)s + sizeof s->refs, 0, offsetof(struct mlp_sock, fast_pad0) - sizeof s->refs);
    atomic_fetch_add(&s->refs, 1);
    s->type = type;
    s->slot = -1;
    s->sio_fd = s->sio_wfd = s->urg_fd = s->urg_wfd = -1;
    pthread_mutex_init(&s->mu, NULL);
    mlp_locks_init(s);
    return s;
}

/*
 * The fork gate.  The prepare handler counts every socket in the table as held by the child to
 * be (sock.c, mlp_holders_add): a socket installed during that scan would be inherited uncounted,
 * and one uninstalled during it could have its last reference dropped by the scan itself, its
 * teardown then run inside the prepare handler.  So installs and uninstalls (short, they never
 * block) pass a gate: the prepare handler closes it and waits for those in progress to finish,
 * and those that come meanwhile wait for the fork to be done (the parent and child handlers open
 * it).  Nothing is locked: a thread that forks from a handler while it is itself inside the gate
 * (fork is async-signal-safe) waits only for the others, and a handler that installs on the
 * forking thread during the scan goes through (its socket may be inherited uncounted, the old
 * behaviour).  A handler that interrupted its thread inside the gate (depth > 0: close, accept,
 * dup2 are async-signal-safe) goes through while the prepare handler is still waiting for the
 * gate to drain (it waits for that very thread, which cannot leave until the handler returns:
 * the handler used to wait for the gate to open, a deadlock), and its count joins the ones the
 * prepare handler waits for; once the scan has begun it waits for the gate to open as any other
 * (its thread then holds no count: the scan began only once the counts drained).  The prepare
 * handler says that it scans (scanning) and then looks at the counts once more, so a handler
 * that counted itself just before is waited for.
 */
static _Atomic int mlp_gate_busy;      /* installs and uninstalls in progress */
static _Atomic bool mlp_gate_closed;   /* a prepare handler is counting */
static _Atomic bool mlp_gate_scanning; /* ... and has begun its scan */
static __thread int mlp_gate_depth __attribute__((tls_model("initial-exec")));
static __thread bool mlp_gate_forker __attribute__((tls_model("initial-exec")));

static void mlp_gate_enter(void)
{
    for (;;) {
        mlp_gate_depth++; /* first: a handler that comes next knows its thread is inside */
        atomic_fetch_add(&mlp_gate_busy, 1);
        if (ml_likely(!atomic_load(&mlp_gate_closed)) || mlp_gate_forker)
            return;
        if (mlp_gate_depth > 1 && !atomic_load(&mlp_gate_scanning))
            return; /* a handler on a thread inside: the prepare handler waits for us both */
        atomic_fetch_sub(&mlp_gate_busy, 1);
        mlp_gate_depth--;
        while (atomic_load(&mlp_gate_closed)) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

static void mlp_gate_leave(void)
{
    atomic_fetch_sub(&mlp_gate_busy, 1);
    mlp_gate_depth--;
}

void mlp_fork_gate_close(void)
{
    mlp_gate_forker = true;
    atomic_store(&mlp_gate_closed, true);
    /* Wait for the others' installs and uninstalls in progress (a few instructions each); then
     * say that the scan begins and look again (seq_cst, as the entering side's count and its
     * look at scanning): a handler that counted itself before seeing it is waited for too. */
    for (;;) {
        for (unsigned i = 0; atomic_load(&mlp_gate_busy) > mlp_gate_depth; i++)
            __ml_brief_wait(i);
        atomic_store(&mlp_gate_scanning, true);
        if (atomic_load(&mlp_gate_busy) <= mlp_gate_depth)
            break;
        atomic_store(&mlp_gate_scanning, false);
    }
}

void mlp_fork_gate_open(bool child)
{
    if (child) { /* the other threads, in the middle or not, are not in the child */
        atomic_store(&mlp_gate_busy, mlp_gate_depth);
        /* A parent's thread may have held the free list's lock at the fork, or a free socket's
         * fast word for a moment (a stale pointer's take, sock.c: mlp_fast_begin): neither is
         * held by anybody here. */
        pthread_mutex_init(&mlp_free_mu, NULL);
        /* Nor is a close that was between its record's release and the kernel's close: its mark
         * would keep every data call on the number waiting for ever (mlp_fd_is_ours_call). */
        for (int fd = mlp_fdrec_next(0, INT_MAX); fd >= 0; fd = mlp_fdrec_next(fd + 1, INT_MAX))
            atomic_store_explicit(&mlp_fdrec(fd)->closing, 0, memory_order_relaxed);
        for (struct mlp_sock *s = mlp_free_list; s; s = s->next_free) {
            atomic_store_explicit(&s->ftx, 0, memory_order_relaxed);
            atomic_store_explicit(&s->frx, 0, memory_order_relaxed);
        }
    }
    atomic_store(&mlp_gate_scanning, false);
    atomic_store(&mlp_gate_closed, false);
    mlp_gate_forker = false;
}

int mlp_install(int fd, struct mlp_sock *s)
{
    struct mlp_fdrec *r = mlp_fdrec_make(fd);
    if (!r)
        return -EMFILE;
    mlp_gate_enter();
    atomic_fetch_add(&s->refs, 1);
    atomic_fetch_add(&s->nfds, 1);
    struct mlp_sock *old = atomic_exchange(&r->sock, s);
    if (old)
        atomic_fetch_sub(&old->nfds, 1);
    mlp_gate_leave();
    if (old)
        mlp_put(old);
    return 0;
}

struct mlp_sock *mlp_uninstall(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (!r || !atomic_load_explicit(&r->sock, memory_order_relaxed))
        return NULL;
    mlp_gate_enter();
    struct mlp_sock *s = atomic_exchange(&r->sock, NULL);
    if (s)
        atomic_fetch_sub(&s->nfds, 1);
    mlp_gate_leave();
    return s;
}

static void mlp_internal_set(int fd, int *owner)
{
    struct mlp_fdrec *r = mlp_fdrec_make(fd);
    if (r)
        atomic_store(&r->owner, owner);
}

static void mlp_internal_clear(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    if (r)
        atomic_store(&r->owner, NULL);
}

bool mlp_is_internal_fd(int fd)
{
    struct mlp_fdrec *r = mlp_fdrec(fd);
    return r && atomic_load_explicit(&r->owner, memory_order_relaxed);
}

/* A duplicate of fd at our high numbers (half the soft limit), or -errno.  A soft limit lowered
 * since start-up (a daemon's own, lower one) lowers the base with it: before, our
 * fds stayed where they were opened, a number the program had closed (its stdout) and took for
 * free (a write to it returned EINVAL, from our eventfd, where the kernel says EBADF).  A
 * limit lowered by a raw system call is not seen. */
static long mlp_dup_high(int fd, bool cloexec)
{
    long h = __ml_sys_fcntl_dupfd(fd, mlp_high_base, cloexec);
    /* The limit as our setrlimit and prlimit interposers noted it: no system call here, which a
     * sandbox installed since may not allow. */
    long cur = mlp_nofile_now();
    if (h == -EINVAL && cur / 2 > 2 && mlp_high_base > cur / 2) {
        mlp_high_base = (int)(cur / 2);
        h = __ml_sys_fcntl_dupfd(fd, mlp_high_base, cloexec);
    }
    return h;
}

/* *fdp (ours) -> a high number, same open file description (OFD locks stay); remembered as ours. */
void mlp_own_fd(int *fdp, bool cloexec)
{
    int fd = *fdp;
    if (fd < 0)
        return; /* a channel keeps no fd (see __ml_seg_drop_fd) */
    long nfd = mlp_dup_high(fd, cloexec);
    if (nfd >= 0) {
        __ml_sys_close(fd);
        fd = (int)nfd;
    } else if (!cloexec) {
        __ml_sys_fcntl(fd, F_SETFD, 0);
    }
    *fdp = fd;
    mlp_internal_set(fd, fdp);
}

/* fd (taken) -> a duplicate at our high numbers, or -1 (fd closed) where none can be made: for
 * an fd of ours that must never sit at a number the program may take for free. */
int mlp_fd_to_high(int fd)
{
    long h = mlp_dup_high(fd, true);
    __ml_sys_close(fd);
    return h >= 0 ? (int)h : -1;
}

/*
 * A call that wakes other threads of the program and then acts on the kernel socket (shutdown:
 * the ring's end first, then the kernel's shutdown) must not act by the number: a woken reader
 * may close it and open another socket there meanwhile, and the kernel's shutdown then went to
 * that one (Boost.Asio's shutdown posted to one thread while another's read was pending: the
 * new connection's send failed with EPIPE, or the shutdown itself with EBADF or ENOTCONN; the
 * kernel's shutdown acts on the file, which a close by another thread does not take from it).
 * So the call holds the file: a duplicate at our high numbers, ours for the call (the
 * program's close of that number, or its close_range, leaves it), closed at its end; the
 * number itself where none can be made (no slot free, the fd limit, a vfork child, a known
 * sandbox, whose filter may kill for fcntl).  A fork child closes the ones its parent's threads
 * held (the threads are not there): each is made and noted inside the fork gate.
 */
#define MLP_HELD_MAX 8
static int mlp_held_fd[MLP_HELD_MAX];         /* the held fd (moved by mlp_evict_fd), -1 */
static ino_t mlp_held_ino[MLP_HELD_MAX];      /* its file's inode, made sure of before each use */
static _Atomic bool mlp_held_used[MLP_HELD_MAX];

/* Our mark on h goes, if it is the slot's (h may be another fd of ours by now). */
static void mlp_held_unmark(int slot, int h)
{
    struct mlp_fdrec *r = mlp_fdrec(h);
    int *mine = &mlp_held_fd[slot];
    if (r)
        atomic_compare_exchange_strong(&r->owner, &mine, NULL);
}

/* Is the held fd of slot still the file we made it for?  A close_range of another thread's that
 * scanned our marks before the duplicate was marked closes it as the program's (a review: 275
 * shutdowns of 3000 failed with EBADF); its number may be another file's since. */
static bool mlp_held_same(int slot, int h)
{
    struct stat st;
    return h >= 0 && __ml_sys_fstat(h, &st) == 0 && st.st_ino == mlp_held_ino[slot];
}

int mlp_hold_file(int fd, int *slot)
{
    *slot = -1;
    if (mlp_vfork_child() || mlp_known_confined())
        return fd;
    for (int i = 0; i < MLP_HELD_MAX; i++) {
        bool no = false;
        if (atomic_load_explicit(&mlp_held_used[i], memory_order_relaxed) ||
            !atomic_compare_exchange_strong(&mlp_held_used[i], &no, true))
            continue;
        int saved = errno;
        /* Inside the fork gate: a fork waits for the duplicate to be noted, and its child
         * closes it (a review: 0.4% of forks made meanwhile gave the child the copy). */
        mlp_gate_enter();
        __atomic_store_n(&mlp_held_fd[i], -1, __ATOMIC_RELAXED);
        long h = mlp_dup_high(fd, true);
        struct stat st;
        if (h >= 0 && __ml_sys_fstat((int)h, &st) < 0) {
            __ml_sys_close((int)h);
            h = -1;
        }
        if (h >= 0) {
            mlp_held_ino[i] = st.st_ino;
            __atomic_store_n(&mlp_held_fd[i], (int)h, __ATOMIC_RELEASE);
            mlp_internal_set((int)h, &mlp_held_fd[i]);
        }
        mlp_gate_leave();
        errno = saved;
        if (h < 0) {
            atomic_store(&mlp_held_used[i], false);
            return fd;
        }
        *slot = i;
        return (int)h;
    }
    return fd;
}

int mlp_held_fd_now(int slot, int fd)
{
    if (slot < 0)
        return fd;
    int saved = errno;
    int h = __atomic_load_n(&mlp_held_fd[slot], __ATOMIC_ACQUIRE); /* moved by an eviction */
    bool same = mlp_held_same(slot, h);
    errno = saved;
    return same ? h : fd; /* taken from us: the number, as before the hold */
}

void mlp_hold_release(int slot)
{
    if (slot < 0)
        return;
    int saved = errno;
    int h = __atomic_load_n(&mlp_held_fd[slot], __ATOMIC_ACQUIRE);
    if (h >= 0) {
        bool same = mlp_held_same(slot, h);
        mlp_held_unmark(slot, h);
        if (same)
            __ml_sys_close(h); /* else closed under us, perhaps another file's number now */
    }
    __atomic_store_n(&mlp_held_fd[slot], -1, __ATOMIC_RELAXED);
    atomic_store(&mlp_held_used[slot], false);
    errno = saved;
}

void mlp_hold_after_fork(void)
{
    for (int i = 0; i < MLP_HELD_MAX; i++) {
        if (!atomic_load(&mlp_held_used[i]))
            continue;
        int h = __atomic_load_n(&mlp_held_fd[i], __ATOMIC_ACQUIRE);
        if (h >= 0) {
            bool same = mlp_held_same(i, h);
            mlp_held_unmark(i, h);
            if (same)
                __ml_sys_close(h);
        }
        __atomic_store_n(&mlp_held_fd[i], -1, __ATOMIC_RELAXED);
        atomic_store(&mlp_held_used[i], false);
    }
}

/* *fdp, at our high numbers already (mlp_fd_to_high), remembered as ours where it lies. */
void mlp_own_fd_at(int *fdp)
{
    if (*fdp >= 0)
        mlp_internal_set(*fdp, fdp);
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
    int *owner = atomic_load(&mlp_fdrec(fd)->owner);
    long flags = __ml_sys_fcntl(fd, F_GETFD, 0);
    long nfd = mlp_dup_high(fd, flags > 0 && (flags & FD_CLOEXEC));
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
