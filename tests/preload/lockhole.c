/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * lockhole: the holes a review found in "locks never held across a sleep", against kernel TCP:
 *   vandal    the peer writes over the shared copies of the indices only we write (the tail of
 *             the ring we read, the head of the ring we write): poll must not report what is not
 *             there (no POLLIN, no POLLOUT with our ring full), and a blocking recv must sleep,
 *             not spin, until the peer's byte comes (CPU time of the blocked thread well under
 *             its wall time).  Over kernel TCP there is nothing to write over: the same lines.
 *             The victim is a fresh exec'd image (a process that never forked, whose locked
 *             passes do not reload the shared copies).
 *   dup2blk   dup2(pipe, fd) while another thread is asleep in recv on fd: the blocked recv
 *             keeps the socket (no FIN reaches the peer, its byte still arrives), and the file
 *             dup2'd in is a plain file (closing its last fd gives the pipe's reader EOF)
 *   unshare   the same with close_range(fd, fd, CLOSE_RANGE_UNSHARE) in place of the dup2 (the
 *             kernel closes in a table of the thread's own: the other thread's recv keeps the fd)
 *   jmplock   a timer handler siglongjmp()s out of recv(4 MB) again and again while a sender
 *             streams (some jumps land in the locked copy): recv works afterwards
 *   jmpsend   the same out of send(4 MB) while the peer drains: send works afterwards
 *   peekwait  recv(MSG_PEEK|MSG_WAITALL) with fewer bytes there than asked and SO_RCVTIMEO: the
 *             bytes there when the timeout runs out
 *   peeksig   the same without the timeout, a handler (SA_RESTART) comes: the bytes there
 * Each case runs in a child with a time limit; a hang prints "killed by signal 14".
 *
 * usage: lockhole PORT   (lockhole PORT --victim TOFD FROMFD: the vandal case's victim)
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

static int port;
static char *self;
static struct sockaddr_in addr;

static void ms(int n) { struct timespec t = {n / 1000, (long)(n % 1000) * 1000000L}; nanosleep(&t, NULL); }

static int dial(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
        perror("connect");
        _exit(1);
    }
    return s;
}

static char rd1(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c = 0;
    if (poll(&p, 1, 5000) != 1 || read(fd, &c, 1) != 1)
        return 0;
    return c;
}

/* ---- vandal ------------------------------------------------------------------------------ */

static double thread_cpu(void)
{
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static void victim(int to, int from)
{
    alarm(8);
    int s = dial();
    char c = 0;
    send(s, "h", 1, 0);
    recv(s, &c, 1, 0);
    static char buf[65536];
    while (send(s, buf, sizeof buf, MSG_DONTWAIT | MSG_NOSIGNAL) > 0)
        ;
    (void)!write(to, "f", 1); /* our ring is full */
    if (rd1(from) != 'v')      /* the vandal did its work */
        printf("vandal: no word from the vandal\n");
    struct pollfd p = {.fd = s, .events = POLLIN | POLLOUT};
    int pr = poll(&p, 1, 300);
    printf("vandal: poll with nothing to read and no room %d %#x\n", pr, pr > 0 ? p.revents : 0);
    (void)!write(to, "p", 1);
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    double c0 = thread_cpu();
    c = '-';
    ssize_t r = recv(s, &c, 1, 0);
    double cpu = thread_cpu() - c0;
    clock_gettime(CLOCK_MONOTONIC, &w1);
    double wall = (double)(w1.tv_sec - w0.tv_sec) + (double)(w1.tv_nsec - w0.tv_nsec) / 1e9;
    printf("vandal: blocked recv %zd %c, slept (cpu under a third of the wait): %s\n", r,
           r > 0 ? c : '-', wall > 1.0 && cpu < wall / 3 ? "yes" : "no");
    if (getenv("LOCKHOLE_DEBUG"))
        fprintf(stderr, "vandal: wall %.2f s cpu %.2f s\n", wall, cpu);
    _exit(0);
}

/* The peer's writes: the victim connected (channel side 0), so it writes ring 0 (head at 256)
 * and reads ring 1 (tail at 640 + 64).  Garbage in its tail; its head made to say "empty".
 * undo: the tail put back (the vandal's own sends reload it, and would find the ring broken). */
#define MAXCH 16
static uint8_t *chans[MAXCH];
static uint64_t saved_t1[MAXCH];
static int nchans;

static void scribble(void)
{
    const char *dir = getenv("MEMLAN_FABRIC");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) && nchans < MAXCH) {
        if (strncmp(e->d_name, "seg-", 4))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDWR);
        if (fd < 0)
            continue;
        uint8_t *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            continue;
        uint32_t kind;
        memcpy(&kind, m + 24, 4);
        if (kind != 2) { /* not a channel */
            munmap(m, 4096);
            continue;
        }
        volatile uint64_t *h0 = (volatile uint64_t *)(m + 256);
        volatile uint64_t *t0 = (volatile uint64_t *)(m + 256 + 64);
        volatile uint64_t *t1 = (volatile uint64_t *)(m + 640 + 64);
        saved_t1[nchans] = *t1;
        chans[nchans++] = m;
        *h0 = *t0;
        *t1 = 0xdeadbeef00ull;
    }
    closedir(d);
}

