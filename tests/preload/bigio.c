/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * bigio: one call of more than 2 GiB moves at most 0x7ffff000 bytes on Linux (MAX_RW_COUNT:
 * every read and write, and every vector, is cut to it), so a program may keep the count in an
 * int.  A blocking write of 3 GiB and a writev of two 1.5 GiB pieces each return 2147479552, and
 * a blocking recv(MSG_WAITALL) into 3 GiB returns 2147479552 too; every byte arrives.
 *
 * usage: bigio PORT
 * The writer's 3 GiB is a private anonymous mapping it never writes (the zero page); the
 * reader's is one 1 MiB memfd mapped 3072 times: neither costs 3 GiB of memory.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG ((size_t)3 << 30)
#define MIB ((size_t)1 << 20)

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

/* n bytes of the writer's: all of them, the first call's count printed. */
static void put(int c, const char *p, size_t n, int vec)
{
    struct iovec v[2] = {{(void *)p, n / 2}, {(void *)(p + n / 2), n - n / 2}};
    ssize_t w = vec ? writev(c, v, 2) : write(c, p, n);
    printf("%s of %zu returned %zd\n", vec ? "writev of two pieces" : "write", n, w);
    fflush(stdout);
    if (w <= 0)
        die("write");
    for (size_t done = (size_t)w; done < n; done += (size_t)w)
        if ((w = write(c, p + done, n - done)) <= 0)
            die("write the rest");
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
        die("listen");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) { /* the writer */
        alarm(120);
        close(l);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        char y;
        if (connect(c, (struct sockaddr *)&a, sizeof a) || send(c, "x", 1, 0) != 1 ||
            recv(c, &y, 1, MSG_WAITALL) != 1)
            die("connect");
        const char *p = mmap(NULL, BIG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            die("mmap");
        put(c, p, BIG, 0);
        put(c, p, BIG, 1);
        close(c);
        _exit(0);
    }
    alarm(120);
    int s = accept(l, NULL, NULL);
    char x;
    if (s < 0 || recv(s, &x, 1, MSG_WAITALL) != 1 || send(s, "y", 1, 0) != 1)
        die("accept");
    int fd = memfd_create("bigio", 0);
    char *in = mmap(NULL, BIG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fd < 0 || ftruncate(fd, (off_t)MIB) || in == MAP_FAILED)
        die("memfd");
    for (size_t o = 0; o < BIG; o += MIB)
        if (mmap(in + o, MIB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
            die("mmap the memfd");
    ssize_t first = recv(s, in, BIG, MSG_WAITALL), r;
    size_t got = first > 0 ? (size_t)first : 0;
    while ((r = recv(s, in, BIG, 0)) > 0)
        got += (size_t)r;
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("writer");
    /* The reader's first count after the writer's lines: printed last, in the same order
     * whichever side got there first. */
    printf("recv(MSG_WAITALL) of %zu returned %zd\nreader got %zu in all\n", BIG, first, got);
    return 0;
}
