/* test-nccl-fake.c — the nccl plugin's GPU-side code (device selection and
 * duplicate checks end to end, NCCL bootstrap and non-blocking init,
 * collectives on device / pageable / pinned buffers with staging, streams,
 * requests backed by events, the collective timeout, asynchronous NCCL
 * errors, abort from another thread and from a peer, finalize) run against
 * an in-process fake of the CUDA runtime and NCCL (tests/nccl-fake), with
 * thread-ranks and a fake store. The fake refuses host pointers where NCCL
 * needs device memory and frees aborted communicators at once, so staging
 * mistakes and use-after-abort show up (under ASan/valgrind). It checks the
 * plugin's plumbing and failure handling; NCCL's own arithmetic and the real
 * CUDA behaviour are for test-nccl-gpu on a GPU machine. Skips when the
 * plugin is not built (no CUDA/NCCL headers). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#ifndef DDPLUG_TEST_NCCL

TEST(nccl_plugin_not_built) {
  dt_skip("the nccl plugin was not built (no CUDA toolkit or NCCL found)");
}

#else

#include "fake_cuda_nccl.h"
#include "internal.h"
#include "nccl_fake_store.h"
#include "nccl_test_values.h"

/* ---- thread-ranks with a group each ------------------------------------ */

typedef struct frank frank;
typedef void (*body_fn)(frank *f);
struct frank {
  fake_rank fr;
  const ddplug_group_init *init;
  ddplug_plugin_group *g;
  int rank, world, created, destroyed;
  body_fn body;
  void *arg;
};

static pthread_barrier_t g_sync; /* for bodies that must take turns */

static void *frank_thread(void *p) {
  frank *f = p;
  f->created = ddnccl_group_create(f->init, &f->fr.svc, &f->g);
  if (f->created != DDPLUG_OK) return NULL;
  if (f->body) f->body(f);
  f->destroyed = ddnccl_group_destroy(f->g);
  return NULL;
}

/* world thread-ranks: create (plugin_options opts, collective timeout
 * timeout_ms), run body, destroy. Returns the store (free it). */
/* checks.duplicate_gpu as the runtime passes it (0: unset). */
static int32_t g_duplicate_gpu;

static fake_store *run_ranks(frank *f, fake_world *w, int world, const char *opts,
                             int64_t timeout_ms, body_fn body, void *arg) {
  fake_store *s = store_new();
  world_init(w, world, opts, timeout_ms);
  for (int r = 0; r < world; r++) w->init[r].duplicate_gpu = g_duplicate_gpu;
  pthread_barrier_init(&g_sync, NULL, (unsigned)world);
  for (int r = 0; r < world; r++) {
    memset(&f[r], 0, sizeof f[r]);
    rank_init(&f[r].fr, s, r);
    f[r].init = &w->init[r];
    f[r].rank = r;
    f[r].world = world;
    f[r].body = body;
    f[r].arg = arg;
  }
  run_threads(world, frank_thread, f, sizeof f[0]);
  pthread_barrier_destroy(&g_sync);
  return s;
}

static void all_created(frank *f, int world) {
  for (int r = 0; r < world; r++)
    CHECK_MSG(f[r].created == DDPLUG_OK, "rank %d: group_create: %s: %s", r,
              ddnccl_status_name(f[r].created), f[r].fr.err);
}

/* The next collective of this thread-rank (sequence numbers 1, 2, ...). */
static ddplug_coll_args coll(int kind, const void *send, void *recv,
                             uint64_t count, int dtype, int op, int root,
                             void *stream) {
  static __thread uint64_t seq;
  return coll_args(kind, send, recv, count, dtype, op, root, stream, ++seq);
}

/* Start, wait (the group's timeout), free; returns the status. */
static int run(frank *f, ddplug_coll_args a) {
  ddplug_plugin_request *req = NULL;
  int st = ddnccl_collective_start(f->g, &a, &req);
  if (st != DDPLUG_OK) return st;
  st = ddnccl_request_wait(f->g, req, -1);
  ddnccl_request_free(f->g, req);
  return st;
}

#define RUN_OK(f, a)                                                          \
  do {                                                                        \
    int st_ = run((f), (a));                                                  \
    CHECK_MSG(st_ == DDPLUG_OK, "rank %d: %s: %s: %s", (f)->rank, #a,         \
              ddnccl_status_name(st_), (f)->fr.err);                          \
  } while (0)

static void check_reduced(const char *what, int rank, int dt, int op,
                          const void *out, size_t n, int world) {
  for (size_t i = 0; i < n; i++) {
    double want = tv_round(dt, tv_reference(dt, op, world, i));
    double got = cf_get(dt, out, i);
    CHECK_MSG(got == want, "rank %d %s %s %s: element %zu is %g, expected %g",
              rank, what, ddnccl_dtype_name(dt), ddnccl_op_name(op),
              i, got, want);
  }
}

/* ---- every dtype x op on every kind of buffer ------------------------- */

