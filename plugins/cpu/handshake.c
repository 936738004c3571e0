/*
 * handshake.c — every collective starts with a handshake that compares what
 * each rank called: (seq, kind, count, dtype, op, root). Inside a node each
 * rank publishes its descriptor in shared memory with its arrival; between
 * nodes the leaders pass one record per node around the ring. Every rank
 * compares against the same reference (local index 0, then node 0), so all
 * ranks reach the same verdict and name the same two ranks: MISMATCH on all
 * ranks instead of garbage or a hang, and the group stays usable because
 * nobody moved data for the mismatched collective.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

void ddcpu_desc_fill(ddcpu_desc *d, const ddplug_coll_args *a, int rank) {
  memset(d, 0, sizeof *d);
  d->seq = a->seq;
  d->count = a->count;
  d->kind = a->kind;
  d->dtype = a->dtype;
  d->op = a->kind == DDPLUG_COLL_ALLREDUCE ? a->op : 0;
  d->root = a->kind == DDPLUG_COLL_BROADCAST ? a->root : 0;
  d->rank = rank;
}

void ddcpu_desc_str(const ddcpu_desc *d, char *out, size_t cap) {
  switch (d->kind) {
    case DDPLUG_COLL_ALLREDUCE:
      snprintf(out, cap, "allreduce(count=%llu, %s, %s)",
               (unsigned long long)d->count, ddcpu_dtype_name(d->dtype),
               ddcpu_op_name(d->op));
      break;
    case DDPLUG_COLL_BROADCAST:
      snprintf(out, cap, "broadcast(count=%llu, %s, root=%d)",
               (unsigned long long)d->count, ddcpu_dtype_name(d->dtype), d->root);
      break;
    case DDPLUG_COLL_ALLGATHER:
      snprintf(out, cap, "allgather(count=%llu, %s)",
               (unsigned long long)d->count, ddcpu_dtype_name(d->dtype));
      break;
    case DDPLUG_COLL_BARRIER: snprintf(out, cap, "barrier()"); break;
    default: snprintf(out, cap, "collective kind %d", d->kind); break;
  }
}

static int same(const ddcpu_desc *a, const ddcpu_desc *b) {
  return a->seq == b->seq && a->kind == b->kind && a->count == b->count &&
         a->dtype == b->dtype && a->op == b->op && a->root == b->root;
}

static int mismatch(const ddcpu_desc *ref, const ddcpu_desc *other) {
  char a[160], b[160];
  ddcpu_desc_str(ref, a, sizeof a);
  ddcpu_desc_str(other, b, sizeof b);
  if (ref->seq != other->seq)
    return ddcpu_err(DDPLUG_E_MISMATCH,
                     "collectives differ across ranks: rank %d is at collective "
                     "#%llu (%s) but rank %d at #%llu (%s); every rank must issue "
                     "the same collectives in the same order",
                     ref->rank, (unsigned long long)ref->seq, a, other->rank,
                     (unsigned long long)other->seq, b);
  return ddcpu_err(DDPLUG_E_MISMATCH,
                   "collective #%llu differs across ranks: rank %d called %s but "
                   "rank %d called %s; every rank must issue the same collectives "
                   "in the same order with the same count, dtype, op and root",
                   (unsigned long long)ref->seq, ref->rank, a, other->rank, b);
}

/* See internal.h. Reads the descriptors of collective index k of every local
 * rank (all arrived, so they are stable). */
int ddcpu_hs_compare_local(ddcpu_group *g, uint64_t k, const ddcpu_desc *mine) {
  if (!g->has_shm) return DDPLUG_OK;
  const ddcpu_desc *ref = &g->shm.ctl[0].desc[k & 1];
  for (int j = 0; j < g->local_world; j++) {
    const ddcpu_desc *d = j == g->local_rank ? mine : &g->shm.ctl[j].desc[k & 1];
    if (!same(ref, d)) return mismatch(ref, d);
  }
  return DDPLUG_OK;
}

/* See internal.h. recs[node] holds every node's record. */
int ddcpu_hs_compare_nodes(ddcpu_group *g, const ddcpu_hs_rec *recs, uint64_t k) {
  for (int n = 0; n < g->num_nodes; n++) {
    if (recs[n].magic != DDCPU_TCP_MAGIC || recs[n].index != k ||
        recs[n].node != n)
      return ddcpu_err(DDPLUG_E_INTERNAL,
                       "ring handshake of collective #%llu: node %d's record "
                       "(from rank %d, its leader) is corrupt: the ring "
                       "connection's stream is out of step",
                       (unsigned long long)recs[g->node].desc.seq, n, g->leaders[n]);
  }
  for (int n = 0; n < g->num_nodes; n++)
    if (recs[n].status != DDPLUG_OK) {
      char detail[DDCPU_MSG_MAX];
      snprintf(detail, sizeof detail, "%s", recs[n].detail);
      return ddcpu_err(recs[n].status, "%s", detail);
    }
  for (int n = 1; n < g->num_nodes; n++)
    if (!same(&recs[0].desc, &recs[n].desc))
      return mismatch(&recs[0].desc, &recs[n].desc);
  return DDPLUG_OK;
}

