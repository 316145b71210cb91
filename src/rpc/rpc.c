/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * rpc.c - the ONC RPC fast path that memlan-rpcgen's stubs use (see include/memlan/rpc.h).
 *
 * Rendezvous: a server that registers (prog, vers) also listens on a Unix seqpacket socket in
 * the fabric, rpc-PROG-VERS.sock (the fabric directory's permissions decide who may connect,
 * as for every other fabric file).  A client on the same host connects, names a message
 * channel it created, and the server attaches.  From then on one call is one message:
 *
 *   call:  struct ml_rpc_call (xid, proc, credential flavor and length), the credential body,
 *          then the arguments in XDR, encoded by the stub's own xdr routine straight into the
 *          ring (memlan_reserve / memlan_commit);
 *   reply: struct ml_rpc_reply (xid, reply and accept/reject status, two words of detail),
 *          then the results in XDR, decoded by the stub straight from the ring (memlan_peek).
 *
 * A call or reply too big for one message of the ring is spilled: its XDR goes into a segment
 * that the sender exports (read-only to the peer) and keeps for the next one, and the message
 * carries the header, ML_RPC_SPILLED, and struct ml_rpc_spill (the length and the segment's
 * token).  The receiver imports the segment once and decodes from it, in place.
 *
 * The server runs the dispatch function rpcgen generated, unchanged, on a SVCXPRT of its own:
 * svc_getargs decodes from the ring, svc_sendreply and svcerr_* encode into it.  Everything
 * else (other hosts, UDP, stock peers, MEMLAN_RPC=off) is libtirpc's, unchanged.
 */
#define MEMLAN_RPC_NO_REMAP
#include "memlan.h"
#include "memlan/rpc.h"
#include "../internal.h"
#include "../channel.h"
#include "../sys/sys.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#define ML_RPC_MAGIC 0x6d6c7232u /* "mlr2": spilled calls and replies */
#define ML_RPC_CRED_MAX 400      /* MAX_AUTH_BYTES */
#define ML_RPC_SPILLED 0x80000000u /* in a call's cred_len, a reply's stat */
#define ML_RPC_SPILL_KEEP (8u << 20) /* spill segments up to this size are kept for reuse */

struct ml_rpc_hello {
    uint32_t magic, prog, vers, pad;
    char token[MEMLAN_TOKEN_LEN + 1];
};

struct ml_rpc_call {
    uint32_t xid, proc, cred_flavor, cred_len;
};

struct ml_rpc_reply {
    uint32_t xid;
    uint32_t stat;   /* MSG_ACCEPTED or MSG_DENIED */
    uint32_t detail; /* accept_stat, or reject_stat */
    uint32_t a, b;   /* PROG_MISMATCH low/high; RPC_MISMATCH low/high; AUTH_ERROR why */
};

/* after the header (and a call's credential) of a spilled message */
struct ml_rpc_spill {
    uint32_t len;                       /* XDR bytes at the segment's start */
    char token[MEMLAN_TOKEN_LEN + 4];   /* NUL-terminated */
};

#define ML_PAD4(n) (((n) + 3u) & ~3u)

/* ---- shared ----------------------------------------------------------------------------- */

static pthread_once_t ml_rpc_once = PTHREAD_ONCE_INIT;
static memlan_fabric_t *ml_rpc_fab;
static int ml_rpc_off, ml_rpc_log, ml_rpc_noloan = 1;
static size_t ml_rpc_ring = 2u << 20;
static unsigned long ml_rpc_server_uid = ULONG_MAX; /* MEMLAN_RPC_SERVER_UID, or none */
static __thread char ml_rpc_why[160];

/* A bad setting is said on stderr with the default used, like the preload's ("Nothing silent"
 * in docs/design.md); ml_rpc_init runs once per process, so each is said once.  MEMLAN_QUIET
 * keeps it off stderr. */
static bool ml_rpc_quiet(void)
{
    const char *q = getenv("MEMLAN_QUIET");
    return q && *q && strcmp(q, "0") != 0;
}

static void ml_rpc_bad(const char *name, const char *v, const char *want, const char *def)
{
    if (ml_rpc_quiet())
        return;
    fprintf(stderr, "memlan-rpc[%d]: bad %s='%.40s' (want %s): using the default, %s\n",
            (int)getpid(), name, v, want, def);
}

/* An on/off setting: 1 for on, 0 for off, def when unset or empty or bad (said once). */
static int ml_rpc_env_on(const char *name, int def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    if (!strcmp(v, "on") || !strcmp(v, "1"))
        return 1;
    if (!strcmp(v, "off") || !strcmp(v, "0"))
        return 0;
    ml_rpc_bad(name, v, "on, off, 1 or 0", def ? "on" : "off");
    return def;
}

static void ml_rpc_init(void)
{
    ml_rpc_off = !ml_rpc_env_on("MEMLAN_RPC", 1);
    ml_rpc_log = getenv("MEMLAN_LOG") != NULL;
    /* opaque arguments are copied unless the server asks to have them lent from the ring
     * (the client can still write there during the call: see memlan/rpc.h) */
    ml_rpc_noloan = !ml_rpc_env_on("MEMLAN_RPC_LOAN", 0);
    const char *kb = getenv("MEMLAN_RPC_RING_KB");
    if (kb && *kb) {
        char *end;
        long v = strtol(kb, &end, 10);
        if (*end == '\0' && v >= 16 && v <= (1 << 20))
            ml_rpc_ring = (size_t)v << 10;
        else
            ml_rpc_bad("MEMLAN_RPC_RING_KB", kb, "16 to 1048576", "2048 KiB");
    }
    const char *uid = getenv("MEMLAN_RPC_SERVER_UID");
    if (uid && *uid) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(uid, &end, 10);
        if (*end == '\0' && uid[0] >= '0' && uid[0] <= '9' && !errno && v < UINT32_MAX)
            ml_rpc_server_uid = v;
        else
            ml_rpc_bad("MEMLAN_RPC_SERVER_UID", uid, "a uid",
                       "none (servers of our own uid, root's and the fabric owner's)");
    }
    if (ml_rpc_off)
        return;
    int rc = memlan_fabric_open(NULL, &ml_rpc_fab);
    if (rc < 0) {
        /* Nothing silent: a fabric that cannot be used (missing, another user's, a sandbox)
         * leaves every call on plain ONC RPC; said once, like the preload's note. */
        ml_rpc_fab = NULL;
        const char *dir = getenv("MEMLAN_FABRIC");
        if (ml_rpc_log || !ml_rpc_quiet())
            fprintf(stderr, "memlan-rpc[%d]: cannot use the fabric %s: %s; every call is plain "
                    "ONC RPC\n", (int)getpid(), dir && *dir ? dir : "(the default)",
                    memlan_strerror(rc));
    }
}

static void ml_rpc_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void ml_rpc_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ml_rpc_why, sizeof ml_rpc_why, fmt, ap);
    va_end(ap);
    if (ml_rpc_log)
        fprintf(stderr, "memlan-rpc: %s\n", ml_rpc_why);
}

const char *memlan_rpc_reason(void)
{
    return ml_rpc_why;
}

static int ml_rpc_sockpath(struct sockaddr_un *sa, rpcprog_t prog, rpcvers_t vers)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path, sizeof sa->sun_path, "%s/rpc-%lu-%lu.sock",
                     memlan_fabric_path(ml_rpc_fab), (unsigned long)prog, (unsigned long)vers);
    return n > 0 && (size_t)n < sizeof sa->sun_path ? 0 : -ENAMETOOLONG;
}

/* A segment of at least need bytes to spill into: *seg when it is big enough, else a new one
 * (the old one's file goes; a peer that still maps it keeps its memory). */
