/* test-audit.c — the per-epoch audit, split ownership across ranks and the
 * context-bound sampler in real multi-process runs (forked ranks, the real
 * rendezvous store, the store-based example backend's collectives). Each
 * failure mode comes from a deliberately broken split and must be diagnosed
 * with the exact sentence; correct splits must pass:
 *   split twice  -> "double partitioning: ranks together saw 252 of 1000 ..."
 *   not split    -> "no partitioning: every rank saw the same samples"
 *   uneven       -> "uneven batches: rank 3 has 62 steps, others 63 (will hang)"
 *   no set_epoch -> "epoch not advanced: ..."
 *   dropped      -> "missing samples: ..."
 *   garbage      -> "out of range: rank 2 delivered 3 indices outside [0, 1000)"
 * plus sampled mode, on_violation = warn, first_epoch scoping, audit off,
 * mismatched audits, ownership conflicts and disagreement, and a plugin's
 * own sampler slots (tests/plugins/sampler-plugin: with sampler_declared,
 * and as a plugin built against ABI 1.1 without it) on N % world != 0.
 * The failure modes run on the example backend and on the real host
 * plugin (libddplug-cpu.so). */
#include <pthread.h>
#include <stdlib.h>

#include "data/data.h"
#include "harness.h"

#define WORLD 4
#define N 1000

typedef struct setup {
  const char *plugin;
  const char *data_split; /* JSON object text for "data_split" */
} setup;

static ddplug_context *open_ctx(const setup *s) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"plugin\": \"%s\", \"data_split\": %s, "
           "\"timeouts\": {\"collective_s\": 60}, "
           "\"rendezvous\": {\"timeout_s\": 60}}",
           s->plugin ? s->plugin : "example",
           s->data_split ? s->data_split : "{\"audit\": \"every_epoch\"}");
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string(json, "test.json", &cfg));
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(cfg, NULL, &ctx));
  ddplug_config_free(cfg);
  return ctx;
}

/* A standalone distributed sampler over [0, n) for rank/world. */
static ddplug_sampler *plain(uint64_t n, int rank, int world, int shuffle,
                             uint64_t epoch) {
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = n;
  d.rank = rank;
  d.world_size = world;
  d.shuffle = shuffle;
  d.seed = 3;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_sampler_new(&d, &s));
  CHECK_OK(ddplug_sampler_set_epoch(s, epoch));
  return s;
}

/* Record everything s yields as steps of `batch` indices. */
static void record_all(ddplug_audit *a, ddplug_sampler *s, uint64_t batch) {
  int64_t buf[64];
  uint64_t got;
  for (;;) {
    CHECK_OK(ddplug_sampler_next(s, buf, batch, &got));
    if (!got) break;
    CHECK_OK(ddplug_audit_record(a, buf, got));
  }
}

/* A context-bound distributed sampler over N for stream. */
static ddplug_sampler *ctx_sampler(ddplug_context *ctx, const char *stream,
                                   int shuffle, uint64_t batch) {
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.stream = stream;
  d.num_samples = N;
  d.shuffle = shuffle;
  d.batch_size = batch;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_context_sampler_new(ctx, &d, &s));
  return s;
}

/* Consume the rest of the epoch in chunks of 100 (into out when given). */
static uint64_t drain(ddplug_sampler *s, int64_t *out) {
  int64_t buf[100];
  uint64_t got, k = 0;
  do {
    CHECK_OK(ddplug_sampler_next(s, out ? out + k : buf, 100, &got));
    k += got;
  } while (got);
  return k;
}

static ddplug_audit *begin_user(ddplug_context *ctx, uint64_t n, uint64_t epoch,
                                int shuffle) {
  CHECK_OK(ddplug_split_claim(ctx, "train", DDPLUG_OWNER_USER, "test sampler"));
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.shuffle = shuffle;
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug_audit_begin(ctx, "train", n, epoch, &o, &a));
  return a;
}

static void expect_failure(ddplug_context *ctx, ddplug_audit *a, int verdict,
                           const char *sentence) {
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_STATUS(ddplug_audit_finish(a, &r, 30000), DDPLUG_E_AUDIT_FAILED);
  CHECK_CONTAINS(ddplug_last_error(), sentence);
  CHECK_CONTAINS(ddplug_context_error(ctx), sentence);
  CHECK_EQ_INT(r.verdict, verdict);
  CHECK_CONTAINS(r.summary, sentence);
  CHECK_CONTAINS(ddplug_audit_text(a), "diagnosis: ");
  ddplug_audit_free(a);
}

static void run(dt_rank_fn fn, const char *const *env) {
  int failed = dt_run_ranks(WORLD, fn, NULL, env, 120, NULL);
  CHECK_EQ_INT(failed, 0);
}

/* Run fn on every rank with the plugin named by arg ("cpu", ...). */
static void run_on(dt_rank_fn fn, const char *plugin) {
  int failed = dt_run_ranks(WORLD, fn, (void *)plugin, NULL, 120, NULL);
  CHECK_EQ_INT(failed, 0);
}

/* ---- correct splits pass ------------------------------------------------- */

