/* watcher.c — the failure watcher: a thread per context blocks on
 * ddplug/abort through its own store connection; when the key appears, the
 * context is aborted (failure.c) and the plugin's group_abort unblocks
 * whatever the rank is doing. Losing the store itself (rank 0 died) is also
 * a failure of the run.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/context.h"

static void *watch(void *arg) {
  ddplug_context *ctx = arg;
  while (!atomic_load(&ctx->watcher_stop)) {
    void *val = NULL;
    uint64_t len = 0;
    int s = ddplug_store_get(ctx->watch_store, ctx->abort_key,
                             DDPLUG__WAIT_SLICE_MS * 2, &val, &len);
    if (s == DDPLUG_E_TIMEOUT) continue;
    if (atomic_load(&ctx->watcher_stop)) {
      ddplug_free(val);
      break;
    }
    if (s == DDPLUG_OK) {
      ddplug__ctx_adopt_abort(ctx, val, DDPLUG__ABORT_NOTIFY);
      ddplug_free(val);
      break;
    }
    ddplug__ctx_store_lost(ctx);
    break;
  }
  return NULL;
}

/* See context.h. */
void ddplug__ctx_store_lost(ddplug_context *ctx) {
  /* The store is gone: rank 0 (which serves it) died, or the network. */
  char msg[DDPLUG__ERRMSG_MAX];
  snprintf(msg, sizeof msg,
           "lost the rendezvous store at %s:%d, which rank 0 serves: rank 0 "
           "exited or was killed, or the network failed (%s)",
           ctx->store_addr, ctx->store_port, ddplug_last_error());
  ddplug__ctx_abort(ctx, DDPLUG_E_PEER_LOST, msg, DDPLUG__ABORT_NOTIFY);
}

/* See context.h. */
int ddplug__watcher_start(ddplug_context *ctx) {
  atomic_store(&ctx->watcher_stop, 0);
  int rc = pthread_create(&ctx->watcher, NULL, watch, ctx);
  if (rc != 0)
    return ddplug__err_errno(DDPLUG_E_SYSTEM, rc, "cannot start the failure watcher thread");
  ctx->watcher_running = 1;
  return DDPLUG_OK;
}

/* See context.h. */
void ddplug__watcher_stop(ddplug_context *ctx) {
  if (!ctx->watcher_running) return;
  atomic_store(&ctx->watcher_stop, 1);
  pthread_join(ctx->watcher, NULL);
  ctx->watcher_running = 0;
}
