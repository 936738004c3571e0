/*
 * p2p.c — point-to-point on NCCL (plugin.h, p2p_start): ncclSend and
 * ncclRecv, with the buffers and requests of a collective (staging for host
 * memory, a CUDA event per launch, request_wait / _test / _free as in
 * collective.c).
 *
 * Fused launches. NCCL needs a send and a receive that wait for each other
 * (two ranks exchanging messages, torch's batch_isend_irecv) in one
 * ncclGroupStart / ncclGroupEnd section, or they may deadlock beyond
 * NCCL's buffers. p2p_start therefore only queues; the queue is launched as
 * one section at the next call into the group that needs it to move:
 * request_wait, request_test, collective_start (which keeps the order of
 * the group's operations), group_destroy drops what was never launched. So
 * sends and receives started back to back — as torch does — are fused.
 * A send or receive whose stream differs from the queued ones launches the
 * queue first.
 *
 * Tags: NCCL matches a send with a receive by order between two ranks and
 * has no tags. Ignoring them (as torch's NCCL backend does) would match a
 * receive with a message of another tag silently, so the plugin takes tag
 * 0 only and refuses another with UNSUPPORTED saying so. Receives from any
 * source: not possible in NCCL (DDPLUG_CAP_P2P_ANY_SOURCE unset: the
 * runtime refuses them). A count or dtype that differ between the two sides
 * are not detected by NCCL (the pair hangs or copies garbage, as with
 * NCCL itself): the plugin does not claim DDPLUG_CAP_MISMATCH_CHECK.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int queue_add(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (g->p2p_n == g->p2p_cap) {
    int cap = g->p2p_cap ? 2 * g->p2p_cap : 16;
    ddplug_plugin_request **q = realloc(g->p2p_queue, (size_t)cap * sizeof *q);
    if (!q) return -1;
    g->p2p_queue = q;
    g->p2p_cap = cap;
  }
  g->p2p_queue[g->p2p_n++] = r;
  return 0;
}

/* The stream a send or receive runs on: the caller's, else the default
 * stream for device memory (ordered after the caller's default-stream
 * work), else the group's internal one. */
static cudaStream_t stream_of(ddplug_plugin_group *g, const ddplug_plugin_request *r) {
  if (r->p2p_stream) return r->p2p_stream;
  return r->p2p_host ? g->stream : (cudaStream_t)0;
}

/* Launch the queued sends and receives as one NCCL section (see the file
 * comment). Any failure fails the group: a peer may be waiting inside NCCL
 * for its part. */
