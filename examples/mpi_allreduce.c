/* MPI_Allreduce latency, the baseline of `coll_bench mpi` (BENCHMARKS.md, "The
 * compiled CPU device: communicating kernels"). Built with `mpicc -O2` and run with
 * `mpirun -n RANKS` by the bench itself, in the same run as Tessera's all_reduce.
 *
 * Arguments: byte sizes. For each: one warm-up call, then ROUNDS rounds of ITERS
 * calls of MPI_Allreduce(MPI_MAX) on f32, each round ending in MPI_Barrier; prints
 * "bytes seconds" per size on rank 0: the slowest rank's best round, per call
 * (what coll_bench measures for Tessera). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define ROUNDS 3

static int iters_for(long bytes) {
    long it = (64L << 20) / (bytes > 0 ? bytes : 1);
    if (it < 3) it = 3;
    if (it > 1000) it = 1000;
    return (int)it;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int a = 1; a < argc; a++) {
        long bytes = atol(argv[a]);
        long n = bytes / 4 > 0 ? bytes / 4 : 1;
        float *buf = malloc(n * sizeof(float));
        if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
        for (long i = 0; i < n; i++) buf[i] = (float)(i % 97) + (float)rank;
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        int iters = iters_for(bytes);
        double best = 1e30;
        for (int r = 0; r < ROUNDS; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++)
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            double t = (MPI_Wtime() - t0) / iters;
            if (t < best) best = t;
        }
        double worst = 0;
        MPI_Reduce(&best, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.9e\n", bytes, worst);
        fflush(stdout);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
