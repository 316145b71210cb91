/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* The RPC tests' client: one scripted session against echo.x's server whose every outcome is
 * printed, so that runs over different paths (memlan's fast path, libtirpc over TCP, stock
 * stubs) can be compared line for line.
 * Usage: echo_client fast|tcp PORT [exit | pings N | pings1 N | echoes N |
 *        flood N | batch N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "echo.h"

static unsigned long rng = 88172645463325252ul;
static unsigned long next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static enum clnt_stat clnt_stat_of(CLIENT *cl)
{
    struct rpc_err e;
    clnt_geterr(cl, &e);
    return e.re_status;
}

static void echo(CLIENT *cl, u_int n)
{
    data d = {n, malloc(n ? n : 1)};
    for (u_int i = 0; i < n; i++)
        d.data_val[i] = (char)next();
    data *r = echo_1(&d, cl);
    if (!r) {
        printf("echo %u: %s\n", n, clnt_sperrno(clnt_stat_of(cl)));
    } else {
        int same = r->data_len == n && (n == 0 || memcmp(r->data_val, d.data_val, n) == 0);
        printf("echo %u: %s\n", n, same ? "same bytes" : "DIFFERENT");
        clnt_freeres(cl, (xdrproc_t)xdr_data, (caddr_t)r);
    }
    free(d.data_val);
}

static void mix(CLIENT *cl, shape s, bool_t flag, int with_opt)
{
    point opt = {(int)next(), (int)next()};
    u_int var[8];
    pair p;
    memset(&p, 0, sizeof p);
    p.a = (quad_t)next();
    p.b = (u_quad_t)next();
    p.d = (double)(long)next() / 3.0;
    p.f = (float)(int)(next() % 100000) / 7.0f;
    p.flag = flag;
    p.s = s;
    p.p.x = (int)next();
    p.p.y = (int)next();
    p.opt = with_opt ? &opt : NULL;
    p.name = "a name";
    for (int i = 0; i < 3; i++)
        p.fixed[i] = (int)next();
    p.var.var_len = (u_int)(next() % 9);
    p.var.var_val = var;
    for (u_int i = 0; i < p.var.var_len; i++)
        var[i] = (u_int)next();
    for (int i = 0; i < 5; i++)
        p.tag[i] = (char)next();
    result *r = mix_1(&p, cl);
    if (!r) {
        printf("mix: %s\n", clnt_sperrno(clnt_stat_of(cl)));
        return;
    }
    printf("mix: status %d", r->status);
    if (r->status == 1 || r->status == 2)
        printf(" error \"%s\"", r->result_u.error);
    if (r->status == 0) {
        pair *v = &r->result_u.value;
        printf(" a %lld b %llu d %.17g f %.9g flag %d s %d p %d,%d", (long long)v->a,
               (unsigned long long)v->b, v->d, (double)v->f, v->flag, v->s, v->p.x, v->p.y);
        if (v->opt)
            printf(" opt %d,%d", v->opt->x, v->opt->y);
        else
            printf(" opt none");
        printf(" name %s fixed %d %d %d var", v->name, v->fixed[0], v->fixed[1], v->fixed[2]);
        for (u_int i = 0; i < v->var.var_len; i++)
            printf(" %u", v->var.var_val[i]);
        printf(" tag");
        for (int i = 0; i < 5; i++)
            printf(" %02x", (unsigned char)v->tag[i]);
    }
    printf("\n");
    clnt_freeres(cl, (xdrproc_t)xdr_result, (caddr_t)r);
}


int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s fast|tcp PORT [pings N]\n", argv[0]);
        return 2;
    }
    CLIENT *cl;
    if (!strncmp(argv[1], "fast", 4)) {
#ifdef MEMLAN_RPC_H
        /* fast: clnt_create; fast-timed: clnt_create_timed; fast-vers: clnt_create_vers */
        struct timeval tv = {5, 0};
        rpcvers_t v = 0;
        if (!strcmp(argv[1], "fast-timed"))
            cl = clnt_create_timed("localhost", ECHOPROG, ECHOVERS, "tcp", &tv);
        else if (!strcmp(argv[1], "fast-vers")) {
            cl = clnt_create_vers("localhost", ECHOPROG, &v, ECHOVERS, ECHOVERS + 2, "tcp");
            if (cl && v != ECHOVERS) {
                fprintf(stderr, "clnt_create_vers chose version %lu\n", (unsigned long)v);
                return 4;
            }
        } else
            cl = clnt_create("localhost", ECHOPROG, ECHOVERS, "tcp");
        if (!cl || !memlan_clnt_is_fast(cl)) {
            fprintf(stderr, "no fast path: %s\n", memlan_rpc_reason());
            return 3;
        }
#else
        fprintf(stderr, "built without memlan\n");
        return 3;
#endif
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2])),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int sock = RPC_ANYSOCK;
        cl = clnttcp_create(&a, ECHOPROG, ECHOVERS, &sock, 0, 0);
        if (!cl) {
            clnt_pcreateerror("clnttcp_create");
            return 1;
        }
    }
    if (argc > 3 && !strcmp(argv[3], "exit")) { /* PORT exit: ask the server to svc_exit() */
        int stop = -1;
        printf("exit: %s\n", slow_1(&stop, cl) ? "ok" : clnt_sperrno(clnt_stat_of(cl)));
        clnt_destroy(cl);
        return 0;
    }
    if (argc > 4 && !strcmp(argv[3], "pings")) { /* PORT pings N: N null calls, back to back */
        long n = atol(argv[4]), failed = 0;
        for (long i = 0; i < n; i++)
            failed += ping_1(NULL, cl) == NULL;
        printf("%ld pings: %ld failed\n", n, failed);
        clnt_destroy(cl);
        return 0;
    }
    if (argc > 4 && (!strcmp(argv[3], "echoes") || !strcmp(argv[3], "pings1"))) {
        /* for the chaos suite, whose vandal may spoil this connection: each call waits 2 s at
         * most, and the first failure ends the run (exit 1) */
        struct timeval two = {2, 0};
        clnt_control(cl, CLSET_TIMEOUT, (char *)&two);
    }
    if (argc > 4 && !strcmp(argv[3], "flood")) { /* PORT flood N: a ping, "up", a line read,
                                                   * then N echoes of 4 KB, 100 ms each at
                                                   * most, on after failures */
        struct timeval tenth = {0, 100000};
        clnt_control(cl, CLSET_TIMEOUT, (char *)&tenth);
        if (!ping_1(NULL, cl))
            return 1;
        printf("up\n"); /* then a line on stdin (the test stops the server meanwhile) */
        fflush(stdout);
        char line[8];
        if (!fgets(line, sizeof line, stdin))
            return 1;
        long n = atol(argv[4]), failed = 0;
        static char blk[4096];
        for (long i = 0; i < n; i++) {
            data d = {sizeof blk, blk};
            data *r = echo_1(&d, cl);
            if (!r)
                failed++;
            else
                clnt_freeres(cl, (xdrproc_t)xdr_data, (caddr_t)r);
        }
        printf("%ld echoes: %ld failed\n", n, failed);
        clnt_destroy(cl);
        return 0;
    }
    if (argc > 4 && !strcmp(argv[3], "batch")) { /* PORT batch N: a ping, "up", then N batched
                                                   * echoes of 4 KB whose replies it does not
                                                   * read, then, after a stdin line, a ping */
        if (!ping_1(NULL, cl))
            return 1;
        printf("up\n");
        fflush(stdout);
        struct timeval zero = {0, 0};
        static char blk[4096];
        data d = {sizeof blk, blk}, r;
        long n = atol(argv[4]), sent = 0;
        time_t t0 = time(NULL);
        for (long i = 0; i < n && time(NULL) - t0 < 10; i++) {
            memset(&r, 0, sizeof r);
            /* timeout 0: sent, no reply waited for (a batched call, clnt_call(3)); a full
             * ring is waited for 25 s at most */
            enum clnt_stat st = clnt_call(cl, ECHO, (xdrproc_t)xdr_data, (caddr_t)&d,
                                          (xdrproc_t)NULL, NULL, zero);
            sent += st == RPC_TIMEDOUT || st == RPC_SUCCESS;
        }
        printf("%ld batched, %ld sent\n", n, sent);
        fflush(stdout);
        char line[8];
        if (!fgets(line, sizeof line, stdin))
            return 1;
        struct timeval ten = {10, 0}; /* the ping reads past the echoes' replies, by xid */
        clnt_control(cl, CLSET_TIMEOUT, (char *)&ten);
        printf("ping after: %s\n", ping_1(NULL, cl) ? "ok" : clnt_sperrno(clnt_stat_of(cl)));
        clnt_destroy(cl);
        return 0;
    }
    if (argc > 4 && !strcmp(argv[3], "pings1")) { /* PORT pings1 N: as pings, to a failure */
        long n = atol(argv[4]), i = 0;
        time_t t0 = time(NULL);
        while (i < n && time(NULL) - t0 < 5 && ping_1(NULL, cl)) /* 5 s in all, at most */
            i++;
        printf("%ld of %ld pings\n", i, n);
        clnt_destroy(cl);
        return i < n;
    }
    if (argc > 4 && !strcmp(argv[3], "echoes")) { /* PORT echoes N: N checked echoes, 0 B to
                                                    * 300 KB (spilled past the ring) */
        static const u_int sz[] = {0, 1, 100, 4096, 70000, 300000};
        long n = atol(argv[4]), wrong = 0, failed = 0;
        time_t t0 = time(NULL);
        for (long i = 0; i < n; i++) {
            if (time(NULL) - t0 >= 5) { /* 5 s in all, at most: a spoiled, slow connection */
                failed++;
                break;
            }
            u_int len = sz[i % (long)(sizeof sz / sizeof sz[0])];
            data d = {len, malloc(len ? len : 1)};
            for (u_int j = 0; j < len; j++)
                d.data_val[j] = (char)(i + j);
            data *r = echo_1(&d, cl);
            if (!r) {
                failed++;
                free(d.data_val);
                break;
            } else {
                wrong += r->data_len != len || (len && memcmp(r->data_val, d.data_val, len));
                clnt_freeres(cl, (xdrproc_t)xdr_data, (caddr_t)r);
            }
            free(d.data_val);
        }
        printf("%ld echoes: %ld wrong, %ld failed\n", n, wrong, failed);
        clnt_destroy(cl);
        return wrong || failed;
    }
    printf("null: %s\n", ping_1(NULL, cl) ? "ok" : clnt_sperrno(clnt_stat_of(cl)));
    u_int sizes[] = {0, 1, 3, 4, 5, 1000, 4096, 65536, 200000, 500000, MAXDATA};
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        echo(cl, sizes[i]);
    mix(cl, CIRCLE, 0, 1);
    mix(cl, CIRCLE, 1, 0);
    mix(cl, SQUARE, 0, 1);
    mix(cl, SQUARE, 1, 1);
    mix(cl, TRIANGLE, 0, 0);
    u_int *who = whoami_1(NULL, cl);
    printf("whoami auth none: %s %u\n", who ? "ok" : "failed", who ? *who : 0);
    AUTH *none = cl->cl_auth;
    cl->cl_auth = authunix_create_default();
    who = whoami_1(NULL, cl);
    printf("whoami auth sys: %s %u (uid %u)\n", who ? "ok" : "failed", who ? *who : 0,
           (unsigned)getuid());
    auth_destroy(cl->cl_auth);
    cl->cl_auth = none;
    int x = 5;
    printf("fail: %s\n", fail_1(&x, cl) ? "returned" : clnt_sperrno(clnt_stat_of(cl)));
    struct timeval tv = {25, 0};
    enum clnt_stat st = clnt_call(cl, 42, (xdrproc_t)(void (*)(void))xdr_void, NULL, (xdrproc_t)(void (*)(void))xdr_void, NULL, tv);
    printf("unknown procedure: %s\n", clnt_sperrno(st));
    int bad = -1; /* a length of 2^32-1: the server cannot decode it */
    st = clnt_call(cl, ECHO, (xdrproc_t)xdr_int, (caddr_t)&bad, (xdrproc_t)(void (*)(void))xdr_void, NULL, tv);
    printf("garbage arguments: %s\n", clnt_sperrno(st));
    struct timeval shortwait = {0, 300000};
    clnt_control(cl, CLSET_TIMEOUT, (char *)&shortwait);
    x = 1000;
    int *sr = slow_1(&x, cl);
    printf("slow 1000 ms with a 300 ms timeout: %s\n", sr ? "returned" : clnt_sperrno(clnt_stat_of(cl)));
    struct timeval longwait = {25, 0};
    clnt_control(cl, CLSET_TIMEOUT, (char *)&longwait);
    x = 10;
    sr = slow_1(&x, cl);
    printf("slow 10 ms after it: %s %d\n", sr ? "ok" : clnt_sperrno(clnt_stat_of(cl)), sr ? *sr : 0);
    int bad_echo = 0;
    for (int i = 0; i < 2000; i++) {
        char buf[100];
        for (int j = 0; j < 100; j++)
            buf[j] = (char)(i + j);
        data d = {(u_int)(i % 100), buf};
        data *r = echo_1(&d, cl);
        if (!r || r->data_len != d.data_len || memcmp(r->data_val, buf, d.data_len))
            bad_echo++;
        else
            clnt_freeres(cl, (xdrproc_t)xdr_data, (caddr_t)r);
    }
    printf("2000 echoes: %d wrong\n", bad_echo);
    clnt_destroy(cl);
    return 0;
}
