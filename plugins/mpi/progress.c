/*
 * progress.c — what moves requests forward.
 *
 * No MPI library progresses a nonblocking operation while nobody calls it
 * (measured on Open MPI 4.1 and 5, MPICH 4.0 and 5: a 16 MiB
 * MPI_Iallreduce left alone for 3 s had not moved), so something must
 * call. Two pollers run the same poll (ddmpi_poll_locked) under the
 * process's MPI lock: a thread waiting in request_wait (for its own
 * group), and one progress thread per process, for requests nobody waits
 * for — a trainer starts its gradient allreduces during backward and
 * waits after it. The thread leaves a group alone while a caller waits on
 * it, sleeps on a condition variable while nothing is pending, and naps
 * between polls otherwise (2 µs, doubling to 0.5 ms while nothing moves;
 * back to 2 µs when something does or a collective starts).
 *
 * The poll walks a group's collectives in the order they were started:
 * tests the mismatch descriptors, judges them, posts each collective's
 * data once every earlier one has posted (MPI wants collectives on one
 * communicator in the same order everywhere), tests the data, finishes
 * (avg, float16 rounding) and completes them in order. Then the
 * point-to-point operations (p2p.c).
 *
 * The watch (ddmpi_watch), outside the lock: a collective pending longer
 * than options.slow_ms publishes this rank's arrival (arrival.c); one
 * pending longer than the collective timeout fails the group with TIMEOUT
 * naming the collective and the ranks that never reached it.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* See internal.h. */
int ddmpi_test_all(MPI_Request *reqs, int n, int *code) {
  int pending = 0;
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status s;
    s.MPI_ERROR = MPI_SUCCESS;
    int rc = MPI_Test(&reqs[i], &flag, &s);
    if (rc != MPI_SUCCESS) {
      *code = rc == MPI_ERR_IN_STATUS ? s.MPI_ERROR : rc;
      return -1;
    }
    if (!flag) pending = 1;
  }
  *code = MPI_SUCCESS;
  return pending ? 0 : 1;
}

static void unlink_coll(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (r->prev) r->prev->next = r->next;
  else g->coll_head = r->next;
  if (r->next) r->next->prev = r->prev;
  else g->coll_tail = r->prev;
  r->next = r->prev = NULL;
}

/* An MPI error on r's communicator: the group cannot go on. */
static void mpi_failed(ddplug_plugin_group *g, ddplug_plugin_request *r, MPI_Comm comm, int code) {
  char why[DDMPI_MSG_MAX];
  ddmpi_peer_failure_text(g, comm, code, why, sizeof why);
  ddmpi_group_fail_locked(g, ddmpi_status_of(code), "plugin mpi: %s failed: %s", r->what, why);
}

/* See internal.h. */
void ddmpi_poll_locked(ddplug_plugin_group *g) {
  int moved = 0, can_post = 1, code = MPI_SUCCESS;
  for (ddplug_plugin_request *r = g->coll_head; r && !g->failed; r = r->next) {
    if (r->stage == DDMPI_ST_CHECK) {
      int t = ddmpi_test_all(&r->check, 1, &code);
      if (t < 0) {
        mpi_failed(g, r, g->check_comm, code);
        return;
      }
      if (t > 0) {
        moved = 1;
        if (ddmpi_mismatch_judge(r) != 0) {
          r->stage = DDMPI_ST_FAILED;
          r->status = DDPLUG_E_MISMATCH;
          continue;
        }
        r->stage = DDMPI_ST_POST;
      }
    }
    if (r->stage == DDMPI_ST_POST && can_post) {
      int rc = ddmpi_collective_post(r);
      moved = 1;
      if (rc != MPI_SUCCESS) {
        ddmpi_group_fail_locked(g, r->status ? r->status : ddmpi_status_of(rc), "plugin mpi: %s",
                                r->msg);
        return;
      }
    }
    if (r->stage == DDMPI_ST_CHECK || r->stage == DDMPI_ST_POST) can_post = 0;
    if (r->stage == DDMPI_ST_DATA && !r->mpi_done) {
      int t = ddmpi_test_all(r->mreq, r->nreq, &code);
      if (t < 0) {
        mpi_failed(g, r, g->comm, code);
        return;
      }
      if (t > 0) r->mpi_done = 1, moved = 1;
    } else if (r->stage == DDMPI_ST_HIER && !r->mpi_done) {
      int h = ddmpi_hier_step(r);
      if (h < 0) {
        ddmpi_group_fail_locked(g, r->status, "plugin mpi: %s", r->msg);
        return;
      }
      if (h > 0) r->mpi_done = 1, moved = 1;
    }
  }
  /* Complete in order. */
  while (!g->failed && g->coll_head &&
         (g->coll_head->mpi_done || g->coll_head->stage == DDMPI_ST_FAILED)) {
    ddplug_plugin_request *r = g->coll_head;
    unlink_coll(g, r);
    if (r->stage != DDMPI_ST_FAILED) {
      ddmpi_collective_finish(r);
      r->stage = DDMPI_ST_DONE;
      r->status = DDPLUG_OK;
    }
    moved = 1;
    if (r->freed) ddmpi_request_release(r);
  }
  if (!g->failed && g->p2p_head) ddmpi_p2p_poll_locked(g, &moved);
  if (moved) atomic_fetch_add(&ddmpi_p.work_epoch, 1);
}