int ddnccl_p2p_flush(ddplug_plugin_group *g) {
  if (g->p2p_n == 0) return DDPLUG_OK;
  int n = g->p2p_n;
  g->p2p_n = 0;
  if (atomic_load(&g->failed)) return ddnccl_group_failed_status(g, 0);
  ddplug_plugin_request **q = g->p2p_queue;
  const char *what = q[0]->what;
  char many[160];
  if (n > 1) {
    ddnccl_fmt(many, sizeof many, "%d fused sends and receives (the first: %s)", n, q[0]->what);
    what = many;
  }
  cudaError_t ce = ddnccl_use_device(g);
  if (ce != cudaSuccess) goto cuda_failed;
  cudaStream_t stream = stream_of(g, q[0]);
  if (g->last_event && g->last_stream != stream) {
    ce = cudaStreamWaitEvent(stream, g->last_event->ev, 0);
    if (ce != cudaSuccess) goto cuda_failed;
  }
  /* host buffers: staging, and the sends' bytes copied in */
  for (int i = 0; i < n; i++) {
    ddplug_plugin_request *r = q[i];
    r->p2p_dev = r->p2p_buf;
    if (!r->p2p_host || r->p2p_bytes == 0) continue;
    ce = ddnccl_stage_get(&g->pool, r->p2p_bytes, &r->stage);
    if (ce != cudaSuccess) goto cuda_failed;
    r->p2p_dev = r->stage->dev;
    if (r->kind == DDNCCL_KIND_SEND) {
      const void *src = r->p2p_buf;
      if (!r->p2p_pinned) {
        memcpy(r->stage->host, r->p2p_buf, r->p2p_bytes);
        src = r->stage->host;
      }
      ce = cudaMemcpyAsync(r->p2p_dev, src, r->p2p_bytes, cudaMemcpyHostToDevice, stream);
      if (ce != cudaSuccess) goto cuda_failed;
    }
  }
  pthread_mutex_lock(&g->comm_mu);
  ncclComm_t comm = g->comm;
  ncclResult_t nr = ncclSuccess;
  if (comm) {
    nr = ncclGroupStart();
    for (int i = 0; i < n && nr == ncclSuccess; i++) {
      ddplug_plugin_request *r = q[i];
      nr = r->kind == DDNCCL_KIND_SEND
               ? ncclSend(r->p2p_dev, (size_t)r->p2p_count, r->p2p_ndt, r->p2p_peer, comm, stream)
               : ncclRecv(r->p2p_dev, (size_t)r->p2p_count, r->p2p_ndt, r->p2p_peer, comm, stream);
    }
    ncclResult_t end = ncclGroupEnd();
    if (nr == ncclSuccess) nr = end;
  }
  pthread_mutex_unlock(&g->comm_mu);
  if (!comm) return ddnccl_group_failed_status(g, 0);
  if (nr == ncclInProgress) {
    uint64_t deadline = q[0]->start_ns + (uint64_t)g->timeout_ms * 1000000ull;
    int st = ddnccl_settle(g, deadline, what, q[0]->start_ns);
    if (st != DDPLUG_OK) return st;
  } else if (nr != ncclSuccess) {
    return ddnccl_group_fail(g, ddnccl_status_of(nr), 1, "%s: NCCL refused it on rank %d: %s (%s)",
                             what, g->rank, ncclGetErrorString(nr), ncclGetLastError(NULL));
  }
  /* host receives: copied back, then into pageable memory once done */
  for (int i = 0; i < n; i++) {
    ddplug_plugin_request *r = q[i];
    if (r->kind != DDNCCL_KIND_RECV || !r->p2p_host || r->p2p_bytes == 0) continue;
    void *dst = r->p2p_pinned ? r->p2p_buf : r->stage->host;
    ce = cudaMemcpyAsync(dst, r->p2p_dev, r->p2p_bytes, cudaMemcpyDeviceToHost, stream);
    if (ce != cudaSuccess) goto cuda_failed;
    if (!r->p2p_pinned) {
      r->out_dst = r->p2p_buf;
      r->out_src = r->stage->host;
      r->out_bytes = r->p2p_bytes;
    }
  }
  ddnccl_event *ev = NULL;
  ce = ddnccl_event_get(&g->pool, &ev);
  if (ce != cudaSuccess) goto cuda_failed;
  ce = cudaEventRecord(ev->ev, stream);
  if (ce != cudaSuccess) {
    ddnccl_event_put(&g->pool, ev);
    goto cuda_failed;
  }
  /* one reference per request, one for the group (ddnccl_event_get gave one) */
  for (int i = 0; i < n; i++) {
    q[i]->event = ev;
    ev->refs++;
  }
  ddnccl_event_put(&g->pool, g->last_event);
  g->last_event = ev;
  g->last_stream = stream;
  return DDPLUG_OK;

cuda_failed:
  (void)cudaGetLastError();
  return ddnccl_group_fail(g, DDPLUG_E_SYSTEM, 1, "%s: CUDA failed on rank %d (cuda:%d): %s: %s",
                           what, g->rank, g->device, cudaGetErrorName(ce), cudaGetErrorString(ce));
}

/* The p2p_start slot (see plugin.h and the file comment): checks and
 * queues; never waits for the peer. On failure *req is untouched and
 * nothing was queued. */
