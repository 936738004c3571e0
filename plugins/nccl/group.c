/*
 * group.c — the process group: create (options, device, checks across
 * ranks, NCCL bootstrap through the store, non-blocking communicator init
 * with a deadline), destroy (finalize with a deadline, else abort), abort
 * (from any thread, told to the peers through the store).
 *
 * group_create, in order (every step bounded by init->timeout_ms overall):
 *   1. local: parse plugin_options; count CUDA devices; choose this rank's
 *      device; describe it (UUID). A failure here is not returned at once:
 *   2. phase "setup": every rank publishes its outcome (agree.c), so a rank
 *      without a GPU makes every rank fail with "rank R: no CUDA device
 *      visible (...)" instead of leaving the others to time out;
 *   3. phase "devices": the ranks of each host compare device UUIDs
 *      (two ranks on one GPU: an error naming both, unless allowed);
 *   4. rank 0 creates the ncclUniqueId and publishes it as key "id"; the
 *      others read it (at most the time left);
 *   5. ncclCommInitRankConfig with blocking = 0, polled until ready; past
 *      the deadline the communicator is aborted (ncclCommAbort) and every
 *      rank learns it through the store key "abort";
 *   6. one 1-element allreduce, waited for (same deadline): NCCL sets up
 *      its connections lazily, on first use, with every peer taking part —
 *      here, rather than in the first collective_start (ddnccl_connect_eagerly).
 * The plugin makes its device current on the calling thread (as
 * torch.cuda.set_device does) and leaves it so.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_TIMEOUT_MS ((int64_t)300000)

/* ---- failure state ------------------------------------------------------- */

/* See internal.h. Also hands the group's (first) failure sentence to
 * set_error, so callers may simply return the result. */
int ddnccl_group_fail(ddplug_plugin_group *g, int status, int publish,
                      const char *fmt, ...) {
  char text[DDNCCL_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  ddnccl_vfmt(text, sizeof text, fmt, ap);
  va_end(ap);

  pthread_mutex_lock(&g->comm_mu);
  int first = !atomic_load(&g->failed);
  if (first) {
    g->fail_status = status;
    ddnccl_fmt(g->fail_msg, sizeof g->fail_msg, "%s", text);
    atomic_store(&g->failed, 1);
  }
  ncclComm_t comm = g->comm;
  g->comm = NULL;
  /* Non-blocking communicator: ncclCommAbort sets the abort flag the
   * kernels poll and reclaims the rest in NCCL's background thread. Done
   * under comm_mu so the slot thread never uses a communicator being
   * freed. With shrink "auto", a ready group's communicator is revoked
   * instead (its operations stop the same way) and kept for group_shrink
   * (shrink.c); group_destroy aborts it. */
  if (comm && !(g->ready && ddnccl_revoke_for_shrink(g, comm))) (void)ncclCommAbort(comm);
  int result = g->fail_status;
  char msg[DDNCCL_MSG_MAX];
  ddnccl_fmt(msg, sizeof msg, "%s", g->fail_msg);
  pthread_mutex_unlock(&g->comm_mu);

  if (first) {
    ddnccl_log(g->svc, g->log_level, DDPLUG_LOG_WARN,
               "group failed (%s): %s", ddnccl_status_name(status),
               text);
    if (publish) {
      /* Keep the first reason a peer published; tell them ours otherwise. */
      const ddplug_host_services *s = g->svc;
      char old[8];
      uint64_t len = 0;
      /* INVALID_ARGUMENT: the key exists but is longer than old[]. */
      int have = s->store_get(s->host, "abort", old, sizeof old, &len, 0);
      if (have != DDPLUG_OK && have != DDPLUG_E_INVALID_ARGUMENT) {
        char val[DDNCCL_MSG_MAX + 32];
        int n = snprintf(val, sizeof val, "rank %d: %s", g->rank, text);
        if (n < 0) n = 0;
        if ((size_t)n >= sizeof val) n = (int)sizeof val - 1;
        (void)s->store_set(s->host, "abort", val, (uint64_t)n);
      }
    }
  }
  return ddnccl_fail(g->svc, result, "%s", msg);
}

/* See internal.h. */
int ddnccl_group_failed_status(ddplug_plugin_group *g, int original) {
  pthread_mutex_lock(&g->comm_mu);
  int st = g->fail_status;
  char msg[DDNCCL_MSG_MAX];
  ddnccl_fmt(msg, sizeof msg, "%s", g->fail_msg);
  pthread_mutex_unlock(&g->comm_mu);
  if (original) return ddnccl_fail(g->svc, st, "%s", msg);
  return ddnccl_fail(g->svc, DDPLUG_E_ABORTED,
                     "the nccl group failed earlier and cannot be used "
                     "any more (%s: %s); close the context",
                     ddnccl_status_name(st), msg);
}

/* See internal.h. One or two store round trips, no waiting. The wait
 * with timeout 0 (rather than a plain get) also reports a run the runtime
 * has aborted (a rank that failed elsewhere, died, or called ddplug_abort):
 * host services' waits end with the run's status once it is aborted. */
int ddnccl_check_peer_abort(ddplug_plugin_group *g) {
  const ddplug_host_services *s = g->svc;
  const char *key[1] = {"abort"};
  int st = s->store_wait(s->host, key, 1, 0);
  if (st == DDPLUG_E_TIMEOUT) return DDPLUG_OK; /* nobody aborted */
  if (st != DDPLUG_OK)
    return ddnccl_group_fail(g, st, 0,
                             "the run was aborted or lost its store (%s) "
                             "while rank %d waited on NCCL",
                             ddnccl_status_name(st), g->rank);
  char buf[DDNCCL_MSG_MAX + 64];
  uint64_t len = 0;
  if (s->store_get(s->host, "abort", buf, sizeof buf - 1, &len, 0) != DDPLUG_OK)
    len = 0;
  buf[len < sizeof buf ? len : sizeof buf - 1] = '\0';
  return ddnccl_group_fail(g, DDPLUG_E_ABORTED, 0,
                           "aborted through the store by %s",
                           len ? buf : "another rank");
}

cudaError_t ddnccl_use_device(ddplug_plugin_group *g) {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == g->device) return cudaSuccess;
  return cudaSetDevice(g->device);
}

