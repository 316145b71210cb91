/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * init.c - start-up of the preload library, its configuration and its log.
 *
 * Start-up is staged so that an interposer called at any moment is safe:
 *   1. the real functions are resolved with dlsym(RTLD_NEXT) (mlp_ready), from our constructor or
 *      from the first interposer called, whichever runs first (another library's constructor may
 *      make socket calls before ours runs);
 *   2. the configuration is read from the environment and the fd table set up;
 *   3. the fabric is opened lazily, by the first listen or connect that could use it: a process
 *      that never makes a TCP connection (a shell, ls) costs nothing and touches no files.
 * Until stage 1 is complete every interposer passes straight through.
 */
#include "preload.h"
#include "preload/ports.h"
#include "sys/sys.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
#include <sys/single_threaded.h>
#endif
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MLP_CALL(ret, name, params, args) ret(*mlp_real_##name) params;
#include "calls.h"
#undef MLP_CALL

struct mlp_config mlp_cfg = {.log_fd = -1};
memlan_fabric_t *mlp_fab;
char mlp_fab_error[128];
_Atomic int mlp_pid;
_Atomic int mlp_ready;
__thread int mlp_inside __attribute__((tls_model("initial-exec")));

static pthread_once_t mlp_once = PTHREAD_ONCE_INIT;

uint64_t mlp_now_ns(void) { return __ml_now_ns(); }

/* The kernel's tick (CLOCK_MONOTONIC_COARSE, read from the vDSO without a system call: 3 ns on
 * the project's VM, where CLOCK_MONOTONIC takes 21.5): for limits of a millisecond or more. */
uint64_t mlp_coarse_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return __ml_now_ns();
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Our own writes (the log, the stderr note) must never raise a signal in the host: SIGPIPE from a
 * pipe or socket whose reader has gone (a log on stderr under systemd is a socket), SIGXFSZ from
 * a regular file past RLIMIT_FSIZE (sshd's sandboxed child sets it to 0, and a log line killed
 * it).  Pipes and sockets get the SIGPIPE-safe write; a regular file is not written at all while
 * the limit is finite (setrlimit and prlimit are interposed to know; the line that says so is
 * written before the limit takes effect).
 */
static _Atomic bool mlp_fsize_limited;
static int mlp_log_mode; /* S_IFMT of the log fd */

static void mlp_fsize_note(void)
{
    struct rlimit rl;
    bool lim = getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
    atomic_store(&mlp_fsize_limited, lim);
}

void mlp_rlimit_changing(int res, const struct rlimit *rl)
{
    if (res != RLIMIT_FSIZE || !rl)
        return;
    if (rl->rlim_cur != RLIM_INFINITY && !atomic_load(&mlp_fsize_limited) &&
        S_ISREG(mlp_log_mode))
        mlp_log(1, "RLIMIT_FSIZE is being set: the log stops here (a write past it would kill us)");
    atomic_store(&mlp_fsize_limited, rl->rlim_cur != RLIM_INFINITY);
}

/* Write fd, whose file type is mode, without raising a signal; false if it was not written. */
static bool mlp_write_quiet(int fd, int mode, const void *buf, size_t n)
{
    if (S_ISREG(mode) && atomic_load(&mlp_fsize_limited))
        return false;
    if (S_ISFIFO(mode) || S_ISSOCK(mode) || !mode)
        return __ml_sys_write_nosigpipe(fd, buf, n) >= 0;
    return __ml_sys_write(fd, buf, n) >= 0;
}

void mlp_log(int level, const char *fmt, ...)
{
    if (mlp_cfg.log_fd < 0 || level > mlp_cfg.log_level)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "memlan[%d]: ", (int)mlp_pid);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    (void)mlp_write_quiet(mlp_cfg.log_fd, mlp_log_mode, buf, (size_t)n);
}

