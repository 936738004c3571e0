/* context.c — the context's life cycle: ddplug_open / ddplug_close /
 * ddplug_abort (the failure state it reports to is failure.c; the
 * context's queries are query.c). The order of
 * ddplug_open: config → world → store (serve/connect, join.c) → plugin
 * loaded → join (startup checks, locality) → failure watcher → plugin group
 * → everyone ready. Any failure after the store is reached is published as
 * the run's abort, so the other ranks fail at once with the same sentence.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "run/context.h"
#include "store/store.h"

/* How long rank 0 keeps the store up for the others to read a verdict or
 * say goodbye. */
#define LEAVE_GRACE_FAIL_MS 3000
#define LEAVE_GRACE_CLOSE_MS 10000

/* ---- open and close -------------------------------------------------------- */

static int copy_config(const ddplug_config *in, ddplug_config **out) {
  if (!in) return ddplug_config_load_env(out);
  return ddplug__config_clone(in, out);
}

static int64_t seconds_ms(const ddplug_config *cfg, const char *path,
                          int64_t fallback_ms) {
  double v;
  if (ddplug_config_get_double(cfg, path, &v) != DDPLUG_OK || v <= 0) return fallback_ms;
  /* A positive timeout is never rounded down to 0 ms ("poll once"), and
   * never overflows (1e12 s is beyond any run). */
  if (v >= 1e12) return (int64_t)1e15;
  int64_t ms = (int64_t)(v * 1000.0 + 0.5);
  return ms < 1 ? 1 : ms;
}

static void set_key(ddplug_context *ctx, const char *prefix) {
  char key[128];
  snprintf(key, sizeof key, "%s%d", prefix, ctx->world.rank);
  ddplug_store_set(ctx->store, key, "1", 1);
}

void (*ddplug__open_ready_hook)(ddplug_context *ctx) = NULL;

