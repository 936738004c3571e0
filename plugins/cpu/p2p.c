/*
 * p2p.c — the cpu plugin's point-to-point operations (plugin.h, p2p_start):
 * sends and receives, the protocol their frames follow, matching, and the
 * engine that moves them. The transports (a ring per pair of ranks of a
 * node, a TCP connection per pair of ranks on two nodes) are p2p_link.c's.
 *
 * Protocol (frames: wire.h). A message of at most eager_bytes travels at
 * once, whole (MSG): the send completes when its frame is written, and a
 * receiver that has not posted a matching receive keeps it in its list of
 * unexpected messages. A larger message is announced (RTS); the receiver
 * answers CTS once a receive matched it (or NAK when the counts differ),
 * and only then does the payload travel, in DATA frames written straight
 * into the receive's buffer. So a large message is never buffered by the
 * receiver, and the ring (or socket) between two ranks never holds more
 * than it has room for: unbounded buffering cannot happen, only eager
 * messages nobody receives accumulate (as with MPI's eager protocol).
 *
 * Matching (plugin.h): an arriving message takes the oldest posted receive
 * whose peer (or DDPLUG_ANY_SOURCE) and tag match; a posted receive takes
 * the oldest unexpected message that matches. Frames between two ranks
 * travel in order on one ring or connection, so messages of one tag are
 * received in the order they were sent (non-overtaking). Count and dtype
 * must agree: otherwise the receive fails with MISMATCH, and for a large
 * message the sender's send too (NAK); no data is delivered.
 *
 * Progress: the engine state is guarded by one mutex. Whoever holds it
 * moves everything that can move (reads every ring and socket, writes
 * answers, first frames and data): p2p_start itself (a small send to a
 * peer on the node usually completes inside it), a caller waiting in
 * request_wait, and the progress thread while operations are pending and
 * nobody waits (progress.c), so a send or receive started and not waited
 * for still completes. Waiting: spin briefly on this rank's doorbell (rung
 * by peers writing into or reading from its rings), then sleep on it (one
 * node) or poll the sockets (several nodes), checking the group's failure
 * state and the node's processes between slices.
 *
 * Failures: the group's failure (abort, a lost peer: failure.c) fails
 * every pending operation with its sentence. A peer that closed its group
 * cleanly (group_destroy: departed on the node, a goodbye on a connection)
 * fails the operations that need it with PEER_LOST saying so. A wait that
 * times out leaves the operation pending.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Largest message sent whole, and largest DATA frame, between nodes. */
#define EAGER_TCP (64u << 10)
#define CHUNK_TCP (256u << 10)
/* How long one sleep of a waiter lasts before it looks at the failure
 * state, the node's processes and peers that left. */
#define SLICE_NS (20ull * 1000 * 1000)

/* ---- lists -------------------------------------------------------------------- */

static void list_push(ddcpu_p2p_list *q, ddcpu_p2p_op *op) {
  op->in = q;
  op->next = NULL;
  op->prev = q->tail;
  if (q->tail) q->tail->next = op; else q->head = op;
  q->tail = op;
}

static void list_push_front(ddcpu_p2p_list *q, ddcpu_p2p_op *op) {
  op->in = q;
  op->prev = NULL;
  op->next = q->head;
  if (q->head) q->head->prev = op; else q->tail = op;
  q->head = op;
}

static void list_unlink(ddcpu_p2p_op *op) {
  ddcpu_p2p_list *q = op->in;
  if (!q) return;
  if (op->prev) op->prev->next = op->next; else q->head = op->next;
  if (op->next) op->next->prev = op->prev; else q->tail = op->prev;
  op->next = op->prev = NULL;
  op->in = NULL;
}

/* ---- names for sentences --------------------------------------------------------- */

static void describe(const ddcpu_p2p_op *op, char *out, size_t cap) {
  char peer[32];
  if (op->peer < 0) snprintf(peer, sizeof peer, "any rank");
  else snprintf(peer, sizeof peer, "rank %d", op->peer);
  snprintf(out, cap, "%s of %llu %s %s %s (tag %lld)", op->send ? "send" : "receive",
           (unsigned long long)op->count, ddcpu_dtype_name(op->dtype),
           op->send ? "to" : "from", peer, (long long)op->tag);
}

/* ---- completion ---------------------------------------------------------------------- */

/* Complete op with status st (a failure: the sentence is fmt). Never frees
 * op (ddcpu_p2p_progress releases freed ones at its end). */
