/* test-sampler.c — property tests of the default samplers over N (0, 1,
 * primes, 10^6) x world (1..8) x batch x drop_last x shuffle: equal length
 * on every rank, disjointness, coverage, declared padding/dropping,
 * determinism, a new order per epoch, resume at any position equal to the
 * uninterrupted order, chunking independence, torch DistributedSampler's
 * order when not shuffling; the Feistel permutation (bijection, pinned
 * values, rough uniformity); desc validation; allocation failures. */
#include <stdarg.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/data.h"
#include "harness.h"

/* ---- helpers ------------------------------------------------------------ */

static ddplug_sampler *make(int kind, uint64_t n, int rank, int world,
                            int shuffle, int drop_last, uint64_t seed) {
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = kind;
  d.num_samples = n;
  d.rank = rank;
  d.world_size = world;
  d.shuffle = shuffle;
  d.drop_last = drop_last;
  d.seed = seed;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_sampler_new(&d, &s));
  return s;
}

/* Read the rest of the epoch in chunks of `chunk`; returns the count. */
static uint64_t drain(ddplug_sampler *s, int64_t *out, uint64_t cap,
                      uint64_t chunk) {
  uint64_t total = 0, got;
  for (;;) {
    uint64_t want = DDPLUG__MIN(chunk, cap - total);
    CHECK_OK(ddplug_sampler_next(s, out + total, want, &got));
    if (got == 0) break;
    total += got;
    CHECK(total <= cap);
    if (total == cap) {
      CHECK_OK(ddplug_sampler_next(s, out + total, 0, &got));
      CHECK_EQ_INT(got, 0);
      int64_t extra[4];
      CHECK_OK(ddplug_sampler_next(s, extra, 4, &got));
      CHECK_EQ_INT(got, 0);
      break;
    }
  }
  return total;
}

/* ---- the permutation ---------------------------------------------------- */

TEST(feistel_is_a_bijection_for_every_small_n) {
  uint8_t *seen = malloc(5000);
  for (uint64_t n = 1; n <= 5000; n += (n < 300 ? 1 : 37)) {
    for (uint64_t seed = 0; seed < 3; seed++) {
      ddplug__feistel f;
      ddplug__feistel_init(&f, n, seed, seed * 7, DDPLUG__SALT_DISTRIBUTED);
      memset(seen, 0, n);
      for (uint64_t i = 0; i < n; i++) {
        uint64_t v = ddplug__feistel_apply(&f, i);
        CHECK_MSG(v < n, "n=%llu: pi(%llu) = %llu out of range",
                  (unsigned long long)n, (unsigned long long)i, (unsigned long long)v);
        CHECK_MSG(!seen[v], "n=%llu: %llu hit twice", (unsigned long long)n,
                  (unsigned long long)v);
        seen[v] = 1;
      }
    }
  }
  free(seen);
}

TEST(feistel_map_equals_apply_for_any_start_stride_count) {
  static const uint64_t ns[] = {2, 3, 65, 1000, 65537, 1000003, 1ull << 40,
                                (1ull << 62) + 12345};
  int64_t out[3000];
  for (size_t k = 0; k < DDPLUG__ARRAY_LEN(ns); k++) {
    ddplug__feistel f;
    ddplug__feistel_init(&f, ns[k], 99, 3, 0);
    uint64_t stride = ns[k] > 10000 ? 7 : 1;
    uint64_t count = DDPLUG__MIN(ns[k] / stride, (uint64_t)3000);
    ddplug__feistel_map(&f, 0, stride, count, out);
    for (uint64_t t = 0; t < count; t++)
      CHECK(out[t] == (int64_t)ddplug__feistel_apply(&f, t * stride));
    /* odd counts and starts exercise partial blocks and windows */
    uint64_t start = ns[k] / 3, c2 = DDPLUG__MIN(ns[k] - start, (uint64_t)1031);
    ddplug__feistel_map(&f, start, 1, c2, out);
    for (uint64_t t = 0; t < c2; t++)
      CHECK(out[t] == (int64_t)ddplug__feistel_apply(&f, start + t));
  }
}

/* The algorithm is part of the contract (same order on every machine and
 * release): these values were computed once — and are reproduced by an
 * independent Python transcription of the documented algorithms,
 * tests/data/feistel_reference.py (feistel_reference_transcription_agrees
 * runs it) — and must never change. */
TEST(feistel_values_are_pinned) {
  ddplug__feistel f;
  ddplug__feistel_init(&f, 1000000, 42, 0, DDPLUG__SALT_DISTRIBUTED);
  uint64_t got[6];
  for (int i = 0; i < 6; i++) got[i] = ddplug__feistel_apply(&f, (uint64_t)i);
  dt_note("pi(0..5) for N=1e6 seed 42 epoch 0: %llu %llu %llu %llu %llu %llu",
          (unsigned long long)got[0], (unsigned long long)got[1],
          (unsigned long long)got[2], (unsigned long long)got[3],
          (unsigned long long)got[4], (unsigned long long)got[5]);
  static const uint64_t want[6] = {778893, 52246, 643670, 42559, 628590, 804822};
  for (int i = 0; i < 6; i++) CHECK_EQ_INT(got[i], want[i]);
}

TEST(feistel_looks_uniform) {
  /* Over many keys: mean of pi(0) near (n-1)/2, about one fixed point per
   * permutation, and pi(0) hits every decile. Loose bounds: a broken round
   * function (identity, constant key) fails them by far. */
  const uint64_t n = 1000;
  const int trials = 4000;
  double sum = 0;
  long fixed = 0;
  int deciles[10] = {0};
  for (int e = 0; e < trials; e++) {
    ddplug__feistel f;
    ddplug__feistel_init(&f, n, 5, (uint64_t)e, 0);
    uint64_t v0 = ddplug__feistel_apply(&f, 0);
    sum += (double)v0;
    deciles[v0 * 10 / n]++;
    for (uint64_t i = 0; i < n; i++) fixed += ddplug__feistel_apply(&f, i) == i;
  }
  double mean = sum / trials;
  dt_note("mean pi(0) %.1f (ideal 499.5), fixed points per perm %.3f (ideal 1)",
          mean, (double)fixed / trials);
  CHECK(mean > 470 && mean < 530);
  CHECK((double)fixed / trials > 0.8 && (double)fixed / trials < 1.2);
  for (int d = 0; d < 10; d++) CHECK(deciles[d] > 300 && deciles[d] < 500);
}

