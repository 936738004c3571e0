/* test-nccl-gpu.c — the nccl plugin on a real GPU, through the runtime
 * (ddplug_open ... ddplug_close), with real rank processes:
 *   one rank through the whole path (device, host, pinned buffers; streams;
 *   async requests; barrier);
 *   two ranks (on one GPU with NCCL_MULTI_RANK_GPU_ENABLE=1 and
 *   allow_shared_gpu when only one is visible) against a host reference for
 *   every dtype x op the plugin advertises, broadcast and allgather;
 *   duplicate-GPU detection; the shared-GPU environment check;
 *   the collective timeout (TIMEOUT, and later calls the same at once; the peer learns it; one
 *   sentence whether it expired in the wait or inside collective_start);
 *   abort from another thread (in the wait, or inside collective_start);
 *   the optional mismatch check.
 * Every case skips (exit 77) when no CUDA device is visible, and all of them
 * when the plugin is not built. CUDA is initialised only inside the rank
 * processes (a forked child cannot use its parent's CUDA state).
 * Two ranks on one GPU need NCCL >= 2.30; with an older NCCL and one GPU
 * those cases skip and say so. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ddplug/store.h"

#ifndef DDPLUG_TEST_NCCL

TEST(nccl_plugin_not_built) {
  dt_skip("the nccl plugin was not built (no CUDA toolkit or NCCL found)");
}

#else

#include <cuda_runtime_api.h>

#include "nccl_test_values.h"

/* ---- helpers ------------------------------------------------------------ */

/* Visible CUDA devices, asked in a throwaway child process. */
static int visible_gpus(void) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int st = 0;
  if (dt_wait_pid(pid, 60000, &st) != 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return 0;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

static int need_gpus(int n) {
  int have = visible_gpus();
  if (have < n) dt_skip("needs %d CUDA device(s), %d visible", n, have);
  return have;
}

/* The version code of the NCCL library the plugin loads (its own RPATH, as
 * ddplug_open would resolve it), asked in a throwaway child; 0 if unknown. */
static int plugin_nccl_version_with(const char *needs);
static int plugin_nccl_version(void) { return plugin_nccl_version_with(NULL); }

/* ... 0 as well when that libnccl lacks the symbol `needs` (non-NULL). */
static int plugin_nccl_version_with(const char *needs) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int v = 0;
    ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
    void *h = ddplug_plugin_inspect("nccl", &info) == DDPLUG_OK
                  ? dlopen(info.path, RTLD_NOW | RTLD_LOCAL)
                  : NULL;
    int (*get)(int *) = h ? (int (*)(int *))dlsym(h, "ncclGetVersion") : NULL;
    if (get && get(&v) != 0) v = 0;
    if (needs && h && !dlsym(h, needs)) v = 0;
    if (write(fds[1], &v, sizeof v) != (ssize_t)sizeof v) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  int v = 0;
  if (pid < 0 || read(fds[0], &v, sizeof v) != (ssize_t)sizeof v) v = 0;
  close(fds[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  return v;
}

/* Enough GPUs for `world` ranks: one each, or fewer shared, which needs
 * NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE); otherwise the case skips. */
static int need_rank_slots(int world) {
  int have = need_gpus(1);
  if (have >= world) return have;
  int v = plugin_nccl_version();
  if (v < 23000)
    dt_skip("%d ranks on %d GPU(s) must share one, which needs NCCL >= 2.30; "
            "the plugin loads NCCL %d.%d.%d",
            world, have, v / 10000, v / 100 % 100, v % 100);
  return have;
}

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    CHECK_MSG(e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_)); \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void check_result(const char *what, int dt, int op, const void *out,
                         size_t n, int world) {
  for (size_t i = 0; i < n; i++) {
    double want = tv_round(dt, tv_reference(dt, op, world, i));
    double got = cf_get(dt, out, i);
    CHECK_MSG(got == want, "%s %s %s: element %zu is %g, expected %g", what,
              ddplug_dtype_name(dt), ddplug_op_name(op), i, got, want);
  }
}

/* The config every case uses: plugin nccl, a collective timeout, and the
 * device placement: separate GPUs when there are enough, else one shared. */
static char g_config[1024];
static const char *g_env[4];
static void set_config(int world, int gpus, const char *extra_options,
                       double collective_s) {
  int share = gpus < world;
  char map[128] = "";
  size_t w = 0;
  for (int r = 0; r < world; r++)
    w += (size_t)snprintf(map + w, sizeof map - w, "%s%d", r ? "," : "",
                          share ? 0 : r);
  snprintf(g_config, sizeof g_config,
           "DDPLUG_CONFIG={\"plugin\":\"nccl\",\"timeouts\":{\"collective_s\":%g},"
           "\"rendezvous\":{\"timeout_s\":60},\"plugin_options\":{\"device_map\":[%s]"
           "%s%s}}",
           collective_s, map, share ? ",\"allow_shared_gpu\":true" : "",
           extra_options ? extra_options : "");
  g_env[0] = g_config;
  g_env[1] = "NCCL_MULTI_RANK_GPU_ENABLE=1";
  g_env[2] = NULL;
}

static ddplug_context *open_ok(void) {
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(NULL, NULL, &ctx));
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_context_plugin(ctx, &info));
  CHECK_EQ_STR(info.name, "nccl");
  return ctx;
}

