/* sampler_bind.c — samplers bound to a context: the ownership check, the
 * plugin's sampler slots (or the defaults), and feeding the stream's open
 * audit with every index delivered (replaying the epoch's earlier positions
 * when the audit began late).
 * SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "run/context.h"
#include "data/data.h"

#define REPLAY_CHUNK 4096

static int plugin_has_sampler(const ddplug_plugin *t) {
  return t->sampler_create && t->sampler_set_epoch && t->sampler_next &&
         t->sampler_seek && t->sampler_length && t->sampler_destroy;
}

/* The plugin's sampler_declared slot, only if its table is of ABI 1.2 or
 * newer and large enough to hold it (the loader copied a 1.1 table's bytes
 * only up to the 1.1 end, but check what the plugin said, not our copy). */
static ddplug__declared_fn plugin_declared_slot(const ddplug__plugin *p) {
  if (DDPLUG_VERSION_MINOR_OF(p->built_abi) < 2 ||
      p->built_size < offsetof(ddplug_plugin, sampler_declared) +
                          sizeof p->table.sampler_declared)
    return NULL;
  return p->table.sampler_declared;
}

static int use_plugin(ddplug_context *ctx, ddplug_sampler *s,
                      const ddplug_sampler_desc *d) {
  const ddplug_plugin *t = &ctx->plugin->table;
  ddplug__plugin_err_clear(ctx);
  int st = t->sampler_create(ctx->group, d, &s->impl);
  if (st) {
    s->impl = NULL;
    ddplug__plugin_err_take(ctx, st, "sampler_create");
    return ddplug__err_prefix(st, "stream '%s': the plugin's sampler", d->stream);
  }
  ddplug__sampler_ops ops = {NULL, t->sampler_set_epoch, t->sampler_next,
                             t->sampler_seek, t->sampler_length,
                             t->sampler_destroy, NULL};
  s->ops = ops;
  s->from_plugin = 1;
  s->plugin_declared = plugin_declared_slot(ctx->plugin);
  st = s->ops.length(s->impl, &s->len);
  if (st) return ddplug__err(st, "stream '%s': the plugin's sampler_length failed", d->stream);
  ddplug__sampler_update_declared(s);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_context_sampler_new(ddplug_context *ctx,
                                          const ddplug_sampler_options *opts,
                                          ddplug_sampler **out) {
  static const char what[] = "ddplug_context_sampler_new";
  if (!ctx || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx and out must not be NULL", what);
  int st = ddplug__ctx_check_local(ctx);
  if (st) return ddplug__ctx_capture_error(ctx, st);
  ddplug_sampler_desc d;
  int exact = 0;
  ddplug_sampler_options in;
  if (opts && opts->struct_size >= offsetof(ddplug_sampler_options, batch_size)) {
    if ((opts->world_size != 0 && opts->world_size != ctx->world.world_size) ||
        (opts->world_size != 0 && opts->rank != ctx->world.rank))
      return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
          "%s: the options say rank %d of %d but this context is rank %d of %d: "
          "leave rank and world_size 0 (the context's are used)",
          what, opts->rank, opts->world_size, ctx->world.rank, ctx->world.world_size));
    memset(&in, 0, sizeof in);
    memcpy(&in, opts, DDPLUG__MIN((size_t)opts->struct_size, sizeof in));
    in.rank = ctx->world.rank;
    in.world_size = ctx->world.world_size;
    opts = &in;
  }
  if ((st = ddplug__sampler_options_to_desc(opts, &d, &exact, what)))
    return ddplug__ctx_capture_error(ctx, st);
  ddplug__data_state *data;
  if ((st = ddplug__ctx_data(ctx, &data))) return ddplug__ctx_capture_error(ctx, st);
  int owner;
  char claimant[DDPLUG__CLAIMANT_MAX];
  ddplug__split_resolve(data, d.stream, &owner, claimant, sizeof claimant);
  if (owner != DDPLUG_OWNER_UNSET && owner != DDPLUG_OWNER_PLUGIN)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_SPLIT_CONFLICT,
        "stream '%s' is split by %s (%s): the plugin's sampler refuses to "
        "split a stream it does not own — use the %s's sampler for it, or "
        "make the plugin its owner",
        d.stream, ddplug_owner_name(owner), claimant, ddplug_owner_name(owner)));
  ddplug_sampler *s;
  if ((st = ddplug__sampler_alloc(&d, exact, &s))) return ddplug__ctx_capture_error(ctx, st);
  /* an exact (evaluation) sampler is always ddplug's: the slots' contract
   * is equal lengths on every rank */
  if (!exact && plugin_has_sampler(&ctx->plugin->table))
    st = use_plugin(ctx, s, &s->desc);
  else
    st = ddplug__sampler_use_default(s, &d);
  /* claim last, so that a failed call leaves the ownership as it was (a
   * concurrent claim for another owner still makes this one fail) */
  if (st == DDPLUG_OK)
    st = ddplug__split_claim(data, d.stream, DDPLUG_OWNER_PLUGIN, "ddplug sampler");
  if (st) {
    ddplug_sampler_free(s);
    return ddplug__ctx_capture_error(ctx, st);
  }
  s->ctx = ctx;
  s->generation = ctx->generation;
  ddplug__deal *deal = ddplug__sampler_deal(s);
  if (deal && ctx->identity_of) ddplug__deal_set_members(deal, ctx->identity_of, ctx->identity);
  /* the stream's audit asks its sampler for what it derives (its finish) */
  ddplug__data_lock(data);
  ddplug__stream *entry = ddplug__data_stream(data, d.stream);
  if (entry) entry->sampler = s;
  ddplug__data_unlock(data);
  *out = s;
  return DDPLUG_OK;
}

