/* record.c — what one rank records for an audit: step and delivery counts,
 * an order fingerprint, the bitmap of tracked samples seen (exact: all N;
 * sampled: the M samples with pi(i) < M for a fixed keyed permutation pi of
 * [0, N), slot pi(i)), the samples it delivered twice itself (a few as
 * examples), and the declared-dropped set.
 * SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "data/data.h"

/* Fixed key of the sampled-mode subset: the same subset on every rank. */
#define SUBSET_SEED 0x6175646974737562ull /* "auditsub" */

int ddplug__audit_alloc(const char *stream, uint64_t n, uint64_t epoch,
                        const ddplug_audit_options *opts, int scope,
                        uint64_t exact_max, int rank, int world,
                        ddplug_audit **out) {
  ddplug_audit *a = ddplug__calloc(1, sizeof *a);
  if (!a) return ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory");
  ddplug__strlcpy(a->stream, stream, sizeof a->stream);
  a->n = n;
  a->epoch = epoch;
  a->scope = scope;
  a->rank = rank;
  a->world = world;
  a->exact_max = exact_max;
  a->opts.struct_size = sizeof a->opts;
  a->opts.abi_version = DDPLUG_ABI_VERSION;
  if (opts) {
    a->opts.shuffle = opts->shuffle;
    a->opts.evaluation = opts->evaluation;
    a->opts.allowed_padding = opts->allowed_padding;
    a->opts.allowed_missing = opts->allowed_missing;
    a->opts.local_dropped = opts->local_dropped;
    a->opts.by_id = opts->by_id;
    a->opts.steps_only = opts->steps_only;
  }
  a->exact = n <= exact_max;
  a->tracked = a->exact ? n : exact_max;
  if (!a->exact)
    ddplug__feistel_init(&a->subset, n, SUBSET_SEED, 0, DDPLUG__SALT_AUDIT);
  if (scope == DDPLUG__SCOPE_FULL && !a->opts.by_id && !a->opts.steps_only) {
    a->words = (a->tracked + 63) / 64;
    a->bits = ddplug__calloc((size_t)(a->words ? a->words : 1), sizeof *a->bits);
    if (!a->bits) {
      ddplug__free(a);
      return ddplug__err(DDPLUG_E_NO_MEMORY,
                         "audit of stream '%s': out of memory for a bitmap of "
                         "%llu samples (lower data_split.audit_exact_max)",
                         stream, (unsigned long long)a->tracked);
    }
  }
  a->fingerprint = 0xcbf29ce484222325ull;
  *out = a;
  return DDPLUG_OK;
}

void ddplug__audit_add(ddplug_audit *a, const int64_t *idx, uint64_t n,
                       uint64_t steps) {
  a->steps += steps;
  a->deliveries += n;
  uint64_t fp = a->fingerprint;
  for (uint64_t k = 0; k < n; k++) {
    uint64_t v = (uint64_t)idx[k];
    fp = ddplug__fp_step(fp, v);
    if (idx[k] < 0 || v >= a->n) {
      a->out_of_range++;
      continue;
    }
    if (!a->bits) continue;
    uint64_t slot = v;
    if (!a->exact) {
      slot = ddplug__feistel_apply(&a->subset, v);
      if (slot >= a->tracked) continue;
    }
    a->tracked_deliveries++;
    uint64_t *w = &a->bits[slot >> 6], bit = 1ull << (slot & 63);
    if (*w & bit) {
      a->local_repeats++;
      if (a->nlocal_ex < DDPLUG__AUDIT_EXAMPLES) a->local_ex[a->nlocal_ex++] = idx[k];
    }
    *w |= bit;
  }
  a->fingerprint = fp;
}

int ddplug__audit_drop(ddplug_audit *a, const int64_t *idx, uint64_t n) {
  for (uint64_t k = 0; k < n; k++)
    if (idx[k] < 0 || (uint64_t)idx[k] >= a->n)
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "ddplug_audit_declare_dropped: stream '%s': index "
                         "%lld (position %llu) is not a sample of [0, %llu): "
                         "nothing was declared",
                         a->stream, (long long)idx[k], (unsigned long long)k,
                         (unsigned long long)a->n);
  if (!a->bits) return DDPLUG_OK; /* no coverage this epoch: nothing to excuse */
  if (!a->dropped) {
    a->dropped = ddplug__calloc((size_t)a->words, sizeof *a->dropped);
    if (!a->dropped)
      return ddplug__err(DDPLUG_E_NO_MEMORY,
                         "ddplug_audit_declare_dropped: stream '%s': out of "
                         "memory for a bitmap of %llu samples",
                         a->stream, (unsigned long long)a->tracked);
  }
  for (uint64_t k = 0; k < n; k++) {
    uint64_t slot = (uint64_t)idx[k];
    if (!a->exact) {
      slot = ddplug__feistel_apply(&a->subset, slot);
      if (slot >= a->tracked) continue;
    }
    a->dropped[slot >> 6] |= 1ull << (slot & 63);
  }
  return DDPLUG_OK;
}

