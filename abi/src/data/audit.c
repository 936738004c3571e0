/* audit.c — ddplug_audit_begin / _record / _record_ids / _declare_dropped /
 * _finish / _free and the report accessors: which epochs are audited
 * (config), registration on the stream (so the context-bound sampler can
 * feed it), and the collective finish through the context's collectives:
 *   1. allgather of every rank's statistics (ddplug__audit_stats), then a
 *      consistency check (same stream, epoch, N, kind and declared set
 *      everywhere, else MISMATCH naming both ranks' values);
 *   2. full scope, indices: allreduce BOR and BAND of the tracked bitmaps as
 *      int64 words, in chunks of 256 KiB, counting union, intersection and
 *      holes; only when repeats exceed the declared padding, a second pass
 *      (allreduce SUM of per-word popcounts, then of per-bit counts of a few
 *      words) finds samples that several ranks delivered;
 *   3. full scope, ids: every rank keeps the largest subset level, then the
 *      sorted ids are compared in rounds over slices of the hash range (at
 *      most 16 MiB per rank and round; ids.c);
 *   4. the diagnosis (diagnose.c), identical on every rank.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/context.h"
#include "data/data.h"

#define CHUNK_WORDS 32768u            /* 256 KiB of bitmap per collective */
#define ROUND_BYTES (16u << 20)       /* ids per rank and round            */

static int scope_for(const ddplug__data_policy *p, uint64_t begun) {
  switch (p->audit_mode) {
    case DDPLUG__AUDIT_EVERY_EPOCH: return DDPLUG__SCOPE_FULL;
    case DDPLUG__AUDIT_FIRST_EPOCH:
      return begun == 0 ? DDPLUG__SCOPE_FULL
             : begun == 1 ? DDPLUG__SCOPE_ORDER : DDPLUG__SCOPE_SKIP;
    default: return DDPLUG__SCOPE_SKIP;
  }
}

DDPLUG_API int ddplug_audit_begin(ddplug_context *ctx, const char *stream,
                                  uint64_t num_samples, uint64_t epoch,
                                  const ddplug_audit_options *opts,
                                  ddplug_audit **out) {
  static const char what[] = "ddplug_audit_begin";
  if (!ctx || !stream || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx, stream and out must not be NULL", what);
  int st = ddplug__stream_name_check(stream, what);
  if (st) return ddplug__ctx_capture_error(ctx, st);
  ddplug_audit_options o;
  memset(&o, 0, sizeof o);
  if (opts) {
    if (opts->struct_size < offsetof(ddplug_audit_options, allowed_padding))
      return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
          "%s: opts struct_size %u is too small (fill it with DDPLUG_AUDIT_OPTIONS_INIT)",
          what, opts->struct_size));
    memcpy(&o, opts, DDPLUG__MIN((size_t)opts->struct_size, sizeof o));
  }
  if (o.by_id && o.steps_only)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "%s: stream '%s': by_id and steps_only exclude each other", what, stream));
  ddplug__data_state *data;
  if ((st = ddplug__ctx_data(ctx, &data))) return ddplug__ctx_capture_error(ctx, st);
  ddplug__data_lock(data);
  ddplug__stream *s = ddplug__data_stream(data, stream);
  ddplug_audit *a = NULL;
  if (!s) {
    st = DDPLUG_E_NO_MEMORY;
  } else if (s->active) {
    st = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                     "%s: an audit of stream '%s' is already open (epoch %llu): "
                     "finish and free it first",
                     what, stream, (unsigned long long)s->active->epoch);
  } else {
    int scope = scope_for(&data->policy, s->audits_begun);
    st = ddplug__audit_alloc(stream, num_samples, epoch, &o, scope,
                             data->policy.exact_max, ctx->world.rank,
                             ctx->world.world_size, &a);
    if (st == DDPLUG_OK) {
      a->ctx = ctx;
      a->state = data;
      a->has_prev = s->has_prev;
      a->prev_epoch = s->prev_epoch;
      a->prev_fingerprint = s->prev_fingerprint;
      s->audits_begun++;
      s->active = a;
    }
  }
  ddplug__data_unlock(data);
  if (st) return ddplug__ctx_capture_error(ctx, st);
  *out = a;
  return DDPLUG_OK;
}

