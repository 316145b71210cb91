/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sigrace: signal handlers and credentials in the corners memlan's interposers must not change.
 * Run once over kernel TCP and once under `memlan run`: the outputs must be equal
 * (tests/py/test_preload.py).
 *
 * 1. vfork: the child installs a handler of its own (its dispositions are its own) and leaves;
 *    the parent's handler is still the one that runs and the one sigaction reports.  (The
 *    child wrote memlan's table in the memory it shares with the parent: the parent's signal
 *    then ran the child's handler.)
 * 2. two threads install handlers for one signal at once, many times: the handler that runs is
 *    the one sigaction reports, called with its own convention.
 * 3. (root) a SIGALRM handler that drops and takes back its euid every 200 us while the program
 *    connects, accepts and closes on a port memlan publishes: it ends.  (setuid is
 *    async-signal-safe; memlan's credential path took its locks there: a handler that came while
 *    the thread held one waited for ever.)
 *
 * 4. vfork: the child calls siginterrupt(sig, 1) for a signal of its own and leaves; the
 *    parent's blocking recv, interrupted by a handler installed with SA_RESTART, still restarts.
 *    (The child's call set memlan's "a handler may interrupt" note in the shared memory: the
 *    parent's recv failed with EINTR.)
 *
 * usage: sigrace PORT [CASE]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* siginterrupt: case 4 */

static int only;
#define CASE(n) if (!only || only == (n))

static volatile sig_atomic_t ran;

static void h_parent(int sig) { (void)sig; ran = 1; }
static void h_child(int sig) { (void)sig; ran = 2; }
static void h_info(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    ran = (si && si->si_signo == sig) ? 3 : 30; /* 30: called without its siginfo */
}
static void h_plain(int sig) { ran = sig == SIGUSR2 ? 4 : 40; }

static void *reported(int sig)
{
    struct sigaction o;
    if (sigaction(sig, NULL, &o) < 0)
        return NULL;
    return (o.sa_flags & SA_SIGINFO) ? (void *)o.sa_sigaction : (void *)o.sa_handler;
}

static pthread_barrier_t bar;
static void *th_olds[2];

static void *installer(void *arg)
{
    int k = (int)(long)arg;
    struct sigaction a, o;
    memset(&a, 0, sizeof a);
    sigemptyset(&a.sa_mask);
    if (k == 0) {
        a.sa_flags = SA_SIGINFO;
        a.sa_sigaction = h_info;
    } else {
        a.sa_flags = 0;
        a.sa_handler = h_plain;
    }
    pthread_barrier_wait(&bar);
    sigaction(SIGUSR2, &a, &o);
    th_olds[k] = (o.sa_flags & SA_SIGINFO) ? (void *)o.sa_sigaction : (void *)o.sa_handler;
    return NULL;
}

static atomic_int flips;
static void h_alrm(int sig)
{
    (void)sig;
    int saved = errno;
    if (atomic_fetch_add(&flips, 1) % 2 == 0)
        (void)seteuid(65534);
    else
        (void)seteuid(0);
    errno = saved;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int port = atoi(argv[1]);
    only = argc > 2 ? atoi(argv[2]) : 0;

    CASE(1) {
        struct sigaction a;
        memset(&a, 0, sizeof a);
        sigemptyset(&a.sa_mask);
        a.sa_handler = h_parent; /* without SA_RESTART: behind memlan's trampoline */
        sigaction(SIGUSR1, &a, NULL);
        pid_t pid = vfork();
        if (pid == 0) {
            struct sigaction c;
            memset(&c, 0, sizeof c);
            sigemptyset(&c.sa_mask);
            c.sa_handler = h_child;
            sigaction(SIGUSR1, &c, NULL);
            _exit(0);
        }
        waitpid(pid, NULL, 0);
        ran = 0;
        raise(SIGUSR1);
        printf("vfork: handler that ran: %s\n", ran == 1 ? "parent's" : ran == 2 ? "child's" : "?");
        printf("vfork: reported: %s\n", reported(SIGUSR1) == (void *)h_parent ? "parent's"
                                        : reported(SIGUSR1) == (void *)h_child ? "child's" : "?");
    }
    CASE(2) {
        pthread_barrier_init(&bar, NULL, 2);
        int bad = 0, n = 20000;
        for (int i = 0; i < n; i++) {
            signal(SIGUSR2, SIG_DFL);
            pthread_t t[2];
            for (long k = 0; k < 2; k++)
                pthread_create(&t[k], NULL, installer, (void *)k);
            for (int k = 0; k < 2; k++)
                pthread_join(t[k], NULL);
            void *fin = reported(SIGUSR2);
            ran = 0;
            raise(SIGUSR2);
            /* The last call's old value is the first call's handler; the first's is SIG_DFL. */
            bool first0 = th_olds[0] == (void *)SIG_DFL && th_olds[1] == (void *)h_info;
            bool first1 = th_olds[1] == (void *)SIG_DFL && th_olds[0] == (void *)h_plain;
            void *last = first0 ? (void *)h_plain : first1 ? (void *)h_info : NULL;
            int want = last == (void *)h_info ? 3 : 4;
            if (!last || fin != last || ran != want)
                bad++;
        }
        printf("threads: %d of %d rounds inconsistent\n", bad, n);
    }
    CASE(3) {
        if (geteuid() != 0) {
            printf("setuid in a handler: skipped (not root)\n");
        } else {
            int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
            setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
            sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 64) < 0) {
                printf("FAIL listen: %s\n", strerror(errno));
                return 1;
            }
            struct sigaction a;
            memset(&a, 0, sizeof a);
            sigemptyset(&a.sa_mask);
            a.sa_handler = h_alrm;
            a.sa_flags = SA_RESTART;
            sigaction(SIGALRM, &a, NULL);
            struct itimerval it = {{0, 200}, {0, 200}};
            setitimer(ITIMER_REAL, &it, NULL);
            struct timespec t0, t;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int rounds = 0;
            do {
                int c = socket(AF_INET, SOCK_STREAM, 0);
                if (c >= 0 && connect(c, (struct sockaddr *)&sa, sizeof sa) == 0) {
                    int s = accept(l, NULL, NULL);
                    if (s >= 0)
                        close(s);
                }
                if (c >= 0)
                    close(c);
                rounds++;
                clock_gettime(CLOCK_MONOTONIC, &t);
            } while (t.tv_sec - t0.tv_sec < 2);
            struct itimerval off = {{0, 0}, {0, 0}};
            setitimer(ITIMER_REAL, &off, NULL);
            (void)seteuid(0);
            close(l);
            printf("setuid in a handler: ended (%s)\n", rounds > 10 ? "rounds made" : "few rounds");
        }
    }
    CASE(4) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)(port + 1))};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 4) < 0) {
            printf("FAIL listen: %s\n", strerror(errno));
            return 1;
        }
        pid_t peer = fork();
        if (peer == 0) { /* the peer: answers after 1.5 s */
            int s = accept(l, NULL, NULL);
            char b;
            if (s >= 0 && recv(s, &b, 1, MSG_WAITALL) == 1) {
                struct timespec ts = {1, 500000000};
                nanosleep(&ts, NULL);
                send(s, "late", 4, 0);
            }
            _exit(0);
        }
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&sa, sizeof sa) < 0 || send(c, "x", 1, 0) != 1) {
            printf("FAIL connect: %s\n", strerror(errno));
            return 1;
        }
        struct sigaction a;
        memset(&a, 0, sizeof a);
        sigemptyset(&a.sa_mask);
        a.sa_handler = h_parent;
        a.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &a, NULL);
        pid_t pid = vfork();
        if (pid == 0) {
            siginterrupt(SIGUSR2, 1);
            _exit(0);
        }
        waitpid(pid, NULL, 0);
        alarm(1);
        char b[8];
        ssize_t r = recv(c, b, sizeof b, MSG_WAITALL);
        printf("vfork siginterrupt: parent's recv %zd %s\n", r, r < 0 ? strerror(errno) : "");
        close(c);
        close(l);
        waitpid(peer, NULL, 0);
    }
    printf("done\n");
    return 0;
}
