/* checks.c — rank 0's startup checks. Rank 0 waits for every rank's join
 * record (reporting the ranks that never came), then checks, one function
 * each and in this order: the world size every rank was started with, that
 * no extra processes joined, the config (by hash, naming the first
 * difference), the plugin and its version. It then groups ranks by host
 * identity into nodes and publishes the verdict every rank reads (join.c).
 * A failed check publishes its sentence as the verdict and as the run's
 * abort, so nobody waits out a timeout for a peer that already gave up.
 * SPDX-License-Identifier: Apache-2.0 */
#include <fcntl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/context.h"
#include "store/store.h"

/* One rank's join record (join.c publishes it); strings borrow from j. */
typedef struct join_rec {
  json_t *j;
  int world_size;
  const char *host_id;
  const char *config_hash;
  const char *origin;
  const char *plugin;
  const char *plugin_version;
  const char *plugin_path;
  int64_t pid;
} join_rec;

/* What the checks share: every rank's record, and scratch flags. */
typedef struct joins {
  int n;
  char **keys;     /* "ddplug/join/<rank>" */
  join_rec *recs;
  int *flag;
} joins;

static int joins_init(joins *j, int n) {
  memset(j, 0, sizeof *j);
  j->n = n;
  j->keys = calloc((size_t)n, sizeof *j->keys);
  j->recs = calloc((size_t)n, sizeof *j->recs);
  j->flag = calloc((size_t)n, sizeof *j->flag);
  if (!j->keys || !j->recs || !j->flag)
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory coordinating %d ranks", n);
  for (int r = 0; r < n; r++) {
    j->keys[r] = ddplug__asprintf("ddplug/join/%d", r);
    if (!j->keys[r]) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  return DDPLUG_OK;
}

static void joins_free(joins *j) {
  for (int r = 0; j->keys && r < j->n; r++) ddplug__free(j->keys[r]);
  for (int r = 0; j->recs && r < j->n; r++) json_decref(j->recs[r].j);
  free(j->keys);
  free(j->recs);
  free(j->flag);
}

/* Publish a failed verdict and abort the run with it. Returns status. */
static int verdict_error(ddplug_context *ctx, int status, const char *msg) {
  json_t *v = json_pack("{s:b, s:i, s:s}", "ok", 0, "status", status, "error", msg);
  char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
  json_decref(v);
  if (text) {
    ddplug_store_set(ctx->store, "ddplug/verdict", text, strlen(text));
    free(text);
  }
  ddplug__ctx_abort(ctx, status, msg, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
  return ddplug__err(status, "%s", msg);
}

/* Wait for every join record, naming the missing ranks every 10 s and when
 * ddplug_open's deadline passes. */
static int wait_for_joins(ddplug_context *ctx, joins *j) {
  const int ws = j->n;
  const uint64_t t0 = ddplug__now_ns(), deadline = ctx->open_deadline_ns;
  uint64_t next_report = t0 + 10ull * 1000000000ull;
  for (;;) {
    int s = ddplug__wait_keys(ctx, ctx->store, (const char *const *)j->keys, (uint32_t)ws,
                              DDPLUG__MIN(deadline, next_report), "waiting for ranks", 0);
    if (s != DDPLUG_E_TIMEOUT) return s;
    for (int r = 0; r < ws; r++) {
      void *v = NULL;
      uint64_t len;
      j->flag[r] = ddplug_store_get(ctx->store, j->keys[r], 0, &v, &len) != DDPLUG_OK;
      ddplug_free(v);
    }
    char list[1024];
    int missing = ddplug__rank_list(j->flag, ws, list, sizeof list);
    double waited = (double)(ddplug__now_ns() - t0) / 1e9;
    if (ddplug__now_ns() >= deadline) {
      char msg[DDPLUG__ERRMSG_MAX];
      snprintf(msg, sizeof msg,
               "rank%s %s never joined after %.1f s (%d of %d processes "
               "joined): started %d of %d processes? Check that every rank "
               "was launched with the same MASTER_ADDR/MASTER_PORT (rank 0 "
               "serves %s:%d) and WORLD_SIZE",
               missing > 1 ? "s" : "", list, waited, ws - missing, ws,
               ws - missing, ws, ctx->store_addr, ctx->store_port);
      return verdict_error(ctx, DDPLUG_E_TIMEOUT, msg);
    }
    DDPLUG__WARN("still waiting for rank%s %s after %.0f s (%d of %d joined)",
                 missing > 1 ? "s" : "", list, waited, ws - missing, ws);
    next_report += 10ull * 1000000000ull;
  }
}

/* Read and parse every record; a malformed one fails the run. */
static int read_joins(ddplug_context *ctx, joins *j) {
  for (int r = 0; r < j->n; r++) {
    void *v = NULL;
    uint64_t len = 0;
    int s = ddplug__wait_get(ctx, ctx->store, j->keys[r], ctx->open_deadline_ns,
                             "reading the join records", 0, &v, &len);
    if (s != DDPLUG_OK) return s;
    join_rec *rec = &j->recs[r];
    json_error_t jerr;
    rec->j = json_loadb(v, len, 0, &jerr);
    ddplug_free(v);
    json_int_t ws_r = 0, pid = 0;
    if (!rec->j ||
        json_unpack(rec->j, "{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:I}",
                    "world_size", &ws_r, "host_id", &rec->host_id, "config_hash",
                    &rec->config_hash, "config_origin", &rec->origin, "plugin",
                    &rec->plugin, "plugin_version", &rec->plugin_version,
                    "plugin_path", &rec->plugin_path, "pid", &pid) != 0) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "rank %d's join record is malformed (a different ddplug "
               "version on that rank?)",
               r);
      return verdict_error(ctx, DDPLUG_E_INTERNAL, msg);
    }
    rec->world_size = (int)ws_r;
    rec->pid = pid;
  }
  return DDPLUG_OK;
}

