/* sampler.c — the plugin's own sampler slots, through the
 * context-bound sampler (ddplug_context_sampler_new): every rank's share of
 * an epoch has the same length; together they cover the data with exactly
 * the padding and dropping the sampler declares; the order is the same when
 * an epoch is repeated and changes with set_epoch when shuffling; seek
 * resumes the uninterrupted order. For the distributed and bucket kinds (a
 * kind the plugin refuses with UNSUPPORTED is skipped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define N_SAMPLES 1003
#define BATCH 4

#define SAMPLER_SLOTS                                                                      \
  (CF_BIT(sampler_create) | CF_BIT(sampler_set_epoch) | CF_BIT(sampler_next) |             \
   CF_BIT(sampler_seek) | CF_BIT(sampler_length) | CF_BIT(sampler_destroy) |               \
   CF_BIT(sampler_declared))

/* A dtype the plugin can allgather indices (< 2^24) with. */
static int index_dtype(const ddplug_plugin_info *in) {
  static const int pref[] = {DDPLUG_INT64, DDPLUG_INT32, DDPLUG_FLOAT64, DDPLUG_FLOAT32};
  for (size_t i = 0; i < sizeof pref / sizeof pref[0]; i++)
    if (in->dtype_mask & DDPLUG_DTYPE_BIT(pref[i])) return pref[i];
  return 0;
}

/* Gather n int64 values from every rank into all[world * n]. */
static int gather(cf_rank *r, ddplug_context *ctx, const int64_t *mine, uint64_t n, int64_t *all) {
  int dt = index_dtype(&r->plan->info);
  size_t es = ddplug_dtype_size(dt);
  char *send = malloc(n * es + 1), *recv = malloc(n * es * (size_t)r->world + 1);
  if (!send || !recv) {
    free(send);
    free(recv);
    return DDPLUG_E_NO_MEMORY;
  }
  for (uint64_t i = 0; i < n; i++) cf_put(dt, send, i, (double)mine[i]);
  int s = ddplug_allgather(ctx, send, recv, n, dt, NULL);
  for (uint64_t i = 0; s == DDPLUG_OK && i < n * (uint64_t)r->world; i++)
    all[i] = (int64_t)cf_get(dt, recv, i);
  free(send);
  free(recv);
  return s;
}

/* One epoch from the current position: up to cap indices into out. */
static int drain(ddplug_sampler *s, int kind, int64_t *out, uint64_t cap, uint64_t *got,
                 char *why, size_t wcap) {
  *got = 0;
  for (;;) {
    uint64_t n = 0, room = cap - *got;
    int st = ddplug_sampler_next(s, out + *got, room < 64 ? room : 64, &n);
    if (st) {
      snprintf(why, wcap, "sampler_next: %s: %s", ddplug_status_name(st), ddplug_last_error());
      return st;
    }
    if (n == 0) return DDPLUG_OK;
    if (kind == DDPLUG_SAMPLER_BUCKET && n != BATCH) {
      snprintf(why, wcap, "the bucket sampler delivered a batch of %llu, expected %d",
               (unsigned long long)n, BATCH);
      return -1;
    }
    *got += n;
    if (*got == cap) {
      snprintf(why, wcap, "the sampler delivered more than %llu indices in one epoch",
               (unsigned long long)cap);
      return -1;
    }
  }
}

