/* deal.c — one global cursor per epoch, and the rest of the epoch dealt over
 * any world: the default distributed sampler's plan.
 *
 * Positions. An epoch's order is pi(0), pi(1), ..., pi(N-1) (pi the keyed
 * permutation of feistel.c for (seed, epoch) when shuffling, the identity
 * otherwise): position p delivers sample pi(p). The order does not depend on
 * the world size; how positions are dealt to ranks does.
 *
 * Segments. An epoch is dealt in segments: the first starts at epoch start,
 * a new one at each change of membership (ddplug_sampler_reform after the
 * group shrank) or resume (ddplug_sampler_state_load). A segment is
 *   cursor C and replay list R: the queue Q = R ++ [C, N) of positions still
 *     to deal (R: ascending positions below C that were dealt once but never
 *     committed — a lost rank's unfinished batches);
 *   world W and, per rank r, the positions H_r it holds from before (batches
 *     it drew and did not commit yet; they stay its own).
 * Let m = |Q| + sum |H_r| (real samples; held padding copies excluded),
 * len = ceil((|Q| + sum |H_r|) / W) (floor with drop_last; at least
 * max |H_r|), and W·len − m the segment's padding: every rank
 * delivers len positions in the segment — H_r first, then new ones — in
 * steps of B (batch_size; 1 if unset): steps = ceil(len / B) on every rank.
 * At step j rank r needs n(r, j) new positions (B, the last partial batch,
 * less while it still delivers held ones); the needing ranks take the next
 * sum_r n(r, j) queue entries round robin: the i-th new slot of rank r at
 * step j is queue index
 *   q = base(j) + sum_r' min(i, n(r', j)) + #{r' < r : n(r', j) > i},
 * base(j) the entries steps before j took. Once no rank holds anything
 * (j >= hsteps), n(r, j) is the same for all r and this is q = base(hsteps)
 * + r + W·(k − hsteps·B) for the rank's k-th delivery: an arithmetic
 * progression, mapped through the permutation in one pass (feistel_map).
 * q >= |Q| is padding: a copy of queue entry q mod |Q|.
 * A fresh epoch (C = 0, R and H empty) deals rank r positions r, r + W,
 * r + 2W, ... — exactly torch's DistributedSampler and this sampler before
 * segments existed; any B gives the same order.
 *
 * Commit. The host commits a step (ddplug_sampler_commit) when its optimizer
 * step is done: the committed part of the epoch is, on every rank, steps
 * [0, K) of every rank of every segment. A checkpoint keeps it as (C', R'):
 * positions below C' are committed unless listed in R', plus a coverage
 * digest (count and an order-independent hash of the committed samples).
 *
 * Reform. After the group re-formed over the survivors, every survivor
 * gives its identity, committed steps k and drawn batches t (allgather, then
 * this plan). K = max k (a survivor one step behind lost only the answer of
 * an allreduce that completed elsewhere: its batch was in it, it is
 * committed — the host adopts the others' parameters for it). Each
 * survivor keeps its drawn batches [K, t) as held positions; everything
 * else dealt at steps >= K (a lost rank's batches, drawn or not, a
 * survivor's undrawn ones) joins the replay list of the next segment, the
 * queue's undealt rest stays the queue.
 *
 * Derived deliveries. The audit records what each live rank delivered; a
 * lost rank's records are gone, and so are a previous process's after a
 * restart. What they committed is derived from the plan: the lost ranks'
 * steps [0, K) of every segment they were in, and a resumed state's
 * committed set. The survivors feed these into the epoch's audit at its
 * finish, each a share (running index modulo the world), as deliveries
 * without steps.
 *
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

#define STATE_VERSION 1
/* A held entry that is a padding copy keeps this bit (positions are below
 * 2^63). */
#define HELD_PAD (1ull << 63)

/* ---- one segment ----------------------------------------------------------- */

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

static void seg_free(ddplug__seg *g) {
  ddplug__free(g->replay);
  if (g->held)
    for (int32_t r = 0; r < g->world; r++) ddplug__free(g->held[r]);
  ddplug__free(g->held);
  ddplug__free(g->nheld);
  ddplug__free(g->member);
  memset(g, 0, sizeof *g);
}

/* Allocate the per-rank arrays of a segment of `world` ranks. */
static int seg_alloc(ddplug__seg *g, int32_t world) {
  memset(g, 0, sizeof *g);
  g->world = world;
  g->member = ddplug__calloc((size_t)world, sizeof *g->member);
  g->held = ddplug__calloc((size_t)world, sizeof *g->held);
  g->nheld = ddplug__calloc((size_t)world, sizeof *g->nheld);
  g->me = -1;
  if (!g->member || !g->held || !g->nheld) {
    seg_free(g);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler: out of memory for a segment of %d ranks",
                       (int)world);
  }
  return DDPLUG_OK;
}

/* Steps rank r spends on its held positions. */
static uint64_t held_steps(const ddplug__seg *g, uint64_t B, int32_t r) {
  return ceil_div(g->nheld[r], B);
}

/* Positions one needing rank takes at step j (B; the last step s_last). */
static uint64_t step_size(const ddplug__seg *g, uint64_t B, uint64_t j) {
  return j + 1 == g->steps ? g->slast : B;
}

/* Ranks that take new positions at step j. */
static uint64_t needing(const ddplug__seg *g, uint64_t B, uint64_t j) {
  uint64_t a = 0;
  for (int32_t r = 0; r < g->world; r++) a += held_steps(g, B, r) <= j;
  return a;
}

