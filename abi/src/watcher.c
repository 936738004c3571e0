/* watcher.c — failure propagation. The run's first failure is published as
 * ddplug/abort = "<STATUS>|<sentence>" (by a rank that aborts, or by the
 * store server when a rank's connection drops without a clean close). A
 * watcher thread per context blocks on that key through its own store
 * connection; when it appears, the context is aborted and the plugin's
 * group_abort unblocks whatever the rank is doing. Losing the store itself
 * (rank 0 died) is also a failure of the run.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"

int ddplug__ctx_check(ddplug_context *ctx) {
  if (atomic_load(&ctx->state) == DDPLUG__CTX_OPEN) return DDPLUG_OK;
  pthread_mutex_lock(&ctx->mu);
  int status = ctx->abort_status;
  ddplug__err(status, "%s", ctx->abort_reason);
  pthread_mutex_unlock(&ctx->mu);
  return status;
}

void ddplug__ctx_abort(ddplug_context *ctx, int status, const char *reason,
                       int publish) {
  pthread_mutex_lock(&ctx->mu);
  int first = atomic_load(&ctx->state) == DDPLUG__CTX_OPEN;
  if (first) {
    ctx->abort_status = status;
    ddplug__strlcpy(ctx->abort_reason, reason ? reason : "aborted",
                    sizeof ctx->abort_reason);
    atomic_store(&ctx->state, DDPLUG__CTX_ABORTED);
  }
  /* Tell the plugin while holding mu, so group creation/destruction (which
   * take mu to publish/clear ctx->group) cannot race with it. */
  if (first && ctx->group && ctx->plugin->table.group_abort)
    ctx->plugin->table.group_abort(ctx->group, ctx->abort_reason);
  pthread_mutex_unlock(&ctx->mu);
  if (!first) return;
  DDPLUG__ERROR("%s", reason ? reason : "aborted");
  if (publish && ctx->store) {
    char value[DDPLUG__ERRMSG_MAX + 32];
    int n = snprintf(value, sizeof value, "%s|%s", ddplug_status_name(status),
                     reason ? reason : "aborted");
    if (n > (int)sizeof value - 1) n = (int)sizeof value - 1;
    int swapped = 0;
    /* First failure of the run wins; ours may come second. */
    ddplug_store_compare_set(ctx->store, "ddplug/abort", NULL, 0, value,
                             (uint64_t)n, &swapped, NULL, NULL);
  }
}

void ddplug__ctx_adopt_abort(ddplug_context *ctx, const char *text) {
  const char *bar = strchr(text, '|');
  int status = DDPLUG_E_ABORTED;
  for (int c = 1; bar && c < DDPLUG_STATUS_COUNT_; c++) {
    const char *name = ddplug_status_name(c);
    if ((size_t)(bar - text) == strlen(name) && !strncmp(text, name, strlen(name)))
      status = c;
  }
  ddplug__ctx_abort(ctx, status, bar ? bar + 1 : text, 0);
}

static void *watch(void *arg) {
  ddplug_context *ctx = arg;
  while (!atomic_load(&ctx->watcher_stop)) {
    void *val = NULL;
    uint64_t len = 0;
    int s = ddplug_store_get(ctx->watch_store, "ddplug/abort",
                             DDPLUG__WAIT_SLICE_MS * 2, &val, &len);
    if (s == DDPLUG_E_TIMEOUT) continue;
    if (atomic_load(&ctx->watcher_stop)) {
      ddplug_free(val);
      break;
    }
    if (s == DDPLUG_OK) {
      ddplug__ctx_adopt_abort(ctx, val);
      ddplug_free(val);
      break;
    }
    /* The store is gone: rank 0 (which serves it) died, or the network. */
    char msg[DDPLUG__ERRMSG_MAX];
    snprintf(msg, sizeof msg,
             "lost the rendezvous store at %s:%d, which rank 0 serves: rank 0 "
             "exited or was killed, or the network failed (%s)",
             ctx->store_addr, ctx->store_port, ddplug_last_error());
    ddplug__ctx_abort(ctx, DDPLUG_E_PEER_LOST, msg, 0);
    break;
  }
  return NULL;
}

int ddplug__watcher_start(ddplug_context *ctx) {
  atomic_store(&ctx->watcher_stop, 0);
  int rc = pthread_create(&ctx->watcher, NULL, watch, ctx);
  if (rc != 0)
    return ddplug__err_errno(DDPLUG_E_SYSTEM, rc, "cannot start the failure watcher thread");
  ctx->watcher_running = 1;
  return DDPLUG_OK;
}

void ddplug__watcher_stop(ddplug_context *ctx) {
  if (!ctx->watcher_running) return;
  atomic_store(&ctx->watcher_stop, 1);
  pthread_join(ctx->watcher, NULL);
  ctx->watcher_running = 0;
}
