/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * rpcfuzz.c - a hostile fast-path client for echo.x's server: it connects to the server's
 * rpc-PROG-VERS.sock as memlan_clnt_create does, hands over a channel, and then writes mutated
 * call messages straight into the ring (header, credential, arguments and spill descriptors
 * with flipped bits, odd lengths, foreign flavors, truncations).  The server must answer each
 * (GARBAGE_ARGS, an auth error, anything) or drop the connection, and never crash or stall: a
 * message that gets neither a reply nor a hang-up within 5 seconds is a hang.  At the end a
 * clean ECHO must still come back right.
 *
 * Usage: rpcfuzz SEED RUNS SECONDS  (stops at RUNS messages or SECONDS, whichever is first)
 * Prints "N runs: R replies, D drops, H hangs" and exits 0 when H is 0 and the server lives.
 * Built with echo_xdr.c (for the seeds' XDR) and -lmemlan -ltirpc; see tests/py/test_rpc.py.
 */
#define MEMLAN_RPC_PLAIN
#include "echo.h"
#include "memlan.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x6d6c7232u
#define SPILLED 0x80000000u

struct hello {
    uint32_t magic, prog, vers, pad;
    char token[MEMLAN_TOKEN_LEN + 1];
};
struct call {
    uint32_t xid, proc, cred_flavor, cred_len;
};

static uint64_t rng;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static memlan_fabric_t *fab;

static memlan_channel_t *connect_server(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/rpc-%lu-%lu.sock", memlan_fabric_path(fab),
             (unsigned long)ECHOPROG, (unsigned long)ECHOVERS);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("connect");
        exit(2);
    }
    memlan_channel_t *ch;
    struct memlan_channel_opts o = {.kind = MEMLAN_MSG, .ring_size = 256 << 10};
    if (memlan_channel_create(fab, &o, &ch) < 0) {
        fprintf(stderr, "no channel\n");
        exit(2);
    }
    struct hello h = {MAGIC, ECHOPROG, ECHOVERS, 0, {0}};
    snprintf(h.token, sizeof h.token, "%s", memlan_channel_token(ch));
    uint32_t answer = 1;
    struct pollfd pf = {s, POLLIN, 0};
    if (send(s, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h || poll(&pf, 1, 5000) != 1 ||
        recv(s, &answer, sizeof answer, 0) != (ssize_t)sizeof answer || answer != 0) {
        fprintf(stderr, "the server did not take the channel\n");
        exit(2);
    }
    close(s);
    return ch;
}

/* A valid call of a random kind into buf; returns its length. */
static size_t seed(char *buf, size_t cap, uint32_t xid)
{
    struct call h = {xid, 0, AUTH_NONE, 0};
    size_t off = sizeof h;
    XDR x;
    int kind = (int)(rnd() % 5);
    if (kind == 4) { /* WHOAMI with AUTH_SYS */
        gid_t g[3] = {0, 1, 2};
        struct authunix_parms a = {1234, "fuzz", (uid_t)rnd() % 3, 0, 3, g};
        xdrmem_create(&x, buf + off, 400, XDR_ENCODE);
        xdr_authunix_parms(&x, &a);
        h.cred_flavor = AUTH_SYS;
        h.cred_len = xdr_getpos(&x);
        off += (h.cred_len + 3) & ~3u;
    }
    xdrmem_create(&x, buf + off, (u_int)(cap - off), XDR_ENCODE);
    char bytes[300];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (char)rnd();
    if (kind == 1) {
        h.proc = ECHO;
        data d = {rnd() % 300, bytes};
        xdr_data(&x, &d);
    } else if (kind == 2) {
        h.proc = MIX;
        point op = {7, 8};
        u_int v[3] = {1, 2, 3};
        pair p = {1, 2, 3.0, 4.0f, 1, SQUARE, {5, 6}, rnd() % 2 ? &op : NULL, "a name",
                  {1, 2, 3}, {rnd() % 4, v}, {1, 2, 3, 4, 5}};
        xdr_pair(&x, &p);
    } else if (kind == 3) {
        h.proc = FAIL;
        int i = (int)rnd();
        xdr_int(&x, &i);
    } else if (kind == 4) {
        h.proc = WHOAMI;
    }
    off += xdr_getpos(&x);
    memcpy(buf, &h, sizeof h);
    return off;
}

static const uint32_t interesting[] = {0, 1, 3, 4, 0x7f, 0xff, 0x100, 0x7fff, 0xffff, 0x10000,
                                       400, 401, 0x7fffffff, 0x80000000, 0x80000001,
                                       0xfffffffc, 0xfffffffe, 0xffffffff};

