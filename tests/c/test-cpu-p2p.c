/* test-cpu-p2p.c — point-to-point through the public API (ddplug_isend,
 * ddplug_irecv, ddplug_send, ddplug_recv, ddplug_request_source) on the cpu
 * plugin (DT_LINK_SHARED: linked against libddplug.so), with forked
 * torchrun-style ranks on one node and on two simulated nodes with two
 * ranks each (DDPLUG_HOST_ID: rings inside a node, TCP between nodes):
 * every pair, messages of one tag in order and tags taken out of order,
 * any source, large messages both ways at once (the rendezvous), zero
 * count, count mismatches (small: the receive fails; large: both sides),
 * refused arguments, a receive that times out and stays pending, a peer
 * killed while another waits for it, sends and receives beside a
 * collective, a receive pending at close, and UNSUPPORTED from a plugin
 * without point-to-point. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddplug/store.h"
#include "harness.h"

#define MIB (1ull << 20)

typedef struct layout {
  int nodes; /* simulated nodes: rank r is on node r % nodes */
} layout;

/* world ranks running fn, on `nodes` simulated nodes; every rank must pass. */
static void in_layout(int world, int nodes, dt_rank_fn fn, int timeout_s) {
  layout l = {nodes};
  CHECK_EQ_INT(dt_run_ranks(world, fn, &l, NULL, timeout_s, NULL), 0);
}

static ddplug_context *open_rank(int rank, int nodes, int coll_s) {
  char json[256];
  snprintf(json, sizeof json,
           "{\"plugin\": \"cpu\", \"rendezvous\": {\"timeout_s\": 30}, "
           "\"timeouts\": {\"collective_s\": %d}}", coll_s);
  setenv("DDPLUG_CONFIG", json, 1);
  if (nodes > 1) {
    char id[32];
    snprintf(id, sizeof id, "p2pnode%d", rank % nodes);
    setenv("DDPLUG_HOST_ID", id, 1);
  }
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(NULL, NULL, &ctx));
  CHECK_EQ_INT(ddplug_context_num_nodes(ctx), nodes);
  return ctx;
}

static void fill(int32_t *v, uint64_t n, int32_t base) {
  for (uint64_t i = 0; i < n; i++) v[i] = base + (int32_t)(i % 100003);
}

static void check_fill(const int32_t *v, uint64_t n, int32_t base, const char *what) {
  for (uint64_t i = 0; i < n; i++)
    if (v[i] != base + (int32_t)(i % 100003))
      dt_fail(__FILE__, __LINE__, "%s: element %llu is %d, expected %d", what,
              (unsigned long long)i, v[i], base + (int32_t)(i % 100003));
}

/* ---- every pair, both forms --------------------------------------------------- */

static void pairs_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  /* blocking: in turn, each rank sends to every other, the others receive */
  for (int src = 0; src < world; src++) {
    if (src == rank) {
      for (int dst = 0; dst < world; dst++) {
        if (dst == rank) continue;
        int32_t v[3] = {rank, dst, 7};
        CHECK_OK(ddplug_send(ctx, v, 3, DDPLUG_INT32, dst, 0, NULL, 20000));
      }
    } else {
      int32_t v[3] = {-1, -1, -1};
      int from = -2;
      CHECK_OK(ddplug_recv(ctx, v, 3, DDPLUG_INT32, src, 0, NULL, 20000, &from));
      CHECK_EQ_INT(from, src);
      CHECK_EQ_INT(v[0], src);
      CHECK_EQ_INT(v[1], rank);
      CHECK_EQ_INT(v[2], 7);
    }
  }
  /* non-blocking: everyone posts receives from everyone, then sends, tag = sender */
  ddplug_request *req[2 * 16];
  int32_t in[16][4], out[4];
  int n = 0;
  for (int r = 0; r < world; r++) {
    if (r == rank) continue;
    CHECK_OK(ddplug_irecv(ctx, in[r], 4, DDPLUG_INT32, r, r, NULL, &req[n++]));
  }
  fill(out, 4, 1000 * rank);
  for (int r = 0; r < world; r++) {
    if (r == rank) continue;
    CHECK_OK(ddplug_isend(ctx, out, 4, DDPLUG_INT32, r, rank, NULL, &req[n++]));
    CHECK_EQ_INT(ddplug_request_seq(req[n - 1]), 0);
  }
  for (int i = 0; i < n; i++) {
    CHECK_OK(ddplug_request_wait(req[i], 20000));
    ddplug_request_free(req[i]);
  }
  for (int r = 0; r < world; r++)
    if (r != rank) check_fill(in[r], 4, 1000 * r, "irecv");
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(p2p_every_pair_one_node_3_ranks, 60) { in_layout(3, 1, pairs_rank, 60); }

