/*
 * data.h — the data layer's header: internal declarations of data-split
 * ownership, the samplers and the audit. Depends on base/, config/ and
 * run/. The module map of abi/src/data/:
 *   feistel.c       keyed bijection of [0, N) (Feistel + cycle walking)
 *   deal.c          the epoch's global cursor and its dealing over any
 *                   world: segments, commits, checkpoint state and digest,
 *                   re-dealing after a shrink, derived deliveries
 *   distributed.c   the default distributed index sampler
 *   bucket.c        the default length-bucketed batch sampler
 *   sampler.c       ddplug_sampler_*: options, dispatch to the defaults or
 *                   a plugin's sampler slots, what a sampler declares
 *   sampler_bind.c  ddplug_context_sampler_new: a sampler bound to a context
 *   owner.c         stream names, the config's forced owners, a context's
 *                   data-split state (created on first use), per-stream
 *                   split ownership (claims)
 *   agree.c         ddplug_split_*: claims agreed across ranks via the store
 *   record.c        the audit's per-rank recording (exact set or sample)
 *   ids.c           the audit of samples by id (exact or a hashed subset)
 *   diagnose.c      the verdict and texts from gathered statistics
 *   audit.c         ddplug_audit_*: begin, record, the collective finish
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_DATA_H
#define DDPLUG_DATA_H

#include <stdint.h>

#include "base/base.h"

/* ---- the permutation (feistel.c) --------------------------------- */

#define DDPLUG__FEISTEL_ROUNDS 4

/* A keyed bijection pi of [0, n). Plain data: copy freely. */
typedef struct ddplug__feistel {
  uint64_t n;
  uint32_t bits_hi, bits_lo; /* widths of the left and right halves */
  uint32_t mask_hi, mask_lo;
  uint32_t key[DDPLUG__FEISTEL_ROUNDS];
} ddplug__feistel;

/* Derive the permutation of [0, n) for (seed, epoch, salt). O(1), never
 * fails (returns DDPLUG_OK); n may be 0 or 1. */
int ddplug__feistel_init(ddplug__feistel *f, uint64_t n, uint64_t seed,
                         uint64_t epoch, uint64_t salt);
/* pi(i) for i < n. */
uint64_t ddplug__feistel_apply(const ddplug__feistel *f, uint64_t i);
/* out[t] = pi(start + t * stride) for t < count; every input must be < n. */
void ddplug__feistel_map(const ddplug__feistel *f, uint64_t start,
                         uint64_t stride, uint64_t count, int64_t *out);

/* Salts that keep the permutations of one (seed, epoch) independent. */
#define DDPLUG__SALT_DISTRIBUTED 0x64697374ull /* "dist" */
#define DDPLUG__SALT_BATCH_ORDER 0x62617463ull /* "batc" */
#define DDPLUG__SALT_BUCKET 0x6275636bull      /* "buck" + bucket number */
#define DDPLUG__SALT_AUDIT 0x61756469ull       /* "audi" */

/* ---- the epoch's dealing over changing worlds (deal.c) --------------------- */

/* One segment of an epoch (deal.c's doc): the queue R ++ [cursor, N) and
 * what each rank holds from before, dealt over `world` ranks. */
typedef struct ddplug__seg {
  uint64_t cursor;
  uint64_t *replay;         /* ascending positions < cursor, dealt first   */
  uint64_t nreplay;
  int32_t world;
  int32_t me;               /* this process's rank in it, -1 if none      */
  int32_t *member;          /* [world] identities (a process's first rank) */
  uint64_t **held;          /* [world] positions each rank holds           */
  uint64_t *nheld;
  uint64_t held_padding;    /* held entries that are padding copies        */
  uint64_t step0;           /* the epoch's committed steps before it        */
  uint64_t steps_end;       /* closed: the steps every member committed    */
  uint64_t my_off0, my_off1; /* this process's delivered entries [0ff0, off1) */
  /* derived (deal.c's seg_derive) */
  uint64_t qlen;            /* |Q|                                         */
  uint64_t m;               /* real samples: |Q| + held, padding excluded  */
  uint64_t steps;           /* S: steps of every rank                      */
  uint64_t hsteps;          /* T: steps until no rank delivers held ones   */
  uint64_t slast;           /* entries per needing rank at the last step   */
  uint64_t base_h;          /* queue entries steps [0, T) take             */
  uint64_t slots;           /* entries all ranks deliver                   */
} ddplug__seg;