/* ---- every dtype x op against the reference ---------------------------- */

static void every_dtype_and_op(ddplug_context *ctx, int rank, int world) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_context_plugin(ctx, &info));
  const size_t n = 1031; /* not a multiple of anything */
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int checked = 0;
  for (int dt = 1; dt < DDPLUG_DTYPE_COUNT_; dt++) {
    if (!(info.dtype_mask & DDPLUG_DTYPE_BIT(dt))) continue;
    size_t es = ddplug_dtype_size(dt);
    unsigned char *in = malloc(n * es), *out = malloc(n * es * (size_t)world);
    void *din, *dout, *pinned;
    CUDA_OK(cudaMalloc(&din, n * es));
    CUDA_OK(cudaMalloc(&dout, n * es * (size_t)world));
    CUDA_OK(cudaMallocHost(&pinned, n * es));
    for (size_t i = 0; i < n; i++) cf_put(dt, in, i, tv_value(rank, i));
    for (int op = 1; op < DDPLUG_OP_COUNT_; op++) {
      if (!(info.op_mask & DDPLUG_OP_BIT(op))) continue;
      /* device buffers, out of place, on a caller stream */
      CUDA_OK(cudaMemcpy(din, in, n * es, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(dout, 0, n * es));
      CHECK_OK(ddplug_allreduce(ctx, din, dout, n, dt, op, s));
      CUDA_OK(cudaMemcpy(out, dout, n * es, cudaMemcpyDeviceToHost));
      check_result("device", dt, op, out, n, world);
      /* device, in place, default stream */
      CHECK_OK(ddplug_allreduce(ctx, din, din, n, dt, op, NULL));
      CUDA_OK(cudaMemcpy(out, din, n * es, cudaMemcpyDeviceToHost));
      check_result("device in-place", dt, op, out, n, world);
      /* pageable host buffers (staged), in place */
      memcpy(out, in, n * es);
      CHECK_OK(ddplug_allreduce(ctx, out, out, n, dt, op, NULL));
      check_result("host", dt, op, out, n, world);
      /* pinned host send, pageable host recv */
      memcpy(pinned, in, n * es);
      memset(out, 0, n * es);
      CHECK_OK(ddplug_allreduce(ctx, pinned, out, n, dt, op, NULL));
      check_result("pinned->host", dt, op, out, n, world);
      checked++;
    }
    /* broadcast from the last rank (device), allgather (host, in place) */
    int root = world - 1;
    CUDA_OK(cudaMemcpy(din, in, n * es, cudaMemcpyHostToDevice));
    CHECK_OK(ddplug_broadcast(ctx, din, din, n, dt, root, s));
    CUDA_OK(cudaMemcpy(out, din, n * es, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
      CHECK_MSG(cf_get(dt, out, i) == tv_value(root, i), "broadcast %s element %zu",
                ddplug_dtype_name(dt), i);
    memset(out, 0, n * es * (size_t)world);
    memcpy(out + (size_t)rank * n * es, in, n * es);
    CHECK_OK(ddplug_allgather(ctx, out + (size_t)rank * n * es, out, n, dt, NULL));
    for (int r = 0; r < world; r++)
      for (size_t i = 0; i < n; i++)
        CHECK_MSG(cf_get(dt, out + (size_t)r * n * es, i) == tv_value(r, i),
                  "allgather %s block %d element %zu", ddplug_dtype_name(dt), r, i);
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
    CUDA_OK(cudaFreeHost(pinned));
    free(in);
    free(out);
  }
  CHECK_EQ_INT(checked, 8 * 5); /* every dtype with sum, avg, min, max, prod */
  CUDA_OK(cudaStreamDestroy(s));
}

/* Async requests backed by events: several in flight, waited in order. */
static void async_requests(ddplug_context *ctx, int rank, int world) {
  enum { K = 4, N = 1 << 16 };
  float *d[K], host[N];
  ddplug_request *req[K];
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++) host[i] = (float)(rank + k);
    CUDA_OK(cudaMalloc((void **)&d[k], N * sizeof(float)));
    CUDA_OK(cudaMemcpy(d[k], host, N * sizeof(float), cudaMemcpyHostToDevice));
  }
  for (int k = 0; k < K; k++)
    CHECK_OK(ddplug_iallreduce(ctx, d[k], d[k], N, DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                               NULL, &req[k]));
  for (int k = 0; k < K; k++) {
    CHECK_OK(ddplug_request_wait(req[k], 60000));
    ddplug_request_free(req[k]);
    CUDA_OK(cudaMemcpy(host, d[k], N * sizeof(float), cudaMemcpyDeviceToHost));
    float want = (float)(world * (world - 1) / 2 + world * k);
    CHECK_MSG(host[0] == want && host[N - 1] == want, "async %d: %g != %g", k,
              host[0], want);
    CUDA_OK(cudaFree(d[k]));
  }
  int done = 0;
  ddplug_request *b = NULL;
  CHECK_OK(ddplug_ibarrier(ctx, &b));
  CHECK_OK(ddplug_request_wait(b, 60000));
  CHECK_OK(ddplug_request_test(b, &done));
  CHECK_EQ_INT(done, 1);
  ddplug_request_free(b);
}

