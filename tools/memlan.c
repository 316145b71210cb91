/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * memlan - the command-line tool.
 *
 *   memlan run [OPTIONS] [--] PROGRAM [ARGS]   run PROGRAM with transparent acceleration
 *   memlan stat [OPTIONS]                      the fabric's live objects and connections
 *   memlan clean [--fabric DIR]                reclaim the files of dead processes
 *   memlan bench [OPTIONS]                     measure against floors and the kernel
 *   memlan version
 *
 * Every command parses its options with getopt_long, has its own --help (printed on stdout, exit
 * 0, nothing else done), and refuses an unknown option or a bad value with a message that names
 * it and exit status 2: a tool that guesses what was meant, or quietly falls back to a default,
 * leaves a user believing in a configuration that is not the one running.
 */
#include "bench.h"
#include "memlan.h"
#include "memlan/layout.h"
#include "internal.h"
#include "preload/elfreach.h"
#include "preload/ports.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: memlan COMMAND [OPTIONS]\n"
               "  run [OPTIONS] [--] PROGRAM [ARGS]\n"
               "                 run PROGRAM with its TCP connections to other memlan processes\n"
               "                 carried over shared memory (LD_PRELOAD)\n"
               "  stat [OPTIONS] list the fabric's processes, connections, channels, segments and\n"
               "                 event queues\n"
               "  clean          remove the fabric files of processes that have died\n"
               "  fabric create --group GROUP [--mode private|listable] DIR\n"
               "                 make DIR a fabric shared by the members of GROUP\n"
               "  bench [OPTIONS]\n"
               "                 measure latency, bandwidth and message rate against floors and\n"
               "                 kernel TCP, Unix sockets and pipes in the same run\n"
               "  version        print the version\n"
               "Every command takes --fabric DIR and --help (memlan COMMAND --help).\n"
               "environment: MEMLAN_FABRIC (fabric directory), MEMLAN_SPIN_US (spin budget); see\n"
               "memlan run --help for the rest\n");
}

/* ---- option helpers ------------------------------------------------------------------------ */

/* getopt_long said '?' (unknown option) or ':' (missing value): say which, exit status 2. */
int cli_opt_error(const char *cmd, int c, char **argv)
{
    const char *a = argv[optind - 1];
    char shortopt[3] = {'-', (char)optopt, 0};
    if (optopt && optopt != '?' && (a[0] != '-' || a[1] != '-'))
        a = shortopt;
    if (c == ':')
        fprintf(stderr, "memlan %s: option '%s' needs a value\n", cmd, a);
    else
        fprintf(stderr, "memlan %s: unknown option '%s'\n", cmd, a);
    fprintf(stderr, "try 'memlan %s --help'\n", cmd);
    return 2;
}

static int bad_value(const char *cmd, const char *opt, const char *val, const char *want)
{
    fprintf(stderr, "memlan %s: bad value '%s' for %s: %s\n", cmd, val, opt, want);
    return 2;
}

/* A whole decimal integer in [lo, hi]. */
static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* path made absolute against our working directory (without resolving links); NULL if it will
 * not fit.  Relative paths in MEMLAN_* would otherwise be read against the working directory of
 * each process that inherits them. */
static char *absolute(const char *path)
{
    if (path[0] == '/')
        return strdup(path);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    char *out;
    if (asprintf(&out, "%s/%s", strcmp(cwd, "/") == 0 ? "" : cwd, path) < 0)
        return NULL;
    return out;
}

/* --fabric DIR: absolute, in MEMLAN_FABRIC for the library and our children. */
int cli_set_fabric(const char *cmd, const char *dir)
{
    if (!*dir)
        return bad_value(cmd, "--fabric", dir, "a directory");
    char *abs = absolute(dir);
    if (!abs)
        return bad_value(cmd, "--fabric", dir, "path too long");
    setenv("MEMLAN_FABRIC", abs, 1);
    free(abs);
    return 0;
}

/* The fabric directory the library would open, and whether it was named (not the default). */
static const char *fabric_dir(char *buf, size_t len, bool *named)
{
    const char *env = getenv("MEMLAN_FABRIC");
    *named = env && *env;
    if (*named)
        snprintf(buf, len, "%s", env);
    else
        snprintf(buf, len, "/dev/shm/memlan-%u", (unsigned)getuid());
    return buf;
}

/* A named fabric that does not exist is a typo, not an empty fabric. */
static int fabric_must_exist(const char *cmd)
{
    char dir[PATH_MAX];
    bool named;
    struct stat st;
    fabric_dir(dir, sizeof dir, &named);
    if (named && stat(dir, &st) < 0) {
        fprintf(stderr, "memlan %s: fabric %s: %s\n", cmd, dir, strerror(errno));
        return 1;
    }
    if (named && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "memlan %s: fabric %s: not a directory\n", cmd, dir);
        return 1;
    }
    return 0;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

/* s as a JSON string: quotes, backslashes and control characters escaped, and any byte that is
 * not part of well-formed UTF-8 replaced by U+FFFD, so that what a process put in its name (or a
 * directory's name) can never break the document. */
static void json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            p++;
        } else if (c < 0x80) {
            fputc(c, f);
            p++;
        } else {
            int n = c >= 0xf0 && c <= 0xf4 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 && c < 0xe0 ? 1 : -1;
            if (c >= 0xf5)
                n = -1;
            bool ok = n > 0;
            for (int i = 1; ok && i <= n; i++)
                ok = (p[i] & 0xc0) == 0x80;
            /* overlong three- and four-byte forms, surrogates and code points past U+10FFFF */
            if (ok && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0) ||
                       (c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] >= 0x90)))
                ok = false;
            if (ok) {
                fwrite(p, 1, (size_t)n + 1, f);
                p += n + 1;
            } else {
                fputs("\\ufffd", f);
                p++;
            }
        }
    }
    fputc('"', f);
}

