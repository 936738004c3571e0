/*
 * ring.c — collectives among node leaders over the TCP ring.
 *
 * L leaders in node order; leader i sends to i+1 and receives from i-1.
 *   allreduce  reduce-scatter then allgather, 2(L-1) steps over L segments
 *              of the buffer: in step t the leader sends segment S(t) and
 *              receives R(t); reduce-scatter steps add what they receive
 *              into the buffer (through a scratch chunk), allgather steps
 *              store it. S(t) = R(t-1), so a step's send may run as far as
 *              the previous step's receive has finished: the whole ring is
 *              pipelined in tcp_chunk_bytes units, not step by step.
 *              AVG divides each final chunk once, before it is sent on.
 *              float16/bfloat16 sums come here as float32 (the leader's
 *              scratch, see coll.c): the ring adds and divides in float32
 *              and never rounds to 16 bits.
 *   allgather  L-1 allgather steps over node segments, where a node's
 *              segment is its ranks' blocks in rank order (ranks of a node
 *              need not be contiguous).
 *   records    the same over one fixed-size record per node (handshake).
 *   broadcast  a chain from the root's node: receive, forward what has
 *              arrived, until the node before the root.
 * Sockets are non-blocking; a step moves as many bytes as the kernel takes
 * and the executor waits in poll() (with the liveness descriptors) when
 * neither direction can move.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "internal.h"

static int mod(int a, int L) { return ((a % L) + L) % L; }

static int sends(const ddcpu_group *g, const ddcpu_ring *r) {
  if (r->op != DDCPU_RING_BCAST) return 1;
  int L = g->num_nodes;
  return mod(g->node - r->root_node, L) < L - 1;
}
static int recvs(const ddcpu_group *g, const ddcpu_ring *r) {
  return r->op != DDCPU_RING_BCAST || g->node != r->root_node;
}

static int send_seg(const ddcpu_group *g, const ddcpu_ring *r, int t) {
  int L = g->num_nodes, me = g->node;
  if (r->op == DDCPU_RING_BCAST) return 0;
  if (r->op == DDCPU_RING_ALLREDUCE && t >= L - 1) return mod(me + 1 - (t - (L - 1)), L);
  return mod(me - t, L);
}
static int recv_seg(const ddcpu_group *g, const ddcpu_ring *r, int t) {
  int L = g->num_nodes, me = g->node;
  if (r->op == DDCPU_RING_BCAST) return 0;
  if (r->op == DDCPU_RING_ALLREDUCE && t >= L - 1) return mod(me - (t - (L - 1)), L);
  return mod(me - t - 1, L);
}
static int reduces_at(const ddcpu_group *g, const ddcpu_ring *r, int t) {
  return r->op == DDCPU_RING_ALLREDUCE && t < g->num_nodes - 1;
}

static uint64_t seg_elem_start(const ddcpu_group *g, const ddcpu_ring *r, int seg) {
  return r->count * (uint64_t)seg / (uint64_t)g->num_nodes;
}

static uint64_t seg_bytes(const ddcpu_group *g, const ddcpu_ring *r, int seg) {
  switch (r->op) {
    case DDCPU_RING_ALLREDUCE:
      return (seg_elem_start(g, r, seg + 1) - seg_elem_start(g, r, seg)) * r->esize;
    case DDCPU_RING_ALLGATHER:
      return (uint64_t)g->node_size[seg] * r->block_bytes;
    case DDCPU_RING_RECORDS: return r->block_bytes;
    default: return r->count * r->esize;
  }
}

/* Pointer to byte `off` of segment seg and how many bytes follow
 * contiguously. */
static unsigned char *span(const ddcpu_group *g, const ddcpu_ring *r, int seg,
                           uint64_t off, uint64_t *len) {
  uint64_t total = seg_bytes(g, r, seg);
  switch (r->op) {
    case DDCPU_RING_ALLREDUCE:
      *len = total - off;
      return r->buf + seg_elem_start(g, r, seg) * r->esize + off;
    case DDCPU_RING_ALLGATHER: {
      uint64_t idx = off / r->block_bytes, in = off % r->block_bytes;
      int rank = g->node_ranks[seg][idx];
      *len = r->block_bytes - in;
      return r->buf + (uint64_t)rank * r->block_bytes + in;
    }
    case DDCPU_RING_RECORDS:
      *len = total - off;
      return r->buf + (uint64_t)seg * r->block_bytes + off;
    default:
      *len = total - off;
      return r->buf + off;
  }
}

