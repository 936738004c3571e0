/*
 * ddplug/ddplug.h — the host API: what a trainer or a host adapter calls.
 *
 * Conventions that hold for every function below unless its block says
 * otherwise:
 *   Returns   a ddplug_status as int: DDPLUG_OK (0) or a DDPLUG_E_* code.
 *             ddplug_strerror(code) is the short message; the detail (rank,
 *             key path, FILE:LINE:COLUMN, sequence number, what to do) is in
 *             ddplug_last_error() on the calling thread and, for calls on a
 *             context, also in ddplug_context_error(ctx).
 *   Failure   a call that fails has no side effect the caller must undo, and
 *             leaves its out-parameters untouched (out handles stay NULL if
 *             the caller initialised them so).
 *   Ownership a function named *_new / *_open / *_load / *_connect / *_serve
 *             gives the caller a handle to release with the matching
 *             *_free / *_close / *_stop. Strings and buffers the library
 *             allocates for the caller are released with ddplug_free().
 *             Pointers passed in are borrowed for the call only, unless the
 *             block says the library keeps them.
 *   Blocking  every call that can wait on another process takes a timeout
 *             (int64 ms, DDPLUG_TIMEOUT_DEFAULT = configured) and never
 *             waits longer than it plus a small constant, whatever else is
 *             frozen, cut off or dead — see "Timeouts" below.
 *   Threads   functions without a handle are thread-safe. A handle may be
 *             used from several threads only where its block says so.
 *   Versioned every struct argument begins {struct_size, abi_version}; fill
 *   structs   them with the matching *_INIT macro (or set struct_size to
 *             sizeof and abi_version to DDPLUG_ABI_VERSION). Fields a caller
 *             built against an older header does not know get their default.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_DDPLUG_H
#define DDPLUG_DDPLUG_H

#include "ddplug/common.h"
#include "ddplug/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Timeouts: the contract. Every wait ends within its own timeout plus a
 * small constant, whatever another process or the network does:
 *  - A collective (a blocking form, or ddplug_request_wait) that cannot complete
 *    fails within its timeout (config timeouts.collective_s, a barrier's
 *    timeout_ms) plus at most 1 s: the failure is published to the other
 *    ranks through the store with a deadline of its own (0.5 s), and a rank
 *    woken by another's failure waits at most 0.4 s for the run's reason.
 *    That holds when the store itself stopped answering: rank 0 frozen
 *    (SIGSTOP, a hung process) or the network cut. After a cut both sides
 *    fail by their timeout, and the sentence names the ranks that went
 *    silent and says the connection to them stalled.
 *  - Once a context has failed, every store call it makes (publishing the
 *    failure, ddplug_close) waits at most 0.5 s for the store: its handles'
 *    default timeouts drop to that. ddplug_close after a failure returns
 *    within about 2 s (rank 0, which serves the store, waits up to 3 s for
 *    the others to disconnect).
 *  - A rank that dies — killed, crashed — at any stage of ddplug_open
 *    (from the moment it reached the store: claiming its rank, the startup
 *    checks, the plugin's shared-memory attach and ring setup, the final
 *    wait) or afterwards is reported on every other rank within about 2 s,
 *    not after a timeout: the store sees its connection close and tells
 *    everyone; same-node ranks of the cpu plugin also watch its process.
 *    A rank that never reached the store is reported when the rendezvous
 *    timeout expires ("ranks 2, 3 never joined after 30.0 s"), on every
 *    rank: rank 0's timeout counts from its own start, and a rank that
 *    started earlier waits for rank 0's report that much longer.
 *  - A store call waits for the handle's lock (another thread's call on
 *    the same handle) only within its own timeout.
 *  - The store server gives a connection that has not authenticated 5 s to
 *    do so, whatever the rendezvous timeout. */

/* Host API ABI version (independent of the plugin ABI version). */
#define DDPLUG_ABI_MAJOR 1
#define DDPLUG_ABI_MINOR 1
#define DDPLUG_ABI_VERSION DDPLUG_MAKE_VERSION(DDPLUG_ABI_MAJOR, DDPLUG_ABI_MINOR)

/* ========================================================================
 * Library, errors, memory
 * ======================================================================== */

/* The library's release version string, e.g. "0.2.0". Static. Since 1.0. */
DDPLUG_API const char *ddplug_version_string(void);

/* DDPLUG_ABI_VERSION of the loaded library. A host checks that its major
 * equals the one it was compiled with. Since 1.0. */
DDPLUG_API uint32_t ddplug_abi_version(void);

/* DDPLUG_PLUGIN_ABI_VERSION the loaded library speaks. Since 1.0. */
DDPLUG_API uint32_t ddplug_plugin_abi_version(void);

/* Short static message for a status code ("timed out"); "unknown status"
 * for an unknown code. Never NULL. Thread-safe. Since 1.0. */
DDPLUG_API const char *ddplug_strerror(int status);

/* Static name of a status code without prefix ("TIMEOUT"), or "UNKNOWN".
 * Since 1.0. */
DDPLUG_API const char *ddplug_status_name(int status);

/* The detail sentence of the last call that failed on the calling thread,
 * e.g. "run.json: sampler.shufle: unknown key (did you mean 'shuffle'?)"
 * or "run.json:4:12: ..." for a syntax error. "" if none failed yet. Thread-local storage owned by the
 * library, valid until the next failing ddplug call on this thread. Since 1.0. */
DDPLUG_API const char *ddplug_last_error(void);

/* Release memory the library returned (strings, buffers). NULL is a no-op.
 * Since 1.0. */
DDPLUG_API void ddplug_free(void *ptr);

/* Size in bytes of one element of dtype; 0 for an unknown dtype. Since 1.0. */
DDPLUG_API uint32_t ddplug_dtype_size(int dtype);
/* Static lowercase names ("bfloat16", "avg", "plugin"), or NULL if unknown.
 * Since 1.0. */
DDPLUG_API const char *ddplug_dtype_name(int dtype);
DDPLUG_API const char *ddplug_op_name(int op);
DDPLUG_API const char *ddplug_owner_name(int owner);

/* ========================================================================
 * Logging
 * Every line is prefixed with the rank ("[ddplug r3] ...", or "[ddplug]"
 * before the rank is known). The threshold comes from, in order:
 * ddplug_log_set_level(), the DDPLUG_LOG environment variable
 * (off|error|warn|info|debug|trace), the config's "log_level", default warn.
 * ======================================================================== */

/* Receives each log line (without trailing newline). level is a
 * DDPLUG_LOG_*; rank is -1 before it is known. Called from whichever thread
 * logs, possibly concurrently: the callback must be thread-safe. */
typedef void (*ddplug_log_fn)(void *user, int level, int rank,
                              const char *line);

/* Install fn (NULL restores the default: stderr). Process-wide. Since 1.0. */
DDPLUG_API int ddplug_log_set_callback(ddplug_log_fn fn, void *user);

/* Set the process-wide threshold (overrides DDPLUG_LOG and config).
 * DDPLUG_E_INVALID_ARGUMENT if level is not a DDPLUG_LOG_*. Since 1.0. */
DDPLUG_API int ddplug_log_set_level(int level);

/* Parse "off|error|warn|info|debug|trace" (case-insensitive). Since 1.0. */
DDPLUG_API int ddplug_log_level_parse(const char *text, int *level);

/* ========================================================================
 * Configuration — strict JSON (see README "Configuration" and the JSON
 * Schema, ddplug_config_schema). Unknown keys (with a "did you mean"
 * suggestion), duplicate keys, wrong types and out-of-range values are
 * DDPLUG_E_CONFIG with the key path; syntax errors carry FILE:LINE:COLUMN.
 * A config handle is immutable and may be shared between threads.
 * ======================================================================== */
typedef struct ddplug_config ddplug_config;

/* Parse the file at path (a regular file of at most 16 MiB). On success
 * *out is a new config; on failure *out is untouched and ddplug_last_error()
 * reads "path:line:col: message" or "path: key.path: message" (a duplicate
 * key is named by its key path). Errors: NOT_FOUND, SYSTEM (unreadable, a
 * directory), CONFIG (the content; a file larger than 16 MiB; a FIFO,
 * socket or device, refused at once without blocking), NO_MEMORY,
 * INVALID_ARGUMENT. A path longer than 512 characters is shown with its
 * middle elided, so the reason always ends the message. Reads the file
 * only; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_config_load_file(const char *path, ddplug_config **out);

/* Parse JSON text. origin names it in messages ("<string>" if NULL).
 * Since 1.0. */
DDPLUG_API int ddplug_config_load_string(const char *json, const char *origin,
                                         ddplug_config **out);

/* From the DDPLUG_CONFIG environment variable: text starting with '{' is
 * JSON, anything else a file path; unset or empty gives the defaults.
 * Since 1.0. */
DDPLUG_API int ddplug_config_load_env(ddplug_config **out);

/* All defaults. Since 1.0. */
DDPLUG_API int ddplug_config_default(ddplug_config **out);

DDPLUG_API void ddplug_config_free(ddplug_config *cfg);

/* The effective config (defaults filled in) as canonical JSON: keys sorted,
 * no insignificant white space. *out is released with ddplug_free.
 * Since 1.0. */
DDPLUG_API int ddplug_config_to_json(const ddplug_config *cfg, char **out);