/* ---- stat ---------------------------------------------------------------------------------- */

static const char *kind_name(uint32_t k)
{
    return k == ML_KIND_RAW ? "segment" : k == ML_KIND_CHANNEL ? "channel" : k == ML_KIND_EVQ ? "evq"
         : k == ML_KIND_PROC ? "process" : "unknown";
}

static int held(int fd, int byte)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

static const char *side_state(uint32_t s)
{
    return s == ML_SIDE_OPEN ? "open" : s == ML_SIDE_SHUT_WR ? "shut-wr" : s == ML_SIDE_CLOSED ? "closed" : "?";
}

struct stat_opts {
    bool json, tokens;
    int pid;          /* 0: all */
    const char *kind; /* NULL: all */
};

/* The connections a memlan process lists in its ML_KIND_PROC segment: printed as text lines, or
 * as JSON items into cj. */
static void proc_conns(const char *dir, int fd, const struct ml_seg_hdr *h,
                       const struct stat_opts *o, FILE *cj, int *n)
{
    struct ml_proc_hdr ph;
    if (pread(fd, &ph, sizeof ph, (off_t)h->body_off) != sizeof ph || ph.nslots > ML_PROC_SLOTS)
        return;
    for (uint32_t i = 0; i < ph.nslots; i++) {
        struct ml_proc_conn c;
        off_t off = (off_t)(h->body_off + sizeof ph + i * sizeof c);
        if (pread(fd, &c, sizeof c, off) != sizeof c || c.state == ML_CONN_FREE)
            continue;
        c.local[sizeof c.local - 1] = c.remote[sizeof c.remote - 1] = 0;
        c.why[sizeof c.why - 1] = 0;
        char tok[ML_TOKEN_HEX + 1] = "";
        unsigned long long b0 = 0, b1 = 0, w0 = 0, w1 = 0, s0 = 0, s1 = 0;
        /* A client's slot says waiting until the client looks at its offer again (its next
         * call on the socket): one that wrote into the ring and went idle (a log forwarder
         * between messages) was shown "waiting: offer posted, not yet taken" while its acceptor
         * had taken the channel and read every byte.  The channel's attach word says. */
        if (c.state == ML_CONN_ACCEL || c.state == ML_CONN_WAIT) {
            char path[PATH_MAX + 64];
            memcpy(tok, c.token, ML_TOKEN_HEX);
            tok[ML_TOKEN_HEX] = 0;
            /* The token is another process's word (a member of a shared fabric may write its
             * entry): hex only, so that it names a file in the fabric and nothing through it
             * ("x/../../fifo"), and that file opened without blocking and read only if it is a
             * regular file (a planted FIFO hung this command: a review's reproduction). */
            bool hex = strspn(tok, "0123456789abcdef") == ML_TOKEN_HEX;
            snprintf(path, sizeof path, "%s/seg-%s", dir, tok);
            int cfd = hex ? open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
            struct stat cst;
            if (cfd >= 0 && (fstat(cfd, &cst) != 0 || !S_ISREG(cst.st_mode))) {
                close(cfd);
                cfd = -1;
            }
            if (cfd >= 0) {
                struct ml_chan_hdr ch;
                struct ml_ring_ctl r0, r1;
                if (pread(cfd, &ch, sizeof ch, sizeof(struct ml_seg_hdr)) == sizeof ch &&
                    ch.ctl_off[0] < 4096 && ch.ctl_off[1] < 4096 &&
                    pread(cfd, &r0, sizeof r0, (off_t)ch.ctl_off[0]) == sizeof r0 &&
                    pread(cfd, &r1, sizeof r1, (off_t)ch.ctl_off[1]) == sizeof r1 &&
                    (c.state == ML_CONN_ACCEL || atomic_load(&ch.attached) == 1)) {
                    c.state = ML_CONN_ACCEL;
                    /* ring 0 carries the connecting end's bytes, ring 1 the acceptor's */
                    bool acc = strcmp(c.why, ML_CONN_ACCEPTED) == 0;
                    b0 = acc ? r1.head : r0.head, b1 = acc ? r0.head : r1.head;
                    w0 = r0.wakeups, w1 = r1.wakeups;
                    s0 = r0.spin_hits, s1 = r1.spin_hits;
                }
                close(cfd);
            }
        }
        const char *state = c.state == ML_CONN_ACCEL ? "accelerated"
                          : c.state == ML_CONN_TCP   ? "tcp" : "waiting";
        if (o->json) {
            fprintf(cj, "%s{\"pid\":%d,\"fd\":%d,\"local\":", *n ? "," : "", ph.pid, c.fd);
            json_str(cj, c.local);
            fputs(",\"remote\":", cj);
            json_str(cj, c.remote);
            fprintf(cj, ",\"state\":\"%s\"", state);
            if (c.state == ML_CONN_ACCEL) {
                fprintf(cj, ",\"bytes_out\":%llu,\"bytes_in\":%llu,\"wakeups\":%llu,"
                            "\"spin_hits\":%llu", b0, b1, w0 + w1, s0 + s1);
                if (o->tokens)
                    fprintf(cj, ",\"channel\":\"%s\"", tok);
            } else {
                fputs(",\"reason\":", cj);
                json_str(cj, c.why);
            }
            fputc('}', cj);
        } else if (c.state == ML_CONN_ACCEL) {
            printf("  conn pid %d fd %d %s -> %s accelerated: bytes out/in %llu/%llu, wake-ups "
                   "%llu, spin hits %llu%s%s\n", ph.pid, c.fd, c.local, c.remote, b0, b1,
                   w0 + w1, s0 + s1, o->tokens ? ", channel " : "", o->tokens ? tok : "");
        } else {
            printf("  conn pid %d fd %d %s -> %s %s: %s\n", ph.pid, c.fd, c.local, c.remote,
                   c.state == ML_CONN_TCP ? "TCP" : "waiting", c.why);
        }
        (*n)++;
    }
}

