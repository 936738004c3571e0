/* split_context.c — the data-split state of a context (ctx->data): the
 * policy read from the config, and ddplug_split_claim / _owner / _agree.
 * Agreement goes through the store: rank r publishes
 * "ddplug/split/<stream>/<call>/<r>" = "<owner>|<claimant>", then reads all.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/context.h"
#include "data/data.h"

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;

static int parse_owner(const char *text, int *owner) {
  static const struct { const char *name; int owner; } names[] = {
      {"auto", DDPLUG_OWNER_UNSET}, {"plugin", DDPLUG_OWNER_PLUGIN},
      {"framework", DDPLUG_OWNER_FRAMEWORK}, {"user", DDPLUG_OWNER_USER}};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(names); i++)
    if (strcmp(text, names[i].name) == 0) {
      *owner = names[i].owner;
      return 0;
    }
  return -1;
}

/* A string setting, or NULL when absent (the schema's default applies). */
static char *cfg_string(const ddplug_config *cfg, const char *path) {
  char *v = NULL;
  if (ddplug_config_get_string(cfg, path, &v) != DDPLUG_OK) return NULL;
  return v;
}

/* data_split.streams: {"<name>": {"owner": "..."}, ...} */
static int read_streams(const ddplug_config *cfg, const char *origin,
                        ddplug__data_policy *p) {
  char *text = cfg_string(cfg, "data_split.streams");
  if (!text) return DDPLUG_OK;
  json_error_t jerr;
  json_t *obj = json_loads(text, 0, &jerr);
  ddplug_free(text);
  if (!json_is_object(obj)) {
    json_decref(obj);
    return ddplug__err(DDPLUG_E_CONFIG, "%s: data_split.streams is not an object",
                       origin);
  }
  p->streams = ddplug__calloc(json_object_size(obj) + 1, sizeof *p->streams);
  if (!p->streams) {
    json_decref(obj);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "data split policy: out of memory");
  }
  const char *name;
  json_t *val;
  json_object_foreach(obj, name, val) {
    const char *o = json_string_value(json_object_get(val, "owner"));
    ddplug__forced_owner *f = &p->streams[p->nstreams];
    if (strlen(name) > DDPLUG__STREAM_MAX) {
      int rc = ddplug__err(DDPLUG_E_CONFIG,
                           "%s: data_split.streams: stream name '%s' is longer "
                           "than %d characters",
                           origin, name, DDPLUG__STREAM_MAX);
      json_decref(obj);
      return rc;
    }
    if (!o || parse_owner(o, &f->owner) != 0) {
      int rc = ddplug__err(DDPLUG_E_CONFIG,
                           "%s: data_split.streams.%s.owner must be auto, "
                           "plugin, framework or user",
                           origin, name);
      json_decref(obj);
      return rc;
    }
    ddplug__strlcpy(f->stream, name, sizeof f->stream);
    snprintf(f->by, sizeof f->by, "data_split.streams.%s.owner in %s", name, origin);
    p->nstreams++;
  }
  json_decref(obj);
  return DDPLUG_OK;
}

static int read_policy(const ddplug_config *cfg, ddplug__data_policy *p) {
  memset(p, 0, sizeof *p);
  p->audit_mode = DDPLUG__AUDIT_FIRST_EPOCH;
  p->exact_max = 100000000ull;
  if (!cfg) return DDPLUG_OK;
  const char *origin = ddplug_config_origin(cfg);
  char *v = cfg_string(cfg, "data_split.owner");
  if (v) {
    int bad = parse_owner(v, &p->fallback.owner);
    ddplug_free(v);
    if (bad)
      return ddplug__err(DDPLUG_E_CONFIG,
                         "%s: data_split.owner must be auto, plugin, framework "
                         "or user", origin);
    snprintf(p->fallback.by, sizeof p->fallback.by, "data_split.owner in %s", origin);
  }
  v = cfg_string(cfg, "data_split.audit");
  if (v) {
    if (!strcmp(v, "off")) p->audit_mode = DDPLUG__AUDIT_OFF;
    else if (!strcmp(v, "every_epoch")) p->audit_mode = DDPLUG__AUDIT_EVERY_EPOCH;
    ddplug_free(v);
  }
  v = cfg_string(cfg, "data_split.on_violation");
  if (v) {
    p->on_violation_warn = strcmp(v, "warn") == 0;
    ddplug_free(v);
  }
  int64_t m;
  if (ddplug_config_get_int(cfg, "data_split.audit_exact_max", &m) == DDPLUG_OK && m >= 0)
    p->exact_max = (uint64_t)m;
  int st = read_streams(cfg, origin, p);
  if (st) {
    ddplug__free(p->streams);
    p->streams = NULL;
  }
  return st;
}

