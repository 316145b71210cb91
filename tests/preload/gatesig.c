/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * gatesig: a signal handler that duplicates and closes a socket (an install and an uninstall:
 * fdtable.c's fork gate) on threads that are themselves duplicating and closing it, while
 * another thread forks again and again.  A handler that interrupted its thread inside the gate
 * waited for the gate to open, and the fork waited for that thread to leave it: a deadlock.
 * Bounded: 3 s of it; a hang is killed by the alarm ("hang" is printed).  A stress test: the
 * window is a few instructions, but 2 threads signalled every 20 us find it (the old code hung
 * 10 runs in 10).
 *
 * usage: gatesig PORT
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

#define WORKERS 2

static int sock;
static atomic_bool stop;
static atomic_long handled, forks;
static pthread_t workers[WORKERS];

static void on_sig(int sig)
{
    (void)sig;
    int e = errno;
    int d = dup(sock);
    if (d >= 0)
        close(d);
    handled++;
    errno = e;
}

static void *worker(void *a)
{
    (void)a;
    while (!stop) {
        int d = dup(sock);
        if (d >= 0)
            close(d);
    }
    return NULL;
}

static void *kicker(void *a)
{
    (void)a;
    struct timespec t = {0, 20000};
    while (!stop) {
        for (int i = 0; i < WORKERS; i++)
            pthread_kill(workers[i], SIGUSR1);
        nanosleep(&t, NULL);
    }
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]);
    setvbuf(stdout, NULL, _IONBF, 0);
    pid_t p = fork(); /* the test in a child: a deadlock is killed by its alarm */
    if (p == 0) {
        alarm(10);
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0) {
            perror("listen");
            _exit(1);
        }
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("connect");
            _exit(1);
        }
        sock = accept(l, NULL, NULL);
        send(c, "x", 1, 0);
        char b;
        recv(sock, &b, 1, 0);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sig;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
        for (int i = 0; i < WORKERS; i++)
            pthread_create(&workers[i], NULL, worker, NULL);
        pthread_t k;
        pthread_create(&k, NULL, kicker, NULL);
        double t0 = now();
        while (now() - t0 < 3.0) {
            pid_t f = fork();
            if (f == 0)
                _exit(0);
            if (f > 0) {
                waitpid(f, NULL, 0);
                forks++;
            }
        }
        stop = true;
        pthread_join(k, NULL);
        for (int i = 0; i < WORKERS; i++)
            pthread_join(workers[i], NULL);
        printf("forks %s, handlers %s\n", forks > 10 ? "many" : "few",
               handled > 100 ? "many" : "few");
        if (getenv("GATESIG_DEBUG"))
            fprintf(stderr, "forks %ld handlers %ld\n", (long)forks, (long)handled);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    if (WIFSIGNALED(st))
        printf("hang: killed by signal %d\n", WTERMSIG(st));
    printf("done\n");
    return 0;
}
