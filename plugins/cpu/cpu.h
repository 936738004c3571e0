/*
 * cpu.h — the single internal header of the `cpu` plugin (CPU backend:
 * shared memory inside a node, a TCP ring between nodes). Everything here is
 * hidden (-fvisibility=hidden); the plugin exports only
 * ddplug_plugin_entry_v1. Internal names use the cp_ prefix. Files, one
 * concept each:
 *   plugin.c    the table, group create/destroy/abort, the slots
 *   options.c   plugin_options (strict JSON knobs)
 *   errors.c    thread-local error sentence, logging through host services
 *   reduce.c    dtype x op kernels (fp16/bf16 accumulate in float32)
 *   shm.c       segment create/attach/unlink, stale-segment cleanup
 *   wait.c      counters in shared memory: post, spin briefly, futex sleep
 *   failure.c   the group's failure record (abort, peer loss), liveness
 *               (pidfds of same-node peers, ring sockets), propagation
 *   tcp.c       sockets: listen/connect/accept, address exchange, framing
 *   handshake.c per-collective descriptors, mismatch detection, verdicts
 *   shm_coll.c  in-node algorithms: small-message path, chunked pipeline
 *   ring.c      inter-node ring (reduce-scatter/allgather, chain broadcast)
 *   coll.c      plans a collective as phases and drives them
 *   direct.c    the single-copy allreduce inside a node: ranks reduce
 *               straight from each other's buffers (registered memory or
 *               the kernel's process_vm_readv/writev), no staging
 *   mem.c       registered memory: per-rank arenas in the node segment,
 *               mem_alloc/free/query
 *   progress.c  requests, the in-order queue, the progress thread,
 *               request wait/test/free
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_PLUGIN_H
#define DDPLUG_CPU_PLUGIN_H

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ddplug/plugin.h"

#define DDCPU_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define DDCPU_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DDCPU_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Most ranks on one node (the kernels keep a source list on the stack). */
#define DDCPU_MAX_LOCAL 256

/* Longest human sentence the plugin produces. */
#define DDCPU_MSG_MAX 768

/* Internal results besides the DDPLUG_E_* codes (which are > 0). */
#define DDCPU_AGAIN (-1)   /* deadline reached, nothing failed: try again later */
#define DDCPU_BLOCKED (-2) /* a step cannot progress until its wait target moves */
#define DDCPU_DONE (-3)    /* a step finished its phase                         */

typedef struct ddplug_plugin_group ddcpu_group;
typedef struct ddplug_plugin_request ddcpu_req;

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

/* ---- options (options.c) ------------------------------------------------ */

typedef struct ddcpu_options {
  uint64_t chunk_bytes;     /* shm pipeline chunk per rank and slot       */
  uint64_t small_msg_bytes; /* bytes per rank up to which the one-shot path runs */
  int64_t spin_us;          /* spin before sleeping; -1 = automatic        */
  uint32_t slots;           /* pipeline depth (chunks in flight)          */
  uint64_t tcp_chunk_bytes; /* ring pipelining unit between nodes         */
  uint64_t nt_bytes;        /* outputs this large use streaming stores    */
  char addr[64];            /* address advertised to other nodes ("" = auto) */
  int64_t registered_bytes; /* registered memory per local rank; -1 = auto */
  int cma;                  /* DDCPU_CMA_AUTO, DDCPU_CMA_ON, DDCPU_CMA_OFF          */
  uint64_t cma_min_bytes;   /* unregistered allreduces this large use it    */
  int progress_thread;      /* DDCPU_PROGRESS_*              */
} ddcpu_options;

/* Values of ddcpu_options.progress_thread: whether the progress thread runs
 * collectives nobody waits for (it always watches liveness). */
