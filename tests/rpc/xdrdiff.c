/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* XDR differential and fuzz driver for echo.x.  Built twice, once with the system rpcgen's
 * echo_xdr.c and once with memlan-rpcgen's: "encode SEED N" prints the encodings of N random
 * values of every type in hex (the two builds' outputs must be equal); "fuzz SEED N" decodes N
 * random and mutated buffers with every decoder and frees what they built (run under ASan: no
 * crash, no over-read, no leak). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "echo.h"

static unsigned long rng;
static unsigned long rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static char names[4][65];

static void fill_pair(pair *p, point *opt, u_int *var, int k)
{
    memset(p, 0, sizeof *p);
    p->a = (quad_t)rnd();
    p->b = (u_quad_t)rnd();
    union { unsigned long u; double d; } ud = {rnd()};
    p->d = ud.d;
    union { unsigned u; float f; } uf = {(unsigned)rnd()};
    p->f = uf.f;
    p->flag = (bool_t)(rnd() & 1);
    p->s = (shape)(1 + rnd() % 3);
    p->p.x = (int)rnd();
    p->p.y = (int)rnd();
    opt->x = (int)rnd();
    opt->y = (int)rnd();
    p->opt = rnd() & 1 ? opt : NULL;
    size_t n = rnd() % 65;
    for (size_t i = 0; i < n; i++)
        names[k][i] = (char)(32 + rnd() % 95);
    names[k][n] = 0;
    p->name = names[k];
    for (int i = 0; i < 3; i++)
        p->fixed[i] = (int)rnd();
    p->var.var_len = (u_int)(rnd() % 9);
    p->var.var_val = var;
    for (u_int i = 0; i < p->var.var_len; i++)
        var[i] = (u_int)rnd();
    for (int i = 0; i < 5; i++)
        p->tag[i] = (char)rnd();
}

static void hex(const char *what, xdrproc_t f, void *obj)
{
    static char buf[1 << 16];
    XDR x;
    xdrmem_create(&x, buf, sizeof buf, XDR_ENCODE);
    if (!f(&x, obj)) {
        printf("%s: encode failed\n", what);
        return;
    }
    u_int n = xdr_getpos(&x);
    printf("%s %u ", what, n);
    for (u_int i = 0; i < n; i++)
        printf("%02x", (unsigned char)buf[i]);
    printf("\n");
}

static int decode(xdrproc_t f, void *obj, size_t size, char *buf, u_int n)
{
    XDR x;
    memset(obj, 0, size);
    xdrmem_create(&x, buf, n, XDR_DECODE);
    int ok = f(&x, obj);
    xdr_free(f, obj); /* frees what was built, also after a failed decode */
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    rng = strtoul(argv[2], NULL, 0) | 1;
    long n = atol(argv[3]);
    if (!strcmp(argv[1], "encode")) {
        for (long i = 0; i < n; i++) {
            point opt;
            u_int var[8];
            pair p;
            fill_pair(&p, &opt, var, 0);
            hex("pair", (xdrproc_t)xdr_pair, &p);
            result r;
            memset(&r, 0, sizeof r);
            r.status = (int)(rnd() % 4);
            if (r.status == 0)
                fill_pair(&r.result_u.value, &opt, var, 1);
            else
                r.result_u.error = names[2];
            hex("result", (xdrproc_t)xdr_result, &r);
            char bytes[300];
            data d = {(u_int)(rnd() % 300), bytes};
            for (u_int k = 0; k < d.data_len; k++)
                bytes[k] = (char)rnd();
            hex("data", (xdrproc_t)xdr_data, &d);
            shape s = (shape)rnd();
            hex("shape", (xdrproc_t)xdr_shape, &s);
        }
        return 0;
    }
    /* fuzz: valid encodings, then truncated, bit-flipped and random buffers */
    long ok = 0;
    static char buf[4096];
    for (long i = 0; i < n; i++) {
        point opt;
        u_int var[8];
        result r;
        memset(&r, 0, sizeof r);
        r.status = (int)(rnd() % 3);
        if (r.status == 0)
            fill_pair(&r.result_u.value, &opt, var, 0);
        else
            r.result_u.error = "an error";
        XDR x;
        xdrmem_create(&x, buf, sizeof buf, XDR_ENCODE);
        xdr_result(&x, &r);
        u_int len = xdr_getpos(&x);
        switch (rnd() % 4) {
        case 0: len = (u_int)(rnd() % (len + 1)); break;
        case 1: buf[rnd() % len] ^= (char)(1u << (rnd() % 8)); break;
        case 2: for (u_int k = 0; k < len; k++) buf[k] = (char)rnd(); break;
        default: break;
        }
        /* the decoders get exactly len bytes, in a heap block of that size */
        char *b = malloc(len ? len : 1);
        memcpy(b, buf, len);
        result rr;
        pair pp;
        data dd;
        ok += decode((xdrproc_t)xdr_result, &rr, sizeof rr, b, len);
        ok += decode((xdrproc_t)xdr_pair, &pp, sizeof pp, b, len);
        ok += decode((xdrproc_t)xdr_data, &dd, sizeof dd, b, len);
        free(b);
    }
    printf("fuzz: %ld buffers, %ld decodes succeeded, no crash\n", n, ok);
    return 0;
}
