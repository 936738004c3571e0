/*
 * bootstrap.c — MPI in this process, and the bootstrap slots.
 *
 * MPI is initialised once per process, by whoever comes first: ddplug
 * (bootstrap_world under mpirun/srun, or the first group_create) or the
 * program itself (mpi4py, a C trainer). MPI_Initialized decides. We ask for
 * MPI_THREAD_MULTIPLE: the progress thread tests requests while the
 * caller's thread starts others (research on Open MPI 4.1/5 and MPICH
 * 4.0/5: none of them progresses a nonblocking collective without calls,
 * and all four give MULTIPLE). An MPI someone else initialised with less
 * than MULTIPLE is refused with a sentence saying how to ask for it.
 *
 * Finalize: only an MPI we initialised, once, at process exit (atexit, and
 * the backend is never unloaded: -z nodelete), because a process may open
 * and close several runs and MPI cannot be initialised twice. Never after
 * a group failed (a lost peer, an abort, a timeout; requests abandoned or
 * not) or a group_create failed, nor after a run that began here (its
 * bootstrap or group_create) and never got its group (ddplug_open failed
 * before group_create, because another rank failed): MPI_Finalize may wait
 * forever for a dead process or for a peer that exits without finalizing
 * (Open MPI 5 with ULFM: seen when one rank of a failed open finalized and
 * the others did not), or for an abandoned collective. Every rank of a
 * failed run skips it alike; the launcher then ends the job, which is what
 * a failed run wants.
 *
 * bootstrap_world reads the world from MPI_COMM_WORLD without any
 * collective beyond MPI's own initialisation (so a rank that never comes
 * cannot hang the others here); local ranks come from the launcher's
 * variables where it sets them. A world of one under a launcher that
 * started several processes means the library is of another family than
 * the launcher (Open MPI under hydra runs every process as a singleton):
 * that is an error naming both, never a silent world of one.
 * bootstrap_broadcast is MPI_Ibcast from rank 0 on a duplicate of
 * MPI_COMM_WORLD made for it (never the program's own communicator),
 * polled until done or the timeout.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

ddmpi_proc ddmpi_p = {.mu = PTHREAD_MUTEX_INITIALIZER, .work_cv = PTHREAD_COND_INITIALIZER};

static const char *thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

static void at_exit(void) {
  ddmpi_progress_stop(1);
  pthread_mutex_lock(&ddmpi_p.mu);
  int pending = 0;
  for (ddplug_plugin_group *g = ddmpi_p.groups; g; g = g->next_group)
    pending |= g->coll_head || g->p2p_head || g->abandoned;
  int fin = 1;
  if (ddmpi_p.we_initialised && !ddmpi_p.broken && !ddmpi_p.unsettled && !pending &&
      MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
    MPI_Finalize();
  pthread_mutex_unlock(&ddmpi_p.mu);
}

/* The world size the launcher announced, or 0 (and its variable). */
static int launcher_size(const char **var) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
  for (int i = 0; vars[i]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) {
      *var = vars[i];
      return atoi(v);
    }
  }
  *var = NULL;
  return 0;
}

