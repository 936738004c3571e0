/*
 * staging.c — the group's pools: CUDA events (one per request, reused) and
 * host↔device staging pairs for collectives on host buffers.
 *
 * Host buffers go through pinned memory so that every copy is truly
 * asynchronous: a cudaMemcpyAsync from pageable memory may synchronize with
 * the stream, i.e. wait for an earlier collective that could be stuck on a
 * peer — an unbounded wait the plugin must never make. The CPU copies
 * user ↔ pinned happen in collective_start (in) and when the request is
 * seen complete (out).
 *
 * Creating events and pinned buffers costs microseconds to milliseconds,
 * so both are pooled for the group's lifetime. Not thread-safe: used by the
 * slot thread only (the runtime serializes slots of one group).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdlib.h>

#include "nccl_plugin.h"

#define DDPLUG_NCCL__STAGE_MIN ((size_t)64 * 1024)

cudaError_t ddplug_nccl__event_get(ddplug_nccl_pool *p, ddplug_nccl_event **out) {
  ddplug_nccl_event *e = p->free_events;
  if (e) {
    p->free_events = e->next;
  } else {
    e = calloc(1, sizeof *e);
    if (!e) return cudaErrorMemoryAllocation;
    cudaError_t ce = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
      free(e);
      return ce;
    }
  }
  e->refs = 1;
  e->next = NULL;
  *out = e;
  return cudaSuccess;
}

void ddplug_nccl__event_put(ddplug_nccl_pool *p, ddplug_nccl_event *e) {
  if (!e || --e->refs > 0) return;
  e->next = p->free_events;
  p->free_events = e;
}

static size_t round_up(size_t bytes) {
  size_t c = DDPLUG_NCCL__STAGE_MIN;
  while (c < bytes && c < ((size_t)1 << 62)) c <<= 1;
  return c < bytes ? bytes : c;
}

static void stage_release(ddplug_nccl_stage *s) {
  if (s->dev) (void)cudaFree(s->dev);
  if (s->host) (void)cudaFreeHost(s->host);
  free(s);
}

cudaError_t ddplug_nccl__stage_get(ddplug_nccl_pool *p, size_t bytes,
                                   ddplug_nccl_stage **out) {
  ddplug_nccl_stage *best = NULL, **small = NULL;
  for (ddplug_nccl_stage **it = &p->stages; *it; it = &(*it)->next) {
    ddplug_nccl_stage *s = *it;
    if (s->busy && s->fence && cudaEventQuery(s->fence->ev) == cudaSuccess) {
      ddplug_nccl__event_put(p, s->fence);
      s->fence = NULL;
      s->busy = 0;
    }
    if (s->busy) continue;
    if (s->cap >= bytes) {
      if (!best || s->cap < best->cap) best = s;
    } else if (!small) {
      small = it;
    }
  }
  if (best) {
    best->busy = 1;
    *out = best;
    return cudaSuccess;
  }
  if (small) { /* replace an idle stage that is too small, not pile up */
    ddplug_nccl_stage *s = *small;
    *small = s->next;
    stage_release(s);
  }
  ddplug_nccl_stage *s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  s->cap = round_up(bytes);
  cudaError_t ce = cudaMalloc(&s->dev, s->cap);
  if (ce == cudaSuccess) ce = cudaHostAlloc(&s->host, s->cap, cudaHostAllocDefault);
  if (ce != cudaSuccess) {
    stage_release(s);
    return ce;
  }
  s->busy = 1;
  s->next = p->stages;
  p->stages = s;
  *out = s;
  return cudaSuccess;
}

void ddplug_nccl__stage_put(ddplug_nccl_pool *p, ddplug_nccl_stage *s,
                            ddplug_nccl_event *fence) {
  if (!s) return;
  if (fence && cudaEventQuery(fence->ev) != cudaSuccess) {
    (void)cudaGetLastError(); /* a failed query must not linger as "last" */
    fence->refs++;
    s->fence = fence;
    return;
  }
  (void)p;
  s->busy = 0;
}

/* Polls until ev completes or deadline_ns passes; 1 if complete. */
static int fence_done(ddplug_nccl_event *e, uint64_t deadline_ns) {
  for (;;) {
    cudaError_t ce = cudaEventQuery(e->ev);
    if (ce == cudaSuccess) return 1;
    if (ce != cudaErrorNotReady) return 0; /* sticky error: never trust it */
    if (ddplug_nccl__now_ns() >= deadline_ns) return 0;
    ddplug_nccl__sleep_us(1000);
  }
}

int ddplug_nccl__pool_destroy(ddplug_nccl_pool *p, uint64_t deadline_ns) {
  int leaked = 0;
  while (p->stages) {
    ddplug_nccl_stage *s = p->stages;
    p->stages = s->next;
    int safe = !s->fence || fence_done(s->fence, deadline_ns);
    if (s->fence) ddplug_nccl__event_put(p, s->fence);
    if (safe) {
      stage_release(s);
    } else {
      free(s); /* its device and pinned memory stay: the GPU may write them */
      leaked++;
    }
  }
  while (p->free_events) {
    ddplug_nccl_event *e = p->free_events;
    p->free_events = e->next;
    (void)cudaEventDestroy(e->ev); /* released once complete, never blocks */
    free(e);
  }
  return leaked;
}
