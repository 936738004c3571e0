/*
 * shm_coll.c — collectives inside a node, through the node's segment.
 *
 * Small messages (up to small_msg_bytes per rank) take a one-shot path: at
 * the handshake each rank copies its data into its own small slot (double
 * buffered by the parity of the collective index) and publishes its arrival;
 * once every rank has arrived, each rank reduces (or copies) all slots
 * itself, in local-index order, so every rank gets the same bits. One
 * synchronisation per collective.
 *
 * Larger messages run a chunked pipeline over `slots` staging slots of one
 * chunk per local rank. For chunk a (slot a mod slots) a rank:
 *   1. copies its chunk of input into its staging area (copy-in), once every
 *      rank has finished with the chunk that used the slot before (counter
 *      copied_out), and posts copied_in;
 *   2. when every rank has copied in (copied_in), reduces its own slice of
 *      the chunk across all staging areas, in place in its own area, and
 *      posts reduced;
 *   3. when every rank has reduced (reduced), copies every rank's reduced
 *      slice into its output (copy-out) and posts copied_out.
 * The chunk is small enough to stay in cache between the steps, so memory
 * traffic is the input read plus the output written, 2·n·S for n ranks,
 * instead of copy-in/copy-out's ~5·n·S. Each rank reduces only 1/n of
 * every chunk. Ranks run ahead of one another by up to `slots` chunks.
 * The same engine, with roles switched off, does reduce-to-leader,
 * broadcast from one rank, allgather and gather-to-leader (the building
 * blocks of the hierarchical algorithms in coll.c). Reduce-to-leader of a
 * float16/bfloat16 input (in_dtype) runs in float32: copy-in widens, the
 * leader receives float32 partial sums, which the ring between nodes
 * keeps in float32 (rounded once, at the end, in coll.c).
 *
 * Counters are absolute chunk numbers (the group's chunk clock), identical
 * on every rank of the node because every rank runs the same phases.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <string.h>

#include "internal.h"

static inline unsigned char *stage(ddcpu_group *g, uint32_t a, int local) {
  uint32_t slot = a & (g->opt.slots - 1); /* slots is a power of two */
  return g->shm.stage +
         ((uint64_t)slot * (uint64_t)g->local_world + (uint64_t)local) *
             g->opt.chunk_bytes;
}

unsigned char *ddcpu_small_slot(ddcpu_group *g, int local, uint64_t k) {
  return g->shm.small +
         ((uint64_t)local * 2 + (k & 1)) * g->opt.small_msg_bytes;
}

/* ---- one-shot small-message path ----------------------------------------- */

/* At the handshake: put this rank's contribution in its small slot. */
void ddcpu_small_put(ddcpu_group *g, ddcpu_req *r) {
  const ddplug_coll_args *a = &r->args;
  uint64_t bytes = a->count * ddcpu_dtype_size(a->dtype);
  if (bytes == 0) return;
  unsigned char *mine = ddcpu_small_slot(g, g->local_rank, r->k);
  if (a->kind == DDPLUG_COLL_ALLREDUCE || a->kind == DDPLUG_COLL_ALLGATHER ||
      (a->kind == DDPLUG_COLL_BROADCAST && a->root == g->rank))
    ddcpu_copy(mine, a->send, bytes, 0);
}

/* After every rank arrived and the descriptors matched. */
void ddcpu_small_finish(ddcpu_group *g, ddcpu_req *r) {
  const ddplug_coll_args *a = &r->args;
  uint32_t es = ddcpu_dtype_size(a->dtype);
  uint64_t bytes = a->count * es;
  if (bytes == 0) return;
  switch (a->kind) {
    case DDPLUG_COLL_ALLREDUCE: {
      const void *srcs[DDCPU_MAX_LOCAL];
      for (int j = 0; j < g->local_world; j++) srcs[j] = ddcpu_small_slot(g, j, r->k);
      ddcpu_reduce_n(a->dtype, a->op, a->recv, srcs, g->local_world, a->count,
                     a->op == DDPLUG_OP_AVG ? g->world : 0);
      break;
    }
    case DDPLUG_COLL_BROADCAST:
      if (a->root == g->rank) {
        if (a->send != a->recv) memmove(a->recv, a->send, bytes);
      } else {
        ddcpu_copy(a->recv, ddcpu_small_slot(g, g->local_of[a->root], r->k), bytes, 0);
      }
      break;
    case DDPLUG_COLL_ALLGATHER:
      for (int j = 0; j < g->local_world; j++) {
        unsigned char *dst = (unsigned char *)a->recv +
                             (uint64_t)g->local_ranks[j] * bytes;
        if (j == g->local_rank) {
          if ((const void *)dst != a->send) memmove(dst, a->send, bytes);
        } else {
          ddcpu_copy(dst, ddcpu_small_slot(g, j, r->k), bytes, 0);
        }
      }
      break;
    default: break;
  }
}

/* ---- chunked pipeline ------------------------------------------------------ */

