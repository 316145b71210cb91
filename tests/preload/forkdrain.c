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
#include "twoends.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static char *page;                 /* two pages: the first readable, the second not (at first) */
static volatile sig_atomic_t in_handler, release;
static _Atomic int h_done, l_done;
static int c = -1;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void on_segv(int sig)
{
    (void)sig;
    in_handler = 1;
    for (int i = 0; i < 5000 && !release; i++)
        sleep_ms(1);
    mprotect(page + 4096, 4096, PROT_READ | PROT_WRITE);
}

/* The send whose copy faults on its own buffer's second page. */
static void *send_h(void *arg)
{
    (void)arg;
    (void)send(c, page + 4096 - 256, 4096, 0);
    atomic_store(&h_done, 1);
    return NULL;
}

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
    page = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        die("mmap");
    memset(page, 'p', 8192);
    mprotect(page + 4096, 4096, PROT_NONE);
    struct sigaction sa = {.sa_handler = on_segv};
    sigaction(SIGSEGV, &sa, NULL);

    pthread_t h, g, lt;
    pthread_create(&h, NULL, send_h, NULL);
    double end = now_s() + 5;
    while (!in_handler && !atomic_load(&h_done) && now_s() < end)
        sleep_ms(1);
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
    end = now_s() + 3;
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
