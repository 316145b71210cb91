/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxconf: a server that confines itself in a seccomp sandbox after accepting, as OpenSSH's
 * privilege-separated child does, and then talks over the connection.  Run once over kernel TCP
 * and once under `memlan run`: the two outputs must be equal (tests/py/test_preload.py).  The
 * filter is sshd's preauth one in substance: open, openat and the stat family fail with EACCES,
 * a short list of calls is allowed (read, write, poll, futex, clocks, sleeps, memory), and any
 * other call kills the process, so nothing the preload calls after start-up may be outside it.
 *
 * usage: sandboxconf PORT
 * The server drops from root to nobody before its sandbox, as sshd's child does (exit 77 when
 * not root).  The client sends messages of growing size (past any ring), the sandboxed server
 * echoes them with read/write and poll; then the client is SIGKILLed and the server must see the
 * end of the stream within 10 s (the peer's liveness lock cannot be asked by name inside).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
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

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#endif

#define ALLOW(nr) BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, (nr), 0, 1), \
                  BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_ALLOW)
#define DENY(nr, e) BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, (nr), 0, 1), \
                    BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_ERRNO | (e))

static int sandbox(void)
{
#ifdef ARCH
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD + BPF_W + BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP + BPF_JEQ + BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD + BPF_W + BPF_ABS, offsetof(struct seccomp_data, nr)),
#ifdef __NR_open
        DENY(__NR_open, EACCES),
#endif
#ifdef __NR_stat
        DENY(__NR_stat, EACCES), DENY(__NR_lstat, EACCES),
#endif
        DENY(__NR_openat, EACCES), DENY(__NR_fstat, EACCES), DENY(__NR_newfstatat, EACCES),
        ALLOW(__NR_read), ALLOW(__NR_write), ALLOW(__NR_writev), ALLOW(__NR_close),
        ALLOW(__NR_ppoll), ALLOW(__NR_pselect6), ALLOW(__NR_futex), ALLOW(__NR_shutdown),
        ALLOW(__NR_clock_gettime), ALLOW(__NR_clock_nanosleep), ALLOW(__NR_nanosleep),
        ALLOW(__NR_gettimeofday), ALLOW(__NR_getpid), ALLOW(__NR_gettid),
        ALLOW(__NR_getrandom), ALLOW(__NR_geteuid), ALLOW(__NR_getuid), ALLOW(__NR_brk),
        ALLOW(__NR_mmap), ALLOW(__NR_munmap), ALLOW(__NR_mremap), ALLOW(__NR_madvise),
        ALLOW(__NR_rt_sigprocmask), ALLOW(__NR_rt_sigreturn), ALLOW(__NR_exit),
        ALLOW(__NR_exit_group),
#ifdef __NR_poll
        ALLOW(__NR_poll), ALLOW(__NR_select),
#endif
        BPF_STMT(BPF_RET + BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
#else
    return -1;
#endif
}

static int full(int fd, void *buf, size_t len, int wr)
{
    size_t got = 0;
    while (got < len) {
        if (!wr) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 10000) != 1)
                return -2;
        }
        ssize_t n = wr ? write(fd, (char *)buf + got, len - got) : read(fd, (char *)buf + got, len - got);
        if (n <= 0)
            return n == 0 ? 0 : -1;
        got += (size_t)n;
    }
    return 1;
}

static void server(int s)
{
    /* One exchange before the sandbox, as sshd's banner goes before its privilege separation. */
    char c;
    if (full(s, &c, 1, 0) != 1 || full(s, &c, 1, 1) != 1)
        _exit(2);
    /* sshd's order: out of root's reach first (which tells memlan's peers not to wait on us),
     * then the sandbox. */
    if (setgid(65534) < 0 || setuid(65534) < 0 || sandbox() < 0)
        _exit(3);
    static char buf[1 << 20];
    for (int round = 0;; round++) {
        unsigned len;
        int r = full(s, &len, sizeof len, 0);
        if (r <= 0) { /* the client is gone: what did we see? */
            const char msg[] = "server: end of stream after the client was killed\n";
            if (write(1, msg, sizeof msg - 1) < 0 || r < 0)
                _exit(4);
            _exit(0);
        }
        if (len > sizeof buf || full(s, buf, len, 0) != 1 || full(s, buf, len, 1) != 1)
            _exit(5);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
#ifndef ARCH
    return 77;
#endif
    if (geteuid() != 0)
        return 77; /* the server drops from root, as sshd's child does */
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0)
        return perror("listen"), 1;
    int ready[2];
    if (pipe(ready) < 0)
        return perror("pipe"), 1;
    pid_t cli = fork();
    if (cli == 0) { /* the client: killed by main at the end */
        close(l);
        close(ready[0]);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0)
            _exit(1);
        char x = 'x';
        if (full(c, &x, 1, 1) != 1 || full(c, &x, 1, 0) != 1)
            _exit(1);
        static char out[1 << 20], in[1 << 20];
        for (unsigned len = 1; len <= sizeof out; len *= 4) {
            for (unsigned i = 0; i < len; i++)
                out[i] = (char)(i * 7 + len);
            if (full(c, &len, sizeof len, 1) != 1 || full(c, out, len, 1) != 1 ||
                full(c, in, len, 0) != 1 || memcmp(in, out, len) != 0) {
                printf("client: echo of %u bytes wrong\n", len);
                _exit(1);
            }
            printf("client: %u bytes echoed\n", len);
        }
        printf("client: waiting to be killed\n");
        if (write(ready[1], "k", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    int s = accept(l, NULL, NULL);
    if (s < 0)
        return perror("accept"), 1;
    close(l);
    pid_t srv = fork();
    if (srv == 0)
        server(s);
    close(s);
    close(ready[1]);
    /* The client's last line, then its death. */
    char k;
    struct pollfd p = {.fd = ready[0], .events = POLLIN};
    if (poll(&p, 1, 30000) != 1 || read(ready[0], &k, 1) != 1) {
        printf("FAIL the client did not finish\n");
        kill(cli, SIGKILL);
        kill(srv, SIGKILL);
        return 1;
    }
    usleep(200000); /* the server is asleep in poll for the next message */
    kill(cli, SIGKILL);
    waitpid(cli, NULL, 0);
    int st = 0;
    for (int i = 0; i < 1000 && waitpid(srv, &st, WNOHANG) == 0; i++)
        usleep(10000);
    if (waitpid(srv, &st, WNOHANG) == 0 && kill(srv, 0) == 0) {
        printf("FAIL the sandboxed server did not see its client die within 10 s\n");
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
        return 1;
    }
    if (WIFSIGNALED(st))
        printf("FAIL the sandboxed server was killed by signal %d\n", WTERMSIG(st));
    else if (WEXITSTATUS(st) != 0)
        printf("FAIL the sandboxed server exited %d\n", WEXITSTATUS(st));
    else
        printf("done\n");
    return 0;
}
