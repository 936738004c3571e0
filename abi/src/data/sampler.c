/* sampler.c — ddplug_sampler_*: the host's options turned into the plugin
 * ABI's desc, one handle that drives either a default sampler
 * (distributed.c, bucket.c) or a plugin's sampler slots, position
 * bookkeeping, and what a sampler declares it pads or drops.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

int ddplug__sampler_options_to_desc(const ddplug_sampler_options *in,
                                    ddplug_sampler_desc *d, int *exact,
                                    const char *what) {
  if (!in)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: options are NULL", what);
  if (DDPLUG_VERSION_MAJOR_OF(in->abi_version) != DDPLUG_ABI_MAJOR)
    return ddplug__err(DDPLUG_E_ABI_MISMATCH,
                       "%s: the options have ABI version %u.%u, this library "
                       "speaks %u.x (fill them with DDPLUG_SAMPLER_OPTIONS_INIT)",
                       what, DDPLUG_VERSION_MAJOR_OF(in->abi_version),
                       DDPLUG_VERSION_MINOR_OF(in->abi_version), DDPLUG_ABI_MAJOR);
  if (in->struct_size < offsetof(ddplug_sampler_options, batch_size) + sizeof in->batch_size)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: options struct_size %u is too small (at least %zu; "
                       "fill them with DDPLUG_SAMPLER_OPTIONS_INIT)",
                       what, in->struct_size,
                       offsetof(ddplug_sampler_options, batch_size) + sizeof in->batch_size);
  ddplug_sampler_options o;
  memset(&o, 0, sizeof o);
  memcpy(&o, in, DDPLUG__MIN((size_t)in->struct_size, sizeof o));
  memset(d, 0, sizeof *d);
  d->struct_size = sizeof *d;
  d->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  d->kind = o.kind;
  d->rank = o.rank;
  d->world_size = o.world_size;
  d->shuffle = o.shuffle;
  d->drop_last = o.drop_last;
  d->seed = o.seed;
  d->num_samples = o.num_samples;
  d->stream = o.stream ? o.stream : "train";
  d->lengths = o.lengths;
  d->boundaries = o.boundaries;
  d->num_boundaries = o.num_boundaries;
  d->num_buckets = o.num_buckets;
  d->batch_size = o.batch_size;
  int st = ddplug__stream_name_check(d->stream, what);
  if (st) return st;
  if (d->world_size == 0 && d->rank == 0) d->world_size = 1;
  if (d->world_size < 1 || d->rank < 0 || d->rank >= d->world_size)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': rank %d is not in a world of %d "
                       "(need 0 <= rank < world_size)",
                       what, d->stream, d->rank, d->world_size);
  if ((d->shuffle != 0 && d->shuffle != 1) ||
      (d->drop_last != 0 && d->drop_last != 1) || (o.exact != 0 && o.exact != 1))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': shuffle (%d), drop_last (%d) and exact "
                       "(%d) must be 0 or 1",
                       what, d->stream, d->shuffle, d->drop_last, o.exact);
  if (o.exact && d->drop_last)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': exact = 1 delivers every sample once; "
                       "drop_last = 1 contradicts it (set one of them to 0)",
                       what, d->stream);
  if (d->num_samples > (uint64_t)INT64_MAX)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': num_samples %llu does not fit the "
                       "int64 indices (at most 2^63 - 1)",
                       what, d->stream, (unsigned long long)d->num_samples);
  *exact = o.exact;
  if (d->kind == DDPLUG_SAMPLER_DISTRIBUTED) return DDPLUG_OK;
  if (d->kind != DDPLUG_SAMPLER_BUCKET)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': kind %d is not a sampler kind (use "
                       "DDPLUG_SAMPLER_DISTRIBUTED or DDPLUG_SAMPLER_BUCKET)",
                       what, d->stream, d->kind);
  if (o.exact)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': the bucket sampler pads or drops to "
                       "whole batches, so it cannot be exact: use the "
                       "distributed kind for an exact (evaluation) stream",
                       what, d->stream);
  if (d->batch_size == 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': the bucket sampler needs batch_size "
                       ">= 1 (per rank)",
                       what, d->stream);
  if (d->num_samples > 0 && !d->lengths)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': the bucket sampler needs lengths[%llu]",
                       what, d->stream, (unsigned long long)d->num_samples);
  if (d->boundaries) {
    if (d->num_boundaries == 0)
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "%s: stream '%s': boundaries given with "
                         "num_boundaries 0",
                         what, d->stream);
    for (uint32_t i = 1; i < d->num_boundaries; i++)
      if (d->boundaries[i] <= d->boundaries[i - 1])
        return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                           "%s: stream '%s': boundaries must be strictly "
                           "ascending: boundaries[%u] = %lld <= "
                           "boundaries[%u] = %lld",
                           what, d->stream, i, (long long)d->boundaries[i],
                           i - 1, (long long)d->boundaries[i - 1]);
  } else if (d->num_boundaries != 0) {
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': num_boundaries %u but boundaries is "
                       "NULL",
                       what, d->stream, d->num_boundaries);
  } else if (d->num_buckets == 0) {
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': give boundaries, or num_buckets >= 1 "
                       "for quantile buckets",
                       what, d->stream);
  }
  return DDPLUG_OK;
}

/* Allocate the handle around a validated desc (no implementation yet). */
int ddplug__sampler_alloc(const ddplug_sampler_desc *d, int exact,
                          ddplug_sampler **out) {
  ddplug_sampler *s = ddplug__calloc(1, sizeof *s);
  if (!s) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler: out of memory");
  s->desc = *d;
  s->exact = exact;
  ddplug__strlcpy(s->stream, d->stream, sizeof s->stream);
  s->desc.stream = s->stream;
  s->desc.lengths = NULL;
  s->desc.boundaries = NULL;
  *out = s;
  return DDPLUG_OK;
}

