/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * zerolen: receives and sends of zero bytes on a connection, as TCP answers them.  A recv,
 * recvfrom, recvmsg or recvmmsg of nothing waits, as one of a byte would, and returns 0 once a
 * byte is there (taking nothing) or at the end; nonblocking it says EAGAIN on an empty socket.
 * A read or readv of nothing is 0 at once (sock_read_iter).  A send of nothing is 0, EPIPE
 * once the socket is shut for writing, and reports a reset.  Run once over kernel TCP and once under `memlan run`:
 * the two outputs must be equal (tests/py/test_preload.py).
 *
 * usage: zerolen PORT
 * Every wait is bounded (SO_RCVTIMEO, poll): nothing here can hang.
 */
#include "callscript.h"

#include <pthread.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void say(const char *label, ssize_t r)
{
    if (r < 0)
        printf("%s: -1 %s\n", label, strerror(errno));
    else
        printf("%s: %zd\n", label, r);
}

static void timeout_ms(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
        cs_die("SO_RCVTIMEO");
}

static void on_alarm(int sig)
{
    (void)sig;
}

static int late_fd;
static void *late_send(void *arg)
{
    (void)arg;
    usleep(150 * 1000);
    if (send(late_fd, "y", 1, 0) != 1)
        cs_die("late send");
    return NULL;
}

/* The one byte left after a zero-length call took nothing. */
static void left(const char *label, int fd)
{
    char b[4];
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r == 1)
        printf("%s: the byte is still there: %c\n", label, b[0]);
    else
        say(label, r);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    cs_listen(argv[1]);
    int c, s;
    char b[4];
    cs_pair(&c, &s, 0);

    /* Empty: nonblocking calls of nothing say EAGAIN; read and readv of nothing say 0. */
    say("recv 0 dontwait, empty", recv(c, b, 0, MSG_DONTWAIT));
    say("recv 0 peek dontwait, empty", recv(c, b, 0, MSG_PEEK | MSG_DONTWAIT));
    say("recvfrom 0 dontwait, empty", recvfrom(c, NULL, 0, MSG_DONTWAIT, NULL, NULL));
    struct msghdr mh = {0};
    say("recvmsg no iov dontwait, empty", recvmsg(c, &mh, MSG_DONTWAIT));
    struct iovec nothing = {b, 0};
    mh.msg_iov = &nothing;
    mh.msg_iovlen = 1;
    say("recvmsg 0 dontwait, empty", recvmsg(c, &mh, MSG_DONTWAIT));
    struct mmsghdr mm = {.msg_hdr = {.msg_iov = &nothing, .msg_iovlen = 1}};
    say("recvmmsg 0 dontwait, empty", recvmmsg(c, &mm, 1, MSG_DONTWAIT, NULL));
    say("read 0, empty", read(c, b, 0));
    say("readv 0, empty", readv(c, &nothing, 1));

    /* Blocking on an empty socket: waits for its timeout. */
    timeout_ms(c, 200);
    double t0 = now();
    ssize_t r = recv(c, b, 0, 0);
    double dt = now() - t0;
    say("recv 0 blocking, empty", r);
    printf("recv 0 blocking, empty: waited for the timeout: %s\n", dt > 0.15 ? "yes" : "no");
    t0 = now();
    r = recv(c, b, 0, MSG_WAITALL);
    dt = now() - t0;
    say("recv 0 waitall, empty", r);
    printf("recv 0 waitall, empty: waited for the timeout: %s\n", dt > 0.15 ? "yes" : "no");

    /* A byte comes while the call waits: 0, and the byte stays. */
    timeout_ms(c, 3000);
    late_fd = s;
    pthread_t th;
    pthread_create(&th, NULL, late_send, NULL);
    t0 = now();
    r = recv(c, b, 0, 0);
    dt = now() - t0;
    pthread_join(th, NULL);
    say("recv 0 blocking, a byte comes", r);
    printf("recv 0 blocking, a byte comes: waited for it: %s\n", dt > 0.1 ? "yes" : "no");
    say("recv 0 dontwait, a byte there", recv(c, b, 0, MSG_DONTWAIT));
    say("recvmsg 0, a byte there", recvmsg(c, &mh, 0));
    say("recv 0 trunc, a byte there", recv(c, NULL, 0, MSG_TRUNC | MSG_DONTWAIT));
    left("after the calls of nothing", c);

    /* Sends of nothing. */
    say("send 0", send(c, b, 0, 0));
    say("send 0 dontwait", send(c, b, 0, MSG_DONTWAIT));
    say("write 0", write(c, b, 0));
    struct pollfd p = {s, POLLIN, 0};
    printf("the peer after the sends of nothing: %s\n",
           poll(&p, 1, 200) == 0 ? "nothing to read" : "readable");

    /* The peer's end: calls of nothing say 0 at once. */
    if (shutdown(s, SHUT_WR) < 0)
        cs_die("shutdown");
    p.fd = c;
    if (poll(&p, 1, 3000) != 1)
        cs_die("poll for the end");
    say("recv 0 at the end", recv(c, b, 0, 0));
    say("recv 0 dontwait at the end", recv(c, b, 0, MSG_DONTWAIT));
    say("recv 1 at the end", recv(c, b, 1, 0));

    /* Shut for writing: a send of nothing says EPIPE. */
    if (shutdown(c, SHUT_WR) < 0)
        cs_die("shutdown c");
    say("send 0 after shutdown", send(c, b, 0, MSG_NOSIGNAL));
    say("write 0 after shutdown", write(c, b, 0));
    close(c);
    close(s);

    /* A signal while a blocking recv of nothing waits: 0, with SA_RESTART or without. */
    for (int restart = 0; restart < 2; restart++) {
        cs_pair(&c, &s, 0);
        struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = restart ? SA_RESTART : 0};
        sigaction(SIGALRM, &sa, NULL);
        timeout_ms(c, 3000);
        struct itimerval it = {{0, 0}, {0, 150 * 1000}};
        setitimer(ITIMER_REAL, &it, NULL);
        t0 = now();
        r = recv(c, b, 0, 0);
        dt = now() - t0;
        say(restart ? "recv 0 blocking, a signal (SA_RESTART)"
                    : "recv 0 blocking, a signal (no SA_RESTART)", r);
        printf("recv 0 blocking, a signal: returned before the timeout: %s\n",
               dt < 2 ? "yes" : "no");
        close(c);
        close(s);
    }

    /* The peer closed: a send of nothing says 0 (no byte goes, no reset comes back). */
    cs_pair(&c, &s, 0);
    close(s);
    p.fd = c;
    if (poll(&p, 1, 3000) != 1)
        cs_die("poll for the close");
    say("send 0 after the peer closed", send(c, b, 0, MSG_NOSIGNAL));
    say("send 0 after the peer closed, again", send(c, b, 0, MSG_NOSIGNAL));
    say("recv 0 after the peer closed", recv(c, b, 0, 0));
    close(c);

    /* The peer reset (SO_LINGER 0): a recv of nothing reports it, then the end. */
    cs_pair(&c, &s, 0);
    struct linger lg = {1, 0};
    setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(s);
    p.fd = c;
    if (poll(&p, 1, 3000) != 1)
        cs_die("poll for the reset");
    say("recv 0 after a reset", recv(c, b, 0, 0));
    say("recv 0 after a reset, again", recv(c, b, 0, 0));
    say("send 0 after a reset", send(c, b, 0, MSG_NOSIGNAL));
    close(c);
    printf("done\n");
    return 0;
}
