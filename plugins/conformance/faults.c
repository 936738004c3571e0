/* faults.c — what must happen when things go wrong:
 *   abort from another thread ends a blocked collective, and reaches the
 *     other ranks with its reason;
 *   a rank killed (SIGKILL) while the others wait in a collective, or while
 *     it is inside a collective itself, gives PEER_LOST naming it;
 *   mismatched collectives give MISMATCH on every rank, and the run goes on
 *     (where the plugin declares DDPLUG_CAP_MISMATCH_CHECK);
 *   a rank whose group_create fails (or that dies there) ends the others'
 *     ddplug_open promptly, naming it — the early-return contract of the
 *     host services' store calls (plugin.h).
 * "Promptly" is within a third of the collective timeout these scenarios
 * set (-t, default 40 s): a plugin that waits out its own timeout fails. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "ddplug/store.h"

#define FAULT_TIMEOUT_S (r->plan->fault_timeout_s)
#define PROMPT_S ((double)r->plan->fault_timeout_s / 3.0)
#define COUNT 1031

/* See conformance.h. */
int cf_first_dtype(const ddplug_plugin_info *in) {
  if (in->dtype_mask & DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32)) return DDPLUG_FLOAT32;
  for (int d = 1; d < DDPLUG_DTYPE_COUNT_; d++)
    if (in->dtype_mask & DDPLUG_DTYPE_BIT(d)) return d;
  return 0;
}

static int first_op(const ddplug_plugin_info *in, int dt) {
  if ((in->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_SUM))) return DDPLUG_OP_SUM;
  for (int o = 1; o < DDPLUG_OP_COUNT_; o++)
    if ((in->op_mask & DDPLUG_OP_BIT(o)) && cf_op_valid(dt, o)) return o;
  return 0;
}

/* A checked allreduce with the suite's values. */
static int allreduce(cf_rank *r, ddplug_context *ctx, char *why, size_t cap) {
  int dt = cf_first_dtype(&r->plan->info);
  return cf_coll_once(ctx, r->rank, r->world, DDPLUG_COLL_ALLREDUCE, dt,
                      first_op(&r->plan->info, dt), 0, COUNT, 0, why, cap);
}

/* See conformance.h. */
int cf_mentions_rank(const char *text, int rank) {
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d", rank);
  const char *p = text;
  while ((p = strstr(p, needle)) != NULL) {
    char next = p[strlen(needle)];
    if (next < '0' || next > '9') return 1;
    p++;
  }
  return 0;
}

/* See conformance.h. */
int cf_launcher_took_the_store(const cf_rank *r, const char *err, int victim) {
  return r->plan->launched && victim != 0 && !cf_mentions_rank(err, victim) &&
         cf_mentions_rank(err, 0) && strstr(err, "store") != NULL;
}

static int open_or_report(cf_rank *r, const char *id, ddplug_context **ctx) {
  int s = cf_open(r, NULL, FAULT_TIMEOUT_S, NULL, ctx);
  if (s != DDPLUG_OK)
    cf_report(r, id, CF_BIT(group_create), CF_FAIL, "the scenario's group is created", "%s: %s",
              ddplug_status_name(s), ddplug_last_error());
  return s;
}

/* See conformance.h. */
int cf_need_host_memory(cf_rank *r, const char *id, const char *title) {
  if (r->plan->info.caps & DDPLUG_CAP_HOST_MEMORY) return 1;
  cf_report(r, id, 0, CF_SKIP, title,
            "the plugin takes device buffers only; this suite passes host buffers");
  return 0;
}

/* Wait (in the store, up to a hang guard) until the run's failure is on
 * record: ddplug/abort, written by the rank that aborted or, for a rank
 * that died, by the store when its connection dropped. */
static int wait_for_the_run_to_end(ddplug_context *ctx) {
  const char *keys[1] = {"ddplug/abort"};
  return ddplug_store_wait(ddplug_context_store(ctx), keys, 1, 10 * 60 * 1000);
}

/* After its warm-up each rank says so in the scenario's store, and the
 * rank about to end the run (an abort, its death) first waits until every
 * rank has: else a slow rank's warm-up, not the call under test, is what
 * the end of the run fails. */
static void warmed_up(const cf_rank *r, ddplug_context *ctx) {
  char key[32];
  snprintf(key, sizeof key, "user/warm/%d", r->rank);
  (void)ddplug_store_set(ddplug_context_store(ctx), key, "1", 1);
}