/* ---- create -------------------------------------------------------------- */

/* Step 1: the local part. Returns a status and fills err on failure. */
static int local_setup(ddplug_plugin_group *g, char *err, size_t cap) {
  const ddplug_group_init *in = g->init;
  int st = ddnccl_options_read(g->svc, &g->opts, err, cap);
  if (st != DDPLUG_OK) return st;
  /* The run's config (checks.duplicate_gpu, ABI 1.1) may allow shared GPUs
   * too; plugin_options.allow_shared_gpu allows them silently. */
  if (DDPLUG_HAS_FIELD(in, ddplug_group_init, duplicate_gpu) && !g->opts.allow_shared_gpu &&
      (in->duplicate_gpu == DDPLUG_CHECK_WARN || in->duplicate_gpu == DDPLUG_CHECK_ALLOW)) {
    g->opts.allow_shared_gpu = 1;
    g->warn_shared_gpu = in->duplicate_gpu == DDPLUG_CHECK_WARN;
  }
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    ddnccl_no_device_text(ce == cudaSuccess ? cudaErrorNoDevice : ce,
                          err, cap);
    return DDPLUG_E_UNSUPPORTED;
  }
  st = ddnccl_pick_device(&g->opts, in->local_rank, in->local_world_size,
                          count, &g->device, err, cap);
  if (st != DDPLUG_OK) return st;
  return ddnccl_devrec_fill(&g->self, g->rank, g->device, in->host_id,
                            err, cap);
}

