/* test-sampler.c — property tests of the default samplers over N (0, 1,
 * primes, 10^6) x world (1..8) x batch x drop_last x shuffle: equal length
 * on every rank, disjointness, coverage, declared padding/dropping,
 * determinism, a new order per epoch, resume at any position equal to the
 * uninterrupted order, chunking independence, torch DistributedSampler's
 * order when not shuffling; the Feistel permutation (bijection, pinned
 * values, rough uniformity); desc validation; allocation failures. */
#include <stdlib.h>
#include <sys/wait.h>

#include "data.h"
#include "harness.h"

/* ---- helpers ------------------------------------------------------------ */

static ddplug_sampler *make(int kind, uint64_t n, int rank, int world,
                            int shuffle, int drop_last, uint64_t seed) {
  ddplug_sampler_desc d = DDPLUG_SAMPLER_DESC_INIT;
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
 * release): these values were computed once — and reproduced by an
 * independent Python transcription of the algorithm documented in
 * sampler_feistel.c — and must never change. */
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

static void check_bucket(const bucket_case *c) {
  int64_t *lengths = malloc(sizeof *lengths * (c->n + 1));
  for (uint64_t i = 0; i < c->n; i++) lengths[i] = length_of(i);
  static const int64_t bounds[] = {10, 50, 200};
  ddplug_sampler_desc d = DDPLUG_SAMPLER_DESC_INIT;
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
    batches[r] = malloc(sizeof(int64_t) * (len * c->bs + 1));
    uint64_t got, nb = 0;
    int64_t *buf = batches[r];
    while (1) {
      CHECK_OK(ddplug_sampler_next(s, buf + nb * c->bs, c->bs + 3, &got));
      if (got == 0) break;
      CHECK_EQ_INT(got, c->bs); /* one whole batch per call */
      int b0 = bucket_index(lengths[buf[nb * c->bs]]);
      for (uint64_t t = 0; t < c->bs; t++) {
        int64_t idx = buf[nb * c->bs + t];
        CHECK(idx >= 0 && (uint64_t)idx < c->n);
        count[idx]++;
        if (!c->quantile) CHECK_EQ_INT(bucket_index(lengths[idx]), b0);
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
  if (!c->quantile && c->world > 1)
    for (uint64_t j = 0; j < len0; j++)
      for (int r = 1; r < c->world; r++)
        CHECK_EQ_INT(bucket_index(lengths[batches[r][j * c->bs]]),
                     bucket_index(lengths[batches[0][j * c->bs]]));
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
    for (int world = 1; world <= 8; world += (world < 4 ? 1 : 4))
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
  ddplug_sampler_desc d = DDPLUG_SAMPLER_DESC_INIT;
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

/* ---- validation ----------------------------------------------------------- */

typedef struct bad_desc {
  const char *what;
  void (*edit)(ddplug_sampler_desc *d);
  int status;
  const char *message;
} bad_desc;

static const int64_t kLen[4] = {1, 2, 3, 4};
static const int64_t kBadBounds[2] = {5, 5};
static void e_kind(ddplug_sampler_desc *d) { d->kind = 7; }
static void e_rank(ddplug_sampler_desc *d) { d->rank = 4; d->world_size = 4; }
static void e_neg(ddplug_sampler_desc *d) { d->rank = -1; d->world_size = 2; }
static void e_shuffle(ddplug_sampler_desc *d) { d->shuffle = 2; }
static void e_stream(ddplug_sampler_desc *d) { d->stream = "tr ain"; }
static void e_empty(ddplug_sampler_desc *d) { d->stream = ""; }
static void e_abi(ddplug_sampler_desc *d) { d->abi_version = DDPLUG_MAKE_VERSION(2, 0); }
static void e_size(ddplug_sampler_desc *d) { d->struct_size = 8; }
static void e_huge(ddplug_sampler_desc *d) { d->num_samples = 1ull << 63; }
static void e_bs(ddplug_sampler_desc *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->lengths = kLen; d->num_buckets = 2; }
static void e_len(ddplug_sampler_desc *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->num_buckets = 2; }
static void e_asc(ddplug_sampler_desc *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; d->boundaries = kBadBounds; d->num_boundaries = 2; }
static void e_nb(ddplug_sampler_desc *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; d->num_boundaries = 2; }
static void e_none(ddplug_sampler_desc *d) { d->kind = DDPLUG_SAMPLER_BUCKET; d->batch_size = 1; d->lengths = kLen; }

TEST(invalid_descs_get_exact_errors) {
  static const bad_desc table[] = {
      {"kind", e_kind, DDPLUG_E_INVALID_ARGUMENT, "kind 7 is not a sampler kind"},
      {"rank", e_rank, DDPLUG_E_INVALID_ARGUMENT, "rank 4 is not in a world of 4"},
      {"negative rank", e_neg, DDPLUG_E_INVALID_ARGUMENT, "rank -1 is not in a world of 2"},
      {"shuffle", e_shuffle, DDPLUG_E_INVALID_ARGUMENT, "shuffle (2) and drop_last (0) must be 0 or 1"},
      {"stream", e_stream, DDPLUG_E_INVALID_ARGUMENT, "stream name 'tr ain' has character ' ' at 2"},
      {"empty stream", e_empty, DDPLUG_E_INVALID_ARGUMENT, "stream name '' must have 1 to 63 characters"},
      {"abi", e_abi, DDPLUG_E_ABI_MISMATCH, "desc has ABI version 2.0"},
      {"size", e_size, DDPLUG_E_INVALID_ARGUMENT, "desc struct_size 8 is too small"},
      {"huge", e_huge, DDPLUG_E_INVALID_ARGUMENT, "does not fit the int64 indices"},
      {"batch", e_bs, DDPLUG_E_INVALID_ARGUMENT, "the bucket sampler needs batch_size >= 1"},
      {"lengths", e_len, DDPLUG_E_INVALID_ARGUMENT, "the bucket sampler needs lengths[4]"},
      {"ascending", e_asc, DDPLUG_E_INVALID_ARGUMENT, "boundaries[1] = 5 <= boundaries[0] = 5"},
      {"nb", e_nb, DDPLUG_E_INVALID_ARGUMENT, "num_boundaries 2 but boundaries is NULL"},
      {"none", e_none, DDPLUG_E_INVALID_ARGUMENT, "give boundaries, or num_buckets >= 1"},
  };
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(table); i++) {
    ddplug_sampler_desc d = DDPLUG_SAMPLER_DESC_INIT;
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

TEST(older_smaller_desc_gets_defaults) {
  /* A writer that knew only the fields up to stream (size cut there). */
  ddplug_sampler_desc d = DDPLUG_SAMPLER_DESC_INIT;
  d.struct_size = (uint32_t)offsetof(ddplug_sampler_desc, stream);
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = 10;
  d.batch_size = 99; /* beyond struct_size: must be ignored */
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_sampler_new(&d, &s));
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_STR(info.stream, "train");
  CHECK_EQ_INT(info.batch_size, 0);
  CHECK_EQ_INT(info.world_size, 1);
  CHECK_EQ_INT(info.length, 10);
  ddplug_sampler_free(s);
}

static void create_bucket_child(void *arg) {
  const char *k = arg;
  setenv("DDPLUG_TEST_FAIL_ALLOC", k, 1);
  int64_t lengths[64];
  for (int i = 0; i < 64; i++) lengths[i] = i % 9;
  ddplug_sampler_desc d = DDPLUG_SAMPLER_DESC_INIT;
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
