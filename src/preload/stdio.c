/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * stdio.c - FILE streams on accelerated sockets.
 *
 * glibc's stdio moves a stream's bytes with libc-internal read and write calls that no
 * interposer sees: fprintf, fwrite or fgets on a FILE whose fd is an accelerated socket would
 * read or write the idle kernel socket under the channel, and the stream would take two paths
 * (git's upload-pack writes its ref advertisement with fwrite on stdout, its pack with write).
 * The rule: every FILE through which stdio can reach an accelerated socket is a stream of ours,
 * made with fopencookie, whose read, write and close go through the interposed calls on the
 * stream's fd, so its bytes take the channel like every other call's.  fileno() keeps answering
 * the fd: a cookie stream's _fileno (glibc marks it -2, "no file") is set to the fd, which
 * glibc's file functions then use only to see that the stream is open.
 *
 *  - fdopen() of an accelerated (or undecided) connection returns such a stream, after glibc's
 *    mode checks (EINVAL; "a" sets O_APPEND on the fd);
 *  - stdin, stdout and stderr are replaced (glibc lets a program assign them) by such a stream
 *    whenever an accelerated connection lands on fd 0, 1 or 2: carried across exec (an
 *    inetd-style child such as git daemon's), by dup, dup2, dup3 or F_DUPFD onto it, or returned
 *    there by accept or connect's socket.  The new stream takes the old one's buffering, its
 *    pending output (the kernel would have written it to the new fd 1) and its unread input
 *    (glibc would return stdin's read-ahead first).  Only glibc's static stream or a live
 *    standard stream of ours is replaced, never a closed one; ours is then closed, fd kept.
 *    The old stream is taken with ftrylockfile: one another thread holds is left alone.  An
 *    undecided connection keeps glibc's stream (it may fall to TCP, where glibc's is right,
 *    wide output included; fopencookie streams are byte streams only).
 *  - the streams we made are flushed by our exit handler, before the connections go: glibc
 *    flushes only after every exit handler, when the bytes would reach the kernel socket.
 *
 * What stays out of reach (docs/design.md): a FILE made before the socket took its fd other
 * than the three standard ones, a pointer to the old standard stream kept by the program (ours
 * is freed when replaced), a standard stream another thread holds when a socket moves under it,
 * wide-character stdio on an accelerated connection, and a dup2 onto 0, 1 or 2 from a signal
 * handler (replacing a stream allocates: not async-signal-safe here).
 */
#include "preload.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ssize_t mlp_io_read(int fd, void *buf, size_t len);
ssize_t mlp_io_write(int fd, const void *buf, size_t len);
int mlp_io_close(int fd);

/* The cookie: the stream itself, known once fopencookie returned it; bytes a replaced stdin
 * had read from the fd and not handed out, served before the next read (pre); whether the
 * stream stands in for a standard one (std) and whether its close leaves the fd open (keep_fd:
 * a replaced standard stream of ours, whose fd now names the new connection). */
struct mlp_ck {
    FILE *f;
    char *pre;
    size_t pre_len, pre_off;
    bool std, keep_fd;
};

/* The streams memlan made and has not seen closed: the only streams other than glibc's static
 * three that a swap may replace.  Lock-free slots (a fork or a signal never finds a lock held); a
 * stream that finds no free slot is still made, but not replaced.  (glibc flushes them at exit,
 * after every exit handler, through the channel: exit() ends no connection, sock.c.) */
#define MLP_NSTREAMS 64
static FILE *_Atomic mlp_streams[MLP_NSTREAMS];
static struct mlp_ck *_Atomic mlp_cookies[MLP_NSTREAMS]; /* each stream's cookie */

static bool mlp_stream_track(FILE *f, struct mlp_ck *c)
{
    for (int i = 0; i < MLP_NSTREAMS; i++) {
        FILE *none = NULL;
        if (atomic_compare_exchange_strong(&mlp_streams[i], &none, f)) {
            atomic_store(&mlp_cookies[i], c);
            return true;
        }
    }
    return false;
}

static void mlp_stream_untrack(FILE *f)
{
    for (int i = 0; i < MLP_NSTREAMS; i++) {
        FILE *want = f;
        if (atomic_compare_exchange_strong(&mlp_streams[i], &want, NULL))
            return;
    }
}

/* The cookie of f if f is a live stream of ours, else NULL (f is only compared, never read). */
static struct mlp_ck *mlp_stream_cookie(FILE *f)
{
    for (int i = 0; i < MLP_NSTREAMS; i++)
        if (atomic_load(&mlp_streams[i]) == f)
            return atomic_load(&mlp_cookies[i]);
    return NULL;
}

static ssize_t mlp_ck_read(void *v, char *buf, size_t len)
{
    struct mlp_ck *c = v;
    if (c->pre) {
        size_t n = c->pre_len - c->pre_off;
        if (n > len)
            n = len;
        memcpy(buf, c->pre + c->pre_off, n);
        c->pre_off += n;
        if (c->pre_off == c->pre_len) {
            free(c->pre);
            c->pre = NULL;
        }
        return (ssize_t)n;
    }
    return mlp_io_read(c->f->_fileno, buf, len);
}

/* glibc's own file write loops until all is written or an error; a cookie's short count marks
 * the stream in error, so loop here the same way. */
static ssize_t mlp_ck_write(void *v, const char *buf, size_t len)
{
    struct mlp_ck *c = v;
    int fd = c->f->_fileno;
    size_t done = 0;
    while (done < len) {
        ssize_t r = mlp_io_write(fd, buf + done, len - done);
        if (r <= 0)
            return done ? (ssize_t)done : -1;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static int mlp_ck_seek(void *c, off64_t *pos, int whence)
{
    errno = ESPIPE; /* a socket cannot seek: what lseek says */
    return -1;
}

static int mlp_ck_close(void *v)
{
    struct mlp_ck *c = v;
    mlp_stream_untrack(c->f);
    int r = c->keep_fd ? 0 : mlp_io_close(c->f->_fileno);
    free(c->pre);
    free(c);
    return r;
}

static const cookie_io_functions_t mlp_ck_funcs = {
    .read = mlp_ck_read, .write = mlp_ck_write, .seek = mlp_ck_seek, .close = mlp_ck_close};

/* A stream of ours on fd, or NULL with fopencookie's errno (EINVAL for a bad mode, ENOMEM).
 * Its functions read the stream's _fileno at every call. */
static FILE *mlp_stream_ck(int fd, const char *mode, bool std, struct mlp_ck **ck)
{
    struct mlp_ck *c = calloc(1, sizeof *c);
    FILE *f = c ? fopencookie(c, mode, mlp_ck_funcs) : NULL;
    if (!f) {
        int e = errno;
        free(c);
        errno = e;
        return NULL;
    }
    c->f = f;
    c->std = std;
    f->_fileno = fd;
    if (!mlp_stream_track(f, c))
        mlp_log(1, "fd %d: more than %d streams through the channel: this one is not flushed "
                   "before memlan's exit handler", fd, MLP_NSTREAMS);
    *ck = c;
    return f;
}

static FILE *mlp_stream(int fd, const char *mode, bool std)
{
    struct mlp_ck *c;
    return mlp_stream_ck(fd, mode, std, &c);
}

/* A connection at fd that is not (or not yet) known to be TCP: what fdopen routes. */
static bool mlp_is_conn(int fd)
{
    struct mlp_sock *s = mlp_get(fd);
    bool conn = s && s->type == MLP_CONN && s->state != MLP_TCP;
    if (s)
        mlp_put(s);
    return conn;
}

/* glibc's fdopen mode: 'r', 'w' or 'a' first ('+' among the next four makes it read-write);
 * returns the O_ACCMODE it needs the fd to allow (O_RDWR: both), -1 if the mode is bad. */
static int mlp_mode(const char *mode, bool *append)
{
    int acc;
    *append = false;
    switch (mode[0]) {
    case 'r': acc = O_RDONLY; break;
    case 'w': acc = O_WRONLY; break;
    case 'a': acc = O_WRONLY, *append = true; break;
    default: return -1;
    }
    for (int i = 1; i < 5 && mode[i]; i++)
        if (mode[i] == '+') {
            acc = O_RDWR;
            break;
        }
    return acc;
}

MLP_EXPORT FILE *fdopen(int fd, const char *mode)
{
    if (ml_unlikely(!mlp_ready))
        mlp_init();
    if (mlp_inside || !mlp_is_conn(fd))
        return mlp_real_fdopen(fd, mode);
    int saved = errno;
    bool append;
    int acc = mlp_mode(mode, &append);
    if (acc < 0) {
        errno = EINVAL;
        return NULL;
    }
    int fl = mlp_real_fcntl(fd, F_GETFL, 0);
    if (fl < 0)
        return NULL; /* EBADF, as fdopen says */
    int have = fl & O_ACCMODE;
    if ((have == O_RDONLY && acc != O_RDONLY) || (have == O_WRONLY && acc != O_WRONLY)) {
        errno = EINVAL;
        return NULL;
    }
    if (append && !(fl & O_APPEND) && mlp_real_fcntl(fd, F_SETFL, fl | O_APPEND) < 0)
        return NULL;
    FILE *f = mlp_stream(fd, mode, false);
    if (!f)
        return NULL;
    errno = saved;
    mlp_log(1, "fd %d: fdopen: a stream through the channel", fd);
    return f;
}

#define MLP_IO_UNBUFFERED 0x0002  /* glibc's _IO_UNBUFFERED */
#define MLP_IO_NO_READS   0x0004  /* _IO_NO_READS */
#define MLP_IO_NO_WRITES  0x0008  /* _IO_NO_WRITES */
#define MLP_IO_LINE_BUF   0x0200  /* _IO_LINE_BUF */

extern FILE _IO_2_1_stdin_, _IO_2_1_stdout_, _IO_2_1_stderr_; /* glibc's static three */

/* Unread input of old (its buffer, then what its cookie still holds if it is ours) in a buffer
 * for the new stream; the old stream gives it up.  false: no memory (nothing moved). */
static bool mlp_take_input(FILE *old, struct mlp_ck *oc, struct mlp_ck *nc)
{
    size_t a = old->_IO_read_ptr < old->_IO_read_end
                   ? (size_t)(old->_IO_read_end - old->_IO_read_ptr) : 0;
    size_t b = oc && oc->pre ? oc->pre_len - oc->pre_off : 0;
    if (!a && !b)
        return true;
    char *p = malloc(a + b);
    if (!p)
        return false;
    memcpy(p, old->_IO_read_ptr, a);
    if (b)
        memcpy(p + a, oc->pre + oc->pre_off, b);
    old->_IO_read_ptr = old->_IO_read_end;
    if (oc && oc->pre) {
        free(oc->pre);
        oc->pre = NULL;
    }
    nc->pre = p;
    nc->pre_len = a + b;
    nc->pre_off = 0;
    return true;
}

/* A connection is now at fd (0, 1 or 2): put a stream of ours in place of the standard one.
 * Only an accelerated connection (an undecided one may still fall to TCP, where glibc's own
 * stream must stay, wide output and all), and only in place of glibc's static stream on that
 * fd or a live standard stream of ours, never a closed one.  wait (a dup onto fd, whose
 * program means to use the stream): a blocking connection still undecided is settled first, as
 * exec settles it; glibc's stream writes straight to the kernel socket, and a connection
 * accelerated after that write lost its bytes (bash's `exec 3<>/dev/tcp/...; echo hi >&3`
 * before the server accepted: the server read nothing).  The wait ends when the server takes
 * the offer or at MEMLAN_ACCEPT_WAIT_MS, on TCP. */
void mlp_stdio_adopt(int fd, bool wait)
{
    if (fd < 0 || fd > 2)
        return;
    struct mlp_sock *s = mlp_get(fd);
    if (!s)
        return;
    int st = s->type == MLP_CONN ? s->state : MLP_TCP;
    if (st == MLP_UNDECIDED) {
        int saved = errno;
        /* without wait, or nonblocking: settled already, perhaps: a look, no wait */
        st = mlp_decide(s, fd, wait && !mlp_nonblock(s));
        if (st == MLP_TCP) /* what the ring took goes out before glibc's stream writes */
            (void)mlp_tcp_catch_up(s, fd, !mlp_nonblock(s));
        errno = saved;
    }
    mlp_put(s);
    const char *name = fd == 0 ? "stdin" : fd == 1 ? "stdout" : "stderr";
    if (st != MLP_ACCEL) {
        if (st == MLP_UNDECIDED)
            mlp_log(1, "fd %d: the connection is not decided yet: %s stays glibc's stream", fd,
                    name);
        return;
    }
    FILE **slot = fd == 0 ? &stdin : fd == 1 ? &stdout : &stderr;
    FILE *stat = fd == 0 ? &_IO_2_1_stdin_ : fd == 1 ? &_IO_2_1_stdout_ : &_IO_2_1_stderr_;
    FILE *old = *slot;
    struct mlp_ck *oc = old && old != stat ? mlp_stream_cookie(old) : NULL;
    bool ours = oc && oc->std;
    if (!old || (old != stat && !ours))
        return; /* the program put a stream of its own there, or closed one of ours */
    if (old->_fileno != fd || (old->_flags & (fd == 0 ? MLP_IO_NO_READS : MLP_IO_NO_WRITES)))
        return; /* closed (fclose: _fileno -1), or moved elsewhere by the program */
    int saved = errno;
    if (ftrylockfile(old) != 0) {
        mlp_log(1, "fd %d: another thread holds %s (a read or write in progress): it stays "
                   "glibc's stream, and stdio on it takes the kernel socket", fd, name);
        errno = saved;
        return;
    }
    int inside = mlp_inside;
    mlp_inside = 0; /* the moved output must go through our write, not straight to the fd */
    struct mlp_ck *nc = NULL;
    FILE *f = mlp_stream_ck(fd, fd == 0 ? "r" : "w", true, &nc);
    if (!f || (fd == 0 && !mlp_take_input(old, oc, nc))) {
        if (f) {
            nc->keep_fd = true;
            fclose(f);
        }
        funlockfile(old);
        mlp_inside = inside;
        mlp_log(0, "fd %d: no memory for a stream through the channel: stdio on it would "
                   "take the kernel socket", fd);
        errno = saved;
        return;
    }
    if (old->_flags & MLP_IO_UNBUFFERED)
        setvbuf(f, NULL, _IONBF, 0);
    else if (old->_flags & MLP_IO_LINE_BUF)
        setvbuf(f, NULL, _IOLBF, 0);
    if (old->_IO_write_ptr > old->_IO_write_base) {
        size_t n = (size_t)(old->_IO_write_ptr - old->_IO_write_base);
        fwrite(old->_IO_write_base, 1, n, f);
        old->_IO_write_ptr = old->_IO_write_base;
    }
    *slot = f;
    funlockfile(old);
    if (ours) {
        oc->keep_fd = true; /* fd is the new connection's now */
        fclose(old);
    }
    mlp_inside = inside;
    mlp_log(1, "fd %d: %s is a stream through the channel", fd, name);
    errno = saved;
}

