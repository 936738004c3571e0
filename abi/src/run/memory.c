/* memory.c — registered memory: the host API over the plugin's mem_alloc,
 * mem_free and mem_query slots (plugin ABI 1.3). The runtime keeps no state
 * of its own: the plugin owns the allocations and says how its collectives
 * reach a buffer. These calls may come from any thread (the slots allow
 * it), so they read the context's state only through its atomics.
 * SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "run/context.h"

static int has_mem_slots(const ddplug_context *ctx) {
  return ctx->plugin && ctx->plugin->table.mem_alloc && ctx->group;
}

DDPLUG_API int ddplug_mem_alloc(ddplug_context *ctx, uint64_t bytes, void **out) {
  if (!ctx || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_mem_alloc: %s is NULL",
                       !ctx ? "ctx" : "out");
  if (bytes == 0)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                             "ddplug_mem_alloc: bytes is 0 (allocate at "
                                             "least one byte)"));
  int s = ddplug__ctx_check(ctx);
  if (s != DDPLUG_OK) return ddplug__ctx_capture_error(ctx, s);
  if (!has_mem_slots(ctx))
    return ddplug__ctx_capture_error(
        ctx, ddplug__err(DDPLUG_E_UNSUPPORTED,
                         "ddplug_mem_alloc: plugin %s has no registered memory (its "
                         "table has no mem_alloc slot, plugin ABI 1.3); use ordinary "
                         "memory: every collective accepts any host buffer",
                         ctx->plugin->table.name));
  void *p = NULL;
  ddplug__plugin_err_clear(ctx);
  s = ctx->plugin->table.mem_alloc(ctx->group, bytes, &p);
  if (s != DDPLUG_OK) return ddplug__ctx_capture_error(
      ctx, ddplug__plugin_err_take(ctx, s, "mem_alloc"));
  if (!p)
    return ddplug__ctx_capture_error(
        ctx, ddplug__err(DDPLUG_E_INTERNAL,
                         "plugin %s: mem_alloc of %llu bytes returned OK and a NULL "
                         "pointer", ctx->plugin->table.name, (unsigned long long)bytes));
  *out = p;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_mem_free(ddplug_context *ctx, void *ptr) {
  if (!ctx) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_mem_free: ctx is NULL");
  if (!ptr) return DDPLUG_OK;
  if (!has_mem_slots(ctx))
    return ddplug__ctx_capture_error(
        ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "ddplug_mem_free: %p is not registered memory of this context "
                         "(plugin %s has none: ddplug_mem_alloc never succeeds with it)",
                         ptr, ctx->plugin->table.name));
  ddplug__plugin_err_clear(ctx);
  int s = ctx->plugin->table.mem_free(ctx->group, ptr);
  if (s != DDPLUG_OK) return ddplug__ctx_capture_error(
      ctx, ddplug__plugin_err_take(ctx, s, "mem_free"));
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_mem_reach(ddplug_context *ctx, const void *ptr, uint64_t bytes,
                                int *reach) {
  if (!ctx || !reach)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_mem_reach: %s is NULL",
                       !ctx ? "ctx" : "reach");
  if (!has_mem_slots(ctx) || !ptr || bytes == 0) {
    *reach = DDPLUG_REACH_STAGED;
    return DDPLUG_OK;
  }
  int32_t r = DDPLUG_REACH_STAGED;
  ddplug__plugin_err_clear(ctx);
  int s = ctx->plugin->table.mem_query(ctx->group, ptr, bytes, &r);
  if (s != DDPLUG_OK) return ddplug__ctx_capture_error(
      ctx, ddplug__plugin_err_take(ctx, s, "mem_query"));
  *reach = r;
  return DDPLUG_OK;
}
