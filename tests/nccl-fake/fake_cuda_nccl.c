/* fake_cuda_nccl.c — an in-process stand-in for the parts of the CUDA
 * runtime and of NCCL that the nccl plugin calls, with the real headers'
 * signatures, so that test-nccl-fake runs the plugin's collective, staging,
 * request, timeout and abort code on a machine without a GPU (and under
 * ASan, TSan and valgrind). It is a model, not an emulator:
 *
 *   - ranks are threads of one process; each has its own current device and
 *     its own default ("legacy") stream, as separate processes would;
 *   - "device memory" is host memory the fake tracks (cudaMalloc), so
 *     cudaPointerGetAttributes tells device, pinned (cudaHostAlloc) and
 *     ordinary host memory apart, and the NCCL calls REFUSE host pointers —
 *     NCCL needs device memory, so this catches staging mistakes;
 *   - a stream is a queue executed in order whenever anyone asks about
 *     progress (cudaEventQuery); an event completes when its stream has run
 *     past it; cudaStreamWaitEvent orders two streams;
 *   - a collective completes when every rank of the communicator has
 *     reached it on its stream (and then computes the real result); one that
 *     a rank never reaches, or reaches with a different kind, count, dtype,
 *     op or root, never completes (NCCL hangs or computes garbage);
 *   - ncclCommAbort frees the communicator at once (so any later use by the
 *     plugin is a use-after-free ASan sees) and lets that rank's queued
 *     collectives pass; non-blocking communicators answer ncclInProgress
 *     until every rank joined (plus fake.init_polls polls);
 *   - ncclCommRevoke lets that rank's queued collectives pass too but keeps
 *     the communicator; ncclCommShrink of a revoked one makes the
 *     survivors' communicator (a clique of its own, ranks renumbered in
 *     the old order), which every survivor must join; on a non-blocking
 *     parent it returns ncclSuccess with *newcomm NULL and, like NCCL's
 *     background job, writes *newcomm only once the parent's
 *     ncclCommGetAsyncError has left ncclInProgress;
 *   - like NCCL >= 2.22 on a non-blocking communicator, every collective
 *     answers ncclInProgress (NCCL launches it from a background thread;
 *     here: for fake.launch_polls polls), and a communicator's first
 *     collective stays ncclInProgress until every rank of the clique has
 *     issued its first one (lazy connection setup, NCCL_RUNTIME_CONNECT=1);
 *     a call while the previous one is still ncclInProgress is refused
 *     (ncclInvalidUsage) and counted (fake_misuses);
 *   - asynchronous errors can be injected per rank;
 *   - ncclSend / ncclRecv: between two ranks, the n-th send matches the n-th
 *     receive (NCCL matches by order, it has no tags); one completes when its
 *     partner has reached the head of its own stream, so a send and a
 *     receive waiting for each other on two streams deadlock unless they are
 *     fused in one ncclGroupStart / ncclGroupEnd section (as with NCCL for
 *     messages beyond its buffers); a count or dtype that differ never
 *     complete. Calls between ncclGroupStart and ncclGroupEnd are queued as
 *     one operation; ncclGroupEnd launches it (ncclInProgress on a
 *     non-blocking communicator, as for a collective).
 * One lock serialises the whole fake. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "fake_cuda_nccl.h"
#include "nccl_test_values.h"

#define MAX_RANKS 16

#define FAKE_DEFAULTS ((fake_cfg){2, 23007, 0, 1, 1, 0, 0, 3, ncclSuccess})
fake_cfg fake = {2, 23007, 0, 1, 1, 0, 0, 3, ncclSuccess};
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int cur_dev = 0;
static ncclResult_t injected[MAX_RANKS];
static int live_comms, completed, connected_comms, misuses;
static int stall_next[MAX_RANKS];

void fake_reset(void) {
  pthread_mutex_lock(&mu);
  fake = FAKE_DEFAULTS;
  memset(injected, 0, sizeof injected);
  memset(stall_next, 0, sizeof stall_next);
  connected_comms = 0;
  misuses = 0;
  pthread_mutex_unlock(&mu);
}

void fake_stall_next_collective(int rank) {
  pthread_mutex_lock(&mu);
  stall_next[rank] = 1;
  pthread_mutex_unlock(&mu);
}

int fake_connected_comms(void) {
  pthread_mutex_lock(&mu);
  int n = connected_comms;
  pthread_mutex_unlock(&mu);
  return n;
}

int fake_misuses(void) {
  pthread_mutex_lock(&mu);
  int n = misuses;
  pthread_mutex_unlock(&mu);
  return n;
}

void fake_inject_async_error(int rank, ncclResult_t err) {
  pthread_mutex_lock(&mu);
  injected[rank] = err;
  pthread_mutex_unlock(&mu);
}

int fake_live_comms(void) {
  pthread_mutex_lock(&mu);
  int n = live_comms;
  pthread_mutex_unlock(&mu);
  return n;
}

int fake_completed_collectives(void) {
  pthread_mutex_lock(&mu);
  int n = completed;
  pthread_mutex_unlock(&mu);
  return n;
}

/* ---- memory ------------------------------------------------------------- */

