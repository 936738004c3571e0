/*
 * shrink.c — group_shrink: after a lost rank, the survivors' NCCL
 * communicator is made in place from the old one (ncclCommShrink, NCCL >=
 * 2.27) instead of a new ncclUniqueId and a full init over the store.
 *
 * When. Only with plugin_options.shrink = "auto", and only where the loaded
 * libnccl has both ncclCommRevoke and ncclCommShrink. They are weak
 * references: the plugin is built against the pinned NCCL's headers but
 * loads with whatever libnccl.so.2 the process has (torch's own may be
 * older), and a missing symbol must mean "re-create", never a plugin that
 * does not load. Otherwise the slot declines (DDPLUG_E_UNSUPPORTED) and
 * the runtime destroys the group and calls group_create over the
 * survivors: the default ("recreate"), which is what ran on an H100
 * (README.md, "When a rank dies"); "auto" ran once on a GPU (H100, NCCL
 * 2.30.7), which found the newcomm bug of step 4; its fix has run against
 * the fake NCCL of test-nccl-fake only, so it is not the default yet.
 *
 * How:
 *   1. when the group fails (a lost peer, an abort, a timeout) after it was
 *      ready, its communicator is revoked rather than aborted
 *      (ddnccl_revoke_for_shrink, from ddnccl_group_fail): NCCL stops its
 *      in-flight operations as an abort would, but the communicator stays
 *      a valid parent for a shrink; group_destroy aborts it;
 *   2. every survivor says through the store (the new generation's keys)
 *      whether it can shrink in place; if any cannot (another NCCL, an old
 *      group that was aborted rather than revoked), every one declines, so
 *      no survivor waits in ncclCommShrink for one that went to
 *      group_create;
 *   3. the revoked communicator is waited for until it is quiescent
 *      (ncclCommGetAsyncError no longer ncclInProgress);
 *   4. ncclCommShrink with the lost ranks excluded, non-blocking: NCCL
 *      runs it as a job of the parent's, which is polled until it leaves
 *      ncclInProgress (bounded by init->timeout_ms), and only then writes
 *      the new communicator through newcomm; NCCL renumbers the
 *      survivors in the order of their old ranks, as the runtime does, and
 *      the new rank and size are checked against init;
 *   5. the rest as group_create makes it: the stream and barrier word, and
 *      the eager connection setup.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#pragma weak ncclCommRevoke
#pragma weak ncclCommShrink

/* 1 when the loaded NCCL can shrink a revoked communicator. */
static int nccl_can_shrink(void) {
  return ncclCommRevoke != NULL && ncclCommShrink != NULL;
}

/* See internal.h. */
int ddnccl_revoke_for_shrink(ddplug_plugin_group *g, ncclComm_t comm) {
  if (!g->opts.shrink_auto || !nccl_can_shrink()) return 0;
  ncclResult_t r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  if (r != ncclSuccess && r != ncclInProgress) return 0;
  g->revoked = comm;
  return 1;
}

/* Whether this survivor can shrink old in place; if not, why (in why). */
static int can_shrink(ddplug_plugin_group *old, char *why, size_t cap) {
  if (!old->opts.shrink_auto) {
    ddnccl_fmt(why, cap, "plugin_options.shrink is \"recreate\"");
    return 0;
  }
  if (!nccl_can_shrink()) {
    int v = old->self.nccl_version;
    ddnccl_fmt(why, cap, "the loaded NCCL %d.%d.%d has no %s", v / 10000, (v % 10000) / 100,
               v % 100, ncclCommShrink ? "ncclCommRevoke" : "ncclCommShrink");
    return 0;
  }
  pthread_mutex_lock(&old->comm_mu);
  int kept = old->revoked != NULL;
  pthread_mutex_unlock(&old->comm_mu);
  if (!kept) {
    ddnccl_fmt(why, cap, "the old communicator was aborted, not revoked (the group failed "
               "before it was ready, or NCCL refused the revocation)");
    return 0;
  }
  return 1;
}

/* The revoked communicator out of ncclInProgress, by deadline: step 3
 * (its operations stopped) and step 4 (the shrink's background job, which
 * NCCL accounts to the parent, finished). *state_out (may be NULL)
 * receives its state then. */
static int wait_parent(ddplug_plugin_group *old, uint64_t deadline, const char *what,
                       ncclResult_t *state_out, char *err, size_t cap) {
  int64_t nap_us = 50;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    pthread_mutex_lock(&old->comm_mu);
    ncclResult_t r = ncclCommGetAsyncError(old->revoked, &state);
    pthread_mutex_unlock(&old->comm_mu);
    if (r != ncclSuccess) state = r;
    if (state != ncclInProgress) {
      if (state_out) *state_out = state;
      return DDPLUG_OK;
    }
    if (ddnccl_now_ns() >= deadline) {
      ddnccl_fmt(err, cap, "%s did not finish within the collective timeout on rank %d", what,
                 old->rank);
      return DDPLUG_E_TIMEOUT;
    }
    ddnccl_sleep_us(nap_us);
    if (nap_us < 1000) nap_us *= 2;
  }
}

