/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * fabric.c - the directory that the processes of one fabric share.
 *
 * A fabric is a directory, by default /dev/shm/memlan-UID with mode 0700.  Its files are named
 * for their tokens: seg-TOKEN is a segment (raw, channel or event queue) and bell-TOKEN the FIFO
 * doorbell of an event queue; ep-NAME and ep-NAME.sock are a named endpoint (endpoint.c).  Every
 * segment file (and ep-NAME) carries its owner's liveness as an OFD lock on byte 0 that the
 * kernel drops when the owner's last descriptor closes, which includes death by SIGKILL; so a
 * file whose byte 0 can be locked by anyone else is an orphan and may be removed.
 * That check is the only reclaim rule: we never judge liveness by pid, which the kernel reuses.
 */
#include "internal.h"
#include "sys/sys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int __ml_token_valid(const char *token)
{
    if (!token)
        return 0;
    for (int i = 0; i < MEMLAN_TOKEN_LEN; i++) {
        char c = token[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
    }
    return token[MEMLAN_TOKEN_LEN] == '\0';
}

int __ml_token_new(char out[MEMLAN_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t raw[MEMLAN_TOKEN_LEN / 2];
    int r = __ml_sys_getrandom(raw, sizeof raw);
    if (r < 0)
        return r;
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[MEMLAN_TOKEN_LEN] = '\0';
    return 0;
}

void __ml_fabric_name(char *buf, size_t len, const char *prefix, const char *token)
{
    snprintf(buf, len, "%s-%s", prefix, token);
}

/*
 * A bad setting of the core's (MEMLAN_SPIN_US, MEMLAN_FABRIC_CREATE): one line on stderr, once
 * per process and setting, with the default used ("Nothing silent" in docs/design.md), written
 * with one raw write that never raises SIGPIPE (the program owns fd 2; stdio would take its lock
 * and buffer).  Not under the preload library (memlan run): it checks the whole environment and
 * says it itself, and the program's own libmemlan is then a second copy of the core.
 */
static _Atomic unsigned ml_env_said; /* the ML_ENV_* bits said, or all once the preload has */

void __ml_env_reported(void) { ml_store_relaxed(&ml_env_said, ~0u); }

void __ml_env_say_bad(unsigned which, const char *name, const char *value, const char *want,
                      const char *def)
{
    const char *q = getenv("MEMLAN_QUIET"), *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "libmemlan-preload"))
        return;
    /* No data is published with the bit: the exchange only elects the one caller that speaks. */
    if ((q && *q && strcmp(q, "0") != 0) || (atomic_fetch_or(&ml_env_said, which) & which))
        return;
    char line[240];
    int n = snprintf(line, sizeof line, "memlan[%d]: bad %s='%.40s' (want %s): using the default, %s\n",
                     (int)__ml_sys_getpid(), name, value, want, def);
    if (n > 0)
        (void)__ml_sys_write_nosigpipe(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

void (*__ml_note)(unsigned topic, const char *msg);
static _Atomic unsigned ml_notes_said;

void __ml_say_once(unsigned topic, const char *msg)
{
    /* SYNC: none; the exchange only elects the one caller that speaks. */
    if (atomic_fetch_or(&ml_notes_said, topic) & topic)
        return;
    if (__ml_note) {
        __ml_note(topic, msg);
        return;
    }
    const char *q = getenv("MEMLAN_QUIET");
    if (q && *q && strcmp(q, "0") != 0)
        return;
    char line[400];
    int n = snprintf(line, sizeof line, "memlan[%d]: %s\n", (int)__ml_sys_getpid(), msg);
    if (n > 0)
        (void)__ml_sys_write_nosigpipe(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* The path memlan_fabric_open(NULL) uses, and whether it is the default. */
static const char *ml_fabric_path(const char *path, char *def, size_t len, bool *explicit_path)
{
    *explicit_path = true;
    if (!path)
        path = getenv("MEMLAN_FABRIC");
    if (!path || !*path) {
        snprintf(def, len, "/dev/shm/memlan-%u", (unsigned)getuid());
        path = def;
        *explicit_path = false;
    }
    return path;
}

/*
 * The fabric's directory is held by an O_PATH descriptor and every file in it is opened relative
 * to that (openat, always O_NOFOLLOW), so the private mode works: a directory that is searchable
 * but not readable (0733/1733) cannot be opened O_RDONLY, and needs not be, since only the sweep
 * lists it (and tolerates EACCES).  The default directory is created if missing, then opened
 * without following a symlink, and its owner and mode are checked on that descriptor (not by a
 * path look-up that could name something else a moment later).  A named directory is never
 * created by accident (a typo in MEMLAN_FABRIC would make a fabric on disk, or nowhere anyone
 * else looks) unless MEMLAN_FABRIC_CREATE=1 asks for it.
 */
static int ml_fabric_open_as(const char *path, bool explicit_path, bool create_it, uid_t owner,
                             memlan_fabric_t **out);

int memlan_fabric_open(const char *path, memlan_fabric_t **out)
{
    if (!out)
        return -EINVAL;
    *out = NULL;
    /* The spin policy's settings, read (and a bad MEMLAN_SPIN_US said) now, once, rather than at
     * the first wait: a process that forks after opening its fabric would say it in every child. */
    __ml_spin_init();
    char def[64];
    bool explicit_path;
    path = ml_fabric_path(path, def, sizeof def, &explicit_path);
    const char *create = getenv("MEMLAN_FABRIC_CREATE");
    if (create && *create && strcmp(create, "0") != 0 && strcmp(create, "1") != 0)
        __ml_env_say_bad(ML_ENV_FABRIC_CREATE, "MEMLAN_FABRIC_CREATE", create, "0 or 1",
                         "0 (a missing fabric directory is not created)");
    return ml_fabric_open_as(path, explicit_path,
                             !explicit_path || (create && strcmp(create, "1") == 0), getuid(),
                             out);
}

/* The fabric of connections carried across exec (the preload): path as the image before named
 * it, a default one (not explicit) checked as that image's default, for its owner's uid; never
 * created. */
int __ml_fabric_open_carried(const char *path, bool explicit_path, uid_t owner,
                             memlan_fabric_t **out)
{
    if (!out || !path)
        return -EINVAL;
    *out = NULL;
    __ml_spin_init();
    return ml_fabric_open_as(path, explicit_path, false, owner, out);
}

static int ml_fabric_open_as(const char *path, bool explicit_path, bool create_it, uid_t owner,
                             memlan_fabric_t **out)
{
    if (strlen(path) >= PATH_MAX - 64)
        return -EINVAL;
    if (create_it) {
        int r = __ml_sys_mkdir(path, 0700);
        if (r < 0 && r != -EEXIST)
            return r;
    }
    long fd = __ml_sys_open(AT_FDCWD, path,
                            O_PATH | O_DIRECTORY | (explicit_path ? 0 : O_NOFOLLOW), 0);
    if (fd < 0) /* the default a symlink: O_PATH|O_NOFOLLOW opens the link, not a directory */
        return !explicit_path && (fd == -ENOTDIR || fd == -ELOOP) ? -ELOOP : (int)fd;
    struct stat st;
    int r = __ml_sys_fstat((int)fd, &st);
    if (r < 0)
        goto fail;
    r = -EACCES;
    /* The default directory must be ours alone: anyone able to write into it could plant files
     * that we would map.  A fabric shared on purpose is named explicitly. */
    if (!S_ISDIR(st.st_mode) ||
        (!explicit_path && (st.st_uid != owner || (st.st_mode & 077))))
        goto fail;
    memlan_fabric_t *fab = calloc(1, sizeof *fab);
    r = -ENOMEM;
    if (!fab)
        goto fail;
    fab->dirfd = (int)fd;
    fab->uid = getuid();
    pthread_mutex_init(&fab->pool_mu, NULL);
    fab->shared = (st.st_mode & 077) != 0;
    fab->sweep_asks = true;
    snprintf(fab->path, sizeof fab->path, "%s", path);
    *out = fab;
    return 0;
fail:
    __ml_sys_close((int)fd);
    return r;
}

const char *__ml_fabric_explain(int err, char *buf, size_t len)
{
    char def[64];
    bool explicit_path;
    (void)ml_fabric_path(NULL, def, sizeof def, &explicit_path);
    const char *why = strerror(-err);
    if (!explicit_path && err == -ELOOP)
        why = "a symlink, not a directory of ours";
    else if (!explicit_path && err == -EACCES)
        why = "another user's or open to others (must be ours, mode 0700)";
    else if (explicit_path && err == -ENOENT)
        why = "no such directory (MEMLAN_FABRIC_CREATE=1 creates it)";
    snprintf(buf, len, "%s", why);
    return buf;
}

void memlan_fabric_close(memlan_fabric_t *fab)
{
    if (!fab)
        return;
    __ml_chan_pool_drain(fab);
    __ml_sys_close(fab->dirfd);
    __ml_free(fab);
}

const char *memlan_fabric_path(const memlan_fabric_t *fab) { return fab ? fab->path : NULL; }

/*
 * An explicit clean (memlan_fabric_clean, `memlan clean`) by the fabric directory's owner in a
 * shared fabric: the other members' private files (their channels, 0600 with an ACL naming the
 * two ends; their stat records, 0644) cannot be opened, so their lock bytes cannot be probed,
 * yet the directory's owner may remove them (the sticky bit lets it).  The kernel lists every
 * OFD lock in /proc/locks (by device and inode, whoever holds it, in any pid namespace), which
 * any user may read: a file whose owner's byte and bridge byte no lock covers is dead, provided
 * it was last modified more than ML_CLEAN_YOUNG_S ago (its creator locks it right after
 * creating it, O_EXCL; a file not yet locked may be that young).  Only the explicit clean does this (never the lazy
 * sweep, which runs inside other programs); everything it could not judge or remove is counted
 * for the caller to say.
 */
#define ML_CLEAN_YOUNG_S 10

struct ml_lockent {
    uint64_t dev, ino;
};

struct ml_clean_ctx {
    struct ml_clean_report *rep;
    bool dir_owner;        /* we own the directory: we may remove any file in it */
    int nlocks;            /* -1: /proc/locks not read yet; -2: unreadable */
    struct ml_lockent *locks; /* locks covering byte 0 or 2, sorted */
};

static int ml_lockent_cmp(const void *a, const void *b)
{
    const struct ml_lockent *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* Read /proc/locks once: the (device, inode) of every lock (held or waited for) that covers
 * byte ML_LOCK_OWNER or its bridge byte. */
static void ml_clean_read_locks(struct ml_clean_ctx *cx)
{
    cx->nlocks = -2;
    long fd = __ml_sys_open(AT_FDCWD, "/proc/locks", O_RDONLY, 0);
    if (fd < 0)
        return;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf)
            break;
        if (len == cap) {
            if (cap >= (64u << 20)) /* bounded: a table this big is not read whole */
                break;
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        ssize_t n = __ml_sys_read((int)fd, buf + len, cap - len);
        if (n == -EINTR)
            continue;
        if (n <= 0) {
            if (n == 0) {
                buf[len] = 0;
                cx->nlocks = 0;
            }
            break;
        }
        len += (size_t)n;
    }
    __ml_sys_close((int)fd);
    if (cx->nlocks != 0) {
        __ml_free(buf);
        return;
    }
    size_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    cx->locks = malloc((lines + 1) * sizeof *cx->locks);
    if (!cx->locks) {
        __ml_free(buf);
        cx->nlocks = -2;
        return;
    }
    int n = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        /* "1: OFDLCK  ADVISORY  WRITE -1 00:1b:1249797 0 0", a waiter with "->" before the
         * type; the end is a number or EOF.  The device field is the first with two colons. */
        char *tok, *save = NULL;
        unsigned maj, min;
        unsigned long long ino, start = 0, end = 0;
        bool got = false, eof = false;
        int after = 0;
        for (tok = strtok_r(line, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
            if (!got) {
                char c;
                if (sscanf(tok, "%x:%x:%llu%c", &maj, &min, &ino, &c) == 3)
                    got = true;
                continue;
            }
            if (after == 0)
                start = strtoull(tok, NULL, 10);
            else if (after == 1) {
                eof = strcmp(tok, "EOF") == 0;
                end = eof ? 0 : strtoull(tok, NULL, 10);
            }
            after++;
        }
        if (!got || after < 2)
            continue;
        bool covers = false;
        for (unsigned long long b = ML_LOCK_OWNER; b <= ML_LOCK_BRIDGE(ML_LOCK_OWNER); b += 2)
            covers |= start <= b && (eof || end >= b);
        if (covers)
            cx->locks[n++] = (struct ml_lockent){makedev(maj, min), ino};
    }
    __ml_free(buf);
    qsort(cx->locks, (size_t)n, sizeof *cx->locks, ml_lockent_cmp);
    cx->nlocks = n;
}

static void ml_clean_note(int *count, char *first, size_t len, const char *name)
{
    if ((*count)++ == 0)
        snprintf(first, len, "%s", name);
}

/* name could not be opened (err): judge it by /proc/locks where we may remove it.  1 if removed
 * (its doorbell too, counted). */
static int ml_clean_unopened(memlan_fabric_t *fab, struct ml_clean_ctx *cx, const char *name,
                             long err)
{
    struct ml_clean_report *rep = cx->rep;
    struct stat st;
    if (err != -EACCES && err != -EPERM)
        return 0; /* gone meanwhile, or not ours to judge (a FIFO, a link) */
    if (!cx->dir_owner || __ml_sys_fstatat(fab->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode)) {
        ml_clean_note(&rep->unopened, rep->unopened_name, sizeof rep->unopened_name, name);
        return 0;
    }
    if (cx->nlocks == -1)
        ml_clean_read_locks(cx);
    if (cx->nlocks < 0) {
        ml_clean_note(&rep->unopened, rep->unopened_name, sizeof rep->unopened_name, name);
        return 0;
    }
    struct ml_lockent key = {(uint64_t)st.st_dev, (uint64_t)st.st_ino};
    if (bsearch(&key, cx->locks, (size_t)cx->nlocks, sizeof key, ml_lockent_cmp))
        return 0; /* live */
    /* Its age by mtime, a bound from below (creation sets it, writes move it on; unlinking
     * another name of it, as this sweep does with an offer's, moves only ctime). */
    if (time(NULL) - st.st_mtime <= ML_CLEAN_YOUNG_S) {
        ml_clean_note(&rep->young, rep->young_name, sizeof rep->young_name, name);
        return 0;
    }
    /* Remove the name only if it still names the inode we judged. */
    struct stat b;
    if (__ml_sys_fstatat(fab->dirfd, name, &b, AT_SYMLINK_NOFOLLOW) != 0 ||
        b.st_ino != st.st_ino || b.st_dev != st.st_dev)
        return 0;
    long r = __ml_sys_unlinkat(fab->dirfd, name, 0);
    if (r < 0) {
        ml_clean_note(&rep->kept, rep->kept_name, sizeof rep->kept_name, name);
        return 0;
    }
    int removed = 1;
    if (strncmp(name, "seg-", 4) == 0) {
        char bell[80];
        __ml_fabric_name(bell, sizeof bell, "bell", name + 4);
        if (__ml_sys_unlinkat(fab->dirfd, bell, 0) == 0)
            removed++;
    }
    return removed;
}

/* Open name (a regular file, never a FIFO or a link) and take its owner's byte without waiting:
 * the fd, the owner gone, or -1.  *st: the opened file, to check that name still names it.
 * *err: why the open failed (0 when it did not). */
static long ml_reclaim_lock_err(memlan_fabric_t *fab, const char *name, struct stat *st,
                                long *err)
{
    long fd = __ml_sys_open(fab->dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0);
    *err = fd < 0 ? fd : 0;
    if (fd < 0)
        return -1;
    if (__ml_sys_fstat((int)fd, st) == 0 && S_ISREG(st->st_mode) &&
        __ml_sys_lock_byte((int)fd, ML_LOCK_OWNER, 0) == 0)
        return fd;
    __ml_sys_close((int)fd);
    return -1;
}

static long ml_reclaim_lock(memlan_fabric_t *fab, const char *name, struct stat *st)
{
    long err;
    return ml_reclaim_lock_err(fab, name, st, &err);
}

/* Does name still name the file st describes? */
static bool ml_still_names(memlan_fabric_t *fab, const char *name, const struct stat *st)
{
    struct stat b;
    return __ml_sys_fstatat(fab->dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
           st->st_ino == b.st_ino && st->st_dev == b.st_dev;
}

/* Remove seg-TOKEN if its owner's lock byte is free; 1 if removed.  cx: an explicit clean's
 * account (NULL in the lazy sweep). */
static int ml_reclaim_seg_cx(memlan_fabric_t *fab, const char *name, struct ml_clean_ctx *cx)
{
    struct stat a;
    long err;
    long fd = ml_reclaim_lock_err(fab, name, &a, &err);
    if (fd < 0)
        return cx && err < 0 ? ml_clean_unopened(fab, cx, name, err) : 0;
    int removed = 0;
    /* We hold the owner's byte; if nobody holds its bridge the owner is gone (or is between
     * creating the file and locking it; its nlink check after locking makes it start again).
     * A channel's second side may live on (its attacher's byte, or its bridge across an exec):
     * it may still open the file by name to carry the connection across an exec or over
     * SCM_RIGHTS, and removes the name itself at its close (channel.c, ML_SOCK_NAME_LEFT and a
     * creator seen dead); removed here, an inetd-style server's child lost the line a one-shot
     * client had sent before it exited (a review).  Remove the name only if it still names the
     * inode we locked. */
    long u = -1;
    if (__ml_sys_byte_held((int)fd, ML_LOCK_BRIDGE(ML_LOCK_OWNER)) == 0 &&
        __ml_sys_byte_held((int)fd, ML_LOCK_ATTACHER) == 0 &&
        __ml_sys_byte_held((int)fd, ML_LOCK_BRIDGE(ML_LOCK_ATTACHER)) == 0 &&
        ml_still_names(fab, name, &a) && (u = __ml_sys_unlinkat(fab->dirfd, name, 0)) < 0 &&
        cx && (u == -EPERM || u == -EACCES))
        ml_clean_note(&cx->rep->kept, cx->rep->kept_name, sizeof cx->rep->kept_name, name);
    if (u == 0) {
        removed = 1;
        if (strncmp(name, "seg-", 4) == 0) {
            /* an event queue's doorbell goes with it, and a channel's sides' SIGIO and SIGURG
             * FIFOs (channel.c, __ml_chan_sio_open) */
            static const char *const fifo[] = {"bell", "sio0", "sio1", "urg0", "urg1"};
            for (size_t i = 0; i < sizeof fifo / sizeof fifo[0]; i++) {
                char f[80];
                __ml_fabric_name(f, sizeof f, fifo[i], name + 4);
                if (__ml_sys_unlinkat(fab->dirfd, f, 0) == 0)
                    removed++;
            }
        }
    }
    __ml_sys_close((int)fd);
    return removed;
}

/* Remove ep-NAME and its socket ep-NAME.sock if nobody holds the name's lock: the socket
 * first, both while we hold the lock (endpoint.c binds only under it). */
static int ml_reclaim_ep(memlan_fabric_t *fab, const char *name)
{
    char sock[NAME_MAX + 1];
    if (snprintf(sock, sizeof sock, "%s.sock", name) >= (int)sizeof sock)
        return 0;
    struct stat a;
    long fd = ml_reclaim_lock(fab, name, &a);
    if (fd < 0)
        return 0;
    int removed = 0;
    if (ml_still_names(fab, name, &a)) {
        if (__ml_sys_unlinkat(fab->dirfd, sock, 0) == 0)
            removed++;
        if (__ml_sys_unlinkat(fab->dirfd, name, 0) == 0)
            removed++;
    }
    __ml_sys_close((int)fd);
    return removed;
}

static int ml_reclaim_seg(memlan_fabric_t *fab, const char *name)
{
    return ml_reclaim_seg_cx(fab, name, NULL);
}

int __ml_fabric_reclaim_name(memlan_fabric_t *fab, const char *name)
{
    return ml_reclaim_seg(fab, name);
}

static int ml_fabric_reclaim_cx(memlan_fabric_t *fab, struct ml_clean_ctx *cx, bool ask);

int __ml_fabric_reclaim(memlan_fabric_t *fab) { return ml_fabric_reclaim_cx(fab, NULL, false); }

int __ml_fabric_clean_report(memlan_fabric_t *fab, struct ml_clean_report *rep)
{
    if (!fab || !rep)
        return -EINVAL;
    memset(rep, 0, sizeof *rep);
    struct stat d;
    int r = __ml_sys_fstat(fab->dirfd, &d);
    if (r < 0)
        return r;
    rep->dir_uid = (uint32_t)d.st_uid;
    struct ml_clean_ctx cx = {.rep = rep, .dir_owner = d.st_uid == geteuid() && fab->shared,
                              .nlocks = -1};
    r = ml_fabric_reclaim_cx(fab, &cx, true);
    __ml_free(cx.locks);
    if (r >= 0)
        rep->removed = r;
    return r;
}

/*
 * A listener record (ls-NETNS-PORT) that nobody holds locked may still have live listeners: one
 * need not hold the lock (a listening socket passed over SCM_RIGHTS, whose publisher is gone:
 * haproxy's seamless reload).  The record names the sockets published in it (lsock); true while
 * one of them may still listen on the port: always where we may not ask the kernel (ask false:
 * a sweep in a process of the preload's that may be sandboxed, which asks nothing), and where
 * the kernel cannot say or lists one as listening.  A record of another namespace than ours, or
 * one that names no socket (an older memlan's), is judged by its lock alone, as before.
 */
static bool ml_lrec_may_listen(memlan_fabric_t *fab, const char *name, bool ask)
{
    unsigned long long ns;
    int port, end = 0;
    struct stat me;
    if (sscanf(name, "ls-%llx-%d%n", &ns, &port, &end) != 2 || name[end] != 0 || port <= 0 ||
        port > 65535 ||
        (__ml_sys_fstatat(AT_FDCWD, "/proc/thread-self/ns/net", &me, 0) < 0 &&
         __ml_sys_fstatat(AT_FDCWD, "/proc/self/ns/net", &me, 0) < 0) ||
        (unsigned long long)me.st_ino != ns)
        return false;
    long fd = __ml_sys_open(fab->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0)
        return false;
    /* A listener holds its lock: live, and nothing to ask (the reclaim would keep it anyway). */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_len = 1};
    if (__ml_sys_fcntl((int)fd, F_OFD_GETLK, (long)&fl) == 0 && fl.l_type != F_UNLCK) {
        __ml_sys_close((int)fd);
        return true;
    }
    struct ml_listen_rec m;
    struct stat st;
    bool named = false, full = false;
    if (__ml_sys_fstat((int)fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (size_t)st.st_size >= sizeof m &&
        __ml_sys_read((int)fd, &m, sizeof m) == (ssize_t)sizeof m && m.magic == ML_LREC_MAGIC) {
        for (unsigned i = 0; i < ML_LREC_LSOCKS; i++)
            named |= m.lsock[i] != 0;
        full = m.lsock_full != 0;
    }
    __ml_sys_close((int)fd);
    if (!named && !full)
        return false;
    if (!ask || __ml_sys_seccomp_mode() != 0)
        return true; /* a filter may kill for the netlink socket (one no interposer saw) */
    /* Slots that cannot tell (more listeners than they hold, or a member of a shared fabric
     * wrote the flag: the chaos suite's vandal left a dead server's record that no `memlan
     * clean` removed): alive while anything at all listens on the port, or unknown. */
    if (full)
        return __ml_sys_tcp_listeners_but(port, 0) != 0;
    uint32_t inos[ML_LREC_LSOCKS];
    bool listens[ML_LREC_LSOCKS];
    for (unsigned i = 0; i < ML_LREC_LSOCKS; i++)
        inos[i] = m.lsock[i];
    return __ml_sys_tcp_listening(port, inos, ML_LREC_LSOCKS, listens) != 0; /* or unknown */
}

/* Does the fabric's path still name its directory for this process?  Not after a chroot (the
 * preload opens the fabric before one: postfix's chrooted smtp client), nor in another mount
 * namespace: there the rpc- and ep- sockets, checked by path, would read ENOENT as "nobody
 * listens" and be unlinked from under live servers. */
static bool ml_fabric_path_is_dir(memlan_fabric_t *fab)
{
    struct stat a, b;
    return __ml_sys_fstat(fab->dirfd, &a) == 0 &&
           __ml_sys_fstatat(AT_FDCWD, fab->path, &b, 0) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

static int ml_fabric_reclaim_cx(memlan_fabric_t *fab, struct ml_clean_ctx *cx, bool ask)
{
    long dfd = __ml_sys_open(fab->dirfd, ".", O_RDONLY | O_DIRECTORY, 0);
    if (dfd < 0)
        return (int)dfd;
    int removed = 0;
    int by_path = -1; /* ml_fabric_path_is_dir, asked at the first socket met */
    char buf[8192];
    for (;;) {
        int n = __ml_sys_getdents((int)dfd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (int off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            const char *nm = d->d_name;
            if (strncmp(nm, "seg-", 4) == 0 && __ml_token_valid(nm + 4)) {
                removed += ml_reclaim_seg_cx(fab, nm, cx);
            } else if (strncmp(nm, "ls-", 3) == 0) {
                /* A listener record: its listeners hold read locks on byte 0, and those that
                 * hold none are looked for by their sockets. */
                if (!ml_lrec_may_listen(fab, nm, ask))
                    removed += ml_reclaim_seg_cx(fab, nm, cx);
            } else if (strncmp(nm, "la-", 3) == 0) {
                /* An address record (src/preload/negotiate.c): a symbolic link to a listener
                 * record, stale once that record is gone or no listener holds it. */
                char t[64];
                ssize_t tn = readlinkat(fab->dirfd, nm, t, sizeof t - 1);
                if (tn <= 0 || tn >= (ssize_t)sizeof t - 1)
                    continue;
                t[tn] = 0;
                bool live = false;
                long tfd = strncmp(t, "ls-", 3) == 0 && !strchr(t, '/')
                               ? __ml_sys_open(fab->dirfd, t, O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0)
                               : -ENOENT;
                if (tfd >= 0) {
                    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_len = 1};
                    live = __ml_sys_fcntl((int)tfd, F_OFD_GETLK, (long)&fl) == 0 &&
                           fl.l_type != F_UNLCK;
                    __ml_sys_close((int)tfd);
                }
                if (!live && __ml_sys_unlinkat(fab->dirfd, nm, 0) == 0)
                    removed++;
            } else if (strncmp(nm, "cx-", 3) == 0) {
                /* An offer is a second name of a channel's file: stale once the channel's
                 * creator is gone (the owner's lock is free).  A small file is a refusal that
                 * nobody came for: stale after 10 s. */
                struct stat st;
                if (__ml_sys_fstatat(fab->dirfd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0)
                    continue;
                if (S_ISREG(st.st_mode) && st.st_size >= ML_PAGE) {
                    removed += ml_reclaim_seg_cx(fab, nm, cx);
                } else if (time(NULL) - st.st_mtime > 10 &&
                           __ml_sys_unlinkat(fab->dirfd, nm, 0) == 0) {
                    removed++;
                }
            } else if (strncmp(nm, "rpc-", 4) == 0 && strlen(nm) > 9 &&
                       strcmp(nm + strlen(nm) - 5, ".sock") == 0 &&
                       (by_path < 0 ? (by_path = ml_fabric_path_is_dir(fab)) : by_path)) {
                /* An RPC server's rendezvous (src/rpc/rpc.c): stale once nobody listens
                 * there (its server was killed before its atexit could remove it). */
                char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
                int pn = snprintf(path, sizeof path, "%s/%s", fab->path, nm);
                if (pn > 0 && (size_t)pn < sizeof path && __ml_sys_unix_listening(path) == 0 &&
                    __ml_sys_unlinkat(fab->dirfd, nm, 0) == 0)
                    removed++;
            } else if (strncmp(nm, "ep-", 3) == 0) {
                /* A named endpoint (endpoint.c): ep-NAME is free once nobody holds its lock.
                 * Its socket goes with it, under that lock: a server binds ep-NAME.sock only
                 * while it holds the lock of the ep-NAME it found, so nothing we remove while
                 * holding it can be a live server's (removing the socket after the lock file,
                 * or on seeing no lock file, took a new server's socket from under it). */
                size_t len = strlen(nm);
                if (len > 8 && strcmp(nm + len - 5, ".sock") == 0) {
                    if (by_path < 0)
                        by_path = ml_fabric_path_is_dir(fab);
                    if (!by_path)
                        continue;
                    /* Without its lock file: a leftover (the lock file went some other way)
                     * once nothing listens there and it is older than any bind-to-listen gap. */
                    char lock[NAME_MAX + 1], path[sizeof(((struct sockaddr_un *)0)->sun_path)];
                    struct stat st, sk;
                    snprintf(lock, sizeof lock, "%.*s", (int)(len - 5), nm);
                    int pn = snprintf(path, sizeof path, "%s/%s", fab->path, nm);
                    if (__ml_sys_fstatat(fab->dirfd, lock, &st, AT_SYMLINK_NOFOLLOW) == -ENOENT &&
                        __ml_sys_fstatat(fab->dirfd, nm, &sk, AT_SYMLINK_NOFOLLOW) == 0 &&
                        time(NULL) - sk.st_ctime > 10 && pn > 0 && (size_t)pn < sizeof path &&
                        __ml_sys_unix_listening(path) == 0 &&
                        __ml_sys_unlinkat(fab->dirfd, nm, 0) == 0)
                        removed++;
                } else {
                    removed += ml_reclaim_ep(fab, nm);
                }
            } else if (strncmp(nm, "px-", 3) == 0) {
                /* A connection passed over SCM_RIGHTS (src/preload/negotiate.c): its receiver
                 * removes it as it takes the connection up, its passer after 10 s or at its
                 * exit().  One left by a passer that died first is stale once nobody holds the
                 * side it names (neither its byte nor its bridge byte is locked: the passer's
                 * bridge went with it), or after a minute. */
                struct stat st;
                if (__ml_sys_fstatat(fab->dirfd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0)
                    continue;
                bool stale = time(NULL) - st.st_mtime > 60;
                long rf = stale ? -1
                                : __ml_sys_open(fab->dirfd, nm, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
                if (rf >= 0) {
                    char rb[256], tok[40], seg[80];
                    int side = -1;
                    unsigned fl;
                    ssize_t rn = __ml_sys_read((int)rf, rb, sizeof rb - 1);
                    __ml_sys_close((int)rf);
                    if (rn > 0) {
                        rb[rn] = 0;
                        if (sscanf(rb, "memlan-pass 1 %d %u %32s", &side, &fl, tok) == 3 &&
                            (side == 0 || side == 1) && __ml_token_valid(tok)) {
                            __ml_fabric_name(seg, sizeof seg, "seg", tok);
                            long sf = __ml_sys_open(fab->dirfd, seg, O_RDONLY | O_NOFOLLOW, 0);
                            stale = sf < 0 ||
                                    (__ml_sys_byte_held((int)sf, side) == 0 &&
                                     __ml_sys_byte_held((int)sf, ML_LOCK_BRIDGE(side)) == 0);
                            if (sf >= 0)
                                __ml_sys_close((int)sf);
                        }
                    }
                }
                if (stale && __ml_sys_unlinkat(fab->dirfd, nm, 0) == 0)
                    removed++;
            } else if ((strncmp(nm, "bell-", 5) == 0 && __ml_token_valid(nm + 5)) ||
                       ((strncmp(nm, "sio", 3) == 0 || strncmp(nm, "urg", 3) == 0) &&
                        (nm[3] == '0' || nm[3] == '1') && nm[4] == '-' &&
                        __ml_token_valid(nm + 5))) {
                /* A doorbell outlives nothing: remove it once its queue's segment is gone; so
                 * does a channel side's SIGIO or SIGURG FIFO (channel.c, __ml_chan_sio_open). */
                char seg[80];
                struct stat st;
                __ml_fabric_name(seg, sizeof seg, "seg", nm + 5);
                if (__ml_sys_fstatat(fab->dirfd, seg, &st, AT_SYMLINK_NOFOLLOW) == -ENOENT &&
                    __ml_sys_unlinkat(fab->dirfd, nm, 0) == 0)
                    removed++;
            }
        }
    }
    __ml_sys_close((int)dfd);
    return removed;
}

void __ml_fabric_sweep_once_ask(memlan_fabric_t *fab, bool ask)
{
    if (!ml_load_relaxed(&fab->swept) && !ml_xchg(&fab->swept, true))
        (void)ml_fabric_reclaim_cx(fab, NULL, ask);
}

void __ml_fabric_sweep_once(memlan_fabric_t *fab)
{
    __ml_fabric_sweep_once_ask(fab, atomic_load_explicit(&fab->sweep_asks, memory_order_relaxed));
}

int memlan_fabric_clean(memlan_fabric_t *fab)
{
    struct ml_clean_report rep;
    return __ml_fabric_clean_report(fab, &rep);
}
