/* rendezvous.c — serve/connect the store, join the run, startup checks,
 * locality. Rank 0 is the coordinator: it waits for every rank's join record
 * (reporting the ranks that never came), checks that all ranks agree (world
 * size, unique ranks, config hash, plugin name and version), groups ranks by
 * host identity into nodes and publishes a verdict every rank reads. Any rank
 * that fails publishes the failure as the run's abort, so nobody waits out a
 * timeout for a peer that already gave up.
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context.h"
#include "store.h"

/* ---- small helpers ------------------------------------------------------ */

static void key_rank(char *buf, size_t cap, const char *prefix, int rank) {
  snprintf(buf, cap, "%s%d", prefix, rank);
}

/* "0, 1, 3" or "0-5, 7" style list of ranks where flag[r] is set. */
static void rank_list(const int *flag, int n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int r = 0; r < n && len + 24 < cap; r++) {
    if (!flag[r]) continue;
    int end = r;
    while (end + 1 < n && flag[end + 1]) end++;
    if (end - r >= 2)
      len += (size_t)snprintf(buf + len, cap - len, "%s%d-%d", len ? ", " : "", r, end);
    else if (end - r == 1)
      len += (size_t)snprintf(buf + len, cap - len, "%s%d, %d", len ? ", " : "", r, end);
    else
      len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", r);
    r = end;
  }
  if (len + 24 >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
}

static int count_flags(const int *flag, int n) {
  int c = 0;
  for (int r = 0; r < n; r++) c += flag[r] != 0;
  return c;
}

static void default_host_id(char *buf, size_t cap) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  char boot[64] = "";
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, boot, sizeof boot - 1);
    close(fd);
    if (n > 0) {
      boot[n] = '\0';
      boot[strcspn(boot, "\n")] = '\0';
    }
  }
  if (*boot)
    snprintf(buf, cap, "%s/%.8s", host, boot);
  else
    snprintf(buf, cap, "%s", host);
}

static void choose_host_id(ddplug_context *ctx, const ddplug_open_options *opts) {
  char *cfg_id = NULL;
  const char *env = getenv("DDPLUG_HOST_ID");
  if (opts && opts->host_id && *opts->host_id)
    ddplug__strlcpy(ctx->host_id, opts->host_id, sizeof ctx->host_id);
  else if (ddplug_config_get_string(ctx->cfg, "world.host_id", &cfg_id) == DDPLUG_OK) {
    ddplug__strlcpy(ctx->host_id, cfg_id, sizeof ctx->host_id);
    ddplug_free(cfg_id);
  } else if (env && *env)
    ddplug__strlcpy(ctx->host_id, env, sizeof ctx->host_id);
  else
    default_host_id(ctx->host_id, sizeof ctx->host_id);
}

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

/* ---- waiting ------------------------------------------------------------ */

int ddplug__wait_keys(ddplug_context *ctx, ddplug_store *st,
                      const char *const *keys, uint32_t nkeys,
                      uint64_t deadline_ns, const char *what, int in_plugin) {
  for (;;) {
    int s = ddplug__ctx_check(ctx);
    if (s != DDPLUG_OK) return s;
    int64_t left = ddplug__remaining_ms(deadline_ns);
    int64_t slice = DDPLUG__MIN(left, (int64_t)DDPLUG__WAIT_SLICE_MS);
    s = ddplug_store_wait(st, keys, nkeys, slice);
    if (s == DDPLUG_OK) return DDPLUG_OK;
    if (s != DDPLUG_E_TIMEOUT) return s;
    char missing[DDPLUG__ERRMSG_MAX]; /* the store names the missing keys */
    ddplug__strlcpy(missing, ddplug_last_error(), sizeof missing);
    /* Someone may have aborted the run while we waited: read the key
     * directly (the watcher may not run yet during startup). Inside a plugin
     * slot, only record it: the watcher tells the plugin. */
    void *val = NULL;
    uint64_t len = 0;
    if (ddplug_store_get(st, "ddplug/abort", 0, &val, &len) == DDPLUG_OK) {
      ddplug__ctx_adopt_abort(ctx, val, in_plugin ? 0 : DDPLUG__ABORT_NOTIFY);
      ddplug_free(val);
      return ddplug__ctx_check(ctx);
    }
    if (left <= slice) return ddplug__err(DDPLUG_E_TIMEOUT, "%s: %s", what, missing);
  }
}

