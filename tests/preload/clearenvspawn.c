/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * clearenvspawn PORT: after clearenv() (environ NULL, as glibc leaves it), system(),
 * posix_spawn with environ and execve of a child with it, an accelerated connection open (its fd
 * without close-on-exec) or not.  Over kernel TCP each runs; under memlan the spawns' carry read
 * the NULL environment and died of SIGSEGV (review of e6cfadf and 5304f5f).
 */
#include "twoends.h"

#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

static void spawns(const char *when)
{
    int st = system("exit 3");
    printf("%s: system: %d\n", when, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    printf("%s: system(NULL): %d\n", when, system(NULL) != 0);
    pid_t p;
    char *argv[] = {(char *)"sh", (char *)"-c", (char *)"exit 4", NULL};
    int r = posix_spawn(&p, "/bin/sh", NULL, NULL, argv, environ);
    if (r == 0 && waitpid(p, &st, 0) == p)
        printf("%s: posix_spawn: %d\n", when, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    else
        printf("%s: posix_spawn: failed %d\n", when, r);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    if (clearenv() != 0)
        die("clearenv");
    printf("environ %s\n", environ ? "set" : "NULL");
    spawns("no connection");
    int acc, c = settled_pair(l, &a, &acc);
    spawns("a connection");
    close(c);
    close(acc);
    close(l);
    printf("done\n");
    return 0;
}
