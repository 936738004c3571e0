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
#include <sched.h>

#include "internal.h"

#define STORE_POLL_NS 100000000ull /* 100 ms */

/* ncclTimeout (8) is newer than some NCCL headers the plugin builds against
 * (2.28's end at ncclInProgress): matched by value, so the plugin builds
 * against either and an older library, which never returns it, is unaffected. */
#define NCCL_RESULT_TIMEOUT 8

int ddnccl_status_of(ncclResult_t r) {
  switch ((int)r) {
    case ncclSuccess: return DDPLUG_OK;
    case ncclRemoteError: return DDPLUG_E_PEER_LOST;
    case NCCL_RESULT_TIMEOUT: return DDPLUG_E_TIMEOUT;
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
  return ddnccl_group_fail(g, ddnccl_status_of(r), 1,
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

/* See internal.h. */
int ddnccl_check_async(ddplug_plugin_group *g, const char *what) {
  int gone = 0;
  ncclResult_t s = comm_state(g, &gone);
  if (gone || atomic_load(&g->failed)) return ddnccl_group_failed_status(g, 0);
  if (s == ncclSuccess || s == ncclInProgress) return DDPLUG_OK;
  return nccl_failed(g, s, what);
}

/* See internal.h. */
int ddnccl_collective_timed_out(ddplug_plugin_group *g, const char *what,
                                uint64_t start_ns, uint64_t now_ns,
                                int enqueuing) {
  double ran = now_ns > start_ns ? (double)(now_ns - start_ns) / 1e9 : 0.0;
  return ddnccl_group_fail(
      g, DDPLUG_E_TIMEOUT, 1,
      "%s did not complete within the collective timeout (%.1f s, running "
      "%.1f s%s): the NCCL communicator was aborted on rank %d. A peer is slow, "
      "stuck, dead, or issued different collectives (NCCL cannot tell which); "
      "the group cannot be used any more: close the context",
      what, (double)g->timeout_ms / 1e3, ran,
      enqueuing ? ", NCCL still enqueuing it: connecting to its peers" : "",
      g->rank);
}

/* Polling schedule of settle: busy for SETTLE_SPIN_NS (a collective's launch
 * by NCCL's background thread takes microseconds to tens of microseconds;
 * the common case must not pay a sleep, which costs >= 50 us of timer
 * slack), then sched_yield() until SETTLE_YIELD_NS (lets that thread run on
 * a busy CPU),
 * then sleeps growing from 50 us to 1 ms (init, finalize, connection setup
 * waiting for peers). */
#define SETTLE_SPIN_NS 20000ull     /* 20 us */
#define SETTLE_YIELD_NS 2000000ull  /* 2 ms  */

/* See internal.h. */
int ddnccl_settle(ddplug_plugin_group *g, uint64_t deadline_ns,
                  const char *what, uint64_t coll_start_ns) {
  uint64_t start = ddnccl_now_ns();
  uint64_t next_store = start + STORE_POLL_NS;
  int64_t nap_us = 50;
  for (;;) {
    int gone = 0;
    ncclResult_t s = comm_state(g, &gone);
    if (gone || atomic_load(&g->failed))
      return ddnccl_group_failed_status(g, 1);
    if (s == ncclSuccess) return DDPLUG_OK;
    if (s != ncclInProgress) return nccl_failed(g, s, what);
    uint64_t now = ddnccl_now_ns();
    if (now >= deadline_ns) {
      if (coll_start_ns)
        return ddnccl_collective_timed_out(g, what, coll_start_ns, now, 1);
      return ddnccl_group_fail(
          g, DDPLUG_E_TIMEOUT, 1,
          "%s did not finish on rank %d within %.1f s: the NCCL communicator "
          "was aborted (is every rank running and able to reach the others? "
          "NCCL_DEBUG=INFO shows where it stopped)",
          what, g->rank, (double)(now - start) / 1e9);
    }
    if (now >= next_store) {
      next_store = now + STORE_POLL_NS;
      int st = ddnccl_check_peer_abort(g);
      if (st != DDPLUG_OK) return st;
    }
    uint64_t spent = now - start;
    if (spent < SETTLE_SPIN_NS) continue;
    if (spent < SETTLE_YIELD_NS) {
      sched_yield();
      continue;
    }
    uint64_t wake = now + (uint64_t)nap_us * 1000u;
    if (wake > deadline_ns) wake = deadline_ns;
    if (wake > next_store) wake = next_store;
    ddnccl_sleep_us((int64_t)((wake - now) / 1000u));
    if (nap_us < 1000) nap_us *= 2;
  }
}