/*
 * Telling the user.  What memlan cannot do in a process (use its fabric, honour a setting) is said
 * once on the host's stderr, besides the log: a silent fall-back to TCP leaves a user measuring
 * the kernel and believing it is memlan.  The host owns fd 2, so the note is written with the raw
 * write system call (no stdio, no lock: safe wherever an interposer runs), its failure is
 * ignored, and it is written only while fd 2 is still the file it was when we loaded: a host that
 * closed its stderr may since have been given that number for a socket or a data file of its own.
 * MEMLAN_QUIET=1 (memlan run --quiet) silences it; the log still gets it.
 */
_Atomic unsigned mlp_said;
static unsigned mlp_said_before; /* the topics MEMLAN_SAID brought from an ancestor */
static bool mlp_quiet;
static bool mlp_stderr_known;
static bool mlp_stderr_net; /* fd 2 is a client's connection (an inetd's service) */
static dev_t mlp_stderr_dev;
static ino_t mlp_stderr_ino;

/* Is fd a client's connection: a network socket (AF_INET, AF_INET6), or the socket of stdin
 * or stdout?  An inetd, socat's EXEC or sshd's inetd mode hands a program its client's
 * connection as stdin, stdout and stderr: a line written there is in the client's data (a Unix
 * socket of its own, as systemd's journal gives, is a log and stays one). */
static bool mlp_fd_is_net(int fd, const struct stat *st)
{
    if (!S_ISSOCK(st->st_mode))
        return false;
    /* The very socket of stdin or stdout, whatever its family: a connection handed over as all
     * three (systemd's Accept=yes on a Unix socket, socat UNIX-LISTEN with EXEC; journald's
     * stderr is a socket of its own, with /dev/null as stdin). */
    struct stat o;
    for (int other = 0; other < 2; other++)
        if (__ml_sys_fstat(other, &o) == 0 && S_ISSOCK(o.st_mode) && o.st_ino == st->st_ino &&
            o.st_dev == st->st_dev)
            return true;
    int dom = 0;
    socklen_t len = sizeof dom;
    if (__ml_sys_raw(SYS_getsockopt, fd, SOL_SOCKET, SO_DOMAIN, (long)&dom, (long)&len, 0) < 0)
        return false;
    return dom == AF_INET || dom == AF_INET6;
}

static void mlp_note_stderr(void)
{
    struct stat st;
    mlp_stderr_known = __ml_sys_fstat(2, &st) == 0;
    mlp_stderr_net = mlp_stderr_known && mlp_fd_is_net(2, &st);
    if (mlp_stderr_net)
        mlp_stderr_known = false; /* nothing of ours goes there */
    if (mlp_stderr_known)
        mlp_stderr_dev = st.st_dev, mlp_stderr_ino = st.st_ino;
}

static void mlp_say_stderr(const char *buf, int n);

void mlp_say(unsigned topic, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof buf - 1)
        n = (int)sizeof buf - 1;
    mlp_log(0, "%s", buf);
    mlp_said |= topic;
    if (mlp_quiet || !mlp_stderr_known || (mlp_said_before & topic))
        return;
    int saved = errno; /* the host's errno is not ours to change */
    mlp_say_stderr(buf, n);
    errno = saved;
}

