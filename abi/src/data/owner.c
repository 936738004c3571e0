/* owner.c — who splits each data stream: the stream-name rule, the owners
 * the config forces, the data-split state of a context (ctx->data, created
 * from its config on first use) with its per-stream registry, the claim
 * rules, and the check that all ranks resolved the same owner.
 *
 * Rules (ddplug_split_claim): the first claim of a stream wins; the same
 * owner again is fine (the first claimant is kept); a different owner is
 * SPLIT_CONFLICT naming both claimants and what to change. A config that
 * forces an owner (data_split.streams.<name>.owner, else data_split.owner,
 * unless "auto") makes every disagreeing claim a conflict naming the key;
 * ddplug_split_forced_owner answers the same question for the host adapters.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "run/context.h"
#include "data/data.h"

/* ---- stream names ---------------------------------------------------------- */

int ddplug__stream_name_check(const char *stream, const char *what) {
  if (!stream)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: the stream name is NULL", what);
  size_t len = strlen(stream);
  if (len == 0 || len > DDPLUG__STREAM_MAX)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream name '%.80s%s' must have 1 to %d characters "
                       "(it has %zu)",
                       what, stream, len > 80 ? "..." : "", DDPLUG__STREAM_MAX, len);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)stream[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (ok) continue;
    if (c >= 0x20 && c < 0x7f)
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "%s: stream name '%s' has character '%c' at %zu; use "
                         "letters, digits, '_', '-' and '.'",
                         what, stream, c, i);
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: stream name has byte 0x%02x at %zu; use letters, "
                       "digits, '_', '-' and '.'",
                       what, c, i);
  }
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_stream_name_check(const char *stream) {
  return ddplug__stream_name_check(stream, "ddplug_stream_name_check");
}

/* ---- the config's forced owners -------------------------------------------- */

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

/* data_split.streams: {"<name>": {"owner": "...", "sampler": {...}}, ...};
 * a stream without "owner" inherits data_split.owner. */
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
  int rc = DDPLUG_OK;
  json_object_foreach(obj, name, val) {
    char what[64];
    snprintf(what, sizeof what, "%s: data_split.streams", origin);
    if (ddplug__stream_name_check(name, what) != DDPLUG_OK) {
      rc = DDPLUG_E_CONFIG; /* the last error names the name and the rule */
      break;
    }
    json_t *o = json_object_get(val, "owner");
    if (!o) continue;
    ddplug__forced_owner *f = &p->streams[p->nstreams];
    if (!json_is_string(o) || parse_owner(json_string_value(o), &f->owner) != 0) {
      rc = ddplug__err(DDPLUG_E_CONFIG,
                       "%s: data_split.streams.%s.owner must be auto, plugin, "
                       "framework or user",
                       origin, name);
      break;
    }
    f->set = 1;
    ddplug__strlcpy(f->stream, name, sizeof f->stream);
    snprintf(f->by, sizeof f->by, "data_split.streams.%s.owner in %s", name, origin);
    p->nstreams++;
  }
  json_decref(obj);
  return rc;
}

int ddplug__data_policy_read(const ddplug_config *cfg, ddplug__data_policy *p) {
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
    p->nstreams = 0;
  }
  return st;
}

const ddplug__forced_owner *ddplug__policy_forced(const ddplug__data_policy *p,
                                                  const char *stream) {
  for (uint32_t i = 0; i < p->nstreams; i++)
    if (p->streams[i].set && strcmp(p->streams[i].stream, stream) == 0)
      return &p->streams[i];
  return &p->fallback;
}

DDPLUG_API int ddplug_split_forced_owner(const ddplug_config *cfg,
                                         const char *stream, int *owner,
                                         char *by, uint64_t cap) {
  static const char what[] = "ddplug_split_forced_owner";
  int st = ddplug__stream_name_check(stream, what);
  if (st) return st;
  if (!owner || (by && cap == 0))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: owner must not be NULL (and cap > 0 with a buffer)", what);
  ddplug__data_policy p;
  if ((st = ddplug__data_policy_read(cfg, &p))) return st;
  const ddplug__forced_owner *f = ddplug__policy_forced(&p, stream);
  *owner = f->owner;
  if (by) ddplug__strlcpy(by, f->owner != DDPLUG_OWNER_UNSET ? f->by : "", (size_t)cap);
  ddplug__free(p.streams);
  return DDPLUG_OK;
}

/* ---- the per-stream registry and the claim rules --------------------------- */

