/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkshut: after fork, the child shuts the shared connection down for writing and exits; the
 * parent's next send fails with EPIPE and the other end reads EOF and nothing after it, as the
 * kernel's shared socket behaves (issue 19, item 10).
 *
 * usage: forkshut PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0) {
        perror("listen");
        return 1;
    }
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("connect");
        return 1;
    }
    int s = accept(l, NULL, NULL);
    printf("send before: %zd\n", send(c, "a", 1, MSG_NOSIGNAL));
    pid_t p = fork();
    if (p == 0) {
        printf("child shutdown: %d\n", shutdown(c, SHUT_WR));
        exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    errno = 0;
    ssize_t w = send(c, "b", 1, MSG_NOSIGNAL);
    printf("parent send after: %zd %s\n", w, w < 0 ? strerrorname_np(errno) : "-");
    struct timeval tv = {2, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 4; i++) {
        char b[8];
        errno = 0;
        ssize_t r = recv(s, b, sizeof b, 0);
        printf("peer recv: %zd %.*s %s\n", r, r > 0 ? (int)r : 0, b,
               r < 0 ? strerrorname_np(errno) : "");
        if (r <= 0)
            break;
    }
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