/* The checks record, record_ids and declare_dropped share. */
static int check_open(const ddplug_audit *a, const void *items, uint64_t n,
                      const char *what) {
  if (!a || (n > 0 && !items))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: audit (and the array when n > 0) must not be NULL", what);
  if (a->finished)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: the audit of stream '%s' epoch %llu is finished", what,
                       a->stream, (unsigned long long)a->epoch);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_audit_record(ddplug_audit *a, const int64_t *indices,
                                   uint64_t n) {
  static const char what[] = "ddplug_audit_record";
  int st = check_open(a, indices, n, what);
  if (st) return st;
  if (a->opts.by_id)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: the audit of stream '%s' was begun by id: record "
                       "with ddplug_audit_record_ids",
                       what, a->stream);
  /* the stream's context-bound sampler may feed this audit from another
   * thread: decide who records, and record, under the same lock */
  if (a->state) ddplug__data_lock(a->state);
  int sampler_feeds = a->fed_by_sampler;
  if (!sampler_feeds) {
    a->fed_by_host = 1;
    ddplug__audit_add(a, indices, n, 1);
  }
  if (a->state) ddplug__data_unlock(a->state);
  if (sampler_feeds)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s' is recorded by its context-bound "
                       "sampler (the plugin owns it): recording it here too "
                       "would count every step twice",
                       what, a->stream);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_audit_record_ids(ddplug_audit *a, const uint64_t *ids,
                                       uint64_t n) {
  static const char what[] = "ddplug_audit_record_ids";
  int st = check_open(a, ids, n, what);
  if (st) return st;
  if (!a->opts.by_id)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: the audit of stream '%s' records indices: begin it "
                       "with options.by_id = 1 to record ids",
                       what, a->stream);
  return ddplug__audit_add_ids(a, ids, n, 1);
}

DDPLUG_API int ddplug_audit_declare_dropped(ddplug_audit *a,
                                            const int64_t *indices,
                                            uint64_t n) {
  static const char what[] = "ddplug_audit_declare_dropped";
  int st = check_open(a, indices, n, what);
  if (st) return st;
  if (a->opts.by_id || a->opts.evaluation)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s' is %s: it cannot declare samples "
                       "dropped",
                       what, a->stream,
                       a->opts.by_id ? "audited by id"
                                     : "an evaluation stream (every sample "
                                       "exactly once)");
  if (a->state) ddplug__data_lock(a->state);
  st = ddplug__audit_drop(a, indices, n);
  if (a->state) ddplug__data_unlock(a->state);
  return st;
}

static int run_coll(ddplug_context *ctx, int kind, const void *send, void *recv,
                    uint64_t count, int op, int64_t timeout_ms) {
  ddplug_request *req = NULL;
  int st = kind == DDPLUG_COLL_ALLGATHER
               ? ddplug_iallgather(ctx, send, recv, count, DDPLUG_INT64, NULL, &req)
               : ddplug_iallreduce(ctx, send, recv, count, DDPLUG_INT64, op, NULL, &req);
  if (st) return st;
  st = ddplug_request_wait(req, timeout_ms);
  ddplug_request_free(req);
  return st;
}

/* What an audit is, for the consistency check's message. */
static void describe(const ddplug__audit_stats *x, char *buf, size_t cap) {
  snprintf(buf, cap, "epoch %lld, N = %lld, %s, %s%s%s", (long long)x->epoch,
           (long long)x->num_samples,
           x->scope == DDPLUG__SCOPE_FULL ? "full"
           : x->scope == DDPLUG__SCOPE_ORDER ? "steps and order" : "skipped",
           x->by_id ? "by id" : x->steps_only ? "steps only" : "by index",
           x->evaluation ? ", evaluation" : "",
           x->dropped_count ? ", with declared-dropped samples" : "");
}

