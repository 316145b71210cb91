/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pollcancel: a thread asleep in poll() on a connection is cancelled (poll is a cancellation
 * point; once after 300 ms, once after 2 ms), another thread then reuses its stack, and data
 * arrives: the process must go on as over kernel TCP (memlan once left the cancelled thread's
 * registration on the socket, on its stack, and the next wake-up walked it: SIGSEGV).  Then a
 * thread that leaves poll through siglongjmp from a signal handler (after 300 ms, and after
 * 2 ms, while a poll of one socket sleeps on the ring's futex, that thread then ending by
 * pthread_exit: memlan's poll had registered a cleanup with glibc that the jump left behind,
 * and the exit jumped into its dead frame, SIGSEGV), and the same; then the main
 * thread leaves its own poll by siglongjmp and polls again.  Last, the connection is closed: the
 * peer must read EOF, as over kernel TCP (memlan kept each abandoned poll's references to the
 * socket, so the close did not end the connection and the peer waited: "peer: no eof").
 *
 * usage: pollcancel PORT [two]
 *
 * two: threads that leave their waits by siglongjmp and then live on without another poll: one
 * asleep in poll on connection A (300 ms: poll's long sleep), one in poll on B (2 ms: the ring's
 * futex), one in epoll_wait on a set holding C (300 ms).  Then the program closes A, B and C:
 * the peer must read EOF on each, as over kernel TCP, where the jump left nothing in the kernel
 * (memlan kept each abandoned wait's reference to its socket until the thread's next poll, which
 * never came, so the close did not end the connection: "peer: A no eof").  Last, the epoll set
 * whose sleeper jumped away (it holds D too) reports D's byte, then is waited on again for 300 ms
 * with nothing to report: it must sleep (a sleeper count left behind must not keep it waking).
 */
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int fd;
static sigjmp_buf jb;

static void *poller(void *a)
{
    struct pollfd p = {fd, POLLIN, 0};
    (void)a;
    poll(&p, 1, -1);
    return NULL;
}

static void *scribble(void *a)
{
    volatile char buf[200000];
    (void)a;
    memset((char *)buf, 0x41, sizeof buf);
    usleep(300000);
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
    siglongjmp(jb, 1);
}

static void *jumper(void *a)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    if (sigsetjmp(jb, 1) == 0) {
        /* Unblocked once jb is set: a signal sent before this thread ran is taken here. */
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, -1);
    }
    if (a)
        pthread_exit(NULL); /* unwinds through nothing of the poll's (it once jumped into it) */
    return NULL;
}

static void *killer(void *a)
{
    usleep(300000); /* the target is asleep in poll */
    pthread_kill(*(pthread_t *)a, SIGUSR1);
    return NULL;
}

static int wait_data(const char *what, int n)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, 5000);
    char buf[16];
    ssize_t got = r == 1 ? recv(fd, buf, sizeof buf, 0) : -1;
    printf("%s: poll %d, recv %zd\n", what, r, got);
    return got == n ? 0 : 1;
}

/* ---- two: waits left by siglongjmp, their threads living on ---- */

static __thread sigjmp_buf tjb;
static int hold[2];  /* the jumpers wait here once they have jumped */
static int jumped[2]; /* and say so here */

static void on_usr2(int sig)
{
    (void)sig;
    siglongjmp(tjb, 1);
}

struct jumper2 {
    int fd, ep; /* ep >= 0: epoll_wait on it, else poll on fd */
    pthread_t t;
};

