/*
 * plugin.h — the plugin layer's header: finding and loading a plugin, and
 * the options it declares; nothing here needs a context (the run layer,
 * which does, uses these). Depends on base/ and config/ (options.c describes values as the config does).
 * The module map of abi/src/plugin/:
 *   loader.c   plugin search, dlopen, version negotiation, table lifting
 *   options.c  the options plugins declare: declarations, the user's
 *              plugin_options checked against them, typed values
 *   inspect.c  ddplug_plugin_inspect / ddplug_plugin_options: what a
 *              plugin file is and declares, for tools
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_PLUGIN_LAYER_H
#define DDPLUG_PLUGIN_LAYER_H

#include <stdint.h>

#include "base/base.h"
#include "ddplug/plugin.h"

struct json_t;

/* ---- loader.c ----------------------------------------------------------- */

typedef struct ddplug__plugin {
  void *dl;                 /* dlopen handle                              */
  ddplug_plugin table;      /* the plugin's table lifted to the latest ABI:
                               slots it did not know are NULL             */
  uint32_t built_abi;       /* abi_version the plugin was built against   */
  uint32_t built_size;      /* its struct_size                            */
  char path[4096];          /* the file loaded                            */
} ddplug__plugin;

/* Find, load and validate a plugin (see ddplug_plugin_inspect): its option
 * declarations too (options.c). On failure *out is untouched and nothing
 * stays loaded. */
int ddplug__plugin_load(const char *name_or_path, ddplug__plugin **out);
void ddplug__plugin_unload(ddplug__plugin *p);
/* The <name> of a file path's libddplug-<name>.so (1), or 0 when the file
 * name does not have that form (or name's cap is too small). */
int ddplug__plugin_file_name(const char *path, char *name, size_t cap);
/* Fill a public info struct (honouring its struct_size) from a plugin. */
void ddplug__plugin_fill_info(const ddplug__plugin *p, ddplug_plugin_info *info);

/* ---- options.c ---------------------------------------------------------- */

/* Refuse a table whose option declarations the runtime cannot use, naming
 * the option (INVALID_ARGUMENT). */
int ddplug__options_validate_decls(const ddplug_plugin *t, const char *path);
/* Check plugin_options (JSON object text) against t's declarations: CONFIG
 * naming plugin_options.<key> on the first problem. On success *out is a
 * new object of every given or defaulted option (NULL when t declares no
 * options: the plugin reads options_json itself). */
int ddplug__options_check(const ddplug_plugin *t, const char *options_json,
                          struct json_t **out);
/* The value of declared option name of type in values (borrowed):
 * NOT_FOUND if undeclared or unset without default, INVALID_ARGUMENT for
 * another declared type. */
int ddplug__option_value(const ddplug_plugin *t, const struct json_t *values,
                         const char *name, int32_t type, const struct json_t **out);
/* t's declarations as a JSON array (one object per option: name, type,
 * description, default and its rules), or JSON null when t declares none;
 * what `ddplug info` and hosts show users. NULL when out of memory. The
 * caller owns the result. */
struct json_t *ddplug__options_json(const ddplug_plugin *t);

#endif /* DDPLUG_PLUGIN_LAYER_H */
