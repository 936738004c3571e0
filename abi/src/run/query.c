/* query.c — what a host may ask an open context: its last error, the
 * world, the number of nodes, the plugin, the config and the store.
 * SPDX-License-Identifier: Apache-2.0 */
#include <string.h>

#include "run/context.h"

DDPLUG_API const char *ddplug_context_error(const ddplug_context *ctx) {
  return ctx ? ddplug__errslot_get(&ctx->err) : "";
}

DDPLUG_API int ddplug_context_world(const ddplug_context *ctx, ddplug_world *out) {
  if (!ctx || !out || out->struct_size < 2 * sizeof(uint32_t))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_context_world: ctx and out (initialised with "
                       "DDPLUG_WORLD_INIT) are required");
  uint32_t keep = out->struct_size;
  memcpy(out, &ctx->world, DDPLUG__MIN((size_t)keep, sizeof ctx->world));
  out->struct_size = keep;
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_context_num_nodes(const ddplug_context *ctx) {
  return ctx ? ctx->num_nodes : 0;
}

DDPLUG_API int ddplug_context_plugin(const ddplug_context *ctx, ddplug_plugin_info *info) {
  if (!ctx || !info || info->struct_size < offsetof(ddplug_plugin_info, caps))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_context_plugin: ctx and info (initialised with "
                       "DDPLUG_PLUGIN_INFO_INIT) are required");
  ddplug__plugin_fill_info(ctx->plugin, info);
  return DDPLUG_OK;
}

DDPLUG_API const ddplug_config *ddplug_context_config(const ddplug_context *ctx) {
  return ctx ? ctx->cfg : NULL;
}

DDPLUG_API ddplug_store *ddplug_context_store(ddplug_context *ctx) {
  return ctx ? ctx->store : NULL;
}