static void *jumper2(void *a)
{
    struct jumper2 *j = a;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR2);
    if (sigsetjmp(tjb, 1) == 0) {
        /* Unblocked once tjb is set: a signal sent before this thread ran is taken here. */
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
        if (j->ep >= 0) {
            struct epoll_event ev;
            epoll_wait(j->ep, &ev, 1, -1);
        } else {
            struct pollfd p = {j->fd, POLLIN, 0};
            poll(&p, 1, -1);
        }
        return NULL; /* woken without the jump: the peer said nothing, so cannot be */
    }
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    char b;
    if (write(jumped[1], "j", 1) != 1 || read(hold[0], &b, 1) != 1) /* live on, no poll */
        return NULL;
    return NULL;
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static int two(int l, struct sockaddr_in *a)
{
    int go[2];
    if (pipe(go) < 0 || pipe(hold) < 0 || pipe(jumped) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        int c[4];
        char b;
        for (int i = 0; i < 4; i++) { /* accepted in this order */
            c[i] = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(c[i], (void *)a, sizeof *a) < 0 || read(c[i], &b, 1) != 1)
                _exit(1);
        }
        if (read(go[0], &b, 1) != 1)
            _exit(1);
        for (int i = 0; i < 3; i++) {
            struct pollfd p = {c[i], POLLIN, 0};
            int r = poll(&p, 1, 3000);
            ssize_t g = r == 1 ? read(c[i], &b, 1) : -1;
            printf("peer: %c %s\n", "ABC"[i], g == 0 ? "eof" : "no eof");
        }
        if (write(c[3], "x", 1) != 1 || read(go[0], &b, 1) != 1)
            _exit(1);
        _exit(0);
    }
    int fd3[4];
    for (int i = 0; i < 4; i++)
        if ((fd3[i] = accept(l, NULL, NULL)) < 0 || write(fd3[i], "g", 1) != 1)
            return 1;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd3[2]};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd3[2], &ev) < 0)
        return 1;
    ev.data.fd = fd3[3];
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd3[3], &ev) < 0)
        return 1;
    signal(SIGUSR2, on_usr2);
    sigset_t blk;
    sigemptyset(&blk);
    sigaddset(&blk, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &blk, NULL); /* only the jumpers take it */
    struct jumper2 j[3] = {{fd3[0], -1, 0}, {fd3[1], -1, 0}, {-1, ep, 0}};
    const unsigned after_us[3] = {300000, 2000, 300000};
    char b;
    for (int i = 0; i < 3; i++) {
        pthread_create(&j[i].t, NULL, jumper2, &j[i]);
        usleep(after_us[i]);
        pthread_kill(j[i].t, SIGUSR2);
        if (read(jumped[0], &b, 1) != 1)
            return 1;
    }
    for (int i = 0; i < 3; i++)
        close(fd3[i]); /* the peer reads EOF on each */
    if (write(go[1], "1", 1) != 1)
        return 1;
    /* The set whose sleeper jumped away: D's byte, then nothing: it must sleep. */
    int n = epoll_wait(ep, &ev, 1, 10000);
    printf("epoll_wait for D: %d, %s, recv %zd\n", n, n == 1 && ev.data.fd == fd3[3] ? "D" : "?",
           recv(fd3[3], &b, 1, MSG_DONTWAIT));
    double c0 = cpu_ms();
    n = epoll_wait(ep, &ev, 1, 300);
    double used = cpu_ms() - c0;
    printf("epoll_wait after the jump: %d, %s\n", n, used < 100 ? "slept" : "BUSY");
    fprintf(stderr, "epoll_wait after the jump: %.1f ms of cpu in 300 ms\n", used);
    int st;
    if (write(go[1], "2", 1) != 1)
        return 1;
    waitpid(pid, &st, 0);
    close(fd3[3]);
    if (write(hold[1], "xxx", 3) != 3)
        return 1;
    for (int i = 0; i < 3; i++)
        pthread_join(j[i].t, NULL);
    close(ep);
    printf("done\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(60);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 4) < 0)
        return 1;
    if (argc == 3)
        return strcmp(argv[2], "two") == 0 ? two(l, &a) : 2;
    int go[2];
    if (pipe(go) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60); /* not inherited: bound the peer too, should its parent die */
        int c = socket(AF_INET, SOCK_STREAM, 0);
        char b;
        if (connect(c, (void *)&a, sizeof a) < 0 || read(c, &b, 1) != 1)
            _exit(1);
        for (int k = 0; k < 3; k++) { /* one round per case: wait for the word, then send */
            if (read(go[0], &b, 1) != 1)
                _exit(1);
            usleep(100000);
            if (write(c, "data", 4) != 4)
                _exit(1);
        }
        struct pollfd p = {c, POLLIN, 0};
        int r = poll(&p, 1, 3000);
        ssize_t g = r == 1 ? read(c, &b, 1) : -1;
        printf("peer: %s\n", g == 0 ? "eof" : "no eof");
        _exit(0);
    }
    fd = accept(l, NULL, NULL);
    if (fd < 0 || write(fd, "g", 1) != 1)
        return 1;
    int bad = 0;

    pthread_t t, s;
    pthread_create(&t, NULL, poller, NULL);
    usleep(300000); /* asleep in poll */
    pthread_cancel(t);
    pthread_join(t, NULL);
    /* Cancelled within its first milliseconds, where a poll of one socket sleeps on the ring's
     * futex (its first 10 ms) rather than in ppoll. */
    pthread_create(&t, NULL, poller, NULL);
    usleep(2000);
    pthread_cancel(t);
    void *how = NULL;
    pthread_join(t, &how);
    if (how != PTHREAD_CANCELED) { /* poll returned (EINTR) instead */
        printf("a poller cancelled after 2 ms was not cancelled\n");
        bad = 1;
    }
    pthread_create(&s, NULL, scribble, NULL);
    if (write(go[1], "1", 1) != 1)
        return 1;
    bad |= wait_data("after a cancelled poller", 4);
    pthread_join(s, NULL);

    signal(SIGUSR1, on_alarm);
    sigset_t blk;
    sigemptyset(&blk);
    sigaddset(&blk, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &blk, NULL); /* only the jumper takes it */
    pthread_create(&t, NULL, jumper, NULL);
    usleep(300000);
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    /* And one that jumps within its first milliseconds, out of the ring's futex (a poll of one
     * socket sleeps there first): its reference must not stay behind either. */
    pthread_create(&t, NULL, jumper, (void *)1);
    usleep(2000);
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    pthread_create(&s, NULL, scribble, NULL);
    if (write(go[1], "2", 1) != 1)
        return 1;
    bad |= wait_data("after a poller left by siglongjmp", 4);
    pthread_join(s, NULL);

    pthread_t self = pthread_self(), k3;
    pthread_sigmask(SIG_UNBLOCK, &blk, NULL);
    pthread_create(&k3, NULL, killer, &self);
    if (sigsetjmp(jb, 1) == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, -1);
    }
    pthread_join(k3, NULL);
    pthread_sigmask(SIG_BLOCK, &blk, NULL);
    if (write(go[1], "3", 1) != 1)
        return 1;
    bad |= wait_data("after this thread left its poll by siglongjmp", 4);

    close(fd); /* the peer reads EOF */

    int st;
    waitpid(pid, &st, 0);
    printf("done\n");
    return bad;
}