int ddnccl_p2p_start(ddplug_plugin_group *g, const ddplug_p2p_args *a,
                     ddplug_plugin_request **out) {
  if (!g) return DDPLUG_E_INVALID_ARGUMENT;
  if (!a || !out || !DDPLUG_HAS_FIELD(a, ddplug_p2p_args, reserved0))
    return ddnccl_fail(g->svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl p2p_start: args (ABI 1.4) and req are required");
  if (atomic_load(&g->failed)) return ddnccl_group_failed_status(g, 0);
  int send = a->kind == DDPLUG_P2P_SEND;
  const char *op = send ? "send" : "receive";
  if (a->tag != 0)
    return ddnccl_fail(g->svc, DDPLUG_E_UNSUPPORTED,
                       "%s with tag %lld: plugin nccl matches sends and receives by their "
                       "order between two ranks, as NCCL does, and takes tag 0 only (NCCL "
                       "has no tags); leave the tag out", op, (long long)a->tag);
  if ((a->kind != DDPLUG_P2P_SEND && a->kind != DDPLUG_P2P_RECV) || a->peer < 0 ||
      a->peer >= g->world || a->peer == g->rank)
    return ddnccl_fail(g->svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl p2p_start: kind %d with peer %d is not a send or receive to "
                       "another rank of %d", a->kind, a->peer, g->world);
  ncclDataType_t ndt;
  if (ddnccl_dtype(a->dtype, &ndt) != 0)
    return ddnccl_fail(g->svc, DDPLUG_E_UNSUPPORTED, "dtype %d is not supported by NCCL",
                       a->dtype);
  size_t es = ddnccl_dtype_size(a->dtype);
  if (a->count > (uint64_t)(SIZE_MAX / es))
    return ddnccl_fail(g->svc, DDPLUG_E_INVALID_ARGUMENT, "count %llu is too large",
                       (unsigned long long)a->count);
  ddplug_plugin_request *r = ddnccl_request_new(g);
  if (!r) return ddnccl_fail(g->svc, DDPLUG_E_NO_MEMORY, "%s: out of memory on rank %d", op, g->rank);
  r->group = g;
  r->kind = send ? DDNCCL_KIND_SEND : DDNCCL_KIND_RECV;
  r->p2p_buf = a->buf;
  r->p2p_count = a->count;
  r->p2p_bytes = (size_t)a->count * es;
  r->p2p_ndt = ndt;
  r->p2p_peer = a->peer;
  r->p2p_stream = (cudaStream_t)a->stream;
  r->start_ns = ddnccl_now_ns();
  if (!send && a->source) *a->source = a->peer; /* NCCL receives from the named rank only */
  ddnccl_fmt(r->what, sizeof r->what, "%s of %llu x %s %s rank %d", op,
             (unsigned long long)a->count, ddnccl_dtype_name(a->dtype), send ? "to" : "from",
             a->peer);
  char err[DDNCCL_MSG_MAX] = "";
  int st = DDPLUG_OK;
  if (r->p2p_bytes > 0)
    st = ddnccl_classify(g, a->buf, a->mem, send ? "send" : "receive", &r->p2p_host,
                         &r->p2p_pinned, err, sizeof err);
  else
    r->p2p_host = 1; /* nothing to move: the internal stream */
  if (st == DDPLUG_OK && g->p2p_n > 0 && stream_of(g, g->p2p_queue[0]) != stream_of(g, r))
    st = ddnccl_p2p_flush(g);
  if (st == DDPLUG_OK && queue_add(g, r) != 0) st = DDPLUG_E_NO_MEMORY, ddnccl_fmt(err, sizeof err, "out of memory");
  if (st != DDPLUG_OK) {
    r->next = g->spare;
    g->spare = r;
    if (err[0]) return ddnccl_fail(g->svc, st, "%s on rank %d: %s", r->what, g->rank, err);
    return st;
  }
  r->state = DDNCCL_PENDING;
  r->prev = NULL;
  r->next = g->live;
  if (g->live) g->live->prev = r;
  g->live = r;
  *out = r;
  return DDPLUG_OK;
}
