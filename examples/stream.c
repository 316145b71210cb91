/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* stream: one process streams bytes to another over a memlan byte-stream channel; the receiver
 * checks every byte and the bandwidth is printed.  The receiver listens on a name in the fabric
 * and the sender, forked only to have a second process, connects by that name (no token passes
 * between them).  Uses only <memlan.h>.
 * Usage: stream [megabytes] */
#include <memlan.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BYTE_AT(o) ((uint8_t)((o) * 131 + ((o) >> 11)))

int main(int argc, char **argv)
{
    long mb = argc > 1 ? atol(argv[1]) : 256;
    uint64_t total = (uint64_t)(mb > 0 ? mb : 1) << 20;
    memlan_fabric_t *fab;
    memlan_listener_t *l;
    memlan_channel_t *ch;
    char name[MEMLAN_NAME_MAX + 1];
    snprintf(name, sizeof name, "stream-%ld", (long)getpid());
    int r = memlan_fabric_open(NULL, &fab);
    if (r < 0 || (r = memlan_listen(fab, name, MEMLAN_STREAM, &l)) < 0) {
        fprintf(stderr, "stream: %s\n", memlan_strerror(r));
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) { /* the sender: connect by name (NULL opts: a stream, the default ring) */
        memlan_fabric_t *f;
        memlan_channel_t *tx;
        if ((r = memlan_fabric_open(NULL, &f)) < 0 ||
            (r = memlan_connect(f, name, NULL, 5000, &tx)) < 0) {
            fprintf(stderr, "stream: connect %s: %s\n", name, memlan_strerror(r));
            _exit(1);
        }
        memlan_channel_set_timeout(tx, -1, 5000); /* a reader that stopped reading */
        static uint8_t buf[65536];
        for (uint64_t off = 0; off < total; off += sizeof buf) {
            for (size_t i = 0; i < sizeof buf; i++)
                buf[i] = BYTE_AT(off + i);
            if (memlan_send(tx, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
                _exit(1);
        }
        memlan_channel_close(tx); /* EOF after the last byte */
        memlan_fabric_close(f);
        _exit(0);
    }
    r = memlan_accept(l, 5000, &ch);
    memlan_listener_close(l);
    if (r < 0) {
        fprintf(stderr, "stream: accept: %s\n", memlan_strerror(r));
        return 1;
    }
    memlan_channel_set_timeout(ch, 5000, -1); /* a sender that went silent */
    static uint8_t buf[65536];
    uint64_t got = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ssize_t n;
    while ((n = memlan_recv(ch, buf, sizeof buf, 0)) > 0) {
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != BYTE_AT(got + (uint64_t)i)) {
                fprintf(stderr, "stream: wrong byte at offset %llu\n",
                        (unsigned long long)(got + (uint64_t)i));
                return 1;
            }
        got += (uint64_t)n;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (n < 0)
        fprintf(stderr, "stream: recv: %s\n", memlan_strerror((int)n));
    /* Close before waiting: a reader that stopped on an error would otherwise wait for a
     * sender blocked on the full ring it no longer reads. */
    memlan_channel_close(ch);
    int st;
    waitpid(pid, &st, 0);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("stream: %llu bytes received and checked, %.0f MB/s (checking included)\n",
           (unsigned long long)got, (double)got / s / 1e6);
    memlan_fabric_close(fab);
    return n == 0 && got == total && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