static void every_dtype_and_op(frank *f) {
  const size_t n = 37;
  int world = f->world, rank = f->rank;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  for (int dt = 1; dt < DDPLUG_DTYPE_COUNT_; dt++) {
    size_t es = tv_dtype_size(dt);
    char *in = malloc(n * es), *out = malloc(n * es * (size_t)world);
    void *din, *dout, *pinned;
    CHECK(cudaMalloc(&din, n * es) == cudaSuccess);
    CHECK(cudaMalloc(&dout, n * es * (size_t)world) == cudaSuccess);
    CHECK(cudaHostAlloc(&pinned, n * es, 0) == cudaSuccess);
    for (size_t i = 0; i < n; i++) cf_put(dt, in, i, tv_value(rank, i));
    for (int op = 1; op < DDPLUG_OP_COUNT_; op++) {
      if (!(ddnccl_op_mask() & DDPLUG_OP_BIT(op))) continue;
      /* device buffers (the fake's device memory is readable here) */
      memcpy(din, in, n * es);
      RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, din, dout, n, dt, op, 0, s));
      check_reduced("device", rank, dt, op, dout, n, world);
      /* device, in place, default stream */
      RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, din, din, n, dt, op, 0, NULL));
      check_reduced("device in-place", rank, dt, op, din, n, world);
      /* pageable host, in place (staged) */
      memcpy(out, in, n * es);
      RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, out, out, n, dt, op, 0, NULL));
      check_reduced("host", rank, dt, op, out, n, world);
      /* pinned send, pageable recv */
      memcpy(pinned, in, n * es);
      memset(out, 0, n * es);
      RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, pinned, out, n, dt, op, 0, s));
      check_reduced("pinned->host", rank, dt, op, out, n, world);
      /* device send, pageable recv */
      memcpy(din, in, n * es);
      memset(out, 0, n * es);
      RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, din, out, n, dt, op, 0, NULL));
      check_reduced("device->host", rank, dt, op, out, n, world);
    }
    /* broadcast from the last rank: device, then host out of place */
    int root = world - 1;
    memcpy(din, in, n * es);
    RUN_OK(f, coll(DDPLUG_COLL_BROADCAST, din, din, n, dt, 0, root, s));
    for (size_t i = 0; i < n; i++)
      CHECK_MSG(cf_get(dt, din, i) == tv_value(root, i), "bcast elem %zu", i);
    memset(out, 0, n * es);
    RUN_OK(f, coll(DDPLUG_COLL_BROADCAST, in, out, n, dt, 0, root, NULL));
    for (size_t i = 0; i < n; i++)
      CHECK_MSG(cf_get(dt, out, i) == tv_value(root, i), "host bcast elem %zu", i);
    /* allgather: host in place, and device send into host recv */
    memset(out, 0, n * es * (size_t)world);
    memcpy(out + (size_t)rank * n * es, in, n * es);
    RUN_OK(f, coll(DDPLUG_COLL_ALLGATHER, out + (size_t)rank * n * es, out, n, dt, 0, 0, NULL));
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < n; i++)
        CHECK_MSG(cf_get(dt, out + (size_t)r * n * es, i) == tv_value(r, i),
                  "allgather block %d elem %zu", r, i);
    memcpy(din, in, n * es);
    memset(out, 0, n * es * (size_t)world);
    RUN_OK(f, coll(DDPLUG_COLL_ALLGATHER, din, out, n, dt, 0, 0, s));
    for (int r = 0; r < world; r++)
      CHECK(cf_get(dt, out + (size_t)r * n * es, n - 1) == tv_value(r, n - 1));
    CHECK(cudaFree(din) == cudaSuccess);
    CHECK(cudaFree(dout) == cudaSuccess);
    CHECK(cudaFreeHost(pinned) == cudaSuccess);
    free(in);
    free(out);
  }
  RUN_OK(f, coll(DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, NULL));
  RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, NULL, NULL, 0, DDPLUG_FLOAT32,
                 DDPLUG_OP_SUM, 0, NULL)); /* count 0 */
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST(every_dtype_and_op_on_device_host_and_pinned_buffers) {
  fake_reset();
  fake.devices = 3;
  frank f[3];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 3, "{}", 10000, every_dtype_and_op, NULL);
  all_created(f, 3);
  for (int r = 0; r < 3; r++) CHECK_OK(f[r].destroyed);
  CHECK_EQ_INT(fake_live_comms(), 0); /* finalized and destroyed */
  CHECK_EQ_INT(fake_misuses(), 0);    /* every ncclInProgress was settled */
  store_free(s);
}

/* ---- async requests, several streams ---------------------------------- */

static void async_two_streams(frank *f) {
  enum { N = 100 };
  float *a, *b;
  CHECK(cudaMalloc((void **)&a, N * sizeof(float)) == cudaSuccess);
  CHECK(cudaMalloc((void **)&b, N * sizeof(float)) == cudaSuccess);
  for (int i = 0; i < N; i++) a[i] = b[i] = (float)(f->rank + 1);
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, 0) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s2, 0) == cudaSuccess);
  ddplug_plugin_request *r1 = NULL, *r2 = NULL;
  ddplug_coll_args c1 = coll(DDPLUG_COLL_ALLREDUCE, a, a, N, DDPLUG_FLOAT32,
                             DDPLUG_OP_SUM, 0, s1);
  ddplug_coll_args c2 = coll(DDPLUG_COLL_ALLREDUCE, b, b, N, DDPLUG_FLOAT32,
                             DDPLUG_OP_MAX, 0, s2);
  CHECK_OK(ddnccl_collective_start(f->g, &c1, &r1));
  CHECK_OK(ddnccl_collective_start(f->g, &c2, &r2));
  /* Wait for the later one first, then test the earlier one. */
  CHECK_OK(ddnccl_request_wait(f->g, r2, 5000));
  int32_t done = 0;
  for (int i = 0; i < 1000 && !done; i++) {
    CHECK_OK(ddnccl_request_test(f->g, r1, &done));
    if (!done) usleep(1000);
  }
  CHECK_EQ_INT(done, 1);
  CHECK_OK(ddnccl_request_wait(f->g, r1, 0)); /* done: stays OK */
  ddnccl_request_free(f->g, r1);
  ddnccl_request_free(f->g, r2);
  CHECK(a[0] == 3.0f && a[N - 1] == 3.0f); /* 1 + 2 */
  CHECK(b[0] == 2.0f);                     /* max */
  CHECK(cudaFree(a) == cudaSuccess);
  CHECK(cudaFree(b) == cudaSuccess);
}

