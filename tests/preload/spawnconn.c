/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * spawnconn: a connection handed to a program started by posix_spawn, whose exec glibc makes
 * inside libc.  Run once over kernel TCP and once under `memlan run` (tests/py/test_preload.py):
 * stdout must be the same.  One process holds both ends (c, the client; acc, accepted), and
 * spawns this program again as the child ("- echo IN OUT": reads a line on fd IN, writes
 * "got:LINE" on fd OUT, exits).
 *   dup2      acc closes on exec; the file actions dup2 it onto the child's 0 and 1 (an inetd,
 *             or Rust's Command with a socket for stdin); the parent closes acc after the spawn
 *   inherit   acc does not close on exec; posix_spawnp, no file actions, the child uses acc's
 *             number; the parent keeps acc and answers on it after the child ends
 *   none      acc closes on exec and the file actions leave it: the child does not get it; the
 *             parent answers on acc, then closes it (the client reads the end at once)
 *   fail      a spawn of a program that does not exist, with the dup2 actions: ENOENT, and the
 *             parent answers on acc
 * Each case prints what the client read, and whether it read the end within 2 s of the last
 * close.
 *
 * usage: spawnconn PORT
 *        spawnconn - echo IN OUT   (the spawned child)
 */
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "twoends.h"

extern char **environ;

static int child_echo(int in, int out)
{
    char line[128];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t r = read(in, line + n, 1);
        if (r <= 0)
            return 3;
        if (line[n++] == '\n')
            break;
    }
    char reply[160];
    int k = snprintf(reply, sizeof reply, "got:%.*s", (int)n, line);
    return write(out, reply, (size_t)k) == k ? 0 : 4;
}

/* What the client reads within 2 s: a line, or the end ("EOF"), or nothing. */
static void client_reads(int c, const char *what)
{
    char b[128];
    size_t n = 0;
    while (n + 1 < sizeof b) {
        struct pollfd p = {c, POLLIN, 0};
        if (poll(&p, 1, 2000) != 1)
            break;
        ssize_t r = recv(c, b + n, 1, 0);
        if (r <= 0) {
            printf("%s: the client read %s\n", what, r == 0 ? "EOF" : strerror(errno));
            return;
        }
        if (b[n++] == '\n')
            break;
    }
    printf("%s: the client read \"%.*s\"\n", what, (int)(n ? n - 1 : 0), b);
}

static pid_t spawn(const char *how, int acc, char **argv)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    char in[16], out[16];
    snprintf(in, sizeof in, "%d", strcmp(how, "inherit") ? 0 : acc);
    snprintf(out, sizeof out, "%d", strcmp(how, "inherit") ? 1 : acc);
    char *args[] = {argv[0], "-", "echo", in, out, NULL};
    if (!strcmp(how, "dup2") || !strcmp(how, "fail")) {
        posix_spawn_file_actions_adddup2(&fa, acc, 0);
        posix_spawn_file_actions_adddup2(&fa, acc, 1);
    }
    pid_t pid = -1;
    int r = !strcmp(how, "inherit")
                ? posix_spawnp(&pid, "/proc/self/exe", &fa, NULL, args, environ)
                : posix_spawn(&pid, !strcmp(how, "fail") ? "/nonexistent/spawnconn" : "/proc/self/exe",
                              &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    printf("%s: posix_spawn %s\n", how, r ? strerror(r) : "0");
    return r ? -1 : pid;
}

static void run_case(const char *how, int l, struct sockaddr_in *a, char **argv)
{
    int acc, c = settled_pair(l, a, &acc);
    if (strcmp(how, "inherit"))
        fcntl(acc, F_SETFD, FD_CLOEXEC);
    fcntl(c, F_SETFD, FD_CLOEXEC);
    pid_t pid = spawn(how, acc, argv);
    if (!strcmp(how, "dup2"))
        close(acc);
    if (send(c, "hello\n", 6, 0) != 6)
        die("client send");
    if (pid > 0 && strcmp(how, "none")) {
        client_reads(c, how);
        int st;
        waitpid(pid, &st, 0);
        printf("%s: the child exited %d\n", how, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    } else {
        if (pid > 0) {
            int st;
            waitpid(pid, &st, 0);
        }
        char b[16];
        ssize_t n = recv(acc, b, sizeof b, 0); /* the parent reads the line itself */
        printf("%s: the parent read %zd bytes\n", how, n);
        if (send(acc, "parent\n", 7, 0) != 7)
            die("parent send");
        client_reads(c, how);
    }
    if (!strcmp(how, "inherit")) { /* the parent goes on after the child */
        if (send(acc, "after\n", 6, 0) != 6)
            die("parent send after");
        client_reads(c, how);
    }
    if (strcmp(how, "dup2"))
        close(acc);
    double t0 = now_s();
    client_reads(c, how);
    printf("%s: the end within 2 s: %s\n", how, now_s() - t0 < 1.9 ? "yes" : "no");
    close(c);
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "-") == 0 && strcmp(argv[2], "echo") == 0)
        return child_echo(atoi(argv[3]), atoi(argv[4]));
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    const char *cases[] = {"dup2", "inherit", "none", "fail"};
    for (int i = 0; i < 4; i++)
        run_case(cases[i], l, &a, argv);
    printf("done\n");
    return 0;
}
