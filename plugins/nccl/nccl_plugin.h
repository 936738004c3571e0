/*
 * nccl_plugin.h — the single internal header of the nccl plugin
 * (libddplug-nccl.so). Everything here is hidden (-fvisibility=hidden); the
 * only exported symbol is ddplug_plugin_entry_v1 (entry.c). Cross-file
 * internals use the ddplug_nccl__ prefix. Modules, one concept each:
 *   entry.c       the plugin table and the entry point
 *   report.c      error sentences (set_error), logging, status names
 *   types.c       ddplug dtype/op/kind → NCCL, names for messages
 *   options.c     plugin_options parsing and validation (strict)
 *   device.c      device choice, the no-device diagnosis, device records,
 *                 the duplicate-GPU verdict
 *   agree.c       "did every rank succeed?" through the store (setup phases)
 *   group.c       group_create / group_destroy / group_abort, NCCL init
 *   progress.c    polling NCCL and CUDA until done, failed, aborted or late
 *   staging.c     events and host↔device staging buffers (pools)
 *   collective.c  collective_start, request_wait/test/free
 *   mismatch.c    the optional cross-rank check of every collective
 * The semantics (what happens on timeout, abort, peer loss; what NCCL cannot
 * detect) are documented in README.md beside this file.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_NCCL_PLUGIN_H
#define DDPLUG_NCCL_PLUGIN_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ddplug/plugin.h"

#define DDPLUG_NCCL__PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Longest error sentence the plugin composes. */
#define DDPLUG_NCCL__MSG_MAX 1024

/* First NCCL release that can put several ranks on one GPU
 * (NCCL_MULTI_RANK_GPU_ENABLE=1). */
#define DDPLUG_NCCL__MULTI_RANK_MIN_VERSION 23000

/* ---- report.c ------------------------------------------------------------ */

/* Format a sentence, hand it to svc->set_error(status, ...) and return
 * status, so callers can write `return ddplug_nccl__fail(svc, E, "...")`. */
int ddplug_nccl__fail(const ddplug_host_services *svc, int status,
                      const char *fmt, ...) DDPLUG_NCCL__PRINTF(3, 4);
/* Log one line through svc->log when level <= threshold. */
void ddplug_nccl__log(const ddplug_host_services *svc, int32_t threshold,
                      int32_t level, const char *fmt, ...)
    DDPLUG_NCCL__PRINTF(4, 5);
/* "TIMEOUT" for DDPLUG_E_TIMEOUT; "UNKNOWN" otherwise. Static. */
const char *ddplug_nccl__status_name(int status);
/* snprintf that never overflows and tolerates cap == 0. */
void ddplug_nccl__fmt(char *buf, size_t cap, const char *fmt, ...)
    DDPLUG_NCCL__PRINTF(3, 4);
void ddplug_nccl__vfmt(char *buf, size_t cap, const char *fmt, va_list ap)
    DDPLUG_NCCL__PRINTF(3, 0);
/* CLOCK_MONOTONIC in ns, and ms left until deadline_ns (>= 0). */
uint64_t ddplug_nccl__now_ns(void);
int64_t ddplug_nccl__left_ms(uint64_t deadline_ns);
void ddplug_nccl__sleep_us(int64_t us);

/* ---- types.c ------------------------------------------------------------- */

/* 0 and *out set for a dtype/op NCCL has; -1 otherwise. */
int ddplug_nccl__dtype(int32_t dtype, ncclDataType_t *out);
int ddplug_nccl__op(int32_t op, ncclRedOp_t *out);
/* Element size in bytes; 0 for an unknown dtype. */
size_t ddplug_nccl__dtype_size(int32_t dtype);
/* Lowercase names for messages ("bfloat16", "avg", "allgather"); "?" if
 * unknown. Static. */
const char *ddplug_nccl__dtype_name(int32_t dtype);
const char *ddplug_nccl__op_name(int32_t op);
const char *ddplug_nccl__kind_name(int32_t kind);
/* The masks the plugin table advertises. */
uint32_t ddplug_nccl__dtype_mask(void);
uint32_t ddplug_nccl__op_mask(void);

/* ---- options.c ----------------------------------------------------------- */

typedef struct ddplug_nccl_options {
  int32_t *device_map;     /* owned; NULL when not given                 */
  uint32_t device_map_len;
  int allow_shared_gpu;    /* 0/1, default 0                             */
  int check_mismatch;      /* 0/1, default 0                             */
} ddplug_nccl_options;