/* Wait for every rank's <prefix><rank> key. */
static int wait_all(ddplug_context *ctx, const char *prefix, uint64_t deadline,
                    const char *what) {
  int n = ctx->world.world_size;
  char **keys = ddplug__calloc((size_t)n, sizeof *keys);
  if (!keys) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  int s = DDPLUG_OK;
  for (int r = 0; r < n && s == DDPLUG_OK; r++) {
    keys[r] = ddplug__asprintf("%s%d", prefix, r);
    if (!keys[r]) s = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  if (s == DDPLUG_OK) {
    s = ddplug__wait_keys(ctx, ctx->store, (const char *const *)keys, (uint32_t)n,
                          deadline, what, 0);
    if (s == DDPLUG_E_PEER_LOST) {
      /* A rank lost once every rank had arrived (the first to see every key
       * may leave and die before a slower one looks): the wait itself
       * succeeded, and this context's next call reports the loss — as it
       * would have a moment later. One look, without waiting. */
      char why[DDPLUG__ERRMSG_MAX];
      ddplug__strlcpy(why, ddplug_last_error(), sizeof why);
      if (ddplug_store_wait(ctx->store, (const char *const *)keys, (uint32_t)n, 0) == DDPLUG_OK)
        s = DDPLUG_OK;
      else
        ddplug__set_last_error(why);
    }
    if (ddplug__own_timeout(ctx, s)) {
      /* Name the ranks that did not arrive (polls, all within the failure
       * path's deadline: the store itself may be what stopped answering). */
      char why[DDPLUG__ERRMSG_MAX];
      ddplug__strlcpy(why, ddplug_last_error(), sizeof why);
      int *missing = ddplug__calloc((size_t)n, sizeof *missing);
      char list[1024] = "?";
      int count = 0;
      uint64_t stop = ddplug__deadline_ns(DDPLUG__FAIL_PATH_MS);
      for (int r = 0; missing && r < n; r++) {
        void *v = NULL;
        uint64_t vl;
        missing[r] = ddplug__now_ns() >= stop ||
                     ddplug_store_get(ctx->store, keys[r], 0, &v, &vl) != DDPLUG_OK;
        ddplug_free(v);
      }
      int answered = missing && ddplug__now_ns() < stop;
      if (answered) count = ddplug__rank_list(missing, n, list, sizeof list);
      ddplug__free(missing);
      if (answered)
        s = ddplug__err(DDPLUG_E_TIMEOUT, "%s: rank%s %s did not arrive in time",
                        what, count > 1 ? "s" : "", list);
      else
        s = ddplug__err(DDPLUG_E_TIMEOUT, "%s", why);
    }
  }
  for (int r = 0; r < n; r++) ddplug__free(keys[r]);
  ddplug__free(keys);
  return s;
}

/* Release the store. Rank 0 keeps serving until every process of the world
 * has connected and then disconnected — cleanly or by dying — or grace_ms
 * passed: the others may still need to read a verdict, an abort, or finish
 * their close. */
static void leave(ddplug_context *ctx, int64_t grace_ms) {
  /* After a failure nobody needs this rank's goodbye (the run's abort is
   * published, or the store no longer answers): close at once. */
  void (*close_fn)(ddplug_store *) =
      atomic_load(&ctx->state) == DDPLUG__CTX_OPEN ? ddplug_store_close
                                                   : ddplug__store_close_now;
  close_fn(ctx->plugin_store);
  close_fn(ctx->watch_store);
  ctx->plugin_store = ctx->watch_store = NULL;
  if (ctx->server && ctx->store) {
    uint64_t deadline = ddplug__deadline_ns(grace_ms);
    for (;;) {
      int64_t came = 0;
      /* Our own main connection is the one left. */
      if (ddplug__store_server_connections(ctx->server) <= 1 &&
          ddplug_store_add(ctx->store, "ddplug/procs", 0, &came) == DDPLUG_OK &&
          came >= ctx->world.world_size)
        break;
      if (ddplug__now_ns() >= deadline) break;
      ddplug__sleep_ms(5);
    }
  }
  close_fn(ctx->store);
  ctx->store = NULL;
  if (ctx->server) ddplug_store_server_stop(ctx->server);
  ctx->server = NULL;
}

void ddplug__group_destroy(ddplug_context *ctx) {
  pthread_mutex_lock(&ctx->mu);
  ddplug_plugin_group *g = ctx->group;
  ctx->group = NULL; /* no new group_abort from now on */
  while (ctx->aborting > 0) pthread_cond_wait(&ctx->abort_cv, &ctx->mu);
  pthread_mutex_unlock(&ctx->mu);
  if (g) {
    ddplug__requests_orphan(ctx, g);
    ddplug__plugin_err_clear(ctx);
    int s = ctx->plugin->table.group_destroy(g);
    if (s != DDPLUG_OK) {
      ddplug__plugin_err_take(ctx, s, "group_destroy");
      DDPLUG__WARN("destroying the plugin group: %s", ddplug_last_error());
    }
  }
}

static void free_context(ddplug_context *ctx) {
  if (ctx->data && ctx->data_free) ctx->data_free(ctx->data);
  json_decref(ctx->option_values);
  ddplug__plugin_unload(ctx->plugin);
  ddplug_config_free(ctx->cfg);
  ddplug__free(ctx->node_of_rank);
  ddplug__free(ctx->local_rank_of);
  ddplug__free(ctx->pid_of_rank);
  ddplug__membership_free(ctx);
  ddplug__errslot_destroy(&ctx->err);
  pthread_mutex_destroy(&ctx->mu);
  pthread_cond_destroy(&ctx->abort_cv);
  pthread_mutex_destroy(&ctx->plugin_err_mu);
  ddplug__free(ctx);
}

int ddplug__group_create(ddplug_context *ctx) {
  ddplug__services_init(ctx);
  ddplug_group_init *in = &ctx->init;
  memset(in, 0, sizeof *in);
  in->struct_size = sizeof *in;
  in->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  in->rank = ctx->world.rank;
  in->world_size = ctx->world.world_size;
  in->local_rank = ctx->world.local_rank;
  in->local_world_size = ctx->world.local_world_size;
  in->node_rank = ctx->world.node_rank;
  in->num_nodes = ctx->num_nodes;
  in->node_of_rank = ctx->node_of_rank;
  in->local_rank_of = ctx->local_rank_of;
  in->pid_of_rank = ctx->pid_of_rank;
  in->host_id = ctx->host_id;
  in->run_id = ctx->run_id;
  in->options_json = ddplug__config_plugin_options(ctx->cfg);
  in->timeout_ms = ctx->coll_timeout_ms;
  in->log_level = ddplug__log_enabled(DDPLUG_LOG_TRACE)   ? DDPLUG_LOG_TRACE
                  : ddplug__log_enabled(DDPLUG_LOG_DEBUG) ? DDPLUG_LOG_DEBUG
                  : ddplug__log_enabled(DDPLUG_LOG_INFO)  ? DDPLUG_LOG_INFO
                  : ddplug__log_enabled(DDPLUG_LOG_WARN)  ? DDPLUG_LOG_WARN
                                                          : DDPLUG_LOG_ERROR;
  in->duplicate_gpu = DDPLUG_CHECK_ERROR;
  char *dup = NULL;
  if (ddplug_config_get_string(ctx->cfg, "checks.duplicate_gpu", &dup) == DDPLUG_OK) {
    if (!strcmp(dup, "warn")) in->duplicate_gpu = DDPLUG_CHECK_WARN;
    else if (!strcmp(dup, "allow")) in->duplicate_gpu = DDPLUG_CHECK_ALLOW;
    ddplug_free(dup);
  }
  ddplug_plugin_group *g = NULL;
  ddplug__plugin_err_clear(ctx);
  int s = ctx->plugin->table.group_create(in, &ctx->services, &g);
  if (s != DDPLUG_OK) {
    int run = ddplug__ctx_check(ctx);
    /* If the run was aborted meanwhile, that is the better explanation. */
    if (run != DDPLUG_OK) return run;
    return ddplug__plugin_err_take(ctx, s, "group_create");
  }
  pthread_mutex_lock(&ctx->mu);
  ctx->group = g;
  pthread_mutex_unlock(&ctx->mu);
  /* Aborted while the group was being created: tell it now (once). */
  if (atomic_load(&ctx->state) != DDPLUG__CTX_OPEN)
    ddplug__ctx_abort(ctx, ctx->abort_status, ctx->abort_reason, DDPLUG__ABORT_NOTIFY);
  return ddplug__ctx_check(ctx);
}

DDPLUG_API int ddplug_open(const ddplug_config *cfg_in,
                           const ddplug_open_options *opts_in,
                           ddplug_context **out) {
  if (!out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_open: out must not be NULL");
  ddplug_open_options opts;
  memset(&opts, 0, sizeof opts);
  if (opts_in) {
    if (opts_in->struct_size < 2 * sizeof(uint32_t))
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "ddplug_open: options must be initialised with "
                         "DDPLUG_OPEN_OPTIONS_INIT");
    memcpy(&opts, opts_in, DDPLUG__MIN((size_t)opts_in->struct_size, sizeof opts));
  }
  if (opts.timeout_ms < 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_open: timeout_ms must be 0 (config) or positive, got %lld",
                       (long long)opts.timeout_ms);
  if (opts.collective_timeout_ms < 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_open: collective_timeout_ms must be 0 (config) or positive, "
                       "got %lld",
                       (long long)opts.collective_timeout_ms);

  ddplug_context *ctx = ddplug__calloc(1, sizeof *ctx);
  if (!ctx) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory creating a context");
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_cond_init(&ctx->abort_cv, NULL);
  pthread_mutex_init(&ctx->plugin_err_mu, NULL);
  ddplug__strlcpy(ctx->key_prefix, "ddplug/", sizeof ctx->key_prefix);
  ddplug__strlcpy(ctx->abort_key, "ddplug/abort", sizeof ctx->abort_key);
  int s = ddplug__errslot_init(&ctx->err);
  if (s != DDPLUG_OK) {
    pthread_mutex_destroy(&ctx->mu);
    pthread_cond_destroy(&ctx->abort_cv);
    pthread_mutex_destroy(&ctx->plugin_err_mu);
    ddplug__free(ctx);
    return s;
  }
  ctx->world.struct_size = sizeof ctx->world;
  ctx->world.abi_version = DDPLUG_ABI_VERSION;
  ddplug__strlcpy(ctx->framework, opts.framework ? opts.framework : "c",
                  sizeof ctx->framework);

  s = copy_config(cfg_in, &ctx->cfg);
  if (s != DDPLUG_OK) goto fail;
  char *level = NULL;
  if (ddplug_config_get_string(ctx->cfg, "log_level", &level) == DDPLUG_OK) {
    int lv;
    if (ddplug_log_level_parse(level, &lv) == DDPLUG_OK) ddplug__log_config_level(lv);
    ddplug_free(level);
  }
  if (!opts.world && (opts.rendezvous_addr || opts.rendezvous_port)) {
    s = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                    "ddplug_open: options.rendezvous_addr / rendezvous_port need "
                    "options.world (a caller that decides the rendezvous decides the world)");
    goto fail;
  }
  s = opts.world ? ddplug__world_given(ctx->cfg, opts.world, opts.rendezvous_addr,
                                       opts.rendezvous_port, &ctx->world)
                 : ddplug_world_discover(ctx->cfg, &ctx->world);
  if (s != DDPLUG_OK) goto fail;
  ddplug__log_set_rank(ctx->world.rank);
  ctx->rdzv_timeout_ms = opts.timeout_ms > 0
                             ? opts.timeout_ms
                             : seconds_ms(ctx->cfg, "rendezvous.timeout_s", 300000);
  ctx->coll_timeout_ms = opts.collective_timeout_ms > 0
                           ? opts.collective_timeout_ms
                           : seconds_ms(ctx->cfg, "timeouts.collective_s", 300000);
  ctx->open_deadline_ns = ddplug__deadline_ns(ctx->rdzv_timeout_ms);

  /* Under an MPI launcher without a rendezvous address the plugin finds
   * the world and rank 0's store (bootstrap.c). */
  if (!opts.world && ddplug__bootstrap_needed(ctx)) {
    s = ddplug__bootstrap(ctx, &opts);
    if (s != DDPLUG_OK) goto fail;
  }
  /* Reach the store first: from then on a failure here (a plugin that does
   * not load on this node, say) reaches every rank at once. */
  s = ddplug__rendezvous_connect(ctx, &opts);
  if (s != DDPLUG_OK) goto fail;
  if (!ctx->plugin) {
    char plugin_name[4096];
    s = ddplug__plugin_choice(ctx, &opts, plugin_name, sizeof plugin_name);
    if (s == DDPLUG_OK) s = ddplug__plugin_load(plugin_name, &ctx->plugin);
    if (s != DDPLUG_OK) goto fail;
  }
  s = ddplug__options_check(&ctx->plugin->table, ddplug__config_plugin_options(ctx->cfg),
                            &ctx->option_values);
  if (s != DDPLUG_OK) goto fail;
  s = ddplug__rendezvous_join(ctx);
  if (s != DDPLUG_OK) goto fail;
  s = ddplug__membership_init(ctx);
  if (s != DDPLUG_OK) goto fail;
  s = ddplug__watcher_start(ctx);
  if (s != DDPLUG_OK) goto fail;
  s = ddplug__group_create(ctx);
  if (s != DDPLUG_OK) goto fail;
  set_key(ctx, "ddplug/ready/");
  if (ddplug__open_ready_hook) ddplug__open_ready_hook(ctx);
  /* Group creation may take up to the collective timeout on top of the
   * rendezvous deadline. */
  s = wait_all(ctx, "ddplug/ready/",
               DDPLUG__MAX(ctx->open_deadline_ns, ddplug__now_ns()) +
                   ddplug__open_grace_ns(ctx) + (uint64_t)ctx->coll_timeout_ms * 1000000ull,
               "waiting for every rank to create its plugin group");
  if (s != DDPLUG_OK) goto fail;

  DDPLUG__INFO("rank %d of %d joined (%s): node %d of %d (%s), local rank %d of "
               "%d, plugin %s %s, run %s",
               ctx->world.rank, ctx->world.world_size, ctx->world.source,
               ctx->world.node_rank, ctx->num_nodes, ctx->host_id,
               ctx->world.local_rank, ctx->world.local_world_size,
               ctx->plugin->table.name,
               ctx->plugin->table.version ? ctx->plugin->table.version : "",
               ctx->run_id);
  *out = ctx;
  return DDPLUG_OK;

fail: {
  /* Keep this rank's explanation; tell the others (first failure wins). */
  char why[DDPLUG__ERRMSG_MAX];
  ddplug__strlcpy(why, ddplug_last_error(), sizeof why);
  if (ctx->store && atomic_load(&ctx->state) == DDPLUG__CTX_OPEN) {
    char reason[DDPLUG__ERRMSG_MAX + 64];
    snprintf(reason, sizeof reason, "rank %d failed to open: %s", ctx->world.rank, why);
    ddplug__ctx_abort(ctx, s, reason, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
  }
  ddplug__watcher_stop(ctx);
  ddplug__group_destroy(ctx);
  leave(ctx, LEAVE_GRACE_FAIL_MS);
  free_context(ctx);
  ddplug__set_last_error(why);
  return s;
}
}

DDPLUG_API int ddplug_close(ddplug_context *ctx) {
  if (!ctx) return DDPLUG_OK;
  ddplug__runonce_forget(ctx); /* a run-once never ended stops beating */
  int s = ddplug__ctx_check(ctx);
  if (s == DDPLUG_OK) {
    char closing[64];
    snprintf(closing, sizeof closing, "%sclosing/", ctx->key_prefix);
    set_key(ctx, closing);
    s = wait_all(ctx, closing, ddplug__deadline_ns(ctx->coll_timeout_ms),
                 "closing: waiting for every rank to close");
    if (s != DDPLUG_OK && atomic_load(&ctx->state) == DDPLUG__CTX_OPEN) {
      /* Tell the others why this rank is gone, before its store goes. */
      char reason[DDPLUG__ERRMSG_MAX + 64];
      snprintf(reason, sizeof reason, "rank %d gave up closing the run: %s", ctx->world.rank,
               ddplug_last_error());
      ddplug__ctx_abort(ctx, s, reason, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
      ddplug__set_last_error(reason);
    }
  }
  char why[DDPLUG__ERRMSG_MAX];
  ddplug__strlcpy(why, ddplug_last_error(), sizeof why);
  ddplug__watcher_stop(ctx);
  ddplug__group_destroy(ctx);
  leave(ctx, s == DDPLUG_OK ? LEAVE_GRACE_CLOSE_MS : LEAVE_GRACE_FAIL_MS);
  free_context(ctx);
  if (s != DDPLUG_OK) ddplug__set_last_error(why);
  return s;
}

DDPLUG_API int ddplug_abort(ddplug_context *ctx, const char *reason) {
  if (!ctx) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_abort: ctx is NULL");
  char msg[DDPLUG__ERRMSG_MAX];
  snprintf(msg, sizeof msg, "rank %d aborted the run: %s", ctx->world.rank,
           reason && *reason ? reason : "(no reason given)");
  ddplug__ctx_abort(ctx, DDPLUG_E_ABORTED, msg, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
  return DDPLUG_OK;
}
