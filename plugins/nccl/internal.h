/*
 * internal.h — the nccl plugin's internal header (libddplug-nccl.so: NCCL
 * collectives on CUDA devices): the functions its files share, grouped by
 * file. Everything here is hidden (-fvisibility=hidden); the only exported
 * symbol is ddplug_plugin_entry_v1 (entry.c). Internal names carry the
 * ddnccl_ prefix (macros DDNCCL_); plugins/README.md states the convention
 * every plugin follows. The state: group.h (the group, its requests, the
 * options, the device record, the staging pools).
 * The files, by job (the same names as in every plugin):
 *   entry.c       the table and the exported entry point
 *   group.c       group_create / group_destroy / group_abort, NCCL init,
 *                 the group's failure
 *   collective.c  collective_start, request_wait / request_test /
 *                 request_free
 *   progress.c    polling NCCL and CUDA until done, failed, aborted or late
 *   options.c     the option declarations and reading them
 *   errors.c      error sentences (set_error), logging, status names, time
 * and by mechanism:
 *   types.c       ddplug dtype/op/kind → NCCL, names for messages
 *   device.c      device choice, the no-device diagnosis, device records,
 *                 the duplicate-GPU verdict
 *   agree.c       "did every rank succeed?" through the store (setup phases)
 *   staging.c     events and host↔device staging buffers (pools)
 *   mismatch.c    the optional cross-rank check of every collective
 *   p2p.c         sends and receives: ncclSend / ncclRecv, queued and
 *                 launched together as one NCCL group section
 *   shrink.c      group_shrink: the survivors' communicator in place
 *                 (ncclCommRevoke, ncclCommShrink), with plugin_options
 *                 shrink = "auto"
 * The semantics (what happens on timeout, abort, peer loss; what NCCL cannot
 * detect) are documented in README.md beside this file.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_NCCL_INTERNAL_H
#define DDPLUG_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ddplug/plugin.h"
#include "group.h"

#define DDNCCL_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* First NCCL release that can put several ranks on one GPU
 * (NCCL_MULTI_RANK_GPU_ENABLE=1). */
#define DDNCCL_MULTI_RANK_MIN_VERSION 23000

/* ---- errors.c ------------------------------------------------------------ */

/* Format a sentence, hand it to svc->set_error(status, ...) and return
 * status, so callers can write `return ddnccl_fail(svc, E, "...")`. */
int ddnccl_fail(const ddplug_host_services *svc, int status,
                const char *fmt, ...) DDNCCL_PRINTF(3, 4);
/* Log one line through svc->log when level <= threshold. */
void ddnccl_log(const ddplug_host_services *svc, int32_t threshold,
                int32_t level, const char *fmt, ...)
    DDNCCL_PRINTF(4, 5);
/* "TIMEOUT" for DDPLUG_E_TIMEOUT; "UNKNOWN" otherwise. Static. */
const char *ddnccl_status_name(int status);
/* snprintf that never overflows and tolerates cap == 0. */
void ddnccl_fmt(char *buf, size_t cap, const char *fmt, ...)
    DDNCCL_PRINTF(3, 4);
void ddnccl_vfmt(char *buf, size_t cap, const char *fmt, va_list ap)
    DDNCCL_PRINTF(3, 0);
/* CLOCK_MONOTONIC in ns, and ms left until deadline_ns (>= 0). */
uint64_t ddnccl_now_ns(void);
int64_t ddnccl_left_ms(uint64_t deadline_ns);
void ddnccl_sleep_us(int64_t us);

/* ---- types.c ------------------------------------------------------------- */

/* 0 and *out set for a dtype/op NCCL has; -1 otherwise. */
int ddnccl_dtype(int32_t dtype, ncclDataType_t *out);
int ddnccl_op(int32_t op, ncclRedOp_t *out);
/* Element size in bytes; 0 for an unknown dtype. */
size_t ddnccl_dtype_size(int32_t dtype);
/* Lowercase names for messages ("bfloat16", "avg", "allgather"); "?" if
 * unknown. Static. */
