/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* The server side of calc.x (rpcgen -N), written once against rpcgen's interface and built with
 * the system rpcgen's output and with memlan-rpcgen's; main is rpcgen's (-s tcp). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "calc.h"

void *ping_1_svc(struct svc_req *rq)
{
    static char r;
    (void)rq;
    return &r;
}

int *add_1_svc(int a, int b, struct svc_req *rq)
{
    static int r;
    (void)rq;
    r = (int)((unsigned)a + (unsigned)b);
    return &r;
}

int *neg_1_svc(int a, struct svc_req *rq)
{
    static int r;
    (void)rq;
    r = (int)(0u - (unsigned)a);
    return &r;
}

pt *move_1_svc(pt p, int dx, quad_t dy, struct svc_req *rq)
{
    static pt r;
    (void)rq;
    r.x = (int)((unsigned)p.x + (unsigned)dx);
    r.y = (int)((unsigned)p.y + (unsigned)(dy >> 32) + (unsigned)(dy & 0xff));
    return &r;
}

name *greet_1_svc(name a, name b, struct svc_req *rq)
{
    static char buf[140];
    static name r = buf;
    (void)rq;
    snprintf(buf, sizeof buf, "%s, %s!", a, b);
    return &r;
}

void *sink_1_svc(pt p, struct svc_req *rq)
{
    static char r;
    (void)p;
    (void)rq;
    return &r;
}

/* a, then b, then a again reversed, times 'times' (at most 4) */
blob *join_1_svc(blob a, blob b, u_int times, struct svc_req *rq)
{
    static blob r;
    (void)rq;
    free(r.blob_val);
    if (times > 4)
        times = 4;
    size_t one = (size_t)a.blob_len * 2 + b.blob_len;
    r.blob_len = (u_int)(one * times);
    r.blob_val = malloc(r.blob_len ? r.blob_len : 1);
    for (u_int t = 0; t < times; t++) {
        char *o = r.blob_val + t * one;
        memcpy(o, a.blob_val, a.blob_len);
        memcpy(o + a.blob_len, b.blob_val, b.blob_len);
        for (u_int i = 0; i < a.blob_len; i++)
            o[a.blob_len + b.blob_len + i] = a.blob_val[a.blob_len - 1 - i];
    }
    return &r;
}

int calcprog_1_freeresult(SVCXPRT *x, xdrproc_t f, caddr_t p)
{
    (void)x;
    xdr_free(f, p);
    return 1;
}
