/* config_get.c — typed reads of the effective config by dotted key path
 * ("sampler.bucket.batch_size", "data_split.streams.train.owner",
 * "plugin_options.device_map"), checked against the key table.
 * SPDX-License-Identifier: Apache-2.0 */
#include <math.h>
#include <string.h>

#include "config/config.h"

/* What a value is, for getter compatibility and messages. */
typedef enum kind { K_INT = 1, K_NUMBER, K_BOOL, K_STRING, K_OBJECT, K_ARRAY, K_NULL } kind;

static const char *const k_kind_names[] = {
    "", "an integer", "a number", "a boolean", "a string", "an object", "an array", "null"};
static const char *const k_kind_getter[] = {
    "", "ddplug_config_get_int", "ddplug_config_get_double",
    "ddplug_config_get_bool", "ddplug_config_get_string",
    "ddplug_config_get_string", "ddplug_config_get_string", "no getter"};

/* Where a path led: the key table entry, the value (NULL = not set) and
 * the kind of value the path holds. */
typedef struct lookup {
  const ddplug__cfg_key *key;
  const json_t *value;
  kind kind;
} lookup;

static kind kind_of_key(const ddplug__cfg_key *k) {
  switch (k->type) {
    case DDPLUG__CFG_INT: return K_INT;
    case DDPLUG__CFG_NUMBER: return K_NUMBER;
    case DDPLUG__CFG_BOOL: return K_BOOL;
    case DDPLUG__CFG_STRING:
    case DDPLUG__CFG_ENUM: return K_STRING;
    case DDPLUG__CFG_INT_ARRAY: return K_ARRAY;
    default: return K_OBJECT;
  }
}

static kind kind_of_value(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_INTEGER: return K_INT;
    case JSON_REAL: return K_NUMBER;
    case JSON_TRUE:
    case JSON_FALSE: return K_BOOL;
    case JSON_STRING: return K_STRING;
    case JSON_OBJECT: return K_OBJECT;
    case JSON_ARRAY: return K_ARRAY;
    default: return K_NULL;
  }
}

/* json_object_get with a key of len bytes (jansson >= 2.12 has no getn). */
static const json_t *get_key(const json_t *obj, const char *key, size_t len) {
  char buf[256];
  if (!json_is_object(obj) || len >= sizeof buf) return NULL;
  memcpy(buf, key, len);
  buf[len] = '\0';
  return json_object_get(obj, buf);
}

/* NOT_FOUND for a path the table does not know, with a suggestion. */
static int unknown_path(const ddplug_config *cfg, const char *path) {
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  ddplug__suggest sg;
  ddplug__suggest_init(&sg, path);
  const char *last = strrchr(path, '.');
  last = last ? last + 1 : path;
  const char *same_name = NULL;
  for (size_t i = 0; i < count; i++) {
    if (strchr(keys[i].path, '*')) continue;
    ddplug__suggest_offer(&sg, keys[i].path, strlen(keys[i].path));
    if (!same_name && !strcmp(ddplug__config_key_name(&keys[i]), last))
      same_name = keys[i].path;
  }
  const char *best = ddplug__suggest_best(&sg);
  if (!best) best = same_name;
  const char *origin = ddplug_config_origin(cfg);
  if (best)
    return ddplug__err(DDPLUG_E_NOT_FOUND,
                       "%s: %s: no such config key (did you mean '%s'?)", origin,
                       path, best);
  return ddplug__err(DDPLUG_E_NOT_FOUND,
                     "%s: %s: no such config key (see `ddplug check-config "
                     "--schema` for every key)",
                     origin, path);
}

/* NOT_FOUND for "<map>.NAME.key" where stream NAME exists but has no such
 * key, suggesting the closest key of the map's items. */
static int unknown_item_key(const ddplug_config *cfg, const char *path,
                            const char *item_path, const char *key) {
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  ddplug__suggest sg;
  ddplug__suggest_init(&sg, key);
  for (size_t i = 0; i < count; i++)
    if (ddplug__config_key_is_child(&keys[i], item_path))
      ddplug__suggest_offer(&sg, ddplug__config_key_name(&keys[i]),
                            strlen(ddplug__config_key_name(&keys[i])));
  const char *best = ddplug__suggest_best(&sg);
  return ddplug__err(DDPLUG_E_NOT_FOUND, "%s: %s: no such config key%s%s%s",
                     ddplug_config_origin(cfg), path, best ? " (did you mean '" : "",
                     best ? best : "", best ? "'?)" : "");
}

