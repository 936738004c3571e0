/* bucket.c — the default length-bucketed batch sampler (the kind
 * VITS and GPT-SoVITS train with), with equal batch counts on every rank.
 *
 * Buckets. With boundaries u_0 < u_1 < ... < u_{m-1}, bucket i holds the
 * samples with u_{i-1} < length <= u_i (u_{-1} = -inf) and one more bucket
 * holds those longer than u_{m-1} — no sample is silently left out. Without
 * boundaries, num_buckets quantile buckets: the lengths are sorted once and
 * u_k is the length at rank ceil((k+1)·N/num_buckets) - 1 (duplicates
 * merged). Empty buckets are skipped. Membership (sample ids grouped by
 * bucket, ascending within each) is built once at create: 4 or 8 bytes per
 * sample; nothing is rebuilt per epoch.
 *
 * An epoch. Bucket i (n_i samples) is read in the order pi_i (a keyed
 * permutation of [0, n_i) for (seed, epoch, bucket) when shuffling; the
 * identity otherwise), padded by repeating that order (position p >= n_i is
 * a copy of p mod n_i) up to B_i·G positions, G = batch_size·world,
 * B_i = ceil(n_i / G) — or cut to B_i = floor(n_i / G) with drop_last. The
 * j-th batch of bucket i for rank r is positions (j·world + r)·batch_size
 * + [0, batch_size). Every rank therefore has exactly L = sum B_i batches.
 * The order of the L batch slots (bucket, j) is a permutation sigma of [0, L)
 * for (seed, epoch) that is the same on every rank, so at each step all ranks
 * draw from the same bucket (similar lengths across ranks too).
 * set_epoch and seek are O(1); each batch costs O(log buckets + batch_size).
 *
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

typedef struct bucket_sampler {
  uint64_t n, world, rank, bs, seed;
  int shuffle, drop_last;
  uint32_t nb;          /* non-empty buckets                          */
  uint64_t *member_off; /* [nb+1] offsets into the member array       */
  uint64_t *batch_off;  /* [nb+1] prefix sums of per-rank batches B_i  */
  uint32_t *members32;  /* sample ids grouped by bucket (n < 2^32)    */
  uint64_t *members64;  /* ... or 64-bit when n >= 2^32               */
  uint64_t epoch, pos;
  ddplug__feistel order; /* sigma over the batch slots                */
} bucket_sampler;

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Effective upper bounds into *bounds (caller frees), count in *nbounds.
 * Quantile mode sorts a copy of the lengths once. */
static int make_bounds(const ddplug_sampler_desc *d, int64_t **bounds,
                       uint32_t *nbounds) {
  if (d->boundaries) {
    int64_t *b = ddplug__malloc(sizeof *b * (d->num_boundaries + 1u));
    if (!b) return ddplug__err(DDPLUG_E_NO_MEMORY, "bucket sampler: out of memory");
    memcpy(b, d->boundaries, sizeof *b * d->num_boundaries);
    *bounds = b;
    *nbounds = d->num_boundaries;
    return DDPLUG_OK;
  }
  uint64_t n = d->num_samples;
  uint32_t q = d->num_buckets;
  int64_t *b = ddplug__malloc(sizeof *b * ((size_t)q + 1u));
  int64_t *sorted = ddplug__malloc(sizeof *sorted * (size_t)(n ? n : 1));
  if (!b || !sorted) {
    ddplug__free(b);
    ddplug__free(sorted);
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "bucket sampler: out of memory sorting %llu lengths for "
                       "quantile buckets",
                       (unsigned long long)n);
  }
  memcpy(sorted, d->lengths, sizeof *sorted * (size_t)n);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_i64);
  uint32_t m = 0;
  for (uint32_t k = 0; k < q && n > 0; k++) {
    uint64_t at = ((uint64_t)(k + 1) * n + q - 1) / q; /* ceil */
    int64_t u = sorted[at - 1];
    if (m == 0 || u > b[m - 1]) b[m++] = u;
  }
  ddplug__free(sorted);
  *bounds = b;
  *nbounds = m;
  return DDPLUG_OK;
}

