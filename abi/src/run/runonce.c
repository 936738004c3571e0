/* runonce.c — run-once: one process per scope does the work, the others
 * wait for its outcome through the rendezvous store (ddplug.h, "Run once").
 *
 * Store keys (the runtime's "ddplug/" prefix; "user/" is the host's):
 *   ddplug/runonce/<scope>/<name>        the outcome: "<status>\n<rank>\n<message>"
 *   ddplug/runonce/<scope>/<name>/beat   the runner's heartbeat counter
 * where <scope> is "global" or "node<index>". The runner registers the
 * outcome key with ddplug_store_on_disconnect carrying a PEER_LOST outcome,
 * so a runner that dies without ending sets it (if absent) and the waiters
 * wake up with PEER_LOST at once. While it works, a thread of the runner adds
 * 1 to the beat key every BEAT_MS: waiters wait as long as it keeps beating
 * (no limit by default: config timeouts.run_once_s = 0), and give up with
 * PEER_LOST when it stops for STALE_MS (a hung host, or one cut off from the
 * store without its connection closing). Waiters wait in slices
 * (ddplug__wait_keys) that also notice an abort of the run and keep the
 * context's shared store connection free for other calls between slices.
 *
 * Processes remember which run-once they are running (ctx, scope, name, and
 * the heartbeat thread) in a small mutex-protected list, so that end can
 * refuse a caller that is not the runner, and close can stop the beats of a
 * run-once that never ended.
 *
 * SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run/context.h"
#include "store/store.h"

#define RUNONCE_NAME_MAX 160
#define RUNONCE_MESSAGE_MAX (512u * 1024u)
#define RUNONCE_KEY_MAX 255
#define BEAT_MS 500    /* the runner's heartbeat period                  */
#define STALE_MS 5000  /* a runner silent this long is taken for dead    */
#define SLICE_MS 1000  /* how often a waiter looks at the heartbeat      */

typedef struct open_once {
  struct open_once *next;
  const ddplug_context *ctx;
  ddplug_store *store;
  int scope;
  char key[RUNONCE_KEY_MAX + 1];
  pthread_t beat;
  int beating;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
} open_once;

static pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;
static open_once *g_open;

/* 1 if name is 1..RUNONCE_NAME_MAX printable ASCII characters, no spaces. */
static int name_ok(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > RUNONCE_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (name[i] < 0x21 || name[i] > 0x7e) return 0;
  return 1;
}

/* Validate the arguments shared by begin and end; fill the world, the
 * outcome key and a description ("run-once 'x' (scope node 1)"). */
static int prepare(ddplug_context *ctx, const char *name, int scope,
                   const char *what, ddplug_world *w, char *key,
                   char *desc, size_t desc_cap) {
  if (!ctx) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx is NULL", what);
  if (!name || !name_ok(name))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: run-once name '%s' must be 1 to %d printable ASCII "
                       "characters without spaces",
                       what, name ? name : "(null)", RUNONCE_NAME_MAX);
  if (scope != DDPLUG_SCOPE_GLOBAL && scope != DDPLUG_SCOPE_NODE)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: run-once '%s': scope %d is neither "
                       "DDPLUG_SCOPE_GLOBAL (1) nor DDPLUG_SCOPE_NODE (2)",
                       what, name, scope);
  int st = ddplug_context_world(ctx, w);
  if (st) return ddplug__err_prefix(st, "%s: run-once '%s'", what, name);
  if (scope == DDPLUG_SCOPE_GLOBAL) {
    snprintf(key, RUNONCE_KEY_MAX + 1, "ddplug/runonce/global/%s", name);
    snprintf(desc, desc_cap, "run-once '%s' (scope global)", name);
  } else {
    snprintf(key, RUNONCE_KEY_MAX + 1, "ddplug/runonce/node%d/%s", w->node_rank,
             name);
    snprintf(desc, desc_cap, "run-once '%s' (scope node %d)", name,
             w->node_rank);
  }
  return DDPLUG_OK;
}

static int is_runner(const ddplug_world *w, int scope) {
  return scope == DDPLUG_SCOPE_GLOBAL ? w->rank == 0 : w->local_rank == 0;
}