static void every_rank_warmed_up(const cf_rank *r, ddplug_context *ctx) {
  warmed_up(r, ctx);
  char(*names)[32] = calloc((size_t)r->world, sizeof *names);
  const char **keys = calloc((size_t)r->world, sizeof *keys);
  if (names && keys) {
    for (int i = 0; i < r->world; i++) {
      snprintf(names[i], sizeof names[i], "user/warm/%d", i);
      keys[i] = names[i];
    }
    (void)ddplug_store_wait(ddplug_context_store(ctx), keys, (uint32_t)r->world,
                            10 * 60 * 1000);
  }
  free(names);
  free(keys);
}

/* ---- abort from another thread ------------------------------------------- */

#define ABORT_REASON "ddplug conformance: abort from another thread"

typedef struct aborter {
  ddplug_context *ctx;
  double at;
} aborter;

#define ABORTED_KEY "user/aborted"

/* The abort, then a word to the other ranks once ddplug_abort returned: by
 * then the plugin was told (group_abort). The run's record (ddplug/abort)
 * is written before that, so a rank that joined the blocked collective on
 * seeing the record alone could complete it first. */
static void *abort_later(void *arg) {
  aborter *a = arg;
  cf_sleep_ms(300);
  a->at = cf_now();
  ddplug_abort(a->ctx, ABORT_REASON);
  (void)ddplug_store_set(ddplug_context_store(a->ctx), ABORTED_KEY, "1", 1);
  return NULL;
}

/* Rank 0's word that its abort is done (abort_later). */
static int wait_for_the_abort(ddplug_context *ctx) {
  const char *keys[1] = {ABORTED_KEY};
  return ddplug_store_wait(ddplug_context_store(ctx), keys, 1, 10 * 60 * 1000);
}

void cf_abort_rank(cf_rank *r) {
  const char *T_LOCAL = "abort from another thread ends a blocked collective";
  const char *T_REMOTE = "an abort on one rank fails the others' calls, with its reason";
  if (!cf_need_host_memory(r, "abort.local", T_LOCAL)) return;
  if (!(r->plan->info.caps & DDPLUG_CAP_ABORT) || r->world < 2) {
    const char *why = r->world < 2 ? "needs 2 ranks (-n)"
                                   : "the plugin does not declare DDPLUG_CAP_ABORT (group_abort "
                                     "interrupts operations): a blocked collective runs to its "
                                     "timeout";
    cf_report(r, "abort.local", 0, CF_SKIP, T_LOCAL, "%s", why);
    cf_report(r, "abort.remote", 0, CF_SKIP, T_REMOTE, "%s", why);
    return;
  }
  ddplug_context *ctx;
  if (open_or_report(r, "abort.open", &ctx)) return;
  char why[1024] = "";
  int s = allreduce(r, ctx, why, sizeof why);
  uint64_t slots = CF_BIT(group_abort) | CF_COLL_SLOTS;
  if (s) {
    cf_report(r, "abort.warmup", CF_COLL_SLOTS, CF_FAIL, "a first allreduce", "%s", why);
    warmed_up(r, ctx); /* done with it, failed: rank 0 must not wait for it */
  } else if (r->rank == 0) {
    every_rank_warmed_up(r, ctx);
    aborter a = {ctx, 0};
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &a);
    s = allreduce(r, ctx, why, sizeof why); /* nobody else joins */
    double after = cf_now() - a.at;
    pthread_join(th, NULL);
    if (s != DDPLUG_E_ABORTED && s != DDPLUG_E_PEER_LOST)
      cf_report(r, "abort.local", slots, CF_FAIL, T_LOCAL,
                "the blocked allreduce returned %s, expected ABORTED: %s", ddplug_status_name(s),
                why);
    else if (after > PROMPT_S)
      cf_report(r, "abort.local", slots, CF_FAIL, T_LOCAL,
                "the blocked allreduce returned %.1f s after ddplug_abort (the collective "
                "timeout is %d s): group_abort must make blocked calls return promptly",
                after, FAULT_TIMEOUT_S);
    else
      cf_report(r, "abort.local", slots, CF_PASS, T_LOCAL, "%s %.2f s after ddplug_abort",
                ddplug_status_name(s), after);
  } else {
    warmed_up(r, ctx);
    /* after rank 0's abort (its word in the store), not after a sleep:
     * joined earlier, this allreduce would complete rank 0's */
    s = wait_for_the_abort(ctx);
    double t0 = cf_now();
    if (s == DDPLUG_OK) s = allreduce(r, ctx, why, sizeof why);
    if (s == DDPLUG_OK) {
      /* This rank's context had not yet heard of the abort (its watcher
       * reads the record on a connection of its own) and the plugin
       * finished the collective from what rank 0 had put in before it
       * aborted (allreduce checked the values). The next call waits for
       * rank 0, so it must meet the abort. */
      t0 = cf_now();
      s = allreduce(r, ctx, why, sizeof why);
    }
    double took = cf_now() - t0;
    if (s != DDPLUG_E_ABORTED)
      cf_report(r, "abort.remote", slots, CF_FAIL, T_REMOTE,
                "an allreduce after rank 0 aborted returned %s, expected ABORTED%s%s",
                ddplug_status_name(s), s ? ": " : "", s ? why : "");
    else if (!strstr(cf_error(ctx), ABORT_REASON))
      cf_report(r, "abort.remote", slots, CF_FAIL, T_REMOTE,
                "the error does not carry rank 0's reason: %s", cf_error(ctx));
    else if (took > PROMPT_S)
      cf_report(r, "abort.remote", slots, CF_FAIL, T_REMOTE, "it took %.1f s", took);
    else
      cf_report(r, "abort.remote", slots, CF_PASS, T_REMOTE, "ABORTED after %.2f s", took);
  }
  ddplug_close(ctx);
}

