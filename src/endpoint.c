/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * endpoint.c - named endpoints: a server listens on a name in the fabric, a client connects by
 * that name.
 *
 * A name is not a capability: the channel token is.  The client creates a channel and sends its
 * token to the server over a Unix seqpacket socket in the fabric directory, ep-NAME.sock, so the
 * token never appears in a file and the directory's permissions decide who may connect (as for
 * every other fabric file).  The server attaches and answers one int32: 0, or the negative errno
 * that refused the channel.  The channel belongs to its creator, the client, like every channel.
 *
 * Who serves a name is decided by an OFD lock, not by the socket: a server first opens ep-NAME
 * (created if missing) and takes its owner byte without waiting.  The kernel drops that lock
 * when the server dies, so a name whose lock can be taken is free, and the taker removes a
 * leftover ep-NAME.sock before binding its own; two servers racing for a dead name cannot both
 * win.  A server checks after locking that ep-NAME still names the inode it locked: a closing
 * server or a sweep may have removed it a moment before (then it starts again).
 *
 * Accepting is level-triggered through one epoll fd that holds the listening socket and the
 * connections whose hello has not come yet, so an application's event loop can sleep on it; a
 * connection that sends no hello within ML_EP_HELLO_MS is dropped.
 *
 * The server attaches only a channel whose file belongs to the user the kernel says connected
 * (SO_PEERCRED): a client cannot make the server take up a channel another user created by
 * sending its token.  Only the process that listened removes the names at close: a fork child
 * that closes its inherited copy leaves the parent's name served.  The sweep (fabric.c) removes
 * ep-NAME.sock only while holding ep-NAME's lock, so it never takes a live server's socket.
 */
#include "internal.h"
#include "channel.h"
#include "sys/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>

#define ML_EP_MAGIC 0x6d6c6570u /* "mlep" */
#define ML_EP_VERSION 1u
#define ML_EP_PENDING 64      /* connections waiting for their hello */
#define ML_EP_HELLO_MS 2000   /* how long one may take to send it */
#define ML_EP_LISTEN_FD UINT64_MAX

struct ml_ep_hello {
    uint32_t magic, version;
    char token[MEMLAN_TOKEN_LEN + 1];
    char pad[7];
};
_Static_assert(sizeof(struct ml_ep_hello) == 48, "hello layout");

struct ml_ep_pending {
    int fd;
    uint64_t since_ns;
};

struct memlan_listener {
    memlan_fabric_t *fab;
    int kind;
    pid_t pid;                /* the process that listened: only it removes the names */
    int lockfd, lfd, epfd;
    int npending;
    struct ml_ep_pending pending[ML_EP_PENDING];
    char name[MEMLAN_NAME_MAX + 1];
    char lockname[MEMLAN_NAME_MAX + 8];
    char sockname[MEMLAN_NAME_MAX + 16];
};

