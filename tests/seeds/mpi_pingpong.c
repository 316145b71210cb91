/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/* mpi_pingpong - two ranks: MPI_Send/MPI_Recv ping-pong over a range of sizes, then MPI_Allreduce,
 * every reply's data checked.  Built with Open MPI's or MPICH's mpicc; run by tests/py/test_seeds.py
 * (a few iterations, every byte checked) and bench/seeds (timed).
 *
 *   mpi_pingpong [-i ITERS] [-t SECONDS] [-s SIZE,SIZE,...] [-a COUNT,COUNT,...]
 *
 * For each size, rank 0 sends a block whose bytes depend on the size and the iteration; rank 1
 * checks it and sends back the block with every byte complemented; rank 0 checks that.  Stamps at
 * the head and tail are checked on every message, the whole block on the first and last
 * iterations and on every one when ITERS <= 100.  Each size runs ITERS round trips or until
 * SECONDS have passed (whichever comes first; rank 0 decides and tells rank 1 in the message).
 * Output (rank 0), one line per figure:
 *   pingpong SIZE ROUNDTRIPS median_us MEDIAN mean_us MEAN p10_us P10 min_us MIN
 *   allreduce COUNT ITERS mean_us MEAN
 *   ok
 * Exit status 1 with a line "MISMATCH ..." on the first wrong byte. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static unsigned char pat(size_t i, int size, long it) { return (unsigned char)(i * 131 + size * 7 + it * 13 + 1); }

static void parse(const char *s, long *out, int *n, int max)
{
    *n = 0;
    while (s && *s && *n < max) {
        char *e;
        out[(*n)++] = strtol(s, &e, 10);
        s = *e == ',' ? e + 1 : e + strlen(e);
    }
}

static void fill(unsigned char *b, int size, long it)
{
    for (long i = 0; i < size; i++)
        b[i] = pat((size_t)i, size, it);
    if (size >= 8) {
        memcpy(b, &it, sizeof it);
        memcpy(b + size - 8, &it, sizeof it);
    }
}

/* The whole block when full (against want, filled here), else the stamps; returns the first
 * wrong index or -1. */
static long check(const unsigned char *b, unsigned char *want, int size, long it, int flip, int full)
{
    unsigned char x = flip ? 0xff : 0;
    if (full || size < 8) {
        fill(want, size, it);
        for (long i = 0; i < size; i++)
            if (b[i] != (unsigned char)(want[i] ^ x))
                return i;
        return -1;
    }
    long h, t;
    memcpy(&h, b, sizeof h);
    memcpy(&t, b + size - 8, sizeof t);
    if ((h ^ (flip ? -1L : 0)) != it) return 0;
    if ((t ^ (flip ? -1L : 0)) != it) return size - 8;
    return -1;
}

int main(int argc, char **argv)
{
    long iters = 1000, sizes[32], counts[32];
    int nsizes = 0, ncounts = 0;
    double secs = 1.0;
    const char *ss = "64,1024,65536,1048576", *cs = "1,1024,131072";
    MPI_Init(&argc, &argv);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-i")) iters = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) secs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) ss = argv[i + 1];
        else if (!strcmp(argv[i], "-a")) cs = argv[i + 1];
    }
    parse(ss, sizes, &nsizes, 32);
    parse(cs, counts, &ncounts, 32);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n != 2) {
        if (rank == 0) fprintf(stderr, "mpi_pingpong: needs exactly 2 ranks, got %d\n", n);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long maxs = 8;
    for (int k = 0; k < nsizes; k++) maxs = sizes[k] > maxs ? sizes[k] : maxs;
    unsigned char *buf = malloc((size_t)maxs), *want = malloc((size_t)maxs);
    double *rt = malloc(sizeof(double) * (size_t)(iters > 0 ? iters : 1));
    if (!buf || !want || !rt) MPI_Abort(MPI_COMM_WORLD, 3);
    int bad = 0;
    for (int k = 0; k < nsizes && !bad; k++) {
        int size = (int)sizes[k];
        long done = 0;
        double t0 = MPI_Wtime(), total = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (long it = 0;; it++) {
            /* The iteration number rides in the tag: a negative tag bit is not allowed, so the
             * last message carries tag 1 and a normal one tag 0. */
            if (rank == 0) {
                int last = it + 1 >= iters || MPI_Wtime() - t0 > secs;
                int full = iters <= 100 || it == 0 || last;
                fill(buf, size, it);
                double a = MPI_Wtime();
                MPI_Send(buf, size, MPI_BYTE, 1, last, MPI_COMM_WORLD);
                MPI_Recv(buf, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                double d = MPI_Wtime() - a;
                rt[done++] = d;
                total += d;
                long w = check(buf, want, size, it, 1, full);
                if (w >= 0) {
                    printf("MISMATCH pingpong size %d iteration %ld byte %ld (rank 0)\n", size, it, w);
                    bad = 1;
                }
                if (last) break;
            } else {
                MPI_Status st;
                MPI_Recv(buf, size, MPI_BYTE, 0, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
                int last = st.MPI_TAG == 1;
                int full = iters <= 100 || it == 0 || last;
                long w = check(buf, want, size, it, 0, full);
                if (w >= 0) {
                    printf("MISMATCH pingpong size %d iteration %ld byte %ld (rank 1)\n", size, it, w);
                    bad = 1;
                }
                for (long i = 0; i < size; i++) buf[i] ^= 0xff;
                MPI_Send(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
                if (last) break;
            }
        }
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0 && !bad) {
            qsort(rt, (size_t)done, sizeof *rt, cmp_d);
            /* The lower quantiles too: on a loaded machine a rank that loses its cpu for a
             * time slice moves the median of the large sizes by milliseconds. */
            printf("pingpong %d %ld median_us %.3f mean_us %.3f p10_us %.3f min_us %.3f\n", size,
                   done, rt[done / 2] * 1e6, total / (double)done * 1e6, rt[done / 10] * 1e6,
                   rt[0] * 1e6);
            fflush(stdout);
        }
    }
    /* Allreduce of COUNT longs, MPI_SUM: rank r contributes i * (r + 1) + it, so the sum is
     * 3 i + 2 it at each index. */
    for (int k = 0; k < ncounts && !bad; k++) {
        long count = counts[k];
        long *v = malloc(sizeof(long) * (size_t)count);
        if (!v) MPI_Abort(MPI_COMM_WORLD, 3);
        long it = 0, stop = 0;
        double t0 = MPI_Wtime(), total = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (; !stop; it++) {
            for (long i = 0; i < count; i++) v[i] = i * (rank + 1) + it;
            double a = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, v, (int)count, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            total += MPI_Wtime() - a;
            for (long i = 0; i < count; i++)
                if (v[i] != 3 * i + 2 * it) {
                    printf("MISMATCH allreduce count %ld iteration %ld index %ld (rank %d)\n",
                           count, it, i, rank);
                    bad = 1;
                    break;
                }
            /* Both ranks must agree when to stop: rank 0's clock decides, broadcast with the
             * error flag. */
            int flags[2] = {bad, rank == 0 && (it + 1 >= iters || MPI_Wtime() - t0 > secs)};
            MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            bad = flags[0];
            stop = flags[0] || flags[1];
        }
        if (rank == 0 && !bad)
            printf("allreduce %ld %ld mean_us %.3f\n", count, it, total / (double)it * 1e6);
        free(v);
    }
    if (rank == 0 && !bad) printf("ok\n");
    fflush(stdout);
    free(buf);
    free(want);
    free(rt);
    MPI_Finalize();
    return bad;
}