TEST(async_requests_on_two_streams) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, async_two_streams, NULL);
  all_created(f, 2);
  store_free(s);
}

/* ---- staging buffers: growth, reuse, fenced release -------------------- */

static int host_allreduce(frank *f, float *buf, size_t n, int32_t mem,
                          ddplug_plugin_request **req) {
  for (size_t i = 0; i < n; i++) buf[i] = (float)(f->rank + 1);
  ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, buf, buf, n, DDPLUG_FLOAT32,
                            DDPLUG_OP_SUM, 0, NULL);
  a.mem = mem;
  return ddnccl_collective_start(f->g, &a, req);
}

static void staging_body(frank *f) {
  /* The group was created with a long timeout (only a hang guard: both
   * ranks come); what this body times out is bounded by the short one. */
  f->g->timeout_ms = 400;
  const size_t big = 100000; /* 400 KB: outgrows the first 64 KiB stage */
  float *h = malloc(big * sizeof *h);
  ddplug_plugin_request *req = NULL;
  size_t sizes[3] = {10, big, 10};
  for (int k = 0; k < 3; k++) {
    CHECK_OK(host_allreduce(f, h, sizes[k], DDPLUG_MEM_HOST, &req));
    CHECK_OK(ddnccl_request_wait(f->g, req, 5000));
    ddnccl_request_free(f->g, req);
    CHECK(h[0] == 3.0f && h[sizes[k] - 1] == 3.0f);
  }
  int stages = 0;
  for (ddnccl_stage *s = f->g->pool.stages; s; s = s->next) stages++;
  CHECK_EQ_INT(stages, 1); /* the small idle stage was replaced, then reused */

  /* request_test while the peer has not joined; a pending request freed
   * keeps its stage fenced until the GPU (here: the fake) is done. */
  if (f->rank == 0) {
    CHECK_OK(host_allreduce(f, h, 10, DDPLUG_MEM_AUTO, &req));
    int32_t done = 1;
    CHECK_OK(ddnccl_request_test(f->g, req, &done));
    CHECK_EQ_INT(done, 0);
    ddnccl_request_free(f->g, req);
    CHECK(f->g->pool.stages->fence != NULL || f->g->pool.stages->next != NULL);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1) { /* joins the allreduce rank 0 abandoned */
    CHECK_OK(host_allreduce(f, h, 10, DDPLUG_MEM_AUTO, &req));
    CHECK_OK(ddnccl_request_wait(f->g, req, 5000));
    ddnccl_request_free(f->g, req);
  }
  pthread_barrier_wait(&g_sync);
  /* The fenced stage is reclaimed once its event completed. */
  CHECK_OK(host_allreduce(f, h, 10, DDPLUG_MEM_AUTO, &req));
  CHECK_OK(ddnccl_request_wait(f->g, req, 5000));
  ddnccl_request_free(f->g, req);
  for (ddnccl_stage *s = f->g->pool.stages; s; s = s->next)
    CHECK(s->fence == NULL && !s->busy);
  /* Finally rank 0 abandons one that rank 1 never joins: destroy waits for
   * the fence (bounded by the timeout), then leaks rather than frees. */
  if (f->rank == 0) {
    CHECK_OK(host_allreduce(f, h, 10, DDPLUG_MEM_AUTO, &req));
    ddnccl_request_free(f->g, req);
  }
  free(h);
}

TEST(staging_buffers_grow_are_reused_and_fenced) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, staging_body, NULL);
  all_created(f, 2);
  store_free(s);
}

/* ---- NCCL init and enqueue answering ncclInProgress --------------------- */

static void one_allreduce(frank *f) {
  int64_t *d;
  CHECK(cudaMalloc((void **)&d, 8 * sizeof *d) == cudaSuccess);
  for (int i = 0; i < 8; i++) d[i] = f->rank + 1;
  RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, d, d, 8, DDPLUG_INT64, DDPLUG_OP_SUM, 0, NULL));
  CHECK_EQ_INT(d[7], f->world * (f->world + 1) / 2);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST(init_and_enqueue_in_progress_are_polled) {
  fake_reset();
  fake.init_polls = 20;
  fake.enqueue_inprogress = 4; /* the two connection warm-ups, then ours */
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, one_allreduce, NULL);
  all_created(f, 2);
  CHECK_EQ_INT(fake.enqueue_inprogress, 0);
  CHECK_EQ_INT(fake_misuses(), 0);
  store_free(s);
}

/* ---- connection setup at group creation -------------------------------- */

/* NCCL connects lazily: a communicator's first collective waits (answering
 * ncclInProgress) until every peer issued its first one too. group_create
 * does that first collective itself, so the first collective of the run is
 * enqueued without waiting for the peer: rank 0's returns from
 * collective_start while rank 1 has not called anything yet. */
static void lonely_first_collective_body(frank *f) {
  float *d;
  CHECK(cudaMalloc((void **)&d, 64 * sizeof(float)) == cudaSuccess);
  for (int i = 0; i < 64; i++) d[i] = (float)(f->rank + 1);
  ddplug_plugin_request *req = NULL;
  ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, d, d, 64, DDPLUG_FLOAT32,
                            DDPLUG_OP_SUM, 0, NULL);
  pthread_barrier_wait(&g_sync); /* both out of group_create */
  if (f->rank == 0) {
    CHECK_EQ_INT(fake_connected_comms(), 2); /* both, during group_create */
    CHECK_OK(ddnccl_collective_start(f->g, &a, &req));
    int32_t done = 1;
    CHECK_OK(ddnccl_request_test(f->g, req, &done));
    CHECK_EQ_INT(done, 0); /* enqueued, waiting for rank 1 on the "GPU" */
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1) CHECK_OK(ddnccl_collective_start(f->g, &a, &req));
  CHECK_OK(ddnccl_request_wait(f->g, req, 5000));
  ddnccl_request_free(f->g, req);
  CHECK(d[0] == 3.0f && d[63] == 3.0f);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST(group_create_connects_so_a_first_collective_does_not_wait_for_peers) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, lonely_first_collective_body,
                            NULL);
  all_created(f, 2);
  for (int r = 0; r < 2; r++) CHECK_OK(f[r].destroyed);
  CHECK_EQ_INT(fake_misuses(), 0);
  store_free(s);
}