/* One object's kind-specific fields: JSON members (after a comma) into f, or prose into detail. */
static void object_detail(int fd, const struct ml_seg_hdr *h, bool json, FILE *f, char *detail,
                          size_t dlen)
{
    if (h->version != ML_LAYOUT_VERSION) {
        snprintf(detail, dlen, "unknown layout version %u", h->version);
    } else if (h->kind == ML_KIND_CHANNEL) {
        struct ml_chan_hdr c;
        struct ml_ring_ctl r0, r1;
        if (pread(fd, &c, sizeof c, (off_t)h->body_off) != sizeof c || c.ctl_off[0] >= 4096 ||
            c.ctl_off[1] >= 4096 || pread(fd, &r0, sizeof r0, (off_t)c.ctl_off[0]) != sizeof r0 ||
            pread(fd, &r1, sizeof r1, (off_t)c.ctl_off[1]) != sizeof r1)
            return;
        const char *type = c.chan_kind == ML_CHAN_MSG ? "message" : "stream";
        const char *att = c.attached ? (held(fd, ML_LOCK_ATTACHER) == 1 ? "live" : "gone") : "none";
        if (json)
            fprintf(f, ",\"channel_type\":\"%s\",\"ring_bytes\":%u,\"side_pids\":[%d,%d],"
                       "\"side_states\":[\"%s\",\"%s\"],\"attacher\":\"%s\","
                       "\"bytes_0_to_1\":%llu,\"bytes_1_to_0\":%llu",
                    type, c.ring_size, c.side_pid[0], c.side_pid[1], side_state(c.side_state[0]),
                    side_state(c.side_state[1]), att, (unsigned long long)r0.head,
                    (unsigned long long)r1.head);
        else
            snprintf(detail, dlen,
                     "%s ring %u B; pids %d/%d; state %s/%s; attacher %s; "
                     "bytes 0->1 %llu, 1->0 %llu", type, c.ring_size, c.side_pid[0],
                     c.side_pid[1], side_state(c.side_state[0]), side_state(c.side_state[1]), att,
                     (unsigned long long)r0.head, (unsigned long long)r1.head);
    } else if (h->kind == ML_KIND_PROC) {
        struct ml_proc_hdr ph;
        if (pread(fd, &ph, sizeof ph, (off_t)h->body_off) != sizeof ph)
            return;
        ph.cmd[sizeof ph.cmd - 1] = 0;
        unsigned long long a = ph.accel_total, t = ph.tcp_total;
        if (json) {
            fputs(",\"command\":", f);
            json_str(f, ph.cmd);
            fprintf(f, ",\"accelerated\":%llu,\"on_tcp\":%llu", a, t);
        } else {
            /* a name is the process's to choose: no control characters to the terminal */
            for (char *c = ph.cmd; *c; c++)
                if ((unsigned char)*c < 0x20 || *c == 0x7f)
                    *c = '?';
            snprintf(detail, dlen, "%.55s: %llu accelerated, %llu on TCP so far", ph.cmd, a, t);
        }
    } else if (h->kind == ML_KIND_EVQ) {
        struct ml_evq_hdr q;
        if (pread(fd, &q, sizeof q, (off_t)h->body_off) != sizeof q)
            return;
        if (json)
            fprintf(f, ",\"capacity\":%u,\"posts\":%llu,\"wakeups\":%llu", q.capacity,
                    (unsigned long long)q.posts, (unsigned long long)q.wakeups);
        else
            snprintf(detail, dlen, "capacity %u; posts %llu; wake-ups %llu", q.capacity,
                     (unsigned long long)q.posts, (unsigned long long)q.wakeups);
    } else {
        const char *mode = h->mode == MEMLAN_MODE_RO ? "read-only" : "read-write";
        if (json)
            fprintf(f, ",\"bytes\":%llu,\"mode\":\"%s\",\"revoked\":%s",
                    (unsigned long long)h->body_size, mode,
                    h->state == ML_SEG_REVOKED ? "true" : "false");
        else
            snprintf(detail, dlen, "%llu bytes, %s%s", (unsigned long long)h->body_size, mode,
                     h->state == ML_SEG_REVOKED ? ", revoked" : "");
    }
}

/* A named endpoint, ep-NAME (memlan_listen): served while its owner byte is locked.  The lock is
 * an OFD lock, which names no process, so its pid is unknown (JSON null).  The file may be
 * anything a fabric member planted: opened without following a link or blocking on a FIFO. */
