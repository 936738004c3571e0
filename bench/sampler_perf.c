/* sampler_perf.c — ddplug-sampler-perf: throughput, epoch start time and
 * memory of ddplug's default samplers, in the format bench/torch_sampler_perf.py
 * prints for torch.utils.data.DistributedSampler.
 *
 *   ddplug-sampler-perf [-N 100000000] [-w 8] [--epochs 2] [--chunk 65536]
 *                       [--ranks R] [--bucket-N 1000000] [--json FILE]
 *
 * Everything runs on one thread (one core). For every rank r < R (default:
 * all) and epoch: set_epoch, then next() in chunks until the epoch ends.
 *   indices/s/rank  this rank's indices / the time to produce them
 *   epoch start     set_epoch + the first next() of 1 index (time to the
 *                   first index of an epoch), median over ranks and epochs
 *   extra memory    what this row alone adds: each row runs in a fresh
 *                   child process (fork), whose peak RSS (getrusage) starts
 *                   at its RSS at the fork; the child first touches the
 *                   buffers it shares with the parent and runs the row on
 *                   a tiny N (so data and code are paged in), then extra = its
 *                   peak RSS minus its RSS before the real row
 *                   (/proc/self/statm). No row inherits an earlier row's
 *                   peak. The chunk buffer and the lengths are allocated
 *                   before the fork.
 * Rows: distributed shuffled, distributed sequential, and the bucket sampler
 * (on --bucket-N samples with random lengths and 10 quantile buckets).
 * A checksum of every index keeps the work honest and is printed, with the
 * peak RSS of the largest row process.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ddplug/ddplug.h"

typedef struct row {
  const char *name;
  int shuffle;
  uint64_t n;
  double rate_mean, rate_min, start_us, extra_kib;
  uint64_t checksum;
  long peak_kib; /* the row's process: peak RSS */
} row;

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static long peak_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what, int st) {
  fprintf(stderr, "ddplug-sampler-perf: %s: %s: %s\n", what,
          ddplug_status_name(st), ddplug_last_error());
  exit(1);
}

/* One row: every rank < ranks, every epoch; fills the measurements. */
static void run_row(row *r, ddplug_sampler_options desc, int world, int ranks,
                    int epochs, int64_t *buf, uint64_t chunk, long base_kib) {
  double *starts = calloc((size_t)ranks * (size_t)epochs, sizeof *starts);
  double sum_rate = 0, min_rate = 0;
  int nstarts = 0, nrates = 0;
  r->checksum = 0;
  for (int rank = 0; rank < ranks; rank++) {
    desc.rank = rank;
    desc.world_size = world;
    ddplug_sampler *s = NULL;
    int st = ddplug_sampler_new(&desc, &s);
    if (st) die("ddplug_sampler_new", st);
    for (int e = 0; e < epochs; e++) {
      uint64_t got = 0, total = 0;
      double t0 = bench_now_s();
      if ((st = ddplug_sampler_set_epoch(s, (uint64_t)e))) die("set_epoch", st);
      uint64_t first_cap = desc.kind == DDPLUG_SAMPLER_BUCKET ? chunk : 1;
      if ((st = ddplug_sampler_next(s, buf, first_cap, &got))) die("next", st);
      double t1 = bench_now_s();
      starts[nstarts++] = (t1 - t0) * 1e6;
      total += got;
      for (uint64_t i = 0; i < got; i++) r->checksum += (uint64_t)buf[i];
      double t2 = bench_now_s();
      for (;;) {
        if ((st = ddplug_sampler_next(s, buf, chunk, &got))) die("next", st);
        if (got == 0) break;
        total += got;
        uint64_t c = 0;
        for (uint64_t i = 0; i < got; i++) c += (uint64_t)buf[i];
        r->checksum += c;
      }
      double rate = (double)total / (bench_now_s() - t2 + (t1 - t0));
      sum_rate += rate;
      min_rate = nrates == 0 || rate < min_rate ? rate : min_rate;
      nrates++;
    }
    ddplug_sampler_free(s);
  }
  qsort(starts, (size_t)nstarts, sizeof *starts, cmp_double);
  r->start_us = starts[nstarts / 2];
  r->rate_mean = sum_rate / nrates;
  r->rate_min = min_rate;
  r->peak_kib = peak_kib();
  long extra = r->peak_kib - base_kib;
  r->extra_kib = extra > 0 ? (double)extra : 0.0;
  free(starts);
}

