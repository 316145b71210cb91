/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* fabric-full: a fabric on a tmpfs too small for every connection never kills a process.
 *
 * A fabric file used to be sized with a sparse ftruncate, so a tmpfs that filled up made the
 * first store to one of its pages fault with SIGBUS (a memcpy in memlan_send).  Here a 2 MiB
 * tmpfs is the fabric.  First the native API: eight clients each create a channel with 256 KiB
 * rings (516 KiB files: three fit), an echo server attaches to those that got one, and a client
 * whose creation fails with -ENOSPC sends over TCP instead; every byte must come back and no
 * process may die of a signal.  Then the socket layer: `memlan run` an echo server and four
 * clients in Python with 512 KiB rings (one fits); the others must fall back to TCP with the
 * reason "fabric full" in the log, and all data must arrive.
 *
 * Needs to mount a tmpfs (root, in a mount namespace of its own so that nothing outlives the
 * test): skipped (77) where that is not permitted. */
#include "test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>

#define NCLIENTS 8
#define RING (256u * 1024u)
#define XFER (1u << 20)
#define CHUNK 16384u

static char dir[64];

static int writen(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int readn(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

/* One server-side connection: 'C' + token (attach and echo over the channel) or 'T' (TCP). */
static int serve_one(int s)
{
    char mode;
    if (readn(s, &mode, 1) < 0)
        return 1;
    static char buf[CHUNK];
    if (mode == 'T') {
        for (;;) {
            ssize_t n = read(s, buf, sizeof buf);
            if (n == 0)
                return 0;
            if (n < 0 || writen(s, buf, (size_t)n) < 0)
                return 1;
        }
    }
    char tok[MEMLAN_TOKEN_LEN + 1] = {0};
    if (mode != 'C' || readn(s, tok, MEMLAN_TOKEN_LEN) < 0)
        return 1;
    memlan_fabric_t *fab;
    memlan_channel_t *ch;
    if (memlan_fabric_open(dir, &fab) < 0 || memlan_channel_attach(fab, tok, &ch) < 0)
        return 1;
    char ok = 'A';
    if (writen(s, &ok, 1) < 0)
        return 1;
    for (;;) {
        ssize_t n = memlan_recv(ch, buf, sizeof buf, 0);
        if (n == 0)
            break;
        if (n < 0 || memlan_send(ch, buf, (size_t)n, 0) != n)
            return 1;
    }
    memlan_channel_close(ch);
    memlan_fabric_close(fab);
    return 0;
}

/* 0: echoed over a channel, 3: the fabric was full and it went over TCP; anything else fails. */
static int client(int port, int ready_w, int go_r, int k)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
        return 1;
    memlan_fabric_t *fab;
    if (memlan_fabric_open(dir, &fab) < 0)
        return 1;
    memlan_channel_t *ch = NULL;
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = RING};
    int r = memlan_channel_create(fab, &o, &ch);
    if (r < 0 && r != -ENOSPC) {
        fprintf(stderr, "client %d: create: %s\n", k, strerror(-r));
        return 1;
    }
    char hello[1 + MEMLAN_TOKEN_LEN];
    hello[0] = ch ? 'C' : 'T';
    if (ch)
        memcpy(hello + 1, memlan_channel_token(ch), MEMLAN_TOKEN_LEN);
    if (writen(s, hello, ch ? sizeof hello : 1) < 0)
        return 1;
    char c;
    if (ch && (readn(s, &c, 1) < 0 || c != 'A'))
        return 1;
    /* Every client holds its channel (or its refusal) before any sends: the fabric is full. */
    if (write(ready_w, "r", 1) != 1 || read(go_r, &c, 1) != 0)
        return 1;
    static uint8_t out[CHUNK], in[CHUNK];
    for (uint32_t off = 0; off < XFER; off += CHUNK) {
        for (uint32_t i = 0; i < CHUNK; i++)
            out[i] = (uint8_t)(k * 31 + (off + i) * 7 + (off + i) / 251);
        if (ch) {
            if (memlan_send(ch, out, CHUNK, 0) != CHUNK ||
                memlan_recv(ch, in, CHUNK, MEMLAN_WAITALL) != CHUNK)
                return 1;
        } else if (writen(s, out, CHUNK) < 0 || readn(s, in, CHUNK) < 0) {
            return 1;
        }
        if (memcmp(in, out, CHUNK) != 0) {
            fprintf(stderr, "client %d: wrong data at %u\n", k, off);
            return 1;
        }
    }
    if (ch)
        memlan_channel_close(ch);
    close(s);
    memlan_fabric_close(fab);
    return ch ? 0 : 3;
}

