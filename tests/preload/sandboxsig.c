/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxsig: a child puts itself under a seccomp filter that kills for rt_sigprocmask (vsftpd's
 * filters allow rt_sigaction for the handlers they install after it, and not rt_sigprocmask),
 * then installs handlers with sigaction and with signal, raises one, and answers a line on a
 * connection it shares with its parent.  Each case prints how the child ended; over kernel TCP
 * and under memlan the output must be the same.
 *
 * Under memlan the child was killed by SIGSYS at its first sigaction: memlan's sigaction blocked
 * every signal (rt_sigprocmask) around its own table's update.
 *
 * usage: sandboxsig PORT
 */
#include "twoends.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "seccompkill.h"

static volatile sig_atomic_t got;

static void on_sig(int sig) { got = sig; }

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    static const char *names[] = {"sigaction", "signal"};
    for (int how = 0; how < 2; how++) {
        int s;
        int c = settled_pair(l, &a, &s);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            alarm(10); /* before the filter: its own bound */
            close(l);
            close(c);
            if (seccomp_kill_for(SYS_rt_sigprocmask))
                _exit(2);
            if (how == 0) {
                struct sigaction sa = {.sa_handler = on_sig};
                if (sigaction(SIGUSR1, &sa, NULL) != 0)
                    _exit(3);
            } else if (signal(SIGUSR1, on_sig) == SIG_ERR) {
                _exit(3);
            }
            if (kill(getpid(), SIGUSR1) != 0 || got != SIGUSR1)
                _exit(4);
            char b[8];
            if (read(s, b, 5) != 5 || memcmp(b, "ping\n", 5) != 0)
                _exit(5);
            _exit(write(s, "pong\n", 5) == 5 ? 0 : 6);
        }
        close(s);
        char b[8] = {0};
        ssize_t r = -1;
        if (write(c, "ping\n", 5) == 5)
            r = read(c, b, 5);
        int st = 0;
        if (waitpid(pid, &st, 0) != pid)
            die("waitpid");
        printf("%s: answer %s, child %s %d\n", names[how],
               r == 5 && memcmp(b, "pong\n", 5) == 0 ? "pong" : "none",
               WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        close(c);
    }
    printf("done\n");
    return 0;
}