static int ml_spill_get(memlan_segment_t **seg, size_t need)
{
    if (*seg && memlan_segment_size(*seg) >= need)
        return 0;
    if (*seg)
        memlan_segment_close(*seg);
    *seg = NULL;
    size_t sz = 1u << 20;
    while (sz < need)
        sz <<= 1;
    return memlan_segment_export(ml_rpc_fab, sz, MEMLAN_MODE_RO, seg);
}

/* Drop a spill segment (export or import) too big to keep until the next one. */
static void ml_spill_trim(memlan_segment_t **seg)
{
    if (*seg && memlan_segment_size(*seg) > ML_RPC_SPILL_KEEP) {
        memlan_segment_close(*seg);
        *seg = NULL;
    }
}

/* The bytes of the peer's spilled message described by sp (peer-written: every field is
 * checked), through *seg, the import kept from the last one; NULL if they cannot be had. */
static const void *ml_spill_map(memlan_segment_t **seg, const void *desc)
{
    struct ml_rpc_spill sp;
    memcpy(&sp, desc, sizeof sp);
    sp.token[MEMLAN_TOKEN_LEN] = 0;
    if (!*seg || strcmp(memlan_segment_token(*seg), sp.token) != 0) {
        if (*seg)
            memlan_segment_close(*seg);
        *seg = NULL;
        if (memlan_segment_import(ml_rpc_fab, sp.token, MEMLAN_MODE_RO, seg) < 0) {
            *seg = NULL;
            return NULL;
        }
    }
    return sp.len <= memlan_segment_size(*seg) ? memlan_segment_ptr(*seg) : NULL;
}

/* Write a spill descriptor for len bytes of seg at dst. */
static void ml_spill_desc(void *dst, const memlan_segment_t *seg, uint32_t len)
{
    struct ml_rpc_spill sp;
    memset(&sp, 0, sizeof sp);
    sp.len = len;
    snprintf(sp.token, sizeof sp.token, "%s", memlan_segment_token(seg));
    memcpy(dst, &sp, sizeof sp);
}

static int64_t ml_rpc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- client ----------------------------------------------------------------------------- */

struct ml_clnt {
    CLIENT cl;
    memlan_channel_t *ch;
    memlan_evq_t *q;           /* one channel: spin-then-sleep waits with a timeout */
    pthread_mutex_t mu;
    uint32_t xid;
    struct timeval wait;       /* CLSET_TIMEOUT; tv_sec < 0: use each call's */
    rpcprog_t prog;
    rpcvers_t vers;
    struct rpc_err err;
    memlan_segment_t *spill_out; /* our calls' spill segment */
    memlan_segment_t *spill_in;  /* the server's replies' spill segment, imported */
    int spill_busy;              /* the server may still read spill_out */
};

static const struct clnt_ops ml_clnt_ops;

int memlan_clnt_is_fast(const CLIENT *cl)
{
    return cl && cl->cl_ops == &ml_clnt_ops;
}

/* Wait for the reply to xid; *ptr/len: its bytes in the ring (release after decoding). */
static enum clnt_stat ml_clnt_wait(struct ml_clnt *c, uint32_t xid, const void **ptr,
                                   ssize_t *len, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : ml_rpc_now_ms() + timeout_ms;
    for (;;) {
        ssize_t n = memlan_peek(c->ch, ptr, MEMLAN_DONTWAIT);
        if (n >= (ssize_t)sizeof(struct ml_rpc_reply)) {
            struct ml_rpc_reply r;
            memcpy(&r, *ptr, sizeof r);
            if (r.xid == xid) {
                *len = n;
                return RPC_SUCCESS;
            }
            memlan_release(c->ch, (size_t)n); /* the late reply of a call that timed out */
            continue;
        }
        if (n >= 0) {
            if (n == 0 && (memlan_channel_poll(c->ch) & MEMLAN_EV_HUP)) {
                c->err.re_errno = ECONNRESET;
                return RPC_CANTRECV;
            }
            /* too short to be a reply (a zero-length message too): drop it, or the next
             * peek would return it again and this loop would never end */
            memlan_release(c->ch, (size_t)n);
            continue;
        }
        if (n != -EAGAIN) {
            c->err.re_errno = (int)-n;
            return RPC_CANTRECV;
        }
        int left = -1;
        if (deadline >= 0) {
            int64_t l = deadline - ml_rpc_now_ms();
            if (l <= 0)
                return RPC_TIMEDOUT;
            left = l > INT32_MAX ? INT32_MAX : (int)l;
        }
        struct memlan_event ev;
        int rc = memlan_evq_wait(c->q, &ev, 1, left);
        if (rc < 0 && rc != -EINTR) {
            c->err.re_errno = -rc;
            return RPC_CANTRECV;
        }
    }
}

