/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * execconf: connections that live on across exec, printed line by line.  Run once over kernel
 * TCP and once under `memlan run`: the outputs must be equal (tests/py/test_preload.py).
 *
 * usage: execconf PORT
 *
 * The parent listens on 127.0.0.1:PORT.  A forked client connects, sends a greeting and execs
 * this program again ("client2 FD"), which sends 100 KB, reads its echo, shuts down its side and
 * waits for EOF.  The server reads the greeting itself, then hands the connection to an inetd-style
 * child: dup2 onto 0 and 1, a first exec that fails (ENOENT), then cat, which echoes through the
 * socket.  Bytes are in flight across every exec.  A second connection, accepted with
 * SOCK_CLOEXEC, goes to a child that execs sleep (so the child's copy closes at exec) while the
 * parent answers and closes it: the client must read the answer and then EOF.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BULK (100 * 1024)

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    _exit(1);
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + (i >> 9)); }

static int readn(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int writen(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = write(fd, (const char *)buf + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

/* The client after its exec: the rest of the conversation on an inherited fd. */
static int client2(int fd)
{
    static unsigned char out[BULK], in[BULK];
    for (size_t i = 0; i < BULK; i++)
        out[i] = pattern(i);
    /* Reader and writer must overlap (cat echoes as it reads): send from a child. */
    pid_t w = fork();
    if (w == 0) {
        if (writen(fd, out, BULK) < 0)
            die("client2 send");
        _exit(0);
    }
    if (readn(fd, in, BULK) < 0)
        die("client2 read echo");
    int st;
    waitpid(w, &st, 0);
    printf("C echo of %d bytes after exec: %s\n", BULK, memcmp(in, out, BULK) ? "CORRUPT" : "ok");
    if (shutdown(fd, SHUT_WR) < 0)
        die("client2 shutdown");
    char c;
    ssize_t r = read(fd, &c, 1);
    printf("C after shutdown: read %zd\n", r);
    close(fd);
    return 0;
}

static int connect_to(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    return s;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "client2") == 0)
        return client2(atoi(argv[2]));
    if (argc != 2) {
        fprintf(stderr, "usage: execconf PORT\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);
    int port = atoi(argv[1]);
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        die("readlink");
    self[sl] = '\0';

    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 8) < 0)
        die("listen");

    /* ---- 1. both sides exec with the connection open ---- */
    pid_t client = fork();
    if (client == 0) {
        close(ls);
        int s = connect_to(port);
        if (writen(s, "hello-1\n", 8) < 0)
            die("greeting");
        char fd[16];
        snprintf(fd, sizeof fd, "%d", s);
        execl(self, "execconf", "client2", fd, (char *)NULL);
        die("exec client2");
    }
    int c = accept(ls, NULL, NULL);
    if (c < 0)
        die("accept");
    char hello[9] = "";
    if (readn(c, hello, 8) < 0)
        die("read greeting");
    printf("S greeting before exec: %.7s\n", hello);
    pid_t handler = fork();
    if (handler == 0) {
        int report = dup(2);
        if (dup2(c, 0) < 0 || dup2(c, 1) < 0)
            die("dup2");
        close(c);
        close(ls);
        execlp("memlan-no-such-program", "x", (char *)NULL);
        dprintf(report, "S first exec failed: %s\n", errno == ENOENT ? "ENOENT" : strerror(errno));
        execlp("cat", "cat", (char *)NULL);
        dprintf(report, "FAIL exec cat: %s\n", strerror(errno));
        _exit(1);
    }
    close(c);
    int st;
    waitpid(client, &st, 0);
    printf("S client exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    waitpid(handler, &st, 0);
    printf("S cat exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);

    /* ---- 2. a child's copy that closes at exec while the parent keeps talking ---- */
    int pfd[2];
    if (pipe(pfd) < 0)
        die("pipe");
    client = fork();
    if (client == 0) {
        close(ls);
        close(pfd[0]);
        int s = connect_to(port);
        char buf[16] = "";
        ssize_t n = recv(s, buf, sizeof buf - 1, MSG_WAITALL);
        printf("C second: %zd bytes \"%s\"\n", n, buf);
        char x;
        n = read(s, &x, 1);
        printf("C second after the answer: read %zd\n", n);
        (void)write(pfd[1], "e", 1);
        _exit(0);
    }
    close(pfd[1]);
    c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
        die("accept4");
    pid_t sleeper = fork();
    if (sleeper == 0) {
        execlp("sleep", "sleep", "5", (char *)NULL);
        _exit(1);
    }
    usleep(100 * 1000); /* let the child reach exec (not needed for the result) */
    if (writen(c, "answer", 6) < 0)
        die("answer");
    close(c);
    char e;
    if (read(pfd[0], &e, 1) != 1)
        die("client report");
    waitpid(client, &st, 0);
    printf("S second client exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    kill(sleeper, SIGTERM);
    waitpid(sleeper, &st, 0);
    close(ls);
    printf("S done\n");
    return 0;
}
