/*
 * group.c — group_create, group_destroy, group_abort and the group's
 * failure.
 *
 * A group is a communicator over the run's ranks, in the run's rank order,
 * made with MPI_Comm_create_group from MPI_COMM_WORLD: only the members
 * take part, so a run over a subset of the MPI job (a torch.distributed
 * subgroup) works as well as the whole job. The members are found through
 * the store first (each publishes its MPI_COMM_WORLD rank as "wr/<rank>"):
 * that wait ends early when the run fails, so a rank whose group_create
 * fails (or that never gets there) never leaves the others blocked inside
 * an MPI call that cannot time out; once every member is known to be here,
 * the blocking communicator calls are safe. Processes that are not one
 * MPI job (started by fork, `ddplug run` or torchrun: each a world of one)
 * are told so, never joined into a silent world of one.
 *
 * Four communicators per group: the collectives' data, their mismatch
 * descriptors (mismatch.c), point-to-point headers and payloads (p2p.c).
 * Collectives on one communicator must be started in the same order on
 * every rank; keeping the descriptors apart lets a collective's check run
 * ahead of the data of the one before it.
 *
 * Failure: MPI cannot cancel a collective. A group that timed out, was
 * aborted or lost a peer keeps its MPI requests pending (abandoned): every
 * call fails with the cause, group_destroy does not wait for them, and the
 * process never calls MPI_Finalize (bootstrap.c).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ULFM's error classes (Open MPI 5 with --with-ft ulfm): a process failed,
 * a communicator was revoked. MPICH's mpi.h names its own. */
#if defined(MPIX_ERR_PROC_FAILED)
#define DDMPI_ERR_PROC_FAILED MPIX_ERR_PROC_FAILED
#define DDMPI_ERR_REVOKED MPIX_ERR_REVOKED
#elif defined(OPEN_MPI)
#define DDMPI_ERR_PROC_FAILED 75
#define DDMPI_ERR_REVOKED 77
#else
#define DDMPI_ERR_PROC_FAILED -1
#define DDMPI_ERR_REVOKED -1
#endif

/* See internal.h. */
int ddmpi_status_of(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  if (cls == DDMPI_ERR_PROC_FAILED || cls == DDMPI_ERR_REVOKED) return DDPLUG_E_PEER_LOST;
  return DDPLUG_E_SYSTEM;
}

/* See internal.h. */
void ddmpi_peer_failure_text(ddplug_plugin_group *g, MPI_Comm comm, int code, char *buf,
                             size_t cap) {
  typedef int (*get_failed_fn)(MPI_Comm, MPI_Group *);
  typedef int (*ack_fn)(MPI_Comm);
  get_failed_fn get_failed = (get_failed_fn)dlsym(RTLD_DEFAULT, "MPIX_Comm_get_failed");
  get_failed_fn get_acked = (get_failed_fn)dlsym(RTLD_DEFAULT, "MPIX_Comm_failure_get_acked");
  ack_fn ack = (ack_fn)dlsym(RTLD_DEFAULT, "MPIX_Comm_failure_ack");
  MPI_Group failed = MPI_GROUP_NULL;
  int ok = 0;
  if (get_failed) ok = get_failed(comm, &failed) == MPI_SUCCESS;
  else if (ack && get_acked) ok = ack(comm) == MPI_SUCCESS && get_acked(comm, &failed) == MPI_SUCCESS;
  char e[400];
  ddmpi_mpi_error(code, e, sizeof e);
  int n = 0;
  if (ok && failed != MPI_GROUP_NULL) MPI_Group_size(failed, &n);
  if (n > 0) {
    MPI_Group mine;
    MPI_Comm_group(comm, &mine);
    int *in = calloc((size_t)n, sizeof *in), *outr = calloc((size_t)n, sizeof *outr);
    unsigned char *flags = calloc((size_t)g->world, 1);
    if (in && outr && flags) {
      for (int i = 0; i < n; i++) in[i] = i;
      MPI_Group_translate_ranks(failed, n, in, mine, outr);
      for (int i = 0; i < n; i++)
        if (outr[i] >= 0 && outr[i] < g->world) flags[outr[i]] = 1;
      char list[256];
      int count = 0;
      ddmpi_rank_list(flags, g->world, list, sizeof list, &count);
      ddmpi_fmt(buf, cap, "rank%s %s failed (MPI reports the process lost: %s)",
                count == 1 ? "" : "s", list, e);
    } else {
      ddmpi_fmt(buf, cap, "a peer failed (%s)", e);
    }
    free(in);
    free(outr);
    free(flags);
    MPI_Group_free(&mine);
  } else {
    ddmpi_fmt(buf, cap, "%s", e);
  }
  if (failed != MPI_GROUP_NULL) MPI_Group_free(&failed);
}

