/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollpassback: a connection in an epoll set, deleted from it (parked under memlan: its kernel
 * entry stays, src/preload/epoll.c), passed to another process over SCM_RIGHTS and closed here,
 * then passed back to us by a process that forwards it unused and closes its copy, and lands on
 * the number it had: its ADD is the kernel's 0 (the DEL had removed the kernel's entry), and
 * the peer's byte is read through it.  Under memlan the parked entry outlived our close (the
 * file lived on in the other process) and the ADD met EEXIST: dovecot's imap-hibernate, which
 * gets an IDLE client's connection back at the same fd, died of "Panic: epoll_ctl(add, 14)
 * failed: File exists".  And the forwarder's close, made before our first call on the
 * connection, took it up from the record it had been passed with and ended its hold, leaving us
 * an idle kernel socket: the wait saw nothing and the read waited for ever.  Printed line by line over kernel TCP and under memlan
 * (tests/py/test_preload.py).
 *
 * usage: epollpassback PORT
 */
#include "twoends.h"

#include "epollprint.h"

#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void send_fd(int u, int fd)
{
    char c = 'f', buf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&c, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf,
                       .msg_controllen = sizeof buf};
    memset(buf, 0, sizeof buf);
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(u, &m, 0) != 1)
        die("sendmsg");
}

static int recv_fd(int u)
{
    char c, buf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&c, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = buf,
                       .msg_controllen = sizeof buf};
    if (recvmsg(u, &m, 0) != 1)
        die("recvmsg");
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (!h || h->cmsg_type != SCM_RIGHTS)
        die("no fd");
    int fd;
    memcpy(&fd, CMSG_DATA(h), sizeof fd);
    return fd;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2)
        return 2;
    alarm(20); /* bounded, whatever goes wrong */
    int u[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, u) != 0)
        die("socketpair");
    pid_t pid = fork(); /* before any connection: the other process */
    if (pid == 0) {
        close(u[0]);
        for (int i = 0; i < 2; i++) { /* each connection it gets goes back at once */
            int fd = recv_fd(u[1]);
            send_fd(u[1], fd);
            close(fd);
            if (write(u[1], "c", 1) != 1) /* closed: the passer may look now */
                _exit(1);
        }
        _exit(0);
    }
    if (pid < 0)
        die("fork");
    close(u[1]);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int peer, c = settled_pair(l, &a, &peer);
    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1");
    ctl("add", EPOLL_CTL_ADD, c, EPOLLIN);
    for (int round = 0; round < 2; round++) {
        ctl("del", EPOLL_CTL_DEL, c, 0);
        send_fd(u[0], c);
        close(c);
        int back = recv_fd(u[0]);
        char closed;
        if (read(u[0], &closed, 1) != 1) /* the other process has closed its copy */
            die("read");
        printf("back under its number: %s\n", back == c ? "yes" : "no");
        c = back;
        ctl("add it back", EPOLL_CTL_ADD, c, EPOLLIN);
        if (write(peer, "x", 1) != 1)
            die("write");
        wait_("wait", 1000);
        char x;
        printf("read: %zd\n", read(c, &x, 1));
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || st != 0)
        die("child");
    ctl("del", EPOLL_CTL_DEL, c, 0);
    close(c);
    close(peer);
    close(ep);
    close(l);
    printf("done\n");
    return 0;
}