int ddplug__sampler_use_default(ddplug_sampler *s,
                                const ddplug_sampler_desc *d) {
  const ddplug__sampler_ops *ops = d->kind == DDPLUG_SAMPLER_BUCKET
                                       ? &ddplug__bucket_ops
                                       : &ddplug__distributed_ops;
  int st = ops->create(d, s->exact, &s->impl);
  if (st) return ddplug__err_prefix(st, "stream '%s'", d->stream);
  s->ops = *ops;
  st = s->ops.length(s->impl, &s->len);
  if (st == DDPLUG_OK) ddplug__sampler_update_declared(s);
  return st;
}

DDPLUG_API int ddplug_sampler_new(const ddplug_sampler_options *opts,
                                  ddplug_sampler **out) {
  if (!out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_sampler_new: out is NULL");
  ddplug_sampler_desc d;
  int exact = 0;
  int st = ddplug__sampler_options_to_desc(opts, &d, &exact, "ddplug_sampler_new");
  if (st) return st;
  ddplug_sampler *s;
  st = ddplug__sampler_alloc(&d, exact, &s);
  if (st) return st;
  st = ddplug__sampler_use_default(s, &d);
  if (st) {
    ddplug_sampler_free(s);
    return st;
  }
  *out = s;
  return DDPLUG_OK;
}

static int check_handle(const ddplug_sampler *s, const char *what) {
  if (!s) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: sampler is NULL", what);
  return DDPLUG_OK;
}

ddplug__deal *ddplug__sampler_deal(const ddplug_sampler *s) {
  if (!s || s->from_plugin || s->desc.kind != DDPLUG_SAMPLER_DISTRIBUTED || !s->impl) return NULL;
  return ddplug__distributed_deal(s->impl);
}

void ddplug__sampler_refresh(ddplug_sampler *s) {
  ddplug__deal *d = ddplug__sampler_deal(s);
  if (d) {
    s->len = ddplug__deal_length(d);
    s->pos = ddplug__deal_position(d);
    s->epoch = d->epoch;
  } else {
    s->ops.length(s->impl, &s->len);
  }
  ddplug__sampler_update_declared(s);
}

DDPLUG_API int ddplug_sampler_set_epoch(ddplug_sampler *s, uint64_t epoch) {
  int st = check_handle(s, "ddplug_sampler_set_epoch");
  if (st) return st;
  if (s->resume_pending && epoch == s->epoch) {
    s->resume_pending = 0; /* a loaded state resumes this epoch */
    return DDPLUG_OK;
  }
  s->resume_pending = 0;
  st = s->ops.set_epoch(s->impl, epoch);
  if (st) return ddplug__err_prefix(st, "stream '%s' set_epoch(%llu)", s->stream,
                                    (unsigned long long)epoch);
  s->epoch = epoch;
  s->pos = 0;
  s->committed = 0;
  ddplug__sampler_refresh(s);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_sampler_commit(ddplug_sampler *s, uint64_t steps) {
  int st = check_handle(s, "ddplug_sampler_commit");
  if (st) return st;
  ddplug__deal *d = ddplug__sampler_deal(s);
  if (d) return ddplug__deal_commit(d, steps, s->stream);
  uint64_t bs = s->desc.kind == DDPLUG_SAMPLER_BUCKET || !s->desc.batch_size ? 1 : s->desc.batch_size;
  uint64_t drawn = s->desc.kind == DDPLUG_SAMPLER_BUCKET ? s->pos : (s->pos + bs - 1) / bs;
  if (s->committed + steps > drawn)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_commit: stream '%s': commits %llu step(s), but only "
                       "%llu batch(es) were delivered and not yet committed: commit once per "
                       "optimizer step, after its batch was drawn",
                       s->stream, (unsigned long long)steps,
                       (unsigned long long)(drawn - DDPLUG__MIN(drawn, s->committed)));
  s->committed += steps;
  return DDPLUG_OK;
}

static const char *kind_word(const ddplug_sampler *s) {
  if (s->from_plugin) return "plugin";
  return s->desc.kind == DDPLUG_SAMPLER_BUCKET ? "bucket" : "distributed";
}

/* The state of a sampler without a plan: epoch and committed position, for
 * the same world only. */
static int save_positional(const ddplug_sampler *s, char **out) {
  uint64_t bs = s->desc.kind == DDPLUG_SAMPLER_BUCKET || !s->desc.batch_size ? 1 : s->desc.batch_size;
  json_t *j = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:b, s:i, s:I, s:I}",
                        "ddplug_sampler_state", 1, "kind", kind_word(s), "stream", s->stream,
                        "epoch", (json_int_t)s->epoch, "seed", (json_int_t)s->desc.seed,
                        "num_samples", (json_int_t)s->desc.num_samples, "shuffle",
                        s->desc.shuffle, "world_size", (int)s->desc.world_size, "position",
                        (json_int_t)(s->committed * bs), "batch_size",
                        (json_int_t)s->desc.batch_size);
  char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(j);
  if (!text) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
  *out = ddplug__strdup(text);
  free(text);
  return *out ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
}