enum { DDCPU_PROGRESS_AUTO = -1, DDCPU_PROGRESS_OFF = 0, DDCPU_PROGRESS_ON = 1 };
/* Values of ddcpu_options.cma. */
enum { DDCPU_CMA_AUTO = -1, DDCPU_CMA_OFF = 0, DDCPU_CMA_ON = 1 };
/* cma "auto" takes the kernel's copy when it moves at least this share of
 * memcpy's bytes per second (measured at group_create, direct.c). */
#define DDCPU_CMA_MIN_SPEED 0.6

/* The options the plugin declares (NULL-terminated), for its table. */
extern const ddplug_option *const ddcpu_option_decls[];
/* Read the checked options from the runtime (svc's option getters) into
 * *out. DDPLUG_E_CONFIG naming plugin_options.<key> for what only the plugin
 * checks (slots a power of two, addr an IPv4 literal). */
int ddcpu_options_read(const ddplug_host_services *svc, ddcpu_options *out);

/* ---- reduce kernels (reduce.c) ------------------------------------------ */

uint32_t ddcpu_dtype_size(int dtype);
const char *ddcpu_dtype_name(int dtype);
const char *ddcpu_op_name(int op);
const char *ddcpu_kind_name(int kind);
int ddcpu_dtype_is_int(int dtype);

/* dst[i] = op over k of srcs[k][i] for i < count, combining the sources in
 * order k = 0..nsrc-1 (so every rank computing the same reduction gets the
 * same bits). fp16/bf16 accumulate in float32 and round once. If divisor > 0
 * the result is divided by it (AVG): floats after accumulation, integers
 * truncated toward zero. op AVG accumulates as SUM. dst may alias srcs[k]. */
void ddcpu_reduce_n(int dtype, int op, void *dst, const void *const *srcs,
                    int nsrc, uint64_t count, int divisor);
/* The same, writing the result to every one of dsts[0..ndst) (block by
 * block: each block is reduced once, in L1, then stored ndst times), with
 * non-temporal stores when stream (call ddcpu_copy_fence before publishing).
 * No dst may alias a source other than at the same offset (in place). */
void ddcpu_reduce_bcast(int dtype, int op, void *const *dsts, int ndst,
                        const void *const *srcs, int nsrc, uint64_t count,
                        int divisor, int stream);
/* dst[i] = dst[i] op src[i] (two-operand form, used by the TCP ring). */
void ddcpu_reduce_into(int dtype, int op, void *dst, const void *src,
                       uint64_t count);
/* x[i] /= divisor (AVG finalisation after a SUM). */
void ddcpu_divide(int dtype, void *x, uint64_t count, int divisor);

/* Copy n bytes (copy.c): glibc's memcpy, except where it is slow (a
 * destination 1..31 bytes past the source modulo 4 KiB, on CPUs whose
 * `rep movsb` stalls there) and, with stream, through non-temporal stores
 * that bypass the cache (then call ddcpu_copy_fence before publishing). */
void ddcpu_copy(void *dst, const void *src, size_t n, int stream);
void ddcpu_copy_fence(int stream);

/* float16/bfloat16 buffer <-> float32 buffer (count elements; narrowing
 * rounds to nearest even). Used where a reduction spans several steps
 * (the multi-node allreduce): partial results stay float32 and are rounded
 * once at the end. */
void ddcpu_half_widen(int dtype, float *out, const void *in, uint64_t count);
void ddcpu_half_narrow(int dtype, void *out, const float *in, uint64_t count);
static inline int ddcpu_dtype_is_half(int dtype) {
  return dtype == DDPLUG_FLOAT16 || dtype == DDPLUG_BFLOAT16;
}

/* IEEE binary16 and bfloat16 conversions (round to nearest even). */
float ddcpu_half_to_float(uint16_t h);
uint16_t ddcpu_float_to_half(float f);
float ddcpu_bf16_to_float(uint16_t b);
uint16_t ddcpu_float_to_bf16(float f);

/* ---- counters in shared memory (wait.c) --------------------------------- */

/* A monotonically increasing 32-bit counter on its own cache line, with a
 * count of sleepers so that posting costs no system call when nobody sleeps.
 * Comparisons are wrap-safe. */
