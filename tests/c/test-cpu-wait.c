/* test-cpu-wait.c — how the cpu plugin waits for a peer. It spins only
 * while every rank of the node can have a CPU of its own, counting the
 * CPUs this process may run on (its affinity mask: taskset, cgroup
 * cpusets), not those the machine has; and a rank blocked in a
 * collective for a peer that comes late sleeps (futex in a node, poll on
 * the ring socket between nodes) instead of burning its CPU: its CPU time
 * over the wait is measured (CLOCK_PROCESS_CPUTIME_ID, all its threads,
 * the progress thread included) and must stay well below the wait's
 * length. CPU time, not wall-clock time, is asserted: a loaded machine
 * makes the wait longer, never the CPU time larger. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"
#include "cpu_driver.h"

#define LATE_US (1500 * 1000)

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int affinity_cpus(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CHECK_EQ_INT(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

/* Restrict this process to the first CPU it may use. */
static void pin_to_one_cpu(void) {
  cpu_set_t set, one;
  CPU_ZERO(&set);
  CHECK_EQ_INT(sched_getaffinity(0, sizeof set, &set), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) {
      CPU_SET(c, &one);
      break;
    }
  CHECK_EQ_INT(sched_setaffinity(0, sizeof one, &one), 0);
  CHECK_EQ_INT(affinity_cpus(), 1);
}

typedef struct wait_case {
  int pin;  /* every rank pinned to one CPU before the group is created */
  int late; /* the rank that comes late */
  _Atomic int *waiting; /* ranks already in the collective the late one joins */
} wait_case;

static void pinned_open(hd_rank *r, const hd_world *w, int rank, int pin) {
  if (pin) pin_to_one_cpu();
  int s = hd_open(r, w, rank);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: group_create: %s: %s", rank, ddplug_status_name(s),
            r->error);
}

/* The spin rule: 50 us while the node's ranks fit the usable CPUs, else 2. */
static void check_spin(hd_rank *r) {
  ddcpu_group *g = (ddcpu_group *)r->g;
  int cpus = affinity_cpus();
  uint64_t want = g->local_world <= cpus ? 50000 : 2000;
  CHECK_MSG(g->spin_ns == want, "rank %d: %d local ranks, %d CPUs in the affinity mask: spin %llu "
            "ns, expected %llu ns", r->rank, g->local_world, cpus,
            (unsigned long long)g->spin_ns, (unsigned long long)want);
}

/* One rank of a wait_case, forked by dt_run_ranks (not hd_run: pinning
 * must come before group_create). */
typedef struct wait_arg {
  const hd_world *w;
  wait_case *wc;
} wait_arg;

static void wait_rank(int rank, int world, void *p) {
  wait_arg *a = p;
  hd_rank r;
  pinned_open(&r, a->w, rank, a->wc->pin);
  check_spin(&r);
  float x[64], y[64];
  for (int i = 0; i < 64; i++) x[i] = (float)rank;
  /* warm: the engine runs blocking calls inline */
  for (int i = 0; i < 3; i++)
    CHECK_OK(hd_coll(&r, DDPLUG_COLL_ALLREDUCE, x, y, 64, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     20000));
  /* The late rank counts its lateness from the moment every other rank is
   * waiting (a shared counter), so each of them waits at least LATE_US. */
  if (rank == a->wc->late) {
    for (int i = 0; atomic_load(a->wc->waiting) < world - 1; i++) {
      CHECK_MSG(i < 45000, "the late rank: the others never started");
      usleep(1000);
    }
    usleep(LATE_US);
    CHECK_OK(hd_coll(&r, DDPLUG_COLL_ALLREDUCE, x, y, 64, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     20000));
  } else {
    double c0 = cpu_s(), t0 = hd_now_s();
    atomic_fetch_add(a->wc->waiting, 1);
    CHECK_OK(hd_coll(&r, DDPLUG_COLL_ALLREDUCE, x, y, 64, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     20000));
    double cpu = cpu_s() - c0, wall = hd_now_s() - t0;
    dt_note("rank %d waited %.0f ms for rank %d using %.1f ms of CPU (%.1f%%), spin %llu ns",
            rank, wall * 1e3, a->wc->late, cpu * 1e3, 100.0 * cpu / wall,
            (unsigned long long)((ddcpu_group *)r.g)->spin_ns);
    CHECK_MSG(wall > 1.0, "rank %d: did not wait for the late rank (%.3f s)", rank, wall);
    CHECK_MSG(cpu < 0.3 * wall, "rank %d: %.0f ms of CPU time while waiting %.0f ms for a late "
              "peer: it spins instead of sleeping", rank, cpu * 1e3, wall * 1e3);
  }
  CHECK(y[63] == (float)(r.w->world * (r.w->world - 1) / 2));
  hd_close(&r);
}

static void run(int world, const int *layout, int pin, int late) {
  hd_world w;
  wait_case wc = {pin, late, hd_shared_page(4096)};
  hd_world_init(&w, world, layout, NULL);
  wait_arg a = {&w, &wc};
  int failed = dt_run_ranks(world, wait_rank, &a, NULL, 60, NULL);
  int left = hd_world_shm_left(&w);
  hd_world_cleanup(&w);
  CHECK_EQ_INT(failed, 0);
  CHECK_EQ_INT(left, 0);
}

/* Two ranks pinned to one CPU: oversubscribed whatever the machine has,
 * so the spin is the short one (2 us). */
TEST_T(spin_follows_affinity_oversubscribed, 60) { run(2, NULL, 1, 1); }
/* Unpinned: whatever this process may use (the rule is checked against
 * its own affinity count). */
TEST_T(spin_follows_affinity, 60) { run(2, NULL, 0, 1); }
/* A late peer on the same node (futex sleep) and on another node (poll on
 * the ring socket; the leader of node 0 waits for node 1's record). */
TEST_T(late_peer_costs_little_cpu_one_node, 60) { run(3, NULL, 0, 2); }
TEST_T(late_peer_costs_little_cpu_one_node_pinned, 60) { run(3, NULL, 1, 0); }
TEST_T(late_peer_costs_little_cpu_two_nodes, 60) {
  const int layout[] = {0, 1, 0, 1};
  run(4, layout, 0, 3);
}
