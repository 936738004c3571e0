/*
 * collective.c — collective_start, request_wait, request_test,
 * request_free, and how a collective becomes MPI calls.
 *
 * collective_start never waits for peers: it posts the mismatch descriptor
 * (mismatch.c) or, without the check, the data itself (MPI_Iallreduce,
 * MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) and returns. With the check,
 * the data is posted by whoever polls next (progress.c) once the
 * descriptors agreed, always in the order the collectives were started.
 * Counts beyond MPI's int are split into several calls of at most 2^30
 * elements, the same on every rank.
 *
 * Waiting: the caller's thread polls MPI itself (progress.c's poll, under
 * the process's MPI lock) — a blocking collective costs no hand-off to
 * another thread — spinning for the first 20 µs, yielding the CPU up to
 * 2 ms, then sleeping in growing naps (up to 0.5 ms). While it waits, the
 * progress thread leaves its group alone. request_wait's own timeout is
 * TIMEOUT naming the collective and the ranks not arrived (the request
 * stays pending); the collective timeout, counted from the start, fails
 * the group (progress.c).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"

/* The largest count one MPI call carries (an int, with room). */
#define DDMPI_CHUNK (1ull << 30)

/* See internal.h. */
ddplug_plugin_request *ddmpi_request_new(ddplug_plugin_group *g, int32_t kind) {
  ddplug_plugin_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->group = g;
  r->kind = kind;
  r->check = MPI_REQUEST_NULL;
  r->mreq = r->inline_reqs;
  for (int i = 0; i < DDMPI_INLINE_REQS; i++) r->inline_reqs[i] = MPI_REQUEST_NULL;
  r->start_ns = ddmpi_now_ns();
  r->source = -1;
  return r;
}

/* See internal.h. */
int ddmpi_request_reqs(ddplug_plugin_request *r, int n) {
  if (r->mreq != r->inline_reqs) free(r->mreq);
  r->mreq = r->inline_reqs;
  r->nreq = n;
  if (n > DDMPI_INLINE_REQS) {
    r->mreq = malloc((size_t)n * sizeof *r->mreq);
    if (!r->mreq) {
      r->mreq = r->inline_reqs;
      r->nreq = 0;
      return -1;
    }
  }
  for (int i = 0; i < n; i++) r->mreq[i] = MPI_REQUEST_NULL;
  return 0;
}

/* See internal.h. */
void ddmpi_live_add(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  r->lprev = NULL;
  r->lnext = g->live;
  if (g->live) g->live->lprev = r;
  g->live = r;
}

/* See internal.h. */
void ddmpi_enqueue_locked(ddplug_plugin_group *g, ddplug_plugin_request *r,
                          ddplug_plugin_request **head, ddplug_plugin_request **tail) {
  ddmpi_live_add(g, r);
  r->next = NULL;
  r->prev = *tail;
  if (*tail) (*tail)->next = r;
  else *head = r;
  *tail = r;
  atomic_fetch_add(&ddmpi_p.work_epoch, 1);
}

/* See internal.h. */
void ddmpi_request_release(ddplug_plugin_request *r) {
  ddplug_plugin_group *g = r->group;
  if (r->lprev) r->lprev->lnext = r->lnext;
  else if (g && g->live == r) g->live = r->lnext;
  if (r->lnext) r->lnext->lprev = r->lprev;
  if (r->mreq != r->inline_reqs) free(r->mreq);
  free(r->scratch);
  free(r);
}

static void describe(ddplug_plugin_request *r) {
  const ddplug_coll_args *a = &r->a;
  switch (a->kind) {
    case DDPLUG_COLL_ALLREDUCE:
      ddmpi_fmt(r->what, sizeof r->what, "allreduce seq %llu (%llu x %s, %s)",
                (unsigned long long)a->seq, (unsigned long long)a->count,
                ddmpi_dtype_name(a->dtype), ddmpi_op_name(a->op));
      break;
    case DDPLUG_COLL_BROADCAST:
      ddmpi_fmt(r->what, sizeof r->what, "broadcast seq %llu (%llu x %s from rank %d)",
                (unsigned long long)a->seq, (unsigned long long)a->count,
                ddmpi_dtype_name(a->dtype), a->root);
      break;
    case DDPLUG_COLL_ALLGATHER:
      ddmpi_fmt(r->what, sizeof r->what, "allgather seq %llu (%llu x %s per rank)",
                (unsigned long long)a->seq, (unsigned long long)a->count,
                ddmpi_dtype_name(a->dtype));
      break;
    default:
      ddmpi_fmt(r->what, sizeof r->what, "%s seq %llu", ddmpi_kind_name(a->kind),
                (unsigned long long)a->seq);
      break;
  }
}

