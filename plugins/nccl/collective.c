/*
 * collective.c — collectives on NCCL: collective_start enqueues on a CUDA
 * stream and returns a request backed by a CUDA event; request_wait and
 * request_test watch that event, the communicator and the clock.
 *
 * Buffers. mem DEVICE: both pointers are device memory of the group's GPU.
 * mem HOST: both are host memory. mem AUTO: each pointer is asked
 * (cudaPointerGetAttributes): device or managed memory goes to NCCL as is;
 * device memory of another GPU is refused; host memory (pageable or pinned)
 * is staged: copied into a pinned buffer, then to a device buffer, reduced
 * there, copied back, and copied into the caller's buffer once the request
 * is seen complete (request_wait/test). Pinned caller memory skips the CPU
 * copies.
 *
 * Streams. A non-NULL stream (a cudaStream_t) is used for everything. With
 * NULL: operations touching device buffers use the CUDA default stream
 * (ordered after the caller's earlier default-stream work, like any CUDA
 * call on stream 0); host-only operations and barriers use the group's
 * internal non-blocking stream, so they do not wait for unrelated GPU
 * work. When consecutive collectives use different streams, the later
 * stream waits for the earlier collective's event: collectives of a group
 * complete in the order they were started.
 *
 * Failures. Once a collective has been entered on some ranks, a rank that
 * cannot enqueue its part would leave the others blocked inside NCCL; so any
 * failure in collective_start after the (optional) mismatch check fails the
 * whole group (communicator aborted, peers told through the store). See
 * README.md for what waits return on timeout, abort and peer loss.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define STORE_POLL_NS 100000000ull /* 100 ms between looks at "abort" */
#define SPIN_NS 1000000ull         /* poll without sleeping for 1 ms    */
#define MAX_SPARE 64

/* A collective resolved to NCCL terms; no side effects until enqueue. */
typedef struct plan {
  int32_t kind, dtype, op, root;
  ncclDataType_t ndt;
  ncclRedOp_t nop;
  const void *send;
  void *recv;
  uint64_t count;
  size_t send_bytes, recv_bytes;
  int send_used;             /* broadcast: only the root's send counts     */
  int send_host, send_pinned, recv_host, recv_pinned;
  ptrdiff_t send_in_recv;    /* both host, send inside recv: offset; else -1 */
  cudaStream_t stream;
} plan;

static size_t align256(size_t n) { return (n + 255u) & ~(size_t)255u; }

