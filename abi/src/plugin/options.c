/* options.c — the options a plugin declares (plugin.h, ddplug_option): the
 * declarations checked when the plugin loads, the user's plugin_options
 * checked against them before group_create (with the declared defaults
 * filled in), and the typed values the host services hand the plugin. One
 * place for every plugin's option rules, with the config's own wording:
 * "plugin_options.<key>: ..." naming the key, a "did you mean", the known
 * names.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "plugin/plugin.h"

#define NAME_MAX_LEN 63

static const char *type_name(int32_t type) {
  switch (type) {
    case DDPLUG_OPTION_BOOL: return "a boolean";
    case DDPLUG_OPTION_INT: return "an integer";
    case DDPLUG_OPTION_NUMBER: return "a number";
    case DDPLUG_OPTION_STRING: return "a string";
    case DDPLUG_OPTION_INT_LIST: return "an array of integers";
    default: return "?";
  }
}

static int valid_name(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > NAME_MAX_LEN) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return 0;
  return 1;
}

static int bounded(int64_t lo, int64_t hi) { return lo != 0 || hi != 0; }
static int bounded_num(double lo, double hi) { return lo != 0 || hi != 0; }

/* "in 4096..16777216, a multiple of 4096" (or "") for messages. */
static void int_rule(const ddplug_option *o, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  if (bounded(o->int_min, o->int_max))
    n = (size_t)snprintf(buf, cap, " in %lld..%lld", (long long)o->int_min,
                         (long long)o->int_max);
  if (o->int_multiple > 1 && n < cap)
    snprintf(buf + n, cap - n, "%s a multiple of %lld", n ? "," : "",
             (long long)o->int_multiple);
}

/* One integer against o's rules; where names it ("plugin_options.x[2]"). */
static int check_int(const ddplug_option *o, const char *where, const json_t *v) {
  char rule[128], got[96];
  int_rule(o, rule, sizeof rule);
  if (!json_is_integer(v)) {
    ddplug__config_describe(v, got, sizeof got);
    return ddplug__err(DDPLUG_E_CONFIG, "%s: expected an integer%s, got %s", where, rule, got);
  }
  json_int_t x = json_integer_value(v);
  if (bounded(o->int_min, o->int_max) && (x < o->int_min || x > o->int_max))
    return ddplug__err(DDPLUG_E_CONFIG, "%s: %lld is out of range %lld..%lld", where,
                       (long long)x, (long long)o->int_min, (long long)o->int_max);
  if (o->int_multiple > 1 && x % o->int_multiple != 0)
    return ddplug__err(DDPLUG_E_CONFIG, "%s: %lld is not a multiple of %lld", where,
                       (long long)x, (long long)o->int_multiple);
  return DDPLUG_OK;
}

/* A value against its declaration; key is the option's name. */
static int check_value(const ddplug_option *o, const json_t *v) {
  char where[96], got[96];
  snprintf(where, sizeof where, "plugin_options.%s", o->name);
  switch (o->type) {
    case DDPLUG_OPTION_BOOL:
      if (json_is_boolean(v)) return DDPLUG_OK;
      ddplug__config_describe(v, got, sizeof got);
      return ddplug__err(DDPLUG_E_CONFIG, "%s: expected true or false, got %s", where, got);
    case DDPLUG_OPTION_INT:
      return check_int(o, where, v);
    case DDPLUG_OPTION_NUMBER: {
      if (!json_is_number(v)) {
        ddplug__config_describe(v, got, sizeof got);
        return ddplug__err(DDPLUG_E_CONFIG, "%s: expected a number, got %s", where, got);
      }
      double x = json_number_value(v);
      if (!isfinite(x) || (bounded_num(o->num_min, o->num_max) && (x < o->num_min || x > o->num_max)))
        return ddplug__err(DDPLUG_E_CONFIG, "%s: %g is out of range %g..%g", where, x,
                           o->num_min, o->num_max);
      return DDPLUG_OK;
    }
    case DDPLUG_OPTION_STRING: {
      if (!json_is_string(v)) {
        ddplug__config_describe(v, got, sizeof got);
        return ddplug__err(DDPLUG_E_CONFIG, "%s: expected a string, got %s", where, got);
      }
      if (!o->choices) return DDPLUG_OK;
      const char *s = json_string_value(v);
      char list[512] = "";
      size_t n = 0;
      ddplug__suggest sg;
      ddplug__suggest_init(&sg, s);
      for (size_t i = 0; o->choices[i]; i++) {
        if (!strcmp(s, o->choices[i])) return DDPLUG_OK;
        ddplug__suggest_offer(&sg, o->choices[i], strlen(o->choices[i]));
        if (n < sizeof list)
          n += (size_t)snprintf(list + n, sizeof list - n, "%s\"%s\"", i ? ", " : "",
                                o->choices[i]);
      }
      const char *best = ddplug__suggest_best(&sg);
      char hint[96] = "";
      if (best) snprintf(hint, sizeof hint, " (did you mean \"%s\"?)", best);
      return ddplug__err(DDPLUG_E_CONFIG, "%s: \"%.64s\" is not one of %s%s", where, s, list, hint);
    }
    case DDPLUG_OPTION_INT_LIST: {
      size_t count = json_is_array(v) ? json_array_size(v) : 0;
      if (!json_is_array(v) || count == 0 || (o->max_items && count > o->max_items)) {
        ddplug__config_describe(v, got, sizeof got);
        char most[32] = "";
        if (o->max_items) snprintf(most, sizeof most, "..%u", o->max_items);
        return ddplug__err(DDPLUG_E_CONFIG, "%s: expected an array of 1%s integers, got %s", where,
                           o->max_items ? most : " or more", got);
      }
      for (size_t i = 0; i < count; i++) {
        char item[sizeof where + 24];
        snprintf(item, sizeof item, "%s[%zu]", where, i);
        int s = check_int(o, item, json_array_get(v, i));
        if (s != DDPLUG_OK) return s;
      }
      return DDPLUG_OK;
    }
    default:
      return ddplug__err(DDPLUG_E_INTERNAL, "%s: declared with unknown type %d", where, o->type);
  }
}

