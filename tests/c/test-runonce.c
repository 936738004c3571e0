/* test-runonce.c — run-once across real processes: one runner per scope (global:
 * rank 0; node: local rank 0 of each node, nodes simulated with
 * DDPLUG_HOST_ID), waiters get the runner's message or failure, recorded
 * outcomes come back at once, waiters wait for a live runner past the
 * collective timeout, a waiter times out naming the runner and the setting
 * that limited it, a runner that dies wakes its node with PEER_LOST, one
 * that stops heartbeating (stopped by a signal) is given up on, and bad
 * arguments are refused. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ddplug/store.h"

static const char *g_calls; /* file every runner appends its rank to */

/* The example plugin (collectives through the store) is enough: run-once
 * only uses the context's store. Short timeouts keep failures quick. */
static ddplug_context *open_ctx_with(const char *collective_s, const char *run_once_s) {
  char json[256];
  snprintf(json, sizeof json,
           "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 30}, "
           "\"timeouts\": {\"collective_s\": %s, \"run_once_s\": %s}}",
           collective_s ? collective_s : "60", run_once_s ? run_once_s : "0");
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string(json, "test", &cfg));
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(cfg, NULL, &ctx));
  ddplug_config_free(cfg);
  return ctx;
}

static ddplug_context *open_ctx(const char *collective_s) {
  return open_ctx_with(collective_s, NULL);
}

static int count_calls(void) {
  FILE *f = fopen(g_calls, "r");
  if (!f) return 0;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF)
    if (c == '\n') n++;
  fclose(f);
  return n;
}

typedef struct work {
  int rank;
  int sleep_ms;
  int status;
  const char *text;
} work;

static int do_work(void *user, char **message) {
  work *w = user;
  int fd = open(g_calls, O_WRONLY | O_APPEND | O_CREAT, 0600);
  if (fd >= 0) {
    char line[16];
    int n = snprintf(line, sizeof line, "%d\n", w->rank);
    if (write(fd, line, (size_t)n) != n) w->status = DDPLUG_E_SYSTEM;
    close(fd);
  }
  usleep((useconds_t)w->sleep_ms * 1000);
  *message = strdup(w->text);
  return w->status;
}

