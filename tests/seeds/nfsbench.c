/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* nfsbench - an NFSv3 client in the shape of Olaf Kirch's nfsbench (the ORL paper's Table 1),
 * every reply checked.  Plain C over libnfs (and, for the NULL calls, raw ONC RPC over a socket).
 *
 *   nfsbench SERVER EXPORT NFSPORT SECONDS TEST...
 *
 * TEST is one of:
 *   null     NULL calls with a 1 KB payload, one in flight: round trip median, p99, mean
 *   storm    NULL calls with a 1 KB payload, 16 in flight: calls/s and mean round trip
 *   write    a 4 MB file written in 4 KB transfers (one in flight), over and over
 *   read     the same file read back in 4 KB transfers, every byte checked
 *   pebbles  a mix of operations on a tree of small files (the percentages are in MIX below)
 * Each test runs for SECONDS, but at least once through (a 4 MB file, 200 calls, 500 ops): with
 * SECONDS 0 it is a data check.  Each prints one line of figures; "ok" last; a wrong byte or a
 * failed call prints "MISMATCH ..." or "FAIL ..." and exits 1. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <nfsc/libnfs.h>

#define BLK 4096
#define FILE_SZ (4 << 20)
#define PAYLOAD 1024

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define FAIL(...) do { printf("FAIL " __VA_ARGS__); printf("\n"); exit(1); } while (0)

/* ---- NULL over raw ONC RPC (record marking, AUTH_NONE), with an opaque 1 KB tail ---------- */

static int rpc_fd = -1;

static void rpc_connect(const char *server, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, server, &a.sin_addr) != 1) FAIL("bad address %s", server);
    rpc_fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(rpc_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(rpc_fd, (struct sockaddr *)&a, sizeof a) != 0) FAIL("connect %s:%d: %s", server, port, strerror(errno));
}

static void put32(unsigned char *p, uint32_t v) { v = htonl(v); memcpy(p, &v, 4); }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return ntohl(v); }

static void full_write(const unsigned char *b, size_t n)
{
    while (n) {
        ssize_t w = write(rpc_fd, b, n);
        if (w <= 0) FAIL("rpc write: %s", w ? strerror(errno) : "closed");
        b += w, n -= (size_t)w;
    }
}

static void full_read(unsigned char *b, size_t n)
{
    while (n) {
        ssize_t r = read(rpc_fd, b, n);
        if (r <= 0) FAIL("rpc read: %s", r ? strerror(errno) : "closed");
        b += r, n -= (size_t)r;
    }
}

static void null_send(uint32_t xid)
{
    unsigned char m[4 + 40 + PAYLOAD];
    uint32_t h[] = {xid, 0, 2, 100003, 3, 0, 0, 0, 0, 0}; /* CALL rpcvers prog vers NULL cred verf */
    put32(m, 0x80000000u | (uint32_t)(sizeof m - 4));
    for (int i = 0; i < 10; i++) put32(m + 4 + 4 * i, h[i]);
    for (int i = 0; i < PAYLOAD; i++) m[44 + i] = (unsigned char)(xid + (uint32_t)i);
    full_write(m, sizeof m);
}

/* Reads one reply and returns its xid; anything but an accepted, successful reply fails. */
static uint32_t null_recv(void)
{
    unsigned char m[4], b[256];
    full_read(m, 4);
    uint32_t len = get32(m);
    if (!(len & 0x80000000u) || (len & 0x7fffffffu) < 24 || (len & 0x7fffffffu) > sizeof b)
        FAIL("NULL reply record of %u bytes", len & 0x7fffffffu);
    len &= 0x7fffffffu;
    full_read(b, len);
    uint32_t vlen = get32(b + 16);
    if (get32(b + 4) != 1 || get32(b + 8) != 0 || vlen > len - 24 || get32(b + 20 + vlen) != 0)
        FAIL("NULL reply not accepted: type %u stat %u", get32(b + 4), get32(b + 8));
    return get32(b);
}

