/*
 * internal.h — the cpu plugin's internal header (libddplug-cpu.so: shared
 * memory inside a node, a TCP ring between nodes): the functions its files
 * share, grouped by file. Everything here is hidden (-fvisibility=hidden);
 * the plugin exports only ddplug_plugin_entry_v1. Internal names carry the
 * ddcpu_ prefix (macros DDCPU_); plugins/README.md states the convention
 * every plugin follows. The state lives in headers of its own:
 *   group.h       the group (struct ddplug_plugin_group), its options, the
 *                 node segment as this process maps it
 *   request.h     a collective's execution state: the request, its phases
 *   shm_layout.h  the node segment's bytes, shared across processes, with
 *                 its version and the rule for bumping it
 *   wire.h        the records node leaders send each other over TCP, and
 *                 the point-to-point frames
 *   p2p.h         point-to-point: ops, unexpected messages, links
 *   kernels.h     reductions, the bulk copy, float16/bfloat16 (no group)
 * The files, by job (the same names as in every plugin):
 *   entry.c       the table and the exported entry point
 *   group.c       group_create / group_destroy / group_abort
 *   collective.c  collective_start, request_wait / request_test /
 *                 request_free: the request queue
 *   progress.c    who executes the queue: the executor role, the progress
 *                 thread
 *   options.c     the option declarations and reading them
 *   errors.c      the thread-local error sentence, reporting it to the
 *                 runtime, logging
 *   mem.c         registered memory: per-rank arenas in the node segment,
 *                 mem_alloc / mem_free / mem_query
 *   p2p.c         point-to-point: p2p_start, the protocol (eager messages,
 *                 RTS/CTS for large ones), matching, the engine
 * and by mechanism:
 *   plan.c        a collective as phases, and the driver that runs them
 *   handshake.c   per-collective descriptors, mismatch detection, verdicts
 *   shm_coll.c    in-node algorithms: small-message path, chunked pipeline
 *   direct.c      the single-copy allreduce inside a node: ranks reduce
 *                 straight from each other's buffers (registered memory or
 *                 the kernel's process_vm_readv/writev), no staging
 *   ring.c        inter-node ring (reduce-scatter/allgather, chain
 *                 broadcast)
 *   tcp.c         sockets: listen/connect/accept, address exchange, framing
 *   shm.c         segment create/attach/unlink, stale-segment cleanup
 *   wait.c        counters in shared memory: post, spin briefly, futex sleep
 *   failure.c     the group's failure record (abort, peer loss), liveness
 *                 (pidfds of same-node peers, ring sockets), propagation
 *   reduce.c      dtype x op kernels (fp16/bf16 accumulate in float32)
 *   copy.c        the bulk copy
 *   p2p_link.c    point-to-point transports: a byte ring per pair of a
 *                 node's ranks, a TCP connection per pair across nodes
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_INTERNAL_H
#define DDPLUG_CPU_INTERNAL_H

#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ddplug/plugin.h"
#include "group.h"
#include "kernels.h"
#include "p2p.h"
#include "request.h"
#include "shm_layout.h"
#include "wire.h"

#define DDCPU_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define DDCPU_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DDCPU_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Most ranks on one node (the kernels keep a source list on the stack). */
#define DDCPU_MAX_LOCAL 256
/* A wait that begins this soon after its start is synchronous (the caller
 * waits at once): starts stop waking the progress thread (progress.c). */
#define DDCPU_SYNC_WAIT_NS (100ull * 1000)
/* The progress thread takes over work nobody has waited for this long. */
#define DDCPU_STRANDED_NS (1000ull * 1000)

/* Internal results besides the DDPLUG_E_* codes (which are > 0). */
#define DDCPU_AGAIN (-1)   /* deadline reached, nothing failed: try again later */
#define DDCPU_BLOCKED (-2) /* a step cannot progress until its wait target moves */
#define DDCPU_DONE (-3)    /* a step finished its phase                         */

/* ---- errors and logging (errors.c) ------------------------------------- */

/* Record the detail sentence for status in this thread's error buffer and
 * return status (so `return ddcpu_err(E, "...")` reads naturally). */
int ddcpu_err(int status, const char *fmt, ...) DDCPU_PRINTF(2, 3);
/* Same with ": strerror(errno_value)" appended. */
int ddcpu_err_errno(int status, int errno_value, const char *fmt, ...)
    DDCPU_PRINTF(3, 4);
