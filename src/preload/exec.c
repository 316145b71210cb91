/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * exec.c - the exec family, and accelerated connections carried across exec.
 *
 * An accelerated socket's bytes are in its channel, not in the kernel socket, so a program that
 * execs with such a socket open (inetd's dup2 onto 0 and 1, a server re-executing itself, a shell
 * running a command on an inherited connection) needs the new image to take the channel up
 * again.  Before exec, for each accelerated socket that will survive it (an fd without
 * close-on-exec), we open the channel's file anew without close-on-exec and take a read lock on
 * our side's bridge byte through it (__ml_chan_exec_bridge): exec takes our mappings, and the
 * liveness lock they held, but this file and its lock live on.  The list of such sockets goes to
 * the new image in a memfd named by MEMLAN_INHERIT (an environment variable holds at most 128 KiB;
 * a server may carry thousands).  The new image's constructor maps each channel from its bridge
 * file and puts the socket back in its fd table (mlp_adopt_conn); listeners are published again.
 * Undecided sockets are settled first, and sockets that fell to TCP push what their ring still
 * holds into the kernel socket, so the new image finds them plain.
 *
 * glibc's execvp, execl and friends call execve inside libc where no interposer sees it, so each
 * is interposed here, and posix_spawn (below); system() and popen() are not (documented).  If
 * exec fails, everything is undone and the caller's errno kept.
 *
 * A socket whose fds all close on exec is released by exec: if other processes hold it too (the
 * child of a fork), we give back our count of holders first, so the peer sees the end when the
 * last of them closes, not when the child's new image exits.
 */
#include "elfreach.h"
#include "preload.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <endian.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <dirent.h>
#include <gnu/libc-version.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#define MLP_INHERIT "MEMLAN_INHERIT"
#define MLP_INIT_EXEC()                                                                        \
    do {                                                                                       \
        if (ml_unlikely(!mlp_ready))                                                           \
            mlp_init();                                                                        \
    } while (0)

struct mlp_fdref {
    int fd;
    struct mlp_sock *s;
};

/* A growing text buffer that remembers whether anything failed to go in. */
struct mlp_buf {
    char *p;
    size_t len, cap;
    bool failed;
};

/* What one exec attempt changed, to undo if it fails. */
struct mlp_carry {
    char **env;               /* the environment to pass (malloc'd), NULL = the caller's */
    char envvar[40];          /* MEMLAN_INHERIT=fd */
    char saidvar[24];         /* MEMLAN_SAID=topics */
    int memfd;
    int *bridges;
    int nbridges;
    struct mlp_sock **gave;   /* sockets whose holder count we gave back */
    int ngave;
    struct mlp_sock **took;   /* sockets a vfork child counted itself in */
    int ntook;
    int *handed;              /* received fds a vfork child handed to its exec (mlp_carry_received) */
    int nhanded;
    const posix_spawn_file_actions_t *fa; /* posix_spawn's file actions, or NULL */
    int *credports;           /* ports whose ML_NO_OFFER_CRED we cleared (mlp_lrec_cred_exec) */
    int ncredports;
    int *blinds;              /* ports whose ML_NO_OFFER_BLIND we wrote (malloc'd) */
    int nblinds;
    char *const *envp;        /* the environment the exec passes (before ours is added) */
    const char *path;         /* the program the exec names (NULL: an fd, or unknown) */
    bool search;              /* execvp's and posix_spawnp's: a bare name is looked for in PATH */
    bool blind_known;         /* mlp_exec_blind asked (at the first connection to carry) */
    const char *blind;        /* the image to come runs without memlan: why (mlp_exec_blind) */
    struct mlp_buf unb;       /* "U" lines: files the new image removes (mlp_unname_later) */
    char blindwhy[160];
    char blindpath[512];
};

/*
 * The dup2 actions of posix_spawn file actions, noted as the program adds them (glibc's list is
 * its own): the connections the spawned program gets at a new number although their fds close
 * on exec (Rust's Command with a socket for stdin: adddup2(sock, 0)).  A few objects at a time
 * (a program builds one, spawns, destroys it); forgotten at init and destroy.
 */
#define MLP_SPAWN_NOTES 8
#define MLP_SPAWN_DUPS 8
static struct {
    const void *fa;
    int n;
    int fd[MLP_SPAWN_DUPS];
} mlp_spawn_notes[MLP_SPAWN_NOTES];
static pthread_mutex_t mlp_spawn_mu = PTHREAD_MUTEX_INITIALIZER;

static void mlp_spawn_forget(const void *fa)
{
    pthread_mutex_lock(&mlp_spawn_mu);
    for (int i = 0; i < MLP_SPAWN_NOTES; i++)
        if (mlp_spawn_notes[i].fa == fa)
            mlp_spawn_notes[i].fa = NULL;
    pthread_mutex_unlock(&mlp_spawn_mu);
}

static void mlp_spawn_note_dup(const void *fa, int fd)
{
    pthread_mutex_lock(&mlp_spawn_mu);
    int at = -1;
    for (int i = 0; i < MLP_SPAWN_NOTES && at < 0; i++)
        if (mlp_spawn_notes[i].fa == fa)
            at = i;
    for (int i = 0; i < MLP_SPAWN_NOTES && at < 0; i++)
        if (!mlp_spawn_notes[i].fa) {
            at = i;
            mlp_spawn_notes[i].fa = fa;
            mlp_spawn_notes[i].n = 0;
        }
    if (at < 0) { /* full (objects never destroyed): the oldest note goes */
        at = 0;
        mlp_spawn_notes[0].fa = fa;
        mlp_spawn_notes[0].n = 0;
    }
    if (mlp_spawn_notes[at].n < MLP_SPAWN_DUPS)
        mlp_spawn_notes[at].fd[mlp_spawn_notes[at].n++] = fd;
    pthread_mutex_unlock(&mlp_spawn_mu);
}

static bool mlp_spawn_dups(const void *fa, int fd)
{
    bool hit = false;
    if (!fa)
        return false;
    pthread_mutex_lock(&mlp_spawn_mu);
    for (int i = 0; i < MLP_SPAWN_NOTES && !hit; i++)
        if (mlp_spawn_notes[i].fa == fa)
            for (int k = 0; k < mlp_spawn_notes[i].n && !hit; k++)
                hit = mlp_spawn_notes[i].fd[k] == fd;
    pthread_mutex_unlock(&mlp_spawn_mu);
    return hit;
}

static int mlp_fdref_cmp(const void *a, const void *b)
{
    const struct mlp_fdref *x = a, *y = b;
    if (x->s != y->s)
        return (uintptr_t)x->s < (uintptr_t)y->s ? -1 : 1;
    return x->fd - y->fd;
}

static bool mlp_fd_survives_exec(int fd)
{
    long f = __ml_sys_fcntl(fd, F_GETFD, 0);
    return f >= 0 && !(f & FD_CLOEXEC);
}