/* All ranks must audit the same thing, else the next collectives differ. */
static int check_same(const ddplug_audit *a, const ddplug__audit_stats *all,
                      int world) {
  const ddplug__audit_stats *r0 = &all[0];
  for (int r = 1; r < world; r++) {
    const ddplug__audit_stats *x = &all[r];
    if (x->stream_hash == r0->stream_hash && x->epoch == r0->epoch &&
        x->num_samples == r0->num_samples && x->scope == r0->scope &&
        x->evaluation == r0->evaluation && x->by_id == r0->by_id &&
        x->steps_only == r0->steps_only)
      continue;
    char d0[192], dr[192];
    describe(r0, d0, sizeof d0);
    describe(x, dr, sizeof dr);
    return ddplug__err(DDPLUG_E_MISMATCH,
                       "rank 0 audits %s; rank %d audits %s%s — every rank must "
                       "begin the same audits in the same order",
                       d0, r, x->stream_hash == r0->stream_hash ? "" : "another stream, ",
                       dr);
  }
  for (int r = 1; r < world; r++)
    if (all[r].dropped_count != r0->dropped_count || all[r].dropped_hash != r0->dropped_hash)
      return ddplug__err(DDPLUG_E_MISMATCH,
                         "rank 0 declared %lld dropped samples, rank %d declared "
                         "%lld%s — every rank must declare the same set "
                         "(ddplug_audit_declare_dropped)",
                         (long long)r0->dropped_count, r, (long long)all[r].dropped_count,
                         all[r].dropped_count == r0->dropped_count ? " (a different set)" : "");
  return DDPLUG_OK;
}

static uint64_t valid_mask(const ddplug_audit *a, uint64_t w) {
  return w * 64 + 64 <= a->tracked ? ~0ull : (1ull << (a->tracked - w * 64)) - 1;
}

/* Union and intersection of every rank's bitmap, chunk by chunk. */
static int coverage(ddplug_audit *a, int64_t timeout_ms, ddplug__audit_coverage *cov) {
  uint64_t chunk = DDPLUG__MIN((uint64_t)CHUNK_WORDS, a->words ? a->words : 1);
  uint64_t *ors = ddplug__malloc(sizeof *ors * chunk);
  uint64_t *ands = ddplug__malloc(sizeof *ands * chunk);
  int st = ors && ands ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory");
  for (uint64_t w0 = 0; st == DDPLUG_OK && w0 < a->words; w0 += chunk) {
    uint64_t cnt = DDPLUG__MIN(chunk, a->words - w0);
    st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, a->bits + w0, ors, cnt, DDPLUG_OP_BOR, timeout_ms);
    if (st == DDPLUG_OK)
      st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, a->bits + w0, ands, cnt, DDPLUG_OP_BAND, timeout_ms);
    for (uint64_t k = 0; st == DDPLUG_OK && k < cnt; k++) {
      uint64_t w = w0 + k, valid = valid_mask(a, w);
      uint64_t dropped = a->dropped ? a->dropped[w] : 0;
      cov->covered += (uint64_t)__builtin_popcountll(ors[k] & valid);
      cov->common += (uint64_t)__builtin_popcountll(ands[k] & valid);
      uint64_t holes = ~ors[k] & valid & ~dropped;
      cov->holes += (uint64_t)__builtin_popcountll(holes);
      cov->dropped_holes += (uint64_t)__builtin_popcountll(~ors[k] & valid & dropped);
      while (a->exact && holes && cov->nmissing_ex < DDPLUG__AUDIT_EXAMPLES) {
        cov->missing_ex[cov->nmissing_ex++] = w * 64 + (uint64_t)__builtin_ctzll(holes);
        holes &= holes - 1;
      }
    }
  }
  ddplug__free(ors);
  ddplug__free(ands);
  return st;
}

/* Samples that more than one rank delivered (exact mode): per-word counts
 * of set bits summed over the ranks exceed the union's where one is; the
 * per-bit counts of the first such words name them. Only run when repeats
 * exceed the declared padding. */