/* See internal.h. */
int ddnccl_classify(ddplug_plugin_group *g, const void *ptr, int32_t mem,
                    const char *which, int *is_host, int *pinned, char *err,
                    size_t cap) {
  *pinned = 0;
  if (mem == DDPLUG_MEM_DEVICE) {
    *is_host = 0;
    return DDPLUG_OK;
  }
  if (mem == DDPLUG_MEM_HOST) {
    *is_host = 1;
    return DDPLUG_OK;
  }
  struct cudaPointerAttributes at;
  memset(&at, 0, sizeof at);
  if (cudaPointerGetAttributes(&at, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    *is_host = 1; /* not known to CUDA: ordinary host memory */
    return DDPLUG_OK;
  }
  switch (at.type) {
    case cudaMemoryTypeDevice:
      if (at.device != g->device) {
        ddnccl_fmt(err, cap,
                   "the %s buffer is device memory of cuda:%d, but rank "
                   "%d's nccl group runs on cuda:%d (%s): allocate it "
                   "on the group's device",
                   which, at.device, g->rank, g->device, g->self.uuid);
        return DDPLUG_E_INVALID_ARGUMENT;
      }
      *is_host = 0;
      return DDPLUG_OK;
    case cudaMemoryTypeManaged:
      *is_host = 0;
      return DDPLUG_OK;
    case cudaMemoryTypeHost:
      *is_host = 1;
      *pinned = 1;
      return DDPLUG_OK;
    default:
      *is_host = 1;
      return DDPLUG_OK;
  }
}

/* Resolves args into p. Returns OK or a status with err filled. */
static int make_plan(ddplug_plugin_group *g, const ddplug_coll_args *a,
                     plan *p, char *err, size_t cap) {
  memset(p, 0, sizeof *p);
  p->kind = a->kind;
  p->send_in_recv = -1;
  int32_t mem = DDPLUG_HAS_FIELD(a, ddplug_coll_args, mem) ? a->mem
                                                            : DDPLUG_MEM_AUTO;
  void *stream = DDPLUG_HAS_FIELD(a, ddplug_coll_args, stream) ? a->stream : NULL;
  if (a->kind == DDPLUG_COLL_BARRIER) {
    p->dtype = DDPLUG_INT32;
    p->op = DDPLUG_OP_SUM;
    p->ndt = ncclInt32;
    p->nop = ncclSum;
    p->count = 1;
    p->send = g->scratch;
    p->recv = g->scratch;
    p->send_used = 1;
    p->send_bytes = p->recv_bytes = sizeof(int32_t);
    p->stream = stream ? (cudaStream_t)stream : g->stream;
    return DDPLUG_OK;
  }
  p->dtype = a->dtype;
  p->op = a->kind == DDPLUG_COLL_ALLREDUCE ? a->op : 0;
  p->root = a->kind == DDPLUG_COLL_BROADCAST ? a->root : 0;
  p->count = a->count;
  p->send = a->send;
  p->recv = a->recv;
  if (ddnccl_dtype(a->dtype, &p->ndt) != 0) {
    ddnccl_fmt(err, cap, "dtype %d is not supported by NCCL", a->dtype);
    return DDPLUG_E_UNSUPPORTED;
  }
  if (a->kind == DDPLUG_COLL_ALLREDUCE && ddnccl_op(a->op, &p->nop) != 0) {
    ddnccl_fmt(err, cap, "reduce op %s is not an NCCL op",
               ddnccl_op_name(a->op));
    return DDPLUG_E_UNSUPPORTED;
  }
  size_t es = ddnccl_dtype_size(a->dtype);
  if (a->count > (uint64_t)(SIZE_MAX / es / (size_t)g->world)) {
    ddnccl_fmt(err, cap, "count %llu is too large",
               (unsigned long long)a->count);
    return DDPLUG_E_INVALID_ARGUMENT;
  }
  p->send_bytes = (size_t)a->count * es;
  p->recv_bytes = a->kind == DDPLUG_COLL_ALLGATHER ? p->send_bytes * (size_t)g->world
                                                   : p->send_bytes;
  switch (a->kind) {
    case DDPLUG_COLL_ALLREDUCE:
    case DDPLUG_COLL_ALLGATHER: p->send_used = 1; break;
    case DDPLUG_COLL_BROADCAST: p->send_used = g->rank == a->root; break;
    default:
      ddnccl_fmt(err, cap, "unknown collective kind %d", a->kind);
      return DDPLUG_E_INVALID_ARGUMENT;
  }
  if (p->recv_bytes == 0) { /* count 0: nothing to move; still ordered */
    p->send_used = 0;
    p->stream = stream ? (cudaStream_t)stream : g->stream;
    return DDPLUG_OK;
  }
  int st = ddnccl_classify(g, p->recv, mem, "recv", &p->recv_host, &p->recv_pinned,
                    err, cap);
  if (st == DDPLUG_OK && p->send_used && p->send != p->recv)
    st = ddnccl_classify(g, p->send, mem, "send", &p->send_host, &p->send_pinned, err,
                  cap);
  else if (p->send_used) {
    p->send_host = p->recv_host;
    p->send_pinned = p->recv_pinned;
  }
  if (st != DDPLUG_OK) return st;
  if (p->send_used && p->send_host && p->recv_host) {
    const char *s = p->send, *r = p->recv;
    if (s >= r && s + p->send_bytes <= r + p->recv_bytes) p->send_in_recv = s - r;
  }
  int any_device = (p->send_used && !p->send_host) || !p->recv_host;
  p->stream = stream ? (cudaStream_t)stream
                     : any_device ? (cudaStream_t)0 : g->stream;
  return DDPLUG_OK;
}

/* "allreduce seq 7 (1024 x float32, sum)" for messages. */
static void describe(const ddplug_plugin_request *r, int32_t dtype, int32_t op,
                     int32_t root, uint64_t count, char *buf, size_t cap) {
  if (r->kind == DDPLUG_COLL_BARRIER)
    ddnccl_fmt(buf, cap, "barrier seq %llu", (unsigned long long)r->seq);
  else if (r->kind == DDPLUG_COLL_ALLREDUCE)
    ddnccl_fmt(buf, cap, "allreduce seq %llu (%llu x %s, %s)",
               (unsigned long long)r->seq, (unsigned long long)count,
               ddnccl_dtype_name(dtype), ddnccl_op_name(op));
  else if (r->kind == DDPLUG_COLL_BROADCAST)
    ddnccl_fmt(buf, cap, "broadcast seq %llu (%llu x %s from rank %d)",
               (unsigned long long)r->seq, (unsigned long long)count,
               ddnccl_dtype_name(dtype), root);
  else
    ddnccl_fmt(buf, cap, "%s seq %llu (%llu x %s)",
               ddnccl_kind_name(r->kind), (unsigned long long)r->seq,
               (unsigned long long)count, ddnccl_dtype_name(dtype));
}

/* See internal.h. */
ddplug_plugin_request *ddnccl_request_new(ddplug_plugin_group *g) {
  ddplug_plugin_request *r = g->spare;
  if (r) {
    g->spare = r->next;
  } else {
    r = malloc(sizeof *r);
    if (!r) return NULL;
  }
  memset(r, 0, offsetof(ddplug_plugin_request, what));
  r->what[0] = '\0';
  r->msg[0] = '\0';
  return r;
}

/* The NCCL call itself, under comm_mu. */
static ncclResult_t call_nccl(ddplug_plugin_group *g, const plan *p,
                              const void *dsend, void *drecv, int *gone) {
  ncclResult_t r = ncclSuccess;
  pthread_mutex_lock(&g->comm_mu);
  ncclComm_t comm = g->comm;
  *gone = comm == NULL;
  if (comm) {
    switch (p->kind) {
      case DDPLUG_COLL_BROADCAST:
        r = ncclBroadcast(dsend, drecv, (size_t)p->count, p->ndt, p->root, comm,
                          p->stream);
        break;
      case DDPLUG_COLL_ALLGATHER:
        r = ncclAllGather(dsend, drecv, (size_t)p->count, p->ndt, comm,
                          p->stream);
        break;
      default: /* allreduce, barrier */
        r = ncclAllReduce(dsend, drecv, (size_t)p->count, p->ndt, p->nop, comm,
                          p->stream);
        break;
    }
  }
  pthread_mutex_unlock(&g->comm_mu);
  return r;
}

/* Enqueue p on its stream; on success *out is a pending request. Any
 * failure fails the group (see the file comment). */
static int enqueue(ddplug_plugin_group *g, const plan *p,
                   ddplug_plugin_request *req) {
  const char *what = req->what;
  cudaError_t ce = cudaSuccess;
  ddnccl_stage *stage = NULL;
  size_t recv_part = p->recv_host ? align256(p->recv_bytes) : 0;
  size_t send_part =
      (p->send_used && p->send_host && p->send_in_recv < 0) ? p->send_bytes : 0;
  if (recv_part + send_part > 0) {
    ce = ddnccl_stage_get(&g->pool, recv_part + send_part, &stage);
    if (ce != cudaSuccess) goto cuda_failed;
  }
  char *drecv = p->recv_host ? (char *)stage->dev : (char *)p->recv;
  const char *dsend;
  if (!p->send_used) dsend = drecv;
  else if (!p->send_host) dsend = p->send;
  else if (p->send_in_recv >= 0) dsend = drecv + p->send_in_recv;
  else dsend = (char *)stage->dev + recv_part;

  if (g->last_event && g->last_stream != p->stream) {
    ce = cudaStreamWaitEvent(p->stream, g->last_event->ev, 0);
    if (ce != cudaSuccess) goto cuda_failed;
  }
  if (p->send_used && p->send_host) {
    const void *src = p->send;
    if (!p->send_pinned) {
      char *h = (char *)stage->host + (dsend - (char *)stage->dev);
      memcpy(h, p->send, p->send_bytes);
      src = h;
    }
    ce = cudaMemcpyAsync((void *)dsend, src, p->send_bytes,
                         cudaMemcpyHostToDevice, p->stream);
    if (ce != cudaSuccess) goto cuda_failed;
  }

  if (p->recv_bytes > 0 || p->kind == DDPLUG_COLL_BARRIER) {
    int gone = 0;
    ncclResult_t r = call_nccl(g, p, dsend, drecv, &gone);
    if (gone) return ddnccl_group_failed_status(g, 0);
    if (r == ncclInProgress) {
      /* A non-blocking communicator launches every collective from NCCL's
       * own thread: wait until it is on the stream (microseconds), so that
       * the event below follows it. Connections were set up at group
       * creation; a collective that needs another algorithm's connections
       * waits here for its peers, within the collective timeout counted
       * from the start of this collective. */
      uint64_t deadline = req->start_ns + (uint64_t)g->timeout_ms * 1000000ull;
      int st = ddnccl_settle(g, deadline, what, req->start_ns);
      if (st != DDPLUG_OK) return st;
    } else if (r != ncclSuccess) {
      return ddnccl_group_fail(g, ddnccl_status_of(r), 1,
                               "%s: NCCL refused it on rank %d: %s (%s)",
                               what, g->rank, ncclGetErrorString(r),
                               ncclGetLastError(NULL));
    }
  }

  if (p->recv_host) {
    void *dst = p->recv_pinned ? p->recv : stage->host;
    ce = cudaMemcpyAsync(dst, drecv, p->recv_bytes, cudaMemcpyDeviceToHost,
                         p->stream);
    if (ce != cudaSuccess) goto cuda_failed;
    if (!p->recv_pinned) {
      req->out_dst = p->recv;
      req->out_src = stage->host;
      req->out_bytes = p->recv_bytes;
    }
  }
  ddnccl_event *ev = NULL;
  ce = ddnccl_event_get(&g->pool, &ev);
  if (ce != cudaSuccess) goto cuda_failed;
  ce = cudaEventRecord(ev->ev, p->stream);
  if (ce != cudaSuccess) {
    ddnccl_event_put(&g->pool, ev);
    goto cuda_failed;
  }
  ddnccl_event_put(&g->pool, g->last_event);
  ev->refs++;
  g->last_event = ev;
  g->last_stream = p->stream;
  req->event = ev;
  req->stage = stage;
  return DDPLUG_OK;

cuda_failed:
  (void)cudaGetLastError();
  /* stage (if any) stays busy: copies may have been enqueued into it. */
  return ddnccl_group_fail(g, DDPLUG_E_SYSTEM, 1,
                           "%s: CUDA failed on rank %d (cuda:%d): %s: %s",
                           what, g->rank, g->device, cudaGetErrorName(ce),
                           cudaGetErrorString(ce));
}

/* The collective_start slot (see plugin.h): with DDPLUG_CAP_ASYNC it
 * returns once the operation is enqueued on its CUDA stream — NCCL has
 * launched it; the peers need not have reached it (group_create set up the
 * connections). Exception: a message size for which NCCL picks an algorithm
 * whose connections are not set up yet makes NCCL connect them first, which
 * needs the peers to reach the same collective; that wait is bounded by the
 * collective timeout and ended by an abort (README.md). With
 * plugin_options.check_mismatch, one comparison through the store (which
 * waits for rank 0) comes first. On failure *req is untouched; unless the failure is
 * MISMATCH (or the mismatch check's TIMEOUT), the group is failed as
 * explained above. Called from the group's slot thread only. */
int ddnccl_collective_start(ddplug_plugin_group *g,
                            const ddplug_coll_args *a,
                            ddplug_plugin_request **out) {
  if (!g) return DDPLUG_E_INVALID_ARGUMENT;
  if (!a || !out || !DDPLUG_HAS_FIELD(a, ddplug_coll_args, seq))
    return ddnccl_fail(g->svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl collective_start: args and req are required");
  if (atomic_load(&g->failed)) return ddnccl_group_failed_status(g, 0);

  /* sends and receives started before keep their place in the order */
  int fl = ddnccl_p2p_flush(g);
  if (fl != DDPLUG_OK) return fl;
  if (g->opts.check_mismatch) {
    int st = ddnccl_check_mismatch(g, a);
    if (st != DDPLUG_OK) return st;
  }
  ddplug_plugin_request *req = ddnccl_request_new(g);
  if (!req)
    return ddnccl_group_fail(g, DDPLUG_E_NO_MEMORY, 1,
                             "collective seq %llu: out of memory on rank %d",
                             (unsigned long long)a->seq, g->rank);
  req->group = g;
  req->seq = a->seq;
  req->kind = a->kind;
  describe(req, a->dtype, a->op, a->root, a->count, req->what, sizeof req->what);

  /* The collective timeout covers enqueuing and completion together. */
  req->start_ns = ddnccl_now_ns();

  char err[DDNCCL_MSG_MAX];
  plan p;
  int st = make_plan(g, a, &p, err, sizeof err);
  if (st != DDPLUG_OK) {
    st = ddnccl_group_fail(g, st, 1, "%s on rank %d: %s", req->what,
                           g->rank, err);
  } else {
    cudaError_t ce = ddnccl_use_device(g);
    if (ce != cudaSuccess)
      st = ddnccl_group_fail(g, DDPLUG_E_SYSTEM, 1,
                             "%s: cannot make cuda:%d current on rank %d: "
                             "%s", req->what, g->device, g->rank,
                             cudaGetErrorString(ce));
    else
      st = enqueue(g, &p, req);
  }
  if (st != DDPLUG_OK) {
    req->next = g->spare;
    g->spare = req;
    return st;
  }
  req->state = DDNCCL_PENDING;
  req->prev = NULL;
  req->next = g->live;
  if (g->live) g->live->prev = req;
  g->live = req;
  *out = req;
  return DDPLUG_OK;
}

/* ---- completion ---------------------------------------------------------- */

static int req_final(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (r->state == DDNCCL_DONE) return DDPLUG_OK;
  return ddnccl_fail(g->svc, r->status, "%s", r->msg);
}

/* Marks r failed with the group's failure (ABORTED for later calls). */
static int req_fail_from_group(ddplug_plugin_group *g, ddplug_plugin_request *r,
                               int status) {
  pthread_mutex_lock(&g->comm_mu);
  ddnccl_fmt(r->msg, sizeof r->msg, "%s did not complete: %s", r->what,
             g->fail_msg);
  pthread_mutex_unlock(&g->comm_mu);
  r->state = DDNCCL_FAILED;
  r->status = status;
  return ddnccl_fail(g->svc, status, "%s", r->msg);
}

/* One look: 1 done, 0 pending, else the failure status (r is final). */
static int poll_once(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (atomic_load(&g->failed))
    return req_fail_from_group(g, r, DDPLUG_E_ABORTED);
  cudaError_t ce = cudaEventQuery(r->event->ev);
  if (ce == cudaSuccess) {
    if (r->out_dst) memcpy(r->out_dst, r->out_src, r->out_bytes);
    ddnccl_stage_put(&g->pool, r->stage, NULL);
    r->stage = NULL;
    ddnccl_event_put(&g->pool, r->event);
    r->event = NULL;
    r->state = DDNCCL_DONE;
    return 1;
  }
  if (ce != cudaErrorNotReady) {
    (void)cudaGetLastError();
    int st = ddnccl_group_fail(g, DDPLUG_E_SYSTEM, 1,
                               "%s: CUDA reports %s on rank %d: %s",
                               r->what, cudaGetErrorName(ce), g->rank,
                               cudaGetErrorString(ce));
    return req_fail_from_group(g, r, st);
  }
  int st = ddnccl_check_async(g, r->what);
  if (st != DDPLUG_OK) return req_fail_from_group(g, r, st);
  return 0;
}

/* Past the collective timeout since start: abort the communicator (the
 * operation can no longer complete consistently) and report TIMEOUT, in the
 * same words as a collective that timed out while being enqueued; the
 * request is final (later waits: ABORTED). */
static int watchdog(ddplug_plugin_group *g, ddplug_plugin_request *r,
                    uint64_t now) {
  ddnccl_collective_timed_out(g, r->what, r->start_ns, now, 0);
  pthread_mutex_lock(&g->comm_mu);
  ddnccl_fmt(r->msg, sizeof r->msg, "%s", g->fail_msg);
  pthread_mutex_unlock(&g->comm_mu);
  r->state = DDNCCL_FAILED;
  r->status = DDPLUG_E_ABORTED; /* what later waits on r report */
  return ddnccl_fail(g->svc, DDPLUG_E_TIMEOUT, "%s", r->msg);
}

/* The request_wait slot (see plugin.h and README.md). Polls the request's
 * CUDA event (spinning for the first 1 ms, then sleeping up to 1 ms between
 * polls), the communicator's asynchronous error, and every 100 ms the
 * store's "abort" key. Returns:
 *   OK            complete (host results copied into the caller's buffer);
 *   TIMEOUT       timeout_ms passed first: r stays pending, wait again;
 *   TIMEOUT       final: the collective timeout passed since the start: the
 *                 communicator was aborted, peers told; later: ABORTED;
 *   PEER_LOST     NCCL reported a remote error (peer died / network);
 *   ABORTED       the group was aborted (here, by another thread, by a peer);
 *   SYSTEM, ...   a CUDA or NCCL error; the group is failed.
 * timeout_ms 0 polls once; < 0 means the group's collective timeout. */
int ddnccl_request_wait(ddplug_plugin_group *g, ddplug_plugin_request *r,
                        int64_t timeout_ms) {
  if (!g || !r) return DDPLUG_E_INVALID_ARGUMENT;
  if (r->state != DDNCCL_PENDING) return req_final(g, r);
  int fl = ddnccl_p2p_flush(g);
  if (fl != DDPLUG_OK) return req_fail_from_group(g, r, fl);
  if (timeout_ms < 0) timeout_ms = g->timeout_ms;
  if (timeout_ms > ((int64_t)1 << 40)) timeout_ms = (int64_t)1 << 40; /* no overflow */
  uint64_t start = ddnccl_now_ns();
  uint64_t deadline = start + (uint64_t)timeout_ms * 1000000ull;
  uint64_t dog = r->start_ns + (uint64_t)g->timeout_ms * 1000000ull;
  uint64_t next_store = start + STORE_POLL_NS;
  int64_t nap = 20;
  for (;;) {
    int st = poll_once(g, r);
    if (st == 1) return DDPLUG_OK;
    if (st != 0) return st;
    uint64_t now = ddnccl_now_ns();
    if (now >= dog) return watchdog(g, r, now);
    if (now >= deadline)
      return ddnccl_fail(
          g->svc, DDPLUG_E_TIMEOUT,
          "%s still running on rank %d after %.1f s (waited %lld ms); it stays "
          "pending until done or the collective timeout (%.1f s)",
          r->what, g->rank, (double)(now - r->start_ns) / 1e9,
          (long long)timeout_ms, (double)g->timeout_ms / 1e3);
    if (now >= next_store) {
      next_store = now + STORE_POLL_NS;
      st = ddnccl_check_peer_abort(g);
      if (st != DDPLUG_OK) return req_fail_from_group(g, r, DDPLUG_E_ABORTED);
    }
    if (now - start < SPIN_NS) continue;
    uint64_t wake = now + (uint64_t)nap * 1000u;
    if (wake > deadline) wake = deadline;
    if (wake > dog) wake = dog;
    ddnccl_sleep_us((int64_t)((wake - now) / 1000u));
    if (nap < 1000) nap *= 2;
  }
}

/* The request_test slot: one look, never sleeps and never calls the store
 * (a peer's abort is seen by the next request_wait, or by the runtime's
 * failure watcher calling group_abort). The collective timeout applies as
 * in request_wait. */
int ddnccl_request_test(ddplug_plugin_group *g, ddplug_plugin_request *r,
                        int32_t *done) {
  if (!g || !r || !done) return DDPLUG_E_INVALID_ARGUMENT;
  if (r->state != DDNCCL_PENDING) {
    int st = req_final(g, r);
    *done = st == DDPLUG_OK;
    return st;
  }
  int fl = ddnccl_p2p_flush(g);
  if (fl != DDPLUG_OK) return req_fail_from_group(g, r, fl);
  int st = poll_once(g, r);
  if (st == 1) {
    *done = 1;
    return DDPLUG_OK;
  }
  if (st != 0) return st;
  uint64_t now = ddnccl_now_ns();
  if (now >= r->start_ns + (uint64_t)g->timeout_ms * 1000000ull)
    return watchdog(g, r, now);
  *done = 0;
  return DDPLUG_OK;
}

/* The request_free slot. A request still pending (the runtime frees those
 * only after an abort) keeps its staging memory fenced by its event until
 * the GPU is done with it; nothing is waited for here. */
void ddnccl_request_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (!g || !r) return;
  for (int i = 0; i < g->p2p_n; i++) /* never launched: forgotten */
    if (g->p2p_queue[i] == r) {
      memmove(&g->p2p_queue[i], &g->p2p_queue[i + 1], (size_t)(g->p2p_n - i - 1) * sizeof r);
      g->p2p_n--;
      break;
    }
  if (r->prev) r->prev->next = r->next;
  else if (g->live == r) g->live = r->next;
  if (r->next) r->next->prev = r->prev;
  ddnccl_stage_put(&g->pool, r->stage, r->event);
  ddnccl_event_put(&g->pool, r->event);
  r->stage = NULL;
  r->event = NULL;
  int spares = 0;
  for (ddplug_plugin_request *s = g->spare; s && spares < MAX_SPARE; s = s->next)
    spares++;
  if (spares >= MAX_SPARE) {
    free(r);
    return;
  }
  r->next = g->spare;
  g->spare = r;
}