/* Queue entries the steps before j took (j <= steps). */
static uint64_t step_base(const ddplug__seg *g, uint64_t B, uint64_t j) {
  if (j > g->hsteps) /* every rank needs at each step from hsteps on */
    return g->base_h + (uint64_t)g->world * B * (j - g->hsteps) -
           (j == g->steps && g->steps > g->hsteps ? (uint64_t)g->world * (B - g->slast) : 0);
  uint64_t base = 0;
  for (uint64_t jj = 0; jj < j; jj++) base += needing(g, B, jj) * step_size(g, B, jj);
  return base;
}

/* Entries rank r delivers in the segment. */
static uint64_t seg_len(const ddplug__seg *g, uint64_t B, int32_t r) {
  uint64_t t = held_steps(g, B, r);
  if (t >= g->steps) return g->nheld[r];
  return g->nheld[r] + (g->steps - 1 - t) * B + g->slast;
}

/* The first entry of rank r's step j (j <= steps: the end). */
static uint64_t step_start(const ddplug__seg *g, uint64_t B, int32_t r, uint64_t j) {
  uint64_t t = held_steps(g, B, r);
  if (j < t) return j * B;
  if (j >= g->steps) return seg_len(g, B, r);
  return g->nheld[r] + (j - t) * B;
}

/* The step of rank r's entry k (k < its length). */
static uint64_t step_of(const ddplug__seg *g, uint64_t B, int32_t r, uint64_t k) {
  if (k < g->nheld[r]) return k / B;
  return held_steps(g, B, r) + (k - g->nheld[r]) / B;
}

/* Steps rank r touched when it delivered `off` entries. */
static uint64_t steps_touched(const ddplug__seg *g, uint64_t B, int32_t r, uint64_t off) {
  return off == 0 ? 0 : step_of(g, B, r, off - 1) + 1;
}

static void seg_derive(ddplug__seg *g, uint64_t n, uint64_t B, int drop_last) {
  g->qlen = g->nreplay + (n - g->cursor);
  uint64_t held = 0, T = 0, W = (uint64_t)g->world;
  for (int32_t r = 0; r < g->world; r++) {
    held += g->nheld[r];
    T = DDPLUG__MAX(T, held_steps(g, B, r));
  }
  g->m = g->qlen + held - DDPLUG__MIN(held, g->held_padding);
  /* the fewest steps whose new slots hold the queue: ranks take new
   * positions once their held steps are done */
  uint64_t S = T, cap = 0;
  while (cap < g->qlen) {
    uint64_t a = 0;
    for (int32_t r = 0; r < g->world; r++) a += held_steps(g, B, r) <= S;
    if (a == W) { /* from here on every step adds W·B */
      uint64_t more = ceil_div(g->qlen - cap, W * B);
      S += more;
      cap += more * W * B;
      break;
    }
    cap += a * B;
    S++;
  }
  /* the last step evens out what is left (padding, or dropping) */
  uint64_t a_last = 0, before = 0;
  for (int32_t r = 0; r < g->world; r++) {
    uint64_t t = held_steps(g, B, r);
    if (S > t) {
      a_last++;
      before += (S - 1 - t) * B;
    }
  }
  uint64_t left = g->qlen > before ? g->qlen - before : 0, slast = 0;
  if (a_last) {
    slast = drop_last ? left / a_last : ceil_div(left, a_last);
    if (slast == 0 && drop_last && S > T) { /* drop the last step instead */
      S--;
      a_last = before = 0;
      for (int32_t r = 0; r < g->world; r++) {
        uint64_t t = held_steps(g, B, r);
        if (S > t) {
          a_last++;
          before += (S - 1 - t) * B;
        }
      }
      left = g->qlen > before ? g->qlen - before : 0;
      slast = a_last ? DDPLUG__MIN(B, left / a_last) : 0;
    }
    slast = DDPLUG__MAX(DDPLUG__MIN(slast, B), 1);
  }
  g->steps = S;
  g->hsteps = T;
  g->slast = slast;
  g->base_h = 0;
  g->base_h = step_base(g, B, DDPLUG__MIN(T, S));
  uint64_t slots = 0;
  for (int32_t r = 0; r < g->world; r++) slots += seg_len(g, B, r);
  g->slots = slots;
}

/* The position of queue entry q; *pad = 1 for a padding copy. */
static uint64_t q_position(const ddplug__seg *g, uint64_t q, int *pad) {
  *pad = q >= g->qlen;
  if (*pad) {
    if (g->qlen == 0) { /* only held positions remain: pad with those */
      uint64_t total = 0;
      for (int32_t r = 0; r < g->world; r++) total += g->nheld[r];
      if (total == 0) return 0;
      q %= total;
      for (int32_t r = 0; r < g->world; r++) {
        if (q < g->nheld[r]) return g->held[r][q] & ~HELD_PAD;
        q -= g->nheld[r];
      }
      return 0;
    }
    q %= g->qlen;
  }
  return q < g->nreplay ? g->replay[q] : g->cursor + (q - g->nreplay);
}

