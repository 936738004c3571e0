/* schema.c — the JSON Schema (draft 2020-12) of the config, generated from
 * the key table (keys.c): the build writes it with `ddplug check-config
 * --schema` and installs it, so an editor can validate configs against the
 * same rules the loader applies (minus the few it cannot express, listed in
 * the schema's description).
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

#define SCHEMA_DESCRIPTION                                                     \
  "Configuration of a ddplug run: one JSON file, loaded by "                   \
  "ddplug_config_load_file or through DDPLUG_CONFIG; check one with `ddplug "  \
  "check-config FILE`. Generated from the loader's key table. The loader is "  \
  "stricter than this schema can say: duplicate keys are errors; integers are " \
  "written without a fraction (3, not 3.0); world.rank < world.world_size, "   \
  "world.local_rank < world.local_world_size, world.local_world_size <= "      \
  "world.world_size; sampler.bucket.boundaries are strictly ascending; "       \
  "rendezvous.port 0 (any free port) only with world.world_size 1."

/* A JSON number as a schema writes it: 300, not 300.0. */
static json_t *number(double d) {
  return d == (double)(json_int_t)d ? json_integer((json_int_t)d) : json_real(d);
}

/* The schema node of entry k, without the children of an object or map. */
static json_t *entry_node(const ddplug__cfg_key *k) {
  static const char *const type_names[] = {
      [DDPLUG__CFG_OBJECT] = "object", [DDPLUG__CFG_MAP] = "object",
      [DDPLUG__CFG_FREE] = "object",   [DDPLUG__CFG_STRING] = "string",
      [DDPLUG__CFG_ENUM] = "string",   [DDPLUG__CFG_BOOL] = "boolean",
      [DDPLUG__CFG_INT] = "integer",   [DDPLUG__CFG_NUMBER] = "number",
      [DDPLUG__CFG_INT_ARRAY] = "array"};
  json_t *s = json_object();
  json_object_set_new(s, "type", json_string(type_names[k->type]));
  json_object_set_new(s, "description", json_string(k->description));
  const int dflt = k->presence == DDPLUG__CFG_DEFAULT;
  switch (k->type) {
    case DDPLUG__CFG_OBJECT:
      json_object_set_new(s, "additionalProperties", json_false());
      if (dflt) json_object_set_new(s, "default", json_object());
      break;
    case DDPLUG__CFG_MAP:
      json_object_set_new(s, "propertyNames", json_pack("{s:s}", "pattern", k->pattern));
      if (dflt) json_object_set_new(s, "default", json_object());
      break;
    case DDPLUG__CFG_FREE:
      if (dflt) json_object_set_new(s, "default", json_object());
      break;
    case DDPLUG__CFG_STRING:
      if (k->min_len) json_object_set_new(s, "minLength", json_integer(k->min_len));
      if (k->max_len) json_object_set_new(s, "maxLength", json_integer(k->max_len));
      if (k->pattern) json_object_set_new(s, "pattern", json_string(k->pattern));
      if (dflt) json_object_set_new(s, "default", json_string(k->def_str));
      break;
    case DDPLUG__CFG_ENUM: {
      json_t *e = json_array();
      for (size_t i = 0; k->enum_values[i]; i++)
        json_array_append_new(e, json_string(k->enum_values[i]));
      json_object_set_new(s, "enum", e);
      if (dflt) json_object_set_new(s, "default", json_string(k->def_str));
      break;
    }
    case DDPLUG__CFG_BOOL:
      json_object_set_new(s, "default", json_boolean(k->def_int));
      break;
    case DDPLUG__CFG_INT:
      json_object_set_new(s, "minimum", json_integer(k->imin));
      if (k->imax != DDPLUG__CFG_NO_MAX) json_object_set_new(s, "maximum", json_integer(k->imax));
      if (dflt) json_object_set_new(s, "default", json_integer(k->def_int));
      break;
    case DDPLUG__CFG_NUMBER:
      json_object_set_new(s, k->nmin_exclusive ? "exclusiveMinimum" : "minimum", number(k->nmin));
      json_object_set_new(s, "maximum", number(k->nmax));
      if (dflt) json_object_set_new(s, "default", number(k->def_num));
      break;
    case DDPLUG__CFG_INT_ARRAY: {
      json_t *items = json_pack("{s:s,s:I}", "type", "integer", "minimum", (json_int_t)k->imin);
      if (k->imax != DDPLUG__CFG_NO_MAX) json_object_set_new(items, "maximum", json_integer(k->imax));
      json_object_set_new(s, "items", items);
      json_object_set_new(s, "minItems", json_integer(k->min_len));
      json_object_set_new(s, "maxItems", json_integer(k->max_len));
      break;
    }
  }
  return s;
}

/* Fill node (an object schema) with the entries below table path parent:
 * "properties" in table order, "required", and each child's own children;
 * a map's value schema is its "<map>.*" entry, as "additionalProperties". */
static void add_children(json_t *node, const char *parent) {
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  json_t *props = json_object(), *required = json_array();
  for (size_t i = 0; i < count; i++) {
    const ddplug__cfg_key *k = &keys[i];
    if (!ddplug__config_key_is_child(k, parent)) continue;
    json_t *child = entry_node(k);
    if (k->type == DDPLUG__CFG_OBJECT) add_children(child, k->path);
    if (k->type == DDPLUG__CFG_MAP) {
      char star[256];
      snprintf(star, sizeof star, "%s.*", k->path);
      const ddplug__cfg_key *v = ddplug__config_key_find(star, strlen(star));
      if (v) {
        json_t *value = entry_node(v);
        if (v->type == DDPLUG__CFG_OBJECT) add_children(value, v->path);
        json_object_set_new(child, "additionalProperties", value);
      }
    }
    const char *name = ddplug__config_key_name(k);
    if (strcmp(name, "*") != 0) json_object_set_new(props, name, child);
    else json_decref(child);
    if (k->presence == DDPLUG__CFG_REQUIRED && strcmp(name, "*") != 0)
      json_array_append_new(required, json_string(name));
  }
  json_object_set_new(node, "properties", props);
  if (json_array_size(required)) json_object_set_new(node, "required", required);
  else json_decref(required);
}

/* See config.h. */
json_t *ddplug__config_schema(void) {
  json_t *root = json_pack("{s:s, s:s, s:s, s:s}", "$schema",
                           "https://json-schema.org/draft/2020-12/schema", "title",
                           "ddplug configuration", "description", SCHEMA_DESCRIPTION,
                           "type", "object");
  if (!root) return NULL;
  add_children(root, "");
  json_object_set_new(root, "additionalProperties", json_false());
  return root;
}

DDPLUG_API int ddplug_config_schema(char **out) {
  if (!out) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_config_schema: out is NULL");
  *out = NULL;
  json_t *root = ddplug__config_schema();
  char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  json_decref(root);
  if (text) *out = ddplug__strdup(text);
  free(text);
  if (!*out) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory writing the config schema");
  return DDPLUG_OK;
}