static int cross_examples(ddplug_audit *a, int64_t timeout_ms, ddplug__audit_coverage *cov) {
  enum { WORDS = DDPLUG__AUDIT_EXAMPLES };
  uint64_t chunk = DDPLUG__MIN((uint64_t)CHUNK_WORDS / 2, a->words ? a->words : 1);
  int64_t *mine = ddplug__malloc(sizeof *mine * chunk * 2);
  int64_t *sums = ddplug__malloc(sizeof *sums * chunk * 2);
  int64_t *bitc = ddplug__malloc(sizeof *bitc * WORDS * 64 * 2);
  int st = mine && sums && bitc ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory");
  uint64_t cand[WORDS];
  int ncand = 0;
  for (uint64_t w0 = 0; st == DDPLUG_OK && w0 < a->words && ncand < WORDS; w0 += chunk) {
    uint64_t cnt = DDPLUG__MIN(chunk, a->words - w0);
    /* mine[0..cnt): my per-word popcounts, summed over the ranks into sums;
     * mine[chunk..): the union of the words (the BOR again: the coverage
     * pass does not keep it) */
    for (uint64_t k = 0; k < cnt; k++) mine[k] = __builtin_popcountll(a->bits[w0 + k] & valid_mask(a, w0 + k));
    st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, mine, sums, cnt, DDPLUG_OP_SUM, timeout_ms);
    if (st == DDPLUG_OK)
      st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, a->bits + w0, mine + chunk, cnt, DDPLUG_OP_BOR, timeout_ms);
    for (uint64_t k = 0; st == DDPLUG_OK && k < cnt && ncand < WORDS; k++) {
      uint64_t u = (uint64_t)mine[chunk + k] & valid_mask(a, w0 + k);
      if (sums[k] > __builtin_popcountll(u)) cand[ncand++] = w0 + k;
    }
  }
  if (st == DDPLUG_OK && ncand > 0) {
    /* every rank found the same candidates (from the same sums) */
    memset(bitc, 0, sizeof *bitc * WORDS * 64);
    for (int c = 0; c < ncand; c++)
      for (int b = 0; b < 64; b++)
        bitc[c * 64 + b] = (int64_t)(a->bits[cand[c]] >> b & 1);
    st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, bitc, bitc + WORDS * 64,
                  (uint64_t)ncand * 64, DDPLUG_OP_SUM, timeout_ms);
    for (int c = 0; st == DDPLUG_OK && c < ncand; c++)
      for (int b = 0; b < 64 && cov->nrepeat_ex < DDPLUG__AUDIT_EXAMPLES; b++)
        if (bitc[WORDS * 64 + c * 64 + b] > 1) cov->repeat_ex[cov->nrepeat_ex++] = (int64_t)(cand[c] * 64 + (uint64_t)b);
  }
  ddplug__free(mine);
  ddplug__free(sums);
  ddplug__free(bitc);
  return st;
}

static int cmp_i64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

/* The repeat examples: cross-rank ones found above and every rank's own. */
static void merge_local_examples(const ddplug__audit_stats *all, int world,
                                 ddplug__audit_coverage *cov) {
  for (int r = 0; r < world; r++)
    for (int64_t k = 0; k < all[r].nlocal_examples && k < DDPLUG__AUDIT_EXAMPLES; k++) {
      ddplug__audit_add_example(cov, all[r].local_examples[k]);
    }
  qsort(cov->repeat_ex, (size_t)cov->nrepeat_ex, sizeof cov->repeat_ex[0], cmp_i64);
}

/* Lower bound of slice k of R over the 64-bit hash range. */
static uint64_t slice_lo(uint64_t k, uint64_t rounds) {
  if (k == 0) return 0;
  unsigned __int128 v = ((unsigned __int128)k << 64) / rounds;
  return (uint64_t)v;
}