static enum clnt_stat ml_clnt_call(CLIENT *cl, rpcproc_t proc, xdrproc_t xargs, void *argsp,
                                   xdrproc_t xres, void *resp, struct timeval tout)
{
    struct ml_clnt *c = (struct ml_clnt *)cl;
    pthread_mutex_lock(&c->mu);
    memset(&c->err, 0, sizeof c->err);
    if (c->wait.tv_sec >= 0)
        tout = c->wait;
    uint32_t xid = ++c->xid;

    /* the call, marshalled straight into the ring */
    struct opaque_auth cred = {AUTH_NONE, NULL, 0};
    if (cl->cl_auth)
        cred = cl->cl_auth->ah_cred;
    if (cred.oa_length > ML_RPC_CRED_MAX)
        cred.oa_length = ML_RPC_CRED_MAX;
    size_t hdr = sizeof(struct ml_rpc_call) + ML_PAD4(cred.oa_length);
    /* a message is reserved at its exact size: xdr_sizeof walks the arguments (lengths only) */
    unsigned long asize = xdr_sizeof(xargs, argsp);
    if ((asize == 0 && xargs != (xdrproc_t)(void (*)(void))xdr_void) || asize > UINT32_MAX) {
        c->err.re_status = RPC_CANTENCODEARGS;
        goto out;
    }
    int spill = hdr + asize > memlan_channel_max_msg(c->ch);
    XDR x;
    if (spill) {
        /* too big for the ring: encode into the spill segment, then post its descriptor.  A
         * segment whose last call timed out may still be read by the server: not reused. */
        if (c->spill_busy && c->spill_out) {
            memlan_segment_close(c->spill_out);
            c->spill_out = NULL;
        }
        int rc = ml_spill_get(&c->spill_out, asize);
        if (rc < 0) {
            c->err.re_errno = -rc;
            c->err.re_status = RPC_CANTSEND;
            goto out;
        }
        xdrmem_create(&x, memlan_segment_ptr(c->spill_out), (u_int)asize, XDR_ENCODE);
        if (!xargs(&x, argsp)) {
            c->err.re_status = RPC_CANTENCODEARGS;
            goto out;
        }
    }
    void *buf;
    size_t want = spill ? hdr + sizeof(struct ml_rpc_spill) : hdr + asize;
    /* Room in the ring, waited for no longer than the call's timeout (25 s for a batched call):
     * a server that does not read (stopped, hostile, or its indices spoiled) must not hold the
     * caller for ever, as it did in a blocking reserve.  The ring is full only when the server
     * is behind (batched calls): the sleeps start at 20 us and double up to 1 ms, so that a
     * stream of batched calls waits about as long as the server takes to make room. */
    long wait_ms = tout.tv_sec * 1000L + tout.tv_usec / 1000;
    int64_t until = ml_rpc_now_ms() + (wait_ms > 0 ? wait_ms : 25000);
    long nap_ns = 20000;
    ssize_t room;
    while ((room = memlan_reserve(c->ch, &buf, want, MEMLAN_DONTWAIT)) == -EAGAIN) {
        if (ml_rpc_now_ms() >= until) {
            c->err.re_status = RPC_TIMEDOUT;
            goto out;
        }
        struct timespec nap = {0, nap_ns};
        nanosleep(&nap, NULL);
        if (nap_ns < 1000000)
            nap_ns *= 2;
    }
    if (room < 0) {
        c->err.re_errno = (int)-room;
        c->err.re_status = room == -EMSGSIZE ? RPC_CANTENCODEARGS : RPC_CANTSEND;
        goto out;
    }
    struct ml_rpc_call h = {xid, (uint32_t)proc, (uint32_t)cred.oa_flavor,
                            cred.oa_length | (spill ? ML_RPC_SPILLED : 0)};
    memcpy(buf, &h, sizeof h);
    if (cred.oa_length) {
        memcpy((char *)buf + sizeof h, cred.oa_base, cred.oa_length);
        memset((char *)buf + sizeof h + cred.oa_length, 0, hdr - sizeof h - cred.oa_length);
    }
    size_t len;
    if (spill) {
        ml_spill_desc((char *)buf + hdr, c->spill_out, xdr_getpos(&x));
        XDR_DESTROY(&x);
        len = want;
    } else {
        xdrmem_create(&x, (char *)buf + hdr, (u_int)((size_t)room - hdr), XDR_ENCODE);
        if (!xargs(&x, argsp)) {
            /* nothing committed: the reservation is simply not used */
            c->err.re_status = RPC_CANTENCODEARGS;
            goto out;
        }
        len = hdr + xdr_getpos(&x);
        XDR_DESTROY(&x);
    }
    int rc = memlan_commit(c->ch, len);
    if (rc < 0) {
        c->err.re_errno = -rc;
        c->err.re_status = RPC_CANTSEND;
        goto out;
    }
    if (spill)
        c->spill_busy = 1;
    if (tout.tv_sec == 0 && tout.tv_usec == 0) { /* batched / one-way, as libtirpc */
        c->err.re_status = RPC_TIMEDOUT;
        goto out;
    }
    const void *rp;
    ssize_t rl = 0;
    long ms = tout.tv_sec * 1000L + tout.tv_usec / 1000;
    c->err.re_status = ml_clnt_wait(c, xid, &rp, &rl, ms > INT32_MAX ? INT32_MAX : (int)ms);
    if (c->err.re_status != RPC_SUCCESS)
        goto out;
    c->spill_busy = 0; /* a reply: the server is done with the arguments */
    ml_spill_trim(&c->spill_out);
    struct ml_rpc_reply r;
    memcpy(&r, rp, sizeof r);
    const char *res = (const char *)rp + sizeof r;
    size_t reslen = (size_t)rl - sizeof r;
    if (r.stat & ML_RPC_SPILLED) {
        r.stat &= ~ML_RPC_SPILLED;
        struct ml_rpc_spill sp = {0, {0}};
        memcpy(&sp, res, reslen >= sizeof sp ? sizeof sp : 0);
        res = reslen >= sizeof sp ? ml_spill_map(&c->spill_in, res) : NULL;
        reslen = sp.len;
    }
    if (!res) {
        c->err.re_status = RPC_CANTDECODERES; /* spilled results that cannot be mapped */
    } else if (r.stat == MSG_ACCEPTED) {
        switch (r.detail) {
        case SUCCESS: {
            xdrmem_create(&x, (char *)res, (u_int)reslen, XDR_DECODE);
            c->err.re_status = xres(&x, resp) ? RPC_SUCCESS : RPC_CANTDECODERES;
            XDR_DESTROY(&x);
            ml_spill_trim(&c->spill_in);
            break;
        }
        case PROG_UNAVAIL: c->err.re_status = RPC_PROGUNAVAIL; break;
        case PROG_MISMATCH:
            c->err.re_status = RPC_PROGVERSMISMATCH;
            c->err.re_vers.low = r.a;
            c->err.re_vers.high = r.b;
            break;
        case PROC_UNAVAIL: c->err.re_status = RPC_PROCUNAVAIL; break;
        case GARBAGE_ARGS: c->err.re_status = RPC_CANTDECODEARGS; break;
        case SYSTEM_ERR: c->err.re_status = RPC_SYSTEMERROR; break;
        default: c->err.re_status = RPC_FAILED; break;
        }
    } else if (r.stat == MSG_DENIED && r.detail == RPC_MISMATCH) {
        c->err.re_status = RPC_VERSMISMATCH;
        c->err.re_vers.low = r.a;
        c->err.re_vers.high = r.b;
    } else if (r.stat == MSG_DENIED && r.detail == AUTH_ERROR) {
        c->err.re_status = RPC_AUTHERROR;
        c->err.re_why = (enum auth_stat)r.a;
    } else {
        c->err.re_status = RPC_FAILED;
    }
    memlan_release(c->ch, (size_t)rl);
out:;
    enum clnt_stat st = c->err.re_status;
    pthread_mutex_unlock(&c->mu);
    return st;
}

static void ml_clnt_abort(CLIENT *cl)
{
    (void)cl;
}

static void ml_clnt_geterr(CLIENT *cl, struct rpc_err *e)
{
    *e = ((struct ml_clnt *)cl)->err;
}

static bool_t ml_clnt_freeres(CLIENT *cl, xdrproc_t xres, void *resp)
{
    (void)cl;
    xdr_free(xres, resp);
    return TRUE;
}

static void ml_clnt_destroy(CLIENT *cl)
{
    struct ml_clnt *c = (struct ml_clnt *)cl;
    memlan_evq_close(c->q);
    memlan_channel_close(c->ch);
    if (c->spill_out)
        memlan_segment_close(c->spill_out);
    if (c->spill_in)
        memlan_segment_close(c->spill_in);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static bool_t ml_clnt_control(CLIENT *cl, u_int req, void *info)
{
    struct ml_clnt *c = (struct ml_clnt *)cl;
    if (!info && req != CLSET_FD_CLOSE && req != CLSET_FD_NCLOSE)
        return FALSE;
    switch (req) {
    case CLSET_TIMEOUT: {
        const struct timeval *tv = info;
        if (tv->tv_sec < 0 || tv->tv_usec < 0 || tv->tv_usec >= 1000000)
            return FALSE;
        c->wait = *tv;
        return TRUE;
    }
    case CLGET_TIMEOUT:
        *(struct timeval *)info = c->wait.tv_sec >= 0 ? c->wait : (struct timeval){25, 0};
        return TRUE;
    case CLGET_XID:
        *(uint32_t *)info = c->xid;
        return TRUE;
    case CLSET_XID:
        c->xid = *(uint32_t *)info - 1;
        return TRUE;
    case CLGET_VERS:
        *(uint32_t *)info = (uint32_t)c->vers;
        return TRUE;
    case CLGET_PROG:
        *(uint32_t *)info = (uint32_t)c->prog;
        return TRUE;
    case CLSET_FD_CLOSE:
    case CLSET_FD_NCLOSE:
        return TRUE;
    default:
        return FALSE;
    }
}

static const struct clnt_ops ml_clnt_ops = {
    ml_clnt_call, ml_clnt_abort, ml_clnt_geterr, ml_clnt_freeres, ml_clnt_destroy,
    ml_clnt_control,
};

/* Is host this machine: a loopback name or address, or one of our interfaces' addresses? */
static int ml_rpc_host_is_local(const char *host)
{
    char me[256];
    if (!strcmp(host, "localhost") || (gethostname(me, sizeof me) == 0 && !strcmp(host, me)))
        return 1;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return 0;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        ifs = NULL;
    int local = 0;
    for (struct addrinfo *a = ai; a && !local; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            struct in_addr in = ((struct sockaddr_in *)a->ai_addr)->sin_addr;
            if ((ntohl(in.s_addr) >> 24) == 127)
                local = 1;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == in.s_addr)
                    local = 1;
        } else if (a->ai_family == AF_INET6) {
            struct in6_addr in6 = ((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            if (IN6_IS_ADDR_LOOPBACK(&in6))
                local = 1;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
                    !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &in6, sizeof in6))
                    local = 1;
        }
    }
    if (ifs)
        freeifaddrs(ifs);
    freeaddrinfo(ai);
    return local;
}

