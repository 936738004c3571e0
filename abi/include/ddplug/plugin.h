/*
 * ddplug/plugin.h — the plugin ABI: what a backend implements and exports.
 *
 * A plugin is a shared object named libddplug-<name>.so that exports exactly
 * one symbol, ddplug_plugin_entry_v<MAJOR> (today: ddplug_plugin_entry_v1),
 * returning a pointer to a const ddplug_plugin table that lives as long as
 * the shared object is loaded. Everything else in the plugin should be hidden
 * (-fvisibility=hidden). A plugin includes only this header (and common.h);
 * it never calls libddplug's functions: what it needs from the runtime —
 * the rendezvous store, logging, the clock, error reporting — comes in the
 * ddplug_host_services table handed to group_create.
 *
 * Building, naming, loading and checking a plugin (docs/writing-a-backend.md
 * walks through all of it):
 *   - Build: find_package(ddplug CONFIG REQUIRED), then
 *       ddplug_add_plugin(<name> SOURCES <src>... [INCLUDE_DIRS <dir>...]
 *                         [DESTINATION <dir>] [NO_INSTALL])
 *     makes the MODULE libddplug-<name>.so (target ddplug-<name>) with
 *     hidden visibility and a version script exporting only the entry
 *     point. Install rule: <libdir>/ddplug under your install prefix, or
 *     DESTINATION (${ddplug_PLUGIN_DIR}: beside ddplug's own plugins, where
 *     that install's libddplug finds it by name).
 *   - Name: the table's name is the <name> of the file libddplug-<name>.so.
 *     The runtime finds a plugin by its file name but keys its store
 *     namespace, logs and startup checks by the table's name; when the two
 *     differ it logs a warning, and `ddplug conformance` fails the plugin.
 *   - Loading: a name is searched in DDPLUG_PLUGIN_PATH, then <dir>/ddplug
 *     (<dir>: where libddplug itself is), the configured install prefix's
 *     plugin directory, then <dir>. A config "plugin" containing '/' is
 *     a path, loaded as is: a relative path resolves against the working
 *     directory of the process, and the error when it does not exist names
 *     that directory.
 *   - Check: `ddplug info PATH` (loads it, shows the table), then
 *     `ddplug conformance PATH [-n RANKS]` (runs every check this header's
 *     contracts imply on real processes; non-zero exit on any failure).
 *
 * Versioning (the SQLite / NCCL pattern):
 *   - Every table and struct starts {uint32_t struct_size; uint32_t
 *     abi_version;}. Fields and slots are only ever appended within a major
 *     version; a comment marks where each minor version ends.
 *   - The runtime copies min(struct_size, sizeof) bytes of a plugin's table
 *     into its own latest struct and treats the slots the plugin did not know
 *     as NULL (or the documented default). A plugin built against ABI 1.0 is
 *     loaded by a 1.1 runtime unchanged.
 *   - A plugin reading a host-provided struct (ddplug_group_init,
 *     ddplug_host_services, ddplug_coll_args, ddplug_sampler_desc) must check
 *     struct_size before touching a field added after the minor version it
 *     was built against; DDPLUG_HAS_FIELD() does that.
 *
 * Blocking contract: group_create and group_destroy may block (with the
 * timeout in ddplug_group_init); collective start slots must not wait for
 * peers beyond enqueueing the operation when DDPLUG_CAP_ASYNC is set;
 * request_wait blocks at most its timeout; request_test never blocks.
 *
 * Options: a plugin built against ABI >= 1.3 declares its plugin_options in
 * its table (ddplug_plugin.options); the runtime then checks the user's
 * plugin_options against the declarations before group_create (unknown
 * keys with "did you mean", types, ranges, choices: DDPLUG_E_CONFIG naming
 * plugin_options.<key>), fills in the declared defaults, and hands the
 * values over typed through the host services (option_int, ...). Checks
 * only the plugin can make (an address that must parse, a power of two)
 * stay in group_create. A plugin without declarations gets the raw JSON in
 * ddplug_group_init.options_json and checks it itself.
 *
 * Progress (DDPLUG_CAP_ASYNC): once collective_start has returned, the
 * operation must progress without further calls into the plugin — a host
 * starts gradient allreduces while backward runs and waits for them later,
 * or blocks meanwhile in a store-based runtime call (split agreement, the
 * audit) while the other ranks wait for this rank's data. Use a progress
 * thread (the cpu plugin) or hardware queues that run by themselves (NCCL
 * on CUDA streams); request_wait and request_test may also drive progress
 * but must not be the only thing that does. Without DDPLUG_CAP_ASYNC,
 * collective_start may complete the whole operation before it returns, and
 * request_wait/request_test only report how it ended.
 *
 * Waiting for peers, in group_create above all: when one rank fails (its
 * group_create returns an error, the process dies) or the run is aborted,
 * the runtime ends the run on every rank — but it can only end waits it
 * sees. The waiting store calls of the host services (store_get and
 * store_wait with a timeout > 0) return early, with DDPLUG_E_ABORTED or
 * DDPLUG_E_PEER_LOST and the run's sentence, as soon as that happens. So
 * wait for peers through the store: store_set "this rank is here" (or its
 * address), then store_wait / store_get the others' keys, and only then
 * use your own sockets or shared memory, whose peers are ready by then. A
 * plugin that must wait on its own descriptors waits in slices (~100 ms)
 * and, between slices, calls store_wait with timeout 0 on a key nobody
 * sets: it returns DDPLUG_E_TIMEOUT while the run is healthy and the
 * failure status once it is not (a store_get with timeout 0 only polls its
 * key). A plugin that waits any other way keeps every other rank waiting
 * out its whole timeout when one rank fails; `ddplug conformance` checks
 * this ("a rank whose group_create fails ends the others' ddplug_open
 * promptly").
 *
 * Threading: the runtime calls the slots of one group from one thread at a
 * time, except group_abort, which may be called from any thread at any time
 * (the runtime's failure watcher calls it) and must make blocked calls on
 * other threads return DDPLUG_E_ABORTED or DDPLUG_E_PEER_LOST promptly.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_PLUGIN_H
#define DDPLUG_PLUGIN_H

#include "ddplug/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDPLUG_PLUGIN_ABI_MAJOR 1
#define DDPLUG_PLUGIN_ABI_MINOR 4
#define DDPLUG_PLUGIN_ABI_VERSION \
  DDPLUG_MAKE_VERSION(DDPLUG_PLUGIN_ABI_MAJOR, DDPLUG_PLUGIN_ABI_MINOR)

/* True when a versioned struct pointed to by p is large enough to hold
 * field f (so the writer knew about it). */
