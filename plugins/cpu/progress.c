/*
 * progress.c — requests, their order, and who executes them.
 *
 * Ordering guarantee: collectives of a group execute and complete in the
 * order they were started, on every rank (the n-th start is the n-th
 * collective everywhere). A request is complete when request_wait/test says
 * so; its buffers may be reused from then on.
 *
 * Execution: exactly one thread at a time holds the executor role and
 * advances the oldest pending request (collective phases never block; the
 * executor waits between steps, see wait.c). Two kinds of thread take it:
 *   - the caller, inside request_wait/request_test: a blocking collective
 *     (start then wait at once) runs inline on the caller's thread, with no
 *     thread hand-off — this is what makes an 8-byte allreduce cost a few
 *     microseconds;
 *   - the group's progress thread, for requests nobody waits on: a trainer
 *     starts gradient allreduces during backward and waits later; the
 *     progress thread runs them meanwhile.
 * The engine adapts: when callers wait right after starting (within
 * 100 µs), start does not wake the progress thread (it would only compete
 * for the CPU); the thread then checks for stranded requests every
 * millisecond and claims any older than 1 ms, which switches the engine back
 * to waking it at every start. After a second without collectives the
 * thread sleeps deeply (100 ms polls for liveness) and every start wakes it.
 * request_wait with a timeout that expires leaves its request pending and
 * hands execution to the progress thread, which finishes it in the
 * background; a later wait finds it done.
 *
 * With plugin_options.progress_thread "off" the thread never claims
 * requests nobody waits for: they run inside the caller's wait or test. It
 * still finishes what a timed-out wait handed over, and it still watches
 * the peers. ("auto", the default, is on: README.md, "Overlap", has the
 * measurements.)
 *
 * The idle progress thread also watches liveness (same-node pidfds, ring
 * sockets) so a peer's death is noticed, and forwarded to other nodes, even
 * while this rank computes.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu.h"

#define SYNC_WAIT_NS (100ull * 1000)      /* wait this soon after start: sync */
#define STRANDED_NS (1000ull * 1000)      /* claim requests older than this  */
#define DEEP_AFTER_NS (1000ull * 1000 * 1000)
#define THREAD_SLICE_MS 100

static int try_exec(ddcpu_group *g) {
  int expect = 0;
  return atomic_compare_exchange_strong(&g->exec, &expect, 1);
}

static void bump(ddcpu_group *g) {
  atomic_fetch_add(&g->ev.val, 1);
  ddcpu_ctr_wake(&g->ev);
}

static void release_exec(ddcpu_group *g) {
  atomic_store(&g->exec, 0);
  bump(g);
}

static void wake_thread(ddcpu_group *g) {
  uint64_t one = 1;
  if (g->wake_fd >= 0) (void)!write(g->wake_fd, &one, sizeof one);
}

static ddcpu_req *head(ddcpu_group *g) {
  pthread_mutex_lock(&g->q_mu);
  ddcpu_req *r = g->q_head;
  pthread_mutex_unlock(&g->q_mu);
  return r;
}

/* Whether a request is pending and, if so, when the oldest was started
 * (read under the lock: a caller may complete and free it right after). */
static int oldest_pending(ddcpu_group *g, uint64_t *submit_ns) {
  pthread_mutex_lock(&g->q_mu);
  ddcpu_req *r = g->q_head;
  if (r) *submit_ns = r->submit_ns;
  pthread_mutex_unlock(&g->q_mu);
  return r != NULL;
}

/* Mark r complete with status st (the sentence is in this thread's buffer)
 * and release it if its owner already freed it. */
static void complete(ddcpu_group *g, ddcpu_req *r, int st) {
  r->status = st;
  free(r->wide); /* executor-only scratch, unused from now on */
  r->wide = NULL;
  if (st != DDPLUG_OK) {
    char d[160];
    ddcpu_desc desc;
    ddcpu_desc_fill(&desc, &r->args, g->rank);
    ddcpu_desc_str(&desc, d, sizeof d);
    snprintf(r->msg, sizeof r->msg, "collective #%llu %s on rank %d: %s",
             (unsigned long long)r->args.seq, d, g->rank, ddcpu_errmsg());
  }
  int release = 0;
  pthread_mutex_lock(&g->q_mu);
  if (r->prev) r->prev->next = r->next; else g->q_head = r->next;
  if (r->next) r->next->prev = r->prev; else g->q_tail = r->prev;
  r->next = r->prev = NULL;
  atomic_store_explicit(&r->done, 1, memory_order_release);
  if (r->user_freed) {
    if (r->aprev) r->aprev->anext = r->anext; else g->all = r->anext;
    if (r->anext) r->anext->aprev = r->aprev;
    release = 1;
  }
  pthread_mutex_unlock(&g->q_mu);
  if (release) free(r);
  bump(g);
}