/* ---- the join record ---------------------------------------------------- */

/* Canonical config without the per-process parts (world, log_level). */
static json_t *run_config_json(const ddplug_config *cfg) {
  char *text = NULL;
  if (ddplug_config_to_json(cfg, &text) != DDPLUG_OK) return NULL;
  json_t *j = json_loads(text, 0, NULL);
  ddplug_free(text);
  if (j && json_is_object(j)) {
    json_object_del(j, "world");
    json_object_del(j, "log_level");
  }
  return j;
}

static int publish_join(ddplug_context *ctx) {
  uint64_t hash = 0;
  int s = ddplug_config_hash(ctx->cfg, &hash);
  if (s != DDPLUG_OK) return s;
  char hash_hex[24];
  snprintf(hash_hex, sizeof hash_hex, "%016" PRIx64, hash);
  char hostname[256] = "?";
  gethostname(hostname, sizeof hostname - 1);
  json_t *cfg_json = run_config_json(ctx->cfg);
  const ddplug_plugin *t = &ctx->plugin->table;
  json_t *rec = json_pack(
      "{s:i, s:i, s:I, s:s, s:s, s:s, s:s, s:o, s:s, s:s, s:s, s:s, s:s}",
      "rank", ctx->world.rank, "world_size", ctx->world.world_size, "pid",
      (json_int_t)getpid(), "host_id", ctx->host_id, "hostname", hostname,
      "config_hash", hash_hex, "config_origin", ddplug_config_origin(ctx->cfg),
      "config", cfg_json ? cfg_json : json_object(), "plugin", t->name,
      "plugin_version", t->version ? t->version : "", "plugin_path",
      ctx->plugin->path, "ddplug", DDPLUG_LIB_VERSION_STRING, "framework",
      ctx->framework);
  if (!rec) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory building the join record");
  char *text = json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(rec);
  if (!text) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory building the join record");
  char key[64];
  key_rank(key, sizeof key, "ddplug/join/", ctx->world.rank);
  s = ddplug_store_set(ctx->store, key, text, strlen(text));
  free(text);
  return s;
}

