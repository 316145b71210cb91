/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sys.c - raw system call wrappers (see sys.h for the convention).
 *
 * Each wrapper saves errno, makes the call, turns a failure into -errno and puts errno back, so
 * code above this file never reads or writes errno.
 */
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long ml_syscall_ret(long r, int saved)
{
    if (r < 0)
        r = -errno;
    errno = saved;
    return r;
}

#define SYS_CALL(...)                                                                          \
    ({                                                                                         \
        int saved__ = errno;                                                                   \
        long r__ = syscall(__VA_ARGS__);                                                       \
        ml_syscall_ret(r__, saved__);                                                          \
    })

long __ml_sys_open(int dirfd, const char *path, int flags, mode_t mode)
{
    return SYS_CALL(SYS_openat, dirfd, path, flags | O_CLOEXEC, mode);
}

long __ml_sys_raw(long n, long a, long b, long c, long d, long e, long f)
{
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return r;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory", "cc");
    return x0;
#else
    return SYS_CALL(n, a, b, c, d, e, f); /* the preload does not interpose syscall() here */
#endif
}

int __ml_sys_close(int fd) { return (int)__ml_sys_raw(SYS_close, fd, 0, 0, 0, 0, 0); }

long __ml_sys_fcntl(int fd, int cmd, long arg) { return SYS_CALL(SYS_fcntl, fd, cmd, arg); }

long __ml_sys_fcntl_dupfd(int fd, int min, bool cloexec)
{
    return SYS_CALL(SYS_fcntl, fd, cloexec ? F_DUPFD_CLOEXEC : F_DUPFD, min);
}

int __ml_sys_unix_listening(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    if (n >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, n + 1);
    long s = SYS_CALL(SYS_socket, AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return (int)s;
    long rc = SYS_CALL(SYS_connect, (int)s, &sa, sizeof sa);
    __ml_sys_close((int)s);
    if (rc == 0 || rc == -EAGAIN || rc == -EINPROGRESS)
        return 1;
    return rc == -ECONNREFUSED || rc == -ENOTSOCK || rc == -EPROTOTYPE || rc == -ENOENT
               ? 0 : (int)rc;
}

int __ml_sys_socket(int domain, int type, int proto)
{
    return (int)SYS_CALL(SYS_socket, domain, type, proto);
}

int __ml_sys_bind(int fd, const void *sa, size_t len)
{
    return (int)SYS_CALL(SYS_bind, fd, sa, (socklen_t)len);
}

int __ml_sys_listen(int fd, int backlog) { return (int)SYS_CALL(SYS_listen, fd, backlog); }

int __ml_sys_accept4(int fd, int flags)
{
    return (int)SYS_CALL(SYS_accept4, fd, NULL, NULL, flags);
}

int __ml_sys_connect(int fd, const void *sa, size_t len)
{
    return (int)SYS_CALL(SYS_connect, fd, sa, (socklen_t)len);
}

ssize_t __ml_sys_send(int fd, const void *buf, size_t len)
{
    return SYS_CALL(SYS_sendto, fd, buf, len, MSG_NOSIGNAL, NULL, 0);
}

/* The credentials of a Unix socket's peer, as the kernel took them at connect (SO_PEERCRED). */
int __ml_sys_peer_uid(int fd, uint32_t *uid)
{
    struct ucred uc;
    socklen_t len = sizeof uc;
    long r = SYS_CALL(SYS_getsockopt, fd, SOL_SOCKET, SO_PEERCRED, &uc, &len);
    if (r < 0)
        return (int)r;
    if (len < sizeof uc)
        return -EPROTO;
    *uid = (uint32_t)uc.uid;
    return 0;
}

ssize_t __ml_sys_recv(int fd, void *buf, size_t len)
{
    return SYS_CALL(SYS_recvfrom, fd, buf, len, 0, NULL, NULL);
}

int __ml_sys_poll1(int fd, short events, int timeout_ms)
{
    struct pollfd pf = {fd, events, 0};
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
    return (int)SYS_CALL(SYS_ppoll, &pf, 1, timeout_ms < 0 ? NULL : &ts, NULL, 0);
}

int __ml_sys_epoll_create(void) { return (int)SYS_CALL(SYS_epoll_create1, EPOLL_CLOEXEC); }

int __ml_sys_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data)
{
    struct epoll_event ev = {.events = events, .data.u64 = data};
    return (int)SYS_CALL(SYS_epoll_ctl, epfd, op, fd, &ev);
}

