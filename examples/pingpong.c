/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* pingpong: two processes bounce a 64-byte message over a memlan message channel and print the
 * median round trip.  The server listens on a name in the fabric and the echo process, forked
 * only to have a second process, connects by that name: no token passes between them (see
 * zerocopy.c for the raw token).  Uses only <memlan.h>.  Usage: pingpong [round trips] */
#include <memlan.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10000;
    if (n < 1)
        n = 1;
    memlan_fabric_t *fab;
    memlan_listener_t *l;
    memlan_channel_t *ch;
    char name[MEMLAN_NAME_MAX + 1];
    snprintf(name, sizeof name, "pingpong-%ld", (long)getpid());
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_listen(fab, name, MEMLAN_MSG, &l)) < 0) {
        fprintf(stderr, "pingpong: %s\n", memlan_strerror(r));
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) { /* the echo side: its own fabric handle, and the name */
        memlan_fabric_t *f;
        memlan_channel_t *peer;
        struct memlan_channel_opts opts = {.kind = MEMLAN_MSG};
        if ((r = memlan_fabric_open(NULL, &f)) < 0 ||
            (r = memlan_connect(f, name, &opts, 5000, &peer)) < 0) {
            fprintf(stderr, "pingpong: connect %s: %s\n", name, memlan_strerror(r));
            _exit(1);
        }
        char msg[64];
        ssize_t got;
        while ((got = memlan_recv(peer, msg, sizeof msg, 0)) > 0)
            if (memlan_send(peer, msg, (size_t)got, 0) != got)
                _exit(1);
        memlan_channel_close(peer);
        memlan_fabric_close(f);
        _exit(got == 0 ? 0 : 1);
    }
    r = memlan_accept(l, 5000, &ch);
    memlan_listener_close(l); /* one client is all we serve; the name is free again */
    if (r < 0) {
        fprintf(stderr, "pingpong: accept: %s\n", memlan_strerror(r));
        return 1;
    }
    double *rtt = malloc(sizeof *rtt * (size_t)n);
    char msg[64] = "ping";
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        if (memlan_send(ch, msg, sizeof msg, 0) != sizeof msg ||
            memlan_recv(ch, msg, sizeof msg, 0) != sizeof msg) {
            fprintf(stderr, "pingpong: exchange %d failed\n", i);
            return 1;
        }
        rtt[i] = now_us() - t0;
    }
    memlan_channel_close(ch); /* the peer sees EOF and exits */
    int st;
    waitpid(pid, &st, 0);
    qsort(rtt, (size_t)n, sizeof *rtt, cmp);
    printf("pingpong: %d round trips of 64 B, median %.2f us, p99 %.2f us\n", n, rtt[n / 2],
           rtt[(int)(n * 0.99)]);
    free(rtt);
    memlan_fabric_close(fab);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