TEST_T(p2p_every_pair_two_nodes_2_ranks_each, 60) { in_layout(4, 2, pairs_rank, 60); }

/* ---- order within a tag, tags out of order, any source -------------------------- */

static void order_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  /* rank 0 sends to the last rank (on the other node with two nodes, on
   * this one with one): five messages of tag 1 and five of tag 2,
   * interleaved, small and large; the receiver takes tag 2 first */
  int peer = world - 1;
  uint64_t sizes[5] = {1, 17, 70000, 300000, 3};
  if (rank == 0) {
    ddplug_request *req[10];
    int32_t *buf[10];
    for (int i = 0; i < 5; i++)
      for (int t = 0; t < 2; t++) {
        int k = 2 * i + t;
        buf[k] = malloc(sizes[i] * 4);
        fill(buf[k], sizes[i], 100 * (t + 1) + i);
        CHECK_OK(ddplug_isend(ctx, buf[k], sizes[i], DDPLUG_INT32, peer, t + 1, NULL, &req[k]));
      }
    for (int k = 0; k < 10; k++) {
      CHECK_OK(ddplug_request_wait(req[k], 20000));
      ddplug_request_free(req[k]);
      free(buf[k]);
    }
  } else if (rank == peer) {
    for (int t = 2; t >= 1; t--)
      for (int i = 0; i < 5; i++) {
        int32_t *v = malloc(sizes[i] * 4);
        CHECK_OK(ddplug_recv(ctx, v, sizes[i], DDPLUG_INT32, 0, t, NULL, 20000, NULL));
        char what[64];
        snprintf(what, sizeof what, "tag %d message %d", t, i);
        check_fill(v, sizes[i], 100 * t + i, what);
        free(v);
      }
  }
  /* any source: every other rank sends its rank to rank 0 twice (tag 7) */
  if (rank == 0) {
    int seen[16] = {0};
    for (int k = 0; k < 2 * (world - 1); k++) {
      int32_t v = -1;
      int from = -1;
      if (k % 2) {
        CHECK_OK(ddplug_recv(ctx, &v, 1, DDPLUG_INT32, DDPLUG_ANY_SOURCE, 7, NULL, 20000, &from));
      } else {
        ddplug_request *r = NULL;
        CHECK_OK(ddplug_irecv(ctx, &v, 1, DDPLUG_INT32, DDPLUG_ANY_SOURCE, 7, NULL, &r));
        CHECK_STATUS(ddplug_request_source(r, &from), DDPLUG_E_INVALID_ARGUMENT);
        CHECK_OK(ddplug_request_wait(r, 20000));
        CHECK_OK(ddplug_request_source(r, &from));
        ddplug_request_free(r);
      }
      CHECK_EQ_INT(v, from);
      CHECK(from > 0 && from < world);
      seen[from]++;
    }
    for (int r = 1; r < world; r++) CHECK_EQ_INT(seen[r], 2);
  } else {
    int32_t v = rank;
    CHECK_OK(ddplug_send(ctx, &v, 1, DDPLUG_INT32, 0, 7, NULL, 20000));
    CHECK_OK(ddplug_send(ctx, &v, 1, DDPLUG_INT32, 0, 7, NULL, 20000));
  }
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(p2p_order_per_tag_tags_and_any_source_one_node, 60) { in_layout(3, 1, order_rank, 60); }

TEST_T(p2p_order_per_tag_tags_and_any_source_two_nodes, 60) { in_layout(4, 2, order_rank, 60); }

/* ---- large messages both ways at once, zero count -------------------------------- */