void ddcpu_ring_init(ddcpu_group *g, ddcpu_ring *r) {
  int L = g->num_nodes;
  r->esize = r->dtype ? ddcpu_dtype_size(r->dtype) : 1;
  r->nsteps = r->op == DDCPU_RING_ALLREDUCE ? 2 * (L - 1)
              : r->op == DDCPU_RING_BCAST   ? 1
                                         : L - 1;
  r->send_step = sends(g, r) ? 0 : r->nsteps;
  r->recv_step = recvs(g, r) ? 0 : r->nsteps;
  r->sent = r->rcvd = r->red = r->fill = 0;
  r->active = 1;
  g->ring_active = 1;
  ddcpu_ring_watch *w = ddcpu_ring_watch_of(g);
  uint64_t now = ddcpu_now_ns();
  atomic_store(&w->rx_ns, now);
  atomic_store(&w->tx_ns, now);
  atomic_store(&w->want_rx, r->recv_step < r->nsteps);
  atomic_store(&w->want_tx, r->send_step < r->nsteps);
  atomic_store(&w->k, atomic_load(&g->exec_k));
}

/* How far the send of step t may go: the whole segment, or as far as the
 * receive it forwards has finished. */
static uint64_t send_limit(const ddcpu_group *g, const ddcpu_ring *r, int t) {
  uint64_t total = seg_bytes(g, r, send_seg(g, r, t));
  if (r->op == DDCPU_RING_BCAST)
    return g->node == r->root_node || r->recv_step >= r->nsteps ? total : r->rcvd;
  if (t == 0 || r->recv_step > t - 1) return total;
  return reduces_at(g, r, t - 1) ? r->red : r->rcvd;
}

/* The failure, or DDCPU_AGAIN when the caller's deadline comes before the
 * cause is settled (the step is retried; nothing moved). */
static int lost(ddcpu_group *g, int node, const char *what, int err) {
  return ddcpu_ring_broken(g, node, what, err, g->exec_deadline);
}