static int chunks_of(uint64_t count) {
  return count == 0 ? 1 : (int)((count + DDMPI_CHUNK - 1) / DDMPI_CHUNK);
}

/* See internal.h. */
int ddmpi_collective_post(ddplug_plugin_request *r) {
  ddplug_plugin_group *g = r->group;
  const ddplug_coll_args *a = &r->a;
  size_t es = ddmpi_dtype_size(a->dtype);
  int rc = MPI_SUCCESS;
  if (ddmpi_hier_takes(g, a)) {
    r->stage = DDMPI_ST_HIER;
    int h = ddmpi_hier_step(r);
    if (h > 0) r->mpi_done = 1;
    return h < 0 ? -1 : MPI_SUCCESS;
  }
  r->stage = DDMPI_ST_DATA;
  switch (a->kind) {
    case DDPLUG_COLL_ALLREDUCE: {
      MPI_Datatype t;
      MPI_Op op;
      int widen = 0, divide = 0;
      ddmpi_mpi_reduction(a->dtype, a->op, &t, &op, &widen, &divide);
      int n = chunks_of(a->count);
      if (ddmpi_request_reqs(r, n) != 0) return MPI_ERR_NO_MEM;
      if (widen && a->count) ddcpu_half_widen(a->dtype, r->scratch, a->send, a->count);
      for (int i = 0; i < n && rc == MPI_SUCCESS; i++) {
        uint64_t off = (uint64_t)i * DDMPI_CHUNK;
        int c = (int)(a->count - off < DDMPI_CHUNK ? a->count - off : DDMPI_CHUNK);
        if (widen)
          rc = MPI_Iallreduce(MPI_IN_PLACE, (float *)r->scratch + off, c, t, op, g->comm,
                              &r->mreq[i]);
        else if (a->send == a->recv)
          rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)a->recv + off * es, c, t, op, g->comm,
                              &r->mreq[i]);
        else
          rc = MPI_Iallreduce((const char *)a->send + off * es, (char *)a->recv + off * es, c, t,
                              op, g->comm, &r->mreq[i]);
      }
      break;
    }
    case DDPLUG_COLL_BROADCAST: {
      int n = chunks_of(a->count);
      if (ddmpi_request_reqs(r, n) != 0) return MPI_ERR_NO_MEM;
      if (g->rank == a->root && a->send != a->recv && a->count)
        memcpy(a->recv, a->send, a->count * es);
      for (int i = 0; i < n && rc == MPI_SUCCESS; i++) {
        uint64_t off = (uint64_t)i * DDMPI_CHUNK;
        int c = (int)(a->count - off < DDMPI_CHUNK ? a->count - off : DDMPI_CHUNK);
        rc = MPI_Ibcast((char *)a->recv + off * es, c, ddmpi_mpi_type(a->dtype), a->root, g->comm,
                        &r->mreq[i]);
      }
      break;
    }
    case DDPLUG_COLL_ALLGATHER: {
      if (ddmpi_request_reqs(r, 1) != 0) return MPI_ERR_NO_MEM;
      MPI_Datatype t = ddmpi_mpi_type(a->dtype);
      const char *mine = (const char *)a->recv + (size_t)g->rank * a->count * es;
      if (a->send == mine)
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a->recv, (int)a->count, t,
                            g->comm, &r->mreq[0]);
      else
        rc = MPI_Iallgather(a->send, (int)a->count, t, a->recv, (int)a->count, t, g->comm,
                            &r->mreq[0]);
      break;
    }
    default: /* barrier: the mismatch check's allreduce already was one */
      if (g->opts.check_mismatch && g->world > 1) {
        r->nreq = 0;
        r->mpi_done = 1;
        return MPI_SUCCESS;
      }
      if (ddmpi_request_reqs(r, 1) != 0) return MPI_ERR_NO_MEM;
      rc = MPI_Ibarrier(g->comm, &r->mreq[0]);
      break;
  }
  if (rc != MPI_SUCCESS) {
    char e[400];
    ddmpi_mpi_error(rc, e, sizeof e);
    ddmpi_fmt(r->msg, sizeof r->msg, "%s: posting it to MPI failed: %s", r->what, e);
  }
  return rc;
}

