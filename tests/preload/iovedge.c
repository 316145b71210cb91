/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * iovedge: send, writev and sendmsg with vectors the kernel refuses or takes in part, each on a
 * connection of its own, from a child (a crash is a line of output, not the end of the run):
 * what the call returned, the errno, how the child ended, and the bytes the reader got.  Over
 * kernel TCP the kernel checks the whole vector before it moves a byte: a piece whose length is
 * negative as an ssize_t is EINVAL, a piece it cannot read (a NULL base, a length past the
 * address space, a NULL vector) is EFAULT, and nothing reaches the reader.  The same on the
 * receiving side, with the peer's 8 bytes waiting: a vector refused leaves them all there.
 * The lines under memlan must equal these.
 *
 * usage: iovedge PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in addr;
static char buf[64];

enum how { WRITEV, SENDMSG, SEND_NULL, READV, RECV_NULL, RECV_TRUNC, PEEK_TRUNC };

struct edge {
    const char *name;
    enum how how;
    int nb;     /* O_NONBLOCK */
    int null_v; /* sendmsg with msg_iov NULL */
    int n;
    struct iovec v[6];
};

static void run(const struct edge *e, int l)
{
    int p[2];
    if (pipe(p))
        exit(1);
    pid_t pid = fork();
    if (pid < 0)
        exit(1);
    if (pid == 0) {
        close(p[0]);
        alarm(10);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr))
            _exit(3);
        /* A byte each way, so the connection is settled (accelerated, under memlan) before
         * the case. */
        char y;
        if (send(c, "x", 1, 0) != 1 || recv(c, &y, 1, MSG_WAITALL) != 1)
            _exit(4);
        if (e->nb)
            fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
        ssize_t r;
        if (e->how >= READV) {
            /* The peer's 8 bytes are there first: the kernel's answer is then the copy's. */
            struct pollfd pf = {.fd = c, .events = POLLIN};
            if (poll(&pf, 1, 5000) != 1)
                _exit(6);
        }
        if (e->how == RECV_NULL) {
            r = recv(c, NULL, 5, 0);
        } else if (e->how == RECV_TRUNC) {
            r = recv(c, NULL, 5, MSG_TRUNC);
        } else if (e->how == PEEK_TRUNC) {
            r = recv(c, NULL, 5, MSG_TRUNC | MSG_PEEK);
        } else if (e->how == READV) {
            r = readv(c, e->v, e->n);
        } else if (e->how == SEND_NULL) {
            r = send(c, NULL, 5, MSG_NOSIGNAL);
        } else if (e->how == WRITEV) {
            r = writev(c, e->v, e->n);
        } else {
            struct msghdr m = {.msg_iov = e->null_v ? NULL : (struct iovec *)e->v,
                               .msg_iovlen = (size_t)e->n};
            r = sendmsg(c, &m, MSG_NOSIGNAL);
        }
        char line[128];
        int k = snprintf(line, sizeof line, "returned %zd%s%s", r, r < 0 ? " " : "",
                         r < 0 ? strerror(errno) : "");
        if (e->how >= READV) {
            char rest[16];
            k += snprintf(line + k, sizeof line - (size_t)k, ", then recv %zd",
                          recv(c, rest, sizeof rest, MSG_DONTWAIT));
        }
        if (write(p[1], line, (size_t)k) != k)
            _exit(5);
        close(c);
        _exit(0);
    }
    close(p[1]);
    int s = accept(l, NULL, NULL);
    long got = -2;
    if (s >= 0) {
        char in[4096];
        got = -3;
        if (recv(s, in, 1, MSG_WAITALL) == 1 && send(s, "y", 1, 0) == 1 &&
            send(s, "abcdefgh", 8, 0) == 8)
            got = 0;
        while (got >= 0) {
            ssize_t r = recv(s, in, sizeof in, 0);
            if (r <= 0)
                break;
            got += r;
        }
        close(s);
    }
    char res[129] = "";
    ssize_t k = read(p[0], res, sizeof res - 1);
    res[k > 0 ? k : 0] = 0;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    printf("%-34s %s; %s; reader got %ld\n", e->name, k > 0 ? res : "(no answer)",
           WIFSIGNALED(st) ? (WTERMSIG(st) == SIGSEGV ? "killed by SIGSEGV" : "killed")
                           : (WEXITSTATUS(st) == 0 ? "exit 0" : "exit failed"),
           got);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&addr, sizeof addr) || listen(l, 4)) {
        perror("listen");
        return 1;
    }
    const size_t q = (size_t)1 << 62;
    const struct edge edges[] = {
        {"send NULL, 5, nonblocking", SEND_NULL, 1, 0, 0, {{0}}},
        {"send NULL, 5, blocking", SEND_NULL, 0, 0, 0, {{0}}},
        {"writev 4 + NULL 4, nonblocking", WRITEV, 1, 0, 2, {{buf, 4}, {NULL, 4}}},
        {"writev 4 + NULL 4, blocking", WRITEV, 0, 0, 2, {{buf, 4}, {NULL, 4}}},
        {"writev 16 + (size_t)-8, nonblocking", WRITEV, 1, 0, 2, {{buf, 16}, {buf, (size_t)-8}}},
        {"writev 16 + (size_t)-8, blocking", WRITEV, 0, 0, 2, {{buf, 16}, {buf, (size_t)-8}}},
        {"writev 16 + SSIZE_MAX, nonblocking", WRITEV, 1, 0, 2, {{buf, 16}, {buf, SSIZE_MAX}}},
        {"writev sum wraps to 8, nonblocking", WRITEV, 1, 0, 5,
         {{buf, 16}, {buf, q}, {buf, q}, {buf, q}, {buf, q - 8}}},
        {"writev sum wraps to 8, blocking", WRITEV, 0, 0, 5,
         {{buf, 16}, {buf, q}, {buf, q}, {buf, q}, {buf, q - 8}}},
        {"writev sum wraps to 0, blocking", WRITEV, 0, 0, 4, {{buf, q}, {buf, q}, {buf, q}, {buf, q}}},
        {"sendmsg NULL vector of 1, blocking", SENDMSG, 0, 1, 1, {{0}}},
        {"writev empty pieces, nonblocking", WRITEV, 1, 0, 3, {{NULL, 0}, {buf, 0}, {NULL, 0}}},
        {"sendmsg 3 + empty + 5, nonblocking", SENDMSG, 1, 0, 3, {{buf, 3}, {NULL, 0}, {buf, 5}}},
        {"recv NULL, 5, data there", RECV_NULL, 1, 0, 0, {{0}}},
        {"readv 4 + NULL 4, data there", READV, 1, 0, 2, {{buf, 4}, {NULL, 4}}},
        {"readv 16 + (size_t)-8, data there", READV, 1, 0, 2, {{buf, 16}, {buf, (size_t)-8}}},
        {"readv sum wraps to 8, data there", READV, 0, 0, 5,
         {{buf, 16}, {buf, q}, {buf, q}, {buf, q}, {buf, q - 8}}},
        {"readv sum wraps to 0, data there", READV, 0, 0, 4, {{buf, q}, {buf, q}, {buf, q}, {buf, q}}},
        {"recv NULL, 5, MSG_TRUNC, data there", RECV_TRUNC, 0, 0, 0, {{0}}},
        {"recv NULL, 5, MSG_TRUNC|MSG_PEEK", PEEK_TRUNC, 0, 0, 0, {{0}}},
    };
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        run(&edges[i], l);
    close(l);
    printf("done\n");
    return 0;
}