typedef struct ddcpu_ctr {
  _Atomic uint32_t val;
  _Atomic uint32_t waiters;
  char pad[56];
} ddcpu_ctr;

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
  int kind;        /* DDCPU_WAIT_CTR or DDCPU_WAIT_FDS                          */
  ddcpu_ctr *ctr;     /* CTR: until ctr >= until                             */
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

#define DDCPU_SHM_MAGIC 0x3148677570646464ull /* "dddpugH1" */
#define DDCPU_SHM_VERSION 2u
#define DDCPU_SHM_PREFIX "ddplug-cpu-"

/* A process that attached, for stale-segment cleanup and liveness. */
typedef struct ddcpu_proc {
  _Atomic int64_t pid;
  _Atomic uint64_t start_time; /* /proc/<pid>/stat starttime (clock ticks) */
  _Atomic uint32_t departed;   /* 1: left through group_destroy            */
  _Atomic uint32_t cma;        /* DDCPU_SC_*: can this rank read and write
                                  every local peer's memory (direct.c)    */
  uint64_t probe_addr;         /* address of a word peers probe with
                                  process_vm_readv/writev                  */
} ddcpu_proc;

enum { DDCPU_SC_UNKNOWN = 0, DDCPU_SC_NO = 1, DDCPU_SC_YES = 2 };

/* One collective as a rank saw it: compared across ranks at every
 * collective's handshake (mismatch detection). */
typedef struct ddcpu_desc {
  uint64_t seq;   /* runtime sequence number (args.seq)                   */
  uint64_t count;
  int32_t kind, dtype, op, root;
  int32_t rank;   /* who wrote it                                         */
  int32_t small;  /* 1 if the writer also put its data in its small slot  */
} ddcpu_desc;

/* The first failure of a group (abort, peer loss) as every rank reports it. */
typedef struct ddcpu_fail_rec {
  _Atomic uint32_t state; /* 0 none, 1 being written, 2 set              */
  int32_t status;         /* DDPLUG_E_ABORTED, _PEER_LOST, ...            */
  int32_t rank;           /* the rank lost, or the rank that aborted      */
  int32_t origin;         /* the rank that detected or called abort       */
  char msg[DDCPU_MSG_MAX];
} ddcpu_fail_rec;

/* Where a rank's buffers of one collective are (direct.c): addresses in
 * its own process (for process_vm_readv/writev) and, when registered,
 * offsets in the node segment (every local rank maps it). */
typedef struct ddcpu_bufref {
  uint64_t send, recv;         /* addresses in the writer's process       */
  int64_t send_off, recv_off;  /* node-segment offsets; -1: not registered */
} ddcpu_bufref;

/* Per-rank control block: the rank's counters and its descriptors. */
typedef struct ddcpu_rank_ctl {
  _Alignas(64) ddcpu_ctr arrive; /* low 32 bits of the last collective it arrived at */
  ddcpu_ctr cin;    /* pipeline chunks copied in (absolute)                 */
  ddcpu_ctr cred;   /* pipeline chunks reduced                              */
  ddcpu_ctr cout;   /* pipeline chunks finished (slot may be reused)        */
  ddcpu_ctr done;   /* direct path: low 32 bits of the last collective whose
                    slice this rank wrote into every rank's output       */
  ddcpu_desc desc[2];  /* by parity of the collective index                 */
  ddcpu_bufref buf[2]; /* by parity: this rank's buffers (direct path)      */
  _Atomic uint64_t writing;   /* collective index while this rank writes
                                 into other ranks' outputs, else 0       */
  _Atomic uint64_t withdrawn; /* collective index this rank abandoned
                                 after a failure (writers skip it)       */
} ddcpu_rank_ctl;

/* A node leader's running ring phase, for TIMEOUT messages on every rank
 * of the node (read by other threads and processes): which collective,
 * whether it still waits to receive / to send, and when it last received /
 * sent a byte (or started). */