/* Queue index of rank r's entry k (a new one: nheld[r] <= k < its length). */
static uint64_t seq_q(const ddplug__seg *g, uint64_t B, int32_t r, uint64_t k) {
  uint64_t t = held_steps(g, B, r), kn = k - g->nheld[r];
  if (t + kn / B >= g->hsteps) /* every rank needs: an arithmetic progression */
    return g->base_h + (uint64_t)r + (uint64_t)g->world * (kn - (g->hsteps - t) * B);
  uint64_t j = t + kn / B, i = kn % B, m = 0;
  for (int32_t o = 0; o < r; o++) m += held_steps(g, B, o) <= j;
  return step_base(g, B, j) + m + i * needing(g, B, j);
}

/* Position of rank r's entry k; *pad as q_position (a held entry counts as
 * real). */
static uint64_t seq_position(const ddplug__seg *g, uint64_t B, int32_t r, uint64_t k, int *pad) {
  if (k < g->nheld[r]) {
    *pad = (g->held[r][k] & HELD_PAD) != 0;
    return g->held[r][k] & ~HELD_PAD;
  }
  return q_position(g, seq_q(g, B, r, k), pad);
}

/* ---- the plan ------------------------------------------------------------------ */

static uint64_t sample_of(const ddplug__deal *d, uint64_t p) {
  return d->shuffle ? ddplug__feistel_apply(&d->perm, p) : p;
}

static ddplug__seg *cur(const ddplug__deal *d) { return &d->segs[d->nsegs - 1]; }

static void drop_history(ddplug__deal *d) {
  for (uint32_t i = 0; i < d->nsegs; i++) seg_free(&d->segs[i]);
  d->nsegs = 0;
  ddplug__free(d->prior_replay);
  d->prior_replay = NULL;
  d->nprior_replay = 0;
  d->has_prior = 0;
  d->prior_cursor = 0;
  d->history[0] = '\0';
}

static int push_segment(ddplug__deal *d, ddplug__seg *g) {
  if (d->nsegs == d->capsegs) {
    uint32_t cap = d->capsegs ? d->capsegs * 2 : 4;
    ddplug__seg *grown = ddplug__realloc(d->segs, sizeof *grown * cap);
    if (!grown) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler: out of memory");
    d->segs = grown;
    d->capsegs = cap;
  }
  d->segs[d->nsegs++] = *g;
  return DDPLUG_OK;
}

void ddplug__deal_free(ddplug__deal *d) {
  if (!d) return;
  drop_history(d);
  ddplug__free(d->segs);
  ddplug__free(d->members);
  memset(d, 0, sizeof *d);
}

int ddplug__deal_init(ddplug__deal *d, uint64_t n, uint64_t seed, int shuffle, int drop_last,
                      uint64_t batch, int32_t world, int32_t rank) {
  memset(d, 0, sizeof *d);
  d->n = n;
  d->seed = seed;
  d->shuffle = shuffle;
  d->drop_last = drop_last;
  d->batch = batch ? batch : 1;
  d->world = world;
  d->rank = rank;
  d->members = ddplug__calloc((size_t)world, sizeof *d->members);
  if (!d->members) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler: out of memory");
  for (int32_t r = 0; r < world; r++) d->members[r] = r;
  d->self = rank;
  return ddplug__deal_start_epoch(d, 0);
}

int ddplug__deal_set_members(ddplug__deal *d, const int32_t *members, int32_t self) {
  for (int32_t r = 0; r < d->world; r++) d->members[r] = members[r];
  d->self = self;
  ddplug__seg *g = cur(d);
  for (int32_t r = 0; r < g->world && r < d->world; r++) g->member[r] = members[r];
  return DDPLUG_OK;
}

int ddplug__deal_start_epoch(ddplug__deal *d, uint64_t epoch) {
  if (d->resumed && epoch == d->epoch && d->nsegs == 1 && d->off == 0) {
    d->resumed = 0; /* keep the state just loaded for this epoch */
    return DDPLUG_OK;
  }
  d->resumed = 0;
  drop_history(d);
  ddplug__seg g;
  int st = seg_alloc(&g, d->world);
  if (st) return st;
  for (int32_t r = 0; r < d->world; r++) g.member[r] = d->members[r];
  g.me = d->rank;
  seg_derive(&g, d->n, d->batch, d->drop_last);
  st = push_segment(d, &g);
  if (st) {
    seg_free(&g);
    return st;
  }
  d->epoch = epoch;
  ddplug__feistel_init(&d->perm, d->n, d->seed, epoch, DDPLUG__SALT_DISTRIBUTED);
  d->off = d->pos0 = d->committed = 0;
  cur(d)->my_off0 = 0;
  return DDPLUG_OK;
}

static uint64_t my_len(const ddplug__deal *d) { return seg_len(cur(d), d->batch, d->rank); }

uint64_t ddplug__deal_length(const ddplug__deal *d) { return d->pos0 + my_len(d); }
uint64_t ddplug__deal_position(const ddplug__deal *d) { return d->pos0 + d->off; }

