/* shrink.c — elastic in place: with elastic.on_peer_lost = "shrink", the
 * survivors of a lost rank re-form the group without restarting.
 *
 * Generations. The group of ddplug_open is generation 0; each re-formation
 * makes the next. Generation G >= 1 keeps its runtime keys under
 * "ddplug/g<G>/" (abort, closing, split agreement, arrivals, readiness), so
 * that renumbered ranks never read a key of the previous generation, and its
 * plugin gets the run id <base>g<G> (its own store prefix and, for the cpu
 * plugin, its own shared-memory names).
 *
 * Who survived. Every process registers "ddplug/gone/<identity>" as a
 * disconnect key at open (join.c): the store sets it when the process's
 * connection closes without a goodbye. A survivor sets
 * "ddplug/g<G>/here/<previous rank>" and waits until each member of the
 * previous generation has arrived or is gone — a rank that has not noticed
 * the loss yet is still connected, and arrives when its next call fails.
 * The arrivals, in the order of their previous ranks, are the new world;
 * locality is the previous generation's, renumbered. A survivor lost during
 * the re-formation fails the new group's creation (PEER_LOST), and the
 * survivors may shrink again.
 *
 * The store is rank 0's (unless external): when rank 0 is the one lost, the
 * store is gone with it and the re-formation fails, naming that.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "run/context.h"
#include "store/store.h"

/* How long one poll of the arrivals waits on a key before it looks again
 * at every member. */
#define ARRIVAL_SLICE_MS 50

/* See context.h. */
int ddplug__membership_init(ddplug_context *ctx) {
  int n = ctx->world.world_size;
  ctx->identity = ctx->world.rank;
  ctx->identity_of = ddplug__calloc((size_t)n, sizeof *ctx->identity_of);
  if (!ctx->identity_of) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  for (int r = 0; r < n; r++) ctx->identity_of[r] = r;
  ctx->prev_world_size = n;
  ddplug__strlcpy(ctx->base_run_id, ctx->run_id, sizeof ctx->base_run_id);
  char *mode = NULL;
  if (ddplug_config_get_string(ctx->cfg, "elastic.on_peer_lost", &mode) == DDPLUG_OK) {
    ctx->elastic_shrink = !strcmp(mode, "shrink");
    ddplug_free(mode);
  }
  int64_t min = 1;
  ddplug_config_get_int(ctx->cfg, "elastic.min_world_size", &min);
  ctx->min_world_size = (int32_t)(min < 1 ? 1 : min);
  return DDPLUG_OK;
}

/* See context.h. */
void ddplug__membership_free(ddplug_context *ctx) {
  ddplug__free(ctx->identity_of);
  ddplug__free(ctx->prev_rank_of);
  ctx->identity_of = ctx->prev_rank_of = NULL;
}

static void fill_membership(const ddplug_context *ctx, ddplug_membership *out) {
  ddplug_membership m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.abi_version = DDPLUG_ABI_VERSION;
  m.generation = ctx->generation;
  m.rank = ctx->world.rank;
  m.world_size = ctx->world.world_size;
  m.identity = ctx->identity;
  m.previous_rank = ctx->prev_rank_of ? ctx->prev_rank_of[ctx->world.rank] : ctx->world.rank;
  m.previous_world_size = ctx->prev_world_size;
  m.lost_count = ctx->lost_count;
  ddplug__strlcpy(m.lost, ctx->lost, sizeof m.lost);
  uint32_t size = out->struct_size;
  memcpy(out, &m, DDPLUG__MIN((size_t)size, sizeof m));
  out->struct_size = size;
}

DDPLUG_API int ddplug_context_membership(const ddplug_context *ctx, ddplug_membership *out) {
  if (!ctx || !out || out->struct_size < offsetof(ddplug_membership, lost))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_context_membership: ctx and out must not be NULL (initialise "
                       "out with DDPLUG_MEMBERSHIP_INIT)");
  fill_membership(ctx, out);
  return DDPLUG_OK;
}

/* The new world: which previous ranks arrived (here[r]), in order. */
typedef struct reform {
  uint64_t gen;
  char prefix[32];
  int old_world;
  int *here;      /* [old_world] 1 arrived, 0 gone                      */
  int n;          /* arrivals                                          */
  int32_t *old_of; /* [n] previous rank of each new rank                */
} reform;

static void reform_free(reform *f) {
  ddplug__free(f->here);
  ddplug__free(f->old_of);
}