typedef struct fk_alloc {
  char *p;
  size_t n;
  int dev, pinned;
  struct fk_alloc *next;
} fk_alloc;
static fk_alloc *allocs;

static fk_alloc *find_alloc(const void *ptr) {
  for (fk_alloc *a = allocs; a; a = a->next)
    if ((const char *)ptr >= a->p && (const char *)ptr < a->p + a->n) return a;
  return NULL;
}

/* Device memory of dev covering [ptr, ptr + n)? */
static int is_device(const void *ptr, size_t n, int dev) {
  fk_alloc *a = find_alloc(ptr);
  return a && !a->pinned && a->dev == dev && (const char *)ptr + n <= a->p + a->n;
}

static cudaError_t alloc(void **ptr, size_t n, int pinned) {
  fk_alloc *a = calloc(1, sizeof *a);
  if (!a) return cudaErrorMemoryAllocation;
  a->p = malloc(n ? n : 1);
  if (!a->p) {
    free(a);
    return cudaErrorMemoryAllocation;
  }
  a->n = n ? n : 1;
  a->dev = cur_dev;
  a->pinned = pinned;
  pthread_mutex_lock(&mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&mu);
  *ptr = a->p;
  return cudaSuccess;
}

static cudaError_t release(void *ptr, int pinned) {
  if (!ptr) return cudaSuccess;
  pthread_mutex_lock(&mu);
  for (fk_alloc **it = &allocs; *it; it = &(*it)->next) {
    fk_alloc *a = *it;
    if (a->p == ptr && a->pinned == pinned) {
      *it = a->next;
      pthread_mutex_unlock(&mu);
      free(a->p);
      free(a);
      return cudaSuccess;
    }
  }
  pthread_mutex_unlock(&mu);
  return cudaErrorInvalidValue;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) { return alloc(devPtr, size, 0); }
cudaError_t cudaFree(void *devPtr) { return release(devPtr, 0); }
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  (void)flags;
  return alloc(pHost, size, 1);
}
cudaError_t cudaFreeHost(void *ptr) { return release(ptr, 1); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr,
                                     const void *ptr) {
  memset(attr, 0, sizeof *attr);
  pthread_mutex_lock(&mu);
  fk_alloc *a = find_alloc(ptr);
  if (a) {
    attr->type = a->pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    attr->device = a->dev;
    attr->devicePointer = (void *)ptr;
    attr->hostPointer = a->pinned ? (void *)ptr : NULL;
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
  }
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  pthread_mutex_lock(&mu);
  int ok = is_device(devPtr, count, cur_dev);
  pthread_mutex_unlock(&mu);
  if (!ok) return cudaErrorInvalidValue;
  memset(devPtr, value, count);
  return cudaSuccess;
}

/* ---- devices ------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count) {
  if (fake.devices <= 0) return cudaErrorNoDevice;
  *count = fake.devices;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= fake.devices) return cudaErrorInvalidDevice;
  cur_dev = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = cur_dev;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= fake.devices) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "Fake GPU %d", device);
  prop->uuid.bytes[0] = (char)0xfa;
  prop->uuid.bytes[15] = (char)device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
  snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", device);
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    default: return "cudaErrorFake";
  }
}
const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "fake CUDA error";
}

/* ---- streams and events --------------------------------------------------- */

/* One message between two ranks (ncclSend / ncclRecv): the n-th send of
 * src to dst meets the n-th receive of dst from src. */
typedef struct fk_msg {
  int src, dst;
  uint64_t n;
  const void *send;
  void *recv;
  size_t send_count, recv_count;
  ncclDataType_t send_dt, recv_dt;
  int send_posted, recv_posted; /* its side reached the head of its stream */
  int has_send, has_recv;
  int done;
  struct fk_msg *next;
} fk_msg;