static void mlp_say_stderr(const char *buf, int n)
{
    struct stat st;
    if (__ml_sys_fstat(2, &st) < 0 || st.st_dev != mlp_stderr_dev || st.st_ino != mlp_stderr_ino)
        return;
    if (S_ISREG(st.st_mode) && atomic_load(&mlp_fsize_limited))
        return; /* SIGXFSZ */
    /* Neither hang nor raise a signal in the host: not into a pipe that is full (it would
     * block) or has lost its reader (SIGPIPE); raw ppoll, as poll is one of our interposers. */
    struct pollfd pfd = {.fd = 2, .events = POLLOUT};
    struct timespec zero = {0, 0};
    if (syscall(SYS_ppoll, &pfd, 1, &zero, NULL, (size_t)8) != 1 ||
        (pfd.revents & (POLLERR | POLLHUP | POLLNVAL)) || !(pfd.revents & POLLOUT))
        return;
    char line[460];
    int m = snprintf(line, sizeof line, "memlan[%d]: %.*s\n", (int)mlp_pid, n, buf);
    if (m <= 0)
        return;
    long len = m < (int)sizeof line ? m : (int)sizeof line - 1;
    if (!S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) {
        /* No reader to lose (a terminal, a file): no signal to guard against, and no call a
         * sandbox installed by a raw system call might kill for (chromium's network service
         * died of SIGSYS at this note's sigpending). */
        (void)__ml_sys_write(2, line, (size_t)len);
        return;
    }
    /* The reader may still go between the look and the write: SIGPIPE is blocked in this thread
     * for the write, and one that it raised (none was pending before) is taken back. */
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    bool had = false;
    if (pthread_sigmask(SIG_BLOCK, &pipe_set, &old) != 0)
        return;
    sigset_t pending;
    if (sigpending(&pending) == 0)
        had = sigismember(&pending, SIGPIPE);
    long w = __ml_sys_write(2, line, (size_t)len);
    if (w == -EPIPE && !had) {
        struct timespec none = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &none) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* "80,8000-8100" contains port? */
static bool mlp_port_in(const char *list, int port)
{
    const char *p = list;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            return false;
        if (*end == '-')
            b = strtol(end + 1, &end, 10);
        if (port >= a && port <= b)
            return true;
        while (*end == ',' || *end == ' ')
            end++;
        p = end;
    }
    return false;
}

bool mlp_port_allowed(int port, const char **why)
{
    if (mlp_cfg.ports[0] && !mlp_port_in(mlp_cfg.ports, port)) {
        *why = "port not in MEMLAN_PORTS";
        return false;
    }
    if (mlp_cfg.no_ports[0] && mlp_port_in(mlp_cfg.no_ports, port)) {
        *why = "port in MEMLAN_NO_PORTS";
        return false;
    }
    return true;
}

/* An integer setting: def when unset; a value that is not a whole number in [lo, hi] is said
 * (once: the configuration is read once per process image) and def used. */
static int mlp_env_int(const char *name, int def, int lo, int hi, const char *def_text)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < lo || x > hi) {
        mlp_say(MLP_SAID_CONFIG, "bad %s='%.40s' (want %d to %d): using the default, %s", name, v, lo, hi,
                def_text);
        return def;
    }
    return (int)x;
}

/* A port list setting: "" (all ports) when unset or bad. */
static void mlp_env_ports(const char *name, char *out, size_t len)
{
    const char *v = getenv(name);
    out[0] = 0;
    if (!v || !*v)
        return;
    if (strlen(v) >= len || !mlp_ports_valid(v)) {
        mlp_say(MLP_SAID_CONFIG, "bad %s='%.40s' (want ports and ranges such as 80,8000-8100): ignored, so no "
                "port is %s", name, v, strcmp(name, "MEMLAN_PORTS") == 0 ? "left out" : "excluded");
        return;
    }
    snprintf(out, len, "%s", v);
}

/* An on/off setting, 0 or 1: unset or empty is 0.  Any other value keeps the meaning documented
 * for it (what it is taken for, in taken) and is said, so that MEMLAN_FABRIC_CREATE=yes does not
 * quietly leave a fabric uncreated.  Only the preload says these; the core reads the same rule. */
static bool mlp_env_flag(const char *name, bool other_is_on, const char *taken)
{
    const char *v = getenv(name);
    if (!v || !*v || strcmp(v, "0") == 0)
        return false;
    if (strcmp(v, "1") == 0)
        return true;
    mlp_say(MLP_SAID_CONFIG, "bad %s='%.40s' (want 0 or 1): %s", name, v, taken);
    return other_is_on;
}

