/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * fdpasslisten: a listening TCP socket handed to another process over a unix socket
 * (SCM_RIGHTS), as haproxy's reload hands its listeners from the old worker to the new master:
 * the receiver accepts a client's connection on it and echoes, promptly.  Two cases: the sender
 * closes its copy and exits before the client connects ("gone"), or keeps it open, never
 * accepting, until the echo is done ("alive").  The output is the same over kernel TCP and
 * under memlan; the log of the run under memlan says whether the connections were accelerated.
 * There the receiver forks its client after it received the socket; with "accept" it never
 * forks once it holds it (see run_accept_case).
 *
 * usage: fdpasslisten PORT [accept]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fdpass.h"

static struct sockaddr_in addr;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void send_fd(int sp, int fd)
{
    if (fdpass_send(sp, fd) < 0) {
        perror("sendmsg");
        exit(1);
    }
}

static int recv_fd(int sp) { return fdpass_recv(sp, MSG_CMSG_CLOEXEC); }

/* The client: one request, one answer. */
static void client_once(const char *tag)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(c, (struct sockaddr *)&addr, sizeof addr) < 0) {
        perror("connect");
        _exit(1);
    }
    char req[32], got[64] = "";
    int n = snprintf(req, sizeof req, "ping %s", tag);
    if (send(c, req, (size_t)n, 0) != n)
        _exit(1);
    ssize_t r = recv(c, got, sizeof got - 1, 0);
    printf("%s: client got \"%s\"\n", tag, r > 0 ? got : "(nothing)");
    close(c);
}

static void client(const char *tag)
{
    client_once(tag);
    _exit(0);
}

/* The old worker: binds, listens, hands the socket over on sp, and goes (closing its copy) once
 * it was received, or, sender_stays, when told to. */
static pid_t sender(int sp[2], int sender_stays)
{
    char x;
    pid_t snd = fork();
    if (snd == 0) {
        close(sp[0]);
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(l, 8) < 0) {
            perror("listen");
            _exit(1);
        }
        send_fd(sp[1], l);
        if (read(sp[1], &x, 1) != 1) /* received */
            _exit(1);
        if (sender_stays && read(sp[1], &x, 1) != 1) /* told to go */
            _exit(1);
        close(l);
        _exit(0);
    }
    return snd;
}

/* One connection on l: accept, one request, one answer.  -1: nothing to accept. */
static int serve(const char *tag, int l)
{
    struct pollfd p = {l, POLLIN, 0};
    int pr = poll(&p, 1, 5000);
    int s = pr == 1 ? accept(l, NULL, NULL) : -1;
    if (s < 0) {
        printf("%s: no connection to accept (poll %d)\n", tag, pr);
        return -1;
    }
    char req[64] = "";
    struct timeval tv = {5, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t r = recv(s, req, sizeof req - 1, 0);
    printf("%s: server got \"%s\"\n", tag, r > 0 ? req : "(nothing)");
    if (send(s, "pong", 4, 0) != 4)
        printf("%s: send failed: %s\n", tag, strerrorname_np(errno));
    close(s);
    return 0;
}

/*
 * accept: the receiver never forks once it holds the socket (its client was made before, and
 * connects when told), so the socket is published at its first accept (mlp_accept_received),
 * not at a fork.  Two connections each.  With the sender alive its record stands, the client
 * offers, and the receiver's first accept publishes and takes the offer: both connections are
 * accelerated.  With the sender gone the first client finds no record and goes over TCP, as a
 * client of a listener nobody published does; the second finds the one the first accept made.
 * Without the publication at accept: the alive case's clients offer to a record whose only
 * holder never accepts, and each waits MEMLAN_ACCEPT_WAIT_MS before TCP ("SLOW").
 */
static int run_accept_case(const char *tag, int sender_stays)
{
    int sp[2], go[2], back[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0 || pipe(go) < 0 || pipe(back) < 0)
        return 1;
    char x;
    pid_t cli = fork();
    if (cli == 0) {
        alarm(30);
        for (int k = 0; k < 2; k++) {
            if (read(go[0], &x, 1) != 1)
                _exit(1);
            client_once(tag);
            if (write(back[1], "d", 1) != 1)
                _exit(1);
        }
        _exit(0);
    }
    pid_t snd = sender(sp, sender_stays);
    close(sp[1]);
    int l = recv_fd(sp[0]); /* from here on, no fork */
    if (l < 0 || write(sp[0], "r", 1) != 1)
        return 1;
    printf("%s: received a socket\n", tag);
    int st;
    if (!sender_stays)
        waitpid(snd, &st, 0);
    for (int k = 0; k < 2; k++) {
        double t0 = now();
        if (write(go[1], "c", 1) != 1)
            return 1;
        if (serve(tag, l) < 0) {
            kill(cli, SIGKILL);
            return 1;
        }
        if (read(back[0], &x, 1) != 1)
            return 1;
        double dt = now() - t0;
        printf("%s: connection %d %s\n", tag, k + 1, dt < 1.0 ? "prompt" : "SLOW (over 1 s)");
    }
    waitpid(cli, &st, 0);
    if (sender_stays && write(sp[0], "g", 1) != 1)
        return 1;
    if (sender_stays)
        waitpid(snd, &st, 0);
    close(l);
    close(sp[0]);
    close(go[1]);
    close(back[0]);
    return 0;
}

static int run_case(const char *tag, int sender_stays)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
        return 1;
    pid_t snd = sender(sp, sender_stays);
    close(sp[1]);
    int l = recv_fd(sp[0]);
    int acc = 0;
    socklen_t al = sizeof acc;
    getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al);
    printf("%s: received a socket, listening %d\n", tag, acc);
    if (l < 0 || write(sp[0], "r", 1) != 1)
        return 1;
    int st;
    if (!sender_stays)
        waitpid(snd, &st, 0);
    double t0 = now();
    pid_t cli = fork();
    if (cli == 0)
        client(tag);
    if (serve(tag, l) < 0)
        kill(cli, SIGKILL);
    waitpid(cli, &st, 0);
    double dt = now() - t0;
    printf("%s: %s\n", tag, dt < 1.0 ? "prompt" : "SLOW (over 1 s)");
    if (sender_stays && write(sp[0], "g", 1) != 1)
        return 1;
    if (sender_stays)
        waitpid(snd, &st, 0);
    close(l);
    close(sp[0]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (argc > 2 && strcmp(argv[2], "accept") == 0) {
        if (run_accept_case("accept-alive", 1) || run_accept_case("accept-gone", 0))
            return 1;
    } else if (run_case("gone", 0) || run_case("alive", 1)) {
        return 1;
    }
    printf("done\n");
    return 0;
}