typedef struct fk_coll {
  uint64_t seq;
  int kind; /* 0 allreduce, 1 broadcast, 2 allgather */
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
  size_t count;
  const void *send[MAX_RANKS];
  void *recv[MAX_RANKS];
  int arrived[MAX_RANKS];
  int narrived, done, mismatched;
  struct fk_coll *next;
} fk_coll;

typedef struct fk_clique {
  char id[NCCL_UNIQUE_ID_BYTES];
  int nranks, joined;
  int connecting;        /* ranks that issued their first collective      */
  int aborted[MAX_RANKS];
  fk_coll *colls;
  fk_msg *msgs;
  uint64_t sends[MAX_RANKS][MAX_RANKS], recvs[MAX_RANKS][MAX_RANKS]; /* so far */
  struct fk_clique *next;
} fk_clique;
static fk_clique *cliques;

enum { OP_COPY, OP_EVENT, OP_WAIT, OP_COLL, OP_P2P };
#define MAX_PARTS 64
typedef struct fk_stream fk_stream;
typedef struct fk_op {
  int kind;
  void *dst;
  const void *src;
  size_t n;
  fk_stream *wst;      /* OP_WAIT: wait until wst has run past wpos */
  uint64_t wpos;
  fk_coll *coll;        /* OP_COLL: the collective, its clique, this rank */
  fk_clique *cl;
  int rank;
  int nparts;           /* OP_P2P: the sends and receives fused in it      */
  fk_msg *part[MAX_PARTS];
  int part_send[MAX_PARTS];
  struct fk_op *next;
} fk_op;

struct fk_stream {
  fk_op *head, *tail;
  uint64_t enq, done;
  fk_stream *next_all;
};
static fk_stream *streams;
static __thread fk_stream *legacy; /* this rank's stream 0 */

typedef struct fk_event {
  fk_stream *st;
  uint64_t pos;
} fk_event;

static fk_stream *stream_new(void) {
  fk_stream *s = calloc(1, sizeof *s);
  s->next_all = streams;
  streams = s;
  return s;
}

/* Under mu. Stream 0 is this thread's own default stream. */
static fk_stream *resolve(cudaStream_t s) {
  if (s) return (fk_stream *)(void *)s;
  if (!legacy) legacy = stream_new();
  return legacy;
}

static void push(fk_stream *s, fk_op *op) {
  op->next = NULL;
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  s->enq++;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&mu);
  *pStream = (cudaStream_t)(void *)stream_new();
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
/* Streams stay in the list (their queued work still runs), like CUDA's
 * "released once its work is done". */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  fk_event *e = calloc(1, sizeof *e);
  if (!e) return cudaErrorMemoryAllocation;
  *event = (cudaEvent_t)(void *)e;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  free((fk_event *)(void *)event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  fk_event *e = (fk_event *)(void *)event;
  fk_op *op = calloc(1, sizeof *op);
  op->kind = OP_EVENT;
  pthread_mutex_lock(&mu);
  fk_stream *s = resolve(stream);
  push(s, op);
  e->st = s;
  e->pos = s->enq;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags) {
  (void)flags;
  fk_event *e = (fk_event *)(void *)event;
  pthread_mutex_lock(&mu);
  if (e->st) {
    fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_WAIT;
    op->wst = e->st;
    op->wpos = e->pos;
    push(resolve(stream), op);
  }
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                            enum cudaMemcpyKind kind, cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  int ok = kind == cudaMemcpyHostToDevice   ? is_device(dst, count, cur_dev)
           : kind == cudaMemcpyDeviceToHost ? is_device(src, count, cur_dev)
                                            : 0;
  if (!ok) {
    pthread_mutex_unlock(&mu);
    fprintf(stderr, "fake cuda: cudaMemcpyAsync(kind %d) with a pointer that is "
                    "not device memory of device %d\n", (int)kind, cur_dev);
    return cudaErrorInvalidValue;
  }
  fk_op *op = calloc(1, sizeof *op);
  op->kind = OP_COPY;
  op->dst = dst;
  op->src = src;
  op->n = count;
  push(resolve(stream), op);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

/* ---- NCCL ----------------------------------------------------------------- */

struct ncclComm {
  fk_clique *cl;
  int rank, dev, polls, finalizing;
  int blocking;
  int connect;           /* 0 never, 1 waiting for the clique, 2 done     */
  int connect_polls;
  int revoked;           /* ncclCommRevoke: a parent for ncclCommShrink   */
  /* A shrink of this (non-blocking) parent in flight: as NCCL's background
   * job, the parent reads ncclInProgress until every survivor joined and
   * shrink_polls polls passed, and only then is the new communicator
   * written through the caller's newcomm (NULL until then). */
  ncclComm_t *shrink_out;
  struct ncclComm *shrink_made;
  int shrink_polls;
  uint64_t seq;
};

static int dt_ddplug(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return DDPLUG_FLOAT32;
    case ncclFloat64: return DDPLUG_FLOAT64;
    case ncclFloat16: return DDPLUG_FLOAT16;
    case ncclBfloat16: return DDPLUG_BFLOAT16;
    case ncclInt8: return DDPLUG_INT8;
    case ncclUint8: return DDPLUG_UINT8;
    case ncclInt32: return DDPLUG_INT32;
    case ncclInt64: return DDPLUG_INT64;
    default: return 0;
  }
}

