/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * stdioearly: a connection moved onto fd 1 before the server has accepted it, then written
 * with printf, as bash's `exec 3<>/dev/tcp/HOST/PORT; echo hi >&3` does.  Run once over kernel
 * TCP and once under `memlan run` (tests/py/test_preload.py): the server must get the same bytes.
 * Under memlan the connection was not decided at the dup2, glibc's stdout stayed and wrote to
 * the kernel socket, and the server, which then accepted it onto the channel, got nothing.
 *
 * usage: stdioearly PORT
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "twoends.h"

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int out = dup(1);
    if (out < 0)
        die("dup");
    for (int round = 0; round < 3; round++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) { /* the server: accepts late, prints what arrives until EOF */
            usleep(300 * 1000);
            int s = accept(l, NULL, NULL);
            if (s < 0)
                die("accept");
            char buf[256];
            size_t got = 0;
            ssize_t n;
            while (got < sizeof buf - 1 && (n = read(s, buf + got, sizeof buf - 1 - got)) > 0)
                got += (size_t)n;
            buf[got] = 0;
            dprintf(out, "round %d: the server got %zu bytes: '%s'\n", round, got, buf);
            _exit(0);
        }
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
            die("connect");
        if (dup2(c, 1) != 1)
            die("dup2");
        printf("early line %d\n", round);
        fflush(stdout);
        if (dup2(out, 1) != 1) /* as bash puts its stdout back after `echo >&3` */
            die("dup2 back");
        if (shutdown(c, SHUT_WR) != 0) /* the socket stays open, as bash's fd 3 does */
            die("shutdown");
        int st;
        if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("the server");
        close(c);
    }
    printf("done\n");
    return 0;
}