/* ---- the distributed sampler -------------------------------------------- */

static const uint64_t kNs[] = {0, 1, 2, 3, 7, 13, 97, 1009, 4099};

/* Check every property for one (n, world, shuffle, drop_last). */
static void check_distributed(uint64_t n, int world, int shuffle, int drop) {
  uint64_t per = drop ? n / (uint64_t)world : (n + (uint64_t)world - 1) / (uint64_t)world;
  uint64_t total = per * (uint64_t)world;
  int64_t *all = malloc(sizeof *all * (total + 1));
  uint32_t *count = calloc(n + 1, sizeof *count);
  int64_t *again = malloc(sizeof *again * (per + 1));
  for (int r = 0; r < world; r++) {
    ddplug_sampler *s = make(DDPLUG_SAMPLER_DISTRIBUTED, n, r, world, shuffle, drop, 7);
    uint64_t len;
    CHECK_OK(ddplug_sampler_length(s, &len));
    CHECK_EQ_INT(len, per);
    CHECK_OK(ddplug_sampler_set_epoch(s, 3));
    int64_t *mine = all + (uint64_t)r * per;
    CHECK_EQ_INT(drain(s, mine, per, 1 + (uint64_t)r * 5), per);
    for (uint64_t k = 0; k < per; k++) {
      CHECK(mine[k] >= 0 && (uint64_t)mine[k] < n);
      count[mine[k]]++;
      if (!shuffle) /* torch: indices[rank:total:world] of a padded range */
        CHECK_EQ_INT(mine[k], (int64_t)(((uint64_t)r + k * (uint64_t)world) % n));
    }
    /* determinism and resume: a fresh sampler, seek(p), same tail */
    ddplug_sampler *s2 = make(DDPLUG_SAMPLER_DISTRIBUTED, n, r, world, shuffle, drop, 7);
    CHECK_OK(ddplug_sampler_set_epoch(s2, 3));
    uint64_t p = per / 3;
    CHECK_OK(ddplug_sampler_seek(s2, p));
    uint64_t pos;
    CHECK_OK(ddplug_sampler_position(s2, &pos));
    CHECK_EQ_INT(pos, p);
    CHECK_EQ_INT(drain(s2, again, per - p, 4096), per - p);
    CHECK(memcmp(again, mine + p, sizeof *again * (per - p)) == 0);
    CHECK_OK(ddplug_sampler_position(s2, &pos));
    CHECK_EQ_INT(pos, per);
    ddplug_sampler_free(s2);
    ddplug_sampler_free(s);
  }
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  ddplug_sampler *s = make(DDPLUG_SAMPLER_DISTRIBUTED, n, 0, world, shuffle, drop, 7);
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  ddplug_sampler_free(s);
  uint64_t distinct = 0, dups = 0;
  for (uint64_t i = 0; i < n; i++) {
    distinct += count[i] > 0;
    dups += count[i] > 1 ? count[i] - 1 : 0;
  }
  if (drop) { /* disjoint, and only the declared few are left out */
    CHECK_EQ_INT(dups, 0);
    CHECK_EQ_INT(distinct, total);
    CHECK_EQ_INT(info.dropped, n - total);
    CHECK(info.dropped < (uint64_t)world);
  } else { /* full coverage; repeats only the declared padding */
    CHECK_EQ_INT(distinct, n);
    CHECK_EQ_INT(dups, total - n);
    CHECK_EQ_INT(info.padded, total - n);
  }
  free(all);
  free(count);
  free(again);
}

TEST(distributed_properties_over_n_world_shuffle_drop) {
  for (size_t k = 0; k < DDPLUG__ARRAY_LEN(kNs); k++)
    for (int world = 1; world <= 8; world++)
      for (int shuffle = 0; shuffle <= 1; shuffle++)
        for (int drop = 0; drop <= 1; drop++)
          check_distributed(kNs[k], world, shuffle, drop);
}

TEST(distributed_properties_at_one_million) {
  for (int world = 1; world <= 8; world++)
    for (int drop = 0; drop <= 1; drop++)
      check_distributed(1000000, world, 1, drop);
  check_distributed(1000000, 8, 0, 0);
}

TEST(distributed_reshuffles_per_epoch_and_per_seed) {
  const uint64_t n = 1009, per = (n + 3) / 4;
  int64_t a[300], b[300], c[300];
  ddplug_sampler *s = make(DDPLUG_SAMPLER_DISTRIBUTED, n, 1, 4, 1, 0, 11);
  CHECK_OK(ddplug_sampler_set_epoch(s, 0));
  CHECK_EQ_INT(drain(s, a, per, 100), per);
  CHECK_OK(ddplug_sampler_set_epoch(s, 1));
  CHECK_EQ_INT(drain(s, b, per, 100), per);
  CHECK_OK(ddplug_sampler_set_epoch(s, 0)); /* back to epoch 0: same order */
  CHECK_EQ_INT(drain(s, c, per, 7), per);
  CHECK(memcmp(a, c, sizeof a[0] * per) == 0);
  int same = 0;
  for (uint64_t k = 0; k < per; k++) same += a[k] == b[k];
  CHECK_MSG(same < 10, "epochs 0 and 1 agree at %d of %llu positions", same,
            (unsigned long long)per);
  ddplug_sampler_free(s);
  ddplug_sampler *t = make(DDPLUG_SAMPLER_DISTRIBUTED, n, 1, 4, 1, 0, 12);
  CHECK_EQ_INT(drain(t, c, per, 100), per);
  same = 0;
  for (uint64_t k = 0; k < per; k++) same += a[k] == c[k];
  CHECK(same < 10);
  ddplug_sampler_free(t);
}

