/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * passundo PORT MODE: an acceptor tries to pass a connection over SCM_RIGHTS and the kernel does
 * not take the message, so the connection stays the acceptor's: it writes "hello I\n" on it and
 * closes it, and the client must read that line and then the end, at once, as over kernel TCP.
 * The client prints "connection I: got LINE", then "connection I: end of stream" (or "error
 * STRERROR", or "no end within 5 s").  Every wait is bounded.
 *
 * MODE: "epipe" (sendmsg to a unix socket whose peer is closed: EPIPE), "mmsg" (sendmmsg of two
 * datagrams, the second carrying the connection and too big for the socket: the call says 1,
 * the second was not sent), "tcp" (sendmsg with SCM_RIGHTS over a TCP socket, whose kernel sends
 * the byte and passes nothing).
 */
#include "fdpass.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int listen_on(int port)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0)
        return -1;
    return l;
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void client_read(int fd, int i)
{
    char buf[256];
    size_t have = 0;
    for (int t = 0; t < 50; t++) { /* 50 polls of 100 ms */
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, 100);
        if (r == 0)
            continue;
        ssize_t k = r < 0 ? -1 : read(fd, buf + have, sizeof buf - 1 - have);
        if (k < 0) {
            printf("connection %d: error %s\n", i, strerror(errno));
            return;
        }
        if (k == 0) {
            printf("connection %d: end of stream\n", i);
            return;
        }
        have += (size_t)k;
        buf[have] = 0;
        char *nl;
        while ((nl = strchr(buf, '\n'))) {
            *nl = 0;
            printf("connection %d: got %s\n", i, buf);
            have -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, have + 1);
        }
    }
    printf("connection %d: no end within 5 s\n", i);
}

/* The kernel's answer to a pass of fd that it does not take, as a line. */
static void try_pass(const char *mode, int fd, int port2)
{
    struct fdpass_one o;
    struct msghdr m = *fdpass_build(&o, fd);
    if (!strcmp(mode, "epipe")) {
        int sp[2];
        socketpair(AF_UNIX, SOCK_STREAM, 0, sp);
        close(sp[1]);
        ssize_t r = sendmsg(sp[0], &m, 0);
        printf("sendmsg: %zd %s\n", r, r < 0 ? strerror(errno) : "");
        close(sp[0]);
    } else if (!strcmp(mode, "mmsg")) {
        int sp[2];
        socketpair(AF_UNIX, SOCK_DGRAM, 0, sp);
        int small = 4096;
        setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        static char big[1 << 20];
        struct iovec bv = {big, sizeof big};
        struct mmsghdr mm[2];
        memset(mm, 0, sizeof mm);
        mm[0].msg_hdr.msg_iov = &o.v; /* one byte, nothing passed */
        mm[0].msg_hdr.msg_iovlen = 1;
        mm[1].msg_hdr = m;          /* the connection, with a datagram too big to go */
        mm[1].msg_hdr.msg_iov = &bv;
        int r = sendmmsg(sp[0], mm, 2, MSG_DONTWAIT);
        printf("sendmmsg: %d %s\n", r, r < 0 ? strerror(errno) : "");
        close(sp[0]);
        close(sp[1]);
    } else { /* tcp: a connection of another listener, kept on kernel TCP (TCP_DEFER_ACCEPT) */
        int l2 = listen_on(0), one = 1; /* a port the kernel picks */
        struct sockaddr_in a2;
        socklen_t al = sizeof a2;
        if (l2 >= 0 && getsockname(l2, (struct sockaddr *)&a2, &al) == 0) {
            setsockopt(l2, IPPROTO_TCP, TCP_DEFER_ACCEPT, &one, sizeof one);
            port2 = ntohs(a2.sin_port);
        } else {
            l2 = -1;
        }
        int a = l2 < 0 ? -1 : dial(port2);
        int b = a < 0 || write(a, "x", 1) != 1 ? -1 : accept(l2, NULL, NULL);
        ssize_t r = b < 0 ? -2 : sendmsg(a, &m, 0);
        printf("sendmsg over TCP: %zd\n", r);
        close(a);
        close(b);
        close(l2);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    int port = atoi(argv[1]);
    const char *mode = argv[2];
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int l = listen_on(port);
    if (l < 0) {
        perror("listen");
        return 1;
    }
    pid_t c = fork();
    if (c == 0) {
        close(l);
        int fd = dial(port);
        if (fd < 0) {
            printf("connection 0: connect: %s\n", strerror(errno));
            _exit(0);
        }
        client_read(fd, 0);
        _exit(0);
    }
    struct pollfd p = {l, POLLIN, 0};
    int fd = poll(&p, 1, 5000) == 1 ? accept(l, NULL, NULL) : -1;
    if (fd >= 0) {
        try_pass(mode, fd, 0);
        (void)!write(fd, "hello 0\n", 8);
        close(fd);
    }
    int st;
    waitpid(c, &st, 0);
    close(l);
    printf("done\n");
    return 0;
}