static void large_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  /* pairs (0, 1), (2, 3): with two nodes a pair spans them */
  int peer = rank ^ 1;
  if (peer < world) {
    uint64_t n = 16 * MIB / 4 + 5;
    int32_t *out = malloc(n * 4), *in = malloc(n * 4);
    fill(out, n, rank * 7);
    ddplug_request *s = NULL, *r = NULL;
    /* both send first: the rendezvous must not deadlock */
    CHECK_OK(ddplug_isend(ctx, out, n, DDPLUG_INT32, peer, 3, NULL, &s));
    CHECK_OK(ddplug_irecv(ctx, in, n, DDPLUG_INT32, peer, 3, NULL, &r));
    CHECK_OK(ddplug_request_wait(s, 30000));
    CHECK_OK(ddplug_request_wait(r, 30000));
    ddplug_request_free(s);
    ddplug_request_free(r);
    check_fill(in, n, peer * 7, "16 MiB message");
    /* zero count, with a NULL buffer */
    CHECK_OK(ddplug_isend(ctx, NULL, 0, DDPLUG_FLOAT32, peer, 4, NULL, &s));
    int from = -1;
    CHECK_OK(ddplug_recv(ctx, NULL, 0, DDPLUG_FLOAT32, peer, 4, NULL, 20000, &from));
    CHECK_EQ_INT(from, peer);
    CHECK_OK(ddplug_request_wait(s, 20000));
    ddplug_request_free(s);
    free(out);
    free(in);
  }
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(p2p_large_both_ways_and_zero_count_one_node, 60) { in_layout(2, 1, large_rank, 60); }

TEST_T(p2p_large_both_ways_and_zero_count_two_nodes, 90) { in_layout(4, 2, large_rank, 90); }

/* ---- mismatches, refused arguments -------------------------------------------------- */