typedef struct ddcpu_ring_watch {
  _Atomic uint64_t k;
  _Atomic uint64_t rx_ns, tx_ns;
  _Atomic uint32_t want_rx, want_tx;
} ddcpu_ring_watch;

typedef struct ddcpu_shm_hdr {
  _Atomic uint64_t magic; /* DDCPU_SHM_MAGIC once initialised (written last) */
  uint32_t version;
  int32_t local_world;
  int32_t node;
  int32_t num_nodes;
  uint32_t slots;
  uint32_t pad0;
  uint64_t total_bytes;
  uint64_t chunk_bytes;
  uint64_t small_bytes;
  char run_id[48];
  _Atomic int64_t creator_pid;
  _Atomic uint64_t creator_start;
  uint64_t procs_off, ctl_off, arrived_off, small_off, stage_off;
  uint64_t arena_off;   /* registered memory: local rank j's arena is at
                           arena_off + j * arena_bytes (sparse: pages exist
                           only once allocated)                          */
  uint64_t arena_bytes;
  ddcpu_ctr attached;      /* processes attached so far                    */
  ddcpu_ctr probed;        /* processes that published their cma verdict   */
  ddcpu_ctr verdict;       /* multi-node: collective index of the verdict  */
  int32_t verdict_status;
  int32_t pad1;
  char verdict_msg[DDCPU_MSG_MAX];
  ddcpu_fail_rec fail[2];  /* see failure.c                                 */
  ddcpu_ring_watch ring_watch; /* the leader's ring phase (ring.c)           */
} ddcpu_shm_hdr;

typedef struct ddcpu_shm_params {
  const char *run_id;
  int32_t local_world, node, num_nodes;
  uint32_t slots;
  uint64_t chunk_bytes, small_bytes;
  uint64_t arena_bytes;  /* registered memory per local rank (0: none)    */
} ddcpu_shm_params;

typedef struct ddcpu_shm {
  void *base;
  size_t size;
  int fd;                  /* kept open: registered memory reserves and
                              releases pages with fallocate             */
  char name[128];
  int creator;
  int unlinked;
  ddcpu_shm_hdr *hdr;
  ddcpu_proc *procs;          /* [local_world]                              */
  ddcpu_rank_ctl *ctl;        /* [local_world]                              */
  _Atomic uint64_t *arrived; /* [num_nodes] last collective index heard from */
  unsigned char *small;    /* [local_world][2][small_bytes]              */
  unsigned char *stage;    /* [slots][local_world][chunk_bytes]          */
  unsigned char *arena;    /* [local_world][arena_bytes]                 */
} ddcpu_shm;

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

#define DDCPU_TCP_MAGIC 0x48504c47u /* "GLPH" */
enum { DDCPU_MSG_HELLO = 1, DDCPU_MSG_ABORT = 2, DDCPU_MSG_BYE = 3 };

/* Control record travelling backwards around the ring (and BYE forwards). */
typedef struct ddcpu_ctl_msg {
  uint32_t magic;
  uint32_t type;
  int32_t status;
  int32_t rank;        /* lost or aborting rank                           */
  int32_t origin;      /* detecting rank                                  */
  int32_t origin_node;
  uint64_t run_hash;
  char msg[DDCPU_MSG_MAX];
} ddcpu_ctl_msg;

/* A control record of `type` from this rank (magic, run hash, origin). */
void ddcpu_ctl_init(const ddcpu_group *g, ddcpu_ctl_msg *m, uint32_t type);
int ddcpu_tcp_listen(int *fd, int *port);
/* Pick the address to advertise (option or first non-loopback IPv4). */
void ddcpu_tcp_local_addr(const char *opt, char *out, size_t cap);
/* Exact send with a deadline (control records, teardown). */
int ddcpu_tcp_send_all(int fd, const void *buf, size_t len, uint64_t deadline);
/* Tune a connected socket: TCP_NODELAY, buffers, keepalive, O_NONBLOCK. */
void ddcpu_tcp_tune(int fd);
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