static void complete(ddcpu_group *g, ddcpu_p2p_op *op, int st, const char *fmt, ...)
    DDCPU_PRINTF(4, 5);
static void complete(ddcpu_group *g, ddcpu_p2p_op *op, int st, const char *fmt, ...) {
  if (atomic_load_explicit(&op->done, memory_order_relaxed)) return;
  list_unlink(op);
  op->state = DDCPU_OP_DONE;
  op->status = st;
  if (st != DDPLUG_OK && fmt) {
    char why[DDCPU_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    describe(op, op->msg, sizeof op->msg);
    size_t n = strlen(op->msg);
    snprintf(op->msg + n, sizeof op->msg - n, " on rank %d: ", g->rank);
    n = strlen(op->msg);
    memcpy(op->msg + n, why, DDCPU_MIN(strlen(why) + 1, sizeof op->msg - n));
    op->msg[sizeof op->msg - 1] = '\0';
  }
  if (st == DDPLUG_OK && !op->send && op->source) *op->source = op->src;
  g->p2p->live--;
  atomic_fetch_sub(&g->p2p->pending, 1);
  atomic_store_explicit(&op->done, 1, memory_order_release);
  /* a caller may sleep on this rank's bell while another thread completed it */
  ddcpu_p2p_bell_ring(g->p2p->bell);
}

static void fail_ops_of(ddcpu_group *g, int peer, int st, const char *why) {
  for (ddcpu_p2p_op *op = g->p2p->all; op; op = op->anext) {
    if (atomic_load_explicit(&op->done, memory_order_relaxed)) continue;
    int needs = op->send ? op->peer == peer
                         : (op->peer == peer || (op->state == DDCPU_OP_RECEIVING && op->src == peer));
    if (needs) complete(g, op, st, "%s", why);
  }
}

/* ---- answers ----------------------------------------------------------------------------- */

static int answer(ddcpu_group *g, ddcpu_p2p_link *l, int type, uint64_t id, const ddcpu_p2p_op *op) {
  ddcpu_p2p_ctl *c = calloc(1, sizeof *c);
  if (!c)
    return ddcpu_fail_set(g, DDPLUG_E_NO_MEMORY, g->rank, g->rank,
                          "rank %d: out of memory answering rank %d's message", g->rank, l->peer);
  c->f.magic = DDCPU_FRAME_MAGIC;
  c->f.type = (uint32_t)type;
  c->f.from = g->rank;
  c->f.id = id;
  c->f.tag = op->tag;
  c->f.count = op->count;
  c->f.dtype = op->dtype;
  c->f.status = type == DDCPU_FR_NAK ? DDPLUG_E_MISMATCH : DDPLUG_OK;
  if (l->ctl_tail) l->ctl_tail->next = c; else l->ctl_head = c;
  l->ctl_tail = c;
  return DDPLUG_OK;
}

static int agrees(const ddcpu_p2p_op *op, uint64_t count, int32_t dtype) {
  return op->count == count && op->dtype == dtype;
}

static void mismatch(ddcpu_group *g, ddcpu_p2p_op *op, int src, int64_t tag, uint64_t count,
                     int32_t dtype) {
  complete(g, op, DDPLUG_E_MISMATCH,
           "rank %d sent %llu %s with tag %lld, this receive takes %llu %s (count and dtype "
           "must agree); nothing was delivered", src, (unsigned long long)count,
           ddcpu_dtype_name(dtype), (long long)tag, (unsigned long long)op->count,
           ddcpu_dtype_name(op->dtype));
}

/* A receive matched a large message of l's peer: ask for the data, or
 * refuse it when the counts differ. */
static void take_rts(ddcpu_group *g, ddcpu_p2p_link *l, ddcpu_p2p_op *op, uint64_t id,
                     int64_t tag, uint64_t count, int32_t dtype) {
  list_unlink(op);
  if (!agrees(op, count, dtype)) {
    answer(g, l, DDCPU_FR_NAK, id, op);
    mismatch(g, op, l->peer, tag, count, dtype);
    return;
  }
  op->state = DDCPU_OP_RECEIVING;
  op->id = id;
  op->src = l->peer;
  list_push(&l->receiving, op);
  answer(g, l, DDCPU_FR_CTS, id, op);
}

static ddcpu_p2p_op *match_posted(ddcpu_group *g, int src, int64_t tag) {
  for (ddcpu_p2p_op *op = g->p2p->posted.head; op; op = op->next)
    if ((op->peer < 0 || op->peer == src) && op->tag == tag) return op;
  return NULL;
}

static ddcpu_p2p_op *find_id(ddcpu_p2p_list *q, uint64_t id) {
  for (ddcpu_p2p_op *op = q->head; op; op = op->next)
    if (op->id == id) return op;
  return NULL;
}

/* ---- what p2p_link.c calls --------------------------------------------------------------- */

/* See internal.h. */
unsigned char *ddcpu_p2p_rx_begin(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h,
                                  ddcpu_p2p_rx *rx) {
  ddcpu_p2p *p = g->p2p;
  switch (h->type) {
    case DDCPU_FR_MSG:
    case DDCPU_FR_RTS: {
      ddcpu_p2p_op *op = match_posted(g, l->peer, h->tag);
      if (op) {
        rx->op = op;
        return h->type == DDCPU_FR_MSG && agrees(op, h->count, h->dtype) ? op->buf : NULL;
      }
      ddcpu_p2p_unexpected *ux = calloc(1, sizeof *ux);
      if (ux && h->type == DDCPU_FR_MSG && h->len && !(ux->data = malloc(h->len))) {
        free(ux);
        ux = NULL;
      }
      if (!ux) {
        ddcpu_fail_set(g, DDPLUG_E_NO_MEMORY, g->rank, g->rank,
                       "rank %d: out of memory keeping a message of %llu bytes from rank %d "
                       "that no receive has asked for yet", g->rank,
                       (unsigned long long)h->len, l->peer);
        return NULL;
      }
      ux->src = l->peer;
      ux->rts = h->type == DDCPU_FR_RTS;
      ux->tag = h->tag;
      ux->id = h->id;
      ux->count = h->count;
      ux->dtype = h->dtype;
      ux->len = h->len;
      rx->ux = ux;
      return ux->data;
    }
    case DDCPU_FR_DATA: {
      ddcpu_p2p_op *op = find_id(&l->receiving, h->id);
      if (!op || h->offset > op->bytes || h->len > op->bytes - h->offset) return NULL;
      rx->op = op;
      return op->buf + h->offset;
    }
    default:
      (void)p;
      return NULL;
  }
}

/* See internal.h. */
void ddcpu_p2p_rx_end(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h, ddcpu_p2p_rx *rx) {
  ddcpu_p2p *p = g->p2p;
  switch (h->type) {
    case DDCPU_FR_MSG:
      if (rx->op) {
        if (!agrees(rx->op, h->count, h->dtype)) {
          mismatch(g, rx->op, l->peer, h->tag, h->count, h->dtype);
        } else {
          rx->op->src = l->peer;
          rx->op->moved = h->len;
          complete(g, rx->op, DDPLUG_OK, NULL);
        }
      }
      break;
    case DDCPU_FR_RTS:
      if (rx->op) take_rts(g, l, rx->op, h->id, h->tag, h->count, h->dtype);
      break;
    case DDCPU_FR_DATA:
      if (rx->op) {
        rx->op->moved += h->len;
        if (rx->op->moved == rx->op->bytes) complete(g, rx->op, DDPLUG_OK, NULL);
      }
      break;
    case DDCPU_FR_CTS: {
      ddcpu_p2p_op *op = find_id(&l->waiting, h->id);
      if (op) {
        list_unlink(op);
        op->state = DDCPU_OP_DATA;
        list_push(&l->data, op);
      }
      break;
    }
    case DDCPU_FR_NAK: {
      ddcpu_p2p_op *op = find_id(&l->waiting, h->id);
      if (op)
        complete(g, op, DDPLUG_E_MISMATCH,
                 "rank %d's matching receive takes %llu %s (count and dtype must agree); "
                 "nothing was delivered", l->peer, (unsigned long long)h->count,
                 ddcpu_dtype_name(h->dtype));
      break;
    }
    default:
      break;
  }
  if (rx->ux) {
    ddcpu_p2p_unexpected *ux = rx->ux;
    if (p->unexp_tail) p->unexp_tail->next = ux; else p->unexp = ux;
    p->unexp_tail = ux;
  }
  memset(rx, 0, sizeof *rx);
}

/* See internal.h. */
void ddcpu_p2p_tx_done(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h, ddcpu_p2p_op *op) {
  (void)l;
  if (!op) return;
  if (h->type == DDCPU_FR_MSG) {
    op->written = op->bytes;
    complete(g, op, DDPLUG_OK, NULL);
  } else if (h->type == DDCPU_FR_DATA) {
    op->written += h->len;
    if (op->written == op->bytes) complete(g, op, DDPLUG_OK, NULL);
  }
}

/* See internal.h. */
void ddcpu_p2p_peer_gone(ddcpu_group *g, ddcpu_p2p_link *l, int clean, int err) {
  int r = l->peer;
  if (clean) {
    l->bye = 1;
    char why[256];
    snprintf(why, sizeof why, "rank %d closed its group (group_destroy) before this "
             "completed: every rank must finish its sends and receives first", r);
    fail_ops_of(g, r, DDPLUG_E_PEER_LOST, why);
    return;
  }
  ddcpu_fail_set(g, DDPLUG_E_PEER_LOST, r, g->rank,
                 "rank %d (node %d, pid %lld) closed its point-to-point connection without "
                 "saying goodbye: it exited or was killed (noticed by rank %d)%s%s", r,
                 g->node_of[r], (long long)g->pid_of[r], g->rank, err ? ": " : "",
                 err ? strerror(err) : "");
}

/* See internal.h. */
void ddcpu_p2p_link_failed(ddcpu_group *g, ddcpu_p2p_link *l, int st) {
  char why[DDCPU_MSG_MAX];
  snprintf(why, sizeof why, "%s", ddcpu_errmsg());
  fail_ops_of(g, l->peer, st, why);
}

/* ---- writing ------------------------------------------------------------------------------ */

static uint64_t data_chunk(ddcpu_group *g, const ddcpu_p2p_link *l) {
  return l->local ? g->p2p->ring_bytes / 4 - sizeof(ddcpu_frame) : CHUNK_TCP;
}

static void frame_of(ddcpu_group *g, const ddcpu_p2p_op *op, int type, ddcpu_frame *f) {
  memset(f, 0, sizeof *f);
  f->magic = DDCPU_FRAME_MAGIC;
  f->type = (uint32_t)type;
  f->from = g->rank;
  f->id = op->id;
  f->tag = op->tag;
  f->count = op->count;
  f->dtype = op->dtype;
}

/* Write what l is due, as far as the transport takes it now. A transport
 * error (a ring that cannot be reserved) fails the group: the peer would
 * wait for frames that cannot come. */
static void flush(ddcpu_group *g, ddcpu_p2p_link *l) {
  ddcpu_p2p *p = g->p2p;
  int st;
  while (l->ctl_head) {
    ddcpu_p2p_ctl *c = l->ctl_head;
    st = ddcpu_p2p_put(g, l, 1, &c->f, NULL, 0, NULL);
    if (st == DDCPU_AGAIN) break;
    if (st != DDPLUG_OK) goto broken;
    l->ctl_head = c->next;
    if (!l->ctl_head) l->ctl_tail = NULL;
    free(c);
  }
  while (l->queued.head) {
    ddcpu_p2p_op *op = l->queued.head;
    int eager = op->bytes <= p->eager_bytes;
    ddcpu_frame f;
    frame_of(g, op, eager ? DDCPU_FR_MSG : DDCPU_FR_RTS, &f);
    f.len = eager ? op->bytes : 0;
    list_unlink(op);
    op->state = eager ? DDCPU_OP_DATA : DDCPU_OP_WAIT_CTS;
    if (!eager) list_push(&l->waiting, op);
    if (eager) op->moved = op->bytes;
    st = ddcpu_p2p_put(g, l, 0, &f, op->buf, f.len, op);
    if (st == DDCPU_AGAIN) {
      list_unlink(op);
      op->state = DDCPU_OP_QUEUED;
      op->moved = 0;
      list_push_front(&l->queued, op);
      break;
    }
    if (st != DDPLUG_OK) goto broken;
  }
  while (l->data.head) {
    ddcpu_p2p_op *op = l->data.head;
    uint64_t n = DDCPU_MIN(op->bytes - op->moved, data_chunk(g, l));
    ddcpu_frame f;
    frame_of(g, op, DDCPU_FR_DATA, &f);
    f.offset = op->moved;
    f.len = n;
    uint64_t at = op->moved;
    op->moved += n; /* before: the transport may complete the send inside put */
    st = ddcpu_p2p_put(g, l, 0, &f, op->buf + at, n, op);
    if (st == DDCPU_AGAIN) {
      op->moved = at;
      break;
    }
    if (st != DDPLUG_OK) goto broken;
    if (op->moved == op->bytes) list_unlink(op);
  }
  return;
broken:
  ddcpu_fail_set(g, st, g->rank, g->rank, "%s", ddcpu_errmsg());
}

/* ---- the engine ----------------------------------------------------------------------------- */

static void release(ddcpu_p2p *p, ddcpu_p2p_op *op) {
  if (op->aprev) op->aprev->anext = op->anext; else p->all = op->anext;
  if (op->anext) op->anext->aprev = op->aprev;
  free(op);
}

/* See internal.h. Holds p2p.mu. */
int ddcpu_p2p_progress(ddcpu_group *g) {
  ddcpu_p2p *p = g->p2p;
  int st = ddcpu_fail_status(g);
  if (st) {
    const ddcpu_fail_rec *f = ddcpu_fail_get(g);
    for (ddcpu_p2p_op *op = p->all; op; op = op->anext)
      if (!atomic_load_explicit(&op->done, memory_order_relaxed))
        complete(g, op, st, "%s", f ? f->msg : "the group failed");
  } else {
    ddcpu_p2p_link_io(g);
    for (int r = 0; r < g->world; r++) {
      ddcpu_p2p_link *l = &p->links[r];
      if (l->ctl_head || l->queued.head || l->data.head) flush(g, l);
    }
  }
  for (ddcpu_p2p_op *op = p->all, *next; op; op = next) {
    next = op->anext;
    if (op->user_freed && atomic_load_explicit(&op->done, memory_order_relaxed)) release(p, op);
  }
  return st;
}

/* Peers of the node that left (group_destroy) and will never send what a
 * receive waits for, or take what a send offers. */
static void check_departed(ddcpu_group *g) {
  if (!g->has_shm) return;
  for (int j = 0; j < g->local_world; j++) {
    int r = g->local_ranks[j];
    if (r == g->rank || !atomic_load(&g->shm.procs[j].departed)) continue;
    ddcpu_p2p_link *l = &g->p2p->links[r];
    if (l->bye) continue;
    ddcpu_p2p_link_io(g); /* what it wrote before leaving is still taken */
    ddcpu_p2p_peer_gone(g, l, 1, 0);
  }
}

/* Sleep until something may have moved: this rank's bell rang (one node),
 * a socket is ready (several nodes), a node process exited, or the slice
 * ended. seen: the bell's value before the last progress. spin: whether to
 * spin first (g->spin_ns): a caller does; the progress thread only with a
 * CPU to spare (else it would take the CPU from a rank that computes). */
static void wait_event(ddcpu_group *g, uint32_t seen, uint64_t deadline, int spin) {
  ddcpu_p2p *p = g->p2p;
  uint64_t now = ddcpu_now_ns();
  if (now >= deadline) return;
  uint64_t spin_end = DDCPU_MIN(now + (spin ? g->spin_ns : 0), deadline);
  while (ddcpu_now_ns() < spin_end) {
    for (int i = 0; i < 64; i++)
      if (atomic_load_explicit(&p->bell->val, memory_order_acquire) != seen) return;
    if (ddcpu_fail_status(g)) return;
  }
  now = ddcpu_now_ns();
  if (now >= deadline) return;
  uint64_t slice = DDCPU_MIN(SLICE_NS, deadline - now);
  struct pollfd pfd[DDCPU_MAX_LOCAL + 64];
  int n = 0;
  if (p->lfd >= 0) {
    /* sockets and rings at once: poll, looking at the bell every ms when
     * peers of this node may write too */
    n = ddcpu_p2p_fds(g, pfd, 64);
    if (g->local_world > 1) slice = DDCPU_MIN(slice, 1000000ull);
  }
  int first_pid = n;
  for (int j = 0; j < g->local_world; j++)
    if (g->pidfd[j] >= 0 && !atomic_load(&g->pid_gone[j]))
      pfd[n++] = (struct pollfd){g->pidfd[j], POLLIN, 0};
  int timeout_ms = 0;
  if (p->lfd < 0) {
    ddcpu_ctr_sleep(p->bell, seen, slice, 1);
  } else {
    if (atomic_load_explicit(&p->bell->val, memory_order_acquire) != seen) return;
    timeout_ms = (int)((slice + 999999ull) / 1000000ull);
  }
  /* the node's processes: looked at after the sleep (one node), or
   * waited for with the sockets */
  if (n > 0 && poll(pfd, (nfds_t)n, timeout_ms) > 0)
    for (int i = first_pid; i < n; i++)
      if (pfd[i].revents)
        for (int j = 0; j < g->local_world; j++)
          if (g->pidfd[j] == pfd[i].fd) ddcpu_peer_exited(g, j);
}

/* ---- creating and destroying ------------------------------------------------------------------ */

/* See internal.h. */
uint64_t ddcpu_p2p_ring_bytes(int local_world) {
  if (local_world < 2) return 0;
  uint64_t pairs = (uint64_t)local_world * (uint64_t)(local_world - 1);
  uint64_t want = (64ull << 20) / pairs, b = 1ull << 20;
  while (b > want && b > (64ull << 10)) b >>= 1;
  return b;
}

/* See internal.h. */
int ddcpu_p2p_create(ddcpu_group *g) {
  ddcpu_p2p *p = calloc(1, sizeof *p);
  if (!p) return ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory");
  g->p2p = p;
  pthread_mutex_init(&p->mu, NULL);
  p->lfd = -1;
  p->links = calloc((size_t)g->world, sizeof *p->links);
  if (!p->links) return ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory");
  p->ring_bytes = g->has_shm ? g->shm.hdr->p2p_ring_bytes : 0;
  /* whole messages up to a quarter ring (at most 64 KiB): a frame always
   * fits, and eager messages nobody receives stay small */
  p->eager_bytes = EAGER_TCP;
  if (p->ring_bytes && p->ring_bytes / 4 - sizeof(ddcpu_frame) < p->eager_bytes)
    p->eager_bytes = p->ring_bytes / 4 - sizeof(ddcpu_frame);
  p->bell = g->has_shm ? &g->shm.bell[g->local_rank] : &p->own_bell;
  return ddcpu_p2p_link_setup(g);
}

/* See internal.h. */
void ddcpu_p2p_destroy(ddcpu_group *g) {
  ddcpu_p2p *p = g->p2p;
  if (!p) return;
  ddcpu_p2p_link_close(g);
  for (ddcpu_p2p_op *op = p->all, *next; op; op = next) {
    next = op->anext;
    free(op);
  }
  for (ddcpu_p2p_unexpected *u = p->unexp, *next; u; u = next) {
    next = u->next;
    free(u->data);
    free(u);
  }
  if (p->links)
    for (int r = 0; r < g->world; r++)
      for (ddcpu_p2p_ctl *c = p->links[r].ctl_head, *next; c; c = next) {
        next = c->next;
        free(c);
      }
  free(p->links);
  pthread_mutex_destroy(&p->mu);
  free(p);
  g->p2p = NULL;
}

/* ---- the slot and the request functions ---------------------------------------------------------- */

/* A receive just posted: take the oldest unexpected message that matches. */
static void post_receive(ddcpu_group *g, ddcpu_p2p_op *op) {
  ddcpu_p2p *p = g->p2p;
  ddcpu_p2p_unexpected *prev = NULL;
  for (ddcpu_p2p_unexpected *u = p->unexp; u; prev = u, u = u->next) {
    if ((op->peer >= 0 && u->src != op->peer) || u->tag != op->tag) continue;
    if (prev) prev->next = u->next; else p->unexp = u->next;
    if (p->unexp_tail == u) p->unexp_tail = prev;
    ddcpu_p2p_link *l = &p->links[u->src];
    if (u->rts) {
      take_rts(g, l, op, u->id, u->tag, u->count, u->dtype);
    } else if (!agrees(op, u->count, u->dtype)) {
      mismatch(g, op, u->src, u->tag, u->count, u->dtype);
    } else {
      if (u->len) memcpy(op->buf, u->data, u->len);
      op->src = u->src;
      op->moved = u->len;
      complete(g, op, DDPLUG_OK, NULL);
    }
    free(u->data);
    free(u);
    return;
  }
  op->state = DDCPU_OP_POSTED;
  list_push(&p->posted, op);
}

/* Start a send or receive (see plugin.h): queued, then moved as far as it
 * goes without waiting. On failure nothing was started and *req is
 * untouched. */
int ddcpu_p2p_start(ddplug_plugin_group *g, const ddplug_p2p_args *args,
                    ddplug_plugin_request **req) {
  if (!g || !args || !req) return DDPLUG_E_INVALID_ARGUMENT;
  if (!DDPLUG_HAS_FIELD(args, ddplug_p2p_args, reserved0))
    return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_ABI_MISMATCH,
                                          "p2p_start: ddplug_p2p_args of %u bytes is older "
                                          "than ABI 1.4", args->struct_size));
  int send = args->kind == DDPLUG_P2P_SEND;
  if (!send && args->kind != DDPLUG_P2P_RECV)
    return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                                          "p2p_start: kind %d is neither a send nor a receive",
                                          args->kind));
  int any = !send && args->peer == DDPLUG_ANY_SOURCE;
  if (!any && (args->peer < 0 || args->peer >= g->world || args->peer == g->rank))
    return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                                          "p2p_start: rank %d cannot %s rank %d (world %d)",
                                          g->rank, send ? "send to" : "receive from",
                                          args->peer, g->world));
  uint32_t es = ddcpu_dtype_size(args->dtype);
  if (!es || args->tag < 0 || (args->count && !args->buf) || args->count > UINT64_MAX / es)
    return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                                          "p2p_start: bad arguments (dtype %d, tag %lld, "
                                          "count %llu)", args->dtype, (long long)args->tag,
                                          (unsigned long long)args->count));
  if (args->mem == DDPLUG_MEM_DEVICE)
    return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_UNSUPPORTED,
                                          "p2p_start: plugin cpu takes host memory only"));
  ddcpu_p2p *p = g->p2p;
  int st = ddcpu_fail_status(g);
  if (st) {
    const ddcpu_fail_rec *f = ddcpu_fail_get(g);
    return ddcpu_report(g->svc, ddcpu_err(st, "%s not started: %s", send ? "send" : "receive",
                                          f ? f->msg : "the group failed"));
  }
  ddcpu_p2p_op *op = calloc(1, sizeof *op);
  if (!op) return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_NO_MEMORY, "p2p_start: out of memory"));
  op->head.kind = DDCPU_REQ_P2P;
  op->send = send;
  op->peer = any ? -1 : args->peer;
  op->tag = args->tag;
  op->buf = args->buf;
  op->count = args->count;
  op->dtype = args->dtype;
  op->bytes = args->count * es;
  op->source = args->source;
  op->src = -1;
  op->start_ns = ddcpu_now_ns();
  pthread_mutex_lock(&p->mu);
  if (send) {
    ddcpu_p2p_link *l = &p->links[op->peer];
    if (l->bye) {
      pthread_mutex_unlock(&p->mu);
      free(op);
      return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_PEER_LOST,
                                            "send to rank %d: it closed its group "
                                            "(group_destroy)", args->peer));
    }
    if (!l->local && (st = ddcpu_p2p_connect(g, l)) != DDPLUG_OK) {
      pthread_mutex_unlock(&p->mu);
      free(op);
      return ddcpu_report(g->svc, st);
    }
  }
  op->anext = p->all;
  if (p->all) p->all->aprev = op;
  p->all = op;
  p->live++;
  atomic_fetch_add(&p->pending, 1);
  if (send) {
    ddcpu_p2p_link *l = &p->links[op->peer];
    op->id = ++l->next_id;
    op->state = DDCPU_OP_QUEUED;
    list_push(&l->queued, op);
  } else {
    post_receive(g, op);
  }
  ddcpu_p2p_progress(g);
  pthread_mutex_unlock(&p->mu);
  atomic_store(&p->last_start_ns, op->start_ns);
  if (!atomic_load(&op->done) && g->progress_runs &&
      (!atomic_load(&p->lazy) || atomic_load(&g->thread_mode) == DDCPU_THREAD_ASLEEP))
    ddcpu_progress_wake(g);
  *req = (ddplug_plugin_request *)op;
  return DDPLUG_OK;
}

