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

#include "internal.h"

#define DDNCCL_STAGE_MIN ((size_t)64 * 1024)

cudaError_t ddnccl_event_get(ddnccl_pool *p, ddnccl_event **out) {
  ddnccl_event *e = p->free_events;
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

void ddnccl_event_put(ddnccl_pool *p, ddnccl_event *e) {
  if (!e || --e->refs > 0) return;
  e->next = p->free_events;
  p->free_events = e;
}

static size_t round_up(size_t bytes) {
  size_t c = DDNCCL_STAGE_MIN;
  while (c < bytes && c < ((size_t)1 << 62)) c <<= 1;
  return c < bytes ? bytes : c;
}

static void stage_release(ddnccl_stage *s) {
  if (s->dev) (void)cudaFree(s->dev);
  if (s->host) (void)cudaFreeHost(s->host);
  free(s);
}

cudaError_t ddnccl_stage_get(ddnccl_pool *p, size_t bytes,
                             ddnccl_stage **out) {
  ddnccl_stage *best = NULL, **small = NULL;
  for (ddnccl_stage **it = &p->stages; *it; it = &(*it)->next) {
    ddnccl_stage *s = *it;
    if (s->busy && s->fence && cudaEventQuery(s->fence->ev) == cudaSuccess) {
      ddnccl_event_put(p, s->fence);
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
    ddnccl_stage *s = *small;
    *small = s->next;
    stage_release(s);
  }
  ddnccl_stage *s = calloc(1, sizeof *s);
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

void ddnccl_stage_put(ddnccl_pool *p, ddnccl_stage *s,
                      ddnccl_event *fence) {
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
static int fence_done(ddnccl_event *e, uint64_t deadline_ns) {
  for (;;) {
    cudaError_t ce = cudaEventQuery(e->ev);
    if (ce == cudaSuccess) return 1;
    if (ce != cudaErrorNotReady) return 0; /* sticky error: never trust it */
    if (ddnccl_now_ns() >= deadline_ns) return 0;
    ddnccl_sleep_us(1000);
  }
}

int ddnccl_pool_destroy(ddnccl_pool *p, uint64_t deadline_ns) {
  int leaked = 0;
  while (p->stages) {
    ddnccl_stage *s = p->stages;
    p->stages = s->next;
    int safe = !s->fence || fence_done(s->fence, deadline_ns);
    if (s->fence) ddnccl_event_put(p, s->fence);
    if (safe) {
      stage_release(s);
    } else {
      free(s); /* its device and pinned memory stay: the GPU may write them */
      leaked++;
    }
  }
  while (p->free_events) {
    ddnccl_event *e = p->free_events;
    p->free_events = e->next;
    (void)cudaEventDestroy(e->ev); /* released once complete, never blocks */
    free(e);
  }
  return leaked;
}
