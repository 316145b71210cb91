/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * spinlend: a signal handler makes a blocking receive on the very socket its thread is blocked
 * receiving on, in rounds, both ends in this process.  The thread's receive waits for byte "m";
 * the handler's receive takes byte "h", which another thread sends only once the handler has
 * started, and "m" only once it has returned.  Over kernel TCP the handler's receive gets "h"
 * and the interrupted one, restarted (SA_RESTART), "m", every round.
 *
 * Under memlan a blocking receive that finds the ring empty first spins for its bytes holding
 * the direction's fast word (sock.c, mlp_rx_hold_spin).  The signal comes 1 to 25 us after the
 * receive began, so in many rounds the handler runs on top of that spin: it must borrow the
 * word (mlp_spin_word).  Without that, its receive found the direction held by a call beneath
 * it and failed with EINTR at once, and the thread's receive then took "h".
 *
 * usage: spinlend PORT
 */
#include "spinround.h"

#include <stdatomic.h>
#include <stdbool.h>

#define ROUNDS 300
#define WAIT_S 10.0 /* no wait of the helper's lasts longer */

static int rfd, sfd;
/* 0: between rounds; 1: the main thread is about to receive; 2: the handler started;
 * 3: the handler's receive returned */
static atomic_int phase;
static volatile ssize_t h_ret;
static volatile char h_byte;
static volatile int h_err;

static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    atomic_store(&phase, 2);
    char c = 0;
    ssize_t r = recv(rfd, &c, 1, 0);
    h_ret = r;
    h_byte = c;
    h_err = r < 0 ? errno : 0;
    atomic_store(&phase, 3);
    errno = saved;
}

static void await_phase(int p)
{
    double end = now_s() + WAIT_S;
    while (atomic_load(&phase) != p)
        if (now_s() > end) {
            printf("FAIL the helper waited %.0f s for phase %d (at %d)\n", WAIT_S, p,
                   atomic_load(&phase));
            fflush(stdout);
            _exit(1);
        }
}

static void *helper(void *arg)
{
    (void)arg;
    spin_helper_start(sfd);
    for (int k = 0; k < ROUNDS; k++) {
        await_phase(2);
        if (send(sfd, "h", 1, 0) != 1)
            die("send h");
        await_phase(3);
        if (send(sfd, "m", 1, 0) != 1)
            die("send m");
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    pthread_t t;
    int l = spin_setup(argv[1], on_alarm, helper, &t, &rfd, &sfd);
    int h_ok = 0, m_ok = 0, shown = 0;
    for (int k = 0; k < ROUNDS; k++) {
        h_ret = -2;
        atomic_store(&phase, 1);
        spin_timer(k);
        char c = 0;
        ssize_t r = recv(rfd, &c, 1, 0);
        int e = errno;
        await_phase(3);
        atomic_store(&phase, 0);
        if (r == 1 && c == 'h' && h_ret < 0) { /* the handler's recv failed: "m" follows */
            char c2 = 0;
            if (recv(rfd, &c2, 1, 0) != 1 || c2 != 'm')
                die("the byte after a failed round");
        }
        bool hok = h_ret == 1 && h_byte == 'h', mok = r == 1 && c == 'm';
        h_ok += hok;
        m_ok += mok;
        if ((!hok || !mok) && shown++ < 3)
            printf("round %d: the handler's recv %zd '%c' %s, the thread's recv %zd '%c' %s\n", k,
                   (ssize_t)h_ret, h_byte ? h_byte : '-', h_err ? strerror(h_err) : "", r,
                   c ? c : '-', r < 0 ? strerror(e) : "");
    }
    pthread_join(t, NULL);
    printf("rounds %d: the handler's recv took the first byte in %d, the thread's the second in %d\n",
           ROUNDS, h_ok, m_ok);
    close(rfd);
    close(sfd);
    close(l);
    printf("done\n");
    return 0;
}