static int op_status(ddcpu_p2p_op *op) {
  if (op->status != DDPLUG_OK) ddcpu_errmsg_set(op->msg);
  return op->status;
}

/* Why op is still pending, for a TIMEOUT. */
static void pending_why(ddcpu_group *g, const ddcpu_p2p_op *op, char *out, size_t cap) {
  ddcpu_p2p *p = g->p2p;
  switch (op->state) {
    case DDCPU_OP_POSTED:
      if (op->peer >= 0)
        snprintf(out, cap, "rank %d has sent no message with tag %lld that this receive could "
                 "take", op->peer, (long long)op->tag);
      else
        snprintf(out, cap, "no rank has sent a message with tag %lld that this receive could "
                 "take", (long long)op->tag);
      break;
    case DDCPU_OP_RECEIVING:
      snprintf(out, cap, "rank %d's message is arriving: %llu of %llu bytes so far", op->src,
               (unsigned long long)op->moved, (unsigned long long)op->bytes);
      break;
    case DDCPU_OP_QUEUED:
      snprintf(out, cap, "rank %d has not taken the messages sent to it before this one",
               op->peer);
      break;
    case DDCPU_OP_WAIT_CTS:
      snprintf(out, cap, "rank %d has posted no receive that matches it (a message of %llu "
               "bytes waits at the sender for its receive; up to %llu bytes would not)",
               op->peer, (unsigned long long)op->bytes, (unsigned long long)p->eager_bytes);
      break;
    default:
      snprintf(out, cap, "%llu of %llu bytes written toward rank %d", (unsigned long long)op->written,
               (unsigned long long)op->bytes, op->peer);
  }
}