TEST(connection_setup_that_never_finishes_fails_create_with_timeout) {
  fake_reset();
  fake.connect_polls = 1 << 30;
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 500, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(f[r].fr.err, "NCCL connection setup (a 1-element allreduce) "
                                "did not finish on rank");
  }
  CHECK_EQ_INT(fake_live_comms(), 0); /* both communicators aborted */
  CHECK(store_has(s, "abort"));
  store_free(s);
}

TEST(one_rank_connects_nothing) {
  fake_reset();
  fake.connect_polls = 1 << 30; /* would stall if a lone rank connected */
  frank f[1];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 1, "{}", 10000, one_allreduce, NULL);
  all_created(f, 1);
  CHECK_OK(f[0].destroyed);
  store_free(s);
}

TEST(init_that_never_finishes_times_out_and_aborts) {
  fake_reset();
  fake.init_polls = 1 << 30;
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 500, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(f[r].fr.err, "NCCL communicator init did not finish");
  }
  CHECK_EQ_INT(fake_live_comms(), 0); /* both communicators aborted */
  CHECK(store_has(s, "abort"));
  store_free(s);
}

TEST(init_failure_is_reported) {
  fake_reset();
  fake.init_result = ncclSystemError;
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_SYSTEM);
    CHECK_CONTAINS(f[r].fr.err, "ncclCommInitRankConfig failed on rank");
  }
  store_free(s);
}

/* ---- device checks end to end ------------------------------------------ */

TEST(two_ranks_on_one_gpu_are_refused_then_allowed) {
  fake_reset();
  fake.devices = 1; /* both ranks see one GPU: both use it */
  frank f[2];
  fake_world w;
  unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_CONFIG);
    CHECK_CONTAINS(f[r].fr.err, "ranks 0 and 1 are bound to the same GPU "
                                "GPU-fa000000-0000-0000-0000-000000000000 (Fake "
                                "GPU 0, PCI 0000:00:00.0) on host node-a (rank 0 "
                                "as cuda:0, rank 1 as cuda:0)");
  }
  store_free(s);

  s = run_ranks(f, &w, 2, "{\"allow_shared_gpu\": true}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_CONFIG);
    CHECK_CONTAINS(f[r].fr.err, "runs without NCCL_MULTI_RANK_GPU_ENABLE=1");
  }
  store_free(s);

  setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  s = run_ranks(f, &w, 2, "{\"allow_shared_gpu\": true}", 10000, one_allreduce, NULL);
  all_created(f, 2);
  store_free(s);

  fake.nccl_version = 22703; /* NCCL 2.27: cannot share */
  s = run_ranks(f, &w, 2, "{\"allow_shared_gpu\": true}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) CHECK_EQ_INT(f[r].created, DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(f[1].fr.err, "runs NCCL 2.27.3, which cannot put two ranks on one GPU");
  store_free(s);
}

TEST(config_duplicate_gpu_warn_or_allow_lets_ranks_share) {
  fake_reset();
  fake.devices = 1;
  frank f[2];
  fake_world w;
  setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
  g_duplicate_gpu = DDPLUG_CHECK_ERROR; /* the default: refused */
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) CHECK_EQ_INT(f[r].created, DDPLUG_E_CONFIG);
  store_free(s);
  const int32_t policies[] = {DDPLUG_CHECK_WARN, DDPLUG_CHECK_ALLOW};
  for (int i = 0; i < 2; i++) {
    g_duplicate_gpu = policies[i];
    s = run_ranks(f, &w, 2, "{}", 10000, one_allreduce, NULL);
    all_created(f, 2);
    store_free(s);
  }
  g_duplicate_gpu = 0;
}

TEST(device_map_picks_the_device) {
  fake_reset();
  fake.devices = 4;
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{\"device_map\": [3, 1]}", 10000,
                            one_allreduce, NULL);
  all_created(f, 2);
  store_free(s);
  s = run_ranks(f, &w, 2, "{\"device_map\": [3, 4]}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_CONFIG);
    CHECK_CONTAINS(f[r].fr.err, "rank 1: plugin_options.device_map[1] = 4, but "
                                "this process sees only 4 CUDA devices");
  }
  store_free(s);
}

/* ---- failures after the group exists ---------------------------------- */

static float *g_buf[4];

/* Rank 0 starts an allreduce that rank 1 never joins. */
static ddplug_plugin_request *lonely_allreduce(frank *f) {
  CHECK(cudaMalloc((void **)&g_buf[f->rank], 64 * sizeof(float)) == cudaSuccess);
  ddplug_plugin_request *req = NULL;
  ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, g_buf[f->rank],
                            g_buf[f->rank], 64, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, NULL);
  CHECK_OK(ddnccl_collective_start(f->g, &a, &req));
  return req;
}

