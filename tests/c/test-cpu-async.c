/* test-cpu-async.c — asynchronous requests of the cpu plugin: a started
 * collective progresses while the caller does something else (the
 * progress thread runs it; request_test then finds it done without any
 * wait), many collectives in flight complete in start order whatever the
 * order they are waited in, request_test polling drives a collective to
 * completion, a request freed while pending still executes in order, and
 * a trainer-like overlap (compute while gradients reduce) is measured and
 * printed. One node and two simulated nodes. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "cpu_data.h"
#include "cpu_driver.h"
#include "internal.h"

#define MIB (1ull << 20)

static void check_sum(hd_rank *r, const float *recv, uint64_t n, const char *what) {
  static float ref[HDATA_PERIOD];
  hdata_ref(ref, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->w->world);
  int64_t bad = hdata_check(recv, ref, DDPLUG_FLOAT32, n, 0);
  if (bad >= 0) {
    char d[160];
    hdata_describe(d, sizeof d, recv, ref, DDPLUG_FLOAT32, (uint64_t)bad, 0);
    dt_fail(__FILE__, __LINE__, "rank %d: %s: %s", r->rank, what, d);
  }
}

/* Start, leave the plugin alone, then find the request done. */
static void background(hd_rank *r, void *arg) {
  (void)arg;
  uint64_t n = 4 * MIB;
  float *send = malloc(n * 4), *recv = malloc(n * 4);
  hdata_fill(send, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->rank, n);
  /* a few blocking calls first: the engine runs them inline */
  for (int i = 0; i < 3; i++)
    CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv, 64, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     20000));
  ddplug_plugin_request *req = NULL;
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                    &req));
  /* look without progressing: request_test would advance it itself, the
   * request's completion flag does not (white box); the limit is only a
   * hang guard */
  const ddcpu_req *q = (const ddcpu_req *)req;
  double t0 = hd_now_s();
  while (!atomic_load(&q->done)) {
    CHECK_MSG(hd_now_s() - t0 < 45, "rank %d: a 16 MiB allreduce did not complete in the "
              "background in %.0f s", r->rank, hd_now_s() - t0);
    usleep(1000);
  }
  CHECK_MSG(atomic_load(&q->by_thread) == 1, "rank %d: completed, but not by the progress thread",
            r->rank);
  int32_t done = 0;
  CHECK_OK(r->p->request_test(r->g, req, &done));
  CHECK_EQ_INT(done, 1);
  check_sum(r, recv, n, "background allreduce");
  hd_free(r, req);
  free(send);
  free(recv);
}

/* progress_thread "on" (as "auto"): the thread runs what nobody waits for. */
#define THREAD_ON "{\"progress_thread\": \"on\"}"

TEST_T(progresses_without_the_caller, 60) {
  CHECK_EQ_INT(hd_run_world(3, NULL, THREAD_ON, background, NULL, 60, NULL), 0);
}

TEST_T(progresses_without_the_caller_two_nodes, 60) {
  const int layout[] = {0, 1, 1};
  CHECK_EQ_INT(hd_run_world(3, layout, THREAD_ON, background, NULL, 60, NULL), 0);
}

/* progress_thread "off": a started collective waits for its caller; a
 * request_test (never blocking) or a wait runs it. Rank 1 waits only once
 * rank 0 has tested (a shared flag), so rank 0's test cannot find it done
 * unless rank 1's progress thread ran rank 1's part. */
static void caller_runs(hd_rank *r, void *arg) {
  _Atomic int *rank0_tested = arg;
  uint64_t n = 1 * MIB;
  float *send = malloc(n * 4), *recv = malloc(n * 4);
  hdata_fill(send, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->rank, n);
  ddplug_plugin_request *req = NULL;
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                    &req));
  if (r->rank == 0) {
    /* time for a progress thread to claim it, were one allowed to (only
     * what the check can catch depends on this, never its outcome) */
    usleep(300 * 1000);
    int32_t done = 0;
    CHECK_OK(r->p->request_test(r->g, req, &done));
    CHECK_MSG(done == 0, "rank 1's progress thread ran a collective although "
              "progress_thread is off");
    atomic_store(rank0_tested, 1);
  } else {
    for (int i = 0; !atomic_load(rank0_tested); i++) {
      CHECK_MSG(i < 45000, "rank 1: rank 0 never tested its request");
      usleep(1000);
    }
  }
  CHECK_OK(hd_wait(r, req, 20000));
  CHECK_MSG(atomic_load(&((const ddcpu_req *)req)->by_thread) == 0,
            "rank %d: the progress thread ran a collective although progress_thread is off",
            r->rank);
  check_sum(r, recv, n, "allreduce run by its caller");
  hd_free(r, req);
  free(send);
  free(recv);
}

TEST_T(progress_thread_off_leaves_collectives_to_their_caller, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, "{\"progress_thread\": \"off\"}", caller_runs,
                            hd_shared_page(4096), 60, NULL), 0);
}

