/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* evq-hostile: a process that can write into an event queue (every poster imports it writable)
 * scribbles random values over its header, summary and leaf words, misaligned offsets included,
 * while the owner collects and a channel's peer posts to it.  The owner must never index past
 * its slots (summary bits past the last leaf word, leaf bits past the capacity), the poster
 * never past the queue's bitmaps (a geometry the peer rewrote), and neither may make a misaligned
 * access: run under ASan+UBSan, any of those is a report and a failure.  Capacities that are not
 * a multiple of 4096 leave summary bits with no leaf word behind them, which is where the old
 * code overflowed. */
#include "test.h"
#include "channel.h"

#include <fcntl.h>
#include <sys/mman.h>

static void scribble(int fd, uint64_t seed)
{
    alarm(30);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        _exit(2);
    uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        _exit(2);
    size_t hdr = sizeof(struct ml_seg_hdr);
    for (;;) {
        uint64_t r = ml_test_rand(&seed);
        uint64_t v = ml_test_rand(&seed);
        switch ((r >> 4) & 3) {
        case 0: v = ~0ull; break;
        case 1: v &= 0xfff; break;          /* small offsets and capacities, often misaligned */
        case 2: v = 1ull << (v % 64); break; /* one bit: a summary or leaf bit */
        default: break;
        }
        size_t off;
        if ((r & 3) == 0) /* the queue header (geometry, waiter, counters) */
            off = hdr + (r >> 8) % sizeof(struct ml_evq_hdr);
        else if ((r & 3) == 1) /* now and then the segment header: body offset and size */
            off = (r >> 8) % hdr;
        else /* the bitmaps */
            off = hdr + sizeof(struct ml_evq_hdr) + (r >> 8) % 512;
        off &= ~(size_t)3;
        if (off + 8 > (size_t)st.st_size)
            continue;
        memcpy(m + off, &v, (r & 64) ? 8 : 4);
    }
}

int main(void)
{
    ml_test_watchdog(120);
    memlan_fabric_t *fab = ml_test_fabric();
    static const unsigned caps[] = {64, 128, 640, 4160};
    int rounds = 0;
    long events = 0;
    for (unsigned c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        for (int round = 0; round < 5; round++, rounds++) {
            memlan_evq_t *q;
            ASSERT_OK(memlan_evq_create(fab, caps[c], &q));
            memlan_channel_t *a[4], *b[4];
            for (int i = 0; i < 4; i++) {
                struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = 4096};
                ASSERT_OK(memlan_channel_create(fab, &o, &a[i]));
                ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a[i]), &b[i]));
                ASSERT_OK(memlan_evq_add(q, b[i], MEMLAN_EV_READ, b[i]));
            }
            int *segfd, *bellfd;
            __ml_evq_fds(q, &segfd, &bellfd); /* the child inherits the queue's file */
            pid_t pid = fork();
            if (pid == 0)
                scribble(*segfd, (uint64_t)round * 7919 + c + 1);
            uint8_t buf[256];
            /* long enough for the scribbler to be at work for most of it */
            uint64_t until = ml_test_now_ns() + 150000000u;
            for (int it = 0; it < 20000 || ml_test_now_ns() < until; it++) {
                int i = it & 3;
                /* a's sends trip b's tripwire in queue mode: a posts (importing the queue) */
                (void)memlan_send(a[i], buf, 1 + it % 64, MEMLAN_DONTWAIT);
                struct memlan_event ev[8];
                int n = memlan_evq_wait(q, ev, 1 + it % 8, 0);
                for (int k = 0; k < n; k++) {
                    memlan_channel_t *ch = ev[k].udata;
                    int ok = 0;
                    for (int j = 0; j < 4; j++)
                        ok |= ch == b[j];
                    ASSERT_TRUE(ok); /* an event names only what we added */
                    events++;
                    (void)memlan_recv(ch, buf, sizeof buf, MEMLAN_DONTWAIT);
                }
                if ((it & 255) == 0)
                    (void)memlan_evq_arm(q);
            }
            kill(pid, SIGKILL);
            ml_test_wait_child(pid);
            for (int i = 0; i < 4; i++) {
                memlan_channel_close(b[i]);
                memlan_channel_close(a[i]);
            }
            memlan_evq_close(q);
        }
    }
    ml_test_fabric_empty(fab);
    printf("evq-hostile: ok, %d queues scribbled over, %ld events, no access out of bounds\n",
           rounds, events);
    ASSERT_GE(events, 1); /* the queues were in use, not just written over */
    return 0;
}