/*
 * Before an exec: will the new image, with our credentials as they are now, be unable to open
 * the log file we write to?  A daemon that dropped to nobody after its log was opened and then
 * execs a child per connection (git daemon --user=nobody, an inetd's services) had each child say
 * on the daemon's stderr that it cannot open MEMLAN_LOG: a line per connection (an explorer).
 * Then the child is told it was said (MEMLAN_SAID), and we say it once in our log instead.  Asked
 * at each credential change too (cred.c), so that a daemon says it before it forks its children.
 */
/* The users (euid + 1) for whom a process of this fork family has said it, on a page the fork
 * children share (made at the first fork: cupsd's children, each dropped to lp and exec'ing a
 * CGI, said it once each, a line per web request: an explorer); NULL before any fork, or where
 * it could not be made (then once per process, as before). */
static _Atomic(_Atomic uint32_t *) mlp_family_said;
#define MLP_FAMILY_SAID 64

static void mlp_family_page(void)
{
    void *p;
    _Atomic uint32_t *none = NULL;
    if (atomic_load_explicit(&mlp_family_said, memory_order_relaxed) ||
        __ml_sys_mmap(&p, NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                      0) != 0)
        return;
    if (!atomic_compare_exchange_strong(&mlp_family_said, &none, (_Atomic uint32_t *)p))
        (void)__ml_sys_munmap(p, 4096); /* another thread's fork made one first */
}

/* First in the family to say it for this user?  exec: the exec's note of the files it leaves
 * (exec.c, mlp_unname_later), not the log's; its own slots, (euid + 1) | 1 << 31. */
bool mlp_family_first(uid_t eu, bool exec)
{
    _Atomic uint32_t *f = atomic_load(&mlp_family_said);
    if (!f)
        return true;
    uint32_t want = ((uint32_t)eu + 1) | (exec ? 0x80000000u : 0);
    for (int i = 0; i < MLP_FAMILY_SAID; i++) {
        uint32_t v = atomic_load(&f[i]);
        if (v == want)
            return false;
        if (v == 0 && atomic_compare_exchange_strong(&f[i], &v, want))
            return true;
        if (v == want)
            return false;
    }
    return true; /* (more users than slots: said by each process) */
}

bool mlp_log_closed_to_exec(void)
{
    const char *log = getenv("MEMLAN_LOG");
    if (mlp_cfg.log_fd < 0 || !S_ISREG(mlp_log_mode) || !log || !*log ||
        !strcmp(log, "stderr") || !strcmp(log, "1") || mlp_sandboxed())
        return false;
    int e = errno;
    /* As the new image will find it: a user other than root loses its capabilities at the exec
     * (setpriv --reuid keeps them until then: CAP_DAC_OVERRIDE said "writable", and each child
     * said on its stderr that it could not open the log: an explorer), as access() with the
     * real ids, the same here, clears them; else with the effective ones. */
    uid_t eu = geteuid();
    int how = eu != 0 && getuid() == eu && getgid() == getegid() &&
                      prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, CAP_DAC_OVERRIDE, 0, 0) != 1
                  ? 0
                  : AT_EACCESS; /* (an ambient CAP_DAC_OVERRIDE survives the exec: a review) */
    bool closed = faccessat(AT_FDCWD, log, W_OK, how) != 0 &&
                  (errno == EACCES || errno == EPERM);
    errno = e;
    static _Atomic bool said;
    if (closed && !atomic_exchange(&said, true) && mlp_family_first(eu, false))
        mlp_log(0, "the programs this process execs cannot open MEMLAN_LOG='%.200s' (euid %u): "
                   "they do not log (said once, here and not on their stderr)",
                log, (unsigned)geteuid());
    return closed;
}

