/*
 * plan.c — a collective as a list of phases, and the driver that runs them.
 *
 * Every collective begins with the node handshake (descriptors + arrival,
 * mismatch check; small messages carry their data in it). With several
 * nodes, the leaders then pass one record per node around the ring and
 * publish the verdict to their node (the other ranks wait for it), so a
 * mismatch anywhere is MISMATCH everywhere and nobody moves data for it.
 * Then, by kind:
 *   one node     small: one-shot finish; large allreduce: the single-copy
 *                path when every rank's buffers can be reached directly
 *                (direct.c), else the chunked pipeline; large broadcast
 *                and allgather: the pipeline
 *   many nodes   allreduce  reduce to the leader (pipeline), ring allreduce
 *                           among leaders, broadcast from the leader;
 *                           float16/bfloat16 sum/avg/prod keep float32
 *                           partial sums from the reduce to the leader
 *                           through the ring (a float32 scratch on the
 *                           leader, float32 on the wire) and are rounded
 *                           to 16 bits once, before the broadcast
 *                broadcast  root's node: broadcast from the root; ring chain
 *                           among leaders; other nodes: broadcast from leader
 *                allgather  gather to the leader, ring allgather of node
 *                           blocks, broadcast of the whole result
 *                barrier    the handshake is the barrier
 * A node with a single rank skips its shared-memory phases (a local copy
 * where one is needed).
 *
 * Phases never block: a phase step does what it can and returns the thing
 * it waits for; ddcpu_coll_advance waits for it (ddcpu_wait) until the caller's
 * deadline. The state lives in the request, so another thread (the progress
 * thread) can resume a collective that a caller's request_wait left at its
 * timeout.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* See internal.h. Pure function of g's fixed fields and a. */
int ddcpu_coll_validate(const ddcpu_group *g, const ddplug_coll_args *a) {
  const char *kind = ddcpu_kind_name(a->kind);
  if (a->kind < DDPLUG_COLL_ALLREDUCE || a->kind > DDPLUG_COLL_BARRIER)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "collective #%llu: unknown collective kind %d",
                     (unsigned long long)a->seq, a->kind);
  if (a->mem == DDPLUG_MEM_DEVICE)
    return ddcpu_err(DDPLUG_E_UNSUPPORTED,
                     "collective #%llu (%s): plugin cpu works on host memory "
                     "only; use a device plugin (nccl) for device buffers",
                     (unsigned long long)a->seq, kind);
  if (a->kind == DDPLUG_COLL_BARRIER) return DDPLUG_OK;
  uint32_t es = ddcpu_dtype_size(a->dtype);
  if (es == 0)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT, "collective #%llu (%s): unknown dtype %d",
                     (unsigned long long)a->seq, kind, a->dtype);
  if (a->kind == DDPLUG_COLL_ALLREDUCE) {
    if (a->op < DDPLUG_OP_SUM || a->op > DDPLUG_OP_BAND)
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "collective #%llu (allreduce): unknown reduce op %d",
                       (unsigned long long)a->seq, a->op);
    if ((a->op == DDPLUG_OP_BOR || a->op == DDPLUG_OP_BAND) &&
        !ddcpu_dtype_is_int(a->dtype))
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "collective #%llu (allreduce): op %s is defined on integer "
                       "dtypes only, not %s", (unsigned long long)a->seq,
                       ddcpu_op_name(a->op), ddcpu_dtype_name(a->dtype));
  }
  if (a->kind == DDPLUG_COLL_BROADCAST && (a->root < 0 || a->root >= g->world))
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "collective #%llu (broadcast): root %d is not a rank of this "
                     "world of %d", (unsigned long long)a->seq, a->root, g->world);
  uint64_t lim = UINT64_MAX / es / (uint64_t)g->world;
  if (a->count > lim)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "collective #%llu (%s): count %llu overflows", (unsigned long long)a->seq,
                     kind, (unsigned long long)a->count);
  if (a->count > 0 && (!a->recv || (!a->send && (a->kind != DDPLUG_COLL_BROADCAST ||
                                                  a->root == g->rank))))
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "collective #%llu (%s): NULL buffer with count %llu",
                     (unsigned long long)a->seq, kind, (unsigned long long)a->count);
  return DDPLUG_OK;
}