static void whole_path_rank(int rank, int world, void *arg) {
  (void)arg;
  ddplug_context *ctx = open_ok();
  every_dtype_and_op(ctx, rank, world);
  async_requests(ctx, rank, world);
  CHECK_OK(ddplug_barrier(ctx, 60000));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(one_rank_whole_path, 300) {
  int gpus = need_gpus(1);
  set_config(1, gpus, NULL, 120);
  CHECK_EQ_INT(dt_run_ranks(1, whole_path_rank, NULL, g_env, 280, NULL), 0);
}

TEST_T(two_ranks_every_dtype_and_op_against_reference, 300) {
  int gpus = need_rank_slots(2);
  set_config(2, gpus, NULL, 120);
  dt_note("%s", gpus >= 2 ? "one GPU per rank" : "both ranks on GPU 0");
  CHECK_EQ_INT(dt_run_ranks(2, whole_path_rank, NULL, g_env, 280, NULL), 0);
}

/* ---- device checks ------------------------------------------------------ */

static void expect_open_fails(int rank, int world, void *arg) {
  (void)world;
  const char *needle = arg;
  unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
  ddplug_context *ctx = NULL;
  int st = ddplug_open(NULL, NULL, &ctx);
  CHECK_MSG(st != DDPLUG_OK, "rank %d: ddplug_open succeeded", rank);
  CHECK(ctx == NULL);
  dt_note("rank %d: %s: %s", rank, ddplug_status_name(st), ddplug_last_error());
  CHECK_EQ_INT(st, DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), needle);
}