/* Prefix the current sentence: "prefix: old". Returns status. */
int ddcpu_err_prefix(int status, const char *fmt, ...) DDCPU_PRINTF(2, 3);
/* This thread's current sentence ("" if none). */
const char *ddcpu_errmsg(void);
void ddcpu_errmsg_set(const char *text);
/* Log through the host services when level passes the group's threshold. */
void ddcpu_log(const ddcpu_group *g, int level, const char *fmt, ...) DDCPU_PRINTF(3, 4);
/* Hand this thread's sentence to the runtime (svc->set_error) when status
 * is not OK; returns status. What every slot returns through. */
int ddcpu_report(const ddplug_host_services *svc, int status);

/* ---- options (options.c) ------------------------------------------------ */

/* The options the plugin declares (NULL-terminated), for its table. */
extern const ddplug_option *const ddcpu_option_decls[];
/* Read the checked options from the runtime (svc's option getters) into
 * *out. DDPLUG_E_CONFIG naming plugin_options.<key> for what only the plugin
 * checks (slots a power of two, addr an IPv4 literal). */
int ddcpu_options_read(const ddplug_host_services *svc, ddcpu_options *out);

/* ---- counters in shared memory (wait.c) --------------------------------- */

/* ddcpu_ctr (shm_layout.h): wrap-safe comparisons. */
static inline int ddcpu_seq_ge(uint32_t a, uint32_t b) {
  return (int32_t)(a - b) >= 0;
}
static inline int ddcpu_ctr_ge(ddcpu_ctr *c, uint32_t v) {
  return ddcpu_seq_ge(atomic_load_explicit(&c->val, memory_order_acquire), v);
}
/* Publish v (release) and wake sleepers of c, if any. */
void ddcpu_ctr_post(ddcpu_ctr *c, uint32_t v);
/* Wake every sleeper of c (abort, failure). */
void ddcpu_ctr_wake(ddcpu_ctr *c);
/* Sleep on c while its value is `seen`, at most timeout_ns (futex). */
void ddcpu_ctr_sleep(ddcpu_ctr *c, uint32_t seen, uint64_t timeout_ns, int shared);

/* What a blocked step waits for. */
typedef struct ddcpu_wait_target {
  int kind;        /* DDCPU_WAIT_CTR or DDCPU_WAIT_FDS                     */
  ddcpu_ctr *ctr;  /* CTR: until ctr >= until                              */
  uint32_t until;
  int poster;      /* CTR: local index of the rank whose arrival ctr
                      counts, or -1; an arrival wait also ends (returns 0,
                      the step re-checks) once a local rank departed
                      (group_destroy) before arriving: it never will      */
  int nfds;        /* FDS: until one of fds[] has its events               */
  struct pollfd fds[2];
} ddcpu_wait_target;
#define DDCPU_WAIT_CTR 1
#define DDCPU_WAIT_FDS 2

/* Wait for t, spinning for the group's spin time, then sleeping, checking
 * the group's failure state and its peers' liveness every slice. Returns 0
 * when t is reached, DDCPU_AGAIN at deadline_ns, or the group's failure. */
int ddcpu_wait(ddcpu_group *g, const ddcpu_wait_target *t, uint64_t deadline_ns);

uint64_t ddcpu_now_ns(void);
/* Deadline for timeout_ms from now; UINT64_MAX for a negative timeout. */
uint64_t ddcpu_deadline(int64_t timeout_ms);

/* ---- shared memory segment (shm.c) -------------------------------------- */

/* Segment name for a run and node: "/ddplug-cpu-<run_id>-n<node>". */
void ddcpu_shm_name(char *out, size_t cap, const char *run_id, int node);
/* Create (exclusively), size and initialise the segment; on failure nothing
 * is left behind. */
int ddcpu_shm_create(ddcpu_shm *s, const ddcpu_shm_params *p);
/* Open an existing segment and check it matches p. */
int ddcpu_shm_attach(ddcpu_shm *s, const char *name, const ddcpu_shm_params *p);
/* Record this process (pid, start time) in slot local_index. */
void ddcpu_shm_register(ddcpu_shm *s, int local_index);
/* Remove the name (mappings stay valid). Idempotent. */
void ddcpu_shm_unlink(ddcpu_shm *s);
/* Unmap the segment and close its descriptor. Idempotent. */
void ddcpu_shm_detach(ddcpu_shm *s);
/* Registered memory per local rank when plugin_options.registered_bytes is
 * automatic: the size of /dev/shm, within a budget of address space for
 * local_world arenas; 0 if it cannot be learnt. */
