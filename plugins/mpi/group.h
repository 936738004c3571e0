/*
 * group.h — the mpi backend's group (the slot ddplug_plugin_group) and its
 * requests (ddplug_plugin_request), with the process-wide MPI state they
 * share (ddmpi_proc): MPI is one per process, so is its lock, its progress
 * thread and the list of live groups. group.c creates and destroys groups;
 * collective.c and p2p.c start requests; progress.c moves them.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_MPI_GROUP_H
#define DDPLUG_MPI_GROUP_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ddplug/plugin.h"
#include "frontend.h"

/* Longest error sentence the plugin composes. */
#define DDMPI_MSG_MAX 1024

/* ---- the options (options.c) ---------------------------------------------- */

enum { DDMPI_INTRA_AUTO = -1, DDMPI_INTRA_MPI = 0, DDMPI_INTRA_CPU = 1 };

typedef struct ddmpi_options {
  int check_mismatch;      /* 0/1: compare every collective across ranks  */
  int intra_node;          /* DDMPI_INTRA_*: who reduces inside a node    */
  int64_t slow_ms;         /* a collective pending this long publishes its
                              arrival (who-has-arrived, for timeouts)     */
  int shrink_recreate;     /* 0/1: group_shrink declines (a new group)    */
} ddmpi_options;

/* ---- requests ------------------------------------------------------------- */

/* What a request is. */
enum { DDMPI_REQ_COLL = 1, DDMPI_REQ_SEND = 2, DDMPI_REQ_RECV = 3 };

/* Where a request is. A collective: CHECK (the descriptor allreduce, when
 * check_mismatch) -> POST (waiting for its turn to post the data) -> DATA
 * (MPI requests in flight; the node part of a hierarchical allreduce is a
 * chain of stages of its own, hier.c) -> DONE or FAILED. A receive: HEADER
 * (the sender's count and dtype) -> DATA. A send: DATA. */
enum {
  DDMPI_ST_CHECK = 1,
  DDMPI_ST_POST = 2,
  DDMPI_ST_DATA = 3,
  DDMPI_ST_HIER = 4,
  DDMPI_ST_HEADER = 5,
  DDMPI_ST_DONE = 6,
  DDMPI_ST_FAILED = 7
};

/* One element of the mismatch descriptor: MPI_LONG_INT, reduced with
 * MPI_MINLOC (value and the lowest rank that has it). */
typedef struct ddmpi_pair {
  long v;
  int r;
} ddmpi_pair;
/* seq, kind, count, dtype, op, root */
#define DDMPI_DESC_FIELDS 6

/* The p2p header a send carries before its payload. */
typedef struct ddmpi_p2p_header {
  int64_t count;
  int32_t dtype;
  int32_t esize;
} ddmpi_p2p_header;

#define DDMPI_INLINE_REQS 4

struct ddplug_plugin_request {
  struct ddplug_plugin_request *next, *prev; /* the group's queue (in order)  */
  struct ddplug_plugin_request *lnext, *lprev; /* the group's live list       */
  ddplug_plugin_group *group;
  int32_t kind;             /* DDMPI_REQ_*                                    */
  int32_t stage;            /* DDMPI_ST_*                                     */
  int status;               /* final once DONE or FAILED                      */
  int freed;                /* request_free came while pending                */
  int mpi_done;             /* its MPI requests finished (DONE waits for the
                               ones before it: collectives complete in order) */
  uint64_t seq;
  uint64_t start_ns;
  ddplug_coll_args a;       /* collectives: a copy                            */
  ddplug_p2p_args p;        /* point-to-point: a copy                         */
  int32_t source;           /* a receive: the matched sender                  */
  int hdr_done;             /* a receive: its header arrived                  */
  int p2p_mismatch;         /* a receive: the sender's count or dtype differ  */
  /* MPI requests of the current stage. */
  MPI_Request *mreq;
  int nreq;
  MPI_Request inline_reqs[DDMPI_INLINE_REQS];
  MPI_Request check;        /* the descriptor allreduce                       */
  ddmpi_pair desc_in[2 * DDMPI_DESC_FIELDS], desc_out[2 * DDMPI_DESC_FIELDS];
  ddmpi_p2p_header hdr;     /* a send's header, or the one a receive got      */
  void *scratch;            /* float32 sums of float16/bfloat16, or a
                               mismatched receive's discarded payload        */
  int hier_step;            /* hier.c                                        */
  ddplug_plugin_request *sub; /* hier.c: the cpu group's request in flight    */
  char what[160];           /* "allreduce seq 7 (1031 x float32, sum)"        */
  char msg[DDMPI_MSG_MAX];  /* the failure's sentence                         */
};

