/* test-cpu-failure.c — the cpu plugin when things go wrong, with real
 * processes: a rank SIGKILLed before or in the middle of a collective
 * (small and large allreduce, broadcast, allgather, barrier; same node and
 * other node, node leaders included) makes every survivor return PEER_LOST
 * naming it; a late rank makes request_wait return TIMEOUT naming the
 * collective's sequence number and the ranks that had not arrived, while
 * the request stays pending and completes later; mismatched collectives
 * (count, dtype, op, kind, root; small and large) return MISMATCH on every
 * rank and leave the group usable; group_abort from any rank (or from
 * another thread of a blocked rank) reaches every rank; a rank that closed
 * its group cleanly (nothing pending) makes its peers' next collective
 * return PEER_LOST saying so, not a TIMEOUT; a ring stream out of step
 * (garbage where a handshake record belongs) fails the group on every
 * rank instead of running later collectives on it; request_test does not
 * block while the plugin waits to learn why a ring connection broke.
 * Detection latencies are printed, not asserted: waits are bounded by
 * timeouts. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/socket.h>

#include "harness.h"
#include "internal.h"
#include "cpu_data.h"
#include "cpu_driver.h"

#define MIB (1ull << 20)

typedef struct shared {
  _Atomic uint64_t event_ns; /* when the victim died / the abort was called */
  _Atomic int warmed;        /* ranks done with warmup() */
} shared;

static uint64_t mono_ns(void) { return (uint64_t)(hd_now_s() * 1e9); }

static void warmup(hd_rank *r) {
  float x[16], y[16];
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j < 16; j++) x[j] = (float)r->rank;
    CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, x, y, 16, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, 20000));
  }
}

/* ---- SIGKILL -------------------------------------------------------------- */

typedef struct kill_case {
  int victim;
  int kind;
  uint64_t count; /* float32 elements */
  int inside;     /* the victim dies inside the collective (else before it) */
  shared *sh;
} kill_case;

static int start_kind(hd_rank *r, const kill_case *kc, void *send, void *recv,
                      ddplug_plugin_request **req) {
  return hd_start(r, kc->kind, send, recv, kc->count, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, req);
}

static void *kill_soon(void *arg) {
  kill_case *kc = arg;
  usleep(3000);
  atomic_store(&kc->sh->event_ns, mono_ns());
  raise(SIGKILL);
  return NULL;
}

static void kill_rank(hd_rank *r, void *arg) {
  kill_case *kc = arg;
  warmup(r);
  /* The victim goes on only once every rank has finished the warmup: a
   * rank still finishing the last warmup collective when the victim dies
   * may rightly fail it (the group fails at the loss), and the warmup is
   * not what is checked. */
  atomic_fetch_add(&kc->sh->warmed, 1);
  for (int i = 0; r->rank == kc->victim && atomic_load(&kc->sh->warmed) < r->w->world; i++) {
    CHECK_MSG(i < 45000, "the victim: the others never finished the warmup");
    usleep(1000);
  }
  uint64_t bytes = kc->count * 4 + 4;
  uint64_t rbytes = kc->kind == DDPLUG_COLL_ALLGATHER ? kc->count * 4 * (uint64_t)r->w->world + 4
                                                      : bytes;
  float *send = calloc(1, bytes), *recv = calloc(1, rbytes);
  CHECK(send && recv);
  if (r->rank == kc->victim) {
    if (kc->inside) {
      ddplug_plugin_request *req = NULL;
      CHECK_OK(start_kind(r, kc, send, recv, &req));
      /* run it (inline, in request_wait) and die 3 ms into it, half done:
       * the collective moves tens of MiB per rank, and a wait that makes
       * progress does not stop at its timeout, so the death comes from
       * another thread. Should the collective end before that thread runs
       * (a loaded machine), the next one is started: the others repeat it
       * until they see the loss. */
      pthread_t killer;
      pthread_create(&killer, NULL, kill_soon, kc);
      for (;;) {
        CHECK_OK(hd_wait(r, req, 30000));
        hd_free(r, req);
        CHECK_OK(start_kind(r, kc, send, recv, &req));
      }
    } else {
      usleep(200 * 1000);
    }
    atomic_store(&kc->sh->event_ns, mono_ns());
    raise(SIGKILL);
  }
  ddplug_plugin_request *req = NULL;
  /* the loss may already be known when this rank starts (then start says
   * so), or be noticed while it waits; a victim that dies inside may have
   * completed some before (as many as it did, then the one it died in) */
  int s;
  do {
    s = start_kind(r, kc, send, recv, &req);
    if (s == DDPLUG_OK) {
      s = hd_wait(r, req, 30000); /* a hang guard: the loss ends the wait */
      hd_free(r, req);
    }
  } while (s == DDPLUG_OK && kc->inside);
  double lat = (double)(mono_ns() - atomic_load(&kc->sh->event_ns)) / 1e6;
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d (", kc->victim);
  CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank %d: expected PEER_LOST, got %s: %s", r->rank,
            ddplug_status_name(s), r->error);
  CHECK_CONTAINS(r->error, needle);
  dt_note("rank %d: PEER_LOST %.1f ms after rank %d died: %s", r->rank, lat, kc->victim, r->error);
  /* the group stays failed: the next collective does not start */
  CHECK_STATUS(hd_start(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, &req),
               DDPLUG_E_PEER_LOST);
  CHECK_CONTAINS(r->error, needle);
  free(send);
  free(recv);
}