/* Step 3: compare the device records of the ranks on this rank's node. */
static int check_node_devices(ddplug_plugin_group *g, uint64_t deadline,
                              char *err, size_t cap) {
  const ddplug_group_init *in = g->init;
  const ddplug_host_services *s = g->svc;
  ddnccl_devrec *recs = calloc((size_t)g->world, sizeof *recs);
  if (!recs) {
    ddnccl_fmt(err, cap, "out of memory reading device records");
    return DDPLUG_E_NO_MEMORY;
  }
  int32_t n = 0;
  int st = DDPLUG_OK;
  for (int32_t r = 0; r < g->world && st == DDPLUG_OK; r++) {
    if (in->node_of_rank && in->node_of_rank[r] != in->node_of_rank[g->rank])
      continue;
    char key[32], buf[1024];
    uint64_t len = 0;
    snprintf(key, sizeof key, "dev/%d", r);
    st = s->store_get(s->host, key, buf, sizeof buf, &len,
                      ddnccl_left_ms(deadline));
    if (st != DDPLUG_OK)
      ddnccl_fmt(err, cap, "cannot read rank %d's device record (key "
                 "'%s'): %s", r, key, ddnccl_status_name(st));
    else if (ddnccl_devrec_parse(buf, (size_t)len, &recs[n]) != 0) {
      ddnccl_fmt(err, cap, "rank %d published a malformed device "
                 "record (key '%s')", r, key);
      st = DDPLUG_E_INTERNAL;
    } else {
      n++;
    }
  }
  if (st == DDPLUG_OK)
    st = ddnccl_check_devices(recs, n, g->opts.allow_shared_gpu,
                              &g->shared_gpu, err, cap);
  if (st == DDPLUG_OK && g->shared_gpu && g->warn_shared_gpu && g->rank == 0)
    g->svc->log(g->svc->host, DDPLUG_LOG_WARN,
                "ranks share a GPU (allowed by checks.duplicate_gpu = \"warn\"): "
                "they compete for its memory and compute");
  free(recs);
  return st;
}

/* Step 4: the NCCL unique id through the store. */
static int bootstrap_id(ddplug_plugin_group *g, ncclUniqueId *id,
                        uint64_t deadline, char *err, size_t cap) {
  const ddplug_host_services *s = g->svc;
  if (g->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess) {
      ddnccl_fmt(err, cap, "rank 0: ncclGetUniqueId failed: %s (%s)",
                 ncclGetErrorString(r), ncclGetLastError(NULL));
      /* A value of another size tells the others why. */
      (void)s->store_set(s->host, "id", err, strlen(err));
      return ddnccl_status_of(r);
    }
    int st = s->store_set(s->host, "id", id, sizeof *id);
    if (st != DDPLUG_OK)
      ddnccl_fmt(err, cap, "cannot publish the NCCL unique id (key "
                 "'id'): %s", ddnccl_status_name(st));
    return st;
  }
  char buf[sizeof(ncclUniqueId) + DDNCCL_MSG_MAX];
  uint64_t len = 0;
  int st = s->store_get(s->host, "id", buf, sizeof buf - 1, &len,
                        ddnccl_left_ms(deadline));
  if (st != DDPLUG_OK) {
    ddnccl_fmt(err, cap, "no NCCL unique id from rank 0 (key 'id'): %s",
               ddnccl_status_name(st));
    return st;
  }
  if (len != sizeof *id) {
    buf[len < sizeof buf ? len : sizeof buf - 1] = '\0';
    ddnccl_fmt(err, cap, "%s", buf);
    return DDPLUG_E_INTERNAL;
  }
  memcpy(id, buf, sizeof *id);
  return DDPLUG_OK;
}

/* Step 5 and the resources collectives need. */
static int init_comm(ddplug_plugin_group *g, const ncclUniqueId *id,
                     uint64_t deadline) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
#if NCCL_VERSION_CODE >= 21900
  cfg.commName = "ddplug"; /* shows in NCCL's own logs */
#endif
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, g->world, *id, g->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    pthread_mutex_lock(&g->comm_mu);
    g->comm = comm; /* NULL unless NCCL handed one out anyway */
    pthread_mutex_unlock(&g->comm_mu);
    return ddnccl_group_fail(g, ddnccl_status_of(r), 1,
                             "ncclCommInitRankConfig failed on rank %d: "
                             "%s (%s)",
                             g->rank, ncclGetErrorString(r),
                             ncclGetLastError(NULL));
  }
  pthread_mutex_lock(&g->comm_mu);
  g->comm = comm;
  pthread_mutex_unlock(&g->comm_mu);
  int st = ddnccl_settle(g, deadline, "NCCL communicator init", 0);
  if (st != DDPLUG_OK) return st;
  return ddnccl_group_resources(g);
}