int __ml_sys_epoll_wait(int epfd, void *events, int max, int timeout_ms)
{
    return (int)SYS_CALL(SYS_epoll_pwait, epfd, events, max, timeout_ms, NULL, 0);
}

int __ml_sys_linkat(int olddir, const char *oldpath, int newdir, const char *newpath)
{
    return (int)SYS_CALL(SYS_linkat, olddir, oldpath, newdir, newpath, 0);
}

ssize_t __ml_sys_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    return SYS_CALL(SYS_pwrite64, fd, buf, len, off);
}

ssize_t __ml_sys_read(int fd, void *buf, size_t len) { return SYS_CALL(SYS_read, fd, buf, len); }

ssize_t __ml_sys_write(int fd, const void *buf, size_t len)
{
    return SYS_CALL(SYS_write, fd, buf, len);
}

/* A write into a pipe or FIFO whose reader may be gone, that never raises SIGPIPE in the host:
 * SIGPIPE is blocked for this thread around the write, and one that the write itself made
 * pending (it was not pending before) is taken back before the mask is restored.  Costs three
 * system calls more than a write: for writes whose reader may be of another user only. */
ssize_t __ml_sys_write_nosigpipe(int fd, const void *buf, size_t len)
{
    sigset_t pipe, old, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigemptyset(&pending);
    if (SYS_CALL(SYS_rt_sigprocmask, SIG_BLOCK, &pipe, &old, _NSIG / 8) < 0)
        return -EPERM; /* cannot make it safe: do not write */
    /* Only a thread that blocked SIGPIPE itself can have one pending already; otherwise no
     * rt_sigpending, which a sandbox (sshd's) may kill on. */
    bool had = sigismember(&old, SIGPIPE) &&
               SYS_CALL(SYS_rt_sigpending, &pending, _NSIG / 8) == 0 &&
               sigismember(&pending, SIGPIPE);
    ssize_t r = SYS_CALL(SYS_write, fd, buf, len);
    if (r == -EPIPE && !had) {
        struct timespec zero = {0, 0};
        (void)SYS_CALL(SYS_rt_sigtimedwait, &pipe, NULL, &zero, _NSIG / 8);
    }
    (void)SYS_CALL(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, _NSIG / 8);
    return r;
}

ssize_t __ml_sys_pread(int fd, void *buf, size_t len, off_t off)
{
    return SYS_CALL(SYS_pread64, fd, buf, len, off);
}

int __ml_sys_ftruncate(int fd, off_t len) { return (int)SYS_CALL(SYS_ftruncate, fd, len); }

/* posix_fallocate's semantics (mode 0): the blocks are reserved now and the size grows to cover
 * them, so a later store to a mapping of the range cannot fault for want of space.  A file system
 * out of room answers -ENOSPC here (EFBIG and EDQUOT are reported as -ENOSPC too: for our callers
 * they all mean "the fabric is full"). */
int __ml_sys_fallocate(int fd, off_t off, off_t len)
{
    int r = (int)SYS_CALL(SYS_fallocate, fd, 0, off, len);
    return r == -EFBIG || r == -EDQUOT ? -ENOSPC : r;
}

int __ml_sys_fchmodat(int dirfd, const char *path, mode_t mode)
{
    return (int)SYS_CALL(SYS_fchmodat, dirfd, path, mode);
}

int __ml_sys_fchmod(int fd, mode_t mode) { return (int)SYS_CALL(SYS_fchmod, fd, mode); }

