/* test-audit-report.c — the audit's recording and diagnosis without a
 * context: G simulated ranks record into their own audits, the test combines
 * their bitmaps the way the collective finish does (OR / AND), and
 * ddplug__audit_diagnose must give the verdict, the exact sentences, the
 * per-rank numbers and the texts; sampled mode's estimates and tolerance;
 * verdict priority; out-of-range indices; the order fingerprint. The same
 * diagnoses in real multi-process runs are in test-audit.c. */
#include <stdlib.h>

#include "data/data.h"
#include "harness.h"

#define MAXR 8

typedef struct sim {
  int world;
  uint64_t n;
  ddplug_audit *a[MAXR];
  ddplug__audit_stats st[MAXR];
  ddplug_audit_report r;
  char *text;
} sim;

static void sim_begin(sim *s, int world, uint64_t n, uint64_t exact_max,
                      int scope, const ddplug_audit_options *o) {
  free(s->text);
  memset(s, 0, sizeof *s);
  s->world = world;
  s->n = n;
  for (int r = 0; r < world; r++)
    CHECK_OK(ddplug__audit_alloc("train", n, 0, o, scope, exact_max, r, world, &s->a[r]));
}

/* Rank r records the indices of a standalone distributed sampler for
 * (srank, sworld) in steps of `batch`, keeping only every `keep`-th index
 * starting at `from`. */
static void sim_feed(sim *s, int r, int srank, int sworld, uint64_t batch,
                     uint64_t from, uint64_t keep) {
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = s->n;
  d.rank = srank;
  d.world_size = sworld;
  d.shuffle = 1;
  d.seed = 1;
  ddplug_sampler *smp = NULL;
  CHECK_OK(ddplug_sampler_new(&d, &smp));
  int64_t buf[64], step[64];
  uint64_t got, pos = 0, m = 0;
  for (;;) {
    CHECK_OK(ddplug_sampler_next(smp, buf, 64, &got));
    if (!got) break;
    for (uint64_t k = 0; k < got; k++, pos++) {
      if (pos < from || (pos - from) % keep) continue;
      step[m++] = buf[k];
      if (m == batch) {
        ddplug__audit_add(s->a[r], step, m, 1);
        m = 0;
      }
    }
  }
  if (m) ddplug__audit_add(s->a[r], step, m, 1);
  ddplug_sampler_free(smp);
}

/* What the finish does, locally: stats, OR/AND of the bitmaps (holes
 * outside the declared set, examples of holes and of samples several ranks
 * delivered), diagnose. */
static void sim_finish(sim *s) {
  ddplug__audit_coverage cov;
  memset(&cov, 0, sizeof cov);
  for (int r = 0; r < s->world; r++) ddplug__audit_local_stats(s->a[r], &s->st[r]);
  const ddplug_audit *a0 = s->a[0];
  for (uint64_t w = 0; w < a0->words; w++) {
    uint64_t o = 0, x = ~0ull, valid = w * 64 + 64 <= a0->tracked ? ~0ull : (1ull << (a0->tracked - w * 64)) - 1;
    for (int r = 0; r < s->world; r++) {
      o |= s->a[r]->bits[w];
      x &= s->a[r]->bits[w];
    }
    uint64_t dropped = a0->dropped ? a0->dropped[w] : 0;
    cov.covered += (uint64_t)__builtin_popcountll(o & valid);
    cov.common += (uint64_t)__builtin_popcountll(x & valid);
    cov.holes += (uint64_t)__builtin_popcountll(~o & valid & ~dropped);
    for (int b = 0; b < 64; b++) {
      uint64_t i = w * 64 + (uint64_t)b;
      if (i >= a0->tracked || !a0->exact) break;
      if (!(o >> b & 1) && !(dropped >> b & 1) && cov.nmissing_ex < DDPLUG__AUDIT_EXAMPLES)
        cov.missing_ex[cov.nmissing_ex++] = i;
      int holders = 0;
      for (int r = 0; r < s->world; r++) holders += (int)(s->a[r]->bits[w] >> b & 1);
      if (holders > 1 && cov.nrepeat_ex < DDPLUG__AUDIT_EXAMPLES) cov.repeat_ex[cov.nrepeat_ex++] = (int64_t)i;
    }
  }
  s->r.struct_size = sizeof s->r;
  ddplug__audit_diagnose("train", s->st, s->world, &cov, &s->r, &s->text);
  CHECK(s->text != NULL);
  for (int r = 0; r < s->world; r++) ddplug_audit_free(s->a[r]);
}