TEST(distributed_seek_anywhere_including_padding_and_end) {
  /* n=10, world=4: per=3, positions 10 and 11 are padding */
  const uint64_t n = 10;
  for (int r = 0; r < 4; r++) {
    ddplug_sampler *s = make(DDPLUG_SAMPLER_DISTRIBUTED, n, r, 4, 1, 0, 3);
    int64_t full[3], one;
    uint64_t got;
    CHECK_EQ_INT(drain(s, full, 3, 1), 3);
    for (uint64_t p = 0; p <= 3; p++) {
      CHECK_OK(ddplug_sampler_seek(s, p));
      CHECK_OK(ddplug_sampler_next(s, &one, 1, &got));
      CHECK_EQ_INT(got, p < 3 ? 1 : 0);
      if (got) CHECK_EQ_INT(one, full[p]);
    }
    CHECK_STATUS(ddplug_sampler_seek(s, 4), DDPLUG_E_INVALID_ARGUMENT);
    CHECK_CONTAINS(ddplug_last_error(), "past the end of the epoch");
    ddplug_sampler_free(s);
  }
}

TEST(distributed_handles_huge_n_in_constant_memory) {
  /* 1e12 samples: creating, starting an epoch and seeking are O(1). */
  const uint64_t n = 1000000000000ull;
  ddplug_sampler *s = make(DDPLUG_SAMPLER_DISTRIBUTED, n, 5, 8, 1, 0, 1);
  uint64_t len;
  CHECK_OK(ddplug_sampler_length(s, &len));
  CHECK_EQ_INT(len, n / 8);
  CHECK_OK(ddplug_sampler_set_epoch(s, 9));
  CHECK_OK(ddplug_sampler_seek(s, len - 2));
  int64_t out[4];
  uint64_t got;
  CHECK_OK(ddplug_sampler_next(s, out, 4, &got));
  CHECK_EQ_INT(got, 2);
  CHECK(out[0] >= 0 && (uint64_t)out[0] < n && out[0] != out[1]);
  ddplug_sampler_free(s);
}

/* ---- the bucket sampler ------------------------------------------------- */

typedef struct bucket_case {
  uint64_t n;
  int world, shuffle, drop;
  uint64_t bs;
  int quantile; /* 0: explicit boundaries {10, 50, 200}; else num_buckets */
} bucket_case;

static int64_t length_of(uint64_t i) { return (int64_t)((i * 2654435761u) % 300); }

static int bucket_index(int64_t len) { /* bounds {10, 50, 200} + overflow */
  return len <= 10 ? 0 : len <= 50 ? 1 : len <= 200 ? 2 : 3;
}

