/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pollzero: a progress loop of zero-timeout polls (Open MPI's tcp BTL, libevent's loops) on a
 * connection, alone and beside a kernel fd, then the end of a peer killed without a close.
 *
 * usage: pollzero PORT [ROUNDS]
 * The child echoes ROUNDS (default 2000) one-byte pings and then waits to be killed.  The parent
 * sends each ping and polls with a zero timeout until the answer is readable: the first half of
 * the rounds with the socket alone in the set, the second half with a pipe of its own beside
 * it, which it writes once, three quarters of the way, and which the first poll after that must
 * report.  Then it kills the child (SIGKILL: the child's files are closed by its exit, no
 * close of its own) and polls with a zero timeout, for 5 s at most, until the socket reports
 * something, the socket twice in the set; prints what each entry says (the kernel's are alike),
 * and what a read then returns.  Last, a thread whose only cancellation point is a loop of
 * zero-timeout polls of the ended socket is cancelled: it must end (joined within 5 s).
 * On stderr: the socket's fd, the number
 * of polls made and the milliseconds the run took (for a test that counts, under strace, how
 * often the kernel was asked of the socket).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "twoends.h"

static void show(const char *what, short rev)
{
    printf("%s:%s%s%s%s%s%s\n", what, rev & POLLIN ? " POLLIN" : "", rev & POLLOUT ? " POLLOUT" : "",
           rev & POLLRDHUP ? " POLLRDHUP" : "", rev & POLLHUP ? " POLLHUP" : "",
           rev & POLLERR ? " POLLERR" : "", rev & POLLNVAL ? " POLLNVAL" : "");
}

/* Polls fd with a zero timeout until cancelled: poll is its only cancellation point. */
static void *poller(void *arg)
{
    int fd = *(int *)arg;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        (void)poll(&p, 1, 0);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]), rounds = argc > 2 ? atoi(argv[2]) : 2000;
    struct sockaddr_in a;
    int l = listen_here(port, &a), one = 1;
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) { /* the echo, killed at the end */
        pin(1);
        int s = accept(l, NULL, NULL);
        if (s < 0)
            die("accept");
        close(l);
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char b;
        for (int i = 0; i < rounds; i++)
            if (read(s, &b, 1) != 1 || write(s, &b, 1) != 1)
                die("echo");
        for (;;)
            pause();
    }
    close(l);
    pin(0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a))
        die("connect");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int pp[2];
    if (pipe(pp))
        die("pipe");
    double t0 = now_s();
    long polls = 0;
    int pipe_first = -1; /* did the first poll after the pipe's write report it? */
    for (int i = 0; i < rounds; i++) {
        char b = (char)('a' + i % 26), got;
        if (write(c, &b, 1) != 1)
            die("ping");
        int with_pipe = i >= rounds / 2, wrote = i == rounds * 3 / 4;
        if (wrote && write(pp[1], "p", 1) != 1)
            die("pipe write");
        double end = now_s() + 30;
        for (int first = 1;; first = 0) {
            struct pollfd p[2] = {{.fd = c, .events = POLLIN | POLLRDHUP},
                                  {.fd = pp[0], .events = POLLIN}};
            int r = poll(p, with_pipe ? 2 : 1, 0);
            polls++;
            if (r < 0)
                die("poll");
            if (wrote && first)
                pipe_first = (p[1].revents & POLLIN) != 0;
            if (with_pipe && (p[1].revents & POLLIN)) {
                char x;
                if (read(pp[0], &x, 1) != 1)
                    die("pipe read");
            }
            if (p[0].revents & ~POLLIN) {
                show("FAIL unexpected", p[0].revents);
                return 1;
            }
            if (p[0].revents & POLLIN)
                break;
            if (now_s() > end)
                die("no answer in 30 s");
        }
        if (read(c, &got, 1) != 1 || got != b)
            die("answer");
    }
    printf("rounds: %d\npipe reported at once: %s\n", rounds, pipe_first == 1 ? "yes" : "no");
    if (kill(pid, SIGKILL) || waitpid(pid, NULL, 0) != pid)
        die("kill");
    short rev = 0, again = 0;
    for (double end = now_s() + 5; !(rev | again) && now_s() < end;) {
        struct pollfd p[2] = {{.fd = c, .events = POLLIN | POLLRDHUP},
                              {.fd = c, .events = POLLIN | POLLRDHUP}};
        if (poll(p, 2, 0) < 0)
            die("poll at the end");
        polls++;
        rev = p[0].revents;
        again = p[1].revents;
    }
    show("end", rev);
    show("end, the same socket again in the set", again);
    pthread_t t;
    if (pthread_create(&t, NULL, poller, &c) != 0)
        die("pthread_create");
    usleep(20000);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    int joined = pthread_cancel(t) == 0 && pthread_timedjoin_np(t, NULL, &dl) == 0;
    printf("a thread polling it is cancelled: %s\n", joined ? "yes" : "no (5 s)");
    char b;
    ssize_t r = read(c, &b, 1);
    printf("read at the end: %zd%s%s\n", r, r < 0 ? " " : "", r < 0 ? strerror(errno) : "");
    fprintf(stderr, "sockfd %d polls %ld ms %.0f\n", c, polls, (now_s() - t0) * 1e3);
    printf("done\n");
    return 0;
}
