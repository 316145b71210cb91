/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * altjmp PORT: handlers that leave by siglongjmp, on the thread's own stack and on an alternate
 * signal stack that lies in main()'s frame (above the sigsetjmp point), then a connection, then
 * pthread_exit from main.  memlan's trampoline links a cleanup buffer that puts its handler
 * depth back when a jump passes it: on the own stack the depth comes back (the connection after
 * the jumps is accelerated; before, the thread counted as in a handler for good and its connects
 * stayed on kernel TCP), and above the target glibc's jump would leave the buffer linked after
 * its frame was gone (the next handler's linked to itself, and pthread_exit's unwinding looped
 * for ever): none is linked there.  Prints what each step saw, and ends (alarm after 10 s).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include "twoends.h"

static sigjmp_buf env;
static void on_usr1(int sig)
{
    (void)sig;
    siglongjmp(env, 1);
}

static __attribute__((noinline)) int jumps(int times)
{
    volatile int n = 0;
    for (volatile int i = 0; i < times; i++)
        if (sigsetjmp(env, 1) == 0)
            raise(SIGUSR1);
        else
            n++;
    return n;
}

static void exchange(int l, struct sockaddr_in *addr, const char *what)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)addr, sizeof *addr) != 0)
        die("connect");
    int a = accept(l, NULL, NULL);
    char b = 0;
    if (a < 0 || send(c, "x", 1, 0) != 1 || recv(a, &b, 1, 0) != 1)
        die("exchange");
    printf("%s: a connection carried '%c'\n", what, b);
    close(a);
    close(c);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    struct sockaddr_in addr;
    int l = scripted_listener(argv[1], &addr);
    alarm(10);
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    printf("own stack: jumped out %d times\n", jumps(3));
    exchange(l, &addr, "after the jumps on the own stack");

    char alt[65536]; /* in main's frame: above jumps()'s */
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
    if (sigaltstack(&ss, NULL))
        die("sigaltstack");
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    printf("alternate stack above: jumped out %d times\n", jumps(3));
    printf("pthread_exit from main\n");
    fflush(stdout);
    pthread_exit(NULL);
}
