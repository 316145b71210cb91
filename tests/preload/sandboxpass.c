/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxpass: a broker under a seccomp filter that allows little more than read, write and
 * sendmsg (vsftpd's privileged broker: it accepts a PASV data connection and passes it to its
 * session child over SCM_RIGHTS, and its filter kills for fstat, ppoll, rt_sigprocmask) accepts
 * a connection that stayed on TCP (or a pipe) and passes it to its parent.  Over kernel TCP the
 * broker exits 0; under memlan, whose sendmsg looks at the descriptors passed (mlp_after_pass),
 * it was killed by SIGSYS: the look asked getpid whether it ran in a vfork child before it knew
 * that no connection of ours was passed.  The output must be the same.
 * (An accelerated connection passed there is not tried: its note still makes system calls.)
 *
 * usage: sandboxpass PORT
 */
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"

#define ALLOW(nr)                                                                              \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

/* vsftpd's broker list, near enough (seccompsandbox.c: base, data connections, sendmsg), with
 * futex (an uncontended lock makes none) and the clock's for the log's time stamps. */
static int broker_filter(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        ALLOW(__NR_read), ALLOW(__NR_write), ALLOW(__NR_mmap), ALLOW(__NR_mprotect),
        ALLOW(__NR_munmap), ALLOW(__NR_brk), ALLOW(__NR_gettimeofday),
        ALLOW(__NR_clock_gettime), ALLOW(__NR_rt_sigreturn), ALLOW(__NR_restart_syscall),
        ALLOW(__NR_close), ALLOW(__NR_exit_group), ALLOW(__NR_exit), ALLOW(__NR_socket),
        ALLOW(__NR_bind), ALLOW(__NR_select), ALLOW(__NR_listen), ALLOW(__NR_accept),
        ALLOW(__NR_sendmsg), ALLOW(__NR_futex),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog p = {sizeof f / sizeof f[0], f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p);
}

/* One broker: accepts from l, is locked down, passes what: "tcp" the connection it accepted
 * (its client connected by the raw system call, so memlan's connect never offered: a plain
 * TCP connection, as vsftpd's clients not under memlan), "pipe" a pipe's end. */
static void run_case(int l, const struct sockaddr_in *a, const char *what)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
        return;
    pid_t broker = fork();
    if (broker == 0) {
        close(sp[0]);
        int c = accept(l, NULL, NULL), pp[2];
        char b[2];
        if (c < 0 || read(c, b, 2) != 2 || pipe(pp))
            _exit(3);
        if (broker_filter())
            _exit(2);
        if (fdpass_send(sp[1], strcmp(what, "pipe") == 0 ? pp[0] : c) < 0)
            _exit(4);
        _exit(0);
    }
    close(sp[1]);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (syscall(SYS_connect, c, (const struct sockaddr *)a, sizeof *a) || write(c, "hi", 2) != 2) {
        printf("FAIL connect\n");
        exit(1);
    }
    int got = fdpass_recv(sp[0], 0);
    int st;
    waitpid(broker, &st, 0);
    printf("%s: %s\n", what, got >= 0 ? "received" : "none");
    if (WIFSIGNALED(st))
        printf("%s: the broker was killed by signal %d\n", what, WTERMSIG(st));
    else
        printf("%s: the broker exited %d\n", what, WEXITSTATUS(st));
    if (got >= 0)
        close(got);
    close(c);
    close(sp[0]);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4)) {
        printf("FAIL listen\n");
        return 1;
    }
    run_case(l, &a, "tcp");
    run_case(l, &a, "pipe");
    printf("done\n");
    return 0;
}