/* ---- a killed rank ----------------------------------------------------- */

static void *kill_later(void *arg) {
  cf_sleep_ms(*(int *)arg);
  raise(SIGKILL);
  return NULL;
}

static void survivor(cf_rank *r, ddplug_context *ctx, const char *id, const char *title,
                     int after_the_death) {
  char why[1024] = "";
  int victim = r->world - 1;
  /* A victim killed inside its own collective: join it only once the death
   * is on record (the store publishes it when the victim's connection
   * drops), else this allreduce could complete the victim's first. */
  int s = after_the_death ? wait_for_the_run_to_end(ctx) : DDPLUG_OK;
  double t0 = cf_now();
  if (s == DDPLUG_OK) s = allreduce(r, ctx, why, sizeof why);
  if (s == DDPLUG_OK && after_the_death) {
    /* The victim had put in all of its share before it died, and the plugin
     * finished the collective from it (allreduce checked the values): no
     * data was lost. The next call must find the death. */
    t0 = cf_now();
    s = allreduce(r, ctx, why, sizeof why);
  }
  double took = cf_now() - t0;
  uint64_t slots = CF_COLL_SLOTS;
  if (s != DDPLUG_E_PEER_LOST)
    cf_report(r, id, slots, CF_FAIL, title, "the allreduce returned %s, expected PEER_LOST%s%s",
              ddplug_status_name(s), s ? ": " : "", s ? why : "");
  else if (cf_launcher_took_the_store(r, cf_error(ctx), victim))
    cf_report(r, id, slots, CF_SKIP, title, CF_LAUNCHER_TOOK_THE_STORE, victim, cf_error(ctx));
  else if (!cf_mentions_rank(cf_error(ctx), victim))
    cf_report(r, id, slots, CF_FAIL, title, "PEER_LOST does not name rank %d: %s", victim,
              cf_error(ctx));
  else if (took > PROMPT_S)
    cf_report(r, id, slots, CF_FAIL, title,
              "PEER_LOST came %.1f s after the call (the collective timeout is %d s)", took,
              FAULT_TIMEOUT_S);
  else {
    /* Later calls fail at once with the same status. */
    double t1 = cf_now();
    int again = allreduce(r, ctx, why, sizeof why);
    if (again != DDPLUG_E_PEER_LOST || cf_now() - t1 > PROMPT_S)
      cf_report(r, id, slots, CF_FAIL, title,
                "the next call returned %s after %.1f s: after a peer is lost every call "
                "fails at once with PEER_LOST", ddplug_status_name(again), cf_now() - t1);
    else
      cf_report(r, id, slots, CF_PASS, title, "PEER_LOST naming rank %d after %.2f s", victim,
                took);
  }
}