static size_t dt_size(ncclDataType_t t) {
  return tv_dtype_size(dt_ddplug(t));
}

/* Every rank arrived: compute into a temporary (buffers may alias), then
 * write each rank's recv. */
static void compute(fk_coll *c, int n) {
  int dt = dt_ddplug(c->dt);
  size_t es = dt_size(c->dt);
  size_t out = c->kind == 2 ? c->count * (size_t)n : c->count;
  char *tmp = malloc(out * es + 1);
  for (size_t i = 0; i < c->count; i++) {
    if (c->kind == 1) {
      memcpy(tmp + i * es, (const char *)c->send[c->root] + i * es, es);
      continue;
    }
    if (c->kind == 2) {
      for (int r = 0; r < n; r++)
        memcpy(tmp + ((size_t)r * c->count + i) * es, (const char *)c->send[r] + i * es, es);
      continue;
    }
    double acc = cf_get(dt, c->send[0], i);
    for (int r = 1; r < n; r++) {
      double v = cf_get(dt, c->send[r], i);
      switch (c->op) {
        case ncclSum: case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMin: acc = v < acc ? v : acc; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        default: break;
      }
    }
    if (c->op == ncclAvg)
      acc = tv_is_int(dt) ? (double)((int64_t)acc / n) : acc / n;
    cf_put(dt, tmp, i, acc);
  }
  for (int r = 0; r < n; r++) memcpy(c->recv[r], tmp, out * es);
  free(tmp);
  c->done = 1;
  completed++;
}

/* Runs what can run of s; 1 if anything ran. Under mu. */
static int progress_stream(fk_stream *s) {
  int ran = 0;
  while (s->head) {
    fk_op *op = s->head;
    if (op->kind == OP_COPY) {
      memmove(op->dst, op->src, op->n);
    } else if (op->kind == OP_WAIT) {
      if (op->wst->done < op->wpos) break;
    } else if (op->kind == OP_P2P) {
      fk_clique *cl = op->cl;
      if (!cl->aborted[op->rank]) {
        int all = 1;
        for (int i = 0; i < op->nparts; i++) {
          fk_msg *m = op->part[i];
          if (op->part_send[i]) m->send_posted = 1;
          else m->recv_posted = 1;
        }
        for (int i = 0; i < op->nparts; i++) {
          fk_msg *m = op->part[i];
          if (!m->done && m->send_posted && m->recv_posted && m->send_dt == m->recv_dt &&
              m->send_count == m->recv_count) {
            if (m->send_count) memcpy(m->recv, m->send, m->send_count * dt_size(m->send_dt));
            m->done = 1;
            completed++;
          }
          if (!m->done) all = 0;
        }
        if (!all) break;
      }
    } else if (op->kind == OP_COLL) {
      fk_coll *c = op->coll;
      fk_clique *cl = op->cl;
      if (!cl->aborted[op->rank]) {
        if (!c->arrived[op->rank]) {
          c->arrived[op->rank] = 1;
          if (++c->narrived == cl->nranks && !c->mismatched)
            compute(c, cl->nranks);
        }
        if (!c->done) break;
      }
    }
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    free(op);
    s->done++;
    ran = 1;
  }
  return ran;
}

