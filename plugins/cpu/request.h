/*
 * request.h — a collective's execution state: the request (the slot
 * ddplug_plugin_request) and the phases plan.c turns it into, each with
 * the state of its mechanism: the shared-memory chunk pipeline
 * (shm_coll.c), the TCP ring (ring.c), the single copy (direct.c), plain
 * copies and float16/bfloat16 conversions. Touched by the executor only,
 * except the fields marked otherwise.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_REQUEST_H
#define DDPLUG_CPU_REQUEST_H

#include <stdatomic.h>
#include <stdint.h>

#include "ddplug/plugin.h"
#include "wire.h"

typedef struct ddplug_plugin_request ddcpu_req;

/* The first member of every request the slots hand out: a collective (the
 * struct below) or a send or receive (ddcpu_p2p_op, p2p.h). request_wait,
 * request_test and request_free read kind through it. */
typedef struct ddcpu_req_head {
  int kind; /* DDCPU_REQ_*                                                */
} ddcpu_req_head;
enum { DDCPU_REQ_COLL = 0, DDCPU_REQ_P2P = 1 };
static inline int ddcpu_req_kind(const void *req) {
  return ((const ddcpu_req_head *)req)->kind;
}

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
  uint64_t copied_in, reduced, copied_out; /* this rank's progress, in chunks
                                              of this phase (ddcpu_rank_ctl
                                              counts since the group began) */
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
  int send_step;         /* the ring step this rank sends in (0..nsteps) */
  int recv_step;         /* the ring step this rank receives in          */
  uint64_t sent, rcvd, red, fill;
  int active;
} ddcpu_ring;

/* Phase kinds (plan.c). */
enum {
  DDCPU_PH_HANDSHAKE = 1, /* local descriptors (+ small data), compare      */
  DDCPU_PH_VERDICT,       /* multi-node: ring handshake (leader) / wait     */
  DDCPU_PH_SMALL,         /* one-shot finish of the small-message path      */
  DDCPU_PH_PIPE,          /* shm chunk pipeline                             */
  DDCPU_PH_RING,          /* leader: TCP ring                               */
  DDCPU_PH_COPY,          /* local copy (single rank on a node, world 1)    */
  DDCPU_PH_WIDEN,         /* half type -> float32 scratch (leader)          */
  DDCPU_PH_NARROW,        /* float32 scratch -> half type, rounded once     */
  DDCPU_PH_DIRECT         /* single-copy allreduce (direct.c); becomes
                             DDCPU_PH_PIPE when some rank's buffers cannot
                             be reached directly                          */
};

/* State of a DDCPU_PH_DIRECT phase. */
typedef struct ddcpu_direct {
  const unsigned char *send;
  unsigned char *recv;
  uint64_t count;
  int dtype, op, divisor;   /* op: AVG already turned into SUM + divisor */
  int mode;                 /* DDCPU_DIRECT_* (decided after the handshake) */
  int pushed;               /* push: this rank's shares are in the peers'  */
  int wrote;                /* this rank's slice is in every output       */
} ddcpu_direct;

/* How a direct allreduce reaches the peers' buffers (direct.c). */
enum { DDCPU_DIRECT_NO = 0, DDCPU_DIRECT_ALL = 1, DDCPU_DIRECT_PUSH = 2 };

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
  ddcpu_req_head head;        /* kind DDCPU_REQ_COLL (0: calloc'd)       */
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
  ddcpu_hs_rec *recs;         /* leader: ring handshake records           */
  float *wide;                /* leader, multi-node half-type allreduce:
                                 float32 partial sums (freed at completion) */
  int direct;                 /* planned with a DDCPU_PH_DIRECT phase: after
                                 arriving, peers may write into its output */
  struct ddplug_plugin_request *next, *prev; /* pending queue            */
  struct ddplug_plugin_request *anext, *aprev; /* all requests           */
};

#endif /* DDPLUG_CPU_REQUEST_H */