static void mlp_read_config(void)
{
    mlp_note_stderr();
    const char *said = getenv(MLP_SAID_ENV);
    if (said)
        mlp_said_before = (unsigned)strtoul(said, NULL, 10) &
                          (MLP_SAID_CONFIG | MLP_SAID_FABRIC | MLP_SAID_FULL | MLP_SAID_EVQ |
                           MLP_SAID_SECURE | MLP_SAID_PASS | MLP_SAID_REACH | MLP_SAID_STALL |
                           MLP_SAID_OOB | MLP_SAID_ASYNC);
    mlp_said = mlp_said_before;
    const char *q = getenv("MEMLAN_QUIET");
    mlp_quiet = q && *q && strcmp(q, "0") != 0;
    /* The log first, so that what is said about the other settings reaches it too. */
    mlp_fsize_note();
    const char *log = getenv("MEMLAN_LOG");
    /* Not into a client's connection (mlp_note_stderr): no log in such a process. */
    if (log && *log && !(mlp_stderr_net && (!strcmp(log, "stderr") || !strcmp(log, "1")))) {
        int fd = -1;
        if (strcmp(log, "stderr") == 0 || strcmp(log, "1") == 0)
            fd = (int)__ml_sys_fcntl_dupfd(2, 100, true);
        else
            fd = (int)__ml_sys_open(AT_FDCWD, log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                                    0644);
        mlp_cfg.log_fd = fd;
        if (fd >= 0) {
            struct stat st;
            mlp_log_mode = __ml_sys_fstat(fd, &st) == 0 ? (int)(st.st_mode & S_IFMT) : 0;
            mlp_own_fd(&mlp_cfg.log_fd, true);
        }
        else
            mlp_say(MLP_SAID_CONFIG, "cannot open MEMLAN_LOG='%.200s' for append: %s; not logging", log,
                    strerror(-fd));
    }
    /* Quiet as every reader takes it (any value but 0); a value that is not 0 or 1 is the one
     * note it lets through. */
    mlp_quiet = false;
    mlp_quiet = mlp_env_flag("MEMLAN_QUIET", true, "taken as 1, quiet from now on");
    const char *m = getenv("MEMLAN");
    mlp_cfg.off = mlp_env_flag("MEMLAN_OFF", true, "taken as 1, so nothing is accelerated") ||
                  (m && strcmp(m, "off") == 0);
    (void)mlp_env_flag("MEMLAN_FABRIC_CREATE", false,
                       "using the default, 0 (a missing fabric directory is not created)");
    mlp_cfg.groupwide = mlp_env_flag("MEMLAN_FABRIC_GROUPWIDE", false,
                                     "using the default, 0 (connections to other users need "
                                     "POSIX ACLs)");
    const char *fab = getenv("MEMLAN_FABRIC");
    mlp_cfg.fabric[0] = 0;
    if (fab && strlen(fab) < sizeof mlp_cfg.fabric)
        snprintf(mlp_cfg.fabric, sizeof mlp_cfg.fabric, "%s", fab);
    mlp_cfg.log_level = mlp_env_int("MEMLAN_LOG_LEVEL", 1, 0, 2, "1 (decisions)");
    mlp_cfg.accept_wait_ms = mlp_env_int("MEMLAN_ACCEPT_WAIT_MS", 2000, 1, 600000, "2000 ms");
    mlp_cfg.accept_queue_ms =
        mlp_env_int("MEMLAN_ACCEPT_QUEUE_MS", 60000, 1, 600000, "60000 ms");
    mlp_cfg.server_wait_ms = mlp_env_int("MEMLAN_SERVER_WAIT_MS", 50, 1, 60000, "50 ms");
    int kb = mlp_env_int("MEMLAN_RING_KB", 256, 4, 1 << 20, "256 KiB");
    mlp_cfg.ring_size = (size_t)kb * 1024;
    kb = mlp_env_int("MEMLAN_RING_GROW_KB", 4096, 0, 64 << 10, "4096 KiB");
    mlp_cfg.ring_grow = (size_t)kb * 1024;
    /* Read by the core's spin policy (src/spin.c), which falls back the same way; said here,
     * with the rest of the configuration, so the core does not say it again. */
    (void)mlp_env_int("MEMLAN_SPIN_US", 0, 0, 1000000, "adaptive");
    __ml_env_reported();
    mlp_env_ports("MEMLAN_PORTS", mlp_cfg.ports, sizeof mlp_cfg.ports);
    mlp_env_ports("MEMLAN_NO_PORTS", mlp_cfg.no_ports, sizeof mlp_cfg.no_ports);
    mlp_netns_refresh();
    mlp_exec_env_snapshot();
}