uint64_t ddcpu_shm_arena_auto(int local_world);
/* Remove /dev/shm/ddplug-cpu-* segments (of this user) whose every recorded
 * process is dead. Returns how many were removed. */
int ddcpu_shm_cleanup_stale(const ddcpu_group *g);
/* Count such abandoned segments; remove them too if remove != 0. */
int ddcpu_shm_stale(const ddcpu_group *g, int remove);
/* Start time of pid from /proc (0 if it does not exist). */
uint64_t ddcpu_proc_start_time(int64_t pid);
/* True if pid runs and started at start_time (0 = do not compare). */
int ddcpu_proc_alive(int64_t pid, uint64_t start_time);

/* ---- TCP (tcp.c) --------------------------------------------------------- */

/* A control record of `type` from this rank (magic, run hash, origin). */
void ddcpu_ctl_init(const ddcpu_group *g, ddcpu_ctl_msg *m, uint32_t type);
int ddcpu_tcp_listen(int *fd, int *port);
/* Pick the address to advertise (option or first non-loopback IPv4). */
void ddcpu_tcp_local_addr(const char *opt, char *out, size_t cap);
/* Exact send with a deadline (control records, teardown). */
int ddcpu_tcp_send_all(int fd, const void *buf, size_t len, uint64_t deadline);
/* Tune a connected socket: TCP_NODELAY, buffers, keepalive, O_NONBLOCK. */
void ddcpu_tcp_tune(int fd);
/* HMAC-SHA256 under key over label || nonce || hello (the ring's and the
 * point-to-point connections' proof of the run's key). 0 on success. */
int ddcpu_tcp_mac(const uint8_t key[32], const char *label, const uint8_t nonce[32],
                  const ddcpu_ctl_msg *hello, uint8_t out[32]);
/* n bytes as 2n lowercase hex digits (and a NUL) into out. */
void ddcpu_hex_encode(const uint8_t *b, size_t n, char *out);
/* "a.b.c.d:port/<64 hex>" into an address and a key; 0 on success. */
struct sockaddr_in;
int ddcpu_tcp_parse_endpoint(const char *v, struct sockaddr_in *a, uint8_t key[32]);
/* Build the ring: publish this leader's address and a ring key made for
 * the run, connect to the next node's leader and accept the previous one's,
 * each proving the key (strangers are logged and dropped, never fail
 * setup); ends early when the run fails. */
int ddcpu_tcp_ring_setup(ddcpu_group *g, uint64_t deadline);
/* Say goodbye on both ring sockets and close them. */
void ddcpu_tcp_ring_close(ddcpu_group *g);

/* ---- failure and liveness (failure.c) ------------------------------------ */

/* Record the group's first failure (later ones are ignored), publish it to
 * the node's shared memory and, for a node leader, backwards around the
 * ring; wake everything that sleeps. Returns the status now in force. */
int ddcpu_fail_set(ddcpu_group *g, int status, int rank, int origin,
                   const char *fmt, ...) DDCPU_PRINTF(5, 6);
/* Adopt a failure record that arrived from elsewhere (ring message). */
int ddcpu_fail_adopt(ddcpu_group *g, int status, int rank, int origin,
                     const char *msg, int from_ring);
/* 0 if the group is healthy, else its failure status (cheap: atomics). */
int ddcpu_fail_status(ddcpu_group *g);
/* Put the failure sentence in this thread's error buffer; return status. */
int ddcpu_fail_report(ddcpu_group *g);
/* The effective failure record (NULL while healthy). */
const ddcpu_fail_rec *ddcpu_fail_get(ddcpu_group *g);
/* A blocked collective was woken by a failure: if it is an abort, watch
 * peers up to 150 ms (never past deadline_ns) for a death that upgrades it
 * to PEER_LOST; then report (as ddcpu_fail_report). Executor only. */
