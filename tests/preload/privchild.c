/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * privchild: a server made as varnishd makes its cache worker.  The parent, root, makes the
 * listening socket and binds it but never listens; a child it forks drops to another user
 * (setgroups, setgid, setuid), listens on the inherited socket (so the port's listener record
 * in the fabric is made by that user) and accepts, each connection a while after it comes (a
 * worker just started, or busy), echoing what it reads until the client's end.  The parent
 * restarts the worker as varnishd's manager does: killed (SIGKILL, its record stays, dead, and
 * the next worker takes it over) or stopped (it closes and exits, its record goes; the parent
 * closes the socket and makes a new one, as `varnishadm stop` and `start` do).
 *
 * Under memlan in a fabric shared by a group, the kernel says that the server's side of a
 * connection was made by root until the worker accepts it, and by the worker's user after.  A
 * client of another member asked once, right after its connect, and went over TCP with "the
 * listener record was not made by the server's user" whenever the worker had not accepted yet:
 * with varnishd, now and then, and always for the first connection to a new record when the
 * worker was slow to accept.  Needs root (tests/py/test_groupfabric.py).
 *
 * usage: privchild PORT UID GID DELAY_MS
 * stdin, a line each: "k" kill the worker and fork another on the same socket; "s" stop the
 * worker, make a new socket and fork another; "d MS" the accept delay of the next workers;
 * "q" quit.  Prints "ready N" each time worker N listens.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in addr;
static uid_t wuid;
static gid_t wgid;
static int delay_ms;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static int make_socket(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("bind");
    return s;
}

/* The worker: drop, listen, tell the parent (ready), accept and echo until ctl says stop. */
static void worker(int s, int ctl, int ready)
{
    if (setgroups(1, &wgid) < 0 || setgid(wgid) < 0 || setuid(wuid) < 0)
        die("drop");
    if (listen(s, 16) < 0)
        die("listen");
    if (write(ready, "r", 1) != 1)
        _exit(1);
    close(ready);
    for (int n = 0; n < 1000; n++) {
        struct pollfd q[2] = {{.fd = s, .events = POLLIN}, {.fd = ctl, .events = POLLIN}};
        if (poll(q, 2, 30000) <= 0 || q[1].revents)
            break;
        usleep((useconds_t)delay_ms * 1000);
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        char b[65536];
        ssize_t r;
        while ((r = recv(c, b, sizeof b, 0)) > 0)
            if (send(c, b, (size_t)r, MSG_NOSIGNAL) != r)
                break;
        close(c);
    }
    close(s);
    exit(0); /* memlan's exit handler removes the record: the port's last listener */
}

static pid_t start(int s, int *ctl, int n)
{
    int cp[2], rp[2];
    if (pipe(cp) < 0 || pipe(rp) < 0)
        die("pipe");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(cp[1]);
        close(rp[0]);
        worker(s, cp[0], rp[1]);
    }
    close(cp[0]);
    close(rp[1]);
    char x;
    if (read(rp[0], &x, 1) != 1)
        die("worker did not listen");
    close(rp[0]);
    *ctl = cp[1];
    printf("ready %d\n", n);
    return pid;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    wuid = (uid_t)atoi(argv[2]);
    wgid = (gid_t)atoi(argv[3]);
    delay_ms = atoi(argv[4]);
    int s = make_socket(), ctl, n = 1;
    pid_t pid = start(s, &ctl, n);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'd') {
            delay_ms = atoi(line + 1);
            printf("delay %d\n", delay_ms);
            continue;
        }
        if (line[0] == 'k')
            kill(pid, SIGKILL);
        close(ctl); /* else a stop: the worker closes and exits */
        waitpid(pid, NULL, 0);
        if (line[0] == 'q')
            break;
        if (line[0] == 's') {
            close(s);
            s = make_socket();
        }
        pid = start(s, &ctl, ++n);
    }
    close(s);
    printf("done\n");
    return 0;
}
