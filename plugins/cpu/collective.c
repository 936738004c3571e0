/*
 * collective.c — the cpu plugin's collective slots: collective_start queues
 * a collective, request_wait / request_test run the queue (or wait while
 * another thread runs it) until the request completed, request_free
 * releases it. Who executes the queue, and the order guarantee, are
 * progress.c's; how one collective runs is plan.c's.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"


/* Queue a (validated, the caller's copy) as the next collective. Never
 * waits for peers. */
static int submit(ddcpu_group *g, const ddplug_coll_args *a, ddcpu_req **out) {
  int st = ddcpu_fail_status(g);
  if (st) {
    char d[160];
    ddcpu_desc desc;
    ddcpu_desc_fill(&desc, a, g->rank);
    ddcpu_desc_str(&desc, d, sizeof d);
    return ddcpu_err(st, "collective #%llu %s on rank %d not started: %s",
                     (unsigned long long)a->seq, d, g->rank, ddcpu_fail_get(g)->msg);
  }
  if ((st = ddcpu_coll_validate(g, a)) != DDPLUG_OK) return st;
  ddcpu_req *r = calloc(1, sizeof *r);
  if (!r)
    return ddcpu_err(DDPLUG_E_NO_MEMORY, "collective #%llu: out of memory",
                     (unsigned long long)a->seq);
  uint64_t scratch = ddcpu_coll_scratch_bytes(g, a);
  if (scratch > 0 && (scratch > SIZE_MAX || !(r->wide = malloc((size_t)scratch)))) {
    free(r);
    return ddcpu_err(DDPLUG_E_NO_MEMORY,
                     "collective #%llu (allreduce of %llu %s) on rank %d: cannot "
                     "allocate %llu bytes for its float32 partial sums; nothing "
                     "was started", (unsigned long long)a->seq,
                     (unsigned long long)a->count, ddcpu_dtype_name(a->dtype), g->rank,
                     (unsigned long long)scratch);
  }
  r->args = *a;
  r->submit_ns = ddcpu_now_ns();
  pthread_mutex_lock(&g->q_mu);
  r->k = ++g->next_k;
  r->prev = g->q_tail;
  if (g->q_tail) g->q_tail->next = r; else g->q_head = r;
  g->q_tail = r;
  r->anext = g->all;
  if (g->all) g->all->aprev = r;
  g->all = r;
  pthread_mutex_unlock(&g->q_mu);
  atomic_store(&g->last_submit_ns, r->submit_ns);
  if (g->progress_runs &&
      (!atomic_load(&g->lazy) || atomic_load(&g->thread_mode) == DDCPU_THREAD_ASLEEP))
    ddcpu_progress_wake(g);
  *out = r;
  return DDPLUG_OK;
}

/* A completed request's status, its sentence in this thread's buffer. */
static int request_status(ddcpu_req *r) {
  if (r->status != DDPLUG_OK) ddcpu_errmsg_set(r->msg);
  return r->status;
}

/* Blocks at most timeout_ms (0 polls once). */
static int wait_request(ddcpu_group *g, ddcpu_req *r, int64_t timeout_ms) {
  uint64_t start = ddcpu_now_ns();
  uint64_t deadline = timeout_ms <= 0 ? start : start + (uint64_t)timeout_ms * 1000000ull;
  if (!atomic_load_explicit(&r->done, memory_order_acquire) &&
      start - r->submit_ns < DDCPU_SYNC_WAIT_NS)
    atomic_store(&g->lazy, 1);
  for (;;) {
    if (atomic_load_explicit(&r->done, memory_order_acquire)) return request_status(r);
    uint32_t seen = atomic_load(&g->ev.val);
    if (ddcpu_exec_try(g)) {
      int st = ddcpu_run_queue(g, r, deadline, 0);
      int more = ddcpu_queue_head(g) != NULL;
      ddcpu_exec_release(g);
      if (st == DDCPU_AGAIN) {
        if (more) { /* finish in the background */
          atomic_store(&g->handoff, 1);
          ddcpu_progress_wake(g);
        }
        break;
      }
      continue;
    }
    uint64_t now = ddcpu_now_ns();
    if (now >= deadline) break;
    /* another thread executes: sleep until it completes something or lets go */
    atomic_fetch_add(&g->callers_waiting, 1);
    ddcpu_ctr_sleep(&g->ev, seen, DDCPU_MIN(deadline - now, 50ull * 1000 * 1000), 1);
    atomic_fetch_sub(&g->callers_waiting, 1);
  }
  if (atomic_load_explicit(&r->done, memory_order_acquire)) return request_status(r);
  char why[DDCPU_MSG_MAX], d[160];
  ddcpu_desc desc;
  ddcpu_desc_fill(&desc, &r->args, g->rank);
  ddcpu_desc_str(&desc, d, sizeof d);
  ddcpu_hs_missing(g, r->k, why, sizeof why);
  return ddcpu_err(DDPLUG_E_TIMEOUT,
                   "collective #%llu %s on rank %d did not complete within %lld ms: "
                   "%s (the request is still pending)",
                   (unsigned long long)r->args.seq, d, g->rank,
                   (long long)DDCPU_MAX(timeout_ms, 0), why);
}

