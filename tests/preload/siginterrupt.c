/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * siginterrupt: handlers installed without SA_RESTART by the calls memlan cannot count
 * (signal() then siginterrupt(sig, 1); sysv_signal(), which is what signal() is in strict ISO C)
 * interrupt a blocking recv with EINTR, as the kernel's recv is: an alarm() timeout fires.
 * Printed line by line over kernel TCP and under memlan (tests/py/test_preload.py).
 *
 * usage: siginterrupt PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern __sighandler_t sysv_signal(int, __sighandler_t);

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* siginterrupt: the point of the test */

static volatile sig_atomic_t fired;
static void on_alarm(int sig) { (void)sig; fired++; }

static void timed_recv(int fd, const char *how)
{
    char b;
    fired = 0;
    alarm(1);
    ssize_t r = recv(fd, &b, 1, 0);
    int e = errno;
    alarm(0);
    printf("%s: recv %zd %s, handler ran %d\n", how, r, r < 0 ? strerror(e) : "", (int)fired);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0)
        return 1;
    int done[2];
    if (pipe(done) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) { /* the peer: says hello, then stays silent until told to go */
        int c = socket(AF_INET, SOCK_STREAM, 0);
        char b;
        if (connect(c, (void *)&a, sizeof a) < 0 || write(c, "h", 1) != 1)
            _exit(1);
        (void)read(done[0], &b, 1);
        _exit(0);
    }
    int fd = accept(l, NULL, NULL);
    char h;
    if (fd < 0 || recv(fd, &h, 1, 0) != 1)
        return 1;
    signal(SIGALRM, on_alarm);
    siginterrupt(SIGALRM, 1);
    timed_recv(fd, "signal + siginterrupt");
    sysv_signal(SIGALRM, on_alarm);
    timed_recv(fd, "sysv_signal");
    if (write(done[1], "g", 1) != 1)
        return 1;
    int st;
    waitpid(pid, &st, 0);
    printf("done\n");
    return 0;
}