/* See internal.h. */
int ddmpi_mpi_ready(const ddplug_host_services *svc) {
  pthread_mutex_lock(&ddmpi_p.mu);
  if (ddmpi_p.ready) {
    pthread_mutex_unlock(&ddmpi_p.mu);
    return DDPLUG_OK;
  }
  int st = DDPLUG_OK;
  char msg[DDMPI_MSG_MAX] = "";
  int init = 0, fin = 0, provided = MPI_THREAD_SINGLE;
  MPI_Finalized(&fin);
  MPI_Initialized(&init);
  if (fin) {
    st = DDPLUG_E_UNSUPPORTED;
    ddmpi_fmt(msg, sizeof msg,
              "plugin mpi: MPI was already finalized in this process (%s): it cannot be "
              "initialised again; keep MPI alive until ddplug's runs are closed",
              ddmpi_p.lib.version);
  } else if (!init) {
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      char e[512];
      ddmpi_mpi_error(rc, e, sizeof e);
      st = DDPLUG_E_SYSTEM;
      ddmpi_fmt(msg, sizeof msg, "plugin mpi: MPI_Init_thread failed (%s, %s): %s",
                ddmpi_p.lib.version, ddmpi_p.lib.path, e);
    } else {
      ddmpi_p.we_initialised = 1;
      atexit(at_exit);
    }
  } else {
    MPI_Query_thread(&provided);
  }
  if (st == DDPLUG_OK && provided < MPI_THREAD_MULTIPLE) {
    st = DDPLUG_E_UNSUPPORTED;
    ddmpi_fmt(msg, sizeof msg,
              "plugin mpi: MPI %s with %s, but the plugin needs MPI_THREAD_MULTIPLE (its "
              "progress thread tests requests while your thread starts others): %s",
              ddmpi_p.we_initialised ? "was initialised" : "was initialised by the program",
              thread_level_name(provided),
              ddmpi_p.we_initialised
                  ? "this MPI build has no thread support; use one that has"
                  : "initialise it with MPI_Init_thread(MPI_THREAD_MULTIPLE) (mpi4py: "
                    "mpi4py.rc.thread_level = \"multiple\", the default, before importing "
                    "mpi4py.MPI), or let ddplug initialise it");
  }
  if (st == DDPLUG_OK) {
    MPI_Comm_rank(MPI_COMM_WORLD, &ddmpi_p.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ddmpi_p.world_size);
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    ddmpi_p.tag_ub = flag && ub ? *(int *)ub : 32767;
    ddmpi_p.boot_comm = MPI_COMM_NULL;
    ddmpi_p.recreate_parent = MPI_COMM_NULL;
    int rc = ddmpi_types_init();
    if (rc != MPI_SUCCESS) {
      char e[512];
      ddmpi_mpi_error(rc, e, sizeof e);
      st = DDPLUG_E_SYSTEM;
      ddmpi_fmt(msg, sizeof msg, "plugin mpi: MPI_Op_create failed: %s", e);
    }
  }
  const char *var = NULL;
  int announced = st == DDPLUG_OK ? launcher_size(&var) : 0;
  if (st == DDPLUG_OK && announced > 1 && ddmpi_p.world_size == 1) {
    st = DDPLUG_E_CONFIG;
    ddmpi_fmt(msg, sizeof msg,
              "plugin mpi: the launcher started %d processes (%s=%d) but %s (%s, %s) sees an MPI "
              "world of 1: the library is of another MPI family than the launcher (hydra's "
              "mpiexec starts MPICH programs, Open MPI's mpirun Open MPI ones). Use the launcher "
              "of that MPI, or point DDPLUG_MPI_LIBRARY (or DDPLUG_MPI_ABI) at the launcher's "
              "library",
              announced, var, announced,
              ddmpi_p.lib.family == DDMPI_FAMILY_OPENMPI ? "Open MPI" : "the MPICH-family MPI",
              ddmpi_p.lib.version, ddmpi_p.lib.path);
  }
  if (st == DDPLUG_OK) ddmpi_p.ready = 1;
  pthread_mutex_unlock(&ddmpi_p.mu);
  if (st != DDPLUG_OK) return ddmpi_fail(svc, st, "%s", msg);
  return DDPLUG_OK;
}

