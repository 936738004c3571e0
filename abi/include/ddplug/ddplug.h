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
 *             waits longer than it.
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

/* Host API ABI version (independent of the plugin ABI version). */
#define DDPLUG_ABI_MAJOR 1
#define DDPLUG_ABI_MINOR 0
#define DDPLUG_ABI_VERSION DDPLUG_MAKE_VERSION(DDPLUG_ABI_MAJOR, DDPLUG_ABI_MINOR)

/* ========================================================================
 * Library, errors, memory
 * ======================================================================== */

/* The library's release version string, e.g. "0.1.0". Static. Since 1.0. */
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
 * Configuration — strict JSON (see README "Configuration" and
 * abi/schema/ddplug-config.schema.json). Unknown keys (with a "did you mean"
 * suggestion), duplicate keys, wrong types and out-of-range values are
 * DDPLUG_E_CONFIG with the key path; syntax errors carry FILE:LINE:COLUMN.
 * A config handle is immutable and may be shared between threads.
 * ======================================================================== */
typedef struct ddplug_config ddplug_config;

/* Parse the file at path. On success *out is a new config; on failure *out
 * is untouched and ddplug_last_error() reads "path:line:col: message" or
 * "path: key.path: message". Since 1.0. */
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

/* ========================================================================
 * World discovery — who am I, how many are we, where is the rendezvous.
 * Order: explicit config "world" > torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) > Lightning's
 * launcher (LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) >
 * SLURM (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID,
 * SLURM_LAUNCH_NODE_IPADDR) > a single process.
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
  char source[16];          /* "config", "torchrun", "lightning", "slurm",
                               "single"                                    */
} ddplug_world;
#define DDPLUG_WORLD_INIT {sizeof(ddplug_world), DDPLUG_ABI_VERSION, 0, 0, 0, 0, 0, 0, {0}, {0}}

/* Discover the world from cfg (may be NULL) and the process environment.
 * Inconsistent input — rank >= world size, a negative or non-numeric value,
 * no rendezvous address for a world larger than one — is DDPLUG_E_CONFIG
 * naming the variables. Reads only; never blocks. Since 1.0. */
DDPLUG_API int ddplug_world_discover(const ddplug_config *cfg,
                                     ddplug_world *out);

/* ========================================================================
 * Rendezvous store — a small TCP key-value store served by rank 0 (or an
 * external address). Values are bytes (at most 1 MiB), keys at most 255
 * bytes. Every blocking call has a timeout. Optional shared secret: a client
 * that cannot prove it knows the secret is refused. A store client handle
 * is thread-safe (calls are serialized on its connection).
 * ======================================================================== */
typedef struct ddplug_store ddplug_store;
typedef struct ddplug_store_server ddplug_store_server;

/* Start a server on addr:port in a background thread (port 0 picks a free
 * port; see ddplug_store_server_port). secret may be NULL. Since 1.0. */
DDPLUG_API int ddplug_store_serve(const char *addr, int port,
                                  const char *secret,
                                  ddplug_store_server **out);
DDPLUG_API int ddplug_store_server_port(const ddplug_store_server *srv);
/* Stop serving, close every connection, free srv. */
DDPLUG_API void ddplug_store_server_stop(ddplug_store_server *srv);

/* Connect, retrying until timeout_ms while the server is not up yet.
 * Since 1.0. */
DDPLUG_API int ddplug_store_connect(const char *addr, int port,
                                    const char *secret, int64_t timeout_ms,
                                    ddplug_store **out);
/* Close the connection cleanly and free st. */
DDPLUG_API void ddplug_store_close(ddplug_store *st);

DDPLUG_API int ddplug_store_set(ddplug_store *st, const char *key,
                                const void *value, uint64_t len);
/* Wait (at most timeout_ms) until key exists; *value (released with
 * ddplug_free; NUL-terminated for convenience, not counted in *len) and
 * *len receive its value. */
DDPLUG_API int ddplug_store_get(ddplug_store *st, const char *key,
                                int64_t timeout_ms, void **value,
                                uint64_t *len);
/* Atomically add delta to the decimal integer at key (missing = 0); the
 * new value goes to *result (may be NULL). */
DDPLUG_API int ddplug_store_add(ddplug_store *st, const char *key,
                                int64_t delta, int64_t *result);
/* Atomically: if key's value equals expected (expected == NULL with
 * elen == 0 means "key absent"), set it to desired. *swapped = 1 if it did.
 * *actual (may be NULL; released with ddplug_free) receives the value after
 * the operation. */
DDPLUG_API int ddplug_store_compare_set(ddplug_store *st, const char *key,
                                        const void *expected, uint64_t elen,
                                        const void *desired, uint64_t dlen,
                                        int *swapped, void **actual,
                                        uint64_t *alen);
/* Remove key. *existed (may be NULL) tells whether it was there. */
DDPLUG_API int ddplug_store_delete(ddplug_store *st, const char *key,
                                   int *existed);
/* Wait until every key exists, at most timeout_ms. On DDPLUG_E_TIMEOUT the
 * last-error names the keys still missing. */
DDPLUG_API int ddplug_store_wait(ddplug_store *st, const char *const *keys,
                                 uint32_t nkeys, int64_t timeout_ms);
/* Ask the server to set key to value (if absent) when this connection
 * drops without ddplug_store_close — how peers learn that a process died.
 * Since 1.0. */
DDPLUG_API int ddplug_store_on_disconnect(ddplug_store *st, const char *key,
                                          const void *value, uint64_t len);