int __ml_sys_fstat(int fd, struct stat *st) { return (int)SYS_CALL(SYS_fstat, fd, st); }

int __ml_sys_fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    return (int)SYS_CALL(SYS_newfstatat, dirfd, path, st, flags);
}

int __ml_sys_unlinkat(int dirfd, const char *path, int flags)
{
    return (int)SYS_CALL(SYS_unlinkat, dirfd, path, flags);
}

int __ml_sys_mkdir(const char *path, mode_t mode)
{
    return (int)SYS_CALL(SYS_mkdirat, AT_FDCWD, path, mode);
}

int __ml_sys_mknodat(int dirfd, const char *path, mode_t mode)
{
    return (int)SYS_CALL(SYS_mknodat, dirfd, path, mode, 0);
}

int __ml_sys_mmap(void **out, void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    int saved = errno;
    void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (p == MAP_FAILED) {
        int e = errno;
        errno = saved;
        return -e;
    }
    errno = saved;
    *out = p;
    return 0;
}

int __ml_sys_munmap(void *p, size_t len) { return (int)SYS_CALL(SYS_munmap, p, len); }

int __ml_sys_madvise(void *p, size_t len, int advice)
{
    return (int)SYS_CALL(SYS_madvise, p, len, advice);
}

int __ml_sys_getrandom(void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        long r = SYS_CALL(SYS_getrandom, (char *)buf + got, len - got, 0);
        if (r == -EINTR)
            continue;
        if (r < 0)
            return (int)r;
        got += (size_t)r;
    }
    return 0;
}

int __ml_sys_lock_byte(int fd, off_t byte, int wait)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    for (;;) {
        long r = SYS_CALL(SYS_fcntl, fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
        if (r == -EINTR)
            continue;
        if (r == -EACCES)
            r = -EAGAIN;
        return (int)r;
    }
}

int __ml_sys_lock_range(int fd, off_t start, off_t len)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    long r;
    do
        r = SYS_CALL(SYS_fcntl, fd, F_OFD_SETLK, &fl);
    while (r == -EINTR);
    return r == -EACCES ? -EAGAIN : (int)r;
}

/* A transient lock goes by this, never by the close alone: an OFD lock lives as long as any
 * descriptor of its open file, and a fork or vfork made by another thread between our open and
 * our close gives the child a copy that holds it until the child's exec or end. */
int __ml_sys_unlock_range(int fd, off_t start, off_t len)
{
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    long r;
    do
        r = SYS_CALL(SYS_fcntl, fd, F_OFD_SETLK, &fl);
    while (r == -EINTR);
    return (int)r;
}

int __ml_sys_lock_byte_shared(int fd, off_t byte)
{
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    long r;
    do
        r = SYS_CALL(SYS_fcntl, fd, F_OFD_SETLK, &fl);
    while (r == -EINTR);
    return r == -EACCES ? -EAGAIN : (int)r;
}

int __ml_sys_byte_held(int fd, off_t byte)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    long r = SYS_CALL(SYS_fcntl, fd, F_OFD_GETLK, &fl);
    if (r < 0)
        return (int)r;
    return fl.l_type != F_UNLCK;
}

int __ml_sys_futex_wait(_Atomic uint32_t *word, uint32_t expect, int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        tsp = &ts;
    }
    long r = SYS_CALL(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, tsp, NULL, 0);
    if (__builtin_expect(r == -ENOSYS || r == -EPERM || r == -EACCES, 0)) {
        /* A sandbox refused futex (seccomp with ERRNO, gVisor-like kernels): the waiter naps a
         * millisecond at most and says it timed out, so that every caller looks again (and
         * checks its peer's liveness) as it would after a real timeout.  Never a busy loop. */
        struct timespec nap = {0, 1000000};
        if (timeout_ns >= 0 && timeout_ns < 1000000)
            nap.tv_nsec = (long)timeout_ns;
        /* The system call, not libc's clock_nanosleep, which is a cancellation point: callers
         * hold locks (a fork's prepare handler among them) that a cancellation must not
         * abandon. */
        if (atomic_load_explicit(word, memory_order_relaxed) == expect)
            (void)SYS_CALL(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &nap, NULL);
        r = -ETIMEDOUT;
    }
    return (int)r;
}