/*
 * Is the server at the other end of s one we may hand a channel to?  The kernel says who it is
 * (SO_PEERCRED); it must own the socket file it listens on (path), and be ourselves, root, the
 * fabric directory's owner, or the uid named by MEMLAN_RPC_SERVER_UID.  Anyone else who may
 * write the fabric directory could have unlinked the real server's socket and bound one of
 * its own, to take the client's calls.  On refusal, *why says who it was.
 */
static int ml_rpc_server_trusted(int s, const char *path, char *why, size_t whylen,
                                 uint32_t *server_uid)
{
    struct ucred pc;
    socklen_t pl = sizeof pc;
    struct stat sock, dir;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &pc, &pl) < 0 || pl != sizeof pc) {
        snprintf(why, whylen, "no SO_PEERCRED (%s)", strerror(errno));
        return 0;
    }
    if (lstat(path, &sock) < 0 || stat(memlan_fabric_path(ml_rpc_fab), &dir) < 0) {
        snprintf(why, whylen, "cannot stat the socket (%s)", strerror(errno));
        return 0;
    }
    if (sock.st_uid != pc.uid) {
        snprintf(why, whylen, "the server is uid %u, the socket's owner uid %u",
                 (unsigned)pc.uid, (unsigned)sock.st_uid);
        return 0;
    }
    *server_uid = (uint32_t)pc.uid;
    if (pc.uid == geteuid() || pc.uid == 0 || pc.uid == dir.st_uid || pc.uid == ml_rpc_server_uid)
        return 1;
    snprintf(why, whylen, "the server is uid %u (not us, root, the fabric's owner %u or "
             "MEMLAN_RPC_SERVER_UID)", (unsigned)pc.uid, (unsigned)dir.st_uid);
    return 0;
}

static CLIENT *ml_clnt_fast(const char *host, rpcprog_t prog, rpcvers_t vers)
{
    struct sockaddr_un sa;
    if (ml_rpc_sockpath(&sa, prog, vers) < 0) {
        ml_rpc_say("prog %lu vers %lu: fabric path too long for a socket",
                   (unsigned long)prog, (unsigned long)vers);
        return NULL;
    }
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return NULL;
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        if (errno == ECONNREFUSED)
            unlink(sa.sun_path); /* its server died without removing it: reclaim */
        ml_rpc_say("prog %lu vers %lu on %s: %s", (unsigned long)prog, (unsigned long)vers, host,
                   errno == ENOENT || errno == ECONNREFUSED
                       ? "no memlan server for it on this fabric"
                       : strerror(errno));
        close(s);
        return NULL;
    }
    char who[160];
    uint32_t su = 0;
    if (!ml_rpc_server_trusted(s, sa.sun_path, who, sizeof who, &su)) {
        ml_rpc_say("prog %lu vers %lu: socket not trusted, no channel handed over: %s",
                   (unsigned long)prog, (unsigned long)vers, who);
        close(s);
        return NULL;
    }
    struct ml_clnt *c = calloc(1, sizeof *c);
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = ml_rpc_ring};
    /* In a shared fabric the channel is private to its two ends: the server's user (by the
     * kernel, above) is granted it, nobody else of the group (channel.c). */
    struct ml_access acc = {0};
    if (su != 0 && su != (uint32_t)geteuid())
        acc = (struct ml_access){.n = 1, .uids = {su}};
    int rc = c ? __ml_chan_create_for(ml_rpc_fab, &o, &acc, &c->ch) : -ENOMEM;
    if (rc == 0 && (rc = memlan_evq_create(ml_rpc_fab, 1, &c->q)) == 0)
        rc = memlan_evq_add(c->q, c->ch, MEMLAN_EV_READ, c);
    if (rc < 0) {
        ml_rpc_say("prog %lu vers %lu: cannot make a channel: %s", (unsigned long)prog,
                   (unsigned long)vers, strerror(-rc));
        goto fail;
    }
    struct ml_rpc_hello h = {ML_RPC_MAGIC, (uint32_t)prog, (uint32_t)vers, 0, {0}};
    snprintf(h.token, sizeof h.token, "%s", memlan_channel_token(c->ch));
    uint32_t answer = 1;
    struct pollfd pf = {s, POLLIN, 0};
    if (send(s, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h || poll(&pf, 1, 2000) != 1 ||
        recv(s, &answer, sizeof answer, 0) != (ssize_t)sizeof answer || answer != 0) {
        ml_rpc_say("prog %lu vers %lu: the memlan server did not take the channel",
                   (unsigned long)prog, (unsigned long)vers);
        goto fail;
    }
    close(s);
    c->cl.cl_ops = (struct clnt_ops *)&ml_clnt_ops;
    c->cl.cl_auth = authnone_create();
    c->cl.cl_private = c;
    pthread_mutex_init(&c->mu, NULL);
    c->wait.tv_sec = -1;
    c->prog = prog;
    c->vers = vers;
    c->xid = (uint32_t)getpid() ^ (uint32_t)time(NULL) << 12;
    ml_rpc_why[0] = 0;
    if (ml_rpc_log)
        fprintf(stderr, "memlan-rpc: prog %lu vers %lu on %s: shared-memory fast path\n",
                (unsigned long)prog, (unsigned long)vers, host);
    return &c->cl;
fail:
    close(s);
    if (c) {
        if (c->q)
            memlan_evq_close(c->q);
        if (c->ch)
            memlan_channel_close(c->ch);
        free(c);
    }
    return NULL;
}

/* The fast path's CLIENT for (prog, vers) on host, or NULL with the reason in ml_rpc_why. */
static CLIENT *ml_clnt_try_fast(const char *host, rpcprog_t prog, rpcvers_t vers,
                                const char *nettype)
{
    pthread_once(&ml_rpc_once, ml_rpc_init);
    ml_rpc_why[0] = 0;
    const char *nt = nettype ? nettype : "netpath";
    int stream = !strcmp(nt, "tcp") || !strcmp(nt, "tcp6") || !strcmp(nt, "circuit_v") ||
                 !strcmp(nt, "circuit_n") || !strcmp(nt, "netpath") || !strcmp(nt, "visible");
    if (ml_rpc_off)
        ml_rpc_say("MEMLAN_RPC=off: plain ONC RPC");
    else if (!ml_rpc_fab)
        ml_rpc_say("no fabric: plain ONC RPC");
    else if (!host)
        ml_rpc_say("no host: plain ONC RPC");
    else if (!stream)
        ml_rpc_say("prog %lu vers %lu: nettype %s is a datagram transport: plain ONC RPC",
                   (unsigned long)prog, (unsigned long)vers, nt);
    else if (!ml_rpc_host_is_local(host))
        ml_rpc_say("prog %lu vers %lu: %s is not this host: plain ONC RPC", (unsigned long)prog,
                   (unsigned long)vers, host);
    else
        return ml_clnt_fast(host, prog, vers);
    return NULL;
}

CLIENT *memlan_clnt_create(const char *host, rpcprog_t prog, rpcvers_t vers, const char *nettype)
{
    CLIENT *cl = ml_clnt_try_fast(host, prog, vers, nettype);
    return cl ? cl : clnt_create(host, prog, vers, nettype);
}

