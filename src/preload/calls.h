/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * calls.h - the one list of libc functions the preload library intercepts.
 *
 * Each line is MLP_CALL(return type, name, (parameters), (arguments)).  preload.h turns it into
 * the pointers to the real functions (mlp_real_<name>), init.c resolves them all with
 * dlsym(RTLD_NEXT) at start-up, and the build turns it into the library's export list, so adding
 * a line here is the whole of declaring a new interposer (its body goes in interpose.c).
 * Variadic functions (fcntl, ioctl) are listed with the fixed argument that carries the rest.
 */
MLP_CALL(int, connect, (int fd, const struct sockaddr *addr, socklen_t len), (fd, addr, len))
MLP_CALL(int, listen, (int fd, int backlog), (fd, backlog))
MLP_CALL(int, accept, (int fd, struct sockaddr *addr, socklen_t *len), (fd, addr, len))
MLP_CALL(int, accept4, (int fd, struct sockaddr *addr, socklen_t *len, int flags),
         (fd, addr, len, flags))
MLP_CALL(int, close, (int fd), (fd))
MLP_CALL(int, shutdown, (int fd, int how), (fd, how))
MLP_CALL(ssize_t, read, (int fd, void *buf, size_t len), (fd, buf, len))
MLP_CALL(ssize_t, write, (int fd, const void *buf, size_t len), (fd, buf, len))
MLP_CALL(ssize_t, readv, (int fd, const struct iovec *iov, int n), (fd, iov, n))
MLP_CALL(ssize_t, writev, (int fd, const struct iovec *iov, int n), (fd, iov, n))
MLP_CALL(ssize_t, recv, (int fd, void *buf, size_t len, int flags), (fd, buf, len, flags))
MLP_CALL(ssize_t, send, (int fd, const void *buf, size_t len, int flags), (fd, buf, len, flags))
MLP_CALL(ssize_t, recvfrom,
         (int fd, void *buf, size_t len, int flags, struct sockaddr *addr, socklen_t *alen),
         (fd, buf, len, flags, addr, alen))
MLP_CALL(ssize_t, sendto,
         (int fd, const void *buf, size_t len, int flags, const struct sockaddr *addr,
          socklen_t alen),
         (fd, buf, len, flags, addr, alen))
MLP_CALL(ssize_t, recvmsg, (int fd, struct msghdr *msg, int flags), (fd, msg, flags))
MLP_CALL(ssize_t, sendmsg, (int fd, const struct msghdr *msg, int flags), (fd, msg, flags))
MLP_CALL(int, recvmmsg,
         (int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *tmo),
         (fd, v, n, flags, tmo))
MLP_CALL(int, sendmmsg, (int fd, struct mmsghdr *v, unsigned int n, int flags), (fd, v, n, flags))
MLP_CALL(ssize_t, preadv2, (int fd, const struct iovec *iov, int n, off_t off, int flags),
         (fd, iov, n, off, flags))
MLP_CALL(ssize_t, pwritev2, (int fd, const struct iovec *iov, int n, off_t off, int flags),
         (fd, iov, n, off, flags))
MLP_CALL(ssize_t, preadv64v2, (int fd, const struct iovec *iov, int n, off64_t off, int flags),
         (fd, iov, n, off, flags))
MLP_CALL(ssize_t, pwritev64v2, (int fd, const struct iovec *iov, int n, off64_t off, int flags),
         (fd, iov, n, off, flags))
MLP_CALL(ssize_t, splice,
         (int in, off64_t *inoff, int out, off64_t *outoff, size_t len, unsigned int flags),
         (in, inoff, out, outoff, len, flags))
/* The fortified entry points of -D_FORTIFY_SOURCE builds (glibc's debug/ directory): the same
 * calls with the caller's buffer size, checked first. */
MLP_CALL(ssize_t, __read_chk, (int fd, void *buf, size_t len, size_t buflen),
         (fd, buf, len, buflen))
MLP_CALL(ssize_t, __recv_chk, (int fd, void *buf, size_t len, size_t buflen, int flags),
         (fd, buf, len, buflen, flags))
MLP_CALL(ssize_t, __recvfrom_chk,
         (int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *addr,
          socklen_t *alen),
         (fd, buf, len, buflen, flags, addr, alen))
MLP_CALL(int, __poll_chk, (struct pollfd *fds, nfds_t n, int timeout, size_t fdslen),
         (fds, n, timeout, fdslen))
MLP_CALL(int, __ppoll_chk,
         (struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask,
          size_t fdslen),
         (fds, n, tmo, mask, fdslen))