/* See context.h. */
int ddplug__options_validate_decls(const ddplug_plugin *t, const char *path) {
  if (!t->options) return DDPLUG_OK;
  for (size_t i = 0; t->options[i]; i++) {
    const ddplug_option *o = t->options[i];
    const char *name = o->name ? o->name : "(null)";
    const char *why = NULL;
    char buf[DDPLUG__ERRMSG_MAX];
    if (o->struct_size < offsetof(ddplug_option, description) + sizeof o->description)
      why = "its struct_size is smaller than an ABI 1.3 ddplug_option";
    else if (!valid_name(o->name))
      why = "the name must be 1 to 63 characters of a-z, 0-9 and '_'";
    else if (o->type < DDPLUG_OPTION_BOOL || o->type > DDPLUG_OPTION_INT_LIST)
      why = "the type is not a ddplug_option_type";
    else if (o->int_min > o->int_max || o->num_min > o->num_max)
      why = "its minimum is above its maximum";
    else if (o->int_multiple < 0)
      why = "int_multiple is negative";
    for (size_t j = 0; !why && j < i; j++)
      if (!strcmp(t->options[j]->name, o->name)) why = "the name is declared twice";
    if (!why && o->default_json) {
      json_error_t e;
      json_t *d = json_loads(o->default_json, JSON_DECODE_ANY, &e);
      if (!d) {
        snprintf(buf, sizeof buf, "its default '%s' is not JSON (%s)", o->default_json, e.text);
        why = buf;
      } else if (check_value(o, d) != DDPLUG_OK) {
        snprintf(buf, sizeof buf, "its default does not pass its own rules (%s)",
                 ddplug_last_error());
        why = buf;
      }
      json_decref(d);
    }
    if (why)
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "plugin '%s' (%s): option #%zu '%s' is declared wrongly: %s", t->name,
                         path, i, name, why);
  }
  return DDPLUG_OK;
}

static const ddplug_option *find_decl(const ddplug_plugin *t, const char *name) {
  for (size_t i = 0; t->options && t->options[i]; i++)
    if (!strcmp(t->options[i]->name, name)) return t->options[i];
  return NULL;
}

/* "did you mean" and the known names for an unknown key. */
static int unknown_option(const ddplug_plugin *t, const char *key) {
  char known[1024] = "";
  size_t n = 0;
  ddplug__suggest sg;
  ddplug__suggest_init(&sg, key);
  for (size_t i = 0; t->options[i]; i++) {
    ddplug__suggest_offer(&sg, t->options[i]->name, strlen(t->options[i]->name));
    if (n < sizeof known)
      n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "", t->options[i]->name);
  }
  const char *best = ddplug__suggest_best(&sg);
  char hint[128] = "";
  if (best) snprintf(hint, sizeof hint, "did you mean '%s'? ", best);
  if (!t->options[0])
    return ddplug__err(DDPLUG_E_CONFIG, "plugin_options.%s: plugin %s takes no options", key,
                       t->name);
  return ddplug__err(DDPLUG_E_CONFIG, "plugin_options.%s: plugin %s has no such option (%sits options: %s)",
                     key, t->name, hint, known);
}

