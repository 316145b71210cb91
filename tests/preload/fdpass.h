/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: one descriptor passed over a unix socket with one byte (SCM_RIGHTS). */
#ifndef MEMLAN_TESTS_FDPASS_H
#define MEMLAN_TESTS_FDPASS_H
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* A message of one byte that passes fd (SCM_RIGHTS), built in o (which it points into). */
struct fdpass_one {
    char byte;
    struct iovec v;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m;
};

static inline struct msghdr *fdpass_build(struct fdpass_one *o, int fd)
{
    memset(o, 0, sizeof *o);
    o->byte = 'L';
    o->v = (struct iovec){&o->byte, 1};
    o->m = (struct msghdr){.msg_iov = &o->v, .msg_iovlen = 1, .msg_control = o->u.buf,
                           .msg_controllen = sizeof o->u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&o->m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return &o->m;
}

/* 0, or -1 when sendmsg did not send its byte. */
static inline int fdpass_send(int sp, int fd)
{
    struct fdpass_one o;
    return sendmsg(sp, fdpass_build(&o, fd), 0) == 1 ? 0 : -1;
}

/* The descriptor that came with one byte over sp (recvmsg with flags), or -1. */
static inline int fdpass_recv(int sp, int flags)
{
    char byte;
    struct iovec v = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    if (recvmsg(sp, &m, flags) != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}
#endif