static int load_positional(ddplug_sampler *s, const char *text) {
  static const char what[] = "ddplug_sampler_state_load";
  json_error_t jerr;
  json_t *j = json_loads(text, 0, &jerr);
  json_int_t epoch = 0, seed = 0, n = 0, position = 0;
  int world = 0, shuffle = 0;
  const char *kind = "?";
  if (!j || json_unpack_ex(j, &jerr, 0, "{s:s, s:I, s:I, s:I, s:b, s:i, s:I}", "kind", &kind,
                           "epoch", &epoch, "seed", &seed, "num_samples", &n, "shuffle",
                           &shuffle, "world_size", &world, "position", &position) != 0) {
    json_decref(j);
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream '%s': not a sampler state (%s): pass the text "
                       "ddplug_sampler_state_save gave",
                       what, s->stream, jerr.text);
  }
  int st = DDPLUG_OK;
  if (strcmp(kind, kind_word(s)) != 0)
    st = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                     "%s: stream '%s': the state is of a %s sampler, this one is a %s sampler",
                     what, s->stream, kind, kind_word(s));
  else if (world != s->desc.world_size)
    st = ddplug__err(DDPLUG_E_UNSUPPORTED,
                     "stream '%s': the checkpoint was saved on %d ranks and this run has %d: "
                     "the %s sampler %s, so its position cannot be dealt over another world "
                     "size — resume on %d ranks, or use ddplug's distributed sampler (its "
                     "state resumes on any world size)",
                     s->stream, world, (int)s->desc.world_size, kind_word(s),
                     s->desc.kind == DDPLUG_SAMPLER_BUCKET && !s->from_plugin
                         ? "forms its global batches of batch_size x world samples per bucket"
                         : "is the plugin's own",
                     world);
  else if ((uint64_t)seed != s->desc.seed || (uint64_t)n != s->desc.num_samples ||
           shuffle != s->desc.shuffle)
    st = ddplug__err(DDPLUG_E_MISMATCH,
                     "stream '%s': the checkpoint says seed %llu, N = %llu, %s; this run has "
                     "seed %llu, N = %llu, %s: resuming would repeat some samples and skip "
                     "others — resume with the checkpoint's seed and dataset",
                     s->stream, (unsigned long long)seed, (unsigned long long)n,
                     shuffle ? "shuffled" : "in order", (unsigned long long)s->desc.seed,
                     (unsigned long long)s->desc.num_samples,
                     s->desc.shuffle ? "shuffled" : "in order");
  json_decref(j);
  if (st) return st;
  if ((st = ddplug_sampler_set_epoch(s, (uint64_t)epoch)) != DDPLUG_OK) return st;
  if ((st = ddplug_sampler_seek(s, (uint64_t)position)) != DDPLUG_OK) return st;
  uint64_t bs = s->desc.kind == DDPLUG_SAMPLER_BUCKET || !s->desc.batch_size ? 1 : s->desc.batch_size;
  s->committed = (uint64_t)position / bs;
  s->resume_pending = 1;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_sampler_state_save(const ddplug_sampler *s, char **state) {
  int st = check_handle(s, "ddplug_sampler_state_save");
  if (st) return st;
  if (!state)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_sampler_state_save: state is NULL");
  ddplug__deal *d = ddplug__sampler_deal(s);
  return d ? ddplug__deal_save(d, s->stream, state) : save_positional(s, state);
}

