/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * nopwait2: a program in a seccomp sandbox that predates epoll_pwait2 (the filter kills the
 * process on it, as a default-deny profile does; a kernel before 5.11 answers ENOSYS) and never
 * calls it: its epoll_wait must work under memlan as without it, on a pipe and on a connection.
 *
 * usage: nopwait2 PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_epoll_pwait2
#define SYS_epoll_pwait2 441
#endif

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        char b;
        if (connect(c, (void *)&a, sizeof a) < 0 || read(c, &b, 1) != 1)
            _exit(1);
        usleep(100000);
        _exit(write(c, "data", 4) == 4 ? 0 : 1);
    }
    int fd = accept(l, NULL, NULL);
    if (fd < 0 || write(fd, "g", 1) != 1)
        return 1;
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_epoll_pwait2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {4, f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        return 77;
    }
    int p[2];
    if (pipe(p) < 0 || write(p[1], "x", 1) != 1)
        return 1;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1};
    epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev);
    int r = epoll_wait(ep, &ev, 1, 100);
    printf("pipe: epoll_wait %d data %llu\n", r, r == 1 ? (unsigned long long)ev.data.u64 : 0ull);
    epoll_ctl(ep, EPOLL_CTL_DEL, p[0], NULL);
    ev = (struct epoll_event){.events = EPOLLIN, .data.u64 = 2};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    r = epoll_wait(ep, &ev, 1, 3000);
    char buf[8];
    printf("connection: epoll_wait %d data %llu recv %zd\n", r,
           r == 1 ? (unsigned long long)ev.data.u64 : 0ull, recv(fd, buf, sizeof buf, 0));
    int st;
    waitpid(pid, &st, 0);
    printf("done\n");
    return 0;
}
