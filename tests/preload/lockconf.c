/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * lockconf: threads sharing one socket while one of them sleeps in a blocking call, against
 * kernel TCP (issue 19: 9, 10, 12, 13).  The kernel releases its socket lock while a call
 * waits, so nothing here may wait behind a sleeping call:
 *   nbrecv    a thread is asleep in recv; another's recv(MSG_DONTWAIT) answers EAGAIN at once
 *   nbsend    a thread is asleep in send (full); another's send(MSG_DONTWAIT) answers EAGAIN
 *   shutwake  a thread is asleep in send; another's shutdown(SHUT_WR) ends it with a short count,
 *             and the peer gets exactly the bytes that count says
 *   longjmp   a handler siglongjmp()s out of a blocked recv; then another thread's recv and the
 *             jumping thread's own recv both work
 *   closeblk  close(fd) while another thread is asleep in recv on it: the file stays in use, so
 *             no FIN goes out (the peer's recv times out) until that recv returns; the peer's
 *             byte still reaches it, and the peer reads EOF after that
 *   exec      exec while another thread is asleep in recv on the socket: the new image's first
 *             recv and send on it work
 * Each case runs in a client child with a time limit; a hang prints "killed by signal 14".  The
 * server (the parent) prints its lines after the child has gone, so the output is in one order.
 *
 * usage: lockconf PORT   (lockconf PORT --exec-child FD GOFD: the exec case's new image)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BIG (8 << 20)

static int port, fd, gofd;
static char *self;

static void ms(int n) { struct timespec t = {n / 1000, (long)(n % 1000) * 1000000L}; nanosleep(&t, NULL); }

static const char *en(ssize_t r, int e) { return r < 0 ? strerrorname_np(e) : "-"; }

static void go(long v) { (void)!write(gofd, &v, sizeof v); }

/* The client's word to the server: -1 when none came within 5 s. */
static long wait_go(int rfd)
{
    struct pollfd p = {.fd = rfd, .events = POLLIN};
    long v = -1;
    if (poll(&p, 1, 5000) == 1 && read(rfd, &v, sizeof v) != sizeof v)
        v = -1;
    return v;
}

struct res { ssize_t r; int e; char c; };

static void *t_recv(void *a)
{
    struct res *o = a;
    o->c = '-';
    o->r = recv(fd, &o->c, 1, 0);
    o->e = errno;
    return NULL;
}

static char *bigbuf;

static void *t_send_big(void *a)
{
    struct res *o = a;
    o->r = send(fd, bigbuf, BIG, MSG_NOSIGNAL);
    o->e = errno;
    return NULL;
}

static sigjmp_buf jb;
static void on_usr1_jump(int sig) { (void)sig; siglongjmp(jb, 1); }
static pthread_t main_thread;
static void *kicker(void *a) { (void)a; ms(150); pthread_kill(main_thread, SIGUSR1); return NULL; }

static void client(const char *name)
{
    alarm(5);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("connect");
        _exit(1);
    }
    pthread_t t;
    struct res o = {0};
    ssize_t r;
    char c = '-';
    if (!strcmp(name, "nbrecv")) {
        pthread_create(&t, NULL, t_recv, &o);
        ms(150);
        r = recv(fd, &c, 1, MSG_DONTWAIT);
        printf("%s: nonblocking recv %zd %s\n", name, r, en(r, errno));
        go(0);
        pthread_join(t, NULL);
        printf("%s: blocked recv %zd %c\n", name, o.r, o.c);
    } else if (!strcmp(name, "nbsend") || !strcmp(name, "shutwake")) {
        bigbuf = calloc(1, BIG);
        pthread_create(&t, NULL, t_send_big, &o);
        ms(300);
        if (!strcmp(name, "nbsend")) {
            /* The kernel may take the byte (room it had not yet woken the sender for) or say
             * EAGAIN; either way at once, and the byte lands between the blocked send's. */
            r = send(fd, "y", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            printf("%s: nonblocking send did not wait: %s\n", name,
                   r == 1 || (r < 0 && errno == EAGAIN) ? "yes" : en(r, errno));
            long took = r == 1;
            r = recv(fd, &c, 1, MSG_DONTWAIT);
            printf("%s: nonblocking recv %zd %s\n", name, r, en(r, errno));
            go(took);
            pthread_join(t, NULL);
            printf("%s: blocked send %zd %s\n", name, o.r, en(o.r, o.e));
        } else {
            int s = shutdown(fd, SHUT_WR);
            printf("%s: shutdown %d\n", name, s);
            pthread_join(t, NULL);
            printf("%s: blocked send %s %s\n", name,
                   o.r > 0 && o.r < BIG ? "short" : o.r == BIG ? "whole" : "none", en(o.r, o.e));
            go(o.r);
        }
    } else if (!strcmp(name, "longjmp")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1_jump;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
        main_thread = pthread_self();
        if (!sigsetjmp(jb, 1)) {
            pthread_create(&t, NULL, kicker, NULL);
            r = recv(fd, &c, 1, 0);
            printf("%s: recv returned %zd\n", name, r);
        } else {
            printf("%s: jumped out of recv\n", name);
        }
        pthread_join(t, NULL);
        go(0);
        pthread_create(&t, NULL, t_recv, &o);
        pthread_join(t, NULL);
        printf("%s: another thread's recv %zd %c\n", name, o.r, o.c);
        r = recv(fd, &c, 1, 0);
        printf("%s: own recv %zd %c\n", name, r, r > 0 ? c : '-');
    } else if (!strcmp(name, "closeblk")) {
        pthread_create(&t, NULL, t_recv, &o);
        ms(150);
        printf("%s: close %d\n", name, close(fd));
        go(0);
        pthread_join(t, NULL);
        printf("%s: blocked recv %zd %c\n", name, o.r, o.c);
    } else if (!strcmp(name, "exec")) {
        pthread_create(&t, NULL, t_recv, &o);
        ms(150);
        char a1[16], a2[16], a3[16];
        snprintf(a1, sizeof a1, "%d", port);
        snprintf(a2, sizeof a2, "%d", fd);
        snprintf(a3, sizeof a3, "%d", gofd);
        execl(self, self, a1, "--exec-child", a2, a3, (char *)NULL);
        printf("%s: exec failed %s\n", name, strerror(errno));
    }
    fflush(stdout);
    _exit(0);
}

static void exec_child(int sfd, int g)
{
    alarm(5);
    fd = sfd;
    gofd = g;
    go(0);
    char c = '-';
    ssize_t r = recv(fd, &c, 1, 0);
    printf("exec: new image recv %zd %c\n", r, r > 0 ? c : '-');
    r = send(fd, "e", 1, MSG_NOSIGNAL);
    printf("exec: new image send %zd\n", r);
    fflush(stdout);
    _exit(0);
}

static long drain(int c)
{
    static char buf[65536];
    long got = 0;
    ssize_t r;
    while ((r = recv(c, buf, sizeof buf, 0)) > 0)
        got += r;
    return got;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    port = atoi(argv[1]);
    self = argv[0];
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 5 && !strcmp(argv[2], "--exec-child"))
        exec_child(atoi(argv[3]), atoi(argv[4]));
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0) {
        perror("listen");
        return 1;
    }
    const char *cases[] = {"nbrecv", "nbsend", "shutwake", "longjmp", "closeblk", "exec"};
    for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *name = cases[i];
        int pp[2];
        if (pipe(pp) < 0)
            return 1;
        pid_t p = fork();
        if (p == 0) {
            close(l);
            close(pp[0]);
            gofd = pp[1];
            client(name);
        }
        close(pp[1]);
        int c = accept(l, NULL, NULL);
        char out[512];
        out[0] = 0;
        long v = wait_go(pp[0]);
        if (!strcmp(name, "nbrecv") || !strcmp(name, "longjmp")) {
            send(c, "xz", !strcmp(name, "nbrecv") ? 1 : 2, MSG_NOSIGNAL);
        } else if (!strcmp(name, "nbsend")) {
            long got = drain(c);
            snprintf(out, sizeof out, "%s: server got every byte sent: %s\n", name,
                     v >= 0 && got == BIG + v ? "yes" : "no");
            if (getenv("LOCKCONF_DEBUG"))
                fprintf(stderr, "nbsend: v %ld got %ld\n", v, got);
        } else if (!strcmp(name, "shutwake")) {
            long got = drain(c);
            snprintf(out, sizeof out, "%s: server got what send counted: %s\n", name,
                     got == v ? "yes" : "no");
        } else if (!strcmp(name, "closeblk")) {
            struct timeval tv = {1, 500000}; /* past the peer's liveness poll */
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            char b = 0;
            struct pollfd pf = {.fd = c, .events = POLLIN | POLLRDHUP};
            int pr = poll(&pf, 1, 1500);
            ssize_t r1 = recv(c, &b, 1, 0);
            int e1 = errno;
            send(c, "x", 1, MSG_NOSIGNAL);
            tv.tv_sec = 3;
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t r2 = recv(c, &b, 1, 0);
            snprintf(out, sizeof out, "%s: server poll while the file is in use %d %#x, recv "
                     "%zd %s, after the recv returned %zd\n", name, pr, pr > 0 ? pf.revents : 0,
                     r1, en(r1, e1), r2);
        } else if (!strcmp(name, "exec")) {
            send(c, "x", 1, MSG_NOSIGNAL);
            char b = '-';
            ssize_t r = recv(c, &b, 1, 0);
            snprintf(out, sizeof out, "%s: server recv %zd %c\n", name, r, r > 0 ? b : '-');
        }
        (void)v;
        int st;
        waitpid(p, &st, 0);
        close(pp[0]);
        if (WIFSIGNALED(st))
            printf("%s: client killed by signal %d\n", name, WTERMSIG(st));
        fputs(out, stdout);
        close(c);
    }
    printf("done\n");
    return 0;
}