/* ---- planning ---------------------------------------------------------------- */

/* A multi-node allreduce of a half type whose partial results must stay
 * float32 between its steps (sum, avg, prod; min/max are exact in any
 * precision and stay 16-bit). */
static int wide_sums(const ddcpu_group *g, const ddplug_coll_args *a) {
  return g->num_nodes > 1 && a->kind == DDPLUG_COLL_ALLREDUCE && a->count > 0 &&
         ddcpu_dtype_is_half(a->dtype) &&
         (a->op == DDPLUG_OP_SUM || a->op == DDPLUG_OP_AVG || a->op == DDPLUG_OP_PROD);
}

/* See internal.h. Pure function of g's fixed fields and a (validated). */
uint64_t ddcpu_coll_scratch_bytes(const ddcpu_group *g, const ddplug_coll_args *a) {
  return g->leader && wide_sums(g, a) ? a->count * (uint64_t)sizeof(float) : 0;
}

static ddcpu_phase *add(ddcpu_req *r, int kind) {
  ddcpu_phase *ph = &r->ph[r->nph++];
  memset(ph, 0, sizeof *ph);
  ph->kind = kind;
  return ph;
}

static void add_copy(ddcpu_req *r, const void *src, void *dst, uint64_t bytes) {
  if (bytes == 0 || src == dst) return;
  ddcpu_phase *ph = add(r, DDCPU_PH_COPY);
  ph->u.copy.src = src;
  ph->u.copy.dst = dst;
  ph->u.copy.bytes = bytes;
}

static ddcpu_pipe *add_pipe(ddcpu_req *r, int mode, int dtype, const void *in,
                            void *out, uint64_t elems) {
  ddcpu_phase *ph = add(r, DDCPU_PH_PIPE);
  ddcpu_pipe *p = &ph->u.pipe;
  p->mode = mode;
  p->dtype = dtype;
  p->in = in;
  p->out = out;
  p->elems = elems;
  return p;
}

static void add_conv(ddcpu_req *r, int kind, const void *src, void *dst,
                     uint64_t count, int dtype) {
  ddcpu_phase *ph = add(r, kind);
  ph->u.conv.src = src;
  ph->u.conv.dst = dst;
  ph->u.conv.count = count;
  ph->u.conv.dtype = dtype;
}

static ddcpu_ring *add_ring(ddcpu_req *r, int op, int dtype, void *buf) {
  ddcpu_phase *ph = add(r, DDCPU_PH_RING);
  ddcpu_ring *g = &ph->u.ring;
  g->op = op;
  g->dtype = dtype;
  g->buf = buf;
  return g;
}

static void plan_one_node(ddcpu_group *g, ddcpu_req *r) {
  const ddplug_coll_args *a = &r->args;
  uint32_t es = ddcpu_dtype_size(a->dtype);
  uint64_t bytes = a->count * es;
  if (g->world == 1) {
    if (a->kind == DDPLUG_COLL_ALLREDUCE || a->kind == DDPLUG_COLL_ALLGATHER ||
        a->kind == DDPLUG_COLL_BROADCAST)
      add_copy(r, a->send, a->recv, bytes);
    return;
  }
  add(r, DDCPU_PH_HANDSHAKE);
  if (a->kind == DDPLUG_COLL_BARRIER || a->count == 0) return;
  if (r->small) {
    add(r, DDCPU_PH_SMALL);
    return;
  }
  if (a->kind == DDPLUG_COLL_ALLREDUCE) {
    /* decided after the handshake, when every rank's buffers are known */
    ddcpu_direct *d = &add(r, DDCPU_PH_DIRECT)->u.direct;
    d->send = a->send;
    d->recv = a->recv;
    d->count = a->count;
    d->dtype = a->dtype;
    d->op = a->op == DDPLUG_OP_AVG ? DDPLUG_OP_SUM : a->op;
    d->divisor = a->op == DDPLUG_OP_AVG ? g->world : 0;
    r->direct = 1;
  } else if (a->kind == DDPLUG_COLL_BROADCAST) {
    if (a->root == g->rank) add_copy(r, a->send, a->recv, bytes);
    ddcpu_pipe *p = add_pipe(r, DDCPU_PIPE_BCAST, a->dtype, a->send, a->recv, a->count);
    p->src = g->local_of[a->root];
  } else {
    add_pipe(r, DDCPU_PIPE_ALLGATHER, a->dtype, a->send, a->recv, a->count);
  }
}

