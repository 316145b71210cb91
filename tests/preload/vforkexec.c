/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * vforkexec: a process that holds a connection vforks and execs /bin/true many times; its heap
 * must not grow with the number of execs, as it does not over kernel TCP.  A vfork child runs
 * in its parent's memory: what memlan allocated there for an exec that succeeded (the new
 * image's environment, the list of carried connections) was never freed, about 400 bytes per
 * exec (found by LeakSanitizer with the ASan-built preload: make test-preload-asan).  Then the
 * connection still works.
 *
 * usage: vforkexec PORT
 */
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXECS 300

static size_t heap_used(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

static void spawn(void)
{
    pid_t pid = vfork();
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("FAIL child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(60);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0)
        return 1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a) < 0)
        return 1;
    int s = accept(l, NULL, NULL);
    char b;
    if (s < 0 || send(s, "h", 1, 0) != 1 || recv(c, &b, 1, MSG_WAITALL) != 1)
        return 1;
    /* The first execs warm up whatever is made once (caches, the dynamic loader's state). */
    for (int i = 0; i < 20; i++)
        spawn();
    size_t before = heap_used();
    for (int i = 0; i < EXECS; i++)
        spawn();
    size_t after = heap_used();
    long grew = (long)after - (long)before;
    printf("heap after %d vfork+exec: %s\n", EXECS, grew < 16384 ? "as before" : "grew");
    if (grew >= 16384)
        fprintf(stderr, "grew by %ld bytes\n", grew);
    ssize_t w = send(c, "abc", 3, 0);
    char buf[8];
    ssize_t r = recv(s, buf, sizeof buf, 0);
    printf("connection after: send %zd recv %zd\n", w, r);
    printf("done\n");
    return 0;
}