/* Set our arrival, then wait until every previous member arrived or is gone. */
static int gather_arrivals(ddplug_context *ctx, reform *f, uint64_t deadline) {
  int W = f->old_world, me = ctx->world.rank;
  char key[96];
  snprintf(key, sizeof key, "%shere/%d", f->prefix, me);
  char val[32];
  int vlen = snprintf(val, sizeof val, "%d", (int)ctx->identity);
  int s = ddplug_store_set(ctx->store, key, val, (uint64_t)vlen);
  if (s != DDPLUG_OK)
    return ddplug__err(DDPLUG_E_PEER_LOST,
                       "re-forming the group: the rendezvous store at %s:%d does not answer "
                       "(%s): rank 0 serves it, and in-place shrink cannot survive its loss — "
                       "use an external store (rendezvous.external) or restart mode "
                       "(elastic.on_peer_lost = \"stop\" under a launcher that restarts)",
                       ctx->store_addr, ctx->store_port, ddplug_last_error());
  int *state = ddplug__calloc((size_t)W, sizeof *state); /* 0 unknown, 1 here, 2 gone */
  if (!state) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  state[me] = 1;
  for (;;) {
    int unknown = -1;
    for (int r = 0; r < W; r++) {
      if (state[r]) continue;
      void *v = NULL;
      uint64_t len = 0;
      snprintf(key, sizeof key, "%shere/%d", f->prefix, r);
      s = ddplug__store_get_within(ctx->store, key, 0, DDPLUG__FAIL_PATH_MS, &v, &len);
      if (s == DDPLUG_OK) {
        state[r] = 1;
      } else if (s == DDPLUG_E_TIMEOUT || s == DDPLUG_E_NOT_FOUND) {
        snprintf(key, sizeof key, "ddplug/gone/%d", (int)ctx->identity_of[r]);
        s = ddplug__store_get_within(ctx->store, key, 0, DDPLUG__FAIL_PATH_MS, &v, &len);
        if (s == DDPLUG_OK) state[r] = 2;
        else if (s != DDPLUG_E_TIMEOUT && s != DDPLUG_E_NOT_FOUND) break;
        else if (unknown < 0) unknown = r;
      } else {
        break;
      }
      ddplug_free(v);
    }
    if (s != DDPLUG_OK && s != DDPLUG_E_TIMEOUT && s != DDPLUG_E_NOT_FOUND) {
      s = ddplug__err(DDPLUG_E_PEER_LOST,
                      "re-forming the group: the rendezvous store stopped answering (%s): "
                      "rank 0 serves it, and in-place shrink cannot survive its loss",
                      ddplug_last_error());
      break;
    }
    if (unknown < 0) {
      s = DDPLUG_OK;
      break;
    }
    if (ddplug__now_ns() >= deadline) {
      int *missing = ddplug__calloc((size_t)W, sizeof *missing);
      char list[512] = "?";
      for (int r = 0; missing && r < W; r++) missing[r] = state[r] == 0;
      if (missing) ddplug__rank_list(missing, W, list, sizeof list);
      ddplug__free(missing);
      s = ddplug__err(DDPLUG_E_TIMEOUT,
                      "re-forming the group: previous rank(s) %s neither arrived nor left "
                      "within the timeout (alive but stuck outside ddplug calls?)",
                      list);
      break;
    }
    /* wait on the first unknown member's arrival for a slice */
    snprintf(key, sizeof key, "%shere/%d", f->prefix, unknown);
    const char *k = key;
    int64_t slice = DDPLUG__MIN(ddplug__remaining_ms(deadline), (int64_t)ARRIVAL_SLICE_MS);
    (void)ddplug_store_wait(ctx->store, &k, 1, slice > 0 ? slice : 1);
  }
  if (s == DDPLUG_OK) {
    f->here = state;
    for (int r = 0; r < W; r++) f->n += state[r] == 1;
    for (int r = 0; r < W; r++) state[r] = state[r] == 1;
  } else {
    ddplug__free(state);
  }
  return s;
}