int ddplug__data_state_new(ddplug__data_policy *policy,
                           ddplug__data_state **out) {
  ddplug__data_state *st = ddplug__calloc(1, sizeof *st);
  pthread_mutex_t *mu = ddplug__malloc(sizeof *mu);
  if (!st || !mu) {
    ddplug__free(st);
    ddplug__free(mu);
    ddplug__free(policy->streams);
    policy->streams = NULL;
    return ddplug__err(DDPLUG_E_NO_MEMORY, "data split state: out of memory");
  }
  pthread_mutex_init(mu, NULL);
  st->mutex = mu;
  st->policy = *policy;
  policy->streams = NULL;
  *out = st;
  return DDPLUG_OK;
}

void ddplug__data_state_free(void *state) {
  ddplug__data_state *st = state;
  if (!st) return;
  pthread_mutex_destroy(st->mutex);
  ddplug__free(st->mutex);
  ddplug__free(st->policy.streams);
  ddplug__free(st->streams);
  ddplug__free(st);
}

/* One context's state is created once, by whichever thread first needs
 * it. */
static pthread_mutex_t g_ctx_data_mu = PTHREAD_MUTEX_INITIALIZER;

/* See data.h. */
int ddplug__ctx_data(ddplug_context *ctx, ddplug__data_state **out) {
  pthread_mutex_lock(&g_ctx_data_mu);
  int st = DDPLUG_OK;
  if (!ctx->data) {
    ddplug__data_policy p;
    st = ddplug__data_policy_read(ctx->cfg, &p);
    ddplug__data_state *state = NULL;
    if (st == DDPLUG_OK) st = ddplug__data_state_new(&p, &state);
    if (st == DDPLUG_OK) {
      ctx->data = state;
      ctx->data_free = ddplug__data_state_free;
      ctx->data_reform = ddplug__data_state_reform;
    }
  }
  *out = ctx->data;
  pthread_mutex_unlock(&g_ctx_data_mu);
  return st;
}

/* See data.h. */
void ddplug__data_state_reform(void *state, int32_t rank, int32_t world) {
  ddplug__data_state *st = state;
  ddplug__data_lock(st);
  for (uint32_t i = 0; i < st->nstreams; i++) {
    struct ddplug_audit *a = st->streams[i].active;
    if (!a) continue;
    a->rank = rank;
    a->world = world;
  }
  ddplug__data_unlock(st);
}

void ddplug__data_lock(ddplug__data_state *st) { pthread_mutex_lock(st->mutex); }
void ddplug__data_unlock(ddplug__data_state *st) {
  pthread_mutex_unlock(st->mutex);
}

ddplug__stream *ddplug__data_stream(ddplug__data_state *st, const char *name) {
  for (uint32_t i = 0; i < st->nstreams; i++)
    if (strcmp(st->streams[i].name, name) == 0) return &st->streams[i];
  if (st->nstreams == st->cap) {
    uint32_t cap = st->cap ? st->cap * 2 : 4;
    ddplug__stream *grown = ddplug__realloc(st->streams, sizeof *grown * cap);
    if (!grown) {
      ddplug__err(DDPLUG_E_NO_MEMORY, "data split state: out of memory");
      return NULL;
    }
    st->streams = grown;
    st->cap = cap;
  }
  ddplug__stream *s = &st->streams[st->nstreams++];
  memset(s, 0, sizeof *s);
  ddplug__strlcpy(s->name, name, sizeof s->name);
  return s;
}

const ddplug__forced_owner *ddplug__data_forced(const ddplug__data_state *st,
                                                const char *stream) {
  return ddplug__policy_forced(&st->policy, stream);
}

/* What to change, for a conflict between two owners. */
static const char *advice(int a, int b) {
  int has_framework = a == DDPLUG_OWNER_FRAMEWORK || b == DDPLUG_OWNER_FRAMEWORK;
  int has_user = a == DDPLUG_OWNER_USER || b == DDPLUG_OWNER_USER;
  if (has_framework && has_user)
    return "turn off the framework's sampler injection (Lightning: "
           "use_distributed_sampler=False) or make the user's sampler "
           "rank-unaware";
  if (has_framework)
    return "turn off the framework's sampler injection (Lightning: "
           "use_distributed_sampler=False) or let ddplug's sampler go";
  return "use ddplug's sampler with a rank-unaware dataset, or set the "
         "stream's owner to 'user' and do not create ddplug's sampler for it";
}