static void check_kind(cf_rank *r, ddplug_context *ctx, int kind, int *dead) {
  const char *name = kind == DDPLUG_SAMPLER_DISTRIBUTED ? "distributed" : "bucket";
  char id[64], title[160], why[1024] = "";
  snprintf(id, sizeof id, "sampler.%s", name);
  snprintf(title, sizeof title,
           "sampler (%s): equal shares cover the data as declared; epochs, seek", name);
  int64_t *lengths = malloc(N_SAMPLES * sizeof *lengths);
  for (int i = 0; i < N_SAMPLES; i++) lengths[i] = 1 + (i * 37) % 200;
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = kind;
  d.shuffle = 1;
  d.seed = 7;
  d.num_samples = N_SAMPLES;
  d.stream = kind == DDPLUG_SAMPLER_DISTRIBUTED ? "conformance-distributed" : "conformance-bucket";
  if (kind == DDPLUG_SAMPLER_BUCKET) {
    d.lengths = lengths;
    d.num_buckets = 4;
    d.batch_size = BATCH;
  }
  ddplug_sampler *s = NULL;
  int st = ddplug_context_sampler_new(ctx, &d, &s);
  free(lengths);
  if (st == DDPLUG_E_UNSUPPORTED) {
    cf_report(r, id, CF_BIT(sampler_create), CF_SKIP, title, "the plugin refuses this kind: %s",
              ddplug_last_error());
    return;
  }
  if (st) {
    cf_report(r, id, CF_BIT(sampler_create), CF_FAIL, title, "sampler_create: %s: %s",
              ddplug_status_name(st), ddplug_last_error());
    return;
  }
  uint64_t cap = 4 * N_SAMPLES, len = 0, got = 0, got2 = 0, got3 = 0;
  int64_t *e0 = malloc(cap * sizeof *e0), *again = malloc(cap * sizeof *again);
  int64_t *e1 = malloc(cap * sizeof *e1), *tail = malloc(cap * sizeof *tail);
  int bad = 0;
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  st = ddplug_sampler_info_get(s, &info);
  if (!st && !info.from_plugin) {
    snprintf(why, sizeof why, "the runtime's default sampler served, not the plugin's slots");
    bad = 1;
  }
  if (!st && !bad) st = ddplug_sampler_set_epoch(s, 0);
  if (!st && !bad) st = ddplug_sampler_length(s, &len);
  if (!st && !bad) st = drain(s, kind, e0, cap, &got, why, sizeof why);
  if (!st && !bad) st = ddplug_sampler_info_get(s, &info);
  uint64_t per = kind == DDPLUG_SAMPLER_BUCKET ? BATCH : 1;
  if (!st && !bad && got != len * per) {
    snprintf(why, sizeof why, "sampler_length says %llu %s, one epoch delivered %llu indices",
             (unsigned long long)len, kind == DDPLUG_SAMPLER_BUCKET ? "batches" : "indices",
             (unsigned long long)got);
    bad = 1;
  }
  /* Lengths agree across ranks; the shares cover [0, N) as declared. */
  int64_t *lens = calloc((size_t)r->world, sizeof *lens);
  int64_t mylen = (int64_t)got;
  if (!st && !bad) {
    st = gather(r, ctx, &mylen, 1, lens);
    if (st) {
      snprintf(why, sizeof why, "allgather of the lengths: %s: %s", ddplug_status_name(st),
               cf_error(ctx));
      *dead = 1;
    }
  }
  for (int k = 0; !st && !bad && k < r->world; k++)
    if (lens[k] != mylen) {
      snprintf(why, sizeof why, "rank %d's share has %lld indices, rank %d's %lld: every rank "
               "must get the same number (or the ranks fall out of step)", r->rank,
               (long long)mylen, k, (long long)lens[k]);
      bad = 1;
    }
  if (!st && !bad) {
    int64_t *all = malloc((size_t)got * (size_t)r->world * sizeof *all + 8);
    st = gather(r, ctx, e0, got, all);
    if (st) {
      snprintf(why, sizeof why, "allgather of the indices: %s: %s", ddplug_status_name(st),
               cf_error(ctx));
      *dead = 1;
    } else {
      char *seen = calloc(N_SAMPLES, 1);
      uint64_t distinct = 0, total = got * (uint64_t)r->world;
      for (uint64_t i = 0; i < total && !bad; i++) {
        if (all[i] < 0 || all[i] >= N_SAMPLES) {
          snprintf(why, sizeof why, "index %lld is outside [0, %d)", (long long)all[i], N_SAMPLES);
          bad = 1;
        } else if (!seen[all[i]]++) {
          distinct++;
        }
      }
      uint64_t repeats = total - distinct, holes = N_SAMPLES - distinct;
      if (!bad && (repeats != info.padded || holes != info.dropped)) {
        snprintf(why, sizeof why, "one epoch repeats %llu and leaves out %llu samples, the "
                 "sampler declares padding %llu and dropping %llu (sampler_declared must say "
                 "exactly what it does)", (unsigned long long)repeats, (unsigned long long)holes,
                 (unsigned long long)info.padded, (unsigned long long)info.dropped);
        bad = 1;
      }
      free(seen);
    }
    free(all);
  }
  /* The same epoch again: the same order. The next epoch: another order. */
  if (!st && !bad) st = ddplug_sampler_set_epoch(s, 0);
  if (!st && !bad) st = drain(s, kind, again, cap, &got2, why, sizeof why);
  if (!st && !bad && (got2 != got || memcmp(again, e0, got * sizeof *e0))) {
    snprintf(why, sizeof why, "epoch 0 delivered twice gave different orders: a sampler must "
             "be deterministic (seed and epoch)");
    bad = 1;
  }
  if (!st && !bad) st = ddplug_sampler_set_epoch(s, 1);
  if (!st && !bad) st = drain(s, kind, e1, cap, &got2, why, sizeof why);
  if (!st && !bad && got2 == got && !memcmp(e1, e0, got * sizeof *e0)) {
    snprintf(why, sizeof why, "epochs 0 and 1 have the same order although shuffle is on: "
             "set_epoch must change the order");
    bad = 1;
  }
  /* seek(k): the rest of epoch 1 from position k. */
  uint64_t k = len / 3;
  if (!st && !bad) st = ddplug_sampler_set_epoch(s, 1);
  if (!st && !bad) st = ddplug_sampler_seek(s, k);
  if (!st && !bad) st = drain(s, kind, tail, cap, &got3, why, sizeof why);
  if (!st && !bad && (got3 != got2 - k * per || memcmp(tail, e1 + k * per, got3 * sizeof *tail))) {
    snprintf(why, sizeof why, "after seek(%llu) the sampler delivered %llu indices that are not "
             "the rest of the epoch's order (%llu expected)", (unsigned long long)k,
             (unsigned long long)got3, (unsigned long long)(got2 - k * per));
    bad = 1;
  }
  if (st > 0 && !*why)
    snprintf(why, sizeof why, "%s: %s", ddplug_status_name(st), ddplug_last_error());
  cf_report(r, id, SAMPLER_SLOTS, st || bad ? CF_FAIL : CF_PASS, title, "%s", why);
  ddplug_sampler_free(s);
  free(lens);
  free(e0);
  free(again);
  free(e1);
  free(tail);
}

void cf_sampler_rank(cf_rank *r) {
  const ddplug_plugin_info *in = &r->plan->info;
  if (!in->has_sampler) {
    cf_report(r, "sampler.distributed", 0, CF_SKIP, "sampler slots",
              "the plugin has no sampler slots (the runtime's samplers serve)");
    return;
  }
  if (!(in->caps & DDPLUG_CAP_HOST_MEMORY) || !index_dtype(in)) {
    cf_report(r, "sampler.distributed", 0, CF_SKIP, "sampler slots",
              "checking the shares needs an allgather of host buffers of int64, int32, "
              "float64 or float32");
    return;
  }
  ddplug_context *ctx;
  int s = cf_open(r, NULL, 60, NULL, &ctx);
  if (s) {
    cf_report(r, "sampler.open", CF_BIT(group_create), CF_FAIL, "the scenario's group is created",
              "%s: %s", ddplug_status_name(s), ddplug_last_error());
    return;
  }
  int dead = 0;
  check_kind(r, ctx, DDPLUG_SAMPLER_DISTRIBUTED, &dead);
  if (!dead) check_kind(r, ctx, DDPLUG_SAMPLER_BUCKET, &dead);
  ddplug_close(ctx);
}
