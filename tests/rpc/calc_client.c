/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* The client of calc.x (rpcgen -N): clnt_create through rpcbind (or memlan's fast path), each
 * outcome printed, so that runs over different paths can be compared line for line.  Whether the
 * fast path was taken goes to stderr.  Usage: calc_client HOST */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "calc.h"

static unsigned long rng = 0x9e3779b97f4a7c15ul;
static unsigned long next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const char *err(CLIENT *cl)
{
    struct rpc_err e;
    clnt_geterr(cl, &e);
    return clnt_sperrno(e.re_status);
}

static unsigned long sum(const char *p, size_t n)
{
    unsigned long h = 5381;
    for (size_t i = 0; i < n; i++)
        h = h * 33 + (unsigned char)p[i];
    return h;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s HOST\n", argv[0]);
        return 2;
    }
    CLIENT *cl = clnt_create(argv[1], CALCPROG, CALCVERS, "tcp");
    if (!cl) {
        clnt_pcreateerror(argv[1]);
        return 1;
    }
#ifdef MEMLAN_RPC_H
    fprintf(stderr, "fast path: %s %s\n", memlan_clnt_is_fast(cl) ? "yes" : "no",
            memlan_rpc_reason());
#endif
    printf("ping: %s\n", ping_1(cl) ? "ok" : err(cl));
    int *r = add_1(2, 40, cl);
    printf("add 2 40: %d\n", r ? *r : -1);
    r = add_1(2147483647, 1, cl);
    printf("add max 1: %d\n", r ? *r : -1);
    r = neg_1(7, cl);
    printf("neg 7: %d\n", r ? *r : -1);
    pt p = {1, 2};
    pt *m = move_1(p, 5, ((quad_t)1 << 40) + 3, cl);
    printf("move: %s %d,%d\n", m ? "ok" : err(cl), m ? m->x : 0, m ? m->y : 0);
    name *g = greet_1("hello", "world", cl);
    printf("greet: %s\n", g ? *g : err(cl));
    if (g)
        clnt_freeres(cl, (xdrproc_t)xdr_name, (caddr_t)g);
    printf("sink: %s\n", sink_1(p, cl) ? "ok" : err(cl));
    u_int sizes[][2] = {{0, 0}, {1, 0}, {3, 5}, {1000, 24}, {70000, 3}, {300000, 200000}};
    for (unsigned k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        blob a = {sizes[k][0], malloc(sizes[k][0] + 1)}, b = {sizes[k][1], malloc(sizes[k][1] + 1)};
        for (u_int i = 0; i < a.blob_len; i++)
            a.blob_val[i] = (char)next();
        for (u_int i = 0; i < b.blob_len; i++)
            b.blob_val[i] = (char)next();
        blob *j = join_1(a, b, 2, cl);
        if (j)
            printf("join %u %u: %u bytes, sum %lu\n", a.blob_len, b.blob_len, j->blob_len,
                   sum(j->blob_val, j->blob_len));
        else
            printf("join %u %u: %s\n", a.blob_len, b.blob_len, err(cl));
        if (j)
            clnt_freeres(cl, (xdrproc_t)xdr_blob, (caddr_t)j);
        free(a.blob_val);
        free(b.blob_val);
    }
    clnt_destroy(cl);
    return 0;
}
