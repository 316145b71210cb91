/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* stream-chunks: a stream send or receive longer than a chunk (a quarter of the ring, at most
 * 64 KiB) publishes each chunk as soon as it is copied (docs/design.md, "Stream chunks"), so the
 * consumer copies out the first while the producer copies in the next.  When the whole copy was
 * published once at its end, copy-in and copy-out never overlapped: Open MPI's 1 MB messages,
 * written in one writev, went through a 256 KiB ring a ring at a time, each side idle while the
 * other copied.
 *
 * Shown without timing: a copy that faults part-way (its buffer's tail is PROT_NONE), in a child
 * that dies of it, has published the chunks copied before the fault.
 * 1. A send of a whole ring from a buffer readable for 2.5 chunks: the receiver gets the first
 *    two chunks, byte for byte (all or nothing before: nothing).
 * 2. A receive of a full ring into a buffer writable for 2.5 chunks: the producer finds the
 *    first two chunks' room free again (none before).
 * 3. The ring still works after both: the rest goes through and is read in order.
 *
 * The tripwire check owed for the chunks is made in mid-copy only when the peer waits on another
 * cpu (a woken peer on ours could only take our time slice); always at the end of the call.
 * 4. A sleeping consumer on another cpu is woken after the send's first chunk: its armed
 *    tripwire is found cleared after a send that faulted in its third chunk.
 * 5. On our cpu it is not: the tripwire is still armed (woken at the end of the call, or when
 *    the ring is full).
 * 6, 7. The same for a producer waiting for room and a receive that faults in its third chunk
 *    (checked after half a ring released).
 */
#include "test.h"
#include "channel.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define RING  (256u * 1024u)
#define CHUNK (64u * 1024u)
#define OK_BYTES (2 * CHUNK + CHUNK / 2) /* accessible before the PROT_NONE part */

static uint8_t pat(uint64_t i) { return (uint8_t)(i * 7 + (i >> 9) + 1); }

/* A buffer of RING bytes whose bytes from OK_BYTES on fault. */
static uint8_t *guarded(int prot)
{
    uint8_t *p = mmap(NULL, RING, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(p != MAP_FAILED);
    for (uint64_t i = 0; i < RING; i++)
        p[i] = pat(i);
    ASSERT_OK(mprotect(p + OK_BYTES, RING - OK_BYTES, prot));
    return p;
}

static void die_quietly(void)
{
    struct rlimit no = {0, 0};
    (void)setrlimit(RLIMIT_CORE, &no);
    signal(SIGSEGV, SIG_DFL);
}

/* Parts 4-7: a fresh pair; the peer's tripwire armed as a sleeper's, its cpu ours or another;
 * a child's send (recv) faults in its third chunk.  Returns whether the tripwire was cleared. */
static int woken_mid_copy(memlan_fabric_t *fab, int recv_side, int same_cpu)
{
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = RING};
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    static uint8_t out[RING];
    uint32_t me = (uint32_t)sched_getcpu() + 1;
    _Atomic uint32_t *word, *cpu;
    if (recv_side) {
        ASSERT_EQ(memlan_send(a, out, RING, MEMLAN_DONTWAIT), RING);
        word = &a->tx.ctl->tx_wait; /* a, the producer, "waits for room" */
        cpu = &a->tx.ctl->tx_cpu;
    } else {
        word = &b->rx.ctl->rx_wait; /* b, the consumer, "waits for data" */
        cpu = &b->rx.ctl->rx_cpu;
    }
    atomic_store(cpu, same_cpu ? me : me + 1);
    atomic_store(word, ML_WAIT_FUTEX);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        die_quietly();
        if (recv_side)
            (void)memlan_recv(b, guarded(PROT_READ), RING, 0);
        else
            (void)memlan_send(a, guarded(PROT_NONE), RING, 0);
        _exit(3);
    }
    ASSERT_EQ(ml_test_wait_child(pid), 128 + SIGSEGV);
    int cleared = atomic_load(word) == 0;
    atomic_store(word, 0u);
    memlan_channel_close(b);
    memlan_channel_close(a);
    return cleared;
}