/* Index of the bucket of length len: first bound >= len, or nbounds. */
static uint32_t bucket_of(const int64_t *bounds, uint32_t nbounds,
                          int64_t len) {
  uint32_t lo = 0, hi = nbounds;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (bounds[mid] >= len) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

static void bucket_destroy(ddplug_plugin_sampler *ps) {
  bucket_sampler *s = (bucket_sampler *)ps;
  if (!s) return;
  ddplug__free(s->member_off);
  ddplug__free(s->batch_off);
  ddplug__free(s->members32);
  ddplug__free(s->members64);
  ddplug__free(s);
}

/* Group sample ids by bucket (counting sort) and drop empty buckets. */
static int build_members(bucket_sampler *s, const ddplug_sampler_desc *d,
                         const int64_t *bounds, uint32_t nbounds) {
  uint32_t slots = nbounds + 1;
  uint64_t *count = ddplug__calloc(slots, sizeof *count);
  uint32_t *which = ddplug__malloc(sizeof *which * (size_t)(s->n ? s->n : 1));
  if (!count || !which) {
    ddplug__free(count);
    ddplug__free(which);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "bucket sampler: out of memory");
  }
  for (uint64_t i = 0; i < s->n; i++) {
    which[i] = bucket_of(bounds, nbounds, d->lengths[i]);
    count[which[i]]++;
  }
  /* compact the non-empty buckets: dense number of each slot */
  uint32_t *dense = ddplug__malloc(sizeof *dense * slots);
  if (!dense) {
    ddplug__free(count);
    ddplug__free(which);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "bucket sampler: out of memory");
  }
  s->nb = 0;
  for (uint32_t b = 0; b < slots; b++) dense[b] = count[b] ? s->nb++ : UINT32_MAX;
  s->member_off = ddplug__calloc((size_t)s->nb + 1, sizeof *s->member_off);
  s->batch_off = ddplug__calloc((size_t)s->nb + 1, sizeof *s->batch_off);
  int wide = s->n > UINT32_MAX;
  if (wide) s->members64 = ddplug__malloc(sizeof(uint64_t) * (size_t)(s->n ? s->n : 1));
  else s->members32 = ddplug__malloc(sizeof(uint32_t) * (size_t)(s->n ? s->n : 1));
  if (!s->member_off || !s->batch_off || (wide ? !s->members64 : !s->members32)) {
    ddplug__free(count);
    ddplug__free(which);
    ddplug__free(dense);
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "bucket sampler: out of memory for %llu members",
                       (unsigned long long)s->n);
  }
  for (uint32_t b = 0; b < slots; b++)
    if (count[b]) s->member_off[dense[b] + 1] = count[b];
  for (uint32_t i = 0; i < s->nb; i++) s->member_off[i + 1] += s->member_off[i];
  /* fill: reuse count[] as the per-bucket cursor */
  for (uint32_t b = 0; b < slots; b++)
    if (count[b]) count[b] = s->member_off[dense[b]];
  for (uint64_t i = 0; i < s->n; i++) {
    uint64_t at = count[which[i]]++;
    if (wide) s->members64[at] = i;
    else s->members32[at] = (uint32_t)i;
  }
  ddplug__free(count);
  ddplug__free(which);
  ddplug__free(dense);
  uint64_t g = s->bs * s->world;
  for (uint32_t i = 0; i < s->nb; i++) {
    uint64_t ni = s->member_off[i + 1] - s->member_off[i];
    uint64_t bi = s->drop_last ? ni / g : ni / g + (ni % g != 0);
    s->batch_off[i + 1] = s->batch_off[i] + bi;
  }
  return DDPLUG_OK;
}

static int bucket_create(const ddplug_sampler_desc *d, int exact,
                         ddplug_plugin_sampler **out) {
  (void)exact; /* refused for this kind by sampler.c */
  bucket_sampler *s = ddplug__calloc(1, sizeof *s);
  if (!s) return ddplug__err(DDPLUG_E_NO_MEMORY, "bucket sampler: out of memory");
  s->n = d->num_samples;
  s->world = (uint64_t)d->world_size;
  s->rank = (uint64_t)d->rank;
  s->bs = d->batch_size;
  s->seed = d->seed;
  s->shuffle = d->shuffle;
  s->drop_last = d->drop_last;
  int64_t *bounds = NULL;
  uint32_t nbounds = 0;
  int st = make_bounds(d, &bounds, &nbounds);
  if (st == DDPLUG_OK) st = build_members(s, d, bounds, nbounds);
  ddplug__free(bounds);
  if (st != DDPLUG_OK) {
    bucket_destroy((ddplug_plugin_sampler *)s);
    return st;
  }
  ddplug__feistel_init(&s->order, s->batch_off[s->nb], s->seed, 0,
                       DDPLUG__SALT_BATCH_ORDER);
  *out = (ddplug_plugin_sampler *)s;
  return DDPLUG_OK;
}

