/* test-cpu-api.c — the cpu plugin as users meet it: through the public API
 * (ddplug_open with plugin "cpu", the real rendezvous store, locality from
 * host identities; DT_LINK_SHARED: linked against libddplug.so). Forked
 * torchrun-style ranks on one node and on two simulated nodes
 * (DDPLUG_HOST_ID); a matrix of dtypes, ops and sizes checked against the
 * exact reference; async requests overlapping compute; a rank SIGKILLed in
 * the middle of an allreduce (every survivor: PEER_LOST naming it); a
 * mismatched collective (MISMATCH on every rank); ddplug_abort from one
 * rank; a wait timeout naming the sequence number and the late rank; bad
 * plugin_options refused by ddplug_open; registered memory
 * (ddplug_mem_alloc/free/reach) with an allreduce on it, and UNSUPPORTED
 * from a plugin without it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "cpu_data.h"
#include "ddplug/store.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define MIB (1ull << 20)

static void use_config(const char *plugin_options, int coll_s) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"plugin\": \"cpu\", \"rendezvous\": {\"timeout_s\": 30}, "
           "\"timeouts\": {\"collective_s\": %d}, \"plugin_options\": %s}",
           coll_s, plugin_options ? plugin_options : "{}");
  setenv("DDPLUG_CONFIG", json, 1);
}

static ddplug_context *open_host(int rank, int nodes, const char *options, int coll_s) {
  use_config(options, coll_s);
  if (nodes > 1) {
    char id[32];
    snprintf(id, sizeof id, "simnode%d", rank % nodes);
    setenv("DDPLUG_HOST_ID", id, 1);
  }
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(NULL, NULL, &ctx));
  CHECK_EQ_INT(ddplug_context_num_nodes(ctx), nodes);
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_context_plugin(ctx, &info));
  CHECK_EQ_STR(info.name, "cpu");
  return ctx;
}

static void check_allreduce(ddplug_context *ctx, int rank, int world, int dt, int op,
                            uint64_t count, int inplace) {
  uint32_t es = ddplug_dtype_size(dt);
  unsigned char *send = malloc(count * es + 8), *recv = malloc(count * es + 8);
  unsigned char ref[HDATA_PERIOD * 8];
  hdata_fill(inplace ? recv : send, dt, op, rank, count);
  hdata_ref(ref, dt, op, world);
  CHECK_OK(ddplug_allreduce(ctx, inplace ? recv : send, recv, count, dt, op, NULL));
  int64_t bad = hdata_check(recv, ref, dt, count, 0);
  if (bad >= 0) {
    char d[160];
    hdata_describe(d, sizeof d, recv, ref, dt, (uint64_t)bad, 0);
    dt_fail(__FILE__, __LINE__, "rank %d: allreduce %s %s count %llu: %s", rank,
            ddplug_dtype_name(dt), ddplug_op_name(op), (unsigned long long)count, d);
  }
  free(send);
  free(recv);
}

/* ---- correctness --------------------------------------------------------- */

typedef struct layout {
  int nodes;
} layout;

static void matrix_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_host(rank, l->nodes, NULL, 60);
  const int dts[] = {DDPLUG_FLOAT32, DDPLUG_FLOAT64, DDPLUG_FLOAT16, DDPLUG_BFLOAT16,
                     DDPLUG_INT8, DDPLUG_UINT8, DDPLUG_INT32, DDPLUG_INT64};
  for (int d = 0; d < 8; d++) {
    int dt = dts[d];
    uint64_t sizes[] = {0, 1, 7, MIB / ddplug_dtype_size(dt) + 3};
    for (int op = DDPLUG_OP_SUM; op <= DDPLUG_OP_BAND; op++) {
      int is_int = dt == DDPLUG_INT8 || dt == DDPLUG_UINT8 || dt == DDPLUG_INT32 ||
                   dt == DDPLUG_INT64;
      if ((op == DDPLUG_OP_BOR || op == DDPLUG_OP_BAND) && !is_int) continue;
      for (int z = 0; z < 4; z++) check_allreduce(ctx, rank, world, dt, op, sizes[z], z & 1);
    }
    /* broadcast and allgather of the largest size */
    uint64_t n = sizes[3];
    uint32_t es = ddplug_dtype_size(dt);
    unsigned char *buf = malloc(n * es * (uint64_t)world);
    int root = (d + 1) % world;
    if (rank == root) hdata_fill(buf, dt, 0, root, n);
    CHECK_OK(ddplug_broadcast(ctx, buf, buf, n, dt, root, NULL));
    CHECK(hdata_check_rank(buf, dt, 0, root, n) < 0);
    unsigned char *mine = buf + (uint64_t)rank * n * es;
    hdata_fill(mine, dt, 0, rank, n);
    CHECK_OK(ddplug_allgather(ctx, mine, buf, n, dt, NULL));
    for (int k = 0; k < world; k++)
      CHECK(hdata_check_rank(buf + (uint64_t)k * n * es, dt, 0, k, n) < 0);
    free(buf);
  }
  /* a large one */
  check_allreduce(ctx, rank, world, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 16 * MIB, 0);
  CHECK_OK(ddplug_barrier(ctx, 20000));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(api_matrix_one_node_4_ranks, 120) {
  layout l = {1};
  CHECK_EQ_INT(dt_run_ranks(4, matrix_rank, &l, NULL, 120, NULL), 0);
}