static void progress_all(void) {
  for (int any = 1; any;) {
    any = 0;
    for (fk_stream *s = streams; s; s = s->next_all) any |= progress_stream(s);
  }
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  fk_event *e = (fk_event *)(void *)event;
  pthread_mutex_lock(&mu);
  progress_all();
  int done = !e->st || e->st->done >= e->pos;
  pthread_mutex_unlock(&mu);
  return done ? cudaSuccess : cudaErrorNotReady;
}

ncclResult_t ncclGetVersion(int *version) {
  *version = fake.nccl_version;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static int counter;
  pthread_mutex_lock(&mu);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-nccl-id-%d", ++counter);
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

/* Under mu: rank's communicator in clique cl. */
static ncclComm_t join(fk_clique *cl, int rank, int dev, const ncclConfig_t *config) {
  struct ncclComm *c = calloc(1, sizeof *c);
  c->cl = cl;
  c->rank = rank;
  c->dev = dev;
  c->polls = fake.init_polls;
  c->blocking = !(config && config->blocking == 0);
  cl->joined++;
  live_comms++;
  return c;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                    ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
    return ncclInvalidArgument;
  if (fake.init_result != ncclSuccess) return fake.init_result;
  pthread_mutex_lock(&mu);
  fk_clique *cl = cliques;
  while (cl && memcmp(cl->id, commId.internal, sizeof cl->id) != 0) cl = cl->next;
  if (!cl) {
    cl = calloc(1, sizeof *cl);
    memcpy(cl->id, commId.internal, sizeof cl->id);
    cl->nranks = nranks;
    cl->next = cliques;
    cliques = cl;
  }
  *comm = join(cl, rank, cur_dev, config);
  pthread_mutex_unlock(&mu);
  return config && config->blocking == 0 ? ncclInProgress : ncclSuccess;
}

/* Under mu: the state ncclCommGetAsyncError reports; polling advances it. */
static ncclResult_t comm_state(ncclComm_t comm, int poll) {
  if (injected[comm->rank] != ncclSuccess) return injected[comm->rank];
  if (comm->shrink_out) {
    fk_clique *made = comm->shrink_made->cl;
    if (made->joined < made->nranks) return ncclInProgress;
    if (comm->shrink_polls > 0) {
      if (poll) comm->shrink_polls--;
      return ncclInProgress;
    }
    *comm->shrink_out = comm->shrink_made;
    comm->shrink_out = NULL;
    comm->shrink_made = NULL;
    return ncclSuccess;
  }
  if (comm->cl->joined < comm->cl->nranks) return ncclInProgress;
  if (comm->connect == 1) {
    if (comm->cl->connecting < comm->cl->nranks) return ncclInProgress;
    if (comm->connect_polls > 0) {
      if (poll) comm->connect_polls--;
      return ncclInProgress;
    }
    if (!poll) return ncclInProgress;
    comm->connect = 2;
    connected_comms++;
  }
  if (comm->polls > 0) {
    if (poll) comm->polls--;
    return ncclInProgress;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  pthread_mutex_lock(&mu);
  *asyncError = comm_state(comm, 1);
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

/* Frees the communicator at once: later use is a use-after-free. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  pthread_mutex_lock(&mu);
  comm->cl->aborted[comm->rank] = 1;
  live_comms--;
  if (comm->shrink_out) {
    /* the shrink job stops, and still writes newcomm as it ends */
    comm->shrink_made->cl->aborted[comm->shrink_made->rank] = 1;
    live_comms--;
    free(comm->shrink_made);
    *comm->shrink_out = NULL;
  }
  pthread_mutex_unlock(&mu);
  free(comm);
  return ncclSuccess;
}

/* Stops this rank's operations as an abort does (its queued collectives
 * pass) but keeps the communicator, ncclInProgress for a poll or two
 * while it quiesces; then it is a parent for ncclCommShrink, and
 * ncclCommAbort frees it. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (!comm || revokeFlags != NCCL_REVOKE_DEFAULT) return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  comm->cl->aborted[comm->rank] = 1;
  comm->revoked = 1;
  comm->connect = 2;
  comm->polls = 2;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

/* The survivors' communicator: a clique of its own (named after the
 * parent's and the excluded ranks), joined by every survivor that calls
 * this with the same list; ranks renumbered in the old order. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags) {
  if (!comm || !newcomm || excludeRanksCount < 1 || !excludeRanksList ||
      (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT))
    return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  fk_clique *parent = comm->cl;
  if (excludeRanksCount >= parent->nranks || (!comm->revoked && shrinkFlags != NCCL_SHRINK_ABORT)) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage; /* the fake shrinks revoked parents only */
  }
  char id[NCCL_UNIQUE_ID_BYTES];
  memcpy(id, parent->id, sizeof id);
  size_t len = strnlen(id, sizeof id);
  int rank = comm->rank;
  for (int i = 0; i < excludeRanksCount; i++) {
    int e = excludeRanksList[i];
    if (e < 0 || e >= parent->nranks || e == comm->rank) {
      pthread_mutex_unlock(&mu);
      return ncclInvalidArgument;
    }
    if (e < comm->rank) rank--;
    int n = snprintf(id + len, sizeof id - len, "%sx%d", i ? "," : "/", e);
    if (n < 0 || (size_t)n >= sizeof id - len) {
      pthread_mutex_unlock(&mu);
      return ncclInternalError;
    }
    len += (size_t)n;
  }
  memset(id + len, 0, sizeof id - len);
  fk_clique *cl = cliques;
  while (cl && memcmp(cl->id, id, sizeof cl->id) != 0) cl = cl->next;
  if (!cl) {
    cl = calloc(1, sizeof *cl);
    memcpy(cl->id, id, sizeof cl->id);
    cl->nranks = parent->nranks - excludeRanksCount;
    cl->next = cliques;
    cliques = cl;
  }
  ncclComm_t made = join(cl, rank, comm->dev, config);
  if (comm->blocking) {
    *newcomm = made;
  } else {
    /* NCCL: a job of the parent's; ncclSuccess now, newcomm later */
    *newcomm = NULL;
    comm->shrink_out = newcomm;
    comm->shrink_made = made;
    comm->shrink_polls = 2;
  }
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  *count = comm->cl->nranks;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  pthread_mutex_lock(&mu);
  comm->finalizing = 1;
  comm->polls = 2; /* a few ncclInProgress answers, as a real one gives */
  pthread_mutex_unlock(&mu);
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  pthread_mutex_lock(&mu);
  int ok = comm->finalizing;
  live_comms--;
  pthread_mutex_unlock(&mu);
  free(comm);
  return ok ? ncclSuccess : ncclInvalidUsage;
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "fake NCCL error";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "fake NCCL: see the test";
}

