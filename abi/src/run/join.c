/* join.c — one rank joining the run: serve (rank 0) or reach the store,
 * claim the rank, publish the join record, compare the world size with
 * rank 0's, and read rank 0's startup verdict (checks.c), which gives the
 * run id and locality. Any rank that fails publishes the failure as the
 * run's abort, so nobody waits out a timeout for a peer that already gave
 * up.
 * SPDX-License-Identifier: Apache-2.0 */
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/context.h"
#include "store/store.h"

static void key_rank(char *buf, size_t cap, const char *prefix, int rank) {
  snprintf(buf, cap, "%s%d", prefix, rank);
}

/* ---- identity: host id and the secret ----------------------------------- */

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

static int read_secret(ddplug_context *ctx, const char **secret) {
  char *var = NULL;
  *secret = NULL;
  if (ctx->boot_secret[0]) { /* the bootstrap carried one (bootstrap.c) */
    *secret = ctx->boot_secret;
    return DDPLUG_OK;
  }
  if (ddplug_config_get_string(ctx->cfg, "rendezvous.secret_env", &var) != DDPLUG_OK)
    return DDPLUG_OK;
  const char *v = getenv(var);
  if (v && *v) *secret = v;
  ddplug_free(var);
  return DDPLUG_OK;
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

/* ---- every rank: read the verdict -------------------------------------- */

/* What rank 0 said, as its startup checks began, about how long they may
 * still take (DDPLUG__CHECKS_LEFT_KEY): read now, later than it was written,
 * so waiting that long from now waits at least until rank 0's deadline. -1:
 * not there (rank 0 never began them) or not a number of ms up to this run's
 * rendezvous timeout. */
static int64_t checks_left_ms(ddplug_context *ctx) {
  void *v = NULL;
  uint64_t len = 0;
  if (ddplug_store_get(ctx->store, DDPLUG__CHECKS_LEFT_KEY, 0, &v, &len) != DDPLUG_OK) return -1;
  int64_t ms = len > 0 && len <= 18 ? 0 : -1; /* 18 digits cannot overflow */
  for (uint64_t i = 0; ms >= 0 && i < len; i++) {
    char c = ((const char *)v)[i];
    ms = c >= '0' && c <= '9' ? ms * 10 + (c - '0') : -1;
  }
  ddplug_free(v);
  return ms <= ctx->rdzv_timeout_ms ? ms : -1;
}

static int read_verdict(ddplug_context *ctx) {
  const char *key = "ddplug/verdict";
  /* Rank 0 publishes its verdict (possibly "ranks 2, 3 never joined") when
   * the same timeout expires there: wait a little longer than it does. */
  void *val = NULL;
  uint64_t len = 0;
  int s = ddplug__wait_get(ctx, ctx->store, key,
                           ctx->open_deadline_ns + ddplug__open_grace_ns(ctx), "verdict", 0,
                           &val, &len);
  int64_t left = s == DDPLUG_E_TIMEOUT ? checks_left_ms(ctx) : -1;
  if (left >= 0)
    /* rank 0 began after this rank: its own deadline is later than ours */
    s = ddplug__wait_get(ctx, ctx->store, key,
                         ddplug__now_ns() + (uint64_t)left * 1000000ull + ddplug__open_grace_ns(ctx),
                         "verdict", 0, &val, &len);
  if (s == DDPLUG_E_TIMEOUT)
    return ddplug__err(DDPLUG_E_TIMEOUT,
                       "rank 0 did not finish the startup checks within %.1f s "
                       "(is rank 0 running, at %s:%d?)",
                       (double)ctx->rdzv_timeout_ms / 1000.0, ctx->store_addr,
                       ctx->store_port);
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

static int is_loopback(const char *addr) {
  return !strcmp(addr, "localhost") || !strncmp(addr, "127.", 4) ||
         !strcmp(addr, "::1");
}

/* See context.h. */
int ddplug__rendezvous_connect(ddplug_context *ctx, const ddplug_open_options *opts) {
  choose_host_id(ctx, opts);
  int external = 0;
  ddplug_config_get_bool(ctx->cfg, "rendezvous.external", &external);
  const char *secret = NULL;
  read_secret(ctx, &secret);
  const int rank = ctx->world.rank;
  int s;
  const int agent = ddplug__torchrun_agent_store(ctx, external);
  char agent_k[160] = "";
  if (agent) ddplug__torchrun_port_key(agent_k, sizeof agent_k);

  if (ctx->world.world_size == 1 && !*ctx->world.master_addr) {
    ddplug__strlcpy(ctx->store_addr, "127.0.0.1", sizeof ctx->store_addr);
    ctx->store_port = ctx->world.master_port; /* 0: any free port */
  } else {
    ddplug__strlcpy(ctx->store_addr, ctx->world.master_addr, sizeof ctx->store_addr);
    ctx->store_port = ctx->world.master_port;
  }
  if (rank == 0 && !external && !ctx->server) {
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
    if (!secret && strcmp(bind_addr, "127.0.0.1") != 0) {
      char *var = NULL;
      ddplug_config_get_string(ctx->cfg, "rendezvous.secret_env", &var);
      DDPLUG__WARN("rank 0 serves the rendezvous store on every interface "
                   "(port %d) without a shared secret: anyone who can reach "
                   "this port can read and change the run's keys, forge an "
                   "abort, or hold its connections. Set %s to the same random "
                   "value on every rank (ddplug run does this by itself; see "
                   "the README, \"Secrets\")",
                   ctx->store_port, var ? var : "DDPLUG_SECRET");
      ddplug_free(var);
    }
  }
  if (agent) {
    int port = ctx->store_port;
    s = ddplug__torchrun_exchange_port(ctx, agent_k, &port);
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
    if (i > 0) continue;
    /* First thing on the store: if this process dies from here on, at any
     * stage of joining, the store tells everyone. */
    char lost[DDPLUG__ERRMSG_MAX];
    int n = snprintf(lost, sizeof lost,
                     "PEER_LOST|rank %d (pid %d on host %s) exited or was killed: "
                     "its connection to the rendezvous store closed%s",
                     rank, (int)getpid(), ctx->host_id,
                     rank == 0 ? " (rank 0 serves the store)" : "");
    s = ddplug_store_on_disconnect(ctx->store, "ddplug/abort", lost, (uint64_t)n);
    if (s != DDPLUG_OK) return s;
    /* Whether this process is gone, whatever the generation: survivors
     * re-forming the group wait for every member to arrive or be gone. */
    char gone[64];
    snprintf(gone, sizeof gone, "ddplug/gone/%d", rank);
    s = ddplug_store_on_disconnect(ctx->store, gone, "1", 1);
    if (s != DDPLUG_OK) return s;
  }
  int64_t procs = 0; /* rank 0 serves until everyone came and left */
  return ddplug_store_add(ctx->store, "ddplug/procs", 1, &procs);
}

/* Rank 0 announces its world size before it waits for everyone; a rank that
 * was started with another one says so at once (as the run's abort), instead
 * of rank 0 waiting out the timeout for ranks that will never come. */
static int compare_world_size(ddplug_context *ctx) {
  const char *key = "ddplug/world_size";
  char mine[16];
  int n = snprintf(mine, sizeof mine, "%d", ctx->world.world_size);
  if (ctx->world.rank == 0) return ddplug_store_set(ctx->store, key, mine, (uint64_t)n);
  void *val = NULL;
  uint64_t len = 0;
  int s = ddplug__wait_get(ctx, ctx->store, key, ctx->open_deadline_ns,
                           "rank 0's world size", 0, &val, &len);
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

/* See context.h. */
int ddplug__rendezvous_join(ddplug_context *ctx) {
  const int rank = ctx->world.rank;
  int s = claim_rank(ctx);
  if (s != DDPLUG_OK) return s;
  s = publish_join(ctx);
  if (s != DDPLUG_OK) return s;
  s = compare_world_size(ctx);
  if (s != DDPLUG_OK) return s;
  if (rank == 0) {
    s = ddplug__startup_checks(ctx);
    if (s != DDPLUG_OK) return s;
  }
  return read_verdict(ctx);
}