#define DDPLUG_HAS_FIELD(p, type, f) \
  ((p)->struct_size >= offsetof(type, f) + sizeof(((type *)0)->f))

/* Opaque plugin-owned objects. The plugin defines these structs. */
typedef struct ddplug_plugin_group ddplug_plugin_group;
typedef struct ddplug_plugin_request ddplug_plugin_request;
typedef struct ddplug_plugin_sampler ddplug_plugin_sampler;

/* ------------------------------------------------------------------------ */
/* Host services: what the runtime lends a plugin. All function pointers are
 * non-NULL in a table the runtime hands out. Keys are plain C strings; the
 * runtime prefixes them with a per-run, per-plugin namespace
 * ("p/<run id: 16 hex digits>/<the table's name>/"), so a plugin may use
 * short names ("addr/3", "ncclid"), never sees another plugin's or another
 * run's keys, and key plus prefix must fit in 255 bytes (a longer one is
 * INVALID_ARGUMENT naming the prefix): keep keys under 200 bytes.
 * Values are at most 1 MiB. Store calls are thread-safe. Every store call
 * returns a status; on failure it has stored the detail with set_error.
 * Waiting calls (store_get, store_wait with timeout_ms > 0; a negative
 * timeout means the collective timeout) return early when the run fails:
 * see "Waiting for peers" above.                                          */