/* Many in flight, waited in reverse order; mixed kinds. */
#define NREQ 24
static void many(hd_rank *r, void *arg) {
  (void)arg;
  int W = r->w->world;
  ddplug_plugin_request *req[NREQ];
  float *send[NREQ], *recv[NREQ];
  uint64_t n[NREQ];
  for (int i = 0; i < NREQ; i++) {
    n[i] = (uint64_t)(i % 4 == 0 ? 300000 : 7 + 1000 * i);
    send[i] = malloc(n[i] * 4);
    recv[i] = malloc(n[i] * 4 * (uint64_t)W);
    int kind = i % 3 == 0 ? DDPLUG_COLL_ALLREDUCE : i % 3 == 1 ? DDPLUG_COLL_BROADCAST
                                                                : DDPLUG_COLL_ALLGATHER;
    hdata_fill(send[i], DDPLUG_FLOAT32, kind == DDPLUG_COLL_ALLREDUCE ? DDPLUG_OP_SUM : 0,
               r->rank, n[i]);
    CHECK_OK(hd_start(r, kind, send[i], recv[i], n[i], DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                      i % W, &req[i]));
  }
  for (int i = NREQ - 1; i >= 0; i--) {
    CHECK_OK(hd_wait(r, req[i], 30000));
    hd_free(r, req[i]);
  }
  for (int i = 0; i < NREQ; i++) {
    if (i % 3 == 0) check_sum(r, recv[i], n[i], "allreduce in flight");
    else if (i % 3 == 1) CHECK(hdata_check_rank(recv[i], DDPLUG_FLOAT32, 0, i % W, n[i]) < 0);
    else
      for (int k = 0; k < W; k++)
        CHECK(hdata_check_rank(recv[i] + (uint64_t)k * n[i], DDPLUG_FLOAT32, 0, k, n[i]) < 0);
    free(send[i]);
    free(recv[i]);
  }
}

TEST_T(many_in_flight_waited_in_reverse, 60) {
  CHECK_EQ_INT(hd_run_world(4, NULL, NULL, many, NULL, 60, NULL), 0);
}

TEST_T(many_in_flight_two_nodes, 60) {
  const int layout[] = {0, 1, 0, 1};
  CHECK_EQ_INT(hd_run_world(4, layout, NULL, many, NULL, 60, NULL), 0);
}

/* request_test alone drives a collective to completion. */
static void polling(hd_rank *r, void *arg) {
  (void)arg;
  uint64_t n = 2 * MIB;
  float *send = malloc(n * 4), *recv = malloc(n * 4);
  hdata_fill(send, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->rank, n);
  ddplug_plugin_request *req = NULL;
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                    &req));
  int32_t done = 0;
  long polls = 0;
  double t0 = hd_now_s();
  while (!done && hd_now_s() - t0 < 30) {
    CHECK_OK(r->p->request_test(r->g, req, &done));
    polls++;
  }
  CHECK(done);
  dt_note("rank %d: done after %ld request_test calls", r->rank, polls);
  check_sum(r, recv, n, "polled allreduce");
  hd_free(r, req);
  free(send);
  free(recv);
}

TEST_T(request_test_polling, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, polling, NULL, 60, NULL), 0);
}

/* A request freed while pending still runs, in order: rank 1 starts only
 * once rank 0 has freed its request (a shared flag), so it is pending then. */
static void freed_pending(hd_rank *r, void *arg) {
  _Atomic int *rank0_freed = arg;
  uint64_t n = 1000;
  float *send = malloc(n * 4), *recv1 = malloc(n * 4), *recv2 = malloc(n * 4);
  hdata_fill(send, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->rank, n);
  for (int i = 0; r->rank == 1 && !atomic_load(rank0_freed); i++) {
    CHECK_MSG(i < 45000, "rank 1: rank 0 never freed its request");
    usleep(1000);
  }
  ddplug_plugin_request *req = NULL;
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv1, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                    &req));
  hd_free(r, req); /* pending on rank 0 (rank 1 has not started) */
  if (r->rank == 0) atomic_store(rank0_freed, 1);
  CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv2, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                   20000));
  check_sum(r, recv1, n, "freed pending allreduce");
  check_sum(r, recv2, n, "allreduce after it");
  free(send);
  free(recv1);
  free(recv2);
}

TEST_T(freed_pending_request_still_runs_in_order, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, freed_pending, hd_shared_page(4096), 60, NULL), 0);
}

/* A trainer's step: start gradient buckets, compute, wait. Measured. */
static volatile double sink;
static double compute(double seconds) {
  double t0 = hd_now_s(), x = 1.0;
  while (hd_now_s() - t0 < seconds)
    for (int i = 0; i < 10000; i++) x = x * 1.0000001 + 1e-9;
  sink = x;
  return hd_now_s() - t0;
}

static void overlap(hd_rank *r, void *arg) {
  (void)arg;
  uint64_t n = 8 * MIB;
  float *send = malloc(n * 4), *recv = malloc(n * 4);
  hdata_fill(send, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->rank, n);
  double t0 = hd_now_s();
  CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                   30000));
  double t_comm = hd_now_s() - t0;
  double t_comp = compute(0.2);
  ddplug_plugin_request *req = NULL;
  t0 = hd_now_s();
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                    &req));
  compute(0.2);
  int32_t done = 0;
  CHECK_OK(r->p->request_test(r->g, req, &done));
  CHECK_OK(hd_wait(r, req, 30000));
  double t_both = hd_now_s() - t0;
  hd_free(r, req);
  check_sum(r, recv, n, "overlapped allreduce");
  dt_note("rank %d: allreduce 32 MiB %.1f ms, compute %.1f ms, both overlapped %.1f ms "
          "(%s when compute ended)", r->rank, t_comm * 1e3, t_comp * 1e3, t_both * 1e3,
          done ? "already done" : "still running");
  free(send);
  free(recv);
}

TEST_T(overlap_compute_and_allreduce, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, overlap, NULL, 60, NULL), 0);
}