/* See internal.h. */
void ddmpi_group_fail_locked(ddplug_plugin_group *g, int status, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = 1;
  g->fail_status = status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->fail_msg, sizeof g->fail_msg, fmt, ap);
  va_end(ap);
  ddplug_plugin_request *lists[2] = {g->coll_head, g->p2p_head};
  g->coll_head = g->coll_tail = g->p2p_head = g->p2p_tail = NULL;
  for (int l = 0; l < 2; l++) {
    for (ddplug_plugin_request *r = lists[l], *next; r; r = next) {
      next = r->next;
      if (r->kind == DDMPI_REQ_RECV) { /* receives can be cancelled; sends and collectives not */
        if (r->check != MPI_REQUEST_NULL) MPI_Cancel(&r->check);
        for (int i = 0; i < r->nreq; i++)
          if (r->mreq[i] != MPI_REQUEST_NULL) MPI_Cancel(&r->mreq[i]);
      }
      r->stage = DDMPI_ST_FAILED;
      r->status = status;
      snprintf(r->msg, sizeof r->msg, "%s", g->fail_msg);
      r->next = r->prev = NULL;
      g->abandoned = 1; /* its MPI requests stay pending; it stays in g->live */
    }
  }
}

/* See internal.h. */
int ddmpi_world_ranks(ddplug_plugin_group *g, char *err, size_t cap) {
  const ddplug_host_services *s = g->svc;
  char key[64], val[64];
  int n = snprintf(val, sizeof val, "%d %d", ddmpi_p.world_rank, ddmpi_p.world_size);
  snprintf(key, sizeof key, "wr/%d", g->rank);
  int st = s->store_set(s->host, key, val, (uint64_t)n);
  if (st != DDPLUG_OK) {
    ddmpi_fmt(err, cap, "plugin mpi: publishing this rank's MPI rank (store key %s) failed", key);
    return st;
  }
  g->world_rank_of = calloc((size_t)g->world, sizeof *g->world_rank_of);
  if (!g->world_rank_of) {
    ddmpi_fmt(err, cap, "plugin mpi: group_create: out of memory");
    return DDPLUG_E_NO_MEMORY;
  }
  uint64_t deadline = ddmpi_now_ns() + (uint64_t)g->timeout_ms * 1000000ull;
  for (int r = 0; r < g->world; r++) {
    int wr = -1, ws = -1;
    if (r == g->rank) {
      wr = ddmpi_p.world_rank;
      ws = ddmpi_p.world_size;
    } else {
      uint64_t len = 0;
      snprintf(key, sizeof key, "wr/%d", r);
      st = s->store_get(s->host, key, val, sizeof val - 1, &len, ddmpi_left_ms(deadline) + 1);
      if (st != DDPLUG_OK) {
        if (st == DDPLUG_E_TIMEOUT)
          ddmpi_fmt(err, cap,
                    "plugin mpi: rank %d did not reach group_create within %.1f s (crashed, not "
                    "started, or stuck before opening the group?)",
                    r, (double)g->timeout_ms / 1e3);
        else
          ddmpi_fmt(err, cap, "plugin mpi: waiting for rank %d's MPI rank (store key %s)", r, key);
        return st;
      }
      val[len < sizeof val ? len : sizeof val - 1] = '\0';
      if (sscanf(val, "%d %d", &wr, &ws) != 2) wr = -1;
    }
    if (wr < 0 || ws != ddmpi_p.world_size || wr >= ws) {
      ddmpi_fmt(err, cap,
                "plugin mpi: rank %d is MPI process %d of an MPI world of %d, rank %d is MPI "
                "process %d of %d: the run's processes are not one MPI job. Start every rank with "
                "one MPI launcher (mpirun -n %d ..., srun ...); processes started otherwise (ddplug "
                "run, torchrun, fork) are MPI worlds of one process each",
                g->rank, ddmpi_p.world_rank, ddmpi_p.world_size, r, wr, ws, g->world);
      return DDPLUG_E_CONFIG;
    }
    g->world_rank_of[r] = wr;
    for (int q = 0; q < r; q++)
      if (g->world_rank_of[q] == wr) {
        ddmpi_fmt(err, cap,
                  "plugin mpi: ranks %d and %d are both MPI process %d of an MPI world of %d: the "
                  "run's processes are not one MPI job (each process started by fork, ddplug run "
                  "or torchrun is an MPI world of its own). Start every rank with one MPI "
                  "launcher: mpirun -n %d ... or srun",
                  q, r, wr, ws, g->world);
        return DDPLUG_E_CONFIG;
      }
  }
  return DDPLUG_OK;
}

