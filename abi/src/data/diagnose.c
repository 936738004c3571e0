/* audit_diagnose.c — from every rank's statistics (and the tracked union and
 * intersection counts) to the verdict, the diagnoses and the report texts.
 * Pure: the same inputs give the same report on every rank.
 *
 * With N samples, G ranks, M tracked (M = N exact), scale s = N / M:
 *   uneven       the step counts differ between ranks;
 *   no partition G > 1, at least 2 samples covered, and every rank saw
 *                every covered sample (intersection == union);
 *   double       G > 1, samples are missing (below), the ranks are nearly
 *                disjoint (repeats within the declared padding plus a tenth
 *                of the union: the outer split pads too) and the union is
 *                N/G within a factor 1.5;
 *   missing      tracked union < M - slack(allowed_missing / s);
 *   overlap      tracked repeats > slack(allowed_padding / s);
 *   not advanced shuffling, and some rank's order fingerprint equals its
 *                previous epoch's, or its sampler's epoch lagged the audit;
 *   out of range some rank delivered an index < 0 or >= N (any number; also
 *                without coverage). Verdict priority: k_priority below.
 * slack(x) = x exact; x + 4 sqrt(x) + 4 sampled (the subset's sampling error).
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdio.h>
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

/* Square root by Newton's iteration (no libm). */
static double root(double x) {
  if (x <= 0) return 0;
  double g = x > 1 ? x / 2 : 1;
  for (int i = 0; i < 64; i++) g = 0.5 * (g + x / g);
  return g;
}

static uint64_t round_u64(double x) { return x <= 0 ? 0 : (uint64_t)(x + 0.5); }

static double slack(double x, int exact) {
  return exact ? x : x + 4.0 * root(x) + 4.0;
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
 * samples and overlap, so they come before them). */
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

static void uneven(const ddplug__audit_stats *all, int world, diag *d) {
  int64_t m = mode_steps(all, world);
  int listed = 0;
  for (int r = 0; r < world; r++) {
    if (all[r].steps == m) continue;
    if (listed == 0)
      dcat(d, "uneven batches: rank %d has %lld steps, others %lld (will hang)", r,
          (long long)all[r].steps, (long long)m);
    else if (listed < 4)
      dcat(d, "; rank %d has %lld", r,
          (long long)all[r].steps);
    listed++;
  }
  if (listed > 4)
    dcat(d, "; %d more ranks differ", listed - 4);
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
  dcat(d, "epoch not advanced: rank(s) %s delivered epoch %llu in %s although "
      "shuffling is on — call set_epoch(epoch) on the sampler at the start of "
      "every epoch",
      ranks, (unsigned long long)epoch,
      behind ? "the order of an earlier epoch (the sampler's epoch was not set)"
             : "the same order as the previous epoch");
}