CLIENT *memlan_clnt_create_timed(const char *host, rpcprog_t prog, rpcvers_t vers,
                                 const char *nettype, const struct timeval *tp)
{
    CLIENT *cl = ml_clnt_try_fast(host, prog, vers, nettype);
    return cl ? cl : clnt_create_timed(host, prog, vers, nettype, tp);
}

/* The highest version in [low, high] that a memlan server serves on the fabric, else libtirpc's
 * negotiation (which asks the server for its range with a null call). */
CLIENT *memlan_clnt_create_vers_timed(const char *host, rpcprog_t prog, rpcvers_t *vers_out,
                                      rpcvers_t low, rpcvers_t high, const char *nettype,
                                      const struct timeval *tp)
{
    char why[sizeof ml_rpc_why] = "";
    for (rpcvers_t v = high; v >= low && high - v < 64; v--) {
        CLIENT *cl = ml_clnt_try_fast(host, prog, v, nettype);
        if (cl) {
            if (vers_out)
                *vers_out = v;
            return cl;
        }
        if (!why[0])
            memcpy(why, ml_rpc_why, sizeof why); /* the reason for the version wanted most */
        if (v == 0)
            break;
    }
    memcpy(ml_rpc_why, why, sizeof why);
    return tp ? clnt_create_vers_timed(host, prog, vers_out, low, high, nettype, tp)
              : clnt_create_vers(host, prog, vers_out, low, high, nettype);
}

CLIENT *memlan_clnt_create_vers(const char *host, rpcprog_t prog, rpcvers_t *vers_out,
                                rpcvers_t low, rpcvers_t high, const char *nettype)
{
    return memlan_clnt_create_vers_timed(host, prog, vers_out, low, high, nettype, NULL);
}

/* ---- server ----------------------------------------------------------------------------- */