typedef struct ddplug_host_services {
  uint32_t struct_size;
  uint32_t abi_version;
  void *host; /* first argument of every call below */

  /* Set key to value (copied). */
  int (*store_set)(void *host, const char *key, const void *value,
                   uint64_t len);
  /* Wait until key exists (at most timeout_ms) and copy up to cap bytes of
   * its value into buf; *len receives the full length (which may exceed cap:
   * then DDPLUG_E_INVALID_ARGUMENT and nothing is copied). */
  int (*store_get)(void *host, const char *key, void *buf, uint64_t cap,
                   uint64_t *len, int64_t timeout_ms);
  /* Atomically add delta to the integer stored at key (missing = 0) and
   * return the new value in *result (may be NULL). */
  int (*store_add)(void *host, const char *key, int64_t delta,
                   int64_t *result);
  /* Wait until every one of keys[0..nkeys) exists, at most timeout_ms. */
  int (*store_wait)(void *host, const char *const *keys, uint32_t nkeys,
                    int64_t timeout_ms);
  /* Remove key; a missing key is not an error. A deletion wakes nobody: a
   * store_get or store_wait parked on the key keeps waiting (until the key
   * is set again or its timeout), so delete a key only when no rank can
   * still wait for it — after a store_add counter says every rank has read
   * it, as examples/custom-backend does. */
  int (*store_delete)(void *host, const char *key);

  /* Emit one log line at level (DDPLUG_LOG_*); the runtime adds the rank
   * and the plugin's name. message need not end in a newline. */
  void (*log)(void *host, int32_t level, const char *message);
  /* Monotonic clock in nanoseconds. */
  uint64_t (*clock_ns)(void *host);
  /* Record the human sentence explaining the status the plugin is about to
   * return (which rank, which sequence number, what to do). The runtime
   * shows it as the last-error text. Thread-safe. */
  void (*set_error)(void *host, int32_t status, const char *message);
  /* ---- end of ABI 1.0 ---- */

  /* (ABI 1.3) The value of a declared option (ddplug_plugin.options): as
   * the user's plugin_options gave it, else its declared default, already
   * checked against the declaration. Each returns DDPLUG_E_NOT_FOUND when
   * the option is neither given nor defaulted, or not declared;
   * DDPLUG_E_INVALID_ARGUMENT when name is declared with another type (or
   * a buffer is too small: nothing is copied, *len / *count tell the size
   * needed). Never block; callable from any thread while the group lives.
   * Read the slots with DDPLUG_HAS_FIELD: a 1.2 runtime has none. */
  int (*option_bool)(void *host, const char *name, int32_t *out);
  int (*option_int)(void *host, const char *name, int64_t *out);
  int (*option_number)(void *host, const char *name, double *out);
  /* Copies the text and its terminating NUL into buf[cap]; *len = its
   * length without the NUL. */
  int (*option_string)(void *host, const char *name, char *buf, uint64_t cap,
                       uint64_t *len);
  /* Copies the items into out[cap]; *count = how many there are. */
  int (*option_int_list)(void *host, const char *name, int64_t *out,
                         uint64_t cap, uint64_t *count);
  /* ---- end of ABI 1.3 ---- */
} ddplug_host_services;

/* ------------------------------------------------------------------------ */
/* What the runtime knows about this rank and the world when it creates the
 * plugin's group. Arrays have world_size entries and stay valid until
 * group_destroy returns. Locality (node_of_rank) was discovered by exchanging
 * host identity through the store, never from environment counts.         */
typedef struct ddplug_group_init {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;       /* index of this rank among ranks on its node */
  int32_t local_world_size; /* ranks on this node                         */
  int32_t node_rank;        /* index of this node, 0..num_nodes-1          */
  int32_t num_nodes;
  const int32_t *node_of_rank;  /* node index of every rank               */
  const int32_t *local_rank_of; /* local rank of every rank               */
  const int64_t *pid_of_rank;   /* process id of every rank (on its node) */
  const char *host_id;      /* this node's identity string                */
  const char *run_id;       /* same on every rank of this run; [A-Za-z0-9_]
                               only, at most 32 chars: safe in shm names   */
  const char *options_json; /* config "plugin_options" as JSON text ("{}") */
  int64_t timeout_ms;       /* default collective timeout (config)         */
  int32_t log_level;        /* threshold; log() filters anyway             */
  int32_t reserved0;
  /* ---- end of ABI 1.0 ---- */
  /* Config checks.duplicate_gpu: what a device plugin does when two ranks
   * of a host are bound to the same device. 0 (unset, or a 1.0 runtime):
   * DDPLUG_CHECK_ERROR. Read with DDPLUG_HAS_FIELD. */
  int32_t duplicate_gpu;
  int32_t reserved1;
  /* ---- end of ABI 1.1 ---- */
} ddplug_group_init;

/* Values of ddplug_group_init.duplicate_gpu. */
#define DDPLUG_CHECK_ERROR 1 /* refuse, naming the ranks and the device */
#define DDPLUG_CHECK_WARN 2  /* allow, with a warning                   */
#define DDPLUG_CHECK_ALLOW 3 /* allow silently                          */

/* ------------------------------------------------------------------------ */
/* One collective call. The runtime validates arguments (non-NULL buffers
 * where count > 0, dtype/op in the plugin's masks, root in range) before the
 * plugin sees them, and assigns seq: the n-th collective on a group has
 * seq = n on every rank, so a plugin can detect mismatches by comparing
 * (seq, kind, count, dtype, op, root) across ranks.
 *   allreduce: send and recv hold count elements; send == recv is in-place.
 *   broadcast: root's send is copied to every rank's recv (count elements);
 *              send == recv allowed; non-root ranks' send is ignored.
 *   allgather: send holds count elements; recv holds count * world_size,
 *              rank r's block at offset r * count; send may equal
 *              recv + rank * count (in-place).
 *   barrier:   count == 0, buffers NULL.                                   */
