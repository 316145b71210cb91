/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * manyconn: one epoll server with N idle connections and one busy one.  Plain POSIX; run over
 * kernel TCP and under `memlan run` (tests/py/test_scale.py, bench/epoll.sh).
 *
 * usage: manyconn N ROUNDS [CLIENT_PROCS] [SERVER_CPU CLIENT_CPU]
 *
 * The parent is the server: one listener, one epoll set (level-triggered EPOLLIN on every
 * connection), echoing whatever arrives.  CLIENT_PROCS forked children (default 4) open the N
 * idle connections between them, each sends one byte and checks its echo, and then they wait.
 * When all are up, the server measures its memory, and one more child (forked at the start, so
 * that it holds none of the server's sockets) opens the busy connection and ping-pongs ROUNDS 64-byte messages through it, timing each round trip, while the N others
 * sit in the same epoll set.  Then the busy client closes, the server closes every idle
 * connection, and the idle clients check that each one reads EOF.  It prints one line of JSON:
 *   {"n":..., "accepted":..., "closed":..., "rtt_p50_us":..., "rtt_p99_us":...,
 *    "rss_kb_before":..., "rss_kb_after":..., "fabric_kb_before":..., "fabric_kb_after":...,
 *    "fds_per_conn":..., "maps_per_conn":..., "failed_children":...}
 * and exits 0 only if every connection carried its bytes and closed cleanly.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "manyconn[%d]: %s: %s\n", (int)getpid(), what, strerror(errno));
    exit(2);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) < 0)
        die("sched_setaffinity");
}

static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':')
            v = atol(line + k + 1);
    if (f)
        fclose(f);
    return v;
}

/* Bytes of tmpfs the fabric's files hold (0 without memlan). */
static long fabric_kb(void)
{
    char def[64];
    const char *dir = getenv("MEMLAN_FABRIC");
    if (!dir || !*dir) {
        snprintf(def, sizeof def, "/dev/shm/memlan-%u", (unsigned)getuid());
        dir = def;
    }
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    long kb = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            kb += (long)st.st_blocks / 2;
    }
    closedir(d);
    return kb;
}

static int count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    while (f && (c = getc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n - 3; /* ., .. and the directory's own fd */
}

static void raise_nofile(long want)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) < 0)
        die("getrlimit");
    if ((long)r.rlim_cur >= want)
        return;
    r.rlim_cur = (rlim_t)want;
    if ((long)r.rlim_max < want)
        r.rlim_max = (rlim_t)want; /* allowed with CAP_SYS_RESOURCE only */
    if (setrlimit(RLIMIT_NOFILE, &r) < 0) {
        getrlimit(RLIMIT_NOFILE, &r);
        fprintf(stderr, "manyconn: needs RLIMIT_NOFILE >= %ld, hard limit is %ld\n", want,
                (long)r.rlim_max);
        exit(3);
    }
}

static void full_write(int fd, const void *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("write");
        p = (const char *)p + w;
        n -= (size_t)w;
    }
}

