/* ids.c — the audit of samples by id (an iterable dataset whose samples
 * carry a key): each rank keeps the ids it delivered, mixed by a 64-bit
 * bijection (so that any id set is spread evenly over the hash range), and
 * the finish compares every rank's sorted ids in rounds over slices of the
 * hash range.
 *
 * Bounded memory: a rank keeps at most max(1024, M / world) ids (M =
 * data_split.audit_exact_max). Reaching that, it raises its subset level L
 * by one and keeps only the ids whose mixed value is below 2^(64-L) — half
 * of what it had, in expectation — so the kept set is always "every id whose
 * hash falls in the lowest 2^-L of the range", a choice by id alone: the same
 * id is kept or dropped on every rank and in every delivery. At the finish
 * all ranks use the largest L. A repeat seen in the subset is a real repeat;
 * d repeated ids are all outside the subset with probability (1 - 2^-L)^d.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

/* splitmix64's finalizer: a bijection of the 64-bit integers. */
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Its inverse (for example ids in messages). */
static uint64_t unmix(uint64_t z) {
  z = z ^ (z >> 31) ^ (z >> 62);
  z *= 0x319642b2d24d8ec3ull; /* inverse of 0x94d049bb133111eb mod 2^64 */
  z = z ^ (z >> 27) ^ (z >> 54);
  z *= 0x96de1b173f119089ull; /* inverse of 0xbf58476d1ce4e5b9 mod 2^64 */
  return z ^ (z >> 30) ^ (z >> 60);
}

static int in_level(uint64_t m, uint32_t level) {
  return level == 0 || (level < 64 && (m >> (64 - level)) == 0);
}

static uint64_t keep_max(const ddplug_audit *a) {
  uint64_t per = a->exact_max / (uint64_t)(a->world > 0 ? a->world : 1);
  return per > 1024 ? per : 1024;
}

void ddplug__audit_ids_level(ddplug_audit *a, uint32_t level) {
  if (level <= a->level) return;
  a->level = level;
  uint64_t k = 0;
  for (uint64_t i = 0; i < a->nids; i++)
    if (in_level(a->ids[i], level)) a->ids[k++] = a->ids[i];
  a->nids = k;
}

int ddplug__audit_add_ids(ddplug_audit *a, const uint64_t *ids, uint64_t n,
                          uint64_t steps) {
  uint64_t limit = keep_max(a);
  if (a->scope == DDPLUG__SCOPE_FULL && a->nids + n > a->cap_ids &&
      a->cap_ids < limit) { /* grow first: a failure keeps nothing */
    uint64_t cap = a->cap_ids ? a->cap_ids : 1024;
    while (cap < a->nids + n && cap < limit) cap *= 2;
    if (cap > limit) cap = limit;
    uint64_t *grown = ddplug__realloc(a->ids, sizeof *grown * (size_t)cap);
    if (!grown)
      return ddplug__err(DDPLUG_E_NO_MEMORY,
                         "ddplug_audit_record_ids: stream '%s': out of memory "
                         "for %llu ids (lower data_split.audit_exact_max)",
                         a->stream, (unsigned long long)cap);
    a->ids = grown;
    a->cap_ids = cap;
  }
  a->steps += steps;
  a->deliveries += n;
  uint64_t fp = a->fingerprint;
  for (uint64_t k = 0; k < n; k++) {
    fp = ddplug__fp_step(fp, ids[k]);
    if (a->scope != DDPLUG__SCOPE_FULL) continue;
    uint64_t m = mix(ids[k]);
    if (!in_level(m, a->level)) continue;
    while (a->nids >= limit || a->nids >= a->cap_ids) {
      ddplug__audit_ids_level(a, a->level + 1);
      if (!in_level(m, a->level)) break;
    }
    if (!in_level(m, a->level)) continue;
    a->tracked_deliveries++;
    a->ids[a->nids++] = m;
  }
  a->fingerprint = fp;
  return DDPLUG_OK;
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return (a > b) - (a < b);
}

void ddplug__audit_ids_sort(ddplug_audit *a) {
  if (a->nids > 1) qsort(a->ids, (size_t)a->nids, sizeof *a->ids, cmp_u64);
  /* drop this rank's own repeats, counting them (and a few as examples) */
  uint64_t k = 0;
  a->local_repeats = 0;
  a->nlocal_ex = 0;
  for (uint64_t i = 0; i < a->nids; i++) {
    if (k > 0 && a->ids[k - 1] == a->ids[i]) {
      a->local_repeats++;
      if (a->nlocal_ex < DDPLUG__AUDIT_EXAMPLES &&
          (a->nlocal_ex == 0 || a->local_ex[a->nlocal_ex - 1] != (int64_t)unmix(a->ids[i])))
        a->local_ex[a->nlocal_ex++] = (int64_t)unmix(a->ids[i]);
      continue;
    }
    a->ids[k++] = a->ids[i];
  }
  a->nids = k;
}

/* See data.h. */
void ddplug__audit_add_example(ddplug__audit_coverage *cov, int64_t id) {
  for (int i = 0; i < cov->nrepeat_ex; i++)
    if (cov->repeat_ex[i] == id) return;
  if (cov->nrepeat_ex < DDPLUG__AUDIT_EXAMPLES) cov->repeat_ex[cov->nrepeat_ex++] = id;
}

void ddplug__audit_ids_merge(const uint64_t *const *parts,
                             const uint64_t *counts, int world,
                             ddplug__audit_coverage *cov) {
  /* a world-way merge of sorted, locally distinct parts: equal heads are
   * one id delivered by several ranks */
  uint64_t *pos = ddplug__calloc((size_t)world, sizeof *pos);
  if (!pos) return; /* the caller allocated more than this already */
  for (;;) {
    uint64_t best = 0;
    int have = 0;
    for (int r = 0; r < world; r++)
      if (pos[r] < counts[r] && (!have || parts[r][pos[r]] < best)) {
        best = parts[r][pos[r]];
        have = 1;
      }
    if (!have) break;
    int holders = 0;
    for (int r = 0; r < world; r++)
      if (pos[r] < counts[r] && parts[r][pos[r]] == best) {
        holders++;
        pos[r]++;
      }
    cov->id_distinct++;
    if (holders > 1) {
      cov->id_duplicates += (uint64_t)(holders - 1);
      ddplug__audit_add_example(cov, (int64_t)unmix(best));
    }
  }
  ddplug__free(pos);
}
