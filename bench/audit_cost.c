/* audit_cost.c — ddplug-audit-cost: what the per-epoch data-split audit costs,
 * side by side with its anchor, the same epoch without an audit.
 *
 *   ddplug-audit-cost [-N 1000000,100000000] [-w 8] [--epochs 2] [--batch 64]
 *                     [--kind distributed|bucket] [--boundaries 16,32,64,96]
 *                     [--evaluation] [--plugin cpu] [--json FILE]
 *
 * For each N, W ranks (forked processes, one context each on the cpu plugin
 * through a real rendezvous store) run every epoch twice, in lockstep:
 *   anchor  set_epoch, then next() in batches until the epoch ends — the
 *           context-bound sampler alone;
 *   audited ddplug_audit_begin, the same loop (the sampler records every
 *           index into the audit), ddplug_audit_finish (the collective
 *           check: allgather of the statistics, BOR/BAND of the bitmaps).
 * A barrier starts each pass; the time of a pass is the slowest rank's.
 *   cost    audited - anchor, per epoch (the record's share and the finish)
 *   finish  the collective finish alone
 *   memory  the audit's own: its bitmap (N bits, or audit_exact_max bits
 *           beyond), the finish's chunk buffers, and the rank's peak RSS
 *           growth over the audited passes (getrusage), the largest rank's.
 * The bucket kind gives the samples random lengths of 8..128 (the demo's
 * shape). Everything the runs deliver goes into a checksum that is printed.
 * The machine's other load shows in the times: compare rows of one run.
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "ddplug/ddplug.h"

#define MAX_N 8

typedef struct opts {
  uint64_t n[MAX_N];
  int nn, world, epochs, evaluation, bucket;
  uint64_t batch;
  int64_t bounds[64];
  uint32_t nbounds;
  const char *plugin, *json;
} opts;

/* What rank 0 reports for one N (max over ranks), in shared memory. */
typedef struct result {
  double anchor_s, audited_s, finish_s;
  double peak_growth_kib;
  uint64_t checksum, deliveries;
  char verdict[32];
  char summary[512];
  int ok;
} result;

static void die(const char *what, int st) {
  fprintf(stderr, "ddplug-audit-cost: %s: %s: %s\n", what, ddplug_status_name(st),
          ddplug_last_error());
  exit(1);
}

static long peak_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* The slowest rank's value. */
static double max_over_ranks(ddplug_context *ctx, double v) {
  int st = ddplug_allreduce(ctx, &v, &v, 1, DDPLUG_FLOAT64, DDPLUG_OP_MAX, NULL);
  if (st) die("allreduce", st);
  return v;
}

static uint64_t drain(ddplug_sampler *s, int64_t *buf, uint64_t cap) {
  uint64_t got, sum = 0;
  for (;;) {
    int st = ddplug_sampler_next(s, buf, cap, &got);
    if (st) die("sampler next", st);
    if (!got) return sum;
    for (uint64_t k = 0; k < got; k++) sum += (uint64_t)buf[k] * 2654435761u;
  }
}

