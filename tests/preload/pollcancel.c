/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pollcancel: a thread asleep in poll() on a connection is cancelled (poll is a cancellation
 * point; once after 300 ms, once after 2 ms), another thread then reuses its stack, and data
 * arrives: the process must go on as over kernel TCP (memlan once left the cancelled thread's
 * registration on the socket, on its stack, and the next wake-up walked it: SIGSEGV).  Then a
 * thread that leaves poll through siglongjmp from a signal handler (after 300 ms, and after
 * 2 ms, while a poll of one socket sleeps on the ring's futex, that thread then ending by
 * pthread_exit: memlan's poll had registered a cleanup with glibc that the jump left behind,
 * and the exit jumped into its dead frame, SIGSEGV), and the same; then the main
 * thread leaves its own poll by siglongjmp and polls again.  Last, the connection is closed: the
 * peer must read EOF, as over kernel TCP (memlan kept each abandoned poll's references to the
 * socket, so the close did not end the connection and the peer waited: "peer: no eof").
 *
 * usage: pollcancel PORT
 */
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int fd;
static sigjmp_buf jb;

static void *poller(void *a)
{
    struct pollfd p = {fd, POLLIN, 0};
    (void)a;
    poll(&p, 1, -1);
    return NULL;
}

static void *scribble(void *a)
{
    volatile char buf[200000];
    (void)a;
    memset((char *)buf, 0x41, sizeof buf);
    usleep(300000);
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
    siglongjmp(jb, 1);
}

static void *jumper(void *a)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    if (sigsetjmp(jb, 1) == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, -1);
    }
    if (a)
        pthread_exit(NULL); /* unwinds through nothing of the poll's (it once jumped into it) */
    return NULL;
}

static void *killer(void *a)
{
    usleep(300000); /* the target is asleep in poll */
    pthread_kill(*(pthread_t *)a, SIGUSR1);
    return NULL;
}

static int wait_data(const char *what, int n)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, 5000);
    char buf[16];
    ssize_t got = r == 1 ? recv(fd, buf, sizeof buf, 0) : -1;
    printf("%s: poll %d, recv %zd\n", what, r, got);
    return got == n ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(60);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1) < 0)
        return 1;
    int go[2];
    if (pipe(go) < 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60); /* not inherited: bound the peer too, should its parent die */
        int c = socket(AF_INET, SOCK_STREAM, 0);
        char b;
        if (connect(c, (void *)&a, sizeof a) < 0 || read(c, &b, 1) != 1)
            _exit(1);
        for (int k = 0; k < 3; k++) { /* one round per case: wait for the word, then send */
            if (read(go[0], &b, 1) != 1)
                _exit(1);
            usleep(100000);
            if (write(c, "data", 4) != 4)
                _exit(1);
        }
        struct pollfd p = {c, POLLIN, 0};
        int r = poll(&p, 1, 3000);
        ssize_t g = r == 1 ? read(c, &b, 1) : -1;
        printf("peer: %s\n", g == 0 ? "eof" : "no eof");
        _exit(0);
    }
    fd = accept(l, NULL, NULL);
    if (fd < 0 || write(fd, "g", 1) != 1)
        return 1;
    int bad = 0;

    pthread_t t, s;
    pthread_create(&t, NULL, poller, NULL);
    usleep(300000); /* asleep in poll */
    pthread_cancel(t);
    pthread_join(t, NULL);
    /* Cancelled within its first milliseconds, where a poll of one socket sleeps on the ring's
     * futex (its first 10 ms) rather than in ppoll. */
    pthread_create(&t, NULL, poller, NULL);
    usleep(2000);
    pthread_cancel(t);
    void *how = NULL;
    pthread_join(t, &how);
    if (how != PTHREAD_CANCELED) { /* poll returned (EINTR) instead */
        printf("a poller cancelled after 2 ms was not cancelled\n");
        bad = 1;
    }
    pthread_create(&s, NULL, scribble, NULL);
    if (write(go[1], "1", 1) != 1)
        return 1;
    bad |= wait_data("after a cancelled poller", 4);
    pthread_join(s, NULL);

    signal(SIGUSR1, on_alarm);
    sigset_t blk;
    sigemptyset(&blk);
    sigaddset(&blk, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &blk, NULL); /* only the jumper takes it */
    pthread_create(&t, NULL, jumper, NULL);
    usleep(300000);
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    /* And one that jumps within its first milliseconds, out of the ring's futex (a poll of one
     * socket sleeps there first): its reference must not stay behind either. */
    pthread_create(&t, NULL, jumper, (void *)1);
    usleep(2000);
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    pthread_create(&s, NULL, scribble, NULL);
    if (write(go[1], "2", 1) != 1)
        return 1;
    bad |= wait_data("after a poller left by siglongjmp", 4);
    pthread_join(s, NULL);

    pthread_t self = pthread_self(), k3;
    pthread_sigmask(SIG_UNBLOCK, &blk, NULL);
    pthread_create(&k3, NULL, killer, &self);
    if (sigsetjmp(jb, 1) == 0) {
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, -1);
    }
    pthread_join(k3, NULL);
    pthread_sigmask(SIG_BLOCK, &blk, NULL);
    if (write(go[1], "3", 1) != 1)
        return 1;
    bad |= wait_data("after this thread left its poll by siglongjmp", 4);

    close(fd); /* the peer reads EOF */

    int st;
    waitpid(pid, &st, 0);
    printf("done\n");
    return bad;
}
