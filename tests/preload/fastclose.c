/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * fastclose: a signal handler closes the socket that its own thread is receiving on, and
 * another thread's socket is closed under a sending thread, in rounds, both ends in this
 * process (no fork: the preload's fast path, which holds a socket by its direction's word alone,
 * without a reference, takes every call that moves bytes at once).  The handler's close lands
 * while the receive copies or waits; the receive then ends with the bytes it had, and the next
 * one says EBADF, as over kernel TCP (where the interrupted call restarts on a closed fd); the
 * sender, whose peer closed with bytes unread, ends with a reset or EPIPE.  Under memlan the
 * socket's teardown waits for the copy in progress (the handler's close comes on top of it:
 * mlp_fast_defer), so nothing is unmapped under it.  Then a thread sends while another closes
 * the sending socket itself: the sender's next call says EBADF.
 *
 * usage: fastclose PORT
 */
#include "twoends.h"

#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#define ROUNDS 60
#define CHUNK (64 << 10)
#define BUF (1 << 20)

static volatile int victim = -1;
static volatile sig_atomic_t closed;

static void on_alarm(int sig)
{
    (void)sig;
    if (victim >= 0 && !closed) {
        close(victim);
        closed = 1;
    }
}

struct writer {
    int fd;
    int err;
    _Atomic int done;
};

static void *write_until_error(void *arg)
{
    struct writer *w = arg;
    static char chunk[CHUNK];
    for (;;) {
        ssize_t r = send(w->fd, chunk, sizeof chunk, MSG_NOSIGNAL);
        if (r < 0) {
            w->err = errno;
            atomic_store(&w->done, 1);
            return NULL;
        }
    }
}

static int conn_pair(int l, struct sockaddr_in *a, int *acc)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int big = 2 << 20;
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(c, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (c < 0 || connect(c, (struct sockaddr *)a, sizeof *a) != 0)
        die("connect");
    *acc = accept(l, NULL, NULL);
    if (*acc < 0)
        die("accept");
    return c;
}

/* A connection whose client end a new thread writes to until an error (w); *acc: the other. */
static pthread_t start_writer(int l, struct sockaddr_in *a, int *acc, struct writer *w)
{
    *w = (struct writer){.fd = conn_pair(l, a, acc)};
    pthread_t t;
    pthread_create(&t, NULL, write_until_error, w);
    return t;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    sigaction(SIGALRM, &sa, NULL);
    static char buf[BUF];
    int ebadf = 0, other = 0, resets = 0, werr_other = 0;
    srand(7);
    for (int round = 0; round < ROUNDS; round++) {
        int s;
        struct writer w;
        pthread_t t = start_writer(l, &a, &s, &w);
        int c = w.fd;
        closed = 0;
        victim = s;
        struct itimerval it = {{0, 0}, {0, 200 + rand() % 3000}};
        setitimer(ITIMER_REAL, &it, NULL);
        for (;;) {
            ssize_t r = recv(s, buf, sizeof buf, 0);
            if (r > 0)
                continue;
            if (r < 0 && errno == EBADF)
                ebadf++;
            else
                other++;
            break;
        }
        victim = -1;
        pthread_join(t, NULL);
        if (w.err == ECONNRESET || w.err == EPIPE)
            resets++;
        else
            werr_other++;
        close(c);
    }
    printf("receiver closed by its own handler: %d rounds, EBADF after: %d, other ends: %d\n",
           ROUNDS, ebadf, other);
    printf("its sender ended with a reset or EPIPE: %d, otherwise: %d\n", resets, werr_other);

    /* A thread sends while this one closes the sending socket; the peer reads meanwhile. */
    int sent_ebadf = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int s;
        struct writer w;
        pthread_t t = start_writer(l, &a, &s, &w);
        int c = w.fd;
        double end = now_s() + (200 + rand() % 3000) * 1e-6;
        while (now_s() < end)
            if (recv(s, buf, sizeof buf, MSG_DONTWAIT) < 0 && errno != EAGAIN)
                die("recv");
        close(c);
        /* A send asleep for room goes on (its call holds the file): drain until it ends. */
        end = now_s() + 10;
        while (!atomic_load(&w.done) && now_s() < end)
            if (recv(s, buf, sizeof buf, MSG_DONTWAIT) < 0 && errno != EAGAIN)
                die("recv after the close");
        if (!atomic_load(&w.done)) {
            printf("FAIL the sender never ended\n");
            return 1;
        }
        pthread_join(t, NULL);
        sent_ebadf += w.err == EBADF;
        close(s);
    }
    printf("sender's socket closed by another thread: %d rounds, its next send EBADF: %d\n",
           ROUNDS, sent_ebadf);
    printf("done\n");
    return 0;
}
