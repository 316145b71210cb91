/* SPDX-License-Identifier: Apache-2.0 OR MIT */
/*
 * pingpong: two MPI ranks, a SIZE-byte message back and forth ITERS times (after ITERS/10 to warm
 * up); rank 0 prints {"bytes":..., "iters":..., "rtt_us":...}.  Built and run by bench/mpich.sh.
 *
 * usage: pingpong [ITERS [SIZE]]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int iters = argc > 1 ? atoi(argv[1]) : 10000, size = argc > 2 ? atoi(argv[2]) : 64;
    if (iters < 1 || size < 1 || size > (1 << 20))
        MPI_Abort(MPI_COMM_WORLD, 2);
    char *buf = calloc(1, (size_t)size);
    if (!buf)
        MPI_Abort(MPI_COMM_WORLD, 2);
    int warm = iters / 10;
    double t0 = 0;
    for (int i = 0; i < warm + iters; i++) {
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank == 0) {
            MPI_Send(buf, size, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, size, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, size, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, size, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    if (rank == 0)
        printf("{\"bytes\":%d,\"iters\":%d,\"rtt_us\":%.2f}\n", size, iters, t / iters * 1e6);
    free(buf);
    MPI_Finalize();
    return 0;
}