static void run_kill(int world, const int *layout, int victim, int kind, uint64_t count,
                     int inside) {
  kill_case kc = {victim, kind, count, inside, hd_shared_page(4096)};
  int st[HD_MAX_RANKS];
  CHECK_EQ_INT(hd_run_world(world, layout, NULL, kill_rank, &kc, 60, st), 1);
  CHECK(WIFSIGNALED(st[victim]) && WTERMSIG(st[victim]) == SIGKILL);
}

TEST_T(kill_before_small_allreduce, 60) {
  run_kill(4, NULL, 2, DDPLUG_COLL_ALLREDUCE, 100, 0);
}
TEST_T(kill_inside_large_allreduce, 60) {
  run_kill(4, NULL, 1, DDPLUG_COLL_ALLREDUCE, 16 * MIB, 1);
}
TEST_T(kill_before_broadcast, 60) {
  run_kill(4, NULL, 3, DDPLUG_COLL_BROADCAST, 100, 0);
}
TEST_T(kill_inside_large_broadcast, 60) {
  run_kill(3, NULL, 2, DDPLUG_COLL_BROADCAST, 16 * MIB, 1);
}
TEST_T(kill_before_barrier, 60) {
  run_kill(4, NULL, 0, DDPLUG_COLL_BARRIER, 0, 0);
}
/* allgather: 64 MiB per rank (receive buffers of ranks x 64 MiB), so the
 * victim's progress thread cannot finish its part in the moment between
 * its request_wait timing out and its death */
TEST_T(kill_before_small_allgather, 60) {
  run_kill(4, NULL, 1, DDPLUG_COLL_ALLGATHER, 100, 0);
}
TEST_T(kill_inside_large_allgather, 60) {
  run_kill(3, NULL, 1, DDPLUG_COLL_ALLGATHER, 16 * MIB, 1);
}
static const int two_nodes[] = {0, 0, 1, 1};
TEST_T(kill_other_node_leader_inside_large_allreduce, 60) {
  run_kill(4, two_nodes, 2, DDPLUG_COLL_ALLREDUCE, 16 * MIB, 1);
}
TEST_T(kill_other_node_member_inside_large_allreduce, 60) {
  run_kill(4, two_nodes, 3, DDPLUG_COLL_ALLREDUCE, 16 * MIB, 1);
}
TEST_T(kill_node_member_before_small_allreduce_two_nodes, 60) {
  run_kill(4, two_nodes, 1, DDPLUG_COLL_ALLREDUCE, 10, 0);
}
TEST_T(kill_leader_before_barrier_two_nodes, 60) {
  run_kill(4, two_nodes, 0, DDPLUG_COLL_BARRIER, 0, 0);
}
TEST_T(kill_other_node_leader_inside_large_allgather, 60) {
  run_kill(4, two_nodes, 2, DDPLUG_COLL_ALLGATHER, 16 * MIB, 1);
}
TEST_T(kill_same_node_member_inside_large_allgather_two_nodes, 60) {
  run_kill(4, two_nodes, 1, DDPLUG_COLL_ALLGATHER, 16 * MIB, 1);
}
TEST_T(kill_before_broadcast_one_rank_per_node, 60) {
  const int layout[] = {0, 1, 2};
  run_kill(3, layout, 1, DDPLUG_COLL_BROADCAST, 1000, 0);
}

