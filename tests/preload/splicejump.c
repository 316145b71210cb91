/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* splicejump: splice from a connection into a pipe while a 200 us timer's handler siglongjmp()s
 * out of the splicing thread's calls; another thread drains the pipe and checks the stream (byte
 * i is i % 251).  Over kernel TCP a splice the handler interrupted had moved its bytes (or none)
 * before the handler ran: the stream is intact.  Under memlan a jump at the pipe write's return,
 * before the ring's release, left the bytes in both (found by a hostile review: "stream:
 * CORRUPT (MORE than sent bytes read)" in 3 of 3 runs).  usage: splicejump PORT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOTAL (8L << 20)
static sigjmp_buf jb;
static volatile sig_atomic_t armed;
static int pp[2];
static volatile long bad = -1, got;

static void on_alarm(int sig) { (void)sig; if (armed) siglongjmp(jb, 1); }

/* Started with SIGALRM blocked (inherited from main, which blocks it around the
 * pthread_create): a block made here, after the start, left a window in which the timer's
 * signal could reach this thread, whose handler then jumped onto main's stack (under load: a
 * SIGSEGV, or both threads spinning in the same call, over kernel TCP and under memlan alike). */
static void *drain(void *a)
{
    (void)a;
    static unsigned char b[65536];
    long off = 0;
    for (;;) {
        ssize_t n = read(pp[0], b, sizeof b);
        if (n <= 0)
            break;
        for (ssize_t i = 0; i < n; i++, off++)
            if (bad < 0 && b[i] != (unsigned char)(off % 251))
                bad = off;
        got = off;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int port = atoi(argv[1]);
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (void *)&a, sizeof a) < 0 || listen(lfd, 8) < 0) return 1;
    pid_t w = fork();
    if (w == 0) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (void *)&a, sizeof a) < 0) _exit(1);
        static unsigned char b[251 * 256];
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(i % 251);
        long sent = 0;
        while (sent < TOTAL) {
            long want = TOTAL - sent < (long)sizeof b ? TOTAL - sent : (long)sizeof b;
            ssize_t r = send(c, b, (size_t)want, 0);
            if (r <= 0)
                _exit(1);
            sent += r;
            if (r != want) { /* keep the pattern aligned: resend the tail from its place */
                long k = sent % 251;
                while (sent < TOTAL && k) {
                    unsigned char x = (unsigned char)(sent % 251);
                    if (send(c, &x, 1, 0) != 1) _exit(1);
                    sent++;
                    k = sent % 251;
                }
            }
        }
        close(c);
        _exit(0);
    }
    int fd = accept(lfd, NULL, NULL);
    if (pipe(pp) < 0) return 1;
    pthread_t t;
    sigset_t m, old;
    sigemptyset(&m);
    sigaddset(&m, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &m, &old);
    pthread_create(&t, NULL, drain, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct sigaction sa = {.sa_handler = on_alarm};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, NULL);
    long jumps = 0, moved = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (sigsetjmp(jb, 1))
            jumps++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > 20)
            break;
        armed = 1;
        ssize_t r = splice(fd, NULL, pp[1], NULL, 65536, 0);
        armed = 0;
        if (r == 0)
            break;
        if (r < 0 && errno != EINTR) {
            printf("splice: %s\n", strerror(errno));
            break;
        }
        if (r > 0)
            moved += r;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    close(pp[1]);
    pthread_join(t, NULL);
    printf("jumps: %s; stream: %s (%s bytes read, %s)\n", jumps ? "some" : "none",
           bad < 0 ? "intact" : "CORRUPT", got == TOTAL ? "all" : got > TOTAL ? "MORE than sent" : "fewer than sent",
           bad < 0 ? "-" : "first bad byte found");
    if (bad >= 0)
        printf("first bad byte at offset %ld of %ld\n", bad, got);
    close(fd);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    return 0;
}