static int env_int(const char *const *vars) {
  for (int i = 0; vars[i]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return -1;
}

/* See internal.h. */
int ddmpi_bootstrap_world(const ddplug_host_services *svc, ddplug_bootstrap_world *out) {
  int st = ddmpi_mpi_ready(svc);
  if (st != DDPLUG_OK) return st;
  pthread_mutex_lock(&ddmpi_p.mu);
  ddmpi_p.unsettled = 1; /* a run begins: settled by its group */
  pthread_mutex_unlock(&ddmpi_p.mu);
  static const char *const local_rank[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                           "SLURM_LOCALID", NULL};
  static const char *const local_size[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                           NULL};
  ddplug_bootstrap_world w;
  memset(&w, 0, sizeof w);
  w.struct_size = sizeof w;
  w.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  w.rank = ddmpi_p.world_rank;
  w.world_size = ddmpi_p.world_size;
  w.local_rank = env_int(local_rank);
  w.local_world_size = env_int(local_size);
  w.node_rank = -1;
  snprintf(w.source, sizeof w.source, "mpi");
  uint32_t keep = out->struct_size;
  memcpy(out, &w, keep < sizeof w ? keep : sizeof w);
  out->struct_size = keep;
  ddmpi_log(svc, DDPLUG_LOG_DEBUG, DDPLUG_LOG_DEBUG,
            "mpi: rank %d of %d from MPI_COMM_WORLD (%s, %s; %s)", w.rank, w.world_size,
            ddmpi_p.lib.version, ddmpi_p.lib.path, ddmpi_p.lib.how);
  return DDPLUG_OK;
}

/* Whether the run failed, as the host's store says (0: healthy or no
 * store at this stage). */
static int run_failure(const ddplug_host_services *svc) {
  if (!svc || !svc->store_wait) return 0;
  const char *key = "mpi/never-set";
  int st = svc->store_wait(svc->host, &key, 1, 0);
  return st == DDPLUG_E_TIMEOUT || st == DDPLUG_E_UNSUPPORTED || st == DDPLUG_OK ? 0 : st;
}

/* See internal.h. */
int ddmpi_wait_one(const ddplug_host_services *svc, MPI_Request *req, uint64_t deadline_ns,
                   int *code) {
  uint64_t next_look = ddmpi_now_ns() + 100000000ull;
  int64_t nap = 1;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    pthread_mutex_lock(&ddmpi_p.mu);
    int rc = MPI_Test(req, &flag, &status);
    pthread_mutex_unlock(&ddmpi_p.mu);
    if (rc != MPI_SUCCESS || flag) {
      *code = rc;
      return DDPLUG_OK;
    }
    uint64_t now = ddmpi_now_ns();
    int failed = 0;
    if (now >= next_look) {
      failed = run_failure(svc);
      next_look = now + 100000000ull;
    }
    if (failed || now >= deadline_ns) {
      pthread_mutex_lock(&ddmpi_p.mu);
      ddmpi_p.broken = 1;
      pthread_mutex_unlock(&ddmpi_p.mu);
      return failed ? failed : DDPLUG_E_TIMEOUT;
    }
    ddmpi_sleep_us(nap);
    if (nap < 1000) nap *= 2;
  }
}

/* See internal.h. */
int ddmpi_bootstrap_broadcast(const ddplug_host_services *svc, void *buf, uint64_t len,
                              int64_t timeout_ms) {
  int st = ddmpi_mpi_ready(svc);
  if (st != DDPLUG_OK) return st;
  if (len > (uint64_t)INT32_MAX)
    return ddmpi_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                      "plugin mpi: bootstrap_broadcast of %llu bytes: at most 2^31-1",
                      (unsigned long long)len);
  uint64_t deadline = ddmpi_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000000ull;
  int code = MPI_SUCCESS;
  pthread_mutex_lock(&ddmpi_p.mu);
  int need_comm = ddmpi_p.boot_comm == MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Comm dup = MPI_COMM_NULL;
  if (need_comm) code = MPI_Comm_idup(MPI_COMM_WORLD, &dup, &req);
  pthread_mutex_unlock(&ddmpi_p.mu);
  const char *stage = "duplicating MPI_COMM_WORLD";
  if (code == MPI_SUCCESS && need_comm) {
    st = ddmpi_wait_one(svc, &req, deadline, &code);
    if (st == DDPLUG_OK && code == MPI_SUCCESS) {
      pthread_mutex_lock(&ddmpi_p.mu);
      MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
      ddmpi_p.boot_comm = dup;
      pthread_mutex_unlock(&ddmpi_p.mu);
    }
  }
  if (st == DDPLUG_OK && code == MPI_SUCCESS) {
    stage = "broadcasting rank 0's bytes";
    pthread_mutex_lock(&ddmpi_p.mu);
    code = MPI_Ibcast(buf, (int)len, MPI_BYTE, 0, ddmpi_p.boot_comm, &req);
    pthread_mutex_unlock(&ddmpi_p.mu);
    if (code == MPI_SUCCESS) st = ddmpi_wait_one(svc, &req, deadline, &code);
  }
  if (st == DDPLUG_E_TIMEOUT)
    return ddmpi_fail(svc, st,
                      "plugin mpi: the bootstrap (%s over MPI, rank %d of %d) did not complete "
                      "within %.1f s: a process of this MPI job has not reached ddplug_open (it "
                      "failed, or is stuck before it), or the job's processes open different "
                      "runs",
                      stage, ddmpi_p.world_rank, ddmpi_p.world_size, (double)timeout_ms / 1e3);
  if (st != DDPLUG_OK) return st;
  if (code != MPI_SUCCESS) {
    char e[512];
    ddmpi_mpi_error(code, e, sizeof e);
    return ddmpi_fail(svc, ddmpi_status_of(code), "plugin mpi: bootstrap (%s) failed: %s", stage,
                      e);
  }
  return DDPLUG_OK;
}