typedef struct ddplug__deal {
  uint64_t n, seed, epoch, batch;
  int shuffle, drop_last;
  ddplug__feistel perm;
  int32_t world, rank, self;
  int32_t *members;         /* [world] identities of the current ranks      */
  ddplug__seg *segs;        /* the epoch's segments, the last is current    */
  uint32_t nsegs, capsegs;
  uint64_t off;             /* entries of the current segment delivered    */
  uint64_t pos0;            /* the epoch position of the segment's entry 0 */
  uint64_t committed;       /* steps committed in the current segment      */
  uint64_t padding_before;  /* padding committed in closed segments         */
  int has_prior;            /* a resumed state: committed before this run   */
  uint64_t prior_cursor, *prior_replay, nprior_replay;
  int resumed;              /* loaded; set_epoch(epoch) keeps it            */
  char history[512];        /* the membership history, for the audit      */
} ddplug__deal;

/* What each survivor gives a reform (int64 fields: one allgather). */
typedef struct ddplug__reform_info {
  int64_t identity, epoch, nsegs, committed, drawn, elastic;
} ddplug__reform_info;
#define DDPLUG__REFORM_NINFO ((uint64_t)(sizeof(ddplug__reform_info) / sizeof(int64_t)))

/* A fresh plan for rank of world (identities = ranks), epoch 0. */
int ddplug__deal_init(ddplug__deal *d, uint64_t n, uint64_t seed, int shuffle, int drop_last,
                      uint64_t batch, int32_t world, int32_t rank);
int ddplug__deal_set_members(ddplug__deal *d, const int32_t *members, int32_t self);
void ddplug__deal_free(ddplug__deal *d);
/* A fresh epoch over the current world — unless a state was just loaded
 * for that epoch and nothing was delivered since (the resume). */
int ddplug__deal_start_epoch(ddplug__deal *d, uint64_t epoch);
uint64_t ddplug__deal_length(const ddplug__deal *d);
uint64_t ddplug__deal_position(const ddplug__deal *d);
/* Steps of the current segment this rank drew (a partial one counts). */
uint64_t ddplug__deal_drawn(const ddplug__deal *d);
/* Entries left in this rank's current step (0 at the end). */
uint64_t ddplug__deal_batch_left(const ddplug__deal *d);
/* The epoch's steps, as the current plan deals them. */
uint64_t ddplug__deal_total_steps(const ddplug__deal *d);
/* The epoch's committed steps (all segments). */
uint64_t ddplug__deal_steps(const ddplug__deal *d);
void ddplug__deal_next(ddplug__deal *d, int64_t *out, uint64_t cap, uint64_t *n);
int ddplug__deal_seek(ddplug__deal *d, uint64_t position);
int ddplug__deal_commit(ddplug__deal *d, uint64_t steps, const char *stream);
void ddplug__deal_declared(const ddplug__deal *d, uint64_t *padded, uint64_t *dropped);
/* The committed part as JSON (ddplug_sampler_state_save); *out is released
 * with ddplug__free. */
int ddplug__deal_save(const ddplug__deal *d, const char *stream, char **out);
int ddplug__deal_load(ddplug__deal *d, const char *stream, const char *text);
/* info[new rank] of every survivor; the plan becomes new rank `rank` of
 * `world`. *adopted: steps committed on this rank's behalf. */
int ddplug__deal_reform(ddplug__deal *d, const char *stream, const ddplug__reform_info *info,
                        int32_t world, int32_t rank, uint64_t *adopted);
/* This rank's share of the derived deliveries (deal.c's doc), through emit;
 * returns how many there are on all ranks together. */
uint64_t ddplug__deal_derived(const ddplug__deal *d,
                              void (*emit)(void *user, const int64_t *idx, uint64_t n),
                              void *user);
/* This rank's deliveries of the epoch so far, batch by batch (steps 1 at a
 * batch's start), through emit. */
void ddplug__deal_replay(const ddplug__deal *d,
                         void (*emit)(void *user, const int64_t *idx, uint64_t n, uint64_t steps),
                         void *user);
/* One segment, from the epoch's start, nothing resumed. */
int ddplug__deal_is_fresh(const ddplug__deal *d);

/* ---- default samplers (distributed.c, bucket.c) ------------------------- */

/* Both defaults implement the plugin's sampler slots (plugin.h) with the same
 * contracts, so sampler.c drives a default and a plugin-supplied sampler
 * through one table. `create` validates desc itself (a copied, size-checked
 * desc; kind already matched) and sets the last error on failure; exact = 1
 * (the distributed kind only) neither pads nor drops. */
