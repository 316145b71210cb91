/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* pingpong: two processes bounce a 64-byte message over a memlan message channel and print the
 * median round trip.  The server listens on a name in the fabric and the echo process connects
 * by that name: no token passes between them (see zerocopy.c for the raw token).  Uses only
 * <memlan.h>.
 *
 *   pingpong [ROUNDS]              both sides: the echo side is forked only to have a second
 *                                  process (it connects by the name, as a stranger would)
 *   pingpong serve NAME [ROUNDS]   the measuring side alone, serving NAME until one echo comes
 *   pingpong echo NAME             the echo side alone, from any other shell of the same user:
 *                                  the name is all the two processes share */
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

/* The echo side: its own fabric handle, and the name.  Returns the exit status. */
static int echo(const char *name)
{
    memlan_fabric_t *f;
    memlan_channel_t *peer;
    struct memlan_channel_opts opts = {.kind = MEMLAN_MSG};
    int r;
    if ((r = memlan_fabric_open(NULL, &f)) < 0 ||
        (r = memlan_connect(f, name, &opts, 5000, &peer)) < 0) {
        fprintf(stderr, "pingpong: connect %s: %s\n", name, memlan_strerror(r));
        return 1;
    }
    /* The measurer pings at once and without pause: 5 s of silence means it is gone or its
     * ping was lost (a spoiled ring), and waiting on would be for ever. */
    memlan_channel_set_timeout(peer, 5000, 5000);
    char msg[64];
    ssize_t got;
    while ((got = memlan_recv(peer, msg, sizeof msg, 0)) > 0)
        if (memlan_send(peer, msg, (size_t)got, 0) != got)
            return 1;
    memlan_channel_close(peer);
    memlan_fabric_close(f);
    return got == 0 ? 0 : 1;
}

/* The measuring side: accept one echo on l (waiting up to wait_ms), then n round trips. */
static int measure(memlan_listener_t *l, int wait_ms, int n)
{
    memlan_channel_t *ch;
    int r = memlan_accept(l, wait_ms, &ch);
    memlan_listener_close(l); /* one client is all we serve; the name is free again */
    if (r < 0) {
        fprintf(stderr, "pingpong: accept: %s\n", memlan_strerror(r));
        return 1;
    }
    memlan_channel_set_timeout(ch, 5000, 5000); /* an echo 5 s late is not coming */
    double *rtt = malloc(sizeof *rtt * (size_t)n);
    char msg[64] = "ping";
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        if (!rtt || memlan_send(ch, msg, sizeof msg, 0) != sizeof msg ||
            memlan_recv(ch, msg, sizeof msg, 0) != sizeof msg) {
            fprintf(stderr, "pingpong: exchange %d failed\n", i);
            memlan_channel_close(ch); /* or the echo, waiting for the next ping, and our caller,
                                       * waiting for the echo to exit, would wait for ever */
            free(rtt);
            return 1;
        }
        rtt[i] = now_us() - t0;
    }
    memlan_channel_close(ch); /* the peer sees EOF and exits */
    qsort(rtt, (size_t)n, sizeof *rtt, cmp);
    printf("pingpong: %d round trips of 64 B, median %.2f us, p99 %.2f us\n", n, rtt[n / 2],
           rtt[(int)(n * 0.99)]);
    free(rtt);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "echo") == 0)
        return echo(argv[2]);
    int serve = argc >= 3 && strcmp(argv[1], "serve") == 0;
    const char *rounds = serve ? (argc > 3 ? argv[3] : NULL) : (argc > 1 ? argv[1] : NULL);
    int n = rounds ? atoi(rounds) : 10000;
    if (n < 1 || argc > (serve ? 4 : 2)) {
        fprintf(stderr, "usage: pingpong [ROUNDS] | pingpong serve NAME [ROUNDS] | "
                        "pingpong echo NAME\n");
        return 2;
    }
    memlan_fabric_t *fab;
    memlan_listener_t *l;
    char name[MEMLAN_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", serve ? argv[2] : "");
    if (!serve)
        snprintf(name, sizeof name, "pingpong-%ld", (long)getpid());
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_listen(fab, name, MEMLAN_MSG, &l)) < 0) {
        fprintf(stderr, "pingpong: %s: %s\n", name, memlan_strerror(r));
        return 1;
    }
    if (serve) {
        printf("pingpong: serving %s; run 'pingpong echo %s' as the same user\n", name, name);
        fflush(stdout);
        r = measure(l, -1, n);
        memlan_fabric_close(fab);
        return r;
    }
    pid_t pid = fork();
    if (pid == 0)
        _exit(echo(name));
    r = measure(l, 5000, n);
    int st;
    waitpid(pid, &st, 0);
    memlan_fabric_close(fab);
    return r == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
