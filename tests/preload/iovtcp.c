/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * iovtcp: readv and writev with a vector pointer the kernel cannot read, on a connection that
 * memlan offered to accelerate and that settled on TCP (its server, accepted by a raw system
 * call memlan does not see, spoke first over TCP).  The kernel says EFAULT to both; under memlan
 * the calls must go to the kernel too, without reading the vector themselves.  A SIGSEGV is a
 * line of output.
 *
 * usage: iovtcp PORT
 */
#include "twoends.h"

#include <signal.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static volatile const char *doing = "";

static void on_segv(int sig)
{
    (void)sig;
    char line[64];
    int n = snprintf(line, sizeof line, "%s: SIGSEGV\n", (const char *)doing);
    (void)!write(1, line, (size_t)n);
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect");
    int s = (int)syscall(SYS_accept4, l, NULL, NULL, 0);
    if (s < 0)
        die("accept4");
    if (syscall(SYS_write, s, "hello", 5) != 5)
        die("the server's word");
    char b[16];
    ssize_t r = recv(c, b, 5, MSG_WAITALL);
    printf("recv: %zd\n", r);
    struct sigaction sa = {.sa_handler = on_segv};
    sigaction(SIGSEGV, &sa, NULL);
    volatile uintptr_t at = 16; /* no page there; volatile: the compiler may not judge it */
    const struct iovec *wild = (const struct iovec *)at;
    doing = "readv";
    r = readv(c, wild, 1);
    printf("readv: %zd %s\n", r, r < 0 ? strerror(errno) : "");
    doing = "writev";
    r = writev(c, wild, 1);
    printf("writev: %zd %s\n", r, r < 0 ? strerror(errno) : "");
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