/* See internal.h. */
void ddmpi_collective_finish(ddplug_plugin_request *r) {
  const ddplug_coll_args *a = &r->a;
  if (a->kind != DDPLUG_COLL_ALLREDUCE || !a->count || r->stage == DDMPI_ST_HIER) return;
  MPI_Datatype t;
  MPI_Op op;
  int widen = 0, divide = 0;
  ddmpi_mpi_reduction(a->dtype, a->op, &t, &op, &widen, &divide);
  int n = r->group->world;
  if (widen) {
    if (divide) ddcpu_divide(DDPLUG_FLOAT32, r->scratch, a->count, n);
    ddcpu_half_narrow(a->dtype, a->recv, r->scratch, a->count);
  } else if (divide) {
    ddcpu_divide(a->dtype, a->recv, a->count, n);
  }
}

/* See internal.h. */
int ddmpi_group_failed(ddplug_plugin_group *g) {
  int st = g->fail_status;
  char msg[DDMPI_MSG_MAX];
  pthread_mutex_lock(&ddmpi_p.mu);
  snprintf(msg, sizeof msg, "%s", g->fail_msg);
  pthread_mutex_unlock(&ddmpi_p.mu);
  return ddmpi_fail(g->svc, st, "%s", msg);
}

/* See internal.h. */
int ddmpi_collective_start(ddplug_plugin_group *g, const ddplug_coll_args *args,
                           ddplug_plugin_request **out) {
  if (args->kind == DDPLUG_COLL_ALLGATHER && args->count > (uint64_t)INT32_MAX)
    return ddmpi_fail(g->svc, DDPLUG_E_INVALID_ARGUMENT,
                      "plugin mpi: allgather of %llu elements per rank: MPI takes at most "
                      "2^31-1 per rank in one call",
                      (unsigned long long)args->count);
  ddplug_plugin_request *r = ddmpi_request_new(g, DDMPI_REQ_COLL);
  if (!r) return ddmpi_fail(g->svc, DDPLUG_E_NO_MEMORY, "plugin mpi: collective_start: out of memory");
  memcpy(&r->a, args, args->struct_size < sizeof r->a ? args->struct_size : sizeof r->a);
  r->seq = args->seq;
  describe(r);
  if (args->kind == DDPLUG_COLL_ALLREDUCE && args->count) {
    MPI_Datatype t;
    MPI_Op op;
    int widen = 0, divide = 0;
    ddmpi_mpi_reduction(args->dtype, args->op, &t, &op, &widen, &divide);
    if (widen && !(r->scratch = malloc(args->count * sizeof(float)))) {
      int st = ddmpi_fail(g->svc, DDPLUG_E_NO_MEMORY,
                          "plugin mpi: %s: cannot allocate the %llu-byte float32 scratch its "
                          "16-bit sums accumulate in",
                          r->what, (unsigned long long)(args->count * sizeof(float)));
      free(r);
      return st;
    }
  }
  pthread_mutex_lock(&ddmpi_p.mu);
  if (g->failed) {
    pthread_mutex_unlock(&ddmpi_p.mu);
    ddmpi_request_release(r);
    return ddmpi_group_failed(g);
  }
  int check = g->opts.check_mismatch && g->world > 1;
  int rc;
  if (check) {
    r->stage = DDMPI_ST_CHECK;
    rc = ddmpi_mismatch_post(r);
  } else {
    r->stage = DDMPI_ST_POST;
    /* Without the check every collective posts at start, so in order. */
    rc = ddmpi_collective_post(r);
  }
  if (rc != MPI_SUCCESS) {
    char e[400], msg[DDMPI_MSG_MAX];
    ddmpi_mpi_error(rc, e, sizeof e);
    int st = rc == MPI_ERR_NO_MEM ? DDPLUG_E_NO_MEMORY : ddmpi_status_of(rc);
    ddmpi_fmt(msg, sizeof msg, "%s", r->msg[0] ? r->msg : e);
    /* Peers may be inside this collective already: the group cannot go on. */
    ddmpi_group_fail_locked(g, st, "plugin mpi: %s: %s", r->what, msg);
    if (r->stage != DDMPI_ST_CHECK || r->check != MPI_REQUEST_NULL) g->abandoned = 1;
    pthread_mutex_unlock(&ddmpi_p.mu);
    free(r->scratch);
    r->scratch = NULL;
    if (!g->abandoned) ddmpi_request_release(r);
    else {
      r->stage = DDMPI_ST_FAILED;
      ddmpi_live_add(g, r); /* MPI may still write its buffers: keep it until destroy */
    }
    return ddmpi_group_failed(g);
  }
  ddmpi_enqueue_locked(g, r, &g->coll_head, &g->coll_tail);
  pthread_mutex_unlock(&ddmpi_p.mu);
  ddmpi_progress_kick();
  *out = r;
  return DDPLUG_OK;
}

static int finished(const ddplug_plugin_request *r) {
  return r->stage == DDMPI_ST_DONE || r->stage == DDMPI_ST_FAILED;
}

