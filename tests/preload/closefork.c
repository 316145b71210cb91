/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * closefork: a process forks while one of its threads is inside close() of a connection, and
 * the child then receives on that fd number: the child's call must return (over kernel TCP it
 * says EBADF: the close had taken the number before the fork).
 *
 * Under memlan a close of an accelerated connection marks the fd's record (closing) until its
 * kernel close, and a data call that finds the mark waits for it.  Here the close is held in
 * the middle: another thread's send holds the socket's send word (its copy stopped by a fault
 * on its own buffer, which the program's SIGSEGV handler mends once the child has answered), and
 * the close's teardown waits for that word.  The fork comes meanwhile; the child has the mark in its copy
 * of the record and no closer to clear it: its receive waited for ever.
 *
 * usage: closefork PORT
 */
#include "heldsend.h"

#include <sys/wait.h>

static _Atomic int closed;
static int c = -1;

static void *close_c(void *arg)
{
    (void)arg;
    close(c);
    atomic_store(&closed, 1);
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
    pthread_t k, h = held_send_start(c);
    pthread_create(&k, NULL, close_c, NULL);
    sleep_ms(20); /* the close is under way (under memlan: waiting for the send's word) */
    pid_t pid = fork();
    if (pid == 0) {
        char b;
        alarm(5); /* a receive that waits for ever ends the child here: SIGALRM */
        (void)recv(c, &b, 1, MSG_DONTWAIT);
        _exit(0);
    }
    if (pid < 0)
        die("fork");
    int st;
    waitpid(pid, &st, 0);
    printf("the child's receive on the number being closed returned: %s\n",
           WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "yes" : "no (it waited)");
    release = 1;
    pthread_join(h, NULL);
    pthread_join(k, NULL);
    printf("the send ended: %s, the close ended: %s\n", atomic_load(&h_done) ? "yes" : "no",
           atomic_load(&closed) ? "yes" : "no");
    close(s);
    close(l);
    printf("done\n");
    return 0;
}