/* The collectives' communicator over the members, from MPI_COMM_WORLD. */
/* The communicator a new group's is made from: MPI_COMM_WORLD, or the
 * survivors' one group_shrink left ("recreate", shrink.c) when it holds
 * every member of gg (taken: the caller frees it). */
static MPI_Comm parent_for(MPI_Group gg) {
  pthread_mutex_lock(&ddmpi_p.mu);
  MPI_Comm parent = ddmpi_p.recreate_parent;
  ddmpi_p.recreate_parent = MPI_COMM_NULL;
  pthread_mutex_unlock(&ddmpi_p.mu);
  if (parent == MPI_COMM_NULL) return MPI_COMM_WORLD;
  MPI_Group pg = MPI_GROUP_NULL, both = MPI_GROUP_NULL;
  int n = -1, have = -2;
  if (MPI_Comm_group(parent, &pg) == MPI_SUCCESS &&
      MPI_Group_intersection(pg, gg, &both) == MPI_SUCCESS) {
    MPI_Group_size(both, &have);
    MPI_Group_size(gg, &n);
  }
  if (both != MPI_GROUP_NULL) MPI_Group_free(&both);
  if (pg != MPI_GROUP_NULL) MPI_Group_free(&pg);
  if (have == n) return parent;
  MPI_Comm_free(&parent);
  return MPI_COMM_WORLD;
}

static int make_comm(ddplug_plugin_group *g, char *err, size_t cap) {
  MPI_Group wg = MPI_GROUP_NULL, gg = MPI_GROUP_NULL;
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &wg);
  if (rc == MPI_SUCCESS) rc = MPI_Group_incl(wg, g->world, g->world_rank_of, &gg);
  /* The tag keeps concurrent creations of overlapping groups apart. */
  unsigned h = 5381;
  for (const char *p = g->init->run_id ? g->init->run_id : ""; *p; p++) h = h * 33u + (unsigned char)*p;
  int tag = (int)(h % (unsigned)(ddmpi_p.tag_ub > 0 ? ddmpi_p.tag_ub : 32767));
  MPI_Comm parent = rc == MPI_SUCCESS ? parent_for(gg) : MPI_COMM_WORLD;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(parent, gg, tag, &g->comm);
  if (parent != MPI_COMM_WORLD) MPI_Comm_free(&parent);
  if (wg != MPI_GROUP_NULL) MPI_Group_free(&wg);
  if (gg != MPI_GROUP_NULL) MPI_Group_free(&gg);
  if (rc != MPI_SUCCESS) {
    char e[512];
    ddmpi_mpi_error(rc, e, sizeof e);
    ddmpi_fmt(err, cap, "plugin mpi: creating the group's communicators failed: %s", e);
    return ddmpi_status_of(rc);
  }
  return DDPLUG_OK;
}

/* The rest of the group's communicators, duplicates of g->comm, and the
 * check that g->comm numbers the ranks as the runtime does. */
