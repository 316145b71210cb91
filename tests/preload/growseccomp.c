/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* growseccomp: a connection's sender fills its ring and more (nonblocking, the reader away) in
 * a process whose seccomp filter kills madvise(MADV_POPULATE_WRITE) and madvise(MADV_REMOVE),
 * the calls with which a ring grows and gives its pages back (docs/design.md, "Rings grow");
 * then the reader reads it all.  Over kernel TCP nothing there calls madvise; under memlan the
 * ring must not grow there (a SIGSYS would kill the program) and every byte must arrive.
 * usage: growseccomp prctl|inherit PORT  (prctl: the filter comes after the connection, through
 * prctl; inherit: it is installed, then the program execs itself, as under systemd's
 * SystemCallFilter).  Prints "filled N, read N intact" and exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static void confine(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_POPULATE_WRITE, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_REMOVE, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog p = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p) < 0) {
        perror("seccomp");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    bool inherit = strcmp(argv[1], "inherit") == 0;
    if (inherit) {
        confine();
        execl("/proc/self/exe", argv[0], "inherited", argv[2], (char *)NULL);
        perror("exec");
        return 1;
    }
    int port = atoi(argv[2]);
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0)
        return 1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a) < 0)
        return 1;
    int s = accept(l, NULL, NULL);
    char x;
    if (send(c, "h", 1, 0) != 1 || recv(s, &x, 1, 0) != 1)
        return 1;
    if (strcmp(argv[1], "prctl") == 0)
        confine();
    fcntl(c, F_SETFL, O_NONBLOCK);
    static unsigned char buf[4096];
    long filled = 0;
    while (filled < (8L << 20)) {
        for (size_t i = 0; i < sizeof buf; i++)
            buf[i] = (unsigned char)((filled + (long)i) % 251);
        ssize_t r = send(c, buf, sizeof buf, 0);
        if (r < 0 && errno == EAGAIN)
            break;
        if (r <= 0) {
            perror("send");
            return 1;
        }
        filled += r;
        if (r < (ssize_t)sizeof buf)
            break; /* the rest would not line up with the pattern */
    }
    long got = 0, bad = 0;
    while (got < filled) {
        ssize_t r = recv(s, buf, sizeof buf, 0);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++)
            bad += buf[i] != (unsigned char)((got + i) % 251);
        got += r;
    }
    printf("filled %ld, read %ld %s\n", filled, got, bad ? "CORRUPT" : "intact");
    return got == filled && !bad ? 0 : 1;
}