static void mismatch_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  int peer = world - 1;
  if (rank == 0) {
    int32_t small[4] = {1, 2, 3, 4};
    CHECK_OK(ddplug_send(ctx, small, 4, DDPLUG_INT32, peer, 0, NULL, 20000)); /* eager: sent */
    uint64_t n = MIB;
    int32_t *big = calloc(n, 4);
    int s = ddplug_send(ctx, big, n, DDPLUG_INT32, peer, 0, NULL, 20000);
    CHECK_MSG(s == DDPLUG_E_MISMATCH, "large send: expected MISMATCH, got %s: %s",
              ddplug_status_name(s), ddplug_last_error());
    CHECK_CONTAINS(ddplug_last_error(), "1048576 int32");
    CHECK_CONTAINS(ddplug_last_error(), "1048575 int32");
    free(big);
    /* the run goes on */
    CHECK_OK(ddplug_send(ctx, small, 4, DDPLUG_INT32, peer, 0, NULL, 20000));
  } else if (rank == peer) {
    int32_t v[8];
    memset(v, 0x55, sizeof v);
    int s = ddplug_recv(ctx, v, 3, DDPLUG_INT32, 0, 0, NULL, 20000, NULL);
    CHECK_MSG(s == DDPLUG_E_MISMATCH, "small receive: expected MISMATCH, got %s: %s",
              ddplug_status_name(s), ddplug_last_error());
    CHECK_CONTAINS(ddplug_last_error(), "rank 0 sent 4 int32 with tag 0");
    CHECK_CONTAINS(ddplug_last_error(), "takes 3 int32");
    CHECK_EQ_INT(v[0], 0x55555555); /* nothing delivered */
    int32_t *big = malloc(MIB * 4);
    s = ddplug_recv(ctx, big, MIB - 1, DDPLUG_INT32, 0, 0, NULL, 20000, NULL);
    CHECK_MSG(s == DDPLUG_E_MISMATCH, "large receive: expected MISMATCH, got %s: %s",
              ddplug_status_name(s), ddplug_last_error());
    free(big);
    CHECK_OK(ddplug_recv(ctx, v, 4, DDPLUG_INT32, 0, 0, NULL, 20000, NULL));
    CHECK_EQ_INT(v[3], 4);
  }
  /* refused before anything starts; the run goes on */
  int32_t x = 0;
  ddplug_request *r = NULL;
  CHECK_STATUS(ddplug_isend(ctx, &x, 1, DDPLUG_INT32, rank, 0, NULL, &r), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "sends to itself");
  CHECK_STATUS(ddplug_irecv(ctx, &x, 1, DDPLUG_INT32, rank, 0, NULL, &r), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "receives from itself");
  CHECK_STATUS(ddplug_isend(ctx, &x, 1, DDPLUG_INT32, world, 0, NULL, &r), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "is not a rank");
  CHECK_STATUS(ddplug_isend(ctx, &x, 1, DDPLUG_INT32, DDPLUG_ANY_SOURCE, 0, NULL, &r),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_isend(ctx, &x, 1, DDPLUG_INT32, (rank + 1) % world, -1, NULL, &r),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "tag -1 is negative");
  CHECK_STATUS(ddplug_isend(ctx, NULL, 1, DDPLUG_INT32, (rank + 1) % world, 0, NULL, &r),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_send(ctx, &x, 1, DDPLUG_INT32, (rank + 1) % world, 0, NULL, 0),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK(r == NULL);
  CHECK_OK(ddplug_barrier(ctx, 20000));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(p2p_count_mismatch_and_refused_arguments_one_node, 60) { in_layout(2, 1, mismatch_rank, 60); }

TEST_T(p2p_count_mismatch_two_nodes, 60) { in_layout(2, 2, mismatch_rank, 60); }

/* ---- timeouts ------------------------------------------------------------------------ */

static void timeout_rank(int rank, int world, void *arg) {
  layout *l = arg;
  (void)world;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  int32_t v = -1;
  if (rank == 0) {
    ddplug_request *r = NULL;
    CHECK_OK(ddplug_irecv(ctx, &v, 1, DDPLUG_INT32, 1, 5, NULL, &r));
    int s = ddplug_request_wait(r, 200);
    CHECK_STATUS(s, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), "receive of 1 int32 from rank 1 (tag 5)");
    CHECK_CONTAINS(ddplug_last_error(), "rank 1 has sent no message with tag 5");
    int done = 1;
    CHECK_OK(ddplug_request_test(r, &done));
    CHECK_EQ_INT(done, 0); /* still pending */
    int32_t go = 1;
    CHECK_OK(ddplug_send(ctx, &go, 1, DDPLUG_INT32, 1, 6, NULL, 20000));
    CHECK_OK(ddplug_request_wait(r, 20000));
    CHECK_EQ_INT(v, 42);
    ddplug_request_free(r);
    /* a blocking receive that times out ends the run on every rank */
    int s2 = ddplug_recv(ctx, &v, 1, DDPLUG_INT32, 1, 9, NULL, 300, NULL);
    CHECK_STATUS(s2, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), "receive of 1 int32 from rank 1 (tag 9)");
    CHECK_STATUS(ddplug_barrier(ctx, 20000), DDPLUG_E_TIMEOUT);
  } else {
    int32_t go = 0;
    CHECK_OK(ddplug_recv(ctx, &go, 1, DDPLUG_INT32, 0, 6, NULL, 20000, NULL));
    v = 42;
    CHECK_OK(ddplug_send(ctx, &v, 1, DDPLUG_INT32, 0, 5, NULL, 20000));
    int s = ddplug_barrier(ctx, 20000);
    CHECK_MSG(s == DDPLUG_E_TIMEOUT, "rank 1: expected the run's TIMEOUT, got %s: %s",
              ddplug_status_name(s), ddplug_last_error());
    CHECK_CONTAINS(ddplug_last_error(), "tag 9");
  }
  ddplug_close(ctx);
}

TEST_T(p2p_receive_times_out_and_stays_pending, 60) { in_layout(2, 1, timeout_rank, 60); }

TEST_T(p2p_receive_times_out_two_nodes, 60) { in_layout(2, 2, timeout_rank, 60); }

/* ---- a dead peer ------------------------------------------------------------------------ */