typedef enum ddplug_coll_kind {
  DDPLUG_COLL_UNSET = 0,
  DDPLUG_COLL_ALLREDUCE = 1,
  DDPLUG_COLL_BROADCAST = 2,
  DDPLUG_COLL_ALLGATHER = 3,
  DDPLUG_COLL_BARRIER = 4
} ddplug_coll_kind;

typedef struct ddplug_coll_args {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t kind;       /* ddplug_coll_kind                              */
  int32_t dtype;      /* ddplug_dtype (barrier: 0)                     */
  int32_t op;         /* ddplug_op (allreduce only, else 0)            */
  int32_t root;       /* broadcast only, else 0                        */
  const void *send;
  void *recv;
  uint64_t count;     /* elements per rank                             */
  uint64_t seq;       /* 1, 2, 3, ... per group, identical across ranks */
  void *stream;       /* device plugins: e.g. a cudaStream_t; else NULL */
  int32_t mem;        /* ddplug_mem                                    */
  int32_t reserved0;
  /* ---- end of ABI 1.0 ---- */
} ddplug_coll_args;

/* ------------------------------------------------------------------------ */
/* Sampler description (optional sampler slots, ABI 1.1), built by the
 * runtime from the host's ddplug_sampler_options (ddplug.h). A sampler
 * yields this rank's share of one epoch of a data stream as dataset
 * indices; the slots serve training streams (equal lengths on every rank):
 * exact evaluation streams are always served by ddplug's own sampler.
 *   kind DDPLUG_SAMPLER_DISTRIBUTED: an index sampler; next() fills up to cap
 *     indices.
 *   kind DDPLUG_SAMPLER_BUCKET: a batch sampler over per-sample lengths;
 *     next() returns exactly one batch per call (n == 0 at the end).        */
typedef enum ddplug_sampler_kind {
  DDPLUG_SAMPLER_UNSET = 0,
  DDPLUG_SAMPLER_DISTRIBUTED = 1,
  DDPLUG_SAMPLER_BUCKET = 2
} ddplug_sampler_kind;

typedef struct ddplug_sampler_desc {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t kind;            /* ddplug_sampler_kind                          */
  int32_t rank;            /* the share to produce: rank of world_size     */
  int32_t world_size;
  int32_t shuffle;         /* 0/1                                          */
  int32_t drop_last;       /* 0: pad by repetition to equal length; 1: drop */
  int32_t reserved0;
  uint64_t seed;
  uint64_t num_samples;    /* N: indices are in [0, N)                     */
  const char *stream;      /* "train", "val", ...                          */
  /* bucket sampler only */
  const int64_t *lengths;     /* [num_samples] per-sample lengths           */
  const int64_t *boundaries;  /* ascending bucket upper bounds, or NULL     */
  uint32_t num_boundaries;
  uint32_t num_buckets;       /* boundaries == NULL: this many quantile buckets */
  uint64_t batch_size;        /* per rank                                   */
  /* ---- end of ABI 1.1 ---- */
} ddplug_sampler_desc;

/* ------------------------------------------------------------------------ */
/* One point-to-point operation (ABI 1.4; p2p_start). The runtime validates
 * the arguments before the plugin sees them: peer in range and not this
 * rank (DDPLUG_ANY_SOURCE only for a receive, and only with
 * DDPLUG_CAP_P2P_ANY_SOURCE), tag >= 0, buf non-NULL where count > 0,
 * dtype in the plugin's mask.                                              */
typedef enum ddplug_p2p_kind {
  DDPLUG_P2P_UNSET = 0,
  DDPLUG_P2P_SEND = 1,
  DDPLUG_P2P_RECV = 2
} ddplug_p2p_kind;

/* A receive's peer that matches a send from any rank. */
#define DDPLUG_ANY_SOURCE (-1)

typedef struct ddplug_p2p_args {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t kind;     /* ddplug_p2p_kind                                      */
  int32_t peer;     /* the other rank, or DDPLUG_ANY_SOURCE (a receive)     */
  int64_t tag;      /* >= 0: a send matches a receive of the same tag       */
  void *buf;        /* a send reads count elements, a receive writes them   */
  uint64_t count;   /* elements                                            */
  int32_t dtype;    /* ddplug_dtype                                         */
  int32_t mem;      /* ddplug_mem                                           */
  void *stream;     /* device plugins: e.g. a cudaStream_t; else NULL       */
  int32_t *source;  /* a receive: the matched sender's rank is stored here
                       before the request completes; NULL = not wanted
                       (the runtime stores peer itself when it names a
                       rank: a plugin must write it for ANY_SOURCE)        */
  int32_t reserved0;
  /* ---- end of ABI 1.4 ---- */
} ddplug_p2p_args;