/* A group for the survivors with old's device and options. NULL when out
 * of memory. */
static ddplug_plugin_group *group_like(const ddplug_plugin_group *old,
                                       const ddplug_group_init *init,
                                       const ddplug_host_services *svc, int64_t timeout) {
  ddplug_plugin_group *g = ddnccl_group_new(init, svc, timeout);
  if (!g) return NULL;
  g->device = old->device;
  g->self = old->self;
  g->self.rank = init->rank;
  g->shared_gpu = old->shared_gpu;
  g->warn_shared_gpu = old->warn_shared_gpu;
  g->opts = old->opts;
  g->opts.device_map = NULL;
  g->opts.device_map_len = 0;
  if (old->opts.device_map_len) {
    g->opts.device_map = calloc(old->opts.device_map_len, sizeof *g->opts.device_map);
    if (!g->opts.device_map) {
      pthread_mutex_destroy(&g->comm_mu);
      free(g);
      return NULL;
    }
    memcpy(g->opts.device_map, old->opts.device_map,
           old->opts.device_map_len * sizeof *g->opts.device_map);
    g->opts.device_map_len = old->opts.device_map_len;
  }
  return g;
}

/* Step 4: the lost ranks (old ranks no survivor had) excluded. */
static int shrink_comm(ddplug_plugin_group *old, ddplug_plugin_group *g,
                       const int32_t *old_rank_of, uint64_t deadline) {
  int *exclude = calloc((size_t)old->world, sizeof *exclude);
  char *kept = calloc((size_t)old->world, 1);
  if (!exclude || !kept) {
    free(exclude);
    free(kept);
    return ddnccl_group_fail(g, DDPLUG_E_NO_MEMORY, 0, "group_shrink: out of memory");
  }
  int n = 0;
  for (int32_t r = 0; r < g->world; r++) kept[old_rank_of[r]] = 1;
  for (int32_t r = 0; r < old->world; r++)
    if (!kept[r]) exclude[n++] = r;
  free(kept);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
#if NCCL_VERSION_CODE >= 21900
  cfg.commName = "ddplug";
#endif
  /* With a non-blocking parent, NCCL runs the shrink as a background job
   * (accounted to the parent: ncclInProgress there until it ends) and
   * writes the new communicator through newcomm only when that job ends,
   * NULL until then: into memory that must outlive this call, and maybe
   * outlive this function when it gives up first (the deadline), so it is
   * freed only once the job has ended (else 8 bytes stay). The
   * H100 run of elastic_shrink_in_place_with_nccl_comm_shrink (NCCL 2.30.7)
   * found this: a stack variable read right after the call was NULL. */
  ncclComm_t *slot = calloc(1, sizeof *slot);
  if (!slot) {
    free(exclude);
    return ddnccl_group_fail(g, DDPLUG_E_NO_MEMORY, 0, "group_shrink: out of memory");
  }
  pthread_mutex_lock(&old->comm_mu);
  ncclResult_t r = ncclCommShrink(old->revoked, exclude, n, slot, &cfg, NCCL_SHRINK_DEFAULT);
  pthread_mutex_unlock(&old->comm_mu);
  free(exclude);
  if (r != ncclSuccess && r != ncclInProgress)
    return ddnccl_group_fail(g, ddnccl_status_of(r), 1,
                             "ncclCommShrink failed on rank %d (was rank %d of %d): %s (%s)",
                             g->rank, (int)old_rank_of[g->rank], old->world,
                             ncclGetErrorString(r), ncclGetLastError(NULL));
  char err[DDNCCL_MSG_MAX] = "";
  ncclResult_t job = ncclSuccess;
  int wst = wait_parent(old, deadline, "ncclCommShrink", &job, err, sizeof err);
  if (wst != DDPLUG_OK) return ddnccl_group_fail(g, wst, 1, "group_shrink: %s", err);
  /* the job stored it before the parent left ncclInProgress */
  ncclComm_t comm = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  free(slot);
  pthread_mutex_lock(&g->comm_mu);
  g->comm = comm;
  pthread_mutex_unlock(&g->comm_mu);
  /* The job writes the communicator even when its init failed, so the
   * slot decides; the parent's state (the job's result, or an error its
   * proxy kept from before the revoke) only explains a failure. */
  if (!comm)
    return ddnccl_group_fail(g, job != ncclSuccess ? ddnccl_status_of(job) : DDPLUG_E_INTERNAL, 1,
                             "ncclCommShrink failed on rank %d (was rank %d of %d): it ended "
                             "without a communicator (the parent reports %s; %s)",
                             g->rank, (int)old_rank_of[g->rank], old->world,
                             ncclGetErrorString(job), ncclGetLastError(NULL));
  int st = ddnccl_settle(g, deadline, "ncclCommShrink", 0);
  if (st != DDPLUG_OK) return st;
  int rank = -1, count = -1;
  pthread_mutex_lock(&g->comm_mu);
  (void)ncclCommUserRank(g->comm, &rank);
  (void)ncclCommCount(g->comm, &count);
  pthread_mutex_unlock(&g->comm_mu);
  if (rank != g->rank || count != g->world)
    return ddnccl_group_fail(g, DDPLUG_E_INTERNAL, 1,
                             "ncclCommShrink made rank %d of %d where the runtime says rank %d "
                             "of %d (was rank %d of %d; the parent reports %s)",
                             rank, count, g->rank, g->world, (int)old_rank_of[g->rank],
                             old->world, ncclGetErrorString(job));
  return DDPLUG_OK;
}

