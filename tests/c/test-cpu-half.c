/* test-cpu-half.c — float16 and bfloat16 allreduce are accumulated in
 * float32 and rounded to 16 bits once, on every path: the one-shot small
 * path and the chunked pipeline inside a node, and the hierarchical
 * multi-node algorithm (reduce to the node leader, TCP ring among leaders,
 * broadcast), with simulated nodes (node layouts given to the plugin, as
 * the runtime would learn them from host identities). The data
 * (cpu_data.h, hdata_fill_wide) is chosen so that rounding a partial sum
 * or product to 16 bits changes the result: each case first checks that
 * the pairwise-rounded reference differs from the float32 one, then that
 * the plugin returns the float32 one bit for bit. Plus the two cases from
 * the review: float16 avg of 40000 on each rank of 2 nodes (40000, not
 * inf: the 16-bit sum overflows) and bfloat16 sum of 256, 1, 1 over 3
 * nodes (258, not 256). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "cpu_data.h"
#include "cpu_driver.h"

#define GUARD 64

static const int half_types[] = {DDPLUG_FLOAT16, DDPLUG_BFLOAT16};
static const int wide_ops[] = {DDPLUG_OP_SUM, DDPLUG_OP_AVG, DDPLUG_OP_PROD};

/* The data must tell float32 accumulation from 16-bit rounding. With two
 * ranks a reduction is one operation, rounded once either way (only an
 * overflow tells them apart: see float16_avg_40000_*); from three on, a
 * good share of the elements differ. */
static void check_data_discriminates(int dt, int op, int world) {
  uint16_t wide[HDATA_PERIOD], pair[HDATA_PERIOD];
  hdata_ref_wide(wide, dt, op, world);
  hdata_ref_pairwise(pair, dt, op, world);
  int differ = 0;
  for (int j = 0; j < HDATA_PERIOD; j++) differ += wide[j] != pair[j];
  if (world < 3) return;
  CHECK_MSG(differ >= HDATA_PERIOD / 20,
            "test data: only %d of %d elements of %s %s over %d ranks differ between "
            "float32 and 16-bit accumulation", differ, HDATA_PERIOD, ddplug_dtype_name(dt),
            ddplug_op_name(op), world);
  dt_note("%s %s over %d ranks: %.0f%% of the elements differ between float32 and 16-bit "
          "accumulation", ddplug_dtype_name(dt), ddplug_op_name(op), world,
          100.0 * differ / HDATA_PERIOD);
}

static void one(hd_rank *r, int dt, int op, uint64_t count, int inplace) {
  uint64_t bytes = count * 2;
  int W = r->w->world;
  unsigned char *send = malloc(bytes + GUARD), *recv = malloc(bytes + GUARD);
  uint16_t ref[HDATA_PERIOD];
  CHECK(send && recv);
  hdata_fill_wide(send, dt, op, r->rank, W, count);
  hdata_ref_wide(ref, dt, op, W);
  if (inplace) memcpy(recv, send, bytes);
  else memset(recv, 0x5A, bytes);
  memset(recv + bytes, 0xA5, GUARD);
  int s = hd_coll(r, DDPLUG_COLL_ALLREDUCE, inplace ? recv : send, recv, count, dt, op, 0,
                  60000);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: allreduce %s %s count %llu: %s: %s", r->rank,
            ddplug_dtype_name(dt), ddplug_op_name(op), (unsigned long long)count,
            ddplug_status_name(s), r->error);
  int64_t bad = hdata_check(recv, ref, dt, count, 0);
  if (bad >= 0) {
    char d[200];
    hdata_describe(d, sizeof d, recv, ref, dt, (uint64_t)bad, 0);
    dt_fail(__FILE__, __LINE__,
            "rank %d of %d: allreduce %s %s count %llu %s is not the float32-accumulated "
            "result rounded once: %s", r->rank, W, ddplug_dtype_name(dt), ddplug_op_name(op),
            (unsigned long long)count, inplace ? "in place" : "out of place", d);
  }
  for (int i = 0; i < GUARD; i++)
    CHECK_MSG(recv[bytes + i] == 0xA5, "allreduce wrote past the end of the receive buffer");
  free(send);
  free(recv);
}

/* Every half type x sum/avg/prod x size (one element, a few, a bit over
 * the one-shot limit, several pipeline chunks and ring segments), in
 * place and out of place, then a barrier. */
static void matrix(hd_rank *r, void *arg) {
  (void)arg;
  const uint64_t sizes[] = {1, 7, 3 * HDATA_PERIOD + 5, (1ull << 19) + 3};
  for (size_t d = 0; d < 2; d++)
    for (size_t o = 0; o < 3; o++)
      for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
        one(r, half_types[d], wide_ops[o], sizes[z], (int)((z + o) & 1));
  CHECK_OK(hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 60000));
}