/* run_row in a fresh child process: its peak RSS is the RSS it was forked
 * with plus what the row itself needs, never an earlier row's peak. The
 * measurements come back through a pipe. */
static void run_row_isolated(row *r, ddplug_sampler_options desc, int world,
                             int ranks, int epochs, int64_t *buf,
                             uint64_t chunk) {
  int fds[2];
  if (pipe(fds) != 0) {
    perror("ddplug-sampler-perf: pipe");
    exit(1);
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("ddplug-sampler-perf: fork");
    exit(1);
  }
  if (pid == 0) {
    close(fds[0]);
    /* warm up on a tiny N first: the code the row runs is paged in (a
     * forked child faults its shared library text again), so that the
     * extra memory is the samplers' data, not their code */
    /* a forked child maps the parent's pages lazily: touch the buffers it
     * shares with the parent so that they are counted before, not during,
     * the row */
    memset(buf, 0, sizeof *buf * chunk);
    volatile int64_t sink = 0;
    if (desc.lengths)
      for (uint64_t i = 0; i < desc.num_samples; i += 512) sink += desc.lengths[i];
    (void)sink;
    ddplug_sampler_options tiny = desc;
    tiny.num_samples = desc.num_samples < 1000 ? desc.num_samples : 1000;
    row warm = *r;
    run_row(&warm, tiny, world, 1, 1, buf, chunk, 0);
    long base = rss_kib(); /* the child's peak is at least this already */
    run_row(r, desc, world, ranks, epochs, buf, chunk, base);
    const char *p = (const char *)r;
    size_t left = sizeof *r;
    while (left > 0) {
      ssize_t w = write(fds[1], p, left);
      if (w <= 0) _exit(1);
      p += w;
      left -= (size_t)w;
    }
    _exit(0);
  }
  close(fds[1]);
  row got;
  char *p = (char *)&got;
  size_t left = sizeof got;
  while (left > 0) {
    ssize_t n = read(fds[0], p, left);
    if (n <= 0) break;
    p += n;
    left -= (size_t)n;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (left != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "ddplug-sampler-perf: the process measuring row '%s' "
            "(shuffle %d) failed (wait status %d)\n", r->name, r->shuffle, status);
    exit(1);
  }
  got.name = r->name; /* the same static string in both processes */
  *r = got;
}