typedef struct ddplug__sampler_ops {
  int (*create)(const ddplug_sampler_desc *desc, int exact,
                ddplug_plugin_sampler **out);
  int (*set_epoch)(ddplug_plugin_sampler *s, uint64_t epoch);
  int (*next)(ddplug_plugin_sampler *s, int64_t *out, uint64_t cap,
              uint64_t *n);
  int (*seek)(ddplug_plugin_sampler *s, uint64_t position);
  int (*length)(ddplug_plugin_sampler *s, uint64_t *length);
  void (*destroy)(ddplug_plugin_sampler *s);
  /* What the default declares about one epoch across all ranks: deliveries
   * that repeat a sample to pad ranks to equal length, and samples that
   * drop_last leaves out. */
  void (*declared)(ddplug_plugin_sampler *s, uint64_t *padded,
                   uint64_t *dropped);
} ddplug__sampler_ops;

extern const ddplug__sampler_ops ddplug__distributed_ops;
extern const ddplug__sampler_ops ddplug__bucket_ops;

/* The plan of a default distributed sampler's implementation; NULL for an
 * exact one (distributed.c). */
ddplug__deal *ddplug__distributed_deal(ddplug_plugin_sampler *ps);
/* An exact distributed sampler dealt again over world (its pass restarts). */
int ddplug__distributed_reshape(ddplug_plugin_sampler *ps, int32_t world, int32_t rank);

/* Samples per rank per epoch of the distributed sampler: ceil(n/world)
 * (padded) or floor(n/world) (drop_last), as torch's DistributedSampler. */
uint64_t ddplug__distributed_per_rank(uint64_t n, uint64_t world,
                                      int drop_last);

/* ---- the public handle (sampler.c, sampler_bind.c) ----------------------- */

/* The type of the plugin table's sampler_declared slot (plugin.h). */
typedef int (*ddplug__declared_fn)(ddplug_plugin_sampler *s, uint64_t *padded,
                                   uint64_t *dropped);

#define DDPLUG__STREAM_MAX DDPLUG_STREAM_NAME_MAX

struct ddplug_sampler {
  ddplug_sampler_desc desc; /* validated copy; lengths/boundaries cleared */
  int exact;                /* options.exact                              */
  char stream[DDPLUG__STREAM_MAX + 1];
  ddplug_plugin_sampler *impl;
  /* the slots driving impl: a default's, or the plugin's (create unused;
   * declared NULL for a plugin's sampler) */
  ddplug__sampler_ops ops;
  int from_plugin; /* 1: the plugin's sampler slots serve it              */
  /* the plugin's sampler_declared slot (ABI 1.2), NULL when it has none */
  ddplug__declared_fn plugin_declared;
  uint64_t len, epoch, pos;
  /* what one epoch declares (ddplug__sampler_update_declared), all ranks */
  uint64_t padded, dropped;
  ddplug_context *ctx; /* context-bound samplers only */
  /* steps committed this epoch (samplers without a plan: the bucket kind, a
   * plugin's), and a loaded state's position kept for set_epoch */
  uint64_t committed;
  int resume_pending;
  uint64_t generation; /* the context's generation it was dealt for      */
};

/* The plan of s (the default distributed kind, not exact), else NULL. */
ddplug__deal *ddplug__sampler_deal(const ddplug_sampler *s);
/* Refresh s->len, s->pos and what one epoch declares from the
 * implementation (after its plan changed). */
void ddplug__sampler_refresh(ddplug_sampler *s);

/* The stream-name rule (ddplug_stream_name_check) with `what` as the
 * message's head: OK, or INVALID_ARGUMENT with the last error set. */
int ddplug__stream_name_check(const char *stream, const char *what);
/* Validate the host's *in and build the plugin ABI's desc *d from it
 * (defaults filled: stream "train", world 1; d->stream points into in's
 * string, copy it before in goes) and *exact. Errors name `what`, the
 * stream and the field. */
int ddplug__sampler_options_to_desc(const ddplug_sampler_options *in,
                                    ddplug_sampler_desc *d, int *exact,
                                    const char *what);
int ddplug__sampler_alloc(const ddplug_sampler_desc *d, int exact,
                          ddplug_sampler **out);
/* Serve s with the default sampler of d->kind. */
int ddplug__sampler_use_default(ddplug_sampler *s,
                                const ddplug_sampler_desc *d);