static int cmp_len(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The upper bounds of q quantile buckets of lengths[n], computed here from
 * the documented rule (u_k = the length at sorted rank ceil((k+1)n/q) - 1,
 * duplicates merged) — independently of sampler_bucket.c. Returns how many
 * (<= q) are in bounds[]. */
static uint32_t quantile_bounds(const int64_t *lengths, uint64_t n, uint32_t q,
                                int64_t *bounds) {
  if (n == 0) return 0;
  int64_t *sorted = malloc(sizeof *sorted * n);
  memcpy(sorted, lengths, sizeof *sorted * n);
  qsort(sorted, n, sizeof *sorted, cmp_len);
  uint32_t m = 0;
  for (uint32_t k = 0; k < q; k++) {
    int64_t u = sorted[((uint64_t)(k + 1) * n + q - 1) / q - 1];
    if (m == 0 || u > bounds[m - 1]) bounds[m++] = u;
  }
  free(sorted);
  return m;
}

/* The interval (bounds[i-1], bounds[i]] holding len; m = past the last. */
static uint32_t interval_of(const int64_t *bounds, uint32_t m, int64_t len) {
  uint32_t i = 0;
  while (i < m && len > bounds[i]) i++;
  return i;
}

static void check_bucket(const bucket_case *c) {
  int64_t *lengths = malloc(sizeof *lengths * (c->n + 1));
  for (uint64_t i = 0; i < c->n; i++) lengths[i] = length_of(i);
  static const int64_t bounds[] = {10, 50, 200};
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_BUCKET;
  d.num_samples = c->n;
  d.world_size = c->world;
  d.shuffle = c->shuffle;
  d.drop_last = c->drop;
  d.seed = 5;
  d.lengths = lengths;
  d.batch_size = c->bs;
  if (c->quantile) d.num_buckets = (uint32_t)c->quantile;
  else {
    d.boundaries = bounds;
    d.num_boundaries = 3;
  }
  /* the buckets every sample must be in, computed independently */
  int64_t qb[64];
  uint32_t nq = 3;
  if (c->quantile) nq = quantile_bounds(lengths, c->n, (uint32_t)c->quantile, qb);
  else memcpy(qb, bounds, sizeof bounds);
  uint64_t sizes[65] = {0};
  for (uint64_t i = 0; i < c->n; i++) sizes[interval_of(qb, nq, lengths[i])]++;
  /* equal batch counts: sum over buckets of ceil (floor: drop_last) of
   * bucket size / (batch_size * world) */
  uint64_t want_len = 0, global = c->bs * (uint64_t)c->world;
  for (uint32_t b = 0; b <= nq; b++)
    want_len += c->drop ? sizes[b] / global : (sizes[b] + global - 1) / global;
  if (c->quantile && c->n >= 1000) {
    /* quantile buckets hold about N/q samples each (the 300 distinct
     * lengths make ties move at most ~N/300 across a bound) */
    CHECK_EQ_INT(nq, c->quantile);
    CHECK_EQ_INT(sizes[nq], 0); /* the last bound is the maximum length */
    for (uint32_t b = 0; b < nq; b++)
      CHECK_MSG(sizes[b] * 10 >= c->n / (uint64_t)c->quantile * 9 &&
                    sizes[b] * 10 <= c->n / (uint64_t)c->quantile * 11,
                "n=%llu q=%d: bucket %u holds %llu samples",
                (unsigned long long)c->n, c->quantile, b, (unsigned long long)sizes[b]);
  }
  uint64_t len0 = 0;
  uint32_t *count = calloc(c->n + 1, sizeof *count);
  int64_t *batches[8] = {0};
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  for (int r = 0; r < c->world; r++) {
    d.rank = r;
    ddplug_sampler *s = NULL;
    CHECK_OK(ddplug_sampler_new(&d, &s));
    CHECK_OK(ddplug_sampler_set_epoch(s, 2));
    uint64_t len;
    CHECK_OK(ddplug_sampler_length(s, &len));
    if (r == 0) len0 = len;
    CHECK_EQ_INT(len, len0); /* equal batch counts on every rank */
    CHECK_EQ_INT(len, want_len);
    batches[r] = malloc(sizeof(int64_t) * (len * c->bs + 1));
    uint64_t got, nb = 0;
    int64_t *buf = batches[r];
    while (1) {
      CHECK_OK(ddplug_sampler_next(s, buf + nb * c->bs, c->bs + 3, &got));
      if (got == 0) break;
      CHECK_EQ_INT(got, c->bs); /* one whole batch per call */
      uint32_t b0 = interval_of(qb, nq, lengths[buf[nb * c->bs]]);
      for (uint64_t t = 0; t < c->bs; t++) {
        int64_t idx = buf[nb * c->bs + t];
        CHECK(idx >= 0 && (uint64_t)idx < c->n);
        count[idx]++;
        /* the whole batch inside one bucket: (qb[b0-1], qb[b0]] */
        CHECK_MSG(interval_of(qb, nq, lengths[idx]) == b0,
                  "n=%llu world=%d q=%d: batch %llu mixes length %lld with a "
                  "batch of bucket %u", (unsigned long long)c->n, c->world,
                  c->quantile, (unsigned long long)nb, (long long)lengths[idx], b0);
        if (!c->quantile) CHECK_EQ_INT(bucket_index(lengths[idx]), (int)b0);
      }
      nb++;
    }
    CHECK_EQ_INT(nb, len);
    /* resume at a batch position = the uninterrupted tail */
    if (len > 1) {
      uint64_t p = len / 2;
      CHECK_OK(ddplug_sampler_seek(s, p));
      int64_t *tail = malloc(sizeof(int64_t) * c->bs);
      CHECK_OK(ddplug_sampler_next(s, tail, c->bs, &got));
      CHECK(memcmp(tail, buf + p * c->bs, sizeof(int64_t) * c->bs) == 0);
      free(tail);
    }
    if (r == 0) CHECK_OK(ddplug_sampler_info_get(s, &info));
    ddplug_sampler_free(s);
  }
  /* at each step every rank draws from the same bucket */
  for (uint64_t j = 0; j < len0; j++)
    for (int r = 1; r < c->world; r++)
      CHECK_EQ_INT(interval_of(qb, nq, lengths[batches[r][j * c->bs]]),
                   interval_of(qb, nq, lengths[batches[0][j * c->bs]]));
  uint64_t distinct = 0, dups = 0;
  for (uint64_t i = 0; i < c->n; i++) {
    distinct += count[i] > 0;
    dups += count[i] > 1 ? count[i] - 1 : 0;
  }
  uint64_t deliveries = len0 * c->bs * (uint64_t)c->world;
  if (c->drop) {
    CHECK_EQ_INT(dups, 0);
    CHECK_EQ_INT(distinct + info.dropped, c->n);
  } else {
    CHECK_EQ_INT(distinct, c->n);
    CHECK_EQ_INT(dups, info.padded);
  }
  CHECK_EQ_INT(deliveries, c->n + info.padded - info.dropped);
  for (int r = 0; r < c->world; r++) free(batches[r]);
  free(count);
  free(lengths);
}

TEST(bucket_properties_over_n_world_batch_shuffle_drop) {
  static const uint64_t ns[] = {0, 1, 7, 97, 1009, 20011};
  static const uint64_t bss[] = {1, 3, 16};
  for (size_t k = 0; k < DDPLUG__ARRAY_LEN(ns); k++)
    for (int world = 1; world <= 8; world++)
      for (size_t b = 0; b < DDPLUG__ARRAY_LEN(bss); b++)
        for (int flags = 0; flags < 8; flags++) {
          bucket_case c = {ns[k], world, flags & 1, (flags >> 1) & 1, bss[b],
                           (flags & 4) ? 5 : 0};
          check_bucket(&c);
        }
}

TEST(bucket_at_one_million_eight_ranks) {
  bucket_case c = {1000000, 8, 1, 0, 32, 0};
  check_bucket(&c);
  c.drop = 1;
  c.quantile = 10;
  check_bucket(&c);
}

TEST(bucket_reshuffles_per_epoch_and_is_deterministic) {
  int64_t lengths[500];
  for (int i = 0; i < 500; i++) lengths[i] = length_of((uint64_t)i);
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_BUCKET;
  d.num_samples = 500;
  d.world_size = 2;
  d.shuffle = 1;
  d.seed = 9;
  d.lengths = lengths;
  d.batch_size = 4;
  d.num_buckets = 4;
  ddplug_sampler *a = NULL, *b = NULL;
  CHECK_OK(ddplug_sampler_new(&d, &a));
  CHECK_OK(ddplug_sampler_new(&d, &b));
  int64_t x[4], y[4];
  uint64_t gx, gy, len;
  CHECK_OK(ddplug_sampler_length(a, &len));
  int same_epoch_diff = 0, next_epoch_same = 0;
  for (uint64_t j = 0; j < len; j++) {
    CHECK_OK(ddplug_sampler_next(a, x, 4, &gx));
    CHECK_OK(ddplug_sampler_next(b, y, 4, &gy));
    same_epoch_diff += memcmp(x, y, sizeof x) != 0;
  }
  CHECK_EQ_INT(same_epoch_diff, 0);
  CHECK_OK(ddplug_sampler_set_epoch(a, 0));
  CHECK_OK(ddplug_sampler_set_epoch(b, 1));
  for (uint64_t j = 0; j < len; j++) {
    CHECK_OK(ddplug_sampler_next(a, x, 4, &gx));
    CHECK_OK(ddplug_sampler_next(b, y, 4, &gy));
    next_epoch_same += memcmp(x, y, sizeof x) == 0;
  }
  CHECK_MSG(next_epoch_same < 3, "%d of %llu batches repeat across epochs",
            next_epoch_same, (unsigned long long)len);
  /* cap smaller than a batch: refused, nothing consumed */
  uint64_t pos;
  CHECK_OK(ddplug_sampler_seek(a, 0));
  CHECK_STATUS(ddplug_sampler_next(a, x, 3, &gx), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "smaller than one batch");
  CHECK_OK(ddplug_sampler_position(a, &pos));
  CHECK_EQ_INT(pos, 0);
  ddplug_sampler_free(a);
  ddplug_sampler_free(b);
}

/* ---- what a plugin's sampler declares ----------------------------------- */

static ddplug_sampler_options dist_desc(uint64_t n, int world) {
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = n;
  d.world_size = world;
  return d;
}

/* The plugin ABI's desc the runtime hands a plugin's sampler slots. */
static ddplug_sampler_desc plugin_desc(ddplug_sampler_options o) {
  ddplug_sampler_desc d;
  int exact = 0;
  CHECK_OK(ddplug__sampler_options_to_desc(&o, &d, &exact, "test"));
  return d;
}

TEST(the_remainder_is_derived_only_in_the_direction_drop_last_says) {
  uint64_t p, dr;
  /* distributed: torch's ceil/floor of N / world, nothing beyond, and
   * padding only without drop_last, dropping only with it */
  static const struct { uint64_t n; int world, drop; uint64_t len, padded, dropped; } dc[] = {
      {1001, 4, 0, 251, 3, 0}, {1001, 4, 1, 250, 0, 1}, {1000, 4, 0, 250, 0, 0},
      {1001, 4, 0, 250, 0, 0}, /* shorter than padding makes it: not declared */
      {1001, 4, 1, 251, 0, 0}, /* longer with drop_last: not declared */
      {1001, 4, 0, 252, 0, 0}, /* 7 repeats: more than equal lengths need */
      {1001, 4, 0, 500, 0, 0}, {1001, 4, 0, 0, 0, 0},   {0, 3, 0, 0, 0, 0},
      {1, 8, 0, 1, 7, 0},      {7, 8, 1, 0, 0, 7},      {5, 1, 0, 5, 0, 0}};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(dc); i++) {
    ddplug_sampler_options o = dist_desc(dc[i].n, dc[i].world);
    o.drop_last = dc[i].drop;
    ddplug_sampler_desc d = plugin_desc(o);
    ddplug__sampler_derive_declared(&d, dc[i].len, &p, &dr);
    CHECK_MSG(p == dc[i].padded && dr == dc[i].dropped,
              "N=%llu world=%d drop_last %d length %llu: derived padded %llu dropped %llu",
              (unsigned long long)dc[i].n, dc[i].world, dc[i].drop, (unsigned long long)dc[i].len,
              (unsigned long long)p, (unsigned long long)dr);
  }
  /* bucket: less than one global batch (batch_size * world) per bucket */
  static const int64_t lens[100] = {0};
  static const int64_t two[2] = {1, 2};
  ddplug_sampler_options b = dist_desc(100, 2);
  b.kind = DDPLUG_SAMPLER_BUCKET;
  b.batch_size = 4;
  b.lengths = lens;
  b.num_buckets = 3; /* at most 3 * 8 - 1 padded or dropped */
  static const struct { int drop; uint64_t len, padded, dropped; } bc[] = {
      {0, 13, 4, 0}, {1, 12, 0, 4}, {0, 15, 20, 0}, {0, 16, 0, 0}, {1, 10, 0, 20},
      {1, 9, 0, 0}, {0, 12, 0, 0}, {1, 13, 0, 0}};
  for (int k = 0; k < 2; k++) {
    if (k) { /* 2 explicit bounds: 3 buckets too */
      b.num_buckets = 0;
      b.num_boundaries = 2;
      b.boundaries = two;
    }
    for (size_t i = 0; i < DDPLUG__ARRAY_LEN(bc); i++) {
      b.drop_last = bc[i].drop;
      ddplug_sampler_desc d = plugin_desc(b);
      ddplug__sampler_derive_declared(&d, bc[i].len, &p, &dr);
      CHECK_MSG(p == bc[i].padded && dr == bc[i].dropped,
                "bucket length %llu drop_last %d: derived padded %llu dropped %llu",
                (unsigned long long)bc[i].len, bc[i].drop, (unsigned long long)p,
                (unsigned long long)dr);
    }
  }
  /* no overflow at the extremes */
  ddplug_sampler_desc h = plugin_desc(dist_desc(UINT64_MAX / 2, 8));
  ddplug__sampler_derive_declared(&h, UINT64_MAX / 4, &p, &dr);
  CHECK_EQ_INT(p, 0);
  CHECK_EQ_INT(dr, 0);
}

