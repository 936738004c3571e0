/* option_getters.h — the host services' option getters (plugin ABI 1.3) for
 * the tests' stand-ins of the runtime (tests/c/cpu_driver.c, the nccl fake
 * store): they check the plugin_options JSON against the plugin's
 * declarations with the runtime's own code (plugin/options.c) and read the
 * value, as ddplug_open's services do. The includer sets og_source to say
 * where a host's plugin table and options JSON are. */
#ifndef DDPLUG_TEST_OPTION_GETTERS_H
#define DDPLUG_TEST_OPTION_GETTERS_H

#include <jansson.h>
#include <string.h>

#include "run/context.h"

typedef struct og_source {
  const ddplug_plugin *(*table)(void *host);
  const char *(*options)(void *host);
  void (*set_error)(void *host, int32_t status, const char *message);
} og_source;
static og_source og_src;

/* A new reference to the checked values (released by the caller). */
static inline int og_value(void *host, const char *name, int32_t type, json_t **values,
                           const json_t **v) {
  const ddplug_plugin *t = og_src.table(host);
  int s = ddplug__options_check(t, og_src.options(host), values);
  if (s == DDPLUG_OK) s = ddplug__option_value(t, *values, name, type, v);
  if (s != DDPLUG_OK) og_src.set_error(host, s, ddplug_last_error());
  return s;
}

static inline int og_bool(void *host, const char *name, int32_t *out) {
  json_t *vals = NULL;
  const json_t *v;
  int s = og_value(host, name, DDPLUG_OPTION_BOOL, &vals, &v);
  if (s == DDPLUG_OK) *out = json_is_true(v);
  json_decref(vals);
  return s;
}

static inline int og_int(void *host, const char *name, int64_t *out) {
  json_t *vals = NULL;
  const json_t *v;
  int s = og_value(host, name, DDPLUG_OPTION_INT, &vals, &v);
  if (s == DDPLUG_OK) *out = json_integer_value(v);
  json_decref(vals);
  return s;
}

static inline int og_number(void *host, const char *name, double *out) {
  json_t *vals = NULL;
  const json_t *v;
  int s = og_value(host, name, DDPLUG_OPTION_NUMBER, &vals, &v);
  if (s == DDPLUG_OK) *out = json_number_value(v);
  json_decref(vals);
  return s;
}

static inline int og_string(void *host, const char *name, char *buf, uint64_t cap, uint64_t *len) {
  json_t *vals = NULL;
  const json_t *v;
  int s = og_value(host, name, DDPLUG_OPTION_STRING, &vals, &v);
  if (s == DDPLUG_OK) {
    *len = json_string_length(v);
    if (cap > *len) memcpy(buf, json_string_value(v), *len + 1);
    else s = DDPLUG_E_INVALID_ARGUMENT;
  }
  json_decref(vals);
  return s;
}

static inline int og_int_list(void *host, const char *name, int64_t *out, uint64_t cap,
                              uint64_t *count) {
  json_t *vals = NULL;
  const json_t *v;
  int s = og_value(host, name, DDPLUG_OPTION_INT_LIST, &vals, &v);
  if (s == DDPLUG_OK) {
    *count = json_array_size(v);
    if (*count > cap) s = DDPLUG_E_INVALID_ARGUMENT;
    for (size_t i = 0; s == DDPLUG_OK && i < *count; i++)
      out[i] = json_integer_value(json_array_get(v, i));
  }
  json_decref(vals);
  return s;
}

#endif /* DDPLUG_TEST_OPTION_GETTERS_H */