/* The JSON Schema (draft 2020-12) of the config, generated from the
 * loader's key table: every key with its type, range, enum values, default
 * and description (the few rules a schema cannot express are listed in its
 * top-level description). *out (indented JSON text) is released with
 * ddplug_free; NULL on failure. Errors: INVALID_ARGUMENT (out NULL),
 * NO_MEMORY. Never blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_config_schema(char **out);

/* 64-bit hash of the run-wide part of the config: the canonical JSON (as
 * ddplug_config_to_json) of the effective config WITHOUT "world" and
 * "log_level", which describe this process rather than the run and may
 * differ between ranks. Configs that mean the same run hash equal on every
 * machine (key order, white space, 300 vs 300.0 and spelled-out defaults do
 * not matter); ddplug_open compares it across ranks. Computed at load:
 * never fails for a valid cfg. Since 1.0. */
DDPLUG_API int ddplug_config_hash(const ddplug_config *cfg, uint64_t *out);

/* The name of what the config was loaded from (file path, "<string>",
 * "DDPLUG_CONFIG", "<defaults>"). Owned by cfg. Since 1.0. */
DDPLUG_API const char *ddplug_config_origin(const ddplug_config *cfg);

/* Typed reads of the effective value at a dotted key path
 * ("sampler.seed"). DDPLUG_E_NOT_FOUND for a path the schema does not
 * have (or an absent optional key), DDPLUG_E_INVALID_ARGUMENT for a type
 * that does not match. get_string's *out is released with ddplug_free; a
 * JSON object or array comes back as JSON text. Since 1.0. */
DDPLUG_API int ddplug_config_get_int(const ddplug_config *cfg,
                                     const char *path, int64_t *out);
DDPLUG_API int ddplug_config_get_double(const ddplug_config *cfg,
                                        const char *path, double *out);
DDPLUG_API int ddplug_config_get_bool(const ddplug_config *cfg,
                                      const char *path, int *out);
DDPLUG_API int ddplug_config_get_string(const ddplug_config *cfg,
                                        const char *path, char **out);

/* Whether the document the config was loaded from sets the key at path
 * itself (*out = 1), rather than leaving it to its default (*out = 0): e.g.
 * whether the user chose a plugin. The same path errors as the getters
 * (NOT_FOUND with a suggestion for a path the schema does not have,
 * INVALID_ARGUMENT for NULL arguments). Never blocks; thread-safe.
 * Since 1.0. */
DDPLUG_API int ddplug_config_is_set(const ddplug_config *cfg, const char *path, int *out);

/* ========================================================================
 * World discovery — who am I, how many are we, where is the rendezvous.
 * Order: explicit config "world" > torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) > Lightning's
 * launcher (LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) >
 * MPI launchers (Open MPI's OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE;
 * hydra's and srun --mpi=pmi2's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
 * MPI_LOCALNRANKS; PMIX_RANK with SLURM_NTASKS, or alone) > SLURM
 * (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID,
 * SLURM_LAUNCH_NODE_IPADDR) > a single process. Under an MPI launcher
 * without MASTER_ADDR (or rendezvous.addr) the address stays empty and
 * ddplug_open asks the plugin's bootstrap slots (plugin.h) for the world and
 * rank 0's store address; world_size is 0 when only PMIX_RANK says
 * anything (the bootstrap says it). Since 1.0; MPI launchers since 1.1.
 * ======================================================================== */
typedef struct ddplug_world {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;       /* as the launcher said; -1 if it did not     */
  int32_t local_world_size; /* as the launcher said; -1 if it did not     */
  int32_t node_rank;        /* as the launcher said; -1 if it did not     */
  int32_t master_port;      /* rendezvous port, 0 if none (single process) */
  char master_addr[256];    /* rendezvous address, "" if none             */
  char source[16];          /* "config", "torchrun", "lightning", "mpi"
                               (an MPI launcher), "slurm", "single", or
                               "caller" (ddplug_open_options)              */
} ddplug_world;
#define DDPLUG_WORLD_INIT {sizeof(ddplug_world), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, 0, {0}, {0}}

/* Discover the world from cfg (may be NULL) and the process environment.
 * Inconsistent input — rank >= world size, a negative or non-numeric value,
 * no rendezvous address for a world larger than one — is DDPLUG_E_CONFIG
 * naming the variables. Reads only; never blocks. Since 1.0. */
DDPLUG_API int ddplug_world_discover(const ddplug_config *cfg,
                                     ddplug_world *out);

/* ========================================================================
 * Plugins
 * ======================================================================== */
typedef struct ddplug_plugin_info {
  uint32_t struct_size;
  uint32_t abi_version;
  uint32_t plugin_abi_version; /* the ABI the plugin was built against    */
  uint32_t dtype_mask;
  uint32_t op_mask;
  int32_t has_sampler;
  uint64_t caps;
  char name[64];
  char version[64];
  char description[256];
  char path[4096];             /* the file that was loaded                 */
} ddplug_plugin_info;
#define DDPLUG_PLUGIN_INFO_INIT {sizeof(ddplug_plugin_info), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, {0}, {0}, {0}, {0}}

/* Load the plugin named name_or_path (a name "cpu" is looked up as
 * libddplug-cpu.so in each directory of DDPLUG_PLUGIN_PATH, then the
 * installed plugin directory, then beside libddplug.so; anything containing
 * '/' is a path), check its ABI, fill *info, and unload it.
 * Errors: NOT_FOUND (last-error lists every path searched), ABI_MISMATCH
 * (no entry symbol: "not a ddplug plugin"; major too new or too old; table
 * too small), INVALID_ARGUMENT (a mandatory slot is NULL: named), SYSTEM
 * (the file exists but cannot be loaded: not an ELF shared object, missing
 * dependencies — dlopen's reason is quoted). Blocks only in dlopen.
 * Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_plugin_inspect(const char *name_or_path,
                                     ddplug_plugin_info *info);

/* The options the plugin declares for the config's "plugin_options"
 * (plugin ABI 1.3), as JSON: an array of {"name", "type" (bool, int,
 * number, string, int_list), "default" (null: none), "description", and as
 * they apply "minimum", "maximum", "multiple_of", "max_items", "choices"};
 * "null" for a plugin that declares none (it reads plugin_options itself).
 * *out is released with ddplug_free; NULL on failure. Loads the plugin as
 * ddplug_plugin_inspect does, with the same errors, and unloads it. Blocks
 * only in dlopen. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_plugin_options(const char *name_or_path, char **out);

/* ========================================================================
 * Context — this process's membership in a data-parallel run.
 * ======================================================================== */
typedef struct ddplug_context ddplug_context;
typedef struct ddplug_request ddplug_request;

typedef struct ddplug_open_options {
  uint32_t struct_size;
  uint32_t abi_version;
  /* Plugin name or path; NULL = config "plugin". */
  const char *plugin;
  /* Node identity; NULL = config "world.host_id", DDPLUG_HOST_ID, then the
   * machine's hostname + boot id. Ranks with equal host ids share a node. */
  const char *host_id;
  /* Who is calling, for logs ("lightning 2.6.6"); NULL = "c". */
  const char *framework;
  /* Rendezvous/startup timeout override in ms; 0 = config
   * "rendezvous.timeout_s". */
  int64_t timeout_ms;
  /* The world as the caller decided it (a framework's cluster environment),
   * used instead of discovery; NULL = ddplug_world_discover. Borrowed for
   * the call. rank and world_size are required; local_rank,
   * local_world_size and node_rank are -1 when unknown; master_addr /
   * master_port serve when the config sets no rendezvous.addr / port (""
   * and 0: MASTER_ADDR / MASTER_PORT then). Checked like a config "world"
   * (CONFIG naming the field); reported with source "caller". Since 1.0. */
  const ddplug_world *world;
  /* Collective timeout override in ms (a framework's own timeout argument,
   * e.g. torch.distributed's); 0 = config "timeouts.collective_s". Since
   * 1.0. */
  int64_t collective_timeout_ms;
  /* With world: the rendezvous as the caller decided it, overriding the
   * config's rendezvous.addr / port and the environment (a framework that
   * exchanges its own address and port, e.g. one per torch.distributed
   * subgroup); NULL = not overridden. rendezvous_port > 0: that port; -1:
   * any free port (a world of one); 0: not overridden. Since 1.0. */
  const char *rendezvous_addr;
  int32_t rendezvous_port;
  int32_t reserved0;
} ddplug_open_options;
#define DDPLUG_OPEN_OPTIONS_INIT \
  {sizeof(ddplug_open_options), DDPLUG_ABI_VERSION, NULL, NULL, NULL, 0, NULL, 0, NULL, 0, 0}

/* Join the run. Collective: every rank of the world calls it.
 *  1. discovers the world (ddplug_world_discover);
 *  2. rank 0 serves the rendezvous store (unless config names an external
 *     one), every rank connects — from here on a failure on any rank is
 *     published and fails every rank at once with that rank's sentence;
 *  3. the plugin is loaded (config "plugin" or opts->plugin);
 *  4. every rank registers; rank 0 waits at most the rendezvous timeout and,
 *     if ranks are missing, fails on every rank naming them ("ranks 2, 3
 *     never joined after 30.0 s: started 2 of 4 processes?");
 *  5. startup checks: world size agreed, ranks unique, config identical
 *     (hash), the same plugin name and version everywhere — a mismatch fails
 *     on every rank naming the ranks that differ;
 *  6. host identities are exchanged to learn which ranks share a node;
 *  7. the plugin's group is created, and every rank waits for all others.
 * On success *out is the context. On failure *out is untouched, everything
 * is released, and ddplug_last_error() says what happened on which rank.
 * cfg may be NULL (ddplug_config_load_env is used); cfg is copied.
 * Blocks at most the rendezvous timeout (plus a grace of max(2 s, 10 %) for
 * rank 0's report) for steps 1–6, plus the collective timeout for the
 * plugin's group creation; a rank that dies meanwhile fails every other
 * rank's ddplug_open within about 2 s ("Timeouts" above). Rank 0 warns once
 * when it serves the store on every interface without a shared secret.
 * Since 1.0. */
