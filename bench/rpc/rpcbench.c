/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* bench/rpc client: calls of tests/rpc/echo.x's PING (null) or ECHO (SIZE bytes), timed.
 * Usage: rpcbench fast|tcp PORT null|echo SIZE SECONDS [THREADS]
 * Prints: calls, mean round trip in microseconds (one thread) and calls per second (all). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "echo.h"

static const char *mode, *proc;
static int port;
static u_int size;
static double secs;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static CLIENT *connect_client(void)
{
#ifdef MEMLAN_RPC_H
    if (!strcmp(mode, "fast")) {
        CLIENT *cl = clnt_create("localhost", ECHOPROG, ECHOVERS, "tcp");
        if (!cl || !memlan_clnt_is_fast(cl)) {
            fprintf(stderr, "no fast path: %s\n", memlan_rpc_reason());
            exit(3);
        }
        return cl;
    }
#endif
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int sock = RPC_ANYSOCK;
    CLIENT *cl = clnttcp_create(&a, ECHOPROG, ECHOVERS, &sock, 0, 0);
    if (!cl) {
        clnt_pcreateerror("clnttcp_create");
        exit(1);
    }
    return cl;
}

static void *worker(void *arg)
{
    long *calls = arg;
    CLIENT *cl = connect_client();
    data d = {size, calloc(1, size ? size : 1)};
    int null = !strcmp(proc, "null");
    for (int i = 0; i < 200; i++) /* warm up */
        null ? (void)ping_1(NULL, cl) : (void)echo_1(&d, cl);
    double end = now() + secs;
    long n = 0;
    while (1) {
        for (int i = 0; i < 64; i++) {
            if (null) {
                if (!ping_1(NULL, cl))
                    goto fail;
            } else {
                data *r = echo_1(&d, cl);
                if (!r || r->data_len != size)
                    goto fail;
                clnt_freeres(cl, (xdrproc_t)xdr_data, (caddr_t)r);
            }
        }
        n += 64;
        if (now() >= end)
            break;
    }
    *calls = n;
    clnt_destroy(cl);
    free(d.data_val);
    return NULL;
fail:
    clnt_perror(cl, "call");
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s fast|tcp PORT null|echo SIZE SECONDS [THREADS]\n", argv[0]);
        return 2;
    }
    mode = argv[1];
    port = atoi(argv[2]);
    proc = argv[3];
    size = (u_int)atoi(argv[4]);
    secs = atof(argv[5]);
    int threads = argc > 6 ? atoi(argv[6]) : 1;
    if (threads < 1 || threads > 64)
        return 2;
    pthread_t t[64];
    long calls[64] = {0};
    double t0 = now();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, &calls[i]);
    long total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        total += calls[i];
    }
    double el = now() - t0;
    /* one thread: its round trip; several: the aggregate rate */
    printf("calls %ld rtt_us %.2f calls_per_s %.0f\n", total,
           threads == 1 ? el * 1e6 / (double)total : 0.0, (double)total / el);
    return 0;
}