/* Deliver this rank's entries [k0, k0 + count) of the current segment. */
static void deliver(const ddplug__deal *d, uint64_t k0, uint64_t count, int64_t *out) {
  const ddplug__seg *g = cur(d);
  uint64_t B = d->batch, W = (uint64_t)g->world, done = 0;
  int pad;
  /* held entries and the steps while some rank still holds: one by one */
  uint64_t ht = held_steps(g, B, d->rank);
  uint64_t fast = g->nheld[d->rank] + (g->hsteps > ht ? (g->hsteps - ht) * B : 0);
  for (; done < count && k0 + done < fast; done++)
    out[done] = (int64_t)sample_of(d, seq_position(g, B, d->rank, k0 + done, &pad));
  /* then an arithmetic progression of queue indices */
  while (done < count) {
    uint64_t k = k0 + done, left = count - done;
    uint64_t q = seq_q(g, B, d->rank, k);
    if (q >= g->nreplay && q < g->qlen) { /* a run of the cursor range */
      uint64_t run = DDPLUG__MIN(left, (g->qlen - 1 - q) / W + 1);
      uint64_t p0 = g->cursor + (q - g->nreplay);
      if (d->shuffle) {
        ddplug__feistel_map(&d->perm, p0, W, run, out + done);
      } else {
        for (uint64_t t = 0; t < run; t++) out[done + t] = (int64_t)(p0 + t * W);
      }
      done += run;
    } else {
      out[done++] = (int64_t)sample_of(d, q_position(g, q, &pad));
    }
  }
}

void ddplug__deal_next(ddplug__deal *d, int64_t *out, uint64_t cap, uint64_t *n) {
  uint64_t len = my_len(d);
  uint64_t m = DDPLUG__MIN(cap, len - DDPLUG__MIN(d->off, len));
  if (m) deliver(d, d->off, m, out);
  d->off += m;
  *n = m;
}

uint64_t ddplug__deal_batch_left(const ddplug__deal *d) {
  const ddplug__seg *g = cur(d);
  uint64_t len = my_len(d);
  if (d->off >= len) return 0;
  uint64_t j = step_of(g, d->batch, d->rank, d->off);
  return step_start(g, d->batch, d->rank, j + 1) - d->off;
}

uint64_t ddplug__deal_total_steps(const ddplug__deal *d) { return cur(d)->step0 + cur(d)->steps; }

int ddplug__deal_seek(ddplug__deal *d, uint64_t position) {
  ddplug__seg *g = cur(d);
  uint64_t lo = d->pos0 + g->my_off0, len = my_len(d);
  if (position < lo || position > d->pos0 + len)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "sampler seek: position %llu is outside this rank's part of the epoch "
                       "since its last change of membership or resume (%llu to %llu)",
                       (unsigned long long)position, (unsigned long long)lo,
                       (unsigned long long)(d->pos0 + len));
  d->off = position - d->pos0;
  /* a seek resumes: the steps before it count as committed */
  d->committed = d->off >= len ? g->steps : step_of(g, d->batch, d->rank, d->off);
  return DDPLUG_OK;
}

uint64_t ddplug__deal_drawn(const ddplug__deal *d) {
  return steps_touched(cur(d), d->batch, d->rank, d->off);
}

int ddplug__deal_commit(ddplug__deal *d, uint64_t steps, const char *stream) {
  uint64_t drawn = ddplug__deal_drawn(d);
  if (steps > drawn - DDPLUG__MIN(drawn, d->committed))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_commit: stream '%s': commits %llu step(s), but only "
                       "%llu batch(es) were delivered and not yet committed (%llu committed, "
                       "%llu delivered since the epoch's last change): commit once per "
                       "optimizer step, after its batch was drawn",
                       stream, (unsigned long long)steps,
                       (unsigned long long)(drawn - DDPLUG__MIN(drawn, d->committed)),
                       (unsigned long long)d->committed, (unsigned long long)drawn);
  d->committed += steps;
  return DDPLUG_OK;
}

uint64_t ddplug__deal_steps(const ddplug__deal *d) { return cur(d)->step0 + d->committed; }

/* ---- what one epoch declares --------------------------------------------------- */

void ddplug__deal_declared(const ddplug__deal *d, uint64_t *padded, uint64_t *dropped) {
  const ddplug__seg *g = cur(d);
  *padded = d->padding_before + (g->slots > g->m ? g->slots - g->m : 0);
  *dropped = g->slots < g->m ? g->m - g->slots : 0;
}

/* ---- the committed part: checkpoint state and its digest ---------------------- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Uncommitted positions below the cursor after K steps of segment g: the
 * replay entries not yet dealt and every rank's held positions at steps
 * >= K. *cursor receives C'. The list is malloc'd, ascending. */
static int committed_state(const ddplug__deal *d, uint64_t K, uint64_t *cursor, uint64_t **out,
                           uint64_t *nout) {
  const ddplug__seg *g = cur(d);
  uint64_t B = d->batch, base = step_base(g, B, DDPLUG__MIN(K, g->steps));
  uint64_t cnt = base < g->nreplay ? g->nreplay - base : 0;
  for (int32_t r = 0; r < g->world; r++) {
    uint64_t from = step_start(g, B, r, K);
    if (g->nheld[r] > from) cnt += g->nheld[r] - from;
  }
  uint64_t *v = ddplug__malloc(sizeof *v * (cnt ? cnt : 1));
  if (!v) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
  uint64_t k = 0;
  for (uint64_t q = base; q < g->nreplay; q++) v[k++] = g->replay[q];
  for (int32_t r = 0; r < g->world; r++)
    for (uint64_t i = step_start(g, B, r, K); i < g->nheld[r]; i++)
      if (!(g->held[r][i] & HELD_PAD)) v[k++] = g->held[r][i];
  qsort(v, (size_t)k, sizeof *v, cmp_u64);
  /* padding copies of held positions may name a position twice */
  uint64_t u = 0;
  for (uint64_t i = 0; i < k; i++)
    if (u == 0 || v[u - 1] != v[i]) v[u++] = v[i];
  uint64_t dealt = DDPLUG__MIN(base, g->qlen);
  *cursor = g->cursor + (dealt > g->nreplay ? dealt - g->nreplay : 0);
  *out = v;
  *nout = u;
  return DDPLUG_OK;
}