static int fake_declared_ok(ddplug_plugin_sampler *s, uint64_t *padded, uint64_t *dropped) {
  (void)s;
  *padded = 23;
  *dropped = 2;
  return DDPLUG_OK;
}

static int fake_declared_fails(ddplug_plugin_sampler *s, uint64_t *padded, uint64_t *dropped) {
  (void)s;
  *padded = 999; /* must not be used */
  *dropped = 999;
  return DDPLUG_E_INTERNAL;
}

static int g_declared_warnings;
static void capture_declared(void *user, int level, int rank, const char *line) {
  (void)user;
  (void)rank;
  if (level == DDPLUG_LOG_WARN && strstr(line, "the plugin's sampler_declared failed"))
    g_declared_warnings++;
}

TEST(a_plugin_sampler_declares_through_its_slot_else_it_is_derived) {
  ddplug_sampler_options d = dist_desc(1001, 4);
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_sampler_new(&d, &s));
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_INT(info.from_plugin, 0);
  CHECK_EQ_INT(info.padded, 3); /* the default's own numbers */
  /* served as a plugin's sampler would be: the slot's numbers win, even
   * beyond what could be derived */
  s->ops.declared = NULL;
  s->from_plugin = 1;
  s->plugin_declared = fake_declared_ok;
  CHECK_OK(ddplug_sampler_set_epoch(s, 1));
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_INT(info.from_plugin, 1);
  CHECK_EQ_INT(info.padded, 23);
  CHECK_EQ_INT(info.dropped, 2);
  /* a failing slot: logged, and derived from the length (251 per rank) */
  ddplug_log_set_callback(capture_declared, NULL);
  s->plugin_declared = fake_declared_fails;
  CHECK_OK(ddplug_sampler_set_epoch(s, 2));
  ddplug_log_set_callback(NULL, NULL);
  CHECK_EQ_INT(g_declared_warnings, 1);
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_INT(info.padded, 3);
  CHECK_EQ_INT(info.dropped, 0);
  /* no slot (a plugin built against ABI 1.1): derived */
  s->plugin_declared = NULL;
  CHECK_OK(ddplug_sampler_set_epoch(s, 3));
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_INT(info.padded, 3);
  ddplug_sampler_free(s);
}

