/* copy_perf.c — ddplug-copy-perf: the cpu plugin's bulk copy (ddcpu_copy,
 * plugins/cpu/copy.c) against glibc's memcpy, by size and by how far the
 * destination lies past the source modulo 4 KiB ("skew"). It shows why the
 * plugin does not always call memcpy: on CPUs whose `rep movsb` stalls when
 * the destination is a few bytes past the source (AMD Zen, with ERMS/FSRM),
 * memcpy of a malloc'd buffer (16 bytes off a page) into a page-aligned
 * shared-memory slot runs at a small fraction of the machine's bandwidth.
 *
 *   build/bin/ddplug-copy-perf [--bytes-total 2G]
 *
 * Prints one table: size, skew, GB/s of memcpy and of ddcpu_copy (each the best
 * of 3 rounds of copying about --bytes-total bytes), and their ratio.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kernels.h"

typedef void (*copy_fn)(void *dst, const void *src, size_t n);

static void with_memcpy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void with_ddcpu_copy(void *dst, const void *src, size_t n) { ddcpu_copy(dst, src, n, 0); }

/* Best GB/s of 3 rounds, each copying about total bytes in n-byte copies. */
static double rate(copy_fn f, unsigned char *dst, const unsigned char *src, size_t n,
                   double total) {
  long iters = (long)(total / (double)n);
  if (iters < 1) iters = 1;
  double best = 0;
  for (int round = 0; round < 3; round++) {
    double t0 = bench_now_s();
    for (long i = 0; i < iters; i++) {
      f(dst, src, n);
      __asm__ volatile("" : : "r"(dst) : "memory"); /* keep every copy */
    }
    double gbs = (double)iters * (double)n / (bench_now_s() - t0) / 1e9;
    if (gbs > best) best = gbs;
  }
  return best;
}

int main(int argc, char **argv) {
  uint64_t total = 2ull << 30;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bytes-total") && i + 1 < argc && bench_parse_size(argv[i + 1], &total) == 0) {
      i++;
      continue;
    }
    fprintf(stderr, "usage: ddplug-copy-perf [--bytes-total SIZE]\n");
    return 2;
  }
  const size_t sizes[] = {4096, 32768, 131072, 262144, 524288, 1 << 20, 8 << 20};
  const size_t skews[] = {0, 8, 16, 31, 32, 48, 64, 4096 + 16};
  const size_t cap = (8u << 20) + 3 * 4096;
  unsigned char *src = aligned_alloc(4096, cap), *dst = aligned_alloc(4096, cap);
  if (!src || !dst) {
    fprintf(stderr, "ddplug-copy-perf: out of memory\n");
    return 1;
  }
  memset(src, 1, cap);
  memset(dst, 2, cap);
  printf("# destination = page-aligned buffer + skew, source page-aligned; best of 3 rounds of %.1f GB\n",
         (double)total / 1e9);
  printf("| %9s | %5s | %12s | %15s | %7s |\n", "size (B)", "skew", "memcpy GB/s",
         "ddcpu_copy GB/s", "ratio");
  printf("|-----------|-------|--------------|-----------------|---------|\n");
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
    for (size_t k = 0; k < sizeof skews / sizeof *skews; k++) {
      size_t n = sizes[si], at = skews[k];
      double m = rate(with_memcpy, dst + at, src, n, (double)total);
      double h = rate(with_ddcpu_copy, dst + at, src, n, (double)total);
      printf("| %9zu | %5zu | %12.2f | %15.2f | %6.2fx |\n", n, at, m, h, h / m);
    }
  free(src);
  free(dst);
  return 0;
}