DDPLUG_API int ddplug_open(const ddplug_config *cfg,
                           const ddplug_open_options *opts,
                           ddplug_context **out);

/* Leave the run: waits (at most the collective timeout) for the other
 * ranks to close too, destroys the plugin group, disconnects, frees ctx.
 * Always frees ctx, also when the close barrier fails (the status says so,
 * and the other ranks are told why this rank left). Rank 0, which serves
 * the store, then waits (a few seconds at most) until the other processes
 * have disconnected. Requests not yet freed lose their context: waiting on
 * them returns ABORTED and ddplug_request_free only releases the handle.
 * NULL is a no-op. Since 1.0. */
DDPLUG_API int ddplug_close(ddplug_context *ctx);

/* Abort the run from this rank: every rank's blocked and future calls
 * return DDPLUG_E_ABORTED with reason. Thread-safe: may be called while
 * another thread is blocked in a collective on ctx. ctx must still be
 * closed. Since 1.0. */
DDPLUG_API int ddplug_abort(ddplug_context *ctx, const char *reason);

/* Detail of the last failure on ctx (any thread). Valid until the next
 * failure on ctx or ddplug_close. Since 1.0. */
DDPLUG_API const char *ddplug_context_error(const ddplug_context *ctx);

/* The world as the context sees it after rendezvous: local_rank,
 * local_world_size and node_rank come from the host-identity exchange.
 * Since 1.0. */
DDPLUG_API int ddplug_context_world(const ddplug_context *ctx,
                                    ddplug_world *out);
/* Number of nodes (distinct host ids) of the run; 0 for NULL. Never
 * blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_context_num_nodes(const ddplug_context *ctx);
/* The loaded plugin, into *info (initialised with DDPLUG_PLUGIN_INFO_INIT;
 * fields past its struct_size are left alone). INVALID_ARGUMENT for NULL
 * arguments. Never blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_context_plugin(const ddplug_context *ctx,
                                     ddplug_plugin_info *info);
/* The context's config (borrowed, lives as long as ctx; NULL for NULL).
 * Never blocks; thread-safe. Since 1.0. */
DDPLUG_API const ddplug_config *ddplug_context_config(const ddplug_context *ctx);

/* ========================================================================
 * Elastic in place. With config "elastic.on_peer_lost": "shrink", a rank
 * that is lost (killed, crashed: its process or connection gone) does not
 * end the run: the survivors' calls fail with DDPLUG_E_PEER_LOST as before,
 * and each survivor then calls ddplug_shrink, which re-forms the group over
 * the survivors — a new generation: ranks renumbered 0..n-1 in the order of
 * their previous ranks, the plugin's group created anew (its group_shrink
 * slot where it has one) — without restarting any process. Collectives
 * that were pending are not completed: the host redoes the step in flight
 * (and re-deals its samples: ddplug_sampler_reform). The store survives the
 * loss of any rank but the one serving it (rank 0, unless the store is
 * external: rendezvous.external); losing it ends the run. A rank lost once
 * every rank has joined does not fail ddplug_open on a slower rank (the
 * loss is reported by its next collective), and calls that work on this
 * rank alone (ddplug_context_sampler_new) do not fail on a loss the run can
 * shrink from: only calls that communicate report it.
 * ======================================================================== */

/* The membership of a context: who it is now and what the last
 * re-formation changed. */
typedef struct ddplug_membership {
  uint32_t struct_size;
  uint32_t abi_version;
  uint64_t generation;         /* 0 at ddplug_open, + 1 per re-formation    */
  int32_t rank;                /* now                                       */
  int32_t world_size;          /* now                                       */
  int32_t identity;            /* this process's rank at ddplug_open        */
  int32_t previous_rank;       /* its rank before the last re-formation     */
  int32_t previous_world_size; /* the world size before it                   */
  int32_t lost_count;          /* ranks it lost                             */
  char lost[256];              /* their previous ranks, "2" or "1, 3" ("" at
                                  generation 0)                             */
} ddplug_membership;
#define DDPLUG_MEMBERSHIP_INIT \
  {sizeof(ddplug_membership), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, 0, 0, {0}}

/* Re-form the group over the survivors after a rank was lost. Collective
 * over the survivors: each calls it once its context failed with
 * DDPLUG_E_PEER_LOST (ranks that have not noticed yet do at their next
 * call). It waits until every member of the current generation has either
 * arrived here or is gone (its store connection closed), renumbers the
 * arrivals, creates the plugin's group over them and waits for each to be
 * ready; the context is then open again (generation + 1), *out (may be
 * NULL; initialise it with DDPLUG_MEMBERSHIP_INIT) describes it, and one
 * warning line names who was lost and how many remain. Requests of the old
 * generation are orphaned (waiting on them returns ABORTED). Errors:
 * INVALID_ARGUMENT (NULL ctx; elastic.on_peer_lost is not "shrink"; the
 * context has not failed); the context's own failure when it is not a
 * lost rank (TIMEOUT, ABORTED, MISMATCH: those end the run); PEER_LOST when
 * fewer ranks than elastic.min_world_size remain, when the store is gone
 * (rank 0 served it), or when a survivor is lost during the re-formation —
 * the context is then failed again and ddplug_shrink may be called again;
 * TIMEOUT when a member neither arrived nor left within timeout_ms
 * (DDPLUG_TIMEOUT_DEFAULT: the collective timeout), which ends the run. On
 * failure *out is untouched. Blocks at most timeout_ms plus the plugin's
 * group creation (the collective timeout). Not thread-safe: no other thread
 * may use ctx meanwhile (ddplug_abort included). Since 1.1. */
DDPLUG_API int ddplug_shrink(ddplug_context *ctx, int64_t timeout_ms,
                             ddplug_membership *out);

/* The context's membership into *out (honouring its struct_size).
 * INVALID_ARGUMENT for NULL arguments. Never blocks; thread-safe except
 * against ddplug_shrink. Since 1.1. */
DDPLUG_API int ddplug_context_membership(const ddplug_context *ctx,
                                         ddplug_membership *out);

/* ========================================================================
 * Collectives. Every rank must issue the same collectives in the same
 * order; a plugin with DDPLUG_CAP_MISMATCH_CHECK reports DDPLUG_E_MISMATCH
 * on every rank instead of producing garbage when they differ (the run goes
 * on). The blocking forms wait the configured collective timeout (barrier:
 * its timeout_ms, > 0 or DDPLUG_TIMEOUT_DEFAULT); if it expires, a peer is
 * lost, or the run is aborted, the context is aborted on every rank: later
 * calls fail at once with the same status and the sentence naming the cause
 * (PEER_LOST naming the lost rank, TIMEOUT naming the collective and the late
 * ranks, ABORTED naming who called ddplug_abort).
 * stream: an opaque device stream for device plugins (e.g. cudaStream_t),
 * NULL otherwise. A ctx is not thread-safe for collectives: issue them from
 * one thread (ddplug_abort and ddplug_context_error excepted).
 * ======================================================================== */

/* recv[i] = op over every rank's send[i], count elements of dtype on every
 * rank; send == recv is in place. Blocks until done, at most the collective
 * timeout (see above). Errors: INVALID_ARGUMENT (NULL ctx or buffers with
 * count > 0, a dtype/op outside ddplug's or the plugin's masks, bitwise ops
 * on floating point, sizes that overflow: nothing started, the run goes on),
 * UNSUPPORTED, MISMATCH (the run goes on), TIMEOUT, PEER_LOST, ABORTED (the
 * run is over: later calls fail the same way). Since 1.0. */
DDPLUG_API int ddplug_allreduce(ddplug_context *ctx, const void *send,
                                void *recv, uint64_t count, int dtype, int op,
                                void *stream);
/* root's send (count elements) into every rank's recv; send == recv
 * allowed; the others' send is ignored (may be NULL). Blocking and errors as
 * ddplug_allreduce, plus INVALID_ARGUMENT for a root outside the world.
 * Since 1.0. */
DDPLUG_API int ddplug_broadcast(ddplug_context *ctx, const void *send,
                                void *recv, uint64_t count, int dtype,
                                int root, void *stream);
/* recv[r*count .. (r+1)*count) = rank r's send, for every rank r; send may
 * be recv + rank*count (in place). Blocking and errors as
 * ddplug_allreduce. Since 1.0. */
DDPLUG_API int ddplug_allgather(ddplug_context *ctx, const void *send,
                                void *recv, uint64_t count, int dtype,
                                void *stream);
/* Returns once every rank reached it, at most timeout_ms (> 0, or
 * DDPLUG_TIMEOUT_DEFAULT: the collective timeout); errors as
 * ddplug_allreduce, the TIMEOUT naming the ranks that had not arrived.
 * Since 1.0. */
DDPLUG_API int ddplug_barrier(ddplug_context *ctx, int64_t timeout_ms);

/* Asynchronous forms: start the collective and return a request in *req
 * (released with ddplug_request_free, also after a failure) without waiting
 * for the peers where the plugin is asynchronous (DDPLUG_CAP_ASYNC); the
 * buffers must stay valid until it completes. Collectives on one context
 * complete in the order they were started. On failure *req is untouched and
 * nothing was started; errors as the blocking forms. Same thread rule.
 * Since 1.0. */
DDPLUG_API int ddplug_iallreduce(ddplug_context *ctx, const void *send,
                                 void *recv, uint64_t count, int dtype, int op,
                                 void *stream, ddplug_request **req);
