/*
 * context.h — the runtime's context: one process's membership in a run.
 * Shared by context.c (lifecycle), rendezvous.c (join and startup checks),
 * watcher.c (failure propagation), services.c (the plugin's host services),
 * collective.c (collectives dispatch) and the data-split modules.
 *
 * Store key layout (all under the run's store; a store serves one run):
 *   ddplug/join/<rank>     rank's join record (JSON)
 *   ddplug/claim/<rank>    who claimed that rank (duplicate detection)
 *   ddplug/joined          counter of processes that joined
 *   ddplug/verdict         rank 0's startup verdict (JSON: ok + layout, or error)
 *   ddplug/ready/<rank>    rank created its plugin group
 *   ddplug/abort           "<STATUS>|<sentence>": the first failure of the run
 *   ddplug/closing         counter for the close barrier
 *   ddplug/split/<stream>/<call>/<rank>  split-owner agreement (split_context.c)
 *   ddplug/runonce/...     run-once status (runonce.c)
 *   p/<run_id>/<plugin>/... the plugin's keys (host services prefix them)
 *   user/...               the host's keys (ddplug_context_store)
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CONTEXT_H
#define DDPLUG_CONTEXT_H

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

/* Granularity of store waits that also watch for an abort of the run. */
#define DDPLUG__WAIT_SLICE_MS 100

enum ddplug__ctx_state {
  DDPLUG__CTX_OPEN = 0,
  DDPLUG__CTX_ABORTED = 1 /* abort_status/abort_reason say why */
};

struct ddplug_context {
  ddplug_config *cfg;            /* owned copy                              */
  ddplug_world world;            /* after locality discovery                */
  int32_t num_nodes;
  int32_t *node_of_rank;         /* [world_size]                            */
  int32_t *local_rank_of;        /* [world_size]                            */
  int64_t *pid_of_rank;          /* [world_size]                            */
  char host_id[256];
  char run_id[40];
  char framework[64];
  char store_addr[256];
  int32_t store_port;
  int64_t rdzv_timeout_ms;
  int64_t coll_timeout_ms;

  ddplug_store_server *server;   /* rank 0, unless the store is external    */
  ddplug_store *store;           /* main client                             */
  ddplug_store *watch_store;     /* the failure watcher's client            */
  ddplug_store *plugin_store;    /* the plugin's host services' client      */

  ddplug__plugin *plugin;
  ddplug_plugin_group *group;    /* NULL until group_create returned        */
  ddplug_host_services services;
  ddplug_group_init init;        /* what the plugin was given              */
  char plugin_prefix[128];       /* "p/<run_id>/<name>/"                    */

  pthread_t watcher;
  int watcher_running;
  atomic_int watcher_stop;

  pthread_mutex_t mu;            /* guards state, abort_*, group abort      */
  atomic_int state;              /* ddplug__ctx_state                       */
  int abort_status;
  char abort_reason[DDPLUG__ERRMSG_MAX];

  /* The plugin's explanation of its last failure (services.set_error). */
  pthread_mutex_t plugin_err_mu;
  int plugin_err_set;
  int plugin_err_status;
  char plugin_err[DDPLUG__ERRMSG_MAX];

  uint64_t seq;                  /* collectives started so far              */
  ddplug__errslot err;           /* ddplug_context_error                    */

  /* Data-split state (split/sampler/audit modules); freed through
   * data_free at close. */
  void *data;
  void (*data_free)(void *data);
};

/* ---- rendezvous.c -------------------------------------------------------- */

/* Choose the host identity, serve (rank 0) and connect the store, and ask
 * the store to publish this rank's loss if its connection drops. */
int ddplug__rendezvous_connect(ddplug_context *ctx, const ddplug_open_options *opts);
/* Claim the rank, publish the join record, (rank 0) wait for everyone and
 * run the startup checks, read the verdict and learn locality. Needs the
 * plugin loaded. On failure the context keeps what it created (context.c
 * cleans up). */
int ddplug__rendezvous_join(ddplug_context *ctx);
/* Wait until every key exists, in slices, failing early when the run is
 * aborted. what names the wait in a TIMEOUT message. */
int ddplug__wait_keys(ddplug_context *ctx, ddplug_store *st,
                      const char *const *keys, uint32_t nkeys,
                      uint64_t deadline_ns, const char *what);

/* ---- watcher.c ---------------------------------------------------------- */

int ddplug__watcher_start(ddplug_context *ctx);
void ddplug__watcher_stop(ddplug_context *ctx);
/* Record the run's first failure locally (first wins), tell the plugin, and
 * (if publish) publish it through the store for the other ranks. */
void ddplug__ctx_abort(ddplug_context *ctx, int status, const char *reason,
                       int publish);
/* Abort ctx (locally) with a published abort value "<STATUS>|<sentence>". */
void ddplug__ctx_adopt_abort(ddplug_context *ctx, const char *text);
/* DDPLUG_OK while open; else sets the last error to the abort reason and
 * returns the abort status. */
int ddplug__ctx_check(ddplug_context *ctx);

/* ---- services.c --------------------------------------------------------- */

void ddplug__services_init(ddplug_context *ctx);
/* Clear the plugin's error before calling a slot. */
void ddplug__plugin_err_clear(ddplug_context *ctx);
/* After a slot returned status != OK: set the thread's last error to the
 * plugin's explanation (or a generic one naming the slot) and return status. */
int ddplug__plugin_err_take(ddplug_context *ctx, int status, const char *slot);

/* Record the thread's last error into ctx's slot and return status. */
int ddplug__ctx_fail(ddplug_context *ctx, int status);

#endif /* DDPLUG_CONTEXT_H */
