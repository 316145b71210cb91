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
#include "sys/sys.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
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
_Atomic bool mlp_forked;

static pthread_once_t mlp_once = PTHREAD_ONCE_INIT;

uint64_t mlp_now_ns(void) { return __ml_now_ns(); }

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
    (void)__ml_sys_write(mlp_cfg.log_fd, buf, (size_t)n);
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

static int mlp_env_int(const char *name, int def, int lo, int hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi)
        return def;
    return (int)x;
}

static void mlp_read_config(void)
{
    const char *v = getenv("MEMLAN_OFF");
    const char *m = getenv("MEMLAN");
    mlp_cfg.off = (v && *v && strcmp(v, "0") != 0) || (m && strcmp(m, "off") == 0);
    mlp_cfg.log_level = mlp_env_int("MEMLAN_LOG_LEVEL", 1, 0, 2);
    const char *log = getenv("MEMLAN_LOG");
    if (log && *log) {
        int fd = -1;
        if (strcmp(log, "stderr") == 0 || strcmp(log, "1") == 0)
            fd = (int)__ml_sys_fcntl_dupfd(2, 100, true);
        else
            fd = (int)__ml_sys_open(AT_FDCWD, log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                                    0644);
        mlp_cfg.log_fd = fd;
        if (fd >= 0)
            mlp_own_fd(&mlp_cfg.log_fd, true);
    }
    mlp_cfg.accept_wait_ms = mlp_env_int("MEMLAN_ACCEPT_WAIT_MS", 2000, 1, 600000);
    mlp_cfg.server_wait_ms = mlp_env_int("MEMLAN_SERVER_WAIT_MS", 50, 1, 60000);
    int kb = mlp_env_int("MEMLAN_RING_KB", 256, 4, 1 << 20);
    mlp_cfg.ring_size = (size_t)kb * 1024;
    snprintf(mlp_cfg.ports, sizeof mlp_cfg.ports, "%s", getenv("MEMLAN_PORTS") ?: "");
    snprintf(mlp_cfg.no_ports, sizeof mlp_cfg.no_ports, "%s", getenv("MEMLAN_NO_PORTS") ?: "");
    struct stat st;
    if (__ml_sys_fstatat(AT_FDCWD, "/proc/self/ns/net", &st, 0) == 0)
        snprintf(mlp_cfg.netns, sizeof mlp_cfg.netns, "%llx", (unsigned long long)st.st_ino);
    else
        snprintf(mlp_cfg.netns, sizeof mlp_cfg.netns, "0");
}

static void mlp_atfork_prepare(void) { mlp_before_fork(); }

static void mlp_atfork_parent(void) { mlp_forked = true; }

static void mlp_atfork_child(void)
{
    mlp_pid = (int)__ml_sys_getpid();
    mlp_forked = true;
    mlp_after_fork_child();
}

static void mlp_keep_fd(int *fdp) { mlp_own_fd(fdp, true); }

static void mlp_init_once(void)
{
    int inside = mlp_inside;
    mlp_inside = 1;
#define MLP_CALL(ret, name, params, args)                                                      \
    mlp_real_##name = (ret(*) params)dlsym(RTLD_NEXT, #name);
#include "calls.h"
#undef MLP_CALL
    mlp_pid = (int)__ml_sys_getpid();
    mlp_fdtable_init();
    __ml_fd_keep = mlp_keep_fd;
    __ml_fd_drop = mlp_disown_fd;
    mlp_read_config();
    __ml_spin_init(); /* nothing asked of the system later that a sandbox could refuse */
    pthread_atfork(mlp_atfork_prepare, mlp_atfork_parent, mlp_atfork_child);
    atexit(mlp_at_exit);
    mlp_ready = 1;
    mlp_log(2, "loaded%s", mlp_cfg.off ? " (off: MEMLAN_OFF)" : "");
    mlp_inside = inside;
}

void mlp_init(void) { pthread_once(&mlp_once, mlp_init_once); }

__attribute__((constructor)) static void mlp_constructor(void)
{
    mlp_init();
    if (!mlp_cfg.off)
        mlp_exec_adopt(); /* connections the image before us carried across exec */
}
