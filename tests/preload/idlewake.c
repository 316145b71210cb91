/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * idlewake PORT THREADS NOFILE: a thread per connection, each blocked in recv on an idle
 * connection (no SO_RCVTIMEO), as a thread-per-connection server's are between requests.  The
 * program first sets RLIMIT_NOFILE's soft limit to NOFILE (through libc's setrlimit, as mariadbd
 * and the JVM raise theirs), makes THREADS connections to itself, lets the receivers settle for
 * a second, then counts for 1.5 s how often each receiver's thread ran (its voluntary context
 * switches, /proc/self/task/TID/status) and how many eventfds the process holds; then every
 * receiver gets its byte.  Over kernel TCP a blocked receiver never runs.  stdout: what must equal
 * kernel TCP's ("received"), then a line of figures for the test ("wakes: ...").
 */
#include "switches.h"
#include "twoends.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

#define MAXT 512

struct rx {
    int fd;
    _Atomic pid_t tid;
    ssize_t r;
    char got;
};

static void *rx_run(void *arg)
{
    struct rx *x = arg;
    atomic_store(&x->tid, gettid());
    x->r = recv(x->fd, &x->got, 1, 0);
    return NULL;
}

static int eventfds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        die("opendir");
    int n = 0;
    struct dirent *e;
    char path[300], link[64];
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k > 0) {
            link[k] = 0;
            n += strcmp(link, "anon_inode:[eventfd]") == 0;
        }
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int nt = atoi(argv[2]);
    if (nt < 1 || nt > MAXT)
        return 2;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        die("getrlimit");
    rl.rlim_cur = (rlim_t)atol(argv[3]);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max)
        rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        die("setrlimit");
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    static struct rx x[MAXT];
    static int c[MAXT];
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 128 << 10);
    pthread_t t[MAXT];
    for (int i = 0; i < nt; i++) {
        c[i] = settled_pair(l, &a, &x[i].fd);
        if (pthread_create(&t[i], &at, rx_run, &x[i]) != 0)
            die("thread");
    }
    for (int i = 0; i < nt; i++)
        while (!atomic_load(&x[i].tid))
            usleep(1000);
    usleep(1000000); /* past the receives' spins and first slices */
    static long v0[MAXT];
    for (int i = 0; i < nt; i++)
        v0[i] = thread_switches(x[i].tid);
    usleep(1500000);
    long most = 0, total = 0;
    for (int i = 0; i < nt; i++) {
        long v = thread_switches(x[i].tid);
        long d = v >= 0 && v0[i] >= 0 ? v - v0[i] : 0;
        most = d > most ? d : most;
        total += d;
    }
    int efds = eventfds();
    for (int i = 0; i < nt; i++)
        if (send(c[i], "z", 1, 0) != 1)
            die("send");
    int ok = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(t[i], NULL);
        ok += x[i].r == 1 && x[i].got == 'z';
    }
    printf("received: %d of %d\n", ok, nt);
    printf("wakes: most %ld total %ld eventfds %d\n", most, total, efds);
    for (int i = 0; i < nt; i++) {
        close(c[i]);
        close(x[i].fd);
    }
    close(l);
    return 0;
}
