/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * lockpage: a connection's locks and O_NONBLOCK before and after a fork.  Run once over kernel
 * TCP and once under `memlan run` (tests/py/test_preload.py): stdout must be the same.
 *   stderr "unforked: N pages"   shared anonymous mappings (/dev/zero in /proc/self/maps) that 8
 *                                connections, both ends in this process, made while nothing
 *                                forked: memlan's lock page is made only when a socket is
 *                                forked (it used to be made with every connection: an mmap,
 *                                two signal-mask calls and an munmap, on both ends)
 *   stderr "forked: N pages"     the same, in the fork child: a page per connection end now,
 *                                and the page the first fork makes for the family's notes
 *   nonblock    O_NONBLOCK set by the child on one connection and cleared on another is seen by
 *               the parent (one open file, as the kernel's flag): a receive on an empty socket
 *               fails at once, or waits for its SO_RCVTIMEO
 *   toggle      100 rounds: a thread sets and clears O_NONBLOCK 200 times (ending set) while
 *               the main thread forks a child that exits at once (the fork moves the flags to
 *               the page): the receive that follows on the empty socket fails at once
 *
 * usage: lockpage PORT
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "twoends.h"

static int shared_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        die("maps");
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "/dev/zero"))
            n++;
    fclose(f);
    return n;
}

static void set_nb(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) != 0)
        die("fcntl");
}

/* A receive on an empty socket: "at once" (EAGAIN, nonblocking) or "waited" (its 300 ms
 * SO_RCVTIMEO, blocking). */
static const char *empty_recv(int fd)
{
    struct timeval tv = {0, 300000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b;
    double t0 = now_s();
    ssize_t r = recv(fd, &b, 1, 0);
    double dt = now_s() - t0;
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
        return "unexpected";
    return dt < 0.15 ? "at once" : dt > 0.25 ? "waited" : "in between";
}

struct toggler {
    int fd;
    pthread_barrier_t *go;
};

static void *toggle(void *arg)
{
    struct toggler *t = arg;
    pthread_barrier_wait(t->go);
    for (int i = 0; i < 200; i++)
        set_nb(t->fd, i % 2 == 0);
    set_nb(t->fd, true);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a;
    int l = listen_backlog(atoi(argv[1]), 16, &a);
    enum { N = 8 };
    int c[N], s[N];
    int m0 = shared_maps();
    for (int i = 0; i < N; i++)
        c[i] = settled_pair(l, &a, &s[i]);
    char b;
    for (int i = 0; i < N; i++) {
        if (i % 2)
            set_nb(c[i], true);
        if (send(c[i], "x", 1, 0) != 1 || recv(s[i], &b, 1, 0) != 1 || send(s[i], "y", 1, 0) != 1)
            die("exchange");
        while (recv(c[i], &b, 1, i % 2 ? 0 : MSG_DONTWAIT) != 1)
            if (errno != EAGAIN)
                die("recv");
    }
    fprintf(stderr, "unforked: %d pages\n", shared_maps() - m0);

    /* c[0] blocking and c[1] nonblocking before the fork; the child swaps them */
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        fprintf(stderr, "forked: %d pages\n", shared_maps() - m0);
        set_nb(c[0], true);
        set_nb(c[1], false);
        for (int i = 0; i < N; i++)
            if (send(c[i], "z", 1, 0) != 1)
                die("child send");
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("the child");
    for (int i = 0; i < N; i++)
        if (recv(s[i], &b, 1, 0) != 1 || b != 'z')
            die("the child's byte");
    printf("nonblock: c0 set by the child: %s\n", empty_recv(c[0]));
    printf("nonblock: c1 cleared by the child: %s\n", empty_recv(c[1]));
    for (int i = 0; i < N; i++) {
        close(c[i]);
        close(s[i]);
    }

    int wrong = 0;
    for (int round = 0; round < 100; round++) {
        int acc, fd = settled_pair(l, &a, &acc);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        struct toggler t = {fd, &go};
        pthread_t th;
        if (pthread_create(&th, NULL, toggle, &t) != 0)
            die("pthread_create");
        pthread_barrier_wait(&go);
        for (volatile int spin = 0; spin < round * 50; spin++)
            ;
        pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0)
            _exit(0);
        pthread_join(th, NULL);
        pthread_barrier_destroy(&go);
        if (waitpid(pid, &st, 0) != pid)
            die("waitpid");
        const char *r = empty_recv(fd);
        if (strcmp(r, "at once") != 0) {
            printf("toggle round %d: %s\n", round, r);
            wrong++;
        }
        close(fd);
        close(acc);
    }
    printf("toggle: 100 rounds, %d wrong\n", wrong);
    printf("done\n");
    return 0;
}