struct ml_prog {
    rpcprog_t prog;
    rpcvers_t vers;
    void (*dispatch)(struct svc_req *, SVCXPRT *);
    int lfd;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

struct ml_conn {
    SVCXPRT xprt;
    memlan_channel_t *ch;
    struct ml_prog *p;
    XDR args;
    uint32_t xid;
    struct authunix_parms unix_cred;
    int unix_cred_live;
    char cred_body[ML_RPC_CRED_MAX];
    struct ucred peer;           /* the client, by the kernel (SO_PEERCRED at its hello) */
    gid_t peer_groups[NGRPS];    /* its supplementary groups (SO_PEERGROUPS), ... */
    int peer_ngroups;            /* ... or -1 when the kernel cannot say */
    struct sockaddr_in caller;   /* svc_getcaller: 127.0.0.1, port by privilege (see below) */
    memlan_segment_t *spill_in;  /* the client's calls' spill segment, imported */
    memlan_segment_t *spill_out; /* our replies' spill segment */
    int reply_failed;            /* a reply could not be made or sent: the connection ends
                                  * after this call */
    char *parked;                /* a reply that found no room in the ring, encoded, waiting for
                                  * room (the connection's calls are not read meanwhile) */
    size_t parked_len;
    struct ml_conn *next;
};

static pthread_mutex_t ml_svc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ml_prog ml_progs[64];
static int ml_nprogs;
static memlan_evq_t *ml_svc_q;
static struct ml_conn *ml_conns;
static int ml_nconns;

static void ml_conn_close(struct ml_conn *c);

/* At exit: the fast path's socket files and event queue leave the fabric with the server. */
static void ml_svc_atexit(void)
{
    for (int i = 0; i < ml_nprogs; i++)
        if (ml_progs[i].lfd >= 0)
            unlink(ml_progs[i].path);
    while (ml_conns)
        ml_conn_close(ml_conns);
    if (ml_svc_q)
        memlan_evq_close(ml_svc_q);
    ml_svc_q = NULL;
}

static bool_t ml_x_recv(SVCXPRT *x, struct rpc_msg *m)
{
    (void)x;
    (void)m;
    return FALSE;
}

static enum xprt_stat ml_x_stat(SVCXPRT *x)
{
    (void)x;
    return XPRT_IDLE;
}

/*
 * Zero-copy loans of opaque arguments.  While the server thread decodes a call's arguments from
 * the ring (svc_getargs), variable-length opaque data (xdr_bytes, which the generated code
 * reaches through <memlan/rpc.h>) is not copied into a fresh allocation: the argument points at
 * the bytes in the ring, which stay put until the call returns and the message is released.
 * svc_freeargs gives the loan back (nothing to free).  Arguments spilled to a segment are
 * copied, because the client exports that segment read-only and a procedure may write into
 * its arguments.
 */
static __thread XDR *ml_loan_xdr;         /* the stream that may lend, during svc_getargs */
static __thread const char *ml_loan_base; /* the message's arguments, during dispatch */
static __thread size_t ml_loan_len;

bool_t memlan_xdr_bytes(XDR *xdrs, char **cpp, u_int *sizep, u_int maxsize)
{
    if (xdrs->x_op == XDR_DECODE && xdrs == ml_loan_xdr && *cpp == NULL) {
        u_int n;
        if (!xdr_u_int(xdrs, &n) || n > maxsize)
            return FALSE;
        *sizep = n;
        if (n == 0)
            return TRUE; /* as xdr_bytes: no buffer */
        u_int at = xdr_getpos(xdrs), padded = n + (-n & 3u);
        if (padded < n || (size_t)at + padded > ml_loan_len || !xdr_setpos(xdrs, at + padded))
            return FALSE;
        *cpp = (char *)ml_loan_base + at;
        return TRUE;
    }
    if (xdrs->x_op == XDR_FREE && *cpp && ml_loan_base && *cpp >= ml_loan_base &&
        *cpp < ml_loan_base + ml_loan_len) {
        *cpp = NULL; /* lent: nothing to free */
        return TRUE;
    }
    return xdr_bytes(xdrs, cpp, sizep, maxsize);
}

static bool_t ml_x_getargs(SVCXPRT *x, xdrproc_t xargs, void *argsp)
{
    struct ml_conn *c = x->xp_p1;
    ml_loan_xdr = ml_loan_base ? &c->args : NULL;
    bool_t ok = xargs(&c->args, argsp);
    ml_loan_xdr = NULL;
    return ok;
}

static bool_t ml_x_freeargs(SVCXPRT *x, xdrproc_t xargs, void *argsp)
{
    (void)x;
    xdr_free(xargs, argsp);
    return TRUE;
}

static bool_t ml_x_reply(SVCXPRT *x, struct rpc_msg *m)
{
    struct ml_conn *c = x->xp_p1;
    void *buf;
    if (c->reply_failed || c->parked)
        return FALSE; /* (the svcerr_systemerr a stub sends after a failed reply) */
    int ok_results = m->rm_reply.rp_stat == MSG_ACCEPTED && m->acpted_rply.ar_stat == SUCCESS;
    unsigned long rsize = 0;
    if (ok_results) {
        rsize = xdr_sizeof(m->acpted_rply.ar_results.proc, m->acpted_rply.ar_results.where);
        if (rsize == 0 && m->acpted_rply.ar_results.proc != (xdrproc_t)(void (*)(void))xdr_void)
            return FALSE; /* the results cannot be encoded */
    }
    if (rsize > UINT32_MAX)
        return FALSE;
    /* The client has read the previous reply (it sent this call after it), so the spill
     * segment is free; one left from a very large reply goes now. */
    ml_spill_trim(&c->spill_out);
    int spill = sizeof(struct ml_rpc_reply) + rsize > memlan_channel_max_msg(c->ch);
    XDR xr;
    if (spill) {
        if (ml_spill_get(&c->spill_out, rsize) < 0)
            return FALSE;
        xdrmem_create(&xr, memlan_segment_ptr(c->spill_out), (u_int)rsize, XDR_ENCODE);
        if (!m->acpted_rply.ar_results.proc(&xr, m->acpted_rply.ar_results.where))
            return FALSE;
    }
    size_t want = sizeof(struct ml_rpc_reply) + (spill ? sizeof(struct ml_rpc_spill) : rsize);
    /* Room for the reply, never waited for: a client that sends calls and does not read their
     * replies (batched calls, a slow, stopped or hostile client) must not hold the server, and
     * every other client, for any time.  Without room the reply is encoded aside and parked on
     * its connection, whose calls are not read until the client has made room for it
     * (ml_conn_flush); the others are served meanwhile. */
    ssize_t room = memlan_reserve(c->ch, &buf, want, MEMLAN_DONTWAIT);
    if (room == -EAGAIN) {
        if (!(c->parked = malloc(want))) {
            c->reply_failed = 1;
            return FALSE;
        }
        buf = c->parked;
        room = (ssize_t)want;
    } else if (room < 0) {
        c->reply_failed = 1;
        return FALSE;
    }
    struct ml_rpc_reply r = {c->xid, (uint32_t)m->rm_reply.rp_stat, 0, 0, 0};
    size_t len = sizeof r;
    if (m->rm_reply.rp_stat == MSG_ACCEPTED) {
        r.detail = (uint32_t)m->acpted_rply.ar_stat;
        if (m->acpted_rply.ar_stat == PROG_MISMATCH) {
            r.a = (uint32_t)m->acpted_rply.ar_vers.low;
            r.b = (uint32_t)m->acpted_rply.ar_vers.high;
        } else if (spill) {
            r.stat |= ML_RPC_SPILLED;
            ml_spill_desc((char *)buf + sizeof r, c->spill_out, xdr_getpos(&xr));
            XDR_DESTROY(&xr);
            len += sizeof(struct ml_rpc_spill);
        } else if (m->acpted_rply.ar_stat == SUCCESS) {
            xdrmem_create(&xr, (char *)buf + sizeof r, (u_int)((size_t)room - sizeof r),
                          XDR_ENCODE);
            xdrproc_t proc = m->acpted_rply.ar_results.proc;
            if (!proc(&xr, m->acpted_rply.ar_results.where)) {
                free(c->parked); /* unencodable: nothing committed, nothing parked */
                c->parked = NULL;
                return FALSE;
            }
            len += xdr_getpos(&xr);
            XDR_DESTROY(&xr);
        }
    } else {
        r.detail = (uint32_t)m->rjcted_rply.rj_stat;
        if (m->rjcted_rply.rj_stat == RPC_MISMATCH) {
            r.a = (uint32_t)m->rjcted_rply.rj_vers.low;
            r.b = (uint32_t)m->rjcted_rply.rj_vers.high;
        } else {
            r.a = (uint32_t)m->rjcted_rply.rj_why;
        }
    }
    memcpy(buf, &r, sizeof r);
    if (c->parked) {
        c->parked_len = len;
        return TRUE; /* sent as far as the stub can tell: ml_conn_flush delivers it */
    }
    if (memlan_commit(c->ch, len) == 0)
        return TRUE;
    c->reply_failed = 1;
    return FALSE;
}

/* A parked reply into the ring, once there is room: 1 when delivered (or none was parked), 0
 * while the ring is still full, -1 when the connection is broken.  The connection is in the
 * queue for room (MEMLAN_EV_WRITE) only while a reply is parked: a send-ready event per reply
 * read would wake the server for every call of every client. */
static int ml_conn_flush(struct ml_conn *c)
{
    if (!c->parked)
        return 1;
    void *buf;
    ssize_t room = memlan_reserve(c->ch, &buf, c->parked_len, MEMLAN_DONTWAIT);
    if (room == -EAGAIN) /* a client gone with its ring full: the end, not a wait */
        return (memlan_channel_poll(c->ch) & (MEMLAN_EV_HUP | MEMLAN_EV_ERR)) ? -1 : 0;
    if (room < 0)
        return -1;
    memcpy(buf, c->parked, c->parked_len);
    free(c->parked);
    c->parked = NULL;
    if (memlan_commit(c->ch, c->parked_len) < 0)
        return -1;
    memlan_evq_del(ml_svc_q, c->ch);
    return memlan_evq_add(ml_svc_q, c->ch, MEMLAN_EV_READ, c) < 0 ? -1 : 1;
}

static void ml_x_destroy(SVCXPRT *x)
{
    (void)x; /* connections end in ml_conn_close */
}

static const struct xp_ops ml_x_ops = {ml_x_recv, ml_x_stat, ml_x_getargs, ml_x_reply,
                                       ml_x_freeargs, ml_x_destroy};

static bool_t ml_x_control(SVCXPRT *x, const u_int rq, void *in)
{
    (void)x;
    (void)rq;
    (void)in;
    return FALSE;
}

static const struct xp_ops2 ml_x_ops2 = {ml_x_control};

static void ml_conn_close(struct ml_conn *c)
{
    /* Off the list and out of the queue first: a server whose SIGTERM handler calls exit()
     * runs ml_svc_atexit() on top of this call, and must not close this connection again. */
    for (struct ml_conn **pp = &ml_conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    ml_nconns--;
    memlan_evq_del(ml_svc_q, c->ch);
    memlan_channel_close(c->ch);
    free(c->parked);
    if (c->spill_in)
        memlan_segment_close(c->spill_in);
    if (c->spill_out)
        memlan_segment_close(c->spill_out);
    free(c);
}

/* Does a client's AUTH_SYS credential agree with what the kernel says of it (SO_PEERCRED at its
 * hello)?  A root client may speak for anyone, as it may over TCP from a reserved port; any
 * other must give its own uid and gid, and only groups it is in. */
static int ml_cred_agrees(const struct ml_conn *c, const struct authunix_parms *a)
{
    if (c->peer.uid == 0)
        return 1;
    if (a->aup_uid != c->peer.uid || a->aup_gid != c->peer.gid)
        return 0;
    for (u_int i = 0; i < a->aup_len; i++) {
        int in = a->aup_gids[i] == c->peer.gid;
        for (int j = 0; !in && j < c->peer_ngroups && j < NGRPS; j++)
            in = a->aup_gids[i] == c->peer_groups[j];
        if (!in)
            return 0;
    }
    return 1;
}

/* Serve one message; 1 if one was served, 0 if none waiting, -1 if the connection ended. */
static int ml_conn_serve_one(struct ml_conn *c)
{
    const void *msg;
    int f = ml_conn_flush(c); /* a parked reply first: no call is read before it is out */
    if (f <= 0)
        return f;
    ssize_t n = memlan_peek(c->ch, &msg, MEMLAN_DONTWAIT);
    if (n == -EAGAIN)
        return 0;
    if (n < 0 || (n == 0 && (memlan_channel_poll(c->ch) & MEMLAN_EV_HUP)))
        return -1;
    struct ml_rpc_call h;
    if ((size_t)n < sizeof h) {
        memlan_release(c->ch, (size_t)n);
        return -1; /* not our protocol: end the connection */
    }
    memcpy(&h, msg, sizeof h);
    int spill = (h.cred_len & ML_RPC_SPILLED) != 0;
    h.cred_len &= ~ML_RPC_SPILLED;
    size_t off = sizeof h + ML_PAD4((size_t)h.cred_len);
    if (h.cred_len > ML_RPC_CRED_MAX || off > (size_t)n ||
        (spill && off + sizeof(struct ml_rpc_spill) > (size_t)n)) {
        memlan_release(c->ch, (size_t)n);
        return -1;
    }
    struct svc_req rq;
    memset(&rq, 0, sizeof rq);
    rq.rq_prog = (u_int32_t)c->p->prog;
    rq.rq_vers = (u_int32_t)c->p->vers;
    rq.rq_proc = h.proc;
    rq.rq_xprt = &c->xprt;
    rq.rq_cred.oa_flavor = (enum_t)h.cred_flavor;
    rq.rq_cred.oa_length = h.cred_len;
    memcpy(c->cred_body, (const char *)msg + sizeof h, h.cred_len);
    rq.rq_cred.oa_base = c->cred_body;
    c->xid = h.xid;
    c->xprt.xp_verf = _null_auth;
    int ok = 1;
    if (h.cred_flavor == AUTH_SYS) {
        XDR xc;
        if (c->unix_cred_live)
            xdr_free((xdrproc_t)xdr_authunix_parms, (char *)&c->unix_cred);
        memset(&c->unix_cred, 0, sizeof c->unix_cred);
        xdrmem_create(&xc, c->cred_body, h.cred_len, XDR_DECODE);
        ok = xdr_authunix_parms(&xc, &c->unix_cred);
        c->unix_cred_live = ok;
        if (ok && !ml_cred_agrees(c, &c->unix_cred))
            ok = 0; /* AUTH_SYS that the kernel's SO_PEERCRED contradicts: AUTH_BADCRED */
        rq.rq_clntcred = &c->unix_cred;
    } else if (h.cred_flavor != AUTH_NONE) {
        ok = 0;
    }
    const char *args = (const char *)msg + off;
    size_t alen = (size_t)n - off;
    if (ok && spill) {
        struct ml_rpc_spill sp;
        memcpy(&sp, args, sizeof sp);
        alen = sp.len;
        args = ml_spill_map(&c->spill_in, args);
    }
    if (!ok) {
        svcerr_auth(&c->xprt, h.cred_flavor == AUTH_SYS ? AUTH_BADCRED : AUTH_REJECTEDCRED);
    } else if (!args) {
        svcerr_systemerr(&c->xprt); /* the spilled arguments cannot be mapped */
    } else {
        xdrmem_create(&c->args, (char *)args, (u_int)alen, XDR_DECODE);
        if (!spill && !ml_rpc_noloan) {
            ml_loan_base = args;
            ml_loan_len = alen;
        }
        c->p->dispatch(&rq, &c->xprt);
        ml_loan_base = NULL;
        ml_loan_len = 0;
        ml_spill_trim(&c->spill_in);
    }
    memlan_release(c->ch, (size_t)n);
    if (c->reply_failed)
        return -1;
    if (c->parked) { /* told when the client makes room (an event at once if it has already) */
        memlan_evq_del(ml_svc_q, c->ch);
        if (memlan_evq_add(ml_svc_q, c->ch, MEMLAN_EV_READ | MEMLAN_EV_WRITE, c) < 0)
            return -1;
    }
    return 1;
}

/* Serve what is waiting on every ready channel; returns how many calls were served. */
static int ml_svc_fast(int timeout_ms)
{
    struct memlan_event ev[64];
    int n = memlan_evq_wait(ml_svc_q, ev, 64, timeout_ms), served = 0;
    for (int i = 0; i < n; i++) {
        struct ml_conn *c = ev[i].udata;
        int r;
        while ((r = ml_conn_serve_one(c)) > 0)
            served++;
        if (r < 0)
            ml_conn_close(c);
    }
    return served;
}

/* A fast-path connection whose hello has not come yet: the server goes on serving meanwhile,
 * so a client that connects and says nothing holds no one up (it is dropped after a second). */
struct ml_pending {
    int fd;
    struct ml_prog *p;
    uint64_t deadline_ns;
};
#define ML_PENDING_MAX 64
#define ML_HELLO_WAIT_NS 1000000000ull
static struct ml_pending ml_pending[ML_PENDING_MAX];
static int ml_npending;

/* Read the hello on s and answer it: attach the client's channel and serve it. */
static void ml_svc_hello(struct ml_prog *p, int s)
{
    struct ml_rpc_hello h;
    uint32_t answer = EPROTO;
    struct ml_conn *c = NULL;
    struct ucred peer;
    socklen_t pl = sizeof peer;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &peer, &pl) < 0 || pl != sizeof peer)
        goto out; /* who the caller is decides AUTH_SYS and svc_getcaller: no guessing */
    if (recv(s, &h, sizeof h, MSG_DONTWAIT) != (ssize_t)sizeof h || h.magic != ML_RPC_MAGIC ||
        h.prog != p->prog || h.vers != p->vers)
        goto out;
    h.token[MEMLAN_TOKEN_LEN] = 0;
    c = calloc(1, sizeof *c);
    if (!c)
        goto out;
    int rc = memlan_channel_attach(ml_rpc_fab, h.token, &c->ch);
    if (rc == 0 && (rc = memlan_evq_add(ml_svc_q, c->ch, MEMLAN_EV_READ, c)) < 0)
        memlan_channel_close(c->ch);
    if (rc < 0) {
        answer = (uint32_t)-rc;
        free(c);
        c = NULL;
        goto out;
    }
    c->p = p;
    c->xprt.xp_fd = -1;
    c->xprt.xp_ops = &ml_x_ops;
    c->xprt.xp_ops2 = &ml_x_ops2;
    c->xprt.xp_p1 = c;
    c->xprt.xp_netid = "memlan";
    c->xprt.xp_verf = _null_auth;
    c->peer = peer;
    c->peer_ngroups = -1;
    socklen_t gl = sizeof c->peer_groups;
    if (getsockopt(s, SOL_SOCKET, SO_PEERGROUPS, c->peer_groups, &gl) == 0)
        c->peer_ngroups = (int)(gl / sizeof(gid_t));
    /* svc_getcaller: the caller is local, on 127.0.0.1.  Its port says what a TCP caller's
     * port would: a reserved one (1023) only when the kernel says the caller is root (root's
     * libtirpc clients bind a reserved port), else 65535, which reserved-port checks refuse.
     * It used to be port 0, which such checks took for a privileged caller. */
    c->caller.sin_family = AF_INET;
    c->caller.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->caller.sin_port = htons(peer.uid == 0 ? 1023 : 65535);
    c->xprt.xp_rtaddr.buf = &c->caller;
    c->xprt.xp_rtaddr.len = c->xprt.xp_rtaddr.maxlen = sizeof c->caller;
    memcpy(&c->xprt.xp_raddr, &c->caller, sizeof c->caller);
    c->xprt.xp_addrlen = sizeof c->caller;
    c->next = ml_conns;
    ml_conns = c;
    ml_nconns++;
    answer = 0;
out:
    send(s, &answer, sizeof answer, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(s);
}

static void ml_svc_accept(struct ml_prog *p)
{
    int s = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0)
        return;
    struct pollfd pf = {s, POLLIN, 0};
    if (poll(&pf, 1, 0) == 1 || ml_npending == ML_PENDING_MAX) {
        ml_svc_hello(p, s); /* here already (the usual case), or no room to wait: answer now */
        return;
    }
    ml_pending[ml_npending++] = (struct ml_pending){s, p, __ml_now_ns() + ML_HELLO_WAIT_NS};
}