TEST_T(api_matrix_two_simulated_nodes, 120) {
  layout l = {2};
  CHECK_EQ_INT(dt_run_ranks(4, matrix_rank, &l, NULL, 120, NULL), 0);
}

/* ---- async ---------------------------------------------------------------- */

static volatile double sink;
static void async_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_host(rank, l->nodes, NULL, 60);
  enum { B = 8 };
  uint64_t n = MIB;
  float *g[B];
  ddplug_request *req[B];
  float ref[HDATA_PERIOD];
  hdata_ref(ref, DDPLUG_FLOAT32, DDPLUG_OP_SUM, world);
  /* "backward": start one bucket after another while computing */
  double x = 1;
  for (int b = 0; b < B; b++) {
    g[b] = malloc(n * 4);
    hdata_fill(g[b], DDPLUG_FLOAT32, DDPLUG_OP_SUM, rank, n);
    CHECK_OK(ddplug_iallreduce(ctx, g[b], g[b], n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, &req[b]));
    CHECK_EQ_INT(ddplug_request_seq(req[b]), b + 1);
    for (int i = 0; i < 200000; i++) x = x * 1.0000001 + 1e-9;
  }
  sink = x;
  int done = 0;
  CHECK_OK(ddplug_request_test(req[0], &done));
  for (int b = 0; b < B; b++) {
    CHECK_OK(ddplug_request_wait(req[b], 30000));
    ddplug_request_free(req[b]);
    CHECK(hdata_check(g[b], ref, DDPLUG_FLOAT32, n, 0) < 0);
    free(g[b]);
  }
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(api_async_buckets_overlap_compute, 60) {
  layout l = {1};
  CHECK_EQ_INT(dt_run_ranks(3, async_rank, &l, NULL, 60, NULL), 0);
}

TEST_T(api_async_buckets_two_nodes, 60) {
  layout l = {2};
  CHECK_EQ_INT(dt_run_ranks(4, async_rank, &l, NULL, 60, NULL), 0);
}

/* ---- failures ----------------------------------------------------------------- */

