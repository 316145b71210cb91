/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * passend PORT MODE: the end of a connection passed over SCM_RIGHTS, as its client sees it.  An
 * acceptor accepts one connection, hands it to a worker (a fork child) over a unix socket and
 * closes its own copy; then it only waits (waitpid: no call memlan sees) while the client reads
 * until the end.  The client prints what it read: "client: got LINE", then "client: end of
 * stream", "client: error STRERROR" or "client: no end within 5 s".  Every wait is bounded.
 *
 * MODE, what the worker does with the descriptor it received:
 *   close       closes it at once, without any other call
 *   dup2        dup2s /dev/null over it at once (closing it so), without any other call
 *   fork        forks a child that writes "hello\n" and closes it; closes its own copy at once
 *   vfork       vforks a child that puts it on 1 and execs echo hello; closes its own copy
 *   vforkmove   the same, the child closing the received number after its dup2 (the socket
 *               reaches the exec on 1 alone)
 *   vforkfail   vforks a child whose exec fails (no such program); the worker then writes
 *               "hello\n" on it itself and closes it
 *   vforkkeep   vforks a child that execs true, which inherits the connection at its number
 *               and never touches it; the worker writes "hello\n" on it and closes it
 *   vforkkeep0  the same, the worker's stdin closed first, so that it receives the connection
 *               at 0 (where true gets it as its stdin)
 *   exec        puts it on 1 (dup2) and execs echo hello
 *   twice       (the acceptor passes the connection twice, by two sendmsg) writes "hello\n" on
 *               the first copy and closes both
 *   mtwice      the same, the two passes made by one sendmmsg of two messages
 *   exit        _exit(0) at once, without any call on it (the kernel closes it)
 *   die         writes "hello\n" (its first call), then _exit(0) without closing it
 *   kill        writes "hello\n", then is killed (SIGKILL)
 *   passerexit  (the acceptor is a child that exit()s right after the pass) waits for the
 *               acceptor's end (the end of a pipe only the acceptor holds open) and 300 ms
 *               more, then writes "hello\n" and closes
 *   passer_exit the same with an acceptor that _exit()s
 */
#include "fdpass.h"
#include "twoends.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static void client(int port)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        printf("client: connect: %s\n", strerror(errno));
        return;
    }
    char buf[256];
    size_t have = 0;
    for (int i = 0; i < 50; i++) { /* 50 polls of 100 ms */
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, 100);
        if (r < 0) {
            printf("client: error %s\n", strerror(errno));
            return;
        }
        if (r == 0)
            continue;
        ssize_t k = read(fd, buf + have, sizeof buf - 1 - have);
        if (k < 0) {
            printf("client: error %s\n", strerror(errno));
            return;
        }
        if (k == 0) {
            fprintf(stderr, "client: end after %ld ms\n", ms_since(&t0));
            printf("client: end of stream\n");
            return;
        }
        have += (size_t)k;
        buf[have] = 0;
        char *nl;
        while ((nl = strchr(buf, '\n'))) {
            *nl = 0;
            printf("client: got %s\n", buf);
            have -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, have + 1);
        }
    }
    printf("client: no end within 5 s\n");
}