/* The options the plugin declares (NULL-terminated), for its table. */
extern const ddplug_option *const ddplug_nccl__option_decls[];
/* Read the options the runtime checked (svc's option getters, plugin ABI
 * 1.3) into *out; on failure err says what and *out is empty (nothing to
 * free). DDPLUG_E_NO_MEMORY if allocation fails. */
int ddplug_nccl__options_read(const ddplug_host_services *svc, ddplug_nccl_options *out,
                              char *err, size_t cap);
void ddplug_nccl__options_free(ddplug_nccl_options *o);

/* ---- device.c ------------------------------------------------------------ */

/* What a rank publishes about its device (text form: device records are
 * exchanged through the store and compared on every rank). */
typedef struct ddplug_nccl_devrec {
  int32_t rank;
  int32_t ordinal;         /* CUDA ordinal as this process sees it       */
  int32_t nccl_version;    /* ncclGetVersion() of the loaded libnccl     */
  int32_t multi_rank_env;  /* NCCL_MULTI_RANK_GPU_ENABLE=1 in its env    */
  char uuid[48];           /* "GPU-xxxxxxxx-xxxx-..."                    */
  char pci[32];            /* "0000:3b:00.0"                             */
  char name[96];           /* "NVIDIA H100 80GB HBM3"                    */
  char host[128];          /* the runtime's host id                      */
} ddplug_nccl_devrec;

/* Choose the CUDA ordinal for a rank: device_map[local_rank] when given;
 * else 0 when exactly one device is visible (the launcher bound it); else
 * local_rank when it is < count; else, with allow_shared_gpu,
 * local_rank % count. Anything else is DDPLUG_E_CONFIG with a sentence in
 * err. count must be > 0. */
int ddplug_nccl__pick_device(const ddplug_nccl_options *o, int32_t local_rank,
                             int32_t local_world, int32_t count,
                             int32_t *ordinal, char *err, size_t cap);
/* The sentence explaining why no device is usable: CUDA_VISIBLE_DEVICES,
 * the driver's CUDA version (or its absence), the CUDA error. */
void ddplug_nccl__no_device_text(cudaError_t err, char *buf, size_t cap);
/* Fill rec for ordinal (uuid, pci, name) plus the given identity fields.
 * DDPLUG_E_SYSTEM with a sentence in err if CUDA cannot describe it. */
int ddplug_nccl__devrec_fill(ddplug_nccl_devrec *rec, int32_t rank,
                             int32_t ordinal, const char *host, char *err,
                             size_t cap);
/* Text form ("key=value" lines); returns the length written (< cap). */
size_t ddplug_nccl__devrec_format(const ddplug_nccl_devrec *rec, char *buf,
                                  size_t cap);
/* Parse the text form; 0 on success, -1 if a field is missing. */
int ddplug_nccl__devrec_parse(const char *text, size_t len,
                              ddplug_nccl_devrec *out);
/* The duplicate-GPU verdict over the records of ranks that share a node
 * (same host). Two records with the same uuid are one GPU used by two
 * ranks: DDPLUG_E_CONFIG naming both ranks and the device, unless
 * allow_shared_gpu; then every rank's NCCL must be >= 2.30
 * (DDPLUG_E_UNSUPPORTED otherwise) and run with NCCL_MULTI_RANK_GPU_ENABLE=1
 * (DDPLUG_E_CONFIG naming the ranks without it). Records are compared only
 * when their host matches. Deterministic: every rank reaches the same
 * verdict from the same records. *shared (may be NULL) = 1 if any GPU is
 * shared and allowed. */
int ddplug_nccl__check_devices(const ddplug_nccl_devrec *recs, int32_t n,
                               int allow_shared_gpu, int *shared, char *err,
                               size_t cap);

/* ---- agree.c ------------------------------------------------------------- */

/* Collective over the store: every rank reports its local outcome of setup
 * phase `phase` (a short key-safe word) and learns whether all succeeded.
 * Returns DDPLUG_OK when every rank's local_status was OK. Otherwise the
 * status to return on this rank: its own failure (msg = "rank R: <local_msg>"), else
 * the first failure any rank reported, with msg = "rank R: <its text>".
 * Ranks that never arrive by deadline_ns: DDPLUG_E_TIMEOUT naming them.
 * Store failures: their status with a sentence naming the key. The sentence
 * goes to msg; nothing is sent to set_error. Blocks until deadline_ns. */
int ddplug_nccl__agree(const ddplug_host_services *svc, const char *phase,
                       int32_t rank, int32_t world, int local_status,
                       const char *local_msg, uint64_t deadline_ns,
                       char *msg, size_t cap);

