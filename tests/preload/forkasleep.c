/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkasleep: a process forks while another of its threads sleeps in poll (or epoll_wait, or a
 * blocking recv) on a connection; the child closes its copy of the socket, the parent closes
 * its own once the sleeper has returned: the peer must read EOF at once, as over kernel TCP,
 * where the socket's last holder is gone.  Run once over kernel TCP and once under `memlan
 * run`: the outputs must be equal (tests/py/test_preload.py).
 *
 * usage: forkasleep PORT
 * Six cases, each on a connection of its own: the sleeper in poll, in epoll_wait (a set made
 * before the fork) or in a blocking recv, and the child's close before the parent's or after
 * it.  The sleeper is woken by a byte the peer sends after the child's fork (and, in the first
 * order, its close), then waits three more times for a byte sent 30 ms after its wait began: it
 * must be woken by each,
 * in most of them within 90 ms (memlan's liveness timer, which ends a wait whose wake-up was
 * lost, looks first after 100 ms; the time itself is not printed).  Between the two closes the
 * peer must not see the end (150 ms), after the second it must within 1 s.  Under memlan the
 * child inherited the registrations of the parent's sleeping poll, each holding a reference to
 * the socket, which nothing in the child ever gave back (the thread does not exist there): the
 * child's close did not end its hold, and the peer read no EOF until the child exited.  So did
 * the child's copy of the blocking recv's own reference to the socket (its channel's file also
 * stayed in the fabric once every process had exited).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 3000
#define ROUNDS 3

static int to_peer[2], from_peer[2];

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static void say(char m)
{
    if (write(from_peer[1], &m, 1) != 1)
        die("peer says");
}

/* The peer: "c" connects (and reads the server's hello), "s" sends a byte at once, "l" sends one
 * 30 ms after its answer, "n" looks for the end for 150 ms ('o': still open), "e" waits for it
 * ('e': EOF within 1 s, 'l': later, 'n': none in 2 s), then closes; "q" quits. */
static void peer(int port)
{
    alarm(120); /* bounded, whatever becomes of the parent */
    int c = -1;
    char b;
    while (read(to_peer[0], &b, 1) == 1) {
        if (b == 'c') {
            c = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
            inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
            char h;
            if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0 ||
                recv(c, &h, 1, MSG_WAITALL) != 1)
                die("connect");
            say('.');
        } else if (b == 's' || b == 'l') {
            say('.');
            if (b == 'l')
                usleep(30000);
            if (send(c, "d", 1, 0) != 1)
                die("send");
        } else if (b == 'n' || b == 'e') {
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            struct pollfd p = {.fd = c, .events = POLLIN};
            int r = poll(&p, 1, b == 'n' ? 150 : 2000);
            char x;
            ssize_t got = r == 1 ? recv(c, &x, 1, MSG_DONTWAIT) : -1;
            if (b == 'n')
                say(r == 0 ? 'o' : got == 0 ? 'e' : 'x');
            else
                say(got == 0 ? (ms_since(&t0) < 1000 ? 'e' : 'l') : r == 0 ? 'n' : 'x');
            if (b == 'e') {
                close(c);
                c = -1;
            }
        } else {
            break;
        }
    }
    exit(0);
}

static char ask(char cmd)
{
    char m = 0;
    if (write(to_peer[1], &cmd, 1) != 1 || read(from_peer[0], &m, 1) != 1)
        die("peer");
    return m;
}

static int s, ep, kind; /* kind: 0 poll, 1 epoll_wait, 2 a blocking recv */
static int started[2];

/* One wait of the sleeper; true when it was woken by one byte, which it read. */
static bool wait_once(int k, bool timed)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int n, rev = 0;
    if (kind == 2) {
        char b = 0;
        ssize_t got = recv(s, &b, 1, 0); /* SO_RCVTIMEO: WAIT_MS */
        long ms = ms_since(&t0);
        printf("  sleeper wait %d: recv %zd %c\n", k, got, got == 1 ? b : '-');
        return got == 1 && (!timed || ms < 90);
    }
    if (ep >= 0) {
        struct epoll_event ev[4];
        n = epoll_wait(ep, ev, 4, WAIT_MS);
        if (n == 1)
            rev = (int)ev[0].events;
    } else {
        struct pollfd pf = {.fd = s, .events = POLLIN};
        n = poll(&pf, 1, WAIT_MS);
        rev = pf.revents;
    }
    long ms = ms_since(&t0);
    char b = 0;
    ssize_t got = recv(s, &b, 1, MSG_DONTWAIT);
    printf("  sleeper wait %d: woken %d events %x, read %zd %c\n", k, n, rev, got,
           got == 1 ? b : '-');
    return n == 1 && got == 1 && (!timed || ms < 90);
}

static void *sleeper(void *a)
{
    (void)a;
    if (write(started[1], ".", 1) != 1)
        die("started");
    wait_once(0, false); /* asleep across the fork; the byte comes after it */
    int prompt = 0;
    for (int k = 1; k <= ROUNDS; k++) {
        if (ask('l') != '.')
            die("peer l");
        prompt += wait_once(k, true);
    }
    printf("  sleeper woken by the byte in most waits: %s\n", 2 * prompt > ROUNDS ? "yes" : "no");
    return NULL;
}

static void one_case(int l, int k, bool child_first)
{
    static const char *const kinds[] = {"poll", "epoll_wait", "recv"};
    bool epoll = k == 1;
    kind = k;
    printf("%s, %s close first:\n", kinds[k], child_first ? "child's" : "parent's");
    char m;
    if (write(to_peer[1], "c", 1) != 1)
        die("peer c");
    s = accept(l, NULL, NULL);
    if (s < 0 || send(s, "h", 1, 0) != 1 || read(from_peer[0], &m, 1) != 1)
        die("accept");
    ep = -1;
    struct timeval tv = {WAIT_MS / 1000, 0};
    if (kind == 2 && setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
        die("SO_RCVTIMEO");
    if (epoll) {
        ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 7};
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0)
            die("epoll");
    }
    int go[2], done[2];
    if (pipe(started) < 0 || pipe(go) < 0 || pipe(done) < 0)
        die("pipe");
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL) != 0)
        die("thread");
    if (read(started[0], &m, 1) != 1)
        die("started");
    usleep(60000); /* the sleeper is asleep (past memlan's first 10 ms on the ring's futex) */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        alarm(30); /* not inherited: a parent that fails must not leave us asleep for ever */
        if (!child_first && read(go[0], &m, 1) != 1)
            _exit(3);
        if (ep >= 0)
            close(ep);
        char r = close(s) == 0 ? '.' : 'x';
        if (write(done[1], &r, 1) != 1)
            _exit(3);
        for (;;)
            pause(); /* holds nothing of the connection, and lives on */
    }
    if (child_first) {
        if (read(done[0], &m, 1) != 1)
            die("child");
        printf("  child closed: %c\n", m);
    }
    if (ask('s') != '.')
        die("peer s");
    pthread_join(t, NULL);
    if (ep >= 0)
        close(ep);
    close(s);
    printf("  parent closed\n");
    if (!child_first) {
        printf("  peer before the child's close: %c\n", ask('n'));
        if (write(go[1], ".", 1) != 1 || read(done[0], &m, 1) != 1)
            die("child");
        printf("  child closed: %c\n", m);
    }
    printf("  peer: %c\n", ask('e'));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(go[0]);
    close(go[1]);
    close(done[0]);
    close(done[1]);
    close(started[0]);
    close(started[1]);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    alarm(100);
    int port = atoi(argv[1]);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0)
        die("listen");
    if (pipe(to_peer) < 0 || pipe(from_peer) < 0)
        die("pipe");
    pid_t pp = fork();
    if (pp < 0)
        die("fork");
    if (pp == 0) {
        close(l);
        peer(port);
    }
    for (int e = 0; e < 3; e++)
        for (int c = 0; c < 2; c++)
            one_case(l, e, c == 0);
    if (write(to_peer[1], "q", 1) != 1)
        die("quit");
    waitpid(pp, NULL, 0);
    printf("done\n");
    return 0;
}
