/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * execodd: exec calls that fail, with odd arguments, printed line by line: the error each gives
 * (and that it gives one, not a crash).  Run once over kernel TCP and once under `memlan run`:
 * the outputs must be equal (tests/py/test_preload.py).  execveat with a directory fd and a null
 * path is the kernel's EFAULT; the secure-execution note (src/preload/exec.c) read path[0] first
 * and the program died of SIGSEGV under memlan.  Each call runs in a child, so that a crash is
 * printed as such; the vfork ones in a vfork child.
 *
 * usage: execodd PORT (the port is not used)
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static char *args[] = {"true", NULL};
static int dirfd_;
static const char *volatile nullpath; /* NULL, hidden from the compiler's nonnull check */

static int call(int which)
{
    switch (which) {
    case 0:
        return execveat(dirfd_, nullpath, args, environ, 0);
    case 1:
        return execveat(AT_FDCWD, nullpath, args, environ, 0);
    case 2:
        return execve(nullpath, args, environ);
    case 3:
        return execve("/nonexistent-memlan/x", args, environ);
    case 4:
        return execvp("no-such-program-memlan", args);
    case 5:
        return execveat(dirfd_, "no-such-file-memlan", args, environ, 0);
    case 6:
        return fexecve(-1, args, environ);
    default:
        return 0;
    }
}

static void one(int which, int use_vfork)
{
    pid_t p = use_vfork ? vfork() : fork();
    if (p == 0) {
        errno = 0;
        int r = call(which);
        _exit(r < 0 ? (errno & 0x7f) : 126);
    }
    int st = 0;
    waitpid(p, &st, 0);
    if (WIFSIGNALED(st))
        printf("%s %d: killed by signal %d\n", use_vfork ? "vfork" : "fork", which, WTERMSIG(st));
    else
        printf("%s %d: errno %s\n", use_vfork ? "vfork" : "fork", which,
               strerrorname_np(WEXITSTATUS(st)) ? strerrorname_np(WEXITSTATUS(st)) : "?");
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    setvbuf(stdout, NULL, _IOLBF, 0);
    dirfd_ = open("/", O_RDONLY | O_DIRECTORY);
    if (dirfd_ < 0)
        return 1;
    for (int i = 0; i < 7; i++) {
        one(i, 0);
        one(i, 1);
    }
    printf("done\n");
    return 0;
}
