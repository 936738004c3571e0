/*
 * sampler_plugin.c — libddplug-sampler-plugin.so, a test plugin with its own
 * sampler slots (DDPLUG_CAP_SAMPLER). The process group and collectives are
 * the example backend's: its source is compiled here (included, not copied)
 * with its entry point renamed, and this file's entry point returns a copy
 * of its table with the identity, the capability bit and the five sampler
 * slots added.
 *
 * The sampler is recognisably not ddplug's default: positions are padded and
 * strided like DistributedSampler (rank r takes g = r, r+world, ...; g >= N
 * repeats g mod N) but the value at global position g is
 *   (N - 1 - (g mod N) + offset) mod N,  offset = shuffle ? (seed + 7919 *
 *   epoch) mod N : 0
 * — a descending order, rotated per epoch when shuffling. Only the
 * distributed kind is supported (the bucket kind is refused with
 * DDPLUG_E_UNSUPPORTED, explained through set_error).
 * SPDX-License-Identifier: Apache-2.0
 */
#define ddplug_plugin_entry_v1 ddplug_example_entry_v1_inner
#include "example_plugin.c"
#undef ddplug_plugin_entry_v1

struct ddplug_plugin_sampler {
  uint64_t n, world, rank, seed, per_rank, pos, offset;
  int shuffle;
};

static int sp_set_epoch(ddplug_plugin_sampler *s, uint64_t epoch) {
  s->offset = s->shuffle && s->n ? (s->seed + 7919u * epoch) % s->n : 0;
  s->pos = 0;
  return DDPLUG_OK;
}

static int sp_create(ddplug_plugin_group *g, const ddplug_sampler_desc *d,
                     ddplug_plugin_sampler **out) {
  if (d->kind != DDPLUG_SAMPLER_DISTRIBUTED)
    return fail(g, DDPLUG_E_UNSUPPORTED,
                "sampler-plugin serves only DDPLUG_SAMPLER_DISTRIBUTED (stream '%s' "
                "asked for kind %d)", d->stream ? d->stream : "?", d->kind);
  ddplug_plugin_sampler *s = calloc(1, sizeof *s);
  if (!s) return fail(g, DDPLUG_E_NO_MEMORY, "sampler-plugin: out of memory");
  s->n = d->num_samples;
  s->world = (uint64_t)d->world_size;
  s->rank = (uint64_t)d->rank;
  s->seed = d->seed;
  s->shuffle = d->shuffle;
  s->per_rank = d->drop_last ? s->n / s->world : (s->n + s->world - 1) / s->world;
  sp_set_epoch(s, 0);
  *out = s;
  return DDPLUG_OK;
}

static int sp_next(ddplug_plugin_sampler *s, int64_t *out, uint64_t cap, uint64_t *n) {
  uint64_t k = 0;
  for (; k < cap && s->pos < s->per_rank; k++, s->pos++) {
    uint64_t g = (s->rank + s->pos * s->world) % s->n;
    out[k] = (int64_t)((s->n - 1 - g + s->offset) % s->n);
  }
  *n = k;
  return DDPLUG_OK;
}

static int sp_seek(ddplug_plugin_sampler *s, uint64_t position) {
  if (position > s->per_rank) return DDPLUG_E_INVALID_ARGUMENT;
  s->pos = position;
  return DDPLUG_OK;
}

static int sp_length(ddplug_plugin_sampler *s, uint64_t *length) {
  *length = s->per_rank;
  return DDPLUG_OK;
}

static void sp_destroy(ddplug_plugin_sampler *s) { free(s); }

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  static ddplug_plugin table;
  const ddplug_plugin *base = ddplug_example_entry_v1_inner(host_abi_version);
  if (!base) return NULL;
  table = *base;
  table.name = "sampler-plugin";
  table.description = "the example backend plus its own sampler slots (test plugin)";
  table.caps |= DDPLUG_CAP_SAMPLER;
  table.sampler_create = sp_create;
  table.sampler_set_epoch = sp_set_epoch;
  table.sampler_next = sp_next;
  table.sampler_seek = sp_seek;
  table.sampler_length = sp_length;
  table.sampler_destroy = sp_destroy;
  return &table;
}