TEST(a_correct_split_passes_with_numbers_and_texts) {
  sim s = {0};
  sim_begin(&s, 4, 1000, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 10, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(s.r.violations, 0);
  CHECK_EQ_INT(s.r.covered, 1000);
  CHECK_EQ_INT(s.r.common, 0);
  CHECK_EQ_INT(s.r.deliveries, 1000);
  CHECK_EQ_INT(s.r.repeats, 0);
  CHECK_EQ_INT(s.r.missing, 0);
  CHECK_EQ_INT(s.st[3].steps, 25);
  CHECK_EQ_INT(s.st[2].deliveries, 250);
  CHECK_EQ_INT(s.r.exact, 1);
  CHECK_EQ_STR(s.r.summary, "audit of stream 'train' epoch 0: PASS — 4 ranks, 25 "
                            "steps and 250 samples each, covered 1000 of 1000 (exact)");
  CHECK_CONTAINS(s.text, "ddplug audit: stream 'train', epoch 0, 4 ranks, N = 1000 (exact)\n");
  CHECK_CONTAINS(s.text, "  rank 3: 25 steps, 250 samples\n");
  free(s.text);
  s.text = NULL;
}

TEST(each_failure_mode_gets_its_sentence) {
  sim s = {0};
  /* split twice: rank-aware sampler, then every 4th of it */
  sim_begin(&s, 4, 1000, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 8, (uint64_t)r, 4);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_DOUBLE_PARTITION);
  CHECK_CONTAINS(s.r.summary, "double partitioning: ranks together saw 250 of 1000 "
                              "samples (about N/4 with 4 ranks; 750 never delivered, "
                              "e.g. sample ");
  CHECK_CONTAINS(s.r.summary, ") — the data was split twice (e.g. a rank-aware "
                              "sampler, or a dataset already sharded per rank, and "
                              "another split on top)");
  /* not split */
  sim_begin(&s, 3, 600, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  for (int r = 0; r < 3; r++) sim_feed(&s, r, 0, 1, 8, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_NO_PARTITION);
  CHECK_CONTAINS(s.r.summary, "no partitioning: every rank saw the same samples");
  CHECK_EQ_INT(s.r.common, 600);
  /* uneven: rank 1 skips its first 8 indices = one step fewer */
  sim_begin(&s, 2, 160, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  sim_feed(&s, 0, 0, 2, 8, 0, 1);
  sim_feed(&s, 1, 1, 2, 8, 8, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_UNEVEN);
  CHECK_CONTAINS(s.r.summary, "uneven batches: rank 1 has 9 steps, others 10 (will hang)");
  CHECK_CONTAINS(s.r.summary, "(and 1 more problem in the report)");
  CHECK(s.r.violations & (1u << DDPLUG_AUDIT_MISSING));
  CHECK_CONTAINS(s.text, "  diagnosis: uneven batches");
  CHECK_CONTAINS(s.text, "  diagnosis: missing samples: ranks together saw 152 of 160");
  /* a rank split gone wrong: two ranks believe they are rank 1 of 3 — the
   * shares overlap heavily, so the split is blamed */
  sim_begin(&s, 3, 300, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  sim_feed(&s, 0, 0, 3, 10, 0, 1);
  sim_feed(&s, 1, 1, 3, 10, 0, 1);
  sim_feed(&s, 2, 1, 3, 10, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_MISSING);
  CHECK(s.r.violations & (1u << DDPLUG_AUDIT_OVERLAP));
  CHECK_EQ_INT(s.r.cross_repeats, 100);
  CHECK_CONTAINS(s.text, "repeated samples: 100 deliveries repeated a sample already "
                         "delivered (declared padding: 0): 100 across ranks, 0 within "
                         "one rank, e.g. sample ");
  CHECK_CONTAINS(s.text, " — the ranks' shares overlap heavily: check the rank and "
                         "world size the split uses");
  free(s.text);
  s.text = NULL;
}

/* A sampler that pads a few samples and leaves a few out (a bucket sampler
 * with length bounds): both problems are named, each with its count and
 * examples, and the rank split is not blamed. */
TEST(padding_and_dropping_are_both_named_and_the_split_is_not_blamed) {
  sim s = {0};
  sim_begin(&s, 2, 100, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  int64_t r0[52], r1[52];
  int m0 = 0, m1 = 0;
  for (int64_t i = 0; i < 100; i++) {
    if (i == 10 || i == 20 || i == 30) continue; /* dropped by the bounds */
    if (i % 2) r1[m1++] = i;
    else r0[m0++] = i;
  }
  r0[m0++] = 1; /* padding: rank 0 repeats rank 1's 1 and 3, rank 1 its own 5 */
  r0[m0++] = 3;
  r1[m1++] = 5;
  ddplug__audit_add(s.a[0], r0, (uint64_t)m0, 1);
  ddplug__audit_add(s.a[1], r1, (uint64_t)m1, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_MISSING);
  CHECK(s.r.violations & (1u << DDPLUG_AUDIT_OVERLAP));
  CHECK_EQ_INT(s.r.missing, 3);
  CHECK_EQ_INT(s.r.repeats, 3);
  CHECK_EQ_INT(s.r.cross_repeats, 2);
  CHECK_CONTAINS(s.text, "diagnosis: missing samples: ranks together saw 97 of 100 "
                         "samples; 3 never delivered (declared dropped: 0), e.g. sample "
                         "10, 20, 30 — a sampler that leaves samples out on purpose "
                         "must declare it (dropped: a count or the indices)");
  CHECK_CONTAINS(s.text, "diagnosis: repeated samples: 3 deliveries repeated a sample "
                         "already delivered (declared padding: 0): 2 across ranks, 1 "
                         "within one rank, e.g. sample 1, 3 — a sampler that repeats "
                         "samples (padding to equal lengths or to whole batches) must "
                         "declare it (padding: a count)");
  CHECK(!strstr(s.text, "check the rank and world size"));
  free(s.text);
  s.text = NULL;

  /* declared: the padding by count, the dropped samples by index */
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.allowed_padding = 3;
  sim_begin(&s, 2, 100, 1u << 20, DDPLUG__SCOPE_FULL, &o);
  int64_t gone[3] = {10, 20, 30};
  for (int r = 0; r < 2; r++) CHECK_OK(ddplug__audit_drop(s.a[r], gone, 3));
  ddplug__audit_add(s.a[0], r0, (uint64_t)m0, 1);
  ddplug__audit_add(s.a[1], r1, (uint64_t)m1, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(s.r.allowed_missing, 3);
  CHECK_EQ_INT(s.st[0].dropped_count, 3);
  CHECK_EQ_INT(s.st[0].dropped_hash, s.st[1].dropped_hash);

  /* declaring other indices than the ones missing does not excuse them */
  sim_begin(&s, 2, 100, 1u << 20, DDPLUG__SCOPE_FULL, &o);
  int64_t wrong[3] = {11, 20, 30};
  for (int r = 0; r < 2; r++) CHECK_OK(ddplug__audit_drop(s.a[r], wrong, 3));
  ddplug__audit_add(s.a[0], r0, (uint64_t)m0, 1);
  ddplug__audit_add(s.a[1], r1, (uint64_t)m1, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_MISSING);
  CHECK_EQ_INT(s.r.missing, 1);
  CHECK_CONTAINS(s.r.summary, "e.g. sample 10 —");
  free(s.text);
  s.text = NULL;
}

TEST(declared_padding_and_dropping_are_allowed_exactly) {
  /* 10 samples on 4 ranks: 2 padded deliveries (ceil) */
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.allowed_padding = 2;
  sim s = {0};
  sim_begin(&s, 4, 10, 1u << 20, DDPLUG__SCOPE_FULL, &o);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 1, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(s.r.repeats, 2);
  /* one allowed repeat fewer: repeated samples */
  o.allowed_padding = 1;
  sim_begin(&s, 4, 10, 1u << 20, DDPLUG__SCOPE_FULL, &o);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 1, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_OVERLAP);
  /* drop_last leaves 2 out (rank r takes r and r + 4 of 10): allowed when
   * declared, missing when not — by count, or as each rank's remainder */
  for (uint64_t allowed = 1; allowed <= 3; allowed++) {
    o.allowed_padding = 0;
    o.allowed_missing = allowed < 3 ? allowed : 0;
    sim_begin(&s, 4, 10, 1u << 20, DDPLUG__SCOPE_FULL, &o);
    for (int r = 0; r < 4; r++) {
      int64_t two[2] = {r, r + 4};
      if (allowed == 3) s.a[r]->opts.local_dropped = r < 2; /* ranks 0 and 1 drop one each */
      ddplug__audit_add(s.a[r], two, 2, 1);
    }
    sim_finish(&s);
    CHECK_EQ_INT(s.r.verdict, allowed >= 2 ? DDPLUG_AUDIT_PASS : DDPLUG_AUDIT_MISSING);
  }
  free(s.text);
  s.text = NULL;
}

TEST(an_evaluation_stream_must_be_exact_but_may_be_uneven) {
  /* 1001 samples on 2 ranks, each once: 501 + 500, uneven steps: PASS */
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.evaluation = 1;
  sim s = {0};
  sim_begin(&s, 2, 1001, 1u << 20, DDPLUG__SCOPE_FULL, &o);
  for (int r = 0; r < 2; r++) {
    ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
    d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
    d.num_samples = 1001;
    d.rank = r;
    d.world_size = 2;
    d.exact = 1;
    ddplug_sampler *smp = NULL;
    CHECK_OK(ddplug_sampler_new(&d, &smp));
    int64_t buf[4];
    uint64_t got;
    while (ddplug_sampler_next(smp, buf, 4, &got) == DDPLUG_OK && got)
      ddplug__audit_add(s.a[r], buf, got, 1);
    ddplug_sampler_free(smp);
  }
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(s.r.evaluation, 1);
  CHECK_EQ_INT(s.st[0].deliveries, 501);
  CHECK_EQ_INT(s.st[1].deliveries, 500);
  CHECK_EQ_INT(s.st[0].steps, 126);
  CHECK_EQ_INT(s.st[1].steps, 125);
  CHECK_CONTAINS(s.r.summary, "PASS — 2 ranks, 125 to 126 steps and 500 to 501 samples each");
  CHECK_CONTAINS(s.text, "stream 'train' (evaluation), epoch 0");
  /* torch's padding (one repeat) is declared, but an evaluation stream
   * must still deliver every sample once */
  o.allowed_padding = 1;
  sim_begin(&s, 2, 1001, 1u << 20, DDPLUG__SCOPE_FULL, &o);
  for (int r = 0; r < 2; r++) sim_feed(&s, r, r, 2, 4, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_OVERLAP);
  CHECK_EQ_INT(s.r.allowed_padding, 0);
  CHECK_CONTAINS(s.r.summary, "repeated samples: 1 delivery repeated a sample already "
                              "delivered (declared padding: 0)");
  CHECK_CONTAINS(s.r.summary, "an evaluation stream must deliver every sample exactly once");
  free(s.text);
  s.text = NULL;
}

TEST(missing_lists_example_indices) {
  sim s = {0};
  sim_begin(&s, 2, 100, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  int64_t idx[100];
  uint64_t m = 0;
  for (int64_t i = 0; i < 100; i++)
    if (i != 7 && i != 8 && i != 50) idx[m++] = i;
  ddplug__audit_add(s.a[0], idx, m / 2, 1);
  ddplug__audit_add(s.a[1], idx + m / 2, m - m / 2, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_MISSING);
  CHECK_CONTAINS(s.r.summary, "missing samples: ranks together saw 97 of 100 samples; 3 "
                              "never delivered (declared dropped: 0), e.g. sample 7, 8, 50");
  free(s.text);
  s.text = NULL;
}

TEST(sampled_mode_estimates_and_tolerates_sampling_error) {
  const uint64_t n = 200000;
  sim s = {0};
  sim_begin(&s, 4, n, 1000, DDPLUG__SCOPE_FULL, NULL);
  CHECK_EQ_INT(s.a[0]->exact, 0);
  CHECK_EQ_INT(s.a[0]->words, (1000 + 63) / 64);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 64, 0, 1);
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(s.r.exact, 0);
  CHECK_EQ_INT(s.r.tracked, 1000);
  CHECK_EQ_INT(s.r.covered, n);
  CHECK_EQ_INT(s.r.deliveries, n);
  /* a declared drop of 1% is tolerated; an undeclared loss of 25% is not */
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.allowed_missing = n / 100;
  sim_begin(&s, 4, n, 1000, DDPLUG__SCOPE_FULL, &o);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 64, 125, 1); /* 500 left out */
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_PASS);
  sim_begin(&s, 4, n, 1000, DDPLUG__SCOPE_FULL, NULL);
  for (int r = 0; r < 4; r++) sim_feed(&s, r, r, 4, 64, 0, r == 3 ? 1000000 : 1);
  sim_finish(&s);
  CHECK(s.r.violations & (1u << DDPLUG_AUDIT_MISSING));
  CHECK_CONTAINS(s.text, "(estimated from 1000 tracked samples)");
  free(s.text);
  s.text = NULL;
}

TEST(order_fingerprint_and_epoch_lag) {
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.shuffle = 1;
  int64_t idx[16];
  for (int i = 0; i < 16; i++) idx[i] = 15 - i;
  ddplug_audit *a = NULL, *b = NULL;
  CHECK_OK(ddplug__audit_alloc("train", 16, 0, &o, DDPLUG__SCOPE_ORDER, 100, 0, 1, &a));
  ddplug__audit_add(a, idx, 16, 1);
  CHECK_OK(ddplug__audit_alloc("train", 16, 1, &o, DDPLUG__SCOPE_ORDER, 100, 0, 1, &b));
  b->has_prev = 1;
  b->prev_epoch = 0;
  b->prev_fingerprint = a->fingerprint;
  ddplug__audit_add(b, idx, 8, 1); /* the same order in two calls */
  ddplug__audit_add(b, idx + 8, 8, 1);
  ddplug__audit_stats st;
  ddplug__audit_local_stats(b, &st);
  CHECK_EQ_INT(st.order_repeated, 1);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  ddplug__audit_diagnose("train", &st, 1, NULL, &r, NULL);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_EPOCH_NOT_ADVANCED);
  CHECK_EQ_INT(r.full, 0);
  CHECK_CONTAINS(r.summary, "epoch not advanced: rank 0 delivered epoch 1 in the same "
                            "order as the previous epoch although shuffling is on");
  /* a different order is fine; so is the same order without shuffling */
  idx[0] = 0;
  idx[15] = 15;
  ddplug_audit *c = NULL;
  CHECK_OK(ddplug__audit_alloc("train", 16, 1, &o, DDPLUG__SCOPE_ORDER, 100, 0, 1, &c));
  c->has_prev = 1;
  c->prev_fingerprint = a->fingerprint;
  ddplug__audit_add(c, idx, 16, 1);
  ddplug__audit_local_stats(c, &st);
  CHECK_EQ_INT(st.order_repeated, 0);
  b->opts.shuffle = 0;
  ddplug__audit_local_stats(b, &st);
  CHECK_EQ_INT(st.order_repeated, 0);
  /* a sampler that lagged */
  c->epoch_behind = 1;
  ddplug__audit_local_stats(c, &st);
  ddplug__audit_diagnose("train", &st, 1, NULL, &r, NULL);
  CHECK_CONTAINS(r.summary, "in the order of an earlier epoch (the sampler's epoch was not set)");
  ddplug_audit_free(a);
  ddplug_audit_free(b);
  ddplug_audit_free(c);
}

TEST(skipped_out_of_range_and_names) {
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug__audit_alloc("val", 10, 4, NULL, DDPLUG__SCOPE_SKIP, 100, 0, 1, &a));
  CHECK(a->bits == NULL); /* nothing allocated for a skipped epoch */
  int64_t idx[3] = {-1, 3, 10};
  ddplug__audit_add(a, idx, 3, 1);
  ddplug__audit_stats st;
  ddplug__audit_local_stats(a, &st);
  CHECK_EQ_INT(st.out_of_range, 2);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  char *text = NULL;
  ddplug__audit_diagnose("val", &st, 1, NULL, &r, &text);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_SKIPPED);
  CHECK_EQ_STR(r.summary, "audit of stream 'val' epoch 4: SKIPPED (data_split.audit)");
  CHECK_EQ_STR(text, "ddplug audit: stream 'val', epoch 4, N = 10: skipped "
                     "(data_split.audit: this epoch is not audited)\n");
  CHECK(!strstr(text, "1 ranks"));
  free(text);
  ddplug_audit_free(a);
  CHECK_EQ_STR(ddplug_audit_verdict_name(DDPLUG_AUDIT_DOUBLE_PARTITION), "DOUBLE_PARTITION");
  CHECK_EQ_STR(ddplug_audit_verdict_name(99), "UNKNOWN");
}

