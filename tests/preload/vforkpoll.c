/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * vforkpoll: a vfork child waits on a connection of its parent's (poll, select and epoll_wait,
 * each with a 20 ms timeout, first with nothing to read, then with a byte waiting), then leaves
 * by _exit, or by exec of /bin/true.  The child runs in its parent's memory until then: what it
 * makes for its waits (an event queue, an eventfd, an epoll set's record) would stay in the
 * parent, naming descriptors that exist only in the child.  After each child the parent works
 * on: it waits 300 ms in poll with nothing to read (it must sleep: less than 100 ms of cpu; memlan
 * once left it spinning on the child's dead queue, about 300 ms of cpu in 300 ms), then gets a
 * byte through poll and through a new epoll set of its own.  The output must equal kernel TCP's
 * (tests/py/test_preload.py).
 *
 * usage: vforkpoll PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* The child's waits on fd, written to out (a pipe: the child shares our stdio buffers). */
static void child_waits(int fd, int out, int do_exec)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r1 = poll(&p, 1, 20);
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    struct timeval tv = {0, 20000};
    int r2 = select(fd + 1, &rs, NULL, NULL, &tv);
    /* epoll only without a byte waiting: a vfork child's epoll is the kernel's, which does not
     * see the ring (docs/design.md, vfork). */
    int r3 = -2;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0)
        r3 = epoll_wait(ep, &ev, 1, 20);
    char line[80];
    int n = snprintf(line, sizeof line, "poll %d %#x, select %d, epoll %d", r1, p.revents, r2, r3);
    if (write(out, line, (size_t)n) != n)
        _exit(1);
    if (do_exec) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    _exit(0);
}

static void one(const char *name, int c, int s, int do_exec, int byte)
{
    int pp[2];
    if (pipe(pp) < 0)
        die("pipe");
    if (byte && send(s, "b", 1, 0) != 1)
        die("send");
    pid_t pid = vfork();
    if (pid < 0)
        die("vfork");
    if (pid == 0)
        child_waits(c, pp[1], do_exec);
    close(pp[1]);
    char line[80] = "";
    ssize_t got = read(pp[0], line, sizeof line - 1);
    line[got > 0 ? got : 0] = 0;
    close(pp[0]);
    int st;
    waitpid(pid, &st, 0);
    /* The child's epoll shows the byte only over kernel TCP: its poll and select must. */
    char *ep = strstr(line, ", epoll");
    if (byte && ep)
        *ep = 0;
    printf("%s: child %s; exit %d\n", name, line, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    char b;
    if (byte && recv(c, &b, 1, 0) != 1)
        die("recv");

    /* The parent works on: an idle poll sleeps. */
    struct pollfd p = {c, POLLIN, 0};
    double c0 = cpu_ms();
    int r = poll(&p, 1, 300);
    double used = cpu_ms() - c0;
    printf("%s: idle poll %d, %s\n", name, r, used < 100 ? "slept" : "BUSY");
    fprintf(stderr, "%s: idle poll: %.1f ms of cpu in 300 ms\n", name, used);
    /* A byte, through poll, then through an epoll set of its own (at the number the child's set
     * had, most likely). */
    if (send(s, "x", 1, 0) != 1)
        die("send");
    r = poll(&p, 1, 5000);
    ssize_t g = r == 1 ? recv(c, &b, 1, 0) : -1;
    int e = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
    if (e < 0 || epoll_ctl(e, EPOLL_CTL_ADD, c, &ev) < 0)
        die("epoll");
    if (send(s, "y", 1, 0) != 1)
        die("send");
    int n = epoll_wait(e, &ev, 1, 5000);
    ssize_t g2 = n == 1 ? recv(c, &b, 1, 0) : -1;
    close(e);
    printf("%s: poll %d recv %zd, epoll %d recv %zd\n", name, r, g, n, g2);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    alarm(60);
    int l = socket(AF_INET, SOCK_STREAM, 0), one_ = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one_, sizeof one_);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0)
        die("listen");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    int s = accept(l, NULL, NULL);
    char b[2];
    if (s < 0 || send(s, "hi", 2, 0) != 2 || recv(c, b, 2, MSG_WAITALL) != 2 ||
        send(c, "ok", 2, 0) != 2 || recv(s, b, 2, MSG_WAITALL) != 2)
        die("settle");
    one("exit", c, s, 0, 0);
    one("exit-byte", c, s, 0, 1);
    one("exec", c, s, 1, 0);
    one("exec-byte", c, s, 1, 1);
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