/* See internal.h and plugin.h (group_shrink). */
int ddnccl_group_shrink(ddplug_plugin_group *old, const ddplug_group_init *init,
                        const ddplug_host_services *svc, const int32_t *old_rank_of,
                        ddplug_plugin_group **out) {
  if (!old || !init || !svc || !old_rank_of || !out)
    return ddnccl_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl group_shrink: group, init, svc, old_rank_of and out are required");
  if (init->world_size < 1 || init->world_size > old->world || init->rank < 0 ||
      init->rank >= init->world_size)
    return ddnccl_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                       "nccl group_shrink: rank %d of world %d from a group of %d",
                       init->rank, init->world_size, old->world);
  for (int32_t r = 0; r < init->world_size; r++)
    if (old_rank_of[r] < 0 || old_rank_of[r] >= old->world ||
        (r > 0 && old_rank_of[r] <= old_rank_of[r - 1]))
      return ddnccl_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                         "nccl group_shrink: old_rank_of[%d] = %d: the survivors' old ranks "
                         "must rise, each below %d",
                         r, (int)old_rank_of[r], old->world);
  int64_t timeout = init->timeout_ms > 0 ? init->timeout_ms : old->timeout_ms;
  uint64_t t0 = ddnccl_now_ns();
  uint64_t deadline = t0 + (uint64_t)timeout * 1000000ull;
  (void)ddnccl_use_device(old);
  /* The old group fails (revoked with "auto") if the runtime has not
   * aborted it yet. */
  if (!atomic_load(&old->failed))
    (void)ddnccl_group_fail(old, DDPLUG_E_PEER_LOST, 0,
                            "the group was re-formed without its lost rank(s)");

  /* 2. in place only if every survivor can */
  char why[DDNCCL_MSG_MAX] = "", msg[DDNCCL_MSG_MAX] = "";
  int local = can_shrink(old, why, sizeof why) ? DDPLUG_OK : DDPLUG_E_UNSUPPORTED;
  int st = ddnccl_agree(svc, "shrink", init->rank, init->world_size, local, why, deadline, msg,
                        sizeof msg);
  if (st == DDPLUG_E_UNSUPPORTED)
    return ddnccl_fail(svc, st, "nccl: cannot shrink in place (%s): a new communicator over "
                       "the survivors instead", msg);
  if (st != DDPLUG_OK) return ddnccl_fail(svc, st, "nccl group_shrink: %s", msg);

  ddplug_plugin_group *g = group_like(old, init, svc, timeout);
  if (!g) return ddnccl_fail(svc, DDPLUG_E_NO_MEMORY, "nccl: out of memory");
  /* 3-5 */
  char err[DDNCCL_MSG_MAX] = "";
  st = wait_parent(old, deadline, "stopping the revoked communicator", NULL, err, sizeof err);
  if (st != DDPLUG_OK) st = ddnccl_group_fail(g, st, 1, "group_shrink: %s", err);
  if (st == DDPLUG_OK) st = shrink_comm(old, g, old_rank_of, deadline);
  if (st == DDPLUG_OK) st = ddnccl_group_resources(g);
  if (st == DDPLUG_OK) st = ddnccl_connect_eagerly(g, deadline);
  st = ddnccl_group_settled(g, st);
  if (st != DDPLUG_OK) return st;
  ddnccl_log(svc, g->log_level, DDPLUG_LOG_INFO,
             "the group was shrunk in place with ncclCommShrink: %d of %d ranks remain; this "
             "one was rank %d and is rank %d, on cuda:%d, in %.1f ms",
             g->world, old->world, (int)old_rank_of[g->rank], g->rank, g->device,
             (double)(ddnccl_now_ns() - t0) / 1e6);
  *out = g;
  return DDPLUG_OK;
}
