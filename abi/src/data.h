/*
 * data.h — internal declarations of the data-split layer (issue 4):
 *   sampler_feistel.c      keyed bijection of [0, N) (Feistel + cycle walking)
 *   sampler_distributed.c  the default distributed index sampler
 *   sampler_bucket.c       the default length-bucketed batch sampler
 *   sampler_api.c          ddplug_sampler_*: validation, dispatch to the
 *                          defaults or a plugin's sampler slots, audit feed
 *   split_owner.c          per-stream split ownership (claims, forced owners,
 *                          agreement across ranks)
 *   audit_diagnose.c       the verdict and texts from gathered statistics
 *   audit_run.c            ddplug_audit_*: recording and the collective finish
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_DATA_H
#define DDPLUG_DATA_H

#include <stdint.h>

#include "internal.h"

/* ---- the permutation (sampler_feistel.c) --------------------------------- */

#define DDPLUG__FEISTEL_ROUNDS 4

/* A keyed bijection pi of [0, n). Plain data: copy freely. */
typedef struct ddplug__feistel {
  uint64_t n;
  uint32_t bits_hi, bits_lo; /* widths of the left and right halves */
  uint32_t mask_hi, mask_lo;
  uint32_t key[DDPLUG__FEISTEL_ROUNDS];
} ddplug__feistel;

/* Derive the permutation of [0, n) for (seed, epoch, salt). O(1), never
 * fails (returns DDPLUG_OK); n may be 0 or 1. */
int ddplug__feistel_init(ddplug__feistel *f, uint64_t n, uint64_t seed,
                         uint64_t epoch, uint64_t salt);
/* pi(i) for i < n. */
uint64_t ddplug__feistel_apply(const ddplug__feistel *f, uint64_t i);
/* out[t] = pi(start + t * stride) for t < count; every input must be < n. */
void ddplug__feistel_map(const ddplug__feistel *f, uint64_t start,
                         uint64_t stride, uint64_t count, int64_t *out);

/* Salts that keep the permutations of one (seed, epoch) independent. */
#define DDPLUG__SALT_DISTRIBUTED 0x64697374ull /* "dist" */
#define DDPLUG__SALT_BATCH_ORDER 0x62617463ull /* "batc" */
#define DDPLUG__SALT_BUCKET 0x6275636bull      /* "buck" + bucket number */
#define DDPLUG__SALT_AUDIT 0x61756469ull       /* "audi" */

/* ---- default samplers (sampler_distributed.c, sampler_bucket.c) ---------- */

/* Both defaults implement the plugin's sampler slots (plugin.h) with the same
 * contracts, so sampler_api.c drives a default and a plugin-supplied sampler
 * through one table. `create` validates desc itself (a copied, size-checked
 * desc; kind already matched) and sets the last error on failure. */
typedef struct ddplug__sampler_ops {
  int (*create)(const ddplug_sampler_desc *desc, ddplug_plugin_sampler **out);
  int (*set_epoch)(ddplug_plugin_sampler *s, uint64_t epoch);
  int (*next)(ddplug_plugin_sampler *s, int64_t *out, uint64_t cap,
              uint64_t *n);
  int (*seek)(ddplug_plugin_sampler *s, uint64_t position);
  int (*length)(ddplug_plugin_sampler *s, uint64_t *length);
  void (*destroy)(ddplug_plugin_sampler *s);
  /* What the default declares about one epoch across all ranks: deliveries
   * that repeat a sample to pad ranks to equal length, and samples that
   * drop_last leaves out. */
  void (*declared)(ddplug_plugin_sampler *s, uint64_t *padded,
                   uint64_t *dropped);
} ddplug__sampler_ops;

extern const ddplug__sampler_ops ddplug__distributed_ops;
extern const ddplug__sampler_ops ddplug__bucket_ops;

/* Samples per rank per epoch of the distributed sampler: ceil(n/world)
 * (padded) or floor(n/world) (drop_last), as torch's DistributedSampler. */
uint64_t ddplug__distributed_per_rank(uint64_t n, uint64_t world,
                                      int drop_last);

/* ---- the public handle (sampler_api.c, sampler_context.c) ---------------- */

#define DDPLUG__STREAM_MAX 63

struct ddplug_sampler {
  ddplug_sampler_desc desc; /* validated copy; lengths/boundaries cleared */
  char stream[DDPLUG__STREAM_MAX + 1];
  ddplug_plugin_sampler *impl;
  /* the slots driving impl: a default's, or the plugin's */
  int (*set_epoch)(ddplug_plugin_sampler *s, uint64_t epoch);
  int (*next)(ddplug_plugin_sampler *s, int64_t *out, uint64_t cap,
              uint64_t *n);
  int (*seek)(ddplug_plugin_sampler *s, uint64_t position);
  int (*length)(ddplug_plugin_sampler *s, uint64_t *length);
  void (*destroy)(ddplug_plugin_sampler *s);
  void (*declared)(ddplug_plugin_sampler *s, uint64_t *padded,
                   uint64_t *dropped); /* NULL for a plugin's sampler */
  uint64_t len, epoch, pos;
  ddplug_context *ctx; /* context-bound samplers only */
};

/* 0 if stream is a valid stream name (1..63 of [A-Za-z0-9_.-]); else
 * INVALID_ARGUMENT with `what` as the message's head. */
int ddplug__stream_name_check(const char *stream, const char *what);
/* Validate *in and copy it into *d (defaults filled: stream "train", world
 * 1). Errors name `what`, the stream and the field. */
int ddplug__sampler_desc_copy(const ddplug_sampler_desc *in,
                              ddplug_sampler_desc *d, const char *what);
int ddplug__sampler_alloc(const ddplug_sampler_desc *d, ddplug_sampler **out);
/* Serve s with the default sampler of d->kind. */
int ddplug__sampler_use_default(ddplug_sampler *s,
                                const ddplug_sampler_desc *d);
/* Padding and dropping the sampler declares for one epoch (0 for plugins). */
void ddplug__sampler_declared(const ddplug_sampler *s, uint64_t *padded,
                              uint64_t *dropped);

/* Context binding (sampler_context.c); no-ops for a standalone sampler.
 * epoch_hook runs after set_epoch; feed_hook after next delivered n indices
 * starting at position `before`; release_hook before the sampler is freed. */
void ddplug__sampler_epoch_hook(ddplug_sampler *s);
int ddplug__sampler_feed_hook(ddplug_sampler *s, uint64_t before,
                              const int64_t *idx, uint64_t n);
void ddplug__sampler_release_hook(ddplug_sampler *s);

#endif /* DDPLUG_DATA_H */