/* The new world's arrays from the previous generation's, renumbered. */
static int build_world(ddplug_context *ctx, reform *f, int32_t **identity_of,
                       int32_t **node_of, int32_t **local_of, int64_t **pid_of, int *nodes,
                       int *my_rank) {
  int n = f->n, W = f->old_world;
  f->old_of = ddplug__calloc((size_t)n, sizeof *f->old_of);
  *identity_of = ddplug__calloc((size_t)n, sizeof **identity_of);
  *node_of = ddplug__calloc((size_t)n, sizeof **node_of);
  *local_of = ddplug__calloc((size_t)n, sizeof **local_of);
  *pid_of = ddplug__calloc((size_t)n, sizeof **pid_of);
  int *node_map = ddplug__calloc((size_t)W + 1, sizeof *node_map);
  int *count = ddplug__calloc((size_t)W + 1, sizeof *count);
  if (!f->old_of || !*identity_of || !*node_of || !*local_of || !*pid_of || !node_map || !count) {
    ddplug__free(node_map);
    ddplug__free(count);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  for (int i = 0; i <= W; i++) node_map[i] = -1;
  int k = 0, nn = 0;
  for (int r = 0; r < W; r++) {
    if (!f->here[r]) continue;
    int old_node = ctx->node_of_rank[r];
    if (old_node < 0 || old_node > W) old_node = W;
    if (node_map[old_node] < 0) node_map[old_node] = nn++;
    int node = node_map[old_node];
    f->old_of[k] = r;
    (*identity_of)[k] = ctx->identity_of[r];
    (*node_of)[k] = node;
    (*local_of)[k] = count[node]++;
    (*pid_of)[k] = ctx->pid_of_rank[r];
    if (r == ctx->world.rank) *my_rank = k;
    k++;
  }
  *nodes = nn;
  ddplug__free(node_map);
  ddplug__free(count);
  return DDPLUG_OK;
}

/* Wait until every new rank created its member of the group. */
static int wait_ready(ddplug_context *ctx, uint64_t deadline) {
  int n = ctx->world.world_size;
  char key[96];
  snprintf(key, sizeof key, "%sready/%d", ctx->key_prefix, ctx->world.rank);
  int s = ddplug_store_set(ctx->store, key, "1", 1);
  if (s != DDPLUG_OK) return s;
  char **keys = ddplug__calloc((size_t)n, sizeof *keys);
  if (!keys) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  for (int r = 0; r < n && s == DDPLUG_OK; r++) {
    keys[r] = ddplug__asprintf("%sready/%d", ctx->key_prefix, r);
    if (!keys[r]) s = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  if (s == DDPLUG_OK)
    s = ddplug__wait_keys(ctx, ctx->store, (const char *const *)keys, (uint32_t)n, deadline,
                          "re-forming the group: waiting for every survivor's new group", 0);
  for (int r = 0; r < n; r++) ddplug__free(keys[r]);
  ddplug__free(keys);
  return s;
}

/* Create the new generation's group: the plugin's group_shrink where it has
 * one (the old group is destroyed after), else group_create over the new
 * world (the old group destroyed first). A group_shrink that declines
 * (DDPLUG_E_UNSUPPORTED: it cannot shrink this group in place) gets the
 * same as a plugin without the slot: *old is destroyed (and set NULL) and
 * group_create runs. */
static int create_new_group(ddplug_context *ctx, ddplug_plugin_group **old) {
  const ddplug_plugin *t = &ctx->plugin->table;
  if (!*old || !t->group_shrink) return ddplug__group_create(ctx);
  /* the slot needs the same init group_create would get */
  ddplug__services_init(ctx);
  ddplug_group_init in = ctx->init;
  in.rank = ctx->world.rank;
  in.world_size = ctx->world.world_size;
  in.local_rank = ctx->world.local_rank;
  in.local_world_size = ctx->world.local_world_size;
  in.node_rank = ctx->world.node_rank;
  in.num_nodes = ctx->num_nodes;
  in.node_of_rank = ctx->node_of_rank;
  in.local_rank_of = ctx->local_rank_of;
  in.pid_of_rank = ctx->pid_of_rank;
  in.run_id = ctx->run_id;
  ctx->init = in;
  ddplug_plugin_group *g = NULL;
  ddplug__plugin_err_clear(ctx);
  int s = t->group_shrink(*old, &ctx->init, &ctx->services, ctx->prev_rank_of, &g);
  if (s == DDPLUG_E_UNSUPPORTED) {
    s = ddplug__plugin_err_take(ctx, s, "group_shrink");
    DDPLUG__INFO("re-forming the group: group_shrink declined (%s): a new group over the "
                 "survivors instead",
                 ddplug_last_error());
    t->group_destroy(*old);
    *old = NULL;
    return ddplug__group_create(ctx);
  }
  if (s != DDPLUG_OK) return ddplug__plugin_err_take(ctx, s, "group_shrink");
  pthread_mutex_lock(&ctx->mu);
  ctx->group = g;
  pthread_mutex_unlock(&ctx->mu);
  return ddplug__ctx_check(ctx);
}

DDPLUG_API int ddplug_shrink(ddplug_context *ctx, int64_t timeout_ms, ddplug_membership *out) {
  static const char what[] = "ddplug_shrink";
  if (!ctx) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx is NULL", what);
  if (out && out->struct_size < offsetof(ddplug_membership, lost))
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "%s: out is too small (initialise it with DDPLUG_MEMBERSHIP_INIT)", what));
  if (!ctx->elastic_shrink)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "%s: the config's elastic.on_peer_lost is \"stop\": a lost rank ends the run; set it "
        "to \"shrink\" to re-form the group in place", what));
  if (atomic_load_explicit(&ctx->state, memory_order_acquire) == DDPLUG__CTX_OPEN)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "%s: rank %d: no rank was lost (the run is healthy): call it after a call failed with "
        "PEER_LOST", what, ctx->world.rank));
  if (ctx->abort_status != DDPLUG_E_PEER_LOST)
    return ddplug__ctx_capture_error(ctx, ddplug__err(ctx->abort_status,
        "%s (%s ends the run; only a lost rank is shrunk away)", ctx->abort_reason,
        ddplug_status_name(ctx->abort_status)));
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT) timeout_ms = ctx->coll_timeout_ms;
  if (timeout_ms <= 0)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "%s: timeout %lld ms must be positive (or DDPLUG_TIMEOUT_DEFAULT)", what,
        (long long)timeout_ms));
  uint64_t deadline = ddplug__deadline_ns(timeout_ms);
  char cause[DDPLUG__ERRMSG_MAX];
  ddplug__strlcpy(cause, ctx->abort_reason, sizeof cause);

  /* the previous generation's group and watcher go first */
  ddplug__watcher_stop(ctx);
  const int slot = ctx->plugin->table.group_shrink != NULL;
  ddplug_plugin_group *old = NULL;
  if (slot) {
    pthread_mutex_lock(&ctx->mu);
    old = ctx->group;
    ctx->group = NULL;
    while (ctx->aborting > 0) pthread_cond_wait(&ctx->abort_cv, &ctx->mu);
    pthread_mutex_unlock(&ctx->mu);
    if (old) ddplug__requests_orphan(ctx, old);
  } else {
    ddplug__group_destroy(ctx);
  }
  ddplug_store *handles[3] = {ctx->store, ctx->watch_store, ctx->plugin_store};
  for (int i = 0; i < 3; i++)
    if (handles[i]) ddplug__store_set_default_timeout(handles[i], ctx->rdzv_timeout_ms);

  reform f;
  memset(&f, 0, sizeof f);
  f.gen = ctx->generation + 1;
  f.old_world = ctx->world.world_size;
  snprintf(f.prefix, sizeof f.prefix, "ddplug/g%llu/", (unsigned long long)f.gen);
  int32_t *identity_of = NULL, *node_of = NULL, *local_of = NULL;
  int64_t *pid_of = NULL;
  int nodes = 0, my_rank = -1;
  int s = gather_arrivals(ctx, &f, deadline);
  if (s == DDPLUG_OK)
    s = build_world(ctx, &f, &identity_of, &node_of, &local_of, &pid_of, &nodes, &my_rank);
  if (s == DDPLUG_OK && f.n < ctx->min_world_size)
    s = ddplug__err(DDPLUG_E_PEER_LOST,
                    "%s; %d rank%s remain, fewer than elastic.min_world_size = %d: the run "
                    "ends",
                    cause, f.n, f.n == 1 ? "" : "s", (int)ctx->min_world_size);
  if (s != DDPLUG_OK) {
    ddplug__free(identity_of);
    ddplug__free(node_of);
    ddplug__free(local_of);
    ddplug__free(pid_of);
    reform_free(&f);
    if (old) ctx->plugin->table.group_destroy(old);
    ddplug__watcher_start(ctx);
    return ddplug__ctx_capture_error(ctx, s);
  }

  /* the new generation */
  char lost[256] = "";
  int *gone = ddplug__calloc((size_t)f.old_world, sizeof *gone);
  for (int r = 0; gone && r < f.old_world; r++) gone[r] = !f.here[r];
  int nlost = gone ? ddplug__rank_list(gone, f.old_world, lost, sizeof lost) : 0;
  ddplug__free(gone);
  int old_rank = ctx->world.rank, old_world = ctx->world.world_size;
  ddplug__free(ctx->identity_of);
  ddplug__free(ctx->prev_rank_of);
  ddplug__free(ctx->node_of_rank);
  ddplug__free(ctx->local_rank_of);
  ddplug__free(ctx->pid_of_rank);
  ctx->identity_of = identity_of;
  ctx->prev_rank_of = f.old_of;
  f.old_of = NULL;
  ctx->node_of_rank = node_of;
  ctx->local_rank_of = local_of;
  ctx->pid_of_rank = pid_of;
  ctx->num_nodes = nodes;
  ctx->prev_world_size = old_world;
  ctx->lost_count = nlost;
  ddplug__strlcpy(ctx->lost, lost, sizeof ctx->lost);
  ctx->generation = f.gen;
  ddplug__strlcpy(ctx->key_prefix, f.prefix, sizeof ctx->key_prefix);
  snprintf(ctx->abort_key, sizeof ctx->abort_key, "%sabort", f.prefix);
  char run_id[96];
  snprintf(run_id, sizeof run_id, "%sg%llu", ctx->base_run_id, (unsigned long long)f.gen);
  ddplug__strlcpy(ctx->run_id, run_id, sizeof ctx->run_id);
  ctx->world.rank = my_rank;
  ctx->world.world_size = f.n;
  ctx->world.node_rank = node_of[my_rank];
  ctx->world.local_rank = local_of[my_rank];
  int local_world = 0;
  for (int r = 0; r < f.n; r++) local_world += node_of[r] == node_of[my_rank];
  ctx->world.local_world_size = local_world;
  reform_free(&f);
  ddplug__log_set_rank(my_rank);

  /* this generation's loss key, then open again */
  char lost_msg[DDPLUG__ERRMSG_MAX];
  int n = snprintf(lost_msg, sizeof lost_msg,
                   "PEER_LOST|rank %d (was rank %d before the group was re-formed; pid %d on "
                   "host %s) exited or was killed: its connection to the rendezvous store "
                   "closed",
                   my_rank, old_rank, (int)getpid(), ctx->host_id);
  s = ddplug_store_on_disconnect(ctx->store, ctx->abort_key, lost_msg,
                                 (uint64_t)DDPLUG__MIN(n, (int)sizeof lost_msg - 1));
  pthread_mutex_lock(&ctx->mu);
  ctx->abort_status = 0;
  ctx->abort_reason[0] = '\0';
  ctx->plugin_notified = 0;
  ctx->seq = 0;
  atomic_store_explicit(&ctx->state, DDPLUG__CTX_OPEN, memory_order_release);
  pthread_mutex_unlock(&ctx->mu);
  if (ctx->data && ctx->data_reform) ctx->data_reform(ctx->data, my_rank, ctx->world.world_size);
  if (s == DDPLUG_OK) s = ddplug__watcher_start(ctx);
  if (s == DDPLUG_OK) s = create_new_group(ctx, &old);
  if (old) ctx->plugin->table.group_destroy(old);
  if (s == DDPLUG_OK) s = wait_ready(ctx, deadline + (uint64_t)ctx->coll_timeout_ms * 1000000ull);
  if (s != DDPLUG_OK) {
    if (atomic_load(&ctx->state) == DDPLUG__CTX_OPEN) {
      char reason[DDPLUG__ERRMSG_MAX + 64];
      snprintf(reason, sizeof reason, "rank %d failed re-forming the group: %s", my_rank,
               ddplug_last_error());
      ddplug__ctx_abort(ctx, s, reason, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
    }
    return ddplug__ctx_capture_error(ctx, ddplug__ctx_check(ctx));
  }
  if (my_rank == 0)
    DDPLUG__WARN("lost rank%s %s of %d (%s): the group is re-formed with %d rank%s "
                 "(generation %llu)",
                 nlost == 1 ? "" : "s", lost, old_world, cause, ctx->world.world_size,
                 ctx->world.world_size == 1 ? "" : "s", (unsigned long long)ctx->generation);
  if (out) fill_membership(ctx, out);
  return DDPLUG_OK;
}
