/* distributed.c — the default distributed index sampler.
 *
 * The epoch's global order is pi(0), pi(1), ..., pi(N-1) — pi the keyed
 * permutation of feistel.c for (seed, epoch) when shuffling, the
 * identity otherwise — padded by repeating it from the start up to
 * T = per_rank * world positions (or cut to T when drop_last), exactly like
 * torch.utils.data.DistributedSampler: per_rank = ceil(N / world), or
 * floor(N / world) with drop_last. Rank r yields global positions
 * r, r + world, r + 2*world, ... (per_rank of them). Position g >= N is the
 * padding copy of position g mod N. Exact (evaluation): no padding and no
 * cut; rank r yields its positions below N, ceil((N - r) / world) of them,
 * so the ranks' counts differ by at most one.
 *
 * State is O(1) (no index list): set_epoch derives four round keys, seek
 * sets a counter, next computes only this rank's positions.
 *
 * A training (not exact) sampler is served by deal.c's plan, which deals
 * the same positions while the world stays as it began, and also keeps the
 * epoch's global cursor, its commits, and the rest of the epoch dealt over
 * another world after a shrink or a resume. An exact sampler keeps the
 * direct arithmetic below: evaluation passes are not elastic (a pass cut
 * by a shrink is dealt again from its start over the new world).
 *
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

typedef struct dist_sampler {
  uint64_t n, world, rank, seed;
  int shuffle, drop_last, exact;
  uint64_t per_rank; /* indices this rank yields per epoch */
  uint64_t unpadded; /* positions k < unpadded have global position < n */
  uint64_t pos;
  ddplug__feistel perm;
  int elastic; /* not exact: deal serves every slot */
  ddplug__deal deal;
} dist_sampler;

uint64_t ddplug__distributed_per_rank(uint64_t n, uint64_t world,
                                      int drop_last) {
  if (world == 0) return 0;
  return drop_last ? n / world : n / world + (n % world != 0);
}

/* Create from a validated desc (sampler.c checked rank/world/flags). */
static int dist_create(const ddplug_sampler_desc *d, int exact,
                       ddplug_plugin_sampler **out) {
  dist_sampler *s = ddplug__calloc(1, sizeof *s);
  if (!s)
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "distributed sampler: out of memory (%zu bytes)",
                       sizeof *s);
  s->n = d->num_samples;
  s->world = (uint64_t)d->world_size;
  s->rank = (uint64_t)d->rank;
  s->seed = d->seed;
  s->shuffle = d->shuffle;
  s->drop_last = d->drop_last;
  s->exact = exact;
  /* k with rank + k*world < n */
  uint64_t below = s->n > s->rank ? (s->n - s->rank - 1) / s->world + 1 : 0;
  s->per_rank = exact ? below
                      : ddplug__distributed_per_rank(s->n, s->world, s->drop_last);
  s->unpadded = DDPLUG__MIN(below, s->per_rank);
  ddplug__feistel_init(&s->perm, s->n, s->seed, 0, DDPLUG__SALT_DISTRIBUTED);
  s->elastic = !exact;
  if (s->elastic) {
    int st = ddplug__deal_init(&s->deal, s->n, s->seed, s->shuffle, s->drop_last, d->batch_size,
                               d->world_size, d->rank);
    if (st) {
      ddplug__deal_free(&s->deal);
      ddplug__free(s);
      return st;
    }
  }
  *out = (ddplug_plugin_sampler *)s;
  return DDPLUG_OK;
}

ddplug__deal *ddplug__distributed_deal(ddplug_plugin_sampler *ps) {
  dist_sampler *s = (dist_sampler *)ps;
  return s && s->elastic ? &s->deal : NULL;
}