static uint64_t lower_bound(const uint64_t *v, uint64_t n, uint64_t x) {
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* By id: the same subset level everywhere, each rank's distinct ids, then
 * rounds comparing every rank's ids in one slice of the hash range. */
static int id_coverage(ddplug_audit *a, const ddplug__audit_stats *all, int world,
                       int64_t timeout_ms, ddplug__audit_coverage *cov) {
  uint32_t level = 0;
  for (int r = 0; r < world; r++) level = DDPLUG__MAX(level, (uint32_t)all[r].level);
  ddplug__audit_ids_level(a, level);
  ddplug__audit_ids_sort(a);
  enum { REC = 3 + DDPLUG__AUDIT_EXAMPLES };
  int64_t mine[REC];
  memset(mine, 0, sizeof mine);
  mine[0] = (int64_t)a->nids;
  mine[1] = (int64_t)a->local_repeats;
  mine[2] = a->nlocal_ex;
  for (int k = 0; k < a->nlocal_ex; k++) mine[3 + k] = a->local_ex[k];
  int64_t *recs = ddplug__calloc((size_t)world * REC, sizeof *recs);
  uint64_t *counts = ddplug__calloc((size_t)world, sizeof *counts);
  const uint64_t **parts = ddplug__calloc((size_t)world, sizeof *parts);
  int64_t *lens = ddplug__calloc((size_t)world * 2, sizeof *lens);
  uint64_t *buf = NULL;
  int st = recs && counts && parts && lens ? DDPLUG_OK
                                           : ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory");
  if (st == DDPLUG_OK)
    st = run_coll(a->ctx, DDPLUG_COLL_ALLGATHER, mine, recs, REC, 0, timeout_ms);
  uint64_t total = 0;
  for (int r = 0; st == DDPLUG_OK && r < world; r++) {
    const int64_t *x = &recs[(size_t)r * REC];
    total += (uint64_t)x[0];
    cov->id_duplicates += (uint64_t)x[1];
    for (int64_t k = 0; k < x[2] && k < DDPLUG__AUDIT_EXAMPLES; k++)
      ddplug__audit_add_example(cov, x[3 + k]);
  }
  uint64_t rounds = total * 8 / ROUND_BYTES + 1;
  for (uint64_t k = 0; st == DDPLUG_OK && k < rounds; k++) {
    uint64_t lo = lower_bound(a->ids, a->nids, slice_lo(k, rounds));
    uint64_t hi = k + 1 == rounds ? a->nids : lower_bound(a->ids, a->nids, slice_lo(k + 1, rounds));
    int64_t n = (int64_t)(hi - lo);
    st = run_coll(a->ctx, DDPLUG_COLL_ALLGATHER, &n, lens, 1, 0, timeout_ms);
    int64_t most = 0;
    for (int r = 0; st == DDPLUG_OK && r < world; r++) most = DDPLUG__MAX(most, lens[r]);
    if (st || most == 0) continue;
    uint64_t *send = ddplug__calloc((size_t)most, sizeof *send);
    ddplug__free(buf);
    buf = ddplug__malloc(sizeof *buf * (size_t)most * (size_t)world);
    if (!send || !buf) {
      ddplug__free(send);
      st = ddplug__err(DDPLUG_E_NO_MEMORY, "audit by id: out of memory for %lld ids",
                       (long long)most * world);
      break;
    }
    if (n) memcpy(send, a->ids + lo, sizeof *send * (size_t)n);
    st = run_coll(a->ctx, DDPLUG_COLL_ALLGATHER, send, buf, (uint64_t)most, 0, timeout_ms);
    ddplug__free(send);
    for (int r = 0; r < world; r++) {
      parts[r] = buf + (size_t)r * (size_t)most;
      counts[r] = (uint64_t)lens[r];
    }
    if (st == DDPLUG_OK) ddplug__audit_ids_merge(parts, counts, world, cov);
  }
  qsort(cov->repeat_ex, (size_t)cov->nrepeat_ex, sizeof cov->repeat_ex[0], cmp_i64);
  ddplug__free(buf);
  ddplug__free(recs);
  ddplug__free(counts);
  ddplug__free(parts);
  ddplug__free(lens);
  return st;
}

static int plugin_can_cover(ddplug_context *ctx, int by_id) {
  const ddplug_plugin *t = &ctx->plugin->table;
  if (!(t->dtype_mask & DDPLUG_DTYPE_BIT(DDPLUG_INT64))) return 0;
  return by_id || ((t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BOR)) &&
                   (t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BAND)) &&
                   (t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_SUM)));
}

/* Whether the repeats exceed what was declared (before the slack of the
 * sampled mode: a superset of the violation, so the examples pass runs
 * whenever the diagnosis may need it). */
static int repeats_undeclared(const ddplug_audit *a, const ddplug__audit_stats *all,
                              int world, uint64_t covered) {
  uint64_t td = 0, pad = 0;
  int eval = 0;
  for (int r = 0; r < world; r++) {
    td += (uint64_t)all[r].tracked_deliveries;
    pad = DDPLUG__MAX(pad, (uint64_t)all[r].allowed_padding);
    eval |= all[r].evaluation != 0;
  }
  uint64_t repeats = td > covered ? td - covered : 0;
  if (eval) return repeats > 0;
  double scale = a->tracked ? (double)a->n / (double)a->tracked : 1.0;
  return (double)repeats > (double)pad / scale;
}