/* Execute pending requests in order until `until` completes (NULL: until
 * none is left) or the deadline passes (DDCPU_AGAIN). Caller holds exec. */
static int run_queue(ddcpu_group *g, ddcpu_req *until, uint64_t deadline, int by_thread) {
  g->exec_by_thread = by_thread;
  for (;;) {
    ddcpu_req *r = head(g);
    if (!r) return DDPLUG_OK;
    if (by_thread) atomic_store(&r->by_thread, 1);
    int st = ddcpu_coll_advance(g, r, deadline);
    if (st == DDCPU_AGAIN) return DDCPU_AGAIN;
    int last = r == until;
    complete(g, r, st);
    if (last) return DDPLUG_OK;
  }
}

/* See cpu.h. Never waits for peers. */
int ddcpu_submit(ddcpu_group *g, const ddplug_coll_args *a, ddcpu_req **out) {
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
      (!atomic_load(&g->lazy) || atomic_load(&g->pt_mode) == DDCPU_PT_DEEP))
    wake_thread(g);
  *out = r;
  return DDPLUG_OK;
}

static int report(ddcpu_req *r) {
  if (r->status != DDPLUG_OK) ddcpu_errmsg_set(r->msg);
  return r->status;
}

/* See cpu.h. Blocks at most timeout_ms (0 polls once). */
int ddcpu_req_wait(ddcpu_group *g, ddcpu_req *r, int64_t timeout_ms) {
  uint64_t start = ddcpu_now_ns();
  uint64_t deadline = timeout_ms <= 0 ? start : start + (uint64_t)timeout_ms * 1000000ull;
  if (!atomic_load_explicit(&r->done, memory_order_acquire) &&
      start - r->submit_ns < SYNC_WAIT_NS)
    atomic_store(&g->lazy, 1);
  for (;;) {
    if (atomic_load_explicit(&r->done, memory_order_acquire)) return report(r);
    uint32_t seen = atomic_load(&g->ev.val);
    if (try_exec(g)) {
      int st = run_queue(g, r, deadline, 0);
      int more = head(g) != NULL;
      release_exec(g);
      if (st == DDCPU_AGAIN) {
        if (more) { /* finish in the background */
          atomic_store(&g->handoff, 1);
          wake_thread(g);
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
  if (atomic_load_explicit(&r->done, memory_order_acquire)) return report(r);
  char why[DDCPU_MSG_MAX], d[160];
  ddcpu_desc desc;
  ddcpu_desc_fill(&desc, &r->args, g->rank);
  ddcpu_desc_str(&desc, d, sizeof d);
  ddcpu_hs_missing(g, r->k, why, sizeof why);
  return ddcpu_err(DDPLUG_E_TIMEOUT,
                   "collective #%llu %s on rank %d did not complete within %lld ms: "
                   "%s (the request is still pending; wait again or abort)",
                   (unsigned long long)r->args.seq, d, g->rank,
                   (long long)DDCPU_MAX(timeout_ms, 0), why);
}

/* See cpu.h. Never waits for peers; may do local work that is ready. */
int ddcpu_req_test(ddcpu_group *g, ddcpu_req *r, int32_t *done) {
  if (!atomic_load_explicit(&r->done, memory_order_acquire) && try_exec(g)) {
    int st = run_queue(g, r, ddcpu_now_ns(), 0);
    int more = head(g) != NULL;
    release_exec(g);
    if (st == DDCPU_AGAIN && more && g->progress_runs) wake_thread(g);
  }
  if (atomic_load_explicit(&r->done, memory_order_acquire)) {
    *done = 1;
    return report(r);
  }
  *done = 0;
  return DDPLUG_OK;
}

/* See cpu.h. A pending request stays in the queue (it still executes in
 * order, its buffers must stay valid) and is released when it completes or
 * when the group is destroyed. */
void ddcpu_req_free(ddcpu_group *g, ddcpu_req *r) {
  if (!r) return;
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

int ddcpu_pending(ddcpu_group *g) {
  int n = 0;
  pthread_mutex_lock(&g->q_mu);
  for (ddcpu_req *r = g->q_head; r; r = r->next) n++;
  pthread_mutex_unlock(&g->q_mu);
  return n;
}

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

/* ---- the progress thread ---------------------------------------------------- */

static void sleep_on_ev(ddcpu_group *g, int ms) {
  uint32_t seen = atomic_load(&g->ev.val);
  ddcpu_ctr_sleep(&g->ev, seen, (uint64_t)ms * 1000000ull, 1);
}

static void *thread_main(void *arg) {
  ddcpu_group *g = arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  struct pollfd pfd[DDCPU_MAX_LOCAL + 8];
  while (!atomic_load(&g->stopping)) {
    uint64_t since = 0;
    int pending = oldest_pending(g, &since);
    uint64_t now = ddcpu_now_ns();
    int lazy = atomic_load(&g->lazy);
    int stranded = pending && now > since && now - since >= STRANDED_NS;
    if (!pending) atomic_store(&g->handoff, 0); /* what was handed over is done */
    int handoff = atomic_load(&g->handoff);
    if (pending && ((g->progress_runs && (!lazy || stranded)) || handoff ||
                    ddcpu_fail_status(g))) {
      if (try_exec(g)) {
        if (lazy && stranded && g->progress_runs) atomic_store(&g->lazy, 0);
        int st = run_queue(g, NULL, ddcpu_deadline(THREAD_SLICE_MS), 1);
        if (st != DDCPU_AGAIN) atomic_store(&g->handoff, 0); /* queue empty */
        release_exec(g);
      } else {
        sleep_on_ev(g, 10);
      }
      continue;
    }
    /* idle (or a fresh request its caller is about to run) */
    int light = lazy && now - atomic_load(&g->last_submit_ns) < DEEP_AFTER_NS;
    atomic_store(&g->pt_mode, light ? DDCPU_PT_LIGHT : DDCPU_PT_DEEP);
    if (g->progress_runs && oldest_pending(g, &since) && !light) {
      atomic_store(&g->pt_mode, DDCPU_PT_BUSY);
      continue;
    }
    int n = 0;
    pfd[n++] = (struct pollfd){g->wake_fd, POLLIN, 0};
    int have = try_exec(g);
    if (have) {
      ddcpu_fail_status(g); /* adopts and forwards a failure of the node */
      n += ddcpu_liveness_fds(g, pfd + n, (int)(sizeof pfd / sizeof pfd[0]) - n);
      release_exec(g);
    } else {
      /* another thread executes (and reads the sockets); the pidfds can
       * still be watched from here, so a dead neighbour is noticed at once
       * even while that thread sleeps */
      int st = ddcpu_fail_status(g);
      if (!st || st == DDPLUG_E_ABORTED)
        for (int j = 0; j < g->local_world; j++)
          if (g->pidfd[j] >= 0 && !atomic_load(&g->pid_gone[j]))
            pfd[n++] = (struct pollfd){g->pidfd[j], POLLIN, 0};
    }
    int timeout = light && g->progress_runs ? 1 : have ? THREAD_SLICE_MS : 10;
    int r = poll(pfd, (nfds_t)n, timeout);
    atomic_store(&g->pt_mode, DDCPU_PT_BUSY);
    if (r == 0 && g->pid_poll && !light && try_exec(g)) {
      ddcpu_liveness_poll(g, 0); /* no pidfds: look at /proc now and then */
      release_exec(g);
    }
    if (r <= 0) continue;
    if (pfd[0].revents) {
      uint64_t v;
      while (read(g->wake_fd, &v, sizeof v) > 0) {
      }
    }
    int other = 0;
    for (int i = 1; i < n; i++) {
      if (!pfd[i].revents) continue;
      int pid_event = 0;
      for (int j = 0; j < g->local_world; j++)
        if (g->pidfd[j] == pfd[i].fd) {
          ddcpu_peer_exited(g, j);
          pid_event = 1;
        }
      if (!pid_event) other = 1;
    }
    if (other) {
      if (try_exec(g)) {
        ddcpu_liveness_poll(g, 0);
        release_exec(g);
      } else {
        sleep_on_ev(g, 10);
      }
    }
  }
  return NULL;
}

int ddcpu_engine_start(ddcpu_group *g) {
  atomic_store(&g->lazy, 1);
  atomic_store(&g->pt_mode, DDCPU_PT_BUSY);
  int e = pthread_create(&g->thread, NULL, thread_main, g);
  if (e != 0)
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e, "cannot start the progress thread");
  g->thread_started = 1;
  return DDPLUG_OK;
}

void ddcpu_engine_stop(ddcpu_group *g) {
  if (!g->thread_started) return;
  atomic_store(&g->stopping, 1);
  wake_thread(g);
  bump(g);
  pthread_join(g->thread, NULL);
  g->thread_started = 0;
}