/* Append "a, b-c, d" for a sorted rank list. */
static void append_ranks(char *out, size_t cap, const int *r, int n) {
  size_t len = strlen(out);
  for (int i = 0; i < n && len < cap; i++) {
    int j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    if (j > i + 1)
      len += (size_t)snprintf(out + len, cap - len, "%s%d-%d", i ? ", " : "", r[i], r[j]);
    else if (j == i + 1)
      len += (size_t)snprintf(out + len, cap - len, "%s%d, %d", i ? ", " : "", r[i], r[j]);
    else
      len += (size_t)snprintf(out + len, cap - len, "%s%d", i ? ", " : "", r[i]);
    i = j;
  }
}

/* When this node's leader's ring phase of collective k still waits: which
 * neighbouring leader went silent, and for how long ("" when none). Every
 * rank of the node can tell (the watch is in shared memory). */
static void ring_stall(ddcpu_group *g, uint64_t k, uint64_t exec_k, char *out, size_t cap) {
  out[0] = '\0';
  if (g->num_nodes < 2 || exec_k != k || (!g->leader && !g->has_shm)) return;
  ddcpu_ring_watch *w = ddcpu_ring_watch_of(g);
  int want_rx = (int)atomic_load(&w->want_rx), want_tx = (int)atomic_load(&w->want_tx);
  if (atomic_load(&w->k) != k || (!want_rx && !want_tx)) return;
  uint64_t now = ddcpu_now_ns();
  double rx = (double)(now - DDCPU_MIN(now, atomic_load(&w->rx_ns))) / 1e9;
  double tx = (double)(now - DDCPU_MIN(now, atomic_load(&w->tx_ns))) / 1e9;
  int L = g->num_nodes, pn = (g->node + L - 1) % L, nn = (g->node + 1) % L;
  size_t len = g->leader ? (size_t)snprintf(out, cap, "the ring connection between nodes "
                                            "stalled:")
                          : (size_t)snprintf(out, cap, "the ring connection of this node's "
                                             "leader (rank %d) to the other nodes stalled:",
                                             g->local_ranks[0]);
  if (want_rx && len < cap)
    len += (size_t)snprintf(out + len, cap - len, " nothing received from rank %d "
                            "(leader of node %d) for %.1f s", g->leaders[pn], pn, rx);
  if (want_tx && len < cap)
    len += (size_t)snprintf(out + len, cap - len, "%s nothing could be sent to rank %d "
                            "(leader of node %d) for %.1f s", want_rx ? ";" : "",
                            g->leaders[nn], nn, tx);
  if (len < cap)
    snprintf(out + len, cap - len, " (is the network between the nodes cut, or that "
             "rank frozen?)");
}

/* See internal.h. Reads counters concurrently with the executor (atomics). */
void ddcpu_hs_missing(ddcpu_group *g, uint64_t k, char *out, size_t cap) {
  int *miss = NULL, nmiss = 0;
  int local[512], far[512], nfar = 0;
  miss = local;
  out[0] = '\0';
  uint64_t exec_k = atomic_load(&g->exec_k);
  if (exec_k < k) {
    snprintf(out, cap, "it has not started: this rank is still executing "
             "collective index %llu ahead of it", (unsigned long long)exec_k);
    return;
  }
  if (g->has_shm) {
    for (int j = 0; j < g->local_world && nmiss < 512; j++)
      if (!ddcpu_ctr_ge(&g->shm.ctl[j].arrive, (uint32_t)k))
        miss[nmiss++] = g->local_ranks[j];
  }
  if (g->num_nodes > 1) {
    _Atomic uint64_t *arr = g->has_shm ? g->shm.arrived : g->arrived_local;
    for (int n = 0; n < g->num_nodes; n++) {
      if (n == g->node) continue;
      if (atomic_load(&arr[n]) >= k) continue;
      for (int i = 0; i < g->node_size[n] && nfar < 512; i++)
        far[nfar++] = g->node_ranks[n][i];
    }
  }
  /* sort (small lists) */
  for (int a = 1; a < nmiss; a++)
    for (int b = a; b > 0 && miss[b - 1] > miss[b]; b--) {
      int t = miss[b]; miss[b] = miss[b - 1]; miss[b - 1] = t;
    }
  for (int a = 1; a < nfar; a++)
    for (int b = a; b > 0 && far[b - 1] > far[b]; b--) {
      int t = far[b]; far[b] = far[b - 1]; far[b - 1] = t;
    }
  size_t len = 0;
  if (nmiss) {
    len += (size_t)snprintf(out + len, cap - len, "rank%s ", nmiss > 1 ? "s" : "");
    append_ranks(out, cap, miss, nmiss);
    len = strlen(out);
    len += (size_t)snprintf(out + len, cap - len, " %s not arrived",
                            nmiss > 1 ? "have" : "has");
  }
  if (nfar && len < cap) {
    len += (size_t)snprintf(out + len, cap - len, "%sranks on other nodes not "
                            "heard from yet: ", nmiss ? "; " : "");
    append_ranks(out, cap, far, nfar);
  }
  char stall[DDCPU_MSG_MAX];
  ring_stall(g, k, exec_k, stall, sizeof stall);
  if (nmiss || nfar) {
    len = strlen(out);
    if (*stall && len < cap) snprintf(out + len, cap - len, "; %s", stall);
    return;
  }
  if (*stall) {
    snprintf(out, cap, "every rank has arrived; %s", stall);
    return;
  }
  if (g->num_nodes > 1 && !g->leader)
    snprintf(out, cap, "every rank has arrived; waiting for this node's leader, "
             "rank %d, which exchanges the data with the other nodes",
             g->local_ranks[0]);
  else
    snprintf(out, cap, "every rank has arrived; the data transfer is still "
             "in progress");
}
