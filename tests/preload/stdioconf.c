/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * stdioconf: stdio on connections moved onto fd 0, 1 and 2, printed line by line.  Run once over
 * kernel TCP and once under `memlan run`: the outputs must be equal (tests/py/test_preload.py).
 *
 * usage: stdioconf PORT   (case F execs "stdioconf wideserver LFD" and "stdioconf wideclient PORT")
 *
 *  A  inetd-style: dup2(conn, 1), printf without fflush, exit: exit's flush reaches the peer.
 *  B  a thread blocked in fgets(stdin) on a pipe while another dup2s a connection onto 0: the
 *     dup2 returns (it must not wait for the stream's lock).
 *  C  fclose(stdout), then dup2(conn, 1): stdout stays closed (fileno -1); and fclose of a
 *     stream memlan made, then another dup2 onto 1.
 *  D  stdin holds a line read ahead from a pipe when a connection is moved onto 0: fgets returns
 *     that line first, then the connection's.
 *  E  200 dup2s onto 1, a printf after each: all the output arrives, and no stream is leaked.
 *  F  a client whose peer is not memlan (exec'd with MEMLAN_OFF=1, by the system call itself:
 *     an exec memlan sees would mark the port, and the client would not even offer) puts its
 *     connection on 1 and writes wide characters: fwide and fwprintf work as with glibc's own
 *     stdout.
 *  G  fdopen: a bad mode is EINVAL, "a" sets O_APPEND on the fd.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wchar.h>

static int lfd;
static struct sockaddr_in addr;

static void die(const char *what)
{
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    _exit(1);
}

/* A connected pair through the listener: *c the client's end, *s the accepted end. */
static void pair(int *c, int *s)
{
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (*c < 0 || connect(*c, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect");
    *s = accept(lfd, NULL, NULL);
    if (*s < 0)
        die("accept");
}

/* Everything the peer sends until EOF, printed with the case's name. */
static void drain(const char *name, int fd)
{
    static char buf[8192];
    size_t got = 0;
    ssize_t n;
    while ((n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = 0;
    if (got > 80)
        printf("%s got %zu bytes, ending '%s'\n", name, got, buf + got - 20);
    else
        printf("%s got %zu bytes: '%s'\n", name, got, buf);
}

static void reap(const char *name, pid_t pid)
{
    int st;
    if (waitpid(pid, &st, 0) < 0)
        die("waitpid");
    if (WIFEXITED(st))
        printf("%s child exit %d\n", name, WEXITSTATUS(st));
    else
        printf("%s child signal %d\n", name, WIFSIGNALED(st) ? WTERMSIG(st) : -1);
}

static pid_t child(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    return pid;
}

/* A child runs body on the accepted end (body exits); the parent prints what arrives. */
static void served(const char *name, void (*body)(int s))
{
    int c, s;
    pair(&c, &s);
    pid_t pid = child();
    if (pid == 0) {
        close(c);
        body(s);
    }
    close(s);
    drain(name, c);
    close(c);
    reap(name, pid);
}

static void body_a(int s)
{
    dup2(s, 1);
    close(s);
    printf("hello from stdout\n"); /* still in the buffer at exit */
    exit(0);
}

static void *reader(void *arg)
{
    char line[64];
    int rep = *(int *)arg;
    if (fgets(line, sizeof line, stdin))
        dprintf(rep, "B thread read: %s", line);
    else
        dprintf(rep, "B thread read nothing\n");
    return NULL;
}

static void case_b(void)
{
    int c, s;
    pair(&c, &s);
    pid_t pid = child();
    if (pid == 0) {
        int p[2];
        if (pipe(p) < 0)
            die("pipe");
        dup2(p[0], 0);
        close(p[0]);
        int rep = 1;
        pthread_t t;
        pthread_create(&t, NULL, reader, &rep);
        usleep(200 * 1000); /* the thread is blocked in fgets, holding stdin's lock */
        alarm(5);
        dup2(s, 0);
        dprintf(rep, "B dup2 returned\n");
        if (write(p[1], "from pipe\n", 10) != 10)
            die("write");
        pthread_join(t, NULL);
        _exit(0);
    }
    close(s);
    close(c);
    reap("B", pid);
}

static void body_c(int s)
{
    int rep = dup(1);
    fclose(stdout);
    dup2(s, 1);
    errno = 0;
    int n = fileno(stdout);
    dprintf(rep, "C fileno(stdout) after fclose and dup2: %d (%s)\n", n, strerror(errno));
    _exit(0);
}

/* A standard stream made by memlan (under memlan), closed, then another dup2 onto 1. */
static void body_c2(int s)
{
    int rep = dup(1);
    dup2(s, 1);
    fclose(stdout);
    dup2(s, 1);
    if (write(1, "raw\n", 4) != 4)
        die("write");
    dprintf(rep, "C second: done\n");
    _exit(0);
}

static void case_d(void)
{
    int c, s;
    pair(&c, &s);
    pid_t pid = child();
    if (pid == 0) {
        close(c);
        int p[2];
        if (pipe(p) < 0)
            die("pipe");
        if (write(p[1], "line1\nline2\n", 12) != 12)
            die("write");
        close(p[1]);
        dup2(p[0], 0);
        close(p[0]);
        char line[64];
        if (fgets(line, sizeof line, stdin))
            printf("D before: %s", line); /* line2 is in stdin's buffer now */
        dup2(s, 0);
        close(s);
        while (fgets(line, sizeof line, stdin))
            printf("D after: %s", line);
        printf("D end\n");
        exit(0);
    }
    close(s);
    if (write(c, "sock\n", 5) != 5)
        die("write");
    shutdown(c, SHUT_WR);
    reap("D", pid);
    close(c);
}

static void body_e(int s)
{
    int rep = dup(1);
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 200; i++) {
        dup2(s, 1);
        printf("%d,", i);
    }
    struct mallinfo2 after = mallinfo2();
    size_t grew = after.uordblks > before.uordblks ? after.uordblks - before.uordblks : 0;
    dprintf(rep, "E memory kept by 200 dup2s: %s\n", grew > 256 * 1024 ? "LEAK" : "small");
    close(s);
    exit(0);
}

static int wideserver(int l)
{
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    drain("F", s);
    return 0;
}

static int wideclient(int port)
{
    struct sockaddr_in a = addr;
    a.sin_port = htons((unsigned short)port);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect F");
    int rep = dup(1);
    dup2(c, 1);
    close(c);
    int o = fwide(stdout, 1);
    int r = wprintf(L"wide %d\n", 42);
    fflush(stdout);
    dprintf(rep, "F fwide %d, wprintf %d\n", o, r);
    return 0;
}

static void case_f(const char *self)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = addr;
    socklen_t al = sizeof a;
    a.sin_port = 0; /* the kernel picks a free port: a fixed one can be any connection's */
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0)
        die("listen F");
    pid_t srv = child();
    if (srv == 0) {
        char arg[16];
        snprintf(arg, sizeof arg, "%d", l);
        setenv("MEMLAN_OFF", "1", 1);
        char *av[] = {(char *)self, "wideserver", arg, NULL};
        extern char **environ;
        syscall(SYS_execve, self, av, environ); /* unseen: the port stays offered to */
        die("exec");
    }
    pid_t cli = child(); /* l stays open here until the client is done: its offer is posted */
    if (cli == 0) { /* a new image: its stdout has no orientation yet */
        char port[16];
        snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
        execl(self, self, "wideclient", port, (char *)NULL);
        die("exec");
    }
    reap("F client", cli);
    close(l);
    reap("F server", srv);
}

static void case_g(void)
{
    int c, s;
    pair(&c, &s);
    errno = 0;
    FILE *f = fdopen(s, "z");
    printf("G fdopen \"z\": %s, %s\n", f ? "a stream" : "NULL", strerror(errno));
    int fl = fcntl(s, F_GETFL);
    printf("G before: O_APPEND %s\n", fl & O_APPEND ? "set" : "clear");
    f = fdopen(s, "a");
    fl = fcntl(s, F_GETFL);
    printf("G fdopen \"a\": %s, O_APPEND %s\n", f ? "a stream" : "NULL", fl & O_APPEND ? "set" : "clear");
    fprintf(f, "appended\n");
    fclose(f);
    drain("G", c);
    close(c);
}

int main(int argc, char **argv)
{
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (argc == 3 && strcmp(argv[1], "wideserver") == 0)
        return wideserver(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "wideclient") == 0)
        return wideclient(atoi(argv[2]));
    if (argc != 2) {
        fprintf(stderr, "usage: stdioconf PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 16) < 0)
        die("listen");
    served("A", body_a);
    case_b();
    served("C", body_c);
    served("C2", body_c2);
    case_d();
    served("E", body_e);
    case_f(argv[0]);
    case_g();
    printf("done\n");
    return 0;
}
