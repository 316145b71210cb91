/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * shutrdwrite: a connection whose reading side we shut down (shutdown SHUT_RD) goes on writing,
 * each write after a poll for POLLOUT, for 1.5 s: over kernel TCP every write succeeds and the
 * peer reads every byte.  Under memlan the kernel socket's own RDHUP (which our SHUT_RD makes)
 * was taken for the peer's FIN: a second later the live peer was declared dead, poll said
 * POLLHUP|POLLERR and the writes failed with EPIPE.  With "killed", the peer is killed after
 * our SHUT_RD instead: the writes must fail (EPIPE) within a second, and poll say POLLHUP and
 * POLLERR, as over kernel TCP (the peer's liveness lock tells that end now).  Without it, we
 * then shut down our writing side too: with both ways shut poll says POLLHUP at once, the peer
 * still alive, as the kernel does (memlan said it only once the peer had ended).
 *
 * usage: shutrdwrite PORT TIMEOUT_MS [killed]  (TIMEOUT_MS: the polls' timeout, 0 or more)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "twoends.h"

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    int port = atoi(argv[1]), tmo = atoi(argv[2]);
    bool killed = argc > 3 && strcmp(argv[3], "killed") == 0;
    struct sockaddr_in a;
    int l = listen_here(port, &a);
    int tell[2]; /* the peer's count of the bytes it read, and then its wait to be killed */
    if (pipe(tell))
        die("pipe");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) { /* reads until our SHUT_WR, says how much, waits to be killed */
        close(tell[0]);
        int s = accept(l, NULL, NULL);
        if (s < 0)
            die("accept");
        close(l);
        char b[4096];
        long n = 0;
        ssize_t r;
        while ((r = read(s, b, sizeof b)) > 0)
            n += r;
        if (r < 0 || write(tell[1], &n, sizeof n) != sizeof n)
            die("peer read");
        for (;;)
            pause();
    }
    close(l);
    close(tell[1]);
    signal(SIGPIPE, SIG_IGN);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a))
        die("connect");
    char b = 'x';
    long wrote = 0, failed = 0;
    if (write(c, &b, 1) != 1)
        die("first write");
    wrote++;
    usleep(100000);
    if (shutdown(c, SHUT_RD))
        die("shutdown SHUT_RD");
    if (killed && (kill(pid, SIGKILL) || waitpid(pid, NULL, 0) != pid))
        die("kill");
    short seen = 0;
    double first_fail = -1, t0 = now_s();
    for (double end = t0 + (killed ? 1 : 1.5); now_s() < end;) {
        struct pollfd p = {.fd = c, .events = POLLOUT};
        if (poll(&p, 1, tmo) < 0)
            die("poll");
        seen |= p.revents;
        if (p.revents & POLLOUT) {
            if (write(c, &b, 1) == 1)
                wrote++;
            else if (failed++ == 0)
                first_fail = now_s() - t0;
        }
        usleep(1000);
    }
    printf("after SHUT_RD%s:%s%s%s, %s writes failed\n", killed ? " and the kill" : "",
           seen & POLLOUT ? " POLLOUT" : "", seen & POLLHUP ? " POLLHUP" : "",
           seen & POLLERR ? " POLLERR" : "", failed ? "some" : "no");
    if (killed) {
        printf("the first failed within a second: %s\n",
               first_fail >= 0 && first_fail < 1 ? "yes" : "no");
    } else {
        if (shutdown(c, SHUT_WR))
            die("shutdown SHUT_WR");
        /* Both ways shut, the peer alive: the kernel says POLLHUP (memlan said it only once
         * the peer had ended too). */
        struct pollfd p = {.fd = c, .events = POLLIN | POLLOUT | POLLRDHUP};
        if (poll(&p, 1, tmo) != 1)
            die("poll after SHUT_WR");
        printf("after SHUT_WR too:%s%s%s%s\n", p.revents & POLLIN ? " POLLIN" : "",
               p.revents & POLLOUT ? " POLLOUT" : "", p.revents & POLLRDHUP ? " POLLRDHUP" : "",
               p.revents & POLLHUP ? " POLLHUP" : "");
        long n = -1;
        if (read(tell[0], &n, sizeof n) != sizeof n)
            die("peer's count");
        printf("the peer read every byte: %s\n", n == wrote ? "yes" : "no");
        if (kill(pid, SIGKILL) || waitpid(pid, NULL, 0) != pid)
            die("kill");
    }
    printf("done\n");
    return 0;
}