/* ---- timeouts ------------------------------------------------------------------ */

typedef struct late_case {
  int late;
  const char *expect_rank0; /* what rank 0's TIMEOUT sentence names */
  _Atomic int *timed_out;   /* punctual ranks done with their timeouts */
} late_case;

/* The late rank starts only once every other rank has timed out waiting
 * for it (a shared counter), so their TIMEOUT does not depend on how long
 * anything takes. A TIMEOUT names the ranks that had not arrived at that
 * moment: rank 0 repeats its wait while another punctual rank is named
 * too, until the sentence it checks names the late rank alone. */
static void late_rank(hd_rank *r, void *arg) {
  late_case *lc = arg;
  uint64_t n = 1000;
  float *send = malloc(n * 4), *recv = malloc(n * 4);
  float ref[HDATA_PERIOD];
  hdata_fill(send, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->rank, n);
  hdata_ref(ref, DDPLUG_FLOAT32, DDPLUG_OP_SUM, r->w->world);
  if (r->rank == lc->late) {
    for (int i = 0; atomic_load(lc->timed_out) < r->w->world - 1; i++) {
      CHECK_MSG(i < 45000, "the late rank: the others never timed out");
      usleep(1000);
    }
    CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     20000));
  } else {
    ddplug_plugin_request *req = NULL;
    CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                      &req));
    for (int tries = 0;; tries++) {
      CHECK_STATUS(hd_wait(r, req, 300), DDPLUG_E_TIMEOUT);
      CHECK_CONTAINS(r->error, "collective #1 ");
      CHECK_CONTAINS(r->error, "still pending");
      if (r->rank != 0 || strstr(r->error, lc->expect_rank0)) break;
      CHECK_MSG(tries < 100, "rank 0: the other ranks never arrived: %s", r->error);
    }
    dt_note("rank %d: %s", r->rank, r->error);
    atomic_fetch_add(lc->timed_out, 1);
    /* the request stays pending and completes once the late rank comes */
    CHECK_OK(hd_wait(r, req, 20000));
    hd_free(r, req);
  }
  CHECK(hdata_check(recv, ref, DDPLUG_FLOAT32, n, 0) < 0);
  /* and the group goes on */
  CHECK_OK(hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 20000));
  free(send);
  free(recv);
}

TEST_T(timeout_names_seq_and_missing_rank, 60) {
  late_case lc = {1, "rank 1 has not arrived", hd_shared_page(4096)};
  CHECK_EQ_INT(hd_run_world(3, NULL, NULL, late_rank, &lc, 60, NULL), 0);
}

TEST_T(timeout_names_ranks_of_other_node, 60) {
  late_case lc = {3, "ranks on other nodes not heard from yet: 2, 3", hd_shared_page(4096)};
  CHECK_EQ_INT(hd_run_world(4, two_nodes, NULL, late_rank, &lc, 60, NULL), 0);
}

/* ---- mismatches ------------------------------------------------------------- */

enum { MM_COUNT, MM_DTYPE, MM_OP, MM_KIND, MM_ROOT, MM_COUNT_LARGE, MM_PATHS, MM_N };
static const char *mm_names[] = {"count", "dtype", "op", "kind", "root", "large count",
                                 "small vs large"};