/* Every rank was started with rank 0's world size. */
static int check_world_size(ddplug_context *ctx, joins *j) {
  const int ws = j->n;
  int first = -1;
  for (int r = 0; r < ws; r++) {
    j->flag[r] = j->recs[r].world_size != ws;
    if (j->flag[r] && first < 0) first = r;
  }
  if (first < 0) return DDPLUG_OK;
  char list[1024], msg[DDPLUG__ERRMSG_MAX];
  int count = ddplug__rank_list(j->flag, ws, list, sizeof list);
  snprintf(msg, sizeof msg,
           "world size differs across ranks: rank 0 has %d, rank%s %s "
           "%s %d: launch every rank with the same WORLD_SIZE",
           ws, count > 1 ? "s" : "", list, count > 1 ? "have" : "has",
           j->recs[first].world_size);
  return verdict_error(ctx, DDPLUG_E_MISMATCH, msg);
}

/* No more processes joined than the world has ranks (a rank started twice
 * is caught earlier, by its claim in join.c). */
static int check_process_count(ddplug_context *ctx, joins *j) {
  void *v = NULL;
  uint64_t len = 0;
  /* Present: every rank counted itself in before publishing its record. */
  if (ddplug__wait_get(ctx, ctx->store, "ddplug/joined", ctx->open_deadline_ns,
                       "reading the number of joined processes", 0, &v, &len) != DDPLUG_OK)
    return DDPLUG_OK;
  long joined = strtol(v, NULL, 10);
  ddplug_free(v);
  if (joined <= j->n) return DDPLUG_OK;
  char msg[256];
  snprintf(msg, sizeof msg,
           "%ld processes joined a world of %d ranks: more processes were "
           "started than WORLD_SIZE says",
           joined, j->n);
  return verdict_error(ctx, DDPLUG_E_CONFIG, msg);
}

/* First differing key path between two JSON values (depth-first). */
static void first_difference(json_t *a, json_t *b, const char *path, char *out,
                             size_t cap) {
  if (json_equal(a, b)) return;
  if (json_is_object(a) && json_is_object(b)) {
    const char *k;
    json_t *va;
    json_object_foreach(a, k, va) {
      char sub[512];
      snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
      json_t *vb = json_object_get(b, k);
      if (!vb) {
        snprintf(out, cap, "'%s' is set on one and absent on the other", sub);
        return;
      }
      if (!json_equal(va, vb)) {
        first_difference(va, vb, sub, out, cap);
        return;
      }
    }
    json_t *vb;
    json_object_foreach(b, k, vb) {
      if (!json_object_get(a, k)) {
        snprintf(out, cap, "'%s%s%s' is set on one and absent on the other",
                 path, *path ? "." : "", k);
        return;
      }
    }
    return;
  }
  char *ta = json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT);
  char *tb = json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT);
  snprintf(out, cap, "'%s': %.100s vs %.100s", *path ? path : "(top level)",
           ta ? ta : "?", tb ? tb : "?");
  free(ta);
  free(tb);
}

static const char *rec_field(const join_rec *rec, size_t offset) {
  return *(const char *const *)((const char *)rec + offset);
}

/* Group ranks by a string field of their records; when there is more than
 * one group, write "<what> differs across ranks: ranks A: x; ranks B: y"
 * into msg and return 1. */
static int check_same(joins *j, size_t offset, const char *what, char *msg, size_t cap) {
  const char *ref = rec_field(&j->recs[0], offset);
  int first_other = -1;
  for (int r = 0; r < j->n; r++) {
    j->flag[r] = strcmp(rec_field(&j->recs[r], offset), ref) != 0;
    if (j->flag[r] && first_other < 0) first_other = r;
  }
  if (first_other < 0) return 0;
  char same[512], other[512];
  int n_other = ddplug__rank_list(j->flag, j->n, other, sizeof other);
  for (int r = 0; r < j->n; r++) j->flag[r] = !j->flag[r];
  int n_same = ddplug__rank_list(j->flag, j->n, same, sizeof same);
  snprintf(msg, cap, "%s differs across ranks: rank%s %s: %s; rank%s %s: %s", what,
           n_same > 1 ? "s" : "", same, ref, n_other > 1 ? "s" : "", other,
           rec_field(&j->recs[first_other], offset));
  return 1;
}