/* See internal.h. Blocks at most timeout_ms (0 polls once). */
int ddcpu_p2p_wait(ddcpu_group *g, ddcpu_p2p_op *op, int64_t timeout_ms) {
  ddcpu_p2p *p = g->p2p;
  uint64_t start = ddcpu_now_ns();
  uint64_t deadline = timeout_ms <= 0 ? start : start + (uint64_t)timeout_ms * 1000000ull;
  uint64_t next_look = start + SLICE_NS;
  if (atomic_load_explicit(&op->done, memory_order_acquire)) return op_status(op);
  if (start - op->start_ns < DDCPU_SYNC_WAIT_NS) atomic_store(&p->lazy, 1);
  atomic_fetch_add(&p->waiters, 1);
  for (;;) {
    uint32_t seen = atomic_load_explicit(&p->bell->val, memory_order_acquire);
    pthread_mutex_lock(&p->mu);
    ddcpu_p2p_progress(g);
    if (!atomic_load(&op->done) && ddcpu_now_ns() >= next_look) {
      check_departed(g);
      next_look = ddcpu_now_ns() + SLICE_NS;
    }
    pthread_mutex_unlock(&p->mu);
    if (atomic_load_explicit(&op->done, memory_order_acquire)) break;
    if (ddcpu_now_ns() >= deadline) break;
    wait_event(g, seen, deadline, 1);
  }
  atomic_fetch_sub(&p->waiters, 1);
  if (atomic_load_explicit(&op->done, memory_order_acquire)) return op_status(op);
  char d[160], why[DDCPU_MSG_MAX];
  describe(op, d, sizeof d);
  pthread_mutex_lock(&p->mu);
  pending_why(g, op, why, sizeof why);
  pthread_mutex_unlock(&p->mu);
  return ddcpu_err(DDPLUG_E_TIMEOUT, "%s on rank %d did not complete within %lld ms: %s",
                   d, g->rank, (long long)DDCPU_MAX(timeout_ms, 0), why);
}