static void watchdog_body(frank *f) {
  /* The group was created with a long timeout (only a hang guard: both
   * ranks come); what this body times out is bounded by the short one,
   * set after the short wait (the watchdog reads it at every wait, from
   * the collective's start: set before, a stall of 280 ms before the short
   * wait would let the watchdog fire first). */
  if (f->rank == 0) {
    ddplug_plugin_request *req = lonely_allreduce(f);
    /* A short wait: TIMEOUT, still pending. */
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 20), DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(f->fr.err, "still running on rank 0");
    CHECK(!atomic_load(&f->g->failed));
    f->g->timeout_ms = 300;
    /* Up to the collective timeout: TIMEOUT, final; the group is failed. */
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, -1), DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(f->fr.err, "did not complete within the collective timeout (0.3 s");
    CHECK_CONTAINS(f->fr.err, "the NCCL communicator was aborted on rank 0");
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 10), DDPLUG_E_ABORTED);
    int32_t done = 0;
    CHECK_EQ_INT(ddnccl_request_test(f->g, req, &done), DDPLUG_E_ABORTED);
    ddplug_coll_args a = coll(DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, NULL);
    ddplug_plugin_request *r2 = NULL;
    CHECK_EQ_INT(ddnccl_collective_start(f->g, &a, &r2), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(f->fr.err, "cannot be used any more (TIMEOUT:");
    ddnccl_request_free(f->g, req);
    CHECK(cudaFree(g_buf[0]) == cudaSuccess);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1) { /* the peer learns it at its next look at the store */
    CHECK_EQ_INT(ddnccl_check_peer_abort(f->g), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(f->fr.err, "aborted through the store by rank 0: allreduce seq");
  }
}

TEST(collective_timeout_aborts_the_group_and_tells_the_peer) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, watchdog_body, NULL);
  all_created(f, 2);
  CHECK_EQ_INT(fake_live_comms(), 0);
  store_free(s);
}

static void pending_then_done_body(frank *f) {
  ddplug_plugin_request *req = NULL;
  if (f->rank == 0) {
    req = lonely_allreduce(f);
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 30), DDPLUG_E_TIMEOUT);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1) {
    req = lonely_allreduce(f); /* now it pairs with rank 0's */
    CHECK_OK(ddnccl_request_wait(f->g, req, 5000));
  } else {
    CHECK_OK(ddnccl_request_wait(f->g, req, 5000));
  }
  ddnccl_request_free(f->g, req);
  CHECK(cudaFree(g_buf[f->rank]) == cudaSuccess);
}

TEST(a_wait_timeout_leaves_the_request_pending) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, pending_then_done_body, NULL);
  all_created(f, 2);
  for (int r = 0; r < 2; r++) CHECK_OK(f[r].destroyed);
  store_free(s);
}

static void async_error_body(frank *f) {
  if (f->rank == 0) {
    ddplug_plugin_request *req = lonely_allreduce(f);
    fake_inject_async_error(0, ncclRemoteError);
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 5000), DDPLUG_E_PEER_LOST);
    CHECK_CONTAINS(f->fr.err, "a peer process exited or the network failed");
    ddnccl_request_free(f->g, req);
    CHECK(cudaFree(g_buf[0]) == cudaSuccess);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1)
    CHECK_EQ_INT(ddnccl_check_peer_abort(f->g), DDPLUG_E_ABORTED);
}

TEST(an_asynchronous_nccl_error_is_peer_lost) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, async_error_body, NULL);
  all_created(f, 2);
  store_free(s);
}

/* A collective that NCCL keeps ncclInProgress inside the call (as while it
 * connects an algorithm to a peer that never comes): collective_start gives
 * up at the collective timeout with the same sentence the watchdog uses, so
 * callers and peers see one wording whichever path timed out. */
static void stuck_enqueue_body(frank *f) {
  /* The group was created with a long timeout (only a hang guard: both
   * ranks come); what this body times out is bounded by the short one. */
  f->g->timeout_ms = 300;
  if (f->rank == 0) {
    CHECK(cudaMalloc((void **)&g_buf[0], 64 * sizeof(float)) == cudaSuccess);
    fake_stall_next_collective(0);
    ddplug_plugin_request *req = NULL;
    ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, g_buf[0], g_buf[0], 64,
                              DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, NULL);
    CHECK_EQ_INT(ddnccl_collective_start(f->g, &a, &req), DDPLUG_E_TIMEOUT);
    CHECK(req == NULL);
    CHECK_CONTAINS(f->fr.err, "allreduce seq 1 (64 x float32, sum) did not "
                              "complete within the collective timeout (0.3 s");
    CHECK_CONTAINS(f->fr.err, "NCCL still enqueuing it");
    CHECK_CONTAINS(f->fr.err, "the NCCL communicator was aborted on rank 0");
    CHECK(atomic_load(&f->g->failed));
    ddplug_coll_args b = coll(DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, NULL);
    CHECK_EQ_INT(ddnccl_collective_start(f->g, &b, &req), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(f->fr.err, "cannot be used any more (TIMEOUT:");
    CHECK(cudaFree(g_buf[0]) == cudaSuccess);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1) {
    CHECK_EQ_INT(ddnccl_check_peer_abort(f->g), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(f->fr.err, "did not complete within the collective timeout");
  }
}

TEST(a_collective_stuck_in_nccl_times_out_in_collective_start) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, stuck_enqueue_body, NULL);
  all_created(f, 2);
  CHECK_EQ_INT(fake_live_comms(), 0);
  store_free(s);
}

static void *abort_soon(void *p) {
  usleep(100000);
  ddnccl_group_abort(p, "stopped by a test thread");
  return NULL;
}