static void mismatch_rank(hd_rank *r, void *arg) {
  (void)arg;
  int W = r->w->world, odd = W - 1; /* the rank that differs */
  uint64_t cap = 2 * MIB + 8;
  float *send = calloc(cap, 4), *recv = calloc(cap, 4);
  for (int v = 0; v < MM_N; v++) {
    int kind = DDPLUG_COLL_ALLREDUCE, dt = DDPLUG_FLOAT32, op = DDPLUG_OP_SUM, root = 0;
    uint64_t n = 10;
    int me = r->rank == odd;
    switch (v) {
      case MM_COUNT: n = me ? 11 : 10; break;
      case MM_DTYPE: dt = me ? DDPLUG_INT32 : DDPLUG_FLOAT32; break;
      case MM_OP: op = me ? DDPLUG_OP_MAX : DDPLUG_OP_SUM; break;
      case MM_KIND: kind = me ? DDPLUG_COLL_BROADCAST : DDPLUG_COLL_ALLREDUCE; break;
      case MM_ROOT: kind = DDPLUG_COLL_BROADCAST; root = me ? 1 : 0; break;
      case MM_COUNT_LARGE: n = me ? MIB + 1 : MIB; break;
      case MM_PATHS: n = me ? 2 * MIB : 3; break;
    }
    int s = hd_coll(r, kind, send, recv, n, dt, op, root, 20000);
    CHECK_MSG(s == DDPLUG_E_MISMATCH, "rank %d, %s mismatch: expected MISMATCH, got %s: %s",
              r->rank, mm_names[v], ddplug_status_name(s), r->error);
    char who[32];
    snprintf(who, sizeof who, "rank %d called", odd);
    CHECK_CONTAINS(r->error, "differs across ranks");
    CHECK_CONTAINS(r->error, who);
    if (r->rank == 0 && v == 0) dt_note("%s", r->error);
    /* nobody moved data: the group is still usable */
    for (int i = 0; i < 4; i++) send[i] = 1.0f;
    CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv, 4, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     20000));
    CHECK(recv[3] == (float)W);
  }
  free(send);
  free(recv);
}

TEST_T(mismatch_every_field_one_node, 60) {
  CHECK_EQ_INT(hd_run_world(4, NULL, NULL, mismatch_rank, NULL, 60, NULL), 0);
}

TEST_T(mismatch_every_field_two_nodes, 60) {
  const int layout[] = {0, 1, 0, 1};
  CHECK_EQ_INT(hd_run_world(4, layout, NULL, mismatch_rank, NULL, 60, NULL), 0);
}

/* ---- abort ---------------------------------------------------------------- */

typedef struct abort_case {
  int aborter;
  shared *sh;
  _Atomic int *started; /* ranks that started the allreduce */
} abort_case;

/* The aborter aborts once every other rank has started the allreduce (a
 * shared counter), which cannot complete without it. */
static void abort_rank(hd_rank *r, void *arg) {
  abort_case *ac = arg;
  warmup(r);
  uint64_t n = 4 * MIB;
  float *send = calloc(n, 4), *recv = calloc(n, 4);
  char needle[64];
  snprintf(needle, sizeof needle, "aborted by rank %d: test says stop", ac->aborter);
  if (r->rank == ac->aborter) {
    for (int i = 0; atomic_load(ac->started) < r->w->world - 1; i++) {
      CHECK_MSG(i < 45000, "rank %d: the others never started", r->rank);
      usleep(1000);
    }
    atomic_store(&ac->sh->event_ns, mono_ns());
    CHECK_OK(r->p->group_abort(r->g, "test says stop"));
    CHECK_STATUS(hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32,
                         DDPLUG_OP_SUM, 0, 30000), DDPLUG_E_ABORTED);
  } else {
    ddplug_plugin_request *req = NULL;
    int s = hd_start(r, DDPLUG_COLL_ALLREDUCE, send, recv, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     &req);
    atomic_fetch_add(ac->started, 1);
    if (s == DDPLUG_OK) {
      s = hd_wait(r, req, 30000); /* a hang guard: the abort ends the wait */
      hd_free(r, req);
    }
    double lat = (double)(mono_ns() - atomic_load(&ac->sh->event_ns)) / 1e6;
    CHECK_MSG(s == DDPLUG_E_ABORTED, "rank %d: expected ABORTED, got %s: %s", r->rank,
              ddplug_status_name(s), r->error);
    dt_note("rank %d: ABORTED %.1f ms after rank %d aborted", r->rank, lat, ac->aborter);
  }
  CHECK_CONTAINS(r->error, needle);
  free(send);
  free(recv);
}