/* splitmix64's finaliser. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Count and order-independent hash of the samples at positions [0, cursor)
 * not in replay (ascending). */
static void digest(const ddplug__deal *d, uint64_t cursor, const uint64_t *replay, uint64_t nreplay,
                   uint64_t *count, uint64_t *hash) {
  uint64_t c = 0, h = 0, k = 0;
  for (uint64_t p = 0; p < cursor; p++) {
    if (k < nreplay && replay[k] == p) {
      k++;
      continue;
    }
    h += mix64(sample_of(d, p) ^ 0x636f766572616765ull); /* "coverage" */
    c++;
  }
  *count = c;
  *hash = mix64(h ^ c);
}

int ddplug__deal_save(const ddplug__deal *d, const char *stream, char **out) {
  uint64_t cursor = 0, *replay = NULL, nreplay = 0, count, hash;
  int st = committed_state(d, d->committed, &cursor, &replay, &nreplay);
  if (st) return st;
  digest(d, cursor, replay, nreplay, &count, &hash);
  json_t *list = json_array();
  for (uint64_t i = 0; list && i < nreplay; i++)
    json_array_append_new(list, json_integer((json_int_t)replay[i]));
  ddplug__free(replay);
  char hex[24];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
  json_t *j = list ? json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:b, s:b, s:I, s:i, s:I, s:o, "
                               "s:I, s:s, s:I, s:s}",
                               "ddplug_sampler_state", STATE_VERSION, "kind", "distributed",
                               "stream", stream, "epoch", (json_int_t)d->epoch, "seed",
                               (json_int_t)d->seed, "num_samples", (json_int_t)d->n,
                               "shuffle", d->shuffle, "drop_last", d->drop_last,
                               "batch_size", (json_int_t)d->batch, "world_size",
                               (int)cur(d)->world, "cursor", (json_int_t)cursor, "replay",
                               list, "committed", (json_int_t)count, "digest", hex, "steps",
                               (json_int_t)ddplug__deal_steps(d), "history", d->history)
                    : NULL;
  char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(j);
  if (!text) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
  *out = ddplug__strdup(text);
  free(text);
  return *out ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
}

/* "seed 7, N = 1000, shuffled" — what a state or this run says. */
static void describe_run(char *buf, size_t cap, uint64_t seed, uint64_t n, int shuffle) {
  snprintf(buf, cap, "seed %llu, N = %llu, %s", (unsigned long long)seed,
           (unsigned long long)n, shuffle ? "shuffled" : "in order");
}

