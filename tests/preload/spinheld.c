/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * spinheld: while a signal handler runs on top of a thread's blocking receive, another thread's
 * nonblocking receive on the same socket answers at once, in rounds, both ends in this process.
 * The main thread's receive waits for byte "m"; a SIGALRM handler (SA_RESTART) that interrupts
 * it makes a blocking receive of its own, for byte "h".  The helper thread, once the handler has
 * started, makes a MSG_DONTWAIT receive on that socket (nothing is queued: EAGAIN), and only
 * then sends "h", and "m" once the handler has returned.  Over kernel TCP the nonblocking
 * receive answers EAGAIN every round.
 *
 * Under memlan a blocking receive that finds the ring empty first spins for its bytes holding
 * the direction's fast word (sock.c, mlp_rx_hold_spin).  The signal comes 1 to 25 us after the
 * receive began, so in many rounds the handler runs on top of that spin.  If the spin's word
 * stays held while the handler runs, the helper's nonblocking receive waits for it, the handler
 * waits for "h", which the helper sends only after that receive: neither moves again.  A watchdog
 * reports the hang.
 *
 * With "signal" the handler is installed by signal() (glibc installs it past an interposed
 * sigaction) rather than sigaction().
 *
 * usage: spinheld PORT [signal]
 */
#include "spinround.h"

#include <stdatomic.h>
#include <stdbool.h>

#define ROUNDS 300
#define WAIT_S 10.0 /* no wait of the test's lasts longer */

static int rfd, sfd;
/* 0: between rounds; 1: the main thread is about to receive; 2: the handler started;
 * 3: the handler's receive returned */
static atomic_int phase;
static atomic_int round_no, helper_in_recv;
static volatile ssize_t h_ret;
static volatile char h_byte;

static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    atomic_store(&phase, 2);
    char c = 0;
    ssize_t r = recv(rfd, &c, 1, 0);
    h_ret = r;
    h_byte = c;
    atomic_store(&phase, 3);
    errno = saved;
}

/* Phase p (or past it) of round k. */
static void await_phase(int k, int p)
{
    double end = now_s() + WAIT_S;
    while (atomic_load(&round_no) != k || atomic_load(&phase) < p)
        if (now_s() > end) {
            printf("FAIL the helper waited %.0f s for phase %d (at %d)\n", WAIT_S, p,
                   atomic_load(&phase));
            fflush(stdout);
            _exit(1);
        }
}

static int eagain_rounds, other_rounds;

static void *helper(void *arg)
{
    (void)arg;
    spin_helper_start(sfd);
    for (int k = 0; k < ROUNDS; k++) {
        await_phase(k, 2);
        atomic_store(&helper_in_recv, 1);
        char c;
        ssize_t r = recv(rfd, &c, 1, MSG_DONTWAIT);
        int e = errno;
        atomic_store(&helper_in_recv, 0);
        if (r < 0 && e == EAGAIN)
            eagain_rounds++;
        else if (other_rounds++ < 3)
            printf("round %d: the helper's nonblocking recv %zd %s\n", k, r,
                   r < 0 ? strerror(e) : "");
        if (send(sfd, "h", 1, 0) != 1)
            die("send h");
        await_phase(k, 3);
        if (send(sfd, "m", 1, 0) != 1)
            die("send m");
    }
    return NULL;
}

/* No round may take WAIT_S: a hang is reported, not waited out. */
static void *watchdog(void *arg)
{
    (void)arg;
    int last = -1;
    double since = now_s();
    for (;;) {
        usleep(100000);
        int k = atomic_load(&round_no);
        if (k != last) {
            last = k;
            since = now_s();
        } else if (now_s() - since > WAIT_S) {
            printf("FAIL round %d hung for %.0f s (phase %d, the helper %s its nonblocking "
                   "recv)\n", k, WAIT_S, atomic_load(&phase),
                   atomic_load(&helper_in_recv) ? "inside" : "not in");
            fflush(stdout);
            _exit(1);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "signal") == 0))
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    rfd = settled_pair(l, &a, &sfd);
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    if (argc == 3 ? signal(SIGALRM, on_alarm) == SIG_ERR : sigaction(SIGALRM, &sa, NULL) != 0)
        die("sigaction");
    spin_block_alarm(SIG_BLOCK); /* the threads made here block it */
    pthread_t t, w;
    if (pthread_create(&t, NULL, helper, NULL) != 0 ||
        pthread_create(&w, NULL, watchdog, NULL) != 0)
        die("pthread_create");
    spin_block_alarm(SIG_UNBLOCK);
    spin_main_start(rfd);
    int h_ok = 0, m_ok = 0;
    for (int k = 0; k < ROUNDS; k++) {
        h_ret = -2;
        atomic_store(&round_no, k); /* after the last round's phase 0 */
        atomic_store(&phase, 1);
        spin_timer(k);
        char c = 0;
        ssize_t r = recv(rfd, &c, 1, 0);
        await_phase(k, 3);
        atomic_store(&phase, 0);
        if (r == 1 && c == 'h' && h_ret < 0) { /* the handler's recv failed: "m" follows */
            char c2 = 0;
            if (recv(rfd, &c2, 1, 0) != 1 || c2 != 'm')
                die("the byte after a failed round");
        }
        h_ok += h_ret == 1 && h_byte == 'h';
        m_ok += r == 1 && c == 'm';
    }
    pthread_join(t, NULL);
    printf("rounds %d: the helper's nonblocking recv answered EAGAIN in %d; the handler took "
           "its byte in %d, the thread in %d\n", ROUNDS, eagain_rounds, h_ok, m_ok);
    close(rfd);
    close(sfd);
    close(l);
    printf("done\n");
    return 0;
}