const char *ddnccl_dtype_name(int32_t dtype);
const char *ddnccl_op_name(int32_t op);
const char *ddnccl_kind_name(int32_t kind);
/* The masks the plugin table advertises. */
uint32_t ddnccl_dtype_mask(void);
uint32_t ddnccl_op_mask(void);

/* ---- options.c ----------------------------------------------------------- */

/* The options the plugin declares (NULL-terminated), for its table. */
extern const ddplug_option *const ddnccl_option_decls[];
/* Read the options the runtime checked (svc's option getters, plugin ABI
 * 1.3) into *out; on failure err says what and *out is empty (nothing to
 * free). DDPLUG_E_NO_MEMORY if allocation fails. */
int ddnccl_options_read(const ddplug_host_services *svc, ddnccl_options *out,
                        char *err, size_t cap);
void ddnccl_options_free(ddnccl_options *o);

/* ---- device.c ------------------------------------------------------------ */

/* Choose the CUDA ordinal for a rank: device_map[local_rank] when given;
 * else 0 when exactly one device is visible (the launcher bound it); else
 * local_rank when it is < count; else, with allow_shared_gpu,
 * local_rank % count. Anything else is DDPLUG_E_CONFIG with a sentence in
 * err. count must be > 0. */
int ddnccl_pick_device(const ddnccl_options *o, int32_t local_rank,
                       int32_t local_world, int32_t count,
                       int32_t *ordinal, char *err, size_t cap);
/* The sentence explaining why no device is usable: CUDA_VISIBLE_DEVICES,
 * the driver's CUDA version (or its absence), the CUDA error. */
void ddnccl_no_device_text(cudaError_t err, char *buf, size_t cap);
/* Fill rec for ordinal (uuid, pci, name) plus the given identity fields.
 * DDPLUG_E_SYSTEM with a sentence in err if CUDA cannot describe it. */
int ddnccl_devrec_fill(ddnccl_devrec *rec, int32_t rank,
                       int32_t ordinal, const char *host, char *err,
                       size_t cap);
/* Text form ("key=value" lines); returns the length written (< cap). */
size_t ddnccl_devrec_format(const ddnccl_devrec *rec, char *buf,
                            size_t cap);
/* Parse the text form; 0 on success, -1 if a field is missing. */
int ddnccl_devrec_parse(const char *text, size_t len,
                        ddnccl_devrec *out);
/* The duplicate-GPU verdict over the records of ranks that share a node
 * (same host). Two records with the same uuid are one GPU used by two
 * ranks: DDPLUG_E_CONFIG naming both ranks and the device, unless
 * allow_shared_gpu; then every rank's NCCL must be >= 2.30
 * (DDPLUG_E_UNSUPPORTED otherwise) and run with NCCL_MULTI_RANK_GPU_ENABLE=1
 * (DDPLUG_E_CONFIG naming the ranks without it). Records are compared only
 * when their host matches. Deterministic: every rank reaches the same
 * verdict from the same records. *shared (may be NULL) = 1 if any GPU is
 * shared and allowed. */