/* Set s->padded and s->dropped: what one epoch of the sampler pads and
 * drops, all ranks together — a default's own numbers; a plugin sampler's
 * sampler_declared slot (ABI 1.2); else derived from its length
 * (ddplug__sampler_derive_declared). Called at creation and by set_epoch
 * (never under the data lock: a failing slot is logged). */
void ddplug__sampler_update_declared(ddplug_sampler *s);
/* The remainder that an equal-length split of d->num_samples needs when
 * every one of d->world_size ranks yields `length` indices (distributed)
 * or batches of d->batch_size (bucket): T = total deliveries; with
 * drop_last 0, T - N is padding, with drop_last 1, N - T is dropping —
 * but only within what equalising can need: fewer than world_size
 * (distributed), fewer than one global batch per bucket (bucket). Anything
 * beyond, or in the other direction, is not declared: the audit reports
 * it. */
void ddplug__sampler_derive_declared(const ddplug_sampler_desc *d,
                                     uint64_t length, uint64_t *padded,
                                     uint64_t *dropped);

/* Context binding (sampler_bind.c): after next delivered n indices
 * starting at position `before`, record them in the stream's open audit (a
 * no-op for a standalone sampler). Problems are logged, never returned:
 * next() has consumed the indices already. */
void ddplug__sampler_feed_hook(ddplug_sampler *s, uint64_t before,
                              const int64_t *idx, uint64_t n);
/* Take s off its stream (ddplug_sampler_free). */
void ddplug__sampler_unbind(ddplug_sampler *s);

/* ---- split ownership and per-stream state (owner.c) --------------------- */

#define DDPLUG__CLAIMANT_MAX 160

enum ddplug__audit_mode {
  DDPLUG__AUDIT_OFF = 0,
  DDPLUG__AUDIT_FIRST_EPOCH = 1,
  DDPLUG__AUDIT_EVERY_EPOCH = 2
};

/* A stream's owner forced by the config, and the config key that did it. */
typedef struct ddplug__forced_owner {
  char stream[DDPLUG__STREAM_MAX + 1]; /* "" = the default for all streams */
  int owner;                           /* DDPLUG_OWNER_*; UNSET = auto      */
  int set;                             /* the stream's own owner key exists */
  char by[DDPLUG__CLAIMANT_MAX];       /* "data_split.streams.train.owner in
                                          config.json"                     */
} ddplug__forced_owner;

/* What the config decides for the data-split layer (read by
 * ddplug__data_policy_read; tests build it directly). */
typedef struct ddplug__data_policy {
  ddplug__forced_owner fallback;  /* data_split.owner                      */
  ddplug__forced_owner *streams;  /* data_split.streams.<name>.owner       */
  uint32_t nstreams;
  int audit_mode;                 /* ddplug__audit_mode                    */
  int on_violation_warn;          /* 0: error, 1: warn                      */
  uint64_t exact_max;             /* data_split.audit_exact_max            */
} ddplug__data_policy;

/* Read the policy from cfg (NULL: the defaults). On failure p->streams is
 * NULL and the last error names the key. */
int ddplug__data_policy_read(const ddplug_config *cfg, ddplug__data_policy *p);
/* The forced owner of stream under p: the stream's own owner key when it
 * has one (also "auto", which forces nothing), else data_split.owner. */
const ddplug__forced_owner *ddplug__policy_forced(const ddplug__data_policy *p,
                                                  const char *stream);

typedef struct ddplug__stream {
  char name[DDPLUG__STREAM_MAX + 1];
  int owner;                         /* DDPLUG_OWNER_*, UNSET until claimed */
  char claimant[DDPLUG__CLAIMANT_MAX];
  uint64_t audits_begun;             /* audits begun for this stream       */
  uint64_t agree_calls;              /* ddplug_split_agree calls so far    */
  int has_prev;                      /* order fingerprint of the last epoch */
  uint64_t prev_epoch, prev_fingerprint;
  struct ddplug_audit *active;       /* the audit open on it, if any       */
  struct ddplug_sampler *sampler;    /* the context-bound sampler feeding it */
} ddplug__stream;

/* The context's data-split state (ctx->data). Thread-safe (one mutex). */
typedef struct ddplug__data_state {
  void *mutex; /* pthread_mutex_t */
  ddplug__data_policy policy;
  ddplug__stream *streams;
  uint32_t nstreams, cap;
} ddplug__data_state;

