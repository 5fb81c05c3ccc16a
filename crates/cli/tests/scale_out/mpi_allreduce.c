/* MPI_Allreduce over every rank with counts from 1 element to 1 Mi elements (eager and
 * rendezvous paths), integer sums and maxima whose exact results every rank checks element
 * by element; also MPI_BXOR over bytes, so every byte of the result is checked.
 *
 *   mpi_allreduce [ITERS]    prints "allreduce ok ..." on rank 0, exits 1 on any mismatch
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t contribution(int rank, size_t i, int iter)
{
    return ((uint64_t)rank + 1) * 0x10001ull * (i + 1) + (uint64_t)iter * 7919 + (i % 251);
}

static unsigned char byte_of(int rank, size_t i, int iter)
{
    return (unsigned char)(contribution(rank, i, iter) >> (8 * (rank % 8)));
}

static const size_t counts[] = {1, 2, 7, 64, 1000, 4096, 65536, 262144, 1 << 20};

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int iters = argc > 1 ? atoi(argv[1]) : 3;
    if (iters <= 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    size_t max = 1 << 20;
    uint64_t *in = malloc(max * sizeof *in), *out = malloc(max * sizeof *out);
    unsigned char *bin = malloc(max), *bout = malloc(max);
    unsigned long long bad = 0, checked = 0, calls = 0;

    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c];
        for (int it = 0; it < iters; it++) {
            /* Sum of uint64: exact, wraps identically everywhere. */
            for (size_t i = 0; i < n; i++)
                in[i] = contribution(rank, i, it);
            MPI_Allreduce(in, out, (int)n, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
            for (size_t i = 0; i < n; i++) {
                uint64_t want = 0;
                for (int r = 0; r < nranks; r++)
                    want += contribution(r, i, it);
                bad += out[i] != want;
            }
            /* Max: the largest rank's contribution, element by element. */
            MPI_Allreduce(in, out, (int)n, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
            for (size_t i = 0; i < n; i++)
                bad += out[i] != contribution(nranks - 1, i, it);
            /* Bitwise xor of bytes: every byte position of the result checked. */
            for (size_t i = 0; i < n; i++)
                bin[i] = byte_of(rank, i, it);
            MPI_Allreduce(bin, bout, (int)n, MPI_UNSIGNED_CHAR, MPI_BXOR, MPI_COMM_WORLD);
            for (size_t i = 0; i < n; i++) {
                unsigned char want = 0;
                for (int r = 0; r < nranks; r++)
                    want ^= byte_of(r, i, it);
                bad += bout[i] != want;
            }
            checked += 3 * n;
            calls += 3;
        }
    }
    if (bad)
        fprintf(stderr, "rank %d: %llu wrong elements\n", rank, bad);
    unsigned long long mine[2] = {bad, checked}, all[2] = {0, 0};
    MPI_Reduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("allreduce %s: ranks %d calls %llu elements_checked %llu wrong %llu\n",
               all[0] ? "FAILED" : "ok", nranks, calls, all[1], all[0]);
    free(in);
    free(out);
    free(bin);
    free(bout);
    MPI_Finalize();
    return bad != 0 || (rank == 0 && all[0] != 0);
}
