/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * epollbefore: a socket put in an epoll set before its connect, as nginx does with its upstream
 * connections (socket, ioctl FIONBIO, epoll_ctl ADD with EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET,
 * then connect) and Netty with its channels.  A forked server answers each line with "re:" and
 * the line; the client waits for the answer through the set.
 *
 * Under memlan the connection was accelerated while the set kept the kernel's entry for the
 * socket, with the program's events: the set reported the kernel's EPOLLOUT, never the reply
 * that came through the ring ("et: no reply within 2 s"), and nginx's proxied requests hung
 * until the client gave up.  The set's fd closed before the connect while a duplicate of it
 * kept the set: the set's entry was not taken over either ("dup: no reply within 2 s").
 *
 * usage: epollbefore PORT
 */
#include "twoends.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#define NCASES 8

static void serve(int l)
{
    for (int i = 0; i < NCASES; i++) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            _exit(1);
        char b[64], o[80];
        ssize_t n = recv(c, b, sizeof b - 1, 0);
        if (n > 0) {
            b[n] = 0;
            int k = snprintf(o, sizeof o, "re:%s", b);
            (void)send(c, o, (size_t)k, MSG_NOSIGNAL);
        }
        while (recv(c, b, sizeof b, 0) > 0) /* until the client closes */
            ;
        close(c);
    }
    _exit(0);
}

static int nb_socket(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || fcntl(s, F_SETFL, O_NONBLOCK) < 0)
        die("socket");
    return s;
}

static void nb_connect(int s, struct sockaddr_in *a)
{
    if (connect(s, (struct sockaddr *)a, sizeof *a) < 0 && errno != EINPROGRESS)
        die("connect");
}

static bool writable(int s)
{
    struct pollfd p = {.fd = s, .events = POLLOUT};
    return poll(&p, 1, 2000) == 1 && (p.revents & POLLOUT);
}

static void add(int ep, int op, int fd, uint32_t ev, uint64_t data)
{
    struct epoll_event e = {.events = ev, .data.u64 = data};
    if (epoll_ctl(ep, op, fd, &e) < 0)
        die("epoll_ctl");
}

/* Wait on ep for EPOLLIN, up to ms: the data of the event, 0 for none. */
static uint64_t wait_in(int ep, int ms)
{
    double end = now_s() + ms / 1000.0;
    for (;;) {
        int left = (int)((end - now_s()) * 1000);
        struct epoll_event e[4];
        int n = epoll_wait(ep, e, 4, left > 0 ? left : 0);
        for (int i = 0; i < n; i++)
            if (e[i].events & EPOLLIN)
                return e[i].data.u64;
        if (left <= 0)
            return 0;
    }
}

static void reply(const char *tag, int s, uint64_t got, uint64_t want)
{
    char b[64];
    ssize_t n = got ? recv(s, b, sizeof b - 1, 0) : -1;
    if (n > 0)
        b[n] = 0;
    printf("%s: %s, data %s\n", tag, n > 0 ? b : "no reply within 2 s",
           got == want ? "as set" : "wrong");
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 16))
        die("listen");
    pid_t pid = fork();
    if (pid == 0)
        serve(l);
    close(l);

    /* nginx's way: edge-triggered, in and out, added before the connect; the request goes out
     * at the set's EPOLLOUT and the answer is waited for on the same set. */
    int ep = epoll_create1(0), s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, 0x1111);
    nb_connect(s, &a);
    bool sent = false;
    uint64_t got = 0;
    for (double end = now_s() + 2; !got && now_s() < end;) {
        struct epoll_event e[4];
        int n = epoll_wait(ep, e, 4, 100);
        for (int i = 0; i < n; i++) {
            if ((e[i].events & EPOLLOUT) && !sent)
                sent = send(s, "et", 2, 0) == 2;
            if (e[i].events & EPOLLIN)
                got = e[i].data.u64;
        }
    }
    printf("et: request %s\n", sent ? "sent at EPOLLOUT" : "never sent");
    reply("et", s, got, 0x1111);
    close(s);
    close(ep);

    /* Level-triggered, EPOLLIN only. */
    ep = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN, 2);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "lt", 2, 0) != 2)
        die("lt send");
    reply("lt", s, wait_in(ep, 2000), 2);
    close(s);
    close(ep);

    /* Added, then changed (events and data) before the connect. */
    ep = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLOUT, 3);
    add(ep, EPOLL_CTL_MOD, s, EPOLLIN | EPOLLRDHUP, 4);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "mod", 3, 0) != 3)
        die("mod send");
    reply("mod", s, wait_in(ep, 2000), 4);
    close(s);
    close(ep);

    /* Added and deleted before the connect: nothing reported, until added again. */
    ep = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN, 5);
    add(ep, EPOLL_CTL_DEL, s, 0, 0);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "del", 3, 0) != 3)
        die("del send");
    usleep(100000);
    struct epoll_event e1;
    printf("del: events before the ADD again: %d\n", epoll_wait(ep, &e1, 1, 200));
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN, 6);
    reply("del", s, wait_in(ep, 2000), 6);
    close(s);
    close(ep);

    /* In two sets before the connect: both report the answer. */
    int ep2;
    ep = epoll_create1(0);
    ep2 = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN, 7);
    add(ep2, EPOLL_CTL_ADD, s, EPOLLIN | EPOLLET, 8);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "two", 3, 0) != 3)
        die("two send");
    uint64_t g1 = wait_in(ep, 2000), g2 = wait_in(ep2, 2000);
    printf("two: second set's data %s\n", g2 == 8 ? "as set" : g2 ? "wrong" : "none within 2 s");
    reply("two", s, g1, 7);
    close(s);
    close(ep);
    close(ep2);

    /* EPOLLEXCLUSIVE (a kernel-only form of entry). */
    ep = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN | EPOLLEXCLUSIVE, 9);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "excl", 4, 0) != 4)
        die("excl send");
    reply("excl", s, wait_in(ep, 2000), 9);
    close(s);
    close(ep);

    /* Added before the connect, the set closed before it: the socket works on (poll). */
    ep = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN | EPOLLET, 10);
    close(ep);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "gone", 4, 0) != 4)
        die("gone send");
    struct pollfd p = {.fd = s, .events = POLLIN};
    reply("gone", s, poll(&p, 1, 2000) == 1 ? 11 : 0, 11);
    close(s);

    /* Added by a set's fd that is closed before the connect, the set kept by a duplicate of it
     * (dup): the duplicate reports the answer.  Before, the note named the closed number, whose
     * EBADF was taken for no set at all ("dup: no reply within 2 s"). */
    ep = epoll_create1(0);
    s = nb_socket();
    add(ep, EPOLL_CTL_ADD, s, EPOLLIN, 12);
    ep2 = dup(ep);
    close(ep);
    nb_connect(s, &a);
    if (!writable(s) || send(s, "dup", 3, 0) != 3)
        die("dup send");
    reply("dup", s, wait_in(ep2, 2000), 12);
    close(s);
    close(ep2);

    int st = 0;
    waitpid(pid, &st, 0);
    printf("server: %s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "failed");
    printf("done\n");
    return 0;
}