TEST(one_rank_and_one_step_are_singular) {
  sim s = {0};
  sim_begin(&s, 1, 1, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  int64_t zero = 0;
  ddplug__audit_add(s.a[0], &zero, 1, 1);
  sim_finish(&s);
  CHECK_EQ_STR(s.r.summary, "audit of stream 'train' epoch 0: PASS — 1 rank, 1 step and "
                            "1 sample each, covered 1 of 1 (exact)");
  CHECK_CONTAINS(s.text, "epoch 0, 1 rank, N = 1 (exact)");
  CHECK_CONTAINS(s.text, "  rank 0: 1 step, 1 sample\n");
  free(s.text);
  s.text = NULL;
}

TEST(out_of_range_indices_are_a_violation_named_by_rank) {
  /* full scope: rank 1 delivers 2 indices >= N and one < 0 in place of
   * three samples; the verdict names the garbage, not only what it hid */
  sim s = {0};
  sim_begin(&s, 3, 30, 1u << 20, DDPLUG__SCOPE_FULL, NULL);
  for (int r = 0; r < 3; r++) {
    int64_t idx[10];
    for (int k = 0; k < 10; k++) idx[k] = r * 10 + k;
    if (r == 1) {
      idx[0] = 30;
      idx[1] = 1000;
      idx[2] = -5;
    }
    ddplug__audit_add(s.a[r], idx, 10, 1);
  }
  sim_finish(&s);
  CHECK_EQ_INT(s.r.verdict, DDPLUG_AUDIT_OUT_OF_RANGE);
  CHECK(s.r.violations & (1u << DDPLUG_AUDIT_MISSING));
  CHECK_EQ_INT(s.r.out_of_range, 3);
  CHECK_CONTAINS(s.r.summary, "out of range: rank 1 delivered 3 indices outside [0, 30) — "
                              "they are not samples of this stream: check the N given to "
                              "the audit and the indices the sampler (or dataset index "
                              "map) yields");
  CHECK_CONTAINS(s.text, "  verdict: OUT_OF_RANGE\n");
  CHECK_CONTAINS(s.text, "indices outside [0, N): 3\n");
  /* the out-of-range diagnosis is listed before missing samples */
  const char *oor = strstr(s.text, "diagnosis: out of range");
  const char *miss = strstr(s.text, "diagnosis: missing samples");
  CHECK(oor && miss && oor < miss);
  free(s.text);
  s.text = NULL;

  /* several ranks; steps and order only (no coverage): still a violation */
  ddplug__audit_stats st[6];
  memset(st, 0, sizeof st);
  for (int r = 0; r < 6; r++) {
    st[r].num_samples = 100;
    st[r].scope = DDPLUG__SCOPE_ORDER;
    st[r].steps = 4;
    st[r].deliveries = 40;
    st[r].tracked = 100;
    st[r].out_of_range = r == 0 ? 0 : r;
  }
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  ddplug__audit_diagnose("val", st, 6, NULL, &r, NULL);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_OUT_OF_RANGE);
  CHECK_EQ_INT(r.full, 0);
  CHECK_EQ_INT(r.out_of_range, 15);
  CHECK_CONTAINS(r.summary, "out of range: rank 1 delivered 1 index outside [0, 100); "
                            "rank 2 delivered 2; rank 3 delivered 3; rank 4 delivered 4; "
                            "1 more rank did — ");
  /* uneven steps still come first */
  st[5].steps = 3;
  ddplug__audit_diagnose("val", st, 6, NULL, &r, NULL);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_UNEVEN);
  CHECK(r.violations & (1u << DDPLUG_AUDIT_OUT_OF_RANGE));
  CHECK_EQ_STR(ddplug_audit_verdict_name(DDPLUG_AUDIT_OUT_OF_RANGE), "OUT_OF_RANGE");
  CHECK_EQ_STR(ddplug_audit_verdict_name(DDPLUG_AUDIT_VERDICT_COUNT_), "UNKNOWN");
}