static int dup_comms(ddplug_plugin_group *g, char *err, size_t cap) {
  MPI_Comm *dups[3] = {&g->check_comm, &g->p2p_comm, &g->p2p_data_comm};
  int rc = MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
  for (int i = 0; i < 3 && rc == MPI_SUCCESS; i++) {
    rc = MPI_Comm_dup(g->comm, dups[i]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(*dups[i], MPI_ERRORS_RETURN);
  }
  int size = -1, me = -1;
  if (rc == MPI_SUCCESS) {
    MPI_Comm_size(g->comm, &size);
    MPI_Comm_rank(g->comm, &me);
  }
  if (rc != MPI_SUCCESS) {
    char e[512];
    ddmpi_mpi_error(rc, e, sizeof e);
    ddmpi_fmt(err, cap, "plugin mpi: creating the group's communicators failed: %s", e);
    return ddmpi_status_of(rc);
  }
  if (size != g->world || me != g->rank) {
    ddmpi_fmt(err, cap, "plugin mpi: the group's communicator has rank %d of %d, expected %d of %d",
              me, size, g->rank, g->world);
    return DDPLUG_E_INTERNAL;
  }
  return DDPLUG_OK;
}

static void free_comms(ddplug_plugin_group *g) {
  MPI_Comm *all[4] = {&g->comm, &g->check_comm, &g->p2p_comm, &g->p2p_data_comm};
  for (int i = 0; i < 4; i++)
    if (*all[i] != MPI_COMM_NULL) MPI_Comm_free(all[i]);
}

static void release_group(ddplug_plugin_group *g) {
  free(g->world_rank_of);
  free(g);
}

/* See internal.h. */
int ddmpi_group_begin(const ddplug_group_init *init, const ddplug_host_services *svc,
                      ddplug_plugin_group **out) {
  if (!DDPLUG_HAS_FIELD(svc, ddplug_host_services, option_int_list))
    return ddmpi_fail(svc, DDPLUG_E_ABI_MISMATCH,
                      "plugin mpi needs a runtime with plugin ABI 1.3's option services");
  int st = ddmpi_mpi_ready(svc);
  if (st != DDPLUG_OK) return st;
  pthread_mutex_lock(&ddmpi_p.mu);
  ddmpi_p.unsettled = 1; /* until the group is made (ddmpi_group_finish) */
  pthread_mutex_unlock(&ddmpi_p.mu);
  ddplug_plugin_group *g = calloc(1, sizeof *g);
  if (!g) return ddmpi_fail(svc, DDPLUG_E_NO_MEMORY, "plugin mpi: group_create: out of memory");
  g->init = init;
  g->svc = svc;
  g->rank = init->rank;
  g->world = init->world_size;
  g->log_level = init->log_level;
  g->timeout_ms = init->timeout_ms > 0 ? init->timeout_ms : 300000;
  g->comm = g->check_comm = g->p2p_comm = g->p2p_data_comm = MPI_COMM_NULL;
  char err[DDMPI_MSG_MAX] = "";
  st = ddmpi_options_read(svc, &g->opts, err, sizeof err);
  if (st != DDPLUG_OK) {
    release_group(g);
    return ddmpi_fail(svc, st, "%s", err);
  }
  *out = g;
  return DDPLUG_OK;
}

/* See internal.h. */
int ddmpi_group_finish(ddplug_plugin_group *g, int st, int talked, char *err, size_t cap,
                       ddplug_plugin_group **out) {
  if (st == DDPLUG_OK) st = dup_comms(g, err, cap);
  if (st == DDPLUG_OK) st = ddmpi_hier_create(g, err, cap);
  if (st == DDPLUG_OK) {
    pthread_mutex_lock(&ddmpi_p.mu);
    g->next_group = ddmpi_p.groups;
    ddmpi_p.groups = g;
    st = ddmpi_progress_start_locked();
    if (st != DDPLUG_OK) {
      ddmpi_p.groups = g->next_group;
      ddmpi_fmt(err, cap, "plugin mpi: cannot start the progress thread");
    } else {
      ddmpi_p.unsettled = 0;
    }
    pthread_mutex_unlock(&ddmpi_p.mu);
  }
  if (st != DDPLUG_OK) {
    const ddplug_host_services *svc = g->svc;
    ddmpi_hier_destroy(g);
    if (!talked) free_comms(g);
    /* The run failed while it was made, typically because a member died:
     * with Open MPI 5 and ULFM, MPI_Finalize waits forever for a dead
     * process even when this one never talked to it (see
     * ddmpi_group_destroy). */
    pthread_mutex_lock(&ddmpi_p.mu);
    ddmpi_p.broken = 1;
    pthread_mutex_unlock(&ddmpi_p.mu);
    release_group(g);
    /* A wait that ended because the run failed already has the run's
     * sentence; do not replace it. */
    if (err[0]) ddmpi_fail(svc, st, "%s", err);
    return st;
  }
  *out = g;
  return DDPLUG_OK;
}

/* See internal.h. */
int ddmpi_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                       ddplug_plugin_group **out) {
  ddplug_plugin_group *g = NULL;
  int st = ddmpi_group_begin(init, svc, &g);
  if (st != DDPLUG_OK) return st;
  char err[DDMPI_MSG_MAX] = "";
  st = ddmpi_world_ranks(g, err, sizeof err);
  /* From here on MPI talks to the other members: after a failure, MPI may
   * still wait for one of them, so its communicators are not freed. */
  int talked = st == DDPLUG_OK;
  if (st == DDPLUG_OK) st = make_comm(g, err, sizeof err);
  st = ddmpi_group_finish(g, st, talked, err, sizeof err, &g);
  if (st != DDPLUG_OK) return st;
  ddmpi_log(svc, g->log_level, DDPLUG_LOG_DEBUG,
            "mpi: group of %d ranks on %s (%s; %s), check_mismatch %s, intra-node %s", g->world,
            ddmpi_p.lib.version, ddmpi_p.lib.path, ddmpi_p.lib.how,
            g->opts.check_mismatch ? "on" : "off", g->hier ? "cpu plugin (hierarchical)" : "mpi");
  *out = g;
  return DDPLUG_OK;
}

