/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxrecv: a child under a seccomp filter that allows recvmsg and kills for getsockopt (as
 * vsftpd's post-login child takes its data connections from its broker) receives a pipe, a
 * connected TCP socket and a listening TCP socket over a socketpair.  Each case prints how the
 * child ended; over kernel TCP and under memlan the output must be the same (memlan's recvmsg
 * must make no system call of its own there: a received listener is published only at a fork
 * or an accept, never at its receipt).
 *
 * usage: sandboxrecv PORT (unused: the listener takes a port the kernel picks)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "seccompkill.h"



static void run_case(const char *what)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
        return;
    pid_t pid = fork();
    if (pid == 0) { /* the sandboxed child: takes the fd, says so with write(2), exits */
        close(sp[0]);
        /* "use": the child reads from what it received, under a filter that kills for fstat
         * and openat too (a look for a connection passed to it must not be made there) */
        const unsigned nrs[] = {__NR_getsockopt, __NR_fstat, __NR_newfstatat, __NR_openat};
        if (seccomp_kill_for_all(nrs, strcmp(what, "use") ? 1 : 4))
            _exit(2);
        int got = fdpass_recv(sp[1], 0); /* flags 0, as vsftpd's filter allows */
        if (got < 0)
            _exit(3);
        if (!strcmp(what, "use")) {
            char b;
            if (recv(got, &b, 1, MSG_DONTWAIT) != -1 || errno != EAGAIN)
                _exit(4);
        }
        _exit(0);
    }
    close(sp[1]);
    int fd = -1, pp[2] = {-1, -1}, l = -1;
    if (!strcmp(what, "pipe")) {
        if (pipe(pp) == 0)
            fd = pp[0];
    } else {
        l = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        if (bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0 &&
            getsockname(l, (struct sockaddr *)&a, &al) == 0) {
            fd = l;
            if (!strcmp(what, "tcp") || !strcmp(what, "use")) {
                fd = socket(AF_INET, SOCK_STREAM, 0);
                if (connect(fd, (struct sockaddr *)&a, sizeof a))
                    fd = -1;
            }
        }
    }
    if (fd < 0 || fdpass_send(sp[0], fd) < 0)
        printf("%s: could not pass it\n", what);
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st))
        printf("%s: the child was killed by signal %d\n", what, WTERMSIG(st));
    else
        printf("%s: the child exited %d\n", what, WEXITSTATUS(st));
    close(sp[0]);
    if (fd >= 0 && fd != l)
        close(fd);
    if (l >= 0)
        close(l);
    if (pp[1] >= 0)
        close(pp[1]);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    run_case("pipe");
    run_case("tcp");
    run_case("listen");
    run_case("use");
    printf("done\n");
    return 0;
}