static void undo(void)
{
    for (int i = 0; i < nchans; i++) {
        *(volatile uint64_t *)(chans[i] + 640 + 64) = saved_t1[i];
        munmap(chans[i], 4096);
    }
    nchans = 0;
}

static void case_vandal(int l)
{
    int to[2], from[2];
    if (pipe(to) < 0 || pipe(from) < 0)
        exit(1);
    pid_t p = fork();
    if (p == 0) {
        char a1[16], a2[16], a3[16];
        snprintf(a1, sizeof a1, "%d", port);
        snprintf(a2, sizeof a2, "%d", to[1]);
        snprintf(a3, sizeof a3, "%d", from[0]);
        execl(self, self, a1, "--victim", a2, a3, (char *)NULL);
        _exit(1);
    }
    int c = accept(l, NULL, NULL);
    char b;
    recv(c, &b, 1, 0);
    send(c, "k", 1, 0);
    if (rd1(to[0]) == 'f') {
        scribble();
        if (getenv("LOCKHOLE_DEBUG"))
            fprintf(stderr, "vandal: %d channels written over\n", nchans);
    }
    (void)!write(from[1], "v", 1);
    rd1(to[0]); /* the victim polled and goes to sleep in recv */
    ms(1500);
    undo();
    send(c, "x", 1, MSG_NOSIGNAL);
    int st;
    waitpid(p, &st, 0);
    if (WIFSIGNALED(st))
        printf("vandal: victim killed by signal %d\n", WTERMSIG(st));
    close(c);
    close(to[0]), close(to[1]), close(from[0]), close(from[1]);
}

/* ---- dup2blk ----------------------------------------------------------------------------- */

static int cfd;
static char got;
static ssize_t got_r;
static void *t_recv(void *a) { (void)a; got = '-'; got_r = recv(cfd, &got, 1, 0); return NULL; }

static void case_dup2blk(int l, bool unshare)
{
    const char *name = unshare ? "unshare" : "dup2blk";
    pid_t p = fork();
    if (p == 0) {
        alarm(8);
        close(l);
        cfd = dial();
        char c;
        send(cfd, "h", 1, 0);
        recv(cfd, &c, 1, 0);
        pthread_t t;
        pthread_create(&t, NULL, t_recv, NULL);
        ms(200);
        if (unshare) {
            printf("%s: close_range(CLOSE_RANGE_UNSHARE) %d\n", name,
                   (int)syscall(SYS_close_range, cfd, cfd, CLOSE_RANGE_UNSHARE));
        } else {
            int pp[2];
            if (pipe(pp) < 0)
                _exit(1);
            printf("%s: dup2 over the socket %d\n", name, dup2(pp[1], cfd) == cfd);
            close(pp[1]);
            close(cfd); /* the pipe's last write end */
            struct pollfd pf = {.fd = pp[0], .events = POLLIN};
            int pr = poll(&pf, 1, 500);
            printf("%s: the pipe's reader sees EOF: %s\n", name,
                   pr == 1 && read(pp[0], &c, 1) == 0 ? "yes" : "no");
        }
        pthread_join(t, NULL);
        printf("%s: blocked recv %zd %c\n", name, got_r, got_r > 0 ? got : '-');
        fflush(stdout);
        _exit(0);
    }
    int c = accept(l, NULL, NULL);
    char b;
    recv(c, &b, 1, 0);
    send(c, "k", 1, 0);
    struct pollfd pf = {.fd = c, .events = POLLIN | POLLRDHUP};
    int pr = poll(&pf, 1, 1500); /* past the peer's liveness poll */
    send(c, "x", 1, MSG_NOSIGNAL);
    int st;
    waitpid(p, &st, 0);
    if (WIFSIGNALED(st))
        printf("%s: client killed by signal %d\n", name, WTERMSIG(st));
    printf("%s: server poll while the recv is asleep %d %#x\n", name, pr,
           pr > 0 ? pf.revents : 0);
    close(c);
}

/* ---- jmplock ----------------------------------------------------------------------------- */

static sigjmp_buf jb;
static volatile sig_atomic_t armed;
static void on_alrm_jump(int s) { (void)s; if (armed) siglongjmp(jb, 1); }