/* The namespace's inode, one word so that a thread reading it while another refreshes it (after
 * an unshare or setns) sees the old or the new, never half of each. */
static _Atomic uint64_t mlp_netns_ino;

void mlp_netns_refresh(void)
{
    /* The calling thread's namespace (unshare and setns move only the calling thread); the
     * process's where /proc/thread-self is missing.  Unreadable (no /proc in a chroot): the
     * value we had stays. */
    struct stat st;
    if (__ml_sys_fstatat(AT_FDCWD, "/proc/thread-self/ns/net", &st, 0) == 0 ||
        __ml_sys_fstatat(AT_FDCWD, "/proc/self/ns/net", &st, 0) == 0)
        atomic_store(&mlp_netns_ino, (uint64_t)st.st_ino);
}

void mlp_netns(char *out)
{
    snprintf(out, 24, "%llx", (unsigned long long)atomic_load(&mlp_netns_ino));
}

/* The table holds still from the count before fork until fork returned (fdtable.c's gate). */
static void mlp_atfork_prepare(void)
{
    mlp_family_page();
    mlp_epoll_unpark_all(true); /* the kernel's sets are shared from now on */
    mlp_fork_gate_close();
    mlp_before_fork();
}

static void mlp_atfork_parent(void)
{
    mlp_fork_gate_open(false);
}

static void mlp_atfork_child(void)
{
    mlp_pid = (int)__ml_sys_getpid();
    mlp_sig_after_fork_child();
    mlp_fork_gate_open(true);
    mlp_after_fork_child();
}

/*
 * Our fork handlers must run inside the allocator's, as glibc runs every handler inside its own
 * malloc's fork locking: our prepare before the allocator's (which takes its locks), our parent
 * and child handlers after its (which free or reset them), since ours free memory (a fork child
 * lets go of its copies of the parent's queues, segments and stat entry) and a prepare handler
 * may free an epoll member.  pthread_atfork runs prepare handlers in the reverse order of their
 * registration and the others in that order, and an allocator that is its own library (jemalloc,
 * tcmalloc) registers its handlers at its first allocation: so the allocator allocates once
 * before we register, at our constructor.  Not at our start-up (mlp_init_once), which may run
 * inside the allocator's own start: jemalloc's calls syscall(SYS_close), which we interpose,
 * when a constructor before ours first allocates (libgpg-error's, in redis-server), and it
 * registers its handlers only when its start is done, after ours.  Registered first, our child
 * handler freed into jemalloc's locks, which its own handler had not reset yet: redis's BGSAVE
 * child (a replica's full resync) hung there for ever.  Our constructor runs in the dynamic
 * loader's initialisation, never inside an allocation; mlp_inside is held, so whatever the
 * allocator's start calls passes through us.  A fork before our constructor (in another
 * library's) runs none of our handlers: nothing of ours exists yet.
 */
static _Atomic bool mlp_atfork_on; /* registered: a fork from now on runs our handlers */

static void mlp_atfork_register(void)
{
    void *volatile p = malloc(1);
    free(p);
    pthread_atfork(mlp_atfork_prepare, mlp_atfork_parent, mlp_atfork_child);
    atomic_store(&mlp_atfork_on, true);
}