static int copies_in(const ddcpu_group *g, const ddcpu_pipe *p) {
  return p->mode != DDCPU_PIPE_BCAST || p->src == g->local_rank;
}
static int reduces(const ddcpu_pipe *p) {
  return p->mode == DDCPU_PIPE_ALLREDUCE || p->mode == DDCPU_PIPE_REDUCE_LEADER;
}
static int copies_out(const ddcpu_group *g, const ddcpu_pipe *p) {
  switch (p->mode) {
    case DDCPU_PIPE_ALLREDUCE:
    case DDCPU_PIPE_ALLGATHER: return 1;
    case DDCPU_PIPE_BCAST: return p->src != g->local_rank;
    default: return g->local_rank == 0;
  }
}

/* Elements in chunk c. */
static uint64_t chunk_len(const ddcpu_pipe *p, uint64_t c) {
  uint64_t start = c * p->chunk_elems;
  return DDCPU_MIN(p->chunk_elems, p->elems - start);
}

/* Slice of a chunk of m elements owned by local index k: [*off, *off+*len).
 * Slices are multiples of 64 bytes so ranks never write the same line. */
static void slice(const ddcpu_group *g, const ddcpu_pipe *p, uint64_t m, int k,
                  uint64_t *off, uint64_t *len) {
  uint64_t unit = 64 / p->esize;
  uint64_t per = (m + (uint64_t)g->local_world - 1) / (uint64_t)g->local_world;
  per = (per + unit - 1) / unit * unit;
  uint64_t s = DDCPU_MIN(m, per * (uint64_t)k);
  uint64_t e = DDCPU_MIN(m, s + per);
  *off = s;
  *len = e - s;
}

/* First local rank whose counter `which` (offset into ddcpu_rank_ctl) is
 * below v, or NULL. only >= 0 restricts the check to that rank. */
static ddcpu_ctr *behind(ddcpu_group *g, size_t which, uint32_t v, int only) {
  for (int k = 0; k < g->local_world; k++) {
    if (only >= 0 && k != only) continue;
    ddcpu_ctr *c = (ddcpu_ctr *)((char *)&g->shm.ctl[k] + which);
    if (!ddcpu_ctr_ge(c, v)) return c;
  }
  return NULL;
}
#define COPIED_IN offsetof(ddcpu_rank_ctl, copied_in)
#define REDUCED offsetof(ddcpu_rank_ctl, reduced)
#define COPIED_OUT offsetof(ddcpu_rank_ctl, copied_out)

/* What copy-out of absolute chunk a waits for. */
static ddcpu_ctr *out_blocker(ddcpu_group *g, const ddcpu_pipe *p, uint32_t a) {
  if (reduces(p)) return behind(g, REDUCED, a + 1, -1);
  if (p->mode == DDCPU_PIPE_BCAST) return behind(g, COPIED_IN, a + 1, p->src);
  return behind(g, COPIED_IN, a + 1, -1);
}

void ddcpu_pipe_init(ddcpu_group *g, ddcpu_pipe *p) {
  p->esize = ddcpu_dtype_size(p->dtype);
  p->chunk_elems = g->opt.chunk_bytes / p->esize;
  p->nchunks = (p->elems + p->chunk_elems - 1) / p->chunk_elems;
  uint64_t out_bytes = p->elems * p->esize *
                       (p->mode == DDCPU_PIPE_ALLGATHER || p->mode == DDCPU_PIPE_GATHER_LEADER
                            ? (uint64_t)g->local_world : 1);
  p->stream = g->opt.nt_bytes > 0 && out_bytes >= g->opt.nt_bytes;
  p->base = g->chunk_clock;
  g->chunk_clock += (uint32_t)p->nchunks;
  p->copied_in = p->reduced = p->copied_out = 0;
}

/* Copy this rank's chunk of input into its staging area. When reducing,
 * its own slice is not needed there: only this rank reads it, straight from
 * the input (reduce_slice), which saves 1/n of the copy. */
static void copy_in(ddcpu_group *g, ddcpu_pipe *p, uint64_t c, uint32_t a) {
  uint64_t m = chunk_len(p, c);
  uint32_t es = p->esize;
  unsigned char *dst = stage(g, a, g->local_rank);
  if (p->in_dtype) {
    /* a half-type input reduced in float32: widen the whole chunk (own
     * slice included: reduce_slice reads it from here) */
    const unsigned char *half = p->in + c * p->chunk_elems * 2;
    ddcpu_half_widen(p->in_dtype, (float *)(void *)dst, half, m);
    return;
  }
  const unsigned char *src = p->in + c * p->chunk_elems * es;
  if (!reduces(p)) {
    ddcpu_copy(dst, src, m * es, 0);
    return;
  }
  uint64_t off, len;
  slice(g, p, m, g->local_rank, &off, &len);
  ddcpu_copy(dst, src, off * es, 0);
  ddcpu_copy(dst + (off + len) * es, src + (off + len) * es, (m - off - len) * es, 0);
}

