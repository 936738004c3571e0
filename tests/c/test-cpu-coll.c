/* test-cpu-coll.c — correctness of the cpu plugin's collectives against an
 * exact reference (tests/c/cpu_data.h): allreduce for every op x dtype x
 * size (0, 1, 7, 1 MiB + 3 elements) x ranks 1..8, in place and out of
 * place; broadcast from every root position class; allgather in place and
 * out of place; barrier. Guard bytes after every receive buffer must stay
 * untouched. 64 MiB runs on every rank count with every dtype but one op
 * per dtype (rotating), plus float32 x every op at 16 MiB — the full
 * op x dtype product at 64 MiB would not fit the suite's budget. Each
 * world runs its whole matrix inside one group (one set of processes),
 * which also exercises many collectives back to back on the same
 * segment. Ranks are forked and drive the plugin through the test driver;
 * test-cpu-api repeats a smaller matrix through the public API. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "cpu_data.h"
#include "cpu_driver.h"

#define GUARD 64
#define MIB (1ull << 20)

static const int dtypes[] = {DDPLUG_FLOAT32, DDPLUG_FLOAT64, DDPLUG_FLOAT16, DDPLUG_BFLOAT16,
                             DDPLUG_INT8,    DDPLUG_UINT8,   DDPLUG_INT32,   DDPLUG_INT64};
static const int ops[] = {DDPLUG_OP_SUM, DDPLUG_OP_AVG, DDPLUG_OP_MIN, DDPLUG_OP_MAX,
                          DDPLUG_OP_PROD, DDPLUG_OP_BOR, DDPLUG_OP_BAND};

static int is_int(int dt) {
  return dt == DDPLUG_INT8 || dt == DDPLUG_UINT8 || dt == DDPLUG_INT32 || dt == DDPLUG_INT64;
}

static void *alloc_guarded(uint64_t bytes) {
  unsigned char *p = malloc(bytes + GUARD);
  if (!p) dt_fail(__FILE__, __LINE__, "out of memory");
  memset(p + bytes, 0xA5, GUARD);
  return p;
}

static void check_guard(const void *buf, uint64_t bytes, const char *what) {
  const unsigned char *p = (const unsigned char *)buf + bytes;
  for (int i = 0; i < GUARD; i++)
    CHECK_MSG(p[i] == 0xA5, "%s: wrote past the end of the receive buffer", what);
}

/* One allreduce of `count` elements, out of place or in place, checked. */
static void one_allreduce(hd_rank *r, int dt, int op, uint64_t count, int inplace,
                          const void *ref) {
  uint32_t es = ddplug_dtype_size(dt);
  uint64_t bytes = count * es;
  void *send = alloc_guarded(bytes), *recv = alloc_guarded(bytes);
  hdata_fill(send, dt, op, r->rank, count);
  if (inplace) memcpy(recv, send, bytes);
  else memset(recv, 0x5A, bytes);
  int s = hd_coll(r, DDPLUG_COLL_ALLREDUCE, inplace ? recv : send, recv, count, dt, op, 0, 60000);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: allreduce %s %s count %llu: %s: %s", r->rank,
            ddplug_dtype_name(dt), ddplug_op_name(op), (unsigned long long)count,
            ddplug_status_name(s), r->error);
  int64_t bad = hdata_check(recv, ref, dt, count, 0);
  if (bad >= 0) {
    char d[200];
    hdata_describe(d, sizeof d, recv, ref, dt, (uint64_t)bad, 0);
    dt_fail(__FILE__, __LINE__, "rank %d of %d: allreduce %s %s count %llu %s: %s", r->rank,
            r->w->world, ddplug_dtype_name(dt), ddplug_op_name(op), (unsigned long long)count,
            inplace ? "in place" : "out of place", d);
  }
  check_guard(recv, bytes, "allreduce");
  if (!inplace) CHECK_MSG(hdata_check_rank(send, dt, op, r->rank, count) < 0,
                          "allreduce modified the send buffer");
  free(send);
  free(recv);
}