/* ---- pinned orders (golden values) ---------------------------------------

   The order of every sampler is part of the contract: a checkpoint saved by
   one release resumes at a position in another. The lines below were
   computed once and are reproduced by tests/data/feistel_reference.py, an
   independent transcription of the documented algorithms; any change to
   the permutation, the padding, the strides, the bucketing or the batch
   order shows up here. */

static void appendf(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t cap, size_t *used, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
  va_end(ap);
  CHECK(n >= 0 && (size_t)n < cap - *used);
  *used += (size_t)n;
}

/* The lines feistel_reference.py prints, from the C implementation. */
static void golden_lines(char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  ddplug__feistel f;
  ddplug__feistel_init(&f, 1000000, 42, 0, DDPLUG__SALT_DISTRIBUTED);
  appendf(buf, cap, &used, "pi N=1000000 seed=42 epoch=0:");
  for (uint64_t i = 0; i < 6; i++)
    appendf(buf, cap, &used, " %llu", (unsigned long long)ddplug__feistel_apply(&f, i));
  appendf(buf, cap, &used, "\n");
  for (int drop = 0; drop <= 1; drop++)
    for (int rank = 0; rank < 3; rank++) {
      ddplug_sampler *s = make(DDPLUG_SAMPLER_DISTRIBUTED, 10, rank, 3, 1, drop, 7);
      CHECK_OK(ddplug_sampler_set_epoch(s, 1));
      int64_t out[8];
      uint64_t n = drain(s, out, drop ? 3 : 4, 2);
      appendf(buf, cap, &used,
              "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=%d rank=%d:", drop, rank);
      for (uint64_t k = 0; k < n; k++) appendf(buf, cap, &used, " %lld", (long long)out[k]);
      appendf(buf, cap, &used, "\n");
      ddplug_sampler_free(s);
    }
  int64_t lengths[24];
  for (int i = 0; i < 24; i++) lengths[i] = (i * 37 + 11) % 97 + 1;
  static const int64_t bounds[2] = {20, 60};
  for (int drop = 0; drop <= 1; drop++)
    for (int q = 0; q <= 1; q++)
      for (int rank = 0; rank < 2; rank++) {
        ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
        d.kind = DDPLUG_SAMPLER_BUCKET;
        d.num_samples = 24;
        d.rank = rank;
        d.world_size = 2;
        d.shuffle = 1;
        d.drop_last = drop;
        d.seed = 5;
        d.lengths = lengths;
        d.batch_size = 2;
        if (q) d.num_buckets = 3;
        else {
          d.boundaries = bounds;
          d.num_boundaries = 2;
        }
        ddplug_sampler *s = NULL;
        CHECK_OK(ddplug_sampler_new(&d, &s));
        CHECK_OK(ddplug_sampler_set_epoch(s, 1));
        appendf(buf, cap, &used,
                "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=%d "
                "bounds=%s rank=%d:", drop, q ? "q3" : "20,60", rank);
        int64_t b[2];
        uint64_t got;
        for (int j = 0;; j++) {
          CHECK_OK(ddplug_sampler_next(s, b, 2, &got));
          if (!got) break;
          appendf(buf, cap, &used, "%s %lld %lld", j ? " |" : "", (long long)b[0],
                  (long long)b[1]);
        }
        appendf(buf, cap, &used, "\n");
        ddplug_sampler_free(s);
      }
}

static const char kGolden[] =
    "pi N=1000000 seed=42 epoch=0: 778893 52246 643670 42559 628590 804822\n"
    "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=0 rank=0: 8 5 9 0\n"
    "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=0 rank=1: 7 3 2 8\n"
    "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=0 rank=2: 1 6 4 7\n"
    "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=1 rank=0: 8 5 9\n"
    "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=1 rank=1: 7 3 2\n"
    "dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=1 rank=2: 1 6 4\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=0 bounds=20,60 rank=0: "
    "0 21 | 21 5 | 19 17 | 23 12 | 22 14 | 15 7 | 16 9 | 18 15\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=0 bounds=20,60 rank=1: "
    "5 8 | 8 13 | 1 3 | 20 10 | 19 17 | 4 2 | 11 6 | 7 4\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=0 bounds=q3 rank=0: "
    "0 13 | 11 3 | 1 9 | 17 22 | 23 18 | 10 2\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=0 bounds=q3 rank=1: "
    "5 16 | 21 8 | 6 4 | 19 14 | 15 20 | 7 12\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=1 bounds=20,60 rank=0: "
    "19 17 | 21 5 | 16 9 | 15 7 | 23 12\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=1 bounds=20,60 rank=1: "
    "1 3 | 8 13 | 11 6 | 4 2 | 20 10\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=1 bounds=q3 rank=0: "
    "0 13 | 11 3 | 1 9 | 17 22 | 23 18 | 10 2\n"
    "bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=1 bounds=q3 rank=1: "
    "5 16 | 21 8 | 6 4 | 19 14 | 15 20 | 7 12\n";

