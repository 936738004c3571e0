/*
 * progress.c — who executes the queued requests, and in which order: the
 * executor role (held by a waiting caller or the progress thread) and the
 * progress thread. Requests are queued, waited for and freed by the slots
 * in collective.c.
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
 * while this rank computes. It also moves point-to-point sends and
 * receives nobody waits for (p2p.c), and takes point-to-point connections
 * and messages from other nodes while idle.
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

#include "internal.h"

#define DEEP_AFTER_NS (1000ull * 1000 * 1000)
#define THREAD_SLICE_MS 100

/* See internal.h. */
int ddcpu_exec_try(ddcpu_group *g) {
  int expect = 0;
  return atomic_compare_exchange_strong(&g->exec, &expect, 1);
}

static void bump(ddcpu_group *g) {
  atomic_fetch_add(&g->ev.val, 1);
  ddcpu_ctr_wake(&g->ev);
}

/* See internal.h. */
void ddcpu_exec_release(ddcpu_group *g) {
  atomic_store(&g->exec, 0);
  bump(g);
}

/* See internal.h. */
void ddcpu_progress_wake(ddcpu_group *g) {
  uint64_t one = 1;
  if (g->wake_fd >= 0) (void)!write(g->wake_fd, &one, sizeof one);
}

/* See internal.h. */
ddcpu_req *ddcpu_queue_head(ddcpu_group *g) {
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

/* See internal.h. */
int ddcpu_run_queue(ddcpu_group *g, ddcpu_req *until, uint64_t deadline, int by_thread) {
  g->exec_by_thread = by_thread;
  for (;;) {
    ddcpu_req *r = ddcpu_queue_head(g);
    if (!r) return DDPLUG_OK;
    if (by_thread) atomic_store(&r->by_thread, 1);
    int st = ddcpu_coll_advance(g, r, deadline);
    if (st == DDCPU_AGAIN) return DDCPU_AGAIN;
    int last = r == until;
    complete(g, r, st);
    if (last) return DDPLUG_OK;
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
  struct pollfd pfd[DDCPU_MAX_LOCAL + 8 + 64];
  while (!atomic_load(&g->stopping)) {
    uint64_t since = 0;
    int pending = oldest_pending(g, &since);
    uint64_t now = ddcpu_now_ns();
    int lazy = atomic_load(&g->lazy);
    int stranded = pending && now > since && now - since >= DDCPU_STRANDED_NS;
    if (!pending) atomic_store(&g->handoff, 0); /* what was handed over is done */
    int handoff = atomic_load(&g->handoff);
    if (pending && ((g->progress_runs && (!lazy || stranded)) || handoff ||
                    ddcpu_fail_status(g))) {
      if (ddcpu_exec_try(g)) {
        if (lazy && stranded && g->progress_runs) atomic_store(&g->lazy, 0);
        int st = ddcpu_run_queue(g, NULL, ddcpu_deadline(THREAD_SLICE_MS), 1);
        if (st != DDCPU_AGAIN) atomic_store(&g->handoff, 0); /* queue empty */
        ddcpu_exec_release(g);
      } else {
        sleep_on_ev(g, 10);
      }
      continue;
    }
    /* sends and receives nobody waits for: move them (a caller waiting in
     * request_wait moves them itself) */
    int p2p_idle = g->p2p && atomic_load(&g->p2p->pending) > 0 && atomic_load(&g->p2p->waiters) == 0;
    int p2p_lazy = p2p_idle && atomic_load(&g->p2p->lazy);
    if (p2p_lazy && now - atomic_load(&g->p2p->last_start_ns) >= DDCPU_STRANDED_NS) {
      atomic_store(&g->p2p->lazy, 0); /* started and not waited for: move them from now on */
      p2p_lazy = 0;
    }
    if (p2p_idle && !p2p_lazy) {
      ddcpu_p2p_background(g, THREAD_SLICE_MS / 10);
      if (!ddcpu_fail_status(g) && ddcpu_exec_try(g)) { /* and watch the peers meanwhile */
        ddcpu_liveness_poll(g, 0);
        ddcpu_exec_release(g);
      }
      continue;
    }
    /* idle (or a fresh request its caller is about to run) */
    /* napping (a poll of 1 ms) rather than asleep while callers wait right
     * after they start: a start then has no thread to wake (a wake per send
     * or receive cost a context switch each, taken from the ranks) */
    int light = (lazy && now - atomic_load(&g->last_submit_ns) < DEEP_AFTER_NS) || p2p_lazy ||
                (g->p2p && atomic_load(&g->p2p->lazy) &&
                 now - atomic_load(&g->p2p->last_start_ns) < DEEP_AFTER_NS);
    atomic_store(&g->thread_mode, light ? DDCPU_THREAD_NAPPING : DDCPU_THREAD_ASLEEP);
    if (g->progress_runs && oldest_pending(g, &since) && !light) {
      atomic_store(&g->thread_mode, DDCPU_THREAD_AWAKE);
      continue;
    }
    int n = 0;
    pfd[n++] = (struct pollfd){g->wake_fd, POLLIN, 0};
    /* point-to-point connections and messages arriving from other nodes
     * are taken while idle too, so a sender's handshake and small sends
     * complete before this rank posts its receive */
    int first_p2p = n;
    if (g->p2p && !pthread_mutex_trylock(&g->p2p->mu)) {
      n += ddcpu_p2p_fds(g, pfd + n, 64);
      pthread_mutex_unlock(&g->p2p->mu);
    }
    int end_p2p = n;
    int have = ddcpu_exec_try(g);
    if (have) {
      ddcpu_fail_status(g); /* adopts and forwards a failure of the node */
      n += ddcpu_liveness_fds(g, pfd + n, (int)(sizeof pfd / sizeof pfd[0]) - n);
      ddcpu_exec_release(g);
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
    atomic_store(&g->thread_mode, DDCPU_THREAD_AWAKE);
    if (r == 0 && g->pid_poll && !light && ddcpu_exec_try(g)) {
      ddcpu_liveness_poll(g, 0); /* no pidfds: look at /proc now and then */
      ddcpu_exec_release(g);
    }
    if (r <= 0) continue;
    if (pfd[0].revents) {
      uint64_t v;
      while (read(g->wake_fd, &v, sizeof v) > 0) {
      }
    }
    int other = 0, p2p_ready = 0;
    for (int i = first_p2p; i < end_p2p; i++)
      if (pfd[i].revents) p2p_ready = 1;
    if (p2p_ready && !pthread_mutex_trylock(&g->p2p->mu)) {
      ddcpu_p2p_progress(g);
      pthread_mutex_unlock(&g->p2p->mu);
    }
    for (int i = end_p2p; i < n; i++) {
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
      if (ddcpu_exec_try(g)) {
        ddcpu_liveness_poll(g, 0);
        ddcpu_exec_release(g);
      } else {
        sleep_on_ev(g, 10);
      }
    }
  }
  return NULL;
}

int ddcpu_engine_start(ddcpu_group *g) {
  atomic_store(&g->lazy, 1);
  atomic_store(&g->thread_mode, DDCPU_THREAD_AWAKE);
  int e = pthread_create(&g->thread, NULL, thread_main, g);
  if (e != 0)
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e, "cannot start the progress thread");
  g->thread_started = 1;
  return DDPLUG_OK;
}

void ddcpu_engine_stop(ddcpu_group *g) {
  if (!g->thread_started) return;
  atomic_store(&g->stopping, 1);
  ddcpu_progress_wake(g);
  bump(g);
  pthread_join(g->thread, NULL);
  g->thread_started = 0;
}
