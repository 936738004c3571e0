/*
 * options.c — the nccl plugin's part of the config: "plugin_options".
 *
 *   {"device_map": [0, 1, 2, 3],   CUDA ordinal of each local rank
 *    "allow_shared_gpu": false,    let two ranks use one GPU (NCCL >= 2.30)
 *    "check_mismatch": false}      compare every collective across ranks
 *
 * Strict like the rest of ddplug's config: unknown keys, duplicate keys,
 * wrong types and out-of-range values are DDPLUG_E_CONFIG naming the key
 * path ("plugin_options.device_map[2]: ...").
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_plugin.h"

#define KNOWN_KEYS "allow_shared_gpu, check_mismatch, device_map"

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
  }
  return "?";
}

static int parse_bool(const char *key, const json_t *v, int *out, char *err,
                      size_t cap) {
  if (!json_is_boolean(v)) {
    ddplug_nccl__fmt(err, cap, "plugin_options.%s: expected true or false, got %s",
                     key, json_kind(v));
    return DDPLUG_E_CONFIG;
  }
  *out = json_is_true(v);
  return DDPLUG_OK;
}

static int parse_device_map(const json_t *v, ddplug_nccl_options *o,
                            char *err, size_t cap) {
  if (!json_is_array(v)) {
    ddplug_nccl__fmt(err, cap,
                     "plugin_options.device_map: expected an array of CUDA "
                     "device ordinals (one per local rank), got %s",
                     json_kind(v));
    return DDPLUG_E_CONFIG;
  }
  size_t n = json_array_size(v);
  if (n == 0) {
    ddplug_nccl__fmt(err, cap,
                     "plugin_options.device_map: empty; give one CUDA device "
                     "ordinal per local rank, or leave the key out");
    return DDPLUG_E_CONFIG;
  }
  if (n > 4096) {
    ddplug_nccl__fmt(err, cap,
                     "plugin_options.device_map: %zu entries; at most 4096", n);
    return DDPLUG_E_CONFIG;
  }
  int32_t *map = calloc(n, sizeof *map);
  if (!map) {
    ddplug_nccl__fmt(err, cap, "plugin_options.device_map: out of memory");
    return DDPLUG_E_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(v, i);
    if (!json_is_integer(e) || json_integer_value(e) < 0 ||
        json_integer_value(e) > 1023) {
      if (json_is_integer(e))
        ddplug_nccl__fmt(err, cap,
                         "plugin_options.device_map[%zu]: %lld is not a CUDA "
                         "device ordinal (0..1023)",
                         i, (long long)json_integer_value(e));
      else
        ddplug_nccl__fmt(err, cap,
                         "plugin_options.device_map[%zu]: expected a CUDA "
                         "device ordinal (an integer >= 0), got %s",
                         i, json_kind(e));
      free(map);
      return DDPLUG_E_CONFIG;
    }
    map[i] = (int32_t)json_integer_value(e);
  }
  o->device_map = map;
  o->device_map_len = (uint32_t)n;
  return DDPLUG_OK;
}

/* See nccl_plugin.h. Not thread-safe with respect to *out only. */
int ddplug_nccl__options_parse(const char *json, ddplug_nccl_options *out,
                               char *err, size_t cap) {
  memset(out, 0, sizeof *out);
  if (!json || !*json) return DDPLUG_OK;
  json_error_t jerr;
  json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    ddplug_nccl__fmt(err, cap, "plugin_options: not valid JSON (%s)", jerr.text);
    return DDPLUG_E_CONFIG;
  }
  int st = DDPLUG_OK;
  if (!json_is_object(root)) {
    ddplug_nccl__fmt(err, cap, "plugin_options: expected an object, got %s",
                     json_kind(root));
    st = DDPLUG_E_CONFIG;
  }
  ddplug_nccl_options o;
  memset(&o, 0, sizeof o);
  const char *key;
  json_t *v;
  if (st == DDPLUG_OK) {
    json_object_foreach(root, key, v) {
      if (strcmp(key, "device_map") == 0)
        st = parse_device_map(v, &o, err, cap);
      else if (strcmp(key, "allow_shared_gpu") == 0)
        st = parse_bool(key, v, &o.allow_shared_gpu, err, cap);
      else if (strcmp(key, "check_mismatch") == 0)
        st = parse_bool(key, v, &o.check_mismatch, err, cap);
      else {
        ddplug_nccl__fmt(err, cap,
                         "plugin_options.%s: unknown option of the nccl plugin "
                         "(known: " KNOWN_KEYS ")",
                         key);
        st = DDPLUG_E_CONFIG;
      }
      if (st != DDPLUG_OK) break;
    }
  }
  json_decref(root);
  if (st != DDPLUG_OK) {
    ddplug_nccl__options_free(&o);
    return st;
  }
  *out = o;
  return DDPLUG_OK;
}

void ddplug_nccl__options_free(ddplug_nccl_options *o) {
  if (!o) return;
  free(o->device_map);
  o->device_map = NULL;
  o->device_map_len = 0;
}