static void run_abort(int world, const int *layout, int aborter) {
  abort_case ac = {aborter, hd_shared_page(4096), hd_shared_page(4096)};
  CHECK_EQ_INT(hd_run_world(world, layout, NULL, abort_rank, &ac, 60, NULL), 0);
}

TEST_T(abort_reaches_every_rank_one_node, 60) { run_abort(4, NULL, 2); }
TEST_T(abort_from_node_member_reaches_other_node, 60) { run_abort(4, two_nodes, 3); }
TEST_T(abort_from_leader_reaches_other_nodes, 60) {
  const int layout[] = {0, 1, 2, 0, 1, 2};
  run_abort(6, layout, 1);
}

/* group_abort from another thread unblocks a rank stuck in a collective.
 * Rank 1 joins only after rank 0's abort (a shared flag), so rank 0's
 * allreduce cannot complete before it. */
typedef struct abort_thread_case {
  hd_rank *r;
  _Atomic int started, aborted;
} abort_thread_case;

static void *abort_later(void *p) {
  abort_thread_case *ac = p;
  while (!atomic_load(&ac->started)) usleep(1000);
  usleep(200 * 1000); /* most likely blocked in its wait by now (not required) */
  ac->r->p->group_abort(ac->r->g, "watcher thread");
  atomic_store(&ac->aborted, 1);
  return NULL;
}

static void abort_thread_rank(hd_rank *r, void *arg) {
  abort_thread_case *ac = arg;
  float x = 1, y = 0;
  if (r->rank == 1) {
    for (int i = 0; !atomic_load(&ac->aborted); i++) {
      CHECK_MSG(i < 45000, "rank 1: rank 0 never aborted");
      usleep(1000);
    }
    CHECK_STATUS(hd_coll(r, DDPLUG_COLL_ALLREDUCE, &x, &y, 1, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                         30000), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(r->error, "aborted by rank 0: watcher thread");
    return;
  }
  ac->r = r;
  pthread_t t;
  pthread_create(&t, NULL, abort_later, ac);
  double t0 = hd_now_s();
  ddplug_plugin_request *req = NULL;
  int s = hd_start(r, DDPLUG_COLL_ALLREDUCE, &x, &y, 1, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, &req);
  atomic_store(&ac->started, 1);
  if (s == DDPLUG_OK) {
    s = hd_wait(r, req, 30000); /* a hang guard: the abort ends the wait */
    hd_free(r, req);
  }
  pthread_join(t, NULL);
  CHECK_STATUS(s, DDPLUG_E_ABORTED);
  dt_note("rank 0: blocked allreduce returned ABORTED %.1f ms after it started (abort at 200 ms)",
          (hd_now_s() - t0) * 1e3);
}

TEST_T(abort_from_another_thread_unblocks, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, abort_thread_rank, hd_shared_page(4096), 60, NULL),
               0);
}

/* Destroying a group with a collective pending aborts the others. Rank 1
 * starts only once rank 0 has destroyed its group (a shared flag): before
 * that, its barrier would meet rank 0's allreduce (a mismatch). */
static void destroy_pending_rank(hd_rank *r, void *arg) {
  _Atomic int *destroyed = arg;
  float x = 1, y = 0;
  if (r->rank == 0) {
    ddplug_plugin_request *req = NULL;
    CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, &x, &y, 1, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, &req));
    hd_close(r); /* destroys the group with req pending */
    atomic_store(destroyed, 1);
    return;
  }
  for (int i = 0; !atomic_load(destroyed); i++) {
    CHECK_MSG(i < 45000, "rank 1: rank 0 never destroyed its group");
    usleep(1000);
  }
  int s = hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 30000);
  CHECK_MSG(s == DDPLUG_E_ABORTED, "got %s: %s", ddplug_status_name(s), r->error);
  CHECK_CONTAINS(r->error, "rank 0 destroyed its group with 1 collective(s) still pending");
}