/* See internal.h. */
int ddnccl_group_resources(ddplug_plugin_group *g) {
  cudaError_t ce = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  if (ce == cudaSuccess) ce = cudaMalloc((void **)&g->scratch, sizeof(int32_t));
  if (ce == cudaSuccess) ce = cudaMemset(g->scratch, 0, sizeof(int32_t));
  if (ce != cudaSuccess)
    return ddnccl_group_fail(g, DDPLUG_E_SYSTEM, 1,
                             "rank %d: cannot set up the CUDA stream and "
                             "barrier buffer on cuda:%d: %s: %s",
                             g->rank, g->device, cudaGetErrorName(ce),
                             cudaGetErrorString(ce));
  return DDPLUG_OK;
}

/* Step 6: connection setup while every rank is in group_create.
 *
 * NCCL (>= 2.22, NCCL_RUNTIME_CONNECT=1 by default) connects the ranks
 * lazily: the first collective that uses an algorithm sets up its
 * connections, which needs every peer to take part. On a non-blocking
 * communicator that collective answers ncclInProgress until the peers have
 * reached it, so without this step the first collective_start of the run
 * would wait for the other ranks (and a rank that is late, or that calls a
 * different collective first, would turn into a timeout or a hang inside
 * NCCL). One allreduce of one int32 on the scratch word — the barrier's
 * exact shape — here, bounded by the init deadline, connects what small
 * collectives and barriers use; afterwards collective_start returns once
 * NCCL has enqueued the call. Sizes that select another algorithm (e.g.
 * ring vs tree across nodes, NVLS on NVSwitch systems) still connect on
 * their first use, with every rank calling the same collective; setting
 * NCCL_RUNTIME_CONNECT=0 makes NCCL connect every algorithm during init
 * (more GPU memory) and this step cheap. */
int ddnccl_connect_eagerly(ddplug_plugin_group *g, uint64_t deadline) {
  static const char what[] = "NCCL connection setup (a 1-element allreduce)";
  if (g->world < 2) return DDPLUG_OK;
  uint64_t t0 = ddnccl_now_ns();
  pthread_mutex_lock(&g->comm_mu);
  ncclComm_t comm = g->comm;
  ncclResult_t r = comm ? ncclAllReduce(g->scratch, g->scratch, 1, ncclInt32,
                                        ncclSum, comm, g->stream)
                        : ncclSuccess;
  pthread_mutex_unlock(&g->comm_mu);
  if (!comm) return ddnccl_group_failed_status(g, 1);
  if (r == ncclInProgress) {
    int st = ddnccl_settle(g, deadline, what, 0);
    if (st != DDPLUG_OK) return st;
  } else if (r != ncclSuccess) {
    return ddnccl_group_fail(g, ddnccl_status_of(r), 1,
                             "%s: NCCL refused it on rank %d: %s (%s)",
                             what, g->rank, ncclGetErrorString(r),
                             ncclGetLastError(NULL));
  }
  /* Enqueued; now wait until it ran (every rank took part). */
  ddnccl_event *ev = NULL;
  cudaError_t ce = ddnccl_event_get(&g->pool, &ev);
  if (ce == cudaSuccess) {
    ce = cudaEventRecord(ev->ev, g->stream);
    uint64_t next_store = ddnccl_now_ns() + 100000000ull;
    int64_t nap_us = 20;
    while (ce == cudaSuccess) {
      ce = cudaEventQuery(ev->ev);
      if (ce == cudaSuccess) break;
      if (ce != cudaErrorNotReady) break;
      ce = cudaSuccess;
      int st = ddnccl_check_async(g, what);
      if (st != DDPLUG_OK) {
        ddnccl_event_put(&g->pool, ev);
        return st;
      }
      uint64_t now = ddnccl_now_ns();
      if (now >= deadline) {
        ddnccl_event_put(&g->pool, ev);
        return ddnccl_group_fail(
            g, DDPLUG_E_TIMEOUT, 1,
            "%s did not finish on rank %d within %.1f s: the NCCL "
            "communicator was aborted (a rank stopped after NCCL init, or the "
            "GPUs cannot reach each other; NCCL_DEBUG=INFO shows where it "
            "stopped)",
            what, g->rank, (double)(now - t0) / 1e9);
      }
      if (now >= next_store) {
        next_store = now + 100000000ull;
        st = ddnccl_check_peer_abort(g);
        if (st != DDPLUG_OK) {
          ddnccl_event_put(&g->pool, ev);
          return st;
        }
      }
      ddnccl_sleep_us(nap_us);
      if (nap_us < 1000) nap_us *= 2;
    }
    ddnccl_event_put(&g->pool, ev);
  }
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return ddnccl_group_fail(g, DDPLUG_E_SYSTEM, 1,
                             "%s: CUDA failed on rank %d (cuda:%d): %s: %s",
                             what, g->rank, g->device,
                             cudaGetErrorName(ce), cudaGetErrorString(ce));
  }
  ddnccl_log(g->svc, g->log_level, DDPLUG_LOG_DEBUG,
             "rank %d: NCCL connections set up in %.1f ms", g->rank,
             (double)(ddnccl_now_ns() - t0) / 1e6);
  return DDPLUG_OK;
}

