/*
 * context.h — the run layer's header: the context (one process's membership
 * in a run) and the functions its files share, grouped by file. Depends on
 * base/, config/, store/ and plugin/.
 * The module map of abi/src/run/:
 *   context.c     the context's life cycle: ddplug_open, ddplug_close,
 *                 ddplug_abort
 *   failure.c     the failure state every file reports to: the run's first
 *                 failure, the context's last error, waits that watch for
 *                 an abort
 *   query.c       the context's queries (world, plugin, config, store, ...)
 *   join.c        serve or reach the store, claim the rank, the join record,
 *                 read the verdict (run id, locality)
 *   checks.c      rank 0's startup checks, one function each, and the verdict
 *   torchrun.c    the store's port through torchrun's agent store
 *   watcher.c     the thread that adopts another rank's failure
 *   services.c    the host services table plugins get (store, log, clock,
 *                 typed options)
 *   collective.c  argument checks, sequence numbers, requests, waits
 *   p2p.c         point-to-point: sends and receives through the plugin's
 *                 p2p_start, their checks and blocking forms
 *   memory.c      registered memory through the plugin's mem slots
 *   world.c       world discovery from the config and the environment
 *   bootstrap.c   the world and rank 0's store address (and a per-run
 *                 secret) through the plugin's bootstrap slots, under an
 *                 MPI launcher with no rendezvous address; which plugin
 *   runonce.c     run-once: one rank does the work, the others wait for it
 *   shrink.c      elastic in place: re-forming the group over the survivors
 *                 of a lost rank (a new generation through the store)
 * The plugin loader and the options plugins declare are the plugin layer
 * (plugin/plugin.h): they need no context.
 *
 * Store key layout (all under the run's store; a store serves one run):
 *   ddplug/join/<rank>     rank's join record (JSON)
 *   ddplug/claim/<rank>    who claimed that rank (duplicate detection)
 *   ddplug/joined          counter of processes that joined
 *   ddplug/checks_left_ms  how long rank 0's startup checks may still take, as they began
 *   ddplug/verdict         rank 0's startup verdict (JSON: ok + layout, or error)
 *   ddplug/ready/<rank>    rank created its plugin group
 *   ddplug/abort           "<STATUS>|<sentence>": the first failure of the run
 *   ddplug/procs           counter of processes that connected (rank 0
 *                          serves until all world_size came and left)
 *   ddplug/closing/<rank>  rank reached ddplug_close (the close barrier)
 *   ddplug/gone/<id>       set by the store when process <id> (its rank at
 *                          open) disconnects without closing (elastic)
 *   ddplug/g<G>/...        generation G >= 1 (a re-formed group, shrink.c):
 *                          abort, closing/<rank>, split/..., here/<old rank>
 *                          (a survivor of generation G-1 arrived), ready/<rank>
 *   ddplug/split/<stream>/<call>/<rank>  split-owner agreement (data/agree.c)
 *   ddplug/runonce/...     run-once outcomes and runner heartbeats (runonce.c)
 *   p/<run_id>/<plugin>/... the plugin's keys (host services prefix them)
 *   user/...               the host's keys (ddplug_context_store)
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CONTEXT_H
#define DDPLUG_CONTEXT_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/base.h"
#include "ddplug/store.h"
#include "plugin/plugin.h"

/* ---- world.c ------------------------------------------------------------ */

/* Environment lookup used by world discovery (getenv in production, a table
 * in tests). Returns NULL for an unset variable. */
typedef const char *(*ddplug__env_fn)(const char *name, void *user);
int ddplug__world_discover_env(const ddplug_config *cfg, ddplug__env_fn env,
                               void *env_user, ddplug_world *out);
/* The world a caller gave (ddplug_open_options.world), checked, with the
 * rendezvous resolved (config > the caller's > MASTER_ADDR/PORT, or the
 * override rdzv_addr / rdzv_port: ddplug_open_options); out is a full
 * ddplug_world. ddplug__world_given reads the process environment. */
