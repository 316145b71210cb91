/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkstat: a fork child's first use of a connection it inherited, where memlan lists it in the
 * child's own `memlan stat` entry (mlp_stat_inherited), in three places where that must not be
 * done or must leave no trace.  Run once over kernel TCP and once under `memlan run`: the outputs
 * must be equal (tests/py/test_preload.py).
 *
 *   vfork  the fork child's first use is a vfork child's write: afterwards the fork child's own
 *          fd at our high numbers (half the soft limit) works (the entry's fd, made in the vfork
 *          child's fd table, was marked ours in the fork child's memory: "dup EBADF")
 *   errno  the fork child's first use is a recv that succeeds after the peer's reset: errno is
 *          as the program left it ("errno 107": getpeername's ENOTCONN leaked)
 *   exit   the fork child's first use is stdio's flush at exit: nothing is made then (the
 *          entry, made after exit's cleanup, stayed in the fabric; the test looks for it)
 *
 * usage: forkstat PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in addr;

static int conn(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
        perror("connect");
        exit(1);
    }
    return s;
}

static void drain(int s, const char *who)
{
    char b[256];
    ssize_t n, total = 0;
    while ((n = read(s, b, sizeof b)) > 0)
        total += n;
    printf("%s: read %zd bytes, then %zd\n", who, total, n);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    alarm(30);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[1]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(l, 8) < 0) {
        perror("listen");
        return 1;
    }
    int st;

    /* vfork */
    int cl = conn(), c = accept(l, NULL, NULL);
    pid_t p = fork();
    if (p == 0) {
        close(l);
        close(cl);
        pid_t v = vfork();
        if (v == 0) {
            static const char m[] = "from the vfork child\n";
            (void)!write(c, m, sizeof m - 1);
            _exit(0);
        }
        waitpid(v, &st, 0);
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        int f = open("/dev/null", O_RDONLY);
        int n = fcntl(f, F_DUPFD, (int)(rl.rlim_cur / 2 > 64 ? rl.rlim_cur / 2 : 64));
        int d = dup(n);
        printf("vfork: dup of the program's fd at our high numbers: %s\n",
               d >= 0 ? "ok" : strerror(errno));
        fflush(stdout);
        static const char m2[] = "from the fork child\n";
        (void)!write(c, m2, sizeof m2 - 1);
        _exit(0);
    }
    close(c);
    waitpid(p, &st, 0);
    shutdown(cl, SHUT_WR);
    drain(cl, "vfork: client");
    close(cl);

    /* errno */
    int sync[2];
    if (pipe(sync) < 0)
        return 1;
    cl = conn();
    c = accept(l, NULL, NULL);
    p = fork();
    if (p == 0) {
        close(l);
        close(cl);
        close(sync[1]);
        char x;
        (void)!read(sync[0], &x, 1); /* the peer has reset the connection */
        char b[16];
        errno = 4242;
        ssize_t n = recv(c, b, sizeof b, 0);
        int e = errno;
        printf("errno: recv %zd, errno %s\n", n, e == 4242 ? "kept" : strerror(e));
        fflush(stdout);
        _exit(0);
    }
    close(c);
    close(sync[0]);
    (void)!write(cl, "abc", 3);
    usleep(200000);
    struct linger lg = {1, 0};
    setsockopt(cl, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(cl);
    usleep(300000);
    (void)!write(sync[1], "g", 1);
    close(sync[1]);
    waitpid(p, &st, 0);

    /* exit */
    cl = conn();
    c = accept(l, NULL, NULL);
    FILE *fp = fdopen(c, "w");
    p = fork();
    if (p == 0) {
        close(l);
        close(cl);
        fprintf(fp, "from the fork child, flushed at its exit\n");
        exit(0); /* stdio flushes after every atexit handler */
    }
    fclose(fp);
    fprintf(stderr, "exit child %d\n", (int)p);
    waitpid(p, &st, 0);
    drain(cl, "exit: client");
    close(cl);
    printf("done\n");
    return 0;
}
