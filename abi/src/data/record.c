/* audit_record.c — what one rank records for an audit: step and delivery
 * counts, an order fingerprint, and the bitmap of tracked samples seen
 * (exact: all N; sampled: the M samples with pi(i) < M for a fixed keyed
 * permutation pi of [0, N), slot pi(i)).
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
  a->opts.struct_size = sizeof a->opts;
  a->opts.abi_version = DDPLUG_ABI_VERSION;
  if (opts) {
    a->opts.shuffle = opts->shuffle;
    a->opts.allowed_padding = opts->allowed_padding;
    a->opts.allowed_missing = opts->allowed_missing;
  }
  a->exact = n <= exact_max;
  a->tracked = a->exact ? n : exact_max;
  if (!a->exact)
    ddplug__feistel_init(&a->subset, n, SUBSET_SEED, 0, DDPLUG__SALT_AUDIT);
  if (scope == DDPLUG__SCOPE_FULL) {
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
    fp = (fp ^ v) * 0x100000001b3ull;
    fp ^= fp >> 29;
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
    a->bits[slot >> 6] |= 1ull << (slot & 63);
  }
  a->fingerprint = fp;
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
  uint64_t distinct = 0;
  for (uint64_t w = 0; w < a->words; w++)
    distinct += (uint64_t)__builtin_popcountll(a->bits[w]);
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
  s->coverage_ok = a->bits != NULL;
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
  ddplug__free(a);
}