int ddplug__ctx_data(ddplug_context *ctx, ddplug__data_state **out) {
  pthread_mutex_lock(&g_init_mu);
  int st = DDPLUG_OK;
  if (!ctx->data) {
    ddplug__data_policy p;
    st = read_policy(ctx->cfg, &p);
    ddplug__data_state *state = NULL;
    if (st == DDPLUG_OK) st = ddplug__data_state_new(&p, &state);
    if (st == DDPLUG_OK) {
      ctx->data = state;
      ctx->data_free = ddplug__data_state_free;
    }
  }
  *out = ctx->data;
  pthread_mutex_unlock(&g_init_mu);
  return st;
}

static int check_args(ddplug_context *ctx, const char *stream, const char *what) {
  if (!ctx || !stream)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx and stream must not be NULL", what);
  return ddplug__stream_name_check(stream, what);
}

DDPLUG_API int ddplug_split_claim(ddplug_context *ctx, const char *stream,
                                  int owner, const char *claimant) {
  int st = check_args(ctx, stream, "ddplug_split_claim");
  if (st) return ctx ? ddplug__ctx_fail(ctx, st) : st;
  if (owner < DDPLUG_OWNER_PLUGIN || owner > DDPLUG_OWNER_USER || !claimant || !*claimant)
    return ddplug__ctx_fail(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "ddplug_split_claim: stream '%s': owner %d must be DDPLUG_OWNER_PLUGIN, "
        "_FRAMEWORK or _USER and the claimant a non-empty description",
        stream, owner));
  ddplug__data_state *data;
  st = ddplug__ctx_data(ctx, &data);
  if (st == DDPLUG_OK) st = ddplug__split_claim(data, stream, owner, claimant);
  if (st == DDPLUG_OK)
    DDPLUG__INFO("stream '%s' is split by %s (claimed by '%s')", stream,
                 ddplug_owner_name(owner), claimant);
  return st ? ddplug__ctx_fail(ctx, st) : DDPLUG_OK;
}