int ddnccl_check_devices(const ddnccl_devrec *recs, int32_t n,
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
int ddnccl_agree(const ddplug_host_services *svc, const char *phase,
                 int32_t rank, int32_t world, int local_status,
                 const char *local_msg, uint64_t deadline_ns,
                 char *msg, size_t cap);

/* ---- staging.c ----------------------------------------------------------- */

/* Take an event (refs = 1) from the pool or create one. cudaError_t. */
cudaError_t ddnccl_event_get(ddnccl_pool *p, ddnccl_event **out);
/* Drop one reference; at zero the event goes back to the pool. NULL ok. */
void ddnccl_event_put(ddnccl_pool *p, ddnccl_event *e);
/* A free stage of at least bytes (allocating one, rounded up to a power of
 * two >= 64 KiB, when none fits). Marked busy. Fenced stages whose event
 * completed are reclaimed first. cudaError_t. */
cudaError_t ddnccl_stage_get(ddnccl_pool *p, size_t bytes,
                             ddnccl_stage **out);
/* Give s back. With fence (the event after the last GPU work touching s)
 * not yet complete, s stays busy until it is. NULL s is a no-op. */
void ddnccl_stage_put(ddnccl_pool *p, ddnccl_stage *s,
                      ddnccl_event *fence);
/* Free everything. A fenced stage whose event does not complete by
 * deadline_ns (GPU work stuck behind something that is not ours) is leaked
 * rather than freed under the GPU's feet. Returns how many were leaked. */
int ddnccl_pool_destroy(ddnccl_pool *p, uint64_t deadline_ns);

/* ---- the group and its requests (group.c, collective.c) ----------------- */

/* group.c: make the group unusable (first call wins): record status and
 * sentence, abort the NCCL communicator (ncclCommAbort; a ready group with
 * shrink "auto" revokes it instead, shrink.c), and with publish
 * tell the peers through the store key "abort". Thread-safe. Returns the
 * status the group failed with (the first one). */
int ddnccl_group_fail(ddplug_plugin_group *g, int status, int publish,
                      const char *fmt, ...) DDNCCL_PRINTF(4, 5);
/* Set svc's last error to the group's failure and return ABORTED (or the
 * original status when `original`). */
int ddnccl_group_failed_status(ddplug_plugin_group *g, int original);
/* Look (without waiting) whether a peer published an abort, or the run
 * was aborted; if so, fail the group with the reason and return its status
 * (ABORTED, or the run's), else OK. */
int ddnccl_check_peer_abort(ddplug_plugin_group *g);
/* Make the group's device current on the calling thread. cudaError_t. */
cudaError_t ddnccl_use_device(ddplug_plugin_group *g);
/* The CUDA stream and the barrier's scratch word a ready communicator
 * needs; on failure the group is failed (peers told). */
int ddnccl_group_resources(ddplug_plugin_group *g);
/* Step 6 of group_create: one 1-element allreduce, waited for, so NCCL
 * connects what barriers and small collectives use while every rank is
 * here (NCCL >= 2.22 connects lazily). Bounded by deadline_ns. */
int ddnccl_connect_eagerly(ddplug_plugin_group *g, uint64_t deadline_ns);
/* The end of group_create and group_shrink: with st OK the group is ready
 * (a later failure revokes rather than aborts, with shrink "auto"); else
 * its failure goes to set_error, it is released, and st returned. */
int ddnccl_group_settled(ddplug_plugin_group *g, int st);
/* A zeroed group for init (rank, world, log level, timeout_ms, the
 * failure flag and comm_mu set up): what group_create and group_shrink
 * start from. NULL when out of memory. */
ddplug_plugin_group *ddnccl_group_new(const ddplug_group_init *init,
                                      const ddplug_host_services *svc, int64_t timeout_ms);
/* Free a group that holds no requests (create failed, or after destroy's
 * own part): pools, stream, scratch, options, the revoked communicator. */
void ddnccl_group_release(ddplug_plugin_group *g);

/* shrink.c: with shrink "auto" and an NCCL that has ncclCommRevoke and
 * ncclCommShrink, revoke comm (called by ddnccl_group_fail under comm_mu
 * with g->comm already cleared) and keep it as g->revoked: returns 1. Else
 * 0, and the caller aborts it. */
int ddnccl_revoke_for_shrink(ddplug_plugin_group *g, ncclComm_t comm);

/* progress.c: wait until the communicator's pending NCCL call settles
 * (ncclCommGetAsyncError no longer ncclInProgress), at most until
 * deadline_ns, releasing comm_mu between polls so group_abort stays
 * prompt. A non-blocking communicator answers ncclInProgress to every
 * collective (NCCL launches it from a background thread), so this is on
 * every collective's path: it busy-polls for the first microseconds, then
 * yields the CPU, and sleeps (up to 1 ms) only after 2 ms. what names the
 * operation in messages. coll_start_ns != 0 marks a collective started
 * then: its deadline passing is reported with the same sentence as the
 * watchdog's (ddnccl_collective_timed_out). On failure the group is
 * failed (communicator aborted, peers told). */
int ddnccl_settle(ddplug_plugin_group *g, uint64_t deadline_ns,
                  const char *what, uint64_t coll_start_ns);
/* The collective `what`, started at start_ns, ran past the collective
 * timeout (found at now_ns, while enqueuing or while waiting): fail the
 * group with TIMEOUT (communicator aborted, peers told) and the one
 * sentence both paths use — "<what> did not complete within the collective
 * timeout (...)". Returns TIMEOUT. */
int ddnccl_collective_timed_out(ddplug_plugin_group *g, const char *what,
                                uint64_t start_ns, uint64_t now_ns,
                                int enqueuing);
/* Check the communicator for an asynchronous error (once, no waiting); on
 * one, fail the group (PEER_LOST for ncclRemoteError) and return it. */
int ddnccl_check_async(ddplug_plugin_group *g, const char *what);
/* Map an NCCL result to a ddplug status. */
int ddnccl_status_of(ncclResult_t r);

/* mismatch.c: with plugin_options.check_mismatch, compare this collective
 * with rank 0's through the store before anything is enqueued. Returns OK,
 * MISMATCH (every rank: which rank called what), TIMEOUT or a store
 * failure, with set_error called. Blocks at most the collective timeout. */
int ddnccl_check_mismatch(ddplug_plugin_group *g,
                          const ddplug_coll_args *a);

/* collective.c: where a buffer lives (mem DEVICE/HOST, or asked of CUDA):
 * *is_host, *pinned. Fills err and returns INVALID_ARGUMENT for device
 * memory of another GPU. which names the buffer in err. */
int ddnccl_classify(ddplug_plugin_group *g, const void *ptr, int32_t mem,
                    const char *which, int *is_host, int *pinned, char *err,
                    size_t cap);
/* A request from the spare list or malloc, zeroed up to its texts; NULL
 * when out of memory. */
ddplug_plugin_request *ddnccl_request_new(ddplug_plugin_group *g);
/* p2p.c: launch the queued sends and receives as one NCCL group section
 * (collective_start, request_wait and request_test call it first). On
 * failure the group is failed. */
int ddnccl_p2p_flush(ddplug_plugin_group *g);
/* The slots (group.c, collective.c, p2p.c), for the table in entry.c. */
int ddnccl_group_create(const ddplug_group_init *init,
                        const ddplug_host_services *svc,
                        ddplug_plugin_group **out);
int ddnccl_group_destroy(ddplug_plugin_group *group);
int ddnccl_group_abort(ddplug_plugin_group *group, const char *reason);
int ddnccl_collective_start(ddplug_plugin_group *group,
                            const ddplug_coll_args *args,
                            ddplug_plugin_request **req);
int ddnccl_request_wait(ddplug_plugin_group *group,
                        ddplug_plugin_request *req, int64_t timeout_ms);
int ddnccl_request_test(ddplug_plugin_group *group,
                        ddplug_plugin_request *req, int32_t *done);
void ddnccl_request_free(ddplug_plugin_group *group,
                         ddplug_plugin_request *req);
int ddnccl_p2p_start(ddplug_plugin_group *group, const ddplug_p2p_args *args,
                     ddplug_plugin_request **req);
int ddnccl_group_shrink(ddplug_plugin_group *group, const ddplug_group_init *init,
                        const ddplug_host_services *svc, const int32_t *old_rank_of,
                        ddplug_plugin_group **out);

#endif /* DDPLUG_NCCL_INTERNAL_H */