static void full_read(int fd, void *p, size_t n)
{
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = EPIPE;
            die("read");
        }
        p = (char *)p + r;
        n -= (size_t)r;
    }
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int tries = 0; connect(fd, (struct sockaddr *)&a, sizeof a) < 0; tries++) {
        if (errno != EAGAIN && errno != ECONNREFUSED && errno != EINTR)
            die("connect");
        if (tries > 1000)
            die("connect (backlog full for 10 s)");
        usleep(10000);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* An idle client: opens its share, checks one echo on each, says so, then waits for the server
 * to close each one (EOF), and closes its ends.  The server closes first so that the TIME_WAIT
 * sockets are its own, all on its one port, not 10,000 of the ephemeral ports that other
 * programs on this machine might be about to bind. */
static void idle_client(int port, int count, int id, int ready_w)
{
    int *fds = malloc(sizeof(int) * (size_t)(count ? count : 1));
    if (!fds)
        die("malloc");
    for (int i = 0; i < count; i++) {
        fds[i] = dial(port);
        unsigned char c = (unsigned char)(id * 31 + i), back;
        full_write(fds[i], &c, 1);
        full_read(fds[i], &back, 1);
        if (back != c) {
            fprintf(stderr, "manyconn: connection %d of client %d echoed %u for %u\n", i, id,
                    back, c);
            exit(4);
        }
    }
    full_write(ready_w, "R", 1);
    for (int i = 0; i < count; i++) {
        char x;
        ssize_t r;
        while ((r = read(fds[i], &x, 1)) < 0 && errno == EINTR)
            ;
        if (r != 0) {
            fprintf(stderr, "manyconn: connection %d of client %d: read %zd, not EOF\n", i, id, r);
            exit(4);
        }
        close(fds[i]);
    }
    exit(0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The busy client: forked before the server accepts anything (so that it holds none of the
 * server's sockets); waits for the word, ping-pongs, then reports the round trips. */
static void busy_client(int port, int rounds, int go_r, int out_w)
{
    char go;
    if (read(go_r, &go, 1) != 1)
        exit(0); /* the server gave up */
    int fd = dial(port);
    char msg[64], back[64];
    double *t = malloc(sizeof(double) * (size_t)rounds);
    if (!t)
        die("malloc");
    for (int i = 0; i < rounds; i++) {
        memset(msg, 'a' + i % 26, sizeof msg);
        double t0 = now_us();
        full_write(fd, msg, sizeof msg);
        full_read(fd, back, sizeof back);
        t[i] = now_us() - t0;
        if (memcmp(msg, back, sizeof msg) != 0) {
            fprintf(stderr, "manyconn: busy connection echoed wrong bytes\n");
            exit(4);
        }
    }
    qsort(t, (size_t)rounds, sizeof *t, cmp_double);
    double r[2] = {t[rounds / 2], t[rounds * 99 / 100]};
    full_write(out_w, r, sizeof r);
    close(fd);
    exit(0);
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4 && argc != 6) {
        fprintf(stderr, "usage: manyconn N ROUNDS [CLIENT_PROCS] [SERVER_CPU CLIENT_CPU]\n");
        return 2;
    }
    int n = atoi(argv[1]), rounds = atoi(argv[2]);
    int procs = argc >= 4 ? atoi(argv[3]) : 4;
    int scpu = argc == 6 ? atoi(argv[4]) : -1, ccpu = argc == 6 ? atoi(argv[5]) : -1;
    if (n < 0 || rounds < 1 || procs < 1 || procs > 64)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    alarm(getenv("MANYCONN_ALARM") ? (unsigned)atoi(getenv("MANYCONN_ALARM")) : 300); /* bounded, whatever happens */
    /* One descriptor per connection, as over kernel TCP: memlan must not need more. */
    raise_nofile((long)n + 64);

    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (l < 0)
        die("socket");
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4096) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0)
        die("listen");
    int port = ntohs(a.sin_port);

    int ready[2], res[2], go[2];
    int *conns = malloc(sizeof(int) * ((size_t)n + 1));
    if (!conns || pipe(ready) < 0 || pipe(res) < 0 || pipe(go) < 0)
        die("pipe");
    long rss0 = status_kb("VmRSS"), fab0 = fabric_kb();
    int fds0 = open_fds(), maps0 = count_maps();
    pid_t kids[66];
    int nkids = 0;
    pid_t busy = fork();
    if (busy < 0)
        die("fork");
    if (busy == 0) {
        close(l);
        close(ready[0]);
        close(ready[1]);
        close(res[0]);
        close(go[1]);
        pin(ccpu);
        busy_client(port, rounds, go[0], res[1]);
    }
    kids[nkids++] = busy;
    close(go[0]);
    for (int i = 0; i < procs; i++) {
        int share = n / procs + (i < n % procs);
        pid_t p = fork();
        if (p < 0)
            die("fork");
        if (p == 0) {
            close(l);
            close(ready[0]);
            close(res[0]);
            close(go[1]);
            pin(ccpu);
            idle_client(port, share, i, ready[1]);
        }
        kids[nkids++] = p;
    }
    close(ready[1]);
    pin(scpu);

    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) < 0)
        die("epoll");
    ev.data.fd = ready[0];
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ready[0], &ev) < 0)
        die("epoll_ctl ready");
    int accepted = 0, closed = 0, readies = 0, busy_started = 0, open_conns = 0;
    long rss1 = 0, fab1 = 0;
    int fds1 = 0, maps1 = 0;
    struct epoll_event evs[64];
    char buf[4096];
    while (busy_started != 2) {
        int k = epoll_wait(ep, evs, 64, 60000);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            die(k == 0 ? "epoll_wait: 60 s without an event" : "epoll_wait");
        for (int i = 0; i < k; i++) {
            int fd = evs[i].data.fd;
            if (fd == l) {
                int c;
                while ((c = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce) < 0)
                        die("epoll_ctl");
                    if (accepted == n + 1)
                        die("more connections than clients");
                    conns[accepted++] = c;
                    open_conns++;
                }
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                    die("accept4");
            } else if (fd == ready[0]) {
                char r;
                ssize_t got = read(ready[0], &r, 1);
                if (got == 1 && ++readies == procs) {
                    /* Every idle connection is up and has echoed: measure, then go busy. */
                    rss1 = status_kb("VmRSS");
                    fab1 = fabric_kb();
                    fds1 = open_fds();
                    maps1 = count_maps();
                    full_write(go[1], "G", 1);
                    busy_started = 1;
                } else if (got <= 0) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, ready[0], NULL);
                }
            } else {
                ssize_t r = read(fd, buf, sizeof buf);
                if (r > 0) {
                    ssize_t w = 0;
                    while (w < r) {
                        ssize_t x = write(fd, buf + w, (size_t)(r - w));
                        if (x < 0 && errno == EAGAIN)
                            continue; /* 64 B at a time: never more than a moment */
                        if (x <= 0)
                            die("echo write");
                        w += x;
                    }
                } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                    close(fd);
                    closed++;
                    open_conns--;
                    for (int j = 0; j < accepted; j++)
                        if (conns[j] == fd)
                            conns[j] = -1;
                    /* The busy client is done: the server closes every idle connection. */
                    if (busy_started == 1 && closed == 1) {
                        for (int j = 0; j < accepted; j++)
                            if (conns[j] >= 0) {
                                epoll_ctl(ep, EPOLL_CTL_DEL, conns[j], NULL);
                                close(conns[j]);
                                conns[j] = -1;
                                open_conns--;
                                closed++;
                            }
                        busy_started = 2;
                    }
                }
            }
        }
    }
    close(ep);
    close(l);
    close(go[1]);
    double rt[2] = {0, 0};
    close(res[1]);
    if (busy_started)
        full_read(res[0], rt, sizeof rt);
    int bad = 0;
    for (int i = 0; i < nkids; i++) {
        int st;
        if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    printf("{\"n\": %d, \"accepted\": %d, \"closed\": %d, \"rtt_p50_us\": %.3f, "
           "\"rtt_p99_us\": %.3f, \"rss_kb_before\": %ld, \"rss_kb_after\": %ld, "
           "\"fabric_kb_before\": %ld, \"fabric_kb_after\": %ld, \"fds_per_conn\": %.2f, \"maps_per_conn\": %.2f, "
           "\"failed_children\": %d}\n",
           n, accepted, closed, rt[0], rt[1], rss0, rss1, fab0, fab1,
           n ? (double)(fds1 - fds0) / n : 0.0, n ? (double)(maps1 - maps0) / n : 0.0, bad);
    return bad || accepted != n + 1 || closed != n + 1 || open_conns != 0 ? 1 : 0;
}