TEST_T(destroy_with_pending_collective, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, destroy_pending_rank, hd_shared_page(4096), 60, NULL),
               0);
}

/* ---- a rank that closed its group cleanly ------------------------------------ */

typedef struct leave_case {
  int leaver;
  const char *needle; /* what the survivors' sentence says about it */
  _Atomic int *early, *left; /* survivors started before it left; it left */
} leave_case;

/* The leaver runs a few collectives with everyone, then destroys its group
 * with nothing pending and exits. The others go on to a collective it never
 * joins: PEER_LOST saying it closed its group (a TIMEOUT would say "has not
 * arrived"; the wait's limit is only a hang guard). The odd survivors start
 * before it leaves (it waits for them: they are already waiting when it
 * leaves), the even ones after it left (they wait for it: shared flags). */
static void leave_rank(hd_rank *r, void *arg) {
  leave_case *lc = arg;
  warmup(r);
  if (r->rank == lc->leaver) {
    int odd = 0;
    for (int k = 1; k < r->w->world; k += 2) odd += k != lc->leaver;
    for (int i = 0; atomic_load(lc->early) < odd; i++) {
      CHECK_MSG(i < 45000, "the leaver: the odd ranks never started");
      usleep(1000);
    }
    hd_close(r);
    atomic_store(lc->left, 1);
    return;
  }
  for (int i = 0; r->rank % 2 == 0 && !atomic_load(lc->left); i++) {
    CHECK_MSG(i < 45000, "rank %d: rank %d never left", r->rank, lc->leaver);
    usleep(1000);
  }
  double t0 = hd_now_s();
  float x[4] = {1, 2, 3, 4}, y[4];
  ddplug_plugin_request *req = NULL;
  int s = hd_start(r, DDPLUG_COLL_ALLREDUCE, x, y, 4, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, &req);
  if (r->rank % 2 == 1) atomic_fetch_add(lc->early, 1);
  if (s == DDPLUG_OK) {
    s = hd_wait(r, req, 30000);
    hd_free(r, req);
  }
  CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank %d: expected PEER_LOST after rank %d left, got %s: %s",
            r->rank, lc->leaver, ddplug_status_name(s), r->error);
  char who[32];
  snprintf(who, sizeof who, "rank %d (", lc->leaver);
  CHECK_CONTAINS(r->error, who);
  CHECK_CONTAINS(r->error, lc->needle);
  dt_note("rank %d: PEER_LOST after %.1f ms: %s", r->rank, (hd_now_s() - t0) * 1e3, r->error);
  /* and the group stays failed */
  CHECK_STATUS(hd_start(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, &req),
               DDPLUG_E_PEER_LOST);
}

static void run_leave(int world, const int *layout, int leaver) {
  leave_case lc = {leaver, "closed its group", hd_shared_page(4096), hd_shared_page(4096)};
  CHECK_EQ_INT(hd_run_world(world, layout, NULL, leave_rank, &lc, 60, NULL), 0);
}

TEST_T(departed_rank_is_peer_lost_one_node, 60) { run_leave(4, NULL, 2); }
TEST_T(departed_node_member_is_peer_lost_two_nodes, 60) { run_leave(4, two_nodes, 3); }
TEST_T(departed_node_leader_is_peer_lost_two_nodes, 60) {
  const int layout[] = {0, 1, 0, 1};
  run_leave(4, layout, 1);
}
TEST_T(departed_leader_is_peer_lost_one_rank_per_node, 60) {
  const int layout[] = {0, 1, 2};
  run_leave(3, layout, 1);
}

/* ---- a ring stream out of step ---------------------------------------------------- */

