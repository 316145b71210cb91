/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * memlan - the command-line tool.
 *
 *   memlan run [OPTIONS] -- PROGRAM [ARGS]   run PROGRAM with transparent acceleration
 *   memlan bench [--quick] [--json] [--plot FILE.svg] [--placement split|same|both]
 *   memlan stat  [--json]     the fabric's live segments, channels and event queues
 *   memlan clean              reclaim the files of dead processes
 *   memlan version
 */
#include "bench.h"
#include "memlan.h"
#include "memlan/layout.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: memlan COMMAND [ARGS]\n"
               "  run [OPTIONS] -- PROGRAM [ARGS]\n"
               "                 run PROGRAM with its TCP connections to other memlan processes\n"
               "                 carried over shared memory (LD_PRELOAD); see memlan run --help\n"
               "  bench [--quick] [--json] [--plot FILE.svg] [--placement split|same|both]\n"
               "                 measure latency, bandwidth and message rate against floors and\n"
               "                 kernel TCP, Unix sockets and pipes in the same run\n"
               "  stat [--json]  list the fabric's segments, channels and event queues\n"
               "  clean          remove the fabric files of processes that have died\n"
               "  version        print the version\n"
               "environment: MEMLAN_FABRIC (fabric directory), MEMLAN_SPIN_US (spin budget)\n");
}

static const char *kind_name(uint32_t k)
{
    return k == ML_KIND_RAW ? "segment" : k == ML_KIND_CHANNEL ? "channel" : k == ML_KIND_EVQ ? "evq"
         : k == ML_KIND_PROC ? "process" : "?";
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

/* The connections a memlan process lists in its ML_KIND_PROC segment. */
static void proc_conns(const char *dir, int fd, const struct ml_seg_hdr *h, int json, char **out,
                       int *n)
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
        char what[300];
        if (c.state == ML_CONN_ACCEL) {
            char tok[ML_TOKEN_HEX + 1], path[4400];
            memcpy(tok, c.token, ML_TOKEN_HEX);
            tok[ML_TOKEN_HEX] = 0;
            snprintf(path, sizeof path, "%s/seg-%s", dir, tok);
            unsigned long long b0 = 0, b1 = 0, w0 = 0, w1 = 0, s0 = 0, s1 = 0;
            int cfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            if (cfd >= 0) {
                struct ml_chan_hdr ch;
                struct ml_ring_ctl r0, r1;
                if (pread(cfd, &ch, sizeof ch, sizeof(struct ml_seg_hdr)) == sizeof ch &&
                    ch.ctl_off[0] < 4096 && ch.ctl_off[1] < 4096 &&
                    pread(cfd, &r0, sizeof r0, (off_t)ch.ctl_off[0]) == sizeof r0 &&
                    pread(cfd, &r1, sizeof r1, (off_t)ch.ctl_off[1]) == sizeof r1) {
                    b0 = r0.head, b1 = r1.head, w0 = r0.wakeups, w1 = r1.wakeups;
                    s0 = r0.spin_hits, s1 = r1.spin_hits;
                }
                close(cfd);
            }
            snprintf(what, sizeof what,
                     "accelerated: bytes out/in %llu/%llu, wake-ups %llu, spin hits %llu",
                     b0, b1, w0 + w1, s0 + s1);
        } else {
            snprintf(what, sizeof what, "%s: %s", c.state == ML_CONN_TCP ? "TCP" : "waiting",
                     c.why);
        }
        if (json) {
            char item[800];
            snprintf(item, sizeof item,
                     "%s{\"pid\":%d,\"fd\":%d,\"local\":\"%s\",\"remote\":\"%s\","
                     "\"state\":\"%s\",\"detail\":\"%s\"}",
                     *n ? "," : "", ph.pid, c.fd, c.local, c.remote,
                     c.state == ML_CONN_ACCEL ? "accelerated" : c.state == ML_CONN_TCP ? "tcp" : "waiting",
                     what);
            size_t len = *out ? strlen(*out) : 0;
            char *p = realloc(*out, len + strlen(item) + 1);
            if (p) {
                strcpy(p + len, item);
                *out = p;
            }
        } else {
            printf("  conn pid %d fd %d %s -> %s %s\n", ph.pid, c.fd, c.local, c.remote, what);
        }
        (*n)++;
    }
}

