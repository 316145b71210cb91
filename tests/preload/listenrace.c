/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * listenrace: a client that connects as soon as the server's port answers.  Each round a server
 * process binds, tells the client, waits 0-3 ms, and listens; the client retries connect (a new
 * socket after each ECONNREFUSED) until one is accepted, then an echo of 4 bytes.  20 rounds.
 * Under memlan nearly every one of these connections is accelerated: the listener is published
 * before the kernel's listen (interpose.c).  It was published after, and a client that connected
 * in that moment found no record and stayed on TCP (a haproxy test's client did, once, in a
 * clean-clone CI run; 0 to 2 of these 20 were accelerated).  An attempt whose look-up of the
 * record came just before the publication and whose connect just after the listen stayed on TCP
 * too (1 to 4 of 20) until the kernel's listen came 200 us after the publication.  The program prints the same lines over kernel TCP and under memlan; the
 * test counts the log's accelerated connections.  usage: listenrace PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
    printf("%s: %s\n", what, strerror(errno));
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(60);
    int base = atoi(argv[1]);
    for (int k = 0; k < 20; k++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + k))};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        int p[2];
        if (pipe(p) < 0)
            die("pipe");
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            close(p[0]);
            int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
            setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (bind(l, (struct sockaddr *)&a, sizeof a) < 0)
                die("bind");
            if (write(p[1], "b", 1) != 1)
                die("tell");
            struct timespec d = {0, (long)(k % 4) * 1000000L};
            nanosleep(&d, NULL);
            if (listen(l, 4) < 0)
                die("listen");
            int c = accept(l, NULL, NULL);
            char b[4];
            if (c < 0 || recv(c, b, 4, MSG_WAITALL) != 4 || send(c, b, 4, 0) != 4)
                die("echo");
            close(c);
            close(l);
            exit(0); /* with its exit handlers: the preload lets its fabric files go */
        }
        close(p[1]);
        char x;
        if (read(p[0], &x, 1) != 1)
            die("bound");
        close(p[0]);
        int c, tries = 0;
        for (;;) {
            c = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(c, (struct sockaddr *)&a, sizeof a) == 0)
                break;
            if (errno != ECONNREFUSED || ++tries > 2000000)
                die("connect");
            close(c);
        }
        char b[4];
        if (send(c, "ping", 4, 0) != 4 || recv(c, b, 4, MSG_WAITALL) != 4 || memcmp(b, "ping", 4))
            die("reply");
        close(c);
        int st;
        waitpid(pid, &st, 0);
        printf("round %d: echoed, server %d\n", k, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    printf("done\n");
    return 0;
}