DDPLUG_API int ddplug_ibroadcast(ddplug_context *ctx, const void *send,
                                 void *recv, uint64_t count, int dtype,
                                 int root, void *stream, ddplug_request **req);
DDPLUG_API int ddplug_iallgather(ddplug_context *ctx, const void *send,
                                 void *recv, uint64_t count, int dtype,
                                 void *stream, ddplug_request **req);
DDPLUG_API int ddplug_ibarrier(ddplug_context *ctx, ddplug_request **req);

/* Wait for req at most timeout_ms (0 polls once; DDPLUG_TIMEOUT_DEFAULT:
 * the collective timeout). OK when done; TIMEOUT when not yet (req stays
 * pending and may be waited again; the last error names its sequence
 * number and, where the plugin knows, the ranks that had not arrived);
 * otherwise the collective's failure, final for req (PEER_LOST naming the
 * rank, ABORTED, MISMATCH, ...). Blocks at most timeout_ms plus a small
 * constant. Not concurrently with another call on req's context.
 * Since 1.0. */
DDPLUG_API int ddplug_request_wait(ddplug_request *req, int64_t timeout_ms);
/* Never blocks: *done = 1 and OK when req completed, *done = 0 and OK while
 * it is pending, the failure status when it failed. Since 1.0. */
DDPLUG_API int ddplug_request_test(ddplug_request *req, int *done);
/* The request's sequence number on its context (1, 2, ...; 0 for NULL and
 * for a send or receive, which are not collectives). Never blocks;
 * thread-safe. Since 1.0. */
DDPLUG_API uint64_t ddplug_request_seq(const ddplug_request *req);
/* Release req. Freeing a pending request aborts the run (the collective
 * cannot be completed safely) — unless the plugin has no group_abort, then
 * it first waits (at most the collective timeout) for it to finish. A request
 * whose context was closed is just released. NULL is a no-op. Since 1.0. */
DDPLUG_API void ddplug_request_free(ddplug_request *req);

/* ========================================================================
 * Point-to-point — one rank sends, one receives; the other ranks take no
 * part. A plugin offers it with DDPLUG_CAP_P2P (and receives from any
 * sender with DDPLUG_CAP_P2P_ANY_SOURCE); with any other plugin every call
 * below is UNSUPPORTED naming the operation and the plugin ("plugin X has
 * no point-to-point (send)"), nothing started, the run goes on.
 *
 * Matching: a receive takes the oldest message from its peer (any peer for
 * DDPLUG_ANY_SOURCE) with its tag that no earlier receive took; between one
 * sender and one receiver, messages of one tag arrive in the order they were
 * sent. Receives are matched in the order they were posted. The count and
 * dtype of a receive must equal the matched send's: otherwise the receive
 * (and the send, where the plugin can tell) fails with MISMATCH naming both
 * ranks, the tag and both counts, no data is delivered, and the run goes
 * on. A send may complete before its receive is posted or only once it is
 * (the cpu plugin buffers small messages, not large ones): never rely on
 * either — two ranks that each send first and receive afterwards must use
 * the i-forms, or order the calls.
 *
 * Point-to-point operations are not collectives: they take no sequence
 * number (ddplug_request_seq is 0), do not count in the collectives' order,
 * and may be pending while collectives run. The same thread rule holds (one
 * thread at a time in a context's calls). Requests are waited for, tested
 * and freed with ddplug_request_wait / _test / _free, whose rules apply:
 * a wait's TIMEOUT leaves a send or receive pending; freeing a pending one
 * ends the run (ddplug_request_free). A dead peer gives PEER_LOST naming it;
 * an aborted run fails them all.
 * ======================================================================== */

/* Start sending count elements of dtype from buf to rank peer with tag
 * (>= 0), and return a request in *req (released with ddplug_request_free,
 * also after a failure). buf must stay valid and unchanged until the
 * request completes. stream: as for the collectives (device plugins).
 * Never waits for the peer where the plugin is asynchronous
 * (DDPLUG_CAP_ASYNC). Errors, nothing started, *req untouched, the run goes
 * on: INVALID_ARGUMENT (NULL ctx or req, buf NULL with count > 0, peer
 * outside the world or this rank itself, a negative tag, a dtype outside
 * ddplug's or the plugin's mask, a size that overflows); UNSUPPORTED (the
 * plugin has no point-to-point, or refuses the arguments: nccl takes tag 0
 * only); the run's status once it ended (ABORTED, PEER_LOST, ...). Not
 * thread-safe (see above). Since 1.1. */
DDPLUG_API int ddplug_isend(ddplug_context *ctx, const void *buf, uint64_t count, int dtype,
                            int peer, int64_t tag, void *stream, ddplug_request **req);

/* Start receiving count elements of dtype into buf from rank peer (or from
 * any rank: DDPLUG_ANY_SOURCE, with DDPLUG_CAP_P2P_ANY_SOURCE) with tag
 * (>= 0), and return a request in *req. buf must stay valid until the
 * request completes; ddplug_request_source then names the sender. Errors as
 * ddplug_isend, plus UNSUPPORTED for DDPLUG_ANY_SOURCE with a plugin that
 * cannot match any sender; a MISMATCH (see above) ends the request, not the
 * run. Since 1.1. */
DDPLUG_API int ddplug_irecv(ddplug_context *ctx, void *buf, uint64_t count, int dtype,
                            int peer, int64_t tag, void *stream, ddplug_request **req);

/* Blocking forms: start, wait at most timeout_ms (> 0, or
 * DDPLUG_TIMEOUT_DEFAULT: the collective timeout), free. A send or receive
 * that does not complete in time ends the run on every rank (as a blocking
 * collective's TIMEOUT does: the operation cannot be taken back), with a
 * sentence naming the operation, the peer and the tag. ddplug_recv stores
 * the sender's rank in *source (may be NULL) — of interest with
 * DDPLUG_ANY_SOURCE. Errors as the i-forms, plus TIMEOUT, PEER_LOST and
 * ABORTED (the run is over) and MISMATCH (it goes on). Since 1.1. */
DDPLUG_API int ddplug_send(ddplug_context *ctx, const void *buf, uint64_t count, int dtype,
                           int peer, int64_t tag, void *stream, int64_t timeout_ms);
DDPLUG_API int ddplug_recv(ddplug_context *ctx, void *buf, uint64_t count, int dtype,
                           int peer, int64_t tag, void *stream, int64_t timeout_ms,
                           int *source);

/* The rank whose message the receive request req matched, into *rank.
 * Returns OK once the receive completed successfully; INVALID_ARGUMENT
 * (*rank untouched) for NULL arguments, a request that is not a receive,
 * or a receive that is still pending or failed (the last error says which:
 * wait for it first). Never blocks; not concurrently with a wait on req.
 * Since 1.1. */
DDPLUG_API int ddplug_request_source(const ddplug_request *req, int *rank);

/* ========================================================================
 * Registered memory — host buffers the plugin's collectives reach from
 * every rank of the node without staging them. With the cpu plugin they are
 * pages of the node's shared memory: a peer reduces straight from such a
 * buffer and writes its result straight into it, so an allreduce of
 * registered buffers moves each byte once (see plugins/cpu/README.md).
 * Every collective accepts any host buffer; registering only makes large
 * allreduces cheaper. Which ranks register is each rank's own choice (the
 * other ranks need not allocate). A plugin without registered memory
 * (DDPLUG_CAP_REGISTERED_MEMORY unset: nccl, most custom backends) answers
 * UNSUPPORTED to ddplug_mem_alloc and STAGED to ddplug_mem_reach.
 * Threads: the three functions may be called from any thread, also while
 * another thread runs a collective on the same context. None of them waits
 * for another rank.
 * ======================================================================== */

/* Allocate bytes (> 0) of registered memory for ctx. *out receives a
 * pointer aligned to at least 64 bytes (the cpu plugin: 4096), contents
 * unspecified, valid until ddplug_mem_free(ctx, *out) or ddplug_close(ctx).
 * Ownership: the caller releases it with ddplug_mem_free before closing
 * ctx. What is still allocated at ddplug_close stays addressable (the cpu
 * plugin leaves a private, no longer registered copy of the last contents
 * there, so a forgotten view does not fault) and stays allocated until the
 * process exits, with a warning naming how many buffers and bytes.
 * Returns OK; INVALID_ARGUMENT (ctx or out NULL, bytes 0); UNSUPPORTED
 * (the plugin has no registered memory: use ordinary memory);
 * NO_MEMORY (the registered memory is exhausted: the last error says how
 * much is in use and what limits it — for the cpu plugin the free space of
 * /dev/shm or plugin_options.registered_bytes); the run's failure status
 * (ABORTED, PEER_LOST, ...) once ctx was aborted. On failure *out is
 * untouched and nothing is allocated. Local: does not block. Since 1.0. */
DDPLUG_API int ddplug_mem_alloc(ddplug_context *ctx, uint64_t bytes, void **out);

/* Release ptr, returned by ddplug_mem_alloc on ctx. NULL is a no-op (OK).
 * A ptr that is not a live allocation of ctx is INVALID_ARGUMENT and
 * nothing is released. Works also after the run failed or was aborted (so
 * cleanup paths can release). A buffer that a pending collective still
 * uses must not be released. Local: does not block. Since 1.0. */
DDPLUG_API int ddplug_mem_free(ddplug_context *ctx, void *ptr);

