/* audit_run.c — ddplug_audit_begin / _record / _finish / _free: which
 * epochs are audited (config), registration on the stream (so the
 * context-bound sampler can feed it), and the collective finish through the
 * context's collectives:
 *   1. allgather of every rank's statistics (16 int64), then a consistency
 *      check (same stream, epoch, N and scope everywhere, else MISMATCH);
 *   2. full scope: allreduce BOR and BAND of the tracked bitmaps as int64
 *      words, in chunks of 256 KiB, counting union and intersection;
 *   3. the diagnosis (audit_diagnose.c), identical on every rank.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "run/context.h"
#include "data/data.h"

#define CHUNK_WORDS 32768u /* 256 KiB of bitmap per collective */
#define MAX_EXAMPLES 5

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
  if (st) return ddplug__ctx_fail(ctx, st);
  ddplug_audit_options o;
  memset(&o, 0, sizeof o);
  if (opts) {
    if (opts->struct_size < offsetof(ddplug_audit_options, allowed_padding))
      return ddplug__ctx_fail(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
          "%s: opts struct_size %u is too small (fill it with DDPLUG_AUDIT_OPTIONS_INIT)",
          what, opts->struct_size));
    memcpy(&o, opts, DDPLUG__MIN((size_t)opts->struct_size, sizeof o));
  }
  ddplug__data_state *data;
  if ((st = ddplug__ctx_data(ctx, &data))) return ddplug__ctx_fail(ctx, st);
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
  if (st) return ddplug__ctx_fail(ctx, st);
  *out = a;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_audit_record(ddplug_audit *a, const int64_t *indices,
                                   uint64_t n) {
  if (!a || (n > 0 && !indices))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_audit_record: audit (and indices when n > 0) must not be NULL");
  if (a->finished)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_audit_record: the audit of stream '%s' epoch %llu is finished",
                       a->stream, (unsigned long long)a->epoch);
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
                       "ddplug_audit_record: stream '%s' is recorded by its "
                       "context-bound sampler (the plugin owns it): recording "
                       "it here too would count every step twice",
                       a->stream);
  return DDPLUG_OK;
}

static int run_coll(ddplug_context *ctx, int kind, const void *send, void *recv,
                    uint64_t count, int op, int64_t timeout_ms) {
  ddplug_request *req = NULL;
  int st = kind == DDPLUG_COLL_ALLGATHER
               ? ddplug_iallgather(ctx, send, recv, count, DDPLUG_INT64, NULL, &req)
               : ddplug_iallreduce(ctx, send, recv, count, DDPLUG_INT64, op, NULL, &req);
  if (st) return st;
  st = ddplug_wait(req, timeout_ms);
  ddplug_request_free(req);
  return st;
}

/* All ranks must audit the same thing, else the next collectives differ. */
static int check_same(const ddplug_audit *a, const ddplug__audit_stats *all,
                      int world) {
  for (int r = 0; r < world; r++) {
    const ddplug__audit_stats *x = &all[r];
    if (x->stream_hash == all[0].stream_hash && x->epoch == all[0].epoch &&
        x->num_samples == all[0].num_samples && x->scope == all[0].scope)
      continue;
    return ddplug__err(DDPLUG_E_MISMATCH,
                       "audit of stream '%s' (rank %d: epoch %lld, N = %lld, "
                       "scope %lld): rank %d audits %s, epoch %lld, N = %lld, "
                       "scope %lld — every rank must begin the same audits in "
                       "the same order",
                       a->stream, a->rank, (long long)all[0].epoch,
                       (long long)all[0].num_samples, (long long)all[0].scope, r,
                       x->stream_hash == all[0].stream_hash ? "the same stream"
                                                            : "another stream",
                       (long long)x->epoch, (long long)x->num_samples,
                       (long long)x->scope);
  }
  return DDPLUG_OK;
}