/* ------------------------------------------------------------------------ */
/* The world as a plugin's engine knows it (ABI 1.4; bootstrap_world), for
 * launchers such as mpirun or srun that start every rank but publish no
 * rendezvous address.                                                      */
typedef struct ddplug_bootstrap_world {
  uint32_t struct_size;
  uint32_t abi_version;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;       /* index among the ranks of this node; -1 unknown */
  int32_t local_world_size; /* ranks on this node; -1 unknown                 */
  int32_t node_rank;        /* index of this node; -1 unknown                 */
  int32_t reserved0;
  char source[16];          /* who said so, e.g. "mpi" (NUL-terminated)       */
  /* ---- end of ABI 1.4 ---- */
} ddplug_bootstrap_world;

/* ------------------------------------------------------------------------ */
/* Option declarations (ABI 1.3): one per key the plugin accepts in the
 * config's "plugin_options". Static, owned by the plugin. Names are 1..63
 * characters of [a-z0-9_]. Bounds are inclusive; a bound pair of 0, 0 means
 * unbounded. A declaration the runtime cannot use (bad name or type, a
 * default that does not parse or breaks its own bounds, a name declared
 * twice) makes the loader refuse the plugin, naming the option.          */
typedef enum ddplug_option_type {
  DDPLUG_OPTION_UNSET = 0,
  DDPLUG_OPTION_BOOL = 1,     /* true / false                              */
  DDPLUG_OPTION_INT = 2,      /* an integer in [int_min, int_max], and a
                                 multiple of int_multiple if that is > 1    */
  DDPLUG_OPTION_NUMBER = 3,   /* a number in [num_min, num_max]            */
  DDPLUG_OPTION_STRING = 4,   /* text; one of choices if choices != NULL   */
  DDPLUG_OPTION_INT_LIST = 5  /* an array of 1..max_items integers, each as
                                 for INT (max_items 0: no limit)           */
} ddplug_option_type;

typedef struct ddplug_option {
  uint32_t struct_size;       /* sizeof(ddplug_option) as the plugin was built */
  uint32_t abi_version;
  const char *name;
  int32_t type;               /* ddplug_option_type                         */
  uint32_t max_items;         /* INT_LIST                                   */
  int64_t int_min, int_max;   /* INT, INT_LIST items                        */
  int64_t int_multiple;       /* INT, INT_LIST items: 0 or 1 = any          */
  double num_min, num_max;    /* NUMBER                                     */
  const char *const *choices; /* STRING: NULL-terminated, or NULL = any     */
  /* The default as JSON text ("65536", "true", "\"eth0\"", "[0, 1]"); NULL:
   * none, the option is absent unless the user gives it (the plugin then
   * decides, e.g. from the machine). */
  const char *default_json;
  /* One sentence for users; `ddplug info` shows it. */
  const char *description;
  /* ---- end of ABI 1.3 ---- */
} ddplug_option;

/* ------------------------------------------------------------------------ */
/* The plugin table. Identity first, then capabilities, then slots, each
 * commented with its contract. A slot marked (optional) may be NULL; the
 * runtime turns a call of a NULL optional slot into DDPLUG_E_UNSUPPORTED
 * or into its own default. Every other slot is mandatory: a table missing
 * one is refused at load time with the slot's name.                        */