TEST(sampler_orders_are_pinned) {
  static char got[8192];
  golden_lines(got, sizeof got);
  CHECK_EQ_STR(got, kGolden);
}

/* Runs tests/data/feistel_reference.py with the repository's .venv Python,
 * else python3; only notes it when neither is there. */
TEST(feistel_reference_transcription_agrees) {
  char script[2048], py[2048], cmd[4608];
  snprintf(script, sizeof script, "%s/tests/data/feistel_reference.py", dt_source_dir());
  snprintf(py, sizeof py, "%s/.venv/bin/python", dt_source_dir());
  if (access(py, X_OK) != 0) {
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
      dt_note("no .venv/bin/python and no python3: the transcription was not run");
      return;
    }
    snprintf(py, sizeof py, "python3");
  }
  snprintf(cmd, sizeof cmd, "'%s' '%s'", py, script);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  static char out[8192];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int st = pclose(p);
  CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed (status %d):\n%s", cmd, st, out);
  static char mine[8192];
  golden_lines(mine, sizeof mine);
  CHECK_EQ_STR(out, mine);
  dt_note("%s agrees with the C samplers (%zu bytes)", py, n);
}

/* ---- validation ----------------------------------------------------------- */

typedef struct bad_desc {
  const char *what;
  void (*edit)(ddplug_sampler_options *d);
  int status;
  const char *message;
} bad_desc;

static const int64_t kLen[4] = {1, 2, 3, 4};
static const int64_t kBadBounds[2] = {5, 5};
static void e_kind(ddplug_sampler_options *d) { d->kind = 7; }
static void e_rank(ddplug_sampler_options *d) { d->rank = 4; d->world_size = 4; }
static void e_neg(ddplug_sampler_options *d) { d->rank = -1; d->world_size = 2; }
static void e_shuffle(ddplug_sampler_options *d) { d->shuffle = 2; }
static void e_stream(ddplug_sampler_options *d) { d->stream = "tr ain"; }
static void e_empty(ddplug_sampler_options *d) { d->stream = ""; }
static void e_abi(ddplug_sampler_options *d) { d->abi_version = DDPLUG_MAKE_VERSION(2, 0); }
static void e_size(ddplug_sampler_options *d) { d->struct_size = 8; }
static void e_huge(ddplug_sampler_options *d) { d->num_samples = 1ull << 63; }
static void e_bs(ddplug_sampler_options *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->lengths = kLen; d->num_buckets = 2; }
static void e_len(ddplug_sampler_options *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->num_buckets = 2; }
static void e_asc(ddplug_sampler_options *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; d->boundaries = kBadBounds; d->num_boundaries = 2; }
static void e_nb(ddplug_sampler_options *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; d->num_boundaries = 2; }
static void e_none(ddplug_sampler_options *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; }
static void e_exact_drop(ddplug_sampler_options *d) { d->exact = 1; d->drop_last = 1; }
static void e_exact_bucket(ddplug_sampler_options *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; d->num_buckets = 1; d->exact = 1; }

TEST(invalid_descs_get_exact_errors) {
  static const bad_desc table[] = {
      {"kind", e_kind, DDPLUG_E_INVALID_ARGUMENT, "kind 7 is not a sampler kind"},
      {"rank", e_rank, DDPLUG_E_INVALID_ARGUMENT, "rank 4 is not in a world of 4"},
      {"negative rank", e_neg, DDPLUG_E_INVALID_ARGUMENT, "rank -1 is not in a world of 2"},
      {"shuffle", e_shuffle, DDPLUG_E_INVALID_ARGUMENT, "shuffle (2), drop_last (0) and exact (0) must be 0 or 1"},
      {"exact with drop_last", e_exact_drop, DDPLUG_E_INVALID_ARGUMENT, "exact = 1 delivers every sample once; drop_last = 1 contradicts it"},
      {"exact bucket", e_exact_bucket, DDPLUG_E_INVALID_ARGUMENT, "the bucket sampler pads or drops to whole batches, so it cannot be exact"},
      {"stream", e_stream, DDPLUG_E_INVALID_ARGUMENT, "stream name 'tr ain' has character ' ' at 2"},
      {"empty stream", e_empty, DDPLUG_E_INVALID_ARGUMENT, "stream name '' must have 1 to 63 characters"},
      {"abi", e_abi, DDPLUG_E_ABI_MISMATCH, "the options have ABI version 2.0"},
      {"size", e_size, DDPLUG_E_INVALID_ARGUMENT, "options struct_size 8 is too small"},
      {"huge", e_huge, DDPLUG_E_INVALID_ARGUMENT, "does not fit the int64 indices"},
      {"batch", e_bs, DDPLUG_E_INVALID_ARGUMENT, "the bucket sampler needs batch_size >= 1"},
      {"lengths", e_len, DDPLUG_E_INVALID_ARGUMENT, "the bucket sampler needs lengths[4]"},
      {"ascending", e_asc, DDPLUG_E_INVALID_ARGUMENT, "boundaries[1] = 5 <= boundaries[0] = 5"},
      {"nb", e_nb, DDPLUG_E_INVALID_ARGUMENT, "num_boundaries 2 but boundaries is NULL"},
      {"none", e_none, DDPLUG_E_INVALID_ARGUMENT, "give boundaries, or num_buckets >= 1"},
  };
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(table); i++) {
    ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
    d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
    d.num_samples = 4;
    table[i].edit(&d);
    ddplug_sampler *s = (ddplug_sampler *)0x1;
    int st = ddplug_sampler_new(&d, &s);
    CHECK_MSG(st == table[i].status, "%s: got %s (%s)", table[i].what,
              ddplug_status_name(st), ddplug_last_error());
    CHECK_MSG(strstr(ddplug_last_error(), table[i].message), "%s: '%s' lacks '%s'",
              table[i].what, ddplug_last_error(), table[i].message);
    CHECK(s == (ddplug_sampler *)0x1); /* untouched on failure */
  }
  CHECK_STATUS(ddplug_sampler_new(NULL, NULL), DDPLUG_E_INVALID_ARGUMENT);
  uint64_t v;
  CHECK_STATUS(ddplug_sampler_length(NULL, &v), DDPLUG_E_INVALID_ARGUMENT);
  ddplug_sampler_free(NULL);
}

