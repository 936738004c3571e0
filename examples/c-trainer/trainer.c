/*
 * trainer.c — a data-parallel trainer in plain C on ddplug: linear regression
 * by minibatch SGD on a synthetic dataset, gradients averaged with
 * ddplug_allreduce. Launch it with the `ddplug run` launcher (or torchrun,
 * SLURM, ...):
 *
 *   ddplug run -n 2 -- ddplug-c-trainer examples/configs/cpu.json
 *
 * The data is split by ddplug's distributed sampler (the stream "train" is
 * claimed with owner "plugin", so nothing else may split it), reshuffled each
 * epoch, and the audit checks what every rank actually consumed (config
 * "data_split.audit"). At the end the ranks check that their weights are
 * bit-identical (allreduce of min and max) — the property data parallelism
 * relies on.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddplug/ddplug.h"

#define DIM 16
#define N_SAMPLES 8192
#define BATCH 32 /* per rank */
#define EPOCHS 5
#define LR 0.05f

static int die(const char *what, int status) {
  fprintf(stderr, "ddplug-c-trainer: %s: %s (%s)\n", what, ddplug_last_error(),
          ddplug_status_name(status));
  return 1;
}

/* Deterministic pseudo-random numbers from an index: the dataset is the same
 * on every rank without being sent anywhere. */
