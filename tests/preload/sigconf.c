/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sigconf: signals and cancellation on a blocking socket call, against kernel TCP.
 *   restart   a handler installed with SA_RESTART interrupts a blocking recv: it goes on
 *   nores     one without SA_RESTART: EINTR
 *   timeo     SA_RESTART, but SO_RCVTIMEO is set: EINTR (the kernel never restarts those)
 *   reenter   the handler itself calls recv(MSG_DONTWAIT) and send on the socket whose recv it
 *             interrupted: EAGAIN and a sent byte, no deadlock
 *   cancel    pthread_cancel of a thread blocked in recv: it is cancelled, and the socket is
 *             usable afterwards (no lock left held)
 * Each case runs in a child with a time limit; a hang prints "hang".
 *
 * usage: sigconf PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int port, fd;
static char hres[64];

static void ms(int n) { struct timespec t = {n / 1000, (long)(n % 1000) * 1000000L}; nanosleep(&t, NULL); }

static void on_usr1(int sig) { (void)sig; }

static void on_usr1_reenter(int sig)
{
    (void)sig;
    int e = errno;
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
    ssize_t w = send(fd, "h", 1, MSG_NOSIGNAL);
    snprintf(hres, sizeof hres, "handler recv %zd %s send %zd", r,
             r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "EAGAIN" : "?", w);
    errno = e;
}

static pthread_t main_thread;

static void *kicker(void *a)
{
    (void)a;
    ms(150);
    pthread_kill(main_thread, SIGUSR1);
    return NULL;
}

static void *blocked_recv(void *a)
{
    (void)a;
    char c;
    for (int i = 0; i < 100; i++)
        if (recv(fd, &c, 1, 0) <= 0)
            break;
    return NULL;
}

static void install(void (*h)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

static void client(const char *name)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("connect");
        _exit(1);
    }
    main_thread = pthread_self();
    char c = 0;
    ssize_t r;
    pthread_t t;
    if (!strcmp(name, "cancel")) {
        pthread_create(&t, NULL, blocked_recv, NULL);
        ms(150);
        pthread_cancel(t);
        void *ret = NULL;
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 2;
        int j = pthread_timedjoin_np(t, &ret, &dl);
        printf("%s: join %s, %s\n", name, j ? "timed out" : "ok",
               ret == PTHREAD_CANCELED ? "cancelled" : "not cancelled");
        r = recv(fd, &c, 1, 0);
        printf("%s: after recv %zd %c\n", name, r, r > 0 ? c : '-');
        fflush(stdout);
        _exit(0);
    }
    install(!strcmp(name, "reenter") ? on_usr1_reenter : on_usr1,
            strcmp(name, "nores") ? SA_RESTART : 0);
    if (!strcmp(name, "timeo")) {
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    pthread_create(&t, NULL, kicker, NULL);
    errno = 0;
    r = recv(fd, &c, 1, 0);
    int e = errno;
    pthread_join(t, NULL);
    printf("%s: recv %zd %s %c\n", name, r, r < 0 ? strerrorname_np(e) : "-", r > 0 ? c : '-');
    if (hres[0])
        printf("%s: %s\n", name, hres);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    port = atoi(argv[1]);
    setvbuf(stdout, NULL, _IONBF, 0);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0) {
        perror("listen");
        return 1;
    }
    const char *cases[] = {"restart", "nores", "timeo", "reenter", "cancel"};
    for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
        pid_t p = fork();
        if (p == 0) {
            close(l);
            client(cases[i]);
        }
        int c = accept(l, NULL, NULL);
        ms(500); /* after the signal (150 ms) */
        send(c, "x", 1, MSG_NOSIGNAL);
        char out[64];
        out[0] = 0;
        if (!strcmp(cases[i], "reenter")) {
            char h = 0;
            struct timeval tv = {2, 0};
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t r = recv(c, &h, 1, 0);
            /* Printed after the client has gone: its line and ours raced (the byte it sent from
             * its handler was there long before our x reached it). */
            snprintf(out, sizeof out, "%s: peer got %zd %c\n", cases[i], r, r > 0 ? h : '-');
        }
        int st = 0;
        for (int k = 0; k < 50; k++) { /* 5 s at most */
            if (waitpid(p, &st, WNOHANG) == p)
                break;
            if (k == 49) {
                printf("%s: hang\n", cases[i]);
                kill(p, SIGKILL);
                waitpid(p, &st, 0);
            }
            ms(100);
        }
        fputs(out, stdout);
        close(c);
    }
    close(l);
    printf("done\n");
    return 0;
}