int ddplug__world_from_caller(const ddplug_config *cfg, ddplug__env_fn env, void *env_user,
                              const ddplug_world *given, const char *rdzv_addr,
                              int32_t rdzv_port, ddplug_world *out);
int ddplug__world_given(const ddplug_config *cfg, const ddplug_world *given,
                        const char *rdzv_addr, int32_t rdzv_port, ddplug_world *out);

/* Granularity of store waits that also watch for an abort of the run. */
#define DDPLUG__WAIT_SLICE_MS 100
/* Store calls on a failure path (publishing the run's abort, closing after
 * it) wait at most this long for the server: the store may be what failed
 * (rank 0 frozen, the network cut), and a failure must surface within its
 * own timeout plus a small constant (ddplug.h, "Timeouts"). */
#define DDPLUG__FAIL_PATH_MS 500

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
  char boot_secret[96];          /* the store's secret the bootstrap carried */
  int32_t store_port;
  int64_t rdzv_timeout_ms;
  int64_t coll_timeout_ms;
  uint64_t open_deadline_ns;     /* ddplug_open's one deadline (rendezvous) */

  ddplug_store_server *server;   /* rank 0, unless the store is external    */
  ddplug_store *store;           /* main client                             */
  ddplug_store *watch_store;     /* the failure watcher's client            */
  ddplug_store *plugin_store;    /* the plugin's host services' client      */

  ddplug__plugin *plugin;
  struct json_t *option_values;  /* the plugin's declared options, checked
                                    (options.c); NULL if it declares none */
  ddplug_plugin_group *group;    /* NULL until group_create returned        */
  ddplug_host_services services;
  ddplug_group_init init;        /* what the plugin was given              */
  char plugin_prefix[128];       /* "p/<run_id>/<name>/"                    */

  pthread_t watcher;
  int watcher_running;
  atomic_int watcher_stop;

  pthread_mutex_t mu;            /* guards group, the abort's first write,
                                    plugin_notified, aborting, live       */
  pthread_cond_t abort_cv;       /* aborting dropped to 0                   */
  atomic_int state;              /* ddplug__ctx_state (release/acquire)     */
  int abort_status;              /* written once, before state flips        */
  char abort_reason[DDPLUG__ERRMSG_MAX];
  int plugin_notified;           /* group_abort was called                  */
  int aborting;                  /* group_abort calls in progress           */
  struct ddplug_request *live;   /* requests not yet freed (orphaned at close) */

  /* The plugin's explanation of its last failure (services.set_error). */
  pthread_mutex_t plugin_err_mu;
  int plugin_err_set;
  int plugin_err_status;
  char plugin_err[DDPLUG__ERRMSG_MAX];

  uint64_t seq;                  /* collectives started so far              */

  /* Membership. A group re-formed over the survivors (shrink.c) is a new
   * generation; a process's identity is its rank at open. */
  uint64_t generation;           /* 0 at open, + 1 per re-formation        */
  int32_t identity;              /* this process's rank at open             */
  int32_t *identity_of;          /* [world_size] each rank's identity       */
  int32_t *prev_rank_of;         /* [world_size] each rank's rank in the
                                    previous generation (NULL at 0)        */
  int32_t prev_world_size;
  int32_t lost_count;            /* ranks lost at the last re-formation     */
  char lost[256];                /* their previous ranks: "2", "1, 3"       */
  char base_run_id[40];          /* the run id at open (generation G's is
                                    <base>g<G>)                            */
  char key_prefix[32];           /* "ddplug/", or "ddplug/g<G>/"            */
  char abort_key[48];            /* <key_prefix>abort                      */
  int elastic_shrink;            /* elastic.on_peer_lost = shrink           */
  int32_t min_world_size;        /* elastic.min_world_size                  */
  ddplug__errslot err;           /* ddplug_context_error                    */

  /* Data-split state (split/sampler/audit modules); freed through
   * data_free at close. */
  void *data;
  void (*data_free)(void *data);
  /* the data layer's state follows a re-formation (open audits) */
  void (*data_reform)(void *data, int32_t rank, int32_t world_size);
};

/* Rank 0 publishes here, as it begins the startup checks, how many ms they
 * may still take (its own open deadline, which may be later than another
 * rank's: rank 0 may have started later). */