/* ---- staging.c ----------------------------------------------------------- */

/* A reusable CUDA event, shared by a request and (as "the last operation
 * enqueued") by its group; returned to the pool when both let go. */
typedef struct ddplug_nccl_event {
  cudaEvent_t ev;
  int32_t refs;
  struct ddplug_nccl_event *next;
} ddplug_nccl_event;

/* A host↔device staging pair: bytes of device memory and as many bytes of
 * pinned host memory. Owned by the group's pool; busy while a request uses
 * it. */
typedef struct ddplug_nccl_stage {
  void *dev;
  void *host;
  size_t cap;
  int busy;
  ddplug_nccl_event *fence; /* busy until this event completes (a ref)   */
  struct ddplug_nccl_stage *next;
} ddplug_nccl_stage;

typedef struct ddplug_nccl_pool {
  ddplug_nccl_event *free_events;
  ddplug_nccl_stage *stages;
} ddplug_nccl_pool;

/* Take an event (refs = 1) from the pool or create one. cudaError_t. */
cudaError_t ddplug_nccl__event_get(ddplug_nccl_pool *p, ddplug_nccl_event **out);
/* Drop one reference; at zero the event goes back to the pool. NULL ok. */
void ddplug_nccl__event_put(ddplug_nccl_pool *p, ddplug_nccl_event *e);
/* A free stage of at least bytes (allocating one, rounded up to a power of
 * two >= 64 KiB, when none fits). Marked busy. Fenced stages whose event
 * completed are reclaimed first. cudaError_t. */
cudaError_t ddplug_nccl__stage_get(ddplug_nccl_pool *p, size_t bytes,
                                   ddplug_nccl_stage **out);
/* Give s back. With fence (the event after the last GPU work touching s)
 * not yet complete, s stays busy until it is. NULL s is a no-op. */
void ddplug_nccl__stage_put(ddplug_nccl_pool *p, ddplug_nccl_stage *s,
                            ddplug_nccl_event *fence);
/* Free everything. A fenced stage whose event does not complete by
 * deadline_ns (GPU work stuck behind something that is not ours) is leaked
 * rather than freed under the GPU's feet. Returns how many were leaked. */
int ddplug_nccl__pool_destroy(ddplug_nccl_pool *p, uint64_t deadline_ns);

/* ---- the group and its requests (group.c, collective.c) ----------------- */

enum { DDPLUG_NCCL__PENDING = 0, DDPLUG_NCCL__DONE = 1, DDPLUG_NCCL__FAILED = 2 };

struct ddplug_plugin_request {
  struct ddplug_plugin_request *next, *prev; /* the group's live list      */
  ddplug_plugin_group *group;
  uint64_t seq;
  int32_t kind;
  int32_t state;             /* DDPLUG_NCCL__*                             */
  int status;                /* final status once not PENDING              */
  int freed;                 /* request_free called while still pending    */
  ddplug_nccl_event *event;  /* recorded after the last enqueued step      */
  ddplug_nccl_stage *stage;  /* staging for host buffers, or NULL          */
  void *out_dst;             /* host recv buffer to fill when done         */
  const void *out_src;       /* pinned bytes to copy from                  */
  size_t out_bytes;
  uint64_t start_ns;
  char what[160];            /* "allreduce seq 7 (1024 x float32, sum)"    */
  char msg[DDPLUG_NCCL__MSG_MAX]; /* the final failure's sentence          */
};

struct ddplug_plugin_group {
  const ddplug_group_init *init;     /* borrowed until group_destroy        */
  const ddplug_host_services *svc;   /* borrowed until group_destroy        */
  int32_t rank, world, log_level;
  int64_t timeout_ms;                /* collective timeout (watchdog)       */
  ddplug_nccl_options opts;
  ddplug_nccl_devrec self;
  int32_t device;
  int shared_gpu;
  int warn_shared_gpu;               /* checks.duplicate_gpu = "warn"       */

  /* comm is read and used under comm_mu by the slot thread and cleared
   * (after ncclCommAbort) under comm_mu by group_abort from any thread. */
  pthread_mutex_t comm_mu;
  ncclComm_t comm;
  atomic_int failed;                 /* set once; then every call fails     */
  int fail_status;                   /* under comm_mu                       */
  char fail_msg[DDPLUG_NCCL__MSG_MAX]; /* under comm_mu                     */

  uint64_t mm_round;                 /* mismatch checks so far (slot thread) */