/* Record of one node sent around the ring at a collective's handshake. */
typedef struct ddcpu_hs_rec {
  uint32_t magic;
  int32_t node;
  int32_t leader;       /* global rank of the node's leader               */
  int32_t status;       /* OK, or MISMATCH found inside the node           */
  uint64_t index;       /* internal collective index                      */
  ddcpu_desc desc;         /* the leader's descriptor                        */
  char detail[DDCPU_MSG_MAX];
} ddcpu_hs_rec;

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

/* ---- collectives ---------------------------------------------------------- */

/* Pipeline modes (shm_coll.c). */
enum {
  DDCPU_PIPE_ALLREDUCE = 1, /* all copy in, reduce own slice, all copy out   */
  DDCPU_PIPE_REDUCE_LEADER, /* same, only the leader copies out              */
  DDCPU_PIPE_BCAST,         /* one source copies in, the others copy out     */
  DDCPU_PIPE_ALLGATHER,     /* all copy their block in, all copy all out     */
  DDCPU_PIPE_GATHER_LEADER  /* all copy their block in, the leader copies out */
};

typedef struct ddcpu_pipe {
  int mode;
  int dtype;
  uint32_t esize;
  int in_dtype;             /* REDUCE_LEADER: a half type the input is in,
                               widened to dtype (float32) at copy-in; 0 =
                               the input is dtype                          */
  int src;                  /* BCAST: local index of the source         */
  int op;                   /* reduce op (AVG → SUM + divisor)           */
  int divisor;
  const unsigned char *in;  /* what this rank copies in                  */
  unsigned char *out;       /* where copy-out writes                     */
  uint64_t elems;           /* elements per copy-in rank                 */
  uint64_t chunk_elems;
  uint64_t nchunks;
  uint32_t base;            /* chunk clock at phase entry                */
  uint64_t c_in, c_red, c_out; /* this rank's progress (relative chunks) */
  int stream;               /* write the output with non-temporal stores */
} ddcpu_pipe;

/* Ring operations (ring.c). */
enum { DDCPU_RING_ALLREDUCE = 1, DDCPU_RING_ALLGATHER, DDCPU_RING_BCAST, DDCPU_RING_RECORDS };

typedef struct ddcpu_ring {
  int op;
  unsigned char *buf;
  uint64_t count;        /* ALLREDUCE/BCAST: elements                    */
  uint64_t block_bytes;  /* ALLGATHER: bytes per rank; RECORDS: per node  */
  int redop;
  int divisor;
  int dtype;
  uint32_t esize;
  int root_node;         /* BCAST                                        */
  uint64_t index;        /* RECORDS: collective index (arrival tracking) */
  int nsteps;
  int ts, tr;            /* current send / receive step                  */
  uint64_t sent, rcvd, red, fill;
  int active;
} ddcpu_ring;

enum {
  DDCPU_PH_HANDSHAKE = 1, /* local descriptors (+ small data), compare      */
  DDCPU_PH_VERDICT,       /* multi-node: ring handshake (leader) / wait     */
  DDCPU_PH_SMALL,         /* one-shot finish of the small-message path      */
  DDCPU_PH_PIPE,          /* shm chunk pipeline                             */
  DDCPU_PH_RING,          /* leader: TCP ring                               */
  DDCPU_PH_COPY,          /* local copy (single rank on a node, world 1)    */
  DDCPU_PH_WIDEN,         /* half type -> float32 scratch (leader)           */
  DDCPU_PH_NARROW,        /* float32 scratch -> half type, rounded once      */
  DDCPU_PH_DIRECT         /* single-copy allreduce (direct.c); becomes
                          DDCPU_PH_PIPE when some rank's buffers cannot be
                          reached directly                               */
};