static void derived_emit(void *user, const int64_t *idx, uint64_t n) {
  ddplug__audit_add(user, idx, n, 0);
}

/* What the stream's elastic sampler knows beyond this rank's records: the
 * deliveries it derives (a lost rank's committed steps, a resumed state's
 * committed part), what its last world declares, and the membership
 * history. Every rank takes the same decision: all were fed by their
 * sampler, which shares the epoch's plan. */
static void take_derived(ddplug_audit *a) {
  if (!a->state) return;
  ddplug__data_lock(a->state);
  ddplug__stream *st = ddplug__data_stream(a->state, a->stream);
  ddplug__deal *d = st && st->sampler ? ddplug__sampler_deal(st->sampler) : NULL;
  if (d && a->fed_by_sampler && d->epoch == a->epoch) {
    ddplug__deal_derived(d, derived_emit, a);
    uint64_t padded = 0, dropped = 0;
    ddplug__deal_declared(d, &padded, &dropped);
    a->opts.allowed_padding = DDPLUG__MAX(a->opts.allowed_padding, padded);
    a->opts.allowed_missing = DDPLUG__MAX(a->opts.allowed_missing, dropped);
    ddplug__strlcpy(a->history, d->history, sizeof a->history);
  }
  ddplug__data_unlock(a->state);
}

/* The membership history after the summary line and the text. */
static void add_history(ddplug_audit *a) {
  if (!a->history[0]) return;
  size_t used = strlen(a->report.summary);
  snprintf(a->report.summary + used, sizeof a->report.summary - used, "; membership: %s",
           a->history);
  if (a->text) {
    char *grown = ddplug__asprintf("%smembership: %s\n", a->text, a->history);
    if (grown) {
      ddplug__free(a->text);
      a->text = grown;
    }
  }
}

static void finish_report(ddplug_audit *a, ddplug_audit_report *report,
                          uint32_t size) {
  memcpy(report, &a->report, DDPLUG__MIN((size_t)size, sizeof a->report));
  report->struct_size = size;
}

