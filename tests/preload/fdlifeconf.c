/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * fdlifeconf: what happens to a connection, and to the next socket given the same fd number,
 * when the fd is released some other way than close(): close_range (with and without
 * CLOSE_RANGE_CLOEXEC), closefrom, dup2 over it, an fd above 65536, and a vfork child that closes
 * its copy before exec while the parent goes on reading; a close_range the kernel refuses (bad
 * flags, a seccomp filter), CLOSE_RANGE_UNSHARE alone, and a close of every fd /proc/self/fd
 * lists.  Run once over kernel TCP and once under `memlan run`: the two outputs must be equal
 * (tests/py/test_preload.py).
 *
 * usage: fdlifeconf PORT [CASE]   (CASE: run only that numbered case, 1 to 11)
 * The program starts with close_range(3, ~0U, 0), as varnishd does: under memlan that also
 * closes memlan's own fds (its log), and the connections after it must still be accelerated.
 * Every wait is bounded: a peer that never sees the end prints "timeout" instead of hanging.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

static struct sockaddr_in addr;
static int only;
#define CASE(n) if (!only || only == (n))
static int lfd;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static int my_close_range(unsigned first, unsigned last, int flags)
{
    return close_range(first, last, flags);
}

/* A settled pair: *c the client end, *s the accepted end. */
static void pair(int *c, int *s, int linger0)
{
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (*c < 0)
        die("socket");
    if (linger0) {
        struct linger lg = {1, 0};
        setsockopt(*c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    if (connect(*c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    *s = accept(lfd, NULL, NULL);
    char b[2];
    if (*s < 0 || send(*s, "hi", 2, 0) != 2 || recv(*c, b, 2, MSG_WAITALL) != 2 ||
        send(*c, "ok", 2, 0) != 2 || recv(*s, b, 2, MSG_WAITALL) != 2)
        die("settle");
}

/* What the other end reads now: bytes, 0 (EOF), an errno, or timeout after 3 s. */
static void outcome(const char *label, int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    int n = poll(&p, 1, 3000);
    if (n == 0) {
        printf("%s: timeout\n", label);
        return;
    }
    char b[16];
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r < 0)
        printf("%s: recv -1 %s\n", label, strerror(errno));
    else
        printf("%s: recv %zd\n", label, r);
}

/* One message across a pair, both ways. */
static void exchange(const char *label, int c, int s)
{
    char b[6] = {0};
    int ok = send(c, "hello", 5, 0) == 5 && recv(s, b, 5, MSG_WAITALL) == 5 &&
             memcmp(b, "hello", 5) == 0 && send(s, "world", 5, 0) == 5 &&
             recv(c, b, 5, MSG_WAITALL) == 5 && memcmp(b, "world", 5) == 0;
    printf("%s: exchange %s\n", label, ok ? "ok" : "FAIL");
}

/* The next pair made after fds were released must end as the kernel ends it: EOF at close. */
static void next_pair_ends_clean(const char *label, int expect_fd)
{
    int c, s;
    pair(&c, &s, 0);
    printf("%s: next client at the same number: %s\n", label, c == expect_fd ? "yes" : "no");
    exchange(label, c, s);
    close(c);
    outcome(label, s);
    close(s);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    only = argc > 2 ? atoi(argv[2]) : 0;
    /* varnishd: everything above stderr goes, memlan's own fds included. */
    CASE(1) if (my_close_range(3, ~0U, 0) < 0 && errno != ENOSYS)
        die("close_range at start");
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 16) < 0)
        die("listen");

    int c, s;
    CASE(1) {
        /* 1. After close_range(3, ~0U) at start: ordinary traffic. */
        pair(&c, &s, 0);
        exchange("start", c, s);
        close(c);
        outcome("start", s);
        close(s);

    }
    CASE(2) {
        /* 2. close_range over an accelerated socket: its peer reads EOF. */
        pair(&c, &s, 0);
        if (my_close_range((unsigned)c, (unsigned)c, 0) < 0)
            die("close_range");
        outcome("close_range peer", s);
        close(s);
        next_pair_ends_clean("close_range", c);

    }
    CASE(3) {
        /* 3. close_range over a socket with SO_LINGER 0: a reset, and nothing left for the next
         * socket at that number. */
        pair(&c, &s, 1);
        if (my_close_range((unsigned)c, (unsigned)c, 0) < 0)
            die("close_range linger");
        outcome("close_range linger peer", s);
        close(s);
        next_pair_ends_clean("close_range linger", c);

    }
    CASE(4) {
        /* 4. CLOSE_RANGE_CLOEXEC leaves the connection open and working. */
        pair(&c, &s, 0);
        if (my_close_range((unsigned)c, (unsigned)c, CLOSE_RANGE_CLOEXEC) < 0 && errno != EINVAL)
            die("close_range cloexec");
        printf("cloexec: flag %d\n", (fcntl(c, F_GETFD) & FD_CLOEXEC) != 0);
        exchange("cloexec", c, s);
        close(c);
        outcome("cloexec", s);
        close(s);

    }
    CASE(5) {
        /* 5. closefrom over both ends, the client with SO_LINGER 0. */
        pair(&c, &s, 1);
        int low = c < s ? c : s;
        closefrom(low);
        printf("closefrom: fds closed %d\n", fcntl(c, F_GETFD) < 0 && fcntl(s, F_GETFD) < 0);
        next_pair_ends_clean("closefrom", c);

    }
    CASE(6) {
        /* 6. dup2 over accelerated sockets: the peer sees the end (EOF; a reset for SO_LINGER 0). */
        int p[2];
        if (pipe(p) < 0)
            die("pipe");
        pair(&c, &s, 0);
        if (dup2(p[0], c) < 0)
            die("dup2");
        outcome("dup2 peer", s);
        close(s);
        close(c);
        pair(&c, &s, 1);
        if (dup2(p[0], c) < 0)
            die("dup2");
        outcome("dup2 linger peer", s);
        close(s);
        if (my_close_range((unsigned)c, (unsigned)c, 0) < 0)
            die("close_range pipe");
        next_pair_ends_clean("dup2 linger", c);
        close(p[0]);
        close(p[1]);

    }
    CASE(7) {
        /* 7. fds above 65536: SO_LINGER 0 set there, before connect, gives a reset. */
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 70100) {
            printf("high: skipped (RLIMIT_NOFILE hard limit %llu)\n", (unsigned long long)rl.rlim_max);
        } else {
            rl.rlim_cur = 70100;
            if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                printf("high: skipped (setrlimit: %s)\n", strerror(errno));
            } else {
                int t = socket(AF_INET, SOCK_STREAM, 0);
                int hc = dup2(t, 70000);
                close(t);
                struct linger lg = {1, 0};
                setsockopt(hc, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
                if (connect(hc, (struct sockaddr *)&addr, sizeof addr) < 0)
                    die("connect high");
                int a = accept(lfd, NULL, NULL);
                int hs = dup2(a, 70001);
                close(a);
                printf("high: fds %d %d\n", hc, hs);
                exchange("high", hc, hs);
                close(hc);
                outcome("high linger peer", hs);
                close(hs);
                pair(&c, &s, 0);
                int hc2 = dup2(c, 70000);
                close(c);
                exchange("high again", hc2, s);
                close(hc2);
                outcome("high again", s);
                close(s);
            }
    }

    }
    CASE(8) {
        /* 8. vfork: the child closes its copy and execs; the parent's connection goes on. */
        pair(&c, &s, 0);
        pid_t pid = vfork();
        if (pid == 0) {
            close(c);
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("vfork: child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    send(s, "after", 5, 0);
    outcome("vfork parent", c);
    exchange("vfork", c, s);
    pid = vfork();
    if (pid == 0) {
        int d = dup2(0, c); /* over the parent's number, in the child's own table */
        (void)d;
        _exit(0);
    }
    waitpid(pid, &st, 0);
    exchange("vfork dup2", c, s);
    close(c);
    outcome("vfork", s);
    close(s);
    }
    CASE(9) {
        /* 9. A close_range the kernel refuses changes nothing: bad flags (EINVAL), and a seccomp
         * filter's EPERM (a sandbox); the connection goes on.  (memlan used to close the
         * accelerated sockets in the range through their records before the refused call.) */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            pair(&c, &s, 0);
            int r = my_close_range((unsigned)c, (unsigned)c, 0x80);
            printf("bad flags: %d %s\n", r, r < 0 ? strerror(errno) : "");
            exchange("bad flags", c, s);
            struct sock_filter f[] = {
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 436 /* close_range */, 0, 1),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
            struct sock_fprog prog = {sizeof f / sizeof f[0], f};
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
                prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
                die("seccomp");
            r = my_close_range((unsigned)(c < s ? c : s), ~0U, 0);
            printf("sandbox: %d %s\n", r, r < 0 ? strerror(errno) : "");
            exchange("sandbox", c, s);
            close(c);
            outcome("sandbox", s);
            close(s);
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        printf("sandbox: child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    CASE(10) {
        /* 10. CLOSE_RANGE_UNSHARE alone closes, in an unshared table: a client that wrote before
         * the server accepted must still deliver its bytes, then the end (memlan released the
         * record after the kernel's close, when the bytes could no longer go out). */
        c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr) < 0)
            die("connect early");
        if (send(c, "early", 5, 0) != 5)
            die("send early");
        if (my_close_range((unsigned)c, (unsigned)c, CLOSE_RANGE_UNSHARE) < 0)
            die("close_range unshare");
        printf("unshare: closed %d\n", fcntl(c, F_GETFD) < 0);
        s = accept(lfd, NULL, NULL);
        char b[16];
        ssize_t n = recv(s, b, sizeof b, MSG_WAITALL);
        printf("unshare: peer read %zd\n", n);
        outcome("unshare", s);
        close(s);
    }
    CASE(11) {
        /* 11. A close of every fd /proc/self/fd lists, as chromium and systemd's close loop make:
         * each close succeeds (memlan's own fds are listed too; their close said EBADF), and the
         * connections the program kept, and the next one, go on. */
        pair(&c, &s, 0);
        exchange("listed before", c, s);
        int fds[256], n = 0, failed = 0;
        DIR *d = opendir("/proc/self/fd");
        if (!d)
            die("opendir");
        struct dirent *e;
        while ((e = readdir(d)) && n < 256) {
            int fd = atoi(e->d_name);
            if (e->d_name[0] != '.' && fd > 2 && fd != dirfd(d) && fd != lfd && fd != c &&
                fd != s)
                fds[n++] = fd;
        }
        closedir(d);
        for (int i = 0; i < n; i++)
            if (close(fds[i]) < 0) {
                failed++;
                printf("close loop: fd listed, close says %s\n", strerror(errno));
            }
        printf("close loop: %d failed\n", failed);
        exchange("listed after", c, s);
        close(c);
        outcome("listed", s);
        close(s);
        pair(&c, &s, 0);
        exchange("after the close loop", c, s);
        close(c);
        outcome("after the close loop", s);
        close(s);
    }
    printf("done\n");
    return 0;
}