/* Under mu: a call while the previous one is still ncclInProgress, which
 * NCCL refuses; counted, and mu released. */
static int misused(ncclComm_t comm) {
  if (comm_state(comm, 0) != ncclInProgress) return 0;
  misuses++;
  pthread_mutex_unlock(&mu);
  fprintf(stderr, "fake nccl: rank %d used its communicator before the "
                  "previous operation returned ncclSuccess\n", comm->rank);
  return 1;
}

/* Queues this rank's part of collective number comm->seq. */
static ncclResult_t enqueue(int kind, const void *send, void *recv, size_t count,
                            ncclDataType_t dt, ncclRedOp_t op, int root,
                            ncclComm_t comm, cudaStream_t stream) {
  if (!comm) return ncclInvalidArgument;
  size_t es = dt_size(dt);
  size_t rbytes = (kind == 2 ? count * (size_t)comm->cl->nranks : count) * es;
  pthread_mutex_lock(&mu);
  if (misused(comm)) return ncclInvalidUsage;
  int sends = kind != 1 || comm->rank == root;
  if ((sends && count && !is_device(send, count * es, comm->dev)) ||
      (count && !is_device(recv, rbytes, comm->dev))) {
    pthread_mutex_unlock(&mu);
    fprintf(stderr, "fake nccl: rank %d passed a buffer that is not device "
                    "memory of device %d\n", comm->rank, comm->dev);
    return ncclInvalidArgument;
  }
  uint64_t seq = comm->seq++;
  fk_coll *c = comm->cl->colls;
  while (c && c->seq != seq) c = c->next;
  if (!c) {
    c = calloc(1, sizeof *c);
    c->seq = seq;
    c->kind = kind;
    c->dt = dt;
    c->op = op;
    c->root = root;
    c->count = count;
    c->next = comm->cl->colls;
    comm->cl->colls = c;
  }
  else if (c->kind != kind || c->dt != dt || c->count != count ||
           (kind == 0 && c->op != op) || (kind == 1 && c->root != root))
    c->mismatched = 1; /* like NCCL: such a pair never completes cleanly */
  c->send[comm->rank] = sends ? send : recv;
  c->recv[comm->rank] = recv;
  fk_op *o = calloc(1, sizeof *o);
  o->kind = OP_COLL;
  o->coll = c;
  o->cl = comm->cl;
  o->rank = comm->rank;
  push(resolve(stream), o);
  if (fake.lazy_connect && comm->connect == 0 && comm->cl->nranks > 1) {
    comm->connect = 1; /* this collective first sets up the connections */
    comm->connect_polls = fake.connect_polls;
    comm->cl->connecting++;
  }
  if (!comm->blocking) {
    if (stall_next[comm->rank]) {
      stall_next[comm->rank] = 0;
      comm->polls = 1 << 30;
    } else if (fake.enqueue_inprogress > 0) {
      fake.enqueue_inprogress--;
      comm->polls = fake.enqueue_polls;
    } else {
      comm->polls = fake.launch_polls;
    }
  }
  ncclResult_t r = comm_state(comm, 0);
  pthread_mutex_unlock(&mu);
  return r == ncclInProgress ? ncclInProgress : ncclSuccess;
}