static void plan_many_nodes(ddcpu_group *g, ddcpu_req *r) {
  const ddplug_coll_args *a = &r->args;
  uint32_t es = ddcpu_dtype_size(a->dtype);
  uint64_t bytes = a->count * es;
  int multi = g->local_world > 1;
  add(r, DDCPU_PH_HANDSHAKE);
  add(r, DDCPU_PH_VERDICT);
  if (a->kind == DDPLUG_COLL_BARRIER || a->count == 0) return;
  unsigned char *recv = a->recv;
  if (a->kind == DDPLUG_COLL_ALLREDUCE) {
    int op = a->op == DDPLUG_OP_AVG ? DDPLUG_OP_SUM : a->op;
    /* half types: the node's partial sums and the ring work in float32,
     * in the leader's scratch r->wide (allocated at start) */
    int wide = wide_sums(g, a);
    int wdt = wide ? DDPLUG_FLOAT32 : a->dtype;
    unsigned char *acc = wide && g->leader ? (unsigned char *)r->wide : recv;
    if (multi) {
      ddcpu_pipe *p = add_pipe(r, DDCPU_PIPE_REDUCE_LEADER, wdt, a->send, acc, a->count);
      p->op = op;
      if (wide) p->in_dtype = a->dtype;
    } else if (wide) {
      add_conv(r, DDCPU_PH_WIDEN, a->send, acc, a->count, a->dtype);
    } else {
      add_copy(r, a->send, recv, bytes);
    }
    if (g->leader) {
      ddcpu_ring *rg = add_ring(r, DDCPU_RING_ALLREDUCE, wdt, acc);
      rg->count = a->count;
      rg->redop = op;
      rg->divisor = a->op == DDPLUG_OP_AVG ? g->world : 0;
      if (wide) add_conv(r, DDCPU_PH_NARROW, acc, recv, a->count, a->dtype);
    }
    if (multi) add_pipe(r, DDCPU_PIPE_BCAST, a->dtype, recv, recv, a->count)->src = 0;
  } else if (a->kind == DDPLUG_COLL_BROADCAST) {
    int rnode = g->node_of[a->root];
    if (g->node == rnode) {
      if (a->root == g->rank) add_copy(r, a->send, recv, bytes);
      if (multi)
        add_pipe(r, DDCPU_PIPE_BCAST, a->dtype, a->send, recv, a->count)->src =
            g->local_of[a->root];
      if (g->leader) {
        ddcpu_ring *rg = add_ring(r, DDCPU_RING_BCAST, a->dtype, recv);
        rg->count = a->count;
        rg->root_node = rnode;
      }
    } else {
      if (g->leader) {
        ddcpu_ring *rg = add_ring(r, DDCPU_RING_BCAST, a->dtype, recv);
        rg->count = a->count;
        rg->root_node = rnode;
      }
      if (multi) add_pipe(r, DDCPU_PIPE_BCAST, a->dtype, recv, recv, a->count)->src = 0;
    }
  } else { /* allgather */
    if (multi)
      add_pipe(r, DDCPU_PIPE_GATHER_LEADER, a->dtype, a->send, recv, a->count);
    else
      add_copy(r, a->send, recv + (uint64_t)g->rank * bytes, bytes);
    if (g->leader) {
      ddcpu_ring *rg = add_ring(r, DDCPU_RING_ALLGATHER, a->dtype, recv);
      rg->block_bytes = bytes;
    }
    if (multi)
      add_pipe(r, DDCPU_PIPE_BCAST, a->dtype, recv, recv, a->count * (uint64_t)g->world)->src = 0;
  }
}

