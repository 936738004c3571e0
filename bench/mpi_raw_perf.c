/*
 * mpi_raw_perf.c — ddplug-mpi-raw-perf-<family>: plain MPI_Allreduce of the
 * same MPI, the anchor the mpi plugin is measured against
 * (bench/mpi_allreduce_perf.py runs them side by side). Built once per MPI
 * family found (linked against that family's libmpi); run under its
 * launcher:
 *
 *   mpirun -n 2 ddplug-mpi-raw-perf-openmpi -b 8 -e 64M -f 2 [--json FILE]
 *
 * float32 sum, out of place, malloc'd buffers; the same sizes, iteration
 * rule (at least 20 and about 0.1 s per size, rank 0's choice broadcast),
 * columns and JSON as ddplug-allreduce-perf: time is the slowest rank's
 * average, busbw = algbw * 2(n-1)/n, #wrong counts elements that differ from
 * the exact sum of one checked run.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

int main(int argc, char **argv) {
  size_t lo = 8, hi = 64u << 20;
  double factor = 2;
  int warm = 5, fixed = 0;
  const char *json = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) lo = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) hi = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warm = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-i")) fixed = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
    else {
      fprintf(stderr, "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-w N] [-i N] [--json FILE]\n",
              argv[0]);
      return 2;
    }
  }
  if (factor <= 1) factor = 2;
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int vlen = 0;
  MPI_Get_library_version(version, &vlen);
  version[strcspn(version, "\n,")] = '\0';
  /* MPICH's says "MPICH Version:<TAB>4.0.2": no control character or quote
   * may reach the JSON string */
  for (char *c = version; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == '"' || *c == '\\') *c = ' ';
  FILE *js = rank == 0 && json ? fopen(json, "w") : NULL;
  if (rank == 0) {
    printf("# ddplug-mpi-raw-perf: MPI_Allreduce of %s, %d ranks, float32 sum, out of place\n#\n",
           version, world);
    printf("# %12s %12s %9s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop",
           "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    if (js) fprintf(js, "{\"tool\": \"ddplug-mpi-raw-perf\", \"mpi\": \"%s\", \"ranks\": %d, "
                        "\"dtype\": \"float32\", \"op\": \"sum\", \"rows\": [", version, world);
  }
  long total_wrong = 0;
  int first = 1;
  for (double sz = (double)lo; sz <= (double)hi; sz *= factor) {
    size_t count = (size_t)sz / 4 ? (size_t)sz / 4 : 1;
    float *in = malloc(count * 4), *out = malloc(count * 4);
    for (size_t i = 0; i < count; i++) in[i] = (float)((i % 13) + rank);
    for (int w = 0; w < warm; w++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int iters = fixed;
    if (!iters) {
      double t0 = MPI_Wtime();
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double one = MPI_Wtime() - t0;
      iters = one > 0 ? (int)(0.1 / one) : 1000;
      if (iters < 20) iters = 20;
      if (iters > 20000) iters = 20000;
      MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++)
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double per = (MPI_Wtime() - t0) / iters, slowest = 0;
    MPI_Allreduce(&per, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = 0, all = 0;
    for (size_t i = 0; i < count; i++) {
      float want = (float)(world * (int)(i % 13) + world * (world - 1) / 2);
      wrong += out[i] != want;
    }
    MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    total_wrong += all;
    double bytes = (double)count * 4, algbw = bytes / slowest / 1e9;
    double busbw = algbw * 2.0 * (world - 1) / world;
    if (rank == 0) {
      printf("  %12.0f %12zu %9s %6s %12.2f %12.2f %12.2f %8ld\n", bytes, count, "float32", "sum",
             slowest * 1e6, algbw, busbw, all);
      if (js) fprintf(js, "%s{\"size\": %.0f, \"count\": %zu, \"time_us\": %.3f, \"algbw\": %.5f, "
                          "\"busbw\": %.5f, \"wrong\": %ld, \"iters\": %d}", first ? "" : ", ",
                      bytes, count, slowest * 1e6, algbw, busbw, all, iters);
      first = 0;
    }
    free(in);
    free(out);
  }
  if (rank == 0) {
    printf("# total wrong elements: %ld\n", total_wrong);
    if (js) {
      fprintf(js, "]}\n");
      fclose(js);
    }
  }
  MPI_Finalize();
  return total_wrong ? 1 : 0;
}