static void rank_main(const opts *o, uint64_t n, int rank, int port, result *out) {
  char json[512];
  snprintf(json, sizeof json,
           "{\"plugin\": \"%s\", \"world\": {\"rank\": %d, \"world_size\": %d}, "
           "\"rendezvous\": {\"addr\": \"127.0.0.1\", \"port\": %d, \"timeout_s\": 120}, "
           "\"timeouts\": {\"collective_s\": 600}, "
           "\"data_split\": {\"audit\": \"every_epoch\"}}",
           o->plugin, rank, o->world, port);
  ddplug_config *cfg = NULL;
  int st = ddplug_config_load_string(json, "bench", &cfg);
  if (st) die("config", st);
  ddplug_context *ctx = NULL;
  if ((st = ddplug_open(cfg, NULL, &ctx))) die("open", st);
  ddplug_config_free(cfg);
  int64_t *lengths = NULL;
  ddplug_sampler_options so = DDPLUG_SAMPLER_OPTIONS_INIT;
  so.kind = o->bucket ? DDPLUG_SAMPLER_BUCKET : DDPLUG_SAMPLER_DISTRIBUTED;
  so.num_samples = n;
  so.shuffle = !o->evaluation;
  so.exact = o->evaluation;
  so.seed = 7;
  so.batch_size = o->batch;
  so.stream = o->evaluation ? "val" : "train";
  if (o->bucket) {
    lengths = malloc(sizeof *lengths * n);
    if (!lengths) die("lengths", DDPLUG_E_NO_MEMORY);
    uint64_t x = 88172645463325252ull;
    for (uint64_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      lengths[i] = 8 + (int64_t)(x % 121);
    }
    so.lengths = lengths;
    so.boundaries = o->nbounds ? o->bounds : NULL;
    so.num_boundaries = o->nbounds;
    so.num_buckets = o->nbounds ? 0 : 8;
  }
  ddplug_sampler *s = NULL;
  if ((st = ddplug_context_sampler_new(ctx, &so, &s))) die("sampler", st);
  free(lengths);
  uint64_t cap = o->bucket ? o->batch : (o->batch ? o->batch : 64);
  int64_t *buf = malloc(sizeof *buf * cap);
  ddplug_audit_options ao = DDPLUG_AUDIT_OPTIONS_INIT;
  ao.evaluation = o->evaluation;
  double anchor = 0, audited = 0, finish = 0;
  uint64_t sum = 0, deliveries = 0;
  long before = peak_kib();
  ddplug_audit_report rep = DDPLUG_AUDIT_REPORT_INIT;
  for (int e = 0; e < o->epochs; e++) {
    /* anchor: the sampler alone (no audit open on the stream) */
    if ((st = ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT))) die("barrier", st);
    double t0 = bench_now_s();
    if ((st = ddplug_sampler_set_epoch(s, (uint64_t)e))) die("set_epoch", st);
    sum += drain(s, buf, cap);
    anchor += max_over_ranks(ctx, bench_now_s() - t0);
    /* audited: begin, the same loop (recorded), the collective finish */
    if ((st = ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT))) die("barrier", st);
    t0 = bench_now_s();
    ddplug_audit *a = NULL;
    if ((st = ddplug_audit_begin(ctx, so.stream, n, (uint64_t)e, &ao, &a))) die("audit begin", st);
    if ((st = ddplug_sampler_set_epoch(s, (uint64_t)e))) die("set_epoch", st);
    sum += drain(s, buf, cap);
    double t1 = bench_now_s();
    st = ddplug_audit_finish(a, &rep, DDPLUG_TIMEOUT_DEFAULT);
    double t2 = bench_now_s();
    if (st) die("audit finish", st);
    deliveries = rep.deliveries;
    ddplug_audit_free(a);
    audited += max_over_ranks(ctx, t2 - t0);
    finish += max_over_ranks(ctx, t2 - t1);
  }
  double growth = max_over_ranks(ctx, (double)(peak_kib() - before));
  if (rank == 0) {
    out->anchor_s = anchor / o->epochs;
    out->audited_s = audited / o->epochs;
    out->finish_s = finish / o->epochs;
    out->peak_growth_kib = growth;
    out->checksum = sum;
    out->deliveries = deliveries;
    snprintf(out->verdict, sizeof out->verdict, "%s", ddplug_audit_verdict_name(rep.verdict));
    snprintf(out->summary, sizeof out->summary, "%s", rep.summary);
    out->ok = 1;
  }
  free(buf);
  ddplug_sampler_free(s);
  if ((st = ddplug_close(ctx))) die("close", st);
}

static int run_n(const opts *o, uint64_t n, result *out) {
  int port = bench_free_port();
  pid_t *pids = calloc((size_t)o->world, sizeof *pids);
  for (int r = 0; r < o->world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      rank_main(o, n, r, port, out);
      _exit(0);
    }
  }
  int failed = 0;
  for (int r = 0; r < o->world; r++) {
    int status;
    if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  free(pids);
  return failed ? -1 : 0;
}

static void parse_list(const char *s, uint64_t *v, int *n, int max) {
  *n = 0;
  for (const char *p = s; *p && *n < max;) {
    char *end;
    double d = strtod(p, &end);
    if (end == p) break;
    v[(*n)++] = (uint64_t)d;
    p = *end == ',' ? end + 1 : end;
  }
}

