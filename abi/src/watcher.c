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

/* The abort state is written once: status and reason are stored before the
 * state flips (release), so readers that see the flip (acquire) read them
 * without a lock — a thread blocked in a plugin slot can always check. */
int ddplug__ctx_check(ddplug_context *ctx) {
  if (atomic_load_explicit(&ctx->state, memory_order_acquire) == DDPLUG__CTX_OPEN)
    return DDPLUG_OK;
  return ddplug__err(ctx->abort_status, "%s", ctx->abort_reason);
}

void ddplug__ctx_abort(ddplug_context *ctx, int status, const char *reason, int flags) {
  pthread_mutex_lock(&ctx->mu);
  int first = atomic_load(&ctx->state) == DDPLUG__CTX_OPEN;
  if (first) {
    ctx->abort_status = status;
    ddplug__strlcpy(ctx->abort_reason, reason ? reason : "aborted", sizeof ctx->abort_reason);
    atomic_store_explicit(&ctx->state, DDPLUG__CTX_ABORTED, memory_order_release);
  }
  /* Tell the plugin once, outside the lock (its group_abort may take its own
   * locks, which its slots may hold while calling our host services). The
   * in-progress count keeps destroy_group from freeing the group meanwhile. */
  ddplug_plugin_group *g = NULL;
  if ((flags & DDPLUG__ABORT_NOTIFY) && !ctx->plugin_notified && ctx->group &&
      ctx->plugin->table.group_abort) {
    ctx->plugin_notified = 1;
    g = ctx->group;
    ctx->aborting++;
  }
  pthread_mutex_unlock(&ctx->mu);
  if (g) {
    ctx->plugin->table.group_abort(g, ctx->abort_reason);
    pthread_mutex_lock(&ctx->mu);
    if (--ctx->aborting == 0) pthread_cond_broadcast(&ctx->abort_cv);
    pthread_mutex_unlock(&ctx->mu);
  }
  if (!first) return;
  DDPLUG__ERROR("%s", reason ? reason : "aborted");
  if ((flags & DDPLUG__ABORT_PUBLISH) && ctx->store) {
    char value[DDPLUG__ERRMSG_MAX + 32];
    int n = snprintf(value, sizeof value, "%s|%s", ddplug_status_name(status),
                     reason ? reason : "aborted");
    if (n > (int)sizeof value - 1) n = (int)sizeof value - 1;
    int swapped = 0;
    /* First failure of the run wins; ours may come second. */
    ddplug_store_compare_set(ctx->store, "ddplug/abort", NULL, 0, value, (uint64_t)n,
                             &swapped, NULL, NULL);
  }
}

void ddplug__ctx_adopt_abort(ddplug_context *ctx, const char *text, int flags) {
  const char *bar = strchr(text, '|');
  int status = DDPLUG_E_ABORTED;
  for (int c = 1; bar && c < DDPLUG_STATUS_COUNT_; c++) {
    const char *name = ddplug_status_name(c);
    if ((size_t)(bar - text) == strlen(name) && !strncmp(text, name, strlen(name)))
      status = c;
  }
  ddplug__ctx_abort(ctx, status, bar ? bar + 1 : text, flags);
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
      ddplug__ctx_adopt_abort(ctx, val, DDPLUG__ABORT_NOTIFY);
      ddplug_free(val);
      break;
    }
    /* The store is gone: rank 0 (which serves it) died, or the network. */
    char msg[DDPLUG__ERRMSG_MAX];
    snprintf(msg, sizeof msg,
             "lost the rendezvous store at %s:%d, which rank 0 serves: rank 0 "
             "exited or was killed, or the network failed (%s)",
             ctx->store_addr, ctx->store_port, ddplug_last_error());
    ddplug__ctx_abort(ctx, DDPLUG_E_PEER_LOST, msg, DDPLUG__ABORT_NOTIFY);
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
