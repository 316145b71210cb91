/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* The server side of echo.x, written once against rpcgen's interface and built both with the
 * system rpcgen's output and with memlan-rpcgen's.  Its own main (as with rpcgen -m): a TCP
 * transport on the port given, registered without rpcbind (protocol 0).  libtirpc's svctcp_create does not listen on a
 * socket it is given: we do. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "echo.h"

void *ping_1_svc(void *arg, struct svc_req *rq)
{
    static char r;
    (void)arg;
    (void)rq;
    return &r;
}

/* Where an argument's bytes are: "lent" when they lie in a mapping of a file in /dev/shm (a
 * memlan channel's ring), "copied" when elsewhere (the heap). */
static const char *where(const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512], path[400];
    unsigned long lo, hi;
    const char *w = "copied";
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %399s", &lo, &hi, path) == 3 &&
            (unsigned long)p >= lo && (unsigned long)p < hi && !strncmp(path, "/dev/shm/", 9))
            w = "lent";
    if (f)
        fclose(f);
    return w;
}

data *echo_1_svc(data *arg, struct svc_req *rq)
{
    static data r;
    (void)rq;
    if (getenv("ECHO_WHERE") && arg->data_len >= 4096) {
        volatile char *b = arg->data_val;
        b[0] = b[0]; /* a procedure may write into its arguments */
        fprintf(stderr, "echo %u: %s\n", arg->data_len, where(arg->data_val));
    }
    free(r.data_val);
    r.data_len = arg->data_len;
    r.data_val = malloc(arg->data_len ? arg->data_len : 1);
    if (arg->data_len)
        memcpy(r.data_val, arg->data_val, arg->data_len);
    return &r;
}

result *mix_1_svc(pair *arg, struct svc_req *rq)
{
    static result r;
    static point opt;
    static char name[80];
    static u_int var[8];
    (void)rq;
    memset(&r, 0, sizeof r);
    if (arg->s == TRIANGLE) {
        r.status = 1;
        snprintf(name, sizeof name, "no triangles (%s)", arg->name);
        r.result_u.error = name;
        return &r;
    }
    if (arg->s == SQUARE && arg->flag) {
        r.status = 7; /* the void default arm */
        return &r;
    }
    pair *v = &r.result_u.value;
    *v = *arg;
    v->a = arg->a * 3 - 1;
    v->b = ~arg->b;
    v->d = arg->d * 2;
    v->f = arg->f + 1;
    v->flag = !arg->flag;
    v->p.x = arg->p.y;
    v->p.y = arg->p.x;
    if (arg->opt) {
        opt.x = arg->opt->x + 1;
        opt.y = arg->opt->y - 1;
        v->opt = &opt;
    }
    snprintf(name, sizeof name, "<%s>", arg->name);
    v->name = name;
    for (int i = 0; i < 3; i++)
        v->fixed[i] = arg->fixed[2 - i];
    v->var.var_len = arg->var.var_len;
    for (u_int i = 0; i < arg->var.var_len; i++)
        var[i] = arg->var.var_val[i] + i;
    v->var.var_val = var;
    for (int i = 0; i < 5; i++)
        v->tag[i] = (char)(arg->tag[i] ^ 0x5a);
    return &r;
}

u_int *whoami_1_svc(void *arg, struct svc_req *rq)
{
    static u_int r;
    (void)arg;
    if (rq->rq_cred.oa_flavor == AUTH_SYS) {
        struct authunix_parms *p = (struct authunix_parms *)rq->rq_clntcred;
        r = p->aup_uid + 1000000u * (p->aup_len > 0);
    } else {
        r = 0xffffffffu;
    }
    return &r;
}

int *fail_1_svc(int *arg, struct svc_req *rq)
{
    (void)arg;
    svcerr_systemerr(rq->rq_xprt);
    return NULL;
}

int *slow_1_svc(int *arg, struct svc_req *rq)
{
    static int r;
    (void)rq;
    if (*arg < 0) { /* slow(-1): stop serving, as a procedure may (svc_run returns) */
        svc_exit();
        r = *arg;
        return &r;
    }
    usleep((useconds_t)*arg * 1000);
    r = *arg;
    return &r;
}

int echoprog_1_freeresult(SVCXPRT *x, xdrproc_t f, caddr_t p)
{
    (void)x;
    xdr_free(f, p);
    return 1;
}

void echoprog_1(struct svc_req *rqstp, SVCXPRT *transp);

static void on_term(int sig)
{
    (void)sig;
    exit(0); /* atexit handlers run: the fast path's socket file is removed */
}

int main(int argc, char **argv)
{
    signal(SIGTERM, on_term);
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT\n", argv[0]);
        return 2;
    }
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0) {
        perror("bind");
        return 1;
    }
    SVCXPRT *t = svctcp_create(s, 0, 0);
    if (!t || !svc_register(t, ECHOPROG, ECHOVERS, echoprog_1, 0)) {
        fprintf(stderr, "cannot serve\n");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    svc_run();
    fprintf(stderr, "svc_run returned\n");
    return 3;
}
