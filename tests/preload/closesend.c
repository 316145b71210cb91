/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * closesend: a thread sends without waiting (MSG_DONTWAIT) in a loop while another closes the
 * sending socket, in rounds; the receiver reads the stream to its end.  Over kernel TCP each send
 * either finds the socket or says EBADF, and every byte a send took reaches the reader.  The
 * program prints how many rounds the sender ended with EBADF and whether the reader got every
 * byte the sends said they took; memlan's log must say nothing about bytes on the kernel socket
 * under an accelerated connection (tests/py/test_preload.py).
 *
 * Under memlan close() takes the fd's record away and then closes the kernel's fd, which the
 * channel's teardown between the two makes a wide window: a send in it found no record and went
 * to the kernel socket, bypassing the ring; its bytes never reached the reader, which reads the
 * ring (and a blocking one could wait for ever on the kernel socket's room).
 *
 * With "full", the reader reads nothing before the close: the sender fills the ring and then
 * goes on being answered EAGAIN, by the regular path (the fast one gives up on a full ring), until
 * the close; 300 rounds.  That path looked at the record, then took its reference: a close between
 * the two sent the call to the kernel socket (about 1 round in 100 lost a send's bytes so).
 *
 * usage: closesend PORT [full]
 */
#include "twoends.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#define ROUNDS 100
#define ROUNDS_FULL 300

struct writer {
    int fd;
    _Atomic long long sent;
    int err;
};

static void *send_until_error(void *arg)
{
    struct writer *w = arg;
    static char chunk[512];
    for (;;) {
        ssize_t r = send(w->fd, chunk, sizeof chunk, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0)
            w->sent += r;
        else if (r < 0 && errno != EAGAIN) {
            w->err = errno;
            return NULL;
        }
    }
}

int main(int argc, char **argv)
{
    if (argc != 2 && (argc != 3 || strcmp(argv[2], "full") != 0))
        return 2;
    bool full = argc == 3;
    int rounds = full ? ROUNDS_FULL : ROUNDS;
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    srand(5);
    int ebadf = 0, whole = 0;
    static char buf[1 << 16];
    for (int round = 0; round < rounds; round++) {
        int s, c = settled_pair(l, &a, &s); /* settled before the writer starts */
        struct writer w = {.fd = c};
        pthread_t t;
        pthread_create(&t, NULL, send_until_error, &w);
        long long got = 0;
        double end = now_s() + (100 + rand() % 1000) * 1e-6;
        if (full) { /* until the ring (or the kernel's buffers) took 64 KiB, then a while */
            double limit = now_s() + 5;
            while (atomic_load(&w.sent) < (64 << 10) && now_s() < limit)
                ;
            end = now_s() + (rand() % 200) * 1e-6;
        }
        while (now_s() < end) {
            ssize_t r = full ? 0 : recv(s, buf, sizeof buf, MSG_DONTWAIT);
            if (r > 0)
                got += r;
        }
        close(c);
        pthread_join(t, NULL);
        ebadf += w.err == EBADF;
        /* The rest of the stream, to its end. */
        end = now_s() + 5;
        for (;;) {
            struct pollfd p = {.fd = s, .events = POLLIN};
            if (poll(&p, 1, 1000) != 1 || now_s() > end)
                break;
            ssize_t r = recv(s, buf, sizeof buf, MSG_DONTWAIT);
            if (r > 0)
                got += r;
            else if (r == 0 || errno != EAGAIN)
                break;
        }
        if (got == w.sent)
            whole++;
        else
            printf("round %d: sent %lld, received %lld\n", round, (long long)w.sent, got);
        close(s);
    }
    printf("%d rounds: the sender ended with EBADF: %d, the reader got every byte sent: %d\n",
           rounds, ebadf, whole);
    printf("done\n");
    return 0;
}