static unsigned long mlp_fd_ino(int fd)
{
    struct stat st;
    return __ml_sys_fstat(fd, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

static void mlp_buf_add(struct mlp_buf *b, const char *fmt, ...)
{
    while (!b->failed) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            break;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *np = realloc(b->p, nc);
        if (!np)
            break;
        b->p = np;
        b->cap = nc;
    }
    b->failed = true;
}

/*
 * A vfork child's dup2 and dup3 of our sockets.  The child runs in its parent's memory, so it
 * leaves the fd table alone (the parent's numbers); but what it dup2s onto 0 and 1 is what its
 * exec must carry: CPython's subprocess (vfork, dup2 of the socket onto the child's stdin and
 * stdout, close_range of the rest, execve) ran its program on an idle kernel socket, and the
 * peer read the program's bytes as "arrived on the kernel socket" (the stream split).  So the
 * child notes each such dup here, in the vforking thread's storage, which it shares: by pid (a
 * note of an earlier child is stale), with the socket's inode then (the source fd may be closed
 * before the exec).  Fixed room, no allocation: dup2 is async-signal-safe.
 */
#define MLP_VFORK_DUPS 8
static __thread struct {
    int pid, n;
    int from[MLP_VFORK_DUPS], to[MLP_VFORK_DUPS];
    unsigned long ino[MLP_VFORK_DUPS];
} mlp_vfork_dups __attribute__((tls_model("initial-exec")));

static unsigned long mlp_fd_ino(int fd);

/* Is fd a number this vfork child dup'd one of our sockets onto (a step of a chain: dup, then
 * dup2 of that onto 0, as CPython's _posixsubprocess moves a stdio fd out of the way)?  Memory
 * first: no system call unless a note names fd. */
bool mlp_vfork_noted(int fd)
{
    for (int i = 0; i < mlp_vfork_dups.n; i++)
        if (mlp_vfork_dups.to[i] == fd)
            return mlp_vfork_dups.pid == (int)__ml_sys_getpid();
    return false;
}

void mlp_vfork_note_dup(int fd, int fd2)
{
    int pid = (int)__ml_sys_getpid();
    if (mlp_vfork_dups.pid != pid) {
        mlp_vfork_dups.pid = pid;
        mlp_vfork_dups.n = 0;
    }
    unsigned long ino = mlp_fd_ino(fd);
    for (int k = 0; k < mlp_vfork_dups.n; k++)
        if (mlp_vfork_dups.to[k] == fd && mlp_vfork_dups.ino[k] == ino) {
            fd = mlp_vfork_dups.from[k]; /* a chain: noted under the parent's fd it started from */
            break;
        }
    int i = 0;
    while (i < mlp_vfork_dups.n && mlp_vfork_dups.to[i] != fd2)
        i++; /* a second dup onto the same number replaces the first */
    if (i == MLP_VFORK_DUPS || !ino)
        return;
    mlp_vfork_dups.from[i] = fd;
    mlp_vfork_dups.to[i] = fd2;
    mlp_vfork_dups.ino[i] = ino;
    if (i == mlp_vfork_dups.n)
        mlp_vfork_dups.n++;
}

/* One socket (group g[0..n), all the same mlp_sock) before exec: its line of the list, if any. */
static void mlp_exec_blind(struct mlp_carry *c, const char *path);

/* This process's hold on s goes at the exec: its count given back now (restored by a failed
 * exec's undo), for the processes that hold it still. */
static void mlp_carry_give_back(struct mlp_carry *c, struct mlp_sock *s)
{
    struct mlp_sock **ng = realloc(c->gave, (size_t)(c->ngave + 1) * sizeof *ng);
    if (!ng)
        return;
    c->gave = ng;
    atomic_fetch_sub(&s->me->holders, 1);
    c->gave[c->ngave++] = s;
}

/*
 * A file of ours that the exec leaves nobody to remove (our stat entry; a connection's channel
 * whose last holder we are): its name goes once the exec has succeeded, removed by the new
 * image at its start ("U" in the carry list, by absolute path, if the name is still that file),
 * as exit() removes both.  Not before the exec: one that then fails goes on with them (a
 * review: a failed exec of a script whose interpreter is missing left the connection's file
 * unnamed, and its next carry across an exec failed, the stream split).  An image that runs
 * without memlan leaves them to the next sweep, as before.  Not a vfork child's (they are its
 * parent's), nor in a seccomp sandbox (its filter, which the new image keeps, may kill for the
 * unlink).  Before, both stayed in the fabric for good: Xvfb forks, setuids and execs a shell
 * at each server reset, and left one dead stat entry each; a fork child that exec'd after its
 * parent closed its copy left the connection's channel.
 */
static void mlp_exec_blind(struct mlp_carry *c, const char *path);

static void mlp_unname_later(struct mlp_carry *c, struct memlan_segment *seg)
{
    char name[80], lp[40], dir[4096];
    struct stat st;
    if (!seg || !seg->owner || !seg->fab || mlp_vfork_child() || mlp_sandboxed())
        return;
    /* An image that runs without memlan removes nothing, and is handed no list for it (a
     * review: a static program got a memfd and MEMLAN_INHERIT it would keep for its life). */
    if (!c->blind_known) {
        c->blind_known = true;
        mlp_exec_blind(c, c->path);
    }
    if (c->blind)
        return;
    /* Out of reach: we changed credentials since it was made (a daemon's child that drops to
     * its user, then execs), and the new image, with the same ones, cannot remove it either;
     * nor can we read /proc/self/fd then.  Said, as exit() says it of its stat entry: once for
     * a process and its fork children (a forking daemon's children, each dropping and
     * exec'ing, said it a line each: 4 lines for 4 requests). */
    if (mlp_fabric_out()) {
        if (mlp_family_first(geteuid(), true))
            mlp_log(1, "exec: %s stays in fabric %.200s (out of reach since it changed its "
                       "credentials; said once for this process and its fork children): "
                       "`memlan clean`, or a later process's sweep of the fabric, removes it",
                    seg == mlp_stat_seg() ? "this process's memlan stat entry"
                                          : "the file of a connection it ends at the exec",
                    seg->fab->path);
        return;
    }
    /* The directory as the kernel names it: absolute, whatever MEMLAN_FABRIC said. */
    snprintf(lp, sizeof lp, "/proc/self/fd/%d", seg->fab->dirfd);
    ssize_t dl = readlink(lp, dir, sizeof dir - 1);
    if (dl <= 0 || dir[0] != '/' || memchr(dir, '\n', (size_t)dl))
        return;
    dir[dl] = '\0';
    __ml_fabric_name(name, sizeof name, "seg", seg->token);
    if (__ml_sys_fstatat(seg->fab->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        mlp_buf_add(&c->unb, "U %lu %lu %s/%s\n", (unsigned long)st.st_ino,
                    (unsigned long)st.st_dev, dir, name);
}

static void mlp_carry_sock(struct mlp_carry *c, const struct mlp_fdref *g, int n, bool vforked,
                           bool spawn, struct mlp_buf *buf)
{
    struct mlp_sock *s = g[0].s;
    int keep[n + MLP_VFORK_DUPS], nk = 0;
    bool moved = false; /* a spawn's file actions dup2 one of its fds into the child */
    for (int i = 0; i < n; i++) {
        if (mlp_fd_survives_exec(g[i].fd))
            keep[nk++] = g[i].fd;
        else if (spawn && mlp_spawn_dups(c->fa, g[i].fd))
            moved = true;
    }
    /* A vfork child's own dups of this socket (mlp_vfork_note_dup), where they still name it. */
    if (vforked && !spawn && mlp_vfork_dups.pid == (int)__ml_sys_getpid())
        for (int k = 0; k < mlp_vfork_dups.n; k++) {
            int to = mlp_vfork_dups.to[k];
            bool ours = false, dup = false;
            for (int i = 0; i < n && !ours; i++)
                ours = g[i].fd == mlp_vfork_dups.from[k];
            for (int i = 0; i < nk && !dup; i++)
                dup = keep[i] == to;
            if (ours && !dup && mlp_fd_survives_exec(to) &&
                mlp_fd_ino(to) == mlp_vfork_dups.ino[k])
                keep[nk++] = to;
        }
    if (spawn && !nk && !moved)
        return; /* the spawned program does not get it: nothing to carry or give back */
    /* The new image has none of our queue cache's mappings: the peer must not sleep on a queue
     * for it that only this image reaches (struct ml_sock_side, reach: an inetd's child that
     * dropped, then execs its service with the connection).  Zeroed, the peer naps while the
     * side says ML_SOCK_NOPOST; without the flag, nothing changes. */
    if (s->type == MLP_CONN && s->ch && s->me && s->state == MLP_ACCEL && (nk || moved))
        __ml_chan_publish_reach(s->ch, true);
    if (s->type == MLP_LISTENER) {
        /* Out of reach since a credential change: the new image, with the same credentials,
         * can neither publish the listener again nor remove its record, which stays, dead once
         * our lock goes at the exec (with the socket, or after it).  Said once per process, as
         * the exit's note is (negotiate.c, mlp_lrec_release_locked). */
        static _Atomic bool said;
        if (mlp_fabric_out() && !vforked && !spawn && mlp_fab && !atomic_exchange(&said, true))
            mlp_log(1, "port %d: its listener record stays in fabric %.200s (out of reach since "
                       "this process changed its credentials; dead after the exec, clients "
                       "connect over TCP): `memlan clean`, or a later process's sweep of the "
                       "fabric, removes it (said once)", s->port, mlp_fab->path);
        if (!nk)
            return;
        /* An image that runs without memlan takes nothing up; a dynamically linked Go program
         * loads us all the same, and our constructor there published the listener again: every
         * memlan client then offered to a server whose accepts we never see, and waited the
         * accept wait, 2 s, for each connection (an explorer).  Its record goes with our lock. */
        if (!c->blind_known) {
            c->blind_known = true;
            mlp_exec_blind(c, c->path);
        }
        if (c->blind) {
            /* Its accepts will be the kernel's: clients must not offer. */
            if (mlp_lrec_blind_mark(s)) {
                mlp_log(1, "listen fd %d port %d: clients will not offer (the exec of %s, "
                           "which keeps the listener, runs without memlan: %s)",
                        keep[0], s->port, c->blindpath, c->blind);
                int *nb = realloc(c->blinds, (size_t)(c->nblinds + 1) * sizeof *nb);
                if (nb) {
                    c->blinds = nb;
                    c->blinds[c->nblinds++] = s->port;
                }
            }
            return;
        }
        mlp_buf_add(buf, "L %lu", mlp_fd_ino(keep[0]));
        for (int i = 0; i < nk; i++)
            mlp_buf_add(buf, " %d", keep[i]);
        mlp_buf_add(buf, "\n");
        return;
    }
    if (!nk && !spawn) {
        /* Exec releases this process's hold; give our count back if others hold it still.
         * Ours alone, the channel's name goes once the exec succeeded (mlp_unname_later). */
        if (!vforked && ml_load_relaxed(&s->me->holders) > 1)
            mlp_carry_give_back(c, s);
        else if (!vforked && s->state == MLP_ACCEL && s->side == 0 && s->ch &&
                 __ml_chan_peer_state(s->ch) == ML_SIDE_CLOSED)
            mlp_unname_later(c, s->ch->seg); /* (a peer still open may carry it by its name:
                                               * it goes at the peer's close, or a sweep) */
        return;
    }
    /* An fd that names the socket now: a vfork child may have closed g[0]'s number (CPython's
     * close_range after its dup2s), where a decision would read POLLNVAL and the catch-up EBADF,
     * leaving the ring's bytes to come after the new image's (a review of 4ea00a2). */
    int live = nk ? keep[0] : g[0].fd;
    int st = s->state;
    if (st == MLP_UNDECIDED)
        st = mlp_decide(s, live, true);
    if (st == MLP_TCP) {
        (void)mlp_tcp_catch_up(s, live, true); /* the new image sees a plain socket */
        return;
    }
    if (st != MLP_ACCEL || !s->ch)
        return;
    if (!c->blind_known) {
        c->blind_known = true;
        mlp_exec_blind(c, c->path);
    }
    if (c->blind) {
        /* Nothing in the new image can take it up.  Carried, its bridge kept the side alive to
         * the peer for as long as the program ran, and both waited for ever (mlp_exec_blind).
         * The last holder shuts it down before the exec, as the program's own shutdown would:
         * the peer reads what we sent and then the end, and the program an empty socket.  One
         * that others hold still stays theirs; this process's hold goes at the exec. */
        bool last = !spawn && !vforked && ml_load_relaxed(&s->me->holders) <= 1;
        mlp_log(0, "fd %d: an accelerated connection cannot follow the exec of %s (%s): %s",
                live, c->blindpath, c->blind,
                last ? "shut down before it (the peer reads the end of the stream; the "
                       "program, an empty socket)"
                     : "it stays with the other processes that hold it, and the program gets "
                       "its socket without the connection's bytes");
        if (last && nk) {
            int e0 = errno;
            (void)mlp_shutdown(s, keep[0], SHUT_RDWR);
            errno = e0;
        }
        if (!last && !spawn && !vforked) /* the spawner keeps its hold; a vfork child took none */
            mlp_carry_give_back(c, s);
        return;
    }
    int b = __ml_chan_exec_bridge(s->ch, s->cred_fd);
    if (b < 0) {
        mlp_log(0, "fd %d: cannot carry the connection across exec (%s)", live, strerror(-b));
        return;
    }
    int *nb = realloc(c->bridges, (size_t)(c->nbridges + 1) * sizeof *nb);
    if (!nb) {
        __ml_sys_close(b);
        return;
    }
    c->bridges = nb;
    long hb = __ml_sys_fcntl_dupfd(b, 900, false); /* out of the new program's way */
    if (hb >= 0) {
        __ml_sys_close(b);
        b = (int)hb;
    }
    c->bridges[c->nbridges++] = b;
    if (vforked || spawn) { /* a new process holds the socket now, and no fork handler counted it */
        /* Nor marked it forked: this is the parent's record (a vfork child runs in its
         * memory), whose locks must reload the ring positions the new image moves from now on
         * (mlp_lock_dir; for good, as the fork handler's).  Unmarked, the parent kept taking
         * the fast words with its own stale positions: its next send went at its old head,
         * over the new image's bytes, and its next receive served again the bytes the new image
         * had read (tests/preload/spawnshare.c). */
        if (!atomic_load_explicit(&s->forked, memory_order_relaxed))
            atomic_store(&s->forked, true);
        struct mlp_sock **nt = realloc(c->took, (size_t)(c->ntook + 1) * sizeof *nt);
        if (nt) {
            c->took = nt;
            atomic_fetch_add(&s->me->holders, 1);
            c->took[c->ntook++] = s;
        }
    }
    unsigned flags = (s->ch->rd_eof_when_empty ? MLP_CARRY_RD_EOF : 0) |
                     (s->ch->shut_rd ? MLP_CARRY_SHUT_RD : 0);
    /* The inode of an fd the new image gets (a vfork child may have closed g[0]'s). */
    mlp_buf_add(buf, "C %d %d %lu %u %s", s->side, b, mlp_fd_ino(live), flags,
                      s->ch->seg->token);
    for (int i = 0; i < nk; i++)
        mlp_buf_add(buf, " %d", keep[i]);
    mlp_buf_add(buf, "\n");
}

/*
 * A vfork child's exec that takes, as its standard streams, a descriptor received over
 * SCM_RIGHTS that nobody has looked at yet (a connection passed to the worker, not used: the
 * child dup2s it onto 0 and 1 and execs a handler).  The child may not look (it runs in its
 * parent's memory, and what a look installs would be the parent's, naming files only the child
 * has), so the new image looks instead, at its start: the list names the socket ("R inode fds",
 * the numbers 0 to 2 it is on there).  Before, the exec carried nothing, the handler wrote on
 * the idle kernel socket and the parent's close of its copy took the connection up and ended
 * it.  So the parent's mark is set "looked" (its copy is the kernel socket from then on; a
 * failed exec, or a list that cannot be made, sets it back).  Only at numbers the child dup2'd
 * it onto: a program that merely inherits the fd (a helper that never touches it, even at 0
 * where the worker received it) would take the connection away from the parent that goes on
 * using it; only a TCP socket; not where the parent's fd is known to be another socket now
 * (another thread may have closed the number and received another connection there since the
 * vfork: its mark is not ours to change); only for a program that will run with memlan
 * (mlp_exec_blind).
 */
static void mlp_carry_received(struct mlp_carry *c, int fd, struct mlp_buf *buf)
{
    struct mlp_fdrec *rec = mlp_fdrec(fd);
    if (!rec || ml_load_relaxed(&rec->received) != MLP_RCV_NEW)
        return;
    unsigned long ino = 0;
    int keep[3], nk = 0;
    /* Only numbers the child itself dup2'd it onto: one the worker received at 0 (its stdin
     * closed) is its own, and a helper that only inherits it does not take it. */
    if (mlp_vfork_dups.pid == (int)__ml_sys_getpid())
        for (int k = 0; k < mlp_vfork_dups.n && nk < 3; k++) {
            int to = mlp_vfork_dups.to[k];
            unsigned long ti = mlp_vfork_dups.ino[k];
            if (mlp_vfork_dups.from[k] != fd || to < 0 || to > 2 || to == fd || !ti ||
                (ino && ti != ino) || !mlp_fd_survives_exec(to) || mlp_fd_ino(to) != ti)
                continue;
            ino = ti; /* the child may have closed fd after its dup2 */
            keep[nk++] = to;
        }
    if (!nk || !ino)
        return;
    struct stat st, pst;
    int dom = 0;
    socklen_t dl = sizeof dom;
    char pfd[48];
    if (__ml_sys_fstat(keep[0], &st) < 0 || !S_ISSOCK(st.st_mode) ||
        mlp_real_getsockopt(keep[0], SOL_SOCKET, SO_DOMAIN, &dom, &dl) < 0 ||
        (dom != AF_INET && dom != AF_INET6))
        return;
    /* The parent's fd must still be this socket.  Where that cannot be asked (a non-dumpable
     * parent, as after a credential change; a /proc of another pid namespace, or none) it is
     * trusted: that race (another thread's close of the number and a receive at it, between
     * the vfork and the exec) is rarer than those configurations. */
    snprintf(pfd, sizeof pfd, "/proc/%d/fd/%d", (int)getppid(), fd);
    if (__ml_sys_fstatat(AT_FDCWD, pfd, &pst, 0) == 0 &&
        (pst.st_ino != st.st_ino || pst.st_dev != st.st_dev))
        return;
    if (!c->blind_known) {
        c->blind_known = true;
        mlp_exec_blind(c, c->path);
    }
    if (c->blind)
        return;
    int *nh = realloc(c->handed, (size_t)(c->nhanded + 1) * sizeof *nh);
    if (!nh) {
        buf->failed = true;
        return;
    }
    c->handed = nh;
    uint8_t v = MLP_RCV_NEW;
    if (!atomic_compare_exchange_strong(&rec->received, &v, (uint8_t)MLP_RCV_LOOKED))
        return;
    c->handed[c->nhanded++] = fd;
    mlp_buf_add(buf, "R %lu", ino);
    for (int i = 0; i < nk; i++)
        mlp_buf_add(buf, " %d", keep[i]);
    mlp_buf_add(buf, "\n");
}

/* The parent's marks that mlp_carry_received set aside, as they were (the exec failed, or the
 * list could not be made): only where nothing else changed them meanwhile. */
static void mlp_carry_received_undo(struct mlp_carry *c)
{
    for (int i = 0; i < c->nhanded; i++) {
        struct mlp_fdrec *rec = mlp_fdrec(c->handed[i]);
        uint8_t v = MLP_RCV_LOOKED;
        if (rec)
            (void)atomic_compare_exchange_strong(&rec->received, &v, (uint8_t)MLP_RCV_NEW);
    }
    c->nhanded = 0;
}

/* Write the list of carried sockets into a memfd for the new image; -1 when nothing to carry. */
static int mlp_carry_list(struct mlp_carry *c, bool spawn)
{
    int max = mlp_fd_max();
    struct mlp_fdref *refs = NULL;
    int n = 0, cap = 0;
    bool oom = false;
    bool vforked = (int)__ml_sys_getpid() != mlp_pid;
    struct mlp_buf rbuf = {.failed = false}; /* received fds handed on unlooked: "R" lines */
    for (int fd = 0; fd <= max && !oom; fd++) {
        mlp_received_look(fd); /* a connection passed to us and not used yet goes on too */
        if (vforked && !spawn && !mlp_fd_is_ours(fd) && mlp_received_pending())
            mlp_carry_received(c, fd, &rbuf); /* which a vfork child cannot look at */
        if (!mlp_fd_is_ours(fd))
            continue;
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            struct mlp_fdref *nr = realloc(refs, (size_t)cap * sizeof *nr);
            if (!nr) {
                mlp_put(s);
                oom = true;
                break;
            }
            refs = nr;
        }
        refs[n++] = (struct mlp_fdref){fd, s};
    }
    if (n == 0 && !rbuf.len && !rbuf.failed && !c->unb.len) {
        free(refs);
        return -1;
    }
    if (n)
        qsort(refs, (size_t)n, sizeof *refs, mlp_fdref_cmp);
    struct mlp_buf buf = {.failed = oom || rbuf.failed};
    if (rbuf.len)
        mlp_buf_add(&buf, "%.*s", (int)rbuf.len, rbuf.p);
    free(rbuf.p);
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && refs[j].s == refs[i].s)
            j++;
        mlp_carry_sock(c, refs + i, j - i, vforked, spawn, &buf);
        i = j;
    }
    /* The fabric the carried connections live in, first, which the new image's own may not be:
     * the default is per uid, and an inetd's child execs its service after a drop
     * (mlp_carry_fabric).  Only with a connection: listeners alone are published again in the
     * new image's own fabric, as an image that carries nothing opens its own. */
    if (mlp_fab && c->nbridges > 0 && !buf.failed && !strchr(mlp_fab->path, '\n')) {
        struct mlp_buf head = {.failed = false};
        if (mlp_fab_explicit)
            mlp_buf_add(&head, "F e %s\n", mlp_fab->path);
        else
            mlp_buf_add(&head, "F d %u %s\n", (unsigned)mlp_fab_owner, mlp_fab->path);
        mlp_buf_add(&head, "%.*s", (int)buf.len, buf.p ? buf.p : "");
        free(buf.p);
        buf = head;
    }
    for (int i = 0; i < n; i++)
        mlp_put(refs[i].s);
    free(refs);
    if (c->unb.len && !c->unb.failed) /* last: nothing above depends on them */
        mlp_buf_add(&buf, "%.*s", (int)c->unb.len, c->unb.p);
    free(c->unb.p);
    c->unb = (struct mlp_buf){.failed = false};
    int mfd = -1;
    if (buf.failed) {
        /* A partial list would give the new image some connections and leave others idle at
         * their fds: give it none, say so, and let the peers see our sides go at exec. */
        mlp_log(0, "out of memory before exec: no accelerated connection is carried across it");
    } else if (buf.len) {
        mfd = memfd_create("memlan-inherit", 0);
        if (mfd >= 0) {
            long hm = __ml_sys_fcntl_dupfd(mfd, 900, false);
            if (hm >= 0) {
                __ml_sys_close(mfd);
                mfd = (int)hm;
            }
            if (__ml_sys_write(mfd, buf.p, buf.len) != (ssize_t)buf.len) {
                __ml_sys_close(mfd);
                mfd = -1;
            }
        }
        if (mfd < 0)
            mlp_log(0, "cannot pass the accelerated connections to the new image (memfd)");
    }
    if (mfd < 0) {
        /* Nothing will take the bridges up: left open, they would keep the peers of connections
         * the new image cannot read waiting for ever. */
        for (int i = 0; i < c->nbridges; i++)
            __ml_sys_close(c->bridges[i]);
        c->nbridges = 0;
        for (int i = 0; i < c->ntook; i++) /* nor will the new image hold them */
            atomic_fetch_sub(&c->took[i]->me->holders, 1);
        c->ntook = 0;
        mlp_carry_received_undo(c); /* nor look at what was handed to it */
    }
    free(buf.p);
    return mfd;
}

