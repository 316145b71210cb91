/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * disconnectwait: a thread waits in recv (and one in poll) on an accelerated client when another
 * thread disconnects it (connect(fd, {AF_UNSPEC})); the peer neither sends nor closes.  Then a
 * thread waits in send on a second one, whose peer reads nothing, when it is disconnected.
 *
 * Under memlan the waiting calls ended as at the peer's end-of-file ("recv: 0", "poll: 1 0x1"),
 * and the send's reset was left in the kernel socket for the next send ("send after: -1
 * Connection reset by peer" where the kernel says EPIPE).
 *
 * usage: disconnectwait PORT
 */
#include "twoends.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static int c;
static char line[2][96];

static void *reader(void *arg)
{
    char b;
    double t0 = now_s();
    ssize_t r = recv(c, &b, 1, 0);
    int e = errno;
    snprintf(line[0], sizeof line[0], "recv: %zd %s%s", r, r < 0 ? strerror(e) : "",
             now_s() - t0 > 2.5 ? " (after 3 s)" : "");
    return arg;
}

static void *writer(void *arg)
{
    static char big[1 << 16];
    ssize_t r;
    while ((r = send(c, big, sizeof big, 0)) > 0)
        ;
    snprintf(line[0], sizeof line[0], "send: %zd %s", r, r < 0 ? strerror(errno) : "");
    return arg;
}

static void *poller(void *arg)
{
    struct pollfd p = {.fd = c, .events = POLLIN};
    int n = poll(&p, 1, 3000);
    snprintf(line[1], sizeof line[1], "poll: %d %#x", n, n == 1 ? p.revents : 0);
    return arg;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    c = settled_pair(l, &a, &s);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pthread_t t[2];
    pthread_create(&t[0], NULL, reader, NULL);
    pthread_create(&t[1], NULL, poller, NULL);
    usleep(300 * 1000);
    struct sockaddr u = {.sa_family = AF_UNSPEC};
    int r = connect(c, &u, sizeof u);
    printf("connect(AF_UNSPEC): %d %s\n", r, r < 0 ? strerror(errno) : "");
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    printf("%s\n%s\n", line[0], line[1]);
    char b;
    r = (int)recv(c, &b, 1, MSG_DONTWAIT);
    printf("recv after: %d %s\n", r, r < 0 ? strerror(errno) : "");
    r = (int)recv(c, &b, 1, MSG_DONTWAIT);
    printf("recv again: %d %s\n", r, r < 0 ? strerror(errno) : "");
    close(s);
    close(c);

    signal(SIGPIPE, SIG_IGN);
    c = settled_pair(l, &a, &s);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    pthread_create(&t[0], NULL, writer, NULL);
    usleep(500 * 1000);
    r = connect(c, &u, sizeof u);
    printf("connect(AF_UNSPEC) under a send: %d %s\n", r, r < 0 ? strerror(errno) : "");
    pthread_join(t[0], NULL);
    printf("%s\n", line[0]);
    r = (int)send(c, "x", 1, 0);
    printf("send after: %d %s\n", r, r < 0 ? strerror(errno) : "");
    close(s);
    close(c);
    close(l);
    printf("done\n");
    return 0;
}