static bool stat_endpoint(const char *dir, const char *file, const struct stat_opts *o, int n)
{
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    int live = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? held(fd, ML_LOCK_OWNER) : -1;
    if (fd >= 0)
        close(fd);
    if (live < 0)
        return false;
    char name[MEMLAN_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", file + 3);
    if (o->json) {
        printf("%s{\"kind\":\"endpoint\",\"name\":", n ? "," : "");
        json_str(stdout, name);
        printf(",\"pid\":null,\"live\":%s}", live ? "true" : "false");
        return true;
    }
    for (char *c = name; *c; c++) /* no control characters to the terminal */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    printf("%-8s %s%7s %-5s name %s%s\n", "endpoint", o->tokens ? "                                 " : "",
           "-", live ? "yes" : "DEAD", name, live ? "" : " (its server died; clean removes it)");
    return true;
}

/* One snapshot of the fabric.  stat only looks: it does not open the fabric through the library,
 * whose lazy reclaim would remove the dead processes' files that stat is there to show. */
static int stat_once(const struct stat_opts *o)
{
    char dir[PATH_MAX];
    bool named;
    fabric_dir(dir, sizeof dir, &named);
    DIR *d = opendir(dir);
    if (!d && !(errno == ENOENT && !named)) {
        fprintf(stderr, "memlan stat: fabric %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char *conns = NULL;
    size_t conns_len = 0;
    FILE *cj = o->json ? open_memstream(&conns, &conns_len) : NULL;
    if (o->json && !cj) {
        if (d)
            closedir(d);
        return 1;
    }
    int n = 0, nconn = 0;
    if (o->json) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        fputs("{\"fabric\":", stdout);
        json_str(stdout, dir);
        printf(",\"time\":%.3f,\"objects\":[", (double)now.tv_sec + now.tv_nsec / 1e9);
    } else {
        printf("fabric %s\n%-8s %s%7s %-5s %s\n", dir, "KIND", o->tokens ? "TOKEN                            " : "",
               "PID", "LIVE", "DETAIL");
    }
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t elen = strlen(e->d_name);
        if (strncmp(e->d_name, "ep-", 3) == 0 && elen > 3 && elen <= 3 + MEMLAN_NAME_MAX &&
            !(elen > 8 && strcmp(e->d_name + elen - 5, ".sock") == 0)) {
            if (!o->pid && (!o->kind || strcmp(o->kind, "endpoint") == 0))
                n += stat_endpoint(dir, e->d_name, o, n);
            continue;
        }
        if (strncmp(e->d_name, "seg-", 4) != 0)
            continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        /* Without blocking, a regular file only: a FIFO planted under a seg- name hung it. */
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat fst;
        if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
            close(fd);
            continue;
        }
        struct ml_seg_hdr h;
        if (pread(fd, &h, sizeof h, 0) != sizeof h || h.magic != ML_SEG_MAGIC ||
            (o->pid && h.owner_pid != o->pid) || (o->kind && strcmp(o->kind, kind_name(h.kind)))) {
            close(fd);
            continue;
        }
        int live = held(fd, ML_LOCK_OWNER);
        char detail[512] = "";
        if (o->json) {
            printf("%s{\"kind\":\"%s\",", n ? "," : "", kind_name(h.kind));
            if (o->tokens) {
                fputs("\"token\":", stdout);
                json_str(stdout, e->d_name + 4);
                fputc(',', stdout);
            }
            printf("\"pid\":%d,\"live\":%s,\"layout_version\":%u", h.owner_pid,
                   live == 1 ? "true" : "false", h.version);
            object_detail(fd, &h, true, stdout, detail, sizeof detail);
            fputc('}', stdout);
        } else {
            object_detail(fd, &h, false, NULL, detail, sizeof detail);
            printf("%-8s ", kind_name(h.kind));
            if (o->tokens)
                printf("%-32s ", e->d_name + 4);
            printf("%7d %-5s %s\n", h.owner_pid, live == 1 ? "yes" : "DEAD", detail);
        }
        if (h.kind == ML_KIND_PROC && h.version == ML_LAYOUT_VERSION && live == 1)
            proc_conns(dir, fd, &h, o, cj, &nconn);
        n++;
        close(fd);
    }
    if (d)
        closedir(d);
    if (o->json) {
        fclose(cj);
        printf("],\"connections\":[%s]}\n", conns ? conns : "");
    } else if (!n) {
        printf("(empty)\n");
    }
    free(conns);
    fflush(stdout);
    return 0;
}

static void stat_usage(FILE *f)
{
    fprintf(f,
            "usage: memlan stat [OPTIONS]\n"
            "List the fabric's objects (processes, channels, event queues, segments, named\n"
            "endpoints), whether their owner lives, and each memlan process's connections:\n"
            "accelerated with their counters, or on TCP with the reason.  Reads only: reclaims\n"
            "nothing.\n"
            "  --fabric DIR        the fabric directory (default $MEMLAN_FABRIC, else\n"
            "                      /dev/shm/memlan-UID)\n"
            "  --json              one JSON document: {fabric, time, objects[], connections[]}\n"
            "  --pid PID           only the objects (and connections) of process PID\n"
            "  --kind KIND         only objects of KIND: process, channel, evq, segment or\n"
            "                      endpoint (an endpoint's pid is unknown: --pid leaves it out)\n"
            "                      (connections are listed with their process)\n"
            "  -i, --interval SEC  print again every SEC seconds (fractions allowed) until\n"
            "                      interrupted; with --json one document per line\n"
            "  -c, --count N       with -i: stop after N snapshots\n"
            "  --tokens            also show the tokens; a token is a capability (whoever has it\n"
            "                      may attach or import), so it is hidden unless asked for\n"
            "  -h, --help          this text\n");
}