DDPLUG_API int ddplug_audit_finish(ddplug_audit *a,
                                   ddplug_audit_report *report,
                                   int64_t timeout_ms) {
  if (!a || !report || report->struct_size < offsetof(ddplug_audit_report, missing))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_audit_finish: audit and report must not be NULL "
                       "(fill the report with DDPLUG_AUDIT_REPORT_INIT)");
  if (a->finished)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_audit_finish: the audit of stream '%s' epoch %llu "
                       "is already finished",
                       a->stream, (unsigned long long)a->epoch);
  uint32_t size = report->struct_size;
  a->finished = 1;
  ddplug__audit_unregister(a);
  take_derived(a);
  ddplug_context *ctx = a->ctx;
  ddplug__audit_stats local;
  ddplug__audit_local_stats(a, &local);
  local.coverage_ok = local.coverage_ok && plugin_can_cover(ctx, a->opts.by_id);
  if (a->scope == DDPLUG__SCOPE_SKIP) {
    a->all = ddplug__malloc(sizeof *a->all);
    if (!a->all) return ddplug__ctx_capture_error(
        ctx, ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory"));
    *a->all = local;
    a->nall = 1;
    ddplug__audit_diagnose(a->stream, &local, 1, NULL, &a->report, &a->text);
    add_history(a);
    a->report.world_size = a->world;
    finish_report(a, report, size);
    return DDPLUG_OK;
  }
  int world = a->world;
  ddplug__audit_stats *all = ddplug__calloc((size_t)world, sizeof *all);
  if (!all) return ddplug__ctx_capture_error(
      ctx, ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory"));
  int st = run_coll(ctx, DDPLUG_COLL_ALLGATHER, &local, all, DDPLUG__AUDIT_NSTATS, 0, timeout_ms);
  if (st == DDPLUG_OK) st = check_same(a, all, world);
  int cover = a->scope == DDPLUG__SCOPE_FULL;
  for (int r = 0; r < world && st == DDPLUG_OK; r++) cover &= all[r].coverage_ok != 0;
  ddplug__audit_coverage cov;
  memset(&cov, 0, sizeof cov);
  if (st == DDPLUG_OK && cover && a->opts.by_id) {
    st = id_coverage(a, all, world, timeout_ms, &cov);
  } else if (st == DDPLUG_OK && cover) {
    st = coverage(a, timeout_ms, &cov);
    uint64_t distinct = 0;
    for (int r = 0; r < world; r++) distinct += (uint64_t)all[r].distinct;
    if (st == DDPLUG_OK && a->exact && distinct > cov.covered &&
        repeats_undeclared(a, all, world, cov.covered))
      st = cross_examples(a, timeout_ms, &cov);
    merge_local_examples(all, world, &cov);
  }
  if (st != DDPLUG_OK) {
    ddplug__free(all);
    return ddplug__ctx_capture_error(ctx, ddplug__err_prefix(st, "audit of stream '%s' epoch %llu",
                                                    a->stream, (unsigned long long)a->epoch));
  }
  a->all = all;
  a->nall = world;
  a->cov = cov;
  ddplug__audit_diagnose(a->stream, all, world, cover ? &cov : NULL, &a->report, &a->text);
  add_history(a);
  finish_report(a, report, size);
  int verdict = a->report.verdict;
  if (verdict == DDPLUG_AUDIT_PASS || verdict == DDPLUG_AUDIT_SKIPPED) {
    DDPLUG__INFO("%s", a->report.summary);
    return DDPLUG_OK;
  }
  if (a->state && a->state->policy.on_violation_warn) {
    DDPLUG__WARN("%s (data_split.on_violation = warn)", a->report.summary);
    return DDPLUG_OK;
  }
  return ddplug__ctx_capture_error(
      ctx, ddplug__err(DDPLUG_E_AUDIT_FAILED, "%s", a->report.summary));
}

DDPLUG_API int ddplug_audit_rank_counts(const ddplug_audit *a, int32_t rank,
                                        uint64_t *steps, uint64_t *samples) {
  static const char what[] = "ddplug_audit_rank_counts";
  if (!a) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: audit is NULL", what);
  if (!a->finished || !a->all)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: the audit of stream '%s' epoch %llu is not finished",
                       what, a->stream, (unsigned long long)a->epoch);
  const ddplug__audit_stats *x = NULL;
  if (a->nall == 1 && a->world > 1) { /* skipped: only this rank's counts */
    if (rank == a->rank) x = &a->all[0];
  } else if (rank >= 0 && rank < a->nall) {
    x = &a->all[rank];
  }
  if (!x)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': rank %d %s", what, a->stream, rank,
                       rank >= 0 && rank < a->world
                           ? "is not known: the epoch was not audited (SKIPPED), "
                             "only this rank's counts are"
                           : "is not in the world");
  if (steps) *steps = (uint64_t)x->steps;
  if (samples) *samples = (uint64_t)x->deliveries;
  return DDPLUG_OK;
}

DDPLUG_API const char *ddplug_audit_text(const ddplug_audit *a) {
  return a && a->finished && a->text ? a->text : "";
}

DDPLUG_API int ddplug_audit_examples(const ddplug_audit *a, int verdict,
                                     int64_t *out, uint64_t cap, uint64_t *n) {
  static const char what[] = "ddplug_audit_examples";
  if (!a || !n || (cap > 0 && !out))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: audit and n must not be NULL (out neither when cap > 0)", what);
  if (verdict != DDPLUG_AUDIT_MISSING && verdict != DDPLUG_AUDIT_OVERLAP)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: verdict %d: examples exist for MISSING (%d) and "
                       "OVERLAP (%d) only",
                       what, verdict, DDPLUG_AUDIT_MISSING, DDPLUG_AUDIT_OVERLAP);
  uint64_t k = 0;
  if (verdict == DDPLUG_AUDIT_MISSING)
    for (; k < cap && k < (uint64_t)a->cov.nmissing_ex; k++) out[k] = (int64_t)a->cov.missing_ex[k];
  else
    for (; k < cap && k < (uint64_t)a->cov.nrepeat_ex; k++) out[k] = a->cov.repeat_ex[k];
  *n = k;
  return DDPLUG_OK;
}