DDPLUG_API int ddplug_sampler_state_load(ddplug_sampler *s, const char *state) {
  int st = check_handle(s, "ddplug_sampler_state_load");
  if (st) return st;
  if (!state)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_sampler_state_load: state is NULL");
  ddplug__deal *d = ddplug__sampler_deal(s);
  if (!d) return load_positional(s, state);
  if ((st = ddplug__deal_load(d, s->stream, state)) != DDPLUG_OK) return st;
  s->committed = 0;
  s->resume_pending = 1;
  ddplug__sampler_refresh(s);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_sampler_next(ddplug_sampler *s, int64_t *out,
                                   uint64_t cap, uint64_t *n) {
  int st = check_handle(s, "ddplug_sampler_next");
  if (st) return st;
  if (!n || (!out && cap > 0))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_next: stream '%s': out (with cap > 0) "
                       "and n must not be NULL",
                       s->stream);
  uint64_t got = 0;
  if (s->pos < s->len) {
    st = s->ops.next(s->impl, out, cap, &got);
    if (st) return ddplug__err_prefix(st, "stream '%s' next", s->stream);
    if (got > cap)
      return ddplug__err(DDPLUG_E_INTERNAL,
                         "stream '%s': the sampler delivered %llu indices into "
                         "a buffer of %llu",
                         s->stream, (unsigned long long)got,
                         (unsigned long long)cap);
  }
  uint64_t before = s->pos;
  s->pos += s->desc.kind == DDPLUG_SAMPLER_BUCKET ? (got > 0) : got;
  ddplug__sampler_feed_hook(s, before, out, got);
  *n = got;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_sampler_next_batch(ddplug_sampler *s, int64_t *out, uint64_t cap,
                                         uint64_t *n) {
  int st = check_handle(s, "ddplug_sampler_next_batch");
  if (st) return st;
  if (!n || (!out && cap > 0))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_next_batch: stream '%s': out (with cap > 0) and n must "
                       "not be NULL",
                       s->stream);
  if (s->desc.kind == DDPLUG_SAMPLER_BUCKET) return ddplug_sampler_next(s, out, cap, n);
  ddplug__deal *d = ddplug__sampler_deal(s);
  uint64_t bs = s->desc.batch_size ? s->desc.batch_size : 1;
  uint64_t want = d ? ddplug__deal_batch_left(d)
                    : DDPLUG__MIN(bs - s->pos % bs, s->len - DDPLUG__MIN(s->pos, s->len));
  if (want > cap)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_next_batch: stream '%s': the batch has %llu indices, "
                       "the buffer %llu (nothing was consumed)",
                       s->stream, (unsigned long long)want, (unsigned long long)cap);
  return ddplug_sampler_next(s, out, want, n);
}