static void abort_thread_body(frank *f) {
  if (f->rank == 0) {
    ddplug_plugin_request *req = lonely_allreduce(f);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, abort_soon, f->g) == 0);
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 10000), DDPLUG_E_ABORTED);
    pthread_join(t, NULL);
    CHECK_CONTAINS(f->fr.err, "aborted on rank 0: stopped by a test thread");
    /* Freed while its collective never ran: fenced, reclaimed at destroy. */
    ddnccl_request_free(f->g, req);
    CHECK(cudaFree(g_buf[0]) == cudaSuccess);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 1) {
    /* A barrier now would pair with rank 0's allreduce inside NCCL (the fake
     * makes such a pair hang); its wait learns the abort from the store. */
    ddplug_plugin_request *req = NULL;
    ddplug_coll_args a = coll(DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, NULL);
    CHECK_OK(ddnccl_collective_start(f->g, &a, &req));
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 10000), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(f->fr.err, "stopped by a test thread");
    ddnccl_request_free(f->g, req); /* pending: fenced until destroy */
  }
}

static void abort_stuck_enqueue_body(frank *f) {
  if (f->rank != 0) return;
  CHECK(cudaMalloc((void **)&g_buf[0], 64 * sizeof(float)) == cudaSuccess);
  fake_stall_next_collective(0);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, abort_soon, f->g) == 0);
  ddplug_plugin_request *req = NULL;
  ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, g_buf[0], g_buf[0], 64,
                            DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, NULL);
  CHECK_EQ_INT(ddnccl_collective_start(f->g, &a, &req), DDPLUG_E_ABORTED);
  pthread_join(t, NULL);
  CHECK(req == NULL);
  CHECK_CONTAINS(f->fr.err, "aborted on rank 0: stopped by a test thread");
  CHECK(cudaFree(g_buf[0]) == cudaSuccess);
}

TEST(abort_from_another_thread_ends_a_collective_stuck_in_nccl) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, abort_stuck_enqueue_body, NULL);
  all_created(f, 2);
  CHECK_EQ_INT(fake_live_comms(), 0);
  store_free(s);
}

TEST(abort_from_another_thread_ends_the_wait) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, abort_thread_body, NULL);
  all_created(f, 2);
  store_free(s);
}

static void peer_abort_body(frank *f) {
  if (f->rank == 0) {
    ddplug_plugin_request *req = lonely_allreduce(f);
    pthread_barrier_wait(&g_sync); /* rank 1 aborts now */
    CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 10000), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(f->fr.err, "aborted through the store by rank 1: aborted on "
                              "rank 1: rank 1 gives up");
    ddnccl_request_free(f->g, req);
    CHECK(cudaFree(g_buf[0]) == cudaSuccess);
  } else {
    CHECK_OK(ddnccl_group_abort(f->g, "rank 1 gives up"));
    pthread_barrier_wait(&g_sync);
  }
}

TEST(a_peers_abort_ends_the_wait_through_the_store) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, peer_abort_body, NULL);
  all_created(f, 2);
  store_free(s);
}

static void wrong_device_body(frank *f) {
  if (f->rank == 0) {
    float *other;
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaMalloc((void **)&other, 16 * sizeof(float)) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    ddplug_plugin_request *req = NULL;
    ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, other, other, 16,
                              DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, NULL);
    CHECK_EQ_INT(ddnccl_collective_start(f->g, &a, &req),
                 DDPLUG_E_INVALID_ARGUMENT);
    CHECK(req == NULL);
    CHECK_CONTAINS(f->fr.err, "the recv buffer is device memory of cuda:1, but "
                              "rank 0's nccl group runs on cuda:0");
    CHECK(atomic_load(&f->g->failed)); /* the peer is already inside it */
    CHECK(cudaFree(other) == cudaSuccess);
  }
}

TEST(a_buffer_on_another_gpu_is_refused_and_fails_the_group) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, wrong_device_body, NULL);
  all_created(f, 2);
  CHECK(store_has(s, "abort"));
  store_free(s);
}

static void mismatch_body(frank *f) {
  float *d;
  CHECK(cudaMalloc((void **)&d, 16 * sizeof(float)) == cudaSuccess);
  memset(d, 0, 16 * sizeof(float));
  ddplug_coll_args a = coll(DDPLUG_COLL_ALLREDUCE, d, d, f->rank == 0 ? 10 : 12,
                            DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, NULL);
  int st = run(f, a);
  CHECK_EQ_INT(st, DDPLUG_E_MISMATCH);
  CHECK_CONTAINS(f->fr.err, "rank 1 called allreduce(count=12, float32, sum) but "
                            "rank 0 called allreduce(count=10, float32, sum)");
  /* Nothing was enqueued: the group still works. The runtime hands the next
   * call the refused call's seq again (it never started). */
  for (int i = 0; i < 16; i++) d[i] = 1.0f;
  a.count = 16;
  RUN_OK(f, a);
  CHECK(d[15] == 2.0f);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST(mismatch_check_leaves_the_group_usable) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{\"check_mismatch\": true}", 10000,
                            mismatch_body, NULL);
  all_created(f, 2);
  for (int r = 0; r < 2; r++) CHECK_OK(f[r].destroyed);
  store_free(s);
}

/* ---- point-to-point: ncclSend / ncclRecv --------------------------------- */

static ddplug_p2p_args p2p_args(int kind, void *buf, uint64_t count, int dtype, int peer,
                                int64_t tag, void *stream) {
  ddplug_p2p_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  a.kind = kind;
  a.buf = buf;
  a.count = count;
  a.dtype = dtype;
  a.peer = peer;
  a.tag = tag;
  a.stream = stream;
  return a;
}

/* Both ranks send first and receive second (torch's batch_isend_irecv):
 * the fake deadlocks a send and a receive waiting for each other unless
 * they are one NCCL group section, which the plugin makes of operations
 * started back to back. Device, pageable and pinned buffers; zero count;
 * then a collective after a queued send keeps its place in the order. */