static bool mlp_env_named(const char *e, const char *name)
{
    size_t l = strlen(name);
    return strncmp(e, name, l) == 0 && e[l] == '=';
}

/*
 * LD_PRELOAD and the MEMLAN_* settings as the environment had them when this image started,
 * copied (no allocation: our start-up may run inside an allocator's), for an exec made after the
 * program emptied its own environment: a daemon that keeps only the variables it names (dovecot's
 * master runs clearenv() at start-up and execs its login, imap and auth processes with what
 * import_environment lists; exim's keep_environment) left nothing of ours in environ, so its
 * children ran without memlan while the master's listeners stayed published, and a memlan client
 * of a port whose first bytes are its own (dovecot's doveadm HTTP API) waited
 * MEMLAN_ACCEPT_WAIT_MS for every connection.  Entries that do not fit are left out.
 */
static char mlp_env0_buf[8192];
static char *mlp_env0[33];
/* The program removed LD_PRELOAD by name (unsetenv, or putenv of the bare name, as `env -u
 * LD_PRELOAD` does); clearenv() afterwards empties everything, ours with the rest. */
static _Atomic bool mlp_env_unset;

MLP_EXPORT int clearenv(void)
{
    MLP_INIT_EXEC();
    atomic_store(&mlp_env_unset, false);
    return mlp_real_clearenv ? mlp_real_clearenv() : (errno = ENOSYS, -1);
}