/* Ids: each rank's sorted distinct ids merged; a rank's own repeats are
 * counted when it sorts; the subset level halves what a rank keeps. */
TEST(ids_are_compared_across_ranks_and_within_one) {
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.by_id = 1;
  ddplug_audit *a[3];
  for (int r = 0; r < 3; r++)
    CHECK_OK(ddplug__audit_alloc("web", 0, 0, &o, DDPLUG__SCOPE_FULL, 1u << 20, r, 3, &a[r]));
  CHECK(a[0]->bits == NULL);
  /* ids 0..299 split by id % 3; rank 2 also delivers 7 (rank 1's) and its
   * own 5 twice */
  for (int r = 0; r < 3; r++) {
    uint64_t ids[120];
    uint64_t m = 0;
    for (uint64_t i = (uint64_t)r; i < 300; i += 3) ids[m++] = i * 1000003u;
    if (r == 2) {
      ids[m++] = 7 * 1000003u;
      ids[m++] = 5 * 1000003u;
    }
    CHECK_OK(ddplug__audit_add_ids(a[r], ids, m, 1));
    ddplug__audit_ids_sort(a[r]);
  }
  CHECK_EQ_INT(a[2]->local_repeats, 1);
  CHECK_EQ_INT(a[2]->local_ex[0], 5 * 1000003);
  ddplug__audit_coverage cov;
  memset(&cov, 0, sizeof cov);
  const uint64_t *parts[3] = {a[0]->ids, a[1]->ids, a[2]->ids};
  uint64_t counts[3] = {a[0]->nids, a[1]->nids, a[2]->nids};
  ddplug__audit_ids_merge(parts, counts, 3, &cov);
  CHECK_EQ_INT(cov.id_distinct, 300);
  CHECK_EQ_INT(cov.id_duplicates, 1);
  CHECK_EQ_INT(cov.nrepeat_ex, 1);
  CHECK_EQ_INT(cov.repeat_ex[0], 7 * 1000003); /* the id, not its hash */
  for (int r = 0; r < 3; r++) ddplug_audit_free(a[r]);

  /* a rank that may keep only 1024 ids raises its level: it keeps about
   * half (those in the lowest half of the hash range), never more than 1024 */
  ddplug_audit *b = NULL;
  CHECK_OK(ddplug__audit_alloc("web", 0, 0, &o, DDPLUG__SCOPE_FULL, 1024, 0, 1, &b));
  uint64_t many[3000];
  for (uint64_t i = 0; i < 3000; i++) many[i] = i;
  CHECK_OK(ddplug__audit_add_ids(b, many, 3000, 1));
  CHECK(b->level >= 2);
  CHECK(b->nids <= 1024 && b->nids > (uint64_t)(3000u >> (b->level + 1)));
  CHECK_EQ_INT(b->deliveries, 3000);
  ddplug_audit_free(b);
}