/* See internal.h. */
int ddmpi_group_abort(ddplug_plugin_group *g, const char *reason) {
  if (!g) return DDPLUG_E_INVALID_ARGUMENT;
  pthread_mutex_lock(&ddmpi_p.mu);
  ddmpi_group_fail_locked(g, DDPLUG_E_ABORTED, "%s", reason && *reason ? reason : "aborted");
  pthread_mutex_unlock(&ddmpi_p.mu);
  ddmpi_hier_abort(g, reason);
  return DDPLUG_OK;
}

/* See internal.h. */
int ddmpi_group_destroy(ddplug_plugin_group *g) {
  if (!g) return DDPLUG_OK;
  /* A healthy group whose requests the runtime let go while pending
   * finishes them first (at most the collective timeout). */
  uint64_t deadline = ddmpi_now_ns() + (uint64_t)g->timeout_ms * 1000000ull;
  for (;;) {
    pthread_mutex_lock(&ddmpi_p.mu);
    if (!g->failed && (g->coll_head || g->p2p_head)) ddmpi_poll_locked(g);
    int pending = !g->failed && (g->coll_head || g->p2p_head);
    if (pending && ddmpi_now_ns() >= deadline)
      ddmpi_group_fail_locked(g, DDPLUG_E_ABORTED,
                              "plugin mpi: the group was destroyed with collectives pending");
    pthread_mutex_unlock(&ddmpi_p.mu);
    if (!pending || ddmpi_now_ns() >= deadline) break;
    ddmpi_sleep_us(100);
  }
  pthread_mutex_lock(&ddmpi_p.mu);
  ddplug_plugin_group **pp = &ddmpi_p.groups;
  while (*pp && *pp != g) pp = &(*pp)->next_group;
  if (*pp) *pp = g->next_group;
  int last = ddmpi_p.groups == NULL;
  pthread_mutex_unlock(&ddmpi_p.mu);
  /* The progress thread may be watching g (outside the lock): wait for it. */
  if (last) ddmpi_progress_stop(0);
  else ddmpi_progress_forget(g);
  ddmpi_hier_destroy(g);
  /* A group that failed (a lost peer, an abort, a timeout) may have a dead
   * process behind it: Open MPI 5 with ULFM was seen waiting in
   * MPI_Finalize forever for the dead rank of a group whose requests had
   * all finished. Such a process does not finalize MPI (nor free the
   * group's communicators): the launcher ends the job, which is what a
   * failed run wants. */
  int broken = g->abandoned || g->failed;
  pthread_mutex_lock(&ddmpi_p.mu);
  if (broken) ddmpi_p.broken = 1;
  else free_comms(g);
  /* What the runtime did not free (pending when it let go, or failed). */
  while (g->live) ddmpi_request_release(g->live);
  pthread_mutex_unlock(&ddmpi_p.mu);
  if (broken)
    ddmpi_log(g->svc, g->log_level, DDPLUG_LOG_DEBUG,
              "mpi: the group ended failed%s (%s): this process will not call MPI_Finalize",
              g->abandoned ? ", with MPI requests pending" : "", g->fail_msg);
  release_group(g);
  return DDPLUG_OK;
}