MLP_EXPORT int unsetenv(const char *name)
{
    MLP_INIT_EXEC();
    const char *n = name; /* libc declares it nonnull; NULL is EINVAL from libc's, not a fault */
    __asm__("" : "+r"(n));
    if (n && strcmp(n, "LD_PRELOAD") == 0)
        atomic_store(&mlp_env_unset, true);
    return mlp_real_unsetenv ? mlp_real_unsetenv(name) : (errno = ENOSYS, -1);
}

MLP_EXPORT int putenv(char *string)
{
    MLP_INIT_EXEC();
    const char *v = string;
    __asm__("" : "+r"(v));
    if (v && strcmp(v, "LD_PRELOAD") == 0) /* glibc: a name without '=' unsets it */
        atomic_store(&mlp_env_unset, true);
    return mlp_real_putenv ? mlp_real_putenv(string) : (errno = ENOSYS, -1);
}

void mlp_exec_env_snapshot(void)
{
    extern char **environ;
    size_t used = 0, n = 0;
    bool preload = false;
    for (char **e = environ; e && *e && n < sizeof mlp_env0 / sizeof *mlp_env0 - 1; e++) {
        if ((!mlp_env_named(*e, "LD_PRELOAD") && strncmp(*e, "MEMLAN", 6) != 0) ||
            mlp_env_named(*e, MLP_INHERIT) || mlp_env_named(*e, MLP_SAID_ENV))
            continue;
        size_t l = strlen(*e) + 1;
        if (l > sizeof mlp_env0_buf - used)
            continue;
        memcpy(mlp_env0_buf + used, *e, l);
        preload |= mlp_env_named(*e, "LD_PRELOAD");
        mlp_env0[n++] = mlp_env0_buf + used;
        used += l;
    }
    mlp_env0[preload ? n : 0] = NULL; /* without our LD_PRELOAD the copy carries nothing */
}

/*
 * The environment for the new image: the caller's, without a stale MEMLAN_INHERIT or
 * MEMLAN_SAID, with ours added.  A program that execs with an environment of its own making (env -i, a sanitised envp)
 * would lose LD_PRELOAD and its children memlan: when envp has no LD_PRELOAD at all we carry ours
 * and the MEMLAN_* settings over, from environ, or when environ has no LD_PRELOAD either and the
 * program emptied it wholesale from the copy made at start-up: clearenv(), or environ truncated
 * by hand (postfix's clean_env() sets environ[0] = 0 and puts back what import_environment names:
 * `memlan run -- postfix start` ran master and every daemon without memlan, silently, its clients
 * told "no memlan listener on this port"), or replaced (`env -i`); an explicit LD_PRELOAD, even
 * empty, is the caller's choice, and so is an LD_PRELOAD it unset by name (`env -u LD_PRELOAD`:
 * put back from the copy, it brought back libraries the caller had dropped; found in review).
 */
/* Does envp[0..n) give the variable that entry ("NAME=value") names? */
static bool mlp_envp_names(char *const envp[], size_t n, const char *entry)
{
    size_t l = strcspn(entry, "=");
    for (size_t i = 0; i < n; i++)
        if (strncmp(envp[i], entry, l) == 0 && (envp[i][l] == '=' || envp[i][l] == 0))
            return true;
    return false;
}

static char *const *mlp_exec_env(struct mlp_carry *c, char *const envp[])
{
    extern char **environ;
    static char *const none[] = {NULL};
    if (!envp)
        envp = none; /* clearenv() leaves environ NULL; the kernel takes a NULL envp as empty */
    size_t n = 0;
    bool has_preload = false;
    for (; envp[n]; n++)
        if (mlp_env_named(envp[n], "LD_PRELOAD"))
            has_preload = true;
    char **from = environ; /* where ours are carried from */
    if (!has_preload && mlp_env0[0] && !atomic_load(&mlp_env_unset)) {
        bool there = false;
        for (char **e = environ; e && *e && !there; e++)
            there = mlp_env_named(*e, "LD_PRELOAD");
        if (!there)
            from = mlp_env0;
    }
    unsigned said = mlp_said;
    if (mlp_log_closed_to_exec())
        said |= MLP_SAID_CONFIG; /* said here, once, not by each image on its stderr */
    size_t extra = (c->memfd >= 0) + (said != 0);
    if (!has_preload)
        for (char **e = from; e && *e; e++)
            if ((mlp_env_named(*e, "LD_PRELOAD") || strncmp(*e, "MEMLAN", 6) == 0) &&
                !mlp_envp_names(envp, n, *e))
                extra++;
    bool stale = false;
    for (size_t i = 0; i < n; i++)
        if (mlp_env_named(envp[i], MLP_INHERIT) || mlp_env_named(envp[i], MLP_SAID_ENV))
            stale = true;
    if (!extra && !stale)
        return envp;
    char **ne = malloc((n + extra + 1) * sizeof *ne);
    if (!ne)
        return envp;
    size_t j = 0;
    /* The caller's own MEMLAN_* settings stay (`env -i MEMLAN_OFF=1 prog`, a Popen env that sets
     * MEMLAN_FABRIC): ours fill in only the names it did not give (a review of db0f797). */
    for (size_t i = 0; i < n; i++)
        if (!mlp_env_named(envp[i], MLP_INHERIT) && !mlp_env_named(envp[i], MLP_SAID_ENV))
            ne[j++] = envp[i];
    if (!has_preload)
        for (char **e = from; e && *e; e++)
            if ((mlp_env_named(*e, "LD_PRELOAD") || strncmp(*e, "MEMLAN", 6) == 0) &&
                !mlp_env_named(*e, MLP_INHERIT) && !mlp_env_named(*e, MLP_SAID_ENV) &&
                !mlp_envp_names(envp, n, *e))
                ne[j++] = *e;
    if (c->memfd >= 0) {
        snprintf(c->envvar, sizeof c->envvar, MLP_INHERIT "=%d", c->memfd);
        ne[j++] = c->envvar;
    }
    if (said) { /* what was said on stderr is not said again by the images that follow */
        snprintf(c->saidvar, sizeof c->saidvar, MLP_SAID_ENV "=%u", said);
        ne[j++] = c->saidvar;
    }
    ne[j] = NULL;
    c->env = ne;
    return ne;
}

/*
 * A vfork child runs in its parent's memory: what it allocates for an exec that succeeds (the
 * environment, the carried lists) stays in the parent's heap, and nobody frees it (about 400
 * bytes per vfork and exec: tests/preload/vforkexec).  So before the call a vfork child hands
 * its allocations to the thread that vforked (thread-local storage, which the child shares), and
 * takes them back if the exec fails; that thread's next exec, in itself or in its next vfork
 * child, frees them: the child that made them has exec'd or exited by then, since the thread
 * was suspended until it did.
 */
static __thread void *mlp_vfork_left[5] __attribute__((tls_model("initial-exec")));

static void mlp_vfork_left_set(const struct mlp_carry *c)
{
    mlp_vfork_left[0] = c ? c->env : NULL;
    mlp_vfork_left[1] = c ? c->bridges : NULL;
    mlp_vfork_left[2] = c ? c->gave : NULL;
    mlp_vfork_left[3] = c ? c->took : NULL;
    mlp_vfork_left[4] = c ? c->handed : NULL;
}

/* libc declares the exec calls' paths nonnull, and the compiler may drop our NULL checks of
 * them: a program that passes NULL gets the kernel's EFAULT, so we look at the pointer as one
 * it knows nothing of. */
static inline const char *mlp_maybe_null(const char *p)
{
    __asm__("" : "+r"(p));
    return p;
}

/* execvp's search of PATH for a bare name: true and the file in found, or false. */
static bool mlp_path_search(const char *name, char *found, size_t cap)
{
    const char *dirs = getenv("PATH"), *d = dirs ? dirs : "/bin:/usr/bin";
    while (*d) {
        size_t l = strcspn(d, ":");
        int n = snprintf(found, cap, "%.*s%s%s", (int)l, d, l ? "/" : "", name);
        if (n > 0 && (size_t)n < cap && access(found, X_OK) == 0)
            return true;
        d += l + (d[l] == ':');
    }
    return false;
}

/*
 * An exec in secure-execution mode (the kernel's AT_SECURE: real and effective ids differ, or a
 * set-user-ID or set-group-ID file): the new image's dynamic linker ignores an LD_PRELOAD path
 * (it loads only set-user-ID libraries of its system directories, by bare name), so the program
 * after this exec runs without memlan and every connection of it stays on TCP, which nothing
 * said: squid's master (real uid proxy, effective uid root) execs its kid so, and the clients
 * read "no memlan listener on this port".  Said once per image, on stderr and in the log.
 * path: the file, or NULL when libc searches PATH for it or an fd names it (ids alone then).
 */