/* See internal.h. */
void ddmpi_watch(ddplug_plugin_group *g) {
  pthread_mutex_lock(&ddmpi_p.mu);
  ddplug_plugin_request *head = g->failed ? NULL : g->coll_head;
  uint64_t now = ddmpi_now_ns(), seq = 0, newest = 0, age = 0;
  char what[160] = "";
  if (head) {
    seq = head->seq;
    newest = g->coll_tail->seq;
    age = now - head->start_ns;
    snprintf(what, sizeof what, "%s", head->what);
  }
  pthread_mutex_unlock(&ddmpi_p.mu);
  if (!head) return;
  if (age >= (uint64_t)g->opts.slow_ms * 1000000ull &&
      atomic_load(&g->arrived_published) < newest)
    ddmpi_arrival_publish(g, newest);
  if (age < (uint64_t)g->timeout_ms * 1000000ull) return;
  if (atomic_exchange(&g->reporting, 1)) return;
  char who[600];
  ddmpi_arrival_text(g, seq, who, sizeof who);
  pthread_mutex_lock(&ddmpi_p.mu);
  if (!g->failed && g->coll_head && g->coll_head->seq == seq)
    ddmpi_group_fail_locked(g, DDPLUG_E_TIMEOUT,
                            "%s did not complete within the collective timeout (%.1f s): %s",
                            what, (double)g->timeout_ms / 1e3, who);
  pthread_mutex_unlock(&ddmpi_p.mu);
  atomic_store(&g->reporting, 0);
}

/* ---- the progress thread ---------------------------------------------------- */

static ddplug_plugin_group *g_busy; /* the group the thread watches outside the lock */
static pthread_cond_t g_idle_cv = PTHREAD_COND_INITIALIZER;

static int any_pending_locked(void) {
  for (ddplug_plugin_group *g = ddmpi_p.groups; g; g = g->next_group)
    if (!g->failed && (g->coll_head || g->p2p_head)) return 1;
  return 0;
}

static void *thread_main(void *arg) {
  (void)arg;
  int64_t nap = 2;
  pthread_mutex_lock(&ddmpi_p.mu);
  while (!ddmpi_p.thread_stop) {
    if (!any_pending_locked()) {
      pthread_cond_wait(&ddmpi_p.work_cv, &ddmpi_p.mu);
      nap = 2;
      continue;
    }
    uint_fast64_t epoch = atomic_load(&ddmpi_p.work_epoch);
    for (ddplug_plugin_group *g = ddmpi_p.groups; g; g = g->next_group)
      if (!g->failed && (g->coll_head || g->p2p_head) && atomic_load(&g->waiters) == 0)
        ddmpi_poll_locked(g);
    /* The watch needs the store, outside the lock: one group at a time,
     * marked busy so that group_destroy waits for it. */
    for (ddplug_plugin_group *g = ddmpi_p.groups; g && !ddmpi_p.thread_stop;) {
      if (g->failed || !g->coll_head) {
        g = g->next_group;
        continue;
      }
      g_busy = g;
      pthread_mutex_unlock(&ddmpi_p.mu);
      ddmpi_watch(g);
      pthread_mutex_lock(&ddmpi_p.mu);
      g_busy = NULL;
      pthread_cond_broadcast(&g_idle_cv);
      /* g may have left the list meanwhile: start over from a live one. */
      ddplug_plugin_group *next = NULL;
      for (ddplug_plugin_group *h = ddmpi_p.groups; h; h = h->next_group)
        if (h == g) next = g->next_group;
      g = next;
    }
    int moved = atomic_load(&ddmpi_p.work_epoch) != epoch;
    pthread_mutex_unlock(&ddmpi_p.mu);
    nap = moved ? 2 : (nap < 500 ? nap * 2 : 500);
    ddmpi_sleep_us(nap);
    pthread_mutex_lock(&ddmpi_p.mu);
  }
  pthread_mutex_unlock(&ddmpi_p.mu);
  return NULL;
}

/* See internal.h. */
void ddmpi_progress_kick(void) {
  pthread_mutex_lock(&ddmpi_p.mu);
  pthread_cond_signal(&ddmpi_p.work_cv);
  pthread_mutex_unlock(&ddmpi_p.mu);
}

/* See internal.h. */
int ddmpi_progress_start_locked(void) {
  if (ddmpi_p.thread_running) return DDPLUG_OK;
  ddmpi_p.thread_stop = 0;
  if (pthread_create(&ddmpi_p.thread, NULL, thread_main, NULL) != 0) return DDPLUG_E_SYSTEM;
  ddmpi_p.thread_running = 1;
  return DDPLUG_OK;
}

/* See internal.h. */
void ddmpi_progress_stop(int force) {
  pthread_mutex_lock(&ddmpi_p.mu);
  if (!ddmpi_p.thread_running || (ddmpi_p.groups && !force)) {
    pthread_mutex_unlock(&ddmpi_p.mu);
    return;
  }
  ddmpi_p.thread_stop = 1;
  ddmpi_p.thread_running = 0;
  pthread_t t = ddmpi_p.thread;
  pthread_cond_broadcast(&ddmpi_p.work_cv);
  pthread_mutex_unlock(&ddmpi_p.mu);
  pthread_join(t, NULL);
}

/* See internal.h. */
void ddmpi_progress_forget(ddplug_plugin_group *g) {
  pthread_mutex_lock(&ddmpi_p.mu);
  while (g_busy == g) pthread_cond_wait(&g_idle_cv, &ddmpi_p.mu);
  pthread_mutex_unlock(&ddmpi_p.mu);
}