static float unit(uint64_t i) {
  i += 0x9e3779b97f4a7c15ull;
  i = (i ^ (i >> 30)) * 0xbf58476d1ce4e5b9ull;
  i = (i ^ (i >> 27)) * 0x94d049bb133111ebull;
  i ^= i >> 31;
  return (float)((double)(i >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void sample(int64_t n, float *x, float *y) {
  float target = 0.0f;
  for (int d = 0; d < DIM; d++) {
    x[d] = unit((uint64_t)n * DIM + (uint64_t)d);
    target += x[d] * (float)(d + 1) / DIM; /* the true weights */
  }
  *y = target + 0.01f * unit((uint64_t)n + 1000003ull);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ddplug-c-trainer CONFIG.json\n");
    return 2;
  }
  ddplug_config *cfg = NULL;
  int s = ddplug_config_load_file(argv[1], &cfg);
  if (s) return die("loading the config", s);
  ddplug_context *ctx = NULL;
  ddplug_open_options opts = DDPLUG_OPEN_OPTIONS_INIT;
  opts.framework = "ddplug-c-trainer";
  s = ddplug_open(cfg, &opts, &ctx);
  ddplug_config_free(cfg);
  if (s) return die("joining the run", s);

  ddplug_world w = DDPLUG_WORLD_INIT;
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  ddplug_context_world(ctx, &w);
  ddplug_context_plugin(ctx, &info);
  if (w.rank == 0)
    printf("ddplug %s: plugin %s %s (plugin ABI %u.%u), %d ranks on %d node(s), launched by %s\n",
           ddplug_version_string(), info.name, info.version,
           DDPLUG_VERSION_MAJOR_OF(info.plugin_abi_version),
           DDPLUG_VERSION_MINOR_OF(info.plugin_abi_version), w.world_size,
           ddplug_context_num_nodes(ctx), w.source);

  /* The sampler: settings from the config's "sampler" section. */
  const ddplug_config *c = ddplug_context_config(ctx);
  int shuffle = 1, drop_last = 0;
  int64_t seed = 0;
  ddplug_config_get_bool(c, "sampler.shuffle", &shuffle);
  ddplug_config_get_bool(c, "sampler.drop_last", &drop_last);
  ddplug_config_get_int(c, "sampler.seed", &seed);
  ddplug_sampler_options desc = DDPLUG_SAMPLER_OPTIONS_INIT;
  desc.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  desc.num_samples = N_SAMPLES;
  desc.shuffle = shuffle;
  desc.drop_last = drop_last;
  desc.seed = (uint64_t)seed;
  desc.batch_size = BATCH; /* the audit counts one step per batch */
  desc.stream = "train";
  ddplug_sampler *sampler = NULL;
  s = ddplug_context_sampler_new(ctx, &desc, &sampler);
  if (s) {
    int rc = die("creating the sampler", s);
    ddplug_close(ctx);
    return rc;
  }
  uint64_t per_rank = 0;
  ddplug_sampler_length(sampler, &per_rank);
  /* Every sample of the epoch: the last batch may be short. (Dropping it is
   * exactly what the audit reports as "missing samples".) */
  const int64_t steps = (int64_t)((per_rank + BATCH - 1) / BATCH);
  if (w.rank == 0) {
    int owner = 0;
    char claimant[128] = "";
    ddplug_split_owner(ctx, "train", &owner, claimant, sizeof claimant);
    printf("stream train: split owner %s (%s); %llu samples per rank per epoch\n",
           ddplug_owner_name(owner), claimant, (unsigned long long)per_rank);
  }
  float weights[DIM] = {0}, grad[DIM + 1];
  double t0 = now_s();
  for (int epoch = 0; epoch < EPOCHS && !s; epoch++) {
    double loss_sum = 0;
    ddplug_audit *audit = NULL;
    ddplug_sampler_set_epoch(sampler, (uint64_t)epoch);
    s = ddplug_audit_begin(ctx, "train", N_SAMPLES, (uint64_t)epoch, NULL, &audit);
    for (int64_t step = 0; step < steps && !s; step++) {
      int64_t idx[BATCH];
      uint64_t got = 0;
      s = ddplug_sampler_next(sampler, idx, BATCH, &got);
      if (s) break;
      memset(grad, 0, sizeof grad);
      for (uint64_t b = 0; b < got; b++) {
        float x[DIM], y, pred = 0.0f;
        sample(idx[b], x, &y);
        for (int d = 0; d < DIM; d++) pred += weights[d] * x[d];
        float err = pred - y;
        for (int d = 0; d < DIM; d++) grad[d] += 2.0f * err * x[d] / (float)got;
        grad[DIM] += err * err / (float)got; /* the loss rides along */
      }
      s = ddplug_allreduce(ctx, grad, grad, DIM + 1, DDPLUG_FLOAT32, DDPLUG_OP_AVG, NULL);
      for (int d = 0; d < DIM; d++) weights[d] -= LR * grad[d];
      loss_sum += grad[DIM];
    }
    if (!s) {
      ddplug_audit_report report = DDPLUG_AUDIT_REPORT_INIT;
      s = ddplug_audit_finish(audit, &report, DDPLUG_TIMEOUT_DEFAULT);
      if (w.rank == 0 && report.verdict != DDPLUG_AUDIT_SKIPPED)
        printf("%s\n", report.summary);
    }
    ddplug_audit_free(audit);
    if (!s && w.rank == 0)
      printf("epoch %d: %lld steps per rank, mean loss %.6f\n", epoch, (long long)steps,
             loss_sum / (double)steps);
  }
  ddplug_sampler_free(sampler);
  if (s) {
    int rc = die("training", s);
    ddplug_close(ctx);
    return rc;
  }
  double secs = now_s() - t0;
  float lo[DIM], hi[DIM];
  s = ddplug_allreduce(ctx, weights, lo, DIM, DDPLUG_FLOAT32, DDPLUG_OP_MIN, NULL);
  if (!s) s = ddplug_allreduce(ctx, weights, hi, DIM, DDPLUG_FLOAT32, DDPLUG_OP_MAX, NULL);
  if (s) return die("checking the weights", s);
  int same = memcmp(lo, hi, sizeof lo) == 0;
  if (w.rank == 0) {
    printf("%.0f samples/s over %d ranks; weights identical on every rank: %s; w[15] = %.3f "
           "(true 1.000)\n",
           (double)(EPOCHS * steps * BATCH * w.world_size) / secs, w.world_size,
           same ? "yes" : "NO", weights[DIM - 1]);
  }
  s = ddplug_close(ctx);
  if (s) return die("leaving the run", s);
  return same ? 0 : 1;
}