/* Takes ownership of policy->streams (also on failure). */
int ddplug__data_state_new(ddplug__data_policy *policy,
                           ddplug__data_state **out);
void ddplug__data_state_free(void *state);
/* After the group re-formed (run/shrink.c): open audits finish over the new
 * world. */
void ddplug__data_state_reform(void *state, int32_t rank, int32_t world);
void ddplug__data_lock(ddplug__data_state *st);
void ddplug__data_unlock(ddplug__data_state *st);
/* The stream's entry, created on first use; NULL (last error set) when out
 * of memory. Call with the lock held. */
ddplug__stream *ddplug__data_stream(ddplug__data_state *st, const char *name);
/* The config's forced owner of a stream (owner UNSET when none/auto). */
const ddplug__forced_owner *ddplug__data_forced(const ddplug__data_state *st,
                                                const char *stream);
/* The claim rules: see ddplug_split_claim. Takes the lock. */
int ddplug__split_claim(ddplug__data_state *st, const char *stream, int owner,
                        const char *claimant);
/* The resolved owner (a claim, else a forced owner, else UNSET) and who
 * decided it ("" when unset). Takes the lock. */
void ddplug__split_resolve(ddplug__data_state *st, const char *stream,
                           int *owner, char *claimant, size_t cap);

/* The context's data state, created from its config on first use
 * (owner.c). */
int ddplug__ctx_data(ddplug_context *ctx, ddplug__data_state **out);

/* The agreement check on gathered owners: owners[r] and claimants[r] of
 * every rank. OK when all equal; else SPLIT_CONFLICT naming the ranks that
 * differ from the majority. */
int ddplug__split_agree_check(const char *stream, int world,
                              const int *owners,
                              const char *const *claimants);

/* ---- audit (record.c, ids.c, diagnose.c, audit.c) ----------------------- */

enum ddplug__audit_scope {
  DDPLUG__SCOPE_SKIP = 0,  /* not audited: counts only, no communication  */
  DDPLUG__SCOPE_ORDER = 1, /* steps and order only                        */
  DDPLUG__SCOPE_FULL = 2   /* steps, order, coverage                      */
};

#define DDPLUG__AUDIT_EXAMPLES 8

/* One rank's contribution to the finish, exchanged by allgather (int64
 * each, so that any plugin's int64 allgather carries it). */
typedef struct ddplug__audit_stats {
  int64_t stream_hash, epoch, num_samples, scope;
  int64_t steps, deliveries, tracked_deliveries, distinct;
  int64_t out_of_range, order_repeated, epoch_behind, shuffle;
  int64_t allowed_padding, allowed_missing, tracked, coverage_ok;
  int64_t evaluation, by_id, steps_only, local_dropped;
  int64_t dropped_count, dropped_hash, level, nlocal_examples;
  /* up to 8 samples this rank delivered twice itself */
  int64_t local_examples[DDPLUG__AUDIT_EXAMPLES];
} ddplug__audit_stats;
#define DDPLUG__AUDIT_NSTATS \
  ((uint64_t)(sizeof(ddplug__audit_stats) / sizeof(int64_t)))

/* What the collective part of the finish found, for the diagnosis. */
typedef struct ddplug__audit_coverage {
  uint64_t covered;        /* tracked samples some rank delivered          */
  uint64_t common;         /* ... every rank delivered                     */
  uint64_t holes;          /* tracked samples nobody delivered, not in the
                              declared set                                 */
  uint64_t dropped_holes;  /* declared-dropped samples nobody delivered    */
  uint64_t missing_ex[DDPLUG__AUDIT_EXAMPLES]; /* hole examples, ascending */
  int nmissing_ex;
  int64_t repeat_ex[DDPLUG__AUDIT_EXAMPLES];   /* repeated samples, ascending */
  int nrepeat_ex;
  uint64_t id_duplicates;  /* by id: deliveries of an id already delivered
                              (within the kept subset)                     */
  uint64_t id_distinct;    /* by id: distinct kept ids                     */
} ddplug__audit_coverage;

/* The order fingerprint takes one more delivered value (by index or by id:
 * every rank's fingerprint must be computed the same way). */
static inline uint64_t ddplug__fp_step(uint64_t fp, uint64_t v) {
  fp = (fp ^ v) * 0x100000001b3ull;
  return fp ^ (fp >> 29);
}

/* Add a repeated-sample example unless it is listed already (at most
 * DDPLUG__AUDIT_EXAMPLES). */
void ddplug__audit_add_example(ddplug__audit_coverage *cov, int64_t id);