int main(int argc, char **argv) {
  uint64_t n = 100000000ull, bucket_n = 1000000ull, chunk = 65536;
  int world = 8, epochs = 2, ranks = -1;
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: %s [-N samples] [-w world] [--epochs E] [--chunk C] "
             "[--ranks R] [--bucket-N samples] [--json FILE]\n", argv[0]);
      return 0;
    }
    if (!v) {
      fprintf(stderr, "ddplug-sampler-perf: %s needs a value (see --help)\n", a);
      return 2;
    }
    if (!strcmp(a, "-N")) n = strtoull(v, NULL, 10);
    else if (!strcmp(a, "-w")) world = atoi(v);
    else if (!strcmp(a, "--epochs")) epochs = atoi(v);
    else if (!strcmp(a, "--chunk")) chunk = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--ranks")) ranks = atoi(v);
    else if (!strcmp(a, "--bucket-N")) bucket_n = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--json")) json = v;
    else {
      fprintf(stderr, "ddplug-sampler-perf: unknown option %s (see --help)\n", a);
      return 2;
    }
    i++;
  }
  if (world < 1 || epochs < 1 || chunk < 1) {
    fprintf(stderr, "ddplug-sampler-perf: -w, --epochs and --chunk must be >= 1\n");
    return 2;
  }
  if (ranks < 1 || ranks > world) ranks = world;
  int64_t *buf = malloc(sizeof *buf * chunk);
  int64_t *lengths = malloc(sizeof *lengths * (bucket_n ? bucket_n : 1));
  if (!buf || !lengths) {
    fprintf(stderr, "ddplug-sampler-perf: out of memory\n");
    return 1;
  }
  memset(buf, 0, sizeof *buf * chunk);
  uint64_t x = 88172645463325252ull;
  for (uint64_t i = 0; i < bucket_n; i++) { /* xorshift64: lengths 1..1000 */
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    lengths[i] = (int64_t)(1 + x % 1000);
  }
  row rows[3] = {{"distributed", 1, n, 0, 0, 0, 0, 0, 0},
                 {"distributed", 0, n, 0, 0, 0, 0, 0, 0},
                 {"bucket(b=32,q=10)", 1, bucket_n, 0, 0, 0, 0, 0, 0}};
  for (int k = 0; k < 3; k++) {
    ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
    d.kind = k < 2 ? DDPLUG_SAMPLER_DISTRIBUTED : DDPLUG_SAMPLER_BUCKET;
    d.num_samples = rows[k].n;
    d.shuffle = rows[k].shuffle;
    d.seed = 42;
    if (k == 2) {
      d.lengths = lengths;
      d.batch_size = 32;
      d.num_buckets = 10;
    }
    run_row_isolated(&rows[k], d, world, ranks, epochs, buf, chunk);
  }
  long peak = 0; /* the largest row process */
  for (int k = 0; k < 3; k++) peak = rows[k].peak_kib > peak ? rows[k].peak_kib : peak;
  printf("ddplug-sampler-perf: world=%d ranks measured=%d epochs=%d chunk=%llu "
         "(one thread)\n", world, ranks, epochs, (unsigned long long)chunk);
  printf("| %-18s | %-7s | %11s | %16s | %15s | %16s | %17s |\n", "sampler",
         "shuffle", "N", "indices/s/rank", "min indices/s", "epoch start (us)",
         "extra memory (KiB)");
  printf("|%s|%s|%s|%s|%s|%s|%s|\n", "--------------------", "---------",
         "-------------", "------------------", "-----------------",
         "------------------", "-------------------");
  for (int k = 0; k < 3; k++)
    printf("| %-18s | %-7s | %11llu | %14.1f M | %13.1f M | %16.3f | %17.0f |\n",
           rows[k].name, rows[k].shuffle ? "yes" : "no",
           (unsigned long long)rows[k].n, rows[k].rate_mean / 1e6,
           rows[k].rate_min / 1e6, rows[k].start_us, rows[k].extra_kib);
  printf("checksums: %llu %llu %llu; peak RSS %ld KiB\n",
         (unsigned long long)rows[0].checksum,
         (unsigned long long)rows[1].checksum,
         (unsigned long long)rows[2].checksum, peak);
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) {
      perror(json);
      return 1;
    }
    fprintf(f, "{\"tool\": \"ddplug-sampler-perf\", \"world\": %d, \"ranks\": %d, "
               "\"epochs\": %d, \"chunk\": %llu, \"rows\": [",
            world, ranks, epochs, (unsigned long long)chunk);
    for (int k = 0; k < 3; k++)
      fprintf(f, "%s\n {\"sampler\": \"%s\", \"shuffle\": %s, \"N\": %llu, "
                 "\"indices_per_s_per_rank\": %.0f, \"min_indices_per_s\": %.0f, "
                 "\"epoch_start_us\": %.3f, \"extra_memory_kib\": %.0f, "
                 "\"checksum\": %llu, \"peak_rss_kib\": %ld}",
              k ? "," : "", rows[k].name, rows[k].shuffle ? "true" : "false",
              (unsigned long long)rows[k].n, rows[k].rate_mean,
              rows[k].rate_min, rows[k].start_us, rows[k].extra_kib,
              (unsigned long long)rows[k].checksum, rows[k].peak_kib);
    fprintf(f, "\n]}\n");
    fclose(f);
  }
  free(buf);
  free(lengths);
  return 0;
}
