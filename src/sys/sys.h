/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sys.h - the only code in memlan that makes system calls.
 *
 * Every wrapper returns a non-negative result or a negative errno and leaves the caller's errno
 * exactly as it found it.  The wrappers go through syscall(2) rather than the libc entry points so
 * that, once the preload library interposes on open(), close() or write(), the core can never
 * re-enter the interposer by accident.
 */
#ifndef MEMLAN_SYS_H
#define MEMLAN_SYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/stat.h>

/* Where ML_SYS_RAW is 1, the calls that release fds (close, close_range) are made by the
 * instruction itself, not through libc's syscall(), which the preload library interposes on those
 * architectures (a program's syscall(SYS_close, fd) must release the fd's record, and memlan's
 * own closes must not reach that interposer).  __ml_sys_raw returns the kernel's value
 * (-errno on failure), errno untouched. */
#if defined(__x86_64__) || defined(__aarch64__)
#define ML_SYS_RAW 1
#else
#define ML_SYS_RAW 0
#endif
long __ml_sys_raw(long n, long a, long b, long c, long d, long e, long f);

long __ml_sys_open(int dirfd, const char *path, int flags, mode_t mode);
int __ml_sys_close(int fd);
long __ml_sys_fcntl(int fd, int cmd, long arg);
long __ml_sys_fcntl_dupfd(int fd, int min, bool cloexec);
int __ml_sys_linkat(int olddir, const char *oldpath, int newdir, const char *newpath);
ssize_t __ml_sys_pwrite(int fd, const void *buf, size_t len, off_t off);
ssize_t __ml_sys_read(int fd, void *buf, size_t len);
ssize_t __ml_sys_write(int fd, const void *buf, size_t len);
ssize_t __ml_sys_write_nosigpipe(int fd, const void *buf, size_t len); /* never raises SIGPIPE */
ssize_t __ml_sys_pread(int fd, void *buf, size_t len, off_t off);
int __ml_sys_ftruncate(int fd, off_t len);
int __ml_sys_fallocate(int fd, off_t off, off_t len); /* mode 0; -ENOSPC when full */
int __ml_sys_fchmod(int fd, mode_t mode);
int __ml_sys_fchmodat(int dirfd, const char *path, mode_t mode);
int __ml_sys_fstat(int fd, struct stat *st);
int __ml_sys_fstatat(int dirfd, const char *path, struct stat *st, int flags);
int __ml_sys_unlinkat(int dirfd, const char *path, int flags);
int __ml_sys_mkdir(const char *path, mode_t mode);
int __ml_sys_mknodat(int dirfd, const char *path, mode_t mode);
int __ml_sys_mmap(void **out, void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __ml_sys_munmap(void *p, size_t len);
int __ml_sys_madvise(void *p, size_t len, int advice);
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
int __ml_sys_getrandom(void *buf, size_t len);
/* OFD byte locks: the liveness of a fabric file's owner.  lock() with wait=0 gives -EAGAIN when
 * another open file description holds the byte; held() answers 1 when someone else holds it. */
int __ml_sys_lock_byte(int fd, off_t byte, int wait);
int __ml_sys_byte_held(int fd, off_t byte);
int __ml_sys_lock_byte_shared(int fd, off_t byte); /* a read lock, never waits */
int __ml_sys_lock_range(int fd, off_t start, off_t len); /* a write lock, never waits */
int __ml_sys_unlock_range(int fd, off_t start, off_t len); /* before a transient lock's close */
/* futex on a word in shared memory (never FUTEX_PRIVATE: the waker is another process). */
int __ml_sys_futex_wait(_Atomic uint32_t *word, uint32_t expect, int64_t timeout_ns);
int __ml_sys_futex_wake(_Atomic uint32_t *word, int n);
/* membarrier(2): cmd with flags 0; 0 or the command's result (QUERY: a mask), or -errno. */
int __ml_sys_membarrier(int cmd);
/* Is the socket fd (still the one whose inode is ino) past its peer's FIN or reset?  1 yes,
 * 0 no, negative errno when it cannot tell (fd closed or reused, the call refused).  Never waits. */
int __ml_sys_socket_hup(int fd, uint64_t ino);
int __ml_sys_socket_data(int fd, uint64_t ino);
int __ml_sys_socket_peer_fin(int fd, uint64_t ino); /* by TCP_INFO: see sys.c */
int __ml_sys_getdents(int fd, void *buf, size_t len);
/* The inode of the network namespace the socket fd was made in, into *ino: 0, or a negative
 * errno (-EPERM without CAP_NET_ADMIN over that namespace, -ENOTTY on a kernel before 4.9). */
int __ml_sys_socket_netns(int fd, uint64_t *ino);
/* Which of the sockets inos[0..n) (inodes; 0: none) listen on TCP port in the calling thread's
 * network namespace, both families (a sock_diag dump of TCP_LISTEN filtered on the port by the
 * kernel, which asks no privilege): listens[i] for each, and how many do; or a negative errno
 * (-E2BIG: more listeners on the port than it reads).  Waits at most a second per answer. */
int __ml_sys_tcp_listening(int port, const uint32_t *inos, int n, bool *listens);
/* How many TCP sockets listen on port there, other than the one of inode except (0: none), or a
 * negative errno, as __ml_sys_tcp_listening asks: a record whose slots cannot tell (lsock_full,
 * which anyone able to write the record can set) is dead when nothing at all listens. */
int __ml_sys_tcp_listeners_but(int port, uint32_t except);
/* The calling process's seccomp mode as /proc/self/status says it now ("Seccomp:": 0 none, 1
 * strict, 2 a filter), or a negative errno where it cannot be read (no /proc: a chroot).  Read
 * fresh, with open and read, before a call a filter may kill for (socket(AF_NETLINK)): a
 * filter can come by a system call no interposer sees. */
int __ml_sys_seccomp_mode(void);
/* 1 when a Unix seqpacket socket listens at path, 0 when none does (ECONNREFUSED, or not a
 * socket), or a negative errno.  The probe connection is closed at once, so the listener's
 * accept sees a peer that hung up. */
int __ml_sys_unix_listening(const char *path);
/* Unix sockets and epoll, for named endpoints (endpoint.c).  send never raises SIGPIPE. */
int __ml_sys_socket(int domain, int type, int proto);
int __ml_sys_bind(int fd, const void *sa, size_t len);
int __ml_sys_listen(int fd, int backlog);
int __ml_sys_accept4(int fd, int flags);
int __ml_sys_connect(int fd, const void *sa, size_t len);
ssize_t __ml_sys_send(int fd, const void *buf, size_t len);
ssize_t __ml_sys_recv(int fd, void *buf, size_t len);
int __ml_sys_peer_uid(int fd, uint32_t *uid);
int __ml_sys_poll1(int fd, short events, int timeout_ms); /* 1 ready, 0 timed out */
int __ml_sys_epoll_create(void);
int __ml_sys_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data);
int __ml_sys_epoll_wait(int epfd, void *events, int max, int timeout_ms);
int __ml_sys_sched_yield(void);
pid_t __ml_sys_getpid(void);
pid_t __ml_pid(void); /* cached; not in a vfork child */
/* Exported from libmemlan.so in the MEMLAN_PRIVATE version node, for libmemlan-rpc only. */
__attribute__((visibility("default"))) uint64_t __ml_now_ns(void);
int __ml_getcpu(void);

#endif