/* 0 when name may be served, else -EINVAL or -ENAMETOOLONG; fills the socket address. */
static int ml_ep_addr(const memlan_fabric_t *fab, const char *name, struct sockaddr_un *sa)
{
    if (!fab || !name || !*name)
        return -EINVAL;
    size_t n = strnlen(name, MEMLAN_NAME_MAX + 1);
    if (n > MEMLAN_NAME_MAX)
        return -ENAMETOOLONG;
    for (size_t i = 0; i < n; i++)
        if (name[i] == '/' || (unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return -EINVAL;
    /* ep-NAME.sock is the rendezvous of NAME: a name ending in .sock would make its own lock
     * file look like another name's socket to the fabric's sweep, which would remove it. */
    if (n >= 5 && strcmp(name + n - 5, ".sock") == 0)
        return -EINVAL;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int w = snprintf(sa->sun_path, sizeof sa->sun_path, "%s/ep-%s.sock", fab->path, name);
    return w < 0 || (size_t)w >= sizeof sa->sun_path ? -ENAMETOOLONG : 0;
}

static int ml_ep_timeleft(uint64_t deadline, int timeout_ms)
{
    if (timeout_ms < 0)
        return -1;
    uint64_t now = __ml_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
}

/* Take the name: lock ep-NAME's owner byte.  Returns the locked fd or a negative errno. */
static int ml_ep_take(memlan_fabric_t *fab, const char *lockname)
{
    int busy = 0;
    for (int tries = 0; tries < 8; tries++) {
        long fd = __ml_sys_open(fab->dirfd, lockname, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
        if (fd < 0)
            return (int)fd;
        struct stat a, b;
        int r = __ml_sys_lock_byte((int)fd, ML_LOCK_OWNER, 0);
        if (r == 0)
            r = __ml_sys_fstat((int)fd, &a);
        if (r == 0 && __ml_sys_fstatat(fab->dirfd, lockname, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            if (fab->shared) /* another user's server may take the name once we are gone */
                (void)__ml_sys_fchmod((int)fd, 0666);
            return (int)fd;
        }
        __ml_sys_close((int)fd);
        if (r == -EAGAIN) {
            /* A live server holds it, or a sweep does for a moment (it locks a name to see
             * whether it is free): look again a few times before saying the name is taken. */
            if (++busy > 20)
                return -EADDRINUSE;
            (void)__ml_sys_poll1(-1, 0, 1);
            tries--;
            continue;
        }
        if (r < 0)
            return r;
        /* Removed between our open and our lock: try again with a fresh file. */
    }
    return -EADDRINUSE;
}

int memlan_listen(memlan_fabric_t *fab, const char *name, int kind, memlan_listener_t **out)
{
    if (!out)
        return -EINVAL;
    *out = NULL;
    if (kind != 0 && kind != MEMLAN_STREAM && kind != MEMLAN_MSG)
        return -EINVAL;
    struct sockaddr_un sa;
    int r = ml_ep_addr(fab, name, &sa);
    if (r < 0)
        return r;
    memlan_listener_t *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->fab = fab;
    l->kind = kind;
    l->pid = __ml_sys_getpid();
    l->lfd = l->epfd = -1;
    snprintf(l->name, sizeof l->name, "%s", name);
    snprintf(l->lockname, sizeof l->lockname, "ep-%s", name);
    snprintf(l->sockname, sizeof l->sockname, "ep-%s.sock", name);
    __ml_fabric_sweep_once(fab);
    if ((r = l->lockfd = ml_ep_take(fab, l->lockname)) < 0) {
        __ml_free(l);
        return r;
    }
    /* The name is ours: a socket file there is a dead server's. */
    (void)__ml_sys_unlinkat(fab->dirfd, l->sockname, 0);
    if ((r = l->lfd = __ml_sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC,
                                      0)) < 0 ||
        (r = __ml_sys_bind(l->lfd, &sa, sizeof sa)) < 0 ||
        (r = __ml_sys_fchmodat(fab->dirfd, l->sockname, fab->shared ? 0666 : 0600)) < 0 ||
        (r = __ml_sys_listen(l->lfd, 128)) < 0 || (r = l->epfd = __ml_sys_epoll_create()) < 0 ||
        (r = __ml_sys_epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->lfd, EPOLLIN, ML_EP_LISTEN_FD)) < 0) {
        memlan_listener_close(l);
        return r;
    }
    *out = l;
    return 0;
}

static void ml_ep_drop(memlan_listener_t *l, int i)
{
    (void)__ml_sys_epoll_ctl(l->epfd, EPOLL_CTL_DEL, l->pending[i].fd, 0, 0);
    __ml_sys_close(l->pending[i].fd);
    l->pending[i] = l->pending[--l->npending];
}

/* Take the new connections off the listening socket. */
static void ml_ep_accept_all(memlan_listener_t *l)
{
    for (;;) {
        int fd = __ml_sys_accept4(l->lfd, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (l->npending == ML_EP_PENDING ||
            __ml_sys_epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, EPOLLIN, (uint64_t)fd) < 0) {
            __ml_sys_close(fd); /* the client sees its socket closed: -ECONNREFUSED */
            continue;
        }
        l->pending[l->npending++] = (struct ml_ep_pending){fd, __ml_now_ns()};
    }
}

/* A pending connection is readable: its hello.  1 and *out when it gave us a channel. */
static int ml_ep_hello(memlan_listener_t *l, int i, memlan_channel_t **out)
{
    struct ml_ep_hello h;
    ssize_t n = __ml_sys_recv(l->pending[i].fd, &h, sizeof h);
    if (n == -EAGAIN || n == -EINTR)
        return 0;
    int32_t answer = -EPROTO;
    memlan_channel_t *ch = NULL;
    uint32_t uid;
    if (n == (ssize_t)sizeof h && h.magic == ML_EP_MAGIC && h.version == ML_EP_VERSION &&
        __ml_token_valid(h.token)) {
        /* The channel must be the connecting user's own: its file's owner is the kernel's
         * word, as the socket's peer credentials are. */
        answer = __ml_sys_peer_uid(l->pending[i].fd, &uid);
        if (answer == 0)
            answer = __ml_chan_attach_uid(l->fab, h.token, uid, &ch);
        if (answer == 0 && l->kind && memlan_channel_kind(ch) != l->kind) {
            answer = -EPROTOTYPE;
            memlan_channel_close(ch);
            ch = NULL;
        }
    } else if (n <= 0) {
        ml_ep_drop(l, i); /* the client hung up before its hello */
        return 0;
    } else if (n >= 8 && h.magic == ML_EP_MAGIC && h.version != ML_EP_VERSION) {
        answer = -EPROTONOSUPPORT;
    }
    /* A client that gave up meanwhile closed its channel: our attach failed (-ECONNREFUSED)
     * or, a moment later, the channel reads EOF; either way the answer may go nowhere. */
    (void)__ml_sys_send(l->pending[i].fd, &answer, sizeof answer);
    ml_ep_drop(l, i);
    if (!ch)
        return 0;
    *out = ch;
    return 1;
}

int memlan_accept(memlan_listener_t *l, int timeout_ms, memlan_channel_t **out)
{
    if (!l || !out)
        return -EINVAL;
    *out = NULL;
    uint64_t deadline = __ml_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    for (;;) {
        /* Drop the connections whose hello never came, and wake in time for the next. */
        uint64_t now = __ml_now_ns(), hello_ns = ML_EP_HELLO_MS * 1000000ull;
        int wait = ml_ep_timeleft(deadline, timeout_ms);
        for (int i = l->npending - 1; i >= 0; i--) {
            uint64_t age = now - l->pending[i].since_ns;
            if (age >= hello_ns) {
                ml_ep_drop(l, i);
                continue;
            }
            int left = (int)((hello_ns - age + 999999) / 1000000);
            if (wait < 0 || left < wait)
                wait = left;
        }
        struct epoll_event ev[16];
        int n = __ml_sys_epoll_wait(l->epfd, ev, 16, wait);
        if (n == -EINTR)
            continue;
        if (n < 0)
            return n;
        for (int e = 0; e < n; e++) {
            if (ev[e].data.u64 == ML_EP_LISTEN_FD) {
                ml_ep_accept_all(l);
                continue;
            }
            for (int i = 0; i < l->npending; i++)
                if ((uint64_t)l->pending[i].fd == ev[e].data.u64) {
                    if (ml_ep_hello(l, i, out))
                        return 0; /* the other events stay pending: epoll is level-triggered */
                    break;
                }
        }
        /* On every pass, not only an empty one: a listening socket that stays readable (accept
         * failing with EMFILE) or a stream of bad hellos must not keep us past the deadline. */
        if (ml_ep_timeleft(deadline, timeout_ms) == 0)
            return timeout_ms == 0 ? -EAGAIN : -ETIMEDOUT;
    }
}

int memlan_listener_fd(const memlan_listener_t *l) { return l ? l->epfd : -EINVAL; }

const char *memlan_listener_name(const memlan_listener_t *l) { return l ? l->name : NULL; }

void memlan_listener_close(memlan_listener_t *l)
{
    if (!l)
        return;
    while (l->npending)
        ml_ep_drop(l, l->npending - 1);
    /* The names are the listening process's: a fork child that closes the copy it inherited
     * must not take them from a parent that still serves (the lock, on the open file they
     * share, stays held until both have closed).  A child left alone after its parent died
     * leaves them to the sweep, which finds the lock free once it closes. */
    bool mine = l->pid == __ml_sys_getpid();
    /* The socket's name first, then the lock file's: while the lock is held nobody else binds. */
    if (l->lfd >= 0) {
        if (mine)
            (void)__ml_sys_unlinkat(l->fab->dirfd, l->sockname, 0);
        __ml_sys_close(l->lfd);
    }
    if (l->epfd >= 0)
        __ml_sys_close(l->epfd);
    if (mine)
        (void)__ml_sys_unlinkat(l->fab->dirfd, l->lockname, 0);
    __ml_sys_close(l->lockfd);
    __ml_free(l);
}

int memlan_connect(memlan_fabric_t *fab, const char *name, const struct memlan_channel_opts *opts,
                   int timeout_ms, memlan_channel_t **out)
{
    if (!out)
        return -EINVAL;
    *out = NULL;
    struct sockaddr_un sa;
    int r = ml_ep_addr(fab, name, &sa);
    if (r < 0)
        return r;
    /* timeout_ms 0: one try (a busy server is -EAGAIN at once) and the server's answer awaited
     * as long as a server waits for a hello; it cannot come in no time at all. */
    bool once = timeout_ms == 0;
    if (once)
        timeout_ms = ML_EP_HELLO_MS;
    uint64_t deadline = __ml_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    int s = __ml_sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return s;
    memlan_channel_t *ch = NULL;
    /* A full backlog answers EAGAIN: the server is busy, not absent; try again until the time
     * runs out. */
    while ((r = __ml_sys_connect(s, &sa, sizeof sa)) == -EAGAIN) {
        if (once)
            goto out; /* -EAGAIN */
        int left = ml_ep_timeleft(deadline, timeout_ms);
        if (left == 0) {
            r = -ETIMEDOUT;
            goto out;
        }
        (void)__ml_sys_poll1(-1, 0, 1);
    }
    if (r == -ENOENT)
        r = -ECONNREFUSED; /* nobody serves the name */
    if (r < 0)
        goto out;
    /* In a shared fabric the channel is its two ends' alone: the server's user (the kernel's
     * word: the credentials its listening socket was made with) is granted it by an ACL before
     * the token leaves us; nobody else of the group can open it. */
    struct ml_access acc = {0};
    if (fab->shared) {
        uint32_t su;
        if ((r = __ml_sys_peer_uid(s, &su)) < 0)
            goto out;
        if (su != 0 && su != (uint32_t)geteuid())
            acc = (struct ml_access){.n = 1, .uids = {su}};
    }
    if ((r = __ml_chan_create_for(fab, opts, &acc, &ch)) < 0)
        goto out;
    struct ml_ep_hello h = {.magic = ML_EP_MAGIC, .version = ML_EP_VERSION};
    memcpy(h.token, memlan_channel_token(ch), sizeof h.token);
    if ((r = (int)__ml_sys_send(s, &h, sizeof h)) < 0)
        goto out;
    int32_t answer;
    for (;;) {
        r = __ml_sys_poll1(s, POLLIN, ml_ep_timeleft(deadline, timeout_ms));
        if (r == -EINTR)
            continue;
        if (r == 0)
            r = -ETIMEDOUT;
        if (r < 0)
            goto out;
        ssize_t n = __ml_sys_recv(s, &answer, sizeof answer);
        if (n == -EAGAIN || n == -EINTR)
            continue;
        /* The server closed without a word: its queue was full, or it went away. */
        r = n == (ssize_t)sizeof answer ? (answer <= 0 && answer > -4096 ? answer : -EPROTO)
            : n < 0 ? (int)n : -ECONNREFUSED;
        break;
    }
out:
    __ml_sys_close(s);
    if (r < 0) {
        if (ch)
            memlan_channel_close(ch);
        return r;
    }
    *out = ch;
    return 0;
}
