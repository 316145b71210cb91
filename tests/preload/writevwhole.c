/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * writevwhole: a small writev on a nonblocking socket (a header and its payload, as Open MPI's
 * tcp BTL and many RPC systems send) reaches a reader that polls with nonblocking recvs in one
 * piece, as over kernel TCP, whose sendmsg queues the whole vector before the reader can see any
 * of it.  Under memlan, before, each piece of the vector was published on its own, so a reader
 * spinning on another cpu could take the header alone and come back for the payload.
 *
 * usage: writevwhole PORT [ROUNDS]
 * The writer sends ROUNDS (default 20000) vectors of 16 + 48 bytes, each after the reader's
 * one-byte answer to the one before (waited for in poll), and stops early after 20 s (a loaded
 * machine), then closes; the reader spins on recv(MSG_DONTWAIT) into a 256-byte buffer, counts
 * the first recvs that returned fewer than 64 bytes, and stops at the end of the stream.  The two
 * sides are pinned to different cpus where there are two.  Prints "split reads: 0" or "split
 * reads: some", and whether at least 1000 rounds ran.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "twoends.h"

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int port = atoi(argv[1]), rounds = argc > 2 ? atoi(argv[2]) : 20000;
    struct sockaddr_in a;
    int l = listen_here(port, &a), one = 1;
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) { /* the writer */
        close(l);
        pin(1);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a))
            die("connect");
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
        char hdr[16], body[48], ack;
        double end = now_s() + 20;
        for (int i = 0; i < rounds && now_s() < end; i++) {
            memset(hdr, 'h' + (i & 7), sizeof hdr);
            memset(body, 'b' + (i & 7), sizeof body);
            struct iovec v[2] = {{hdr, sizeof hdr}, {body, sizeof body}};
            ssize_t w = writev(c, v, 2);
            if (w != 64) { /* 64 bytes always fit in an empty socket buffer */
                printf("FAIL writev returned %zd (%s)\n", w, w < 0 ? strerror(errno) : "short");
                _exit(1);
            }
            for (;;) {
                struct pollfd p = {.fd = c, .events = POLLIN};
                if (poll(&p, 1, 30000) == 0)
                    die("ack: none in 30 s");
                ssize_t r = recv(c, &ack, 1, 0);
                if (r == 1)
                    break;
                if (r == 0 || (errno != EAGAIN && errno != EINTR))
                    die("ack");
            }
        }
        close(c);
        _exit(0);
    }
    pin(0);
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    close(l);
    long split = 0;
    int i;
    for (i = 0; i < rounds; i++) {
        char buf[256];
        size_t got = 0;
        int first = 1;
        double end = now_s() + 30; /* for this round */
        while (got < 64) {
            ssize_t r = recv(s, buf + got, sizeof buf - got, MSG_DONTWAIT);
            if (r > 0) {
                if (first && r < 64)
                    split++;
                first = 0;
                got += (size_t)r;
            } else if (r == 0 && got == 0) {
                break; /* the writer stopped early */
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR) || now_s() > end) {
                die("recv");
            }
        }
        if (got == 0)
            break;
        if (got != 64 || buf[0] != 'h' + (i & 7) || buf[15] != 'h' + (i & 7) ||
            buf[16] != 'b' + (i & 7) || buf[63] != 'b' + (i & 7)) {
            printf("FAIL round %d: %zu bytes, wrong data\n", i, got);
            return 1;
        }
        if (send(s, "a", 1, 0) != 1)
            die("send ack");
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("FAIL writer\n");
        return 1;
    }
    printf("at least 1000 rounds: %s\nsplit reads: %s\n", i >= 1000 ? "yes" : "no",
           split ? "some" : "0");
    fprintf(stderr, "rounds %d, split reads: %ld\n", i, split);
    close(s);
    return 0;
}