static int cmd_stat(int json)
{
    char *conn_json = NULL;
    int nconn = 0;
    /* stat only looks: it does not open the fabric through the library, whose lazy reclaim
     * would remove the dead processes' files that stat is there to show. */
    char dir[4096];
    const char *env = getenv("MEMLAN_FABRIC");
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else
        snprintf(dir, sizeof dir, "/dev/shm/memlan-%u", (unsigned)getuid());
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            printf(json ? "{\"fabric\":\"%s\",\"objects\":[],\"connections\":[]}\n" : "fabric %s: (empty)\n", dir);
            return 0;
        }
        perror(dir);
        return 1;
    }
    int n = 0;
    if (json)
        printf("{\"fabric\":\"%s\",\"objects\":[", dir);
    else
        printf("fabric %s\n%-8s %-32s %7s %-5s %s\n", dir, "KIND", "TOKEN", "PID", "LIVE", "DETAIL");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "seg-", 4) != 0)
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct ml_seg_hdr h;
        if (pread(fd, &h, sizeof h, 0) != sizeof h || h.magic != ML_SEG_MAGIC) {
            close(fd);
            continue;
        }
        int live = held(fd, ML_LOCK_OWNER);
        char detail[512] = "";
        if (h.version != ML_LAYOUT_VERSION) {
            snprintf(detail, sizeof detail, "unknown layout version %u", h.version);
        } else if (h.kind == ML_KIND_CHANNEL) {
            struct ml_chan_hdr c;
            struct ml_ring_ctl r0, r1;
            if (pread(fd, &c, sizeof c, (off_t)h.body_off) == sizeof c &&
                c.ctl_off[0] < 4096 && c.ctl_off[1] < 4096 &&
                pread(fd, &r0, sizeof r0, (off_t)c.ctl_off[0]) == sizeof r0 &&
                pread(fd, &r1, sizeof r1, (off_t)c.ctl_off[1]) == sizeof r1)
                snprintf(detail, sizeof detail,
                         "%s ring %u B; pids %d/%d; state %s/%s; attacher %s; "
                         "bytes 0->1 %llu, 1->0 %llu",
                         c.chan_kind == ML_CHAN_MSG ? "message" : "stream", c.ring_size,
                         c.side_pid[0], c.side_pid[1], side_state(c.side_state[0]),
                         side_state(c.side_state[1]),
                         c.attached ? (held(fd, ML_LOCK_ATTACHER) == 1 ? "live" : "gone") : "none",
                         (unsigned long long)r0.head, (unsigned long long)r1.head);
        } else if (h.kind == ML_KIND_PROC) {
            struct ml_proc_hdr ph;
            if (pread(fd, &ph, sizeof ph, (off_t)h.body_off) == sizeof ph)
                snprintf(detail, sizeof detail, "%.55s: %llu accelerated, %llu on TCP so far",
                         ph.cmd, (unsigned long long)ph.accel_total,
                         (unsigned long long)ph.tcp_total);
        } else if (h.kind == ML_KIND_EVQ) {
            struct ml_evq_hdr q;
            if (pread(fd, &q, sizeof q, (off_t)h.body_off) == sizeof q)
                snprintf(detail, sizeof detail, "capacity %u; posts %llu; wake-ups %llu",
                         q.capacity, (unsigned long long)q.posts, (unsigned long long)q.wakeups);
        } else {
            snprintf(detail, sizeof detail, "%llu bytes, %s%s", (unsigned long long)h.body_size,
                     h.mode == MEMLAN_MODE_RO ? "read-only" : "read-write",
                     h.state == ML_SEG_REVOKED ? ", revoked" : "");
        }
        if (json)
            printf("%s{\"kind\":\"%s\",\"token\":\"%s\",\"pid\":%d,\"live\":%s,\"detail\":\"%s\"}",
                   n ? "," : "", kind_name(h.kind), e->d_name + 4, h.owner_pid,
                   live == 1 ? "true" : "false", detail);
        else
            printf("%-8s %-32s %7d %-5s %s\n", kind_name(h.kind), e->d_name + 4, h.owner_pid,
                   live == 1 ? "yes" : "DEAD", detail);
        if (h.kind == ML_KIND_PROC && h.version == ML_LAYOUT_VERSION && live == 1)
            proc_conns(dir, fd, &h, json, &conn_json, &nconn);
        n++;
        close(fd);
    }
    closedir(d);
    if (json)
        printf("],\"connections\":[%s]}\n", conn_json ? conn_json : "");
    else if (!n)
        printf("(empty)\n");
    free(conn_json);
    return 0;
}

