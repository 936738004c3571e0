/* inspect.c — what a plugin file is and what it declares, for tools
 * (`ddplug info`, `ddplug conformance`, the Python package): the plugin is
 * loaded exactly as ddplug_open would load it (found, validated), described,
 * and unloaded again.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <stdlib.h>

#include "plugin/plugin.h"

DDPLUG_API int ddplug_plugin_inspect(const char *name_or_path,
                                     ddplug_plugin_info *info) {
  if (!info || info->struct_size < offsetof(ddplug_plugin_info, caps))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_plugin_inspect: info must be initialised with "
                       "DDPLUG_PLUGIN_INFO_INIT");
  ddplug__plugin *p;
  int s = ddplug__plugin_load(name_or_path, &p);
  if (s != DDPLUG_OK) return s;
  ddplug__plugin_fill_info(p, info);
  ddplug__plugin_unload(p);
  return DDPLUG_OK;
}

DDPLUG_API int ddplug_plugin_options(const char *name_or_path, char **out) {
  if (!out) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_plugin_options: out is NULL");
  *out = NULL;
  ddplug__plugin *p;
  int s = ddplug__plugin_load(name_or_path, &p);
  if (s != DDPLUG_OK) return s;
  json_t *list = ddplug__options_json(&p->table);
  char *text = list ? json_dumps(list, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(list);
  ddplug__plugin_unload(p);
  if (text) *out = ddplug__strdup(text);
  free(text);
  if (!*out) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory describing plugin options");
  return DDPLUG_OK;
}