static size_t mutate(char *buf, size_t len, size_t cap)
{
    int n = 1 + (int)(rnd() % 4);
    for (int k = 0; k < n; k++) {
        switch (rnd() % 6) {
        case 0: /* flip a bit */
            if (len)
                buf[rnd() % len] ^= (char)(1u << (rnd() % 8));
            break;
        case 1: /* an interesting word at an aligned offset */
            if (len >= 4) {
                uint32_t v = interesting[rnd() % (sizeof interesting / sizeof *interesting)];
                if (rnd() % 2)
                    v = htonl(v);
                memcpy(buf + (rnd() % (len / 4)) * 4, &v, 4);
            }
            break;
        case 2: /* truncate */
            len = len ? rnd() % len : 0;
            break;
        case 3: /* random bytes appended */
        {
            size_t add = rnd() % 64;
            if (len + add > cap)
                add = cap - len;
            for (size_t i = 0; i < add; i++)
                buf[len + i] = (char)rnd();
            len += add;
            break;
        }
        case 4: /* the header's credential length, spilled or not */
            if (len >= 16) {
                uint32_t v = rnd() % 2 ? rnd() % 512 : rnd();
                if (rnd() % 3 == 0)
                    v |= SPILLED;
                memcpy(buf + 12, &v, 4);
            }
            break;
        case 5: /* the flavor */
            if (len >= 16) {
                uint32_t v = rnd() % 8;
                memcpy(buf + 8, &v, 4);
            }
            break;
        }
    }
    if (len >= 8) { /* never SLOW (it sleeps as long as asked, or calls svc_exit) */
        uint32_t proc;
        memcpy(&proc, buf + 4, 4);
        if (proc == SLOW) {
            proc = 99;
            memcpy(buf + 4, &proc, 4);
        }
    }
    return len;
}

/* Post len bytes of buf and wait for the reply: 1 a reply, 0 the connection ended, -1 hang. */
static int post(memlan_channel_t *ch, const char *buf, size_t len, const void **rep,
                ssize_t *rlen)
{
    void *w;
    ssize_t room = memlan_reserve(ch, &w, len, 0);
    if (room < 0)
        return (memlan_channel_poll(ch) & MEMLAN_EV_HUP) ? 0 : -1;
    memcpy(w, buf, len);
    if (memlan_commit(ch, len) < 0)
        return 0;
    int64_t deadline = now_ms() + 5000;
    for (int i = 0; now_ms() < deadline; i++) {
        ssize_t n = memlan_peek(ch, rep, MEMLAN_DONTWAIT);
        if (n > 0) {
            *rlen = n;
            return 1;
        }
        if (n == 0 || (n < 0 && n != -EAGAIN)) {
            if (n != 0 || (memlan_channel_poll(ch) & MEMLAN_EV_HUP))
                return 0;
            memlan_release(ch, 0);
        }
        if (memlan_channel_poll(ch) & MEMLAN_EV_HUP)
            return 0;
        if (i > 1000)
            usleep(200);
    }
    return -1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s SEED RUNS SECONDS\n", argv[0]);
        return 2;
    }
    rng = strtoull(argv[1], NULL, 0) * 2654435761u + 88172645463325252ull;
    long runs = atol(argv[2]);
    int64_t until = now_ms() + atol(argv[3]) * 1000;
    if (memlan_fabric_open(NULL, &fab) < 0) {
        fprintf(stderr, "no fabric\n");
        return 2;
    }
    static char buf[8192];
    memlan_channel_t *ch = connect_server();
    long n = 0, replies = 0, drops = 0, hangs = 0;
    for (; n < runs && now_ms() < until && hangs == 0; n++) {
        size_t len = seed(buf, sizeof buf - 64, (uint32_t)n);
        if (rnd() % 8)
            len = mutate(buf, len, sizeof buf);
        const void *rep;
        ssize_t rl;
        int r = post(ch, buf, len, &rep, &rl);
        if (r > 0) {
            replies++;
            memlan_release(ch, (size_t)rl);
        } else if (r == 0) {
            drops++;
            memlan_channel_close(ch);
            ch = connect_server();
        } else {
            hangs++;
            fprintf(stderr, "hang after message %ld (%zu bytes)\n", n, len);
        }
    }
    /* the server still serves: a clean ECHO of 100 bytes comes back right */
    struct call h = {0xabcdef, ECHO, AUTH_NONE, 0};
    memcpy(buf, &h, sizeof h);
    char bytes[100];
    memset(bytes, 0x5a, sizeof bytes);
    data d = {sizeof bytes, bytes};
    XDR x;
    xdrmem_create(&x, buf + sizeof h, 4096, XDR_ENCODE);
    xdr_data(&x, &d);
    const void *rep;
    ssize_t rl;
    int ok = post(ch, buf, sizeof h + xdr_getpos(&x), &rep, &rl) == 1 &&
             rl == 20 + 4 + 100 && !memcmp((const char *)rep + 24, bytes, 100);
    printf("%ld runs: %ld replies, %ld drops, %ld hangs; server %s\n", n, replies, drops, hangs,
           ok ? "alive" : "NOT ANSWERING");
    memlan_channel_close(ch);
    memlan_fabric_close(fab);
    return hangs == 0 && ok ? 0 : 1;
}