static int do_send(ddcpu_group *g, ddcpu_ring *r, int *moved) {
  while (r->send_step < r->nsteps) {
    int seg = send_seg(g, r, r->send_step);
    uint64_t total = seg_bytes(g, r, seg), limit = send_limit(g, r, r->send_step);
    while (r->sent < limit) {
      uint64_t len;
      unsigned char *p = span(g, r, seg, r->sent, &len);
      len = DDCPU_MIN(len, limit - r->sent);
      ssize_t n = send(g->next_fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        r->sent += (uint64_t)n;
        *moved = 1;
        atomic_store_explicit(&ddcpu_ring_watch_of(g)->tx_ns, ddcpu_now_ns(), memory_order_relaxed);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
      return lost(g, (g->node + 1) % g->num_nodes,
                  "sending to it failed (connection closed)", n < 0 ? errno : 0);
    }
    if (r->sent < total) return 0; /* waiting for our own receive */
    r->send_step++;
    r->sent = 0;
    *moved = 1;
    if (!sends(g, r)) r->send_step = r->nsteps;
  }
  return 0;
}

/* The connection from the previous leader ended where this collective's
 * first record from it belongs, after exactly a goodbye record: that leader
 * closed its group between collectives (tcp.c sends the goodbye forward too,
 * and a collective's first bytes on the ring are its handshake record,
 * which is longer). The idle progress thread reads such a goodbye when it
 * comes first; a collective that started before it did must reach the same
 * verdict, not blame a lost connection. */
static int said_goodbye(const ddcpu_group *g, const ddcpu_ring *r) {
  if (r->op != DDCPU_RING_RECORDS || r->recv_step != 0 || r->rcvd != sizeof(ddcpu_ctl_msg))
    return 0;
  ddcpu_ctl_msg m;
  uint64_t len;
  memcpy(&m, span(g, r, recv_seg(g, r, 0), 0, &len), sizeof m);
  return m.magic == DDCPU_TCP_MAGIC && m.type == DDCPU_MSG_BYE && m.run_hash == g->run_hash;
}

static int recv_bytes(ddcpu_group *g, const ddcpu_ring *r, void *p, uint64_t len,
                      uint64_t *got) {
  *got = 0;
  for (;;) {
    ssize_t n = recv(g->prev_fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      *got = (uint64_t)n;
      atomic_store_explicit(&ddcpu_ring_watch_of(g)->rx_ns, ddcpu_now_ns(), memory_order_relaxed);
      return 0;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0 && said_goodbye(g, r)) g->prev_bye = 1;
    return lost(g, (g->node + g->num_nodes - 1) % g->num_nodes,
                n == 0 ? "its connection closed in the middle of a collective"
                       : "receiving from it failed",
                n < 0 ? errno : 0);
  }
}

static int do_recv(ddcpu_group *g, ddcpu_ring *r, int *moved) {
  while (r->recv_step < r->nsteps) {
    int t = r->recv_step, seg = recv_seg(g, r, t);
    uint64_t total = seg_bytes(g, r, seg), got;
    if (reduces_at(g, r, t)) {
      while (r->red < total) {
        uint64_t want = DDCPU_MIN(g->opt.tcp_chunk_bytes, total - r->red);
        if (r->fill < want) {
          int st = recv_bytes(g, r, g->ring_tmp + r->fill, want - r->fill, &got);
          if (st) return st;
          if (got == 0) return 0;
          r->fill += got;
          *moved = 1;
          if (r->fill < want) continue;
        }
        uint64_t len;
        unsigned char *dst = span(g, r, seg, r->red, &len);
        uint64_t n = want / r->esize;
        ddcpu_reduce_into(r->dtype, r->redop, dst, g->ring_tmp, n);
        if (r->divisor > 0 && t == g->num_nodes - 2)
          ddcpu_divide(r->dtype, dst, n, r->divisor);
        r->red += want;
        r->fill = 0;
      }
    } else {
      while (r->rcvd < total) {
        uint64_t len;
        unsigned char *p = span(g, r, seg, r->rcvd, &len);
        int st = recv_bytes(g, r, p, len, &got);
        if (st) return st;
        if (got == 0) return 0;
        r->rcvd += got;
        *moved = 1;
      }
    }
    if (r->op == DDCPU_RING_RECORDS) {
      _Atomic uint64_t *arr = g->has_shm ? g->shm.arrived : g->arrived_local;
      atomic_store(&arr[seg], r->index);
    }
    r->recv_step++;
    r->rcvd = r->red = r->fill = 0;
    *moved = 1;
  }
  return 0;
}

/* See internal.h. Executor only. */
int ddcpu_ring_step(ddcpu_group *g, ddcpu_ring *r, ddcpu_wait_target *wt) {
  for (;;) {
    int moved = 0, st;
    if ((st = do_recv(g, r, &moved)) != 0) return st;
    if ((st = do_send(g, r, &moved)) != 0) return st;
    atomic_store(&ddcpu_ring_watch_of(g)->want_rx, r->recv_step < r->nsteps);
    atomic_store(&ddcpu_ring_watch_of(g)->want_tx, r->send_step < r->nsteps);
    if (r->send_step >= r->nsteps && r->recv_step >= r->nsteps) {
      r->active = 0;
      g->ring_active = 0;
      return DDCPU_DONE;
    }
    if (moved) continue;
    wt->kind = DDCPU_WAIT_FDS;
    wt->nfds = 0;
    if (r->send_step < r->nsteps && r->sent < send_limit(g, r, r->send_step))
      wt->fds[wt->nfds++] = (struct pollfd){g->next_fd, POLLOUT, 0};
    if (r->recv_step < r->nsteps)
      wt->fds[wt->nfds++] = (struct pollfd){g->prev_fd, POLLIN, 0};
    return DDCPU_BLOCKED;
  }
}