/* Build "<status>\n<rank>\n<message>" (message cut to the limit). */
static char *encode_outcome(int status, int rank, const char *message,
                            size_t *len) {
  size_t mlen = message ? strlen(message) : 0;
  static const char cut[] = "\n... (message cut: longer than 512 KiB)";
  int truncated = mlen > RUNONCE_MESSAGE_MAX;
  if (truncated) mlen = RUNONCE_MESSAGE_MAX;
  char head[48];
  int h = snprintf(head, sizeof head, "%d\n%d\n", status, rank);
  size_t total = (size_t)h + mlen + (truncated ? sizeof cut - 1 : 0);
  char *out = ddplug__malloc(total + 1);
  if (!out) return NULL;
  memcpy(out, head, (size_t)h);
  if (mlen) memcpy(out + h, message, mlen);
  if (truncated) memcpy(out + h + mlen, cut, sizeof cut - 1);
  out[total] = '\0';
  *len = total;
  return out;
}

/* Parse an outcome value; *msg points into value. 0 on success. */
static int decode_outcome(const char *value, int *status, int *rank,
                          const char **msg) {
  char *end;
  long s = strtol(value, &end, 10);
  if (end == value || *end != '\n') return -1;
  const char *p = end + 1;
  long r = strtol(p, &end, 10);
  if (end == p || *end != '\n') return -1;
  *status = (int)s;
  *rank = (int)r;
  *msg = end + 1;
  return 0;
}

/* The waiter's limit in ms (-1: none while the runner lives) and what set
 * it, for the TIMEOUT message. */
static int waiter_timeout(ddplug_context *ctx, int64_t timeout_ms, int64_t *out,
                          char *by, size_t cap) {
  if (timeout_ms >= 0) {
    *out = timeout_ms;
    snprintf(by, cap, "the timeout the caller passed, %.1f s", (double)timeout_ms / 1000.0);
    return DDPLUG_OK;
  }
  if (timeout_ms != DDPLUG_TIMEOUT_DEFAULT)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "run-once: timeout %lld ms is negative (use "
                       "DDPLUG_TIMEOUT_DEFAULT for the configured one)",
                       (long long)timeout_ms);
  double s = 0.0;
  const ddplug_config *cfg = ddplug_context_config(ctx);
  if (cfg) (void)ddplug_config_get_double(cfg, "timeouts.run_once_s", &s);
  *out = s > 0 ? (int64_t)(s * 1000.0) : -1;
  snprintf(by, cap, "timeouts.run_once_s = %g in %s", s,
           cfg ? ddplug_config_origin(cfg) : "the defaults");
  return DDPLUG_OK;
}

/* Hand a recorded outcome to the caller. */
static int deliver(const char *value, const char *desc, char **message) {
  int status, rank;
  const char *msg;
  if (decode_outcome(value, &status, &rank, &msg) != 0 || status < 0 ||
      status >= DDPLUG_STATUS_COUNT_)
    return ddplug__err(DDPLUG_E_INTERNAL,
                       "%s: the recorded outcome is malformed (another "
                       "program wrote the store key?)",
                       desc);
  if (message) {
    *message = ddplug__strdup(msg);
    if (!*message)
      return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory", desc);
  }
  if (status == DDPLUG_OK) return DDPLUG_OK;
  if (status == DDPLUG_E_PEER_LOST)
    return ddplug__err(status, "%s: %s", desc, msg);
  const char *nl = strchr(msg, '\n');
  int first = nl ? (int)(nl - msg) : (int)strlen(msg);
  return ddplug__err(status, "%s failed on its runner, rank %d: %.*s%s", desc,
                     rank, first > 400 ? 400 : first, msg,
                     first > 400 || nl ? " (full text in the message)" : "");
}

/* The run has ended (ctx's last error says how), while or before this
 * waiter waited. An outcome already on record says more (its runner
 * failed, and that ended the run): OK with it in *value; else the run's
 * status, ctx's last error as it was. */
static int on_record_after_the_end(ddplug_store *store, const char *key, int run_status,
                                   void **value) {
  char why[DDPLUG__ERRMSG_MAX];
  ddplug__strlcpy(why, ddplug_last_error(), sizeof why);
  uint64_t len = 0;
  if (ddplug_store_get(store, key, 0, value, &len) == DDPLUG_OK) return DDPLUG_OK;
  ddplug__set_last_error(why);
  return run_status;
}

