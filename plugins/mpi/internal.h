/*
 * internal.h — the mpi plugin's internal header: the functions its files
 * share, grouped by file. Everything is hidden (-fvisibility=hidden);
 * internal names carry the ddmpi_ prefix (macros DDMPI_), as
 * plugins/README.md says for every plugin. The state: group.h.
 *
 * Two shared objects are built from this folder (README.md, "Building"):
 *   libddplug-mpi.so (the front end, no MPI): frontend.c, detect.c,
 *     options.c's declarations — what the runtime loads;
 *   libddplug-mpi-<family>.so (a backend per MPI ABI family, compiled
 *     against that family's mpi.h, linked against no libmpi): the files
 *     below, plus the cpu plugin's reduction kernels (plugins/cpu/reduce.c:
 *     float16/bfloat16 conversions and the user-defined MPI ops).
 * The backend's files, by job (the same names as in every plugin):
 *   entry.c       the table and the backend's exported entry point
 *   group.c       group_create / group_destroy / group_abort, the group's
 *                 failure
 *   collective.c  collective_start, request_wait / request_test /
 *                 request_free
 *   progress.c    what moves requests: the poll every waiter and the
 *                 progress thread run, the collective timeout
 *   options.c     the option declarations and reading them
 *   errors.c      error sentences (set_error), logging, names, time
 * and by mechanism:
 *   bootstrap.c   MPI initialised once per process (and finalized at exit
 *                 when we initialised it), bootstrap_world and
 *                 bootstrap_broadcast
 *   types.c       ddplug dtype/op -> MPI, float16/bfloat16 ops
 *   mismatch.c    the descriptor every collective is compared with
 *   arrival.c     who has arrived at a late collective (for TIMEOUT)
 *   p2p.c         p2p_start: sends and receives with a header
 *   hier.c        the hierarchical allreduce (the node's part through the
 *                 cpu plugin, loaded through the plugin ABI)
 *   shrink.c      group_shrink: the group re-formed over the survivors with
 *                 ULFM's MPIX_Comm_shrink
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_MPI_INTERNAL_H
#define DDPLUG_MPI_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "group.h"

#define DDMPI_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- errors.c --------------------------------------------------------------- */

/* Format a sentence, hand it to svc->set_error(status, ...) and return
 * status. svc may be NULL (then only returned). */
int ddmpi_fail(const ddplug_host_services *svc, int status, const char *fmt, ...)
    DDMPI_PRINTF(3, 4);
/* Log one line through svc->log when level <= threshold. */
void ddmpi_log(const ddplug_host_services *svc, int32_t threshold, int32_t level,
               const char *fmt, ...) DDMPI_PRINTF(4, 5);
/* snprintf that never overflows and tolerates cap == 0. */
void ddmpi_fmt(char *buf, size_t cap, const char *fmt, ...) DDMPI_PRINTF(3, 4);
/* MPI's sentence for an error code: "MPI_ERR_TRUNCATE: message truncated". */
void ddmpi_mpi_error(int code, char *buf, size_t cap);
/* Lowercase names for messages. Static. */
const char *ddmpi_dtype_name(int32_t dtype);
const char *ddmpi_op_name(int32_t op);
const char *ddmpi_kind_name(int32_t kind);
/* "rank 1", "ranks 1, 3" of the ranks whose flag is set, at most cap. */
void ddmpi_rank_list(const unsigned char *flags, int n, char *buf, size_t cap, int *count);
uint64_t ddmpi_now_ns(void);
int64_t ddmpi_left_ms(uint64_t deadline_ns);
void ddmpi_sleep_us(int64_t us);

/* ---- options.c ---------------------------------------------------------------- */

/* Read the options the runtime checked into *out. On failure the sentence
 * is in err. */
int ddmpi_options_read(const ddplug_host_services *svc, ddmpi_options *out, char *err,
                       size_t cap);

/* ---- types.c ------------------------------------------------------------------ */

/* Element size in bytes; 0 for an unknown dtype. */
size_t ddmpi_dtype_size(int32_t dtype);
/* The MPI datatype carrying dtype's bytes (float16/bfloat16: MPI_UINT16_T). */
MPI_Datatype ddmpi_mpi_type(int32_t dtype);
/* How an allreduce of dtype with op runs: *mtype and *mop for MPI; *widen
 * = 1 when the data goes through a float32 scratch (float16/bfloat16 sum,
 * avg, prod: accumulated in float32 and rounded once, as the cpu plugin
 * does); *divide = 1 when the result is divided by the world size
 * afterwards (avg). Needs the user-defined ops (ddmpi_types_init). */
void ddmpi_mpi_reduction(int32_t dtype, int32_t op, MPI_Datatype *mtype, MPI_Op *mop,
                         int *widen, int *divide);
/* Create the user-defined ops (float16/bfloat16 min and max) once MPI is
 * initialised. MPI error code. */
int ddmpi_types_init(void);

/* ---- bootstrap.c ------------------------------------------------------------ */