int main(int argc, char **argv) {
  opts o = {.world = 8, .epochs = 2, .batch = 64, .plugin = "cpu"};
  o.n[0] = 1000000;
  o.n[1] = 100000000;
  o.nn = 2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-N") && v) { parse_list(v, o.n, &o.nn, MAX_N); i++; }
    else if (!strcmp(a, "-w") && v) { o.world = atoi(v); i++; }
    else if (!strcmp(a, "--epochs") && v) { o.epochs = atoi(v); i++; }
    else if (!strcmp(a, "--batch") && v) { o.batch = strtoull(v, NULL, 10); i++; }
    else if (!strcmp(a, "--kind") && v) { o.bucket = !strcmp(v, "bucket"); i++; }
    else if (!strcmp(a, "--boundaries") && v) {
      uint64_t b[64];
      int nb;
      parse_list(v, b, &nb, 64);
      for (int k = 0; k < nb; k++) o.bounds[k] = (int64_t)b[k];
      o.nbounds = (uint32_t)nb;
      i++;
    }
    else if (!strcmp(a, "--evaluation")) o.evaluation = 1;
    else if (!strcmp(a, "--plugin") && v) { o.plugin = v; i++; }
    else if (!strcmp(a, "--json") && v) { o.json = v; i++; }
    else {
      fprintf(stderr,
              "usage: ddplug-audit-cost [-N 1000000,100000000] [-w 8] [--epochs 2] [--batch 64]\n"
              "                         [--kind distributed|bucket] [--boundaries 16,32,64,96]\n"
              "                         [--evaluation] [--plugin cpu] [--json FILE]\n");
      return 2;
    }
  }
  if (o.world < 1 || o.epochs < 1 || o.nn < 1 || (o.bucket && o.batch == 0)) {
    fprintf(stderr, "ddplug-audit-cost: need -w >= 1, --epochs >= 1, some N, and --batch >= 1 for bucket\n");
    return 2;
  }
  result *res = mmap(NULL, sizeof *res * MAX_N, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (res == MAP_FAILED) return 1;
  memset(res, 0, sizeof *res * MAX_N);
  printf("ddplug-audit-cost: %d ranks (%s plugin), %s sampler%s, batch %llu, %d epochs each; "
         "times are the slowest rank's, per epoch\n",
         o.world, o.plugin, o.bucket ? "bucket" : "distributed",
         o.evaluation ? " (exact, evaluation stream)" : "", (unsigned long long)o.batch, o.epochs);
  printf("%14s %12s %12s %12s %12s %9s %12s %14s %10s\n", "N", "anchor_s", "audited_s", "cost_s",
         "finish_s", "cost_%", "bitmap_MiB", "peak_grow_MiB", "verdict");
  for (int k = 0; k < o.nn; k++) {
    if (run_n(&o, o.n[k], &res[k]) != 0 || !res[k].ok) {
      fprintf(stderr, "ddplug-audit-cost: the run for N = %llu failed\n", (unsigned long long)o.n[k]);
      return 1;
    }
    result *r = &res[k];
    uint64_t tracked = o.n[k] < 100000000ull ? o.n[k] : 100000000ull;
    double bitmap = (double)((tracked + 63) / 64 * 8) / (1024.0 * 1024.0);
    double cost = r->audited_s - r->anchor_s;
    printf("%14llu %12.4f %12.4f %12.4f %12.4f %8.1f%% %12.2f %14.2f %10s\n",
           (unsigned long long)o.n[k], r->anchor_s, r->audited_s, cost, r->finish_s,
           r->anchor_s > 0 ? 100.0 * cost / r->anchor_s : 0.0, bitmap, r->peak_growth_kib / 1024.0,
           r->verdict);
  }
  FILE *jf = o.json ? fopen(o.json, "w") : NULL;
  FILE *outs[2] = {stdout, jf};
  for (int f = 0; f < 2; f++) {
    if (!outs[f]) continue;
    fprintf(outs[f], "{\"bench\": \"audit_cost\", \"world\": %d, \"plugin\": \"%s\", \"kind\": \"%s\", "
                     "\"evaluation\": %s, \"batch\": %llu, \"epochs\": %d, \"rows\": [",
            o.world, o.plugin, o.bucket ? "bucket" : "distributed", o.evaluation ? "true" : "false",
            (unsigned long long)o.batch, o.epochs);
    for (int k = 0; k < o.nn; k++) {
      result *r = &res[k];
      uint64_t tracked = o.n[k] < 100000000ull ? o.n[k] : 100000000ull;
      fprintf(outs[f], "%s{\"N\": %llu, \"anchor_s\": %.6f, \"audited_s\": %.6f, \"cost_s\": %.6f, "
                       "\"finish_s\": %.6f, \"bitmap_bytes\": %llu, \"peak_growth_kib\": %.0f, "
                       "\"deliveries\": %llu, \"verdict\": \"%s\", \"checksum\": %llu}",
              k ? ", " : "", (unsigned long long)o.n[k], r->anchor_s, r->audited_s,
              r->audited_s - r->anchor_s, r->finish_s, (unsigned long long)((tracked + 63) / 64 * 8),
              r->peak_growth_kib, (unsigned long long)r->deliveries, r->verdict,
              (unsigned long long)r->checksum);
    }
    fprintf(outs[f], "]}\n");
  }
  if (jf) fclose(jf);
  return 0;
}