static void dead_rank(int rank, int world, void *arg) {
  layout *l = arg;
  (void)world;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  CHECK_OK(ddplug_barrier(ctx, 20000));
  /* rank 1 dies only once rank 0 has left the barrier (across nodes a
   * death can end rank 0's barrier before it read the data already there) */
  ddplug_store *st = ddplug_context_store(ctx);
  if (rank == 0) CHECK_OK(ddplug_store_set(st, "user/test/barrier-done", "1", 1));
  if (rank == 1) {
    void *v = NULL;
    CHECK_OK(ddplug_store_get(st, "user/test/barrier-done", 30000, &v, NULL));
    ddplug_free(v);
    usleep(100 * 1000); /* let rank 0 wait inside its receive (the outcome holds either way) */
    raise(SIGKILL);
  }
  int32_t v = 0;
  int s = ddplug_recv(ctx, &v, 1, DDPLUG_INT32, 1, 0, NULL, 30000, NULL);
  CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank %d: expected PEER_LOST, got %s: %s", rank,
            ddplug_status_name(s), ddplug_last_error());
  CHECK_CONTAINS(ddplug_last_error(), "rank 1");
  ddplug_close(ctx);
}

static void run_dead(int nodes) {
  layout l = {nodes};
  int st[2];
  CHECK_EQ_INT(dt_run_ranks(2, dead_rank, &l, NULL, 60, st), 1);
  CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
  CHECK(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0);
}

TEST_T(p2p_dead_peer_is_peer_lost_naming_it, 60) { run_dead(1); }
TEST_T(p2p_dead_peer_two_nodes, 60) { run_dead(2); }

/* ---- beside collectives; pending at close ---------------------------------------------------- */

static void beside_rank(int rank, int world, void *arg) {
  layout *l = arg;
  ddplug_context *ctx = open_rank(rank, l->nodes, 60);
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  uint64_t n = MIB;
  int32_t *out = malloc(n * 4), *in = malloc(n * 4);
  fill(out, n, rank);
  ddplug_request *s = NULL, *r = NULL, *c = NULL, *never = NULL;
  CHECK_OK(ddplug_irecv(ctx, in, n, DDPLUG_INT32, prev, 1, NULL, &r));
  float sum[256];
  for (int i = 0; i < 256; i++) sum[i] = (float)rank;
  CHECK_OK(ddplug_iallreduce(ctx, sum, sum, 256, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, &c));
  CHECK_EQ_INT(ddplug_request_seq(c), 1);
  CHECK_OK(ddplug_isend(ctx, out, n, DDPLUG_INT32, next, 1, NULL, &s));
  CHECK_OK(ddplug_request_wait(c, 20000));
  CHECK_OK(ddplug_request_wait(s, 20000));
  CHECK_OK(ddplug_request_wait(r, 20000));
  check_fill(in, n, prev, "beside a collective");
  CHECK(sum[255] == (float)(world * (world - 1) / 2));
  ddplug_request_free(c);
  ddplug_request_free(s);
  ddplug_request_free(r);
  /* a receive nobody sends to, freed after close */
  int32_t x;
  CHECK_OK(ddplug_irecv(ctx, &x, 1, DDPLUG_INT32, next, 99, NULL, &never));
  CHECK_OK(ddplug_close(ctx));
  CHECK_STATUS(ddplug_request_wait(never, 10), DDPLUG_E_ABORTED);
  ddplug_request_free(never);
  free(out);
  free(in);
}

TEST_T(p2p_beside_a_collective_and_pending_at_close, 60) { in_layout(3, 1, beside_rank, 60); }

TEST_T(p2p_beside_a_collective_two_nodes, 60) { in_layout(4, 2, beside_rank, 60); }

/* ---- a plugin without point-to-point ------------------------------------------------------------ */

static void unsupported_rank(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  setenv("DDPLUG_CONFIG", "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 30}}", 1);
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(NULL, NULL, &ctx));
  int32_t v = 0;
  ddplug_request *r = NULL;
  CHECK_STATUS(ddplug_isend(ctx, &v, 1, DDPLUG_INT32, 1 - rank, 0, NULL, &r), DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(ddplug_last_error(), "plugin example has no point-to-point (send)");
  CHECK_STATUS(ddplug_recv(ctx, &v, 1, DDPLUG_INT32, 1 - rank, 0, NULL, 1000, NULL),
               DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(ddplug_last_error(), "plugin example has no point-to-point (recv)");
  CHECK(r == NULL);
  CHECK_OK(ddplug_barrier(ctx, 20000)); /* the run goes on */
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(p2p_plugin_without_it_is_unsupported_naming_the_op, 60) {
  CHECK_EQ_INT(dt_run_ranks(2, unsupported_rank, NULL, NULL, 60, NULL), 0);
}