TEST_T(duplicate_gpu_names_both_ranks, 120) {
  need_gpus(1);
  static const char *env[] = {
      "DDPLUG_CONFIG={\"plugin\":\"nccl\",\"rendezvous\":{\"timeout_s\":60},"
      "\"plugin_options\":{\"device_map\":[0,0]}}",
      NULL};
  CHECK_EQ_INT(dt_run_ranks(2, expect_open_fails,
                            (void *)"ranks 0 and 1 are bound to the same GPU GPU-",
                            env, 100, NULL),
               0);
}

TEST_T(shared_gpu_without_the_nccl_env_is_refused, 120) {
  /* Only NCCL >= 2.30 can share a GPU; before it the version is refused
   * first, and the environment check is never reached. */
  if (plugin_nccl_version() < 23000)
    dt_skip("sharing a GPU needs NCCL >= 2.30; the environment check is not reached");
  need_gpus(1);
  static const char *env[] = {
      "DDPLUG_CONFIG={\"plugin\":\"nccl\",\"rendezvous\":{\"timeout_s\":60},"
      "\"plugin_options\":{\"device_map\":[0,0],\"allow_shared_gpu\":true}}",
      NULL};
  CHECK_EQ_INT(dt_run_ranks(2, expect_open_fails,
                            (void *)"without NCCL_MULTI_RANK_GPU_ENABLE=1", env,
                            100, NULL),
               0);
}

/* ---- timeout, abort, mismatch ------------------------------------------ */

/* The sentence every path of a collective timeout uses (the plugin's
 * watchdog in request_wait, and collective_start when NCCL kept the call
 * ncclInProgress that long, e.g. connecting an algorithm to a peer that
 * never came). */
#define TIMEOUT_SENTENCE "did not complete within the collective timeout"

/* The rank that stays out of the failed collective: once the run's
 * failure is on record (ddplug/abort in the store; not after a sleep, which
 * a slow rank 0 could outlast, and then this barrier would pair with rank
 * 0's collective inside NCCL) it calls a barrier, which must fail with the
 * run's reason containing `needle`. */
static void late_rank_barrier(ddplug_context *ctx, const char *needle) {
  const char *abort_key[1] = {"ddplug/abort"};
  CHECK_OK(ddplug_store_wait(ddplug_context_store(ctx), abort_key, 1, 60000));
  double t0 = now_s();
  int st = ddplug_barrier(ctx, 60000);
  dt_note("rank 1: barrier returned %s after %.2f s: %s", ddplug_status_name(st),
          now_s() - t0, ddplug_last_error());
  CHECK_MSG(st != DDPLUG_OK, "rank 1's barrier succeeded in an aborted run");
  CHECK_CONTAINS(ddplug_last_error(), needle);
}

#define CHECKED_KEY "user/test-nccl-gpu/rank1-checked"

static void timeout_rank(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  ddplug_context *ctx = open_ok();
  ddplug_store *store = ddplug_context_store(ctx);
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, 1024 * sizeof(float)));
  if (rank == 0) {
    /* Rank 1 never joins this allreduce. group_create connected the ranks,
     * so it is normally enqueued at once and times out in the wait (the
     * watchdog; the runtime then aborts the run). Should NCCL pick an
     * algorithm for 4 KiB that group_create's 1-element allreduce did not
     * connect, it stays inside collective_start, which times out with the
     * same sentence (the peer then learns it from the plugin's "abort" key
     * in its next wait). Either way: TIMEOUT, and every later call fails at
     * once with the same status and sentence (ddplug.h, "Collectives"). */
    double t0 = now_s();
    int st = ddplug_allreduce(ctx, d, d, 1024, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
    dt_note("rank 0: allreduce returned %s after %.2f s: %s",
            ddplug_status_name(st), now_s() - t0, ddplug_last_error());
    CHECK_EQ_INT(st, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), TIMEOUT_SENTENCE);
    /* at once: the run's reason, about the first collective; a call that
     * went to the plugin again would time out on its own, naming the second
     * ("collective #2", "seq 2") */
    st = ddplug_allreduce(ctx, d, d, 1024, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
    CHECK_EQ_INT(st, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), TIMEOUT_SENTENCE);
    CHECK_CONTAINS(ddplug_last_error(), "rank 0 ended the run: ");
    CHECK_MSG(!strstr(ddplug_last_error(), "#2") && !strstr(ddplug_last_error(), "seq 2"),
              "the call after the timeout ran (and timed out) again: %s", ddplug_last_error());
    /* Rank 0 serves the store: stay until rank 1 has looked (a close that
     * gave up waiting for rank 1 would abort the run with its own reason). */
    void *v = NULL;
    uint64_t len = 0;
    CHECK_OK(ddplug_store_get(store, CHECKED_KEY, 60000, &v, &len));
    ddplug_free(v);
  } else {
    /* after rank 0's collective timeout (2 s) ended the run */
    late_rank_barrier(ctx, TIMEOUT_SENTENCE);
    CHECK_OK(ddplug_store_set(store, CHECKED_KEY, "1", 1));
  }
  (void)ddplug_close(ctx);
}