#define DDPLUG__CHECKS_LEFT_KEY "ddplug/checks_left_ms"

/* Non-zero ranks wait this long past ddplug_open's deadline for rank 0's
 * verdict: rank 0 reports missing ranks exactly at the deadline. */
static inline uint64_t ddplug__open_grace_ns(const ddplug_context *ctx) {
  int64_t ms = ctx->rdzv_timeout_ms / 10 > 2000 ? ctx->rdzv_timeout_ms / 10 : 2000;
  return (uint64_t)ms * 1000000ull;
}

/* ---- failure.c: the failure state ---------------------------------------- */

/* Record the run's first failure locally (first wins). Flags:
 *   DDPLUG__ABORT_PUBLISH  publish it through the store for the other ranks;
 *   DDPLUG__ABORT_NOTIFY   call the plugin's group_abort (once per context).
 * Never pass NOTIFY from inside a plugin slot (host services): the plugin
 * is told by the watcher instead, never re-entered on its own thread. */
#define DDPLUG__ABORT_PUBLISH 1
#define DDPLUG__ABORT_NOTIFY 2
void ddplug__ctx_abort(ddplug_context *ctx, int status, const char *reason, int flags);
/* Abort ctx with a published abort value "<STATUS>|<sentence>" (flags as
 * for ddplug__ctx_abort). */
void ddplug__ctx_adopt_abort(ddplug_context *ctx, const char *text, int flags);
/* The rendezvous store stopped answering (not a timeout: its connection
 * failed): rank 0, which serves it, is gone. Abort ctx with PEER_LOST
 * saying so (the watcher's conclusion, also drawn on failure paths). */
void ddplug__ctx_store_lost(ddplug_context *ctx);
/* DDPLUG_OK while open; else sets the last error to the abort reason and
 * returns the abort status. */
int ddplug__ctx_check(ddplug_context *ctx);
/* As ddplug__ctx_check, for calls that work on this rank alone (creating a
 * sampler): a lost rank that ddplug_shrink re-forms the run from
 * (elastic.on_peer_lost "shrink") does not fail them — the host's next
 * collective reports the loss, inside the loop that recovers from it. */
int ddplug__ctx_check_local(ddplug_context *ctx);
/* A seam for tests (test-elastic): called by ddplug_open between this
 * rank's ready key and its wait for every other rank's. NULL in real runs. */
extern void (*ddplug__open_ready_hook)(ddplug_context *ctx);
/* Whether a TIMEOUT from a wait is this wait's own: the run's abort may
 * carry TIMEOUT too (another rank's collective timed out), and then its
 * reason, already in the last error, must not be replaced by "waited N s". */
static inline int ddplug__own_timeout(ddplug_context *ctx, int s) {
  return s == DDPLUG_E_TIMEOUT &&
         atomic_load_explicit(&ctx->state, memory_order_acquire) == DDPLUG__CTX_OPEN;
}
/* Copy this thread's last error into ctx's last-error slot (what
 * ddplug_context_error returns) and return status unchanged, so a public
 * call can end with `return ddplug__ctx_capture_error(ctx, ddplug__err(...))`.
 * Records only: it aborts nothing and fails nothing. ctx may be NULL. */
int ddplug__ctx_capture_error(ddplug_context *ctx, int status);
/* Wait until every key exists, in slices, failing early when the run is
 * aborted. what names the wait in a TIMEOUT message. in_plugin: called from
 * a plugin slot (host services), so the plugin is not told of an abort
 * here (the watcher tells it). */
int ddplug__wait_keys(ddplug_context *ctx, ddplug_store *st,
                      const char *const *keys, uint32_t nkeys,
                      uint64_t deadline_ns, const char *what, int in_plugin);
/* ddplug__wait_keys for one key, and read it: *value (release with
 * ddplug_free) and *len, as ddplug_store_get gives them. The read is the
 * wait (a GET that waits in the server answers with the value), never a
 * second call after it: a second call would be bounded by the store's
 * short reply grace alone, so a loaded rank 0 that answered it late would
 * fail a wait whose key was there, long before the wait's deadline. */
