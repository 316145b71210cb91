/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollrearm: the shape of nfs-ganesha's RPC loop (libntirpc): one thread waits in epoll_wait on
 * a set whose connection is registered EPOLLIN|EPOLLONESHOT; on an event it hands the request to
 * a worker thread and goes straight back to epoll_wait, while the worker reads the request,
 * re-arms the connection with EPOLL_CTL_MOD and only then sends the reply.  Plain POSIX; run over
 * kernel TCP and under `memlan run` (tests/py/test_preload.py).
 *
 * usage: epollrearm PINGS [pool]
 *
 * The parent is the server (the loop thread and the worker); a forked child connects and
 * ping-pongs PINGS 64-byte messages, checking each echo, then closes.  When the MOD comes the
 * loop thread is asleep and the connection has nothing to read (its client waits for the reply),
 * so the kernel leaves the loop thread asleep: it wakes once per request.  The set also holds an
 * eventfd (ntirpc's control socket) that the worker writes when it reads the EOF.
 *
 * It prints one line of JSON:
 *   {"pings":..., "loop_switches":..., "loop_returns":..., "mod_wakes":..., "echoed":...}
 * (voluntary context switches of each thread from the loop's first wait to its end, the loop's
 * epoll_wait returns, and the loop thread's sleeps that a MOD caused) and exits 0 only if every
 * byte came back and the connection closed cleanly.
 *
 * With "pool", the loop moves as in libntirpc: POOL threads take turns, and the one that gets an
 * event hands the loop to an idle one and handles the request itself (read, MOD, reply).  The
 * server's threads share one cpu and the client has another (when there are two), as in
 * bench/seeds' split placement.  Each thread counts the times it was preempted inside epoll_wait
 * (getrusage's involuntary switches across the call): a thread asleep there is never preempted;
 * one that spins there while the thread that must reply waits for the cpu is.  The line is then
 *   {"pings":..., "pool":..., "wait_preempted":..., "loop_returns":..., "echoed":..., "ok":...}
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include "switches.h"
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG 64

static void die(const char *what)
{
    fprintf(stderr, "epollrearm[%d]: %s: %s\n", (int)getpid(), what, strerror(errno));
    exit(2);
}

/* Voluntary context switches of thread tid (0: the calling thread). */
static long switches(pid_t tid)
{
    long v = thread_switches(tid);
    if (v < 0)
        die("/proc/.../status");
    return v;
}

/* Is thread tid asleep in an epoll wait (the kernel's, or the one memlan sleeps in)?  Its state
 * and the system call it is in, from /proc: the worker re-arms only once the loop sleeps, as it
 * does in ganesha, whose threads share one cpu. */
static bool asleep_in_epoll(pid_t tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true; /* cannot tell: go on */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || p[2] != 'S')
        return false;
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    if (!(f = fopen(path, "r")))
        return true;
    long nr = -1;
    int k = fscanf(f, "%ld", &nr);
    fclose(f);
    if (k != 1)
        return true;
    return nr == SYS_epoll_wait || nr == SYS_epoll_pwait
#ifdef SYS_epoll_pwait2
           || nr == SYS_epoll_pwait2
#endif
        ;
}

static int ep, conn, stopfd;
static _Atomic pid_t loop_tid;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int pending;  /* requests handed to the worker, not yet taken (under mu) */
static bool started; /* the loop has taken its first count (under mu) */
static long loop_switches, loop_returns, worker_switches, echoed, mod_wakes;
static int status;

/* epoll_wait on the set, for up to 10 s.  Under a tracer (strace, in the test that counts these
 * waits) a signal the program ignores still interrupts it (EINTR: epoll_wait is never restarted,
 * signal(7)), as the client child's SIGCHLD does at its exit: wait again. */
static int wait_events(struct epoll_event *out)
{
    int n;
    do
        n = epoll_wait(ep, out, 4, 10000);
    while (n < 0 && errno == EINTR);
    return n;
}

static void *loop(void *arg)
{
    (void)arg;
    loop_tid = (pid_t)syscall(SYS_gettid);
    long s0 = switches(0);
    pthread_mutex_lock(&mu);
    started = true;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (;;) {
        struct epoll_event out[4];
        int n = wait_events(out);
        loop_returns++;
        if (n <= 0) {
            /* nothing for 10 s, or an error: a wake-up was lost */
            fprintf(stderr, "epollrearm: loop: epoll_wait %d: %s\n", n,
                    n ? strerror(errno) : "timed out");
            status = 1;
            break;
        }
        bool stop = false, req = false;
        for (int i = 0; i < n; i++) {
            if (out[i].data.fd == stopfd)
                stop = true;
            else if (out[i].data.fd == conn)
                req = true;
            else {
                fprintf(stderr, "epollrearm: loop: unknown event %#llx\n",
                        (unsigned long long)out[i].data.u64);
                status = 1;
                stop = true;
            }
        }
        if (req) { /* hand it to the worker, and wait for the next event at once */
            pthread_mutex_lock(&mu);
            pending++;
            pthread_cond_signal(&cv);
            pthread_mutex_unlock(&mu);
        }
        if (stop)
            break;
    }
    loop_switches = switches(0) - s0;
    return NULL;
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!started)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    long s0 = switches(0);
    char buf[MSG];
    for (;;) {
        pthread_mutex_lock(&mu);
        while (!pending)
            pthread_cond_wait(&cv, &mu);
        pending--;
        pthread_mutex_unlock(&mu);
        ssize_t r = recv(conn, buf, sizeof buf, MSG_WAITALL);
        if (r == 0)
            break; /* the client closed: stop the loop */
        if (r != (ssize_t)sizeof buf) {
            fprintf(stderr, "epollrearm: worker: recv %zd: %s\n", r,
                    r < 0 ? strerror(errno) : "short");
            status = 1;
            break;
        }
        /* ntirpc re-arms the one-shot registration before it replies; by then its loop thread
         * sleeps (on one cpu it has run first).  Waited for here, at most 100 ms. */
        for (int k = 0; k < 2000 && !asleep_in_epoll(loop_tid); k++)
            usleep(50);
        long v0 = switches(loop_tid);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = conn};
        if (epoll_ctl(ep, EPOLL_CTL_MOD, conn, &ev) < 0)
            die("epoll_ctl MOD");
        /* Did the MOD wake it?  A thread woken is runnable when the waking call returns: wait
         * until it sleeps in its epoll wait again, and count its sleeps meanwhile. */
        for (int k = 0; k < 2000 && !asleep_in_epoll(loop_tid); k++)
            usleep(50);
        mod_wakes += switches(loop_tid) - v0;
        if (send(conn, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
            die("send");
        echoed += MSG;
    }
    worker_switches = switches(0) - s0;
    uint64_t one = 1;
    if (write(stopfd, &one, sizeof one) != sizeof one)
        die("write stop");
    return NULL;
}


/* ---- pool: libntirpc's loop, which moves to an idle thread as each event is handled ---- */

#define POOL 4

static bool loop_free = true, done; /* under mu */
static long wait_preempted;         /* under mu */
static _Atomic long loop_entries;   /* epoll_wait calls begun by the pool */

static long preempted(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) < 0)
        die("getrusage");
    return ru.ru_nivcsw;
}

