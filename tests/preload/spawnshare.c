/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * spawnshare: a connection shared with a process started by vfork + exec (no fork handler
 * runs), which moves bytes on it; then the parent moves bytes on it too.  Run once over kernel TCP and once under `memlan run` (tests/py/test_preload.py): stdout
 * must be the same.
 *   vfork send      the exec'd child sends "child", then the parent "parent": the peer reads
 *                   "childparent"
 *   vfork recv      the peer sends "0123456789"; the exec'd child reads 5 bytes, then the
 *                   parent reads the other 5: "56789"
 *   round 2         the same again on the same connection (the parent's locks now the mutex)
 * (posix_spawn: tests/preload/spawnconn.c.)
 *
 * usage: spawnshare PORT            (the test)
 *        spawnshare - send FD TEXT  (the exec'd child: sends TEXT on FD)
 *        spawnshare - recv FD N     (the exec'd child: reads N bytes on FD, prints them)
 */
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "twoends.h"

static int child_main(char **argv)
{
    int fd = atoi(argv[3]);
    if (strcmp(argv[2], "send") == 0) {
        size_t n = strlen(argv[4]);
        if (send(fd, argv[4], n, 0) != (ssize_t)n)
            return 3;
        return 0;
    }
    int want = atoi(argv[4]), got = 0;
    char b[64];
    while (got < want) {
        ssize_t r = recv(fd, b + got, (size_t)(want - got), 0);
        if (r <= 0)
            return 4;
        got += (int)r;
    }
    printf("  child read: %.*s\n", got, b);
    return 0;
}

static void run_child(const char *self, char *const args[])
{
    pid_t pid = vfork();
    if (pid < 0)
        die("vfork");
    if (pid == 0) {
        execv(self, args);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("FAIL the child: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        exit(1);
    }
}

/* Read up to want bytes from fd within a second. */
static int read_for(int fd, char *b, int want)
{
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int got = 0;
    while (got < want) {
        ssize_t r = recv(fd, b + got, (size_t)(want - got), 0);
        if (r <= 0)
            break;
        got += (int)r;
    }
    return got;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "-") == 0)
        return child_main(argv);
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    int acc, c = settled_pair(l, &a, &acc);
    fcntl(acc, F_SETFD, FD_CLOEXEC); /* only c goes to the child */
    char fds[16], b[64];
    snprintf(fds, sizeof fds, "%d", c);
    for (int round = 1; round <= 2; round++) {
        char how[24];
        snprintf(how, sizeof how, "round %d", round);

        /* send: the child's bytes, then ours */
        char *sargs[] = {argv[0], "-", "send", fds, "child", NULL};
        run_child("/proc/self/exe", sargs);
        if (send(c, "parent", 6, 0) != 6)
            die("parent send");
        int n = read_for(acc, b, 11);
        printf("%s send: the peer read \"%.*s\"\n", how, n, b);

        /* recv: the child reads 5, then we read the rest */
        if (send(acc, "0123456789", 10, 0) != 10)
            die("peer send");
        char *rargs[] = {argv[0], "-", "recv", fds, "5", NULL};
        run_child("/proc/self/exe", rargs);
        n = read_for(c, b, 5);
        printf("%s recv: the parent read \"%.*s\"\n", how, n, b);
    }
    close(c);
    close(acc);
    printf("done\n");
    return 0;
}