int ddplug__distributed_reshape(ddplug_plugin_sampler *ps, int32_t world, int32_t rank) {
  dist_sampler *s = (dist_sampler *)ps;
  s->world = (uint64_t)world;
  s->rank = (uint64_t)rank;
  uint64_t below = s->n > s->rank ? (s->n - s->rank - 1) / s->world + 1 : 0;
  s->per_rank = s->exact ? below : ddplug__distributed_per_rank(s->n, s->world, s->drop_last);
  s->unpadded = DDPLUG__MIN(below, s->per_rank);
  s->pos = 0;
  return DDPLUG_OK;
}

static int dist_set_epoch(ddplug_plugin_sampler *ps, uint64_t epoch) {
  dist_sampler *s = (dist_sampler *)ps;
  if (s->elastic) return ddplug__deal_start_epoch(&s->deal, epoch);
  ddplug__feistel_init(&s->perm, s->n, s->seed, epoch,
                       DDPLUG__SALT_DISTRIBUTED);
  s->pos = 0;
  return DDPLUG_OK;
}

static int dist_next(ddplug_plugin_sampler *ps, int64_t *out, uint64_t cap,
                     uint64_t *n) {
  dist_sampler *s = (dist_sampler *)ps;
  if (s->elastic) {
    ddplug__deal_next(&s->deal, out, cap, n);
    return DDPLUG_OK;
  }
  uint64_t m = DDPLUG__MIN(cap, s->per_rank - s->pos);
  uint64_t k = s->pos;
  uint64_t done = 0;
  /* The unpadded run: global positions rank + k*world < n. */
  if (k < s->unpadded) {
    uint64_t run = DDPLUG__MIN(m, s->unpadded - k);
    uint64_t g0 = s->rank + k * s->world;
    if (s->shuffle) {
      ddplug__feistel_map(&s->perm, g0, s->world, run, out);
    } else {
      for (uint64_t t = 0; t < run; t++)
        out[t] = (int64_t)(g0 + t * s->world);
    }
    done = run;
  }
  /* Padding: global position g >= n repeats position g mod n. */
  for (; done < m; done++) {
    uint64_t g = (s->rank + (k + done) * s->world) % s->n;
    out[done] =
        (int64_t)(s->shuffle ? ddplug__feistel_apply(&s->perm, g) : g);
  }
  s->pos += m;
  *n = m;
  return DDPLUG_OK;
}

static int dist_seek(ddplug_plugin_sampler *ps, uint64_t position) {
  dist_sampler *s = (dist_sampler *)ps;
  if (s->elastic) return ddplug__deal_seek(&s->deal, position);
  if (position > s->per_rank)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "sampler seek: position %llu is past the end of the "
                       "epoch (rank %llu yields %llu indices per epoch)",
                       (unsigned long long)position,
                       (unsigned long long)s->rank,
                       (unsigned long long)s->per_rank);
  s->pos = position;
  return DDPLUG_OK;
}

static int dist_length(ddplug_plugin_sampler *ps, uint64_t *length) {
  dist_sampler *s = (dist_sampler *)ps;
  *length = s->elastic ? ddplug__deal_length(&s->deal) : s->per_rank;
  return DDPLUG_OK;
}

static void dist_destroy(ddplug_plugin_sampler *ps) {
  dist_sampler *s = (dist_sampler *)ps;
  if (s->elastic) ddplug__deal_free(&s->deal);
  ddplug__free(ps);
}

static void dist_declared(ddplug_plugin_sampler *ps, uint64_t *padded,
                          uint64_t *dropped) {
  dist_sampler *s = (dist_sampler *)ps;
  if (s->exact) {
    *padded = *dropped = 0;
    return;
  }
  if (s->elastic) {
    ddplug__deal_declared(&s->deal, padded, dropped);
    return;
  }
  uint64_t total = s->per_rank * s->world;
  *padded = total > s->n ? total - s->n : 0;
  *dropped = total < s->n ? s->n - total : 0;
}

const ddplug__sampler_ops ddplug__distributed_ops = {
    dist_create, dist_set_epoch, dist_next,    dist_seek,
    dist_length, dist_destroy,   dist_declared};
