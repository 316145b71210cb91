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
 *  - fdopen() of an accelerated (or undecided) connection returns such a stream;
 *  - stdin, stdout and stderr are replaced (glibc lets a program assign them) by such a stream,
 *    with the old one's buffering mode, whenever a connection lands on fd 0, 1 or 2: carried
 *    across exec (an inetd-style child such as git daemon's), or by dup, dup2, dup3 or F_DUPFD
 *    onto it, or returned there by accept or connect's socket.  Output the old stream still
 *    held goes to the new one first (the kernel would have written it to the new fd 1).
 *
 * What stays out of reach (docs/design.md): a FILE made before the socket took its fd other
 * than the three standard ones, a pointer to the old standard stream kept by the program, and a
 * thread writing to the old stream while another moves a socket onto its fd.  Replacing a
 * stream allocates: a dup2 onto 0, 1 or 2 from a signal handler is not async-signal-safe here.
 */
#include "preload.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ssize_t mlp_io_read(int fd, void *buf, size_t len);
ssize_t mlp_io_write(int fd, const void *buf, size_t len);
int mlp_io_close(int fd);

/* The cookie: the stream itself, known once fopencookie returned it. */
struct mlp_ck {
    FILE *f;
};

static ssize_t mlp_ck_read(void *c, char *buf, size_t len)
{
    return mlp_io_read(fileno(((struct mlp_ck *)c)->f), buf, len);
}

/* glibc's own file write loops until all is written or an error; a cookie's short count marks
 * the stream in error, so loop here the same way. */
static ssize_t mlp_ck_write(void *c, const char *buf, size_t len)
{
    int fd = fileno(((struct mlp_ck *)c)->f);
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

static int mlp_ck_close(void *c)
{
    int r = mlp_io_close(fileno(((struct mlp_ck *)c)->f));
    free(c);
    return r;
}

static const cookie_io_functions_t mlp_ck_funcs = {
    .read = mlp_ck_read, .write = mlp_ck_write, .seek = mlp_ck_seek, .close = mlp_ck_close};

/* A stream of ours on fd, or NULL.  Its functions read the stream's _fileno at every call. */
static FILE *mlp_stream(int fd, const char *mode)
{
    struct mlp_ck *c = malloc(sizeof *c);
    FILE *f = c ? fopencookie(c, mode, mlp_ck_funcs) : NULL;
    if (!f) {
        free(c);
        return NULL;
    }
    c->f = f;
    f->_fileno = fd;
    return f;
}

static bool mlp_is_conn(int fd)
{
    struct mlp_sock *s = mlp_get(fd);
    bool conn = s && s->type == MLP_CONN && s->state != MLP_TCP;
    if (s)
        mlp_put(s);
    return conn;
}

MLP_EXPORT FILE *fdopen(int fd, const char *mode)
{
    if (ml_unlikely(!mlp_ready))
        mlp_init();
    if (mlp_inside || !mlp_is_conn(fd))
        return mlp_real_fdopen(fd, mode);
    int saved = errno;
    if (mlp_real_fcntl(fd, F_GETFL, 0) < 0)
        return NULL; /* EBADF, as fdopen says */
    FILE *f = mlp_stream(fd, mode);
    if (!f) {
        errno = ENOMEM;
        return NULL;
    }
    errno = saved;
    mlp_log(1, "fd %d: fdopen: a stream through the channel", fd);
    return f;
}

#define MLP_IO_UNBUFFERED 0x0002  /* glibc's _IO_UNBUFFERED */
#define MLP_IO_LINE_BUF   0x0200  /* _IO_LINE_BUF */

/* A connection is now at fd (0, 1 or 2): put a stream of ours in place of the standard one. */
void mlp_stdio_adopt(int fd)
{
    if (fd < 0 || fd > 2 || !mlp_is_conn(fd))
        return;
    FILE **slot = fd == 0 ? &stdin : fd == 1 ? &stdout : &stderr;
    FILE *old = *slot;
    if (!old || (old->_fileno != fd && old->_fileno >= 0))
        return; /* the program moved the standard stream elsewhere */
    int saved = errno;
    int inside = mlp_inside;
    mlp_inside = 0; /* the moved output must go through our write, not straight to the fd */
    flockfile(old);
    FILE *f = mlp_stream(fd, fd == 0 ? "r" : "w");
    if (!f) {
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
    if (old->_IO_read_ptr < old->_IO_read_end)
        mlp_log(0, "fd %d: the standard stream held %zd bytes read from the fd before; they "
                   "stay in the old stream", fd, (ssize_t)(old->_IO_read_end - old->_IO_read_ptr));
    *slot = f;
    funlockfile(old);
    mlp_inside = inside;
    mlp_log(1, "fd %d: std%s is a stream through the channel", fd,
            fd == 0 ? "in" : fd == 1 ? "out" : "err");
    errno = saved;
}