static void set_node(int rank) {
  setenv("DDPLUG_HOST_ID", rank < 2 ? "node-a" : "node-b", 1);
  char lr[8];
  snprintf(lr, sizeof lr, "%d", rank % 2);
  setenv("LOCAL_RANK", lr, 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
}

/* ---- success, both scopes ---------------------------------------------- */

static void rank_success(int rank, int world, void *arg) {
  int scope = *(int *)arg;
  set_node(rank);
  ddplug_context *ctx = open_ctx(NULL);
  work w = {rank, 300, DDPLUG_OK, scope == DDPLUG_SCOPE_GLOBAL ? "result-global" : rank < 2 ? "result-a" : "result-b"};
  char *msg = NULL;
  CHECK_OK(ddplug_run_once(ctx, "prepare", scope, do_work, &w, 20000, &msg));
  CHECK(msg != NULL);
  if (scope == DDPLUG_SCOPE_GLOBAL)
    CHECK_EQ_STR(msg, "result-global");
  else
    CHECK_EQ_STR(msg, rank < 2 ? "result-a" : "result-b");
  ddplug_free(msg);
  /* the work of this scope is done when the call returns */
  if (scope == DDPLUG_SCOPE_GLOBAL) CHECK_EQ_INT(count_calls(), 1);
  /* recorded: a second call returns at once without running the work */
  int runner = -1;
  msg = NULL;
  CHECK_OK(ddplug_run_once_begin(ctx, "prepare", scope, 0, &runner, &msg));
  CHECK_EQ_INT(runner, 0);
  CHECK(msg && strncmp(msg, "result-", 7) == 0);
  ddplug_free(msg);
  CHECK_OK(ddplug_barrier(ctx, 20000));
  /* every rank is past its run-once: one call per scope, none repeated */
  CHECK_EQ_INT(count_calls(), scope == DDPLUG_SCOPE_GLOBAL ? 1 : 2);
  (void)world;
  CHECK_OK(ddplug_close(ctx));
}

/* Run fn on `world` ranks (two simulated nodes) for scope, all must pass. */
static void run_scope(dt_rank_fn fn, int world, int scope) {
  g_calls = dt_temp_file(".calls", "");
  CHECK_EQ_INT(dt_run_ranks(world, fn, &scope, NULL, 90, NULL), 0);
}

TEST_T(global_scope_runs_once_and_shares_the_message, 120) {
  run_scope(rank_success, 4, DDPLUG_SCOPE_GLOBAL);
}

TEST_T(node_scope_runs_once_per_node, 120) {
  run_scope(rank_success, 4, DDPLUG_SCOPE_NODE);
}

/* ---- failure ------------------------------------------------------------ */

static void rank_failure(int rank, int world, void *arg) {
  int scope = *(int *)arg;
  set_node(rank);
  ddplug_context *ctx = open_ctx(NULL);
  work w = {rank, 100, DDPLUG_E_SYSTEM, "disk full while unpacking shard 3\nsecond line"};
  char *msg = NULL;
  int st = ddplug_run_once(ctx, "unpack", scope, do_work, &w, 20000, &msg);
  CHECK_STATUS(st, DDPLUG_E_SYSTEM);
  CHECK(msg != NULL);
  CHECK_EQ_STR(msg, "disk full while unpacking shard 3\nsecond line");
  int runner_rank = scope == DDPLUG_SCOPE_GLOBAL ? 0 : (rank < 2 ? 0 : 2);
  if (rank == runner_rank) {
    CHECK_CONTAINS(ddplug_last_error(), "the work failed on this process: disk full");
  } else {
    char want[128];
    snprintf(want, sizeof want, "failed on its runner, rank %d: disk full while unpacking shard 3",
             runner_rank);
    CHECK_CONTAINS(ddplug_last_error(), want);
  }
  ddplug_free(msg);
  (void)world;
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(failure_reaches_every_waiter_global, 120) {
  run_scope(rank_failure, 3, DDPLUG_SCOPE_GLOBAL);
}

TEST_T(failure_reaches_every_waiter_node, 120) {
  run_scope(rank_failure, 4, DDPLUG_SCOPE_NODE);
}

/* ---- timeout, misuse ---------------------------------------------------- */

static void rank_timeout(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  ddplug_context *ctx = open_ctx(NULL);
  ddplug_store *st = ddplug_context_store(ctx);
  int runner = -1;
  char *msg = NULL;
  if (rank == 0) {
    CHECK_OK(ddplug_run_once_begin(ctx, "slow", DDPLUG_SCOPE_GLOBAL, 1000, &runner, &msg));
    CHECK_EQ_INT(runner, 1);
    /* a non-runner may not end it; neither may the runner with a wrong scope */
    CHECK_STATUS(ddplug_run_once_end(ctx, "slow", DDPLUG_SCOPE_NODE, DDPLUG_OK, NULL),
                 DDPLUG_E_INVALID_ARGUMENT);
    CHECK_CONTAINS(ddplug_last_error(), "this process is not running it");
    /* end only once the waiter has timed out */
    void *v = NULL;
    uint64_t len = 0;
    CHECK_OK(ddplug_store_get(st, "user/test/timed-out", 60000, &v, &len));
    ddplug_free(v);
    CHECK_OK(ddplug_run_once_end(ctx, "slow", DDPLUG_SCOPE_GLOBAL, DDPLUG_OK, "late"));
    CHECK_STATUS(ddplug_run_once_end(ctx, "slow", DDPLUG_SCOPE_GLOBAL, DDPLUG_OK, NULL),
                 DDPLUG_E_INVALID_ARGUMENT);
  } else {
    CHECK_STATUS(ddplug_run_once_begin(ctx, "slow", DDPLUG_SCOPE_GLOBAL, 300, &runner, &msg),
                 DDPLUG_E_TIMEOUT);
    /* the limit, not how long the wait took (a loaded machine takes longer) */
    CHECK_CONTAINS(ddplug_last_error(), "no outcome from its runner, rank 0, after ");
    CHECK_CONTAINS(ddplug_last_error(), " s (the timeout the caller passed, 0.3 s)");
    CHECK_EQ_INT(runner, 0);
    CHECK_OK(ddplug_store_set(st, "user/test/timed-out", "1", 1));
    /* the outcome still comes */
    CHECK_OK(ddplug_run_once_begin(ctx, "slow", DDPLUG_SCOPE_GLOBAL, 60000, &runner, &msg));
    CHECK_EQ_STR(msg, "late");
    ddplug_free(msg);
  }
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(waiter_times_out_naming_the_runner, 120) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_timeout, NULL, NULL, 90, NULL), 0);
}

