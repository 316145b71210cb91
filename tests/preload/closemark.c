/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * closemark: a close that waits while another thread's call is stopped inside its send, and what
 * a call on the closing fd does meanwhile.  A thread (the sender) sends a page that is mapped
 * PROT_NONE on a settled connection, both ends in this process; main closes that connection
 * while the send is stopped; the stop lasts 300 ms after main began its close.  Over kernel
 * TCP the send fails with EFAULT at once and the stop comes after it; under memlan the copy of
 * the preload's fast path faults (a documented limit: SIGSEGV where the kernel says EFAULT), the
 * handler maps the page and stops there, with the send's fast word held: the close's teardown
 * waits for the word (mlp_sock_destroy) with the fd's record marked closing.
 *
 * usage: closemark PORT MODE
 *   handler: the stop (in the SIGSEGV handler under memlan) sends a byte on the closing fd.
 *            Kernel TCP: EBADF (the close came first); the call must end either way (with the
 *            mark, it waited for the close, which waited for the handler's thread: a deadlock).
 *   reuse:   during the stop a thread (the waiter) sends a byte on the closing fd, and another
 *            closes the fd too, opens a connection that gets its number and closes that: the
 *            waiter's send must end (EBADF over kernel TCP, or 1 on the new connection).  The
 *            second close's mark was written over the first's, its waiters' flag lost, and
 *            nobody woke the waiter.
 *   cancel:  a thread with a cancellation pending closes the fd (glibc's close acts on it before
 *            the kernel's: the thread ends, the fd stays open); then main sends a byte on it.
 *            The send must end (the mark of the close that never finished was never cleared,
 *            and the send waited for ever for a thread that was gone).
 * (A fork in the middle of such a close: closefork.c.)
 * Prints the same lines over kernel TCP and memlan; "FAIL ..." and exit 1 on a failure; a
 * process alarm of 30 s ends a hang.
 */
#include "twoends.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

static int conn = -1;
static char *page;
static long pagesz;
static _Atomic int closing;
static _Atomic int stopped; /* the sender reached its stop (either way) */
static _Atomic int failed;
static int reuse_mode;
static _Atomic int reuse_now, reuse_done;
static int reuse_close = 99;
static struct sockaddr_in addr;
static int lsn = -1;

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "FAIL hung (alarm)\n";
    (void)!write(1, m, sizeof m - 1);
    _exit(1);
}

static void nap_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Bounded: the process alarm ends everything first. */
static void wait_for(_Atomic int *flag)
{
    for (int i = 0; i < 60000 && !atomic_load(flag); i++)
        nap_ms(1);
}

/* The stop: after main began its close, 300 ms, then the mode's call. */
static void stop(void)
{
    atomic_store(&stopped, 1);
    wait_for(&closing);
    nap_ms(300);
    if (reuse_mode) {
        atomic_store(&reuse_now, 1);
        wait_for(&reuse_done);
    } else {
        int saved = errno;
        ssize_t r = send(conn, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        fprintf(stderr, "the stop's send: %zd (%s)\n", r, r < 0 ? strerror(errno) : "-");
        errno = saved;
    }
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    char *a = si->si_addr;
    if (a < page || a >= page + pagesz)
        abort();
    mprotect(page, (size_t)pagesz, PROT_READ | PROT_WRITE);
    fprintf(stderr, "the send's copy faulted: stopped in the handler\n");
    stop();
}

static void *sender(void *arg)
{
    (void)arg;
    ssize_t r = send(conn, page, (size_t)pagesz, MSG_NOSIGNAL);
    if (r < 0 && errno == EFAULT)
        stop(); /* kernel TCP: the stop after the call */
    else if (r != pagesz) {
        printf("FAIL the send: %zd (%s)\n", r, r < 0 ? strerror(errno) : "short");
        atomic_store(&failed, 1);
    }
    r = send(conn, "y", 1, MSG_NOSIGNAL);
    printf("a send after the close: %s\n", r < 0 && errno == EBADF ? "EBADF" : "not EBADF");
    return NULL;
}

static void *waiter(void *arg)
{
    (void)arg;
    wait_for(&closing);
    nap_ms(100);
    /* EBADF, or a byte sent on the new connection at that number, woken just before its
     * close (either is a kernel's answer to a call that raced two closes and an open). */
    ssize_t r = send(conn, "w", 1, MSG_NOSIGNAL);
    printf("the waiting send: %s\n", r == 1 || (r < 0 && errno == EBADF) ? "ended" : "other");
    return NULL;
}

static void *reuser(void *arg)
{
    (void)arg;
    wait_for(&reuse_now);
    int fd = conn;
    reuse_close = close(fd);
    int s2, c2 = settled_pair(lsn, &addr, &s2);
    if (c2 != fd) {
        printf("FAIL the new connection got fd %d, not %d\n", c2, fd);
        atomic_store(&failed, 1);
    }
    nap_ms(50);
    close(c2);
    close(s2);
    nap_ms(50);
    atomic_store(&reuse_done, 1);
    return NULL;
}

static void *cancelled_closer(void *arg)
{
    (void)arg;
    pthread_cancel(pthread_self()); /* deferred: it acts at the next cancellation point */
    int r = close(conn);
    printf("FAIL the close returned %d under a pending cancellation\n", r);
    atomic_store(&failed, 1);
    return NULL;
}

static int cancel_mode(void)
{
    pthread_t t;
    void *res = NULL;
    pthread_create(&t, NULL, cancelled_closer, NULL);
    pthread_join(t, &res);
    printf("the close was cancelled: %s\n", res == PTHREAD_CANCELED ? "yes" : "no");
    printf("the fd after it: %s\n", fcntl(conn, F_GETFD) >= 0 ? "open" : "closed");
    ssize_t r = send(conn, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    printf("a send on it: %s\n", r == 1 ? "1" : r < 0 ? strerror(errno) : "other");
    return close(conn) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    reuse_mode = strcmp(argv[2], "reuse") == 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGALRM, on_alarm);
    alarm(30);
    pagesz = sysconf(_SC_PAGESIZE);
    page = mmap(NULL, (size_t)pagesz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        die("mmap");
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &sa, NULL);
    struct sockaddr_in a;
    int l = listen_here(atoi(argv[1]), &a), s;
    conn = settled_pair(l, &a, &s);
    addr = a;
    lsn = l;
    if (strcmp(argv[2], "cancel") == 0) {
        int rc = cancel_mode() | atomic_load(&failed);
        close(s);
        close(l);
        if (rc)
            return 1;
        printf("done\n");
        return 0;
    }
    pthread_t ts, tw, tr;
    if (reuse_mode) {
        pthread_create(&tw, NULL, waiter, NULL);
        pthread_create(&tr, NULL, reuser, NULL);
    }
    pthread_create(&ts, NULL, sender, NULL);
    wait_for(&stopped);
    atomic_store(&closing, 1);
    int r = close(conn);
    pthread_join(ts, NULL);
    if (reuse_mode) {
        pthread_join(tw, NULL);
        pthread_join(tr, NULL);
        /* Two closes of one fd: one closed it, the other found it closed. */
        printf("the two closes: %s\n", (r == 0) + (reuse_close == 0) == 1 ? "one 0" : "not one 0");
        r = 0;
    }
    printf("close: %d\n", r); /* after the others' lines: under memlan the close ends last */
    close(s);
    close(l);
    if (atomic_load(&failed))
        return 1;
    printf("done\n");
    return 0;
}
