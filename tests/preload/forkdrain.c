/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * forkdrain: a process forks while one of its threads is in the middle of a send on a
 * connection (its copy stopped by a fault on its own buffer, which the program's SIGSEGV
 * handler mends 50 ms later), and another thread sends on the same connection 20 ms into the
 * fork.  Both sends must end, and the fork too, as over kernel TCP (where the faulting send
 * simply ends with what it copied, or EFAULT: its result is not printed).
 *
 * Under memlan the first send holds the socket's send word (the socket was never forked: the
 * fast word) while its handler runs; the fork's prepare handler waits for that word
 * (mlp_fast_drain), asleep on it, and the second sender, come after the socket was marked
 * forked, takes the robust mutex and then waits for the word too.  The word's give-back wakes
 * one sleeper: the fork's drain, asleep first, which went its way without passing the wake-up
 * on, and the second sender slept for ever.
 *
 * usage: forkdrain PORT
 */
#include "heldsend.h"

#include <sys/wait.h>

static _Atomic int l_done;
static int c = -1;

static void *send_l(void *arg)
{
    (void)arg;
    if (send(c, "x", 1, 0) != 1)
        die("the second send");
    atomic_store(&l_done, 1);
    return NULL;
}

/* 20 ms into the fork the second sender; 30 ms later the first send's handler may end. */
static void *helper(void *arg)
{
    pthread_t *l = arg;
    sleep_ms(20);
    pthread_create(l, NULL, send_l, NULL);
    sleep_ms(30);
    release = 1;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a);
    int s;
    c = settled_pair(l, &a, &s);
    pthread_t g, lt;
    pthread_t h = held_send_start(c);
    pthread_create(&g, NULL, helper, &lt);
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid < 0)
        die("fork");
    int st;
    waitpid(pid, &st, 0);
    printf("fork: child exited %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    pthread_join(g, NULL);
    double end = now_s() + 3;
    while (!(atomic_load(&l_done) && atomic_load(&h_done)) && now_s() < end)
        sleep_ms(1);
    printf("the faulting send ended: %s\n", atomic_load(&h_done) ? "yes" : "no");
    printf("the other thread's send ended: %s\n", atomic_load(&l_done) ? "yes" : "no");
    fflush(stdout);
    if (!atomic_load(&l_done) || !atomic_load(&h_done)) {
        printf("FAIL a send slept through the fork\n");
        fflush(stdout);
        _exit(1);
    }
    pthread_join(h, NULL);
    pthread_join(lt, NULL);
    close(c);
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