static void p2p_exchange(frank *f) {
  const size_t n = 1000;
  int peer = 1 - f->rank;
  void *dsend, *drecv, *pinned;
  CHECK(cudaMalloc(&dsend, n * 4) == cudaSuccess);
  CHECK(cudaMalloc(&drecv, n * 4) == cudaSuccess);
  CHECK(cudaHostAlloc(&pinned, n * 4, 0) == cudaSuccess);
  float *host = malloc(n * 4), *hout = malloc(n * 4);
  for (int kind = 0; kind < 3; kind++) {
    float *src = kind == 0 ? dsend : kind == 1 ? host : pinned;
    float *dst = kind == 0 ? drecv : hout;
    for (size_t i = 0; i < n; i++) src[i] = (float)(100 * f->rank + i % 97);
    memset(dst, 0, n * 4);
    ddplug_p2p_args sa = p2p_args(DDPLUG_P2P_SEND, src, n, DDPLUG_FLOAT32, peer, 0, NULL);
    ddplug_p2p_args ra = p2p_args(DDPLUG_P2P_RECV, dst, n, DDPLUG_FLOAT32, peer, 0, NULL);
    int32_t source = -1;
    ra.source = &source;
    ddplug_plugin_request *rs = NULL, *rr = NULL;
    CHECK_OK(ddnccl_p2p_start(f->g, &sa, &rs));
    CHECK_OK(ddnccl_p2p_start(f->g, &ra, &rr));
    CHECK_OK(ddnccl_request_wait(f->g, rr, 5000));
    CHECK_EQ_INT(source, peer); /* the sender, as plugin.h asks of a receive */
    CHECK_OK(ddnccl_request_wait(f->g, rs, 5000));
    ddnccl_request_free(f->g, rs);
    ddnccl_request_free(f->g, rr);
    for (size_t i = 0; i < n; i++)
      CHECK_MSG(dst[i] == (float)(100 * peer + i % 97), "rank %d kind %d element %zu is %g",
                f->rank, kind, i, dst[i]);
  }
  /* zero elements */
  ddplug_p2p_args z = p2p_args(f->rank ? DDPLUG_P2P_RECV : DDPLUG_P2P_SEND, NULL, 0,
                               DDPLUG_INT32, peer, 0, NULL);
  ddplug_plugin_request *rz = NULL;
  CHECK_OK(ddnccl_p2p_start(f->g, &z, &rz));
  CHECK_OK(ddnccl_request_wait(f->g, rz, 5000));
  ddnccl_request_free(f->g, rz);
  /* a send (receive) queued, then an allreduce on both: the queued one is
   * launched first, as started (launched after the allreduce, rank 0's
   * send and rank 1's allreduce would wait for each other) */
  int32_t *d;
  CHECK(cudaMalloc((void **)&d, 4 * sizeof *d) == cudaSuccess);
  for (int i = 0; i < 4; i++) d[i] = f->rank + 1;
  ddplug_plugin_request *r1 = NULL;
  ddplug_p2p_args one = p2p_args(f->rank ? DDPLUG_P2P_RECV : DDPLUG_P2P_SEND, dsend, n,
                                 DDPLUG_FLOAT32, peer, 0, NULL);
  CHECK_OK(ddnccl_p2p_start(f->g, &one, &r1));
  if (f->rank == 0) {
    ddplug_coll_args ar = coll(DDPLUG_COLL_ALLREDUCE, d, d, 4, DDPLUG_INT32, DDPLUG_OP_SUM, 0, NULL);
    ddplug_plugin_request *rc = NULL;
    CHECK_OK(ddnccl_collective_start(f->g, &ar, &rc));
    CHECK_OK(ddnccl_request_wait(f->g, rc, 5000));
    ddnccl_request_free(f->g, rc);
  } else {
    /* rank 1 launches its receive by waiting for it first */
    CHECK_OK(ddnccl_request_wait(f->g, r1, 5000));
    RUN_OK(f, coll(DDPLUG_COLL_ALLREDUCE, d, d, 4, DDPLUG_INT32, DDPLUG_OP_SUM, 0, NULL));
  }
  CHECK_EQ_INT(d[3], 3);
  CHECK_OK(ddnccl_request_wait(f->g, r1, 5000));
  ddnccl_request_free(f->g, r1);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(dsend) == cudaSuccess);
  CHECK(cudaFree(drecv) == cudaSuccess);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  free(host);
  free(hout);
}

TEST(p2p_sends_and_receives_started_together_are_fused_and_delivered) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, p2p_exchange, NULL);
  all_created(f, 2);
  for (int r = 0; r < 2; r++) CHECK_OK(f[r].destroyed);
  CHECK_EQ_INT(fake_misuses(), 0);
  store_free(s);
}

/* A tag other than 0 is refused (NCCL matches by order); a receive nobody
 * sends to times out in request_wait and stays pending; the send then
 * completes it. */