DDPLUG_API int ddplug_sampler_seek(ddplug_sampler *s, uint64_t position) {
  int st = check_handle(s, "ddplug_sampler_seek");
  if (st) return st;
  if (position > s->len)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_seek: stream '%s': position %llu is "
                       "past the end of the epoch (length %llu on rank %d)",
                       s->stream, (unsigned long long)position,
                       (unsigned long long)s->len, s->desc.rank);
  st = s->ops.seek(s->impl, position);
  if (st) return ddplug__err_prefix(st, "stream '%s' seek", s->stream);
  s->pos = position;
  /* a seek resumes: what lies before it counts as committed */
  uint64_t bs = s->desc.kind == DDPLUG_SAMPLER_BUCKET || !s->desc.batch_size ? 1 : s->desc.batch_size;
  s->committed = position / bs;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_sampler_length(const ddplug_sampler *s,
                                     uint64_t *length) {
  int st = check_handle(s, "ddplug_sampler_length");
  if (st) return st;
  if (!length)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_sampler_length: length is NULL");
  *length = s->len;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_sampler_position(const ddplug_sampler *s,
                                       uint64_t *position) {
  int st = check_handle(s, "ddplug_sampler_position");
  if (st) return st;
  if (!position)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_sampler_position: position is NULL");
  *position = s->pos;
  return DDPLUG_OK;
}

/* a * b, saturating at UINT64_MAX. */
static uint64_t mul_sat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

void ddplug__sampler_derive_declared(const ddplug_sampler_desc *d,
                                     uint64_t length, uint64_t *padded,
                                     uint64_t *dropped) {
  *padded = *dropped = 0;
  uint64_t world = d->world_size > 0 ? (uint64_t)d->world_size : 1;
  uint64_t n = d->num_samples, total, limit;
  if (d->kind == DDPLUG_SAMPLER_BUCKET) {
    uint64_t buckets = d->num_boundaries ? (uint64_t)d->num_boundaries + 1
                                         : (uint64_t)d->num_buckets;
    uint64_t global = mul_sat(d->batch_size, world);
    total = mul_sat(mul_sat(length, d->batch_size), world);
    limit = mul_sat(buckets ? buckets : 1, global);
  } else {
    total = mul_sat(length, world);
    limit = world;
  }
  if (total == UINT64_MAX) return;
  if (!d->drop_last && total >= n && total - n < limit) *padded = total - n;
  else if (d->drop_last && total < n && n - total < limit) *dropped = n - total;
}

void ddplug__sampler_update_declared(ddplug_sampler *s) {
  s->padded = s->dropped = 0;
  if (s->ops.declared) {
    s->ops.declared(s->impl, &s->padded, &s->dropped);
    return;
  }
  if (s->plugin_declared) {
    uint64_t p = 0, d = 0;
    int st = s->plugin_declared(s->impl, &p, &d);
    if (st == DDPLUG_OK) {
      s->padded = p;
      s->dropped = d;
      return;
    }
    DDPLUG__WARN("stream '%s': the plugin's sampler_declared failed (%s): "
                 "its padding and dropping are derived from its length "
                 "instead",
                 s->stream, ddplug_status_name(st));
  }
  ddplug__sampler_derive_declared(&s->desc, s->len, &s->padded, &s->dropped);
}

DDPLUG_API int ddplug_sampler_info_get(const ddplug_sampler *s,
                                       ddplug_sampler_info *info) {
  int st = check_handle(s, "ddplug_sampler_info_get");
  if (st) return st;
  if (!info || info->struct_size < offsetof(ddplug_sampler_info, stream))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_info_get: info is NULL or too small "
                       "(fill it with DDPLUG_SAMPLER_INFO_INIT)");
  ddplug_sampler_info v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.abi_version = DDPLUG_ABI_VERSION;
  v.kind = s->desc.kind;
  v.rank = s->desc.rank;
  v.world_size = s->desc.world_size;
  v.from_plugin = s->from_plugin;
  v.num_samples = s->desc.num_samples;
  v.batch_size = s->desc.batch_size;
  v.length = s->len;
  v.epoch = s->epoch;
  v.position = s->pos;
  v.padded = s->padded;
  v.dropped = s->dropped;
  ddplug__strlcpy(v.stream, s->stream, sizeof v.stream);
  v.exact = s->exact;
  ddplug__deal *d = ddplug__sampler_deal(s);
  uint64_t bs = s->desc.batch_size ? s->desc.batch_size : 1;
  v.steps = d ? ddplug__deal_total_steps(d)
              : s->desc.kind == DDPLUG_SAMPLER_BUCKET ? s->len : (s->len + bs - 1) / bs;
  v.committed = d ? ddplug__deal_steps(d) : s->committed;
  uint32_t size = info->struct_size;
  memcpy(info, &v, DDPLUG__MIN((size_t)size, sizeof v));
  info->struct_size = size;
  return DDPLUG_OK;
}

DDPLUG_API void ddplug_sampler_free(ddplug_sampler *s) {
  if (!s) return;
  ddplug__sampler_unbind(s);
  if (s->impl && s->ops.destroy) s->ops.destroy(s->impl);
  ddplug__free(s);
}