static void rank_bad_args(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  (void)rank;
  ddplug_context *ctx = open_ctx(NULL);
  int runner = 7;
  CHECK_STATUS(ddplug_run_once_begin(ctx, "has space", DDPLUG_SCOPE_GLOBAL, 0, &runner, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_EQ_INT(runner, 0);
  CHECK_CONTAINS(ddplug_last_error(), "run-once name 'has space' must be 1 to 160 printable ASCII");
  CHECK_STATUS(ddplug_run_once_begin(ctx, "", DDPLUG_SCOPE_GLOBAL, 0, &runner, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_run_once_begin(ctx, "x", 7, 0, &runner, NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "scope 7 is neither");
  CHECK_STATUS(ddplug_run_once_begin(ctx, "x", DDPLUG_SCOPE_GLOBAL, 0, NULL, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_run_once_begin(NULL, "x", DDPLUG_SCOPE_GLOBAL, 0, &runner, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_run_once_begin(ctx, "x", DDPLUG_SCOPE_GLOBAL, -5, &runner, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_run_once(ctx, "x", DDPLUG_SCOPE_GLOBAL, NULL, NULL, 0, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_run_once_end(ctx, "never-begun", DDPLUG_SCOPE_GLOBAL, DDPLUG_OK, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_run_once_end(ctx, "x", DDPLUG_SCOPE_GLOBAL, 999, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "status 999 is not a ddplug status");
  /* an outcome someone else wrote into the runtime's keys is refused, not trusted */
  CHECK_OK(ddplug_store_set(ddplug_context_store(ctx), "ddplug/runonce/global/forged", "junk", 4));
  CHECK_STATUS(ddplug_run_once_begin(ctx, "forged", DDPLUG_SCOPE_GLOBAL, 0, &runner, NULL),
               DDPLUG_E_INTERNAL);
  CHECK_CONTAINS(ddplug_last_error(), "run-once 'forged' (scope global): the recorded outcome is malformed");
  CHECK_OK(ddplug_close(ctx));
}

TEST(bad_arguments_are_refused) {
  CHECK_EQ_INT(dt_run_ranks(1, rank_bad_args, NULL, NULL, 30, NULL), 0);
}

/* ---- a live runner is waited for ------------------------------------------ */

/* The collective timeout is 1 s and the work takes 3: with the default
 * (timeouts.run_once_s = 0) the waiter waits as long as the runner beats. */
static void rank_long_work(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  ddplug_context *ctx = open_ctx("1");
  work w = {rank, 3000, DDPLUG_OK, "downloaded"};
  char *msg = NULL;
  CHECK_OK(ddplug_run_once(ctx, "download", DDPLUG_SCOPE_GLOBAL, do_work, &w,
                           DDPLUG_TIMEOUT_DEFAULT, &msg));
  CHECK_EQ_STR(msg, "downloaded");
  ddplug_free(msg);
  CHECK_EQ_INT(count_calls(), 1);
  /* together into close, whose wait for the other rank is the 1 s timeout */
  CHECK_OK(ddplug_barrier(ctx, 20000));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(a_live_runner_is_waited_for_past_the_collective_timeout, 60) {
  g_calls = dt_temp_file(".calls", "");
  CHECK_EQ_INT(dt_run_ranks(2, rank_long_work, NULL, NULL, 45, NULL), 0);
}

/* timeouts.run_once_s = 0.5 with work that lasts until the waiter has
 * given up (store keys order it: the waiter begins once the runner has
 * begun, so it sees the runner's heartbeat; the runner ends once the waiter
 * timed out): the waiter gives up, naming the key and saying that the
 * runner is alive. */
static void rank_configured_limit(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  ddplug_context *ctx = open_ctx_with("60", "0.5");
  ddplug_store *st = ddplug_context_store(ctx);
  int runner = -1;
  char *msg = NULL;
  void *v = NULL;
  uint64_t len = 0;
  if (rank == 0) {
    CHECK_OK(ddplug_run_once_begin(ctx, "prep", DDPLUG_SCOPE_GLOBAL, DDPLUG_TIMEOUT_DEFAULT,
                                   &runner, &msg));
    CHECK_EQ_INT(runner, 1);
    CHECK_OK(ddplug_store_set(st, "user/test/begun", "1", 1));
    CHECK_OK(ddplug_store_get(st, "user/test/timed-out", 60000, &v, &len));
    ddplug_free(v);
    CHECK_OK(ddplug_run_once_end(ctx, "prep", DDPLUG_SCOPE_GLOBAL, DDPLUG_OK, "x"));
  } else {
    CHECK_OK(ddplug_store_get(st, "user/test/begun", 60000, &v, &len));
    ddplug_free(v);
    CHECK_STATUS(ddplug_run_once_begin(ctx, "prep", DDPLUG_SCOPE_GLOBAL, DDPLUG_TIMEOUT_DEFAULT,
                                       &runner, &msg),
                 DDPLUG_E_TIMEOUT);
    /* the limit, not how long the wait took (a loaded machine takes longer) */
    CHECK_CONTAINS(ddplug_last_error(), "run-once 'prep' (scope global): no outcome from its "
                                        "runner, rank 0, after ");
    CHECK_CONTAINS(ddplug_last_error(), " s (timeouts.run_once_s = 0.5 in test); the runner is "
                                        "alive and still working");
    CHECK_OK(ddplug_store_set(st, "user/test/timed-out", "1", 1));
  }
  CHECK_OK(ddplug_barrier(ctx, 20000));
  CHECK_OK(ddplug_close(ctx));
}

TEST_T(a_configured_limit_is_named_in_the_timeout, 60) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_configured_limit, NULL, NULL, 45, NULL), 0);
}

/* A runner that stops (SIGSTOP: alive, connected, silent) is given up on
 * about 5 s after its last heartbeat, well before the 60 s limit. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int stop_work(void *user, char **message) {
  ddplug_store *st = user;
  (void)message;
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
  if (ddplug_store_set(st, "user/test/pid", pid, (uint64_t)n) != DDPLUG_OK) _exit(8);
  raise(SIGSTOP);
  _exit(7); /* not reached: the waiter kills it */
}

static void rank_stops(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  set_node(rank);
  ddplug_context *ctx = open_ctx("60");
  ddplug_store *store = ddplug_context_store(ctx);
  if (rank == 2) ddplug_run_once(ctx, "hang", DDPLUG_SCOPE_NODE, stop_work, store, 60000, NULL);
  if (rank == 3) {
    work w = {rank, 0, DDPLUG_OK, ""};
    double t0 = now_s();
    CHECK_STATUS(ddplug_run_once(ctx, "hang", DDPLUG_SCOPE_NODE, do_work, &w, 60000, NULL),
                 DDPLUG_E_PEER_LOST);
    double waited = now_s() - t0;
    CHECK_CONTAINS(ddplug_last_error(), "its runner, local rank 0 of node 1, stopped "
                                        "heartbeating");
    /* Not before the runner was silent for 5 s (load can only make the
     * wait longer, never shorter); that it was the heartbeat, not the 60 s
     * limit, is what the sentence above says. */
    CHECK_MSG(waited > 4.0, "gave up after %.1f s", waited);
    void *v = NULL;
    uint64_t len = 0;
    CHECK_OK(ddplug_store_get(store, "user/test/pid", 1000, &v, &len));
    kill((pid_t)atoi(v), SIGKILL);
    ddplug_free(v);
  }
  ddplug_close(ctx);
}

TEST_T(a_runner_that_stops_heartbeating_is_given_up_on, 90) {
  int statuses[4];
  dt_run_ranks(4, rank_stops, NULL, NULL, 60, statuses);
  CHECK(WIFSIGNALED(statuses[2]) && WTERMSIG(statuses[2]) == SIGKILL);
  CHECK_MSG(WIFEXITED(statuses[3]) && WEXITSTATUS(statuses[3]) == 0, "rank 3 failed");
}

/* ---- a waiter that arrives after the runner's failure ended the run ------- */

/* Rank 0's work fails and rank 0 then ends the run (as Lightning's
 * on_exception does); rank 1 reaches its run_once only after it learnt
 * that the run ended: it gets the work's failure, the cause, as a rank
 * already waiting would, not only ABORTED. */
static void rank_late_after_failure(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  ddplug_context *ctx = open_ctx("30");
  ddplug_store *store = ddplug_context_store(ctx);
  work w = {rank, 0, DDPLUG_E_NOT_FOUND, "mirror https://example.invalid/data.tar is unreachable"};
  char *msg = NULL;
  if (rank == 0) {
    CHECK_STATUS(ddplug_run_once(ctx, "prep", DDPLUG_SCOPE_GLOBAL, do_work, &w, 60000, &msg),
                 DDPLUG_E_NOT_FOUND);
    CHECK_OK(ddplug_abort(ctx, "prepare_data failed on rank 0"));
    CHECK_OK(ddplug_store_set(store, "user/test/aborted", "1", 1));
  } else {
    void *v = NULL;
    CHECK_OK(ddplug_store_get(store, "user/test/aborted", 60000, &v, NULL));
    ddplug_free(v);
    /* this rank's context knows the run ended (its next call says so) */
    CHECK_STATUS(ddplug_barrier(ctx, 20000), DDPLUG_E_ABORTED);
    CHECK_STATUS(ddplug_run_once(ctx, "prep", DDPLUG_SCOPE_GLOBAL, do_work, &w, 60000, &msg),
                 DDPLUG_E_NOT_FOUND);
    CHECK_CONTAINS(ddplug_last_error(), "run-once 'prep' (scope global) failed on its runner, rank 0");
    CHECK_CONTAINS(msg, "example.invalid");
    CHECK_EQ_INT(count_calls(), 1); /* rank 0's only */
    /* a name nobody ran: the run's own status */
    CHECK_STATUS(ddplug_run_once(ctx, "other", DDPLUG_SCOPE_GLOBAL, do_work, &w, 60000, NULL),
                 DDPLUG_E_ABORTED);
    CHECK_CONTAINS(ddplug_last_error(), "prepare_data failed on rank 0");
  }
  ddplug_free(msg);
  ddplug_close(ctx);
}

TEST_T(a_waiter_arriving_after_the_runners_failure_ended_the_run_gets_that_failure, 60) {
  g_calls = dt_temp_file(".calls", "");
  CHECK_EQ_INT(dt_run_ranks(2, rank_late_after_failure, NULL, NULL, 45, NULL), 0);
}

/* ---- the runner dies ---------------------------------------------------- */

static int die_work(void *user, char **message) {
  (void)user;
  (void)message;
  _exit(9);
}

static void rank_dies(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  set_node(rank);
  ddplug_context *ctx = open_ctx("10");
  ddplug_store *store = ddplug_context_store(ctx);
  if (rank == 2) {
    /* node 0 finishes its own run first: rank 2's death ends the run, and a
     * node-0 rank still inside its run_once would (rightly) see PEER_LOST */
    const char *node0[] = {"user/test/node0-done-0", "user/test/node0-done-1"};
    CHECK_OK(ddplug_store_wait(store, node0, 2, 60000));
    ddplug_run_once(ctx, "doomed", DDPLUG_SCOPE_NODE, die_work, NULL, 20000, NULL);
    CHECK(!"not reached");
  }
  work w = {rank, 0, DDPLUG_OK, "fine"};
  char *msg = NULL;
  /* PEER_LOST (not TIMEOUT after 60 s): the runner's disconnect woke the waiter */
  int st = ddplug_run_once(ctx, "doomed", DDPLUG_SCOPE_NODE, do_work, &w, 60000, &msg);
  if (rank == 3) {
    CHECK_STATUS(st, DDPLUG_E_PEER_LOST);
    /* its own record ("its runner, rank 2, disconnected before it finished") or
     * the runtime's ("rank 2 (pid ...) exited or was killed"), whichever first */
    const char *e = ddplug_last_error();
    CHECK_CONTAINS(e, "rank 2");
    CHECK_MSG(strstr(e, "disconnected before it finished") || strstr(e, "exited or was killed"), "%s", e);
  } else {
    CHECK_OK(st);
    char key[64];
    snprintf(key, sizeof key, "user/test/node0-done-%d", rank);
    CHECK_OK(ddplug_store_set(store, key, "1", 1));
  }
  ddplug_free(msg);
  /* end together once rank 3 has checked (an abort before would wake it with
   * ABORTED instead) */
  if (rank == 3) {
    CHECK_OK(ddplug_store_set(store, "user/test/rank3-checked", "1", 1));
  } else {
    void *v = NULL;
    uint64_t len = 0;
    CHECK_OK(ddplug_store_get(store, "user/test/rank3-checked", 60000, &v, &len));
    ddplug_free(v);
  }
  ddplug_close(ctx);
}

TEST_T(a_dying_runner_wakes_its_node, 150) {
  g_calls = dt_temp_file(".calls", "");
  int statuses[4];
  dt_run_ranks(4, rank_dies, NULL, NULL, 120, statuses);
  for (int r = 0; r < 4; r++) {
    if (r == 2)
      CHECK(WIFEXITED(statuses[r]) && WEXITSTATUS(statuses[r]) == 9);
    else
      CHECK_MSG(WIFEXITED(statuses[r]) && WEXITSTATUS(statuses[r]) == 0, "rank %d failed", r);
  }
}
