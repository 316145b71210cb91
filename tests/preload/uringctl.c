/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * uringctl PORT: a client that puts its connection into its epoll set the way libuv (1.45 and
 * later: uvloop, Node.js's own builds) does, by an io_uring IORING_OP_EPOLL_CTL made through
 * libc's syscall(), and falls back to epoll_ctl when io_uring_setup fails, as libuv does.  A
 * server (a fork child) answers each "ping I\n" with "pong I\n"; the client sends three pings,
 * waiting for each answer in epoll_wait (5 s at most).  Prints "io_uring: used" or
 * "io_uring: refused", then "round I ok" or "round I: no answer within 5 s", then "done".
 *
 * Under memlan an epoll_ctl made by io_uring never reaches the preload library: the set knew
 * nothing of the accelerated socket, whose kernel socket never becomes readable (the bytes are
 * in the ring), and the client waited for ever (uvloop's server and client under memlan hung at
 * their first message).
 */
#include "twoends.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* One IORING_OP_EPOLL_CTL, submitted and waited for; its result, or -1 when io_uring_setup
 * failed (then *refused is set). */
static int uring_epoll_add(int ep, int fd, struct epoll_event *ev, int *refused)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int ring = (int)syscall(SYS_io_uring_setup, 4, &p);
    if (ring < 0) {
        *refused = 1;
        return -1;
    }
    size_t sqlen = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cqlen = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    size_t len = sqlen > cqlen ? sqlen : cqlen; /* IORING_FEAT_SINGLE_MMAP: one map for both */
    char *sq = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring,
                    IORING_OFF_SQ_RING);
    struct io_uring_sqe *sqes = mmap(NULL, p.sq_entries * sizeof *sqes, PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQES);
    if (sq == MAP_FAILED || sqes == MAP_FAILED || !(p.features & IORING_FEAT_SINGLE_MMAP)) {
        printf("io_uring: cannot map its rings\n");
        exit(1);
    }
    unsigned *tail = (unsigned *)(sq + p.sq_off.tail), *mask = (unsigned *)(sq + p.sq_off.ring_mask);
    unsigned *array = (unsigned *)(sq + p.sq_off.array);
    unsigned t = *tail, i = t & *mask;
    memset(&sqes[i], 0, sizeof sqes[i]);
    sqes[i].opcode = IORING_OP_EPOLL_CTL;
    sqes[i].fd = ep;
    sqes[i].len = EPOLL_CTL_ADD; /* the kernel's io_epoll_ctl_prep: len the op, off the fd */
    sqes[i].off = (unsigned long)fd;
    sqes[i].addr = (unsigned long)ev;
    array[i] = i;
    __atomic_store_n(tail, t + 1, __ATOMIC_RELEASE);
    if (syscall(SYS_io_uring_enter, ring, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
        printf("io_uring_enter: %s\n", strerror(errno));
        exit(1);
    }
    unsigned *chead = (unsigned *)(sq + p.cq_off.head);
    struct io_uring_cqe *cqes = (struct io_uring_cqe *)(sq + p.cq_off.cqes);
    int res = cqes[*chead & *(unsigned *)(sq + p.cq_off.ring_mask)].res;
    __atomic_store_n(chead, *chead + 1, __ATOMIC_RELEASE);
    return res;
}

static void server(int l)
{
    int fd = accept(l, NULL, NULL);
    close(l);
    char line[64], out[64];
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, line + n, 1);
        if (k <= 0)
            break;
        if (line[n] == '\n' || n + 2 >= sizeof line) {
            line[n + 1] = 0;
            int i = -1;
            if (sscanf(line, "ping %d", &i) == 1) {
                int m = snprintf(out, sizeof out, "pong %d\n", i);
                (void)!write(fd, out, (size_t)m);
            }
            n = 0;
        } else {
            n++;
        }
    }
    close(fd);
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_backlog(port, 8, &a); /* twoends.h */
    pid_t s = fork();
    if (s == 0)
        server(l);
    close(l);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("connect");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    int refused = 0;
    int r = uring_epoll_add(ep, fd, &ev, &refused);
    if (refused)
        r = epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev); /* libuv's fallback */
    printf("io_uring: %s\n", refused ? "refused" : "used");
    if (r < 0) {
        printf("epoll add failed: %s\n", strerror(refused ? errno : -r));
        return 1;
    }
    for (int i = 0; i < 3; i++) {
        char req[32], want[32], got[64];
        int k = snprintf(req, sizeof req, "ping %d\n", i);
        snprintf(want, sizeof want, "pong %d\n", i);
        (void)!write(fd, req, (size_t)k);
        size_t n = 0;
        while (n < strlen(want)) {
            struct epoll_event out;
            int w = epoll_wait(ep, &out, 1, 5000);
            if (w <= 0)
                break;
            ssize_t m = read(fd, got + n, strlen(want) - n);
            if (m <= 0)
                break;
            n += (size_t)m;
        }
        got[n] = 0;
        if (strcmp(got, want) == 0)
            printf("round %d ok\n", i);
        else {
            printf("round %d: no answer within 5 s\n", i);
            break;
        }
    }
    close(fd);
    int st;
    waitpid(s, &st, 0);
    printf("done\n");
    return 0;
}