/* The store key of a run-once's heartbeat counter: "<key>/beat". */
#define BEAT_KEY_MAX (RUNONCE_KEY_MAX + 8)
static void beat_key(char out[BEAT_KEY_MAX], const char *key) {
  snprintf(out, BEAT_KEY_MAX, "%s/beat", key);
}

/* The runner's heartbeat: add 1 to "<key>/beat" every BEAT_MS until told to
 * stop. A failing add is not an error here: waiters notice a silent runner. */
static void *beat_main(void *arg) {
  open_once *o = arg;
  char bkey[BEAT_KEY_MAX];
  beat_key(bkey, o->key);
  pthread_mutex_lock(&o->mu);
  while (!o->stop) {
    pthread_mutex_unlock(&o->mu);
    (void)ddplug_store_add(o->store, bkey, 1, NULL);
    pthread_mutex_lock(&o->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)BEAT_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (!o->stop && pthread_cond_timedwait(&o->cv, &o->mu, &until) == 0) {
    }
  }
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

/* The first heartbeat, before begin returns (so that waiters can tell a
 * runner that stops at once from one that has not begun yet), then the
 * heartbeat thread (every signal blocked there: the host's handlers stay on
 * its own threads). */
static int beat_start(open_once *o) {
  char bkey[BEAT_KEY_MAX];
  beat_key(bkey, o->key);
  int st = ddplug_store_add(o->store, bkey, 1, NULL);
  if (st) return ddplug__err_prefix(st, "run-once: the runner's first heartbeat");
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&o->beat, NULL, beat_main, o);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    return ddplug__err_errno(DDPLUG_E_SYSTEM, rc, "run-once: starting the heartbeat thread");
  }
  o->beating = 1;
  return DDPLUG_OK;
}

/* Stop the heartbeat and release o. */
static void once_free(open_once *o) {
  if (o->beating) {
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->beat, NULL);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
  }
  ddplug__free(o);
}

static void open_add(open_once *o) {
  pthread_mutex_lock(&g_open_mu);
  o->next = g_open;
  g_open = o;
  pthread_mutex_unlock(&g_open_mu);
}

/* Remove and return the matching open run-once, or NULL. */
static open_once *open_take(const ddplug_context *ctx, int scope,
                            const char *key) {
  pthread_mutex_lock(&g_open_mu);
  open_once **pp = &g_open;
  open_once *found = NULL;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->ctx == ctx && (*pp)->scope == scope && !strcmp((*pp)->key, key)) {
      found = *pp;
      *pp = found->next;
      break;
    }
  pthread_mutex_unlock(&g_open_mu);
  return found;
}

void ddplug__runonce_forget(const ddplug_context *ctx) {
  for (;;) {
    pthread_mutex_lock(&g_open_mu);
    open_once **pp = &g_open, *found = NULL;
    for (; *pp; pp = &(*pp)->next)
      if ((*pp)->ctx == ctx) {
        found = *pp;
        *pp = found->next;
        break;
      }
    pthread_mutex_unlock(&g_open_mu);
    if (!found) return;
    once_free(found);
  }
}

/* Wait until the outcome key exists (in slices that also notice an abort of
 * the run) or the deadline passes, and read it. */
