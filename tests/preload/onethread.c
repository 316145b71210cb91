/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * onethread: a connection used by a process with one thread, then by several.  Under memlan a
 * socket's fast word is taken and given back with a plain load and store while glibc says the
 * process has one thread (sock.c, mlp_one_thread), with a compare-and-swap once it has made
 * another.  The other end is a fork child on the other cpu that echoes every 64-byte record.
 *
 *   1  one thread: 20,000 records there and back, each checked.
 *   2  jumps: a timer's handler siglongjmp()s out of a blocking receive 1-25 us into it (under
 *      memlan often out of the spin that holds the receive's word, which the handler's
 *      trampoline lends back to the socket), 300 rounds; after each a nonblocking receive
 *      answers EAGAIN and a record sent comes back whole: nobody keeps the word.
 *   3  four threads (two on each cpu) send 2,000 records each at once, the main thread
 *      receives the 8,000 echoes: each whole, each thread's in order (two senders in one ring
 *      at once would mix their bytes); three rounds, new threads each.
 *   4  one thread again (the others joined), 2,000 records.
 * glibc's flag is printed where it changes.  Printed line by line over kernel TCP and under
 * memlan (tests/py/test_preload.py).
 *
 * usage: onethread PORT
 */
#include "twoends.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/wait.h>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
#include <sys/single_threaded.h>
#define ONE_THREAD() (__libc_single_threaded ? "yes" : "no")
#else
#define ONE_THREAD() "unknown"
#endif

#define REC 64
#define SENDERS 4
#define PER_SENDER 2000

static int cfd;
static sigjmp_buf jb;
static cpu_set_t all_cpus; /* the process's at its start */

static void fill(unsigned char *r, int who, uint32_t seq)
{
    r[0] = 'R';
    r[1] = (unsigned char)who;
    r[2] = r[3] = 0;
    memcpy(r + 4, &seq, 4);
    for (int i = 8; i < REC; i++)
        r[i] = (unsigned char)(seq * 7u + (unsigned)who * 13u + (unsigned)i);
}

/* 0: r is who's record seq, whole. */
static int check(const unsigned char *r, int who, uint32_t seq)
{
    unsigned char w[REC];
    fill(w, who, seq);
    return memcmp(r, w, REC) != 0;
}

static void send_rec(const unsigned char *r)
{
    if (send(cfd, r, REC, 0) != REC)
        die("send");
}

static void recv_rec(unsigned char *r)
{
    ssize_t n = recv(cfd, r, REC, MSG_WAITALL);
    if (n != REC) {
        printf("FAIL recv: %zd (%s)\n", n, n < 0 ? strerror(errno) : "short");
        exit(1);
    }
}

/* The fork child: echo every record until the end. */
static void echo(int l)
{
    pin(1);
    int s = accept(l, NULL, NULL);
    if (s < 0)
        _exit(3);
    unsigned char r[REC];
    for (;;) {
        ssize_t n = recv(s, r, REC, MSG_WAITALL);
        if (n != REC)
            _exit(n == 0 ? 0 : 4);
        if (send(s, r, REC, 0) != REC)
            _exit(5);
    }
}

static void on_alarm(int sig)
{
    (void)sig;
    siglongjmp(jb, 1);
}

static void *sender(void *arg)
{
    int who = (int)(intptr_t)arg;
    /* Half of them on each cpu (the main thread's mask has one): at the word at once. */
    sched_setaffinity(0, sizeof all_cpus, &all_cpus);
    pin(who % 2);
    unsigned char r[REC];
    for (uint32_t k = 0; k < PER_SENDER; k++) {
        fill(r, who, k);
        send_rec(r);
    }
    return NULL;
}

/* n records there and back from this thread alone, as who: how many came back whole. */
static int round_trips(int n, int who)
{
    unsigned char r[REC];
    int good = 0;
    for (int k = 0; k < n; k++) {
        fill(r, who, (uint32_t)k);
        send_rec(r);
        memset(r, 0, REC);
        recv_rec(r);
        good += check(r, who, (uint32_t)k) == 0;
    }
    return good;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    sched_getaffinity(0, sizeof all_cpus, &all_cpus);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0)
        echo(l);
    pin(0);
    cfd = socket(AF_INET, SOCK_STREAM, 0);
    if (cfd < 0 || connect(cfd, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect");
    printf("one thread: %s\n", ONE_THREAD());

    int good = round_trips(20000, 10);
    printf("1 one thread: %d of 20000 records came back whole\n", good);

    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        die("sigaction");
    /* volatile: changed between a sigsetjmp and the siglongjmp back to it */
    volatile int jumped = 0, eagain = 0, whole = 0;
    for (int k = 0; k < 300; k++) {
        if (sigsetjmp(jb, 1) == 0) {
            struct itimerval it = {.it_value = {.tv_usec = 1 + k % 25}};
            if (setitimer(ITIMER_REAL, &it, NULL) != 0)
                die("setitimer");
            unsigned char c;
            ssize_t n = recv(cfd, &c, 1, 0); /* nothing comes until we send */
            printf("FAIL round %d: recv returned %zd\n", k, n);
            return 1;
        }
        jumped++;
        unsigned char c;
        if (recv(cfd, &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN)
            eagain++;
        whole += round_trips(1, 11 + k % 100) == 1;
    }
    printf("2 jumps: jumped out %d of 300; then EAGAIN %d, records whole %d\n", jumped, eagain,
           whole);

    /* Three rounds of new threads: the race a plain take would lose is a narrow one. */
    int bad = 0, order = 0;
    for (int round = 0; round < 3; round++) {
        pthread_t t[SENDERS];
        for (int i = 0; i < SENDERS; i++)
            if (pthread_create(&t[i], NULL, sender, (void *)(intptr_t)i) != 0)
                die("pthread_create");
        if (round == 0)
            printf("after pthread_create, one thread: %s\n", ONE_THREAD());
        uint32_t next[SENDERS] = {0};
        for (int k = 0; k < SENDERS * PER_SENDER; k++) {
            unsigned char r[REC];
            recv_rec(r);
            uint32_t seq;
            memcpy(&seq, r + 4, 4);
            int who = r[1];
            if (r[0] != 'R' || who >= SENDERS || check(r, who, seq)) {
                bad++;
                continue;
            }
            if (seq != next[who])
                order++;
            next[who] = seq + 1;
        }
        for (int i = 0; i < SENDERS; i++)
            pthread_join(t[i], NULL);
    }
    printf("3 four threads, three rounds: %d records, %d not whole, %d out of order\n",
           3 * SENDERS * PER_SENDER, bad, order);

    good = round_trips(2000, 20);
    printf("4 one thread again: %d of 2000 records came back whole\n", good);

    shutdown(cfd, SHUT_WR);
    int st = 0;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        printf("FAIL the echo child: status %#x\n", st);
    close(cfd);
    close(l);
    printf("done\n");
    return 0;
}