static void p2p_tag_and_timeout(frank *f) {
  int32_t *d;
  CHECK(cudaMalloc((void **)&d, 8 * sizeof *d) == cudaSuccess);
  int peer = 1 - f->rank;
  ddplug_plugin_request *r = NULL;
  ddplug_p2p_args tagged = p2p_args(DDPLUG_P2P_SEND, d, 8, DDPLUG_INT32, peer, 3, NULL);
  CHECK_STATUS(ddnccl_p2p_start(f->g, &tagged, &r), DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(f->fr.err, "takes tag 0 only");
  CHECK(r == NULL);
  if (f->rank == 1) {
    ddplug_p2p_args ra = p2p_args(DDPLUG_P2P_RECV, d, 8, DDPLUG_INT32, peer, 0, NULL);
    CHECK_OK(ddnccl_p2p_start(f->g, &ra, &r));
    CHECK_STATUS(ddnccl_request_wait(f->g, r, 100), DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(f->fr.err, "receive of 8 x int32 from rank 0");
    int32_t done = 1;
    CHECK_OK(ddnccl_request_test(f->g, r, &done));
    CHECK_EQ_INT(done, 0);
  }
  pthread_barrier_wait(&g_sync);
  if (f->rank == 0) {
    for (int i = 0; i < 8; i++) d[i] = 40 + i;
    ddplug_p2p_args sa = p2p_args(DDPLUG_P2P_SEND, d, 8, DDPLUG_INT32, peer, 0, NULL);
    CHECK_OK(ddnccl_p2p_start(f->g, &sa, &r));
  }
  CHECK_OK(ddnccl_request_wait(f->g, r, 5000));
  ddnccl_request_free(f->g, r);
  if (f->rank == 1) CHECK_EQ_INT(d[7], 47);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST(p2p_tag_other_than_0_refused_and_a_late_send_completes_a_timed_out_receive) {
  fake_reset();
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 10000, p2p_tag_and_timeout, NULL);
  all_created(f, 2);
  CHECK_EQ_INT(fake_misuses(), 0);
  store_free(s);
}

/* ---- elastic: group_shrink ---------------------------------------------- */

/* The new generation the runtime would make for the survivors: its store
 * keys (a prefix of their own: here a store of their own) and inits. */
static fake_store *g_store2;
static fake_world g_world2;
static fake_rank g_fr2[2];
static int g_in_place; /* plugin_options.shrink = "auto" */

/* Rank 1 of 3 is lost while ranks 0 and 2 wait in an allreduce it never
 * joins. The runtime aborts the survivors' group (PEER_LOST reached them)
 * and asks for the group without it: old ranks 0 and 2 become 0 and 1. */
static void shrink_body(frank *f) {
  static const int32_t old_of[2] = {0, 2};
  if (f->rank == 1) { /* the lost rank: never calls NCCL again */
    pthread_barrier_wait(&g_sync);
    pthread_barrier_wait(&g_sync);
    return;
  }
  ddplug_plugin_request *req = lonely_allreduce(f);
  pthread_barrier_wait(&g_sync);
  CHECK_OK(ddnccl_group_abort(f->g, "rank 1 (pid 1001) exited or was killed"));
  CHECK_EQ_INT(ddnccl_request_wait(f->g, req, 5000), DDPLUG_E_ABORTED);
  ddnccl_request_free(f->g, req);
  /* "auto": revoked and kept for the shrink; "recreate": aborted */
  CHECK_EQ_INT(f->g->revoked != NULL, g_in_place);
  int nr = f->rank == 0 ? 0 : 1;
  ddplug_plugin_group *g2 = NULL;
  int st = ddnccl_group_shrink(f->g, &g_world2.init[nr], &g_fr2[nr].svc, old_of, &g2);
  if (g_in_place) {
    CHECK_MSG(st == DDPLUG_OK, "rank %d: group_shrink: %s: %s", f->rank, ddnccl_status_name(st),
              g_fr2[nr].err);
    float *d = NULL;
    CHECK(cudaMalloc((void **)&d, 8 * sizeof(float)) == cudaSuccess);
    for (int i = 0; i < 8; i++) d[i] = (float)(f->rank + 1) * (float)(i + 1);
    ddplug_coll_args a = coll_args(DDPLUG_COLL_ALLREDUCE, d, d, 8, DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                                   0, NULL, 1);
    ddplug_plugin_request *r2 = NULL;
    CHECK_OK(ddnccl_collective_start(g2, &a, &r2));
    CHECK_OK(ddnccl_request_wait(g2, r2, 5000));
    ddnccl_request_free(g2, r2);
    for (int i = 0; i < 8; i++) /* (0+1 + 2+1) * (i+1): the survivors only */
      CHECK_MSG(d[i] == 4.0f * (float)(i + 1), "rank %d: element %d is %g", nr, i, d[i]);
    CHECK(cudaFree(d) == cudaSuccess);
    CHECK_OK(ddnccl_group_destroy(g2));
  } else {
    CHECK_EQ_INT(st, DDPLUG_E_UNSUPPORTED);
    CHECK(g2 == NULL);
    CHECK_CONTAINS(g_fr2[nr].err, "cannot shrink in place");
    CHECK_CONTAINS(g_fr2[nr].err, "plugin_options.shrink is \"recreate\"");
  }
  pthread_barrier_wait(&g_sync);
  CHECK(cudaFree(g_buf[f->rank]) == cudaSuccess);
}

static void shrink_case(const char *options, int in_place) {
  fake_reset();
  fake.devices = 3;
  g_in_place = in_place;
  g_store2 = store_new();
  world_init(&g_world2, 2, options, 10000);
  for (int r = 0; r < 2; r++) rank_init(&g_fr2[r], g_store2, r);
  frank f[3];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 3, options, 10000, shrink_body, NULL);
  all_created(f, 3);
  CHECK_EQ_INT(fake_live_comms(), 0); /* the revoked one aborted at destroy */
  store_free(s);
  store_free(g_store2);
}

TEST(shrink_auto_makes_the_survivors_communicator_in_place) {
  shrink_case("{\"shrink\": \"auto\"}", 1);
}

TEST(shrink_recreate_declines_so_the_runtime_makes_a_new_group) {
  shrink_case("{}", 0);
}

TEST(no_device_through_the_fake) {
  fake_reset();
  fake.devices = 0;
  frank f[2];
  fake_world w;
  fake_store *s = run_ranks(f, &w, 2, "{}", 60000, NULL, NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(f[r].created, DDPLUG_E_UNSUPPORTED);
    CHECK_CONTAINS(f[r].fr.err, "no CUDA device visible");
  }
  store_free(s);
}

#endif /* DDPLUG_TEST_NCCL */
