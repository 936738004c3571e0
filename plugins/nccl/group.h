/*
 * group.h — the nccl plugin's group (the slot ddplug_plugin_group) and its
 * requests (ddplug_plugin_request), with the types they hold: the options,
 * this rank's device record, and the pools of CUDA events and staging
 * buffers (staging.c). group.c creates and destroys the group;
 * collective.c starts, waits for and frees the requests (p2p.c starts the
 * sends and receives).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_NCCL_GROUP_H
#define DDPLUG_NCCL_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ddplug/plugin.h"

/* Longest error sentence the plugin composes. */
#define DDNCCL_MSG_MAX 1024

/* ---- the options (options.c) ----------------------------------------------- */

typedef struct ddnccl_options {
  int32_t *device_map;     /* owned; NULL when not given                 */
  uint32_t device_map_len;
  int allow_shared_gpu;    /* 0/1, default 0                             */
  int check_mismatch;      /* 0/1, default 0                             */
  int shrink_auto;         /* shrink "auto" (1) or "recreate" (0)        */
} ddnccl_options;

/* ---- the device record (device.c) -------------------------------------------- */

/* What a rank publishes about its device (text form: device records are
 * exchanged through the store and compared on every rank). */
typedef struct ddnccl_devrec {
  int32_t rank;
  int32_t ordinal;         /* CUDA ordinal as this process sees it       */
  int32_t nccl_version;    /* ncclGetVersion() of the loaded libnccl     */
  int32_t multi_rank_env;  /* NCCL_MULTI_RANK_GPU_ENABLE=1 in its env    */
  char uuid[48];           /* "GPU-xxxxxxxx-xxxx-..."                    */
  char pci[32];            /* "0000:3b:00.0"                             */
  char name[96];           /* "NVIDIA H100 80GB HBM3"                    */
  char host[128];          /* the runtime's host id                      */
} ddnccl_devrec;

/* ---- events and staging buffers (staging.c) ---------------------------------- */

/* A reusable CUDA event, shared by a request and (as "the last operation
 * enqueued") by its group; returned to the pool when both let go. */
typedef struct ddnccl_event {
  cudaEvent_t ev;
  int32_t refs;
  struct ddnccl_event *next;
} ddnccl_event;

/* A host↔device staging pair: bytes of device memory and as many bytes of
 * pinned host memory. Owned by the group's pool; busy while a request uses
 * it. */
typedef struct ddnccl_stage {
  void *dev;
  void *host;
  size_t cap;
  int busy;
  ddnccl_event *fence; /* busy until this event completes (a ref)   */
  struct ddnccl_stage *next;
} ddnccl_stage;

typedef struct ddnccl_pool {
  ddnccl_event *free_events;
  ddnccl_stage *stages;
} ddnccl_pool;

/* ---- the group and its requests ---------------------------------------------- */

enum { DDNCCL_PENDING = 0, DDNCCL_DONE = 1, DDNCCL_FAILED = 2 };
/* ddplug_plugin_request.kind of a send and a receive (after the
 * collectives' ddplug_coll_kind values). */
enum { DDNCCL_KIND_SEND = 101, DDNCCL_KIND_RECV = 102 };

struct ddplug_plugin_request {
  struct ddplug_plugin_request *next, *prev; /* the group's live list      */
  ddplug_plugin_group *group;
  uint64_t seq;
  int32_t kind;
  int32_t state;             /* DDNCCL_PENDING, _DONE, _FAILED             */
  int status;                /* final status once not PENDING              */
  int freed;                 /* request_free called while still pending    */
  ddnccl_event *event;  /* recorded after the last enqueued step      */
  ddnccl_stage *stage;  /* staging for host buffers, or NULL          */
  void *out_dst;             /* host recv buffer to fill when done         */
  const void *out_src;       /* pinned bytes to copy from                  */
  size_t out_bytes;
  /* a send or receive (p2p.c) */
  void *p2p_buf;             /* the caller's buffer                        */
  void *p2p_dev;             /* what NCCL gets (p2p_buf or the staging)    */
  uint64_t p2p_count;
  size_t p2p_bytes;
  ncclDataType_t p2p_ndt;
  int32_t p2p_peer;
  int p2p_host, p2p_pinned;  /* the buffer is host memory (pinned)        */
  cudaStream_t p2p_stream;   /* the caller's, or NULL                      */
  uint64_t start_ns;
  char what[160];            /* "allreduce seq 7 (1024 x float32, sum)"    */
  char msg[DDNCCL_MSG_MAX]; /* the final failure's sentence          */
};

struct ddplug_plugin_group {
  const ddplug_group_init *init;     /* borrowed until group_destroy        */
  const ddplug_host_services *svc;   /* borrowed until group_destroy        */
  int32_t rank, world, log_level;
  int64_t timeout_ms;                /* collective timeout (watchdog)       */
  ddnccl_options opts;
  ddnccl_devrec self;
  int32_t device;
  int shared_gpu;
  int warn_shared_gpu;               /* checks.duplicate_gpu = "warn"       */

  /* comm is read and used under comm_mu by the slot thread and cleared
   * (after ncclCommAbort) under comm_mu by group_abort from any thread. */
  pthread_mutex_t comm_mu;
  ncclComm_t comm;
  /* After a failure with shrink "auto" (and an NCCL that can): the
   * communicator, revoked instead of aborted so that group_shrink can
   * shrink it (shrink.c); group_destroy aborts it. Under comm_mu. */
  ncclComm_t revoked;
  int ready;                         /* created (group_create/_shrink done) */
  atomic_int failed;                 /* set once; then every call fails     */
  int fail_status;                   /* under comm_mu                       */
  char fail_msg[DDNCCL_MSG_MAX]; /* under comm_mu                     */

  uint64_t mm_round;                 /* mismatch checks so far (slot thread) */

  cudaStream_t stream;               /* internal: barriers                  */
  int32_t *scratch;                  /* device int32 for barriers           */
  ddnccl_pool pool;
  ddnccl_event *last_event;     /* last operation enqueued (a ref)     */
  cudaStream_t last_stream;
  ddplug_plugin_request *live;       /* requests not yet freed              */
  ddplug_plugin_request *spare;      /* freed requests kept for reuse       */
  ddplug_plugin_request **p2p_queue; /* sends and receives not yet launched
                                        (p2p.c), in the order started      */
  int p2p_n, p2p_cap;
  uint64_t abort_poll_ns;            /* next time waits look at the store   */
};

#endif /* DDPLUG_NCCL_GROUP_H */