int ddcpu_fail_settle(ddcpu_group *g, uint64_t deadline_ns);
/* Local index j's process exited: PEER_LOST unless it departed cleanly.
 * Thread-safe. */
void ddcpu_peer_exited(ddcpu_group *g, int j);
/* Check peers: pidfds of same-node peers, ring sockets (control messages,
 * hang-ups). timeout_ms 0 polls. Returns ddcpu_fail_status afterwards. */
int ddcpu_liveness_poll(ddcpu_group *g, int timeout_ms);
/* Fill pfd with the liveness descriptors (returns how many). */
int ddcpu_liveness_fds(ddcpu_group *g, struct pollfd *pfd, int cap);
/* A ring socket to node's leader broke (what: how). Wait up to 200 ms
 * from the first break for an abort record explaining it, else record
 * PEER_LOST of that leader; never waits past deadline_ns. Returns the
 * failure status, or DDCPU_AGAIN when deadline_ns came first (call again). */
int ddcpu_ring_broken(ddcpu_group *g, int node, const char *what, int err,
                      uint64_t deadline_ns);
/* For group_create's waits (shared-memory attach, ring setup), called in
 * their loops: at most every 100 ms, ask the runtime through host services
 * whether the run has failed (a wait with timeout 0 for key, one this rank
 * published, ends early when it has). Returns OK, or the run's failure
 * with a sentence naming what (the runtime reports the run's own reason). */
int ddcpu_startup_check(ddcpu_group *g, const char *key, const char *what,
                        uint64_t *next_probe_ns);
/* Open pidfds for same-node peers. */
int ddcpu_liveness_open(ddcpu_group *g);
void ddcpu_liveness_close(ddcpu_group *g);
/* Wake every sleeper of the node segment (used by abort and failures). */
void ddcpu_wake_all(ddcpu_group *g);

/* ---- handshake and mismatch (handshake.c) -------------------------------- */

void ddcpu_desc_fill(ddcpu_desc *d, const ddplug_coll_args *a, int rank);
/* Human form: "allreduce(count=10, float32, sum)". */
void ddcpu_desc_str(const ddcpu_desc *d, char *out, size_t cap);
/* Compare the local ranks' descriptors for collective index k (all have
 * arrived). MISMATCH with a sentence naming two ranks, or OK. */
int ddcpu_hs_compare_local(ddcpu_group *g, uint64_t k, const ddcpu_desc *mine);
/* Compare the nodes' records after the ring exchange. */
int ddcpu_hs_compare_nodes(ddcpu_group *g, const ddcpu_hs_rec *recs, uint64_t k);
/* Sentence for a TIMEOUT of collective index k: which ranks had not
 * arrived. */
void ddcpu_hs_missing(ddcpu_group *g, uint64_t k, char *out, size_t cap);

/* ---- a collective's phases (plan.c and the mechanisms) ------------------------- */

/* Plan and run r as far as possible before deadline_ns. Returns DDPLUG_OK
 * when it completed (successfully), DDCPU_AGAIN at the deadline, or the final
 * failure (MISMATCH, PEER_LOST, ...), with the sentence in the thread's
 * error buffer. */
int ddcpu_coll_advance(ddcpu_group *g, ddcpu_req *r, uint64_t deadline_ns);
/* Check args against the plugin's rules (dtype/op combinations, buffers). */
int ddcpu_coll_validate(const ddcpu_group *g, const ddplug_coll_args *a);
/* Bytes of float32 scratch (ddcpu_req.wide) this rank needs for a (0: none):
 * a node leader's partial sums of a multi-node float16/bfloat16 allreduce.
 * Allocated when the collective starts, so that running it cannot fail for
 * want of memory. */
uint64_t ddcpu_coll_scratch_bytes(const ddcpu_group *g, const ddplug_coll_args *a);

/* direct.c */
/* At the handshake, before arriving: publish where this rank's buffers of
 * r are (ddcpu_bufref), for a collective planned with a direct phase. */
void ddcpu_direct_publish(ddcpu_group *g, ddcpu_req *r);
/* Enter the direct phase after the handshake: every rank decides the same
 * from everyone's ddcpu_bufref and cma verdict, and a phase that cannot run
 * directly turns into the shared-memory pipeline (DDCPU_PH_PIPE, initialised). */