static void rank_plugin_sampler_passes(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_sampler *s = ctx_sampler(ctx, "train", 1, 16);
  int owner;
  char who[64];
  CHECK_OK(ddplug_split_owner(ctx, "train", &owner, who, sizeof who));
  CHECK_EQ_INT(owner, DDPLUG_OWNER_PLUGIN);
  CHECK_EQ_STR(who, "ddplug sampler");
  CHECK_OK(ddplug_split_agree(ctx, "train", 30000));
  for (uint64_t epoch = 0; epoch < 2; epoch++) {
    CHECK_OK(ddplug_sampler_set_epoch(s, epoch));
    ddplug_audit *a = NULL;
    CHECK_OK(ddplug_audit_begin(ctx, "train", N, epoch, NULL, &a));
    drain(s, NULL);
    /* the sampler records: the host must not record too */
    int64_t one = 0;
    CHECK_STATUS(ddplug_audit_record(a, &one, 1), DDPLUG_E_INVALID_ARGUMENT);
    CHECK_CONTAINS(ddplug_last_error(), "would count every step twice");
    ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
    CHECK_OK(ddplug_audit_finish(a, &r, 30000));
    CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
    CHECK_EQ_INT(r.exact, 1);
    CHECK_EQ_INT(r.covered, N);
    CHECK_EQ_INT(r.common, 0);
    CHECK_EQ_INT(r.deliveries, N);
    CHECK_EQ_INT(r.steps_min, 16); /* 250 indices in batches of 16 */
    CHECK_EQ_INT(r.steps_max, 16);
    uint64_t steps = 0, samples = 0;
    for (int32_t k = 0; k < world; k++) { /* every rank's counts, on every rank */
      CHECK_OK(ddplug_audit_rank_counts(a, k, &steps, &samples));
      CHECK_EQ_INT(samples, 250);
      CHECK_EQ_INT(steps, 16);
    }
    CHECK_STATUS(ddplug_audit_rank_counts(a, world, &steps, &samples), DDPLUG_E_INVALID_ARGUMENT);
    CHECK_CONTAINS(ddplug_last_error(), "rank 4 is not in the world");
    CHECK_CONTAINS(ddplug_audit_text(a), "  rank 3: 16 steps, 250 samples\n");
    CHECK_CONTAINS(r.summary, "audit of stream 'train' epoch");
    CHECK_CONTAINS(r.summary, ": PASS — 4 ranks, 16 steps and 250 samples each, covered 1000 of 1000 (exact)");
    ddplug_audit_free(a);
  }
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(correct_plugin_sampler_passes_every_epoch, 150) {
  run(rank_plugin_sampler_passes, NULL);
}

TEST_T(correct_plugin_sampler_passes_every_epoch_on_cpu, 150) {
  run_on(rank_plugin_sampler_passes, "cpu");
}

static void rank_bucket_passes_with_padding(int rank, int world, void *arg) {
  setup su = {0};
  ddplug_context *ctx = open_ctx(&su);
  int64_t lengths[N];
  for (int i = 0; i < N; i++) lengths[i] = (i * 37) % 500;
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_BUCKET;
  d.stream = "val";
  d.num_samples = N;
  d.shuffle = 1;
  d.lengths = lengths;
  d.batch_size = 8;
  d.num_buckets = 5;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_context_sampler_new(ctx, &d, &s));
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug_audit_begin(ctx, "val", N, 0, NULL, &a));
  int64_t buf[8];
  uint64_t got, batches = 0;
  /* two batches before... then the rest: the audit sees them all */
  do { CHECK_OK(ddplug_sampler_next(s, buf, 8, &got)); batches += got > 0; } while (got);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_OK(ddplug_audit_finish(a, &r, 30000));
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(r.covered, N);
  CHECK_EQ_INT(r.steps_min, batches);
  CHECK(r.allowed_padding > 0 && r.repeats == r.allowed_padding);
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(bucket_sampler_with_declared_padding_passes, 150) {
  run(rank_bucket_passes_with_padding, NULL);
}

static void rank_late_audit_replays(int rank, int world, void *arg) {
  setup su = {0};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_sampler *s = ctx_sampler(ctx, "train", 1, 0);
  int64_t buf[30];
  uint64_t got;
  CHECK_OK(ddplug_sampler_next(s, buf, 30, &got)); /* before the audit began */
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug_audit_begin(ctx, "train", N, 0, NULL, &a));
  drain(s, NULL);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_OK(ddplug_audit_finish(a, &r, 30000));
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(r.deliveries, N);
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(an_audit_begun_late_replays_the_epoch, 150) {
  run(rank_late_audit_replays, NULL);
}

/* ---- broken splits are diagnosed ----------------------------------------- */