static void one_broadcast(hd_rank *r, int dt, uint64_t count, int root, int inplace) {
  uint32_t es = ddplug_dtype_size(dt);
  uint64_t bytes = count * es;
  void *send = alloc_guarded(bytes), *recv = alloc_guarded(bytes);
  memset(recv, 0x5A, bytes);
  if (r->rank == root) hdata_fill(inplace ? recv : send, dt, 0, root, count);
  int s = hd_coll(r, DDPLUG_COLL_BROADCAST, inplace ? recv : send, recv, count, dt, 0, root, 60000);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: broadcast: %s: %s", r->rank, ddplug_status_name(s), r->error);
  CHECK_MSG(hdata_check_rank(recv, dt, 0, root, count) < 0,
            "rank %d of %d: broadcast of %llu %s from root %d delivered wrong data", r->rank,
            r->w->world, (unsigned long long)count, ddplug_dtype_name(dt), root);
  check_guard(recv, bytes, "broadcast");
  free(send);
  free(recv);
}

static void one_allgather(hd_rank *r, int dt, uint64_t count, int inplace) {
  uint32_t es = ddplug_dtype_size(dt);
  uint64_t bytes = count * es, total = bytes * (uint64_t)r->w->world;
  void *send = alloc_guarded(bytes), *recv = alloc_guarded(total);
  memset(recv, 0x5A, total);
  void *mine = inplace ? (unsigned char *)recv + (uint64_t)r->rank * bytes : send;
  hdata_fill(mine, dt, 0, r->rank, count);
  int s = hd_coll(r, DDPLUG_COLL_ALLGATHER, mine, recv, count, dt, 0, 0, 60000);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: allgather: %s: %s", r->rank, ddplug_status_name(s), r->error);
  for (int k = 0; k < r->w->world; k++)
    CHECK_MSG(hdata_check_rank((unsigned char *)recv + (uint64_t)k * bytes, dt, 0, k, count) < 0,
              "rank %d of %d: allgather of %llu %s: block of rank %d is wrong", r->rank,
              r->w->world, (unsigned long long)count, ddplug_dtype_name(dt), k);
  check_guard(recv, total, "allgather");
  free(send);
  free(recv);
}

/* The whole matrix for one world. */
static void matrix(hd_rank *r, void *arg) {
  (void)arg;
  int W = r->w->world;
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    int dt = dtypes[d];
    uint32_t es = ddplug_dtype_size(dt);
    uint64_t sizes[] = {0, 1, 7, MIB / es + 3};
    void *ref = malloc(HDATA_PERIOD * es);
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      int op = ops[o];
      if ((op == DDPLUG_OP_BOR || op == DDPLUG_OP_BAND) && !is_int(dt)) continue;
      hdata_ref(ref, dt, op, W);
      for (size_t z = 0; z < 4; z++)
        for (int inplace = 0; inplace < 2; inplace++)
          one_allreduce(r, dt, op, sizes[z], inplace, ref);
    }
    free(ref);
    for (size_t z = 0; z < 4; z++) {
      one_broadcast(r, dt, sizes[z], (int)(z + d) % W, (int)(z & 1));
      one_allgather(r, dt, sizes[z], (int)((z + d) & 1));
    }
  }
  CHECK_OK(hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 60000));
}

static void run_timed(int world, const int *node_of, const char *options,
                      void (*fn)(hd_rank *r, void *arg), const char *what) {
  double t0 = hd_now_s();
  CHECK_EQ_INT(hd_run_world(world, node_of, options, fn, NULL, 400, NULL), 0);
  dt_note("world %d: %s took %.2f s", world, what, hd_now_s() - t0);
}

static void run_world(int world, const int *node_of, const char *options) {
  run_timed(world, node_of, options, matrix, "matrix");
}

TEST_T(matrix_1_rank, 300) { run_world(1, NULL, NULL); }
TEST_T(matrix_2_ranks, 300) { run_world(2, NULL, NULL); }
TEST_T(matrix_3_ranks, 300) { run_world(3, NULL, NULL); }
TEST_T(matrix_4_ranks, 300) { run_world(4, NULL, NULL); }
TEST_T(matrix_5_ranks, 300) { run_world(5, NULL, NULL); }
TEST_T(matrix_6_ranks, 300) { run_world(6, NULL, NULL); }
TEST_T(matrix_7_ranks, 300) { run_world(7, NULL, NULL); }
TEST_T(matrix_8_ranks, 300) { run_world(8, NULL, NULL); }

