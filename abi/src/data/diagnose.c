/* diagnose.c — from every rank's statistics and what the finish found
 * (union, intersection, holes, repeats, examples) to the verdict, the
 * diagnoses and the report texts. Pure: the same inputs give the same
 * report on every rank.
 *
 * With N samples, G ranks, M tracked (M = N exact), scale s = N / M, the
 * declared padding P and dropping D (counts, drop_last remainders summed
 * over the ranks; declared-dropped indices are no holes at all):
 *   uneven       the step counts differ between ranks (not for evaluation
 *                streams, which run without lockstep);
 *   no partition G > 1, at least 2 samples covered, and every rank saw
 *                every covered sample (intersection == union);
 *   double       G > 1, samples are missing (below), the ranks are nearly
 *                disjoint (repeats within the declared padding plus a tenth
 *                of the union: the outer split pads too) and the union is
 *                N/G within a factor 1.5;
 *   missing      tracked holes > slack(D / s);
 *   repeated     tracked repeats > slack(P / s); the rank split is named as
 *                the likely cause only when the ranks' shares overlap by
 *                more than a tenth of the union;
 *   not advanced shuffling, and some rank's order fingerprint equals its
 *                previous epoch's, or its sampler's epoch lagged the audit;
 *   out of range some rank delivered an index < 0 or >= N (any number; also
 *                without coverage). Verdict priority: k_priority below.
 * Evaluation streams declare nothing: any hole or repeat is a violation.
 * slack(x) = x exact, and 0 for x = 0 (a hole or repeat seen among the
 * tracked samples is real); x + 4 sqrt(x) + 4 sampled (the subset's
 * sampling error of a declared amount).
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

DDPLUG_API const char *ddplug_audit_verdict_name(int verdict) {
  static const char *const names[DDPLUG_AUDIT_VERDICT_COUNT_] = {
      "UNSET",   "PASS",    "SKIPPED", "UNEVEN", "NO_PARTITION",
      "DOUBLE_PARTITION", "MISSING", "OVERLAP", "EPOCH_NOT_ADVANCED",
      "OUT_OF_RANGE"};
  if (verdict < 0 || verdict >= DDPLUG_AUDIT_VERDICT_COUNT_) return "UNKNOWN";
  return names[verdict];
}

/* ---- growing text ---------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t used, cap;
  int failed;
} sbuf;

static void sb_cat(sbuf *b, const char *fmt, ...) DDPLUG__PRINTF(2, 3);
static void sb_cat(sbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->used;
    int n = vsnprintf(b->p ? b->p + b->used : NULL, b->p ? room : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->p && (size_t)n < room) {
      b->used += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->used + (size_t)n + 1) cap *= 2;
    char *grown = ddplug__realloc(b->p, cap);
    if (!grown) {
      b->failed = 1;
      return;
    }
    b->p = grown;
    b->cap = cap;
  }
}

/* Append printf output to buf[cap] at *used, never overflowing. */
static void cat(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    DDPLUG__PRINTF(4, 5);
static void cat(char *buf, size_t cap, size_t *used, const char *fmt, ...) {
  if (*used + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = DDPLUG__MIN(*used + (size_t)n, cap - 1);
}

/* ---- arithmetic ------------------------------------------------------------ */

/* Square root by Newton's iteration (no libm). */
static double root(double x) {
  if (x <= 0) return 0;
  double g = x > 1 ? x / 2 : 1;
  for (int i = 0; i < 64; i++) g = 0.5 * (g + x / g);
  return g;
}

static uint64_t round_u64(double x) { return x <= 0 ? 0 : (uint64_t)(x + 0.5); }

static double slack(double x, int exact) {
  if (exact || x <= 0) return x > 0 ? x : 0;
  return x + 4.0 * root(x) + 4.0;
}

static const char *plural(uint64_t n, const char *one, const char *many) {
  return n == 1 ? one : many;
}

/* The step count most ranks have (ties: the larger). */
static int64_t mode_steps(const ddplug__audit_stats *all, int world) {
  int64_t best = all[0].steps;
  int best_n = 0;
  for (int i = 0; i < world; i++) {
    int n = 0;
    for (int r = 0; r < world; r++) n += all[r].steps == all[i].steps;
    if (n > best_n || (n == best_n && all[i].steps > best)) {
      best = all[i].steps;
      best_n = n;
    }
  }
  return best;
}

/* The violations from the most to the least telling: the verdict is the
 * first that applies (indices that are no sample at all explain missing
 * samples and repeats, so they come before them). */
static const int k_priority[] = {
    DDPLUG_AUDIT_UNEVEN,           DDPLUG_AUDIT_OUT_OF_RANGE,
    DDPLUG_AUDIT_NO_PARTITION,     DDPLUG_AUDIT_DOUBLE_PARTITION,
    DDPLUG_AUDIT_MISSING,          DDPLUG_AUDIT_OVERLAP,
    DDPLUG_AUDIT_EPOCH_NOT_ADVANCED};

typedef struct diag {
  char line[1024];
  size_t used;
} diag;

/* Append to one diagnosis line. */
static void dcat(diag *x, const char *fmt, ...) DDPLUG__PRINTF(2, 3);
static void dcat(diag *x, const char *fmt, ...) {
  if (x->used + 1 >= sizeof x->line) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(x->line + x->used, sizeof x->line - x->used, fmt, ap);
  va_end(ap);
  if (n > 0) x->used = DDPLUG__MIN(x->used + (size_t)n, sizeof x->line - 1);
}

/* Record a violation: its bit, and the line to write it in. */
static diag *raise_violation(ddplug_audit_report *v, diag *d, int verdict) {
  v->violations |= 1u << verdict;
  return &d[verdict];
}

/* Example indices as decimals; example ids (64-bit, often hashes of keys) as
 * 16 hex digits. */
static void examples(diag *x, const char *head, const int64_t *ex, int n, int ids) {
  for (int k = 0; k < n; k++) {
    if (k == 0) dcat(x, "%s", head);
    if (ids)
      dcat(x, k ? ", %016llx" : "%016llx", (unsigned long long)ex[k]);
    else
      dcat(x, k ? ", %lld" : "%lld", (long long)ex[k]);
  }
}

/* ---- the diagnoses --------------------------------------------------------- */

static void uneven(const ddplug__audit_stats *all, int world, diag *d) {
  int64_t m = mode_steps(all, world);
  int listed = 0;
  for (int r = 0; r < world; r++) {
    if (all[r].steps == m) continue;
    if (listed == 0)
      dcat(d, "uneven batches: rank %d has %lld steps, others %lld (will hang)", r,
           (long long)all[r].steps, (long long)m);
    else if (listed < 4)
      dcat(d, "; rank %d has %lld", r, (long long)all[r].steps);
    listed++;
  }
  if (listed > 4) dcat(d, "; %d more ranks differ", listed - 4);
  dcat(d, " — every rank must take the same number of steps: use a sampler that "
          "pads or drops to equal lengths per rank");
}

static void out_of_range(const ddplug__audit_stats *all, int world,
                         uint64_t n, diag *d) {
  int listed = 0;
  for (int r = 0; r < world; r++) {
    if (all[r].out_of_range <= 0) continue;
    long long k = (long long)all[r].out_of_range;
    if (listed == 0)
      dcat(d, "out of range: rank %d delivered %lld %s outside [0, %llu)", r, k,
           k == 1 ? "index" : "indices", (unsigned long long)n);
    else if (listed < 4)
      dcat(d, "; rank %d delivered %lld", r, k);
    listed++;
  }
  if (listed > 4) dcat(d, "; %d more %s", listed - 4, listed == 5 ? "rank did" : "ranks did");
  dcat(d, " — they are not samples of this stream: check the N given to the "
          "audit and the indices the sampler (or dataset index map) yields");
}

static void not_advanced(const ddplug__audit_stats *all, int world,
                         uint64_t epoch, diag *d) {
  char ranks[256] = "";
  size_t used = 0;
  int n = 0, behind = 0;
  for (int r = 0; r < world; r++) {
    if (!all[r].order_repeated && !all[r].epoch_behind) continue;
    behind |= all[r].epoch_behind != 0;
    if (n < 8) cat(ranks, sizeof ranks, &used, n ? ", %d" : "%d", r);
    n++;
  }
  if (n > 8) cat(ranks, sizeof ranks, &used, " and %d more", n - 8);
  dcat(d, "epoch not advanced: %s %s delivered epoch %llu in %s although "
          "shuffling is on — call set_epoch(epoch) on the sampler at the start "
          "of every epoch",
       n == 1 ? "rank" : "ranks", ranks, (unsigned long long)epoch,
       behind ? "the order of an earlier epoch (the sampler's epoch was not set)"
              : "the same order as the previous epoch");
}

/* What the evidence says about the repeats. */
static const char *repeat_advice(int evaluation, int heavy) {
  if (evaluation)
    return " — an evaluation stream must deliver every sample exactly once "
           "(repeats bias its metrics): do not pad it";
  if (heavy)
    return " — the ranks' shares overlap heavily: check the rank and world "
           "size the split uses";
  return " — a sampler that repeats samples (padding to equal lengths or to "
         "whole batches) must declare it (padding: a count)";
}

static const char *missing_advice(int evaluation) {
  if (evaluation)
    return " — an evaluation stream must deliver every sample exactly once "
           "(its metrics leave the others out): do not drop from it";
  return " — a sampler that leaves samples out on purpose must declare it "
         "(dropped: a count or the indices); otherwise they are lost to "
         "training";
}

/* ---- the report ---------------------------------------------------------- */

void ddplug__audit_diagnose(const char *stream,
                            const ddplug__audit_stats *all, int world,
                            const ddplug__audit_coverage *cov,
                            ddplug_audit_report *out, char **text) {
  ddplug_audit_report v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.abi_version = DDPLUG_ABI_VERSION;
  const ddplug__audit_stats *s0 = &all[0];
  int scope = (int)s0->scope;
  int by_id = s0->by_id != 0, evaluation = s0->evaluation != 0;
  v.world_size = world;
  v.evaluation = evaluation;
  v.epoch = (uint64_t)s0->epoch;
  v.num_samples = (uint64_t)s0->num_samples;
  int coverage = cov != NULL && scope == DDPLUG__SCOPE_FULL && !s0->steps_only;
  v.full = coverage;
  uint32_t level = 0;
  uint64_t tracked_deliveries = 0, distinct_sum = 0, local_dropped = 0;
  v.steps_min = v.samples_min = UINT64_MAX;
  for (int k = 0; k < world; k++) {
    uint64_t st = (uint64_t)all[k].steps, sa = (uint64_t)all[k].deliveries;
    if (st < v.steps_min) { v.steps_min = st; v.steps_min_rank = k; }
    if (st > v.steps_max || k == 0) { v.steps_max = st; v.steps_max_rank = k; }
    if (sa < v.samples_min) { v.samples_min = sa; v.samples_min_rank = k; }
    if (sa > v.samples_max || k == 0) { v.samples_max = sa; v.samples_max_rank = k; }
    v.deliveries += sa;
    v.out_of_range += (uint64_t)all[k].out_of_range;
    tracked_deliveries += (uint64_t)all[k].tracked_deliveries;
    distinct_sum += (uint64_t)all[k].distinct;
    local_dropped += (uint64_t)all[k].local_dropped;
    level = DDPLUG__MAX(level, (uint32_t)all[k].level);
    v.allowed_padding = DDPLUG__MAX(v.allowed_padding, (uint64_t)all[k].allowed_padding);
    v.allowed_missing = DDPLUG__MAX(v.allowed_missing, (uint64_t)all[k].allowed_missing);
  }
  v.allowed_missing += local_dropped;
  if (evaluation) v.allowed_padding = v.allowed_missing = 0;

  /* tracked quantities and their scale */
  uint64_t tracked, covered = 0, common = 0, holes = 0, repeats_t = 0, cross_t = 0;
  uint64_t dropped_set = 0; /* the declared index sets' samples, in all-samples units */
  double scale = 1.0;
  int exact;
  if (by_id) {
    exact = level == 0;
    scale = (double)(1ull << (level < 63 ? level : 63));
    tracked = v.num_samples ? round_u64((double)v.num_samples / scale) : 0;
    if (coverage) {
      covered = cov->id_distinct;
      repeats_t = cov->id_duplicates;
      cross_t = repeats_t; /* ids.c does not split them: report all */
      holes = tracked > covered ? tracked - covered : 0;
    }
  } else {
    tracked = (uint64_t)s0->tracked;
    exact = tracked == v.num_samples;
    scale = coverage && tracked ? (double)v.num_samples / (double)tracked : 1.0;
    if (coverage) {
      covered = cov->covered;
      common = cov->common;
      holes = cov->holes;
      repeats_t = tracked_deliveries > covered ? tracked_deliveries - covered : 0;
      cross_t = distinct_sum > covered ? distinct_sum - covered : 0;
      dropped_set = round_u64((double)s0->dropped_count * scale);
      v.allowed_missing += dropped_set;
    }
  }
  v.exact = coverage ? exact : -1;
  v.tracked = coverage ? tracked : 0;
  if (coverage) {
    v.covered = round_u64((double)covered * scale);
    v.common = round_u64((double)common * scale);
    v.repeats = round_u64((double)repeats_t * scale);
    v.cross_repeats = round_u64((double)cross_t * scale);
    v.missing = by_id && !v.num_samples ? 0 : round_u64((double)holes * scale);
  }
  ddplug__strlcpy(v.stream, stream, sizeof v.stream);

  diag d[DDPLUG_AUDIT_VERDICT_COUNT_];
  memset(d, 0, sizeof d);
  if (scope == DDPLUG__SCOPE_SKIP) {
    v.verdict = DDPLUG_AUDIT_SKIPPED;
  } else {
    if (v.steps_min != v.steps_max && !evaluation)
      uneven(all, world, raise_violation(&v, d, DDPLUG_AUDIT_UNEVEN));
    if (v.out_of_range > 0)
      out_of_range(all, world, v.num_samples,
                   raise_violation(&v, d, DDPLUG_AUDIT_OUT_OF_RANGE));
    if (coverage) {
      /* declared dropping that is not an index set, in tracked units */
      double count_missing = (double)(v.allowed_missing - (by_id ? 0 : dropped_set));
      double miss_ok = slack(count_missing / scale, exact);
      double pad_ok = slack((double)v.allowed_padding / scale, exact);
      if (by_id && !exact && v.num_samples)
        miss_ok += 4.0 * root((double)v.num_samples / scale) + 4.0; /* kept share */
      int missing_some = (by_id ? v.num_samples > 0 : 1) && (double)holes > miss_ok;
      int disjoint = (double)repeats_t <= pad_ok;
      /* a split applied twice pads a little itself (the outer split's
       * equal-length padding): tolerate repeats up to a tenth */
      int mostly_disjoint = (double)repeats_t <= pad_ok + 0.1 * (double)covered;
      double per_g = (double)v.num_samples / world;
      if (!by_id && world > 1 && covered >= 2 && common == covered) {
        dcat(raise_violation(&v, d, DDPLUG_AUDIT_NO_PARTITION),
             "no partitioning: every rank saw the same samples (each of the %d "
             "ranks saw the same %llu of %llu) — nothing split the data: use "
             "ddplug's sampler, or let exactly one layer (framework or "
             "rank-aware sampler) split it",
             world, (unsigned long long)v.covered,
             (unsigned long long)v.num_samples);
      } else if (!by_id && world > 1 && missing_some && mostly_disjoint &&
                 per_g >= 1 && (double)v.covered <= 1.5 * per_g &&
                 (double)v.covered >= per_g / 1.5) {
        diag *x = raise_violation(&v, d, DDPLUG_AUDIT_DOUBLE_PARTITION);
        dcat(x,
             "double partitioning: ranks together saw %llu of %llu samples "
             "(about N/%d with %d ranks; %llu never delivered",
             (unsigned long long)v.covered, (unsigned long long)v.num_samples,
             world, world, (unsigned long long)v.missing);
        examples(x, ", e.g. sample ", (const int64_t *)cov->missing_ex, cov->nmissing_ex, 0);
        dcat(x, ") — the data was split twice (e.g. a rank-aware sampler, or a "
                "dataset already sharded per rank, and another split on top): "
                "let exactly one layer split it; or the sampler covers only "
                "part of the dataset");
      } else if (missing_some) {
        diag *x = raise_violation(&v, d, DDPLUG_AUDIT_MISSING);
        if (by_id)
          dcat(x, "missing samples: ranks together delivered %llu distinct ids of "
                  "the %llu expected; %llu never delivered (declared dropped: %llu)",
               (unsigned long long)v.covered, (unsigned long long)v.num_samples,
               (unsigned long long)v.missing, (unsigned long long)v.allowed_missing);
        else
          dcat(x, "missing samples: ranks together saw %llu of %llu samples; %llu "
                  "never delivered (declared dropped: %llu)",
               (unsigned long long)v.covered, (unsigned long long)v.num_samples,
               (unsigned long long)v.missing, (unsigned long long)v.allowed_missing);
        examples(x, ", e.g. sample ", (const int64_t *)cov->missing_ex, cov->nmissing_ex, 0);
        if (!exact)
          dcat(x, " (estimated from %llu tracked %s)", (unsigned long long)tracked,
               by_id ? "ids" : "samples");
        dcat(x, "%s", missing_advice(evaluation));
      }
      if (!disjoint && !(v.violations & (1u << DDPLUG_AUDIT_NO_PARTITION))) {
        diag *x = raise_violation(&v, d, DDPLUG_AUDIT_OVERLAP);
        uint64_t cross = v.cross_repeats, within = v.repeats > cross ? v.repeats - cross : 0;
        dcat(x, "repeated samples: %llu %s repeated a sample already delivered "
                "(declared padding: %llu)",
             (unsigned long long)v.repeats, plural(v.repeats, "delivery", "deliveries"),
             (unsigned long long)v.allowed_padding);
        if (!by_id && world > 1)
          dcat(x, ": %llu across ranks, %llu within one rank", (unsigned long long)cross,
               (unsigned long long)within);
        examples(x, by_id ? ", e.g. id " : ", e.g. sample ", cov->repeat_ex, cov->nrepeat_ex, by_id);
        if (!exact)
          dcat(x, " (%s)", by_id ? "counted among a hashed subset of the ids, scaled"
                                  : "estimated from the tracked samples");
        int heavy = world > 1 && (double)cross_t > 0.1 * (double)covered &&
                    (!by_id || cross_t > 0);
        dcat(x, "%s", repeat_advice(evaluation, heavy && !by_id));
      }
    }
    int shuffled_lag = 0;
    for (int k = 0; k < world; k++)
      shuffled_lag |= all[k].order_repeated || all[k].epoch_behind;
    if (shuffled_lag)
      not_advanced(all, world, v.epoch,
                   raise_violation(&v, d, DDPLUG_AUDIT_EPOCH_NOT_ADVANCED));
    v.verdict = DDPLUG_AUDIT_PASS;
    for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_priority); i++)
      if (v.violations & (1u << k_priority[i])) {
        v.verdict = k_priority[i];
        break;
      }
  }

  /* the summary line */
  size_t used = 0;
  int nviol = 0;
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_priority); i++)
    nviol += (v.violations >> k_priority[i]) & 1;
  cat(v.summary, sizeof v.summary, &used, "audit of stream '%s' epoch %llu: ",
      stream, (unsigned long long)v.epoch);
  if (v.verdict == DDPLUG_AUDIT_SKIPPED) {
    cat(v.summary, sizeof v.summary, &used, "SKIPPED (data_split.audit)");
  } else if (v.verdict == DDPLUG_AUDIT_PASS) {
    if (v.steps_min == v.steps_max && v.samples_min == v.samples_max)
      cat(v.summary, sizeof v.summary, &used, "PASS — %d %s, %llu %s and %llu %s each", world,
          plural((uint64_t)world, "rank", "ranks"), (unsigned long long)v.steps_max,
          plural(v.steps_max, "step", "steps"), (unsigned long long)v.samples_max,
          plural(v.samples_max, "sample", "samples"));
    else
      cat(v.summary, sizeof v.summary, &used,
          "PASS — %d %s, %llu to %llu steps and %llu to %llu samples each", world,
          plural((uint64_t)world, "rank", "ranks"), (unsigned long long)v.steps_min,
          (unsigned long long)v.steps_max, (unsigned long long)v.samples_min,
          (unsigned long long)v.samples_max);
    if (coverage)
      cat(v.summary, sizeof v.summary, &used, ", covered %llu of %llu %s(%s)",
          (unsigned long long)v.covered, (unsigned long long)v.num_samples,
          by_id ? "ids " : "", exact ? "exact" : "sampled");
    else
      cat(v.summary, sizeof v.summary, &used, " (%s)",
          scope == DDPLUG__SCOPE_ORDER ? "steps and order checked"
          : s0->steps_only ? "steps and order checked: no common index space"
                           : "coverage not checked");
  } else {
    cat(v.summary, sizeof v.summary, &used, "%s", d[v.verdict].line);
    if (nviol > 1)
      cat(v.summary, sizeof v.summary, &used, " (and %d more %s in the report)",
          nviol - 1, nviol == 2 ? "problem" : "problems");
  }
  if (used >= sizeof v.summary - 1) memcpy(v.summary + sizeof v.summary - 4, "...", 4);

  if (text) {
    sbuf b = {0};
    if (scope == DDPLUG__SCOPE_SKIP) {
      sb_cat(&b, "ddplug audit: stream '%s', epoch %llu, N = %llu: skipped "
                 "(data_split.audit: this epoch is not audited)\n",
             stream, (unsigned long long)v.epoch, (unsigned long long)v.num_samples);
    } else {
      char nbuf[48];
      if (by_id && !v.num_samples)
        snprintf(nbuf, sizeof nbuf, "N unknown");
      else
        snprintf(nbuf, sizeof nbuf, "N = %llu", (unsigned long long)v.num_samples);
      sb_cat(&b, "ddplug audit: stream '%s'%s, epoch %llu, %d %s, %s (%s)\n",
             stream, evaluation ? " (evaluation)" : "", (unsigned long long)v.epoch,
             world, plural((uint64_t)world, "rank", "ranks"), nbuf,
             !coverage ? (s0->steps_only ? "steps and order only: no common index space"
                                         : "steps and order only")
             : exact ? (by_id ? "exact, by id" : "exact")
                     : (by_id ? "sampled ids" : "sampled"));
      sb_cat(&b, "  verdict: %s\n", ddplug_audit_verdict_name(v.verdict));
      sb_cat(&b,
             "  steps per rank: min %llu (rank %d), max %llu (rank %d)\n"
             "  samples per rank: min %llu (rank %d), max %llu (rank %d)\n",
             (unsigned long long)v.steps_min, v.steps_min_rank,
             (unsigned long long)v.steps_max, v.steps_max_rank,
             (unsigned long long)v.samples_min, v.samples_min_rank,
             (unsigned long long)v.samples_max, v.samples_max_rank);
      if (coverage) {
        if (by_id)
          sb_cat(&b, "  distinct ids: %llu%s%s; repeated: %llu\n",
                 (unsigned long long)v.covered, v.num_samples ? " of " : "",
                 v.num_samples ? "the expected" : "", (unsigned long long)v.repeats);
        else
          sb_cat(&b, "  coverage: %llu of %llu distinct samples; seen by every rank: %llu\n",
                 (unsigned long long)v.covered, (unsigned long long)v.num_samples,
                 (unsigned long long)v.common);
        sb_cat(&b, "  repeats: %llu (declared padding %llu); never delivered: %llu "
                   "(declared dropped %llu)\n",
               (unsigned long long)v.repeats, (unsigned long long)v.allowed_padding,
               (unsigned long long)v.missing, (unsigned long long)v.allowed_missing);
        if (!exact && by_id)
          sb_cat(&b, "  sampled 1 in %llu ids (by hash): a set of d repeated ids goes "
                     "unseen with probability (1 - 1/%llu)^d\n",
                 (unsigned long long)scale, (unsigned long long)scale);
      }
      if (v.out_of_range)
        sb_cat(&b, "  indices outside [0, N): %llu\n", (unsigned long long)v.out_of_range);
      int listed = world <= 256 ? world : 256;
      for (int k = 0; k < listed; k++)
        sb_cat(&b, "  rank %d: %lld %s, %lld %s\n", k, (long long)all[k].steps,
               plural((uint64_t)all[k].steps, "step", "steps"), (long long)all[k].deliveries,
               plural((uint64_t)all[k].deliveries, "sample", "samples"));
      if (listed < world)
        sb_cat(&b, "  (%d more ranks: ddplug_audit_rank_counts gives each)\n", world - listed);
      for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_priority); i++)
        if (v.violations & (1u << k_priority[i]))
          sb_cat(&b, "  diagnosis: %s\n", d[k_priority[i]].line);
    }
    if (b.failed) {
      ddplug__free(b.p);
      b.p = NULL;
    }
    *text = b.p;
  }
  *out = v;
}