/*
 * A new process made by syscall(SYS_clone, flags, NULL, ...) (or SYS_fork), which runs none of
 * fork's handlers: vsftpd makes each session's process so (CLONE_NEWPID or CLONE_NEWIPC, then its
 * unprivileged half with CLONE_NEWNET).  Unseen, the child took itself for a vfork child (its pid
 * not ours) and went past us on every call: the accelerated control connection it got from the
 * listener's accept was written on its idle kernel socket ("220 (vsFTPd 3.0.3)" arrived there,
 * the stream split) and every login failed.  Our handlers run around the call as around fork():
 * the holders counted, the gate closed, the child's state made fresh, its network namespace read
 * again (CLONE_NEWNET).  Only where glibc's own fork locking is not missed: a process with one
 * thread (__libc_single_threaded), whose allocator nobody else can hold, and not from a signal
 * handler of ours; elsewhere (another thread may hold the allocator's lock, which the child
 * handler's frees would wait on for ever) the call goes past us as before.  Returns the call's
 * result, errno as it left it.
 */
long mlp_raw_fork(long (*call)(long, long, long, long, long, long, long), long n, long a, long b,
                  long c, long d, long e, long f)
{
    bool ours = atomic_load(&mlp_atfork_on) && !mlp_inside && !mlp_cfg.off &&
                !mlp_vfork_child() && !mlp_sig_in_handler();
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    ours = ours && __libc_single_threaded;
#else
    ours = false;
#endif
    if (!ours)
        return call(n, a, b, c, d, e, f);
    int saved = errno;
    /* glibc names a thread in its mutexes by its descriptor's tid, which only its own fork sets
     * in the child (CLONE_CHILD_SETTID), and registers the thread's robust list with the kernel
     * again there (set_robust_list).  A raw clone's child kept its parent's tid: a process-shared
     * robust mutex the parent held read EDEADLK in the child (our socket locks: a reset reported,
     * tests/preload/rawclone.c "shared"), and with no robust list a child dying inside a send
     * would leave the socket's lock held for ever.  The kernel says where the tid lies (glibc
     * gives that address as the thread's clear-child-tid: PR_GET_TID_ADDRESS, checked to lie in
     * the thread's descriptor and to hold our tid) and where the list's head is: read here, set
     * in the child as glibc's fork sets them.  Not in a known sandbox, nor where either cannot be
     * read (a kernel without CHECKPOINT_RESTORE): the child is left as before. */
    int *tidp = NULL;
    void *rhead = NULL;
    size_t rlen = 0;
    char *self = (char *)pthread_self();
    bool fixid = !mlp_known_confined() &&
                 __ml_sys_raw(SYS_prctl, PR_GET_TID_ADDRESS, (long)&tidp, 0, 0, 0, 0) == 0 &&
                 (char *)tidp >= self && (char *)tidp + sizeof *tidp <= self + 4096 &&
                 *tidp == (int)__ml_sys_raw(SYS_gettid, 0, 0, 0, 0, 0, 0) &&
                 __ml_sys_raw(SYS_get_robust_list, 0, (long)&rhead, (long)&rlen, 0, 0, 0) == 0;
    mlp_publish_received(); /* as fork() does: the children inherit the publication */
    mlp_atfork_prepare();
    errno = saved;
    long r = call(n, a, b, c, d, e, f);
    int err = errno;
    if (r == 0) {
        if (fixid) {
            /* set_tid_address also names the tid's place to the kernel for this child's own
             * raw clones (a raw clone gives its child no clear-child-tid: vsftpd's session
             * raw-clones its unprivileged half), and answers the tid.  The list starts empty:
             * the parent's mutexes are not the child's (glibc's fork empties it so too). */
            *tidp = (int)__ml_sys_raw(SYS_set_tid_address, (long)tidp, 0, 0, 0, 0, 0);
            *(void **)rhead = rhead;
            (void)__ml_sys_raw(SYS_set_robust_list, (long)rhead, (long)rlen, 0, 0, 0, 0);
        }
        mlp_atfork_child();
        if (n == SYS_clone ? (a & CLONE_NEWNET) != 0
#ifdef SYS_clone3
            : n == SYS_clone3 ? (((const struct mlp_clone_args *)a)->flags & CLONE_NEWNET) != 0
#endif
                              : false)
            mlp_netns_refresh();
    } else {
        mlp_atfork_parent();
        if (r < 0)
            mlp_fork_failed(); /* the prepare handler counted the child that was not born */
    }
    errno = err;
    return r;
}