/* Exit status of a child as the test reads it: a signal is 128 + its number. */
static const char *how(int st, char *buf, size_t n)
{
    snprintf(buf, n, st >= 128 ? "killed by signal %d" : "exit %d", st >= 128 ? st - 128 : st);
    return buf;
}

static int native_part(void)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    ASSERT_OK(bind(ls, (struct sockaddr *)&a, sizeof a));
    ASSERT_OK(listen(ls, NCLIENTS));
    ASSERT_OK(getsockname(ls, (struct sockaddr *)&a, &al));
    int port = ntohs(a.sin_port);
    pid_t server = fork();
    ASSERT_GE(server, 0);
    if (server == 0) {
        pid_t h[NCLIENTS];
        for (int i = 0; i < NCLIENTS; i++) {
            int s = accept(ls, NULL, NULL);
            if (s < 0)
                _exit(1);
            if ((h[i] = fork()) == 0)
                _exit(serve_one(s));
            close(s);
        }
        int bad = 0;
        char b[40];
        for (int i = 0; i < NCLIENTS; i++) {
            int st = ml_test_wait_child(h[i]);
            if (st) {
                fprintf(stderr, "server handler %d: %s\n", i, how(st, b, sizeof b));
                bad = 1;
            }
        }
        _exit(bad);
    }
    close(ls);
    int ready[2], go[2];
    ASSERT_OK(pipe(ready));
    ASSERT_OK(pipe(go));
    pid_t c[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++) {
        if ((c[i] = fork()) == 0) {
            close(go[1]);
            _exit(client(port, ready[1], go[0], i));
        }
    }
    close(go[0]);
    close(ready[1]);
    for (int i = 0; i < NCLIENTS; i++) { /* a client that died first ends this early */
        char x;
        if (read(ready[0], &x, 1) != 1)
            break;
    }
    close(go[1]);
    int chan = 0, tcp = 0, bad = 0;
    char b[40];
    for (int i = 0; i < NCLIENTS; i++) {
        int st = ml_test_wait_child(c[i]);
        if (st == 0)
            chan++;
        else if (st == 3)
            tcp++;
        else {
            fprintf(stderr, "native client %d: %s\n", i, how(st, b, sizeof b));
            bad++;
        }
    }
    int st = ml_test_wait_child(server);
    if (st)
        fprintf(stderr, "native server: %s\n", how(st, b, sizeof b));
    printf("native: %d clients over channels, %d fell back to TCP (fabric full)\n", chan, tcp);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(st, 0);
    ASSERT_GE(chan, 1);
    ASSERT_GE(tcp, 1); /* the fabric really was full */
    return 0;
}

/* ---- under `memlan run` ------------------------------------------------------------------- */

static const char py_server[] =
    "import socket, sys, threading\n"
    "n = int(sys.argv[1])\n"
    "ls = socket.socket(); ls.bind(('127.0.0.1', 0)); ls.listen(n)\n"
    "print(ls.getsockname()[1], flush=True)\n"
    "def echo(s):\n"
    "    while True:\n"
    "        b = s.recv(65536)\n"
    "        if not b: break\n"
    "        s.sendall(b)\n"
    "    s.close()\n"
    "ts = []\n"
    "for i in range(n):\n"
    "    s, _ = ls.accept(); t = threading.Thread(target=echo, args=(s,)); t.start(); ts.append(t)\n"
    "for t in ts: t.join()\n";

static const char py_client[] =
    "import socket, sys\n"
    "port, k = int(sys.argv[1]), int(sys.argv[2])\n"
    "s = socket.create_connection(('127.0.0.1', port))\n"
    "print('c', flush=True); sys.stdin.read(1)\n"
    "data = bytes((k * 31 + i * 7) & 255 for i in range(65536))\n"
    "for r in range(32):\n"
    "    s.sendall(data); got = b''\n"
    "    while len(got) < len(data):\n"
    "        b = s.recv(len(data) - len(got))\n"
    "        if not b: sys.exit('EOF after %d bytes' % len(got))\n"
    "        got += b\n"
    "    if got != data: sys.exit('wrong data')\n"
    "s.close()\n";

#define NPY 4