/* How ctx's collectives reach [ptr, ptr + bytes) of this rank, in *reach:
 * DDPLUG_REACH_REGISTERED (inside one live ddplug_mem_alloc buffer),
 * DDPLUG_REACH_SINGLE_COPY (not registered, but reduced in place without
 * staging: the cpu plugin copies between the ranks' address spaces through
 * the kernel where the system allows it, for buffers of at least
 * plugin_options.cma_min_bytes), or DDPLUG_REACH_STAGED (copied through the
 * plugin's staging area; also every answer of a plugin without registered
 * memory). A hint for choosing buffers (plugin.h, mem_query); the answer
 * for given arguments does not change during the run. Returns OK, or
 * INVALID_ARGUMENT (ctx or reach NULL). Never blocks. Since 1.0. */
DDPLUG_API int ddplug_mem_reach(ddplug_context *ctx, const void *ptr, uint64_t bytes,
                                int *reach);

/* ========================================================================
 * Data split ownership, samplers, audit.
 *
 * Exactly one layer splits each data stream ("train", "val", ...): the
 * plugin (ddplug's samplers or the plugin's own), the framework (its
 * DistributedSampler injection) or the user (a rank-aware sampler or a
 * dataset already sharded per rank). The samplers below are ddplug's; the
 * audit proves, per epoch, from what every rank actually consumed, that the
 * split was right.
 * ======================================================================== */

/* Longest stream name, in bytes (without the NUL). */
#define DDPLUG_STREAM_NAME_MAX 63

/* Whether stream is a valid stream name: 1 to DDPLUG_STREAM_NAME_MAX
 * characters of A-Z a-z 0-9 _ . - (the rule every call below applies, and
 * the config's data_split.streams keys). Returns OK, or INVALID_ARGUMENT
 * (NULL, empty, too long, or a character outside the set: the last error
 * names it and its position). Never blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_stream_name_check(const char *stream);

/* ---- samplers ----------------------------------------------------------

   A sampler yields this rank's share of one epoch of a stream as dataset
   indices. Two kinds (ddplug_sampler_kind, plugin.h):

   DDPLUG_SAMPLER_DISTRIBUTED — an index sampler with the semantics of
     torch.utils.data.DistributedSampler: the epoch's order is a keyed
     pseudo-random permutation of [0, N) for (seed, epoch) when shuffle is 1,
     else 0, 1, ..., N-1; it is padded by repeating its start up to
     world·ceil(N/world) positions, or cut to world·floor(N/world) with
     drop_last; rank r takes positions r, r+world, r+2·world, ... Every rank
     yields the same count. With exact = 1 (evaluation streams) it is
     neither padded nor cut: rank r takes positions r, r+world, ... < N,
     so every sample is delivered exactly once and the ranks' counts differ
     by at most one (ceil or floor of N/world). next() fills up to cap
     indices (chunks).
   DDPLUG_SAMPLER_BUCKET — a batch sampler over per-sample lengths: samples
     are grouped into length buckets (explicit ascending upper bounds, plus a
     bucket for longer samples, or num_buckets quantile buckets), each bucket
     is shuffled per epoch and padded by repetition (or cut, drop_last) to
     whole global batches, and the order of batches is shuffled the same way
     on every rank. Every rank yields the same number of batches of exactly
     batch_size indices; each sample is in at most one batch per epoch apart
     from the declared padding. next() returns one batch per call. It always
     pads or cuts: exact = 1 is refused for it.

   The permutation is a 4-round Feistel network on ceil(log2 N) bits with
   cycle walking (abi/src/data/feistel.c documents it): O(1) memory and
   O(1) epoch start whatever N, any position resumes directly, the same
   indices on every machine and run for the same options, seed and epoch.
   The bucket sampler keeps its bucket membership (4 bytes per sample below
   2^32 samples, else 8); it does not keep lengths or option pointers.
   A sampler handle is used from one thread at a time; distinct samplers
   are independent.
   ---------------------------------------------------------------------- */
typedef struct ddplug_sampler ddplug_sampler;

/* What a host asks of a sampler. Fill it with DDPLUG_SAMPLER_OPTIONS_INIT,
 * then set the fields. (A plugin's sampler slots receive the plugin ABI's
 * ddplug_sampler_desc, plugin.h, which the runtime builds from these.) */
typedef struct ddplug_sampler_options {
  uint32_t struct_size;
  uint32_t abi_version;       /* DDPLUG_ABI_VERSION                          */
  int32_t kind;               /* ddplug_sampler_kind (plugin.h)              */
  int32_t rank;               /* 0/0 = a single rank; the context-bound     */
  int32_t world_size;         /*   constructor takes them from the context */
  int32_t shuffle;            /* 0/1                                         */
  int32_t drop_last;          /* 0: pad by repetition; 1: drop the tail      */
  int32_t exact;              /* 1: every sample once, no padding or drop;
                                 per-rank counts may differ by one
                                 (distributed kind only; evaluation)       */
  uint64_t seed;
  uint64_t num_samples;       /* N: indices are in [0, N), N < 2^63          */
  const char *stream;         /* name, for messages and ownership; NULL =
                                 "train" (copied)                           */
  /* the bucket kind only */
  const int64_t *lengths;     /* [num_samples] per-sample lengths (read
                                 during the call only)                     */
  const int64_t *boundaries;  /* strictly ascending upper bounds, or NULL    */
  uint32_t num_boundaries;
  uint32_t num_buckets;       /* boundaries == NULL: quantile buckets (>= 1) */
  uint64_t batch_size;        /* bucket: per rank, >= 1; distributed:
                                 optional, the audit then counts one step
                                 per batch_size indices (else per index)   */
} ddplug_sampler_options;
#define DDPLUG_SAMPLER_OPTIONS_INIT                                   \
  {sizeof(ddplug_sampler_options), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, \
   0, 0, 0, NULL, NULL, NULL, 0, 0, 0}

/* Create a standalone sampler (no context, no ownership, no audit) from
 * opts, which is copied (lengths and boundaries are read during the call
 * only; stream is copied). The epoch is 0 and the position 0 until
 * set_epoch/seek. Returns OK; INVALID_ARGUMENT naming the field (unknown
 * kind, rank out of range, NULL lengths, boundaries not ascending,
 * batch_size 0, exact with the bucket kind, a bad stream name, ...),
 * ABI_MISMATCH for options of another major version, NO_MEMORY. On failure
 * *out is untouched. Does not block; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_sampler_new(const ddplug_sampler_options *opts,
                                  ddplug_sampler **out);

/* Start epoch `epoch` at position 0: O(1) (keys derived from seed and
 * epoch). Call it at the start of every epoch — the audit reports a shuffled
 * stream whose order did not change as "epoch not advanced". Returns OK,
 * INVALID_ARGUMENT (NULL s), or a plugin sampler's failure. Does not block;
 * one thread at a time per sampler. Since 1.0. */
DDPLUG_API int ddplug_sampler_set_epoch(ddplug_sampler *s, uint64_t epoch);

/* Deliver the next indices into out[0..cap): the distributed kind fills
 * min(cap, remaining) indices; the bucket kind one batch (exactly
 * batch_size indices; INVALID_ARGUMENT if cap < batch_size, nothing
 * consumed). *n = how many; 0 at the end of the epoch. A context-bound
 * sampler records them in the stream's open audit. Does not block; one
 * thread at a time per sampler. Since 1.0. */
DDPLUG_API int ddplug_sampler_next(ddplug_sampler *s, int64_t *out,
                                   uint64_t cap, uint64_t *n);

/* Deliver the rest of this rank's current batch — one step's indices —
 * into out[0..cap): batch_size indices (1 if unset), fewer for the epoch's
 * last batch; after a change of membership or a resume, a batch this rank
 * held from before ends where it ended (the distributed kind); the bucket
 * kind one batch as ddplug_sampler_next. *n = how many; 0 at the end of the
 * epoch. INVALID_ARGUMENT when cap is smaller than the batch (nothing
 * consumed). A host that trains one step per batch calls this, so that its
 * steps are the sampler's (ddplug_sampler_commit). Does not block; one
 * thread at a time per sampler. Since 1.1. */
DDPLUG_API int ddplug_sampler_next_batch(ddplug_sampler *s, int64_t *out,
                                         uint64_t cap, uint64_t *n);

/* Make the next index (distributed) or batch (bucket) delivered the
 * position-th of this epoch (0-based), exactly as if that many had been
 * consumed: resuming at a position yields the uninterrupted order. O(1).
 * position == length is the end; beyond it INVALID_ARGUMENT. Does not
 * block; one thread at a time per sampler. Since 1.0. */
DDPLUG_API int ddplug_sampler_seek(ddplug_sampler *s, uint64_t position);

/* Indices (distributed) or batches (bucket) this rank yields per epoch:
 * the same on every rank, except with exact = 1 (ceil or floor of
 * N/world). Returns OK or INVALID_ARGUMENT (NULL argument). Since 1.0. */
DDPLUG_API int ddplug_sampler_length(const ddplug_sampler *s,
                                     uint64_t *length);

/* Indices (distributed) or batches (bucket) consumed so far this epoch.
 * Returns OK or INVALID_ARGUMENT (NULL argument). Since 1.0. */
DDPLUG_API int ddplug_sampler_position(const ddplug_sampler *s,
                                       uint64_t *position);