void ddplug__sampler_unbind(ddplug_sampler *s) {
  if (!s->ctx || !s->ctx->data) return;
  ddplug__data_state *data = s->ctx->data;
  ddplug__data_lock(data);
  ddplug__stream *entry = ddplug__data_stream(data, s->stream);
  if (entry && entry->sampler == s) entry->sampler = NULL;
  ddplug__data_unlock(data);
}

/* ---- reform ------------------------------------------------------------------ */

static int run_allgather(ddplug_context *ctx, const int64_t *send, int64_t *recv,
                         uint64_t count, int64_t timeout_ms) {
  ddplug_request *req = NULL;
  int st = ddplug_iallgather(ctx, send, recv, count, DDPLUG_INT64, NULL, &req);
  if (st) return st;
  st = ddplug_request_wait(req, timeout_ms);
  ddplug_request_free(req);
  return st;
}

DDPLUG_API int ddplug_sampler_reform(ddplug_sampler *s, int64_t timeout_ms, uint64_t *adopted) {
  static const char what[] = "ddplug_sampler_reform";
  if (!s) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: sampler is NULL", what);
  ddplug_context *ctx = s->ctx;
  if (!ctx)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': a standalone sampler has no group to follow: save its "
                       "state and load it into a sampler of the new world",
                       what, s->stream);
  int st = ddplug__ctx_check(ctx);
  if (st) return ddplug__ctx_capture_error(ctx, st);
  if (s->generation == ctx->generation)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "%s: stream '%s': the group was not re-formed since this sampler was dealt "
        "(generation %llu): call it after ddplug_shrink",
        what, s->stream, (unsigned long long)ctx->generation));
  ddplug__deal *deal = ddplug__sampler_deal(s);
  int kind = deal ? 1 : (!s->from_plugin && s->desc.kind == DDPLUG_SAMPLER_DISTRIBUTED) ? 2 : 0;
  int world = ctx->world.world_size, rank = ctx->world.rank;
  ddplug__reform_info mine;
  memset(&mine, 0, sizeof mine);
  mine.identity = ctx->identity;
  mine.epoch = (int64_t)s->epoch;
  mine.elastic = kind;
  if (deal) {
    mine.nsegs = deal->nsegs;
    mine.committed = (int64_t)deal->committed;
    mine.drawn = (int64_t)ddplug__deal_drawn(deal);
  }
  ddplug__reform_info *all = ddplug__calloc((size_t)world, sizeof *all);
  if (!all) return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory"));
  st = run_allgather(ctx, (const int64_t *)&mine, (int64_t *)all, DDPLUG__REFORM_NINFO, timeout_ms);
  for (int r = 0; st == DDPLUG_OK && r < world; r++)
    if (all[r].elastic != kind)
      st = ddplug__err(DDPLUG_E_MISMATCH,
                       "%s: stream '%s': new rank %d reforms a different kind of sampler",
                       what, s->stream, r);
  uint64_t took = 0;
  if (st == DDPLUG_OK && kind == 0)
    st = ddplug__err(DDPLUG_E_UNSUPPORTED,
                     "stream '%s': the %s sampler cannot be dealt over another world size (it "
                     "%s): the rest of this epoch cannot continue in place — use ddplug's "
                     "distributed sampler for elastic runs, or restart mode",
                     s->stream, s->from_plugin ? "plugin's" : "bucket",
                     s->from_plugin ? "is the plugin's own"
                                    : "forms its global batches of batch_size x world samples");
  if (st == DDPLUG_OK && kind == 2) {
    /* an evaluation pass starts over on the new world */
    st = ddplug__distributed_reshape(s->impl, world, rank);
    s->desc.rank = rank;
    s->desc.world_size = world;
    s->committed = 0;
  }
  if (st == DDPLUG_OK && kind == 1) {
    ddplug__data_state *data = ctx->data;
    if (data) ddplug__data_lock(data);
    st = ddplug__deal_reform(deal, s->stream, all, world, rank, &took);
    if (data) ddplug__data_unlock(data);
    s->desc.rank = rank;
    s->desc.world_size = world;
  }
  ddplug__free(all);
  if (st) return ddplug__ctx_capture_error(ctx, st);
  s->generation = ctx->generation;
  ddplug__sampler_refresh(s);
  if (adopted) *adopted = took;
  return DDPLUG_OK;
}

/* Steps that positions (before, after] complete: the distributed kind counts
 * one step per batch_size indices (1 if unset), the bucket kind one per
 * batch. */
