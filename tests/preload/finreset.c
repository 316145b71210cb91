/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * finreset: a reset that comes after the peer's FIN.  The server shuts down its writing side
 * (its FIN), the client writes one more request, and the server closes (or dies) without reading
 * it: the kernel answers with a reset, but the client's kernel already has the end (SOCK_DONE),
 * so its recv reads the bytes and then 0, never ECONNRESET; the reset's pending error is EPIPE
 * while the client still writes (CLOSE_WAIT), and there is none when it had shut down too (the
 * server's kernel, with both FINs, closes without a reset).
 * Apache's lingering close does this to a keep-alive client whose next request crossed it: under
 * memlan, ab -k read ECONNRESET and stopped ("apr_socket_recv: Connection reset by peer").
 * Run once over kernel TCP and once under `memlan run`: the outputs must be equal
 * (tests/py/test_preload.py).
 *
 * usage: finreset PORT
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "callscript.h"



/* how: 'c' the server closes, 'l' it closes with SO_LINGER 0.  client_shut: 1, the client shuts
 * down writing too after its last request (LAST_ACK); 2, it shuts down only after the server's
 * close: the reset came first and its EPIPE stays pending (the shutdown's own result, ENOTCONN
 * over kernel TCP, is not printed). */
static void fin_then_reset(char how, int client_shut, const char *calls)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("fin, request, %s%s, then %s\n", how == 'c' ? "close" : "linger 0 close",
           client_shut == 1 ? ", client shut" : client_shut ? ", client shut after" : "", calls);
    send(s, "resp", 4, 0);
    shutdown(s, SHUT_WR);
    settle_close();
    send(c, "request", 7, 0);
    if (client_shut == 1)
        shutdown(c, SHUT_WR);
    usleep(20000);
    if (how == 'l') {
        struct linger lg = {1, 0};
        setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(s);
    settle_close();
    if (client_shut == 2)
        (void)shutdown(c, SHUT_WR);
    script(c, calls);
    close(c);
}

/* The accepted end's last holder, a child, shuts down writing and is killed, the request
 * unread.  No poll first: memlan learns of a death when a call probes for it (a recv at the
 * end does), the kernel at once. */
static void fin_then_killed(int client_shut, const char *calls)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("fin, request, holder killed%s, then %s\n",
           client_shut == 1 ? ", client shut" : client_shut ? ", client shut after" : "", calls);
    int go[2];
    if (pipe(go) < 0)
        cs_die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        send(s, "resp", 4, 0);
        shutdown(s, SHUT_WR);
        if (write(go[1], "s", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    close(s);
    char x;
    if (read(go[0], &x, 1) != 1)
        cs_die("go");
    settle_close();
    send(c, "request", 7, 0);
    if (client_shut == 1)
        shutdown(c, SHUT_WR);
    usleep(20000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    settle_close();
    if (client_shut == 2)
        (void)shutdown(c, SHUT_WR); /* after the death's reset: EPIPE stays */
    script(c, calls);
    close(go[0]);
    close(go[1]);
    close(c);
}

static int blocked_fd;

static void *blocked_recv(void *arg)
{
    char b[8];
    for (int i = 0; i < 3; i++) {
        ssize_t r = recv(blocked_fd, b, sizeof b, 0);
        printf("  blocked recv %zd %s\n", r, r < 0 ? strerror(errno) : "");
        if (r <= 0)
            break;
    }
    return arg;
}

/* A thread asleep in recv: it reads the response and the end, not the reset after it. */
static void blocked(void)
{
    int c, s;
    cs_pair(&c, &s, 0);
    printf("fin, request, close, recv asleep\n");
    blocked_fd = c;
    send(c, "request", 7, 0);
    usleep(20000);
    pthread_t t;
    pthread_create(&t, NULL, blocked_recv, NULL);
    usleep(100000);
    send(s, "resp", 4, 0);
    shutdown(s, SHUT_WR);
    usleep(20000);
    close(s);
    pthread_join(t, NULL);
    settle_close();
    script(c, "PRE");
    close(c);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    cs_listen(argv[1]);

    fin_then_reset('c', 0, "PWRRRRSSP");
    fin_then_reset('c', 0, "ERRRP");
    fin_then_reset('c', 0, "SSRRP");
    fin_then_reset('c', 1, "PRRRREP");
    fin_then_reset('l', 0, "PRRRRSP");
    fin_then_reset('c', 2, "PRRREP");
    fin_then_reset('l', 2, "ESP");
    fin_then_killed(0, "RRRRESP");
    fin_then_killed(1, "RRRREP");
    fin_then_killed(2, "EPRRRR");
    blocked();
    printf("done\n");
    return 0;
}