/* Initialise MPI (once per process, MPI_THREAD_MULTIPLE; an MPI someone
 * else initialised is used as it is, if it has MPI_THREAD_MULTIPLE) and
 * the process state. DDPLUG_OK, or a failure explained through svc. */
int ddmpi_mpi_ready(const ddplug_host_services *svc);
int ddmpi_bootstrap_world(const ddplug_host_services *svc, ddplug_bootstrap_world *out);
int ddmpi_bootstrap_broadcast(const ddplug_host_services *svc, void *buf, uint64_t len,
                              int64_t timeout_ms);
/* Wait (polling under ddmpi_p.mu) for one MPI request until deadline_ns;
 * between polls, what the host's store says about the run (svc's
 * store_wait with timeout 0, when svc has a store: NULL svc for none).
 * DDPLUG_OK when it completed (*code = its MPI result), DDPLUG_E_TIMEOUT,
 * or the run's failure. On anything but OK the request is left pending
 * and the process is marked broken. */
int ddmpi_wait_one(const ddplug_host_services *svc, MPI_Request *req, uint64_t deadline_ns,
                   int *code);

/* ---- group.c ---------------------------------------------------------------- */

/* Make the group unusable (first call wins; under ddmpi_p.mu): every
 * pending request fails with status and the sentence; with ULFM the
 * communicators are revoked so that the peers learn at once. */
void ddmpi_group_fail_locked(ddplug_plugin_group *g, int status, const char *fmt, ...)
    DDMPI_PRINTF(3, 4);
/* A peer failure MPI reported (ULFM: MPI_ERR_PROC_FAILED / _REVOKED) as
 * a sentence naming the failed ranks where MPI tells them. */
void ddmpi_peer_failure_text(ddplug_plugin_group *g, MPI_Comm comm, int code, char *buf,
                             size_t cap);
/* The status an MPI error code means: PEER_LOST for a process failure
 * (ULFM), else SYSTEM. */
int ddmpi_status_of(int code);

/* What group_create and group_shrink share. ddmpi_group_begin: a group
 * for init with its options read, no communicator yet (a failure is
 * explained through svc). ddmpi_world_ranks: every member's
 * MPI_COMM_WORLD rank through the store ("wr/<rank>"), checked; it returns
 * once every member has reached it, or fails within the collective
 * timeout (earlier when the run fails), so that the blocking communicator
 * calls after it never wait for a member that is not coming.
 * ddmpi_group_finish: with st so far and g->comm made, the rest (the
 * duplicated communicators, the hierarchical part, the progress thread);
 * on failure g is released (its communicators kept when talked: MPI may
 * still wait for a member), the sentence in err goes to set_error and the
 * process will not finalize MPI. */
int ddmpi_group_begin(const ddplug_group_init *init, const ddplug_host_services *svc,
                      ddplug_plugin_group **out);
int ddmpi_world_ranks(ddplug_plugin_group *g, char *err, size_t cap);
int ddmpi_group_finish(ddplug_plugin_group *g, int st, int talked, char *err, size_t cap,
                       ddplug_plugin_group **out);

/* The slots (group.c, collective.c, p2p.c), for the table in entry.c. */
int ddmpi_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                       ddplug_plugin_group **out);
int ddmpi_group_destroy(ddplug_plugin_group *group);
int ddmpi_group_abort(ddplug_plugin_group *group, const char *reason);
int ddmpi_collective_start(ddplug_plugin_group *group, const ddplug_coll_args *args,
                           ddplug_plugin_request **req);
int ddmpi_request_wait(ddplug_plugin_group *group, ddplug_plugin_request *req,
                       int64_t timeout_ms);
int ddmpi_request_test(ddplug_plugin_group *group, ddplug_plugin_request *req, int32_t *done);
void ddmpi_request_free(ddplug_plugin_group *group, ddplug_plugin_request *req);
int ddmpi_p2p_start(ddplug_plugin_group *group, const ddplug_p2p_args *args,
                    ddplug_plugin_request **req);

/* ---- shrink.c ----------------------------------------------------------------- */

/* 1 when this process can shrink a communicator in place: the MPI has
 * ULFM's MPIX_Comm_revoke, _shrink and _agree, and the job runs with fault
 * tolerance (Open MPI: OMPI_MCA_mpi_ft_enable, which mpirun --with-ft ulfm
 * sets; MPICH: MPIR_CVAR_ENABLE_FT). Else 0 and why says what is missing.
 * Resolved once; thread-safe after the first call (entry.c's, under
 * ddmpi_p.mu). */
int ddmpi_shrink_usable(char *why, size_t cap);
/* The group_shrink slot (filled only when ddmpi_shrink_usable). */
int ddmpi_group_shrink(ddplug_plugin_group *group, const ddplug_group_init *init,
                       const ddplug_host_services *svc, const int32_t *old_rank_of,
                       ddplug_plugin_group **out);

/* ---- collective.c --------------------------------------------------------- */