/* ---- point-to-point ----------------------------------------------------------- */

static __thread int group_depth;
static __thread fk_op *group_op;        /* the section's fused operation   */
static __thread ncclComm_t group_comm;
static __thread cudaStream_t group_stream;

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

/* Under mu: the message src -> dst number n (made when first asked for). */
static fk_msg *message(fk_clique *cl, int src, int dst, uint64_t n) {
  for (fk_msg *m = cl->msgs; m; m = m->next)
    if (m->src == src && m->dst == dst && m->n == n) return m;
  fk_msg *m = calloc(1, sizeof *m);
  m->src = src;
  m->dst = dst;
  m->n = n;
  m->next = cl->msgs;
  cl->msgs = m;
  return m;
}

/* Launch op on stream (a fused section, or one call): like a collective's
 * enqueue, ncclInProgress on a non-blocking communicator for a few polls. */
static ncclResult_t launch_p2p(ncclComm_t comm, fk_op *op, cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  push(resolve(stream), op);
  if (!comm->blocking) comm->polls = fake.launch_polls;
  ncclResult_t r = comm_state(comm, 0);
  pthread_mutex_unlock(&mu);
  return r == ncclInProgress ? ncclInProgress : ncclSuccess;
}

static ncclResult_t p2p(int send, void *buf, size_t count, ncclDataType_t dt, int peer,
                        ncclComm_t comm, cudaStream_t stream) {
  if (!comm || peer < 0 || peer >= comm->cl->nranks || peer == comm->rank)
    return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  if (misused(comm)) return ncclInvalidUsage;
  if (count && !is_device(buf, count * dt_size(dt), comm->dev)) {
    pthread_mutex_unlock(&mu);
    fprintf(stderr, "fake nccl: rank %d passed a %s buffer that is not device "
                    "memory of device %d\n", comm->rank, send ? "send" : "receive", comm->dev);
    return ncclInvalidArgument;
  }
  fk_clique *cl = comm->cl;
  int src = send ? comm->rank : peer, dst = send ? peer : comm->rank;
  uint64_t n = send ? cl->sends[src][dst]++ : cl->recvs[src][dst]++;
  fk_msg *m = message(cl, src, dst, n);
  if (send) {
    m->has_send = 1;
    m->send = buf;
    m->send_count = count;
    m->send_dt = dt;
  } else {
    m->has_recv = 1;
    m->recv = buf;
    m->recv_count = count;
    m->recv_dt = dt;
  }
  fk_op *op = group_depth ? group_op : NULL;
  if (!op) {
    op = calloc(1, sizeof *op);
    op->kind = OP_P2P;
    op->cl = cl;
    op->rank = comm->rank;
  }
  if (op->nparts == MAX_PARTS) {
    pthread_mutex_unlock(&mu);
    return ncclInvalidUsage;
  }
  op->part_send[op->nparts] = send;
  op->part[op->nparts++] = m;
  pthread_mutex_unlock(&mu);
  if (group_depth) {
    group_op = op;
    group_comm = comm;
    group_stream = stream;
    return ncclSuccess;
  }
  return launch_p2p(comm, op, stream);
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  fk_op *op = group_op;
  group_op = NULL;
  if (!op) return ncclSuccess;
  return launch_p2p(group_comm, op, group_stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return p2p(1, (void *)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return p2p(0, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(0, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return enqueue(1, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                 stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                           size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(2, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm,
                 stream);
}
