/*
 * sampler_plugin.c — libddplug-sampler-plugin.so, a test plugin with its own
 * sampler slots (DDPLUG_CAP_SAMPLER). The process group and collectives are
 * the example backend's: its source is compiled here (included, not copied)
 * with its entry point renamed, and this file's entry point returns a copy
 * of its table with the identity, the capability bit and the sampler slots
 * added.
 *
 * The sampler is recognisably not ddplug's default: positions are padded and
 * strided like DistributedSampler (rank r takes g = r, r+world, ...; g >= N
 * repeats g mod N) but the value at global position g is
 *   (N - 1 - (g mod N) + offset) mod N,  offset = shuffle ? (seed + 7919 *
 *   epoch) mod N : 0
 * — a descending order, rotated per epoch when shuffling. Each rank yields
 * ceil(N / world) positions (floor with drop_last); with desc.batch_size > 1
 * that count is rounded up (down with drop_last) to whole batches, so the
 * padding (or drop) can exceed world - 1: only the plugin knows it, through
 * its sampler_declared slot (ABI 1.2). Only the distributed kind is
 * supported (the bucket kind is refused with DDPLUG_E_UNSUPPORTED,
 * explained through set_error).
 *
 * Built twice (CMakeLists.txt):
 *   libddplug-sampler-plugin.so         plugin ABI 1.2, with sampler_declared
 *   libddplug-sampler-plugin-1.1.so     SP_ABI_1_1: the same sampler as a
 *                                       plugin built against ABI 1.1 (table
 *                                       cut at the 1.1 end, no slot)
 * SPDX-License-Identifier: Apache-2.0
 */
#define ddplug_plugin_entry_v1 ddplug_example_entry_v1_inner
#include "example_plugin.c"
#undef ddplug_plugin_entry_v1

#ifdef SP_ABI_1_1
#define SP_NAME "sampler-plugin-1.1"
#else
#define SP_NAME "sampler-plugin"
#endif

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
                SP_NAME " serves only DDPLUG_SAMPLER_DISTRIBUTED (stream '%s' "
                "asked for kind %d)", d->stream ? d->stream : "?", d->kind);
  ddplug_plugin_sampler *s = calloc(1, sizeof *s);
  if (!s) return fail(g, DDPLUG_E_NO_MEMORY, SP_NAME ": out of memory");
  s->n = d->num_samples;
  s->world = (uint64_t)d->world_size;
  s->rank = (uint64_t)d->rank;
  s->seed = d->seed;
  s->shuffle = d->shuffle;
  s->per_rank = d->drop_last ? s->n / s->world : (s->n + s->world - 1) / s->world;
  uint64_t bs = d->batch_size;
  if (bs > 1) /* whole batches per rank */
    s->per_rank = d->drop_last ? s->per_rank / bs * bs : (s->per_rank + bs - 1) / bs * bs;
  if (s->n == 0) s->per_rank = 0;
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

#ifndef SP_ABI_1_1
/* Positions past N repeat a sample; positions never reached drop one. */
static int sp_declared(ddplug_plugin_sampler *s, uint64_t *padded, uint64_t *dropped) {
  uint64_t total = s->per_rank * s->world;
  *padded = total > s->n ? total - s->n : 0;
  *dropped = total < s->n ? s->n - total : 0;
  return DDPLUG_OK;
}
#endif

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  static ddplug_plugin table;
  const ddplug_plugin *base = ddplug_example_entry_v1_inner(host_abi_version);
  if (!base) return NULL;
  table = *base;
  table.name = SP_NAME;
  table.description = "the example backend plus its own sampler slots (test plugin)";
  table.caps |= DDPLUG_CAP_SAMPLER;
  table.sampler_create = sp_create;
  table.sampler_set_epoch = sp_set_epoch;
  table.sampler_next = sp_next;
  table.sampler_seek = sp_seek;
  table.sampler_length = sp_length;
  table.sampler_destroy = sp_destroy;
#ifdef SP_ABI_1_1
  /* what a plugin built against the ABI 1.1 header returns */
  table.struct_size = (uint32_t)DDPLUG_PLUGIN_SIZE_1_1;
  table.abi_version = DDPLUG_MAKE_VERSION(1, 1);
#else
  table.sampler_declared = sp_declared;
#endif
  return &table;
}