static void plan(ddcpu_group *g, ddcpu_req *r) {
  const ddplug_coll_args *a = &r->args;
  uint64_t bytes = a->kind == DDPLUG_COLL_BARRIER ? 0 : a->count * ddcpu_dtype_size(a->dtype);
  r->small = g->num_nodes == 1 && g->has_shm && a->kind != DDPLUG_COLL_BARRIER &&
             bytes <= g->opt.small_msg_bytes;
  r->nph = r->cur = 0;
  if (g->num_nodes == 1)
    plan_one_node(g, r);
  else
    plan_many_nodes(g, r);
}

/* ---- phases ------------------------------------------------------------------ */

static ddcpu_desc my_desc(ddcpu_group *g, ddcpu_req *r) {
  ddcpu_desc d;
  ddcpu_desc_fill(&d, &r->args, g->rank);
  d.small = r->small;
  return d;
}

static void handshake_enter(ddcpu_group *g, ddcpu_req *r) {
  if (!g->has_shm) return;
  ddcpu_rank_ctl *me = &g->shm.ctl[g->local_rank];
  me->desc[r->k & 1] = my_desc(g, r);
  if (r->small) ddcpu_small_put(g, r);
  if (r->direct) ddcpu_direct_publish(g, r);
  ddcpu_ctr_post(&me->arrive, (uint32_t)r->k);
}

/* Local index j left through group_destroy (with nothing pending) before
 * arriving at r: it never will, and no collective of the group can
 * complete without it. The group fails with PEER_LOST naming it, unless it
 * has failed already: then the departure is that failure's consequence (the
 * rank that aborted, or that saw the failure, destroyed its group), which
 * stays the cause, as for a goodbye on the ring (ddcpu_ring_broken). Only a
 * death upgrades an abort to PEER_LOST. */
static int departed(ddcpu_group *g, ddcpu_req *r, int j) {
  if (ddcpu_fail_status(g)) return ddcpu_fail_report(g);
  int peer = g->local_ranks[j];
  char d[160];
  ddcpu_desc desc;
  ddcpu_desc_fill(&desc, &r->args, g->rank);
  ddcpu_desc_str(&desc, d, sizeof d);
  ddcpu_fail_set(g, DDPLUG_E_PEER_LOST, peer, g->rank,
                 "rank %d (pid %lld, node %d) closed its group (group_destroy) "
                 "before collective #%llu %s: it has left, and no collective of "
                 "this group can complete without it; every rank must issue the "
                 "same collectives before destroying its group (noticed by rank %d)",
                 peer, (long long)g->pid_of[peer], g->node,
                 (unsigned long long)r->args.seq, d, g->rank);
  return ddcpu_fail_report(g);
}

/* Wait for every local rank's arrival, then compare. Returns DDCPU_DONE, or
 * MISMATCH (one node: final), or DDCPU_BLOCKED. */
