/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * vforkexit: a process with a listener and a connection vforks a child whose exec fails and
 * which then leaves by exit(), not _exit (a common mistake: undefined, but it runs the exit
 * handlers in the parent's memory, and programs do it).  Then the parent goes on: the old
 * connection carries a byte, and a new connection to its listener carries a byte each way,
 * as over kernel TCP.
 *
 * Under memlan the child ran memlan's exit handler in the parent's memory: the parent's
 * listener record went, and its "exit() has begun" flag stayed set, so every later connection
 * of the parent stayed on TCP (the log: "TCP (exit() has begun in this process)").  The bytes
 * are the same either way; the test's pytest reads the log.
 *
 * usage: vforkexit PORT
 */
#include "twoends.h"

#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    int c = settled_pair(l, &a, &s);
    pid_t p = vfork();
    if (p == 0) {
        char *av[] = {"/nonexistent/vforkexit", NULL};
        execv(av[0], av);
        exit(127);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p)
        die("vfork");
    printf("child's exit: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    char b;
    if (send(c, "x", 1, 0) != 1 || recv(s, &b, 1, 0) != 1 || b != 'x')
        die("the old connection");
    printf("the old connection: a byte\n");
    int s2, c2 = settled_pair(l, &a, &s2);
    if (send(s2, "y", 1, 0) != 1 || recv(c2, &b, 1, 0) != 1 || b != 'y')
        die("the new connection");
    printf("a new connection: a byte each way\n");
    close(c2);
    close(s2);
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