/* A new request of kind for g (zeroed, start time set). NULL: out of memory. */
ddplug_plugin_request *ddmpi_request_new(ddplug_plugin_group *g, int32_t kind);
/* Under ddmpi_p.mu: r joins g's live list, and the end of the queue
 * *head..*tail (collectives or point-to-point). */
void ddmpi_live_add(ddplug_plugin_group *g, ddplug_plugin_request *r);
void ddmpi_enqueue_locked(ddplug_plugin_group *g, ddplug_plugin_request *r,
                          ddplug_plugin_request **head, ddplug_plugin_request **tail);
/* Not under the lock: set_error to the group's failure; its status. */
int ddmpi_group_failed(ddplug_plugin_group *g);
/* Room for n MPI requests in r (all MPI_REQUEST_NULL). -1: out of memory. */
int ddmpi_request_reqs(ddplug_plugin_request *r, int n);
/* Release r's memory (not its MPI requests) and take it off its group's
 * live list (under ddmpi_p.mu once the group is shared). */
void ddmpi_request_release(ddplug_plugin_request *r);
/* Under ddmpi_p.mu: post the data of collective r (its turn has come).
 * 0, or an MPI error code (r's msg then says what failed). */
int ddmpi_collective_post(ddplug_plugin_request *r);
/* Under ddmpi_p.mu: the data of collective r arrived: finish it (avg's
 * division, float16/bfloat16 rounding). */
void ddmpi_collective_finish(ddplug_plugin_request *r);

/* ---- progress.c --------------------------------------------------------------- */

/* Under ddmpi_p.mu: move every pending request of g as far as it goes. */
void ddmpi_poll_locked(ddplug_plugin_group *g);
/* Outside the lock: the checks a poller makes for g's oldest collective —
 * publish this rank's arrival when it has waited options.slow_ms, fail the
 * group with TIMEOUT naming the ranks not arrived when it ran past the
 * collective timeout. */
void ddmpi_watch(ddplug_plugin_group *g);
/* Tell the progress thread there is work (after a start). */
void ddmpi_progress_kick(void);
/* Start the progress thread if it is not running (under ddmpi_p.mu); stop
 * and join it when no group is left, or with force (process exit), not
 * under the lock. */
int ddmpi_progress_start_locked(void);
void ddmpi_progress_stop(int force);
/* Return once the progress thread no longer uses g (g has left
 * ddmpi_p.groups; not under the lock). */
void ddmpi_progress_forget(ddplug_plugin_group *g);
/* Test MPI requests reqs[0..n): 1 when all completed (*code = 0), 0 while
 * some are pending, -1 on an error (*code = the MPI error). */
int ddmpi_test_all(MPI_Request *reqs, int n, int *code);

/* ---- p2p.c ------------------------------------------------------------------ */

/* Under ddmpi_p.mu: move g's sends and receives; *moved = 1 when one did. */
void ddmpi_p2p_poll_locked(ddplug_plugin_group *g, int *moved);

/* ---- mismatch.c ------------------------------------------------------------- */

/* Fill r's descriptor and post its allreduce on g->check_comm. MPI code. */
int ddmpi_mismatch_post(ddplug_plugin_request *r);
/* After the descriptor allreduce: 0 when every rank called the same, or
 * -1 with r->msg naming two ranks and what each called. */
int ddmpi_mismatch_judge(ddplug_plugin_request *r);

/* ---- arrival.c ---------------------------------------------------------------- */

/* Publish (store key "at/<rank>") that this rank has reached collective seq. */
void ddmpi_arrival_publish(ddplug_plugin_group *g, uint64_t seq);
/* The ranks that have not published reaching seq (this rank has): "rank 1
 * has not reached it (rank 0 has)". */
void ddmpi_arrival_text(ddplug_plugin_group *g, uint64_t seq, char *buf, size_t cap);

/* ---- hier.c ------------------------------------------------------------------- */

/* Under group_create: set up the node's cpu group and the leaders'
 * communicator when options and layout call for it (g->hier, else NULL).
 * DDPLUG_OK or a failure explained in err. */
int ddmpi_hier_create(ddplug_plugin_group *g, char *err, size_t cap);
void ddmpi_hier_destroy(ddplug_plugin_group *g);
/* Whether collective a takes the hierarchical path. */
int ddmpi_hier_takes(const ddplug_plugin_group *g, const ddplug_coll_args *a);
/* Under ddmpi_p.mu: start / advance r's hierarchical allreduce. 1 done,
 * 0 pending, -1 failed (r->status, r->msg). */
int ddmpi_hier_step(ddplug_plugin_request *r);
/* Abort the node's cpu group (group_abort). */
void ddmpi_hier_abort(ddplug_plugin_group *g, const char *reason);
/* The node leaders' communicator, or MPI_COMM_NULL (one node, or flat). */
MPI_Comm ddmpi_hier_leaders(const ddplug_plugin_group *g);

#endif /* DDPLUG_MPI_INTERNAL_H */