struct ddplug_audit {
  ddplug_context *ctx;          /* NULL in unit tests                      */
  ddplug__data_state *state;    /* the context's data state (or a test's)  */
  char stream[DDPLUG__STREAM_MAX + 1];
  int rank, world;
  int scope;                    /* ddplug__audit_scope                     */
  int finished;
  uint64_t n, epoch;
  ddplug_audit_options opts;    /* declared by the host (or a sampler)     */
  int exact;                    /* 1: every sample tracked                 */
  uint64_t tracked;             /* M: samples tracked                      */
  uint64_t exact_max;           /* data_split.audit_exact_max              */
  ddplug__feistel subset;       /* sampled mode: i tracked iff pi(i) < M   */
  uint64_t *bits;               /* [words] tracked samples seen            */
  uint64_t *dropped;            /* [words] declared dropped (lazy)         */
  uint64_t words;
  uint64_t steps, deliveries, tracked_deliveries, out_of_range;
  uint64_t local_repeats;       /* tracked deliveries of a sample seen here */
  int64_t local_ex[DDPLUG__AUDIT_EXAMPLES];
  int nlocal_ex;
  uint64_t fingerprint;         /* order hash of the deliveries            */
  int has_prev;                 /* the stream's previous epoch's order     */
  uint64_t prev_epoch, prev_fingerprint;
  int fed_by_sampler, fed_by_host;
  int warned_double_feed;
  int epoch_behind;             /* a sampler fed it from an older epoch    */
  uint64_t sampler_epoch;
  /* by id (ids.c): the kept mixed ids, and the subset level L (ids kept
   * iff their mixed hash < 2^(64-L)) */
  uint64_t *ids;
  uint64_t nids, cap_ids;
  uint32_t level;
  /* after finish */
  ddplug__audit_stats *all;     /* [world] every rank's stats (skip: 1)    */
  int nall;
  ddplug_audit_report report;
  ddplug__audit_coverage cov;
  char *text;
  char history[512];            /* the elastic sampler's membership history */
};

/* Allocate an audit (no registration): scope decides whether a bitmap of
 * min(n, exact_max) bits is allocated (not for an audit by id or of steps
 * only). */
int ddplug__audit_alloc(const char *stream, uint64_t n, uint64_t epoch,
                        const ddplug_audit_options *opts, int scope,
                        uint64_t exact_max, int rank, int world,
                        ddplug_audit **out);
/* Record n indices as `steps` steps (0 for more samples of the current
 * step). Never fails. */
void ddplug__audit_add(ddplug_audit *a, const int64_t *idx, uint64_t n,
                       uint64_t steps);
/* Declare indices dropped (ddplug_audit_declare_dropped, checked). */
int ddplug__audit_drop(ddplug_audit *a, const int64_t *idx, uint64_t n);
/* Take the audit off its stream (if registered) and keep its order
 * fingerprint there for the next epoch's check. */
void ddplug__audit_unregister(ddplug_audit *a);
/* This rank's stats for the finish. */
void ddplug__audit_local_stats(const ddplug_audit *a, ddplug__audit_stats *s);
uint64_t ddplug__audit_stream_hash(const char *stream);

/* By id (ids.c). Record n ids as `steps` steps; NO_MEMORY keeps nothing. */
int ddplug__audit_add_ids(ddplug_audit *a, const uint64_t *ids, uint64_t n,
                          uint64_t steps);
/* Keep only the ids of subset level `level` (>= a->level). */
void ddplug__audit_ids_level(ddplug_audit *a, uint32_t level);
/* Sort the kept ids and count this rank's own repeats (adjacent equal). */
void ddplug__audit_ids_sort(ddplug_audit *a);
/* Duplicates and distinct ids over every rank's sorted kept ids:
 * parts[r][0..counts[r]) (each ascending). Adds to cov (id_duplicates,
 * id_distinct, repeat examples). */
void ddplug__audit_ids_merge(const uint64_t *const *parts,
                             const uint64_t *counts, int world,
                             ddplug__audit_coverage *cov);

/* Build the report and the text from every rank's stats (all[world]) and
 * what the finish found (cov: NULL without coverage). The text is malloc'd
 * into *text (NULL when out of memory: the report still stands). */
void ddplug__audit_diagnose(const char *stream,
                            const ddplug__audit_stats *all, int world,
                            const ddplug__audit_coverage *cov,
                            ddplug_audit_report *r, char **text);

#endif /* DDPLUG_DATA_H */