/* Detail of the last failure on st (thread-safe copy semantics: valid until
 * the next failing call on st). */
DDPLUG_API const char *ddplug_store_error(const ddplug_store *st);

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

/* Load the plugin named name_or_path (a name "host" is looked up as
 * libddplug-host.so in each directory of DDPLUG_PLUGIN_PATH, then the
 * installed plugin directory, then beside libddplug.so; anything containing
 * '/' is a path), check its ABI, fill *info, and unload it.
 * Errors: NOT_FOUND (last-error lists every path searched), ABI_MISMATCH
 * (no entry symbol: "not a ddplug plugin"; major too new or too old; table
 * too small), INVALID_ARGUMENT (a mandatory slot is NULL: named).
 * Since 1.0. */
DDPLUG_API int ddplug_plugin_inspect(const char *name_or_path,
                                     ddplug_plugin_info *info);

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
} ddplug_open_options;
#define DDPLUG_OPEN_OPTIONS_INIT {sizeof(ddplug_open_options), DDPLUG_ABI_VERSION, NULL, NULL, NULL, 0}

/* Join the run. Collective: every rank of the world calls it.
 *  1. discovers the world (ddplug_world_discover);
 *  2. rank 0 serves the rendezvous store (unless config names an external
 *     one), every rank connects;
 *  3. every rank registers; rank 0 waits at most the rendezvous timeout and,
 *     if ranks are missing, fails on every rank naming them ("ranks 2, 3
 *     never joined after 30.0 s: started 2 of 4 processes?");
 *  4. startup checks: world size agreed, ranks unique, config identical
 *     (hash), the same plugin name and version everywhere — a mismatch fails
 *     on every rank naming the ranks that differ;
 *  5. host identities are exchanged to learn which ranks share a node;
 *  6. the plugin is loaded and its group created.
 * On success *out is the context. On failure *out is untouched, everything
 * is released, and ddplug_last_error() says what happened on which rank.
 * cfg may be NULL (ddplug_config_load_env is used); cfg is copied.
 * Blocks at most the rendezvous timeout. Since 1.0. */
DDPLUG_API int ddplug_open(const ddplug_config *cfg,
                           const ddplug_open_options *opts,
                           ddplug_context **out);

/* Leave the run: waits (at most the collective timeout) for the other
 * ranks to close too, destroys the plugin group, disconnects, frees ctx.
 * Always frees ctx, also when the close barrier fails (the status says so).
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
/* Number of nodes (distinct host ids). */
DDPLUG_API int ddplug_context_num_nodes(const ddplug_context *ctx);
/* The loaded plugin. */
DDPLUG_API int ddplug_context_plugin(const ddplug_context *ctx,
                                     ddplug_plugin_info *info);
/* The context's config (borrowed, lives as long as ctx). */
DDPLUG_API const ddplug_config *ddplug_context_config(const ddplug_context *ctx);
/* The context's store client (borrowed). Keys under "user/" are reserved
 * for the host; the runtime and plugins use other prefixes. */
DDPLUG_API ddplug_store *ddplug_context_store(ddplug_context *ctx);

/* ========================================================================
 * Collectives. Every rank must issue the same collectives in the same
 * order; a plugin with DDPLUG_CAP_MISMATCH_CHECK reports DDPLUG_E_MISMATCH
 * instead of producing garbage when they differ. The blocking forms wait
 * the configured collective timeout; if it expires or a peer is lost, the
 * context is aborted (later calls return ABORTED naming the cause).
 * stream: an opaque device stream for device plugins (e.g. cudaStream_t),
 * NULL otherwise. A ctx is not thread-safe for collectives: issue them from
 * one thread (ddplug_abort and ddplug_context_error excepted).
 * ======================================================================== */

/* recv[i] = op over ranks of send[i]; send == recv is in-place. */
DDPLUG_API int ddplug_allreduce(ddplug_context *ctx, const void *send,
                                void *recv, uint64_t count, int dtype, int op,
                                void *stream);
/* root's send → every rank's recv. */
DDPLUG_API int ddplug_broadcast(ddplug_context *ctx, const void *send,
                                void *recv, uint64_t count, int dtype,
                                int root, void *stream);
/* recv[r*count .. (r+1)*count) = rank r's send. */
DDPLUG_API int ddplug_allgather(ddplug_context *ctx, const void *send,
                                void *recv, uint64_t count, int dtype,
                                void *stream);
DDPLUG_API int ddplug_barrier(ddplug_context *ctx, int64_t timeout_ms);

/* Asynchronous forms: start and return a request in *req (buffers must
 * stay valid until it completes). Collectives on one context complete in
 * the order they were started. */
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

/* Wait at most timeout_ms: OK when done; TIMEOUT if not yet (req stays
 * pending; the last-error names its sequence number and, where the plugin
 * knows, the ranks that had not arrived); otherwise the failure, final. */
DDPLUG_API int ddplug_wait(ddplug_request *req, int64_t timeout_ms);
/* Never blocks: *done = 1 when complete. */
DDPLUG_API int ddplug_test(ddplug_request *req, int *done);
/* The request's sequence number on its context (1, 2, ...). */
DDPLUG_API uint64_t ddplug_request_seq(const ddplug_request *req);
/* Release req. Freeing a pending request aborts the context (the
 * collective cannot be completed safely); NULL is a no-op. */
DDPLUG_API void ddplug_request_free(ddplug_request *req);

/* ========================================================================
 * Data split ownership, samplers, audit — see issue "Data-split ownership".
 * (declared in the section below by that work)
 * ======================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* DDPLUG_DDPLUG_H */