static int bucket_set_epoch(ddplug_plugin_sampler *ps, uint64_t epoch) {
  bucket_sampler *s = (bucket_sampler *)ps;
  s->epoch = epoch;
  s->pos = 0;
  ddplug__feistel_init(&s->order, s->batch_off[s->nb], s->seed, epoch,
                       DDPLUG__SALT_BATCH_ORDER);
  return DDPLUG_OK;
}

static int bucket_next(ddplug_plugin_sampler *ps, int64_t *out, uint64_t cap,
                       uint64_t *n) {
  bucket_sampler *s = (bucket_sampler *)ps;
  uint64_t total = s->batch_off[s->nb];
  if (s->pos >= total) {
    *n = 0;
    return DDPLUG_OK;
  }
  if (cap < s->bs)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "bucket sampler next: cap %llu is smaller than one "
                       "batch (batch_size %llu)",
                       (unsigned long long)cap, (unsigned long long)s->bs);
  uint64_t slot = s->shuffle ? ddplug__feistel_apply(&s->order, s->pos) : s->pos;
  /* bucket i with batch_off[i] <= slot < batch_off[i+1] */
  uint32_t lo = 0, hi = s->nb - 1;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo + 1) / 2;
    if (s->batch_off[mid] <= slot) lo = mid;
    else hi = mid - 1;
  }
  uint64_t j = slot - s->batch_off[lo];
  uint64_t base = s->member_off[lo];
  uint64_t ni = s->member_off[lo + 1] - base;
  ddplug__feistel pi;
  if (s->shuffle)
    ddplug__feistel_init(&pi, ni, s->seed, s->epoch,
                         DDPLUG__SALT_BUCKET + ((uint64_t)lo << 32));
  uint64_t p0 = (j * s->world + s->rank) * s->bs;
  if (p0 + s->bs <= ni) { /* no padding in this batch: one run */
    if (s->shuffle) {
      ddplug__feistel_map(&pi, p0, 1, s->bs, out);
    } else {
      for (uint64_t t = 0; t < s->bs; t++) out[t] = (int64_t)(p0 + t);
    }
  } else { /* padding: positions wrap around the bucket */
    uint64_t p = p0 % ni;
    for (uint64_t t = 0; t < s->bs; t++) {
      out[t] = (int64_t)(s->shuffle ? ddplug__feistel_apply(&pi, p) : p);
      if (++p == ni) p = 0;
    }
  }
  for (uint64_t t = 0; t < s->bs; t++) {
    uint64_t p = (uint64_t)out[t];
    out[t] = (int64_t)(s->members64 ? s->members64[base + p]
                                    : s->members32[base + p]);
  }
  s->pos++;
  *n = s->bs;
  return DDPLUG_OK;
}

static int bucket_seek(ddplug_plugin_sampler *ps, uint64_t position) {
  bucket_sampler *s = (bucket_sampler *)ps;
  uint64_t total = s->batch_off[s->nb];
  if (position > total)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "bucket sampler seek: batch %llu is past the end of the "
                       "epoch (rank %llu yields %llu batches per epoch)",
                       (unsigned long long)position,
                       (unsigned long long)s->rank, (unsigned long long)total);
  s->pos = position;
  return DDPLUG_OK;
}

static int bucket_length(ddplug_plugin_sampler *ps, uint64_t *length) {
  bucket_sampler *s = (bucket_sampler *)ps;
  *length = s->batch_off[s->nb];
  return DDPLUG_OK;
}

static void bucket_declared(ddplug_plugin_sampler *ps, uint64_t *padded,
                            uint64_t *dropped) {
  bucket_sampler *s = (bucket_sampler *)ps;
  uint64_t g = s->bs * s->world;
  *padded = *dropped = 0;
  for (uint32_t i = 0; i < s->nb; i++) {
    uint64_t ni = s->member_off[i + 1] - s->member_off[i];
    uint64_t slots = (s->batch_off[i + 1] - s->batch_off[i]) * g;
    if (slots > ni) *padded += slots - ni;
    else *dropped += ni - slots;
  }
}

const ddplug__sampler_ops ddplug__bucket_ops = {
    bucket_create, bucket_set_epoch, bucket_next,    bucket_seek,
    bucket_length, bucket_destroy,   bucket_declared};