static void mlp_exec_secure_note(const char *path)
{
    path = mlp_maybe_null(path);
    if (mlp_cfg.off || (atomic_load(&mlp_said) & MLP_SAID_SECURE))
        return;
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0)
        return;
    struct stat st;
    char found[512];
    /* execvp's search, so that a name it will not find is not said (squid tries squid_start
     * first) */
    if (path && !strchr(path, '/') && (ru != eu || rg != eg) &&
        !mlp_path_search(path, found, sizeof found))
        return;
    /* Nor a file that the exec will not run (no such file, not a regular file we may execute):
     * squid's master, started as /usr/sbin/squid, first tries /usr/sbin/squid_start, which
     * Debian does not ship, and the log said "exec of /usr/sbin/squid_start ... that program runs
     * without memlan"; in one process, that took the only note from the exec that followed. */
    if ((ru != eu || rg != eg) && path && strchr(path, '/')) {
        int saved = errno;
        bool runs = stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
                    faccessat(AT_FDCWD, path, X_OK, AT_EACCESS) == 0;
        errno = saved;
        if (!runs)
            return;
    }
    if (ru != eu || rg != eg) {
        mlp_say(MLP_SAID_SECURE, "exec of %.200s with real uid %u, effective uid %u (gid %u, %u): "
                "secure-execution mode, where the dynamic linker ignores LD_PRELOAD; that "
                "program runs without memlan, its connections on TCP",
                path ? path : "a program", (unsigned)ru, (unsigned)eu, (unsigned)rg, (unsigned)eg);
    } else if (path && strchr(path, '/') && stat(path, &st) == 0 &&
               (((st.st_mode & S_ISUID) && st.st_uid != eu) ||
                ((st.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) && st.st_gid != eg))) {
        mlp_say(MLP_SAID_SECURE, "exec of %.200s, a set-%s-ID program: secure-execution mode, "
                "where the dynamic linker ignores LD_PRELOAD; that program runs without memlan, "
                "its connections on TCP",
                path, (st.st_mode & S_ISUID) && st.st_uid != eu ? "user" : "group");
    }
}

/*
 * An exec of a program that LD_PRELOAD cannot reach (elfreach.h): a Go program, which makes its
 * socket system calls itself, or a statically linked one.  `memlan run` warns about the program
 * it starts, but one started by a shell script or a launcher under memlan was said nowhere: a Go
 * server run by `sh -c` kept every client on TCP, and the clients' log said only "no memlan
 * listener on this port", as if the server were not under memlan.  Said once per image, and not
 * again by the images it starts (MEMLAN_SAID), on stderr and in the log.  path: the file as the
 * exec names it; a bare name is looked for in PATH, as execvp does (NULL, an fd: nothing said).
 */
static bool mlp_is_valgrind_tool(const char *path);

static void mlp_exec_reach_note(const char *path)
{
    path = mlp_maybe_null(path);
    if (!path || mlp_cfg.off || (atomic_load(&mlp_said) & MLP_SAID_REACH))
        return;
    char found[512], judged[512];
    if (!strchr(path, '/')) {
        if (!mlp_path_search(path, found, sizeof found))
            return;
        path = found;
    }
    int saved = errno;
    int reach = mlp_is_valgrind_tool(path) ? 0 : mlp_elf_reach(path, 0, judged, sizeof judged);
    errno = saved;
    if (reach >= 1)
        mlp_say(MLP_SAID_REACH, "exec of %.200s%s%.200s, %s; %s runs without memlan, its "
                "connections on TCP", path, strcmp(path, judged) ? ": its interpreter " : "",
                strcmp(path, judged) ? judged : "", mlp_elf_reach_why(reach),
                reach == 3 ? "its Go code" : "that program");
}

/*
 * Will the image this exec starts run without memlan?  Then no connection can follow it: the
 * dynamic linker ignores LD_PRELOAD in secure-execution mode (real and effective ids apart; a
 * set-user-ID or set-group-ID file for another id, where no_new_privs and a nosuid mount do not
 * disarm the bit), and a Go or statically linked program never loads it.  Sets c->blind to the
 * reason, or leaves it NULL where the image will run memlan or we cannot tell (an fd, a name
 * that PATH does not give: the exec may still find it, and a failed exec must find everything
 * as it was).  A carried connection was taken up by nothing there: the bridge kept its side
 * alive, and the peer and the program both waited for ever (socat `EXEC:` of a set-user-ID
 * program, of a Go one).
 */
static bool mlp_is_loader(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    return strncmp(b, "ld-linux", 8) == 0 || strncmp(b, "ld.so", 5) == 0 ||
           (strncmp(b, "ld-", 3) == 0 && strstr(b, ".so"));
}

/*
 * A valgrind tool (memcheck-amd64-linux, ...): a statically linked program that runs its guest
 * with the guest's own dynamic linker and the environment's LD_PRELOAD, its vgpreload libraries
 * put in front, so memlan runs in the guest as under ld.so run as a program.  Its launcher
 * (valgrind.bin) execs it; judged by the file, a connection carried to `valgrind PROGRAM`
 * (socat EXEC:, inetd, tcpserver) was shut down before that exec and its client read nothing
 * back, where kernel TCP's went through, and every valgrind under memlan said "statically
 * linked: runs without memlan" of a guest that ran it.  Known by the file beside it that only a
 * valgrind installation has: vgpreload_core-ARCH-linux.so, for a tool named NAME-ARCH-linux.
 */
static bool mlp_is_valgrind_tool(const char *path)
{
    const char *b = strrchr(path, '/'), *end = path + strlen(path), *p = end;
    if (!b || end - b < 8 || strcmp(end - 6, "-linux") != 0)
        return false;
    int dashes = 0;
    while (p > b + 1 && dashes < 2)
        dashes += *--p == '-';
    char core[600];
    int n = snprintf(core, sizeof core, "%.*s/vgpreload_core%s.so", (int)(b - path), path, p);
    return dashes == 2 && n > 0 && (size_t)n < sizeof core && access(core, F_OK) == 0;
}

/*
 * Will a non-root caller's exec of this regular file run in secure-execution mode for its file
 * capabilities?  The kernel's rule (cap_bprm_creds_from_file), not the attribute's presence: the
 * file's permitted set within our bounding set, with its inheritable set within ours, becomes
 * the new permitted set (within our old permitted set under no_new_privs), and the exec is
 * secure when the file's effective bit is set or that set is not empty.  No_new_privs does not
 * disarm the effective bit; a nosuid mount disarms everything (checked by the caller).  A v3
 * attribute that names another namespace's root gives nothing (read from inside a user
 * namespace whose ancestor's root owns the file, the kernel still honours it: not followed).
 * An effective file whose permitted set is not all granted fails to exec (EPERM): not blind.
 * Not followed either: a "#!" script's interpreter's capabilities, and the narrowing under
 * ptrace or a CLONE_FS sharer.  Before, any attribute was
 * taken for secure execution and none under no_new_privs: a program with inheritable-only
 * capabilities, which runs memlan, had its carried connection shut down before the exec, and
 * an effective one under no_new_privs (systemd's NoNewPrivileges) got a connection it could
 * not take up.  errno kept by the caller.
 */
static bool mlp_file_caps_secure(const char *path, bool nnp)
{
    uint32_t v[6] = {0};
    ssize_t n = getxattr(path, "security.capability", v, sizeof v);
    if (n < (ssize_t)(2 * sizeof v[0]))
        return false; /* none (ENODATA, ENOTSUP), or unreadable: as the kernel, no capabilities */
    for (int i = 0; i < 6; i++)
        v[i] = le32toh(v[i]); /* the attribute is little-endian */
    uint32_t rev = v[0] & VFS_CAP_REVISION_MASK;
    bool eff = (v[0] & VFS_CAP_FLAGS_EFFECTIVE) != 0;
    uint64_t fp = v[1], fi = v[2];
    if (rev == VFS_CAP_REVISION_2 || rev == VFS_CAP_REVISION_3) {
        if (n < (ssize_t)(5 * sizeof v[0]))
            return false;
        fp |= (uint64_t)v[3] << 32;
        fi |= (uint64_t)v[4] << 32;
        if (rev == VFS_CAP_REVISION_3 && (n < (ssize_t)(6 * sizeof v[0]) || v[5] != 0))
            return false; /* another namespace's root: the kernel gives nothing */
    } else if (rev != VFS_CAP_REVISION_1) {
        return false;
    }
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    if (syscall(SYS_capget, &h, d) < 0)
        return eff || fp || fi; /* cannot tell: as before, the attribute decides */
    uint64_t ci = d[0].inheritable | (uint64_t)d[1].inheritable << 32;
    uint64_t cp = d[0].permitted | (uint64_t)d[1].permitted << 32;
    uint64_t np = fi & ci;
    for (int cap = 0; cap < 64; cap++)
        if (((fp >> cap) & 1) && prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1)
            np |= (uint64_t)1 << cap; /* EINVAL: past this kernel's last, which it masks off */
    /* An effective file whose permitted set is not all granted: the exec fails (EPERM), and a
     * failed exec must find the connection as it was (ping with cap_net_raw+ep where the
     * container's bounding set lacks it). */
    if (eff && (fp & ~np) != 0)
        return false;
    if (nnp)
        np &= cp;
    return eff || np != 0;
}

/* Does the LD_PRELOAD value (or /etc/ld.so.preload's text) v name our library?  Entries are
 * apart by spaces, colons, tabs or newlines, as the dynamic linker reads them. */
static bool mlp_preload_names_us(const char *v)
{
    static const char so[] = "libmemlan-preload.so";
    for (const char *p = v; p && *p;) {
        size_t l = strcspn(p, " :\t\n");
        const char *b = p + l;
        while (b > p && b[-1] != '/')
            b--;
        if ((size_t)(p + l - b) == sizeof so - 1 && memcmp(b, so, sizeof so - 1) == 0)
            return true;
        p += l + (p[l] != 0);
    }
    return false;
}

/* What envp says of the new image: LD_PRELOAD's value as the dynamic linker takes it (the last
 * one), MEMLAN_OFF's and MEMLAN's as our getenv there will (the first); NULL where absent. */
static void mlp_env_scan(char *const envp[], const char **pre, const char **off, const char **word)
{
    for (char *const *e = envp; e && *e; e++) {
        if (mlp_env_named(*e, "LD_PRELOAD"))
            *pre = *e + sizeof "LD_PRELOAD";
        else if (!*off && mlp_env_named(*e, "MEMLAN_OFF"))
            *off = *e + sizeof "MEMLAN_OFF";
        else if (!*word && mlp_env_named(*e, "MEMLAN"))
            *word = *e + sizeof "MEMLAN";
    }
}

