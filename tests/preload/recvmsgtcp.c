/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * recvmsgtcp: recvmsg and recvmmsg with a name, a control buffer and msg_flags preset, on both
 * ends of a connection; prints what the calls returned in the header.  Run under memlan with
 * MEMLAN_ACCEPT_WAIT_MS=1, MEMLAN_ACCEPT_QUEUE_MS=1 (from the connect, the server not having
 * accepted yet) and a server that accepts 300 ms late, the connection settles on TCP
 * with both ends memlan sockets: the kernel's answers must come back all the same (0, 0, 0 and
 * no control message), not the values the caller preset.
 *
 * usage: recvmsgtcp PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void show(const char *who, ssize_t r, const struct msghdr *m)
{
    printf("%s: %zd, msg_namelen %u, msg_controllen %zu, msg_flags %#x, cmsg %s\n", who, r,
           (unsigned)m->msg_namelen, (size_t)m->msg_controllen, (unsigned)m->msg_flags,
           CMSG_FIRSTHDR(m) ? "present" : "none");
}

/* One message of 5 bytes read with recvmsg (mm 0) or recvmmsg (mm 1), header preset. */
static void take(int fd, int mm, const char *who)
{
    char buf[16], ctl[64];
    struct sockaddr_in from;
    struct iovec v = {buf, 5};
    memset(ctl, 0xab, sizeof ctl);
    struct mmsghdr h = {.msg_hdr = {.msg_name = &from, .msg_namelen = sizeof from,
                                    .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl,
                                    .msg_controllen = sizeof ctl, .msg_flags = 0x40000}};
    ssize_t r = mm ? recvmmsg(fd, &h, 1, MSG_WAITALL, NULL) : recvmsg(fd, &h.msg_hdr, MSG_WAITALL);
    show(who, r, &h.msg_hdr);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4)) {
        perror("listen");
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) { /* the client: two messages in, two out */
        close(l);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a)) {
            perror("connect");
            _exit(1);
        }
        if (send(c, "ping1ping2", 10, 0) != 10)
            _exit(1);
        take(c, 0, "client recvmsg");
        take(c, 1, "client recvmmsg");
        close(c);
        _exit(0);
    }
    struct timespec late = {0, 300000000}; /* the client's offer has gone by then */
    nanosleep(&late, NULL);
    int s = accept(l, NULL, NULL);
    if (s < 0) {
        perror("accept");
        return 1;
    }
    take(s, 0, "server recvmsg");
    take(s, 1, "server recvmmsg");
    if (send(s, "pong1pong2", 10, 0) != 10)
        return 1;
    int st;
    waitpid(pid, &st, 0);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