static void killed(cf_rank *r, const char *id, const char *title, int inside) {
  if (!cf_need_host_memory(r, id, title)) return;
  if (r->world < 2) {
    cf_report(r, id, 0, CF_SKIP, title, "needs 2 ranks (-n)");
    return;
  }
  ddplug_context *ctx;
  if (open_or_report(r, "peer.open", &ctx)) return;
  char why[1024] = "";
  if (allreduce(r, ctx, why, sizeof why)) {
    cf_report(r, "peer.warmup", CF_COLL_SLOTS, CF_FAIL, "a first allreduce", "%s", why);
    warmed_up(r, ctx); /* done with it, failed: the victim must not wait for it */
    ddplug_close(ctx);
    return;
  }
  if (r->rank == r->world - 1) {
    every_rank_warmed_up(r, ctx);
    if (!inside) {
      cf_sleep_ms(300); /* the others are waiting in the allreduce now */
      raise(SIGKILL);
    }
    /* Inside a collective of its own (the others come later): killed from
     * a second thread while this one is blocked in the call. */
    static int delay = 250;
    pthread_t th;
    pthread_create(&th, NULL, kill_later, &delay);
    allreduce(r, ctx, why, sizeof why);
    raise(SIGKILL);
  }
  warmed_up(r, ctx);
  survivor(r, ctx, id, title, inside);
  ddplug_close(ctx);
}

void cf_killed_waiting_rank(cf_rank *r) {
  killed(r, "peer.waiting", "a rank killed while the others wait in a collective: PEER_LOST naming it", 0);
}

void cf_killed_inside_rank(cf_rank *r) {
  killed(r, "peer.inside", "a rank killed inside its own collective: PEER_LOST naming it", 1);
}

/* ---- mismatched collectives -------------------------------------------- */

typedef struct mm_case {
  const char *id, *title;
} mm_case;

/* Rank 0 and the others issue different calls for case c. */
static int mismatched(cf_rank *r, ddplug_context *ctx, int c, int dt, int dt2, int op, int op2) {
  size_t es = 8;
  char *send = calloc(64, es), *recv = calloc(64 * (size_t)r->world, es);
  int first = r->rank == 0, s;
  switch (c) {
    case 0: /* count */
      s = ddplug_allreduce(ctx, send, recv, first ? 16 : 32, dt, op, NULL);
      break;
    case 1: /* dtype */
      s = ddplug_allreduce(ctx, send, recv, 16, first ? dt : dt2, op, NULL);
      break;
    case 2: /* op */
      s = ddplug_allreduce(ctx, send, recv, 16, dt, first ? op : op2, NULL);
      break;
    case 3: /* kind */
      s = first ? ddplug_allreduce(ctx, send, recv, 16, dt, op, NULL)
                : ddplug_broadcast(ctx, send, recv, 16, dt, 0, NULL);
      break;
    default: /* root */
      s = ddplug_broadcast(ctx, send, recv, 16, dt, first ? 0 : r->world - 1, NULL);
      break;
  }
  free(send);
  free(recv);
  return s;
}

void cf_mismatch_rank(cf_rank *r) {
  static const mm_case cases[] = {
      {"mismatch.count", "mismatch: count differs: MISMATCH on every rank, the run goes on"},
      {"mismatch.dtype", "mismatch: dtype differs: MISMATCH on every rank, the run goes on"},
      {"mismatch.op", "mismatch: op differs: MISMATCH on every rank, the run goes on"},
      {"mismatch.kind", "mismatch: allreduce against broadcast: MISMATCH on every rank, the run goes on"},
      {"mismatch.root", "mismatch: broadcast roots differ: MISMATCH on every rank, the run goes on"},
  };
  const int n = (int)(sizeof cases / sizeof cases[0]);
  const ddplug_plugin_info *in = &r->plan->info;
  if (!cf_need_host_memory(r, cases[0].id, cases[0].title)) return;
  if (!(in->caps & DDPLUG_CAP_MISMATCH_CHECK) || r->world < 2) {
    for (int c = 0; c < n; c++)
      cf_report(r, cases[c].id, 0, CF_SKIP, cases[c].title, "%s",
                r->world < 2 ? "needs 2 ranks (-n)"
                             : "the plugin does not declare DDPLUG_CAP_MISMATCH_CHECK");
    return;
  }
  int dt = cf_first_dtype(in), op = first_op(in, dt), dt2 = 0, op2 = 0;
  for (int d = 1; d < DDPLUG_DTYPE_COUNT_ && !dt2; d++)
    if (d != dt && (in->dtype_mask & DDPLUG_DTYPE_BIT(d)) && cf_op_valid(d, op)) dt2 = d;
  for (int o = 1; o < DDPLUG_OP_COUNT_ && !op2; o++)
    if (o != op && (in->op_mask & DDPLUG_OP_BIT(o)) && cf_op_valid(dt, o)) op2 = o;
  ddplug_context *ctx;
  if (open_or_report(r, "mismatch.open", &ctx)) return;
  int dead = 0;
  for (int c = 0; c < n; c++) {
    if ((c == 1 && !dt2) || (c == 2 && !op2)) {
      cf_report(r, cases[c].id, 0, CF_SKIP, cases[c].title, "the plugin advertises one %s only",
                c == 1 ? "dtype" : "op");
      continue;
    }
    if (dead) continue;
    double t0 = cf_now();
    int s = mismatched(r, ctx, c, dt, dt2, op, op2);
    double took = cf_now() - t0;
    char why[1024] = "";
    if (s != DDPLUG_E_MISMATCH) {
      cf_report(r, cases[c].id, CF_COLL_SLOTS, CF_FAIL, cases[c].title, "returned %s%s%s",
                ddplug_status_name(s), s ? ": " : "", s ? cf_error(ctx) : " (garbage, or a hang "
                "avoided only by luck)");
      dead = s != DDPLUG_OK;
      continue;
    }
    if (took > PROMPT_S) {
      cf_report(r, cases[c].id, CF_COLL_SLOTS, CF_FAIL, cases[c].title,
                "MISMATCH after %.1f s", took);
      continue;
    }
    s = allreduce(r, ctx, why, sizeof why);
    if (s) {
      cf_report(r, cases[c].id, CF_COLL_SLOTS, CF_FAIL, cases[c].title,
                "MISMATCH, but the next matching allreduce failed: %s", why);
      dead = s > 0;
    } else {
      cf_report(r, cases[c].id, CF_COLL_SLOTS, CF_PASS, cases[c].title, "MISMATCH after %.2f s",
                took);
    }
  }
  ddplug_close(ctx);
}