DDPLUG_API int ddplug_split_owner(ddplug_context *ctx, const char *stream,
                                  int *owner, char *claimant, uint64_t cap) {
  int st = check_args(ctx, stream, "ddplug_split_owner");
  if (st) return ctx ? ddplug__ctx_fail(ctx, st) : st;
  if (!owner || (claimant && cap == 0))
    return ddplug__ctx_fail(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "ddplug_split_owner: owner must not be NULL (and cap > 0 with a claimant buffer)"));
  ddplug__data_state *data;
  st = ddplug__ctx_data(ctx, &data);
  if (st) return ddplug__ctx_fail(ctx, st);
  ddplug__split_resolve(data, stream, owner, claimant, claimant ? (size_t)cap : 0);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_split_agree(ddplug_context *ctx, const char *stream,
                                  int64_t timeout_ms) {
  int st = check_args(ctx, stream, "ddplug_split_agree");
  if (st) return ctx ? ddplug__ctx_fail(ctx, st) : st;
  if ((st = ddplug__ctx_check(ctx))) return ddplug__ctx_fail(ctx, st);
  ddplug__data_state *data;
  if ((st = ddplug__ctx_data(ctx, &data))) return ddplug__ctx_fail(ctx, st);
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT) timeout_ms = ctx->coll_timeout_ms;
  int owner;
  char claimant[DDPLUG__CLAIMANT_MAX];
  ddplug__split_resolve(data, stream, &owner, claimant, sizeof claimant);
  ddplug__data_lock(data);
  ddplug__stream *s = ddplug__data_stream(data, stream);
  uint64_t call = s ? ++s->agree_calls : 0;
  ddplug__data_unlock(data);
  if (!s) return ddplug__ctx_fail(ctx, DDPLUG_E_NO_MEMORY);
  int world = ctx->world.world_size, rank = ctx->world.rank;
  char key[DDPLUG__STREAM_MAX + 96], value[DDPLUG__CLAIMANT_MAX + 16];
  snprintf(key, sizeof key, "ddplug/split/%s/%llu/%d", stream, (unsigned long long)call, rank);
  int vlen = snprintf(value, sizeof value, "%d|%s", owner, claimant);
  if ((st = ddplug_store_set(ctx->store, key, value, (uint64_t)vlen)))
    return ddplug__ctx_fail(ctx, ddplug__err_prefix(st, "ddplug_split_agree"));
  char **keys = ddplug__calloc((size_t)world, sizeof *keys);
  int *owners = ddplug__calloc((size_t)world, sizeof *owners);
  char **claimants = ddplug__calloc((size_t)world, sizeof *claimants);
  st = keys && owners && claimants ? DDPLUG_OK
                                   : ddplug__err(DDPLUG_E_NO_MEMORY, "ddplug_split_agree: out of memory");
  for (int r = 0; r < world && st == DDPLUG_OK; r++) {
    keys[r] = ddplug__asprintf("ddplug/split/%s/%llu/%d", stream, (unsigned long long)call, r);
    if (!keys[r]) st = ddplug__err(DDPLUG_E_NO_MEMORY, "ddplug_split_agree: out of memory");
  }
  if (st == DDPLUG_OK) {
    char what[DDPLUG__STREAM_MAX + 64];
    snprintf(what, sizeof what, "ddplug_split_agree('%s')", stream);
    st = ddplug__wait_keys(ctx, ctx->store, (const char *const *)keys, (uint32_t)world,
                           ddplug__deadline_ns(timeout_ms), what, 0);
    if (ddplug__own_timeout(ctx, st)) { /* name the ranks that did not come */
      char list[512] = "";
      size_t used = 0;
      for (int r = 0; r < world && used + 16 < sizeof list; r++) {
        void *v = NULL;
        uint64_t len;
        if (ddplug_store_get(ctx->store, keys[r], 0, &v, &len) == DDPLUG_OK) {
          ddplug_free(v);
          continue;
        }
        used += (size_t)snprintf(list + used, sizeof list - used, used ? ", %d" : "%d", r);
      }
      st = ddplug__err(DDPLUG_E_TIMEOUT,
                       "%s: rank(s) %s did not call it within %.1f s — every rank "
                       "must call ddplug_split_agree for the stream",
                       what, list, (double)timeout_ms / 1000.0);
    }
  }
  for (int r = 0; r < world && st == DDPLUG_OK; r++) {
    void *v = NULL;
    uint64_t len = 0;
    st = ddplug_store_get(ctx->store, keys[r], timeout_ms, &v, &len);
    if (st) break;
    char *text = v;
    char *bar = strchr(text, '|');
    owners[r] = atoi(text);
    claimants[r] = ddplug__strdup(bar ? bar + 1 : "");
    ddplug_free(v);
    if (!claimants[r]) st = ddplug__err(DDPLUG_E_NO_MEMORY, "ddplug_split_agree: out of memory");
  }
  if (st == DDPLUG_OK)
    st = ddplug__split_agree_check(stream, world, owners, (const char *const *)claimants);
  for (int r = 0; r < world; r++) {
    if (keys) ddplug__free(keys[r]);
    if (claimants) ddplug__free(claimants[r]);
  }
  ddplug__free(keys);
  ddplug__free(owners);
  ddplug__free(claimants);
  return st ? ddplug__ctx_fail(ctx, st) : DDPLUG_OK;
}