/* Never waits for peers; may do local work that is ready. */
static int test_request(ddcpu_group *g, ddcpu_req *r, int32_t *done) {
  if (!atomic_load_explicit(&r->done, memory_order_acquire) && ddcpu_exec_try(g)) {
    int st = ddcpu_run_queue(g, r, ddcpu_now_ns(), 0);
    int more = ddcpu_queue_head(g) != NULL;
    ddcpu_exec_release(g);
    if (st == DDCPU_AGAIN && more && g->progress_runs) ddcpu_progress_wake(g);
  }
  if (atomic_load_explicit(&r->done, memory_order_acquire)) {
    *done = 1;
    return request_status(r);
  }
  *done = 0;
  return DDPLUG_OK;
}

/* See internal.h. */
int ddcpu_pending(ddcpu_group *g) {
  int n = 0;
  pthread_mutex_lock(&g->q_mu);
  for (ddcpu_req *r = g->q_head; r; r = r->next) n++;
  pthread_mutex_unlock(&g->q_mu);
  return n;
}

/* See internal.h. */
void ddcpu_free_all_requests(ddcpu_group *g) {
  pthread_mutex_lock(&g->q_mu);
  ddcpu_req *r = g->all;
  g->all = NULL;
  g->q_head = g->q_tail = NULL;
  pthread_mutex_unlock(&g->q_mu);
  while (r) {
    ddcpu_req *n = r->anext;
    free(r->wide);
    free(r);
    r = n;
  }
}

/* ---- the slots (see plugin.h) --------------------------------------------- */

/* Start a collective (see plugin.h): enqueues it and returns; never waits
 * for peers. On failure nothing was started and *req is untouched. */
int ddcpu_collective_start(ddplug_plugin_group *g, const ddplug_coll_args *args,
                           ddplug_plugin_request **req) {
  if (!g || !args || !req) return DDPLUG_E_INVALID_ARGUMENT;
  if (!DDPLUG_HAS_FIELD(args, ddplug_coll_args, reserved0))
    return ddcpu_report(g->svc, ddcpu_err(DDPLUG_E_ABI_MISMATCH,
                                          "collective_start: ddplug_coll_args of %u "
                                          "bytes is older than ABI 1.0", args->struct_size));
  ddplug_coll_args a;
  memset(&a, 0, sizeof a);
  memcpy(&a, args, DDCPU_MIN((size_t)args->struct_size, sizeof a));
  return ddcpu_report(g->svc, submit(g, &a, req));
}

/* Wait for a request (see plugin.h); TIMEOUT leaves it pending. Sends and
 * receives are p2p.c's. */
int ddcpu_request_wait(ddplug_plugin_group *g, ddplug_plugin_request *req,
                       int64_t timeout_ms) {
  if (!g || !req) return DDPLUG_E_INVALID_ARGUMENT;
  if (ddcpu_req_kind(req) == DDCPU_REQ_P2P)
    return ddcpu_report(g->svc, ddcpu_p2p_wait(g, (ddcpu_p2p_op *)req, timeout_ms));
  return ddcpu_report(g->svc, wait_request(g, req, timeout_ms));
}

/* Test a request without blocking (see plugin.h). */
int ddcpu_request_test(ddplug_plugin_group *g, ddplug_plugin_request *req,
                       int32_t *done) {
  if (!g || !req || !done) return DDPLUG_E_INVALID_ARGUMENT;
  if (ddcpu_req_kind(req) == DDCPU_REQ_P2P)
    return ddcpu_report(g->svc, ddcpu_p2p_test(g, (ddcpu_p2p_op *)req, done));
  return ddcpu_report(g->svc, test_request(g, req, done));
}

/* Release a request (see plugin.h). A pending one stays in the queue (it
 * still executes in order, its buffers must stay valid) and is released
 * when it completes or when the group is destroyed. */
void ddcpu_request_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (!g || !r) return;
  if (ddcpu_req_kind(r) == DDCPU_REQ_P2P) {
    ddcpu_p2p_free(g, (ddcpu_p2p_op *)r);
    return;
  }
  int release = 0;
  pthread_mutex_lock(&g->q_mu);
  if (atomic_load(&r->done)) {
    if (r->aprev) r->aprev->anext = r->anext; else g->all = r->anext;
    if (r->anext) r->anext->aprev = r->aprev;
    release = 1;
  } else {
    r->user_freed = 1;
  }
  pthread_mutex_unlock(&g->q_mu);
  if (release) free(r);
}