static int wait_outcome(ddplug_context *ctx, const char *key, const char *desc,
                        const char *who, int64_t timeout_ms, const char *limit_by,
                        void **value) {
  char bkey[BEAT_KEY_MAX];
  beat_key(bkey, key);
  uint64_t start = ddplug__now_ns();
  uint64_t deadline = timeout_ms >= 0 ? ddplug__deadline_ns(timeout_ms) : UINT64_MAX;
  int64_t last_beat = -1;
  uint64_t last_change = start;
  for (;;) {
    uint64_t slice = ddplug__deadline_ns(SLICE_MS);
    uint64_t len = 0;
    int rc = ddplug__wait_get(ctx, ctx->store, key, DDPLUG__MIN(slice, deadline), desc, 0,
                              value, &len);
    uint64_t now = ddplug__now_ns();
    if (rc == DDPLUG_OK) return DDPLUG_OK;
    if (!ddplug__own_timeout(ctx, rc)) {
      /* The run failed while we waited (e.g. the runner died and the runtime
       * noticed first): its own record, if it got there, says more. */
      if (on_record_after_the_end(ctx->store, key, rc, value) == DDPLUG_OK) return DDPLUG_OK;
      return ddplug__err_prefix(rc, "%s: waiting for the outcome of %s", desc, who);
    }
    void *bv = NULL;
    uint64_t blen = 0;
    if (ddplug_store_get(ctx->store, bkey, 0, &bv, &blen) == DDPLUG_OK) {
      int64_t beat = 0;
      int parsed = ddplug__parse_i64(bv, &beat) == 0;
      ddplug_free(bv);
      if (parsed && beat != last_beat) {
        last_beat = beat;
        last_change = now;
      }
    }
    double waited = (double)(now - start) / 1e9;
    if (now >= deadline)
      return ddplug__err(DDPLUG_E_TIMEOUT,
                         "%s: no outcome from its runner, %s, after %.1f s (%s)%s",
                         desc, who, waited, limit_by,
                         last_beat >= 0 && now - last_change < (uint64_t)STALE_MS * 1000000ull
                             ? "; the runner is alive and still working: raise that "
                               "timeout, or set timeouts.run_once_s = 0 to wait as long "
                               "as it lives"
                             : "");
    if (last_beat >= 0 && now - last_change > (uint64_t)STALE_MS * 1000000ull)
      return ddplug__err(DDPLUG_E_PEER_LOST,
                         "%s: its runner, %s, stopped heartbeating %.1f s ago without "
                         "an outcome (its process hangs, or its host lost the "
                         "network): giving up after %.1f s",
                         desc, who, (double)(now - last_change) / 1e9, waited);
  }
}

/* Who runs scope, for messages: "rank 0" / "local rank 0 of node 1". */
static void runner_name(const ddplug_world *w, int scope, char *out,
                        size_t cap) {
  if (scope == DDPLUG_SCOPE_GLOBAL)
    snprintf(out, cap, "rank 0");
  else
    snprintf(out, cap, "local rank 0 of node %d", w->node_rank);
}

DDPLUG_API int ddplug_run_once_begin(ddplug_context *ctx, const char *name,
                                     int scope, int64_t timeout_ms,
                                     int *runner, char **message) {
  ddplug_world w = DDPLUG_WORLD_INIT;
  char key[RUNONCE_KEY_MAX + 1], desc[256];
  if (!runner)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_run_once_begin: runner is NULL");
  *runner = 0;
  if (message) *message = NULL;
  int st = prepare(ctx, name, scope, "ddplug_run_once_begin", &w, key, desc,
                   sizeof desc);
  if (st) return st;
  int64_t tmo = 0;
  char limit_by[320];
  st = waiter_timeout(ctx, timeout_ms, &tmo, limit_by, sizeof limit_by);
  if (st) return st;
  st = ddplug__ctx_check(ctx);
  void *value = NULL;
  uint64_t len = 0;
  if (st && !is_runner(&w, scope) &&
      on_record_after_the_end(ctx->store, key, st, &value) == DDPLUG_OK) {
    st = deliver(value, desc, message);
    ddplug_free(value);
    return st;
  }
  if (st) return ddplug__err_prefix(st, "%s", desc);
  ddplug_store *store = ctx->store;

  if (is_runner(&w, scope)) {
    /* The store's answer decides (a loaded rank 0 may give it later than
     * a poll's reply grace, and no answer must not read as "not run yet"). */
    st = ddplug__store_get_within(store, key, 0, ctx->rdzv_timeout_ms, &value, &len);
    if (st == DDPLUG_OK) { /* already recorded: once per run */
      st = deliver(value, desc, message);
      ddplug_free(value);
      return st;
    }
    if (st != DDPLUG_E_TIMEOUT)
      return ddplug__err_prefix(st, "%s: reading its outcome", desc);
    open_once *o = ddplug__calloc(1, sizeof *o);
    if (!o) return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory", desc);
    o->ctx = ctx;
    o->store = store;
    o->scope = scope;
    ddplug__strlcpy(o->key, key, sizeof o->key);
    char reason[320];
    snprintf(reason, sizeof reason,
             "its runner, rank %d, disconnected before it finished (the "
             "process died?)",
             w.rank);
    size_t vlen = 0;
    char *lost = encode_outcome(DDPLUG_E_PEER_LOST, w.rank, reason, &vlen);
    if (!lost) {
      ddplug__free(o);
      return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory", desc);
    }
    st = ddplug_store_on_disconnect(store, key, lost, vlen);
    ddplug__free(lost);
    if (st) {
      ddplug__free(o);
      return ddplug__err_prefix(st, "%s: registering the runner", desc);
    }
    if ((st = beat_start(o))) {
      /* This process will not run it: tell the waiters now (they would wait
       * for an outcome or this process's exit), then report the failure. */
      char why[DDPLUG__ERRMSG_MAX];
      ddplug__strlcpy(why, ddplug_last_error(), sizeof why);
      char *failed = encode_outcome(st, w.rank, why, &vlen);
      if (failed) (void)ddplug_store_set(store, key, failed, vlen);
      ddplug__free(failed);
      ddplug__set_last_error(why);
      ddplug__free(o);
      return ddplug__err_prefix(st, "%s", desc);
    }
    open_add(o);
    *runner = 1;
    DDPLUG__DEBUG("%s: this process runs it", desc);
    return DDPLUG_OK;
  }

  char who[64];
  runner_name(&w, scope, who, sizeof who);
  DDPLUG__DEBUG("%s: waiting for %s", desc, who);
  st = wait_outcome(ctx, key, desc, who, tmo, limit_by, &value);
  if (st) return st;
  st = deliver(value, desc, message);
  ddplug_free(value);
  return st;
}