/* Inside a MAP ("data_split.streams"): rest is "NAME" or "NAME.child";
 * a NAME may itself contain dots, so an exact name wins. */
static int resolve_map(const ddplug_config *cfg, const char *path,
                       const ddplug__cfg_key *map, const json_t *node,
                       const char *rest, lookup *lk) {
  char item_path[128];
  snprintf(item_path, sizeof item_path, "%s.*", map->path);
  const ddplug__cfg_key *item = ddplug__config_key_find(item_path, strlen(item_path));
  const json_t *exact = node ? json_object_get(node, rest) : NULL;
  const char *dot = strrchr(rest, '.');
  if (!exact && dot && dot > rest) {
    const ddplug__cfg_key *child =
        ddplug__config_key_child(item_path, dot + 1, strlen(dot + 1));
    const json_t *entry = get_key(node, rest, (size_t)(dot - rest));
    if (child) {
      lk->key = child;
      lk->value = entry ? json_object_get(entry, dot + 1) : NULL;
      return DDPLUG_OK;
    }
    if (entry) return unknown_item_key(cfg, path, item_path, dot + 1);
  }
  if (!exact && ddplug__config_pattern_match(map->pattern, rest, strlen(rest)) != 1)
    return unknown_path(cfg, path);
  lk->key = item;
  lk->value = exact;
  return DDPLUG_OK;
}

/* Map path to its table entry and its value in the tree at node (the
 * effective config, or the document as given). */
static int resolve_in(const ddplug_config *cfg, const json_t *node, const char *path,
                      lookup *lk) {
  const ddplug__cfg_key *k = NULL;
  const char *p = path;
  for (;;) {
    size_t seg = strcspn(p, ".");
    const ddplug__cfg_key *child = NULL;
    if (k && k->type == DDPLUG__CFG_MAP) return resolve_map(cfg, path, k, node, p, lk);
    if (k && k->type == DDPLUG__CFG_FREE) {
      /* free-form: any key; the value decides the kind */
      node = get_key(node, p, seg);
    } else {
      child = ddplug__config_key_child(k ? k->path : "", p, seg);
      if (!child || seg == 0) return unknown_path(cfg, path);
      node = get_key(node, p, seg);
      k = child;
    }
    if (p[seg] == '\0') break;
    if (k->type != DDPLUG__CFG_OBJECT && k->type != DDPLUG__CFG_MAP &&
        k->type != DDPLUG__CFG_FREE)
      return unknown_path(cfg, path);
    p += seg + 1;
  }
  lk->key = k;
  lk->value = node;
  return DDPLUG_OK;
}

static int resolve(const ddplug_config *cfg, const char *path, const char *fn,
                   lookup *lk) {
  if (!cfg || !path)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                       !cfg ? "cfg" : "path");
  return resolve_in(cfg, ddplug__config_root(cfg), path, lk);
}

DDPLUG_API int ddplug_config_is_set(const ddplug_config *cfg, const char *path, int *out) {
  if (!out) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_config_is_set: out is NULL");
  lookup lk;
  int rc = resolve(cfg, path, "ddplug_config_is_set", &lk);
  if (rc != DDPLUG_OK) return rc;
  rc = resolve_in(cfg, ddplug__config_given(cfg), path, &lk);
  if (rc != DDPLUG_OK) return rc;
  *out = lk.value != NULL;
  return DDPLUG_OK;
}

/* Resolve path and check that the getter fn, which reads `want` into out,
 * may read it. */