/* ---- failure in group_create -------------------------------------------- */

static void create_fault(cf_rank *r, const char *mode, const char *id, const char *title) {
  if (!*r->plan->shim) {
    cf_report(r, id, 0, CF_SKIP, title,
              "the fault wrapper plugin (" CF_SHIM_FILE ") was not found beside libddplug");
    return;
  }
  if (r->world < 2) {
    cf_report(r, id, 0, CF_SKIP, title, "needs 2 ranks (-n)");
    return;
  }
  int victim = r->world - 1;
  ddplug_context *ctx = NULL;
  if (r->rank == victim) {
    setenv(CF_WRAP_ENV, r->plan->path, 1);
    setenv(CF_FAULT_ENV, mode, 1);
    if (cf_open(r, r->plan->shim, FAULT_TIMEOUT_S, NULL, &ctx) == DDPLUG_OK) {
      cf_report(r, id, 0, CF_FAIL, title, "the wrapped group_create did not fail on rank %d",
                victim);
      ddplug_close(ctx);
    }
    return;
  }
  double t0 = cf_now();
  int s = cf_open(r, NULL, FAULT_TIMEOUT_S, NULL, &ctx);
  double took = cf_now() - t0;
  char err[1024];
  snprintf(err, sizeof err, "%s", ddplug_last_error());
  if (s == DDPLUG_OK) {
    cf_report(r, id, CF_BIT(group_create), CF_FAIL, title,
              "ddplug_open succeeded although rank %d's group_create failed", victim);
    ddplug_close(ctx);
  } else if (took > PROMPT_S) {
    cf_report(r, id, CF_BIT(group_create), CF_FAIL, title,
              "ddplug_open returned %s only after %.1f s (the collective timeout is %d s): "
              "group_create must end its waits when a store call returns early "
              "(docs/writing-a-backend.md): %s", ddplug_status_name(s), took, FAULT_TIMEOUT_S, err);
  } else if (cf_launcher_took_the_store(r, err, victim)) {
    cf_report(r, id, 0, CF_SKIP, title, CF_LAUNCHER_TOOK_THE_STORE, victim, err);
  } else if (!cf_mentions_rank(err, victim)) {
    cf_report(r, id, CF_BIT(group_create), CF_FAIL, title,
              "the error does not name rank %d: %s", victim, err);
  } else {
    cf_report(r, id, CF_BIT(group_create), CF_PASS, title, "%s after %.2f s",
              ddplug_status_name(s), took);
  }
}

void cf_create_fails_rank(cf_rank *r) {
  create_fault(r, "fail", "create.fails",
               "a rank whose group_create fails ends the others' ddplug_open promptly");
}

void cf_create_dies_rank(cf_rank *r) {
  create_fault(r, "die", "create.dies",
               "a rank that dies in group_create ends the others' ddplug_open promptly");
}