static int handshake_step(ddcpu_group *g, ddcpu_req *r, ddcpu_wait_target *wt) {
  if (!g->has_shm) {
    r->status = DDPLUG_OK;
    return DDCPU_DONE;
  }
  int wait_for = -1;
  for (int j = 0; j < g->local_world; j++) {
    ddcpu_ctr *c = &g->shm.ctl[j].arrive;
    if (ddcpu_ctr_ge(c, (uint32_t)r->k)) continue;
    /* departed is set after the rank's last arrival: re-read the counter */
    if (atomic_load(&g->shm.procs[j].departed) && !ddcpu_ctr_ge(c, (uint32_t)r->k))
      return departed(g, r, j);
    if (wait_for < 0) wait_for = j;
  }
  if (wait_for >= 0) {
    wt->kind = DDCPU_WAIT_CTR;
    wt->ctr = &g->shm.ctl[wait_for].arrive;
    wt->until = (uint32_t)r->k;
    wt->poster = wait_for;
    return DDCPU_BLOCKED;
  }
  ddcpu_desc mine = my_desc(g, r);
  int st = ddcpu_hs_compare_local(g, r->k, &mine);
  r->status = st;
  if (st != DDPLUG_OK) {
    snprintf(r->msg, sizeof r->msg, "%s", ddcpu_errmsg());
    if (g->num_nodes == 1) return st;
  }
  return DDCPU_DONE;
}

static void verdict_enter(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph) {
  if (!g->leader) return;
  ddcpu_hs_rec *own = &g->recs[g->node];
  memset(own, 0, sizeof *own);
  own->magic = DDCPU_TCP_MAGIC;
  own->node = g->node;
  own->leader = g->rank;
  own->status = r->status;
  own->index = r->k;
  own->desc = my_desc(g, r);
  if (r->status != DDPLUG_OK) snprintf(own->detail, sizeof own->detail, "%s", r->msg);
  ddcpu_ring *rg = &ph->u.ring;
  memset(rg, 0, sizeof *rg);
  rg->op = DDCPU_RING_RECORDS;
  rg->buf = (unsigned char *)g->recs;
  rg->block_bytes = sizeof(ddcpu_hs_rec);
  rg->index = r->k;
  _Atomic uint64_t *arr = g->has_shm ? g->shm.arrived : g->arrived_local;
  atomic_store(&arr[g->node], r->k);
  ddcpu_ring_init(g, rg);
}

static int verdict_step(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph,
                        ddcpu_wait_target *wt) {
  if (g->leader) {
    int st = ddcpu_ring_step(g, &ph->u.ring, wt);
    if (st != DDCPU_DONE) return st;
    st = ddcpu_hs_compare_nodes(g, g->recs, r->k);
    if (g->has_shm) {
      ddcpu_shm_hdr *h = g->shm.hdr;
      h->verdict_status = st;
      snprintf(h->verdict_msg, sizeof h->verdict_msg, "%s",
               st == DDPLUG_OK ? "" : ddcpu_errmsg());
      ddcpu_ctr_post(&h->verdict, (uint32_t)r->k);
    }
    return st == DDPLUG_OK ? DDCPU_DONE : st;
  }
  ddcpu_shm_hdr *h = g->shm.hdr;
  if (!ddcpu_ctr_ge(&h->verdict, (uint32_t)r->k)) {
    wt->kind = DDCPU_WAIT_CTR;
    wt->ctr = &h->verdict;
    wt->until = (uint32_t)r->k;
    return DDCPU_BLOCKED;
  }
  if (h->verdict_status != DDPLUG_OK)
    return ddcpu_err(h->verdict_status, "%s", h->verdict_msg);
  return DDCPU_DONE;
}

