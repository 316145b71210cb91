/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxuse: a child puts itself under a seccomp filter (prctl, as vsftpd's session child does)
 * that kills for one system call, receives a descriptor over a socketpair (a pipe, or a connected
 * TCP socket that is not memlan's) and reads one byte from it: the first call on a descriptor
 * received over SCM_RIGHTS, where memlan looks for a connection passed with it (the TCP one is kept
 * on kernel TCP under memlan by TCP_DEFER_ACCEPT).  Each case prints
 * how the child ended; over kernel TCP and under memlan the output must be the same: a process
 * known to be sandboxed must meet no system call of ours it did not make (its filter may kill it).
 * (A filter that kills for getpid is not tried: a data call on a descriptor with a record asks
 * getpid whether it runs in a vfork child, before and after b888bea.)
 *
 * usage: sandboxuse PORT (unused: the listener takes a port the kernel picks)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "seccompkill.h"

static void run_case(const char *what, const char *killed, unsigned nr)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
        return;
    pid_t pid = fork();
    if (pid == 0) { /* the sandboxed child: takes the fd, reads a byte from it, exits */
        close(sp[0]);
        if (seccomp_kill_for(nr))
            _exit(2);
        int fd = fdpass_recv(sp[1], 0);
        if (fd < 0)
            _exit(3);
        char c = 0;
        _exit(read(fd, &c, 1) == 1 && c == 'x' ? 0 : 4);
    }
    close(sp[1]);
    int fd = -1, w = -1, pp[2] = {-1, -1}, l = -1;
    if (!strcmp(what, "pipe")) {
        if (pipe(pp) == 0)
            fd = pp[0], w = pp[1];
    } else {
        l = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        int one = 1; /* TCP_DEFER_ACCEPT: the connection stays on kernel TCP under memlan */
        if (setsockopt(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &one, sizeof one) == 0 &&
            bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0 &&
            getsockname(l, (struct sockaddr *)&a, &al) == 0) {
            w = socket(AF_INET, SOCK_STREAM, 0); /* the client writes, the accepted socket goes */
            if (connect(w, (struct sockaddr *)&a, sizeof a) || write(w, "x", 1) != 1 ||
                (fd = accept(l, NULL, NULL)) < 0)
                fd = -1;
        }
    }
    if (fd < 0 || w < 0 || (pp[1] >= 0 && write(w, "x", 1) != 1) || fdpass_send(sp[0], fd) < 0)
        printf("%s (filter kills %s): could not pass it\n", what, killed);
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st))
        printf("%s (filter kills %s): the child was killed by signal %d\n", what, killed,
               WTERMSIG(st));
    else
        printf("%s (filter kills %s): the child exited %d\n", what, killed, WEXITSTATUS(st));
    close(sp[0]);
    if (fd >= 0)
        close(fd);
    if (w >= 0)
        close(w);
    if (l >= 0)
        close(l);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    run_case("pipe", "fstat", __NR_fstat);
    run_case("pipe", "openat", __NR_openat);
    run_case("tcp", "fstat", __NR_fstat);
    run_case("tcp", "openat", __NR_openat);
    printf("done\n");
    return 0;
}
