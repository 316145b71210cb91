/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * heaphandler PORT: async-signal-safe calls on sockets made from a signal handler (close,
 * dup2, shutdown, send, recv, poll, select, accept, socket, connect and listen; a send that
 * wakes another thread's poll), and exit() from a handler, must not touch the heap: the
 * handler may have interrupted its thread inside malloc or free, and a heap call then corrupts
 * the heap ("free(): corrupted unsorted chunks", seen once in 150 runs of exithandler.c
 * closeconn).  The program replaces malloc, calloc, realloc and free with glibc's
 * own behind a check: one made while a handler of the program runs writes "HEAP <call>" (by
 * write(2), itself safe there).  Over kernel TCP no such line is written; the same lines, and
 * what each step's peer sees, are expected under memlan.  Prints "done" at the end.
 */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/select.h>
#include <sys/wait.h>

#include "twoends.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

static volatile sig_atomic_t in_handler;

static void heap_said(const char *what)
{
    if (!in_handler)
        return;
    char b[64] = "HEAP ";
    size_t n = strlen(b);
    for (const char *w = what; *w && n < sizeof b - 2; w++)
        b[n++] = *w;
    b[n++] = '\n';
    (void)!write(1, b, n);
}

void *malloc(size_t n)
{
    heap_said("malloc");
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    heap_said("calloc");
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    heap_said("realloc");
    return __libc_realloc(p, n);
}

void free(void *p)
{
    if (p)
        heap_said("free");
    __libc_free(p);
}

static void (*action)(void);

static void on_usr1(int sig)
{
    (void)sig;
    in_handler = 1;
    action();
    in_handler = 0;
}

static void in_a_handler(void (*what)(void))
{
    action = what;
    raise(SIGUSR1);
}

static int l = -1, c = -1, a = -1, extra = -1;
static struct sockaddr_in addr;

static void do_close_c(void) { close(c); }
static void do_close_a(void) { close(a); }
static void do_dup2(void) { dup2(extra, c); }
static void do_shutdown(void) { shutdown(c, SHUT_WR); }
static void do_send(void) { (void)!send(c, "h", 1, 0); }
static void do_recv(void)
{
    char b;
    if (recv(a, &b, 1, MSG_DONTWAIT) != 1 || b != 'r')
        (void)!write(1, "handler: recv failed\n", 21);
}
static void do_accept(void)
{
    a = accept(l, NULL, NULL);
    if (a < 0 || send(a, "z", 1, 0) != 1)
        (void)!write(1, "handler: accept failed\n", 23);
}
static void do_connect(void)
{
    c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr) != 0 || send(c, "y", 1, 0) != 1)
        (void)!write(1, "handler: connect failed\n", 24);
}
static void do_poll(void)
{
    struct pollfd p[2] = {{a, POLLIN, 0}, {c, POLLIN, 0}};
    int n0 = poll(p, 2, 0), r0 = p[0].revents;
    int n1 = poll(p + 1, 1, 20);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(a, &rs);
    struct timeval tv = {0, 20000};
    int n2 = select(a + 1, &rs, NULL, NULL, &tv);
    char b[80];
    int k = snprintf(b, sizeof b, "handler: poll %d (%#x), poll %d, select %d\n", n0, r0, n1, n2);
    (void)!write(1, b, (size_t)k);
}
static void do_close_l(void) { close(extra); }
static void do_listen(void)
{
    if (listen(extra, 4) != 0)
        (void)!write(1, "handler: listen failed\n", 23);
}

/* A thread asleep in poll on the accepted end while the handler sends on the client: the send
 * wakes it through the event queue (whose import allocated). */
static void *poll_a(void *arg)
{
    struct pollfd p = {a, POLLIN, 0};
    *(int *)arg = poll(&p, 1, 3000) == 1 ? p.revents : -1;
    return NULL;
}
static void do_exit(void) { exit(7); }

/* What the other end of the pair reads now: a byte, the end, or nothing within 2 s. */
static void peer_reads(const char *step, int fd)
{
    char b;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t n = recv(fd, &b, 1, 0);
    if (n == 1)
        printf("%s: the peer read '%c'\n", step, b);
    else
        printf("%s: the peer read %zd (%s)\n", step, n, n < 0 ? strerror(errno) : "end");
}

static void pair(void) { c = settled_pair(l, &addr, &a); }

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    l = scripted_listener(argv[1], &addr);
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    extra = open("/dev/null", O_RDONLY);

    pair();
    in_a_handler(do_close_c);
    peer_reads("close the client", a);
    close(a);

    pair();
    in_a_handler(do_close_a);
    peer_reads("close the accepted", c);
    close(c);

    pair();
    in_a_handler(do_dup2);
    peer_reads("dup2 over the client", a);
    close(a);
    close(c);

    pair();
    in_a_handler(do_shutdown);
    peer_reads("shutdown", a);
    close(a);
    close(c);

    pair();
    in_a_handler(do_send);
    peer_reads("send", a);
    if (send(c, "r", 1, 0) != 1)
        die("send r");
    usleep(100000);
    in_a_handler(do_recv);
    printf("recv: done\n");
    if (send(c, "p", 1, 0) != 1)
        die("send p");
    usleep(100000);
    in_a_handler(do_poll);
    /* again, once this thread has polled and slept outside a handler (its waiter and the
     * process's queue made, the sockets registered) */
    struct pollfd pf = {c, POLLIN, 0};
    printf("poll outside: %d\n", poll(&pf, 1, 30));
    in_a_handler(do_poll);
    close(a);
    close(c);

    c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr) != 0)
        die("connect");
    in_a_handler(do_accept);
    peer_reads("accept", c);
    close(a);
    close(c);

    in_a_handler(do_connect);
    a = accept(l, NULL, NULL);
    if (a < 0)
        die("accept");
    peer_reads("connect", a);
    close(a);
    close(c);

    pair();
    int got = 0;
    pthread_t t;
    pthread_create(&t, NULL, poll_a, &got);
    usleep(200000);
    in_a_handler(do_send);
    pthread_join(t, NULL);
    printf("send to a sleeping poll: revents %#x\n", (unsigned)got);
    close(a);
    close(c);

    struct sockaddr_in a2 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t a2l = sizeof a2;
    int l3 = socket(AF_INET, SOCK_STREAM, 0);
    if (l3 < 0 || bind(l3, (struct sockaddr *)&a2, sizeof a2) != 0 ||
        getsockname(l3, (struct sockaddr *)&a2, &a2l) != 0)
        die("bind");
    close(extra);
    extra = l3;
    in_a_handler(do_listen);
    c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a2, sizeof a2) != 0 || send(c, "L", 1, 0) != 1)
        die("connect to the handler's listener");
    a = accept(l3, NULL, NULL);
    peer_reads("listen", a);
    close(a);
    close(c);
    close(l3);
    extra = open("/dev/null", O_RDONLY);

    int l2 = listen_backlog(0, 4, &a2);
    close(extra);
    extra = l2;
    in_a_handler(do_close_l);
    printf("close a listener: done\n");

    pair();
    pid_t pid = fork();
    if (pid == 0) {
        in_a_handler(do_exit);
        _exit(1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("exit in a child: status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    close(a);
    close(c);
    printf("done\n");
    return 0;
}