int ddplug__wait_get(ddplug_context *ctx, ddplug_store *st, const char *key,
                     uint64_t deadline_ns, const char *what, int in_plugin,
                     void **value, uint64_t *len);

/* ---- join.c ------------------------------------------------------------- */

/* Choose the host identity, serve (rank 0) and connect the store, and ask
 * the store to publish this rank's loss if its connection drops. */
int ddplug__rendezvous_connect(ddplug_context *ctx, const ddplug_open_options *opts);
/* Claim the rank, publish the join record, (rank 0) wait for everyone and
 * run the startup checks, read the verdict and learn locality. Needs the
 * plugin loaded. On failure the context keeps what it created (context.c
 * cleans up). */
int ddplug__rendezvous_join(ddplug_context *ctx);

/* ---- bootstrap.c ---------------------------------------------------------- */

/* Whether the world came from an MPI launcher without a rendezvous
 * address (then ddplug_open bootstraps through the plugin). */
int ddplug__bootstrap_needed(const ddplug_context *ctx);
/* The plugin to load: the caller's, the config's when the user set it,
 * "mpi" under an MPI launcher (logged), else the config's default. */
int ddplug__plugin_choice(ddplug_context *ctx, const ddplug_open_options *opts, char *buf,
                          size_t cap);
/* Load the chosen plugin, learn the world from its bootstrap_world, and
 * (world > 1) have rank 0 serve the store and broadcast its address and
 * secret: afterwards ctx->world has the rendezvous, ctx->boot_secret the
 * secret and (rank 0) ctx->server the store. */
int ddplug__bootstrap(ddplug_context *ctx, const ddplug_open_options *opts);

/* ---- checks.c ----------------------------------------------------------- */

/* Rank 0: wait for every join record, run the startup checks and publish
 * the verdict (or the failed check's sentence, also as the run's abort). */
int ddplug__startup_checks(ddplug_context *ctx);

/* ---- torchrun.c --------------------------------------------------------- */

/* Whether this rank must exchange the store's port through torchrun's agent
 * store (TORCHELASTIC_USE_AGENT_STORE, MASTER_PORT is the agent's, no
 * rendezvous.port in the config, not an external store). */
int ddplug__torchrun_agent_store(const ddplug_context *ctx, int external);
/* The agent-store key for this open: unique per run id, restart and open. */
void ddplug__torchrun_port_key(char *buf, size_t cap);
/* Rank 0 publishes *port (> 0) under key; the others read it into *port.
 * Bounded by ddplug_open's deadline. */
int ddplug__torchrun_exchange_port(ddplug_context *ctx, const char *key, int *port);

/* ---- context.c ---------------------------------------------------------- */

/* Create the plugin group from ctx's world (ctx->init, the host services)
 * and publish it as ctx->group. */
int ddplug__group_create(ddplug_context *ctx);
/* Take ctx->group away (no group_abort from then on), orphan its requests
 * and destroy it. */
void ddplug__group_destroy(ddplug_context *ctx);

/* ---- shrink.c ---------------------------------------------------------- */

/* Generation 0's membership fields (identity, key prefix, elastic config),
 * set once the world is known. */
int ddplug__membership_init(ddplug_context *ctx);
void ddplug__membership_free(ddplug_context *ctx);

/* ---- watcher.c ---------------------------------------------------------- */

int ddplug__watcher_start(ddplug_context *ctx);
void ddplug__watcher_stop(ddplug_context *ctx);

/* ---- services.c --------------------------------------------------------- */

/* Fill ctx->services, the host services table the plugin gets. */
void ddplug__services_init(ddplug_context *ctx);
/* The table the bootstrap slots get: no store or options yet (their slots
 * return UNSUPPORTED); log, clock and set_error work. */
void ddplug__services_bootstrap(ddplug_context *ctx, ddplug_host_services *out);
/* Clear the plugin's error before calling a slot. */
void ddplug__plugin_err_clear(ddplug_context *ctx);
/* After a slot returned status != OK: set the thread's last error to the
 * plugin's explanation (or a generic one naming the slot) and return status. */