/* See internal.h. */
int ddmpi_request_test(ddplug_plugin_group *g, ddplug_plugin_request *r, int32_t *done) {
  pthread_mutex_lock(&ddmpi_p.mu);
  if (!finished(r)) ddmpi_poll_locked(g);
  int fin = finished(r), st = r->status;
  char msg[DDMPI_MSG_MAX];
  if (fin && st != DDPLUG_OK) snprintf(msg, sizeof msg, "%s", r->msg);
  pthread_mutex_unlock(&ddmpi_p.mu);
  *done = fin;
  if (fin && st != DDPLUG_OK) return ddmpi_fail(g->svc, st, "%s", msg);
  return DDPLUG_OK;
}

/* The sentence of a wait that ran out before r completed. */
static void pending_text(ddplug_plugin_group *g, ddplug_plugin_request *r, int64_t waited_ms,
                         char *buf, size_t cap) {
  if (r->kind == DDMPI_REQ_COLL) {
    char who[600];
    ddmpi_arrival_text(g, r->seq, who, sizeof who);
    ddmpi_fmt(buf, cap, "%s not complete after %.3f s: %s", r->what, (double)waited_ms / 1e3, who);
  } else {
    ddmpi_fmt(buf, cap, "%s not complete after %.3f s (%s)", r->what, (double)waited_ms / 1e3,
              r->kind == DDMPI_REQ_RECV ? "no matching send has arrived"
                                        : "the receiver has not taken it yet");
  }
}

/* See internal.h. */
int ddmpi_request_wait(ddplug_plugin_group *g, ddplug_plugin_request *r, int64_t timeout_ms) {
  uint64_t t0 = ddmpi_now_ns();
  uint64_t deadline = t0 + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
  atomic_fetch_add(&g->waiters, 1);
  int64_t nap = 5;
  uint64_t next_watch = t0 + 1000000ull;
  int fin, st;
  char msg[DDMPI_MSG_MAX];
  for (;;) {
    pthread_mutex_lock(&ddmpi_p.mu);
    if (!finished(r)) ddmpi_poll_locked(g);
    fin = finished(r);
    st = r->status;
    if (fin && st != DDPLUG_OK) snprintf(msg, sizeof msg, "%s", r->msg);
    pthread_mutex_unlock(&ddmpi_p.mu);
    if (fin) break;
    uint64_t now = ddmpi_now_ns();
    if (now >= next_watch) {
      ddmpi_watch(g);
      next_watch = now + 1000000ull;
      continue;
    }
    if (now >= deadline) {
      /* Past the collective timeout too? Then the group fails with the
       * watch's sentence (the runtime's blocking calls wait exactly that
       * long). */
      if (r->kind == DDMPI_REQ_COLL) {
        ddmpi_watch(g);
        /* The progress thread may be the one failing the group right now
         * (naming the ranks takes store reads): its sentence, not ours. */
        for (int i = 0; i < 2000 && atomic_load(&g->reporting); i++) ddmpi_sleep_us(500);
        pthread_mutex_lock(&ddmpi_p.mu);
        fin = finished(r);
        st = r->status;
        if (fin && st != DDPLUG_OK) snprintf(msg, sizeof msg, "%s", r->msg);
        pthread_mutex_unlock(&ddmpi_p.mu);
      }
      break;
    }
    uint64_t waited = now - t0;
    if (waited < 20000ull) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else if (waited < 2000000ull) {
      sched_yield();
    } else {
      ddmpi_sleep_us(nap);
      if (nap < 500) nap *= 2;
    }
  }
  atomic_fetch_sub(&g->waiters, 1);
  if (fin) return st == DDPLUG_OK ? DDPLUG_OK : ddmpi_fail(g->svc, st, "%s", msg);
  pending_text(g, r, timeout_ms, msg, sizeof msg);
  return ddmpi_fail(g->svc, DDPLUG_E_TIMEOUT, "%s", msg);
}

/* See internal.h. */
void ddmpi_request_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  (void)g;
  if (!r) return;
  pthread_mutex_lock(&ddmpi_p.mu);
  /* Finished and out of the queues: gone now. A pending one finishes in
   * order and is released when it does; a failed one whose MPI requests
   * were abandoned stays (MPI may still write its buffers) until
   * group_destroy. */
  int queued = r->next || r->prev || r->group->coll_head == r || r->group->p2p_head == r;
  if (r->stage == DDMPI_ST_DONE || (r->stage == DDMPI_ST_FAILED && !queued && !r->group->abandoned))
    ddmpi_request_release(r);
  else
    r->freed = 1;
  pthread_mutex_unlock(&ddmpi_p.mu);
}
