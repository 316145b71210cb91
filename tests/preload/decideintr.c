/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * decideintr: a client's blocking read while the server has not accepted its connection yet
 * (it accepts 3 s on and answers), in these modes:
 *   intr           alarm(1), a SIGALRM handler without SA_RESTART: EINTR at 1 s;
 *   restart        the same with SA_RESTART: the answer at 3 s;
 *   timeo          SO_RCVTIMEO of 1 s: EAGAIN at 1 s, at 2 s, the answer at 3 s;
 *   timeo-restart  SO_RCVTIMEO of 5 s and the SA_RESTART alarm: EINTR at 1 s (a socket with a
 *                  timeout is never restarted), then the answer;
 *   sysv           siginterrupt(SIGUSR1, 1) called, no signal sent: the answer at 3 s;
 *   sndtimeo       SO_SNDTIMEO of 1 s and one write of 64 MiB: a part of it, at 1 s;
 *   huge-restart   SO_RCVTIMEO of 634 years and the SA_RESTART alarm: EINTR at 1 s;
 *   1m-sndtimeo    SO_SNDTIMEO of 1 s and a write of 1 MiB: all of it, at once (the kernel's
 *                  buffers; an undecided ring grows as they do);
 *   sendfile       O_NONBLOCK, a sendfile of 1000 bytes of a file: all of them, at once;
 *   splice         O_NONBLOCK, a splice of 1000 bytes from a pipe: all of them, at once;
 *   sendfile-timeo, splice-timeo  the same, blocking, with SO_SNDTIMEO of 1 s;
 *   read0          a read of 0 bytes: 0, at once; then the answer.
 * Those are kernel TCP's answers.  Under memlan the read waited for the decision
 * (MEMLAN_ACCEPT_WAIT_MS, 2 s) whatever ran, and the handler's interruption was lost ("read 5"
 * in intr mode); it heeded no SO_RCVTIMEO or SO_SNDTIMEO (timeo: EAGAIN at 3 s; sndtimeo: at 3
 * s); and once it heeded handlers, a program that had called siginterrupt read EINTR at once.
 * The nonblocking sendfile and splice waited for the decision: 1000 bytes at 2 s; with the
 * timeouts heeded, a review found the huge timeout wrapped round (EAGAIN at once), a 1 MiB
 * write cut at 256 KiB, blocking sendfile and splice EAGAIN at 1 s, read0 waiting 2 s.
 * Prints what each call returned and after how many seconds (rounded).
 *
 * usage: decideintr PORT MODE (above)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t rang;
static void on_alarm(int sig) { (void)sig; rang = 1; }

static double t0;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void show(const char *what, ssize_t r, const char *buf)
{
    int after = (int)(now_s() - t0 + 0.5);
    if (r < 0)
        printf("%s -1 %s after %d s\n", what,
               errno == EINTR ? "EINTR" : errno == EAGAIN ? "EAGAIN" : strerror(errno), after);
    else
        printf("%s %zd %.*s after %d s\n", what, r, (int)r, buf, after);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PORT MODE (see the source)\n", argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4)) {
        perror("listen");
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* The server: accepts 2.6 s late (said "after 3 s", rounded), answers, closes.  Not 3 s:
         * the answer then came as the third 1 s timeout ran out, and under load the timeout came
         * first (an EAGAIN more, CI). */
        struct timespec late = {2, 600000000};
        nanosleep(&late, NULL);
        int s = accept(l, NULL, NULL);
        char b[1100];
        size_t want = !strncmp(mode, "sendfile", 8) || !strncmp(mode, "splice", 6) ? 1002 : 2;
        size_t got = 0;
        ssize_t k = 1;
        while (s >= 0 && got < want && (k = read(s, b, want - got)) > 0)
            got += (size_t)k;
        if (want > 2)
            printf("the server read %zu\n", got);
        if (got != want || write(s, "hello", 5) != 5)
            _exit(1);
        close(s);
        _exit(0);
    }
    close(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) || write(c, "hi", 2) != 2) {
        perror("connect");
        return 1;
    }
    bool alarmed = !strcmp(mode, "intr") || strstr(mode, "restart");
    struct timeval tv = {!strcmp(mode, "timeo-restart") ? 5 : 1, 0};
    if (!strcmp(mode, "huge-restart"))
        tv.tv_sec = 20000000000; /* 634 years: a timeout still, for the kernel */
    if (!strcmp(mode, "timeo") || strstr(mode, "-restart"))
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (strstr(mode, "sndtimeo") || strstr(mode, "-timeo"))
        setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (!strcmp(mode, "sysv"))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        siginterrupt(SIGUSR1, 1); /* no SIGUSR1 ever comes */
#pragma GCC diagnostic pop
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = strstr(mode, "restart") ? SA_RESTART : 0;
    sigaction(SIGALRM, &sa, NULL);
    t0 = now_s();
    if (!strncmp(mode, "sendfile", 8) || !strncmp(mode, "splice", 6)) {
        char blk[1000];
        memset(blk, 'f', sizeof blk);
        int src[2] = {-1, -1};
        if (!strncmp(mode, "sendfile", 8)) {
            FILE *f = tmpfile();
            if (!f || fwrite(blk, 1, sizeof blk, f) != sizeof blk || fflush(f))
                return 1;
            src[0] = fileno(f);
        } else if (pipe(src) || write(src[1], blk, sizeof blk) != (ssize_t)sizeof blk) {
            return 1;
        }
        if (!strstr(mode, "-timeo"))
            fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
        t0 = now_s();
        off_t at = 0;
        ssize_t w = !strncmp(mode, "sendfile", 8) ? sendfile(c, src[0], &at, sizeof blk)
                                                  : splice(src[0], NULL, c, NULL, sizeof blk, 0);
        if (w >= 0)
            printf("%s %zd after %d s\n", mode, w, (int)(now_s() - t0 + 0.5));
        else
            show(mode, w, "");
        fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
        char buf[16];
        show("read", read(c, buf, sizeof buf), buf);
    } else if (strstr(mode, "sndtimeo")) {
        size_t big = !strcmp(mode, "1m-sndtimeo") ? 1u << 20 : 64u << 20;
        char *b = calloc(1, big);
        ssize_t w = b ? write(c, b, big) : -1;
        int after = (int)(now_s() - t0 + 0.5);
        if (w > 0 && (size_t)w < big)
            printf("write a part after %d s\n", after);
        else if (w < 0)
            show("write", w, "");
        else
            printf("write all after %d s\n", after); /* the kernel's buffers take 1 MiB */
        free(b);
    } else {
        if (alarmed)
            alarm(1);
        char buf[16];
        ssize_t r = -1;
        if (!strcmp(mode, "read0"))
            show("read0", read(c, buf, 0), buf);
        for (int k = 0; k < 4 && r < 0; k++) {
            r = read(c, buf, sizeof buf);
            show(k ? "again" : "read", r, buf);
        }
        if (alarmed)
            printf("alarm %s\n", rang ? "rang" : "did not ring");
    }
    int st;
    waitpid(pid, &st, 0);
    close(c);
    printf("done\n");
    return 0;
}