static void t_null(double secs)
{
    size_t cap = 1 << 20, n = 0;
    double *rt = malloc(cap * sizeof *rt), sum = 0, end = now() + secs;
    for (uint32_t xid = 1; n < 200 || (now() < end && n < cap); xid++) {
        double a = now();
        null_send(xid);
        if (null_recv() != xid) FAIL("NULL reply xid");
        rt[n] = now() - a;
        sum += rt[n++];
    }
    qsort(rt, n, sizeof *rt, cmp_d);
    printf("null calls %zu median_us %.2f p99_us %.2f mean_us %.2f\n", n, rt[n / 2] * 1e6,
           rt[n * 99 / 100] * 1e6, sum / (double)n * 1e6);
    free(rt);
}

/* Replies may come back in any order (the server has a pool of threads): each must answer a
 * call in flight, once. */
static void t_storm(double secs)
{
    enum { W = 16 };
    double sent[W], sum = 0, t0 = now(), end = t0 + secs;
    uint32_t out[W] = {0}, next = 1; /* xid 0 is never sent: 0 marks a free slot */
    size_t done = 0, inflight = 0;
    for (; next <= W; next++, inflight++) {
        sent[next % W] = now();
        out[next % W] = next;
        null_send(next);
    }
    while (inflight) {
        uint32_t x = null_recv();
        if (x == 0 || out[x % W] != x) FAIL("storm reply xid %u answers no call in flight", x);
        out[x % W] = 0;
        inflight--;
        sum += now() - sent[x % W];
        done++;
        /* The slot just freed takes the next call: slot s carries xids s, s + W, s + 2W... */
        if (done + W <= 2000 || now() < end) {
            uint32_t y = x + W;
            sent[y % W] = now();
            out[y % W] = y;
            null_send(y);
            inflight++;
        }
    }
    double took = now() - t0;
    printf("storm calls %zu per_s %.1f inflight %d mean_us %.2f Mbps %.2f\n", done, done / took, W,
           sum / (double)done * 1e6, done * (double)PAYLOAD * 8 / took / 1e6);
}

/* ---- libnfs tests ----------------------------------------------------------------------- */

static struct nfs_context *nfs;

static void block(unsigned char *b, uint64_t off, uint32_t pass)
{
    for (int i = 0; i < BLK; i += 8) {
        uint64_t v = (off + (uint64_t)i) * 0x9e3779b97f4a7c15ull ^ pass;
        memcpy(b + i, &v, 8);
    }
}

static uint32_t write_pass;

static void t_write(double secs)
{
    unsigned char b[BLK];
    double t0 = now(), end = t0 + secs, busy = 0;
    size_t ops = 0;
    do {
        struct nfsfh *fh;
        write_pass++;
        if (nfs_open(nfs, "/nfsbench.dat", O_WRONLY | O_CREAT | O_TRUNC, &fh) != 0)
            FAIL("open for write: %s", nfs_get_error(nfs));
        for (uint64_t off = 0; off < FILE_SZ; off += BLK) {
            block(b, off, write_pass);
            double a = now();
            if (nfs_pwrite(nfs, fh, off, BLK, b) != BLK) FAIL("write at %lu: %s", (unsigned long)off, nfs_get_error(nfs));
            busy += now() - a;
            ops++;
        }
        if (nfs_close(nfs, fh) != 0) FAIL("close: %s", nfs_get_error(nfs));
    } while (now() < end);
    double took = now() - t0;
    printf("write bytes %zu Mbps %.2f mean_us %.2f passes %u\n", ops * BLK, ops * BLK * 8.0 / took / 1e6,
           busy / (double)ops * 1e6, write_pass);
}

static void t_read(double secs)
{
    unsigned char b[BLK], w[BLK];
    double t0 = now(), end = t0 + secs, busy = 0;
    size_t ops = 0;
    if (!write_pass) FAIL("read needs write before it");
    struct nfsfh *fh;
    if (nfs_open(nfs, "/nfsbench.dat", O_RDONLY, &fh) != 0) FAIL("open for read: %s", nfs_get_error(nfs));
    do {
        for (uint64_t off = 0; off < FILE_SZ; off += BLK) {
            double a = now();
            if (nfs_pread(nfs, fh, off, BLK, b) != BLK) FAIL("read at %lu: %s", (unsigned long)off, nfs_get_error(nfs));
            busy += now() - a;
            ops++;
            block(w, off, write_pass);
            if (memcmp(b, w, BLK)) FAIL("MISMATCH read at offset %lu", (unsigned long)off);
        }
    } while (now() < end);
    nfs_close(nfs, fh);
    double took = now() - t0;
    printf("read bytes %zu Mbps %.2f mean_us %.2f\n", ops * BLK, ops * BLK * 8.0 / took / 1e6,
           busy / (double)ops * 1e6);
}

