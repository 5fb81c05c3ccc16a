/* MPI ping-pong between rank pairs (0,1), (2,3), ...: every message carries a pattern
 * derived from (size, iteration, sender) and the receiver checks every byte.
 *
 *   mpi_pingpong [ITERS [MAX_BYTES]]  validate: sizes 0, 1, 8, ... up to 4 MiB (or MAX_BYTES),
 *                                     ITERS round trips each; rank 0 prints "pingpong ok ..."
 *                                     and exits 1 on any wrong byte
 *   mpi_pingpong --bench ITERS        time 8 B latency (ITERS round trips) and 64 KiB / 1 MiB
 *                                     ping-pong bandwidth (ITERS / 10), after a warm-up
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(size_t i, size_t size, int iter, int sender)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull ^ (uint64_t)size * 31 ^
                 (uint64_t)iter * 1000003 ^ (uint64_t)sender << 56;
    x ^= x >> 29;
    return (unsigned char)(x ^ x >> 17);
}

static void fill(unsigned char *buf, size_t size, int iter, int sender)
{
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(i, size, iter, sender);
}

/* Returns the number of wrong bytes. */
static size_t check(const unsigned char *buf, size_t size, int iter, int sender)
{
    size_t bad = 0;
    for (size_t i = 0; i < size; i++)
        bad += buf[i] != pattern(i, size, iter, sender);
    return bad;
}

static const size_t sizes[] = {0, 1, 8, 63, 64, 1000, 4096, 8192, 16384, 65536,
                               65537, 262144, 1 << 20, 4 << 20};

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    int iters = argc > 1 + bench ? atoi(argv[1 + bench]) : 10;
    size_t max_bytes = !bench && argc > 2 ? strtoull(argv[2], NULL, 0) : (size_t)4 << 20;
    if (nranks % 2 != 0 || iters <= 0) {
        if (rank == 0)
            fprintf(stderr, "need an even number of ranks and ITERS > 0\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int peer = rank ^ 1;
    int first = rank % 2 == 0;
    unsigned char *buf = malloc(4 << 20);

    if (bench) {
        const size_t bench_sizes[] = {8, 65536, 1 << 20};
        for (int s = 0; s < 3; s++) {
            size_t size = bench_sizes[s];
            int n = size >= 65536 ? (iters / 10 > 0 ? iters / 10 : 1) : iters;
            memset(buf, 1, size);
            for (int warm = 0; warm < 2; warm++) {
                int rounds = warm ? n : (n / 10 > 0 ? n / 10 : 1);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                for (int i = 0; i < rounds; i++) {
                    if (first) {
                        MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                        MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                                 MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                                 MPI_STATUS_IGNORE);
                        MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                    }
                }
                double half_rtt = (MPI_Wtime() - t0) / rounds / 2;
                if (warm && rank == 0)
                    printf("size %zu iters %d latency_us %.3f bandwidth_MBps %.1f\n", size,
                           rounds, half_rtt * 1e6, size / half_rtt / 1e6);
            }
        }
        fflush(stdout);
        free(buf);
        MPI_Finalize();
        return 0;
    }

    size_t bad = 0, bytes = 0, messages = 0;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t size = sizes[s];
        if (size > max_bytes)
            break;
        for (int i = 0; i < iters; i++) {
            MPI_Status st;
            int count;
            if (first) {
                fill(buf, size, i, rank);
                MPI_Send(buf, (int)size, MPI_BYTE, peer, (int)s, MPI_COMM_WORLD);
                memset(buf, 0xEE, size);
                MPI_Recv(buf, 4 << 20, MPI_BYTE, peer, (int)s, MPI_COMM_WORLD, &st);
            } else {
                memset(buf, 0xEE, size);
                MPI_Recv(buf, 4 << 20, MPI_BYTE, peer, (int)s, MPI_COMM_WORLD, &st);
            }
            MPI_Get_count(&st, MPI_BYTE, &count);
            if ((size_t)count != size || st.MPI_SOURCE != peer) {
                fprintf(stderr, "rank %d: size %zu iter %d: got %d bytes from %d\n", rank,
                        size, i, count, st.MPI_SOURCE);
                bad += size ? size : 1;
            } else {
                size_t wrong = check(buf, size, i, peer);
                if (wrong)
                    fprintf(stderr, "rank %d: size %zu iter %d: %zu wrong bytes\n", rank,
                            size, i, wrong);
                bad += wrong;
            }
            bytes += size;
            messages++;
            if (!first) {
                fill(buf, size, i, rank);
                MPI_Send(buf, (int)size, MPI_BYTE, peer, (int)s, MPI_COMM_WORLD);
            }
        }
    }
    unsigned long long mine[3] = {bad, bytes, messages}, all[3];
    MPI_Reduce(mine, all, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("pingpong %s: ranks %d messages %llu bytes %llu wrong %llu\n",
               all[0] ? "FAILED" : "ok", nranks, all[2], all[1], all[0]);
    free(buf);
    MPI_Finalize();
    return rank == 0 && all[0] != 0;
}
