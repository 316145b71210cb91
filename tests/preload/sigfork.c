/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sigfork: a child forked inside a signal handler, which never returns from it, connects out.
 * PostgreSQL's postmaster (15 and before, Debian 12's) works so: its signals are blocked except
 * while it sleeps in select(), and its SIGUSR1 handler forks the walreceiver (and background
 * workers), each running to its end inside the handler's frame.  Over kernel TCP the child's
 * connection is an ordinary one.
 *
 * Under memlan the child inherited the handler depth the trampoline had counted, and so took
 * itself for a handler for ever: its connects went past the negotiation ("connect from a
 * handler: kernel TCP alone"), silently: a standby's WAL stream stayed on TCP, its primary's log
 * saying "the client is not memlan (no offer)".
 *
 * usage: sigfork PORT [nested|return]
 * nested: the handler forks from a handler it interrupted (the depth is 2 in the child).
 * return: the child returns from the handler and connects from the loop it interrupted.
 * The child sends a line and reads the echo back; the parent echoes in its select loop.
 */
#include "twoends.h"

#include <signal.h>
#include <sys/select.h>
#include <sys/wait.h>

static struct sockaddr_in addr;
static volatile sig_atomic_t forked, nested, ret, in_child;
static sigset_t unblock;

static void child_work(void)
{
    sigprocmask(SIG_SETMASK, &unblock, NULL); /* as a postmaster child does */
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr) != 0)
        die("child connect");
    const char msg[] = "from the handler's child\n";
    if (send(c, msg, sizeof msg - 1, 0) != (ssize_t)(sizeof msg - 1))
        die("child send");
    char buf[64];
    size_t got = 0;
    while (got < sizeof msg - 1) {
        ssize_t n = recv(c, buf + got, sizeof buf - got, 0);
        if (n <= 0)
            die("child recv");
        got += (size_t)n;
    }
    printf("child: echo %s", memcmp(buf, msg, sizeof msg - 1) == 0 ? "matches\n" : "differs\n");
    close(c);
    _exit(0); /* inside the handler, as a postmaster child ends */
}

static void on_usr2(int sig)
{
    (void)sig;
    pid_t p = fork();
    if (p == 0 && ret) {
        in_child = 1;
        return;
    }
    if (p == 0)
        child_work();
    forked = p > 0 ? p : -1;
}

static void on_usr1(int sig)
{
    (void)sig;
    if (nested) {
        raise(SIGUSR2); /* delivered now: SIGUSR2 is not blocked inside this handler */
        return;
    }
    on_usr2(sig);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    nested = argc > 2 && strcmp(argv[2], "nested") == 0;
    ret = argc > 2 && strcmp(argv[2], "return") == 0;
    int l = scripted_listener(argv[1], &addr);
    struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
    sigfillset(&sa.sa_mask);
    sigdelset(&sa.sa_mask, SIGUSR2);
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_usr2;
    sigfillset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    sigset_t block;
    sigfillset(&block);
    sigdelset(&block, SIGALRM);
    sigprocmask(SIG_SETMASK, &block, &unblock);
    kill(getpid(), SIGUSR1); /* pending until the select below lets it in */
    int acc = -1;
    double t0 = now_s();
    while (now_s() - t0 < 20) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(l, &r);
        if (acc >= 0)
            FD_SET(acc, &r);
        struct timeval tv = {0, 100000};
        sigprocmask(SIG_SETMASK, &unblock, NULL);
        int n = select((acc > l ? acc : l) + 1, &r, NULL, NULL, &tv);
        sigprocmask(SIG_SETMASK, &block, NULL);
        if (in_child)
            child_work();
        if (n < 0 && errno != EINTR)
            die("select");
        if (n <= 0)
            continue;
        if (FD_ISSET(l, &r) && acc < 0) {
            acc = accept(l, NULL, NULL);
            if (acc < 0)
                die("accept");
        } else if (acc >= 0 && FD_ISSET(acc, &r)) {
            char buf[256];
            ssize_t k = recv(acc, buf, sizeof buf, 0);
            if (k < 0)
                die("parent recv");
            if (k == 0)
                break;
            if (send(acc, buf, (size_t)k, 0) != k)
                die("parent send");
        }
    }
    int st = 0;
    if (forked <= 0 || waitpid(forked, &st, 0) != forked)
        die("no child");
    printf("parent: child exited %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}