static void *pool_thread(void *arg)
{
    (void)arg;
    char buf[MSG];
    long mine = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (!loop_free && !done)
            pthread_cond_wait(&cv, &mu);
        if (done) {
            pthread_mutex_unlock(&mu);
            break;
        }
        loop_free = false; /* this thread is the loop now */
        pthread_mutex_unlock(&mu);
        struct epoll_event out[4];
        long p0 = preempted();
        loop_entries++;
        int n = wait_events(out);
        mine += preempted() - p0;
        pthread_mutex_lock(&mu);
        loop_returns++;
        pthread_mutex_unlock(&mu);
        if (n <= 0) {
            fprintf(stderr, "epollrearm: pool: epoll_wait %d: %s\n", n,
                    n ? strerror(errno) : "timed out");
            status = 1;
            n = 0;
        }
        bool req = false, stop = n == 0;
        for (int i = 0; i < n; i++) {
            if (out[i].data.fd == conn)
                req = true;
            else
                stop = true;
        }
        long entries = loop_entries;
        pthread_mutex_lock(&mu);
        if (stop)
            done = true;
        loop_free = true; /* hand the loop to an idle thread, then handle the request */
        if (stop)
            pthread_cond_broadcast(&cv);
        else
            pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
        if (!req)
            continue;
        /* ganesha decodes and dispatches for a while: let the next loop thread get into its
         * epoll_wait first (at most 100 ms), and give it the cpu a little longer */
        for (int k = 0; k < 2000 && loop_entries == entries; k++)
            usleep(50);
        usleep(200);
        ssize_t r = recv(conn, buf, sizeof buf, MSG_WAITALL);
        if (r == 0) {
            uint64_t one = 1;
            if (write(stopfd, &one, sizeof one) != sizeof one)
                die("write stop");
            continue;
        }
        if (r != (ssize_t)sizeof buf) {
            fprintf(stderr, "epollrearm: pool: recv %zd: %s\n", r, r < 0 ? strerror(errno) : "short");
            status = 1;
            uint64_t one = 1;
            if (write(stopfd, &one, sizeof one) != sizeof one)
                die("write stop");
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = conn};
        if (epoll_ctl(ep, EPOLL_CTL_MOD, conn, &ev) < 0)
            die("epoll_ctl MOD");
        if (send(conn, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
            die("send");
        pthread_mutex_lock(&mu);
        echoed += MSG;
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_lock(&mu);
    wait_preempted += mine;
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
}

static int client(int port, int pings)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char msg[MSG], back[MSG];
    for (int i = 0; i < pings; i++) {
        for (int j = 0; j < MSG; j++)
            msg[j] = (char)(i * 7 + j);
        if (send(fd, msg, sizeof msg, 0) != (ssize_t)sizeof msg)
            die("send");
        size_t got = 0;
        while (got < sizeof back) {
            ssize_t r = recv(fd, back + got, sizeof back - got, 0);
            if (r <= 0)
                die("recv");
            got += (size_t)r;
        }
        if (memcmp(msg, back, sizeof msg) != 0) {
            fprintf(stderr, "epollrearm: echo %d differs\n", i);
            return 1;
        }
    }
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    bool pool = argc == 3 && strcmp(argv[2], "pool") == 0;
    if ((argc != 2 && !pool) || atoi(argv[1]) < 1)
        return fprintf(stderr, "usage: epollrearm PINGS [pool]\n"), 2;
    int pings = atoi(argv[1]);
    /* pool: the server's threads on one cpu, the client on another (bench/seeds' split) */
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (pool && cpus > 1)
        pin(0);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0)
        die("listen");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(l);
        if (pool && cpus > 1)
            pin(1);
        _exit(client(ntohs(a.sin_port), pings));
    }
    if ((conn = accept(l, NULL, NULL)) < 0)
        die("accept");
    close(l);
    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 || (stopfd = eventfd(0, EFD_CLOEXEC)) < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = stopfd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, stopfd, &ev) < 0)
        die("epoll_ctl ADD stop");
    ev = (struct epoll_event){.events = EPOLLIN | EPOLLONESHOT, .data.fd = conn};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, conn, &ev) < 0)
        die("epoll_ctl ADD");
    if (pool) {
        pthread_t pt[POOL];
        for (int k = 0; k < POOL; k++)
            if (pthread_create(&pt[k], NULL, pool_thread, NULL) != 0)
                die("pthread_create");
        for (int k = 0; k < POOL; k++)
            pthread_join(pt[k], NULL);
        int st, bad = status;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
        if (echoed != (long)pings * MSG)
            bad = 1;
        printf("{\"pings\":%d,\"pool\":%d,\"wait_preempted\":%ld,\"loop_returns\":%ld,"
               "\"echoed\":%ld,\"ok\":%s}\n",
               pings, POOL, wait_preempted, loop_returns, echoed, bad ? "false" : "true");
        return bad;
    }
    pthread_t lt, wt;
    if (pthread_create(&wt, NULL, worker, NULL) != 0 || pthread_create(&lt, NULL, loop, NULL) != 0)
        die("pthread_create");
    pthread_join(lt, NULL);
    pthread_join(wt, NULL);
    int st, bad = status;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        bad = 1;
    if (echoed != (long)pings * MSG)
        bad = 1;
    printf("{\"pings\":%d,\"loop_switches\":%ld,\"loop_returns\":%ld,\"mod_wakes\":%ld,"
           "\"worker_switches\":%ld,\"echoed\":%ld,\"ok\":%s}\n",
           pings, loop_switches, loop_returns, mod_wakes, worker_switches, echoed,
           bad ? "false" : "true");
    close(conn);
    close(ep);
    close(stopfd);
    return bad;
}