/* Union and intersection of every rank's bitmap, chunk by chunk. */
static int coverage(ddplug_audit *a, int64_t timeout_ms, uint64_t *covered,
                    uint64_t *common, uint64_t *missing, int *nmissing) {
  uint64_t chunk = DDPLUG__MIN((uint64_t)CHUNK_WORDS, a->words ? a->words : 1);
  uint64_t *ors = ddplug__malloc(sizeof *ors * chunk);
  uint64_t *ands = ddplug__malloc(sizeof *ands * chunk);
  int st = ors && ands ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory");
  *covered = *common = 0;
  *nmissing = 0;
  for (uint64_t w0 = 0; st == DDPLUG_OK && w0 < a->words; w0 += chunk) {
    uint64_t cnt = DDPLUG__MIN(chunk, a->words - w0);
    st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, a->bits + w0, ors, cnt, DDPLUG_OP_BOR, timeout_ms);
    if (st == DDPLUG_OK)
      st = run_coll(a->ctx, DDPLUG_COLL_ALLREDUCE, a->bits + w0, ands, cnt, DDPLUG_OP_BAND, timeout_ms);
    for (uint64_t k = 0; st == DDPLUG_OK && k < cnt; k++) {
      uint64_t w = w0 + k;
      uint64_t valid = w * 64 + 64 <= a->tracked ? ~0ull : (1ull << (a->tracked - w * 64)) - 1;
      *covered += (uint64_t)__builtin_popcountll(ors[k] & valid);
      *common += (uint64_t)__builtin_popcountll(ands[k] & valid);
      uint64_t holes = ~ors[k] & valid;
      while (a->exact && holes && *nmissing < MAX_EXAMPLES) {
        missing[(*nmissing)++] = w * 64 + (uint64_t)__builtin_ctzll(holes);
        holes &= holes - 1;
      }
    }
  }
  ddplug__free(ors);
  ddplug__free(ands);
  return st;
}

static int plugin_can_cover(ddplug_context *ctx) {
  const ddplug_plugin *t = &ctx->plugin->table;
  return (t->dtype_mask & DDPLUG_DTYPE_BIT(DDPLUG_INT64)) &&
         (t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BOR)) &&
         (t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BAND));
}

DDPLUG_API int ddplug_audit_finish(ddplug_audit *a,
                                   ddplug_audit_report *report,
                                   int64_t timeout_ms) {
  if (!a || !report || report->struct_size < offsetof(ddplug_audit_report, steps))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_audit_finish: audit and report must not be NULL "
                       "(fill the report with DDPLUG_AUDIT_REPORT_INIT)");
  if (a->finished)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_audit_finish: the audit of stream '%s' epoch %llu "
                       "is already finished",
                       a->stream, (unsigned long long)a->epoch);
  a->finished = 1;
  ddplug__audit_unregister(a);
  ddplug_context *ctx = a->ctx;
  ddplug__audit_stats local;
  ddplug__audit_local_stats(a, &local);
  local.coverage_ok = local.coverage_ok && plugin_can_cover(ctx);
  if (a->scope == DDPLUG__SCOPE_SKIP) {
    ddplug__audit_diagnose(a->stream, &local, 1, 0, 0, NULL, 0, report);
    if (DDPLUG_HAS_FIELD(report, ddplug_audit_report, world_size))
      report->world_size = a->world;
    return DDPLUG_OK;
  }
  int world = a->world;
  ddplug__audit_stats *all = ddplug__calloc((size_t)world, sizeof *all);
  if (!all) return ddplug__ctx_fail(ctx, ddplug__err(DDPLUG_E_NO_MEMORY, "audit: out of memory"));
  int st = run_coll(ctx, DDPLUG_COLL_ALLGATHER, &local, all, DDPLUG__AUDIT_NSTATS, 0, timeout_ms);
  if (st == DDPLUG_OK) st = check_same(a, all, world);
  int cover = a->scope == DDPLUG__SCOPE_FULL;
  for (int r = 0; r < world && st == DDPLUG_OK; r++) cover &= all[r].coverage_ok != 0;
  uint64_t covered = 0, common = 0, missing[MAX_EXAMPLES];
  int nmissing = 0;
  if (st == DDPLUG_OK && cover)
    st = coverage(a, timeout_ms, &covered, &common, missing, &nmissing);
  if (st != DDPLUG_OK) {
    ddplug__free(all);
    return ddplug__ctx_fail(ctx, ddplug__err_prefix(st, "audit of stream '%s' epoch %llu",
                                                    a->stream, (unsigned long long)a->epoch));
  }
  ddplug__audit_diagnose(a->stream, all, world, covered, common, missing, nmissing, report);
  ddplug__free(all);
  int verdict = report->verdict;
  if (verdict == DDPLUG_AUDIT_PASS || verdict == DDPLUG_AUDIT_SKIPPED) {
    DDPLUG__INFO("%s", report->summary);
    return DDPLUG_OK;
  }
  if (a->state && a->state->policy.on_violation_warn) {
    DDPLUG__WARN("%s (data_split.on_violation = warn)", report->summary);
    return DDPLUG_OK;
  }
  return ddplug__ctx_fail(ctx, ddplug__err(DDPLUG_E_AUDIT_FAILED, "%s", report->summary));
}