static void mlp_keep_fd(int *fdp) { mlp_own_fd(fdp, true); }

/* A limit the core met (__ml_say_once): said our way, on stderr and in the log. */
static void mlp_core_note(unsigned topic, const char *msg)
{
    (void)topic; /* one core topic so far: the event queue's parts */
    mlp_say(MLP_SAID_EVQ, "%s", msg);
}

static bool mlp_config_later; /* mlp_init_once ran before the environment was there */

static void mlp_init_once(void)
{
    int inside = mlp_inside;
    mlp_inside = 1;
    __ml_mb_off(); /* every publication keeps its full barrier here: see __ml_mb_off() */
    __ml_yield_off(); /* and no wait gives its cpu away: see __ml_yield_budget_ns() */
#define MLP_CALL(ret, name, params, args)                                                      \
    mlp_real_##name = (ret(*) params)dlsym(RTLD_NEXT, #name);
#include "calls.h"
#undef MLP_CALL
    mlp_pid = (int)__ml_sys_getpid();
    mlp_fdtable_init();
    __ml_fd_keep = mlp_keep_fd;
    __ml_fd_drop = mlp_disown_fd;
    __ml_sio_missed = mlp_sio_missed;
    __ml_wait_recv = mlp_wait_is_recv;
    __ml_note = mlp_core_note;
    mlp_sigbus_init(); /* before anything is mapped */
    /* Before the C library has its environment (a sanitizer runtime's preinit function calls
     * setrlimit before any library's initialiser has run, and reaches us first), no setting can
     * be read: we stay off until our constructor reads them. */
    if (environ) {
        mlp_read_config();
        __ml_spin_init(); /* nothing asked of the system later that a sandbox could refuse */
    } else {
        mlp_cfg.off = true;
        mlp_config_later = true;
    }
    mlp_ready = 1;
    mlp_log(2, "loaded%s", mlp_cfg.off ? " (off: MEMLAN_OFF)" : "");
    mlp_inside = inside;
}

void mlp_init(void) { pthread_once(&mlp_once, mlp_init_once); }

/* The exit handler is registered here, not in mlp_init_once, which the first call we interpose
 * runs: that may come from inside a sanitizer runtime's own initialisation (AddressSanitizer's
 * calls setrlimit from the program's preinit array), and its atexit() then died of "CHECK failed
 * ... asan_init_is_running" before main.  Our constructor runs after every preinit function and,
 * as before, in the dynamic loader's initialisation, before glibc registers the destructors'
 * runner: the handler still runs after the ELF destructors (design.md, "exit()"). */
__attribute__((constructor)) static void mlp_constructor(void)
{
    mlp_init();
    if (mlp_config_later) { /* single-threaded still: the dynamic loader's initialisation */
        mlp_config_later = false;
        mlp_cfg.off = false;
        int inside = mlp_inside;
        mlp_inside = 1;
        mlp_read_config();
        __ml_spin_init();
        mlp_inside = inside;
        mlp_log(2, "loaded (settings read at our constructor: a runtime's preinit reached us first)");
    }
    int inside = mlp_inside;
    mlp_inside = 1;
    mlp_atfork_register();
    mlp_inside = inside;
    atexit(mlp_at_exit);
    if (!mlp_cfg.off)
        mlp_exec_adopt(); /* connections the image before us carried across exec */
}