void ddcpu_direct_enter(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph);
int ddcpu_direct_step(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph, ddcpu_wait_target *wt);
/* r failed after this rank arrived: make sure no peer still writes into its
 * output before the caller gets the buffer back (waits for live writers). */
void ddcpu_direct_withdraw(ddcpu_group *g, ddcpu_req *r);
/* group_create, once every local rank attached: find out whether this rank
 * may read and write every local peer's memory through the kernel
 * (process_vm_readv/writev; ptrace rules, containers), publish the verdict
 * and wait until every local rank has (so every rank answers mem_query the
 * same). Logs the outcome once, at debug level. */
int ddcpu_direct_probe(ddcpu_group *g, uint64_t deadline);
/* 1 when unregistered buffers of bytes per rank take the single copy. */
int ddcpu_direct_cma_for(ddcpu_group *g, uint64_t bytes);

/* mem.c: the slots (see plugin.h; any thread), and for the single copy: */
int ddcpu_mem_alloc(ddplug_plugin_group *g, uint64_t bytes, void **ptr);
int ddcpu_mem_free(ddplug_plugin_group *g, void *ptr);
int ddcpu_mem_query(ddplug_plugin_group *g, const void *ptr, uint64_t bytes, int32_t *reach);
/* Node-segment offset of [ptr, ptr + bytes) when it lies inside one live
 * registered allocation of this rank, else -1. Thread-safe. */
int64_t ddcpu_mem_offset(ddcpu_group *g, const void *ptr, uint64_t bytes);
/* group_destroy: unmap the node segment, leaving at the addresses of
 * allocations still live a private copy of their contents (so a view the
 * host forgot does not fault), with a warning; free the bookkeeping. */
void ddcpu_mem_detach(ddcpu_group *g);

/* shm_coll.c */
void ddcpu_pipe_init(ddcpu_group *g, ddcpu_pipe *p);
int ddcpu_pipe_step(ddcpu_group *g, ddcpu_pipe *p, ddcpu_wait_target *wt);
void ddcpu_small_put(ddcpu_group *g, ddcpu_req *r);
void ddcpu_small_finish(ddcpu_group *g, ddcpu_req *r);
unsigned char *ddcpu_small_slot(ddcpu_group *g, int local, uint64_t k);

/* ring.c */
void ddcpu_ring_init(ddcpu_group *g, ddcpu_ring *r);
int ddcpu_ring_step(ddcpu_group *g, ddcpu_ring *r, ddcpu_wait_target *wt);

/* ---- point-to-point (p2p.c: the protocol and engine; p2p_link.c: the
 * rings and sockets; p2p.h: the state) ------------------------------------- */

/* Bytes of one point-to-point ring for a node of local_world ranks (0 for
 * one rank): 1 MiB, less when there are many pairs (64 MiB of address
 * space for all of them), never under 64 KiB. */
uint64_t ddcpu_p2p_ring_bytes(int local_world);
/* group_create, after the node segment: the state, the links, and with
 * several nodes this rank's listener, published under p2p/<rank>. */
int ddcpu_p2p_create(ddcpu_group *g);
/* teardown (the progress thread stopped): goodbyes, sockets, every op. */
void ddcpu_p2p_destroy(ddcpu_group *g);
/* The slot (see plugin.h) and its ops' side of the request slots. */
int ddcpu_p2p_start(ddplug_plugin_group *g, const ddplug_p2p_args *args,
                    ddplug_plugin_request **req);
int ddcpu_p2p_wait(ddcpu_group *g, ddcpu_p2p_op *op, int64_t timeout_ms);
int ddcpu_p2p_test(ddcpu_group *g, ddcpu_p2p_op *op, int32_t *done);
void ddcpu_p2p_free(ddcpu_group *g, ddcpu_p2p_op *op);
/* Move everything that can move (holds p2p->mu); fails every pending op
 * once the group failed. Returns the group's failure status. */
int ddcpu_p2p_progress(ddcpu_group *g);
/* The progress thread, while ops are pending and nobody waits: progress,
 * then wait at most ms for something to move. */
void ddcpu_p2p_background(ddcpu_group *g, int ms);
/* For p2p_link.c: a frame's header arrived; where its payload goes (NULL:
 * discarded), remembered in rx. Then the payload is in: act on the frame. */
unsigned char *ddcpu_p2p_rx_begin(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h,
                                  ddcpu_p2p_rx *rx);