MLP_CALL(ssize_t, sendfile, (int out, int in, off_t *off, size_t count), (out, in, off, count))
MLP_CALL(ssize_t, sendfile64, (int out, int in, off64_t *off, size_t count), (out, in, off, count))
MLP_CALL(int, setsockopt, (int fd, int level, int name, const void *val, socklen_t len),
         (fd, level, name, val, len))
MLP_CALL(int, getsockopt, (int fd, int level, int name, void *val, socklen_t *len),
         (fd, level, name, val, len))
MLP_CALL(int, ioctl, (int fd, unsigned long req, void *arg), (fd, req, arg))
MLP_CALL(int, fcntl, (int fd, int cmd, long arg), (fd, cmd, arg))
MLP_CALL(int, fcntl64, (int fd, int cmd, long arg), (fd, cmd, arg))
/* fd-table operations: each releases the fds' records (interpose.c). */
MLP_CALL(int, close_range, (unsigned int first, unsigned int last, int flags),
         (first, last, flags))
MLP_CALL(void, closefrom, (int lowfd), (lowfd))
/* prctl(PR_SET_SECCOMP): a sandbox, where memlan makes no call it can avoid (negotiate.c,
 * mlp_confined); variadic, listed with the four arguments the kernel reads. */
MLP_CALL(int, prctl,
         (int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5),
         (option, a2, a3, a4, a5))
#if defined(__x86_64__) || defined(__aarch64__) /* ML_SYS_RAW: memlan's own closes bypass it */
/* syscall(SYS_close, fd) and SYS_close_range, as libuv (Node.js) closes every fd; variadic, listed
 * with the six arguments it passes on (glibc's reads six). */
MLP_CALL(long, syscall, (long n, long a, long b, long c, long d, long e, long f),
         (n, a, b, c, d, e, f))
#endif
MLP_CALL(int, dup, (int fd), (fd))
MLP_CALL(int, dup2, (int fd, int fd2), (fd, fd2))
MLP_CALL(int, dup3, (int fd, int fd2, int flags), (fd, fd2, flags))
MLP_CALL(int, poll, (struct pollfd *fds, nfds_t n, int timeout), (fds, n, timeout))
MLP_CALL(int, ppoll,
         (struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask),
         (fds, n, tmo, mask))
MLP_CALL(int, select, (int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tmo),
         (n, r, w, e, tmo))
MLP_CALL(int, pselect,
         (int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *tmo,
          const sigset_t *mask),
         (n, r, w, e, tmo, mask))
MLP_CALL(int, epoll_create, (int size), (size))
MLP_CALL(int, epoll_create1, (int flags), (flags))
MLP_CALL(int, epoll_ctl, (int epfd, int op, int fd, struct epoll_event *ev), (epfd, op, fd, ev))
MLP_CALL(int, epoll_wait, (int epfd, struct epoll_event *ev, int max, int tmo),
         (epfd, ev, max, tmo))
MLP_CALL(int, epoll_pwait,
         (int epfd, struct epoll_event *ev, int max, int tmo, const sigset_t *mask),
         (epfd, ev, max, tmo, mask))
MLP_CALL(int, epoll_pwait2,
         (int epfd, struct epoll_event *ev, int max, const struct timespec *tmo,
          const sigset_t *mask),
         (epfd, ev, max, tmo, mask))
MLP_CALL(FILE *, fdopen, (int fd, const char *mode), (fd, mode))
/* A move to another network namespace (interpose.c): the rendezvous names carry it. */
MLP_CALL(int, unshare, (int flags), (flags))
MLP_CALL(int, setns, (int fd, int nstype), (fd, nstype))
/* Credential changes (cred.c): a process that can no longer use the fabric stops offering. */
MLP_CALL(int, setuid, (uid_t uid), (uid))
MLP_CALL(int, seteuid, (uid_t uid), (uid))
MLP_CALL(int, setreuid, (uid_t r, uid_t e), (r, e))
MLP_CALL(int, setresuid, (uid_t r, uid_t e, uid_t s), (r, e, s))
MLP_CALL(int, setgid, (gid_t gid), (gid))
MLP_CALL(int, setegid, (gid_t gid), (gid))
MLP_CALL(int, setregid, (gid_t r, gid_t e), (r, e))
MLP_CALL(int, setresgid, (gid_t r, gid_t e, gid_t s), (r, e, s))
MLP_CALL(int, setgroups, (size_t n, const gid_t *list), (n, list))
MLP_CALL(int, initgroups, (const char *user, gid_t group), (user, group))
MLP_CALL(int, capset, (void *hdr, void *data), (hdr, data))
MLP_CALL(pid_t, fork, (void), ())
/* _exit and _Exit: this process's memlan stat entry loses its name first (negotiate.c). */
MLP_CALL(void, _exit, (int status), (status))
MLP_CALL(void, _Exit, (int status), (status))
MLP_CALL(int, execve, (const char *path, char *const argv[], char *const envp[]),
         (path, argv, envp))