/* See internal.h. Never waits for peers. */
int ddcpu_p2p_test(ddcpu_group *g, ddcpu_p2p_op *op, int32_t *done) {
  ddcpu_p2p *p = g->p2p;
  if (!atomic_load_explicit(&op->done, memory_order_acquire) && !pthread_mutex_trylock(&p->mu)) {
    ddcpu_p2p_progress(g);
    pthread_mutex_unlock(&p->mu);
  }
  if (atomic_load_explicit(&op->done, memory_order_acquire)) {
    *done = 1;
    return op_status(op);
  }
  *done = 0;
  return DDPLUG_OK;
}

/* See internal.h. A pending op goes on (its buffer must stay valid) and is
 * released once complete, or at group_destroy. */
void ddcpu_p2p_free(ddcpu_group *g, ddcpu_p2p_op *op) {
  ddcpu_p2p *p = g->p2p;
  pthread_mutex_lock(&p->mu);
  if (atomic_load(&op->done)) release(p, op);
  else op->user_freed = 1;
  pthread_mutex_unlock(&p->mu);
}

/* See internal.h. */
void ddcpu_p2p_background(ddcpu_group *g, int ms) {
  ddcpu_p2p *p = g->p2p;
  uint32_t seen = atomic_load_explicit(&p->bell->val, memory_order_acquire);
  if (!pthread_mutex_trylock(&p->mu)) {
    ddcpu_p2p_progress(g);
    pthread_mutex_unlock(&p->mu);
  }
  if (atomic_load(&p->pending) == 0 || atomic_load(&p->waiters) > 0) return;
  wait_event(g, seen, ddcpu_deadline(ms), g->spare_cpu);
}
