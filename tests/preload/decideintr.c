/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * decideintr: a client's blocking read while the server has not accepted its connection yet,
 * with alarm(1) and a SIGALRM handler installed without SA_RESTART ("intr") or with it
 * ("restart").  Over kernel TCP the first read ends with EINTR at the alarm (or, restarted,
 * returns the answer the server sends when it accepts, 3 s on); the second read returns the
 * answer.  Under memlan the read waited for the decision (MEMLAN_ACCEPT_WAIT_MS, 2 s) whatever
 * ran, and the handler's interruption was lost: "read 5".  Prints what each read returned.
 *
 * usage: decideintr PORT intr|restart
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t rang;
static void on_alarm(int sig) { (void)sig; rang = 1; }

static void show(const char *what, ssize_t r, const char *buf)
{
    if (r < 0)
        printf("%s -1 %s\n", what, errno == EINTR ? "EINTR" : strerror(errno));
    else
        printf("%s %zd %.*s\n", what, r, (int)r, buf);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PORT intr|restart\n", argv[0]);
        return 2;
    }
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
    if (pid == 0) { /* the server: accepts 3 s late, answers, closes */
        struct timespec late = {3, 0};
        nanosleep(&late, NULL);
        int s = accept(l, NULL, NULL);
        char b[8];
        if (s < 0 || read(s, b, 2) != 2 || write(s, "hello", 5) != 5)
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
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = strcmp(argv[2], "restart") == 0 ? SA_RESTART : 0;
    sigaction(SIGALRM, &sa, NULL);
    alarm(1);
    char buf[16];
    ssize_t r = read(c, buf, sizeof buf);
    show("read", r, buf);
    printf("alarm %s\n", rang ? "rang" : "did not ring");
    if (r < 0) {
        r = read(c, buf, sizeof buf);
        show("again", r, buf);
    }
    int st;
    waitpid(pid, &st, 0);
    close(c);
    printf("done\n");
    return 0;
}