static int cmd_stat(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},          {"pid", required_argument, 0, 'p'},
        {"kind", required_argument, 0, 'k'},    {"interval", required_argument, 0, 'i'},
        {"count", required_argument, 0, 'c'},   {"tokens", no_argument, 0, 't'},
        {"fabric", required_argument, 0, 'f'},  {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    struct stat_opts o = {0};
    double interval = 0;
    long count = 0, v;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hi:c:", opts, NULL)) != -1) {
        switch (c) {
        case 'j': o.json = true; break;
        case 't': o.tokens = true; break;
        case 'p':
            if (!parse_long(optarg, 1, INT_MAX, &v))
                return bad_value("stat", "--pid", optarg, "a process id");
            o.pid = (int)v;
            break;
        case 'k':
            if (strcmp(optarg, "process") && strcmp(optarg, "channel") && strcmp(optarg, "evq") &&
                strcmp(optarg, "segment") && strcmp(optarg, "endpoint"))
                return bad_value("stat", "--kind", optarg,
                                 "process, channel, evq, segment or endpoint");
            o.kind = optarg;
            break;
        case 'i': {
            char *end;
            interval = strtod(optarg, &end);
            if (!*optarg || *end || !(interval >= 0.01 && interval <= 86400))
                return bad_value("stat", "--interval", optarg, "seconds, 0.01 to 86400");
            break;
        }
        case 'c':
            if (!parse_long(optarg, 1, LONG_MAX, &count))
                return bad_value("stat", "--count", optarg, "a positive number");
            break;
        case 'f':
            if (cli_set_fabric("stat", optarg))
                return 2;
            break;
        case 'h': stat_usage(stdout); return 0;
        default: return cli_opt_error("stat", c, argv);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "memlan stat: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (count && !interval) {
        fprintf(stderr, "memlan stat: --count needs --interval\n");
        return 2;
    }
    for (long i = 0;; i++) {
        int r = stat_once(&o);
        if (r || !interval || (count && i + 1 >= count))
            return r;
        if (!o.json)
            printf("\n");
        struct timespec ts = {(time_t)interval, (long)((interval - floor(interval)) * 1e9)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
}

/* ---- clean --------------------------------------------------------------------------------- */

static int cmd_clean(int argc, char **argv)
{
    static const struct option opts[] = {{"fabric", required_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (cli_set_fabric("clean", optarg))
                return 2;
            break;
        case 'h':
            printf("usage: memlan clean [--fabric DIR]\n"
                   "Remove the fabric files whose owner has died (a process killed before it\n"
                   "could clean up).  A live process's files are never touched.\n"
                   "  --fabric DIR   the fabric directory (default $MEMLAN_FABRIC, else\n"
                   "                 /dev/shm/memlan-UID)\n"
                   "  -h, --help     this text\n");
            return 0;
        default: return cli_opt_error("clean", c, argv);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "memlan clean: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (fabric_must_exist("clean"))
        return 1;
    memlan_fabric_t *fab;
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0) {
        fprintf(stderr, "memlan clean: cannot open the fabric: %s\n", memlan_strerror(r));
        return 1;
    }
    struct ml_clean_report rep;
    r = __ml_fabric_clean_report(fab, &rep);
    if (r == -EACCES && rep.dir_uid != (uint32_t)geteuid()) {
        fprintf(stderr,
                "memlan clean: cannot list %s: a private shared fabric (searchable, not "
                "listable) is listed only by its owner (uid %u) and root; run memlan clean as "
                "one of them\n",
                memlan_fabric_path(fab), (unsigned)rep.dir_uid);
        memlan_fabric_close(fab);
        return 1;
    }
    if (r < 0) {
        fprintf(stderr, "memlan clean: %s\n", memlan_strerror(r));
        memlan_fabric_close(fab);
        return 1;
    }
    printf("memlan clean: removed %d file(s) of dead processes from %s\n", r,
           memlan_fabric_path(fab));
    /* What was left and why, in a fabric shared by a group (design.md, "Fabric"). */
    bool owner = rep.dir_uid == (uint32_t)geteuid();
    if (rep.unopened)
        fprintf(stderr,
                "memlan clean: %d file(s) of other users not checked (%s...): this user may "
                "not open them (a member's channels are its two ends' alone)%s; run memlan "
                "clean as %s\n",
                rep.unopened, rep.unopened_name,
                owner ? " and cannot read /proc/locks" : "", owner ? "root" : "the fabric's owner "
                "or root");
    if (rep.kept)
        fprintf(stderr,
                "memlan clean: %d dead file(s) of other users left (%s...): the fabric is "
                "sticky, so only their owner, the fabric's owner (uid %u) or root may remove "
                "them\n",
                rep.kept, rep.kept_name, (unsigned)rep.dir_uid);
    if (rep.young)
        fprintf(stderr,
                "memlan clean: %d file(s) of other users made less than 10 s ago left (%s...): "
                "too new to tell dead from being set up without opening them; run memlan "
                "clean again later\n",
                rep.young, rep.young_name);
    memlan_fabric_close(fab);
    return 0;
}

/* ---- fabric create ------------------------------------------------------------------------- */

static void fabric_usage(FILE *f)
{
    fprintf(f,
            "usage: memlan fabric create --group GROUP [--mode private|listable] DIR\n"
            "Make DIR a fabric shared on purpose by the members of GROUP (design.md, \"Fabric\"):\n"
            "create it if missing (its parent must exist), give it to GROUP, and set its mode\n"
            "to 3730 (private: members may create and open files but not list them) or 3770\n"
            "(listable).  The setgid bit makes files inherit GROUP; the sticky bit keeps members\n"
            "from removing each other's files.  Each connection's channel is readable and\n"
            "writable by its two ends only (a POSIX ACL): members share the directory, not\n"
            "their traffic.  Then run both ends with MEMLAN_FABRIC=DIR (memlan run --fabric\n"
            "DIR), as users in GROUP.\n"
            "  --group GROUP   the group whose members share the fabric (name or number)\n"
            "  --mode MODE     private (default) or listable\n"
            "  -h, --help      this text\n");
}

static int cmd_fabric(int argc, char **argv)
{
    static const struct option opts[] = {{"group", required_argument, 0, 'g'},
                                         {"mode", required_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *group = NULL;
    bool listable = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'g': group = optarg; break;
        case 'm':
            if (strcmp(optarg, "private") == 0)
                listable = false;
            else if (strcmp(optarg, "listable") == 0)
                listable = true;
            else
                return bad_value("fabric create", "--mode", optarg, "private or listable");
            break;
        case 'h': fabric_usage(stdout); return 0;
        default: return cli_opt_error("fabric", c, argv);
        }
    }
    if (optind >= argc || strcmp(argv[optind], "create") != 0) {
        fabric_usage(stderr);
        return 2;
    }
    optind++; /* getopt_long moved the options, wherever they were, before the words */
    if (!group || optind + 1 != argc) {
        fprintf(stderr, "memlan fabric create: %s\n",
                !group ? "--group GROUP is required" : "one directory is required");
        return 2;
    }
    const char *dir = argv[optind];
    struct group *g = getgrnam(group);
    char *end;
    long gnum = strtol(group, &end, 10);
    gid_t gid = g ? g->gr_gid : (*group && !*end && gnum >= 0) ? (gid_t)gnum : (gid_t)-1;
    if (gid == (gid_t)-1) {
        fprintf(stderr, "memlan fabric create: no such group '%s'\n", group);
        return 1;
    }
    bool made = mkdir(dir, 0700) == 0;
    if (!made && errno != EEXIST) {
        fprintf(stderr, "memlan fabric create: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    /* Everything else through one descriptor of the directory itself, never through a path
     * that could be swapped for a symlink meanwhile. */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "memlan fabric create: %s: %s\n", dir,
                errno == ELOOP || errno == ENOTDIR ? "not a directory (a symlink?)" : strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    /* An existing directory must be ours (root too: another user's directory stays theirs,
     * with whatever they put in it and the right to remove anyone's files) and empty. */
    if (st.st_uid != geteuid()) {
        fprintf(stderr, "memlan fabric create: %s: belongs to uid %u, not to us\n", dir,
                (unsigned)st.st_uid);
        close(fd);
        return 1;
    }
    if (!made) {
        int dfd = dup(fd);
        DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
        struct dirent *e;
        bool empty = d != NULL;
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                empty = false;
        if (d)
            closedir(d);
        else if (dfd >= 0)
            close(dfd);
        if (!empty) {
            fprintf(stderr, "memlan fabric create: %s: exists and is not empty (a fabric is made "
                    "from a new or empty directory)\n", dir);
            close(fd);
            return 1;
        }
    }
    /* No ACL from before: the modes below say who may join. */
    (void)fremovexattr(fd, "system.posix_acl_access");
    (void)fremovexattr(fd, "system.posix_acl_default");
    mode_t mode = listable ? 03770 : 03730;
    if (fchown(fd, (uid_t)-1, gid) < 0 || fchmod(fd, mode) < 0) {
        fprintf(stderr, "memlan fabric create: %s: %s\n", dir, strerror(errno));
        close(fd);
        return 1;
    }
    close(fd);
    printf("memlan fabric create: %s is a fabric for group %s (mode %04o, %s); run both ends "
           "with MEMLAN_FABRIC=%s\n", dir, g ? g->gr_name : group, (unsigned)mode,
           listable ? "listable" : "private: searchable, not listable", dir);
    return 0;
}

/* ---- run ----------------------------------------------------------------------------------- */

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: memlan run [OPTIONS] [--] PROGRAM [ARGS]\n"
            "Run PROGRAM with its TCP connections to other memlan processes on this host carried\n"
            "over shared memory.  Children inherit the settings.\n"
            "  --fabric DIR        fabric directory (MEMLAN_FABRIC; default /dev/shm/memlan-UID)\n"
            "  --spin-us N         spin budget before sleeping, 0 to 1000000 (MEMLAN_SPIN_US;\n"
            "                      0 = never spin; default adaptive)\n"
            "  --ports LIST        accelerate only these server ports, e.g. 80,8000-8100\n"
            "                      (MEMLAN_PORTS)\n"
            "  --no-ports LIST     never accelerate these server ports (MEMLAN_NO_PORTS)\n"
            "  --log stderr|FILE   log each decision (MEMLAN_LOG); a FILE is opened for append\n"
            "                      now, and a relative one made absolute\n"
            "  --log-level N       0 errors, 1 decisions, 2 debug (MEMLAN_LOG_LEVEL, default 1)\n"
            "  --accept-wait-ms N  how long a client's offer waits for a memlan accept before the\n"
            "                      connection stays on TCP, 1 to 600000 (MEMLAN_ACCEPT_WAIT_MS,\n"
            "                      default 2000); a client that polls, or waits in a read, whose\n"
            "                      connection is still in the server's accept queue waits on\n"
            "  --accept-queue-ms N how long, from the connect, it waits in all, 1 to 600000\n"
            "                      (MEMLAN_ACCEPT_QUEUE_MS, default 60000)\n"
            "  --ring-kb N         ring size per direction, KiB, 4 to 1048576, unless\n"
            "                      SO_SNDBUF/SO_RCVBUF set before connect say otherwise\n"
            "                      (MEMLAN_RING_KB, default 256)\n"
            "  --ring-grow-kb N    the region a full ring grows into, KiB, 0 (never) to 65536,\n"
            "                      as kernel TCP autotunes its buffers; none where\n"
            "                      SO_SNDBUF/SO_RCVBUF sized the ring (MEMLAN_RING_GROW_KB,\n"
            "                      default 4096)\n"
            "  --off               load the library but accelerate nothing (MEMLAN_OFF=1)\n"
            "  -q, --quiet         say nothing on stderr when memlan cannot accelerate or a\n"
            "                      setting is bad (MEMLAN_QUIET=1); --log still logs\n"
            "  -h, --help          this text\n"
            "memlan stat shows the connections and, for each one that stayed on TCP, why.\n");
}

#ifndef MEMLAN_LIBDIR
#define MEMLAN_LIBDIR "/usr/local/lib"
#endif
#ifndef MEMLAN_BINDIR
#define MEMLAN_BINDIR "/usr/local/bin"
#endif
#define PRELOAD_NAME "libmemlan-preload.so"

/* out = dir/libmemlan-preload.so, resolved, if that file is readable. */
static int preload_in(const char *dir, char *out, size_t len)
{
    char path[4096];
    if (!dir || !*dir || (size_t)snprintf(path, sizeof path, "%s/" PRELOAD_NAME, dir) >= sizeof path ||
        access(path, R_OK) != 0)
        return -1;
    char *real = realpath(path, NULL);
    snprintf(out, len, "%s", real ? real : path);
    free(real);
    return 0;
}

/* By soname, as the dynamic linker would find it: LD_LIBRARY_PATH, then ldconfig's cache. */
static int preload_by_soname(char *out, size_t len)
{
    const char *llp = getenv("LD_LIBRARY_PATH");
    if (llp) {
        char *dirs = strdup(llp), *save = NULL;
        for (char *d = dirs ? strtok_r(dirs, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save))
            if (preload_in(d, out, len) == 0) {
                free(dirs);
                return 0;
            }
        free(dirs);
    }
    FILE *f = popen("/sbin/ldconfig -p 2>/dev/null", "r");
    if (!f)
        return -1;
    char line[4096];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        char *arrow = strstr(line, " => ");
        if (strncmp(line + strspn(line, " \t"), PRELOAD_NAME " ", strlen(PRELOAD_NAME) + 1) || !arrow)
            continue;
        arrow[strcspn(arrow, "\n")] = 0;
        char *slash = strrchr(arrow + 4, '/');
        if (slash) {
            *slash = 0;
            found = preload_in(arrow + 4, out, len);
        }
    }
    pclose(f);
    return found;
}

/* Where libmemlan-preload.so is: MEMLAN_PRELOAD_LIB; LIBDIR when we run from the installed
 * BINDIR; next to us (../lib: the build tree, or an install moved or staged with DESTDIR); the
 * LIBDIR we were built for; else by soname.  The build tree's own library wins over an
 * installed one, so a developer's `build/bin/memlan run` runs what was just built. */
static int find_preload(char *out, size_t len)
{
    const char *env = getenv("MEMLAN_PRELOAD_LIB");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return access(out, R_OK);
    }
    char self[4096], *here = NULL, *bindir = realpath(MEMLAN_BINDIR, NULL);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            here = self;
        }
    }
    int installed = here && bindir && strcmp(here, bindir) == 0;
    free(bindir);
    char up[4096] = "";
    if (here)
        snprintf(up, sizeof up, "%.4000s/../lib", here);
    if ((installed && preload_in(MEMLAN_LIBDIR, out, len) == 0) || preload_in(up, out, len) == 0 ||
        preload_in(MEMLAN_LIBDIR, out, len) == 0)
        return 0;
    return preload_by_soname(out, len);
}