/* What a sampler is and declares about one epoch (all ranks together). */
typedef struct ddplug_sampler_info {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t kind;            /* ddplug_sampler_kind                          */
  int32_t rank;
  int32_t world_size;
  int32_t from_plugin;     /* 1: the plugin's sampler slots serve it       */
  uint64_t num_samples;
  uint64_t batch_size;     /* bucket: per rank; distributed: as given      */
  uint64_t length;         /* this rank's, per epoch (ddplug_sampler_length) */
  uint64_t epoch;
  uint64_t position;
  uint64_t padded;         /* deliveries repeating a sample (padding)      */
  uint64_t dropped;        /* samples left out by drop_last                */
  char stream[64];
  int32_t exact;           /* 1: every sample once (options.exact)         */
  int32_t reserved0;
  /* ---- Since 1.1 ---- */
  uint64_t steps;          /* batches this rank yields per epoch
                              (ddplug_sampler_next_batch calls), as the
                              epoch is dealt now                         */
  uint64_t committed;      /* the epoch's steps committed so far (all
                              segments: before a resume or shrink too)   */
} ddplug_sampler_info;
#define DDPLUG_SAMPLER_INFO_INIT {sizeof(ddplug_sampler_info), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 0}

/* Fill *info (honouring its struct_size). padded/dropped: a default
 * sampler's own numbers; for a plugin-supplied sampler what its
 * sampler_declared slot (plugin ABI 1.2) reports, else the remainder its
 * drop_last implies (see "audit" below). Returns OK or INVALID_ARGUMENT
 * (NULL, or info smaller than up to its stream field). Since 1.0. */
DDPLUG_API int ddplug_sampler_info_get(const ddplug_sampler *s,
                                       ddplug_sampler_info *info);

/* Release s. NULL is a no-op. Since 1.0. */
DDPLUG_API void ddplug_sampler_free(ddplug_sampler *s);
/* ---- elastic: the global cursor ------------------------------------------

   The distributed kind (not exact) deals one order of the whole dataset:
   position p of epoch e is sample pi(p), whatever the world size; after k
   steps of batch_size B on W ranks the committed part of the epoch is
   positions [0, k·B·W). Its state — epoch, seed, N, a cursor and a short
   replay list of positions dealt but never committed, with a coverage
   digest — resumes on any world size, and after ddplug_shrink the rest of
   the epoch (a lost rank's unfinished batches included) is dealt over the
   survivors. abi/src/data/deal.c specifies the dealing.
   The bucket kind forms its global batches of batch_size x world samples
   per bucket, and a plugin's sampler is its own: their state resumes on the
   same world size only, and ddplug_sampler_reform refuses them
   (UNSUPPORTED). An exact (evaluation) sampler's pass restarts over the
   new world at reform.
   ---------------------------------------------------------------------- */

/* Commit `steps` optimizer steps: the oldest delivered batches not yet
 * committed (the distributed kind counts batches of batch_size indices, 1
 * if unset; the bucket kind its batches). Call it once per optimizer step,
 * after the step was applied. INVALID_ARGUMENT (NULL s; more steps than
 * batches delivered and not committed). Local; does not block; one thread
 * at a time per sampler. Since 1.1. */
DDPLUG_API int ddplug_sampler_commit(ddplug_sampler *s, uint64_t steps);

/* The sampler's state as JSON text into *state (released with ddplug_free):
 * for a checkpoint. The distributed kind: epoch, seed, N, shuffle,
 * batch_size, world size, the cursor and replay list of the committed part
 * (the commits of this rank's current world, which every rank shares in
 * lockstep), the committed count and digest, the epoch's committed steps
 * and its membership history. Other kinds: epoch and the committed
 * position. Errors: INVALID_ARGUMENT, NO_MEMORY; on failure *state is
 * untouched. O(committed samples) (the digest); does not block. Since 1.1. */
DDPLUG_API int ddplug_sampler_state_save(const ddplug_sampler *s,
                                         char **state);

/* Resume from a state ddplug_sampler_state_save gave, on this sampler's
 * world (any world size for the distributed kind): the epoch continues
 * with the positions not committed, dealt over this world; the next
 * ddplug_sampler_set_epoch with the state's epoch keeps it (any other
 * epoch starts that epoch afresh). A context-bound sampler feeds the
 * committed part into the epoch's audit at its finish (each rank a share),
 * so the audit covers the whole epoch across the restart, and the audit's
 * line says where it resumed. Errors: INVALID_ARGUMENT (not a state, or
 * of another kind); MISMATCH naming both sides when the state's seed, N or
 * shuffle differ from this sampler's ("the checkpoint says seed 7, N =
 * 1000 ...; this run has seed 3 ...") or its digest does not match its
 * cursor; UNSUPPORTED for a bucket or plugin sampler saved on another world
 * size. On failure the sampler is unchanged. O(committed samples); does
 * not block. Since 1.1. */
DDPLUG_API int ddplug_sampler_state_load(ddplug_sampler *s, const char *state);

/* After ddplug_shrink: deal the rest of the epoch over the new world.
 * Collective over the re-formed group (every survivor calls it for the same
 * samplers in the same order). The survivors exchange their committed and
 * drawn batches; a survivor one step behind the others (its allreduce
 * completed elsewhere) has that step committed on its behalf, *adopted
 * (may be NULL) says how many (0 or 1): the host then takes the others'
 * parameters instead of redoing the step. Each survivor keeps the batches
 * it drew and did not commit; the lost ranks' uncommitted batches join the
 * replay list and are dealt first. The stream's audit counts the lost
 * ranks' committed deliveries (derived from the dealing) at its finish.
 * Errors: INVALID_ARGUMENT (NULL s, a standalone sampler, or a context
 * that was not re-formed since the sampler was made or last reformed);
 * UNSUPPORTED (bucket or plugin sampler: they cannot be re-dealt);
 * MISMATCH (survivors at different epochs); the collective's errors.
 * Blocks at most timeout_ms. Since 1.1. */
DDPLUG_API int ddplug_sampler_reform(ddplug_sampler *s, int64_t timeout_ms,
                                     uint64_t *adopted);


/* ---- split ownership ---------------------------------------------------

   Every stream has one owner (ddplug_owner, common.h): DDPLUG_OWNER_PLUGIN
   (ddplug's or the plugin's sampler splits), _FRAMEWORK (the framework's own
   injection) or _USER (the dataset/sampler is rank-aware). The config can
   force one: "data_split.streams.<name>.owner", else "data_split.owner"
   ("auto" forces nothing; a stream's own "auto" also overrides
   data_split.owner). A claimant is a short human description of who claims
   ("lightning adapter: rank-aware sampler BucketSampler"), shown in
   conflicts. Ownership state lives in the context and is thread-safe.
   ---------------------------------------------------------------------- */

/* The owner cfg forces for stream, and by which key: *owner receives
 * DDPLUG_OWNER_PLUGIN/_FRAMEWORK/_USER, or DDPLUG_OWNER_UNSET when nothing
 * is forced ("auto"); by (may be NULL) receives, in at most cap bytes with
 * the NUL, the key and the config's origin ("data_split.streams.train.owner
 * in run.json"), "" when nothing is forced. cfg NULL means the defaults
 * (nothing forced). The one rule every caller uses: the context's claims
 * and the host adapters ask it. Returns OK; INVALID_ARGUMENT (bad stream
 * name, NULL owner, cap 0 with a buffer); NO_MEMORY. On failure the
 * out-parameters are untouched. Never blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_split_forced_owner(const ddplug_config *cfg,
                                         const char *stream, int *owner,
                                         char *by, uint64_t cap);

/* Claim stream for owner on behalf of claimant. The first claim wins; the
 * same owner again is OK (the first claimant stays on record); a different
 * owner is DDPLUG_E_SPLIT_CONFLICT naming both claimants and what to change;
 * a claim that disagrees with an owner the config forces
 * (ddplug_split_forced_owner) is SPLIT_CONFLICT naming the config key.
 * INVALID_ARGUMENT for a bad stream name, an owner that is not
 * PLUGIN/FRAMEWORK/USER, or an empty claimant. Local (no communication; see
 * ddplug_split_agree); thread-safe. Since 1.0. */
DDPLUG_API int ddplug_split_claim(ddplug_context *ctx, const char *stream,
                                  int owner, const char *claimant);

/* The owner of stream now: the claimed one, else the config's forced one,
 * else DDPLUG_OWNER_UNSET. claimant (may be NULL) receives who decided, at
 * most cap bytes with the NUL ("" if unset). Returns OK or INVALID_ARGUMENT.
 * Any time, any thread. Since 1.0. */
DDPLUG_API int ddplug_split_owner(ddplug_context *ctx, const char *stream,
                                  int *owner, char *claimant, uint64_t cap);

/* Collective through the store: every rank calls it for the same stream
 * (the same number of times). OK when every rank resolved the same owner;
 * otherwise DDPLUG_E_SPLIT_CONFLICT on every rank naming the ranks that
 * differ, what each resolved and who claimed it. TIMEOUT (naming the
 * missing ranks) if some rank does not call it within timeout_ms. Blocks at
 * most timeout_ms. Since 1.0. */
DDPLUG_API int ddplug_split_agree(ddplug_context *ctx, const char *stream,
                                  int64_t timeout_ms);

/* Create a sampler bound to ctx for opts->stream. rank and world_size come
 * from the context (opts' must be 0 or equal to them, else
 * INVALID_ARGUMENT). The stream must be owned by the plugin: an unclaimed
 * stream is claimed for DDPLUG_OWNER_PLUGIN (claimant "ddplug sampler");
 * a stream owned by the framework or the user is DDPLUG_E_SPLIT_CONFLICT —
 * the plugin's sampler refuses to split what it does not own. When the
 * plugin has sampler slots (DDPLUG_CAP_SAMPLER) they serve the sampler,
 * except for exact = 1 (the slots' contract is equal lengths): ddplug's
 * defaults serve it then, and otherwise. While an audit is open on the
 * stream (ddplug_audit_begin), every index the sampler delivers is recorded
 * in it, with the padding/dropping the sampler declares (see "audit"
 * below); indices delivered before the audit began in the same epoch are
 * replayed into it. Feeding is safe against ddplug_audit_finish/_free of
 * that audit on another thread (both wait for a delivery being recorded).
 * The sampler must be freed before ctx is closed. On failure *out is
 * untouched and the ownership is as it was. Does not block; thread-safe
 * (the sampler it gives is used from one thread at a time). Since 1.0. */