static void case_jmplock(int l, bool tx)
{
    const char *name = tx ? "jmpsend" : "jmplock";
    pid_t p = fork();
    if (p == 0) { /* the peer: streams for 2 s (or drains, for jmpsend), then waits to be killed */
        close(l);
        int s = dial();
        static char buf[1 << 16];
        memset(buf, 'a', sizeof buf);
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            if ((tx ? recv(s, buf, sizeof buf, 0) : send(s, buf, sizeof buf, MSG_NOSIGNAL)) <= 0)
                break;
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while (t.tv_sec - t0.tv_sec < 2);
        if (!tx)
            send(s, "z", 1, MSG_NOSIGNAL);
        else
            while (recv(s, buf, sizeof buf, 0) > 0)
                ;
        sleep(8);
        _exit(0);
    }
    int c = accept(l, NULL, NULL);
    pid_t q = fork(); /* the jumping side, in a child of its own: its timer and its hang */
    if (q == 0) {
        alarm(8);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alrm_jump;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGPROF, &sa, NULL);
        static char big[4 << 20];
        struct itimerval it = {{0, 300}, {0, 300}};
        setitimer(ITIMER_PROF, &it, NULL);
        long jumps = 0, bytes = 0;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= 1000)
                break;
            if (sigsetjmp(jb, 1)) {
                armed = 0;
                jumps++;
                continue;
            }
            armed = 1;
            ssize_t r = tx ? send(c, big, sizeof big, MSG_NOSIGNAL) : recv(c, big, sizeof big, 0);
            armed = 0;
            if (r > 0)
                bytes += r;
            else if (r == 0 || errno != EINTR)
                break;
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_PROF, &off, NULL);
        armed = 0;
        if (getenv("LOCKHOLE_DEBUG"))
            fprintf(stderr, "%s: jumps %ld bytes %ld\n", name, jumps, bytes);
        int eintr = 0;
        ssize_t r = -1;
        for (int i = 0; i < 100; i++) {
            r = tx ? send(c, "y", 1, MSG_NOSIGNAL) : recv(c, big, 1, 0);
            if (r < 0 && errno == EINTR) {
                eintr++;
                continue;
            }
            break;
        }
        printf("%s: after the jumps %s %s, EINTR answers %d\n", name, tx ? "send" : "recv",
               r == 1 ? "1 byte" : r < 0 ? strerror(errno) : "0", eintr);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(q, &st, 0);
    if (WIFSIGNALED(st))
        printf("%s: %s killed by signal %d\n", name, tx ? "sender" : "receiver", WTERMSIG(st));
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    close(c);
}

/* ---- peekwait ---------------------------------------------------------------------------- */

static void on_usr1(int sig) { (void)sig; }
static pthread_t peeker;
static void *kick_peeker(void *a) { (void)a; ms(300); pthread_kill(peeker, SIGUSR1); return NULL; }

static void case_peekwait(int l, bool sig)
{
    const char *name = sig ? "peeksig" : "peekwait";
    pid_t p = fork();
    if (p == 0) {
        close(l);
        int s = dial();
        send(s, "a", 1, 0);
        sleep(4);
        _exit(0);
    }
    int c = accept(l, NULL, NULL);
    pid_t q = fork();
    if (q == 0) {
        alarm(3);
        pthread_t t;
        if (sig) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_usr1;
            sa.sa_flags = SA_RESTART;
            sigaction(SIGUSR1, &sa, NULL);
            peeker = pthread_self();
            pthread_create(&t, NULL, kick_peeker, NULL);
        } else {
            struct timeval tv = {0, 300000};
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        }
        char b[4];
        ms(100);
        ssize_t r = recv(c, b, 4, MSG_PEEK | MSG_WAITALL);
        printf("%s: recv(MSG_PEEK|MSG_WAITALL) with %s %zd %s\n", name,
               sig ? "a handler (SA_RESTART)" : "SO_RCVTIMEO", r,
               r < 0 ? strerrorname_np(errno) : "-");
        if (sig)
            pthread_join(t, NULL);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(q, &st, 0);
    if (WIFSIGNALED(st))
        printf("%s: receiver killed by signal %d\n", name, WTERMSIG(st));
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    close(c);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    port = atoi(argv[1]);
    self = argv[0];
    setvbuf(stdout, NULL, _IONBF, 0);
    addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (argc == 5 && !strcmp(argv[2], "--victim"))
        victim(atoi(argv[3]), atoi(argv[4]));
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(l, 8) < 0) {
        perror("listen");
        return 1;
    }
    const char *only = getenv("LOCKHOLE_CASE"); /* a list of the cases to run: all without it */
    if (!only || strstr(only, "vandal"))
        case_vandal(l);
    if (!only || strstr(only, "dup2blk"))
        case_dup2blk(l, false);
    if (!only || strstr(only, "unshare"))
        case_dup2blk(l, true);
    if (!only || strstr(only, "jmplock"))
        case_jmplock(l, false);
    if (!only || strstr(only, "jmpsend"))
        case_jmplock(l, true);
    if (!only || strstr(only, "peekwait"))
        case_peekwait(l, false);
    if (!only || strstr(only, "peeksig"))
        case_peekwait(l, true);
    printf("done\n");
    return 0;
}