TEST_T(collective_timeout_aborts_and_the_peer_learns_it, 120) {
  int gpus = need_rank_slots(2);
  set_config(2, gpus, NULL, 2);
  CHECK_EQ_INT(dt_run_ranks(2, timeout_rank, NULL, g_env, 100, NULL), 0);
}

typedef struct abort_arg {
  ddplug_context *ctx;
} abort_arg;

static void *abort_later(void *p) {
  abort_arg *a = p;
  usleep(300000);
  (void)ddplug_abort(a->ctx, "test abort from another thread");
  return NULL;
}

static void abort_rank(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  ddplug_context *ctx = open_ok();
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, 1024 * sizeof(float)));
  if (rank == 0) {
    /* The aborting thread starts first: should the allreduce stay inside
     * collective_start (NCCL connecting an algorithm with rank 1, which
     * never joins), the abort ends it there; normally it is enqueued at
     * once and the abort ends the wait. */
    abort_arg a = {ctx};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, abort_later, &a) == 0);
    double t0 = now_s();
    ddplug_request *req = NULL;
    int st = ddplug_iallreduce(ctx, d, d, 1024, DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                               NULL, &req);
    const char *where = "iallreduce";
    if (st == DDPLUG_OK) {
      where = "wait";
      st = ddplug_request_wait(req, 60000);
    }
    dt_note("rank 0: %s returned %s after %.2f s: %s", where,
            ddplug_status_name(st), now_s() - t0, ddplug_last_error());
    pthread_join(t, NULL);
    CHECK_EQ_INT(st, DDPLUG_E_ABORTED);
    CHECK_CONTAINS(ddplug_last_error(), "test abort from another thread");
    ddplug_request_free(req);
  } else {
    /* Join no collective while rank 0's is pending (a barrier would pair
     * with it inside NCCL); by the time this runs, the run is aborted. */
    late_rank_barrier(ctx, "test abort from another thread");
  }
  (void)ddplug_close(ctx);
}

TEST_T(abort_from_another_thread_reaches_every_rank, 120) {
  int gpus = need_rank_slots(2);
  set_config(2, gpus, NULL, 60);
  CHECK_EQ_INT(dt_run_ranks(2, abort_rank, NULL, g_env, 100, NULL), 0);
}

