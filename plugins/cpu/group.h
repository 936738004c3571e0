/*
 * group.h — the cpu plugin's group (the slot ddplug_plugin_group): one
 * rank's state from group_create to group_destroy. Identity and topology,
 * the options, the node segment as this process maps it, the ring's
 * sockets, liveness, the failure state, the request queue and who executes
 * it, the single copy's probe and registered memory. Which file owns which
 * part is said at each part; group.c creates and destroys it all.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_GROUP_H
#define DDPLUG_CPU_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ddplug/plugin.h"
#include "request.h"
#include "shm_layout.h"
#include "wire.h"

typedef struct ddplug_plugin_group ddcpu_group;

/* ---- the options (options.c) ---------------------------------------------- */

typedef struct ddcpu_options {
  uint64_t chunk_bytes;     /* shm pipeline chunk per rank and slot          */
  uint64_t small_msg_bytes; /* bytes per rank up to which the one-shot path
                               runs                                         */
  int64_t spin_us;          /* spin before sleeping; -1 = automatic         */
  uint32_t slots;           /* pipeline depth (chunks in flight)             */
  uint64_t tcp_chunk_bytes; /* ring pipelining unit between nodes            */
  uint64_t nt_bytes;        /* outputs this large use streaming stores       */
  char addr[64];            /* address advertised to other nodes ("" = auto) */
  int64_t registered_bytes; /* registered memory per local rank; -1 = auto  */
  int cma;                  /* DDCPU_CMA_AUTO, DDCPU_CMA_ON, DDCPU_CMA_OFF  */
  uint64_t cma_min_bytes;   /* unregistered allreduces this large use it     */
  int progress_thread;      /* DDCPU_PROGRESS_*                              */
} ddcpu_options;

/* Values of ddcpu_options.progress_thread: whether the progress thread runs
 * collectives nobody waits for (it always watches liveness). */
enum { DDCPU_PROGRESS_AUTO = -1, DDCPU_PROGRESS_OFF = 0, DDCPU_PROGRESS_ON = 1 };
/* Values of ddcpu_options.cma. */
enum { DDCPU_CMA_AUTO = -1, DDCPU_CMA_OFF = 0, DDCPU_CMA_ON = 1 };
/* cma "auto" takes the kernel's copy when it moves at least this share of
 * memcpy's bytes per second of CPU time (measured by local rank 0 at
 * group_create, direct.c). */
#define DDCPU_CMA_MIN_SPEED 0.6

/* ---- the node segment as this process maps it (shm.c) --------------------- */

/* What the segment is made for (every rank of the node must agree). */
typedef struct ddcpu_shm_params {
  const char *run_id;
  int32_t local_world, node, num_nodes;
  uint32_t slots;
  uint64_t chunk_bytes, small_bytes;
  uint64_t arena_bytes;  /* registered memory per local rank (0: none)    */
} ddcpu_shm_params;

/* The mapping, with a pointer to each region (shm_layout.h). */
typedef struct ddcpu_shm {
  void *base;
  size_t size;
  int fd;                     /* kept open: registered memory reserves and
                                 releases pages with fallocate             */
  char name[128];
  int creator;
  int unlinked;
  ddcpu_shm_hdr *hdr;
  ddcpu_proc *procs;          /* [local_world]                              */
  ddcpu_rank_ctl *ctl;        /* [local_world]                              */
  _Atomic uint64_t *arrived;  /* [num_nodes] last collective index heard from */
  unsigned char *small;       /* [local_world][2][small_bytes]              */
  unsigned char *stage;       /* [slots][local_world][chunk_bytes]          */
  unsigned char *arena;       /* [local_world][arena_bytes]                 */
  ddcpu_ctr *bell;            /* [local_world] point-to-point doorbells     */
  ddcpu_p2p_ring_ctl *p2p_ctl; /* [local_world][local_world]                */
  unsigned char *p2p;         /* [local_world][local_world][p2p_ring_bytes] */
} ddcpu_shm;

/* ---- the group -------------------------------------------------------------- */

/* What the progress thread is doing (ddplug_plugin_group.thread_mode), for
 * collective_start to decide whether to wake it (progress.c). */
enum {
  DDCPU_THREAD_AWAKE = 0,   /* running requests, or about to look again   */
  DDCPU_THREAD_NAPPING = 1, /* callers run their collectives inline and
                               one started within the last second: it
                               polls every millisecond (progress_thread
                               on) and claims stranded requests itself,
                               so a start need not wake it               */
  DDCPU_THREAD_ASLEEP = 2   /* idle for a second or more: wakes every
                               100 ms for liveness only, so a start must
                               wake it                                   */
};

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
  ddcpu_ring_watch ring_watch_local; /* without shared memory (see
                                        ddcpu_ring_watch_of)             */
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
  ddcpu_req *q_head, *q_tail;  /* pending, in order                      */
  ddcpu_req *all;              /* every request not yet released          */
  uint64_t next_k;             /* guarded by q_mu                         */
  _Atomic uint64_t exec_k;     /* index being executed (for messages)     */
  _Atomic int exec;            /* 1 while some thread executes            */
  ddcpu_ctr ev;                /* bumped at completions and exec release */
  _Atomic int lazy;            /* callers execute inline; thread waits   */
  _Atomic int thread_mode;     /* DDCPU_THREAD_*                          */
  _Atomic uint64_t last_submit_ns;
  int wake_fd;                 /* eventfd: work for the progress thread  */
  pthread_t thread;
  int thread_started;
  uint32_t chunk_clock;        /* executor only                          */
  ddcpu_hs_rec *recs;          /* executor only: [num_nodes]             */
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

  /* point-to-point (p2p.c, p2p_link.c) */
  struct ddcpu_p2p *p2p;

  /* registered memory (mem.c) */
  pthread_mutex_t mem_mu;
  struct ddcpu_alloc *allocs;  /* live allocations, by address           */
  int nallocs, allocs_cap;
  uint64_t mem_used;           /* bytes of this rank's arena in use      */
};

/* The node's ring watch: in shared memory when there is some, so that
 * every local rank can name a stalled neighbour. */
static inline ddcpu_ring_watch *ddcpu_ring_watch_of(ddcpu_group *g) {
  return g->has_shm && g->shm.hdr ? &g->shm.hdr->ring_watch : &g->ring_watch_local;
}

#endif /* DDPLUG_CPU_GROUP_H */