static void rank_split_twice(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit *a = begin_user(ctx, N, 0, 0);
  /* a rank-aware sampler, then the framework's DistributedSampler again over
   * its output (padded to equal counts: 63 of this rank's 250 each) */
  ddplug_sampler *s = plain(N, rank, world, 1, 0);
  int64_t mine[N];
  uint64_t got, k = 0;
  do { CHECK_OK(ddplug_sampler_next(s, mine + k, 64, &got)); k += got; } while (got);
  uint64_t per = (k + (uint64_t)world - 1) / (uint64_t)world;
  for (uint64_t i = 0; i < per; i++)
    CHECK_OK(ddplug_audit_record(a, &mine[((uint64_t)rank + i * (uint64_t)world) % k], 1));
  expect_failure(ctx, a, DDPLUG_AUDIT_DOUBLE_PARTITION,
                 "double partitioning: ranks together saw 252 of 1000 samples "
                 "(about N/4 with 4 ranks; 748 never delivered, e.g. sample ");
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(split_twice_is_double_partitioning, 150) { run(rank_split_twice, NULL); }
TEST_T(split_twice_is_double_partitioning_on_cpu, 150) { run_on(rank_split_twice, "cpu"); }

static void rank_not_split(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit *a = begin_user(ctx, N, 0, 0);
  ddplug_sampler *s = plain(N, 0, 1, 1, 0); /* world 1 on every rank */
  record_all(a, s, 32);
  expect_failure(ctx, a, DDPLUG_AUDIT_NO_PARTITION,
                 "no partitioning: every rank saw the same samples (each of the "
                 "4 ranks saw the same 1000 of 1000)");
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(not_split_is_no_partitioning, 150) { run(rank_not_split, NULL); }
TEST_T(not_split_is_no_partitioning_on_cpu, 150) { run_on(rank_not_split, "cpu"); }

static void rank_uneven(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit *a = begin_user(ctx, N, 0, 0);
  /* 250 per rank in batches of 4 = 63 steps; rank 3's loader drops its
   * last partial... here: rank 3 takes batches of 4 but stops one early */
  ddplug_sampler *s = plain(N, rank, world, 0, 0);
  int64_t buf[4];
  uint64_t got, steps = 0;
  for (;;) {
    CHECK_OK(ddplug_sampler_next(s, buf, 4, &got));
    if (!got || (rank == 3 && steps == 62)) break;
    CHECK_OK(ddplug_audit_record(a, buf, got));
    steps++;
  }
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_STATUS(ddplug_audit_finish(a, &r, 30000), DDPLUG_E_AUDIT_FAILED);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_UNEVEN);
  CHECK_CONTAINS(ddplug_last_error(),
                 "uneven batches: rank 3 has 62 steps, others 63 (will hang)");
  CHECK(r.violations & (1u << DDPLUG_AUDIT_MISSING)); /* rank 3's tail */
  CHECK_EQ_INT(r.steps_min_rank, 3);
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(uneven_steps_are_diagnosed_with_the_rank, 150) { run(rank_uneven, NULL); }
TEST_T(uneven_steps_are_diagnosed_on_cpu, 150) { run_on(rank_uneven, "cpu"); }

static void rank_epoch_not_advanced(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_sampler *s = ctx_sampler(ctx, "train", 1, 0);
  for (uint64_t epoch = 0; epoch < 2; epoch++) {
    /* the bug: set_epoch is never called; the trainer rewinds with seek */
    CHECK_OK(ddplug_sampler_seek(s, 0));
    ddplug_audit *a = NULL;
    CHECK_OK(ddplug_audit_begin(ctx, "train", N, epoch, NULL, &a));
    drain(s, NULL);
    if (epoch == 0) {
      ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
      CHECK_OK(ddplug_audit_finish(a, &r, 30000));
      ddplug_audit_free(a);
    } else {
      expect_failure(ctx, a, DDPLUG_AUDIT_EPOCH_NOT_ADVANCED,
                     "epoch not advanced: ranks 0, 1, 2, 3 delivered epoch 1 in "
                     "the order of an earlier epoch (the sampler's epoch was not "
                     "set) although shuffling is on — call set_epoch(epoch)");
    }
  }
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(a_sampler_left_at_an_old_epoch_is_diagnosed, 150) {
  run(rank_epoch_not_advanced, NULL);
}

TEST_T(a_sampler_left_at_an_old_epoch_is_diagnosed_on_cpu, 150) {
  run_on(rank_epoch_not_advanced, "cpu");
}

static void rank_same_order_user(int rank, int world, void *arg) {
  setup su = {0};
  ddplug_context *ctx = open_ctx(&su);
  for (uint64_t epoch = 0; epoch < 2; epoch++) {
    ddplug_audit *a = begin_user(ctx, N, epoch, 1);
    ddplug_sampler *s = plain(N, rank, world, 1, 0); /* epoch 0 order twice */
    record_all(a, s, 10);
    if (epoch == 0) {
      ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
      CHECK_OK(ddplug_audit_finish(a, &r, 30000));
      CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
      ddplug_audit_free(a);
    } else {
      expect_failure(ctx, a, DDPLUG_AUDIT_EPOCH_NOT_ADVANCED,
                     "epoch not advanced: ranks 0, 1, 2, 3 delivered epoch 1 in "
                     "the same order as the previous epoch although shuffling is on");
    }
    ddplug_sampler_free(s);
  }
  ddplug_close(ctx);
}

TEST_T(a_user_order_repeated_across_epochs_is_diagnosed, 150) {
  run(rank_same_order_user, NULL);
}

static void rank_missing(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit *a = begin_user(ctx, N, 0, 0);
  ddplug_sampler *s = plain(N, rank, world, 0, 0);
  int64_t buf[10];
  uint64_t got;
  for (;;) { /* rank 1 skips every index below 100 (a filtering bug) */
    CHECK_OK(ddplug_sampler_next(s, buf, 10, &got));
    if (!got) break;
    if (rank == 1) for (uint64_t k = 0; k < got; k++) if (buf[k] < 100) buf[k] = buf[k] + 200;
    CHECK_OK(ddplug_audit_record(a, buf, got));
  }
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_STATUS(ddplug_audit_finish(a, &r, 30000), DDPLUG_E_AUDIT_FAILED);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_MISSING);
  CHECK_CONTAINS(ddplug_last_error(),
                 "missing samples: ranks together saw 975 of 1000 samples; 25 "
                 "never delivered (declared dropped: 0), e.g. sample 1, 5, 9, 13, 17");
  CHECK_CONTAINS(ddplug_last_error(), "(and 1 more problem in the report)");
  CHECK(r.violations & (1u << DDPLUG_AUDIT_OVERLAP));
  CHECK_EQ_INT(r.missing, 25);
  CHECK_EQ_INT(r.repeats, 25);
  CHECK_EQ_INT(r.cross_repeats, 0);
  /* both problems, each with examples: the repeats are rank 1's own */
  CHECK_CONTAINS(ddplug_audit_text(a),
                 "diagnosis: repeated samples: 25 deliveries repeated a sample already "
                 "delivered (declared padding: 0): 0 across ranks, 25 within one rank, "
                 "e.g. sample 201, 205, 209, 213, 217, 221, 225, 229 — a sampler that "
                 "repeats samples");
  int64_t ex[16];
  uint64_t nex = 0;
  CHECK_OK(ddplug_audit_examples(a, DDPLUG_AUDIT_MISSING, ex, 16, &nex));
  CHECK_EQ_INT(nex, 8);
  CHECK_EQ_INT(ex[0], 1);
  CHECK_EQ_INT(ex[7], 29);
  CHECK_OK(ddplug_audit_examples(a, DDPLUG_AUDIT_OVERLAP, ex, 2, &nex));
  CHECK_EQ_INT(nex, 2);
  CHECK_EQ_INT(ex[1], 205);
  CHECK_STATUS(ddplug_audit_examples(a, DDPLUG_AUDIT_UNEVEN, ex, 2, &nex), DDPLUG_E_INVALID_ARGUMENT);
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(missing_samples_are_diagnosed_with_examples, 150) { run(rank_missing, NULL); }
TEST_T(missing_samples_are_diagnosed_on_cpu, 150) { run_on(rank_missing, "cpu"); }

/* ---- modes --------------------------------------------------------------- */

static void rank_sampled(int rank, int world, void *arg) {
  setup su = {NULL, "{\"audit\": \"every_epoch\", \"audit_exact_max\": 1024}"};
  ddplug_context *ctx = open_ctx(&su);
  const uint64_t n = 100000;
  /* correct split: passes, sampled */
  ddplug_audit *a = begin_user(ctx, n, 0, 1);
  ddplug_sampler *s = plain(n, rank, world, 1, 0);
  record_all(a, s, 64);
  ddplug_sampler_free(s);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_OK(ddplug_audit_finish(a, &r, 30000));
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(r.exact, 0);
  CHECK_EQ_INT(r.tracked, 1024);
  CHECK_EQ_INT(r.covered, n);
  CHECK_CONTAINS(r.summary, "(sampled)");
  ddplug_audit_free(a);
  /* split twice: still caught from the subset */
  CHECK_OK(ddplug_audit_begin(ctx, "train", n, 1, NULL, &a));
  s = plain(n, rank, world, 1, 1);
  int64_t *mine = malloc(sizeof *mine * n);
  uint64_t got, k = 0;
  do { CHECK_OK(ddplug_sampler_next(s, mine + k, 4096, &got)); k += got; } while (got);
  uint64_t per = (k + (uint64_t)world - 1) / (uint64_t)world;
  for (uint64_t i = 0; i < per; i++)
    CHECK_OK(ddplug_audit_record(a, &mine[((uint64_t)rank + i * (uint64_t)world) % k], 1));
  CHECK_STATUS(ddplug_audit_finish(a, &r, 30000), DDPLUG_E_AUDIT_FAILED);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_DOUBLE_PARTITION);
  CHECK_CONTAINS(ddplug_last_error(), "double partitioning: ranks together saw ");
  ddplug_audit_free(a);
  free(mine);
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(sampled_mode_beyond_exact_max, 150) { run(rank_sampled, NULL); }

static int g_warned;
static void capture(void *user, int level, int rank, const char *line) {
  (void)user;
  if (level == DDPLUG_LOG_WARN && strstr(line, "no partitioning")) g_warned++;
}

static void rank_warn_and_first_epoch(int rank, int world, void *arg) {
  setup su = {NULL, "{\"audit\": \"first_epoch\", \"on_violation\": \"warn\"}"};
  ddplug_log_set_callback(capture, NULL);
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  for (uint64_t epoch = 0; epoch < 3; epoch++) {
    ddplug_audit *a = begin_user(ctx, N, epoch, 0);
    ddplug_sampler *s = plain(N, 0, 1, 0, 0); /* not split: a violation */
    record_all(a, s, 50);
    CHECK_OK(ddplug_audit_finish(a, &r, 30000)); /* warn: OK */
    static const int want[3] = {DDPLUG_AUDIT_NO_PARTITION, DDPLUG_AUDIT_PASS,
                                DDPLUG_AUDIT_SKIPPED};
    CHECK_EQ_INT(r.verdict, want[epoch]);
    CHECK_EQ_INT(r.full, epoch == 0);
    ddplug_audit_free(a);
    ddplug_sampler_free(s);
  }
  CHECK_EQ_INT(g_warned, 1);
  CHECK_CONTAINS(r.summary, "SKIPPED");
  ddplug_close(ctx);
  ddplug_log_set_callback(NULL, NULL);
}

TEST_T(warn_mode_and_first_epoch_scoping, 150) { run(rank_warn_and_first_epoch, NULL); }

static void rank_mismatch(int rank, int world, void *arg) {
  setup su = {0};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit *a = begin_user(ctx, rank == 2 ? N + 1 : N, 0, 0);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_STATUS(ddplug_audit_finish(a, &r, 30000), DDPLUG_E_MISMATCH);
  /* every rank names rank 0's values under rank 0 and rank 2's under rank 2 */
  CHECK_CONTAINS(ddplug_last_error(), "audit of stream 'train' epoch 0: rank 0 audits epoch 0, "
                                      "N = 1000, full, by index; rank 2 audits epoch 0, "
                                      "N = 1001, full, by index — every rank must begin the "
                                      "same audits in the same order");
  ddplug_audit_free(a);
  ddplug_close(ctx);
}

TEST_T(ranks_auditing_different_things_get_mismatch, 150) { run(rank_mismatch, NULL); }

/* ---- ownership across ranks ---------------------------------------------- */

static void rank_ownership(int rank, int world, void *arg) {
  setup su = {NULL, "{\"streams\": {\"test\": {\"owner\": \"framework\"}}}"};
  ddplug_context *ctx = open_ctx(&su);
  /* a stream owned by the user: the plugin's sampler refuses it */
  CHECK_OK(ddplug_split_claim(ctx, "train", DDPLUG_OWNER_USER, "MyBucketSampler"));
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = N;
  ddplug_sampler *s = NULL;
  CHECK_STATUS(ddplug_context_sampler_new(ctx, &d, &s), DDPLUG_E_SPLIT_CONFLICT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "stream 'train' is split by user (MyBucketSampler): the plugin's "
                 "sampler refuses to split a stream it does not own");
  CHECK(s == NULL);
  /* the config forces the framework for "test" */
  int owner;
  char who[128];
  CHECK_OK(ddplug_split_owner(ctx, "test", &owner, who, sizeof who));
  CHECK_EQ_INT(owner, DDPLUG_OWNER_FRAMEWORK);
  CHECK_EQ_STR(who, "data_split.streams.test.owner in test.json");
  d.stream = "test";
  CHECK_STATUS(ddplug_context_sampler_new(ctx, &d, &s), DDPLUG_E_SPLIT_CONFLICT);
  CHECK_STATUS(ddplug_split_claim(ctx, "test", DDPLUG_OWNER_USER, "x"), DDPLUG_E_SPLIT_CONFLICT);
  CHECK_CONTAINS(ddplug_last_error(), "data_split.streams.test.owner in test.json forces owner framework");
  /* desc rank/world that contradict the context */
  d.stream = "val";
  d.rank = (rank + 1) % world;
  d.world_size = world;
  CHECK_STATUS(ddplug_context_sampler_new(ctx, &d, &s), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "leave rank and world_size 0");
  /* agreement: rank 2 resolves differently */
  CHECK_OK(ddplug_split_agree(ctx, "train", 30000));
  CHECK_OK(ddplug_split_claim(ctx, "val", rank == 2 ? DDPLUG_OWNER_USER : DDPLUG_OWNER_PLUGIN,
                              rank == 2 ? "RankAwareSampler" : "ddplug sampler"));
  CHECK_STATUS(ddplug_split_agree(ctx, "val", 30000), DDPLUG_E_SPLIT_CONFLICT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "stream 'val': ranks disagree on who splits the data: rank(s) 2 "
                 "resolved user (rank 2: claimed by 'RankAwareSampler') while "
                 "rank(s) 0, 1, 3 resolved plugin");
  ddplug_close(ctx);
}

TEST_T(ownership_conflicts_and_disagreement_across_ranks, 150) {
  run(rank_ownership, NULL);
}

static void rank_agree_timeout(int rank, int world, void *arg) {
  setup su = {0};
  ddplug_context *ctx = open_ctx(&su);
  /* Together first: a rank that reached the agreement over 1.5 s after the
   * others would rightly be named with rank 3. */
  CHECK_OK(ddplug_barrier(ctx, 30000));
  if (rank != 3) {
    CHECK_STATUS(ddplug_split_agree(ctx, "train", 1500), DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), "rank(s) 3 did not call it within 1.5 s");
  }
  ddplug_barrier(ctx, 30000);
  ddplug_close(ctx);
}

TEST_T(agreement_names_ranks_that_never_come, 150) { run(rank_agree_timeout, NULL); }

/* ---- a plugin's own sampler ---------------------------------------------- */

static void rank_plugin_slots(int rank, int world, void *arg) {
  setup su = {"sampler-plugin", NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = N;
  d.shuffle = 1;
  d.seed = 5;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_context_sampler_new(ctx, &d, &s));
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_INT(info.from_plugin, 1);
  CHECK_EQ_INT(info.length, 250);
  CHECK_OK(ddplug_sampler_set_epoch(s, 2));
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug_audit_begin(ctx, "train", N, 2, NULL, &a));
  int64_t buf[350];
  uint64_t got, k = drain(s, buf);
  CHECK_EQ_INT(k, 250);
  uint64_t offset = (5 + 7919 * 2) % N; /* the plugin's documented order */
  for (uint64_t j = 0; j < k; j++)
    CHECK_EQ_INT(buf[j], (int64_t)((N - 1 - ((uint64_t)rank + j * 4) % N + offset) % N));
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_OK(ddplug_audit_finish(a, &r, 30000));
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(r.covered, N);
  ddplug_audit_free(a);
  CHECK_OK(ddplug_sampler_seek(s, 100)); /* through the plugin's seek slot */
  CHECK_OK(ddplug_sampler_next(s, buf, 1, &got));
  CHECK_EQ_INT(buf[0], (int64_t)((N - 1 - ((uint64_t)rank + 100 * 4) % N + offset) % N));
  /* the plugin refuses the bucket kind with its own explanation */
  int64_t lengths[4] = {1, 2, 3, 4};
  d.kind = DDPLUG_SAMPLER_BUCKET;
  d.num_samples = 4;
  d.lengths = lengths;
  d.batch_size = 1;
  d.num_buckets = 1;
  d.stream = "bucketed";
  ddplug_sampler *b = NULL;
  CHECK_STATUS(ddplug_context_sampler_new(ctx, &d, &b), DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(ddplug_last_error(), "sampler-plugin serves only DDPLUG_SAMPLER_DISTRIBUTED");
  CHECK(b == NULL);
  int owner;
  CHECK_OK(ddplug_split_owner(ctx, "bucketed", &owner, NULL, 0));
  CHECK_EQ_INT(owner, DDPLUG_OWNER_UNSET); /* the failed call claimed nothing */
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(a_plugin_supplies_its_own_sampler_through_the_slots, 150) {
  run(rank_plugin_slots, NULL);
}

/* A correct plugin sampler whose split does not come out even: N = 1001 on
 * 4 ranks (3 padded deliveries, or 1 sample dropped), and whole batches of
 * 16 per rank (23 padded, or 41 dropped: more than could be derived). */
typedef struct uneven_case {
  const char *plugin;
  int drop_last;
  uint64_t batch;
  int verdict;                /* expected                               */
  uint64_t padding, missing;  /* the report's allowed_* (declared)      */
  uint64_t per_rank;
} uneven_case;

static void rank_plugin_uneven_n(int rank, int world, void *arg) {
  const uneven_case *c = arg;
  setup su = {c->plugin, NULL};
  ddplug_context *ctx = open_ctx(&su);
  const uint64_t n = N + 1;
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = n;
  d.shuffle = 1;
  d.seed = 5;
  d.drop_last = c->drop_last;
  d.batch_size = c->batch;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_context_sampler_new(ctx, &d, &s));
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  CHECK_OK(ddplug_sampler_info_get(s, &info));
  CHECK_EQ_INT(info.from_plugin, 1);
  CHECK_EQ_INT(info.length, c->per_rank);
  CHECK_EQ_INT(info.padded, c->padding);
  CHECK_EQ_INT(info.dropped, c->missing);
  for (uint64_t epoch = 0; epoch < 2; epoch++) {
    CHECK_OK(ddplug_sampler_set_epoch(s, epoch));
    ddplug_audit *a = NULL;
    CHECK_OK(ddplug_audit_begin(ctx, "train", n, epoch, NULL, &a));
    CHECK_EQ_INT(drain(s, NULL), c->per_rank);
    ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
    int st = ddplug_audit_finish(a, &r, 30000);
    CHECK_MSG(r.verdict == c->verdict, "%s drop_last=%d batch=%llu: %s",
              c->plugin, c->drop_last, (unsigned long long)c->batch, r.summary);
    CHECK_EQ_INT(st, c->verdict == DDPLUG_AUDIT_PASS ? DDPLUG_OK : DDPLUG_E_AUDIT_FAILED);
    CHECK_EQ_INT(r.deliveries, c->per_rank * (uint64_t)world);
    CHECK_EQ_INT(r.allowed_padding, c->padding);
    CHECK_EQ_INT(r.allowed_missing, c->missing);
    uint64_t total = c->per_rank * (uint64_t)world;
    CHECK_EQ_INT(r.repeats, total > n ? total - n : 0);
    CHECK_EQ_INT(r.covered, total > n ? n : total);
    ddplug_audit_free(a);
  }
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

static void run_uneven(const uneven_case *c) {
  int failed = dt_run_ranks(WORLD, rank_plugin_uneven_n, (void *)c, NULL, 120, NULL);
  CHECK_EQ_INT(failed, 0);
}

TEST_T(a_plugin_sampler_declares_its_padding_when_n_is_not_a_multiple, 150) {
  /* the slot (ABI 1.2) declares it */
  uneven_case pad = {"sampler-plugin", 0, 0, DDPLUG_AUDIT_PASS, 3, 0, 251};
  run_uneven(&pad);
  uneven_case drop = {"sampler-plugin", 1, 0, DDPLUG_AUDIT_PASS, 0, 1, 250};
  run_uneven(&drop);
  /* whole batches of 16: only the slot can know 23 repeats are padding */
  uneven_case bpad = {"sampler-plugin", 0, 16, DDPLUG_AUDIT_PASS, 23, 0, 256};
  run_uneven(&bpad);
  uneven_case bdrop = {"sampler-plugin", 1, 16, DDPLUG_AUDIT_PASS, 0, 41, 240};
  run_uneven(&bdrop);
}

TEST_T(a_plugin_sampler_without_the_slot_gets_its_padding_derived, 150) {
  /* a plugin built against ABI 1.1: torch-like padding is derived from its
   * length (ceil/floor of N / world) */
  uneven_case pad = {"sampler-plugin-1.1", 0, 0, DDPLUG_AUDIT_PASS, 3, 0, 251};
  run_uneven(&pad);
  uneven_case drop = {"sampler-plugin-1.1", 1, 0, DDPLUG_AUDIT_PASS, 0, 1, 250};
  run_uneven(&drop);
  /* what it does not declare and equal lengths do not need is reported */
  uneven_case bpad = {"sampler-plugin-1.1", 0, 16, DDPLUG_AUDIT_OVERLAP, 0, 0, 256};
  run_uneven(&bpad);
  uneven_case bdrop = {"sampler-plugin-1.1", 1, 16, DDPLUG_AUDIT_MISSING, 0, 0, 240};
  run_uneven(&bdrop);
}

/* What the host declared at begin is kept: the sampler's declaration adds
 * to it, never lowers it to its own (smaller) numbers. */
static void rank_host_declared_kept(int rank, int world, void *arg) {
  setup su = {"sampler-plugin", NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_sampler_options d = DDPLUG_SAMPLER_OPTIONS_INIT;
  d.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  d.num_samples = N + 1;
  d.shuffle = 0;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_context_sampler_new(ctx, &d, &s));
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.allowed_padding = 10;
  o.allowed_missing = 4;
  o.shuffle = 1;
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug_audit_begin(ctx, "train", N + 1, 0, &o, &a));
  drain(s, NULL);
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_OK(ddplug_audit_finish(a, &r, 30000));
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(r.allowed_padding, 10);
  CHECK_EQ_INT(r.allowed_missing, 4);
  CHECK(a->opts.shuffle == 1); /* the host's shuffle = 1 is kept too */
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(host_declared_allowances_are_never_lowered_by_the_sampler, 150) {
  run(rank_host_declared_kept, NULL);
}

/* A rank that delivers indices that are no sample fails the audit even
 * though coverage, steps and order are fine. */
static void rank_out_of_range(int rank, int world, void *arg) {
  setup su = {arg, NULL};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_audit *a = begin_user(ctx, N, 0, 0);
  ddplug_sampler *s = plain(N, rank, world, 1, 0);
  record_all(a, s, 10);
  if (rank == 2) { /* one extra step of garbage: -1, N, N + 7 */
    int64_t bad[3] = {-1, N, N + 7};
    CHECK_OK(ddplug_audit_record(a, bad, 3));
  } else { /* the same number of steps elsewhere */
    CHECK_OK(ddplug_audit_record(a, NULL, 0));
  }
  ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
  CHECK_STATUS(ddplug_audit_finish(a, &r, 30000), DDPLUG_E_AUDIT_FAILED);
  CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_OUT_OF_RANGE);
  CHECK_EQ_INT(r.violations, 1u << DDPLUG_AUDIT_OUT_OF_RANGE);
  CHECK_EQ_INT(r.out_of_range, 3);
  CHECK_EQ_INT(r.covered, N);
  CHECK_CONTAINS(ddplug_last_error(),
                 "out of range: rank 2 delivered 3 indices outside [0, 1000) — "
                 "they are not samples of this stream");
  CHECK_CONTAINS(ddplug_audit_text(a), "diagnosis: out of range: rank 2 delivered 3 indices");
  CHECK_EQ_STR(ddplug_audit_verdict_name(r.verdict), "OUT_OF_RANGE");
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  ddplug_close(ctx);
}

TEST_T(out_of_range_indices_are_a_violation, 150) { run(rank_out_of_range, NULL); }
TEST_T(out_of_range_indices_are_a_violation_on_cpu, 150) {
  run_on(rank_out_of_range, "cpu");
}

/* data_split.audit = "off": every epoch is SKIPPED, locally (no
 * collective: rank 1 never finishes, and the others do not wait for it),
 * even for a split that is plainly wrong; the sampler still works. */
static void rank_audit_off(int rank, int world, void *arg) {
  setup su = {NULL, "{\"audit\": \"off\"}"};
  ddplug_context *ctx = open_ctx(&su);
  ddplug_sampler *cs = ctx_sampler(ctx, "val", 1, 0);
  for (uint64_t epoch = 0; epoch < 3; epoch++) {
    ddplug_audit *a = begin_user(ctx, N, epoch, 1);
    ddplug_sampler *s = plain(N, 0, 1, 1, 0); /* not split, same order */
    record_all(a, s, 50);
    ddplug_sampler_free(s);
    /* a plugin-owned stream is not audited either */
    ddplug_audit *v = NULL;
    CHECK_OK(ddplug_audit_begin(ctx, "val", N, epoch, NULL, &v));
    CHECK_OK(ddplug_sampler_set_epoch(cs, epoch));
    CHECK_EQ_INT(drain(cs, NULL), N / WORLD);
    if (rank != 1) {
      ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
      CHECK_OK(ddplug_audit_finish(a, &r, 2000));
      CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_SKIPPED);
      CHECK_EQ_INT(r.violations, 0);
      CHECK_EQ_INT(r.full, 0);
      CHECK_EQ_INT(r.world_size, WORLD);
      CHECK_EQ_INT(r.steps_max, 20);
      char want[128];
      snprintf(want, sizeof want,
               "audit of stream 'train' epoch %llu: SKIPPED (data_split.audit)",
               (unsigned long long)epoch);
      CHECK_EQ_STR(r.summary, want);
      CHECK_OK(ddplug_audit_finish(v, &r, 2000));
      CHECK_EQ_INT(r.verdict, DDPLUG_AUDIT_SKIPPED);
    }
    ddplug_audit_free(a);
    ddplug_audit_free(v);
  }
  ddplug_sampler_free(cs);
  CHECK_OK(ddplug_barrier(ctx, 30000));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(audit_off_skips_every_epoch_without_communicating, 150) {
  run(rank_audit_off, NULL);
}

/* ---- ids, declarations, evaluation, examples through the real finish ------ */

static void record_ids_upto(ddplug_audit *a, uint64_t lo, uint64_t hi, uint64_t step,
                            uint64_t extra) {
  uint64_t ids[16];
  uint64_t m = 0;
  for (uint64_t i = lo; i < hi; i += step) {
    ids[m++] = i * 7919u + 13u;
    if (m == 16) {
      CHECK_OK(ddplug_audit_record_ids(a, ids, m));
      m = 0;
    }
  }
  if (extra != UINT64_MAX) ids[m++] = extra * 7919u + 13u;
  if (m) CHECK_OK(ddplug_audit_record_ids(a, ids, m));
}

static void rank_ids_and_declarations(int rank, int world, void *arg) {
  setup su = {arg, "{\"audit\": \"every_epoch\", \"on_violation\": \"warn\", "
                   "\"audit_exact_max\": 1024}"};
  ddplug_context *ctx = open_ctx(&su);
  uint64_t r = (uint64_t)rank, g = (uint64_t)world, n;
  int64_t ex[8];
  ddplug_audit_report rep = DDPLUG_AUDIT_REPORT_INIT;

  /* by id, exact: ids r, r + 4, ... of 400; rank 3 also delivers rank 1's 5 */
  ddplug_audit_options o = DDPLUG_AUDIT_OPTIONS_INIT;
  o.by_id = 1;
  ddplug_audit *a = NULL;
  CHECK_OK(ddplug_audit_begin(ctx, "web", 400, 0, &o, &a));
  int64_t one = 1;
  CHECK_STATUS(ddplug_audit_record(a, &one, 1), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "record with ddplug_audit_record_ids");
  record_ids_upto(a, r, 400, g, rank == 3 ? 5 : UINT64_MAX);
  CHECK_OK(ddplug_audit_finish(a, &rep, 30000));
  CHECK_EQ_INT(rep.verdict, DDPLUG_AUDIT_OVERLAP);
  CHECK_EQ_INT(rep.covered, 400);
  CHECK_EQ_INT(rep.repeats, 1);
  CHECK_EQ_INT(rep.exact, 1);
  CHECK_OK(ddplug_audit_examples(a, DDPLUG_AUDIT_OVERLAP, ex, 8, &n));
  CHECK_EQ_INT(n, 1);
  CHECK_EQ_INT(ex[0], 5 * 7919 + 13);
  ddplug_audit_free(a);

  /* by id, sampled: 3000 ids per rank (1024 may be kept), 200 of them
   * delivered by two ranks: found in the hashed subset, counted about right */
  CHECK_OK(ddplug_audit_begin(ctx, "web", 0, 1, &o, &a));
  record_ids_upto(a, r * 3000, r * 3000 + 3000, 1, UINT64_MAX);
  if (rank == 1) record_ids_upto(a, 0, 200, 1, UINT64_MAX); /* rank 0's first 200 */
  CHECK_OK(ddplug_audit_finish(a, &rep, 30000));
  CHECK(rep.violations & (1u << DDPLUG_AUDIT_OVERLAP)); /* rank 1's extra steps: uneven too */
  CHECK_EQ_INT(rep.exact, 0);
  CHECK_MSG(rep.repeats > 80 && rep.repeats < 500, "estimated %llu repeats of 200",
            (unsigned long long)rep.repeats);
  CHECK_CONTAINS(ddplug_audit_text(a), "sampled 1 in ");
  CHECK_CONTAINS(ddplug_audit_text(a), "ids (by hash): a set of d repeated ids goes unseen");
  ddplug_audit_free(a);

  /* indices declared dropped (the same set everywhere): 0..9 may go */
  CHECK_OK(ddplug_split_claim(ctx, "train", DDPLUG_OWNER_USER, "test sampler"));
  int64_t gone[10];
  for (int k = 0; k < 10; k++) gone[k] = k;
  for (int epoch = 0; epoch < 2; epoch++) {
    CHECK_OK(ddplug_audit_begin(ctx, "train", 410, (uint64_t)epoch, NULL, &a));
    CHECK_OK(ddplug_audit_declare_dropped(a, gone, epoch == 1 && rank == 2 ? 9 : 10));
    int64_t bad = 410;
    CHECK_STATUS(ddplug_audit_declare_dropped(a, &bad, 1), DDPLUG_E_INVALID_ARGUMENT);
    for (int64_t i = 10 + rank; i < 410; i += world) CHECK_OK(ddplug_audit_record(a, &i, 1));
    if (epoch == 0) {
      CHECK_OK(ddplug_audit_finish(a, &rep, 30000));
      CHECK_EQ_INT(rep.verdict, DDPLUG_AUDIT_PASS);
      CHECK_EQ_INT(rep.missing, 0);
      CHECK_EQ_INT(rep.allowed_missing, 10);
    } else { /* rank 2 declared another set */
      CHECK_STATUS(ddplug_audit_finish(a, &rep, 30000), DDPLUG_E_MISMATCH);
      CHECK_CONTAINS(ddplug_last_error(), "rank 0 declared 10 dropped samples, rank 2 declared 9");
    }
    ddplug_audit_free(a);
  }

  /* a rank split gone wrong, found by the examples pass: ranks 1 and 2 both
   * take rank 1's share of 400 */
  CHECK_OK(ddplug_split_claim(ctx, "wrong", DDPLUG_OWNER_USER, "test sampler"));
  CHECK_OK(ddplug_audit_begin(ctx, "wrong", 400, 0, NULL, &a));
  int64_t share = rank == 2 ? 1 : rank;
  for (int64_t i = share; i < 400; i += world) CHECK_OK(ddplug_audit_record(a, &i, 1));
  CHECK_OK(ddplug_audit_finish(a, &rep, 30000));
  CHECK_EQ_INT(rep.verdict, DDPLUG_AUDIT_MISSING);
  CHECK_EQ_INT(rep.cross_repeats, 100);
  CHECK_OK(ddplug_audit_examples(a, DDPLUG_AUDIT_OVERLAP, ex, 8, &n));
  CHECK_EQ_INT(n, 8);
  CHECK_EQ_INT(ex[0], 1);
  CHECK_EQ_INT(ex[1], 5);
  CHECK_OK(ddplug_audit_examples(a, DDPLUG_AUDIT_MISSING, ex, 8, &n));
  CHECK_EQ_INT(ex[0], 2);
  CHECK_CONTAINS(ddplug_audit_text(a), "the ranks' shares overlap heavily: check the rank and world size");
  ddplug_audit_free(a);

  /* an evaluation stream through the context-bound exact sampler: uneven
   * counts (1001 on 4 ranks), every sample once, PASS */
  ddplug_sampler_options so = DDPLUG_SAMPLER_OPTIONS_INIT;
  so.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  so.stream = "val";
  so.num_samples = 1001;
  so.exact = 1;
  so.batch_size = 8;
  ddplug_sampler *s = NULL;
  CHECK_OK(ddplug_context_sampler_new(ctx, &so, &s));
  ddplug_audit_options eo = DDPLUG_AUDIT_OPTIONS_INIT;
  eo.evaluation = 1;
  CHECK_OK(ddplug_audit_begin(ctx, "val", 1001, 0, &eo, &a));
  CHECK_STATUS(ddplug_audit_declare_dropped(a, gone, 1), DDPLUG_E_INVALID_ARGUMENT);
  drain(s, NULL);
  CHECK_OK(ddplug_audit_finish(a, &rep, 30000));
  CHECK_EQ_INT(rep.verdict, DDPLUG_AUDIT_PASS);
  CHECK_EQ_INT(rep.evaluation, 1);
  CHECK_EQ_INT(rep.covered, 1001);
  CHECK_EQ_INT(rep.deliveries, 1001);
  uint64_t steps, samples;
  CHECK_OK(ddplug_audit_rank_counts(a, 0, &steps, &samples));
  CHECK_EQ_INT(samples, 251);
  CHECK_OK(ddplug_audit_rank_counts(a, 3, &steps, &samples));
  CHECK_EQ_INT(samples, 250);
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(ids_declarations_evaluation_and_examples_on_cpu, 150) {
  run_on(rank_ids_and_declarations, "cpu");
}

/* The sampler feeds the open audit on one thread while another thread
 * begins, finishes and frees audits of the same stream: the feed must
 * never touch an audit being finished or freed (run under ASan/TSan; a
 * single rank, so the finish's collectives are local). */
typedef struct race {
  ddplug_context *ctx;
  ddplug_sampler *s;
  volatile int stop;
  uint64_t delivered;
} race;

static void *race_feeder(void *arg) {
  race *x = arg;
  int64_t buf[7];
  uint64_t got;
  for (uint64_t epoch = 0; !x->stop; epoch++) {
    if (ddplug_sampler_set_epoch(x->s, epoch) != DDPLUG_OK) break;
    do {
      if (ddplug_sampler_next(x->s, buf, 7, &got) != DDPLUG_OK) return NULL;
      x->delivered += got;
    } while (got && !x->stop);
  }
  return NULL;
}

TEST_T(a_feeding_sampler_and_a_finishing_audit_on_two_threads, 120) {
  setup su = {NULL, "{\"audit\": \"every_epoch\", \"on_violation\": \"warn\"}"};
  ddplug_log_set_level(DDPLUG_LOG_ERROR);
  ddplug_context *ctx = open_ctx(&su); /* no launcher variables: 1 rank */
  race x = {ctx, ctx_sampler(ctx, "train", 1, 0), 0, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, race_feeder, &x) == 0);
  uint64_t fed = 0;
  for (int i = 0; i < 3000; i++) {
    ddplug_audit *a = NULL;
    CHECK_OK(ddplug_audit_begin(ctx, "train", N, (uint64_t)i, NULL, &a));
    for (volatile int spin = 0; spin < (i % 7) * 50; spin++) {
    }
    ddplug_audit_report r = DDPLUG_AUDIT_REPORT_INIT;
    if (i % 3 == 0) {
      ddplug_audit_free(a); /* unfinished: free unregisters it */
      continue;
    }
    CHECK_OK(ddplug_audit_finish(a, &r, 30000));
    fed += r.deliveries;
    ddplug_audit_free(a);
  }
  x.stop = 1;
  CHECK(pthread_join(t, NULL) == 0);
  dt_note("%llu indices delivered, %llu of them into finished audits",
          (unsigned long long)x.delivered, (unsigned long long)fed);
  CHECK(fed <= x.delivered);
  ddplug_sampler_free(x.s);
  CHECK_OK(ddplug_close(ctx));
}