/* The pass: once, or the same connection twice (two sendmsg, or one sendmmsg of two). */
static int fdpass_send_as(int sp, int fd, const char *mode)
{
    if (!strcmp(mode, "twice"))
        return fdpass_send(sp, fd) < 0 ? -1 : fdpass_send(sp, fd);
    if (strcmp(mode, "mtwice"))
        return fdpass_send(sp, fd);
    char byte[2] = {'L', 'L'};
    struct iovec v[2] = {{&byte[0], 1}, {&byte[1], 1}};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u[2];
    struct mmsghdr mm[2];
    memset(u, 0, sizeof u);
    memset(mm, 0, sizeof mm);
    for (int i = 0; i < 2; i++) {
        struct msghdr *m = &mm[i].msg_hdr;
        m->msg_iov = &v[i];
        m->msg_iovlen = 1;
        m->msg_control = u[i].buf;
        m->msg_controllen = sizeof u[i].buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return sendmmsg(sp, mm, 2, 0) == 2 ? 0 : -1;
}

static int passer_gone = -1; /* read end of a pipe whose write end only the passer holds */

static void worker(int sp, const char *mode)
{
    if (!strcmp(mode, "vforkkeep0"))
        close(0);
    int fd = fdpass_recv(sp, 0);
    if (fd < 0)
        _exit(1);
    if (!strcmp(mode, "twice") || !strcmp(mode, "mtwice")) { /* two copies: one used */
        int fd2 = fdpass_recv(sp, 0);
        (void)!write(fd, "hello\n", 6);
        close(fd);
        close(fd2);
        _exit(0);
    }
    if (!strcmp(mode, "close")) {
        close(fd);
        _exit(0);
    }
    if (!strcmp(mode, "dup2")) {
        int nul = open("/dev/null", O_RDONLY);
        dup2(nul, fd);
        close(fd);
        _exit(0);
    }
    if (!strcmp(mode, "usevfork"))
        (void)!write(fd, "first\n", 6);
    if (!strcmp(mode, "vforkfail") || !strncmp(mode, "vforkkeep", 9)) {
        pid_t c = vfork();
        if (c == 0) {
            if (strcmp(mode, "vforkfail")) {
                execl("/bin/true", "true", (char *)NULL);
                _exit(127);
            }
            dup2(fd, 1);
            execl("/nonexistent/memlan-passend", "x", (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(c, &st, 0);
        (void)!write(fd, "hello\n", 6);
        close(fd);
        _exit(0);
    }
    if (!strcmp(mode, "fork") || !strcmp(mode, "vfork") || !strcmp(mode, "usevfork") ||
        !strcmp(mode, "vforkmove")) {
        pid_t c = !strcmp(mode, "fork") ? fork() : vfork();
        if (c == 0) {
            if (strcmp(mode, "fork")) { /* the vfork child execs with the connection on 1 */
                dup2(fd, 1);
                if (!strcmp(mode, "vforkmove"))
                    close(fd);
                execl("/bin/echo", "echo", "hello", (char *)NULL);
                _exit(127);
            }
            (void)!write(fd, "hello\n", 6);
            close(fd);
            _exit(0);
        }
        close(fd);
        int st;
        waitpid(c, &st, 0);
        _exit(0);
    }
    if (!strcmp(mode, "exec")) { /* the connection on 1, then exec: echo writes there */
        dup2(fd, 1);
        close(fd);
        execl("/bin/echo", "echo", "hello", (char *)NULL);
        _exit(127);
    }
    if (!strcmp(mode, "exit"))
        _exit(0);
    if (!strncmp(mode, "passer", 6)) { /* the passer's end first: its pipe's end of file */
        struct pollfd p = {passer_gone, POLLIN, 0};
        char c;
        if (poll(&p, 1, 5000) != 1 || read(passer_gone, &c, 1) != 0)
            _exit(1);
        /* a receiver a little late: the peer's liveness looks (every 100 ms) come first */
        nanosleep(&(struct timespec){0, 300 * 1000000}, NULL);
    }
    (void)!write(fd, "hello\n", 6);
    if (!strcmp(mode, "kill"))
        raise(SIGKILL);
    if (!strncmp(mode, "passer", 6))
        close(fd);
    _exit(0);
}

int main(int argc, char **argv)
{
    int gone[2];
    if (pipe(gone) < 0)
        return 1;
    passer_gone = gone[0];
    if (argc < 3)
        return 2;
    int port = atoi(argv[1]);
    const char *mode = argv[2];
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_backlog(port, 8, &a); /* twoends.h */
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
        return 1;
    pid_t w = fork();
    if (w == 0) {
        close(l);
        close(sp[0]);
        close(gone[1]);
        worker(sp[1], mode);
    }
    close(sp[1]);
    pid_t c = fork();
    if (c == 0) {
        close(l);
        close(sp[0]);
        close(gone[1]);
        client(port);
        _exit(0);
    }
    bool passer_child = !strncmp(mode, "passer", 6);
    pid_t pc = passer_child ? fork() : 0;
    if (pc > 0)
        close(gone[1]); /* the passer's alone now */
    if (pc == 0) {
        struct pollfd p = {l, POLLIN, 0};
        int fd = poll(&p, 1, 5000) == 1 ? accept(l, NULL, NULL) : -1;
        if (fd < 0 || fdpass_send_as(sp[0], fd, mode) < 0)
            printf("acceptor: no connection passed\n");
        close(fd);
        if (!strcmp(mode, "passerexit"))
            exit(0);
        if (!strcmp(mode, "passer_exit"))
            _exit(0);
    }
    close(l);
    int st;
    waitpid(c, &st, 0);
    if (passer_child)
        waitpid(pc, &st, 0);
    close(sp[0]);
    waitpid(w, &st, 0);
    printf("done\n");
    return 0;
}