/* The file execvp() would run for name, or false. */
static bool which(const char *name, char *out, size_t len)
{
    if (strchr(name, '/')) {
        snprintf(out, len, "%s", name);
        return true;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t l = strcspn(path, ":");
        snprintf(out, len, "%.*s/%s", (int)(l ? l : 1), l ? path : ".", name);
        if (access(out, X_OK) == 0)
            return true;
        path += l + (path[l] == ':');
    }
    return false;
}

static int cmd_run(int argc, char **argv)
{
    enum { O_SPIN = 256, O_FABRIC, O_PORTS, O_NOPORTS, O_LOG, O_LOGLEVEL, O_ACCEPT, O_RING, O_OFF,
           O_GROW, O_QUEUE };
    static const struct option opts[] = {
        {"spin-us", required_argument, 0, O_SPIN},   {"fabric", required_argument, 0, O_FABRIC},
        {"ports", required_argument, 0, O_PORTS},    {"no-ports", required_argument, 0, O_NOPORTS},
        {"log", required_argument, 0, O_LOG},        {"log-level", required_argument, 0, O_LOGLEVEL},
        {"accept-wait-ms", required_argument, 0, O_ACCEPT},
        {"accept-queue-ms", required_argument, 0, O_QUEUE},
        {"ring-kb", required_argument, 0, O_RING},   {"off", no_argument, 0, O_OFF},
        {"ring-grow-kb", required_argument, 0, O_GROW},
        {"quiet", no_argument, 0, 'q'},              {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    long v;
    bool quiet = false;
    optind = 1;
    opterr = 0;
    /* '+': options end at PROGRAM, whose own options are its business. */
    while ((c = getopt_long(argc, argv, "+:hq", opts, NULL)) != -1) {
        switch (c) {
        case O_SPIN:
            if (!parse_long(optarg, 0, 1000000, &v))
                return bad_value("run", "--spin-us", optarg, "microseconds, 0 to 1000000");
            setenv("MEMLAN_SPIN_US", optarg, 1);
            break;
        case O_FABRIC:
            if (cli_set_fabric("run", optarg))
                return 2;
            break;
        case O_PORTS:
        case O_NOPORTS:
            if (!mlp_ports_valid(optarg))
                return bad_value("run", c == O_PORTS ? "--ports" : "--no-ports", optarg,
                                 "ports 1 to 65535 and ranges, e.g. 80,8000-8100");
            setenv(c == O_PORTS ? "MEMLAN_PORTS" : "MEMLAN_NO_PORTS", optarg, 1);
            break;
        case O_LOG:
            if (!*optarg)
                return bad_value("run", "--log", optarg, "stderr or a file");
            setenv("MEMLAN_LOG", optarg, 1);
            break;
        case O_LOGLEVEL:
            if (!parse_long(optarg, 0, 2, &v))
                return bad_value("run", "--log-level", optarg, "0, 1 or 2");
            setenv("MEMLAN_LOG_LEVEL", optarg, 1);
            break;
        case O_ACCEPT:
            if (!parse_long(optarg, 1, 600000, &v))
                return bad_value("run", "--accept-wait-ms", optarg, "milliseconds, 1 to 600000");
            setenv("MEMLAN_ACCEPT_WAIT_MS", optarg, 1);
            break;
        case O_QUEUE:
            if (!parse_long(optarg, 1, 600000, &v))
                return bad_value("run", "--accept-queue-ms", optarg, "milliseconds, 1 to 600000");
            setenv("MEMLAN_ACCEPT_QUEUE_MS", optarg, 1);
            break;
        case O_RING:
            if (!parse_long(optarg, 4, 1 << 20, &v))
                return bad_value("run", "--ring-kb", optarg, "KiB, 4 to 1048576");
            setenv("MEMLAN_RING_KB", optarg, 1);
            break;
        case O_GROW:
            if (!parse_long(optarg, 0, 64 << 10, &v))
                return bad_value("run", "--ring-grow-kb", optarg, "KiB, 0 to 65536");
            setenv("MEMLAN_RING_GROW_KB", optarg, 1);
            break;
        case O_OFF: setenv("MEMLAN_OFF", "1", 1); break;
        case 'q':
            quiet = true;
            setenv("MEMLAN_QUIET", "1", 1);
            break;
        case 'h': run_usage(stdout); return 0;
        default: return cli_opt_error("run", c, argv);
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "memlan run: no PROGRAM to run\n");
        run_usage(stderr);
        return 2;
    }
    /* The log file, from --log or the environment: absolute, so that every process writes the
     * same file whatever its working directory, and openable now rather than silently not. */
    const char *log = getenv("MEMLAN_LOG");
    if (log && *log && strcmp(log, "stderr") != 0 && strcmp(log, "1") != 0) {
        char *abs = absolute(log);
        if (!abs)
            return bad_value("run", "--log", log, "path too long");
        int fd = open(abs, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "memlan run: cannot open the log file %s for append: %s\n", abs,
                    strerror(errno));
            free(abs);
            return 2;
        }
        close(fd);
        setenv("MEMLAN_LOG", abs, 1);
        free(abs);
    }
    const char *prog = argv[optind];
    char file[PATH_MAX], judged[PATH_MAX];
    int reach = which(prog, file, sizeof file) ? mlp_elf_reach(file, 0, judged, sizeof judged) : 0;
    if (reach >= 1) {
        /* On stderr unless --quiet, and in the log file either way: a Go server's is the one
         * process of a run whose connections stay on TCP with no line in the log (its clients'
         * say only "no memlan listener on this port"). */
        if (!quiet)
            fprintf(stderr, "memlan run: warning: %s%s%s is %s, so %s will not be "
                            "accelerated\n", file, strcmp(file, judged) ? ": its interpreter " : "",
                    strcmp(file, judged) ? judged : "", mlp_elf_reach_why(reach),
                    mlp_elf_reach_what(reach));
        const char *lf = getenv("MEMLAN_LOG");
        int fd = lf && *lf == '/' ? open(lf, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
        if (fd >= 0) {
            dprintf(fd, "memlan run[%d]: %s%s%s is %s, so %s will not be "
                        "accelerated\n", (int)getpid(), file,
                    strcmp(file, judged) ? ": its interpreter " : "",
                    strcmp(file, judged) ? judged : "", mlp_elf_reach_why(reach),
                    mlp_elf_reach_what(reach));
            close(fd);
        }
    }
    /* A set-user-ID or set-group-ID program runs in secure-execution mode, where the dynamic
     * linker ignores an LD_PRELOAD path (sudo, or a server installed so). */
    struct stat pst;
    if (!quiet && reach == 0 && stat(file, &pst) == 0 &&
        (((pst.st_mode & S_ISUID) && pst.st_uid != geteuid()) ||
         ((pst.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) && pst.st_gid != getegid())))
        fprintf(stderr, "memlan run: warning: %s is set-%s-ID: the dynamic linker ignores "
                        "LD_PRELOAD for it, so its connections will not be accelerated\n", file,
                (pst.st_mode & S_ISUID) && pst.st_uid != geteuid() ? "user" : "group");
    char lib[4096];
    if (find_preload(lib, sizeof lib) < 0) {
        fprintf(stderr, "memlan run: cannot find " PRELOAD_NAME " in ../lib next to this program, in "
                        MEMLAN_LIBDIR ", nor by soname (LD_LIBRARY_PATH, ldconfig); set "
                        "MEMLAN_PRELOAD_LIB to its path\n");
        return 1;
    }
    const char *old = getenv("LD_PRELOAD");
    char *pre;
    if (old && *old) {
        if (asprintf(&pre, "%s:%s", lib, old) < 0)
            return 1;
    } else {
        pre = strdup(lib);
    }
    setenv("LD_PRELOAD", pre, 1);
    free(pre);
    execvp(prog, argv + optind);
    fprintf(stderr, "memlan run: %s: %s\n", prog, strerror(errno));
    return 127;
}

/* ---- version, help, dispatch --------------------------------------------------------------- */

static int cmd_version(int argc, char **argv)
{
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            printf("usage: memlan version\nPrint memlan's version.\n");
            return 0;
        }
        return cli_opt_error("version", c, argv);
    }
    if (optind < argc) {
        fprintf(stderr, "memlan version: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    printf("memlan %d.%d.%d\n", MEMLAN_VERSION_MAJOR, MEMLAN_VERSION_MINOR, MEMLAN_VERSION_PATCH);
    return 0;
}

static int cmd_bench(int argc, char **argv) { return bench_main(argc, argv); }

static const struct {
    const char *name;
    int (*fn)(int, char **);
} commands[] = {
    {"run", cmd_run},     {"stat", cmd_stat},       {"clean", cmd_clean},
    {"fabric", cmd_fabric},
    {"bench", cmd_bench}, {"version", cmd_version},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0)
        return cmd_version(1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc > 2) { /* memlan help COMMAND = memlan COMMAND --help */
            char *sub[] = {argv[2], "--help", NULL};
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (strcmp(argv[2], commands[i].name) == 0)
                    return commands[i].fn(2, sub);
            fprintf(stderr, "memlan: unknown command '%s'\n", argv[2]);
            return 2;
        }
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "memlan: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