static void run(int world, const int *layout, const char *options) {
  for (size_t d = 0; d < 2; d++)
    for (size_t o = 0; o < 3; o++) check_data_discriminates(half_types[d], wide_ops[o], world);
  double t0 = hd_now_s();
  CHECK_EQ_INT(hd_run_world(world, layout, options, matrix, NULL, 300, NULL), 0);
  dt_note("world %d: %.2f s", world, hd_now_s() - t0);
}

/* one node: the one-shot path and the pipeline */
TEST_T(one_node_4_ranks, 300) { run(4, NULL, NULL); }
TEST_T(one_node_3_ranks_tiny_chunks, 300) {
  run(3, NULL, "{\"chunk_bytes\": 4096, \"slots\": 2, \"small_msg_bytes\": 0}");
}

/* several simulated nodes: reduce to the leader, ring, broadcast */
TEST_T(nodes_one_rank_each_2, 300) {
  const int layout[] = {0, 1};
  run(2, layout, NULL);
}
TEST_T(nodes_one_rank_each_3, 300) {
  const int layout[] = {0, 1, 2};
  run(3, layout, NULL);
}
TEST_T(nodes_2x2, 300) {
  const int layout[] = {0, 0, 1, 1};
  run(4, layout, NULL);
}
TEST_T(nodes_interleaved_2x2_small_chunks, 300) {
  const int layout[] = {0, 1, 0, 1};
  run(4, layout, "{\"tcp_chunk_bytes\": 4096, \"chunk_bytes\": 8192}");
}
TEST_T(nodes_3_mixed_8_ranks, 300) {
  const int layout[] = {0, 0, 1, 1, 2, 2, 2, 1};
  run(8, layout, NULL);
}

/* ---- the review's two examples ------------------------------------------------- */

static uint16_t f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static float from_f16(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}
static float from_bf16(uint16_t u) {
  uint32_t x = (uint32_t)u << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* float16 avg of 40000 on every rank: the sum (80000 with 2 ranks)
 * overflows float16 (max 65504) but not float32. */
static void avg_40000(hd_rank *r, void *arg) {
  (void)arg;
  uint16_t x[5], y[5];
  for (int i = 0; i < 5; i++) x[i] = f16(40000.0f);
  CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, x, y, 5, DDPLUG_FLOAT16, DDPLUG_OP_AVG, 0, 30000));
  for (int i = 0; i < 5; i++)
    CHECK_MSG(y[i] == f16(40000.0f), "rank %d: float16 avg of 40000 on %d ranks gave %g",
              r->rank, r->w->world, (double)from_f16(y[i]));
}

TEST_T(float16_avg_40000_two_nodes, 60) {
  const int layout[] = {0, 1};
  CHECK_EQ_INT(hd_run_world(2, layout, NULL, avg_40000, NULL, 60, NULL), 0);
}
TEST_T(float16_avg_40000_two_nodes_2x2, 60) {
  const int layout[] = {0, 0, 1, 1};
  CHECK_EQ_INT(hd_run_world(4, layout, NULL, avg_40000, NULL, 60, NULL), 0);
}
TEST_T(float16_avg_40000_one_node, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, avg_40000, NULL, 60, NULL), 0);
}

/* bfloat16 sum of 256, 1, 1: 256 + 1 rounds to 256 in bfloat16; 258 is
 * representable. */
static void bf16_258(hd_rank *r, void *arg) {
  (void)arg;
  uint16_t x[3], y[3];
  uint16_t v = r->rank == 0 ? 0x4380 /* 256 */ : 0x3F80 /* 1 */;
  for (int i = 0; i < 3; i++) x[i] = v;
  CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, x, y, 3, DDPLUG_BFLOAT16, DDPLUG_OP_SUM, 0, 30000));
  for (int i = 0; i < 3; i++)
    CHECK_MSG(from_bf16(y[i]) == 258.0f, "rank %d: bfloat16 sum of 256, 1, 1 gave %g", r->rank,
              (double)from_bf16(y[i]));
}

TEST_T(bfloat16_sum_258_three_nodes, 60) {
  const int layout[] = {0, 1, 2};
  CHECK_EQ_INT(hd_run_world(3, layout, NULL, bf16_258, NULL, 60, NULL), 0);
}
TEST_T(bfloat16_sum_258_one_node, 60) {
  CHECK_EQ_INT(hd_run_world(3, NULL, NULL, bf16_258, NULL, 60, NULL), 0);
}