void ddplug__audit_diagnose(const char *stream,
                            const ddplug__audit_stats *all, int world,
                            uint64_t covered, uint64_t common,
                            const uint64_t *missing, int nmissing,
                            ddplug_audit_report *r) {
  uint32_t size = r->struct_size;
  ddplug_audit_report v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.abi_version = DDPLUG_ABI_VERSION;
  const ddplug__audit_stats *s0 = &all[0];
  int scope = (int)s0->scope;
  v.world_size = world;
  v.epoch = (uint64_t)s0->epoch;
  v.num_samples = (uint64_t)s0->num_samples;
  v.ranks_listed = DDPLUG__MIN(world, DDPLUG_AUDIT_MAX_RANKS);
  int coverage = scope == DDPLUG__SCOPE_FULL;
  for (int k = 0; k < world; k++) coverage &= all[k].coverage_ok != 0;
  v.full = coverage;
  uint64_t tracked = (uint64_t)s0->tracked;
  int exact = tracked == v.num_samples;
  v.exact = coverage ? exact : -1;
  v.tracked = coverage ? tracked : 0;
  uint64_t tracked_deliveries = 0;
  v.steps_min = v.samples_min = UINT64_MAX;
  for (int k = 0; k < world; k++) {
    uint64_t st = (uint64_t)all[k].steps, sa = (uint64_t)all[k].deliveries;
    if (k < DDPLUG_AUDIT_MAX_RANKS) {
      v.steps[k] = st;
      v.samples[k] = sa;
    }
    if (st < v.steps_min) { v.steps_min = st; v.steps_min_rank = k; }
    if (st > v.steps_max || k == 0) { v.steps_max = st; v.steps_max_rank = k; }
    if (sa < v.samples_min) { v.samples_min = sa; v.samples_min_rank = k; }
    if (sa > v.samples_max || k == 0) { v.samples_max = sa; v.samples_max_rank = k; }
    v.deliveries += sa;
    v.out_of_range += (uint64_t)all[k].out_of_range;
    tracked_deliveries += (uint64_t)all[k].tracked_deliveries;
    v.allowed_padding = DDPLUG__MAX(v.allowed_padding, (uint64_t)all[k].allowed_padding);
    v.allowed_missing = DDPLUG__MAX(v.allowed_missing, (uint64_t)all[k].allowed_missing);
  }
  double scale = coverage && tracked ? (double)v.num_samples / (double)tracked : 1.0;
  uint64_t repeats_tracked = tracked_deliveries > covered ? tracked_deliveries - covered : 0;
  if (coverage) {
    v.covered = round_u64((double)covered * scale);
    v.common = round_u64((double)common * scale);
    v.repeats = round_u64((double)repeats_tracked * scale);
  }
  ddplug__strlcpy(v.stream, stream, sizeof v.stream);

  diag d[DDPLUG_AUDIT_VERDICT_COUNT_];
  memset(d, 0, sizeof d);
  if (scope == DDPLUG__SCOPE_SKIP) {
    v.verdict = DDPLUG_AUDIT_SKIPPED;
  } else {
    if (v.steps_min != v.steps_max)
      uneven(all, world, raise_violation(&v, d, DDPLUG_AUDIT_UNEVEN));
    if (v.out_of_range > 0)
      out_of_range(all, world, v.num_samples,
                   raise_violation(&v, d, DDPLUG_AUDIT_OUT_OF_RANGE));
    if (coverage) {
      double miss_ok = slack((double)v.allowed_missing / scale, exact);
      double pad_ok = slack((double)v.allowed_padding / scale, exact);
      int missing_some = (double)covered < (double)tracked - miss_ok;
      int disjoint = (double)repeats_tracked <= pad_ok;
      /* a split applied twice pads a little itself (the outer split's
       * equal-length padding): tolerate repeats up to a tenth */
      int mostly_disjoint = (double)repeats_tracked <= pad_ok + 0.1 * (double)covered;
      double per_g = (double)v.num_samples / world;
      if (world > 1 && covered >= 2 && common == covered) {
        dcat(raise_violation(&v, d, DDPLUG_AUDIT_NO_PARTITION),
            "no partitioning: every rank saw the same samples (each of the %d "
            "ranks saw the same %llu of %llu) — nothing split the data: use "
            "ddplug's sampler, or let exactly one layer (framework or "
            "rank-aware sampler) split it",
            world, (unsigned long long)v.covered,
            (unsigned long long)v.num_samples);
      } else if (world > 1 && missing_some && mostly_disjoint && per_g >= 1 &&
                 (double)v.covered <= 1.5 * per_g &&
                 (double)v.covered >= per_g / 1.5) {
        dcat(raise_violation(&v, d, DDPLUG_AUDIT_DOUBLE_PARTITION),
            "double partitioning: ranks together saw %llu of %llu samples "
            "(about N/%d with %d ranks) — the data was split twice (e.g. a "
            "rank-aware sampler and the framework's DistributedSampler): let "
            "exactly one of them split",
            (unsigned long long)v.covered, (unsigned long long)v.num_samples,
            world, world);
      } else if (missing_some) {
        diag *x = raise_violation(&v, d, DDPLUG_AUDIT_MISSING);
        dcat(x,
            "missing samples: ranks together saw %llu of %llu samples; %llu "
            "never delivered (declared dropped: %llu)",
            (unsigned long long)v.covered, (unsigned long long)v.num_samples,
            (unsigned long long)(v.num_samples > v.covered ? v.num_samples - v.covered : 0),
            (unsigned long long)v.allowed_missing);
        for (int k = 0; k < nmissing; k++)
          dcat(x, k ? ", %llu" : " — e.g. sample %llu",
              (unsigned long long)missing[k]);
        if (!exact) dcat(x, " (estimated from %llu tracked samples)",
                        (unsigned long long)tracked);
      }
      if (!disjoint && !(v.violations & (1u << DDPLUG_AUDIT_NO_PARTITION))) {
        dcat(raise_violation(&v, d, DDPLUG_AUDIT_OVERLAP),
            "overlap: %llu deliveries repeated a sample already delivered "
            "(declared padding: %llu) — the ranks' shares intersect: check "
            "the rank and world size the split uses",
            (unsigned long long)v.repeats, (unsigned long long)v.allowed_padding);
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

  /* the texts */
  size_t used = 0;
  cat(v.summary, sizeof v.summary, &used, "audit of stream '%s' epoch %llu: ",
      stream, (unsigned long long)v.epoch);
  if (v.verdict == DDPLUG_AUDIT_SKIPPED) {
    cat(v.summary, sizeof v.summary, &used, "SKIPPED (data_split.audit)");
  } else if (v.verdict == DDPLUG_AUDIT_PASS) {
    cat(v.summary, sizeof v.summary, &used, "PASS — %d ranks, %llu steps and %llu samples each",
        world, (unsigned long long)v.steps_max, (unsigned long long)v.samples_max);
    if (coverage)
      cat(v.summary, sizeof v.summary, &used, ", covered %llu of %llu (%s)",
          (unsigned long long)v.covered, (unsigned long long)v.num_samples,
          exact ? "exact" : "sampled");
    else
      cat(v.summary, sizeof v.summary, &used, " (%s)",
          scope == DDPLUG__SCOPE_ORDER ? "steps and order checked" : "coverage not checked");
  } else {
    cat(v.summary, sizeof v.summary, &used, "%s", d[v.verdict].line);
  }
  used = 0;
  cat(v.text, sizeof v.text, &used,
      "ddplug audit: stream '%s', epoch %llu, %d ranks, N = %llu (%s)\n",
      stream, (unsigned long long)v.epoch, world, (unsigned long long)v.num_samples,
      scope == DDPLUG__SCOPE_SKIP ? "skipped"
      : !coverage ? "steps and order only"
      : exact ? "exact" : "sampled");
  cat(v.text, sizeof v.text, &used, "  verdict: %s\n", ddplug_audit_verdict_name(v.verdict));
  cat(v.text, sizeof v.text, &used,
      "  steps per rank: min %llu (rank %d), max %llu (rank %d)\n"
      "  samples per rank: min %llu (rank %d), max %llu (rank %d)\n",
      (unsigned long long)v.steps_min, v.steps_min_rank,
      (unsigned long long)v.steps_max, v.steps_max_rank,
      (unsigned long long)v.samples_min, v.samples_min_rank,
      (unsigned long long)v.samples_max, v.samples_max_rank);
  if (coverage)
    cat(v.text, sizeof v.text, &used,
        "  coverage: %llu of %llu distinct samples; seen by every rank: %llu\n"
        "  repeats: %llu (declared padding %llu); declared missing %llu\n",
        (unsigned long long)v.covered, (unsigned long long)v.num_samples,
        (unsigned long long)v.common, (unsigned long long)v.repeats,
        (unsigned long long)v.allowed_padding,
        (unsigned long long)v.allowed_missing);
  if (v.out_of_range)
    cat(v.text, sizeof v.text, &used, "  indices outside [0, N): %llu\n",
        (unsigned long long)v.out_of_range);
  for (int k = 0; k < v.ranks_listed; k++)
    cat(v.text, sizeof v.text, &used, "  rank %d: %llu steps, %llu samples\n", k,
        (unsigned long long)v.steps[k], (unsigned long long)v.samples[k]);
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_priority); i++)
    if (v.violations & (1u << k_priority[i]))
      cat(v.text, sizeof v.text, &used, "  diagnosis: %s\n", d[k_priority[i]].line);
  memcpy(r, &v, DDPLUG__MIN((size_t)size, sizeof v));
  r->struct_size = size;
}