/* State of a DDCPU_PH_DIRECT phase. */
typedef struct ddcpu_direct {
  const unsigned char *send;
  unsigned char *recv;
  uint64_t count;
  int dtype, op, divisor;   /* op: AVG already turned into SUM + divisor */
  int wrote;                /* this rank's slice is in every output       */
} ddcpu_direct;

typedef struct ddcpu_phase {
  int kind;
  int entered;
  union {
    ddcpu_pipe pipe;
    ddcpu_ring ring;
    ddcpu_direct direct;
    struct { const void *src; void *dst; uint64_t bytes; } copy;
    struct { const void *src; void *dst; uint64_t count; int dtype; } conv;
  } u;
} ddcpu_phase;

#define DDCPU_MAX_PHASES 6

struct ddplug_plugin_request {
  ddplug_coll_args args;
  uint64_t k;                 /* internal collective index (1, 2, ...)    */
  uint64_t submit_ns;
  _Atomic int done;           /* 1 once complete (status/msg valid)      */
  int status;
  char msg[DDCPU_MSG_MAX];
  int user_freed;             /* guarded by the queue mutex              */
  _Atomic int by_thread;      /* 1 if the progress thread executed it     */
  /* execution state (touched only by the executor) */
  int planned;
  int small;
  int nph, cur;
  ddcpu_phase ph[DDCPU_MAX_PHASES];
  ddcpu_hs_rec *recs;            /* leader: ring handshake records           */
  float *wide;                /* leader, multi-node half-type allreduce:
                                 float32 partial sums (freed at completion) */
  int direct;                 /* planned with a DDCPU_PH_DIRECT phase: after
                                 arriving, peers may write into its output */
  struct ddplug_plugin_request *next, *prev; /* pending queue            */
  struct ddplug_plugin_request *anext, *aprev; /* all requests           */
};

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

/* mem.c */
int ddcpu_mem_alloc(ddcpu_group *g, uint64_t bytes, void **ptr);
int ddcpu_mem_free(ddcpu_group *g, void *ptr);
int ddcpu_mem_query(ddcpu_group *g, const void *ptr, uint64_t bytes, int32_t *reach);
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

/* ---- requests and progress (progress.c) ---------------------------------- */

int ddcpu_engine_start(ddcpu_group *g);
void ddcpu_engine_stop(ddcpu_group *g);
int ddcpu_submit(ddcpu_group *g, const ddplug_coll_args *a, ddcpu_req **out);
int ddcpu_req_wait(ddcpu_group *g, ddcpu_req *r, int64_t timeout_ms);
int ddcpu_req_test(ddcpu_group *g, ddcpu_req *r, int32_t *done);
void ddcpu_req_free(ddcpu_group *g, ddcpu_req *r);
/* Number of requests submitted and not complete. */
int ddcpu_pending(ddcpu_group *g);
void ddcpu_free_all_requests(ddcpu_group *g);

/* ---- the group ------------------------------------------------------------ */

enum { DDCPU_PT_BUSY = 0, DDCPU_PT_LIGHT = 1, DDCPU_PT_DEEP = 2 };

struct ddplug_plugin_group {
  /* identity */
  int rank, world, local_rank, local_world, node, num_nodes;
  int32_t *node_of;     /* [world]                                       */
  int32_t *local_of;    /* [world]                                       */
  int64_t *pid_of;      /* [world]                                       */
  int32_t *local_ranks; /* [local_world] global rank of each local index */
  int32_t *leaders;     /* [num_nodes] global rank of each node's leader */
  int32_t *node_size;   /* [num_nodes]                                   */
  int32_t **node_ranks; /* [num_nodes][node_size] ranks in rank order    */
  int leader;           /* 1 if local_rank == 0                          */
  char run_id[48];
  uint64_t run_hash;
  char host_id[64];
  const ddplug_host_services *svc;
  int32_t log_level;
  int64_t timeout_ms;
  ddcpu_options opt;
  uint64_t spin_ns;

