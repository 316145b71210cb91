/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: what the spin-and-handler tests share (spinlend, spinheld, spinjump): a thread
 * of the program's main one receives on rfd, a helper thread on another cpu talks on sfd, and a
 * timer's SIGALRM lands 1-25 us into each of the main thread's receives, where under memlan the
 * receive spins holding its direction's word (sock.c, mlp_rx_hold_spin). */
#ifndef MEMLAN_TESTS_SPINROUND_H
#define MEMLAN_TESTS_SPINROUND_H
#include "twoends.h"

#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

/* SIGALRM blocked (in the calling thread and those it makes). */
static inline void spin_block_alarm(int how)
{
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGALRM);
    pthread_sigmask(how, &m, NULL);
}

/* The helper's start: the timer's signal is the main thread's, the helper runs on the second
 * cpu, and it receives the byte spin_main_start sends, waiting for it there: the spin policy
 * spins only for a peer that last waited on a cpu other than ours (the accepted end waited on
 * the main thread's). */
static inline void spin_helper_start(int sfd)
{
    spin_block_alarm(SIG_BLOCK);
    pin(1);
    char x;
    if (recv(sfd, &x, 1, 0) != 1)
        die("recv x");
}

/* The main thread's, once its helper threads are made: the first cpu (after the helpers' start:
 * they inherit the mask to choose their own cpu from), and the byte the helper waits for. */
static inline void spin_main_start(int rfd)
{
    pin(0);
    usleep(20000);
    if (send(rfd, "x", 1, 0) != 1)
        die("send x");
}

/* What spinlend and spinjump begin with: the pair (*rfd the main thread's end, *sfd the helper's),
 * handler for SIGALRM with SA_RESTART, the helper thread (*t, to join), the main thread's start.
 * The listener. */
static inline int spin_setup(const char *port, void (*handler)(int), void *(*helper)(void *),
                             pthread_t *t, int *rfd, int *sfd)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(port), &a);
    *rfd = settled_pair(l, &a, sfd);
    struct sigaction sa = {.sa_handler = handler, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        die("sigaction");
    if (pthread_create(t, NULL, helper, NULL) != 0)
        die("pthread_create");
    spin_main_start(*rfd);
    return l;
}

/* The timer, for round k's receive: it fires on this thread's cpu, so its signal comes without a
 * cross-cpu interrupt (tens of microseconds in a VM, past the spin). */
static inline void spin_timer(int k)
{
    struct itimerval it = {.it_value = {.tv_usec = 1 + k % 25}};
    if (setitimer(ITIMER_REAL, &it, NULL) != 0)
        die("setitimer");
}
#endif