static int lookup_as(const ddplug_config *cfg, const char *path, const void *out,
                     kind want, const char *fn, lookup *lk) {
  if (!out) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: out is NULL", fn);
  int rc = resolve(cfg, path, fn, lk);
  if (rc != DDPLUG_OK) return rc;
  int free_form = lk->key->type == DDPLUG__CFG_FREE && strchr(path, '.');
  if (free_form && !lk->value)
    return ddplug__err(DDPLUG_E_NOT_FOUND, "%s: %s: not set (plugin_options has no such key)",
                       ddplug_config_origin(cfg), path);
  lk->kind = free_form ? kind_of_value(lk->value) : kind_of_key(lk->key);
  int ok;
  switch (want) {
    case K_INT:
    case K_NUMBER:
      ok = lk->kind == K_INT || lk->kind == K_NUMBER;
      break;
    case K_STRING:
      ok = lk->kind == K_STRING || lk->kind == K_OBJECT || lk->kind == K_ARRAY;
      break;
    default:
      ok = lk->kind == want;
      break;
  }
  if (!ok)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: %s: %s holds %s (read it with %s)",
                       fn, ddplug_config_origin(cfg), path, k_kind_names[lk->kind],
                       k_kind_getter[lk->kind]);
  if (!lk->value)
    return ddplug__err(DDPLUG_E_NOT_FOUND, "%s: %s: not set (an optional key absent from the config)",
                       ddplug_config_origin(cfg), path);
  return DDPLUG_OK;
}

/* The integer at path into *out. Returns OK; NOT_FOUND (unknown path, with
 * a suggestion, or an optional key not set); INVALID_ARGUMENT (not a
 * number, a number with a fraction or beyond int64, a NULL argument).
 * *out is untouched on failure. Thread-safe. */
DDPLUG_API int ddplug_config_get_int(const ddplug_config *cfg,
                                     const char *path, int64_t *out) {
  lookup lk;
  int rc = lookup_as(cfg, path, out, K_INT, "ddplug_config_get_int", &lk);
  if (rc != DDPLUG_OK) return rc;
  if (json_is_integer(lk.value)) {
    *out = json_integer_value(lk.value);
    return DDPLUG_OK;
  }
  double d = json_real_value(lk.value);
  if (d != floor(d) || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
    char got[64];
    ddplug__config_describe(lk.value, got, sizeof got);
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_get_int: %s: %s: %s is not an integer "
                       "(read it with ddplug_config_get_double)",
                       ddplug_config_origin(cfg), path, got);
  }
  *out = (int64_t)d;
  return DDPLUG_OK;
}

/* The number at path (an integer or a real) into *out. Errors as
 * ddplug_config_get_int, without the fraction rule. Thread-safe. */
DDPLUG_API int ddplug_config_get_double(const ddplug_config *cfg,
                                        const char *path, double *out) {
  lookup lk;
  int rc = lookup_as(cfg, path, out, K_NUMBER, "ddplug_config_get_double", &lk);
  if (rc != DDPLUG_OK) return rc;
  *out = json_number_value(lk.value);
  return DDPLUG_OK;
}

/* The boolean at path into *out (1 true, 0 false). Errors as
 * ddplug_config_get_int (INVALID_ARGUMENT for anything but a boolean).
 * Thread-safe. */
DDPLUG_API int ddplug_config_get_bool(const ddplug_config *cfg,
                                      const char *path, int *out) {
  lookup lk;
  int rc = lookup_as(cfg, path, out, K_BOOL, "ddplug_config_get_bool", &lk);
  if (rc != DDPLUG_OK) return rc;
  *out = json_is_true(lk.value);
  return DDPLUG_OK;
}

/* The string at path, or an object/array as canonical JSON text, in a new
 * *out released with ddplug_free. Errors as ddplug_config_get_int, plus
 * NO_MEMORY; *out is untouched on failure. Thread-safe. */
DDPLUG_API int ddplug_config_get_string(const ddplug_config *cfg,
                                        const char *path, char **out) {
  lookup lk;
  int rc = lookup_as(cfg, path, out, K_STRING, "ddplug_config_get_string", &lk);
  if (rc != DDPLUG_OK) return rc;
  char *text = json_is_string(lk.value)
                   ? ddplug__strndup(json_string_value(lk.value),
                                     json_string_length(lk.value))
                   : ddplug__config_canonical(lk.value);
  if (!text)
    return ddplug__err(DDPLUG_E_NO_MEMORY, "ddplug_config_get_string: %s: out of memory",
                       path);
  *out = text;
  return DDPLUG_OK;
}
