/* agree.c — ddplug_split_claim / _owner / _agree.
 * Agreement goes through the store: rank r publishes
 * "ddplug/split/<stream>/<call>/<r>" = "<owner>|<claimant>" (under the
 * generation's prefix after a re-formation), then reads all.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/context.h"
#include "data/data.h"

static int check_args(ddplug_context *ctx, const char *stream, const char *what) {
  if (!ctx || !stream)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx and stream must not be NULL", what);
  return ddplug__stream_name_check(stream, what);
}

DDPLUG_API int ddplug_split_claim(ddplug_context *ctx, const char *stream,
                                  int owner, const char *claimant) {
  int st = check_args(ctx, stream, "ddplug_split_claim");
  if (st) return ctx ? ddplug__ctx_capture_error(ctx, st) : st;
  if (owner < DDPLUG_OWNER_PLUGIN || owner > DDPLUG_OWNER_USER || !claimant || !*claimant)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "ddplug_split_claim: stream '%s': owner %d must be DDPLUG_OWNER_PLUGIN, "
        "_FRAMEWORK or _USER and the claimant a non-empty description",
        stream, owner));
  ddplug__data_state *data;
  st = ddplug__ctx_data(ctx, &data);
  if (st == DDPLUG_OK) st = ddplug__split_claim(data, stream, owner, claimant);
  if (st == DDPLUG_OK)
    DDPLUG__INFO("stream '%s' is split by %s (claimed by '%s')", stream,
                 ddplug_owner_name(owner), claimant);
  return st ? ddplug__ctx_capture_error(ctx, st) : DDPLUG_OK;
}

DDPLUG_API int ddplug_split_owner(ddplug_context *ctx, const char *stream,
                                  int *owner, char *claimant, uint64_t cap) {
  int st = check_args(ctx, stream, "ddplug_split_owner");
  if (st) return ctx ? ddplug__ctx_capture_error(ctx, st) : st;
  if (!owner || (claimant && cap == 0))
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
        "ddplug_split_owner: owner must not be NULL (and cap > 0 with a claimant buffer)"));
  ddplug__data_state *data;
  st = ddplug__ctx_data(ctx, &data);
  if (st) return ddplug__ctx_capture_error(ctx, st);
  ddplug__split_resolve(data, stream, owner, claimant, claimant ? (size_t)cap : 0);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_split_agree(ddplug_context *ctx, const char *stream,
                                  int64_t timeout_ms) {
  int st = check_args(ctx, stream, "ddplug_split_agree");
  if (st) return ctx ? ddplug__ctx_capture_error(ctx, st) : st;
  if ((st = ddplug__ctx_check(ctx))) return ddplug__ctx_capture_error(ctx, st);
  ddplug__data_state *data;
  if ((st = ddplug__ctx_data(ctx, &data))) return ddplug__ctx_capture_error(ctx, st);
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT) timeout_ms = ctx->coll_timeout_ms;
  int owner;
  char claimant[DDPLUG__CLAIMANT_MAX];
  ddplug__split_resolve(data, stream, &owner, claimant, sizeof claimant);
  ddplug__data_lock(data);
  ddplug__stream *s = ddplug__data_stream(data, stream);
  uint64_t call = s ? ++s->agree_calls : 0;
  ddplug__data_unlock(data);
  if (!s) return ddplug__ctx_capture_error(ctx, DDPLUG_E_NO_MEMORY);
  int world = ctx->world.world_size, rank = ctx->world.rank;
  char key[DDPLUG__STREAM_MAX + 96], value[DDPLUG__CLAIMANT_MAX + 16];
  snprintf(key, sizeof key, "%ssplit/%s/%llu/%d", ctx->key_prefix, stream,
           (unsigned long long)call, rank);
  int vlen = snprintf(value, sizeof value, "%d|%s", owner, claimant);
  if ((st = ddplug_store_set(ctx->store, key, value, (uint64_t)vlen)))
    return ddplug__ctx_capture_error(ctx, ddplug__err_prefix(st, "ddplug_split_agree"));
  char **keys = ddplug__calloc((size_t)world, sizeof *keys);
  int *owners = ddplug__calloc((size_t)world, sizeof *owners);
  char **claimants = ddplug__calloc((size_t)world, sizeof *claimants);
  st = keys && owners && claimants ? DDPLUG_OK
                                   : ddplug__err(DDPLUG_E_NO_MEMORY, "ddplug_split_agree: out of memory");
  for (int r = 0; r < world && st == DDPLUG_OK; r++) {
    keys[r] = ddplug__asprintf("%ssplit/%s/%llu/%d", ctx->key_prefix, stream,
                               (unsigned long long)call, r);
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
  return st ? ddplug__ctx_capture_error(ctx, st) : DDPLUG_OK;
}