int ddplug__split_claim(ddplug__data_state *st, const char *stream, int owner,
                        const char *claimant) {
  int rc = DDPLUG_OK;
  ddplug__data_lock(st);
  const ddplug__forced_owner *forced = ddplug__data_forced(st, stream);
  ddplug__stream *s = ddplug__data_stream(st, stream);
  if (!s) {
    rc = DDPLUG_E_NO_MEMORY;
  } else if (forced->owner != DDPLUG_OWNER_UNSET && forced->owner != owner) {
    rc = ddplug__err(DDPLUG_E_SPLIT_CONFLICT,
                     "stream '%s': '%s' claims the split for %s, but %s forces "
                     "owner %s: change that setting, or stop '%s' from "
                     "splitting the data",
                     stream, claimant, ddplug_owner_name(owner), forced->by,
                     ddplug_owner_name(forced->owner), claimant);
  } else if (s->owner == DDPLUG_OWNER_UNSET) {
    s->owner = owner;
    ddplug__strlcpy(s->claimant, claimant, sizeof s->claimant);
  } else if (s->owner != owner) {
    rc = ddplug__err(DDPLUG_E_SPLIT_CONFLICT,
                     "stream '%s' is already split by %s (claimed by '%s'); "
                     "'%s' claims it for %s: exactly one layer may split the "
                     "data — %s",
                     stream, ddplug_owner_name(s->owner), s->claimant,
                     claimant, ddplug_owner_name(owner),
                     advice(s->owner, owner));
  }
  ddplug__data_unlock(st);
  return rc;
}

void ddplug__split_resolve(ddplug__data_state *st, const char *stream,
                           int *owner, char *claimant, size_t cap) {
  ddplug__data_lock(st);
  const ddplug__forced_owner *forced = ddplug__data_forced(st, stream);
  const ddplug__stream *s = NULL;
  for (uint32_t i = 0; i < st->nstreams && !s; i++)
    if (strcmp(st->streams[i].name, stream) == 0) s = &st->streams[i];
  if (s && s->owner != DDPLUG_OWNER_UNSET) {
    *owner = s->owner;
    if (claimant) ddplug__strlcpy(claimant, s->claimant, cap);
  } else {
    *owner = forced->owner;
    if (claimant) ddplug__strlcpy(claimant, forced->owner ? forced->by : "", cap);
  }
  ddplug__data_unlock(st);
}

/* Append ", r" for every rank with owners[r] == want (or != want). */
static void list_ranks(char *buf, size_t cap, int world, const int *owners,
                       int want, int equal) {
  size_t used = strlen(buf);
  int first = 1;
  for (int r = 0; r < world && used + 16 < cap; r++) {
    if ((owners[r] == want) != equal) continue;
    used += (size_t)snprintf(buf + used, cap - used, first ? "%d" : ", %d", r);
    first = 0;
  }
}

int ddplug__split_agree_check(const char *stream, int world,
                              const int *owners,
                              const char *const *claimants) {
  /* the majority owner (ties: the lowest value) */
  int best = owners[0], best_n = 0;
  for (int i = 0; i < world; i++) {
    int n = 0;
    for (int r = 0; r < world; r++) n += owners[r] == owners[i];
    if (n > best_n || (n == best_n && owners[i] < best)) {
      best = owners[i];
      best_n = n;
    }
  }
  if (best_n == world) return DDPLUG_OK;
  int odd = -1, maj = -1;
  for (int r = 0; r < world; r++) {
    if (owners[r] != best && odd < 0) odd = r;
    if (owners[r] == best && maj < 0) maj = r;
  }
  char differ[512] = "", agree[512] = "", who_odd[256], who_maj[256];
  list_ranks(differ, sizeof differ, world, owners, best, 0);
  list_ranks(agree, sizeof agree, world, owners, best, 1);
  if (claimants[odd][0]) snprintf(who_odd, sizeof who_odd, "claimed by '%s'", claimants[odd]);
  else snprintf(who_odd, sizeof who_odd, "not claimed");
  if (claimants[maj][0]) snprintf(who_maj, sizeof who_maj, "claimed by '%s'", claimants[maj]);
  else snprintf(who_maj, sizeof who_maj, "not claimed");
  const char *name_odd = ddplug_owner_name(owners[odd]);
  const char *name_maj = ddplug_owner_name(best);
  return ddplug__err(
      DDPLUG_E_SPLIT_CONFLICT,
      "stream '%s': ranks disagree on who splits the data: rank(s) %s resolved "
      "%s (rank %d: %s) while rank(s) %s resolved %s (rank %d: %s) — every "
      "rank must make the same claim: check that the sampler setup and the "
      "config are the same on every rank",
      stream, differ, name_odd ? name_odd : "?", odd, who_odd, agree,
      name_maj ? name_maj : "?", maj, who_maj);
}