/* Small chunks and no one-shot path: many pipeline chunks and slot reuse,
 * odd slices, with 3 ranks. */
TEST_T(matrix_3_ranks_tiny_chunks, 300) {
  run_world(3, NULL, "{\"chunk_bytes\": 4096, \"slots\": 2, \"small_msg_bytes\": 0}");
}

/* 64 MiB on every rank count: every dtype with one op each (rotating through
 * the ops, in place and out of place alternately), float32 with every op,
 * broadcast, and allgather (up to 3 ranks: the result is ranks x 64 MiB). */
static void big(hd_rank *r, void *arg) {
  (void)arg;
  void *ref = malloc(HDATA_PERIOD * 8);
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    int dt = dtypes[d];
    int op = ops[d % 5]; /* sum avg min max prod */
    if (is_int(dt) && d % 2) op = d % 4 == 1 ? DDPLUG_OP_BOR : DDPLUG_OP_BAND;
    hdata_ref(ref, dt, op, r->w->world);
    one_allreduce(r, dt, op, 64 * MIB / ddplug_dtype_size(dt), (int)(d & 1), ref);
  }
  for (int op = DDPLUG_OP_SUM; op <= DDPLUG_OP_PROD; op++) {
    hdata_ref(ref, DDPLUG_FLOAT32, op, r->w->world);
    one_allreduce(r, DDPLUG_FLOAT32, op, 16 * MIB, op & 1, ref);
  }
  free(ref);
  one_broadcast(r, DDPLUG_FLOAT32, 16 * MIB, r->w->world - 1, 0);
  if (r->w->world <= 3) one_allgather(r, DDPLUG_UINT8, 64 * MIB, 1);
}

static void run_big(int world) { run_timed(world, NULL, NULL, big, "64 MiB cases"); }

TEST_T(mib64_1_rank, 300) { run_big(1); }
TEST_T(mib64_2_ranks, 300) { run_big(2); }
TEST_T(mib64_3_ranks, 300) { run_big(3); }
TEST_T(mib64_4_ranks, 300) { run_big(4); }
TEST_T(mib64_5_ranks, 300) { run_big(5); }
TEST_T(mib64_6_ranks, 300) { run_big(6); }
TEST_T(mib64_7_ranks, 300) { run_big(7); }
TEST_T(mib64_8_ranks, 400) { run_big(8); }
TEST_T(mib64_two_nodes_2x2, 300) {
  const int layout[] = {0, 1, 0, 1};
  CHECK_EQ_INT(hd_run_world(4, layout, NULL, big, NULL, 400, NULL), 0);
}

/* Several simulated nodes on this machine (the node layout is what the
 * runtime would have learnt from host identities): hierarchical algorithms
 * over shared memory in each node and the TCP ring between node leaders. */
TEST_T(nodes_2x2, 300) {
  const int layout[] = {0, 0, 1, 1};
  run_world(4, layout, NULL);
}
TEST_T(nodes_interleaved_2x2, 300) {
  const int layout[] = {0, 1, 0, 1};
  run_world(4, layout, NULL);
}
TEST_T(nodes_uneven_3_plus_1, 300) {
  const int layout[] = {0, 0, 0, 1};
  run_world(4, layout, NULL);
}
TEST_T(nodes_one_rank_each_2, 300) {
  const int layout[] = {0, 1};
  run_world(2, layout, NULL);
}
TEST_T(nodes_one_rank_each_3, 300) {
  const int layout[] = {0, 1, 2};
  run_world(3, layout, NULL);
}
TEST_T(nodes_3_mixed_8_ranks, 300) {
  const int layout[] = {0, 0, 1, 1, 2, 2, 2, 1};
  run_world(8, layout, NULL);
}
TEST_T(nodes_2x2_small_tcp_chunks, 300) {
  const int layout[] = {1, 0, 0, 1};
  run_world(4, layout, "{\"tcp_chunk_bytes\": 4096, \"chunk_bytes\": 8192}");
}
