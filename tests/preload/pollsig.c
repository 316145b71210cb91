/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pollsig: a signal handler that polls (poll and epoll, timeout 0) the socket its own thread is
 * asleep on in poll or in epoll_wait (issue 19: 12).  It must answer (POLLOUT) rather than wait
 * for a lock its thread holds; the interrupted wait fails with EINTR (the kernel never restarts
 * poll or epoll_wait, SA_RESTART or not).  As over kernel TCP, line for line.
 *
 * usage: pollsig PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int fd;
static char hres[128];
static pthread_t main_thread;

static void ms(int n) { struct timespec t = {n / 1000, (long)(n % 1000) * 1000000L}; nanosleep(&t, NULL); }

static void on_usr1(int sig)
{
    (void)sig;
    int e = errno;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
    int r = poll(&p, 1, 0);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLOUT}, o;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    int r2 = epoll_wait(ep, &o, 1, 0);
    close(ep);
    snprintf(hres, sizeof hres, "handler poll %d %#x epoll %d", r, (unsigned)p.revents, r2);
    errno = e;
}

static void *kicker(void *a)
{
    (void)a;
    ms(150);
    pthread_kill(main_thread, SIGUSR1);
    return NULL;
}

static void client(const struct sockaddr_in *a, int mode)
{
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) < 0)
        _exit(1);
    main_thread = pthread_self();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t t;
    pthread_create(&t, NULL, kicker, NULL);
    int r;
    if (mode == 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        r = poll(&pf, 1, 3000);
    } else {
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN}, o;
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        r = epoll_wait(ep, &o, 1, 3000);
    }
    int e = errno;
    pthread_join(t, NULL);
    printf("%s: wait %d %s; %s\n", mode ? "epoll" : "poll", r, r < 0 ? strerrorname_np(e) : "-",
           hres);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    alarm(10);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 4) < 0) {
        perror("listen");
        return 1;
    }
    for (int mode = 0; mode < 2; mode++) {
        pid_t p = fork();
        if (p == 0)
            client(&a, mode);
        int c = accept(l, NULL, NULL);
        ms(400);
        send(c, "x", 1, MSG_NOSIGNAL);
        int st;
        waitpid(p, &st, 0);
        if (WIFSIGNALED(st))
            printf("client killed by signal %d\n", WTERMSIG(st));
        close(c);
    }
    return 0;
}