/*
 * Will the environment the exec passes leave memlan out of the new image, as mlp_exec_env will
 * make it (ours is added where envp has no LD_PRELOAD)?  Memlan turned off there (MEMLAN_OFF,
 * MEMLAN=off: init.c's reading, whichever way the library is loaded: an image with memlan off
 * takes no connection up); an LD_PRELOAD of the caller's that does not name our library (a
 * program that empties it for its children: LD_PRELOAD=""), or none at all, judged only where
 * this image got us by LD_PRELOAD (start-up's copy) and /etc/ld.so.preload does not name us: a
 * library loaded that way is loaded whatever LD_PRELOAD says.  The reason, or NULL.  Before, a
 * connection carried into such an image was bridged to nothing: the child read the idle kernel
 * socket, and its peer read a reset where kernel TCP delivered.
 */
static const char *mlp_exec_env_blind(char *const envp[])
{
    extern char **environ;
    const char *pre = NULL, *off = NULL, *word = NULL, *pre0 = NULL, *off0 = NULL, *word0 = NULL;
    mlp_env_scan(envp, &pre, &off, &word);
    bool carried = !pre; /* ours, and our MEMLAN_* settings, are added then, from where
                          * mlp_exec_env takes them (a setting envp names stays envp's) */
    if (carried) {
        bool there = false;
        for (char **e = environ; e && *e && !there; e++)
            there = mlp_env_named(*e, "LD_PRELOAD");
        mlp_env_scan(!there && mlp_env0[0] && !atomic_load(&mlp_env_unset) ? mlp_env0 : environ,
                     &pre, &off, &word);
    }
    bool none = !pre;
    if ((off && *off && strcmp(off, "0") != 0) || (word && strcmp(word, "off") == 0))
        return "memlan is turned off in the environment it is given (MEMLAN_OFF, MEMLAN=off)";
    mlp_env_scan(mlp_env0, &pre0, &off0, &word0);
    if (!pre0 || !mlp_preload_names_us(pre0))
        return NULL; /* not loaded by LD_PRELOAD: the environment's LD_PRELOAD says nothing */
    char sys[4096];
    long f = __ml_sys_open(AT_FDCWD, "/etc/ld.so.preload", O_RDONLY | O_CLOEXEC, 0);
    if (f >= 0) {
        long n = __ml_sys_pread((int)f, sys, sizeof sys - 1, 0);
        __ml_sys_close((int)f);
        sys[n > 0 ? n : 0] = 0;
        if (mlp_preload_names_us(sys))
            return NULL;
    }
    if (none)
        return "the environment it is given has no LD_PRELOAD";
    if (!pre || !mlp_preload_names_us(pre))
        return "the LD_PRELOAD it is given leaves memlan out";
    return NULL;
}

static void mlp_exec_blind(struct mlp_carry *c, const char *path)
{
    c->blind = NULL;
    path = mlp_maybe_null(path);
    if (mlp_cfg.off || !path)
        return;
    int saved = errno;
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    char found[512];
    struct stat st;
    struct statvfs vf;
    /* As the exec finds it: execvp and posix_spawnp search PATH for a bare name, the others
     * take it as it is (from the working directory).  And judged only if the exec can run it:
     * a regular file we may execute, not on a noexec mount (a failed exec must find the
     * connection as it was). */
    if (c->search && !strchr(path, '/') && !mlp_path_search(path, found, sizeof found))
        goto out;
    if (c->search && !strchr(path, '/'))
        path = found;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode) || faccessat(AT_FDCWD, path, X_OK, AT_EACCESS) < 0 ||
        (statvfs(path, &vf) == 0 && (vf.f_flag & ST_NOEXEC)) || mlp_is_loader(path) ||
        mlp_is_valgrind_tool(path))
        goto out; /* the dynamic loader run as a program honours LD_PRELOAD, as valgrind does */
    if ((c->blind = mlp_exec_env_blind(c->envp)))
        goto named;
    if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0)
        goto out;
    char magic[4] = {0};
    long mf = __ml_sys_open(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (mf >= 0) {
        (void)__ml_sys_pread((int)mf, magic, sizeof magic, 0);
        __ml_sys_close((int)mf);
    }
    /* A file we may execute but not read is a binary: the kernel runs a script only through
     * its interpreter, which must read it (a 0711 set-user-ID or capability binary). */
    bool elf = memcmp(magic, "\177ELF", 4) == 0 || (mf == -EACCES);
    bool mnt_nosuid = statvfs(path, &vf) == 0 && (vf.f_flag & ST_NOSUID);
    bool nnp = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1;
    bool nosuid = mnt_nosuid || nnp;
    if (ru != eu || rg != eg) {
        snprintf(c->blindwhy, sizeof c->blindwhy, "secure-execution mode: real uid %u, "
                 "effective uid %u", (unsigned)ru, (unsigned)eu);
        c->blind = c->blindwhy;
    } else if (elf && !nosuid &&
               (((st.st_mode & S_ISUID) && st.st_uid != eu) ||
                ((st.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) && st.st_gid != eg))) {
        /* The kernel honours the bit on a binary only (a "#!" script runs its interpreter
         * with our ids), and not under no_new_privs or on a nosuid mount. */
        snprintf(c->blindwhy, sizeof c->blindwhy, "a set-%s-ID program: secure-execution mode",
                 (st.st_mode & S_ISUID) && st.st_uid != eu ? "user" : "group");
        c->blind = c->blindwhy;
    } else if (elf && !mnt_nosuid && eu != 0 && mlp_file_caps_secure(path, nnp)) {
        /* File capabilities that raise a non-root caller's: secure execution too (root's are
         * all there already); no_new_privs does not disarm them (mlp_file_caps_secure). */
        snprintf(c->blindwhy, sizeof c->blindwhy, "a program with file capabilities: "
                 "secure-execution mode");
        c->blind = c->blindwhy;
    } else {
        char judged[512];
        int reach = mlp_elf_reach(path, 0, judged, sizeof judged);
        if (reach >= 1) {
            snprintf(c->blindwhy, sizeof c->blindwhy, "%.150s", mlp_elf_reach_why(reach));
            c->blind = c->blindwhy;
        }
    }
named:
    if (c->blind)
        snprintf(c->blindpath, sizeof c->blindpath, "%.500s", path);
out:
    errno = saved;
}

/* A process whose fabric is out of reach (a credential change) and that execs: the ports it
 * marked "clients will not offer" and keeps no listener of across the exec are cleared, and,
 * where the exec'ing thread is out of reach too, the ports it keeps a listener of are marked
 * (mlp_lrec_cred_exec: an inetd's child that drops to a service's user, and execs it without
 * the inetd's listeners, or with the one it accepts on).  own: the exec is this process's; a
 * vfork child's or a posix_spawn's makes another process (subprocess.Popen's vfork after a
 * drop: each client of the service it started waited an eighth of the accept wait, a review),
 * which only marks. */
static void mlp_exec_cred_marks(struct mlp_carry *c, bool own)
{
    bool mark = mlp_cred_out_here();
    if (!own && !mark)
        return;
    uint8_t *kept = calloc(65536 / 8, 1);
    if (!kept)
        return;
    int max = mlp_fd_max();
    for (int fd = 0; fd <= max; fd++) {
        if (!mlp_fd_is_ours(fd))
            continue;
        struct mlp_sock *s = mlp_get(fd);
        if (!s)
            continue;
        int port = s->type == MLP_LISTENER ? s->port : -1;
        if (port >= 0 && port < 65536 && mlp_fd_survives_exec(fd))
            kept[port / 8] |= (uint8_t)(1u << (port % 8));
        mlp_put(s);
    }
    c->credports = mlp_lrec_cred_exec(kept, &c->ncredports, mark, own);
    free(kept);
}

static char *const *mlp_exec_prepare(struct mlp_carry *c, const char *path, bool search,
                                     char *const envp[])
{
    static char *const empty[] = {NULL};
    for (int i = 0; i < 5; i++)
        free(mlp_vfork_left[i]);
    mlp_vfork_left_set(NULL);
    memset(c, 0, sizeof *c);
    c->memfd = -1;
    if (!envp)
        envp = empty; /* Linux reads a null envp as an empty one */
    /* Exec takes the pool's mappings: give its channel files back now.  Not a vfork child's:
     * the pool and the mappings are its parent's, which the exec leaves to it (drained here, a
     * file parked by the parent lost its mapping and its place without its name: each
     * subprocess.Popen after a connection's close left one in the fabric for good). */
    if (mlp_fab && !mlp_vfork_child())
        __ml_chan_pool_drain(mlp_fab);
    c->path = path;
    c->search = search;
    c->envp = envp;
    if (!mlp_cfg.off) {
        mlp_unname_later(c, mlp_stat_seg()); /* our stat entry is this image's */
        c->memfd = mlp_carry_list(c, false);
    }
    if (mlp_fab && !mlp_cfg.off && mlp_fabric_out())
        mlp_exec_cred_marks(c, (int)__ml_sys_getpid() == mlp_pid);
    return mlp_exec_env(c, envp);
}

/* Exec failed (undo): as if we had never tried; or a spawn's child has its own copies of the
 * bridges and the list now: ours go, the counts stay.  errno kept. */
static void mlp_carry_end(struct mlp_carry *c, bool undo)
{
    int saved = errno;
    for (int i = 0; i < c->nbridges; i++)
        __ml_sys_close(c->bridges[i]);
    for (int i = 0; undo && i < c->ngave; i++)
        atomic_fetch_add(&c->gave[i]->me->holders, 1);
    for (int i = 0; undo && i < c->ntook; i++)
        atomic_fetch_sub(&c->took[i]->me->holders, 1);
    if (undo)
        mlp_carry_received_undo(c);
    if (undo && c->ncredports)
        mlp_lrec_cred_undo(c->credports, c->ncredports);
    for (int i = 0; undo && i < c->nblinds; i++)
        mlp_lrec_blind_undo(c->blinds[i]);
    free(c->blinds);
    free(c->credports);
    if (c->memfd >= 0)
        __ml_sys_close(c->memfd);
    free(c->bridges);
    free(c->gave);
    free(c->took);
    free(c->handed);
    free(c->env);
    errno = saved;
}

static void mlp_exec_undo(struct mlp_carry *c) { mlp_carry_end(c, true); }

/* ---- the new image ----------------------------------------------------------------------- */

static bool mlp_is_sock(int fd, unsigned long ino)
{
    struct stat st;
    return __ml_sys_fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) &&
           (unsigned long)st.st_ino == ino;
}

/* The fds of this image that are the socket ino (a spawn's file actions may have moved or closed
 * the ones the image before us listed): fstat of each open fd, from /proc/self/fd. */