static void mismatch_rank(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  ddplug_context *ctx = open_ok();
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, 16 * sizeof(float)));
  CUDA_OK(cudaMemset(d, 0, 16 * sizeof(float)));
  int st = ddplug_allreduce(ctx, d, d, rank == 0 ? 10 : 12, DDPLUG_FLOAT32,
                            DDPLUG_OP_SUM, NULL);
  CHECK_EQ_INT(st, DDPLUG_E_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(),
                 "rank 1 called allreduce(count=12, float32, sum) but rank 0 "
                 "called allreduce(count=10, float32, sum)");
  /* Nothing was enqueued: the group is still usable. */
  CHECK_OK(ddplug_allreduce(ctx, d, d, 16, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(mismatch_check_reports_on_every_rank, 120) {
  int gpus = need_rank_slots(2);
  set_config(2, gpus, ",\"check_mismatch\":true", 60);
  CHECK_EQ_INT(dt_run_ranks(2, mismatch_rank, NULL, g_env, 100, NULL), 0);
}

/* ---- point-to-point ------------------------------------------------------ */

/* Every rank sends to the next and receives from the previous one, both
 * started before either is waited for (a ring needs them fused, or it could
 * deadlock beyond NCCL's buffers): 4 MiB of device memory on a caller
 * stream, then 3 floats of pageable host memory (staged) on no stream, then
 * pinned host memory. Then an allreduce (p2p queued ahead of a collective
 * runs first), a 16 MiB exchange both ways with the blocking forms in rank
 * order, and a tag other than 0 refused (NCCL has no tags). */
static void p2p_rank(int rank, int world, void *arg) {
  (void)arg;
  ddplug_context *ctx = open_ok();
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  const size_t n = 1 << 20;
  float *host = malloc(n * sizeof(float)), *pinned, *dsend, *drecv;
  CHECK(host != NULL);
  CUDA_OK(cudaMalloc((void **)&dsend, n * sizeof(float)));
  CUDA_OK(cudaMalloc((void **)&drecv, n * sizeof(float)));
  CUDA_OK(cudaMallocHost((void **)&pinned, 2 * n * sizeof(float)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t i = 0; i < n; i++) host[i] = (float)(rank * 1000003 + (int)(i % 4099));
  CUDA_OK(cudaMemcpy(dsend, host, n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(drecv, 0, n * sizeof(float)));
  ddplug_request *rs = NULL, *rr = NULL;
  CHECK_OK(ddplug_isend(ctx, dsend, n, DDPLUG_FLOAT32, next, 0, s, &rs));
  CHECK_OK(ddplug_irecv(ctx, drecv, n, DDPLUG_FLOAT32, prev, 0, s, &rr));
  CHECK_OK(ddplug_request_wait(rr, 60000));
  CHECK_OK(ddplug_request_wait(rs, 60000));
  int src = -1;
  CHECK_OK(ddplug_request_source(rr, &src));
  CHECK_EQ_INT(src, prev);
  ddplug_request_free(rs);
  ddplug_request_free(rr);
  CUDA_OK(cudaMemcpy(host, drecv, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i += 997)
    CHECK_MSG(host[i] == (float)(prev * 1000003 + (int)(i % 4099)),
              "device ring: element %zu is %g from rank %d", i, host[i], prev);

  float small_out[3] = {(float)rank, (float)rank + 0.5f, -1.0f}, small_in[3] = {0, 0, 0};
  CHECK_OK(ddplug_isend(ctx, small_out, 3, DDPLUG_FLOAT32, next, 0, NULL, &rs));
  CHECK_OK(ddplug_irecv(ctx, small_in, 3, DDPLUG_FLOAT32, prev, 0, NULL, &rr));
  CHECK_OK(ddplug_request_wait(rs, 60000));
  CHECK_OK(ddplug_request_wait(rr, 60000));
  ddplug_request_free(rs);
  ddplug_request_free(rr);
  CHECK_MSG(small_in[0] == (float)prev && small_in[1] == (float)prev + 0.5f && small_in[2] == -1.0f,
            "host ring: got %g %g %g from rank %d", small_in[0], small_in[1], small_in[2], prev);

  for (size_t i = 0; i < n; i++) pinned[i] = (float)(rank + 7);
  CHECK_OK(ddplug_isend(ctx, pinned, n, DDPLUG_FLOAT32, next, 0, NULL, &rs));
  CHECK_OK(ddplug_irecv(ctx, pinned + n, n, DDPLUG_FLOAT32, prev, 0, NULL, &rr));
  /* an allreduce started while they are queued: they launch first */
  float one = 1.0f;
  CHECK_OK(ddplug_allreduce(ctx, &one, &one, 1, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  CHECK_MSG(one == (float)world, "allreduce after queued p2p: %g", one);
  CHECK_OK(ddplug_request_wait(rs, 60000));
  CHECK_OK(ddplug_request_wait(rr, 60000));
  ddplug_request_free(rs);
  ddplug_request_free(rr);
  CHECK_MSG(pinned[n] == (float)(prev + 7) && pinned[2 * n - 1] == (float)(prev + 7),
            "pinned ring: %g %g from rank %d", pinned[n], pinned[2 * n - 1], prev);

  /* 16 MiB between ranks 0 and 1 with the blocking forms, ordered */
  if (rank < 2) {
    const size_t big = 4 << 20;
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, big * sizeof(float)));
    if (rank == 0) {
      CUDA_OK(cudaMemset(d, 0, big * sizeof(float)));
      int from = -1;
      CHECK_OK(ddplug_recv(ctx, d, big, DDPLUG_FLOAT32, 1, 0, NULL, 60000, &from));
      CHECK_EQ_INT(from, 1);
      CHECK_OK(ddplug_send(ctx, d, big, DDPLUG_FLOAT32, 1, 0, NULL, 60000));
    } else {
      for (size_t i = 0; i < n; i++) host[i] = 42.0f;
      for (size_t off = 0; off < big; off += n)
        CUDA_OK(cudaMemcpy(d + off, host, n * sizeof(float), cudaMemcpyHostToDevice));
      CHECK_OK(ddplug_send(ctx, d, big, DDPLUG_FLOAT32, 0, 0, NULL, 60000));
      CUDA_OK(cudaMemset(d, 0, big * sizeof(float)));
      CHECK_OK(ddplug_recv(ctx, d, big, DDPLUG_FLOAT32, 0, 0, NULL, 60000, NULL));
    }
    float last = 0, first = 0;
    CUDA_OK(cudaMemcpy(&first, d, sizeof first, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&last, d + big - 1, sizeof last, cudaMemcpyDeviceToHost));
    CHECK_MSG(first == 42.0f && last == 42.0f, "16 MiB round trip: %g .. %g", first, last);
    CUDA_OK(cudaFree(d));
  }

  ddplug_request *bad = NULL;
  CHECK_STATUS(ddplug_isend(ctx, dsend, 4, DDPLUG_FLOAT32, next, 3, NULL, &bad),
               DDPLUG_E_UNSUPPORTED);
  CHECK(bad == NULL);
  CHECK_CONTAINS(ddplug_last_error(), "tag");
  CHECK_OK(ddplug_barrier(ctx, 60000));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(dsend));
  CUDA_OK(cudaFree(drecv));
  CUDA_OK(cudaFreeHost(pinned));
  free(host);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(p2p_ring_device_host_pinned_and_16mib_on_three_ranks, 300) {
  int gpus = need_rank_slots(3);
  set_config(3, gpus, NULL, 120);
  dt_note("%s", gpus >= 3 ? "one GPU per rank" : "the ranks share GPU 0");
  CHECK_EQ_INT(dt_run_ranks(3, p2p_rank, NULL, g_env, 280, NULL), 0);
}

/* ---- elastic: a rank lost inside its allreduce, survivors shrink ---------- */

/* Three ranks (elastic.on_peer_lost = "shrink"); rank 2 is killed with an
 * allreduce of device memory in flight. The survivors' allreduce fails with
 * PEER_LOST (or completes, if rank 2's share was in: the next one fails),
 * ddplug_shrink re-forms the group over ranks 0 and 1, and device
 * allreduces then sum over the two. With plugin_options.shrink "recreate"
 * (the default) the runtime destroys the aborted NCCL communicator and
 * creates a new one (the plugin's group_shrink declines); with "auto"
 * (arg non-NULL) the plugin shrinks the revoked one in place with
 * ncclCommShrink, which its log line says. */
static int g_shrunk_in_place;
static void shrink_log(void *user, int level, int rank, const char *line) {
  (void)user;
  (void)level;
  (void)rank;
  if (strstr(line, "shrunk in place with ncclCommShrink")) g_shrunk_in_place = 1;
}

static void elastic_rank(int rank, int world, void *arg) {
  (void)world;
  if (arg) ddplug_log_set_callback(shrink_log, NULL);
  ddplug_context *ctx = open_ok();
  float *d, h[256];
  CUDA_OK(cudaMalloc((void **)&d, sizeof h));
  for (int i = 0; i < 256; i++) h[i] = 1.0f;
  CUDA_OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
  CHECK_OK(ddplug_allreduce(ctx, d, d, 256, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  if (rank == 2) {
    ddplug_request *req = NULL;
    CHECK_OK(ddplug_iallreduce(ctx, d, d, 256, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, &req));
    raise(SIGKILL);
  }
  int st = DDPLUG_OK, calls = 0;
  while (st == DDPLUG_OK && calls < 3) {
    st = ddplug_allreduce(ctx, d, d, 256, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
    calls++;
  }
  dt_note("rank %d: call %d returned %s: %s", rank, calls, ddplug_status_name(st),
          ddplug_last_error());
  CHECK_EQ_INT(st, DDPLUG_E_PEER_LOST);
  CHECK_CONTAINS(ddplug_last_error(), "rank 2");
  ddplug_membership m = DDPLUG_MEMBERSHIP_INIT;
  double t0 = now_s();
  CHECK_OK(ddplug_shrink(ctx, 60000, &m));
  dt_note("rank %d: shrink took %.3f s: now rank %d of %d (lost %s)", rank, now_s() - t0,
          m.rank, m.world_size, m.lost);
  CHECK_EQ_INT(m.world_size, 2);
  CHECK_EQ_INT(m.rank, rank);
  CHECK_EQ_STR(m.lost, "2");
  if (arg) CHECK_MSG(g_shrunk_in_place, "rank %d: the group was not shrunk in place", rank);
  for (int i = 0; i < 256; i++) h[i] = (float)(rank + 1);
  CUDA_OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
  for (int k = 0; k < 3; k++)
    CHECK_OK(ddplug_allreduce(ctx, d, d, 256, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  /* (1 + 2) doubled twice: 12 */
  CHECK_MSG(h[0] == 12.0f && h[255] == 12.0f, "after the shrink: %g .. %g", h[0], h[255]);
  CHECK_OK(ddplug_barrier(ctx, 60000));
  CUDA_OK(cudaFree(d));
  CHECK_OK(ddplug_close(ctx));
}

static void elastic_case(const char *extra_options, void *arg) {
  int gpus = need_rank_slots(3);
  set_config(3, gpus, extra_options, 60);
  /* set_config's JSON ends "}}": add the elastic section and the log level
   * before the last brace */
  size_t len = strlen(g_config);
  snprintf(g_config + len - 1, sizeof g_config - len + 1,
           ",\"elastic\":{\"on_peer_lost\":\"shrink\"},\"log_level\":\"info\"}");
  int statuses[3] = {0, 0, 0};
  CHECK_EQ_INT(dt_run_ranks(3, elastic_rank, arg, g_env, 280, statuses), 1);
  CHECK(WIFSIGNALED(statuses[2]) && WTERMSIG(statuses[2]) == SIGKILL);
  CHECK(WIFEXITED(statuses[0]) && WEXITSTATUS(statuses[0]) == 0);
  CHECK(WIFEXITED(statuses[1]) && WEXITSTATUS(statuses[1]) == 0);
}

TEST_T(elastic_shrink_after_a_rank_dies_inside_a_device_allreduce, 300) {
  elastic_case(NULL, NULL);
}

/* The same with the communicator shrunk in place (ncclCommShrink of the
 * revoked one): needs an NCCL with ncclCommRevoke and ncclCommShrink. */
TEST_T(elastic_shrink_in_place_with_nccl_comm_shrink, 300) {
  need_rank_slots(3);
  if (!plugin_nccl_version_with("ncclCommRevoke") || !plugin_nccl_version_with("ncclCommShrink"))
    dt_skip("the loaded NCCL (%d) has no ncclCommRevoke or ncclCommShrink",
            plugin_nccl_version());
  static int in_place = 1;
  elastic_case(",\"shrink\":\"auto\"", &in_place);
}

#endif /* DDPLUG_TEST_NCCL */