DDPLUG_API int ddplug_context_sampler_new(ddplug_context *ctx,
                                          const ddplug_sampler_options *opts,
                                          ddplug_sampler **out);

/* ---- audit ---------------------------------------------------------------

   An audit checks one epoch of one stream from what every rank consumed:
   steps and samples per rank, union coverage, repeats, and a diagnosis.
   begin at the start of the epoch, record every step (the context-bound
   sampler records by itself for a plugin-owned stream; the host records for
   a user- or framework-owned one), finish at the end (collective).

   Config: "data_split.audit" off | first_epoch (default) | every_epoch;
   "data_split.on_violation" error (default: finish returns
   DDPLUG_E_AUDIT_FAILED with the diagnosis as the last error) | warn (OK
   and a warning log line); "data_split.audit_exact_max" M (>= 1024).
   first_epoch audits the first epoch begun for the stream on this context
   in full and checks the second one's order and steps only (the order
   check needs two epochs: it catches a missing set_epoch).

   Padding and dropping. A sample delivered more than once (padding) and a
   sample never delivered are violations unless declared, and padding and
   dropping are declared separately; the audit never infers them from a
   sampler's own length. Declarations:
     - the host's, in ddplug_audit_options: allowed_padding and
       allowed_missing (counts, all ranks together), local_dropped (this
       rank's drop_last remainder: a batching that drops its last partial
       batch; summed over the ranks), and ddplug_audit_declare_dropped
       (the indices left out on purpose);
     - for a plugin-owned stream the context-bound sampler's, when it first
       feeds the audit, raising (never lowering) what the host gave:
       ddplug's default samplers declare exactly what they pad or drop (the
       distributed one world·ceil(N/world) - N or N - world·floor(N/world);
       the bucket one its per-bucket padding or drop; exact = 1 nothing);
       a plugin's own sampler declares through its sampler_declared slot
       (plugin.h, plugin ABI 1.2); one without that slot (or whose slot
       fails) is taken to pad (drop_last 0) or drop (drop_last 1) only the
       remainder that equal lengths need — less than world (distributed) or
       than buckets·batch_size·world (bucket) — and anything beyond is a
       violation.
   ddplug_sampler_info shows the numbers a sampler declares.

   Evaluation streams (options.evaluation = 1; val, test and predict) run
   without lockstep and must be exact: the ranks' step counts may differ,
   and every sample is delivered exactly once — no declaration allows a
   repeat or a hole there.

   Exact mode (N <= M): one bit per sample per rank; union and intersection
   through two allreduces (BOR, BAND on int64 words, in chunks).
   Sampled mode (N > M): the audit follows a fixed pseudo-random subset of
   exactly M samples — those with pi(i) < M for a keyed permutation pi of
   [0, N) — with M bits; coverage and repeats are exact on that subset and
   scaled by N/M in the report, and the "missing" and "overlap" diagnoses
   allow for the sampling error (4 standard deviations). Steps, deliveries
   and order fingerprints are exact in both modes. When repeats or holes
   are found, a second pass over the bitmaps finds example indices (cost
   only then).

   Samples identified by id (options.by_id = 1; an iterable dataset whose
   samples carry a key): ddplug_audit_record_ids records 64-bit ids, and
   the audit checks that no id is delivered twice in the epoch, on one rank
   or across ranks, and, when num_samples > 0 (the expected count), that
   num_samples distinct ids were delivered. It is exact while every rank
   keeps at most M / world ids: the ids are exchanged in rounds of at most
   16 MiB per rank. Beyond, a rank keeps only ids whose mixed 64-bit hash
   falls in the lowest 2^-L of the range (L raised one step at a time until
   it keeps at most M / world), all ranks use the largest L, and the check
   runs on that hash-chosen subset: a repeat found there is a real repeat
   (no false alarm, up to 64-bit hash collisions), a set of d repeated ids
   goes unseen with probability (1 - 2^-L)^d, and counts are scaled by 2^L
   (the report says "sampled 1 in 2^L"). Memory: 8 bytes per kept id.

   Every collective goes through the context's collectives (any plugin);
   a plugin without int64 BOR/BAND gets counts-only audits (noted).

   Diagnoses (verdict, in priority order — the verdict is the first that
   applies; the report's violations and text list every one present, each
   with its counts and, where known, a few example indices), as the
   one-line text starts:
     "uneven batches: rank r has k steps, others m (will hang)"
                              (not for evaluation streams)
     "out of range: rank r delivered k indices outside [0, N)"
                              (indices that are no sample: any count fails;
                               checked also when coverage is not)
     "no partitioning: every rank saw the same samples"
     "double partitioning: ranks together saw N/G of N samples — the data
      was split twice (e.g. a rank-aware sampler and the framework's
      DistributedSampler)"
     "missing samples: ..."   (samples never delivered beyond the declared
                               dropping)
     "repeated samples: ..."  (deliveries beyond the declared padding; the
                               rank split is blamed only when the ranks'
                               shares overlap heavily)
     "epoch not advanced: ..." (shuffled, yet the same order as the
                                previous epoch; or the sampler's epoch is
                                behind the audited one)
   ---------------------------------------------------------------------- */
typedef struct ddplug_audit ddplug_audit;

typedef enum ddplug_audit_verdict {
  DDPLUG_AUDIT_UNSET = 0,
  DDPLUG_AUDIT_PASS = 1,
  DDPLUG_AUDIT_SKIPPED = 2,            /* config: this epoch is not audited */
  DDPLUG_AUDIT_UNEVEN = 3,
  DDPLUG_AUDIT_NO_PARTITION = 4,
  DDPLUG_AUDIT_DOUBLE_PARTITION = 5,
  DDPLUG_AUDIT_MISSING = 6,
  DDPLUG_AUDIT_OVERLAP = 7,            /* repeated samples                  */
  DDPLUG_AUDIT_EPOCH_NOT_ADVANCED = 8,
  DDPLUG_AUDIT_OUT_OF_RANGE = 9
} ddplug_audit_verdict;
#define DDPLUG_AUDIT_VERDICT_COUNT_ 10

/* What the host declares about the epoch (see "Padding and dropping"). */
typedef struct ddplug_audit_options {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t shuffle;          /* 1: the order must change between epochs   */
  int32_t evaluation;       /* 1: no lockstep, every sample exactly once  */
  uint64_t allowed_padding; /* declared padding: deliveries that repeat a
                               sample, all ranks together                */
  uint64_t allowed_missing; /* declared dropping: samples left out on
                               purpose, all ranks together                */
  uint64_t local_dropped;   /* this rank's drop_last remainder (samples its
                               batching leaves out), summed over ranks    */
  int32_t by_id;            /* 1: samples are ids (ddplug_audit_record_ids) */
  int32_t steps_only;       /* 1: indices of different ranks are not in one
                               index space: check steps (and order) only  */
} ddplug_audit_options;
#define DDPLUG_AUDIT_OPTIONS_INIT {sizeof(ddplug_audit_options), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, 0, 0}

/* The numbers of a finished audit, identical on every rank. Per-rank
 * numbers, the multi-line text and example indices come from the accessor
 * functions below (any world size). */
typedef struct ddplug_audit_report {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t verdict;            /* ddplug_audit_verdict (the first diagnosis) */
  uint32_t violations;        /* bit (1u << verdict) of every diagnosis    */
  int32_t world_size;
  int32_t exact;              /* 1 exact, 0 sampled; -1 not checked        */
  int32_t full;               /* 1 coverage checked; 0 steps/order only    */
  int32_t evaluation;         /* 1: an evaluation stream (exact coverage)  */
  uint64_t epoch;
  uint64_t num_samples;       /* N (by id: expected ids, 0 if unknown)     */
  uint64_t tracked;           /* samples followed (N exact, M sampled)     */
  uint64_t covered;           /* distinct samples seen by some rank (est.)  */
  uint64_t common;            /* seen by every rank (est.)                 */
  uint64_t deliveries;        /* samples delivered, all ranks              */
  uint64_t repeats;           /* deliveries - covered (padding included)   */
  uint64_t allowed_padding;   /* declared, all ranks together              */
  uint64_t allowed_missing;   /* declared (counts, drop_last remainders and
                                 declared indices not delivered)           */
  uint64_t out_of_range;      /* indices outside [0, N), all ranks         */
  uint64_t steps_min, steps_max;
  int32_t steps_min_rank, steps_max_rank;
  uint64_t samples_min, samples_max;
  int32_t samples_min_rank, samples_max_rank;
  uint64_t missing;           /* samples never delivered, beyond declared  */
  uint64_t cross_repeats;     /* repeats of samples another rank delivered */
  char stream[64];
  char summary[512];          /* one line: "audit of stream 'train' epoch 0:
                                 PASS ..." (cut at 511 bytes)             */
} ddplug_audit_report;
#define DDPLUG_AUDIT_REPORT_INIT \
  {.struct_size = sizeof(ddplug_audit_report), .abi_version = DDPLUG_ABI_VERSION}