typedef struct ddplug_plugin {
  uint32_t struct_size;  /* sizeof(ddplug_plugin) as the plugin was built  */
  uint32_t abi_version;  /* DDPLUG_PLUGIN_ABI_VERSION as the plugin was built */

  /* Identity: static strings owned by the plugin. name must be the file
   * name's <name> part (libddplug-<name>.so: the loader warns otherwise, see
   * "Name" above); version is the plugin's own release string. */
  const char *name;
  const char *version;
  const char *description;

  uint64_t caps;         /* DDPLUG_CAP_* */
  uint32_t dtype_mask;   /* DDPLUG_DTYPE_BIT(d) for every supported dtype */
  uint32_t op_mask;      /* DDPLUG_OP_BIT(o) for every supported op       */

  /* --- process group ---------------------------------------------------- */

  /* Create this rank's member of the process group. Collective: every rank
   * calls it; it may exchange addresses through svc's store and blocks at
   * most init->timeout_ms. svc and init stay valid until group_destroy.
   * On success *out is the group; on failure *out is untouched, nothing is
   * left allocated, and set_error has explained the status. */
  int (*group_create)(const ddplug_group_init *init,
                      const ddplug_host_services *svc,
                      ddplug_plugin_group **out);

  /* Release the group and everything it owns (shared memory, sockets,
   * threads). Requests not yet freed are freed. Never blocks on peers for
   * longer than the group's timeout; safe after an abort or a peer loss. */
  int (*group_destroy)(ddplug_plugin_group *group);

  /* (optional) Abort: make every blocked or future call on this group
   * return DDPLUG_E_ABORTED (or PEER_LOST if that is what happened) and, as
   * far as the plugin can, tell the peers. Callable from any thread, also
   * concurrently with a blocked collective. reason may be NULL. */
  int (*group_abort)(ddplug_plugin_group *group, const char *reason);

  /* --- collectives ----------------------------------------------------- */

  /* Start the collective described by args (kind selects which) and return
   * a request in *req. Buffers must stay valid until the request completes.
   * With DDPLUG_CAP_ASYNC the call returns without waiting for peers;
   * without it the call may complete the operation before returning. On
   * failure *req is untouched and nothing was started. Collectives on one
   * group complete in the order they were started. */
  int (*collective_start)(ddplug_plugin_group *group,
                          const ddplug_coll_args *args,
                          ddplug_plugin_request **req);

  /* Wait for req to complete, at most timeout_ms (> 0; 0 polls). Returns
   * DDPLUG_OK when done, DDPLUG_E_TIMEOUT when not yet (req stays pending
   * and may be waited again), or the operation's failure (PEER_LOST,
   * MISMATCH, ABORTED, ...), which is final for req. */
  int (*request_wait)(ddplug_plugin_group *group, ddplug_plugin_request *req,
                      int64_t timeout_ms);

  /* Never blocks: *done = 1 and DDPLUG_OK when complete; *done = 0 and
   * DDPLUG_OK while pending; the failure status if it failed. */
  int (*request_test)(ddplug_plugin_group *group, ddplug_plugin_request *req,
                      int32_t *done);

  /* Release req. A pending request is first completed or abandoned as the
   * plugin documents; the runtime only frees requests that finished,
   * failed, or whose group was aborted. */
  void (*request_free)(ddplug_plugin_group *group, ddplug_plugin_request *req);

  /* ---- end of ABI 1.0 ---- */

  /* --- sampler (optional; all six or none, plus sampler_declared) ------- */

  /* Create a sampler for desc (copied). The runtime only calls this for a
   * stream whose split owner is DDPLUG_OWNER_PLUGIN. */
  int (*sampler_create)(ddplug_plugin_group *group,
                        const ddplug_sampler_desc *desc,
                        ddplug_plugin_sampler **out);
  /* Start epoch `epoch` at position 0. O(1) preferred. */
  int (*sampler_set_epoch)(ddplug_plugin_sampler *s, uint64_t epoch);
  /* Deliver the next indices (see ddplug_sampler_desc) into out[0..cap);
   * *n = how many; *n == 0 at the end of the epoch. */
  int (*sampler_next)(ddplug_plugin_sampler *s, int64_t *out, uint64_t cap,
                      uint64_t *n);
  /* Position the sampler so the next index (or batch) delivered is the
   * position-th of this epoch (0-based), as if that many were consumed. */
  int (*sampler_seek)(ddplug_plugin_sampler *s, uint64_t position);
  /* Number of indices (index sampler) or batches (batch sampler) this rank
   * yields per epoch. */
  int (*sampler_length)(ddplug_plugin_sampler *s, uint64_t *length);
  void (*sampler_destroy)(ddplug_plugin_sampler *s);

  /* ---- end of ABI 1.1 ---- */

  /* (optional, ABI 1.2; only with the six slots above) What one epoch of
   * this sampler does beyond an exact split, all ranks together:
   * *padded = deliveries that repeat a sample so that every rank gets the
   * same count (padding), *dropped = samples no rank delivers (drop_last).
   * The runtime's audit allows exactly these repeats and holes (ddplug.h,
   * "audit"). Called from the thread that uses the sampler, after
   * sampler_create or sampler_set_epoch; must not block. On a failure
   * status (or when the slot is NULL, or the plugin was built against ABI
   * 1.1) the runtime allows only the remainder that equal lengths need, in
   * the direction desc->drop_last says (padding without it, dropping with
   * it); anything beyond is a violation of the audit. */
  int (*sampler_declared)(ddplug_plugin_sampler *s, uint64_t *padded,
                          uint64_t *dropped);

  /* ---- end of ABI 1.2 ---- */

  /* (optional, ABI 1.3) The plugin's option declarations: a NULL-terminated
   * array of pointers (see ddplug_option). NULL: the plugin declares none
   * and reads ddplug_group_init.options_json itself. A non-NULL empty array
   * means the plugin takes no options: any key is an error. */
  const ddplug_option *const *options;

  /* --- registered memory (optional, ABI 1.3; all three or none) --------
   * Host memory the plugin's collectives reach from every rank of the node
   * without staging it (for the cpu plugin: pages of the node's shared
   * memory, so a peer reduces straight from this rank's buffer and writes
   * its result straight into it). Buffers that are not registered work as
   * before; registering only makes them cheaper. A plugin with these slots
   * sets DDPLUG_CAP_REGISTERED_MEMORY. Unlike the other slots, the three
   * may be called from any thread, concurrently with each other and with a
   * collective in progress on another thread; none of them waits for
   * peers. */

  /* Allocate bytes (> 0) of registered memory, aligned to at least 64
   * bytes, contents unspecified. *ptr receives it, valid until mem_free or
   * group_destroy (which releases what is left: the plugin decides what
   * those addresses hold afterwards, and must not make them fault — the
   * cpu plugin leaves a private copy of the data there). On failure *ptr
   * is untouched, nothing is allocated, and set_error explains:
   * DDPLUG_E_NO_MEMORY when the registered memory is exhausted (saying how
   * much is in use and what limits it), INVALID_ARGUMENT for bytes == 0.
   * Does not touch (fault in) more than the plugin needs to reserve the
   * pages. */
  int (*mem_alloc)(ddplug_plugin_group *group, uint64_t bytes, void **ptr);

  /* Release ptr, returned by mem_alloc on this group. NULL is a no-op
   * (DDPLUG_OK). A pointer that is not a live allocation of this group is
   * DDPLUG_E_INVALID_ARGUMENT and nothing is released. The caller must not
   * free a buffer a pending collective still uses. */
  int (*mem_free)(ddplug_plugin_group *group, void *ptr);

  /* How the collectives reach [ptr, ptr + bytes) of this rank, in
   * *reach: DDPLUG_REACH_REGISTERED when the range lies inside one live
   * allocation of mem_alloc, DDPLUG_REACH_SINGLE_COPY when it does not but
   * the plugin still reduces it without staging (the cpu plugin: the
   * kernel copies between the ranks' address spaces, for buffers of at
   * least plugin_options.cma_min_bytes, where the system allows it),
   * DDPLUG_REACH_STAGED otherwise. A hint for the host's choice of
   * buffers; every answer stays valid for the group's life (the cpu
   * plugin learns what the system allows in group_create). Never fails
   * for valid arguments. */
  int (*mem_query)(ddplug_plugin_group *group, const void *ptr, uint64_t bytes,
                   int32_t *reach);

  /* ---- end of ABI 1.3 ---- */

  /* --- point-to-point (optional, ABI 1.4; DDPLUG_CAP_P2P) ---------------
   * Start a send or a receive (ddplug_p2p_args) and return a request in
   * *req, completed through request_wait / request_test / request_free
   * like a collective's. With DDPLUG_CAP_ASYNC it never waits for the peer.
   * Matching: a receive matches the oldest unmatched send of its peer (of
   * any rank for DDPLUG_ANY_SOURCE) with the same tag; between one sender
   * and one receiver, the messages of one tag are received in the order
   * they were sent (non-overtaking). A send may complete before the
   * receive is posted (buffered) or only once it is: a host relies on
   * neither. count and dtype must agree with the matched send: otherwise
   * the receive (and the send, where the plugin can tell) fails with
   * DDPLUG_E_MISMATCH naming both ranks, the tag and both counts, and no
   * data is delivered. Point-to-point operations are not collectives: they
   * take no sequence number, other ranks need not take part, and they may
   * be pending while collectives run on the group (the runtime still calls
   * a group's slots from one thread at a time). A receive nobody sends to
   * ends in request_wait with DDPLUG_E_TIMEOUT (it stays pending); a dead
   * peer gives DDPLUG_E_PEER_LOST naming it; group_abort ends pending
   * operations as it ends collectives. On failure *req is untouched and
   * nothing was started. A plugin with DDPLUG_CAP_P2P fills this slot, and
   * only such a plugin. */
  int (*p2p_start)(ddplug_plugin_group *group, const ddplug_p2p_args *args,
                   ddplug_plugin_request **req);

  /* --- bootstrap (optional, ABI 1.4; both or neither; DDPLUG_CAP_BOOTSTRAP)
   * For a plugin whose engine learns the world by itself (mpi: from
   * MPI_COMM_WORLD under mpirun or srun). Called by ddplug_open before the
   * rendezvous store exists, when the launcher gave no rendezvous address:
   * the runtime takes the world from bootstrap_world, rank 0 starts the
   * store, and bootstrap_broadcast carries its address and a fresh per-run
   * secret to every rank, over a channel private to the job. Not called on
   * a group (there is none yet): the plugin keeps what it needs (e.g. an
   * initialised MPI, once per process, coexisting with other users of it
   * such as mpi4py) for its later group_create. svc's log and set_error
   * work; its store and option slots return DDPLUG_E_UNSUPPORTED here. */

  /* Fill *out (its struct_size says how much) with this process's rank and
   * the world. Does not wait for peers beyond what the engine's own
   * initialisation does. Errors: DDPLUG_E_NOT_FOUND when the process was
   * not started by a launcher the engine knows (set_error says what was
   * looked for), DDPLUG_E_SYSTEM when the engine cannot start. */
  int (*bootstrap_world)(const ddplug_host_services *svc,
                         ddplug_bootstrap_world *out);
  /* Copy rank 0's len bytes of buf into every rank's buf. Collective over
   * the bootstrap world; every rank passes the same len. Blocks at most
   * timeout_ms (> 0): DDPLUG_E_TIMEOUT, naming what is known of the ranks
   * that did not take part. */
  int (*bootstrap_broadcast)(const ddplug_host_services *svc, void *buf,
                             uint64_t len, int64_t timeout_ms);

  /* --- shrink (optional, ABI 1.4; DDPLUG_CAP_SHRINK) --------------------
   * Re-form the group over the survivors after a peer loss (the group
   * reported DDPLUG_E_PEER_LOST or was aborted for it), without restarting
   * any process. init describes the new world: the survivors renumbered
   * 0..n-1 in the order of their old ranks, with a new run_id (a new
   * generation of the run: store keys and shared-memory names differ) and
   * the survivors' locality; old_rank_of[new rank] is each member's rank
   * in group. Collective over the survivors only; blocks at most
   * init->timeout_ms and must not wait for the dead. On success *out is
   * the new group; group must still be released with group_destroy, which
   * must then not block on the dead ranks either. On failure *out is
   * untouched and set_error has explained. Without this slot the runtime
   * destroys group and calls group_create with init (the cpu plugin
   * re-creates its shared memory that way); an engine that can shrink a
   * communicator in place (ncclCommShrink, ULFM's MPIX_Comm_shrink) fills
   * it. svc and init stay valid until the new group is destroyed.
   * DDPLUG_E_UNSUPPORTED declines: the plugin cannot shrink this group in
   * place (e.g. its engine lacks fault tolerance in this job, or an option
   * asks for re-creation). It must then have done nothing a later
   * group_create would trip over; the runtime destroys group and calls
   * group_create with init, exactly as without the slot (since ABI 1.4; a
   * runtime that predates this rule treats it as any failure). */
  int (*group_shrink)(ddplug_plugin_group *group, const ddplug_group_init *init,
                      const ddplug_host_services *svc, const int32_t *old_rank_of,
                      ddplug_plugin_group **out);

  /* ---- end of ABI 1.4 ---- */
} ddplug_plugin;