int ddplug__deal_load(ddplug__deal *d, const char *stream, const char *text) {
  json_error_t jerr;
  json_t *j = json_loads(text, 0, &jerr);
  if (!j || !json_is_object(j)) {
    json_decref(j);
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_state_load: stream '%s': the state is not a JSON object "
                       "(%s at line %d column %d): pass the text ddplug_sampler_state_save gave",
                       stream, jerr.text, jerr.line, jerr.column);
  }
  json_int_t version = 0, epoch = 0, seed = 0, n = 0, batch = 0, cursor = 0, committed = 0,
             steps = 0;
  int world = 0, shuffle = 0, drop_last = 0;
  const char *kind = NULL, *sstream = NULL, *hex = NULL, *history = "";
  json_t *list = NULL;
  if (json_unpack_ex(j, &jerr, 0,
                     "{s:I, s:s, s:s, s:I, s:I, s:I, s:b, s:b, s:I, s:i, s:I, s:o, s:I, s:s, "
                     "s:I, s?s}",
                     "ddplug_sampler_state", &version, "kind", &kind, "stream", &sstream,
                     "epoch", &epoch, "seed", &seed, "num_samples", &n, "shuffle", &shuffle,
                     "drop_last", &drop_last, "batch_size", &batch, "world_size", &world,
                     "cursor", &cursor, "replay", &list, "committed", &committed, "digest",
                     &hex, "steps", &steps, "history", &history) != 0 ||
      !json_is_array(list)) {
    int st = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "ddplug_sampler_state_load: stream '%s': the state lacks a field or "
                         "has one of the wrong type (%s): pass the text "
                         "ddplug_sampler_state_save gave",
                         stream, jerr.text);
    json_decref(j);
    return st;
  }
  char saved[160], mine[160];
  describe_run(saved, sizeof saved, (uint64_t)seed, (uint64_t)n, shuffle);
  describe_run(mine, sizeof mine, d->seed, d->n, d->shuffle);
  int st = DDPLUG_OK;
  if (version != STATE_VERSION || strcmp(kind, "distributed") != 0) {
    st = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                     "ddplug_sampler_state_load: stream '%s': the state is of a %s sampler "
                     "(state version %lld); this one is ddplug's distributed sampler (version %d)",
                     stream, kind, (long long)version, STATE_VERSION);
  } else if ((uint64_t)seed != d->seed || (uint64_t)n != d->n || shuffle != d->shuffle) {
    st = ddplug__err(DDPLUG_E_MISMATCH,
                     "stream '%s': the checkpoint says %s (epoch %lld, cursor %lld of %lld, "
                     "saved on %d ranks); this run has %s: its order is another, so resuming "
                     "there would repeat some samples and skip others — resume with the "
                     "checkpoint's seed and dataset, or start the epoch over without the "
                     "sampler's state",
                     stream, saved, (long long)epoch, (long long)cursor, (long long)n, world,
                     mine);
  } else if (cursor < 0 || (uint64_t)cursor > d->n) {
    st = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                     "ddplug_sampler_state_load: stream '%s': cursor %lld is not in [0, %llu]",
                     stream, (long long)cursor, (unsigned long long)d->n);
  }
  size_t nreplay = st ? 0 : json_array_size(list);
  uint64_t *replay = ddplug__malloc(sizeof *replay * (nreplay ? nreplay : 1));
  if (!st && !replay) st = ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
  for (size_t i = 0; !st && i < nreplay; i++) {
    json_t *v = json_array_get(list, i);
    json_int_t p = json_integer_value(v);
    if (!json_is_integer(v) || p < 0 || p >= cursor || (i > 0 && (uint64_t)p <= replay[i - 1]))
      st = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_sampler_state_load: stream '%s': replay[%zu] must be an "
                       "ascending position below the cursor %lld",
                       stream, i, (long long)cursor);
    else
      replay[i] = (uint64_t)p;
  }
  if (!st) {
    uint64_t count, hash;
    ddplug__deal saved_plan = *d; /* the digest is of the checkpoint's epoch */
    ddplug__feistel_init(&saved_plan.perm, d->n, d->seed, (uint64_t)epoch,
                         DDPLUG__SALT_DISTRIBUTED);
    digest(&saved_plan, (uint64_t)cursor, replay, nreplay, &count, &hash);
    char want[24];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)hash);
    if (count != (uint64_t)committed || strcmp(want, hex) != 0)
      st = ddplug__err(DDPLUG_E_MISMATCH,
                       "stream '%s': the checkpoint's coverage digest does not match the "
                       "samples its cursor names: it says %lld samples committed (digest %s), "
                       "its cursor %lld and replay list give %llu (digest %s) with %s — the "
                       "state was edited, or saved by a ddplug whose permutation differs",
                       stream, (long long)committed, hex, (long long)cursor,
                       (unsigned long long)count, want, mine);
  }
  if (st) {
    ddplug__free(replay);
    json_decref(j);
    return st;
  }
  /* the epoch resumes as one fresh segment over this run's world */
  ddplug__seg g;
  st = seg_alloc(&g, d->world);
  if (st) {
    ddplug__free(replay);
    json_decref(j);
    return st;
  }
  uint64_t *prior = ddplug__malloc(sizeof *prior * (nreplay ? nreplay : 1));
  if (!prior) {
    seg_free(&g);
    ddplug__free(replay);
    json_decref(j);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler state: out of memory");
  }
  memcpy(prior, replay, sizeof *prior * nreplay);
  drop_history(d);
  g.cursor = (uint64_t)cursor;
  g.replay = replay;
  g.nreplay = nreplay;
  for (int32_t r = 0; r < d->world; r++) g.member[r] = d->members[r];
  g.me = d->rank;
  g.step0 = (uint64_t)steps;
  seg_derive(&g, d->n, d->batch, d->drop_last);
  push_segment(d, &g); /* cannot fail: drop_history kept the array */
  d->epoch = (uint64_t)epoch;
  ddplug__feistel_init(&d->perm, d->n, d->seed, d->epoch, DDPLUG__SALT_DISTRIBUTED);
  d->off = d->pos0 = d->committed = d->padding_before = 0;
  d->has_prior = 1;
  d->prior_cursor = (uint64_t)cursor;
  d->prior_replay = prior;
  d->nprior_replay = nreplay;
  d->resumed = 1;
  snprintf(d->history, sizeof d->history,
           "%s%sresumed at step %lld (cursor %lld of %llu, %lld committed) on %d rank%s, "
           "saved on %d",
           history, *history ? "; " : "", (long long)steps, (long long)cursor,
           (unsigned long long)d->n, (long long)committed, (int)d->world,
           d->world == 1 ? "" : "s", world);
  json_decref(j);
  return DDPLUG_OK;
}

/* ---- reform ---------------------------------------------------------------------- */

static int find_member(const ddplug__seg *g, int32_t id) {
  for (int32_t r = 0; r < g->world; r++)
    if (g->member[r] == id) return (int)r;
  return -1;
}

/* Append p to v (grown as needed). */
static int push_pos(uint64_t **v, uint64_t *nv, uint64_t *cap, uint64_t p) {
  if (*nv == *cap) {
    uint64_t c = *cap ? *cap * 2 : 256;
    uint64_t *grown = ddplug__realloc(*v, sizeof *grown * c);
    if (!grown) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler reform: out of memory");
    *v = grown;
    *cap = c;
  }
  (*v)[(*nv)++] = p;
  return DDPLUG_OK;
}

/* Append rank r's real entries of steps [j0, j1) of segment g to v. */
static int pool_steps(const ddplug__deal *d, const ddplug__seg *g, int32_t r, uint64_t j0,
                      uint64_t j1, uint64_t **v, uint64_t *nv, uint64_t *cap) {
  uint64_t k1 = step_start(g, d->batch, r, DDPLUG__MIN(j1, g->steps));
  for (uint64_t k = step_start(g, d->batch, r, DDPLUG__MIN(j0, g->steps)); k < k1; k++) {
    int pad;
    uint64_t p = seq_position(g, d->batch, r, k, &pad);
    if (pad) continue;
    int st = push_pos(v, nv, cap, p);
    if (st) return st;
  }
  return DDPLUG_OK;
}