static pid_t spawn(const char *memlan, const char *script, char *a1, char *a2, int *in_w,
                   int *out_r)
{
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0)
        return -1;
    pid_t p = fork();
    if (p == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        char *argv[] = {(char *)memlan, "run", "python3", "-c", (char *)script, a1, a2, NULL};
        execv(memlan, argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    *in_w = in[1];
    *out_r = out[0];
    return p;
}

static int read_line(int fd, char *buf, size_t n)
{
    size_t i = 0;
    while (i + 1 < n) {
        ssize_t r = read(fd, buf + i, 1);
        if (r <= 0)
            return -1;
        if (buf[i] == '\n')
            break;
        i++;
    }
    buf[i] = 0;
    return 0;
}

static int preload_part(const char *log)
{
    char self[PATH_MAX], memlan[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT_GE(n, 1);
    self[n] = 0;
    *strrchr(self, '/') = 0; /* BUILD/tests */
    snprintf(memlan, sizeof memlan, "%s/../bin/memlan", self);
    if (access(memlan, X_OK) != 0 || system("python3 -c pass") != 0) {
        printf("memlan run part skipped: no %s or no python3\n", memlan);
        return 0;
    }
    setenv("MEMLAN_FABRIC", dir, 1);
    setenv("MEMLAN_RING_KB", "512", 1);
    setenv("MEMLAN_LOG", log, 1);
    unsetenv("MEMLAN_OFF");
    char nstr[8], port[16], kstr[NPY][8];
    snprintf(nstr, sizeof nstr, "%d", NPY);
    int sin, sout;
    pid_t server = spawn(memlan, py_server, nstr, NULL, &sin, &sout);
    ASSERT_GE(server, 1);
    ASSERT_OK(read_line(sout, port, sizeof port));
    pid_t c[NPY];
    int cin[NPY], cout[NPY];
    for (int i = 0; i < NPY; i++) {
        snprintf(kstr[i], sizeof kstr[i], "%d", i);
        c[i] = spawn(memlan, py_client, port, kstr[i], &cin[i], &cout[i]);
        ASSERT_GE(c[i], 1);
    }
    char line[8];
    for (int i = 0; i < NPY; i++) /* every client connected: the fabric is as full as it gets */
        (void)read_line(cout[i], line, sizeof line);
    for (int i = 0; i < NPY; i++)
        close(cin[i]);
    int bad = 0;
    char b[40];
    for (int i = 0; i < NPY; i++) {
        int st = ml_test_wait_child(c[i]);
        if (st) {
            fprintf(stderr, "memlan run client %d: %s\n", i, how(st, b, sizeof b));
            bad++;
        }
    }
    int st = ml_test_wait_child(server);
    if (st)
        fprintf(stderr, "memlan run server: %s\n", how(st, b, sizeof b));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -c 'fabric full' %s", log);
    FILE *f = popen(cmd, "r");
    int full = 0;
    if (f) {
        if (fscanf(f, "%d", &full) != 1)
            full = 0;
        pclose(f);
    }
    printf("memlan run: %d of %d connections reported \"fabric full\"\n", full, NPY);
    if (bad || st || full < 1) {
        snprintf(cmd, sizeof cmd, "cat %s >&2", log);
        (void)system(cmd);
    }
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(st, 0);
    ASSERT_GE(full, 1);
    return 0;
}

int main(void)
{
    ml_test_watchdog(120);
    setvbuf(stdout, NULL, _IONBF, 0); /* children leave with _exit */
    snprintf(dir, sizeof dir, "/tmp/memlan-full-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char log[96];
    snprintf(log, sizeof log, "%s.log", dir);
    pid_t p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
        /* A mount namespace of our own: the tmpfs goes with the last process of the test even if
         * the watchdog kills it. */
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0700") < 0) {
            printf("fabric-full: skipped, cannot mount a tmpfs: %s\n", strerror(errno));
            _exit(77);
        }
        /* MEMLAN_TEST_PART=preload runs the second part alone (to see it fail on old code). */
        const char *part = getenv("MEMLAN_TEST_PART");
        if (!part || strcmp(part, "preload") != 0) {
            native_part();
            /* the native part leaves nothing behind */
            snprintf(ml_test_dir, sizeof ml_test_dir, "%s", dir);
            ASSERT_EQ(ml_test_count_files(), 0);
        }
#ifdef __SANITIZE_ADDRESS__
        (void)preload_part;
        printf("memlan run part skipped: the preload library of a sanitizer build needs the "
               "sanitizer's runtime in the program\n");
#else
        preload_part(log);
#endif
        umount2(dir, MNT_DETACH);
        _exit(0);
    }
    int st = ml_test_wait_child(p);
    unlink(log);
    rmdir(dir);
    if (st == 0)
        printf("fabric-full: ok, no process died, all data arrived\n");
    return st == 0 || st == 77 ? st : 1;
}