static void killed_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_host(rank, l->nodes, NULL, 60);
  uint64_t n = 16 * MIB;
  float *buf = calloc(n, 4);
  CHECK_OK(ddplug_allreduce(ctx, buf, buf, 1000, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  /* Rank 2 goes on once every rank has finished that first allreduce (one
   * still finishing it when rank 2 dies may rightly fail it). */
  ddplug_store *st = ddplug_context_store(ctx);
  char key[32];
  snprintf(key, sizeof key, "test/warm/%d", rank);
  CHECK_OK(ddplug_store_set(st, key, "1", 1));
  if (rank == 2) {
    const char *warm[] = {"test/warm/0", "test/warm/1", "test/warm/2", "test/warm/3"};
    CHECK_OK(ddplug_store_wait(st, warm, 4, 30000));
    /* inside it, then gone; should its 2 ms wait have run it to the end
     * (a wait that makes progress goes on), the next one */
    for (;;) {
      ddplug_request *req = NULL;
      CHECK_OK(ddplug_iallreduce(ctx, buf, buf, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, &req));
      if (ddplug_request_wait(req, 2) != DDPLUG_OK) raise(SIGKILL);
      ddplug_request_free(req);
    }
  }
  double t0 = now_s();
  int s;
  do /* as many as rank 2 completed, then the one it died in */
    s = ddplug_allreduce(ctx, buf, buf, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  while (s == DDPLUG_OK);
  double t1 = now_s();
  CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank %d: expected PEER_LOST, got %s: %s", rank,
            ddplug_status_name(s), ddplug_last_error());
  CHECK_CONTAINS(ddplug_last_error(), "rank 2");
  dt_note("rank %d: PEER_LOST after %.1f ms in the allreduce: %s", rank, (t1 - t0) * 1e3,
          ddplug_last_error());
  double t2 = now_s();
  ddplug_close(ctx);
  dt_note("rank %d: ddplug_close took %.1f ms", rank, (now_s() - t2) * 1e3);
  free(buf);
  (void)world;
}

static void run_killed(int nodes) {
  layout l = {nodes};
  int st[4];
  int failed = dt_run_ranks(4, killed_rank, &l, NULL, 60, st);
  CHECK_EQ_INT(failed, 1);
  CHECK(WIFSIGNALED(st[2]) && WTERMSIG(st[2]) == SIGKILL);
}

TEST_T(api_rank_killed_inside_allreduce, 60) { run_killed(1); }
TEST_T(api_rank_killed_inside_allreduce_two_nodes, 60) { run_killed(2); }

static void mismatch_rank(int rank, int world, void *arg) {
  (void)arg;
  ddplug_context *ctx = open_host(rank, 1, NULL, 60);
  int32_t v[8] = {0};
  int s = ddplug_allreduce(ctx, v, v, rank == world - 1 ? 8 : 4, DDPLUG_INT32, DDPLUG_OP_SUM,
                           NULL);
  CHECK_MSG(s == DDPLUG_E_MISMATCH, "rank %d: expected MISMATCH, got %s: %s", rank,
            ddplug_status_name(s), ddplug_last_error());
  CHECK_CONTAINS(ddplug_last_error(), "differs across ranks");
  ddplug_close(ctx);
}

TEST_T(api_mismatch_on_every_rank, 60) {
  CHECK_EQ_INT(dt_run_ranks(3, mismatch_rank, NULL, NULL, 60, NULL), 0);
}

static void abort_rank(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  ddplug_context *ctx = open_host(rank, 1, NULL, 60);
  float x = 1;
  if (rank == 1) {
    usleep(300 * 1000);
    CHECK_OK(ddplug_abort(ctx, "stop the run"));
  }
  int s = ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  CHECK_STATUS(s, DDPLUG_E_ABORTED);
  CHECK_CONTAINS(ddplug_last_error(), "stop the run");
  ddplug_close(ctx);
}

TEST_T(api_abort_reaches_every_rank, 60) {
  CHECK_EQ_INT(dt_run_ranks(3, abort_rank, NULL, NULL, 60, NULL), 0);
}

/* Rank 1 is late: it starts the allreduce only once ranks 0 and 2 have
 * timed out waiting for it (store keys), so their TIMEOUT does not depend
 * on how long anything takes. A TIMEOUT names every rank that had not
 * arrived at that moment: while the other punctual rank has not started
 * either, both are named; the wait is repeated until only rank 1 is. */
static void late_rank(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  ddplug_context *ctx = open_host(rank, 1, NULL, 60);
  ddplug_store *st = ddplug_context_store(ctx);
  float x = 1, y = 0;
  if (rank == 1) {
    const char *timed_out[] = {"test/timed_out/0", "test/timed_out/2"};
    CHECK_OK(ddplug_store_wait(st, timed_out, 2, 30000));
  }
  ddplug_request *req = NULL;
  CHECK_OK(ddplug_iallreduce(ctx, &x, &y, 1, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, &req));
  if (rank != 1) {
    for (int tries = 0;; tries++) {
      CHECK_STATUS(ddplug_request_wait(req, 300), DDPLUG_E_TIMEOUT);
      CHECK_CONTAINS(ddplug_last_error(), "collective #1");
      if (strstr(ddplug_last_error(), "rank 1 has not arrived")) break;
      CHECK_CONTAINS(ddplug_last_error(),
                     rank == 0 ? "ranks 1, 2 have not arrived" : "ranks 0, 1 have not arrived");
      CHECK_MSG(tries < 100, "rank %d: the other punctual rank never arrived: %s", rank,
                ddplug_last_error());
    }
    if (rank == 0) dt_note("%s", ddplug_last_error());
    char key[32];
    snprintf(key, sizeof key, "test/timed_out/%d", rank);
    CHECK_OK(ddplug_store_set(st, key, "1", 1));
  }
  CHECK_OK(ddplug_request_wait(req, 30000));
  ddplug_request_free(req);
  CHECK(y == 3.0f);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(api_wait_timeout_names_late_rank, 60) {
  CHECK_EQ_INT(dt_run_ranks(3, late_rank, NULL, NULL, 60, NULL), 0);
}

/* ---- registered memory ------------------------------------------------------ */

static void registered_rank(int rank, int world, void *arg) {
  (void)arg;
  ddplug_context *ctx = open_host(rank, 1, NULL, 60);
  uint64_t n = 3 * MIB + 7;
  void *p = NULL;
  CHECK_OK(ddplug_mem_alloc(ctx, n * 4, &p));
  float *buf = p;
  int reach = -1;
  CHECK_OK(ddplug_mem_reach(ctx, buf, n * 4, &reach));
  CHECK_EQ_INT(reach, DDPLUG_REACH_REGISTERED);
  float ref[HDATA_PERIOD];
  hdata_ref(ref, DDPLUG_FLOAT32, DDPLUG_OP_SUM, world);
  for (int round = 0; round < 2; round++) {
    hdata_fill(buf, DDPLUG_FLOAT32, DDPLUG_OP_SUM, rank, n);
    CHECK_OK(ddplug_allreduce(ctx, buf, buf, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
    CHECK(hdata_check(buf, ref, DDPLUG_FLOAT32, n, 0) < 0);
  }
  void *q = (void *)0x1;
  CHECK_STATUS(ddplug_mem_alloc(ctx, 0, &q), DDPLUG_E_INVALID_ARGUMENT);
  CHECK(q == (void *)0x1);
  CHECK_CONTAINS(ddplug_last_error(), "bytes is 0");
  CHECK_STATUS(ddplug_mem_free(ctx, buf + 1), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "is not a live allocation");
  CHECK_OK(ddplug_mem_free(ctx, buf));
  CHECK_OK(ddplug_mem_free(ctx, NULL));
  CHECK_STATUS(ddplug_mem_reach(ctx, buf, 4, NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(api_registered_memory, 60) {
  CHECK_EQ_INT(dt_run_ranks(2, registered_rank, NULL, NULL, 60, NULL), 0);
}

static void no_registered_rank(int rank, int world, void *arg) {
  (void)arg;
  (void)rank;
  (void)world;
  setenv("DDPLUG_CONFIG", "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 30}}", 1);
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(NULL, NULL, &ctx));
  void *p = NULL;
  CHECK_STATUS(ddplug_mem_alloc(ctx, 4096, &p), DDPLUG_E_UNSUPPORTED);
  CHECK(p == NULL);
  CHECK_CONTAINS(ddplug_last_error(), "plugin example has no registered memory");
  int reach = -1;
  char local[64];
  CHECK_OK(ddplug_mem_reach(ctx, local, sizeof local, &reach));
  CHECK_EQ_INT(reach, DDPLUG_REACH_STAGED);
  CHECK_OK(ddplug_barrier(ctx, 20000)); /* the run goes on */
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(api_plugin_without_registered_memory, 60) {
  CHECK_EQ_INT(dt_run_ranks(2, no_registered_rank, NULL, NULL, 60, NULL), 0);
}

static void bad_options_rank(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  (void)rank;
  use_config("{\"chunk_bytes\": 7}", 60);
  ddplug_context *ctx = NULL;
  int s = ddplug_open(NULL, NULL, &ctx);
  CHECK_MSG(s == DDPLUG_E_CONFIG || s == DDPLUG_E_ABORTED, "got %s: %s",
            ddplug_status_name(s), ddplug_last_error());
  CHECK(ctx == NULL);
  CHECK_CONTAINS(ddplug_last_error(), "plugin_options.chunk_bytes: 7 is out of range");
}

TEST_T(api_bad_plugin_options_refused, 60) {
  CHECK_EQ_INT(dt_run_ranks(2, bad_options_rank, NULL, NULL, 60, NULL), 0);
}
