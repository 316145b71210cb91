/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * lowatstale: the SO_RCVLOWAT a new connection starts with is its kernel socket's, whatever an
 * earlier fd of the same number carried.  Three cases, one connection each (client and server in
 * this process), 4 bytes queued by the server:
 *   stale  a unix socket with SO_RCVLOWAT 100 closed by fclose (glibc's own close, which the
 *          preload does not see), then a TCP socket on the same number: its mark is 1;
 *   dup    SO_RCVLOWAT 10 set, the socket dup'ed and the original closed: the dup's mark is 10;
 *   listen SO_RCVLOWAT 10 set on the listener after the connection was queued: the accepted
 *          socket's mark is the one the kernel gave it.
 * Each prints the mark, poll's answer within 300 ms and a blocking recv's count under a 1 s
 * SO_RCVTIMEO, compared line for line with kernel TCP.  (A review found the first two: the
 * channel took the mark from the fd's record, which kept the closed fd's and knew nothing of
 * the dup: "poll 0 0" and a recv held to its timeout where the kernel said "poll 1 0x1".)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
    printf("%s: %s\n", what, strerror(errno));
    exit(1);
}

static void setlw(int fd, int v)
{
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) < 0)
        die("SO_RCVLOWAT");
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void report(const char *cs, const char *queued, int c)
{
    int v;
    socklen_t l = sizeof v;
    getsockopt(c, SOL_SOCKET, SO_RCVLOWAT, &v, &l);
    struct pollfd p = {.fd = c, .events = POLLIN};
    int r = poll(&p, 1, 300);
    printf("%s: mark %d, %s queued: poll %d 0x%x\n", cs, v, queued, r, (unsigned)p.revents);
    struct timeval tv = {.tv_sec = 1};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    double t0 = now();
    ssize_t n = recv(c, buf, sizeof buf, 0);
    printf("%s: blocking recv %zd, held to its timeout: %s\n", cs, n,
           now() - t0 > 0.9 ? "yes" : "no");
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(30);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 8) < 0)
        die("listen");
    const char *cases[] = {"stale", "dup", "listen"};
    for (int k = 0; k < 3; k++) {
        const char *cs = cases[k];
        int c;
        if (k == 0) {
            int u = socket(AF_UNIX, SOCK_STREAM, 0);
            setlw(u, 100);
            FILE *f = fdopen(u, "r+");
            if (!f)
                die("fdopen");
            fclose(f);
            c = socket(AF_INET, SOCK_STREAM, 0);
            printf("stale: the new socket has the closed one's number: %s\n",
                   c == u ? "yes" : "no");
        } else if (k == 1) {
            int o = socket(AF_INET, SOCK_STREAM, 0);
            setlw(o, 10);
            c = dup(o);
            close(o);
        } else {
            c = socket(AF_INET, SOCK_STREAM, 0);
        }
        if (connect(c, (struct sockaddr *)&a, sizeof a) < 0)
            die("connect");
        int x;
        if (k == 2) {
            /* The connection is queued: the listener's mark set now is not the accepted
             * socket's (the kernel copied the listener's when the connection came). */
            usleep(100000);
            setlw(lfd, 10);
            x = accept(lfd, NULL, NULL);
            report("listen", "nothing", x);
            setlw(lfd, 1);
            if (send(c, "abcd", 4, 0) != 4)
                die("send");
            usleep(100000);
            report("listen", "4 bytes", x);
        } else {
            x = accept(lfd, NULL, NULL);
            if (x < 0 || send(x, "abcd", 4, 0) != 4)
                die("accept");
            usleep(100000);
            report(cs, "4 bytes", c);
        }
        close(x);
        close(c);
    }
    printf("done\n");
    return 0;
}