/* Pending hellos: answer those that came (revents, in the order of ml_pending), drop those
 * whose second is up.  Returns the milliseconds until the next deadline, or -1 if none. */
static int ml_svc_pending(const struct pollfd *pf)
{
    if (!ml_npending)
        return -1; /* the usual case, on every turn of the server's loop: no clock read */
    uint64_t now = __ml_now_ns();
    int j = 0, next = -1;
    for (int i = 0; i < ml_npending; i++) {
        struct ml_pending pd = ml_pending[i];
        if (pf && pf[i].revents) {
            ml_svc_hello(pd.p, pd.fd);
        } else if (now >= pd.deadline_ns) {
            ml_svc_hello(pd.p, pd.fd); /* reads nothing: answers EPROTO and closes */
        } else {
            int ms = (int)((pd.deadline_ns - now + 999999) / 1000000);
            if (next < 0 || ms < next)
                next = ms;
            ml_pending[j++] = pd;
        }
    }
    ml_npending = j;
    return next;
}

bool_t memlan_svc_register(SVCXPRT *xprt, rpcprog_t prog, rpcvers_t vers,
                           void (*dispatch)(struct svc_req *, SVCXPRT *), int protocol)
{
    if (!svc_register(xprt, prog, vers, dispatch, protocol))
        return FALSE;
    pthread_once(&ml_rpc_once, ml_rpc_init);
    if (ml_rpc_off || !ml_rpc_fab)
        return TRUE;
    pthread_mutex_lock(&ml_svc_mu);
    for (int i = 0; i < ml_nprogs; i++)
        if (ml_progs[i].prog == prog && ml_progs[i].vers == vers)
            goto done; /* a second transport for the same program: one fast path */
    if (ml_nprogs == (int)(sizeof ml_progs / sizeof ml_progs[0])) {
        ml_rpc_say("prog %lu vers %lu: too many programs for the fast path", (unsigned long)prog,
                   (unsigned long)vers);
        goto done;
    }
    if (!ml_svc_q) {
        int rc = memlan_evq_create(ml_rpc_fab, 4096, &ml_svc_q);
        if (rc < 0) {
            ml_rpc_say("no event queue (%s): plain ONC RPC only", strerror(-rc));
            goto done;
        }
        atexit(ml_svc_atexit);
    }
    struct ml_prog *p = &ml_progs[ml_nprogs];
    struct sockaddr_un sa;
    if (ml_rpc_sockpath(&sa, prog, vers) < 0)
        goto done;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        goto done;
    /* Like pmap_unset: the newest server of (prog, vers) takes the socket over, but only from
     * its own user: a socket of another user's server is left alone (that server keeps its
     * clients, and ours go through rpcbind), and so is anything that is not a socket. */
    struct stat st;
    if (lstat(sa.sun_path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
            ml_rpc_say("prog %lu vers %lu: %s belongs to uid %u%s: not replaced, no fast path",
                       (unsigned long)prog, (unsigned long)vers, sa.sun_path,
                       (unsigned)st.st_uid, S_ISSOCK(st.st_mode) ? "" : " and is no socket");
            close(s);
            goto done;
        }
        unlink(sa.sun_path);
    }
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(s, 128) < 0) {
        ml_rpc_say("prog %lu vers %lu: cannot listen on %s: %s", (unsigned long)prog,
                   (unsigned long)vers, sa.sun_path, strerror(errno));
        close(s);
        goto done;
    }
    p->prog = prog;
    p->vers = vers;
    p->dispatch = dispatch;
    p->lfd = s;
    snprintf(p->path, sizeof p->path, "%s", sa.sun_path);
    ml_nprogs++;
    if (ml_rpc_log)
        fprintf(stderr, "memlan-rpc: prog %lu vers %lu: fast path at %s\n", (unsigned long)prog,
                (unsigned long)vers, sa.sun_path);
