/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxdiag: a client that sends its request, then confines itself in a seccomp sandbox that
 * kills for socket() (as a sandboxed worker does: it keeps the connections it has), and waits
 * for the answer.  The server's listener has TCP_DEFER_ACCEPT, set by a raw system call: its
 * kernel holds the handshake open until TCP data comes.  Over kernel TCP the request completes
 * it, the server answers, and the client prints the answer and exits 0.
 *
 * Under memlan the request went into the ring, and 200 ms on the undecided client asked
 * sock_diag whether the server's kernel held its handshake open: its socket(AF_NETLINK) killed
 * it (SIGSYS).
 *
 * usage: sandboxdiag PORT [before]
 * With "before" the client confines itself before it makes its socket, in a sandbox that kills
 * for socket(AF_NETLINK) only: the sock_diag socket made at its first offer killed it.
 */
#include "twoends.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#endif

/* Kill for socket(); netlink_only: for socket(AF_NETLINK, ...) only. */
static int sandbox(bool netlink_only)
{
#ifdef ARCH
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD + BPF_W + BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD + BPF_W + BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, __NR_socket, 0, 3),
        BPF_STMT(BPF_LD + BPF_W + BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, netlink_only ? AF_NETLINK : (uint32_t)-1, 0, 1),
        BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_ALLOW),
    };
    if (!netlink_only) /* any socket(): the family's test passes every time */
        f[6] = (struct sock_filter)BPF_JUMP(BPF_JMP + BPF_JA, 0, 0, 0);
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return -1;
    return 0;
#else
    return -1;
#endif
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    bool before = argc > 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int secs = 5;
    if (syscall(SYS_setsockopt, l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &secs, sizeof secs) != 0)
        die("TCP_DEFER_ACCEPT");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(l);
        if (before && sandbox(true) != 0) {
            printf("client: no sandbox here\n");
            _exit(77);
        }
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
            die("connect");
        if (send(c, "ping", 4, 0) != 4)
            die("send");
        if (!before && sandbox(false) != 0) {
            printf("client: no sandbox here\n");
            _exit(77);
        }
        struct pollfd p = {.fd = c, .events = POLLIN};
        char b[8];
        ssize_t n = poll(&p, 1, 5000) == 1 ? read(c, b, sizeof b) : -1;
        printf("client: %s\n", n == 4 && memcmp(b, "pong", 4) == 0 ? "pong" : "no answer");
        _exit(0);
    }
    struct pollfd p = {.fd = l, .events = POLLIN};
    if (poll(&p, 1, 8000) == 1) {
        int s = accept(l, NULL, NULL);
        char b[8];
        if (s >= 0 && recv(s, b, 4, MSG_WAITALL) == 4 && memcmp(b, "ping", 4) == 0)
            (void)send(s, "pong", 4, MSG_NOSIGNAL);
        if (s >= 0)
            close(s);
    } else {
        printf("server: no connection within 8 s\n");
    }
    int st;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        return 77;
    if (WIFSIGNALED(st))
        printf("client: killed by signal %d\n", WTERMSIG(st));
    else
        printf("client: exit %d\n", WEXITSTATUS(st));
    close(l);
    printf("done\n");
    return 0;
}