/* Values of mem_query's *reach (and ddplug_mem_reach's). */
#define DDPLUG_REACH_STAGED 0      /* copied through the plugin's staging */
#define DDPLUG_REACH_SINGLE_COPY 1 /* reduced in place, one kernel copy  */
#define DDPLUG_REACH_REGISTERED 2  /* registered: peers reach it directly */

/* Sizes of the table at the end of each minor version, for the loader. */
#define DDPLUG_PLUGIN_SIZE_1_0 offsetof(ddplug_plugin, sampler_create)
#define DDPLUG_PLUGIN_SIZE_1_1 offsetof(ddplug_plugin, sampler_declared)
#define DDPLUG_PLUGIN_SIZE_1_2 offsetof(ddplug_plugin, options)
#define DDPLUG_PLUGIN_SIZE_1_3 offsetof(ddplug_plugin, p2p_start)
#define DDPLUG_PLUGIN_SIZE_1_4 sizeof(ddplug_plugin)

/* The entry point a plugin exports. host_abi_version is the runtime's
 * DDPLUG_PLUGIN_ABI_VERSION, so a plugin may return a table suited to it (or
 * NULL if it cannot serve that runtime: the loader then reports an ABI
 * mismatch). The returned table is const and static. */
typedef const ddplug_plugin *(*ddplug_plugin_entry_fn)(uint32_t host_abi_version);
#define DDPLUG_PLUGIN_ENTRY_SYMBOL "ddplug_plugin_entry_v1"

#ifdef __cplusplus
}
#endif
#endif /* DDPLUG_PLUGIN_H */