/* Node 0's leader puts a record's worth of zeros on its ring connection
 * to node 1 between two collectives: node 1 reads them as node 0's
 * handshake record (corrupt: "stream out of step") and everything after
 * on that connection is shifted. Every rank must end with the group failed
 * (INTERNAL, naming the collective), never run another collective on it. */
static void out_of_step_rank(hd_rank *r, void *arg) {
  (void)arg;
  CHECK_OK(hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 20000));
  CHECK_OK(hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 20000));
  if (r->rank == 0) {
    ddcpu_group *g = (ddcpu_group *)r->g;
    static unsigned char junk[sizeof(ddcpu_hs_rec)];
    CHECK(g->leader && g->next_fd >= 0);
    CHECK_EQ_INT(send(g->next_fd, junk, sizeof junk, MSG_NOSIGNAL), (long long)sizeof junk);
  }
  /* a few collectives: the group must fail at one of them (node 1 at the
   * first, node 0 once node 1's failure record reaches it) and stay failed */
  int s = DDPLUG_OK, i;
  for (i = 0; i < 5 && s == DDPLUG_OK; i++) {
    float x[8] = {0}, y[8];
    ddplug_plugin_request *req = NULL;
    s = hd_start(r, DDPLUG_COLL_ALLREDUCE, x, y, 8, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, &req);
    if (s == DDPLUG_OK) {
      s = hd_wait(r, req, 30000); /* a hang guard: the failure ends the wait */
      hd_free(r, req);
    }
  }
  CHECK_MSG(s == DDPLUG_E_INTERNAL, "rank %d: expected the group to fail with INTERNAL, got %s "
            "after %d collective(s): %s", r->rank, ddplug_status_name(s), i, r->error);
  CHECK_CONTAINS(r->error, "out of step");
  CHECK_CONTAINS(r->error, "cannot run further collectives");
  if (r->node_of[r->rank] == 1) CHECK_EQ_INT(i, 1); /* node 1 fails at the first */
  dt_note("rank %d: %s after %d collective(s): %s", r->rank, ddplug_status_name(s), i, r->error);
  ddplug_plugin_request *req = NULL;
  CHECK_STATUS(hd_start(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, &req), DDPLUG_E_INTERNAL);
}

TEST_T(ring_stream_out_of_step_fails_the_group, 60) {
  CHECK_EQ_INT(hd_run_world(4, two_nodes, NULL, out_of_step_rank, NULL, 60, NULL), 0);
}
TEST_T(ring_stream_out_of_step_fails_the_group_one_rank_per_node, 60) {
  const int layout[] = {0, 1};
  CHECK_EQ_INT(hd_run_world(2, layout, NULL, out_of_step_rank, NULL, 60, NULL), 0);
}

/* ---- request_test never blocks ---------------------------------------------------- */

typedef struct test_case {
  _Atomic int go;   /* node 0 is ready for the end of its connection   */
  _Atomic int shut; /* node 1's leader has shut its sending side */
  _Atomic int seen; /* node 0 has seen the allreduce end in PEER_LOST   */
} test_case;

/* Node 1's leader shuts the sending side of its ring connection to node
 * 0 (without a goodbye and without dying): node 0's leader meets the
 * connection's end in its next collective and waits up to 200 ms for an
 * abort record that would explain it. request_test must not wait with it:
 * it returns done == 0 and the wait goes on in the background, until
 * PEER_LOST. (Node 0's idle progress thread would notice the end first and
 * settle it in the background; the test hides it from that thread, as a
 * running ring phase does, so that the caller's request_test meets it.)
 * Node 1's leader starts its own collective only once node 0 is done (a
 * shared flag): its own view of the broken ring, sent round, must not be
 * what node 0 reports. */
