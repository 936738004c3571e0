/* failure.c — the run's failure state, which every file of the run layer
 * reports to. The run's first failure is published as
 * ddplug/abort = "<STATUS>|<sentence>" (by a rank that aborts, or by the
 * store server when a rank's connection drops without a clean close);
 * every rank adopts it (watcher.c, or a wait below), and every later call
 * fails with it. Also here: the context's last error (ddplug_context_error)
 * and the store waits that watch for an abort while they wait. Calls
 * nothing of the context's life cycle (context.c), which calls it.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <string.h>

#include "run/context.h"
#include "store/store.h"

/* The abort state is written once: status and reason are stored before the
 * state flips (release), so readers that see the flip (acquire) read them
 * without a lock — a thread blocked in a plugin slot can always check. */
/* See context.h. */
int ddplug__ctx_check(ddplug_context *ctx) {
  if (atomic_load_explicit(&ctx->state, memory_order_acquire) == DDPLUG__CTX_OPEN)
    return DDPLUG_OK;
  return ddplug__err(ctx->abort_status, "%s", ctx->abort_reason);
}

/* See context.h. */
int ddplug__ctx_check_local(ddplug_context *ctx) {
  int s = ddplug__ctx_check(ctx);
  return s == DDPLUG_E_PEER_LOST && ctx->elastic_shrink ? DDPLUG_OK : s;
}

/* Publish the run's first failure for the other ranks (first failure of
 * the run wins; ours may come second). */
static void publish(ddplug_context *ctx, int status, const char *reason) {
  char value[DDPLUG__ERRMSG_MAX + 32];
  int n = snprintf(value, sizeof value, "%s|%s", ddplug_status_name(status), reason);
  if (n > (int)sizeof value - 1) n = (int)sizeof value - 1;
  int swapped = 0;
  char keep[DDPLUG__ERRMSG_MAX];
  ddplug__strlcpy(keep, ddplug_last_error(), sizeof keep);
  if (ddplug__store_compare_set_within(ctx->store, ctx->abort_key, NULL, 0, value,
                                       (uint64_t)n, &swapped, DDPLUG__FAIL_PATH_MS) != DDPLUG_OK)
    DDPLUG__WARN("could not tell the other ranks through the rendezvous store "
                 "(they learn of it by their own timeouts): %s", ddplug_last_error());
  ddplug__set_last_error(keep);
}

/* See context.h. */
void ddplug__ctx_abort(ddplug_context *ctx, int status, const char *reason, int flags) {
  if (!reason) reason = "aborted";
  pthread_mutex_lock(&ctx->mu);
  int first = atomic_load(&ctx->state) == DDPLUG__CTX_OPEN;
  if (first) {
    ctx->abort_status = status;
    ddplug__strlcpy(ctx->abort_reason, reason, sizeof ctx->abort_reason);
    atomic_store_explicit(&ctx->state, DDPLUG__CTX_ABORTED, memory_order_release);
  }
  pthread_mutex_unlock(&ctx->mu);
  if (first) {
    if (ctx->elastic_shrink && status == DDPLUG_E_PEER_LOST)
      DDPLUG__WARN("%s (elastic.on_peer_lost = shrink: the survivors may re-form the group)",
                   reason);
    else
      DDPLUG__ERROR("%s", reason);
    /* From now on every store call is on a failure path: none may wait for
     * the rendezvous timeout on a store that may not answer. */
    ddplug_store *handles[3] = {ctx->store, ctx->watch_store, ctx->plugin_store};
    for (int i = 0; i < 3; i++)
      if (handles[i]) ddplug__store_set_default_timeout(handles[i], DDPLUG__FAIL_PATH_MS);
    /* Published before the plugin is told: a peer whose plugin learns of
     * this abort from ours then finds the run's reason (and its status,
     * PEER_LOST for an elastic run) already there. */
    if ((flags & DDPLUG__ABORT_PUBLISH) && ctx->store) publish(ctx, status, reason);
  }
  /* Tell the plugin once, outside the lock (its group_abort may take its own
   * locks, which its slots may hold while calling our host services). The
   * in-progress count keeps destroy_group from freeing the group meanwhile. */
  ddplug_plugin_group *g = NULL;
  pthread_mutex_lock(&ctx->mu);
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
}

/* See context.h. */
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

/* See context.h. */
int ddplug__ctx_capture_error(ddplug_context *ctx, int status) {
  if (ctx) ddplug__errslot_capture(&ctx->err);
  return status;
}

/* The wait of ddplug__wait_keys; with value, the wait is a GET of keys[0]
 * (nkeys 1), whose answer carries the value. */
static int wait_loop(ddplug_context *ctx, ddplug_store *st, const char *const *keys,
                     uint32_t nkeys, uint64_t deadline_ns, const char *what,
                     int in_plugin, void **value, uint64_t *len) {
  for (;;) {
    int s = ddplug__ctx_check(ctx);
    if (s != DDPLUG_OK) return s;
    int64_t left = ddplug__remaining_ms(deadline_ns);
    int64_t slice = DDPLUG__MIN(left, (int64_t)DDPLUG__WAIT_SLICE_MS);
    s = value ? ddplug_store_get(st, keys[0], slice, value, len)
              : ddplug_store_wait(st, keys, nkeys, slice);
    if (s == DDPLUG_OK) return DDPLUG_OK;
    if (s != DDPLUG_E_TIMEOUT) return s;
    char missing[DDPLUG__ERRMSG_MAX]; /* the store names the missing keys */
    ddplug__strlcpy(missing, ddplug_last_error(), sizeof missing);
    /* Someone may have aborted the run while we waited: read the key
     * directly (the watcher may not run yet during startup). Inside a plugin
     * slot, only record it: the watcher tells the plugin. */
    void *val = NULL;
    uint64_t vlen = 0;
    if (ddplug__store_get_within(st, ctx->abort_key, 0, DDPLUG__WAIT_SLICE_MS, &val, &vlen) ==
        DDPLUG_OK) {
      ddplug__ctx_adopt_abort(ctx, val, in_plugin ? 0 : DDPLUG__ABORT_NOTIFY);
      ddplug_free(val);
      return ddplug__ctx_check(ctx);
    }
    if (left <= slice) return ddplug__err(DDPLUG_E_TIMEOUT, "%s: %s", what, missing);
  }
}

/* See context.h. */
int ddplug__wait_keys(ddplug_context *ctx, ddplug_store *st,
                      const char *const *keys, uint32_t nkeys,
                      uint64_t deadline_ns, const char *what, int in_plugin) {
  return wait_loop(ctx, st, keys, nkeys, deadline_ns, what, in_plugin, NULL, NULL);
}

/* See context.h. */
int ddplug__wait_get(ddplug_context *ctx, ddplug_store *st, const char *key,
                     uint64_t deadline_ns, const char *what, int in_plugin,
                     void **value, uint64_t *len) {
  return wait_loop(ctx, st, &key, 1, deadline_ns, what, in_plugin, value, len);
}