MLP_CALL(int, execvpe, (const char *file, char *const argv[], char *const envp[]),
         (file, argv, envp))
MLP_CALL(int, fexecve, (int fd, char *const argv[], char *const envp[]), (fd, argv, envp))
MLP_CALL(int, execveat,
         (int dirfd, const char *path, char *const argv[], char *const envp[], int flags),
         (dirfd, path, argv, envp, flags))
/* posix_spawn: glibc execs inside libc, so the carry is prepared in the parent (exec.c). */
MLP_CALL(int, posix_spawn,
         (pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
          const posix_spawnattr_t *attr, char *const argv[], char *const envp[]),
         (pid, path, fa, attr, argv, envp))
MLP_CALL(int, posix_spawnp,
         (pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
          const posix_spawnattr_t *attr, char *const argv[], char *const envp[]),
         (pid, file, fa, attr, argv, envp))
/* system: glibc spawns its shell inside libc; exec.c spawns it through posix_spawn instead
 * when an accelerated connection would reach the shell. */
MLP_CALL(int, system, (const char *line), (line))
/* clearenv, unsetenv and putenv: noted (exec.c), so that exec carries our settings from the
 * start-up copy where the program emptied its environment wholesale (clearenv(), or postfix's
 * environ[0] = 0), not where it unset LD_PRELOAD on purpose. */
MLP_CALL(int, clearenv, (void), ())
MLP_CALL(int, unsetenv, (const char *name), (name))
/* chroot: the fabric is opened before it (negotiate.c, mlp_fabric_preopen). */
MLP_CALL(int, chroot, (const char *path), (path))
MLP_CALL(int, putenv, (char *string), (string))
MLP_CALL(int, posix_spawn_file_actions_init, (posix_spawn_file_actions_t *fa), (fa))
MLP_CALL(int, posix_spawn_file_actions_destroy, (posix_spawn_file_actions_t *fa), (fa))
MLP_CALL(int, posix_spawn_file_actions_adddup2, (posix_spawn_file_actions_t *fa, int fd, int nfd),
         (fa, fd, nfd))
MLP_CALL(int, execv, (const char *path, char *const argv[]), (path, argv))
MLP_CALL(int, execvp, (const char *file, char *const argv[]), (file, argv))
MLP_CALL(int, execl, (const char *path, const char *arg, ...), (path, arg))
MLP_CALL(int, execlp, (const char *file, const char *arg, ...), (file, arg))
MLP_CALL(int, execle, (const char *path, const char *arg, ...), (path, arg))
/* Handlers without SA_RESTART are counted (signals.c); the other ways to install one are noted. */
MLP_CALL(int, siginterrupt, (int sig, int flag), (sig, flag))
MLP_CALL(__sighandler_t, sysv_signal, (int sig, __sighandler_t h), (sig, h))
MLP_CALL(__sighandler_t, __sysv_signal, (int sig, __sighandler_t h), (sig, h))
MLP_CALL(__sighandler_t, sigset, (int sig, __sighandler_t h), (sig, h))
/* signal() and bsd_signal(): through our sigaction (signals.c: the trampoline lends a spinning
 * receive's word back for the handler's run) */
MLP_CALL(__sighandler_t, signal, (int sig, __sighandler_t h), (sig, h))
MLP_CALL(__sighandler_t, bsd_signal, (int sig, __sighandler_t h), (sig, h))
MLP_CALL(int, sigaction, (int sig, const struct sigaction *act, struct sigaction *old),
         (sig, act, old))
/* RLIMIT_FSIZE: memlan's own log must not be written past it (SIGXFSZ would kill the host). */
MLP_CALL(int, setrlimit, (__rlimit_resource_t res, const struct rlimit *rl), (res, rl))
MLP_CALL(int, setrlimit64, (__rlimit_resource_t res, const struct rlimit64 *rl), (res, rl))
MLP_CALL(int, prlimit, (pid_t pid, enum __rlimit_resource res, const struct rlimit *nl,
                        struct rlimit *ol), (pid, res, nl, ol))
MLP_CALL(int, prlimit64, (pid_t pid, enum __rlimit_resource res, const struct rlimit64 *nl,
                          struct rlimit64 *ol), (pid, res, nl, ol))