/* See internal.h. */
int ddnccl_group_settled(ddplug_plugin_group *g, int st) {
  if (st != DDPLUG_OK) {
    ddnccl_group_failed_status(g, 1);
    ddnccl_group_release(g);
    return st;
  }
  g->ready = 1;
  return DDPLUG_OK;
}

/* See internal.h. Releases what create made; the communicator is already
 * aborted or gone, a revoked one is aborted here. */
void ddnccl_group_release(ddplug_plugin_group *g) {
  if (g->revoked) (void)ncclCommAbort(g->revoked);
  g->revoked = NULL;
  (void)ddnccl_pool_destroy(&g->pool, 0); /* events only: no stages yet */
  if (g->scratch) (void)cudaFree(g->scratch);
  if (g->stream) (void)cudaStreamDestroy(g->stream);
  ddnccl_options_free(&g->opts);
  pthread_mutex_destroy(&g->comm_mu);
  free(g);
}

/* See internal.h. */
ddplug_plugin_group *ddnccl_group_new(const ddplug_group_init *init,
                                      const ddplug_host_services *svc, int64_t timeout_ms) {
  ddplug_plugin_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->init = init;
  g->svc = svc;
  g->rank = init->rank;
  g->world = init->world_size;
  g->log_level = init->log_level > 0 ? init->log_level : DDPLUG_LOG_WARN;
  g->timeout_ms = timeout_ms;
  atomic_init(&g->failed, 0);
  pthread_mutex_init(&g->comm_mu, NULL);
  return g;
}

/* The group_create slot: see plugin.h and the steps above. Blocks at most
 * init->timeout_ms (default 300 s when unset). On failure nothing is left
 * allocated, the communicator (if any) is aborted, and set_error explains
 * which rank failed and why. Called once per rank, from one thread. */