/* Every rank loaded the same config (only 'world' and 'log_level' may
 * differ: join.c leaves them out of the hash). */
static int check_config(ddplug_context *ctx, joins *j) {
  char msg[DDPLUG__ERRMSG_MAX];
  if (!check_same(j, offsetof(join_rec, config_hash), "config hash", msg, sizeof msg))
    return DDPLUG_OK;
  int other = 1;
  while (other < j->n && !strcmp(j->recs[other].config_hash, j->recs[0].config_hash)) other++;
  char diff[700] = "";
  first_difference(json_object_get(j->recs[0].j, "config"),
                   json_object_get(j->recs[other].j, "config"), "", diff, sizeof diff);
  char full[2 * DDPLUG__ERRMSG_MAX]; /* verdict_error truncates to the max */
  snprintf(full, sizeof full,
           "the config differs across ranks (rank 0 loaded %s, rank %d "
           "loaded %s): first difference %s; %s. Every rank must load the "
           "same config (only 'world' and 'log_level' may differ)",
           j->recs[0].origin, other, j->recs[other].origin, diff, msg);
  return verdict_error(ctx, DDPLUG_E_MISMATCH, full);
}

/* Every rank loaded the same plugin, in the same version. */
static int check_plugin(ddplug_context *ctx, joins *j) {
  char msg[DDPLUG__ERRMSG_MAX];
  if (!check_same(j, offsetof(join_rec, plugin), "the plugin", msg, sizeof msg) &&
      !check_same(j, offsetof(join_rec, plugin_version), "the plugin version", msg,
                  sizeof msg))
    return DDPLUG_OK;
  char full[2 * DDPLUG__ERRMSG_MAX];
  snprintf(full, sizeof full, "%s (rank 0 loaded %s): install the same plugin on every node",
           msg, j->recs[0].plugin_path);
  return verdict_error(ctx, DDPLUG_E_MISMATCH, full);
}

/* A fresh run id: 16 hex digits from /dev/urandom (clock and pid without). */
static void make_run_id(char *buf, size_t cap) {
  unsigned char raw[8] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  int ok = fd >= 0 && read(fd, raw, sizeof raw) == (ssize_t)sizeof raw;
  if (fd >= 0) close(fd);
  if (!ok) {
    uint64_t x = ddplug__hash64(&ok, sizeof ok, ddplug__now_ns() ^ (uint64_t)getpid());
    memcpy(raw, &x, sizeof raw);
  }
  size_t len = 0;
  for (size_t i = 0; i < sizeof raw && len + 3 <= cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%02x", raw[i]);
}

/* All checks passed: nodes in order of their lowest rank, the run id, the
 * pids, as the verdict. */
static int publish_verdict(ddplug_context *ctx, joins *j) {
  json_t *nodes = json_array(), *node_of = json_array(), *pids = json_array();
  for (int r = 0; r < j->n; r++) {
    size_t idx;
    json_t *h;
    int found = -1;
    json_array_foreach(nodes, idx, h) {
      if (!strcmp(json_string_value(h), j->recs[r].host_id)) found = (int)idx;
    }
    if (found < 0) {
      json_array_append_new(nodes, json_string(j->recs[r].host_id));
      found = (int)json_array_size(nodes) - 1;
    }
    json_array_append_new(node_of, json_integer(found));
    json_array_append_new(pids, json_integer(j->recs[r].pid));
  }
  char run_id[40];
  make_run_id(run_id, sizeof run_id);
  json_t *v = json_pack("{s:b, s:i, s:s, s:o, s:o, s:o}", "ok", 1, "world_size", j->n,
                        "run_id", run_id, "nodes", nodes, "node_of_rank", node_of,
                        "pid_of_rank", pids);
  char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
  json_decref(v);
  if (!text) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory publishing the verdict");
  int s = ddplug_store_set(ctx->store, "ddplug/verdict", text, strlen(text));
  free(text);
  return s;
}

/* See context.h. */
int ddplug__startup_checks(ddplug_context *ctx) {
  static int (*const steps[])(ddplug_context *, joins *) = {
      wait_for_joins, read_joins,   check_world_size, check_process_count,
      check_config,   check_plugin, publish_verdict,
  };
  /* How long these checks may still take: a rank that began before rank 0
   * (read_verdict) waits for the verdict that long from when it reads this. */
  char left[32];
  snprintf(left, sizeof left, "%lld", (long long)ddplug__remaining_ms(ctx->open_deadline_ns));
  int s = ddplug_store_set(ctx->store, DDPLUG__CHECKS_LEFT_KEY, left, strlen(left));
  if (s != DDPLUG_OK) return s;
  joins j;
  s = joins_init(&j, ctx->world.world_size);
  for (size_t i = 0; s == DDPLUG_OK && i < DDPLUG__ARRAY_LEN(steps); i++)
    s = steps[i](ctx, &j);
  joins_free(&j);
  return s;
}