static int cmd_clean(void)
{
    memlan_fabric_t *fab;
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0) {
        fprintf(stderr, "memlan clean: %s\n", strerror(-r));
        return 1;
    }
    r = memlan_fabric_clean(fab);
    if (r < 0) {
        fprintf(stderr, "memlan clean: %s\n", strerror(-r));
        memlan_fabric_close(fab);
        return 1;
    }
    printf("memlan clean: removed %d file(s) of dead processes from %s\n", r,
           memlan_fabric_path(fab));
    memlan_fabric_close(fab);
    return 0;
}

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: memlan run [OPTIONS] [--] PROGRAM [ARGS]\n"
            "  --spin-us N         spin budget before sleeping (MEMLAN_SPIN_US; 0 = never spin)\n"
            "  --fabric DIR        fabric directory (MEMLAN_FABRIC; default /dev/shm/memlan-UID)\n"
            "  --ports LIST        accelerate only these server ports, e.g. 80,8000-8100\n"
            "                      (MEMLAN_PORTS)\n"
            "  --no-ports LIST     never accelerate these server ports (MEMLAN_NO_PORTS)\n"
            "  --log stderr|FILE   log each decision (MEMLAN_LOG)\n"
            "  --log-level N       0 errors, 1 decisions, 2 debug (MEMLAN_LOG_LEVEL)\n"
            "  --accept-wait-ms N  how long a client's offer waits for a memlan accept before the\n"
            "                      connection stays on TCP (MEMLAN_ACCEPT_WAIT_MS, default 2000)\n"
            "  --ring-kb N         ring size per direction, KiB, unless SO_SNDBUF/SO_RCVBUF set\n"
            "                      before connect say otherwise (MEMLAN_RING_KB, default 256)\n"
            "  --off               load the library but accelerate nothing (MEMLAN_OFF=1)\n"
            "Children inherit the settings.  memlan stat shows the connections and, for each one\n"
            "that stayed on TCP, why.\n");
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

static int cmd_run(int argc, char **argv)
{
    static const struct { const char *opt, *env; } opts[] = {
        {"--spin-us", "MEMLAN_SPIN_US"}, {"--fabric", "MEMLAN_FABRIC"},
        {"--ports", "MEMLAN_PORTS"},     {"--no-ports", "MEMLAN_NO_PORTS"},
        {"--log", "MEMLAN_LOG"},         {"--log-level", "MEMLAN_LOG_LEVEL"},
        {"--accept-wait-ms", "MEMLAN_ACCEPT_WAIT_MS"}, {"--ring-kb", "MEMLAN_RING_KB"},
    };
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            run_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--off") == 0) {
            setenv("MEMLAN_OFF", "1", 1);
            continue;
        }
        if (a[0] != '-')
            break;
        size_t k = 0;
        for (; k < sizeof opts / sizeof opts[0]; k++) {
            size_t l = strlen(opts[k].opt);
            if (strncmp(a, opts[k].opt, l) == 0 && (a[l] == 0 || a[l] == '=')) {
                const char *v = a[l] == '=' ? a + l + 1 : (i + 1 < argc ? argv[++i] : NULL);
                if (!v) {
                    fprintf(stderr, "memlan run: %s needs a value\n", opts[k].opt);
                    return 2;
                }
                setenv(opts[k].env, v, 1);
                break;
            }
        }
        if (k == sizeof opts / sizeof opts[0]) {
            fprintf(stderr, "memlan run: unknown option '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        run_usage(stderr);
        return 2;
    }
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
    execvp(argv[i], argv + i);
    fprintf(stderr, "memlan run: %s: %s\n", argv[i], strerror(errno));
    return 127;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "bench") == 0)
        return bench_main(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "stat") == 0)
        return cmd_stat(argc > 2 && strcmp(argv[2], "--json") == 0);
    if (strcmp(cmd, "clean") == 0)
        return cmd_clean();
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("memlan %d.%d\n", MEMLAN_VERSION_MAJOR, MEMLAN_VERSION_MINOR);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "memlan: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
