/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * sandboxyield: a process confined by a seccomp filter that kills it for sched_yield (OpenSSH's
 * pre-authentication filter allows no sched_yield) whose threads meet on locks of ours.  A fork
 * child settles a connection to the parent, puts the filter on, and then four threads at once:
 *   sigaction  20,000 installs each of one handler (under memlan the signal table's lock)
 *   sigbus     5,000 installs each of a SIGBUS handler (the SIGBUS guard's lock)
 *   fork gate  thread 0 forks 1,000 times (each child leaves at once) while the other three
 *              dup() and close() the connection (the fd table's fork gate: the fork's prepare
 *              handler waits there for installs and uninstalls in progress)
 * and last a byte each way on the connection.  The parent prints how the child ended: over
 * kernel TCP, and under memlan, "exited 0".  The locks' waits gave the cpu away with sched_yield
 * when their holder kept them past a few pauses, and the filter killed the process for it
 * ("killed by signal 31").  Each phase alone was killed so with the old waits (scratch copies
 * with the other two taken out, 3 or 4 runs of each).  The fork gate phase used to make and close
 * 2,000 plain sockets per thread, which never pass the gate (only a connection of ours is in the
 * fd table), and it exited 0 with the old waits too.
 *
 * usage: sandboxyield PORT
 */
#include "seccompkill.h"
#include "twoends.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define THREADS 4

static void on_sig(int sig) { (void)sig; }

/* Installs of a handler for sig, n times. */
struct installs {
    int sig, n;
};

static void *install_loop(void *arg)
{
    const struct installs *w = arg;
    struct sigaction sa = {.sa_handler = on_sig};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < w->n; i++)
        if (sigaction(w->sig, &sa, NULL) != 0)
            die("sigaction");
    return NULL;
}

#define FORKS 1000

static int conn;
static atomic_int forks_done;

/* Thread 0 forks; the others dup() and close() the connection until it is done (each dup an
 * install in the fd table, each close an uninstall). */
static void *gate_loop(void *arg)
{
    if ((intptr_t)arg != 0) {
        for (int i = 0; i < 200000 && !atomic_load(&forks_done); i++) {
            int d = dup(conn);
            if (d < 0)
                die("dup");
            close(d);
        }
        return NULL;
    }
    for (int i = 0; i < FORKS; i++) {
        pid_t p = fork();
        if (p < 0)
            die("fork");
        if (p == 0)
            _exit(0);
        int st;
        if (waitpid(p, &st, 0) != p)
            die("waitpid");
    }
    atomic_store(&forks_done, 1);
    return NULL;
}

static void run(const char *what, void *(*fn)(void *), void *arg)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, fn, arg ? arg : (void *)(intptr_t)i) != 0)
            die("pthread_create");
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("child: %s done\n", what);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = scripted_listener(argv[1], &a);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0)
            die("connect");
        char x = 0;
        if (send(c, "c", 1, 0) != 1 || recv(c, &x, 1, MSG_WAITALL) != 1)
            die("settle");
        if (seccomp_kill_process_for(SYS_sched_yield) != 0)
            die("seccomp");
        struct installs usr1 = {SIGUSR1, 20000}, bus = {SIGBUS, 5000};
        run("sigaction", install_loop, &usr1);
        run("sigbus", install_loop, &bus);
        conn = c;
        run("fork gate", gate_loop, NULL);
        if (send(c, "d", 1, 0) != 1 || recv(c, &x, 1, MSG_WAITALL) != 1 || x != 'D')
            die("last byte");
        printf("child: the connection works\n");
        _exit(0);
    }
    int s = accept(l, NULL, NULL);
    char x = 0;
    if (s < 0 || recv(s, &x, 1, MSG_WAITALL) != 1 || send(s, "p", 1, 0) != 1)
        die("accept");
    if (recv(s, &x, 1, MSG_WAITALL) != 1 || x != 'd' || send(s, "D", 1, 0) != 1)
        printf("parent: no last byte from the child\n");
    int st = 0;
    if (waitpid(child, &st, 0) != child)
        die("waitpid");
    if (WIFEXITED(st))
        printf("child exited %d\n", WEXITSTATUS(st));
    else
        printf("child killed by signal %d\n", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