  /* node segment (local_world > 1) */
  int has_shm;
  ddcpu_shm shm;

  /* ring (leaders, num_nodes > 1) */
  int next_fd, prev_fd;
  pthread_mutex_t ctl_mu;  /* writes of control messages on prev_fd    */
  unsigned char ctl_rx[sizeof(ddcpu_ctl_msg)];
  size_t ctl_rx_len;
  int next_bye, prev_bye;  /* neighbours said goodbye                    */
  int ring_active;         /* a ring phase is reading prev_fd            */
  ddcpu_ring_watch ring_watch_local; /* without shared memory (see ddcpu_ring_watch_of) */
  _Atomic int ring_told[2]; /* each failure slot went out on the ring   */
  unsigned char *ring_tmp; /* tcp_chunk_bytes scratch for reductions    */
  _Atomic uint64_t *arrived_local; /* [num_nodes] when there is no shm  */

  /* liveness */
  int *pidfd;              /* [local_world], -1 for self/none            */
  _Atomic int *pid_gone;   /* [local_world] exit seen (clean or not)     */
  int pid_poll;            /* no pidfds: poll /proc at liveness checks   */
  int abort_fd;            /* eventfd, readable once the group failed   */

  /* failure (failure.c): two write-once slots, see there */
  _Atomic int fail_status;     /* effective status, 0 while healthy      */
  ddcpu_fail_rec fail[2];
  _Atomic int stopping;

  /* engine */
  pthread_mutex_t q_mu;
  ddcpu_req *q_head, *q_tail;     /* pending, in order                      */
  ddcpu_req *all;                 /* every request not yet released          */
  uint64_t next_k;             /* guarded by q_mu                         */
  _Atomic uint64_t exec_k;     /* index being executed (for messages)     */
  _Atomic int exec;            /* 1 while some thread executes            */
  ddcpu_ctr ev;                   /* bumped at completions and exec release */
  _Atomic int lazy;            /* callers execute inline; thread waits   */
  _Atomic int pt_mode;
  _Atomic uint64_t last_submit_ns;
  int wake_fd;                 /* eventfd: work for the progress thread  */
  pthread_t thread;
  int thread_started;
  uint32_t chunk_clock;        /* executor only                          */
  ddcpu_hs_rec *recs;             /* executor only: [num_nodes]             */
  uint64_t exec_deadline;      /* executor only: the running call's deadline */
  uint64_t ring_broken_ns;     /* executor only: when a ring socket broke */
  int progress_runs;           /* the progress thread runs collectives
                                  nobody waits for (progress_thread)     */
  int spare_cpu;               /* the node's ranks leave a CPU of this
                                  process's affinity mask free           */
  int exec_by_thread;          /* executor only: the progress thread is it */
  _Atomic int callers_waiting; /* callers asleep in request_wait while
                                  another thread executes                */
  _Atomic int handoff;         /* a timed-out wait left requests for the
                                  progress thread to finish              */

  /* single copy (direct.c) */
  _Atomic uint64_t probe_word; /* peers read and write it back (probe)   */
  int cma_all;                 /* every local rank's verdict is DDCPU_SC_YES */
  unsigned char *dscratch;     /* executor only: blocks read from peers   */
  uint64_t dblock;             /* bytes per block of the single copy      */

  /* registered memory (mem.c) */
  pthread_mutex_t mem_mu;
  struct ddcpu_alloc *allocs;     /* live allocations, by address           */
  int nallocs, allocs_cap;
  uint64_t mem_used;           /* bytes of this rank's arena in use      */
};

/* The node's ring watch: in shared memory when there is some, so that
 * every local rank can name a stalled neighbour. */
static inline ddcpu_ring_watch *ddcpu_ring_watch_of(ddcpu_group *g) {
  return g->has_shm && g->shm.hdr ? &g->shm.hdr->ring_watch : &g->ring_watch_local;
}

#endif /* DDPLUG_CPU_PLUGIN_H */
