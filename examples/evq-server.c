/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-server: one server listens on a name in the fabric and answers 64 client processes, each
 * with its own channel, through a single event queue (the CLAN event-queue pattern).  The
 * clients, forked only to have separate processes, connect by the name; the server's loop sleeps
 * in poll() on two descriptors, memlan_listener_fd for new clients and memlan_evq_fd for
 * requests, until every client is in; then it closes the listener and waits in memlan_evq_wait,
 * which spins before it sleeps.  Uses only <memlan.h>.
 * Usage: evq-server [clients] [requests per client] */
#include <memlan.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A client: connect by name, send numbers, expect each doubled. */
static int client(const char *name, int i, int nreq)
{
    memlan_fabric_t *fab;
    memlan_channel_t *c;
    struct memlan_channel_opts opts = {.kind = MEMLAN_MSG, .ring_size = 4096};
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_connect(fab, name, &opts, 10000, &c)) < 0) {
        fprintf(stderr, "evq-server: client %d: connect %s: %s\n", i, name, memlan_strerror(r));
        return 1;
    }
    memlan_channel_set_timeout(c, 5000, 5000); /* an answer 5 s late is not coming */
    for (uint64_t k = 1; k <= (uint64_t)nreq; k++) {
        uint64_t v = k * 1000 + (uint64_t)i, back;
        if (memlan_send(c, &v, sizeof v, 0) != sizeof v ||
            memlan_recv(c, &back, sizeof back, 0) != sizeof back || back != 2 * v)
            return 1;
    }
    memlan_channel_close(c);
    memlan_fabric_close(fab);
    return 0;
}

/* Answer what the events say; returns the number of channels that finished, or -1. */
static int answer(memlan_evq_t *q, const struct memlan_event *ev, int n, long *answered)
{
    int done = 0;
    for (int e = 0; e < n; e++) {
        memlan_channel_t *c = ev[e].udata;
        for (;;) { /* edge-triggered: drain until -EAGAIN re-arms the channel */
            uint64_t v;
            ssize_t got = memlan_recv(c, &v, sizeof v, MEMLAN_DONTWAIT);
            if (got == -EAGAIN)
                break;
            if (got <= 0) { /* the client finished (0) or died (<0) */
                memlan_evq_del(q, c);
                done++;
                break;
            }
            v *= 2;
            if (memlan_send(c, &v, sizeof v, 0) != sizeof v)
                return -1;
            (*answered)++;
        }
    }
    return done;
}

int main(int argc, char **argv)
{
    int nc = argc > 1 ? atoi(argv[1]) : 64, nreq = argc > 2 ? atoi(argv[2]) : 1000;
    if (nc < 1 || nc > 1024 || nreq < 1)
        return 2;
    memlan_fabric_t *fab;
    memlan_listener_t *l;
    memlan_evq_t *q;
    char name[MEMLAN_NAME_MAX + 1];
    snprintf(name, sizeof name, "evq-server-%ld", (long)getpid());
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_evq_create(fab, (unsigned)nc, &q)) < 0 ||
        (r = memlan_listen(fab, name, MEMLAN_MSG, &l)) < 0) {
        fprintf(stderr, "evq-server: %s\n", memlan_strerror(r));
        return 1;
    }
    for (int i = 0; i < nc; i++)
        if (fork() == 0)
            _exit(client(name, i, nreq));

    memlan_channel_t **ch = calloc((size_t)nc, sizeof *ch);
    struct memlan_event ev[64];
    long answered = 0;
    int accepted = 0, open = 0, n;
    while (accepted < nc) { /* clients still to come: sleep on both descriptors */
        memlan_channel_t *c;
        while (accepted < nc && (r = memlan_accept(l, 0, &c)) == 0) {
            ch[accepted++] = c;
            open++;
            if ((r = memlan_evq_add(q, c, MEMLAN_EV_READ, c)) < 0)
                goto fail;
        }
        if (r < 0 && r != -EAGAIN)
            goto fail;
        if ((n = memlan_evq_wait(q, ev, 64, 0)) < 0 || (n = answer(q, ev, n, &answered)) < 0) {
            r = n;
            goto fail;
        }
        open -= n;
        if (accepted == nc || memlan_evq_arm(q) == 1)
            continue; /* events are waiting: do not sleep */
        struct pollfd pfd[2] = {{.fd = memlan_listener_fd(l), .events = POLLIN},
                                {.fd = memlan_evq_fd(q), .events = POLLIN}};
        if (poll(pfd, 2, 10000) == 0) {
            r = -ETIMEDOUT;
            goto fail;
        }
    }
    memlan_listener_close(l); /* everyone is in: no more names to serve */
    l = NULL;
    while (open > 0) {
        if ((n = memlan_evq_wait(q, ev, 64, 10000)) <= 0 ||
            (n = answer(q, ev, n, &answered)) < 0) {
            r = n ? n : -ETIMEDOUT;
            goto fail;
        }
        open -= n;
    }
    /* Close before waiting: a client whose connection was spoiled (counted as ended here while
     * it still waits for an answer) would otherwise wait for ever, and we for it. */
    for (int i = 0; i < nc; i++)
        memlan_channel_close(ch[i]);
    int ok = 1, st;
    while (wait(&st) > 0)
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    printf("evq-server: %d clients, %ld requests answered through one event queue\n", nc,
           answered);
    memlan_evq_close(q);
    memlan_fabric_close(fab);
    free(ch);
    return ok && answered == (long)nc * nreq ? 0 : 1;
fail:
    fprintf(stderr, "evq-server: %d of %d clients in, %ld requests answered: %s\n", accepted, nc,
            answered, memlan_strerror(r));
    return 1;
}
