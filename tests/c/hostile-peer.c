/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* hostile-peer: a child maps the channel and writes random values into every shared control
 * word, index, tripwire, event-queue reference and record header, as fast as it can, while the
 * parent keeps sending and receiving on it (one round in four, the indices the attacher starts
 * from are left unaligned too).  The parent may see corrupt data and errors
 * (-EPROTO, -ECONNRESET, -EPIPE) but must never crash, hang or touch memory outside the channel:
 * run under ASan (make test does) this catches any out-of-bounds access. */
#include "test.h"
#include "channel.h"

#include <fcntl.h>
#include <sys/mman.h>

int main(void)
{
    ml_test_watchdog(120);
    memlan_fabric_t *fab = ml_test_fabric();
    int rounds = 0, errors = 0;
    for (int kind = MEMLAN_STREAM; kind <= MEMLAN_MSG; kind++) {
        for (int round = 0; round < 20; round++, rounds++) {
            memlan_channel_t *a, *b;
            struct memlan_channel_opts o = {.kind = kind, .ring_size = 4096};
            ASSERT_OK(memlan_channel_create(fab, &o, &a));
            if (round % 4 == 3) {
                /* The attacher starts from the shared indices: leave them unaligned (a
                 * message ring's record header must then never be read or written there). */
                uint8_t *base = a->seg->base;
                struct ml_ring_ctl *c0 = (void *)(base + ML_CHAN_CTL0_OFF);
                struct ml_ring_ctl *c1 = (void *)(base + ML_CHAN_CTL1_OFF);
                atomic_store(&c0->tail, (uint64_t)round % 7 + 1);
                atomic_store(&c0->head, (uint64_t)round % 7 + 41);
                atomic_store(&c1->head, (uint64_t)round % 5 + 3);
                atomic_store(&c1->tail, (uint64_t)round % 5 + 3);
            }
            ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
            /* Also attach an event queue so that the wake path reads the references. */
            memlan_evq_t *q;
            ASSERT_OK(memlan_evq_create(fab, 64, &q));
            ASSERT_OK(memlan_evq_add(q, b, MEMLAN_EV_READ | MEMLAN_EV_WRITE, b));
            char path[512];
            snprintf(path, sizeof path, "%s/seg-%s", ml_test_dir, memlan_channel_token(a));
            pid_t pid = fork();
            if (pid == 0) {
                alarm(30);
                int fd = open(path, O_RDWR);
                struct stat st;
                fstat(fd, &st);
                uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m == MAP_FAILED)
                    _exit(2);
                uint64_t seed = (uint64_t)round * 7919 + (uint64_t)kind;
                for (;;) {
                    uint64_t r = ml_test_rand(&seed);
                    /* Mostly the control page (headers, indices, tripwires, references), sometimes
                     * the data (message headers live there). */
                    size_t off = (r & 3) ? (r >> 8) % 4096 : (r >> 8) % (size_t)st.st_size;
                    off &= ~(size_t)7;
                    uint64_t v = ml_test_rand(&seed);
                    switch (v & 3) {
                    case 0: v = 0; break;
                    case 1: v = ~0ull; break;
                    case 2: v &= 0xffff; break;
                    default: break;
                    }
                    memcpy(m + off, &v, 8);
                }
            }
            uint8_t buf[8192];
            uint64_t seed = 42;
            for (int i = 0; i < 20000; i++) {
                size_t n = (size_t)(ml_test_rand(&seed) % sizeof buf);
                memset(buf, (int)i, n);
                ssize_t r = memlan_send(a, buf, n, MEMLAN_DONTWAIT);
                if (r < 0 && r != -EAGAIN)
                    errors++;
                r = memlan_recv(b, buf, sizeof buf, MEMLAN_DONTWAIT);
                if (r < 0 && r != -EAGAIN)
                    errors++;
                const void *p;
                r = memlan_peek(b, &p, MEMLAN_DONTWAIT);
                if (r > 0) {
                    /* Touch every byte peek claims is there: ASan checks the bounds. */
                    volatile uint8_t s = 0;
                    for (ssize_t k = 0; k < r; k++)
                        s ^= ((const uint8_t *)p)[k];
                    (void)s;
                    memlan_release(b, (size_t)r);
                }
                void *w;
                r = memlan_reserve(a, &w, 16, MEMLAN_DONTWAIT);
                if (r > 0) {
                    memset(w, 0x5a, (size_t)r);
                    memlan_commit(a, 16);
                }
                (void)memlan_channel_poll(a);
                (void)memlan_channel_poll(b);
                struct memlan_event ev[8];
                (void)memlan_evq_wait(q, ev, 8, 0);
                (void)memlan_send(b, buf, 100, MEMLAN_DONTWAIT);
                (void)memlan_recv(a, buf, sizeof buf, MEMLAN_DONTWAIT);
            }
            kill(pid, SIGKILL);
            ml_test_wait_child(pid);
            memlan_evq_close(q);
            memlan_channel_close(b);
            memlan_channel_close(a);
        }
    }
    ml_test_fabric_empty(fab);
    printf("hostile-peer: ok, %d rounds survived, %d errors reported cleanly\n", rounds, errors);
    ASSERT_GE(errors, 1); /* the corruption was noticed, not silently ignored */
    return 0;
}
