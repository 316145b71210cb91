/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * connectintr: a blocking connect interrupted by a signal (EINTR: the listener's accept queue is
 * full, the SYN was dropped and is retransmitted 1 s on).  The kernel goes on connecting; the
 * server accepts once the retransmitted SYN completes the handshake, and the program's second
 * connect says 0.  Then the client sends a request: over kernel TCP the server has it at once.
 *
 * Under memlan the interrupted connect gave its offer up, and the second connect, which the
 * kernel answers with 0, posted one for a connection the server had already accepted (over TCP,
 * no offer then): nobody took it, and the request waited in the ring for the accept wait, 2 s.
 *
 * usage: connectintr PORT
 */
#include "twoends.h"

#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

static void on_alarm(int sig) { (void)sig; }

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_backlog(atoi(argv[1]), 0, &a);
    /* Fill the accept queue (backlog 0 holds one). */
    int fill = socket(AF_INET, SOCK_STREAM, 0);
    if (fill < 0 || connect(fill, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect fill");
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART */
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {.it_value = {.tv_usec = 200000}};
    setitimer(ITIMER_REAL, &it, NULL);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    int r = connect(c, (struct sockaddr *)&a, sizeof a);
    printf("first connect: %s\n", r == 0 ? "0" : strerror(errno));
    int f = accept(l, NULL, NULL); /* room in the queue again */
    struct pollfd p = {.fd = l, .events = POLLIN};
    if (f < 0 || poll(&p, 1, 5000) != 1)
        die("the retransmitted SYN");
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    r = connect(c, (struct sockaddr *)&a, sizeof a);
    printf("second connect: %s\n", r == 0 ? "0" : strerror(errno));
    double t0 = now_s();
    if (send(c, "ping", 4, 0) != 4)
        die("send");
    char b[4];
    p = (struct pollfd){.fd = s, .events = POLLIN};
    ssize_t n = poll(&p, 1, 5000) == 1 ? recv(s, b, 4, MSG_WAITALL) : -1;
    double dt = now_s() - t0;
    printf("server: %s %s\n", n == 4 && memcmp(b, "ping", 4) == 0 ? "ping" : "nothing",
           dt < 0.5 ? "within 0.5 s" : "late");
    close(c);
    close(s);
    close(f);
    close(fill);
    close(l);
    printf("done\n");
    return 0;
}