  cudaStream_t stream;               /* internal: barriers                  */
  int32_t *scratch;                  /* device int32 for barriers           */
  ddplug_nccl_pool pool;
  ddplug_nccl_event *last_event;     /* last operation enqueued (a ref)     */
  cudaStream_t last_stream;
  ddplug_plugin_request *live;       /* requests not yet freed              */
  ddplug_plugin_request *spare;      /* freed requests kept for reuse       */
  uint64_t abort_poll_ns;            /* next time waits look at the store   */
};

/* group.c: make the group unusable (first call wins): record status and
 * sentence, abort the NCCL communicator (ncclCommAbort), and with publish
 * tell the peers through the store key "abort". Thread-safe. Returns the
 * status the group failed with (the first one). */
int ddplug_nccl__group_fail(ddplug_plugin_group *g, int status, int publish,
                            const char *fmt, ...) DDPLUG_NCCL__PRINTF(4, 5);
/* Set svc's last error to the group's failure and return ABORTED (or the
 * original status when `original`). */
int ddplug_nccl__group_failed_status(ddplug_plugin_group *g, int original);
/* Look (without waiting) whether a peer published an abort, or the run
 * was aborted; if so, fail the group with the reason and return its status
 * (ABORTED, or the run's), else OK. */
int ddplug_nccl__check_peer_abort(ddplug_plugin_group *g);
/* Make the group's device current on the calling thread. cudaError_t. */
cudaError_t ddplug_nccl__use_device(ddplug_plugin_group *g);

/* progress.c: wait until the communicator's pending NCCL call settles
 * (ncclCommGetAsyncError no longer ncclInProgress), at most until
 * deadline_ns, releasing comm_mu between polls so group_abort stays
 * prompt. A non-blocking communicator answers ncclInProgress to every
 * collective (NCCL launches it from a background thread), so this is on
 * every collective's path: it busy-polls for the first microseconds, then
 * yields the CPU, and sleeps (up to 1 ms) only after 2 ms. what names the
 * operation in messages. coll_start_ns != 0 marks a collective started
 * then: its deadline passing is reported with the same sentence as the
 * watchdog's (ddplug_nccl__collective_timed_out). On failure the group is
 * failed (communicator aborted, peers told). */
int ddplug_nccl__settle(ddplug_plugin_group *g, uint64_t deadline_ns,
                        const char *what, uint64_t coll_start_ns);
/* The collective `what`, started at start_ns, ran past the collective
 * timeout (found at now_ns, while enqueuing or while waiting): fail the
 * group with TIMEOUT (communicator aborted, peers told) and the one
 * sentence both paths use — "<what> did not complete within the collective
 * timeout (...)". Returns TIMEOUT. */
int ddplug_nccl__collective_timed_out(ddplug_plugin_group *g, const char *what,
                                      uint64_t start_ns, uint64_t now_ns,
                                      int enqueuing);
/* Check the communicator for an asynchronous error (once, no waiting); on
 * one, fail the group (PEER_LOST for ncclRemoteError) and return it. */
int ddplug_nccl__check_async(ddplug_plugin_group *g, const char *what);
/* Map an NCCL result to a ddplug status. */
int ddplug_nccl__status_of(ncclResult_t r);

/* mismatch.c: with plugin_options.check_mismatch, compare this collective
 * with rank 0's through the store before anything is enqueued. Returns OK,
 * MISMATCH (every rank: which rank called what), TIMEOUT or a store
 * failure, with set_error called. Blocks at most the collective timeout. */
int ddplug_nccl__check_mismatch(ddplug_plugin_group *g,
                                const ddplug_coll_args *a);

/* The slots (group.c, collective.c), for the table in entry.c. */
int ddplug_nccl__group_create(const ddplug_group_init *init,
                              const ddplug_host_services *svc,
                              ddplug_plugin_group **out);
int ddplug_nccl__group_destroy(ddplug_plugin_group *group);
int ddplug_nccl__group_abort(ddplug_plugin_group *group, const char *reason);
int ddplug_nccl__collective_start(ddplug_plugin_group *group,
                                  const ddplug_coll_args *args,
                                  ddplug_plugin_request **req);
int ddplug_nccl__request_wait(ddplug_plugin_group *group,
                              ddplug_plugin_request *req, int64_t timeout_ms);
int ddplug_nccl__request_test(ddplug_plugin_group *group,
                              ddplug_plugin_request *req, int32_t *done);
void ddplug_nccl__request_free(ddplug_plugin_group *group,
                               ddplug_plugin_request *req);

#endif /* DDPLUG_NCCL_PLUGIN_H */