int ddnccl_group_create(const ddplug_group_init *init,
                        const ddplug_host_services *svc,
                        ddplug_plugin_group **out) {
  if (!svc || !DDPLUG_HAS_FIELD(svc, ddplug_host_services, option_int_list))
    return DDPLUG_E_ABI_MISMATCH;
  if (!init || !out)
    return ddnccl_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl group_create: init and out are required");
  if (!DDPLUG_HAS_FIELD(init, ddplug_group_init, reserved0))
    return ddnccl_fail(svc, DDPLUG_E_ABI_MISMATCH,
                       "nccl group_create: ddplug_group_init of %u bytes "
                       "is older than ABI 1.0",
                       init->struct_size);
  if (init->world_size < 1 || init->rank < 0 || init->rank >= init->world_size)
    return ddnccl_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl group_create: rank %d of world %d",
                       init->rank, init->world_size);

  uint64_t t0 = ddnccl_now_ns();
  int64_t timeout = init->timeout_ms > 0 ? init->timeout_ms : DEFAULT_TIMEOUT_MS;
  uint64_t deadline = t0 + (uint64_t)timeout * 1000000ull;

  ddplug_plugin_group *g = ddnccl_group_new(init, svc, timeout);
  if (!g)
    return ddnccl_fail(svc, DDPLUG_E_NO_MEMORY, "nccl: out of memory");
  g->device = -1;

  /* 1-2: local setup, then agree on it (publishing this rank's device). */
  char err[DDNCCL_MSG_MAX] = "", msg[DDNCCL_MSG_MAX] = "";
  int local = local_setup(g, err, sizeof err);
  if (local == DDPLUG_OK) {
    char rec[1024], key[32];
    size_t len = ddnccl_devrec_format(&g->self, rec, sizeof rec);
    snprintf(key, sizeof key, "dev/%d", g->rank);
    int st = svc->store_set(svc->host, key, rec, len);
    if (st != DDPLUG_OK) {
      local = st;
      ddnccl_fmt(err, sizeof err, "cannot publish the device record "
                 "(key '%s'): %s", key, ddnccl_status_name(st));
    }
  }
  int st = ddnccl_agree(svc, "setup", g->rank, g->world, local, err,
                        deadline, msg, sizeof msg);
  /* 3: two ranks on one GPU? */
  if (st == DDPLUG_OK) {
    err[0] = '\0';
    local = check_node_devices(g, deadline, err, sizeof err);
    st = ddnccl_agree(svc, "devices", g->rank, g->world, local, err,
                      deadline, msg, sizeof msg);
  }
  if (st != DDPLUG_OK) {
    ddnccl_fail(svc, st, "nccl: %s", msg);
    ddnccl_group_release(g);
    return st;
  }

  /* 4-5: bootstrap and init on the chosen device. */
  cudaError_t ce = cudaSetDevice(g->device);
  ncclUniqueId id;
  if (ce != cudaSuccess) {
    st = DDPLUG_E_SYSTEM;
    ddnccl_fmt(err, sizeof err, "rank %d: cudaSetDevice(%d) failed: %s: %s",
               g->rank, g->device, cudaGetErrorName(ce),
               cudaGetErrorString(ce));
    /* The others wait for the id: a value of another size tells them why. */
    if (g->rank == 0) (void)svc->store_set(svc->host, "id", err, strlen(err));
  } else {
    st = bootstrap_id(g, &id, deadline, err, sizeof err);
  }
  if (st != DDPLUG_OK) {
    /* Tell the peers waiting for the id or in init, then fail here. */
    ddnccl_group_fail(g, st, 1, "%s", err);
    ddnccl_fail(svc, st, "nccl: %s", err);
    ddnccl_group_release(g);
    return st;
  }
  st = init_comm(g, &id, deadline);
  if (st == DDPLUG_OK) st = ddnccl_connect_eagerly(g, deadline);
  st = ddnccl_group_settled(g, st);
  if (st != DDPLUG_OK) return st;
  int v = g->self.nccl_version;
  ddnccl_log(svc, g->log_level, DDPLUG_LOG_INFO,
             "NCCL %d.%d.%d communicator ready: rank %d of %d on cuda:%d "
             "(%s, %s)%s in %.1f ms",
             v / 10000, (v % 10000) / 100, v % 100, g->rank, g->world,
             g->device, g->self.name, g->self.uuid,
             g->shared_gpu ? ", GPU shared with other ranks" : "",
             (double)(ddnccl_now_ns() - t0) / 1e6);
  *out = g;
  return DDPLUG_OK;
}

/* ---- destroy, abort ------------------------------------------------------ */

/* Finalize (flushing what was enqueued; collective with the peers) within
 * the group's timeout, then destroy; on failure or timeout abort instead. */
static int finalize_comm(ddplug_plugin_group *g) {
  uint64_t deadline = ddnccl_now_ns() + (uint64_t)g->timeout_ms * 1000000ull;
  pthread_mutex_lock(&g->comm_mu);
  ncclComm_t comm = g->comm;
  ncclResult_t r = comm ? ncclCommFinalize(comm) : ncclSuccess;
  pthread_mutex_unlock(&g->comm_mu);
  if (!comm) return DDPLUG_OK;
  if (r != ncclSuccess && r != ncclInProgress)
    return ddnccl_group_fail(g, ddnccl_status_of(r), 1,
                             "ncclCommFinalize failed on rank %d: %s (%s)",
                             g->rank, ncclGetErrorString(r),
                             ncclGetLastError(NULL));
  int st = ddnccl_settle(g, deadline, "NCCL communicator finalize", 0);
  if (st != DDPLUG_OK) return st; /* settle aborted the communicator */
  pthread_mutex_lock(&g->comm_mu);
  comm = g->comm;
  g->comm = NULL;
  pthread_mutex_unlock(&g->comm_mu);
  /* Finalized: destroy frees local resources only (it may hand that to
   * NCCL's background thread and answer ncclInProgress: nothing to wait). */
  if (comm) (void)ncclCommDestroy(comm);
  return DDPLUG_OK;
}

