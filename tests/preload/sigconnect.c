/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sigconnect: a signal handler that connects (connect is async-signal-safe), interrupting a
 * thread that connects too, to the same port.  Over kernel TCP every connect completes.
 *
 * Under memlan the handler's connect took the negotiation's locks, which the interrupted
 * connect could be holding (the listener record's look-up, its count of pending clients): the
 * thread waited on itself for ever.
 *
 * usage: sigconnect PORT [signal]
 * signal: the handler is installed by signal() (glibc installs it through its own sigaction,
 * past ours, unless we interpose signal() too) instead of sigaction().
 * The work runs in a child; the parent gives it 20 s and says "hung" if it has not finished.
 */
#include "twoends.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in addr;
static volatile sig_atomic_t handler_ok, handler_runs, handler_errno;

static void on_alarm(int sig)
{
    (void)sig;
    if (handler_runs >= 2000)
        return; /* with the thread's 3000, well inside the ephemeral ports (TIME_WAIT) */
    int saved = errno;
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c >= 0) {
        int r = connect(c, (struct sockaddr *)&addr, sizeof addr);
        if (r == 0 || errno == EINPROGRESS)
            handler_ok++;
        else
            handler_errno = errno;
        close(c);
    }
    handler_runs++;
    errno = saved;
}

static void *acceptor(void *arg)
{
    int l = *(int *)arg;
    for (;;) {
        int s = accept(l, NULL, NULL);
        if (s >= 0)
            close(s);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "signal")))
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t pid = fork();
    if (pid == 0) {
        int l = listen_backlog(atoi(argv[1]), 4096, &addr);
        pthread_t t;
        pthread_create(&t, NULL, acceptor, &l);
        if (argc == 3) {
            signal(SIGALRM, on_alarm);
        } else {
            struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
            sigaction(SIGALRM, &sa, NULL);
        }
        struct itimerval it = {{0, 200}, {0, 200}};
        setitimer(ITIMER_REAL, &it, NULL);
        int ok = 0;
        double t0 = now_s();
        for (int i = 0; i < 3000 && now_s() - t0 < 8; i++) {
            int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            int r = connect(c, (struct sockaddr *)&addr, sizeof addr);
            if (r == 0 || errno == EINPROGRESS)
                ok++;
            close(c);
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        printf("connects: all %s; handler connects: %s\n", ok > 0 ? "made" : "failed",
               handler_ok == handler_runs ? "all made" : "some failed");
        if (handler_ok != handler_runs)
            fprintf(stderr, "handler: %d of %d failed, the last with %s\n",
                    (int)(handler_runs - handler_ok), (int)handler_runs, strerror(handler_errno));
        _exit(0);
    }
    int st = 0;
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            break;
        usleep(100000);
        if (i == 199) {
            printf("hung\n");
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    printf("done\n");
    return 0;
}