/* Claim our rank; a second process with the same rank fails the run. */
static int claim_rank(ddplug_context *ctx) {
  char key[64], token[512];
  key_rank(key, sizeof key, "ddplug/claim/", ctx->world.rank);
  snprintf(token, sizeof token, "pid %d on host %s", (int)getpid(), ctx->host_id);
  int swapped = 0;
  void *actual = NULL;
  uint64_t alen = 0;
  int s = ddplug_store_compare_set(ctx->store, key, NULL, 0, token, strlen(token),
                                   &swapped, &actual, &alen);
  if (s != DDPLUG_OK) return s;
  if (!swapped) {
    char msg[DDPLUG__ERRMSG_MAX];
    snprintf(msg, sizeof msg,
             "rank %d was started twice: by %s and by %s: every process "
             "needs its own rank (check the launcher's RANK / LOCAL_RANK / "
             "NODE_RANK)",
             ctx->world.rank, actual ? (const char *)actual : "?", token);
    ddplug_free(actual);
    ddplug__ctx_abort(ctx, DDPLUG_E_CONFIG, msg, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
    return ddplug__err(DDPLUG_E_CONFIG, "%s", msg);
  }
  ddplug_free(actual);
  int64_t joined = 0;
  return ddplug_store_add(ctx->store, "ddplug/joined", 1, &joined);
}

/* ---- rank 0: checks and verdict ---------------------------------------- */

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

/* Group ranks by a string field; report when there is more than one group.
 * Returns 1 if they differ (message written). */
static int check_same(const join_rec *recs, int n, size_t field_offset,
                      const char *what, char *msg, size_t cap) {
  const char *ref = *(const char *const *)((const char *)&recs[0] + field_offset);
  int differ = 0;
  for (int r = 1; r < n; r++) {
    const char *v = *(const char *const *)((const char *)&recs[r] + field_offset);
    if (strcmp(v, ref) != 0) differ = 1;
  }
  if (!differ) return 0;
  int *same = calloc((size_t)n, sizeof *same);
  int *other = calloc((size_t)n, sizeof *other);
  if (!same || !other) {
    free(same);
    free(other);
    snprintf(msg, cap, "%s differs across ranks", what);
    return 1;
  }
  int first_other = -1;
  for (int r = 0; r < n; r++) {
    const char *v = *(const char *const *)((const char *)&recs[r] + field_offset);
    if (!strcmp(v, ref)) same[r] = 1;
    else {
      other[r] = 1;
      if (first_other < 0) first_other = r;
    }
  }
  char a[512], b[512];
  rank_list(same, n, a, sizeof a);
  rank_list(other, n, b, sizeof b);
  const char *vo = *(const char *const *)((const char *)&recs[first_other] + field_offset);
  snprintf(msg, cap, "%s differs across ranks: rank%s %s: %s; rank%s %s: %s", what,
           count_flags(same, n) > 1 ? "s" : "", a, ref,
           count_flags(other, n) > 1 ? "s" : "", b, vo);
  free(same);
  free(other);
  return 1;
}

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

static int coordinate(ddplug_context *ctx) {
  const int ws = ctx->world.world_size;
  uint64_t t0 = ddplug__now_ns();
  uint64_t deadline = ctx->open_deadline_ns;
  char **keys = calloc((size_t)ws, sizeof *keys);
  join_rec *recs = calloc((size_t)ws, sizeof *recs);
  int *flag = calloc((size_t)ws, sizeof *flag);
  int status = DDPLUG_OK;
  char msg[DDPLUG__ERRMSG_MAX] = "";
  if (!keys || !recs || !flag) {
    status = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory coordinating %d ranks", ws);
    goto out;
  }
  for (int r = 0; r < ws; r++) {
    keys[r] = ddplug__asprintf("ddplug/join/%d", r);
    if (!keys[r]) {
      status = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
      goto out;
    }
  }
  /* Wait for everyone, reporting progress now and then. */
  uint64_t next_report = t0 + 10ull * 1000000000ull;
  for (;;) {
    uint64_t slice_deadline = DDPLUG__MIN(deadline, next_report);
    status = ddplug__wait_keys(ctx, ctx->store, (const char *const *)keys,
                               (uint32_t)ws, slice_deadline, "waiting for ranks", 0);
    if (status == DDPLUG_OK) break;
    if (status != DDPLUG_E_TIMEOUT) goto out;
    /* Which ranks are missing? */
    int missing = 0;
    for (int r = 0; r < ws; r++) {
      void *v = NULL;
      uint64_t len;
      flag[r] = ddplug_store_get(ctx->store, keys[r], 0, &v, &len) != DDPLUG_OK;
      missing += flag[r];
      ddplug_free(v);
    }
    char list[1024];
    rank_list(flag, ws, list, sizeof list);
    double waited = (double)(ddplug__now_ns() - t0) / 1e9;
    if (ddplug__now_ns() >= deadline) {
      snprintf(msg, sizeof msg,
               "rank%s %s never joined after %.1f s (%d of %d processes "
               "joined): started %d of %d processes? Check that every rank "
               "was launched with the same MASTER_ADDR/MASTER_PORT (rank 0 "
               "serves %s:%d) and WORLD_SIZE",
               missing > 1 ? "s" : "", list, waited, ws - missing, ws,
               ws - missing, ws, ctx->store_addr, ctx->store_port);
      status = verdict_error(ctx, DDPLUG_E_TIMEOUT, msg);
      goto out;
    }
    DDPLUG__WARN("still waiting for rank%s %s after %.0f s (%d of %d joined)",
                 missing > 1 ? "s" : "", list, waited, ws - missing, ws);
    next_report += 10ull * 1000000000ull;
  }

  /* Read and parse every record. */
  for (int r = 0; r < ws; r++) {
    void *v = NULL;
    uint64_t len = 0;
    status = ddplug_store_get(ctx->store, keys[r], 0, &v, &len);
    if (status != DDPLUG_OK) goto out;
    json_error_t jerr;
    recs[r].j = json_loadb(v, len, 0, &jerr);
    ddplug_free(v);
    json_int_t ws_r = 0, pid = 0;
    if (!recs[r].j ||
        json_unpack(recs[r].j, "{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:I}",
                    "world_size", &ws_r, "host_id", &recs[r].host_id,
                    "config_hash", &recs[r].config_hash, "config_origin",
                    &recs[r].origin, "plugin", &recs[r].plugin, "plugin_version",
                    &recs[r].plugin_version, "plugin_path", &recs[r].plugin_path,
                    "pid", &pid) != 0) {
      snprintf(msg, sizeof msg,
               "rank %d's join record is malformed (a different ddplug "
               "version on that rank?)",
               r);
      status = verdict_error(ctx, DDPLUG_E_INTERNAL, msg);
      goto out;
    }
    recs[r].world_size = (int)ws_r;
    recs[r].pid = pid;
  }

  /* 1. world size agreed */
  {
    int differ = 0;
    for (int r = 0; r < ws; r++) {
      flag[r] = recs[r].world_size != ws;
      differ |= flag[r];
    }
    if (differ) {
      char list[1024];
      rank_list(flag, ws, list, sizeof list);
      int first = 0;
      while (!flag[first]) first++;
      snprintf(msg, sizeof msg,
               "world size differs across ranks: rank 0 has %d, rank%s %s "
               "%s %d: launch every rank with the same WORLD_SIZE",
               ws, count_flags(flag, ws) > 1 ? "s" : "", list,
               count_flags(flag, ws) > 1 ? "have" : "has", recs[first].world_size);
      status = verdict_error(ctx, DDPLUG_E_MISMATCH, msg);
      goto out;
    }
  }
  /* 2. no extra processes (a rank counted twice is caught by its claim) */
  {
    void *v = NULL;
    uint64_t len = 0;
    if (ddplug_store_get(ctx->store, "ddplug/joined", 0, &v, &len) == DDPLUG_OK) {
      long joined = strtol(v, NULL, 10);
      ddplug_free(v);
      if (joined > ws) {
        snprintf(msg, sizeof msg,
                 "%ld processes joined a world of %d ranks: more processes were "
                 "started than WORLD_SIZE says",
                 joined, ws);
        status = verdict_error(ctx, DDPLUG_E_CONFIG, msg);
        goto out;
      }
    }
  }
  /* 3. the same config */
  if (check_same(recs, ws, offsetof(join_rec, config_hash), "config hash", msg,
                 sizeof msg)) {
    int other = 1;
    while (other < ws && !strcmp(recs[other].config_hash, recs[0].config_hash)) other++;
    char diff[700] = "";
    first_difference(json_object_get(recs[0].j, "config"),
                     json_object_get(recs[other].j, "config"), "", diff, sizeof diff);
    char full[2 * DDPLUG__ERRMSG_MAX]; /* verdict_error truncates to the max */
    snprintf(full, sizeof full,
             "the config differs across ranks (rank 0 loaded %s, rank %d "
             "loaded %s): first difference %s; %s. Every rank must load the "
             "same config (only 'world' and 'log_level' may differ)",
             recs[0].origin, other, recs[other].origin, diff, msg);
    status = verdict_error(ctx, DDPLUG_E_MISMATCH, full);
    goto out;
  }
  /* 4. the same plugin and version */
  if (check_same(recs, ws, offsetof(join_rec, plugin), "the plugin", msg, sizeof msg) ||
      check_same(recs, ws, offsetof(join_rec, plugin_version), "the plugin version",
                 msg, sizeof msg)) {
    char full[2 * DDPLUG__ERRMSG_MAX];
    snprintf(full, sizeof full, "%s (rank 0 loaded %s): install the same plugin on every node",
             msg, recs[0].plugin_path);
    status = verdict_error(ctx, DDPLUG_E_MISMATCH, full);
    goto out;
  }

  /* Locality: nodes in order of their lowest rank. */
  {
    json_t *nodes = json_array(), *node_of = json_array(), *pids = json_array();
    for (int r = 0; r < ws; r++) {
      size_t idx;
      json_t *h;
      int found = -1;
      json_array_foreach(nodes, idx, h) {
        if (!strcmp(json_string_value(h), recs[r].host_id)) found = (int)idx;
      }
      if (found < 0) {
        json_array_append_new(nodes, json_string(recs[r].host_id));
        found = (int)json_array_size(nodes) - 1;
      }
      json_array_append_new(node_of, json_integer(found));
      json_array_append_new(pids, json_integer(recs[r].pid));
    }
    char run_id[40];
    make_run_id(run_id, sizeof run_id);
    json_t *v = json_pack("{s:b, s:i, s:s, s:o, s:o, s:o}", "ok", 1, "world_size", ws,
                          "run_id", run_id, "nodes", nodes, "node_of_rank", node_of,
                          "pid_of_rank", pids);
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!text) {
      status = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory publishing the verdict");
      goto out;
    }
    status = ddplug_store_set(ctx->store, "ddplug/verdict", text, strlen(text));
    free(text);
  }
out:
  for (int r = 0; keys && r < ws; r++) free(keys[r]);
  for (int r = 0; recs && r < ws; r++) json_decref(recs[r].j);
  free(keys);
  free(recs);
  free(flag);
  return status;
}