/* ---- the group -------------------------------------------------------------- */

typedef struct ddmpi_hier ddmpi_hier; /* hier.c */

struct ddplug_plugin_group {
  const ddplug_group_init *init;   /* borrowed until group_destroy           */
  const ddplug_host_services *svc; /* borrowed until group_destroy           */
  int32_t rank, world, log_level;
  int64_t timeout_ms;              /* the collective timeout                 */
  ddmpi_options opts;
  MPI_Comm comm;                   /* the data of collectives                */
  MPI_Comm check_comm;             /* the mismatch descriptors               */
  MPI_Comm p2p_comm;               /* point-to-point headers                 */
  MPI_Comm p2p_data_comm;          /* point-to-point payloads                */
  int32_t *world_rank_of;          /* [world] MPI_COMM_WORLD rank of each rank */

  /* Under ddmpi_proc.mu: */
  ddplug_plugin_request *coll_head, *coll_tail; /* collectives, in order      */
  ddplug_plugin_request *p2p_head, *p2p_tail;   /* sends and receives         */
  ddplug_plugin_request *live;     /* every request not yet released        */
  int failed;                      /* then every call fails with fail_status  */
  int fail_status;
  char fail_msg[DDMPI_MSG_MAX];
  int abandoned;                   /* MPI requests were left pending          */
  struct ddplug_plugin_group *next_group; /* ddmpi_proc.groups               */

  atomic_int waiters;              /* threads polling inside request_wait     */
  atomic_uint_fast64_t arrived_published; /* highest seq published (arrival.c) */
  atomic_int reporting;            /* one thread names the missing ranks      */
  ddmpi_hier *hier;                /* hier.c, or NULL: every collective flat  */
};

/* ---- the process ------------------------------------------------------------ */

typedef struct ddmpi_proc {
  pthread_mutex_t mu;              /* every MPI call of the plugin after init,
                                      the groups' queues and failure state   */
  pthread_cond_t work_cv;          /* new work for the progress thread       */
  ddmpi_library lib;               /* what the front end loaded              */
  int ready;                       /* MPI initialised and checked            */
  int we_initialised;              /* so we finalize it, at exit             */
  int broken;                      /* MPI requests were abandoned: never
                                      finalize (it would wait for them)      */
  int unsettled;                   /* a run began here (bootstrap_world,
                                      group_create) and has no group yet: if
                                      it failed there, its peers may not
                                      finalize either; never finalize        */
  int world_rank, world_size;
  int tag_ub;
  MPI_Comm boot_comm;              /* bootstrap broadcasts (MPI_COMM_NULL
                                      until the first)                       */
  MPI_Comm recreate_parent;        /* survivors' communicator group_shrink
                                      left ("recreate") for the next
                                      group_create, or MPI_COMM_NULL        */
  MPI_Op half_min[2], half_max[2]; /* float16, bfloat16 (types.c)            */
  ddplug_plugin_group *groups;     /* live groups                            */
  int thread_running;
  int thread_stop;
  pthread_t thread;
  atomic_uint_fast64_t work_epoch; /* bumped by every start                  */
} ddmpi_proc;

extern ddmpi_proc ddmpi_p;

#endif /* DDPLUG_MPI_GROUP_H */
