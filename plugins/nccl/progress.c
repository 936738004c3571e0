/*
 * progress.c — watching a non-blocking NCCL communicator: wait for a call
 * that answered ncclInProgress to settle, look for asynchronous errors, and
 * translate NCCL results into ddplug statuses.
 *
 * Every wait here has a deadline, gives comm_mu back between polls (so
 * group_abort from another thread gets in within one poll), and looks at
 * the store key "abort" every 100 ms (so an abort or failure on another
 * rank ends it within about 100 ms plus one store round trip).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "nccl_plugin.h"

#define STORE_POLL_NS 100000000ull /* 100 ms */

int ddplug_nccl__status_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return DDPLUG_OK;
    case ncclRemoteError: return DDPLUG_E_PEER_LOST;
    case ncclTimeout: return DDPLUG_E_TIMEOUT;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return DDPLUG_E_INVALID_ARGUMENT;
    case ncclSystemError:
    case ncclUnhandledCudaError: return DDPLUG_E_SYSTEM;
    default: return DDPLUG_E_INTERNAL;
  }
}

/* Fails the group for an NCCL error state seen while doing `what`. */
static int nccl_failed(ddplug_plugin_group *g, ncclResult_t r,
                       const char *what) {
  const char *hint = r == ncclRemoteError
                         ? "a peer process exited or the network failed"
                         : "see NCCL_DEBUG=WARN output for details";
  return ddplug_nccl__group_fail(g, ddplug_nccl__status_of(r), 1,
                                 "%s failed on rank %d: NCCL: %s (%s; %s)", what,
                                 g->rank, ncclGetErrorString(r),
                                 ncclGetLastError(NULL), hint);
}

/* Reads the communicator's state under comm_mu. *gone = 1 if it was
 * aborted (group failed). */
static ncclResult_t comm_state(ddplug_plugin_group *g, int *gone) {
  ncclResult_t state = ncclSuccess;
  pthread_mutex_lock(&g->comm_mu);
  *gone = g->comm == NULL;
  if (!*gone) {
    ncclResult_t r = ncclCommGetAsyncError(g->comm, &state);
    if (r != ncclSuccess) state = r;
  }
  pthread_mutex_unlock(&g->comm_mu);
  return state;
}

/* See nccl_plugin.h. */
int ddplug_nccl__check_async(ddplug_plugin_group *g, const char *what) {
  int gone = 0;
  ncclResult_t s = comm_state(g, &gone);
  if (gone || atomic_load(&g->failed)) return ddplug_nccl__group_failed_status(g, 0);
  if (s == ncclSuccess || s == ncclInProgress) return DDPLUG_OK;
  return nccl_failed(g, s, what);
}

/* See nccl_plugin.h. Spins briefly (most calls settle within
 * microseconds), then sleeps 1 ms between polls. */
int ddplug_nccl__settle(ddplug_plugin_group *g, uint64_t deadline_ns,
                        const char *what) {
  uint64_t start = ddplug_nccl__now_ns();
  uint64_t next_store = start + STORE_POLL_NS;
  for (int polls = 0;; polls++) {
    int gone = 0;
    ncclResult_t s = comm_state(g, &gone);
    if (gone || atomic_load(&g->failed))
      return ddplug_nccl__group_failed_status(g, 1);
    if (s == ncclSuccess) return DDPLUG_OK;
    if (s != ncclInProgress) return nccl_failed(g, s, what);
    uint64_t now = ddplug_nccl__now_ns();
    if (now >= deadline_ns)
      return ddplug_nccl__group_fail(
          g, DDPLUG_E_TIMEOUT, 1,
          "%s did not finish on rank %d within %.1f s: the NCCL communicator "
          "was aborted (is every rank running and able to reach the others? "
          "NCCL_DEBUG=INFO shows where it stopped)",
          what, g->rank, (double)(now - start) / 1e9);
    if (now >= next_store) {
      next_store = now + STORE_POLL_NS;
      int st = ddplug_nccl__check_peer_abort(g);
      if (st != DDPLUG_OK) return st;
    }
    ddplug_nccl__sleep_us(polls < 100 ? 10 : 1000);
  }
}
