/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* zerocopy: messages built in place in the ring (memlan_reserve/memlan_commit) and read in place
 * (memlan_peek/memlan_release): no copy on either side.  It is also the raw-token example: the
 * child attaches with the channel's token (memlan_channel_token), inherited through fork, with
 * no name in the fabric.  A token is the capability itself: whoever holds its 32 hex digits may
 * attach, so pass it only over a private path (an inherited variable, a pipe, a Unix socket).
 * The other examples find their peer by name (memlan_listen/memlan_connect).
 * Uses only <memlan.h>. */
#include <memlan.h>

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct order {
    unsigned id;
    double price;
    char symbol[8];
};

int main(void)
{
    memlan_fabric_t *fab;
    memlan_channel_t *ch;
    struct memlan_channel_opts opts = {.kind = MEMLAN_MSG, .ring_size = 65536};
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_channel_create(fab, &opts, &ch)) < 0) {
        fprintf(stderr, "zerocopy: %s\n", memlan_strerror(r));
        return 1;
    }
    const unsigned N = 100000;
    pid_t pid = fork();
    if (pid == 0) { /* producer: write each order straight into the ring */
        memlan_channel_t *tx;
        if (memlan_channel_attach(fab, memlan_channel_token(ch), &tx) < 0)
            _exit(1);
        memlan_channel_set_timeout(tx, -1, 5000); /* a consumer that stopped reading */
        for (unsigned i = 0; i < N; i++) {
            void *slot;
            if (memlan_reserve(tx, &slot, sizeof(struct order), 0) < 0)
                _exit(1);
            struct order *o = slot;
            o->id = i;
            o->price = 100.0 + i % 50;
            memcpy(o->symbol, "MEML", 5);
            memlan_commit(tx, sizeof *o);
        }
        memlan_channel_close(tx);
        _exit(0);
    }
    /* A peer that never attaches (it died first) would leave the consumer waiting for ever, as
     * an accept with no client does: wait for it a bounded time first. */
    if ((r = memlan_channel_wait_peer(ch, 10000)) < 0) {
        fprintf(stderr, "zerocopy: the producer did not attach: %s\n", memlan_strerror(r));
        memlan_channel_close(ch); /* a producer that did attach meanwhile sees the end */
        int st;
        waitpid(pid, &st, 0);
        memlan_fabric_close(fab);
        return 1;
    }
    memlan_channel_set_timeout(ch, 5000, -1); /* a producer that went silent */
    unsigned seen = 0;
    double sum = 0;
    for (;;) { /* consumer: read each order where it lies */
        const void *p;
        ssize_t n = memlan_peek(ch, &p, 0);
        if (n <= 0)
            break;
        const struct order *o = p;
        if (n != (ssize_t)sizeof *o || o->id != seen || strcmp(o->symbol, "MEML") != 0) {
            fprintf(stderr, "zerocopy: bad order %u\n", seen);
            break;
        }
        sum += o->price;
        seen++;
        memlan_release(ch, 0);
    }
    /* Close before waiting: a consumer that stopped early (an error, a bad order) would
     * otherwise wait for a producer blocked for ever on the full ring it no longer reads. */
    memlan_channel_close(ch);
    int st;
    waitpid(pid, &st, 0);
    printf("zerocopy: %u orders read in place, total price %.0f\n", seen, sum);
    memlan_fabric_close(fab);
    return seen == N && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
