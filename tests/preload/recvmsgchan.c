/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * recvmsgchan: sendmsg and recvmsg on a connection settled on the channel (a byte each way
 * first), the receive's header preset with a name buffer, a control buffer and msg_flags, with
 * and without MSG_DONTWAIT, after the bytes are there: the preload's fast path takes these
 * calls, and what comes back in the header must be the kernel's (msg_namelen 0, msg_controllen
 * 0, msg_flags 0, no control message), as recvmsgtcp checks for a connection on TCP.
 *
 * usage: recvmsgchan PORT
 */
#include "twoends.h"

#include <netinet/tcp.h>
#include <unistd.h>

static void show(const char *who, ssize_t r, const struct msghdr *m)
{
    printf("%s: %zd, msg_namelen %u, msg_controllen %zu, msg_flags %#x, cmsg %s\n", who, r,
           (unsigned)m->msg_namelen, (size_t)m->msg_controllen, (unsigned)m->msg_flags,
           CMSG_FIRSTHDR(m) ? "present" : "none");
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int s;
    int c = settled_pair(l, &a, &s), one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* no Nagle: each send goes */
    const char *tries[] = {"plain", "MSG_DONTWAIT"};
    for (int k = 0; k < 2; k++) {
        struct iovec out[2] = {{"he", 2}, {"llo", 3}};
        struct msghdr mo = {.msg_iov = out, .msg_iovlen = 2};
        ssize_t w = sendmsg(c, &mo, MSG_NOSIGNAL);
        printf("sendmsg %s: %zd\n", tries[k], w);
        usleep(20000); /* the bytes are there before the receive */
        char buf[16] = {0}, name[32], ctl[64];
        memset(ctl, 0x5a, sizeof ctl);
        struct iovec v = {buf, sizeof buf};
        struct msghdr m = {.msg_name = name, .msg_namelen = sizeof name, .msg_iov = &v,
                           .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl,
                           .msg_flags = 0x1234};
        ssize_t r = recvmsg(s, &m, k ? MSG_DONTWAIT : 0);
        show(tries[k], r, &m);
        printf("bytes: %s\n", buf);
    }
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