/* The group_destroy slot. Finalizes the communicator when the group is
 * healthy (bounded by the collective timeout; aborts past it), else it was
 * aborted already. Then releases requests, pools, stream and memory. GPU
 * memory that in-flight copies may still touch (only after an abort, and
 * only if they do not finish within the collective timeout, at most 10 s)
 * is leaked with a warning rather than freed. Returns OK, or the finalize failure (the group is released
 * anyway). Not callable concurrently with other slots of the group. */
int ddnccl_group_destroy(ddplug_plugin_group *g) {
  if (!g) return DDPLUG_OK;
  (void)ddnccl_use_device(g);
  int st = DDPLUG_OK;
  if (!atomic_load(&g->failed)) (void)ddnccl_check_peer_abort(g);
  if (!atomic_load(&g->failed)) st = finalize_comm(g);

  /* Bounded wait for GPU copies into staging memory (only after an abort
   * can they still be running): the collective timeout, at most 10 s. */
  int64_t grace_ms = g->timeout_ms < 10000 ? g->timeout_ms : 10000;
  uint64_t deadline = ddnccl_now_ns() + (uint64_t)grace_ms * 1000000ull;
  while (g->live) {
    ddplug_plugin_request *r = g->live;
    g->live = r->next;
    ddnccl_stage_put(&g->pool, r->stage, r->event);
    ddnccl_event_put(&g->pool, r->event);
    free(r);
  }
  while (g->spare) {
    ddplug_plugin_request *r = g->spare;
    g->spare = r->next;
    free(r);
  }
  free(g->p2p_queue); /* queued sends and receives never launched: dropped */
  g->p2p_queue = NULL;
  g->p2p_n = 0;
  ddnccl_event_put(&g->pool, g->last_event);
  g->last_event = NULL;
  if (g->stream) {
    (void)cudaStreamDestroy(g->stream); /* released once its work is done */
    g->stream = NULL;
  }
  int leaked = ddnccl_pool_destroy(&g->pool, deadline);
  if (leaked)
    ddnccl_log(g->svc, g->log_level, DDPLUG_LOG_WARN,
               "left %d staging buffer%s allocated: GPU copies into them "
               "did not finish within %lld ms (requests freed while "
               "pending, or an abort)",
               leaked, leaked == 1 ? "" : "s", (long long)grace_ms);
  if (g->scratch && !leaked) {
    (void)cudaFree(g->scratch);
  }
  g->scratch = NULL;
  ddnccl_group_release(g);
  return st;
}

/* The group_abort slot: callable from any thread, also while another
 * thread waits in request_wait on this group. Marks the group failed
 * (every blocked or later call returns DDPLUG_E_ABORTED), aborts the NCCL
 * communicator (its kernels stop), and publishes "rank R: reason" as the
 * store key "abort", which the other ranks' waits look at every 100 ms.
 * Returns OK (also when the group had failed already). */
int ddnccl_group_abort(ddplug_plugin_group *g, const char *reason) {
  if (!g) return DDPLUG_E_INVALID_ARGUMENT;
  if (atomic_load(&g->failed)) {
    /* Already failed: make sure the communicator is gone, keep the cause. */
    pthread_mutex_lock(&g->comm_mu);
    ncclComm_t comm = g->comm;
    g->comm = NULL;
    if (comm) (void)ncclCommAbort(comm);
    pthread_mutex_unlock(&g->comm_mu);
    return DDPLUG_OK;
  }
  ddnccl_group_fail(g, DDPLUG_E_ABORTED, 1, "aborted on rank %d: %s",
                    g->rank, reason && *reason ? reason : "no reason given");
  return DDPLUG_OK;
}