void ddcpu_p2p_rx_end(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h,
                      ddcpu_p2p_rx *rx);
/* A frame of op (NULL for answers) is written whole. */
void ddcpu_p2p_tx_done(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h,
                       ddcpu_p2p_op *op);
/* l's peer left: cleanly (its group closed: the ops that need it fail) or
 * not (the group fails: PEER_LOST naming it; err: the socket's errno). */
void ddcpu_p2p_peer_gone(ddcpu_group *g, ddcpu_p2p_link *l, int clean, int err);
/* l cannot carry anything (no connection within the timeout): its ops fail
 * with st and this thread's sentence. */
void ddcpu_p2p_link_failed(ddcpu_group *g, ddcpu_p2p_link *l, int st);

/* p2p_link.c */
int ddcpu_p2p_link_setup(ddcpu_group *g);
void ddcpu_p2p_link_close(ddcpu_group *g);
/* Look up where l's peer listens and start connecting (several nodes; the
 * first send to it). */
int ddcpu_p2p_connect(ddcpu_group *g, ddcpu_p2p_link *l);
/* Hand a frame (header h, len payload bytes at pay) to l's transport:
 * DDPLUG_OK when taken (a ring: written; a socket: written or being
 * written, ddcpu_p2p_tx_done follows), DDCPU_AGAIN when there is no room
 * now, or a failure. answer: a CTS/NAK (on a socket pair: the in one). */
int ddcpu_p2p_put(ddcpu_group *g, ddcpu_p2p_link *l, int answer, const ddcpu_frame *h,
                  const void *pay, uint64_t len, ddcpu_p2p_op *op);
/* Read every ring and socket, accept and prove connections, move partial
 * frames. Returns how many frames arrived. */
int ddcpu_p2p_link_io(ddcpu_group *g);
/* The sockets to poll (listener, handshakes, connections); how many. */
int ddcpu_p2p_fds(ddcpu_group *g, struct pollfd *pfd, int cap);
/* Ring a doorbell (a peer's or this rank's). */
void ddcpu_p2p_bell_ring(ddcpu_ctr *bell);

/* ---- who executes the queue (progress.c) ---------------------------------- */

/* Start / stop the progress thread (group_create / teardown). */
int ddcpu_engine_start(ddcpu_group *g);
void ddcpu_engine_stop(ddcpu_group *g);
/* Take the executor role (1) or find another thread holding it (0). At most
 * one thread executes the queue at a time. */
int ddcpu_exec_try(ddcpu_group *g);
/* Give the executor role back and wake the callers that sleep on g->ev. */
void ddcpu_exec_release(ddcpu_group *g);
/* Wake the progress thread (work for it, or stop). */
void ddcpu_progress_wake(ddcpu_group *g);
/* The oldest pending request, or NULL. */
ddcpu_req *ddcpu_queue_head(ddcpu_group *g);
/* Execute pending requests in order until `until` completes (NULL: until
 * none is left) or the deadline passes (DDCPU_AGAIN). Caller holds the
 * executor role; by_thread: the caller is the progress thread. */
int ddcpu_run_queue(ddcpu_group *g, ddcpu_req *until, uint64_t deadline, int by_thread);

/* ---- the request queue and the collective slots (collective.c) ---------------- */

/* Number of requests submitted and not complete. */
int ddcpu_pending(ddcpu_group *g);
/* group_destroy: free every request, pending or not. */
void ddcpu_free_all_requests(ddcpu_group *g);
int ddcpu_collective_start(ddplug_plugin_group *g, const ddplug_coll_args *args,
                           ddplug_plugin_request **req);
int ddcpu_request_wait(ddplug_plugin_group *g, ddplug_plugin_request *req,
                       int64_t timeout_ms);
int ddcpu_request_test(ddplug_plugin_group *g, ddplug_plugin_request *req,
                       int32_t *done);
void ddcpu_request_free(ddplug_plugin_group *g, ddplug_plugin_request *req);

/* ---- the group slots (group.c) ------------------------------------------------- */

int ddcpu_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                       ddplug_plugin_group **out);
int ddcpu_group_destroy(ddplug_plugin_group *g);
int ddcpu_group_abort(ddplug_plugin_group *g, const char *reason);

#endif /* DDPLUG_CPU_INTERNAL_H */