/* "0-2" or "0, 2, 5": the identities of a segment's members. */
static void member_list(const ddplug__seg *g, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  int32_t r = 0;
  while (r < g->world && n + 16 < cap) {
    int32_t e = r;
    while (e + 1 < g->world && g->member[e + 1] == g->member[e] + 1) e++;
    if (e >= r + 2)
      n += (size_t)snprintf(buf + n, cap - n, "%s%d-%d", n ? ", " : "", (int)g->member[r],
                            (int)g->member[e]);
    else
      for (int32_t x = r; x <= e; x++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? ", " : "", (int)g->member[x]);
    r = e + 1;
  }
}

int ddplug__deal_reform(ddplug__deal *d, const char *stream, const ddplug__reform_info *info,
                        int32_t world, int32_t rank, uint64_t *adopted) {
  ddplug__seg *g = cur(d);
  uint64_t B = d->batch, K = 0, Kp = 0;
  for (int32_t s = 0; s < world; s++) {
    const ddplug__reform_info *x = &info[s];
    if (x->epoch != info[0].epoch || x->nsegs != info[0].nsegs)
      return ddplug__err(DDPLUG_E_MISMATCH,
                         "sampler reform: stream '%s': the survivors are not in the same "
                         "epoch: new rank 0 is in epoch %lld (segment %lld), new rank %d in "
                         "epoch %lld (segment %lld) — every survivor must reform the same "
                         "sampler at the same point",
                         stream, (long long)info[0].epoch, (long long)info[0].nsegs, (int)s,
                         (long long)x->epoch, (long long)x->nsegs);
    if (find_member(g, (int32_t)x->identity) < 0)
      return ddplug__err(DDPLUG_E_MISMATCH,
                         "sampler reform: stream '%s': new rank %d (process %lld) was not a "
                         "member of the sampler's last world",
                         stream, (int)s, (long long)x->identity);
    K = DDPLUG__MAX(K, (uint64_t)x->committed);
    Kp = DDPLUG__MAX(Kp, (uint64_t)x->drawn);
  }
  K = DDPLUG__MIN(K, g->steps);
  Kp = DDPLUG__MIN(DDPLUG__MAX(Kp, K), g->steps);
  int32_t *survivor_of = ddplug__calloc((size_t)g->world, sizeof *survivor_of);
  if (!survivor_of) return ddplug__err(DDPLUG_E_NO_MEMORY, "sampler reform: out of memory");
  for (int32_t r = 0; r < g->world; r++) survivor_of[r] = -1;
  for (int32_t s = 0; s < world; s++) survivor_of[find_member(g, (int32_t)info[s].identity)] = s;
  /* the pool: what was dealt at steps >= K and no survivor drew (a lost
   * rank's batches, drawn or not; a survivor's undrawn ones), then the
   * queue's undealt replay entries */
  uint64_t *pool = NULL, npool = 0, cap = 0;
  int st = DDPLUG_OK;
  for (int32_t r = 0; st == DDPLUG_OK && r < g->world; r++) {
    uint64_t from = survivor_of[r] < 0
                        ? K
                        : DDPLUG__MAX(K, (uint64_t)info[survivor_of[r]].drawn);
    uint64_t to = DDPLUG__MAX(Kp, held_steps(g, B, r));
    if (from < to) st = pool_steps(d, g, r, from, to, &pool, &npool, &cap);
  }
  uint64_t base = step_base(g, B, Kp);
  for (uint64_t q = base; st == DDPLUG_OK && q < g->nreplay; q++)
    st = push_pos(&pool, &npool, &cap, g->replay[q]);
  ddplug__seg ng;
  memset(&ng, 0, sizeof ng);
  if (st == DDPLUG_OK) st = seg_alloc(&ng, world);
  /* the survivors' drawn steps [K, drawn) stay theirs */
  for (int32_t s = 0; st == DDPLUG_OK && s < world; s++) {
    int32_t r = find_member(g, (int32_t)info[s].identity);
    ng.member[s] = (int32_t)info[s].identity;
    uint64_t k0 = step_start(g, B, r, K);
    uint64_t k1 = step_start(g, B, r, DDPLUG__MIN((uint64_t)info[s].drawn, g->steps));
    if (k1 <= k0) continue;
    ng.held[s] = ddplug__malloc(sizeof *ng.held[s] * (size_t)(k1 - k0));
    if (!ng.held[s]) {
      st = ddplug__err(DDPLUG_E_NO_MEMORY, "sampler reform: out of memory");
      break;
    }
    for (uint64_t k = k0; k < k1; k++) {
      int pad;
      uint64_t p = seq_position(g, B, r, k, &pad);
      ng.held[s][k - k0] = pad ? p | HELD_PAD : p;
      ng.held_padding += (uint64_t)pad;
    }
    ng.nheld[s] = k1 - k0;
  }
  if (st != DDPLUG_OK) {
    ddplug__free(pool);
    ddplug__free(survivor_of);
    seg_free(&ng);
    return st;
  }
  ddplug__free(survivor_of);
  if (npool > 1) qsort(pool, (size_t)npool, sizeof *pool, cmp_u64);
  uint64_t dealt = DDPLUG__MIN(base, g->qlen);
  ng.cursor = g->cursor + (dealt > g->nreplay ? dealt - g->nreplay : 0);
  ng.replay = pool;
  ng.nreplay = npool;
  ng.step0 = g->step0 + K;
  ng.me = rank;
  seg_derive(&ng, d->n, B, d->drop_last);
  /* the padding every member delivered in the committed steps */
  uint64_t pad_committed = 0;
  for (int32_t r = 0; r < g->world; r++) {
    uint64_t end = step_start(g, B, r, K);
    for (uint64_t k = 0; k < end; k++) {
      int pad;
      (void)seq_position(g, B, r, k, &pad);
      pad_committed += (uint64_t)pad;
    }
  }
  /* close the old segment, open the new */
  uint64_t my_committed = d->committed, my_k0 = step_start(g, B, d->rank, K);
  g->steps_end = K;
  g->my_off1 = d->off;
  char before[256], after[256];
  member_list(g, before, sizeof before);
  uint64_t closed_step0 = g->step0;
  st = push_segment(d, &ng);
  if (st != DDPLUG_OK) {
    seg_free(&ng);
    return st;
  }
  member_list(cur(d), after, sizeof after);
  uint64_t off_new = d->off > my_k0 ? d->off - my_k0 : 0;
  d->pos0 += d->off - off_new;
  d->off = off_new;
  cur(d)->my_off0 = off_new;
  d->committed = 0;
  d->padding_before += pad_committed;
  int32_t *members = ddplug__realloc(d->members, sizeof *members * (size_t)world);
  if (members) {
    d->members = members;
    for (int32_t s = 0; s < world; s++) d->members[s] = (int32_t)info[s].identity;
  }
  d->world = world;
  d->rank = rank;
  if (adopted) *adopted = K - DDPLUG__MIN(K, my_committed);
  size_t used = strlen(d->history);
  snprintf(d->history + used, sizeof d->history - used, "%sranks %s until step %llu, then %s",
           used ? "; " : "", before, (unsigned long long)(closed_step0 + K), after);
  return DDPLUG_OK;
}