int ddplug__plugin_err_take(ddplug_context *ctx, int status, const char *slot);

/* ---- runonce.c ----------------------------------------------------------- */

/* Stop the heartbeats of the run-onces ctx runs and never ended (close). */
void ddplug__runonce_forget(const ddplug_context *ctx);

/* ---- collective.c --------------------------------------------------------- */

/* A started collective, send or receive (ddplug_request): the plugin's
 * request and what the runtime says about it. */
struct ddplug_request {
  ddplug_context *ctx;           /* NULL once its context was closed        */
  ddplug_plugin_request *preq;
  struct ddplug_request *prev, *next; /* ctx->live                          */
  uint64_t seq;                  /* collectives; 0 for a send or receive    */
  int kind;                      /* ddplug_coll_kind, or DDPLUG__REQ_SEND /
                                    DDPLUG__REQ_RECV                        */
  int finished; /* 1 once the plugin reported completion or final failure */
  int status;   /* final status when finished                             */
  int32_t source; /* a receive: the matched sender (the plugin writes it)  */
  uint64_t count;  /* count, dtype and op (a collective), peer and tag (a    */
  int dtype, op;   /* send or receive): its description, formatted only     */
  int32_t peer;    /* when a message needs it (ddplug__request_what)        */
  int64_t tag;
  int on_stack;    /* a blocking call's own request: not freed              */
  char what[128];  /* the description, once made                            */
};
/* "collective #12 (allreduce of 4 float32, sum)" or "send of 2 float32 to
 * rank 1 (tag 0)": made (and kept in req->what) the first time a message
 * needs it. Formatting it for every call cost about a third of a small
 * blocking allreduce, and more in a process where a library registered
 * printf handlers (glibc then formats every call on its slow path). */
const char *ddplug__request_what(ddplug_request *req);
/* ddplug_request.kind of point-to-point requests (after the collectives'). */
#define DDPLUG__REQ_SEND 100
#define DDPLUG__REQ_RECV 101

/* At close, before group_destroy: requests not yet freed lose their
 * context; the plugin's side of finished ones is freed now, of pending ones
 * by group_destroy. Freeing a request later frees only its wrapper. */
void ddplug__requests_orphan(ddplug_context *ctx, ddplug_plugin_group *group);
/* The checks every start makes first (ctx and out given, the run still
 * going): OK, or the status with ctx's last error set. */
int ddplug__start_check(ddplug_context *ctx, const char *fn, ddplug_request **out);
/* A zeroed request of ctx into *out (NO_MEMORY naming fn). */
int ddplug__request_new(ddplug_context *ctx, const char *fn, ddplug_request **out);
/* The plugin's start slot failed with s, all of it handled: req freed
 * (unless on the caller's stack); the run's status when the run has ended
 * meanwhile; else s, with the plugin's explanation (or one naming slot,
 * after prefix when given) as ctx's last error, and the run ended if s
 * broke it. Returns the status for the caller to return. */
int ddplug__request_start_failed(ddplug_context *ctx, ddplug_request *req, int s,
                                 const char *slot, const char *prefix);
/* Add a started request to ctx's live list (freed or orphaned later). */
void ddplug__request_link(ddplug_context *ctx, struct ddplug_request *req);
/* After a blocking call's wait failed with s: a caller error or a mismatch
 * leaves the run going; anything else ends it on every rank, with this
 * rank's last error as the reason. */
void ddplug__end_run_if_broken(ddplug_context *ctx, int s);
/* A blocking call's timeout: > 0 or DDPLUG_TIMEOUT_DEFAULT; otherwise
 * INVALID_ARGUMENT naming fn and what ("collective", "send or receive"). */
int ddplug__blocking_timeout_check(ddplug_context *ctx, const char *fn, int64_t timeout_ms,
                                   const char *what);
/* A blocking call's end: free req, keeping the wait's last error. */
int ddplug__request_finish_blocking(ddplug_context *ctx, struct ddplug_request *req, int s);

#endif /* DDPLUG_CONTEXT_H */