static void reduce_slice(ddcpu_group *g, ddcpu_pipe *p, uint64_t c, uint32_t a) {
  uint64_t m = chunk_len(p, c), off, len;
  slice(g, p, m, g->local_rank, &off, &len);
  if (len == 0) return;
  const void *srcs[DDCPU_MAX_LOCAL];
  for (int k = 0; k < g->local_world; k++)
    srcs[k] = stage(g, a, k) + off * p->esize;
  /* our own contribution comes from the input (see copy_in), unless the
   * input had to be widened */
  if (!p->in_dtype) srcs[g->local_rank] = p->in + (c * p->chunk_elems + off) * p->esize;
  ddcpu_reduce_n(p->dtype, p->op, stage(g, a, g->local_rank) + off * p->esize,
                 srcs, g->local_world, len, p->divisor);
}

/* Copy to the user's output. Large outputs are written with non-temporal
 * stores: no read-for-ownership of lines we overwrite entirely, and the
 * output does not evict the staging slots from the cache. */
static void copy_out(ddcpu_group *g, ddcpu_pipe *p, uint64_t c, uint32_t a) {
  uint64_t m = chunk_len(p, c);
  uint64_t first = c * p->chunk_elems;
  uint32_t es = p->esize;
  int nt = p->stream;
  switch (p->mode) {
    case DDCPU_PIPE_ALLREDUCE:
    case DDCPU_PIPE_REDUCE_LEADER:
      for (int i = 0; i < g->local_world; i++) {
        /* start with our own slice, then the others in turn */
        int k = (g->local_rank + i) % g->local_world;
        uint64_t off, len;
        slice(g, p, m, k, &off, &len);
        if (len)
          ddcpu_copy(p->out + (first + off) * es, stage(g, a, k) + off * es, len * es, nt);
      }
      break;
    case DDCPU_PIPE_BCAST:
      ddcpu_copy(p->out + first * es, stage(g, a, p->src), m * es, nt);
      break;
    default: /* ALLGATHER, GATHER_LEADER: out is the whole receive buffer */
      for (int k = 0; k < g->local_world; k++) {
        uint64_t at = (uint64_t)g->local_ranks[k] * p->elems + first;
        ddcpu_copy(p->out + at * es, stage(g, a, k), m * es, nt);
      }
      break;
  }
  ddcpu_copy_fence(nt);
}

/* See internal.h: run the pipeline as far as it goes without waiting. */
int ddcpu_pipe_step(ddcpu_group *g, ddcpu_pipe *p, ddcpu_wait_target *wt) {
  const uint64_t ns = g->opt.slots;
  const int in_role = copies_in(g, p), red_role = reduces(p),
            out_role = copies_out(g, p);
  ddcpu_rank_ctl *me = &g->shm.ctl[g->local_rank];
  for (;;) {
    int moved = 0;
    /* oldest first: finish a chunk, then reduce, then start a new one */
    if (p->copied_out < p->reduced) {
      uint32_t a = p->base + (uint32_t)p->copied_out;
      if (!out_role || !out_blocker(g, p, a)) {
        if (out_role) copy_out(g, p, p->copied_out, a);
        ddcpu_ctr_post(&me->copied_out, a + 1);
        p->copied_out++;
        moved = 1;
      }
    }
    if (p->reduced < p->copied_in) {
      uint32_t a = p->base + (uint32_t)p->reduced;
      if (!red_role) {
        p->reduced = p->copied_in;
        moved = 1;
      } else if (!behind(g, COPIED_IN, a + 1, -1)) {
        reduce_slice(g, p, p->reduced, a);
        ddcpu_ctr_post(&me->reduced, a + 1);
        p->reduced++;
        moved = 1;
      }
    }
    if (p->copied_in < p->nchunks && p->copied_in - p->copied_out < ns) {
      uint32_t a = p->base + (uint32_t)p->copied_in;
      if (!in_role) {
        p->copied_in++;
        moved = 1;
      } else if (!behind(g, COPIED_OUT, a + 1 - (uint32_t)ns, -1)) {
        copy_in(g, p, p->copied_in, a);
        ddcpu_ctr_post(&me->copied_in, a + 1);
        p->copied_in++;
        moved = 1;
      }
    }
    if (p->copied_out == p->nchunks) return DDCPU_DONE;
    if (moved) continue;
    /* blocked: wait for the oldest stage's condition */
    ddcpu_ctr *b = NULL;
    uint32_t v = 0;
    if (p->copied_out < p->reduced) {
      v = p->base + (uint32_t)p->copied_out + 1;
      b = out_blocker(g, p, v - 1);
    } else if (p->reduced < p->copied_in) {
      v = p->base + (uint32_t)p->reduced + 1;
      b = behind(g, COPIED_IN, v, -1);
    } else {
      v = p->base + (uint32_t)p->copied_in + 1 - (uint32_t)ns;
      b = behind(g, COPIED_OUT, v, -1);
    }
    if (!b) continue; /* it moved meanwhile */
    wt->kind = DDCPU_WAIT_CTR;
    wt->ctr = b;
    wt->until = v;
    return DDCPU_BLOCKED;
  }
}
