/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * strerror.c - memlan_strerror(): what an error means in memlan's terms.
 *
 * The API returns negative errnos, and several of them mean something narrower here than the C
 * library's text says ("Protocol error", "Stale file handle", "No such file or directory" for a
 * wrong token).  This table gives memlan's meaning for the errors the API documents; any other
 * errno gets the C library's text.
 */
#include "memlan.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const struct {
    int err;
    const char *text;
} ml_texts[] = {
    {EPROTO, "peer broke the channel protocol (corrupt shared indices, records or header, or a "
             "garbled hello or answer at a named endpoint)"},
    {EPROTONOSUPPORT, "unknown shared-memory layout version or endpoint protocol version (the peer "
                      "runs another memlan release)"},
    {ESTALE, "stale token: the channel was reused or its offer withdrawn"},
    {ECONNABORTED, "revoked by its exporter"},
    {EOWNERDEAD, "the owner of the shared object died"},
    {EBUSY, "the channel already has its second side attached"},
    {ECONNREFUSED, "nobody to connect to: no server listens on the name, or the channel's "
                   "creator closed it before it was attached"},
    {EADDRINUSE, "the name is taken: a live server in this fabric listens on it"},
    {ENAMETOOLONG, "name too long (over MEMLAN_NAME_MAX bytes, or its socket path in the fabric "
                   "directory over the Unix socket limit)"},
    {EPROTOTYPE, "wrong channel kind: the server accepts only the other kind (stream or message)"},
    {EINVAL, "invalid argument (a NULL pointer, a malformed token, an empty name or one holding "
             "'/' or a control character, an unknown kind, mode or flag, or a size or path out "
             "of range)"},
    {ECONNRESET, "the peer died or the channel was revoked"},
    {EPIPE, "the channel is closed for sending (the peer closed it, or we shut it down)"},
    {EACCES, "fabric permission denied (another user's directory, a directory open to others "
             "that MEMLAN_FABRIC does not name, or read-write asked of a read-only export)"},
    {ENOSPC, "fabric full (no space left for its files) or the event queue is full"},
    {ENOENT, "no such token or fabric directory (a wrong token, or another fabric)"},
    {EMSGSIZE, "message larger than the channel can carry"},
    {EAGAIN, "nothing to do now: the call would block"},
    {ETIMEDOUT, "timed out (for memlan_connect: the server did not accept in time)"},
};

const char *memlan_strerror(int err)
{
    if (err < 0)
        err = -err;
    for (size_t i = 0; i < sizeof ml_texts / sizeof ml_texts[0]; i++)
        if (ml_texts[i].err == err)
            return ml_texts[i].text;
    /* glibc (2.32 and later) answers a known error number with its constant table text, and
     * only an unknown one with a per-thread buffer of its own; a buffer of ours would need TLS,
     * and libmemlan would then need the dynamic linker's __tls_get_addr besides libc. */
    return strerror(err);
}