/* ---- derived deliveries and replay ----------------------------------------------- */

/* Calls emit(user, positions as sample indices, n) in chunks. */
typedef struct feeder {
  const ddplug__deal *d;
  int32_t world, rank;
  uint64_t running;
  int64_t buf[1024];
  uint64_t n;
  void (*emit)(void *user, const int64_t *idx, uint64_t n);
  void *user;
} feeder;

static void feed_flush(feeder *f) {
  if (f->n) f->emit(f->user, f->buf, f->n);
  f->n = 0;
}

static void feed_one(feeder *f, uint64_t p) {
  if (f->running++ % (uint64_t)f->world != (uint64_t)f->rank) return;
  f->buf[f->n++] = (int64_t)sample_of(f->d, p);
  if (f->n == DDPLUG__ARRAY_LEN(f->buf)) feed_flush(f);
}

uint64_t ddplug__deal_derived(const ddplug__deal *d,
                              void (*emit)(void *user, const int64_t *idx, uint64_t n),
                              void *user) {
  feeder f = {.d = d, .world = d->world, .rank = d->rank, .emit = emit, .user = user};
  if (d->has_prior) {
    uint64_t k = 0;
    for (uint64_t p = 0; p < d->prior_cursor; p++) {
      if (k < d->nprior_replay && d->prior_replay[k] == p) {
        k++;
        continue;
      }
      feed_one(&f, p);
    }
  }
  const ddplug__seg *last = cur(d);
  for (uint32_t s = 0; s + 1 < d->nsegs; s++) {
    const ddplug__seg *g = &d->segs[s];
    for (int32_t r = 0; r < g->world; r++) {
      if (find_member(last, g->member[r]) >= 0) continue; /* alive: it records itself */
      uint64_t end = step_start(g, d->batch, r, g->steps_end);
      for (uint64_t k = 0; k < end; k++) {
        int pad;
        feed_one(&f, seq_position(g, d->batch, r, k, &pad));
      }
    }
  }
  feed_flush(&f);
  return f.running;
}

int ddplug__deal_is_fresh(const ddplug__deal *d) {
  return d->nsegs == 1 && !d->has_prior && d->pos0 == 0;
}

void ddplug__deal_replay(const ddplug__deal *d,
                         void (*emit)(void *user, const int64_t *idx, uint64_t n, uint64_t steps),
                         void *user) {
  int64_t buf[1024];
  for (uint32_t s = 0; s < d->nsegs; s++) {
    const ddplug__seg *g = &d->segs[s];
    if (g->me < 0) continue;
    uint64_t k0 = g->my_off0, k1 = s + 1 == d->nsegs ? d->off : g->my_off1;
    k1 = DDPLUG__MIN(k1, seg_len(g, d->batch, g->me));
    while (k0 < k1) {
      /* one step at a time, so that steps count as delivered */
      uint64_t j = step_of(g, d->batch, g->me, k0);
      uint64_t first = step_start(g, d->batch, g->me, j);
      uint64_t end = DDPLUG__MIN(k1, step_start(g, d->batch, g->me, j + 1));
      uint64_t cnt = DDPLUG__MIN(end - k0, (uint64_t)DDPLUG__ARRAY_LEN(buf));
      for (uint64_t t = 0; t < cnt; t++) {
        int pad;
        buf[t] = (int64_t)sample_of(d, seq_position(g, d->batch, g->me, k0 + t, &pad));
      }
      emit(user, buf, cnt, k0 == first ? 1 : 0);
      k0 += cnt;
    }
  }
}