int __ml_sys_membarrier(int cmd)
{
#ifdef SYS_membarrier
    return (int)SYS_CALL(SYS_membarrier, cmd, 0, 0);
#else
    (void)cmd;
    return -ENOSYS;
#endif
}

int __ml_sys_futex_wake(_Atomic uint32_t *word, int n)
{
    return (int)SYS_CALL(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* A zero-timeout ppoll of fd, still the socket of inode ino: its revents, or -errno (-EBADF when
 * fd is no longer that socket).  A sandbox may refuse fstat (sshd's denies it with EACCES): then
 * the number is taken on trust.  The risk: a program that closed it through a path we do not
 * see and got another file at that number whose poll answers would have it read as ours; a
 * sandboxed process rarely opens anything.  ppoll, not recvfrom: sshd's filter allows it. */
static bool ml_socket_is(int fd, uint64_t ino)
{
    struct stat st;
    if (fd < 0)
        return false;
    int r0 = __ml_sys_fstat(fd, &st);
    return r0 == 0 ? S_ISSOCK(st.st_mode) && (uint64_t)st.st_ino == ino
                   : r0 == -EACCES || r0 == -EPERM || r0 == -ENOSYS;
}

static int ml_socket_revents(int fd, uint64_t ino)
{
    if (!ml_socket_is(fd, ino))
        return -EBADF;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    struct timespec zero = {0, 0};
    long r = SYS_CALL(SYS_ppoll, &p, 1, &zero, NULL, 0);
    return r < 0 ? (int)r : p.revents;
}

int __ml_sys_socket_hup(int fd, uint64_t ino)
{
    int ev = ml_socket_revents(fd, ino);
    return ev < 0 ? ev : (ev & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* Has the peer of the TCP socket fd (still the socket of inode ino) sent its FIN, or reset it?
 * 1 yes, 0 no, -errno.  Asked of the connection's state (TCP_INFO), not of poll, whose RDHUP
 * our own shutdown(SHUT_RD) raises too: a peer taken for gone by it was alive and reading
 * (tests/preload/exitrace.c, "peershutrd").  Only for that case: a sandbox that allows ppoll
 * may not expect getsockopt. */
int __ml_sys_socket_peer_fin(int fd, uint64_t ino)
{
    if (!ml_socket_is(fd, ino))
        return -EBADF;
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    long r = SYS_CALL(SYS_getsockopt, fd, IPPROTO_TCP, TCP_INFO, &ti, &len);
    if (r < 0)
        return (int)r;
    if (len < 1)
        return -EPROTO;
    switch (ti.tcpi_state) {
    case TCP_CLOSE_WAIT:
    case TCP_LAST_ACK:
    case TCP_CLOSING:
    case TCP_TIME_WAIT:
    case TCP_CLOSE:
        return 1;
    default:
        return 0;
    }
}

/* Bytes waiting on the kernel socket fd (still the socket of inode ino), with no end of stream
 * behind them: 1 yes, 0 no, -errno.  POLLIN without POLLRDHUP can only be data. */
int __ml_sys_socket_data(int fd, uint64_t ino)
{
    int ev = ml_socket_revents(fd, ino);
    return ev < 0 ? ev : (ev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == POLLIN;
}

int __ml_sys_socket_netns(int fd, uint64_t *ino)
{
    long ns = SYS_CALL(SYS_ioctl, fd, SIOCGSKNS, 0); /* a new fd, close-on-exec */
    if (ns < 0)
        return (int)ns;
    struct stat st;
    int r = __ml_sys_fstat((int)ns, &st);
    (void)__ml_sys_close((int)ns);
    if (r < 0)
        return r;
    *ino = (uint64_t)st.st_ino;
    return 0;
}

int __ml_sys_getdents(int fd, void *buf, size_t len)
{
    return (int)SYS_CALL(SYS_getdents64, fd, buf, len);
}

int __ml_sys_sched_yield(void) { return (int)SYS_CALL(SYS_sched_yield); }

pid_t __ml_sys_getpid(void) { return (pid_t)syscall(SYS_getpid); }

/* The pid, asked once per process (a fork child forgets it).  Not for code that may run in a
 * vfork child (it would read the parent's): that uses __ml_sys_getpid. */
static _Atomic pid_t ml_pid_cached;
static pthread_once_t ml_pid_once = PTHREAD_ONCE_INIT;

static void ml_pid_forget(void) { atomic_store_explicit(&ml_pid_cached, 0, memory_order_relaxed); }
static void ml_pid_setup(void) { (void)pthread_atfork(NULL, NULL, ml_pid_forget); }

pid_t __ml_pid(void)
{
    pid_t p = atomic_load_explicit(&ml_pid_cached, memory_order_relaxed);
    if (p)
        return p;
    pthread_once(&ml_pid_once, ml_pid_setup);
    p = __ml_sys_getpid();
    atomic_store_explicit(&ml_pid_cached, p, memory_order_relaxed);
    return p;
}

uint64_t __ml_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call, never fails for MONOTONIC */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int __ml_getcpu(void)
{
    int saved = errno;
    int c = sched_getcpu(); /* vDSO on x86_64 and arm64 */
    errno = saved;
    return c < 0 ? -1 : c;
}

int __ml_sys_seccomp_mode(void)
{
    /* A small window read a piece at a time (the line is past the first kilobyte): this may
     * run on a signal handler's stack, which can be a few KiB. */
    char b[512];
    static const char key[] = "\nSeccomp:";
    const size_t keep = sizeof key + 4;
    long fd = __ml_sys_open(AT_FDCWD, "/proc/self/status", O_RDONLY, 0);
    if (fd < 0)
        return (int)fd;
    size_t have = 0;
    int mode = -ENOENT;
    for (;;) {
        ssize_t n = __ml_sys_read((int)fd, b + have, sizeof b - 1 - have);
        if (n < 0)
            mode = (int)n;
        if (n <= 0)
            break;
        have += (size_t)n;
        b[have] = 0;
        const char *f = strstr(b, key);
        if (f && (size_t)(f - b) + sizeof key + 2 <= have) {
            f += sizeof key - 1;
            while (*f == '\t' || *f == ' ')
                f++;
            mode = *f >= '0' && *f <= '9' ? *f - '0' : -EIO;
            break;
        }
        if (have > keep) { /* keep the tail, where the key may have begun */
            memmove(b, b + have - keep, keep);
            have = keep;
        }
    }
    __ml_sys_close((int)fd);
    return mode;
}

/* The listening TCP sockets on port: their inodes into ino[] (the first max), their count, or
 * -errno (__ml_sys_tcp_listening). */
static int ml_tcp_listeners(int port, uint32_t *ino, int max)
{
    int fd = __ml_sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return fd;
    struct timeval tv = {.tv_sec = 1};
    (void)SYS_CALL(SYS_setsockopt, fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    enum { BUFSZ = 32768 }; /* a dump's part fits (the kernel's are at most 32 KiB) */
    char *buf = malloc(BUFSZ);
    int n = 0, e = buf ? 0 : -ENOMEM;
    for (int fam = 0; fam < 2 && e == 0; fam++) {
        /* The kernel filters on the port (bytecode: sport >= port, then sport <= port), so the
         * answer is a part or two however many listeners the host has, and a dump that
         * another socket's close shifts between its parts cannot skip one of ours. */
        struct {
            struct nlmsghdr h;
            struct inet_diag_req_v2 q;
            struct rtattr a;
            struct inet_diag_bc_op ops[4];
        } req;
        memset(&req, 0, sizeof req);
        req.h.nlmsg_len = sizeof req;
        req.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
        req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
        req.h.nlmsg_seq = (uint32_t)fam + 1;
        req.q.sdiag_family = fam ? AF_INET6 : AF_INET;
        req.q.sdiag_protocol = IPPROTO_TCP;
        req.q.idiag_states = 1u << TCP_LISTEN;
        req.a.rta_type = INET_DIAG_REQ_BYTECODE;
        req.a.rta_len = RTA_LENGTH(sizeof req.ops);
        req.ops[0] = (struct inet_diag_bc_op){INET_DIAG_BC_S_GE, 8, 20};
        req.ops[1] = (struct inet_diag_bc_op){0, 0, (uint16_t)port};
        req.ops[2] = (struct inet_diag_bc_op){INET_DIAG_BC_S_LE, 8, 12};
        req.ops[3] = (struct inet_diag_bc_op){0, 0, (uint16_t)port};
        ssize_t got = __ml_sys_send(fd, &req, sizeof req); /* to the kernel: no address */
        if (got < 0) {
            e = (int)got;
            break;
        }
        bool done = false;
        for (int parts = 0; !done && e == 0; parts++) {
            struct iovec iov = {buf, BUFSZ};
            struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
            got = parts < 4096 ? SYS_CALL(SYS_recvmsg, fd, &mh, 0) : -EIO;
            if (got >= 0 && (mh.msg_flags & MSG_TRUNC))
                got = -EMSGSIZE;
            if (got < 0) {
                e = got == -EAGAIN ? -ETIMEDOUT : (int)got;
                break;
            }
            int len = (int)got;
            for (const struct nlmsghdr *h = (const void *)buf; NLMSG_OK(h, len);
                 h = NLMSG_NEXT(h, len)) {
                if (h->nlmsg_seq != req.h.nlmsg_seq)
                    continue;
                if (h->nlmsg_type == NLMSG_DONE) {
                    done = true;
                    break;
                }
                if (h->nlmsg_type == NLMSG_ERROR) {
                    const struct nlmsgerr *ne = NLMSG_DATA(h);
                    e = h->nlmsg_len >= NLMSG_LENGTH(sizeof *ne) && ne->error ? ne->error
                                                                               : -EIO;
                    break;
                }
                if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
                    h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
                    continue;
                const struct inet_diag_msg *m = NLMSG_DATA(h);
                if (m->idiag_state != TCP_LISTEN || ntohs(m->id.idiag_sport) != port)
                    continue;
                if (n < max)
                    ino[n] = m->idiag_inode;
                n++;
            }
        }
    }
    free(buf);
    (void)SYS_CALL(SYS_close, fd);
    return e < 0 ? e : n;
}

/* See sys.h. */
int __ml_sys_tcp_listeners_but(int port, uint32_t except)
{
    enum { MAX = 256 };
    uint32_t *live = malloc(MAX * sizeof *live);
    int k = live ? ml_tcp_listeners(port, live, MAX) : -ENOMEM;
    if (k > MAX)
        k = -E2BIG;
    int others = k;
    for (int j = 0; j < k; j++)
        others -= except != 0 && live[j] == except;
    free(live);
    return others;
}

/* See sys.h. */
int __ml_sys_tcp_listening(int port, const uint32_t *inos, int n, bool *listens)
{
    enum { MAX = 256 };
    uint32_t *live = malloc(MAX * sizeof *live);
    int k = live ? ml_tcp_listeners(port, live, MAX) : -ENOMEM;
    if (k > MAX)
        k = -E2BIG;
    int found = k < 0 ? k : 0;
    for (int i = 0; i < n && k >= 0; i++) {
        listens[i] = false;
        for (int j = 0; j < k && inos[i] != 0 && !listens[i]; j++)
            listens[i] = live[j] == inos[i];
        found += listens[i];
    }
    free(live);
    return found;
}
