/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * resetconf: what a peer sees when a socket is closed with bytes it never read, or with SO_LINGER
 * set to zero (the kernel answers both with a reset), printed line by line.  Run once over kernel
 * TCP and once under `memlan run`: the two outputs must be equal (tests/py/test_preload.py).
 *
 * usage: resetconf PORT
 * Every case makes a fresh connection in this one process (both ends accelerated under memlan),
 * settles it with one exchange, then closes one end and prints every call the other end makes:
 * poll and epoll bits, recv, send, SO_ERROR, in orders that show the reset is reported once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "callscript.h"



/* The accepted end closes after the client sent it bytes it never read. */
static void unread(const char *calls)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("unread, then %s\n", calls);
    send(c, "0123456789", 10, 0);
    send(s, "abcde", 5, 0);
    usleep(20000);
    close(s);
    settle_close();
    script(c, calls);
    close(c);
}

/* The accepted end sets SO_LINGER {on, t} and closes, every byte read. */
static void linger(int t, const char *calls)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("linger %d, then %s\n", t, calls);
    struct linger lg = {1, t};
    setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    send(s, "abcde", 5, 0);
    close(s);
    settle_close();
    script(c, calls);
    close(c);
}

/* SO_LINGER 0 set on the client before it connected: the server sees the reset. */
static void linger_before_connect(void)
{
    int c, s;
    cs_pair(&c, &s, 1);
    printf("client linger 0 before connect\n");
    send(c, "abcd", 4, 0);
    close(c);
    settle_close();
    script(s, "RRRE");
    close(s);
}

/* A child holds the accepted end: the parent's close with unread bytes ends nothing; the child
 * reads everything and exits: a plain end of stream. */
static void forked(void)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("forked holder\n");
    send(c, "0123", 4, 0);
    usleep(20000);
    int go[2];
    if (pipe(go) < 0)
        cs_die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        char b[8], x;
        if (read(go[0], &x, 1) != 1 || recv(s, b, 4, MSG_WAITALL) != 4)
            _exit(1);
        exit(0);
    }
    close(s);
    settle_close();
    script(c, "PS");
    if (write(go[1], "g", 1) != 1)
        cs_die("go");
    int st;
    waitpid(pid, &st, 0);
    printf("  child %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    settle_close();
    script(c, "PRE");
    close(go[0]);
    close(go[1]);
    close(c);
}

/* sendfile after the peer closed: the first is taken (the file's bytes up to its end, the
 * offset moved on), then at the file's end nothing to send is no error; then the reset. */
static void sendfile_late(void)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("sendfile after close\n");
    close(s);
    settle_close();
    char path[] = "/tmp/resetconf-XXXXXX";
    int f = mkstemp(path);
    if (f < 0 || write(f, "0123456789", 10) != 10)
        cs_die("file");
    unlink(path);
    off_t off = 4;
    ssize_t r = sendfile(c, f, &off, 100);
    printf("  sendfile %zd off %lld\n", r, (long long)off);
    r = sendfile(c, f, &off, 100);
    printf("  sendfile %zd %s\n", r, r < 0 ? strerror(errno) : "");
    settle_close();
    script(c, "PRR");
    close(f);
    close(c);
}

static int blocked_fd;

static void *blocked_recv(void *arg)
{
    char b[8];
    ssize_t r = recv(blocked_fd, b, sizeof b, 0);
    printf("  blocked recv %zd %s\n", r, r < 0 ? strerror(errno) : "");
    return arg;
}

/* A thread asleep in recv when the reset comes. */
static void blocked(void)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("recv asleep\n");
    blocked_fd = c;
    pthread_t t;
    pthread_create(&t, NULL, blocked_recv, NULL);
    usleep(100000);
    send(c, "01", 2, 0);
    usleep(20000);
    close(s);
    pthread_join(t, NULL);
    script(c, "R");
    close(c);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    cs_listen(argv[1]);

    unread("PWRRRRSSP");
    unread("SSRRRP");
    unread("ERRRP");
    unread("WRRSW");
    linger(0, "PRRRRSP");
    linger(5, "PRRRSPESP");
    linger_before_connect();
    forked();
    blocked();
    sendfile_late();

    /* SO_LINGER 0 on the listener: the accepted socket inherits it. */
    struct linger lg = {1, 0};
    setsockopt(cs_lfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    int c, s;
    cs_pair(&c, &s, 0);
    printf("listener linger 0\n");
    close(s);
    settle_close();
    script(c, "PRR");
    close(c);
    printf("done\n");
    return 0;
}