static uint64_t steps_between(const ddplug_sampler *s, uint64_t before,
                              uint64_t after) {
  if (s->desc.kind == DDPLUG_SAMPLER_BUCKET) return after - before;
  uint64_t bs = s->desc.batch_size ? s->desc.batch_size : 1;
  return (after + bs - 1) / bs - (before + bs - 1) / bs;
}

static void replay_emit(void *user, const int64_t *idx, uint64_t n, uint64_t steps) {
  ddplug__audit_add(user, idx, n, steps);
}

/* Feed positions [0, upto) of the current epoch again (the audit began after
 * they were delivered), then restore the sampler's position `resume`. */
static int replay(ddplug_sampler *s, ddplug_audit *a, uint64_t upto,
                  uint64_t resume) {
  ddplug__deal *deal = ddplug__sampler_deal(s);
  if (deal && !ddplug__deal_is_fresh(deal)) { /* a plan with history replays it */
    ddplug__deal_replay(deal, replay_emit, a);
    return DDPLUG_OK;
  }
  int64_t buf[REPLAY_CHUNK];
  uint64_t cap = s->desc.kind == DDPLUG_SAMPLER_BUCKET ? s->desc.batch_size : REPLAY_CHUNK;
  int64_t *tmp = cap > REPLAY_CHUNK ? ddplug__malloc(sizeof *tmp * cap) : buf;
  if (!tmp) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler audit replay: out of memory");
  int st = s->ops.seek(s->impl, 0);
  uint64_t pos = 0;
  while (st == DDPLUG_OK && pos < upto) {
    uint64_t want = s->desc.kind == DDPLUG_SAMPLER_BUCKET ? cap : DDPLUG__MIN(cap, upto - pos);
    uint64_t got = 0;
    st = s->ops.next(s->impl, tmp, want, &got);
    if (st || got == 0) break;
    uint64_t adv = s->desc.kind == DDPLUG_SAMPLER_BUCKET ? 1 : got;
    ddplug__audit_add(a, tmp, got, steps_between(s, pos, pos + adv));
    pos += adv;
  }
  if (st == DDPLUG_OK) st = s->ops.seek(s->impl, resume);
  if (tmp != buf) ddplug__free(tmp);
  return st ? ddplug__err_prefix(st, "stream '%s': replaying the epoch into its audit", s->stream)
            : DDPLUG_OK;
}

/* Feed one delivery into the open audit a (called with the data lock held,
 * so that a concurrent ddplug_audit_finish or _free on another thread —
 * both take the lock to unregister the audit before they read or free it —
 * waits until this returns). Warnings are returned, not logged: a log
 * callback must not run under the lock. */
enum { FEED_OK = 0, FEED_DOUBLE = 1, FEED_REPLAY_FAILED = 2 };
static int feed_locked(ddplug_sampler *s, ddplug_audit *a, uint64_t before,
                       const int64_t *idx, uint64_t n) {
  int warn = FEED_OK;
  if (a->fed_by_host) { /* the host records it: do not count twice */
    warn = a->warned_double_feed ? FEED_OK : FEED_DOUBLE;
    a->warned_double_feed = 1;
    return warn;
  }
  if (!a->fed_by_sampler) {
    a->fed_by_sampler = 1;
    /* what the sampler declares adds to what the host declared at
     * ddplug_audit_begin; never lowers it */
    a->opts.shuffle = a->opts.shuffle || s->desc.shuffle;
    a->opts.allowed_padding = DDPLUG__MAX(a->opts.allowed_padding, s->padded);
    a->opts.allowed_missing = DDPLUG__MAX(a->opts.allowed_missing, s->dropped);
    a->sampler_epoch = s->epoch;
    a->epoch_behind = s->epoch != a->epoch;
    if (before > 0 && replay(s, a, before, s->pos) != DDPLUG_OK)
      warn = FEED_REPLAY_FAILED;
  }
  ddplug__audit_add(a, idx, n, steps_between(s, before, s->pos));
  return warn;
}

void ddplug__sampler_feed_hook(ddplug_sampler *s, uint64_t before,
                              const int64_t *idx, uint64_t n) {
  if (!s->ctx || !s->ctx->data || n == 0) return;
  ddplug__data_state *data = s->ctx->data;
  ddplug__data_lock(data);
  ddplug__stream *st = ddplug__data_stream(data, s->stream);
  ddplug_audit *a = st ? st->active : NULL;
  int warn = a ? feed_locked(s, a, before, idx, n) : FEED_OK;
  ddplug__data_unlock(data);
  if (warn == FEED_DOUBLE)
    DDPLUG__WARN("stream '%s': the host records this audit with "
                 "ddplug_audit_record and the plugin's sampler delivers too: "
                 "a plugin-owned stream is recorded by its sampler only; "
                 "the sampler's deliveries are not recorded", s->stream);
  else if (warn == FEED_REPLAY_FAILED)
    DDPLUG__WARN("%s: the audit misses the epoch's first %llu positions",
                 ddplug_last_error(), (unsigned long long)before);
}