/* See context.h. */
int ddplug__options_check(const ddplug_plugin *t, const char *options_json, json_t **out) {
  *out = NULL;
  if (!t->options) return DDPLUG_OK;
  json_error_t e;
  json_t *given = json_loads(options_json && *options_json ? options_json : "{}", 0, &e);
  if (!json_is_object(given)) {
    json_decref(given);
    return ddplug__err(DDPLUG_E_CONFIG, "plugin_options: expected an object");
  }
  json_t *values = json_object();
  int s = values ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  const char *key;
  json_t *v;
  json_object_foreach(given, key, v) {
    if (s != DDPLUG_OK) break;
    const ddplug_option *o = find_decl(t, key);
    s = o ? check_value(o, v) : unknown_option(t, key);
    if (s == DDPLUG_OK && json_object_set(values, key, v) != 0)
      s = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  for (size_t i = 0; s == DDPLUG_OK && t->options[i]; i++) {
    const ddplug_option *o = t->options[i];
    if (json_object_get(values, o->name) || !o->default_json) continue;
    json_t *d = json_loads(o->default_json, JSON_DECODE_ANY, &e); /* checked at load */
    if (!d || json_object_set_new(values, o->name, d) != 0)
      s = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  json_decref(given);
  if (s != DDPLUG_OK) {
    json_decref(values);
    return s;
  }
  *out = values;
  return DDPLUG_OK;
}

/* See context.h. */
int ddplug__option_value(const ddplug_plugin *t, const json_t *values, const char *name,
                         int32_t type, const json_t **out) {
  const ddplug_option *o = name ? find_decl(t, name) : NULL;
  if (!o)
    return ddplug__err(DDPLUG_E_NOT_FOUND, "plugin %s declares no option '%s'", t->name,
                       name ? name : "(null)");
  if (o->type != type)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin option '%s' is declared as %s, not read as %s", name,
                       type_name(o->type), type_name(type));
  *out = values ? json_object_get(values, name) : NULL;
  if (!*out)
    return ddplug__err(DDPLUG_E_NOT_FOUND,
                       "plugin option '%s' is not set and has no default", name);
  return DDPLUG_OK;
}

/* One declaration as JSON: what `ddplug info` and hosts show users. */
static json_t *decl_json(const ddplug_option *o) {
  static const char *const types[] = {"", "bool", "int", "number", "string", "int_list"};
  json_t *j = json_pack("{s:s, s:s, s:s}", "name", o->name, "type", types[o->type],
                        "description", o->description ? o->description : "");
  if (!j) return NULL;
  json_error_t e;
  json_object_set_new(j, "default", o->default_json ? json_loads(o->default_json, JSON_DECODE_ANY, &e)
                                                    : json_null());
  if (o->type == DDPLUG_OPTION_INT || o->type == DDPLUG_OPTION_INT_LIST) {
    if (bounded(o->int_min, o->int_max)) {
      json_object_set_new(j, "minimum", json_integer(o->int_min));
      json_object_set_new(j, "maximum", json_integer(o->int_max));
    }
    if (o->int_multiple > 1) json_object_set_new(j, "multiple_of", json_integer(o->int_multiple));
  }
  if (o->type == DDPLUG_OPTION_INT_LIST && o->max_items)
    json_object_set_new(j, "max_items", json_integer(o->max_items));
  if (o->type == DDPLUG_OPTION_NUMBER && bounded_num(o->num_min, o->num_max)) {
    json_object_set_new(j, "minimum", json_real(o->num_min));
    json_object_set_new(j, "maximum", json_real(o->num_max));
  }
  if (o->type == DDPLUG_OPTION_STRING && o->choices) {
    json_t *c = json_array();
    for (size_t i = 0; o->choices[i]; i++) json_array_append_new(c, json_string(o->choices[i]));
    json_object_set_new(j, "choices", c);
  }
  return j;
}

/* See plugin.h. */
json_t *ddplug__options_json(const ddplug_plugin *t) {
  json_t *list = t->options ? json_array() : json_null();
  for (size_t i = 0; list && t->options && t->options[i]; i++)
    if (json_array_append_new(list, decl_json(t->options[i])) != 0) {
      json_decref(list);
      list = NULL;
    }
  return list;
}