int main(void)
{
    ml_test_watchdog(60);
    memlan_fabric_t *fab = ml_test_fabric();
    struct memlan_channel_opts o = {.kind = MEMLAN_STREAM, .ring_size = RING};
    memlan_channel_t *a, *b;
    ASSERT_OK(memlan_channel_create(fab, &o, &a));
    ASSERT_OK(memlan_channel_attach(fab, memlan_channel_token(a), &b));
    static uint8_t in[RING], out[RING];

    /* 1. The sender's copy faults in its third chunk: a child sends, from its own copy of a
     * (the rings are shared), and dies of it. */
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        die_quietly();
        uint8_t *src = guarded(PROT_NONE);
        (void)memlan_send(a, src, RING, 0);
        _exit(3); /* not reached: the copy faults */
    }
    ASSERT_EQ(ml_test_wait_child(pid), 128 + SIGSEGV);
    ssize_t got = memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT);
    ASSERT_EQ(got, 2 * CHUNK);
    for (uint64_t i = 0; i < (uint64_t)got; i++)
        ASSERT_EQ(in[i], pat(i));
    /* Our own handle of that side never moved: take it to where the child's chunks ended. */
    a->tx.pos += 2 * CHUNK;
    a->tx.other = a->tx.pos; /* and the receiver has taken them all */
    a->bytes_tx += 2 * CHUNK;

    /* 2. A full ring, then a receive whose copy faults in its third chunk, in a child. */
    for (uint64_t i = 0; i < RING; i++)
        out[i] = pat(i + 5);
    ASSERT_EQ(memlan_send(a, out, RING, MEMLAN_DONTWAIT), RING);
    ASSERT_EQ(memlan_send(a, out, 1, MEMLAN_DONTWAIT), -EAGAIN);
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        die_quietly();
        uint8_t *dst = guarded(PROT_READ);
        (void)memlan_recv(b, dst, RING, 0);
        _exit(3);
    }
    ASSERT_EQ(ml_test_wait_child(pid), 128 + SIGSEGV);
    /* The first two chunks' room is free again: exactly that much goes in. */
    ASSERT_EQ(memlan_send(a, out, RING, MEMLAN_DONTWAIT), 2 * CHUNK);

    /* 3. Our reading handle resumes where the child's released chunks end (its third chunk
     * was copied in part and never released: it is read again). */
    b->rx.pos += 2 * CHUNK;
    b->rx.other = b->rx.pos;
    b->bytes_rx += 2 * CHUNK;
    uint64_t seen = 0;
    while (seen < RING) {
        ssize_t r = memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT);
        ASSERT_GE(r, 1);
        for (uint64_t i = 0; i < (uint64_t)r; i++) {
            /* out's second half, then its first half (sent again after the child's release) */
            uint64_t k = seen + i, half = RING - 2 * CHUNK;
            uint8_t want = k < half ? pat(k + 2 * CHUNK + 5) : pat(k - half + 5);
            ASSERT_EQ(in[i], want);
        }
        seen += (uint64_t)r;
    }
    ASSERT_EQ(memlan_recv(b, in, sizeof in, MEMLAN_DONTWAIT), -EAGAIN);

    memlan_channel_close(b);
    memlan_channel_close(a);

    /* 4-7: on one cpu, so that ours stays ours (the child inherits it). */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_OK(sched_setaffinity(0, sizeof one, &one));
    ASSERT_EQ(woken_mid_copy(fab, 0, 0), 1);
    ASSERT_EQ(woken_mid_copy(fab, 0, 1), 0);
    ASSERT_EQ(woken_mid_copy(fab, 1, 0), 1);
    ASSERT_EQ(woken_mid_copy(fab, 1, 1), 0);
    ml_test_fabric_empty(fab);
    printf("stream-chunks: ok\n");
    return 0;
}