done:
    pthread_mutex_unlock(&ml_svc_mu);
    return TRUE;
}

/* memlan_svc_run's spin (__ml_spin_run): serve the calls that came, and go on spinning while
 * they keep coming; every 16 rounds see whether a procedure called svc_exit(), and every
 * millisecond give the kernel fds (TCP clients, new connections) a look. */
struct ml_svc_spin {
    struct pollfd *pf;
    nfds_t nk;
    uint64_t kpoll;
    int n;                    /* what that look at the kernel fds said */
};

static int ml_svc_spin_look(struct ml_spinning *s, void *a)
{
    if (ml_svc_fast(0) > 0)
        ml_spin_found(s, __ml_now_ns());
    return 0;
}

static int ml_svc_spin_tick(struct ml_spinning *s, void *a)
{
    struct ml_svc_spin *w = a;
    if (svc_max_pollfd == 0 && svc_pollfd == NULL)
        return 1; /* a procedure called svc_exit() */
    uint64_t now = __ml_now_ns();
    if (now - w->kpoll >= 1000000u) {
        w->kpoll = now;
        if ((w->n = poll(w->pf, w->nk, 0)) > 0)
            return 1;
        s->budget = __ml_evq_spin_budget(ml_svc_q);
    }
    return 0;
}

void memlan_svc_run(void)
{
    struct pollfd *pf = NULL;
    int cap = 0;
    if (!ml_nprogs) {
        svc_run();
        return;
    }
    for (;;) {
        int nsvc = svc_max_pollfd;
        if (nsvc == 0 && svc_pollfd == NULL)
            break; /* svc_exit() */
        int hello_ms = ml_svc_pending(NULL); /* drops hellos that never came */
        int need = nsvc + ml_nprogs + ml_npending + 1;
        if (need > cap) {
            struct pollfd *g = realloc(pf, sizeof *pf * (size_t)need);
            if (!g) {
                free(pf);
                return;
            }
            pf = g;
            cap = need;
        }
        for (int i = 0; i < nsvc; i++) {
            pf[i].fd = svc_pollfd[i].fd;
            pf[i].events = svc_pollfd[i].events;
            pf[i].revents = 0;
        }
        for (int i = 0; i < ml_nprogs; i++)
            pf[nsvc + i] = (struct pollfd){ml_progs[i].lfd, POLLIN, 0};
        struct pollfd *hello = pf + nsvc + ml_nprogs;
        for (int i = 0; i < ml_npending; i++)
            hello[i] = (struct pollfd){ml_pending[i].fd, POLLIN, 0};
        pf[need - 1] = (struct pollfd){memlan_evq_fd(ml_svc_q), POLLIN, 0};
        /* Spin over the channels for about a wake-up's cost before sleeping in poll, by the
         * event queue's policy: not when the last client to post ran on this cpu (the spin would
         * only hold the core it needs), shorter after spins that found nothing.  While calls
         * keep coming the spin goes on, with a look at the kernel fds (TCP clients, new
         * connections) every millisecond so that they are not starved. */
        struct ml_svc_spin w = {.pf = pf, .nk = (nfds_t)(need - 1), .kpoll = __ml_now_ns()};
        struct ml_spinning spin = {.sp = __ml_evq_spin(ml_svc_q),
                                   .budget = ml_nconns ? __ml_evq_spin_budget(ml_svc_q) : 0,
                                   .every = 16, .look = ml_svc_spin_look,
                                   .tick = ml_svc_spin_tick, .arg = &w};
        (void)__ml_spin_run(&spin);
        int n = w.n;
        if (svc_max_pollfd == 0 && svc_pollfd == NULL)
            break; /* svc_exit() while we spun */
        if (n <= 0) {
            int armed = memlan_evq_arm(ml_svc_q) == 0;
            n = poll(pf, (nfds_t)need, armed ? hello_ms : 0);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "memlan_svc_run: poll: %s\n", strerror(errno));
            break;
        }
        int nk = 0;
        for (int i = 0; i < nsvc; i++)
            nk += pf[i].revents != 0;
        if (nk)
            svc_getreq_poll(pf, nk);
        if (ml_npending)
            ml_svc_pending(hello); /* before any accept below adds to the list */
        for (int i = 0; i < ml_nprogs; i++)
            if (pf[nsvc + i].revents)
                ml_svc_accept(&ml_progs[i]);
        ml_svc_fast(0);
    }
    free(pf);
}