static int mlp_scan_fds(unsigned long ino, int *fds, int max)
{
    long d = __ml_sys_open(AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (d < 0)
        return 0;
    int n = 0;
    char buf[4096];
    for (int got; n < max && (got = __ml_sys_getdents((int)d, buf, sizeof buf)) > 0;) {
        for (int off = 0; off < got && n < max;) {
            struct dirent64 *e = (struct dirent64 *)(buf + off);
            off += e->d_reclen;
            char *end;
            long v = strtol(e->d_name, &end, 10);
            if (*end || end == e->d_name || v < 0 || v == d || v > 1 << 24)
                continue;
            if (mlp_is_sock((int)v, ino))
                fds[n++] = (int)v;
        }
    }
    __ml_sys_close((int)d);
    return n;
}

/* Parse a list of fds ("%d %d ..."): those that are the socket ino; none listed or none still
 * there (a spawn's file actions), the image's fds are searched for it. */
static int mlp_parse_fds(char *p, unsigned long ino, int *fds, int max)
{
    int n = 0, listed = 0;
    char *end;
    while (n < max) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        p = end;
        listed++;
        if (v >= 0 && v <= 1 << 24 && mlp_is_sock((int)v, ino))
            fds[n++] = (int)v;
    }
    if (n == max && strtol(p, &end, 10) >= 0 && end != p)
        mlp_log(0, "fd %d: only %d fds of one socket are carried across exec; the others are "
                   "plain kernel sockets now", fds[0], max);
    if (n == 0)
        n = mlp_scan_fds(ino, fds, max);
    return n;
}

/* An "R" or "L" line: "X inode fds...", the fds of this image that are that socket (64 at most). */
static int mlp_line_fds(char *line, int *fds)
{
    unsigned long ino;
    int off = 0;
    if (sscanf(line + 1, " %lu%n", &ino, &off) != 1)
        return 0;
    return mlp_parse_fds(line + 1 + off, ino, fds, 64);
}

/* fds[0] holds a socket of ours: the other numbers of the list name it too. */
static void mlp_install_rest(const int *fds, int n)
{
    struct mlp_sock *s = mlp_get(fds[0]);
    if (!s)
        return;
    for (int i = 1; i < n; i++)
        mlp_install(fds[i], s);
    mlp_put(s);
}

static void mlp_adopt_line(char *line)
{
    int fds[64];
    if (line[0] == 'F' && line[1] == ' ') {
        unsigned owner = 0;
        int off = 0;
        if (line[2] == 'e' && line[3] == ' ') {
            mlp_carry_explicit = true;
            off = 4;
        } else if (sscanf(line, "F d %u %n", &owner, &off) == 1 && off > 0) {
            mlp_carry_explicit = false;
            mlp_carry_owner = (uid_t)owner;
        } else {
            return;
        }
        if (line[off] == '/')
            snprintf(mlp_carry_fabric, sizeof mlp_carry_fabric, "%s", line + off);
        return;
    }
    if (line[0] == 'R') {
        /* A connection passed to the image before us and not looked at (mlp_carry_received):
         * looked at now, before stdio is set up on it, as its first call would. */
        int n = mlp_line_fds(line, fds);
        if (n > 0) {
            mlp_mark_received_one(fds[0]);
            if (mlp_take_passed(fds[0]))
                mlp_install_rest(fds, n);
        }
        return;
    }
    if (line[0] == 'U') {
        /* A file the image before us left to us (mlp_unname_later), if the name is still it:
         * only a fabric file's name ("seg-" and a token), never any path the list names. */
        unsigned long ino, dev;
        int off = 0;
        struct stat st;
        const char *base = strrchr(line, '/');
        if (sscanf(line, "U %lu %lu %n", &ino, &dev, &off) != 2 || off <= 0 ||
            line[off] != '/' || !base || strncmp(base + 1, "seg-", 4) != 0 ||
            !__ml_token_valid(base + 5))
            return;
        long r = __ml_sys_fstatat(AT_FDCWD, line + off, &st, AT_SYMLINK_NOFOLLOW);
        if (r == 0 && (!S_ISREG(st.st_mode) || (unsigned long)st.st_ino != ino ||
                       (unsigned long)st.st_dev != dev))
            return;
        if (r == 0)
            r = __ml_sys_unlinkat(AT_FDCWD, line + off, 0);
        /* Refused: the exec took a reach the image before us had (capabilities that a user
         * other than root loses there); that image lists nothing once it knows itself out of
         * reach (mlp_unname_later).  Said, as exit() says so of its own. */
        if (r == -EACCES || r == -EPERM)
            mlp_log(1, "exec: a memlan file the image before this one left to it (its stat "
                       "entry, or a connection's channel) stays in the fabric, out of this "
                       "image's reach (%.200s): `memlan clean`, or a later process's sweep of "
                       "the fabric, removes it", line + off);
        return;
    }
    if (line[0] == 'L') {
        int n = mlp_line_fds(line, fds);
        mlp_listen_carried = true; /* (the image's start: one thread) */
        int pub = n > 0 ? mlp_on_listen(fds[0], false) : -1;
        mlp_listen_carried = false;
        if (pub < 0)
            return;
        mlp_lowat_inherited(fds[0]); /* a mark the image before us set on the listener */
        mlp_install_rest(fds, n);
        return;
    }
    int side, bridge, off = 0;
    unsigned long ino;
    unsigned flags;
    char token[MEMLAN_TOKEN_LEN + 1];
    if (line[0] != 'C' || sscanf(line, "C %d %d %lu %u %32s%n", &side, &bridge, &ino, &flags,
                                 token, &off) != 5)
        return;
    struct stat st;
    if (bridge < 0 || __ml_sys_fstat(bridge, &st) < 0 || !S_ISREG(st.st_mode)) {
        mlp_log(0, "an accelerated connection carried across exec lost its channel file");
        return;
    }
    /* At no fd (n 0): the side is taken up only to give back the count taken for us. */
    int n = mlp_parse_fds(line + off, ino, fds, 64);
    mlp_adopt_conn(fds, n, bridge, side, token, flags, "carried across exec");
}

void mlp_exec_adopt(void)
{
    const char *v = getenv(MLP_INHERIT);
    if (!v)
        return;
    char *end;
    long mfd = strtol(v, &end, 10);
    unsetenv(MLP_INHERIT); /* ours alone: our children get their own */
    /* Not in secure-execution mode: the list is the invoker's to write, and the image runs
     * with rights the invoker may not have (a review: a "U" line would remove a file the
     * invoker could not, were memlan ever loaded into a set-user-ID program). */
    if (getauxval(AT_SECURE))
        return;
    if (*end || mfd < 0 || mfd > 1 << 24)
        return;
    struct stat st;
    if (__ml_sys_fstat((int)mfd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        st.st_size > 64 << 20)
        return;
    char *buf = malloc((size_t)st.st_size + 1);
    ssize_t got = buf ? __ml_sys_pread((int)mfd, buf, (size_t)st.st_size, 0) : -1;
    __ml_sys_close((int)mfd);
    if (got != st.st_size) {
        free(buf);
        return;
    }
    buf[got] = '\0';
    int inside = mlp_inside;
    mlp_inside = 1;
    for (char *line = buf, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = '\0';
        mlp_adopt_line(line);
    }
    mlp_inside = inside;
    free(buf);
    mlp_cred_adopted_out(); /* taken up in a fabric out of our reach: peers must not sleep */
    for (int fd = 0; fd <= 2; fd++)
        mlp_stdio_adopt(fd, false); /* inetd-style: the standard streams are the connection */
}

/* ---- posix_spawn -------------------------------------------------------------------------- */

/*
 * posix_spawn and posix_spawnp start a program in a new process whose exec glibc makes inside
 * libc (clone, then execve in the child), where no interposer sees it: the connections the new
 * program inherited were idle kernel sockets there, their bytes in channels it did not have.  So
 * the parent prepares the carry as a vfork child's exec does, for every accelerated connection
 * it holds whatever its close-on-exec (the spawn's file actions may dup2 one onto the child's 0
 * and 1, as an inetd does; Rust's Command with a socket for stdin spawns so): a bridge each, the
 * new process counted as a holder, the list in a memfd named in the child's environment.  The new
 * image takes up the connections it finds among its fds (by the socket's inode, wherever the file
 * actions put them) and gives back the count of the others (mlp_adopt_conn with no fd).  After
 * the call the parent closes its copies of the bridges and the list (the child's are its own), or
 * undoes everything if the spawn failed.  A file action that closes the bridges or the list
 * (closefrom) leaves the new image nothing to take up: its connections are lost, as before.
 * popen() spawns inside libc too, past this interposer (design.md, "Not supported"); system()
 * is interposed below.
 */
static char *const *mlp_spawn_prepare(struct mlp_carry *c, const posix_spawn_file_actions_t *fa,
                                      const char *path, bool search, char *const envp[])
{
    extern char **environ;
    memset(c, 0, sizeof *c);
    c->memfd = -1;
    c->fa = fa;
    if (!envp)
        envp = environ; /* glibc's posix_spawn passes the caller's environment then */
    c->path = path;
    c->search = search;
    c->envp = envp;
    if (!mlp_cfg.off && !mlp_vfork_child())
        c->memfd = mlp_carry_list(c, true);
    if (mlp_fab && !mlp_cfg.off && !mlp_vfork_child() && mlp_fabric_out())
        mlp_exec_cred_marks(c, false); /* the listeners it keeps, whatever the file actions do */
    return mlp_exec_env(c, envp);
}

static void mlp_spawn_done(struct mlp_carry *c, int r) { mlp_carry_end(c, r != 0); }

typedef int (*mlp_spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                            const posix_spawnattr_t *, char *const[], char *const[]);

static int mlp_spawn_call(mlp_spawn_fn real, pid_t *pid, const char *path,
                          const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                          char *const argv[], char *const envp[])
{
    if (!real)
        return ENOSYS;
    if (mlp_inside)
        return real(pid, path, fa, attr, argv, envp);
    mlp_exec_secure_note(path);
    struct mlp_carry c;
    char *const *env = mlp_spawn_prepare(&c, fa, path, real == mlp_real_posix_spawnp, envp);
    int r = real(pid, path, fa, attr, argv, env);
    mlp_spawn_done(&c, r);
    return r;
}

MLP_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    MLP_INIT_EXEC();
    return mlp_spawn_call(mlp_real_posix_spawn, pid, path, fa, attr, argv, envp);
}

MLP_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                            const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    MLP_INIT_EXEC();
    return mlp_spawn_call(mlp_real_posix_spawnp, pid, file, fa, attr, argv, envp);
}