uint64_t ddplug__audit_stream_hash(const char *stream) {
  return ddplug__hash64(stream, strlen(stream), 0x617564) >> 1;
}

void ddplug__audit_local_stats(const ddplug_audit *a, ddplug__audit_stats *s) {
  memset(s, 0, sizeof *s);
  s->stream_hash = (int64_t)ddplug__audit_stream_hash(a->stream);
  s->epoch = (int64_t)a->epoch;
  s->num_samples = (int64_t)a->n;
  s->scope = a->scope;
  s->steps = (int64_t)a->steps;
  s->deliveries = (int64_t)a->deliveries;
  s->tracked_deliveries = (int64_t)a->tracked_deliveries;
  uint64_t distinct = 0, dropped = 0, dhash = 0;
  for (uint64_t w = 0; w < a->words; w++)
    distinct += (uint64_t)__builtin_popcountll(a->bits[w]);
  if (a->dropped) {
    for (uint64_t w = 0; w < a->words; w++) {
      if (!a->dropped[w]) continue;
      dropped += (uint64_t)__builtin_popcountll(a->dropped[w]);
      dhash = ddplug__fp_step(dhash ^ w, a->dropped[w]);
    }
  }
  s->distinct = (int64_t)distinct;
  s->out_of_range = (int64_t)a->out_of_range;
  /* The same order as the previous epoch with shuffling on: only with
   * enough deliveries that a legitimate reshuffle repeating the order is
   * negligible (8 indices: 1/8! at most). */
  s->order_repeated = a->opts.shuffle && a->has_prev &&
                      a->prev_epoch != a->epoch && a->deliveries >= 8 &&
                      a->prev_fingerprint == a->fingerprint;
  s->epoch_behind = a->opts.shuffle && a->epoch_behind;
  s->shuffle = a->opts.shuffle;
  s->allowed_padding = (int64_t)a->opts.allowed_padding;
  s->allowed_missing = (int64_t)a->opts.allowed_missing;
  s->tracked = (int64_t)a->tracked;
  s->coverage_ok = a->bits != NULL || (a->opts.by_id && a->scope == DDPLUG__SCOPE_FULL);
  s->evaluation = a->opts.evaluation != 0;
  s->by_id = a->opts.by_id != 0;
  s->steps_only = a->opts.steps_only != 0;
  s->local_dropped = (int64_t)a->opts.local_dropped;
  s->dropped_count = (int64_t)dropped;
  s->dropped_hash = (int64_t)(dhash >> 1);
  s->level = (int64_t)a->level;
  if (a->opts.by_id) {
    s->distinct = 0; /* ids.c counts them at the finish */
  } else {
    s->nlocal_examples = a->nlocal_ex;
    for (int k = 0; k < a->nlocal_ex; k++) s->local_examples[k] = a->local_ex[k];
  }
}

/* Take the audit off its stream and remember its order for the next epoch. */
void ddplug__audit_unregister(ddplug_audit *a) {
  if (!a->state) return;
  ddplug__data_lock(a->state);
  ddplug__stream *s = ddplug__data_stream(a->state, a->stream);
  if (s && s->active == a) {
    s->active = NULL;
    if (a->deliveries > 0) {
      s->has_prev = 1;
      s->prev_epoch = a->epoch;
      s->prev_fingerprint = a->fingerprint;
    }
  }
  ddplug__data_unlock(a->state);
}

DDPLUG_API void ddplug_audit_free(ddplug_audit *a) {
  if (!a) return;
  if (!a->finished) ddplug__audit_unregister(a);
  ddplug__free(a->bits);
  ddplug__free(a->dropped);
  ddplug__free(a->ids);
  ddplug__free(a->all);
  ddplug__free(a->text);
  ddplug__free(a);
}
