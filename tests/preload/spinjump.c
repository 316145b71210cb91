/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * spinjump: a signal handler siglongjmp()s out of a blocking receive, in rounds, 1 to 25 us into
 * it (under memlan: often out of the spin that holds the direction's fast word, sock.c,
 * mlp_rx_hold_spin, while the word is lent back to the socket for the handler's run), after a
 * nonblocking receive of its own on that socket in odd rounds.  Each round another thread's
 * nonblocking receive must answer EAGAIN (nobody keeps the word), and at the end a byte sent
 * arrives once, and the close reaches the peer as the end (nobody keeps the socket).
 *
 * usage: spinjump PORT
 */
#include "spinround.h"

#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>

#define ROUNDS 300

static int rfd, sfd;
static sigjmp_buf jb;
static volatile int round_k;
static atomic_int go, answered, eagain;

static void on_alarm(int sig)
{
    (void)sig;
    if (round_k & 1) {
        char c;
        (void)recv(rfd, &c, 1, MSG_DONTWAIT);
    }
    siglongjmp(jb, 1);
}

static void *helper(void *arg)
{
    (void)arg;
    spin_helper_start(sfd);
    for (int k = 0; k < ROUNDS; k++) {
        double end = now_s() + 10;
        while (atomic_load(&go) != k + 1)
            if (now_s() > end) {
                printf("FAIL round %d: the helper waited 10 s\n", k);
                fflush(stdout);
                _exit(1);
            }
        char c;
        ssize_t r = recv(rfd, &c, 1, MSG_DONTWAIT);
        if (r < 0 && errno == EAGAIN)
            atomic_fetch_add(&eagain, 1);
        atomic_store(&answered, k + 1);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    pthread_t t;
    int l = spin_setup(argv[1], on_alarm, helper, &t, &rfd, &sfd);
    int jumped = 0;
    for (int k = 0; k < ROUNDS; k++) {
        round_k = k;
        if (sigsetjmp(jb, 1) == 0) {
            spin_timer(k);
            char c;
            ssize_t r = recv(rfd, &c, 1, 0);
            printf("FAIL round %d: recv returned %zd\n", k, r);
            return 1;
        }
        jumped++;
        atomic_store(&go, k + 1);
        double end = now_s() + 10;
        while (atomic_load(&answered) != k + 1)
            if (now_s() > end) {
                printf("FAIL round %d: the helper's nonblocking recv hung\n", k);
                fflush(stdout);
                _exit(1);
            }
    }
    pthread_join(t, NULL);
    if (send(sfd, "z", 1, 0) != 1)
        die("send z");
    char c = 0;
    if (recv(rfd, &c, 1, 0) != 1 || c != 'z')
        die("recv z");
    close(rfd);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t e = recv(sfd, &c, 1, 0);
    printf("rounds %d: jumped out %d, the helper's nonblocking recv answered EAGAIN in %d; "
           "'z' arrived; the peer's recv after the close: %zd%s%s\n", ROUNDS, jumped,
           atomic_load(&eagain), e, e < 0 ? " " : "", e < 0 ? strerror(errno) : "");
    close(sfd);
    close(l);
    printf("done\n");
    return 0;
}