MLP_EXPORT int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa)
{
    MLP_INIT_EXEC();
    mlp_spawn_forget(fa);
    return mlp_real_posix_spawn_file_actions_init(fa);
}

MLP_EXPORT int posix_spawn_file_actions_destroy(posix_spawn_file_actions_t *fa)
{
    MLP_INIT_EXEC();
    mlp_spawn_forget(fa);
    return mlp_real_posix_spawn_file_actions_destroy(fa);
}

MLP_EXPORT int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa, int fd, int newfd)
{
    MLP_INIT_EXEC();
    int r = mlp_real_posix_spawn_file_actions_adddup2(fa, fd, newfd);
    if (r == 0 && !mlp_inside && fd >= 0) {
        mlp_received_look(fd);
        if (mlp_fd_is_ours(fd)) /* (fd == newfd too: glibc clears its close-on-exec then) */
            mlp_spawn_note_dup(fa, fd);
    }
    return r;
}

/*
 * system(): glibc spawns "/bin/sh -c" with its own internal posix_spawn, past our interposer,
 * so a shell given an accelerated connection (one whose fd survives exec: socat's
 * SYSTEM:...,nofork dup2s the accepted socket onto 0 and 1 and calls system()) got an idle kernel
 * socket there, its bytes in a channel it did not have: the shell and its programs read nothing,
 * and the client waited for ever.  When such a connection exists we do what glibc's system()
 * does (sysdeps/posix/system.c: SIGINT and SIGQUIT ignored while the shell runs, counted across
 * threads, SIGCHLD blocked, the shell spawned with the caller's mask and those two signals reset
 * to their default where they were not ignored, a cancelled caller's shell killed and reaped,
 * 127 where the shell cannot be spawned) with the interposed posix_spawn, which carries them,
 * for every call (see system() below); in a vfork child glibc's own system() runs.
 */
static pthread_mutex_t mlp_system_mu = PTHREAD_MUTEX_INITIALIZER;
static int mlp_system_refs;
static struct sigaction mlp_system_intr, mlp_system_quit;

static void mlp_system_restore(void)
{
    pthread_mutex_lock(&mlp_system_mu);
    if (--mlp_system_refs == 0) {
        sigaction(SIGINT, &mlp_system_intr, NULL);
        sigaction(SIGQUIT, &mlp_system_quit, NULL);
    }
    pthread_mutex_unlock(&mlp_system_mu);
}

struct mlp_system_args {
    pid_t pid;
    sigset_t omask;
};

static void mlp_system_cancelled(void *arg)
{
    struct mlp_system_args *a = arg;
    kill(a->pid, SIGKILL);
    while (waitpid(a->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    mlp_system_restore();
    pthread_sigmask(SIG_SETMASK, &a->omask, NULL);
}

static int mlp_system_run(const char *line)
{
    extern char **environ;
    /* No cancellation point before the wait, as glibc's: the carry's settling of an undecided
     * connection may wait (a cancellation point of ours), and a cancel there left SIGINT and
     * SIGQUIT ignored and the carry made (found in review). */
    int cstate;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cstate);
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigemptyset(&ign.sa_mask);
    pthread_mutex_lock(&mlp_system_mu);
    if (mlp_system_refs++ == 0) {
        sigaction(SIGINT, &ign, &mlp_system_intr);
        sigaction(SIGQUIT, &ign, &mlp_system_quit);
    }
    pthread_mutex_unlock(&mlp_system_mu);
    struct mlp_system_args a = {.pid = -1};
    sigset_t chld, reset;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &chld, &a.omask);
    sigemptyset(&reset);
    if (mlp_system_intr.sa_handler != SIG_IGN)
        sigaddset(&reset, SIGINT);
    if (mlp_system_quit.sa_handler != SIG_IGN)
        sigaddset(&reset, SIGQUIT);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &a.omask);
    posix_spawnattr_setsigdefault(&attr, &reset);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    /* glibc 2.36 (Debian 12's) runs "sh -c LINE" (checked: a line that starts with '-' is
     * taken as an option there); glibc 2.38 puts "--" before the line (as other projects that
     * track its spawns found: firebuild's change for it), so from 2.38 on we do. */
    unsigned maj = 0, min = 0;
    bool dashes = sscanf(gnu_get_libc_version(), "%u.%u", &maj, &min) == 2 &&
                  (maj > 2 || (maj == 2 && min >= 38));
    char *argv[] = {(char *)"sh", (char *)"-c", (char *)"--", (char *)line, NULL};
    if (!dashes) {
        argv[2] = (char *)line;
        argv[3] = NULL;
    }
    mlp_log(2, "system(): the shell is spawned through posix_spawn, which carries this "
               "process's accelerated connections to it, if any");
    int status = -1;
    int r = mlp_spawn_call(mlp_real_posix_spawn, &a.pid, "/bin/sh", NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (r == 0) {
        pthread_cleanup_push(mlp_system_cancelled, &a);
        pthread_setcancelstate(cstate, NULL);
        pid_t w;
        while ((w = waitpid(a.pid, &status, 0)) < 0 && errno == EINTR)
            ;
        if (w != a.pid)
            status = -1;
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
        pthread_cleanup_pop(0);
    } else {
        status = 127 << 8; /* as a shell that _exit(127): POSIX's answer, and glibc's */
    }
    mlp_system_restore();
    pthread_sigmask(SIG_SETMASK, &a.omask, NULL);
    pthread_setcancelstate(cstate, NULL);
    if (r != 0)
        errno = r;
    return status;
}

/* Every call takes our way, carrying or not (but for a vfork child, and with memlan off): glibc
 * keeps a count of its own calls and its own copies of SIGINT's and SIGQUIT's dispositions, and a
 * call of each kind at once in two threads left SIGINT ignored for good (found in review).
 * system(NULL) asks whether a shell runs, as glibc's does ("exit 0"). */
MLP_EXPORT int system(const char *line)
{
    MLP_INIT_EXEC();
    if (!mlp_real_system)
        return errno = ENOSYS, -1;
    if (mlp_inside || mlp_cfg.off || mlp_vfork_child())
        return mlp_real_system(line);
    if (!line)
        return mlp_system_run("exit 0") == 0;
    return mlp_system_run(line);
}

/* ---- the interposers --------------------------------------------------------------------- */

#define MLP_EXEC(path, search, call)                                                           \
    do {                                                                                       \
        struct mlp_carry c;                                                                    \
        mlp_epoll_unpark_all(false); /* a set the new image inherits: no parked entry */      \
        char *const *env = mlp_exec_prepare(&c, (path), (search), envp);                       \
        if (mlp_vfork_child())                                                                 \
            mlp_vfork_left_set(&c);                                                            \
        int r = (call);                                                                        \
        mlp_vfork_left_set(NULL); /* it failed: ours to free */                                \
        mlp_exec_undo(&c);                                                                     \
        return r;                                                                              \
    } while (0)

MLP_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    MLP_INIT_EXEC();
    if (mlp_inside)
        return mlp_real_execve(path, argv, envp);
    mlp_exec_secure_note(path);
    mlp_exec_reach_note(path);
    MLP_EXEC(path, false, mlp_real_execve(path, argv, env));
}

MLP_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    MLP_INIT_EXEC();
    if (mlp_inside || !mlp_real_execvpe)
        return mlp_real_execvpe ? mlp_real_execvpe(file, argv, envp) : (errno = ENOSYS, -1);
    mlp_exec_secure_note(file);
    mlp_exec_reach_note(file);
    MLP_EXEC(file, true, mlp_real_execvpe(file, argv, env));
}

MLP_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    MLP_INIT_EXEC();
    if (mlp_inside || !mlp_real_fexecve)
        return mlp_real_fexecve ? mlp_real_fexecve(fd, argv, envp) : (errno = ENOSYS, -1);
    mlp_exec_secure_note(NULL);
    MLP_EXEC(NULL, false, mlp_real_fexecve(fd, argv, env));
}

MLP_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags)
{
    MLP_INIT_EXEC();
    if (mlp_inside || !mlp_real_execveat)
        return mlp_real_execveat ? mlp_real_execveat(dirfd, path, argv, envp, flags)
                                 : (errno = ENOSYS, -1);
    path = mlp_maybe_null(path); /* NULL: the kernel's EFAULT, not ours to read */
    mlp_exec_secure_note(path && (dirfd == AT_FDCWD || path[0] == '/') ? path : NULL);
    mlp_exec_reach_note(path && (dirfd == AT_FDCWD || path[0] == '/') ? path : NULL);
    MLP_EXEC(path && path[0] && (dirfd == AT_FDCWD || path[0] == '/') ? path : NULL, false,
             mlp_real_execveat(dirfd, path, argv, env, flags));
}

MLP_EXPORT int execv(const char *path, char *const argv[])
{
    extern char **environ;
    return execve(path, argv, environ);
}

MLP_EXPORT int execvp(const char *file, char *const argv[])
{
    extern char **environ;
    return execvpe(file, argv, environ);
}

/* execl, execle, execlp: the argument list as an array (on the stack, as glibc does). */
#define MLP_ARGV(argv, arg0, ap, extra)                                                        \
    size_t argc_ = 1;                                                                          \
    va_start(ap, arg0);                                                                        \
    while (va_arg(ap, const char *))                                                           \
        argc_++;                                                                               \
    va_end(ap);                                                                                \
    if (argc_ > 1u << 20) {                                                                    \
        errno = E2BIG;                                                                         \
        return -1;                                                                             \
    }                                                                                          \
    const char *argv[argc_ + 1];                                                               \
    argv[0] = arg0;                                                                            \
    va_start(ap, arg0);                                                                        \
    for (size_t i_ = 1; i_ <= argc_; i_++)                                                     \
        argv[i_] = va_arg(ap, const char *);                                                   \
    extra;                                                                                     \
    va_end(ap)

MLP_EXPORT int execl(const char *path, const char *arg, ...)
{
    va_list ap;
    MLP_ARGV(argv, arg, ap, (void)0);
    return execv(path, (char *const *)argv);
}

MLP_EXPORT int execlp(const char *file, const char *arg, ...)
{
    va_list ap;
    MLP_ARGV(argv, arg, ap, (void)0);
    return execvp(file, (char *const *)argv);
}

MLP_EXPORT int execle(const char *path, const char *arg, ...)
{
    va_list ap;
    char *const *envp;
    MLP_ARGV(argv, arg, ap, envp = va_arg(ap, char *const *));
    return execve(path, (char *const *)argv, envp);
}
