/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-server: one server waits on a single event queue for 64 client processes, each with its
 * own channel, and answers every request (the CLAN event-queue pattern).  Uses only <memlan.h>.
 * Usage: evq-server [clients] [requests per client] */
#include <memlan.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int nc = argc > 1 ? atoi(argv[1]) : 64, nreq = argc > 2 ? atoi(argv[2]) : 1000;
    if (nc < 1 || nc > 1024 || nreq < 1)
        return 2;
    memlan_fabric_t *fab;
    memlan_evq_t *q;
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_evq_create(fab, (unsigned)nc, &q)) < 0) {
        fprintf(stderr, "evq-server: %s\n", memlan_strerror(r));
        return 1;
    }
    memlan_channel_t **ch = calloc((size_t)nc, sizeof *ch);
    struct memlan_channel_opts opts = {.kind = MEMLAN_MSG, .ring_size = 4096};
    for (int i = 0; i < nc; i++) {
        if ((r = memlan_channel_create(fab, &opts, &ch[i])) < 0 ||
            (r = memlan_evq_add(q, ch[i], MEMLAN_EV_READ, ch[i])) < 0) {
            fprintf(stderr, "evq-server: %s\n", memlan_strerror(r));
            return 1;
        }
    }
    for (int i = 0; i < nc; i++) {
        if (fork() == 0) { /* a client: send a number, expect it doubled */
            memlan_channel_t *c;
            if (memlan_channel_attach(fab, memlan_channel_token(ch[i]), &c) < 0)
                _exit(1);
            for (uint64_t k = 1; k <= (uint64_t)nreq; k++) {
                uint64_t v = k * 1000 + (uint64_t)i, back;
                if (memlan_send(c, &v, sizeof v, 0) != sizeof v ||
                    memlan_recv(c, &back, sizeof back, 0) != sizeof back || back != 2 * v)
                    _exit(1);
            }
            memlan_channel_close(c);
            _exit(0);
        }
    }
    long answered = 0;
    int open = nc;
    while (open > 0) {
        struct memlan_event ev[64];
        int n = memlan_evq_wait(q, ev, 64, 10000);
        if (n <= 0) {
            fprintf(stderr, "evq-server: wait: %s\n", n ? memlan_strerror(n) : "timed out");
            return 1;
        }
        for (int e = 0; e < n; e++) {
            memlan_channel_t *c = ev[e].udata;
            for (;;) { /* edge-triggered: drain until -EAGAIN re-arms the channel */
                uint64_t v;
                ssize_t got = memlan_recv(c, &v, sizeof v, MEMLAN_DONTWAIT);
                if (got == -EAGAIN)
                    break;
                if (got <= 0) { /* the client finished (0) or died (<0) */
                    memlan_evq_del(q, c);
                    open--;
                    break;
                }
                v *= 2;
                memlan_send(c, &v, sizeof v, 0);
                answered++;
            }
        }
    }
    int ok = 1, st;
    while (wait(&st) > 0)
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    printf("evq-server: %d clients, %ld requests answered through one event queue\n", nc,
           answered);
    for (int i = 0; i < nc; i++)
        memlan_channel_close(ch[i]);
    memlan_evq_close(q);
    memlan_fabric_close(fab);
    free(ch);
    return ok && answered == (long)nc * nreq ? 0 : 1;
}