static void test_nonblocking_rank(hd_rank *r, void *arg) {
  test_case *tc = arg;
  ddcpu_group *g = (ddcpu_group *)r->g;
  CHECK_OK(hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 20000));
  if (r->rank == 1) {
    while (!atomic_load(&tc->go)) usleep(1000);
    CHECK_EQ_INT(shutdown(g->next_fd, SHUT_WR), 0);
    atomic_store(&tc->shut, 1);
    while (!atomic_load(&tc->seen)) usleep(1000);
    /* node 0's verdict reaches this rank through the ring's control channel */
    int s = hd_coll(r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 30000);
    CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank 1: got %s: %s", ddplug_status_name(s), r->error);
    return;
  }
  /* The progress thread decides what to watch while it holds the executor
   * role: holding it while the flag changes makes every later decision see
   * it (a poll already under way that wakes for the connection's end looks
   * again, with the flag, before it reads anything). */
  while (!ddcpu_exec_try(g)) usleep(1000);
  g->ring_active = 1; /* the progress thread stops watching prev_fd */
  ddcpu_exec_release(g);
  atomic_store(&tc->go, 1);
  while (!atomic_load(&tc->shut)) usleep(1000);
  float x[16] = {0}, y[16];
  ddplug_plugin_request *req = NULL;
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, x, y, 16, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, &req));
  int32_t done = 0;
  int s = DDPLUG_OK, not_done = 0;
  double longest = 0, t_end = hd_now_s() + 40;
  /* the first call runs the collective inline and meets the end at once
   * (on loopback the end is there as soon as shutdown returned) */
  double t0 = hd_now_s();
  s = r->p->request_test(r->g, req, &done);
  longest = hd_now_s() - t0;
  CHECK_MSG(!done, "rank 0: the first request_test waited for the cause of the broken "
            "connection (%.1f ms) and returned %s", longest * 1e3, ddplug_status_name(s));
  while (!done && hd_now_s() < t_end) {
    double t1 = hd_now_s();
    s = r->p->request_test(r->g, req, &done);
    double dt = hd_now_s() - t1;
    if (dt > longest) longest = dt;
    if (!done) {
      not_done++;
      usleep(1000);
    }
  }
  CHECK_MSG(done, "rank 0: the allreduce never completed");
  CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank 0: got %s: %s", ddplug_status_name(s), r->error);
  CHECK_CONTAINS(r->error, "rank 1 (leader of node 1");
  atomic_store(&tc->seen, 1);
  dt_note("rank 0: %d request_test calls said not done; the longest took %.2f ms; then %s",
          not_done, longest * 1e3, r->error);
  hd_free(r, req);
}

TEST_T(request_test_does_not_block_on_a_broken_ring, 60) {
  const int layout[] = {0, 1};
  test_case *tc = hd_shared_page(4096);
  CHECK_EQ_INT(hd_run_world(2, layout, NULL, test_nonblocking_rank, tc, 60, NULL), 0);
}

/* ---- a node segment removed before this rank attached ------------------------
 * The startup race: a rank killed while the run joins fails every rank's
 * group_create; the node's first rank then removes the segment it had
 * published, and a rank still on its way finds no file. It must name the
 * cause, not the missing file: here rank 0, the segment's creator, is dead
 * (a process that exited), and rank 1 finds its published segment gone. */

static void write_key(const hd_world *w, const char *key, const char *value) {
  char path[600];
  snprintf(path, sizeof path, "%s/k_%s", w->dir, key);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fputs(value, f);
  fclose(f);
}

TEST_T(segment_gone_before_attach_names_the_dead_creator, 60) {
  hd_world w;
  hd_world_init(&w, 2, NULL, NULL);
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  CHECK(dead > 0);
  int st = 0;
  CHECK(waitpid(dead, &st, 0) == dead);
  char pid[32], name[128];
  snprintf(pid, sizeof pid, "%d", (int)dead);
  write_key(&w, "drv_pid_0", pid);
  ddcpu_shm_name(name, sizeof name, w.run_id, 0); /* published, never created */
  write_key(&w, "shm_0", name);
  hd_rank r;
  int s = hd_open(&r, &w, 1);
  dt_note("rank 1: %s", r.error);
  CHECK_STATUS(s, DDPLUG_E_PEER_LOST);
  CHECK_CONTAINS(r.error, "rank 0 (pid");
  CHECK_CONTAINS(r.error, "exited while the node's ranks attached to its shared memory");
  hd_world_cleanup(&w);
}