/* Open the audit of epoch `epoch` of stream (num_samples = N; by id: the
 * expected number of distinct ids, 0 if unknown). Always gives a handle
 * (free it with ddplug_audit_free), also when the config says not to audit
 * this epoch: then record counts steps only and finish reports
 * DDPLUG_AUDIT_SKIPPED without communicating. opts may be NULL (no shuffle,
 * nothing declared, a training stream of indices). One audit per stream at
 * a time: INVALID_ARGUMENT if one is open. Also INVALID_ARGUMENT for a bad
 * stream name or NULL arguments, NO_MEMORY (the bitmap: lower
 * data_split.audit_exact_max). On failure *out is untouched. Local; does
 * not block; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_audit_begin(ddplug_context *ctx, const char *stream,
                                  uint64_t num_samples, uint64_t epoch,
                                  const ddplug_audit_options *opts,
                                  ddplug_audit **out);

/* Record one step that consumed indices[0..n) (n may be 0: a step without
 * samples). INVALID_ARGUMENT for a plugin-owned stream whose context-bound
 * sampler records already (it would count twice), for an audit by id, or
 * a finished one. Local; O(n); one thread at a time per audit. Since 1.0. */
DDPLUG_API int ddplug_audit_record(ddplug_audit *a, const int64_t *indices,
                                   uint64_t n);

/* Record one step that consumed the samples with ids[0..n) (an audit begun
 * with options.by_id = 1; equal ids are the same sample; a host hashes
 * non-integer keys to 64 bits the same way on every rank).
 * INVALID_ARGUMENT for an audit of indices or a finished one; NO_MEMORY
 * (nothing recorded). Local; amortised O(n); one thread at a time per
 * audit. Since 1.0. */
DDPLUG_API int ddplug_audit_record_ids(ddplug_audit *a, const uint64_t *ids,
                                       uint64_t n);

/* Declare indices[0..n) left out of the epoch on purpose (e.g. the samples
 * a bucket sampler's length bounds exclude): they may go undelivered. Call
 * it any time before finish, with the same set on every rank (finish
 * fails with MISMATCH otherwise); repeated calls add to the set. An index
 * outside [0, N) is INVALID_ARGUMENT (nothing declared). Not for audits by
 * id or evaluation streams (INVALID_ARGUMENT). NO_MEMORY (nothing
 * declared). Local; O(n); one thread at a time per audit. Since 1.0. */
DDPLUG_API int ddplug_audit_declare_dropped(ddplug_audit *a,
                                            const int64_t *indices,
                                            uint64_t n);

/* Collective: every rank that began the audit finishes it. Fills *report
 * (honouring its struct_size) on every rank with the same content. Returns
 * OK for PASS and SKIPPED, and for a violation with on_violation = warn
 * (a warning is logged); DDPLUG_E_AUDIT_FAILED for a violation with
 * on_violation = error (the last error is the summary line);
 * DDPLUG_E_MISMATCH if ranks audit different streams, epochs, N, kinds or
 * declared index sets (naming the ranks and their values);
 * TIMEOUT/PEER_LOST/ABORTED from the collectives (a timeout aborts the
 * context); INVALID_ARGUMENT (NULL, a report smaller than up to its
 * missing field, finished twice). The audit keeps what the report and the
 * accessors below give until ddplug_audit_free; on failure the report is
 * untouched except for a violation (its numbers are filled). Waits at most
 * timeout_ms per collective; the thread that issues the context's
 * collectives calls it. Since 1.0. */
DDPLUG_API int ddplug_audit_finish(ddplug_audit *a,
                                   ddplug_audit_report *report,
                                   int64_t timeout_ms);

/* Steps and samples rank `rank` recorded in a finished audit (the same on
 * every rank). INVALID_ARGUMENT: NULL a, not finished, rank outside
 * [0, world), or the audit was SKIPPED (only this rank's are known: other
 * ranks give INVALID_ARGUMENT). steps or samples may be NULL. Never blocks;
 * any thread once finish returned. Since 1.0. */
DDPLUG_API int ddplug_audit_rank_counts(const ddplug_audit *a, int32_t rank,
                                        uint64_t *steps, uint64_t *samples);

/* The multi-line text of a finished audit, for logs: the numbers, every
 * rank's steps and samples, and one "diagnosis:" line per violation.
 * Owned by a, valid until ddplug_audit_free; "" before finish and for NULL.
 * Never blocks; any thread once finish returned. Since 1.0. */
DDPLUG_API const char *ddplug_audit_text(const ddplug_audit *a);

/* Up to cap example indices (by id: ids) behind the violation `verdict`
 * of a finished audit: DDPLUG_AUDIT_MISSING (never delivered, exact mode
 * only) or DDPLUG_AUDIT_OVERLAP (delivered more than once), smallest
 * first, at most 8. *n = how many (0 when none are known, or before
 * finish). INVALID_ARGUMENT for another verdict, NULL a or n, or out NULL
 * with cap > 0. Never blocks; any thread once finish returned. Since 1.0. */
DDPLUG_API int ddplug_audit_examples(const ddplug_audit *a, int verdict,
                                     int64_t *out, uint64_t cap,
                                     uint64_t *n);

/* Release a (finished or not). NULL is a no-op. Since 1.0. */
DDPLUG_API void ddplug_audit_free(ddplug_audit *a);

/* Static name of a verdict ("DOUBLE_PARTITION"), or "UNKNOWN". Since 1.0. */
DDPLUG_API const char *ddplug_audit_verdict_name(int verdict);

/* ========================================================================
 * Run once — work (a download, a preprocessing pass) that exactly one
 * process per scope performs while the others of the scope wait for its
 * outcome through the rendezvous store. No collective barrier: waiters
 * block on a store key, so ranks may arrive minutes apart (slow shared file
 * systems). The runner heartbeats through the store while it works (a
 * thread of the runner process, every 0.5 s): waiters wait as long as it
 * lives (config "timeouts.run_once_s", default 0 = no limit), and stop at
 * once when it dies (its store connection drops) or records a failure, or
 * within 5 s of its last heartbeat when it hangs or loses the network
 * without its connection closing.
 *
 * A run-once is named; the name identifies the work within the run. A name
 * whose outcome is already recorded returns it at once, to every process
 * of the scope, runner included (the work runs once per run). Names are 1 to
 * 160 printable ASCII characters without spaces.
 *
 * Scopes: DDPLUG_SCOPE_GLOBAL — one process in the run, rank 0.
 *         DDPLUG_SCOPE_NODE   — one process per node, its local rank 0
 *                               (nodes as the host-identity exchange found).
 * ======================================================================== */
typedef enum ddplug_scope {
  DDPLUG_SCOPE_UNSET = 0,
  DDPLUG_SCOPE_GLOBAL = 1,
  DDPLUG_SCOPE_NODE = 2
} ddplug_scope;

/* Start run-once `name` in `scope`. Every process of the scope calls it.
 *  - The runner whose outcome is not yet recorded gets *runner = 1 and OK
 *    at once, and starts heartbeating; it must do the work and then call
 *    ddplug_run_once_end (if it dies first, the others get PEER_LOST;
 *    ddplug_close stops the heartbeat of one never ended).
 *  - Every other process gets *runner = 0 and blocks until the outcome is
 *    recorded (at most timeout_ms; DDPLUG_TIMEOUT_DEFAULT = config
 *    "timeouts.run_once_s", 0 there meaning as long as the runner
 *    heartbeats), then returns it: OK when the work succeeded,
 *    else the status the runner ended with. *message (may be NULL; released
 *    with ddplug_free; "" when there is none) receives the runner's message:
 *    on success what it passed to ddplug_run_once_end (e.g. a serialized
 *    result), on failure its failure text (e.g. an exception and traceback).
 *    The last error then names the runner's rank and the run-once. The
 *    runner's *message stays NULL.
 * Errors: INVALID_ARGUMENT (NULL ctx/runner, bad name or scope), TIMEOUT
 * (naming the runner's rank and what set the limit — the config key or the
 * argument; the outcome may still come), PEER_LOST (the runner
 * disconnected, or stopped heartbeating, without an outcome), ABORTED (the
 * run was aborted; but a waiter whose runner's outcome is already on
 * record gets that outcome, whether it was waiting or arrives after the
 * run ended: the runner's failure is the cause), the runner's status,
 * SYSTEM (the runner could not start its heartbeat thread), or a store
 * failure. On failure *runner is 0. Blocks (waiters only). Thread-safe.
 * Since 1.0. */
DDPLUG_API int ddplug_run_once_begin(ddplug_context *ctx, const char *name,
                                     int scope, int64_t timeout_ms,
                                     int *runner, char **message);

/* Record the runner's outcome of run-once `name`: status OK for success,
 * any other DDPLUG_E_* for a failure; message (may be NULL: "") is handed to
 * every waiter (at most 512 KiB; a longer one is cut and says so). Only the
 * process that got *runner = 1 calls it, once. Errors: INVALID_ARGUMENT
 * (not the runner of an open run-once of that name and scope), or a store
 * failure. Does not block on other ranks. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_run_once_end(ddplug_context *ctx, const char *name,
                                   int scope, int status,
                                   const char *message);

/* The work of ddplug_run_once: returns OK or a DDPLUG_E_* status; may set
 * *message to a string allocated with malloc (the runtime frees it) that is
 * handed to the waiters (a result on success, the reason on failure). */
typedef int (*ddplug_run_once_fn)(void *user, char **message);

/* begin + fn on the runner + end, in one call. Returns what begin returns
 * to a waiter (OK or the runner's status); on the runner, fn's status. The
 * message as in begin (the runner gets its own). Since 1.0. */
DDPLUG_API int ddplug_run_once(ddplug_context *ctx, const char *name,
                               int scope, ddplug_run_once_fn fn, void *user,
                               int64_t timeout_ms, char **message);

#ifdef __cplusplus
}
#endif
#endif /* DDPLUG_DDPLUG_H */