/* The mix, in percent of operations, modelled on nhfsstone's default (Legato) mix. */
enum { LOOKUP, READ, WRITE, GETATTR, READLINK, READDIR, CREATE, SETATTR, REMOVE, FSSTAT, NOPS };
static const char *const opname[NOPS] = {"lookup", "read", "write", "getattr", "readlink", "readdir",
                                         "create", "setattr", "remove", "fsstat"};
static const int MIX[NOPS] = {34, 22, 15, 13, 8, 3, 2, 1, 1, 1};

#define NF 16
#define FSZ (8 * BLK)

static void t_pebbles(double secs)
{
    static unsigned char shadow[NF][FSZ];
    unsigned char b[BLK];
    struct nfsfh *fh[NF];
    char path[128], lbuf[128];
    size_t count[NOPS] = {0};
    int made = 0, gone = 0;
    nfs_mkdir(nfs, "/pebbles"); /* may exist from an earlier run: checked by the opens below */
    for (int f = 0; f < NF; f++) {
        snprintf(path, sizeof path, "/pebbles/file%02d", f);
        if (nfs_open(nfs, path, O_RDWR | O_CREAT | O_TRUNC, &fh[f]) != 0) FAIL("create %s: %s", path, nfs_get_error(nfs));
        for (int k = 0; k < FSZ / BLK; k++) {
            block(shadow[f] + k * BLK, (uint64_t)(f * FSZ + k * BLK), 7);
            if (nfs_pwrite(nfs, fh[f], (uint64_t)k * BLK, BLK, shadow[f] + k * BLK) != BLK) FAIL("fill %s", path);
        }
        snprintf(lbuf, sizeof lbuf, "/pebbles/link%02d", f);
        nfs_unlink(nfs, lbuf);
        snprintf(path, sizeof path, "file%02d-target", f);
        if (nfs_symlink(nfs, path, lbuf) != 0) FAIL("symlink %s: %s", lbuf, nfs_get_error(nfs));
    }
    uint64_t rng = 88172645463325252ull;
    double t0 = now(), end = t0 + secs, busy = 0;
    size_t ops = 0;
    while (ops < 500 || now() < end) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int r = (int)(rng % 100), op = 0, f = (int)((rng >> 8) % NF), k = (int)((rng >> 16) % (FSZ / BLK));
        while (r >= MIX[op]) r -= MIX[op++];
        struct nfs_stat_64 st;
        struct statvfs sv;
        double a = now();
        switch (op) {
        case LOOKUP:
            snprintf(path, sizeof path, "/pebbles/file%02d", f);
            if (nfs_stat64(nfs, path, &st) != 0 || st.nfs_size != FSZ) FAIL("lookup %s", path);
            break;
        case READ:
            if (nfs_pread(nfs, fh[f], (uint64_t)k * BLK, BLK, b) != BLK) FAIL("read %d", f);
            if (memcmp(b, shadow[f] + k * BLK, BLK)) FAIL("MISMATCH pebbles read file %d block %d", f, k);
            break;
        case WRITE:
            block(shadow[f] + k * BLK, (uint64_t)(f * FSZ + k * BLK), (uint32_t)ops);
            if (nfs_pwrite(nfs, fh[f], (uint64_t)k * BLK, BLK, shadow[f] + k * BLK) != BLK) FAIL("write %d", f);
            break;
        case GETATTR:
            if (nfs_fstat64(nfs, fh[f], &st) != 0 || st.nfs_size != FSZ) FAIL("getattr %d", f);
            break;
        case READLINK:
            snprintf(path, sizeof path, "/pebbles/link%02d", f);
            snprintf((char *)b, sizeof b, "file%02d-target", f);
            if (nfs_readlink(nfs, path, lbuf, sizeof lbuf) != 0 || strcmp(lbuf, (char *)b))
                FAIL("MISMATCH readlink %s", path);
            break;
        case READDIR: {
            struct nfsdir *d;
            int n = 0;
            if (nfs_opendir(nfs, "/pebbles", &d) != 0) FAIL("opendir: %s", nfs_get_error(nfs));
            struct nfsdirent *e;
            while ((e = nfs_readdir(nfs, d)))
                n += !strncmp(e->name, "file", 4) || !strncmp(e->name, "link", 4);
            nfs_closedir(nfs, d);
            if (n != 2 * NF) FAIL("MISMATCH readdir: %d of %d entries", n, 2 * NF);
            break;
        }
        case CREATE: {
            struct nfsfh *t;
            snprintf(path, sizeof path, "/pebbles/tmp%d", made++);
            if (nfs_open(nfs, path, O_WRONLY | O_CREAT | O_TRUNC, &t) != 0) FAIL("create %s: %s", path, nfs_get_error(nfs));
            nfs_close(nfs, t);
            break;
        }
        case SETATTR:
            if (nfs_fchmod(nfs, fh[f], 0600 | (ops & 1 ? 040 : 0)) != 0) FAIL("setattr %d", f);
            break;
        case REMOVE:
            if (gone < made) {
                snprintf(path, sizeof path, "/pebbles/tmp%d", gone++);
                if (nfs_unlink(nfs, path) != 0) FAIL("remove %s: %s", path, nfs_get_error(nfs));
            } else if (nfs_stat64(nfs, "/pebbles/tmp-none", &st) == 0) {
                FAIL("lookup of a missing file succeeded");
            }
            break;
        case FSSTAT:
            if (nfs_statvfs(nfs, "/", &sv) != 0) FAIL("fsstat");
            break;
        }
        busy += now() - a;
        count[op]++;
        ops++;
    }
    double took = now() - t0;
    /* What the mix wrote is there: every block of every file read back once more. */
    for (int f = 0; f < NF; f++) {
        for (int k = 0; k < FSZ / BLK; k++)
            if (nfs_pread(nfs, fh[f], (uint64_t)k * BLK, BLK, b) != BLK || memcmp(b, shadow[f] + k * BLK, BLK))
                FAIL("MISMATCH pebbles final read file %d block %d", f, k);
        nfs_close(nfs, fh[f]);
    }
    for (; gone < made; gone++) {
        snprintf(path, sizeof path, "/pebbles/tmp%d", gone);
        nfs_unlink(nfs, path);
    }
    printf("pebbles ops %zu per_s %.1f mean_us %.2f mix", ops, ops / took, busy / (double)ops * 1e6);
    for (int i = 0; i < NOPS; i++) printf(" %s=%zu", opname[i], count[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: nfsbench SERVER EXPORT NFSPORT SECONDS null|storm|write|read|pebbles...\n");
        return 2;
    }
    const char *server = argv[1], *export = argv[2];
    double secs = atof(argv[4]);
    for (int i = 5; i < argc; i++) {
        const char *t = argv[i];
        if (!strcmp(t, "null") || !strcmp(t, "storm")) {
            if (rpc_fd < 0) rpc_connect(server, atoi(argv[3]));
            !strcmp(t, "null") ? t_null(secs) : t_storm(secs);
            continue;
        }
        if (!nfs) {
            nfs = nfs_init_context();
            if (!nfs) FAIL("nfs_init_context");
            nfs_set_version(nfs, 3); /* NFS_V3 */
            if (nfs_mount(nfs, server, export) != 0) FAIL("mount %s:%s: %s", server, export, nfs_get_error(nfs));
        }
        if (!strcmp(t, "write")) t_write(secs);
        else if (!strcmp(t, "read")) t_read(secs);
        else if (!strcmp(t, "pebbles")) t_pebbles(secs);
        else FAIL("unknown test %s", t);
        fflush(stdout);
    }
    if (nfs) {
        nfs_unlink(nfs, "/nfsbench.dat");
        nfs_umount(nfs);
        nfs_destroy_context(nfs);
    }
    if (rpc_fd >= 0) close(rpc_fd);
    printf("ok\n");
    return 0;
}