/* ---- every rank: read the verdict -------------------------------------- */

static int read_verdict(ddplug_context *ctx) {
  const char *key = "ddplug/verdict";
  /* Rank 0 publishes its verdict (possibly "ranks 2, 3 never joined") when
   * the same timeout expires there: wait a little longer than it does. */
  int s = ddplug__wait_keys(ctx, ctx->store, &key, 1,
                            ctx->open_deadline_ns + ddplug__open_grace_ns(ctx), "verdict", 0);
  if (s == DDPLUG_E_TIMEOUT)
    return ddplug__err(DDPLUG_E_TIMEOUT,
                       "rank 0 did not finish the startup checks within %.1f s "
                       "(is rank 0 running, at %s:%d?)",
                       (double)ctx->rdzv_timeout_ms / 1000.0, ctx->store_addr,
                       ctx->store_port);
  if (s != DDPLUG_OK) return s;
  void *val = NULL;
  uint64_t len = 0;
  s = ddplug_store_get(ctx->store, key, 0, &val, &len);
  if (s != DDPLUG_OK) return s;
  json_t *v = json_loadb(val, len, 0, NULL);
  ddplug_free(val);
  int ok = 0;
  json_int_t ws = 0;
  const char *run_id = NULL;
  json_t *nodes = NULL, *node_of = NULL, *pids = NULL;
  if (!v || json_unpack(v, "{s:b}", "ok", &ok) != 0) {
    json_decref(v);
    return ddplug__err(DDPLUG_E_INTERNAL, "rank 0's startup verdict is malformed");
  }
  if (!ok) {
    const char *err = json_string_value(json_object_get(v, "error"));
    int st = (int)json_integer_value(json_object_get(v, "status"));
    s = ddplug__err(st ? st : DDPLUG_E_ABORTED, "%s", err ? err : "rank 0 failed the startup checks");
    json_decref(v);
    return s;
  }
  if (json_unpack(v, "{s:I, s:s, s:o, s:o, s:o}", "world_size", &ws, "run_id", &run_id,
                  "nodes", &nodes, "node_of_rank", &node_of, "pid_of_rank", &pids) != 0) {
    json_decref(v);
    return ddplug__err(DDPLUG_E_INTERNAL, "rank 0's startup verdict is malformed");
  }
  if (ws != ctx->world.world_size) {
    s = ddplug__err(DDPLUG_E_MISMATCH,
                    "this process was started with world size %d but rank 0 "
                    "has %lld: launch every rank with the same WORLD_SIZE",
                    ctx->world.world_size, (long long)ws);
    json_decref(v);
    return s;
  }
  const int n = ctx->world.world_size;
  /* The verdict came over the network: check its shape before using it. */
  int malformed = !json_is_array(nodes) || !json_is_array(node_of) || !json_is_array(pids) ||
                  json_array_size(node_of) != (size_t)n || json_array_size(pids) != (size_t)n ||
                  json_array_size(nodes) < 1 || json_array_size(nodes) > (size_t)n ||
                  !run_id || strlen(run_id) >= sizeof ctx->run_id;
  for (int r = 0; r < n && !malformed; r++) {
    json_t *v_node = json_array_get(node_of, (size_t)r);
    json_int_t node = json_integer_value(v_node);
    malformed = !json_is_integer(v_node) || node < 0 || node >= (json_int_t)json_array_size(nodes);
  }
  for (const char *p = run_id; !malformed && *p; p++)
    malformed = !((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_');
  if (malformed) {
    json_decref(v);
    return ddplug__err(DDPLUG_E_INTERNAL,
                       "rank 0's startup verdict is malformed (a different ddplug version "
                       "on rank 0, or something else wrote the rendezvous store at %s:%d?)",
                       ctx->store_addr, ctx->store_port);
  }
  ctx->node_of_rank = ddplug__calloc((size_t)n, sizeof *ctx->node_of_rank);
  ctx->local_rank_of = ddplug__calloc((size_t)n, sizeof *ctx->local_rank_of);
  ctx->pid_of_rank = ddplug__calloc((size_t)n, sizeof *ctx->pid_of_rank);
  if (!ctx->node_of_rank || !ctx->local_rank_of || !ctx->pid_of_rank) {
    json_decref(v);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  ctx->num_nodes = (int32_t)json_array_size(nodes);
  int32_t *count = ddplug__calloc((size_t)ctx->num_nodes + 1, sizeof *count);
  if (!count) {
    json_decref(v);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  for (int r = 0; r < n; r++) {
    int node = (int)json_integer_value(json_array_get(node_of, (size_t)r));
    ctx->node_of_rank[r] = node;
    ctx->local_rank_of[r] = count[node]++;
    ctx->pid_of_rank[r] = json_integer_value(json_array_get(pids, (size_t)r));
  }
  int me = ctx->world.rank, my_node = ctx->node_of_rank[me];
  int env_local = ctx->world.local_rank;
  ctx->world.node_rank = my_node;
  ctx->world.local_rank = ctx->local_rank_of[me];
  ctx->world.local_world_size = count[my_node];
  if (env_local >= 0 && env_local != ctx->world.local_rank)
    DDPLUG__DEBUG("launcher said LOCAL_RANK=%d; by host identity this rank is "
                  "local rank %d of %d on node %d",
                  env_local, ctx->world.local_rank, count[my_node], my_node);
  ddplug__free(count);
  ddplug__strlcpy(ctx->run_id, run_id, sizeof ctx->run_id);
  json_decref(v);
  return DDPLUG_OK;
}

/* ---- the whole rendezvous ---------------------------------------------- */

static int read_secret(ddplug_context *ctx, const char **secret) {
  char *var = NULL;
  *secret = NULL;
  if (ddplug_config_get_string(ctx->cfg, "rendezvous.secret_env", &var) != DDPLUG_OK)
    return DDPLUG_OK;
  const char *v = getenv(var);
  if (v && *v) *secret = v;
  ddplug_free(var);
  return DDPLUG_OK;
}

/* ---- torchrun's agent store ------------------------------------------- */

/* Under torchrun (torch >= 2.4) the agent itself serves a TCPStore on
 * MASTER_ADDR:MASTER_PORT and tells the workers so with
 * TORCHELASTIC_USE_AGENT_STORE=True: rank 0 cannot listen on that port. Then
 * (unless the config names a port) rank 0 serves ddplug's store on a free
 * port and publishes it in the agent's store, where the others read it. */
static int agent_store_mode(const ddplug_context *ctx, int external) {
  const char *v = getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (external || ctx->world.world_size <= 1 || !v ||
      (strcmp(v, "True") != 0 && strcmp(v, "true") != 0 && strcmp(v, "1") != 0))
    return 0;
  int64_t cfg_port = 0;
  if (ddplug_config_get_int(ctx->cfg, "rendezvous.port", &cfg_port) == DDPLUG_OK)
    return 0;
  const char *mp = getenv("MASTER_PORT");
  int64_t port = 0;
  return mp && ddplug__parse_i64(mp, &port) == 0 && port == ctx->world.master_port;
}

/* Every ddplug_open of a process under torchrun gets its own key, in the
 * same order on every rank (each rank opens the same runs in turn). */
static atomic_uint g_agent_opens;

static void agent_key(char *buf, size_t cap) {
  const char *run = getenv("TORCHELASTIC_RUN_ID");
  const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
  snprintf(buf, cap, "ddplug/store_port/%.64s/%.16s/%u", run && *run ? run : "-",
           restart && *restart ? restart : "0", atomic_fetch_add(&g_agent_opens, 1));
}

/* Rank 0 publishes port (> 0), the others read it into *port. */
static int agent_exchange(ddplug_context *ctx, const char *key, int *port) {
  ddplug__tstore *ts = NULL;
  uint64_t deadline = ctx->open_deadline_ns;
  int s = ddplug__tstore_connect(ctx->world.master_addr, ctx->world.master_port,
                                 deadline, &ts);
  if (s == DDPLUG_OK && ctx->world.rank == 0) {
    char val[16];
    int n = snprintf(val, sizeof val, "%d", *port);
    s = ddplug__tstore_set(ts, key, val, (size_t)n, deadline);
  } else if (s == DDPLUG_OK) {
    char val[32];
    int64_t p = 0;
    s = ddplug__tstore_wait_get(ts, key, val, sizeof val, deadline);
    if (s == DDPLUG_E_TIMEOUT)
      s = ddplug__err(DDPLUG_E_TIMEOUT,
                      "rank 0 did not publish ddplug's store port in "
                      "torchrun's store at %s:%d within %.1f s (is rank 0 "
                      "running? did it fail to open?)",
                      ctx->world.master_addr, ctx->world.master_port,
                      (double)ctx->rdzv_timeout_ms / 1000.0);
    else if (s == DDPLUG_OK && (ddplug__parse_i64(val, &p) != 0 || p <= 0 || p > 65535))
      s = ddplug__err(DDPLUG_E_PEER_LOST,
                      "torchrun's store holds '%.20s' under %s, not a port",
                      val, key);
    *port = (int)p;
  }
  ddplug__tstore_close(ts);
  if (s != DDPLUG_OK)
    return ddplug__err_prefix(s, "rank %d, under torchrun (TORCHELASTIC_USE_"
                              "AGENT_STORE=True)", ctx->world.rank);
  return DDPLUG_OK;
}

static int is_loopback(const char *addr) {
  return !strcmp(addr, "localhost") || !strncmp(addr, "127.", 4) ||
         !strcmp(addr, "::1");
}

int ddplug__rendezvous_connect(ddplug_context *ctx, const ddplug_open_options *opts) {
  choose_host_id(ctx, opts);
  int external = 0;
  ddplug_config_get_bool(ctx->cfg, "rendezvous.external", &external);
  const char *secret = NULL;
  read_secret(ctx, &secret);
  const int rank = ctx->world.rank;
  int s;
  const int agent = agent_store_mode(ctx, external);
  char agent_k[160] = "";
  if (agent) agent_key(agent_k, sizeof agent_k);

  if (ctx->world.world_size == 1 && !*ctx->world.master_addr) {
    ddplug__strlcpy(ctx->store_addr, "127.0.0.1", sizeof ctx->store_addr);
    ctx->store_port = ctx->world.master_port; /* 0: any free port */
  } else {
    ddplug__strlcpy(ctx->store_addr, ctx->world.master_addr, sizeof ctx->store_addr);
    ctx->store_port = ctx->world.master_port;
  }
  if (rank == 0 && !external) {
    /* Listen on every interface when other hosts may connect; only on
     * loopback when the rendezvous address itself is loopback. */
    const char *bind_addr = ctx->world.world_size == 1 || is_loopback(ctx->store_addr)
                                ? "127.0.0.1"
                                : "0.0.0.0";
    s = ddplug_store_serve(bind_addr, agent ? 0 : ctx->store_port, secret, &ctx->server);
    if (s != DDPLUG_OK)
      return ddplug__err_prefix(s,
                                "rank 0 could not serve the rendezvous store on "
                                "port %d (another run on this port? pick a free "
                                "MASTER_PORT / rendezvous.port)",
                                agent ? 0 : ctx->store_port);
    ctx->store_port = ddplug_store_server_port(ctx->server);
    if (ctx->world.world_size == 1)
      ddplug__strlcpy(ctx->store_addr, "127.0.0.1", sizeof ctx->store_addr);
  }
  if (agent) {
    int port = ctx->store_port;
    s = agent_exchange(ctx, agent_k, &port);
    if (s != DDPLUG_OK) return s;
    ctx->store_port = port;
    DDPLUG__DEBUG("under torchrun: ddplug's store is on port %d (torchrun's "
                  "own store has MASTER_PORT=%d)", port, ctx->world.master_port);
  }
  uint64_t deadline = ctx->open_deadline_ns;
  const char *addr = (rank == 0 && !external) ? "127.0.0.1" : ctx->store_addr;
  ddplug_store **conns[3] = {&ctx->store, &ctx->watch_store, &ctx->plugin_store};
  for (int i = 0; i < 3; i++) {
    s = ddplug_store_connect(addr, ctx->store_port, secret,
                             ddplug__remaining_ms(deadline), conns[i]);
    if (s != DDPLUG_OK)
      return ddplug__err_prefix(s, "rank %d could not reach the rendezvous store at %s:%d",
                                rank, ctx->store_addr, ctx->store_port);
    /* Calls without their own timeout (set, add, ...) wait at most this. */
    ddplug__store_set_default_timeout(*conns[i], ctx->rdzv_timeout_ms);
  }
  int64_t procs = 0; /* rank 0 serves until everyone came and left */
  s = ddplug_store_add(ctx->store, "ddplug/procs", 1, &procs);
  if (s != DDPLUG_OK) return s;
  /* If this process dies, the store tells everyone. */
  char lost[DDPLUG__ERRMSG_MAX];
  int n = snprintf(lost, sizeof lost,
                   "PEER_LOST|rank %d (pid %d on host %s) exited or was killed: "
                   "its connection to the rendezvous store closed%s",
                   rank, (int)getpid(), ctx->host_id,
                   rank == 0 ? " (rank 0 serves the store)" : "");
  return ddplug_store_on_disconnect(ctx->store, "ddplug/abort", lost, (uint64_t)n);
}

/* Rank 0 announces its world size before it waits for everyone; a rank that
 * was started with another one says so at once (as the run's abort), instead
 * of rank 0 waiting out the timeout for ranks that will never come. */
static int check_world_size(ddplug_context *ctx) {
  const char *key = "ddplug/world_size";
  char mine[16];
  int n = snprintf(mine, sizeof mine, "%d", ctx->world.world_size);
  if (ctx->world.rank == 0) return ddplug_store_set(ctx->store, key, mine, (uint64_t)n);
  int s = ddplug__wait_keys(ctx, ctx->store, &key, 1, ctx->open_deadline_ns,
                            "rank 0's world size", 0);
  if (s != DDPLUG_OK) return s;
  void *val = NULL;
  uint64_t len = 0;
  s = ddplug_store_get(ctx->store, key, 0, &val, &len);
  if (s != DDPLUG_OK) return s;
  int64_t ws0 = 0;
  int same = len < sizeof mine && ddplug__parse_i64(val, &ws0) == 0 &&
             ws0 == ctx->world.world_size;
  ddplug_free(val);
  if (same) return DDPLUG_OK;
  char msg[DDPLUG__ERRMSG_MAX];
  snprintf(msg, sizeof msg,
           "world size differs across ranks: rank 0 has %lld, rank %d has %d: "
           "launch every rank with the same WORLD_SIZE",
           (long long)ws0, ctx->world.rank, ctx->world.world_size);
  ddplug__ctx_abort(ctx, DDPLUG_E_MISMATCH, msg, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
  return ddplug__err(DDPLUG_E_MISMATCH, "%s", msg);
}

int ddplug__rendezvous_join(ddplug_context *ctx) {
  const int rank = ctx->world.rank;
  int s = claim_rank(ctx);
  if (s != DDPLUG_OK) return s;
  s = publish_join(ctx);
  if (s != DDPLUG_OK) return s;
  s = check_world_size(ctx);
  if (s != DDPLUG_OK) return s;
  if (rank == 0) {
    s = coordinate(ctx);
    if (s != DDPLUG_OK) return s;
  }
  return read_verdict(ctx);
}