DDPLUG_API int ddplug_run_once_end(ddplug_context *ctx, const char *name,
                                   int scope, int status,
                                   const char *message) {
  ddplug_world w = DDPLUG_WORLD_INIT;
  char key[RUNONCE_KEY_MAX + 1], desc[256];
  int st = prepare(ctx, name, scope, "ddplug_run_once_end", &w, key, desc,
                   sizeof desc);
  if (st) return st;
  if (status < 0 || status >= DDPLUG_STATUS_COUNT_)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: status %d is not a ddplug status", desc, status);
  open_once *o = open_take(ctx, scope, key);
  if (!o)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: this process is not running it (only the "
                       "process that got runner = 1 from "
                       "ddplug_run_once_begin ends it, once)",
                       desc);
  once_free(o);
  size_t len = 0;
  char *value = encode_outcome(status, w.rank, message, &len);
  if (!value) return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory", desc);
  st = ddplug_store_set(ddplug_context_store(ctx), key, value, len);
  ddplug__free(value);
  if (st) return ddplug__err_prefix(st, "%s: recording the outcome", desc);
  DDPLUG__DEBUG("%s: %s", desc, status ? "failed" : "done");
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_run_once(ddplug_context *ctx, const char *name,
                               int scope, ddplug_run_once_fn fn, void *user,
                               int64_t timeout_ms, char **message) {
  if (message) *message = NULL;
  if (!fn)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_run_once: fn is NULL");
  int runner = 0;
  int st = ddplug_run_once_begin(ctx, name, scope, timeout_ms, &runner, message);
  if (!runner) return st;
  char *msg = NULL;
  int work = fn(user, &msg);
  if (work < 0 || work >= DDPLUG_STATUS_COUNT_) work = DDPLUG_E_INTERNAL;
  st = ddplug_run_once_end(ctx, name, scope, work, msg);
  if (message && msg) *message = ddplug__strdup(msg);
  if (st) {
    free(msg);
    return st;
  }
  if (work) {
    const char *nl = msg ? strchr(msg, '\n') : NULL;
    int first = msg ? (nl ? (int)(nl - msg) : (int)strlen(msg)) : 0;
    st = ddplug__err(work, "run-once '%s': the work failed on this process%s%.*s",
                     name, first ? ": " : "", first > 400 ? 400 : first,
                     msg ? msg : "");
  }
  free(msg);
  return st;
}