TEST(options_smaller_than_1_0_are_refused_and_a_newer_writers_are_read_so_far) {
  /* the options struct is the host API's own since 1.0: nothing smaller */
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.struct_size = (uint32_t)offsetof(ddplug_sampler_options, batch_size);
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = 10;
  ddplug_sampler *s = NULL;
  CHECK_STATUS(ddplug_sampler_new(&d, &s), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "fill them with DDPLUG_SAMPLER_OPTIONS_INIT");
  /* a writer built against a newer minor version: its fields past ours
   * are ignored */
  struct { ddplug_sampler_options o; uint64_t newer; } big;
  memset(&big, 0, sizeof big);
  big.o = (ddplug_sampler_options)DDPLUG_SAMPLER_OPTIONS_INIT;
  big.o.struct_size = sizeof big;
  big.o.abi_version = DDPLUG_MAKE_VERSION(DDPLUG_ABI_MAJOR, DDPLUG_ABI_MINOR + 1);
  big.o.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  big.o.num_samples = 10;
  big.newer = ~0ull;
  CHECK_OK(ddplug_sampler_new(&big.o, &s));
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_STR(info.stream, "train");
  CHECK_EQ_INT(info.batch_size, 0);
  CHECK_EQ_INT(info.world_size, 1);
  CHECK_EQ_INT(info.length, 10);
  ddplug_sampler_free(s);
}

/* Exact (evaluation): every sample once, no padding; counts may differ. */
TEST(an_exact_sampler_delivers_every_sample_once_with_uneven_counts) {
  static const struct { uint64_t n; int world; } cases[] = {
      {1001, 2}, {1001, 3}, {7, 8}, {0, 3}, {96, 4}, {1, 1}};
  for (size_t c = 0; c < DDPLUG__ARRAY_LEN(cases); c++) {
    uint64_t n = cases[c].n;
    int world = cases[c].world;
    unsigned char *seen = calloc(n ? n : 1, 1);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
      memset(seen, 0, n ? n : 1);
      uint64_t total = 0;
      for (int r = 0; r < world; r++) {
        ddplug_sampler_options d = dist_desc(n, world);
        d.rank = r;
        d.exact = 1;
        d.shuffle = shuffle;
        d.seed = 9;
        ddplug_sampler *s = NULL;
        CHECK_OK(ddplug_sampler_new(&d, &s));
        CHECK_OK(ddplug_sampler_set_epoch(s, 3));
        uint64_t len = 0;
        CHECK_OK(ddplug_sampler_length(s, &len));
        CHECK_EQ_INT(len, (n > (uint64_t)r) ? (n - (uint64_t)r - 1) / (uint64_t)world + 1 : 0);
        ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
        CHECK_OK(ddplug_sampler_info_get(s, &info));
        CHECK_EQ_INT(info.exact, 1);
        CHECK_EQ_INT(info.padded, 0);
        CHECK_EQ_INT(info.dropped, 0);
        int64_t buf[16];
        uint64_t got, mine = 0;
        do {
          CHECK_OK(ddplug_sampler_next(s, buf, 16, &got));
          for (uint64_t k = 0; k < got; k++) {
            CHECK(buf[k] >= 0 && (uint64_t)buf[k] < n);
            CHECK_MSG(!seen[buf[k]], "N=%llu world=%d: sample %lld twice",
                      (unsigned long long)n, world, (long long)buf[k]);
            seen[buf[k]] = 1;
          }
          mine += got;
        } while (got);
        CHECK_EQ_INT(mine, len);
        total += mine;
        ddplug_sampler_free(s);
      }
      CHECK_EQ_INT(total, n);
    }
    free(seen);
  }
}

static void create_bucket_child(void *arg) {
  const char *k = arg;
  setenv("DDPLUG_TEST_FAIL_ALLOC", k, 1);
  int64_t lengths[64];
  for (int i = 0; i < 64; i++) lengths[i] = i % 9;
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_BUCKET;
  d.num_samples = 64;
  d.lengths = lengths;
  d.batch_size = 2;
  d.num_buckets = 3;
  ddplug_sampler *s = NULL;
  int st = ddplug_sampler_new(&d, &s);
  if (st == DDPLUG_OK) {
    ddplug_sampler_free(s);
    exit(0); /* exit, not _exit: LeakSanitizer checks at exit */
  }
  exit(st == DDPLUG_E_NO_MEMORY && s == NULL && strstr(ddplug_last_error(), "out of memory") ? 10 : 11);
}

TEST(every_allocation_failure_is_clean) {
  int failures = 0;
  for (int k = 1; k <= 20; k++) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", k);
    pid_t pid = dt_fork(create_bucket_child, buf);
    int st = 0;
    CHECK(dt_wait_pid(pid, 10000, &st) == 0);
    CHECK(WIFEXITED(st));
    CHECK_MSG(WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 10,
              "allocation %d: exit %d", k, WEXITSTATUS(st));
    failures += WEXITSTATUS(st) == 10;
  }
  CHECK(failures >= 5); /* the bucket sampler allocates at least 5 times */
}