static int phase_step(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph, ddcpu_wait_target *wt) {
  if (!ph->entered) {
    ph->entered = 1;
    switch (ph->kind) {
      case DDCPU_PH_HANDSHAKE: handshake_enter(g, r); break;
      case DDCPU_PH_VERDICT: verdict_enter(g, r, ph); break;
      case DDCPU_PH_PIPE: ddcpu_pipe_init(g, &ph->u.pipe); break;
      case DDCPU_PH_DIRECT: ddcpu_direct_enter(g, r, ph); break; /* may become PIPE */
      case DDCPU_PH_RING:
        ph->u.ring.esize = ddcpu_dtype_size(ph->u.ring.dtype);
        ddcpu_ring_init(g, &ph->u.ring);
        break;
      default: break;
    }
  }
  switch (ph->kind) {
    case DDCPU_PH_HANDSHAKE: return handshake_step(g, r, wt);
    case DDCPU_PH_VERDICT: return verdict_step(g, r, ph, wt);
    case DDCPU_PH_SMALL: ddcpu_small_finish(g, r); return DDCPU_DONE;
    case DDCPU_PH_PIPE: return ddcpu_pipe_step(g, &ph->u.pipe, wt);
    case DDCPU_PH_DIRECT: return ddcpu_direct_step(g, r, ph, wt);
    case DDCPU_PH_RING: return ddcpu_ring_step(g, &ph->u.ring, wt);
    case DDCPU_PH_COPY:
      memmove(ph->u.copy.dst, ph->u.copy.src, ph->u.copy.bytes);
      return DDCPU_DONE;
    case DDCPU_PH_WIDEN:
      ddcpu_half_widen(ph->u.conv.dtype, ph->u.conv.dst, ph->u.conv.src, ph->u.conv.count);
      return DDCPU_DONE;
    case DDCPU_PH_NARROW:
      ddcpu_half_narrow(ph->u.conv.dtype, ph->u.conv.dst, ph->u.conv.src, ph->u.conv.count);
      return DDCPU_DONE;
    default: return ddcpu_err(DDPLUG_E_INTERNAL, "unknown phase %d", ph->kind);
  }
}

static int advance(ddcpu_group *g, ddcpu_req *r, uint64_t deadline_ns) {
  g->exec_deadline = deadline_ns;
  if (!r->planned) {
    plan(g, r);
    r->planned = 1;
    atomic_store(&g->exec_k, r->k);
  }
  /* A failed group starts nothing; a started collective keeps going as
   * long as it can progress (peers that arrived before an abort still
   * finish it), and reports the failure only when it has to wait. */
  if (r->cur == 0 && !r->ph[0].entered) {
    int fs = ddcpu_fail_report(g);
    if (fs) return fs;
  }
  for (;;) {
    if (r->cur >= r->nph) return DDPLUG_OK;
    ddcpu_phase *ph = &r->ph[r->cur];
    ddcpu_wait_target wt;
    memset(&wt, 0, sizeof wt);
    wt.poster = -1;
    int st = phase_step(g, r, ph, &wt);
    if (st == DDCPU_DONE) {
      r->cur++;
      continue;
    }
    if (st == DDCPU_BLOCKED) {
      int w = ddcpu_wait(g, &wt, deadline_ns);
      if (w == DDCPU_AGAIN) return DDCPU_AGAIN;
      if (w > 0) return ddcpu_fail_status(g) ? ddcpu_fail_settle(g, deadline_ns) : w;
      continue;
    }
    if (st > 0 && st != DDPLUG_E_MISMATCH) {
      /* Anything but a mismatch leaves the group unusable (a ring stream
       * out of step would carry the next collective's data into the wrong
       * place): fail the group, so that this rank starts nothing more and
       * every other rank learns it (shared memory, the ring). */
      if (!ddcpu_fail_status(g)) {
        char why[DDCPU_MSG_MAX];
        snprintf(why, sizeof why, "%s", ddcpu_errmsg());
        ddcpu_fail_set(g, st, g->rank, g->rank,
                       "rank %d stopped at collective #%llu: %s; the group cannot "
                       "run further collectives: destroy it and create a new one",
                       g->rank, (unsigned long long)r->args.seq, why);
      }
      return ddcpu_fail_report(g);
    }
    return st;
  }
}

/* See internal.h. Executor only. A collective that fails after this rank
 * arrived at a direct phase hands its buffers back only once no peer
 * writes into them any more. */
int ddcpu_coll_advance(ddcpu_group *g, ddcpu_req *r, uint64_t deadline_ns) {
  int st = advance(g, r, deadline_ns);
  if (st > 0 && r->direct && r->nph > 0 && r->ph[0].entered) ddcpu_direct_withdraw(g, r);
  return st;
}
