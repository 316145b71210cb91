/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* tests/preload: a send held in the middle of its copy.  Its buffer's second page is not
 * readable at first; the copy faults there, and the program's SIGSEGV handler waits until
 * release is set (5 s at most) before it makes the page readable and returns, so the send goes
 * on.  Under memlan the send holds its direction's lock all that time. */
#ifndef MEMLAN_TESTS_HELDSEND_H
#define MEMLAN_TESTS_HELDSEND_H
#include "twoends.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

static char *page;                 /* two pages: the first readable, the second not (at first) */
static volatile sig_atomic_t in_handler, release;
static _Atomic int h_done;         /* the held send returned */
static int held_fd = -1;

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
    (void)send(held_fd, page + 4096 - 256, 4096, 0);
    atomic_store(&h_done, 1);
    return NULL;
}

/* A thread's send on fd, returned once its handler runs (or it ended, or 5 s went by). */
static pthread_t held_send_start(int fd)
{
    held_fd = fd;
    page = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        die("mmap");
    memset(page, 'p', 8192);
    mprotect(page + 4096, 4096, PROT_NONE);
    struct sigaction sa = {.sa_handler = on_segv};
    sigaction(SIGSEGV, &sa, NULL);
    pthread_t h;
    pthread_create(&h, NULL, send_h, NULL);
    double end = now_s() + 5;
    while (!in_handler && !atomic_load(&h_done) && now_s() < end)
        sleep_ms(1);
    return h;
}
#endif
