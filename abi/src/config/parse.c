/* config_parse.c — validate a parsed JSON document against the key table
 * (config_schema.c) and build the effective config: defaults filled in,
 * integral numbers stored as integers. The first error wins; it reads
 * "origin: key.path: what is wrong, what is allowed".
 * SPDX-License-Identifier: Apache-2.0 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

/* The walk's state: where in the document we are, for messages. */
typedef struct pctx {
  const char *origin;
  char path[1024];
  size_t len;
} pctx;

/* Cross-key rules the table cannot express: lo < hi (strict) or lo <= hi,
 * checked when both keys of the object are present. */
static const struct cross_rule {
  const char *object, *lo, *hi;
  int strict;
} k_cross_rules[] = {
    {"world", "rank", "world_size", 1},
    {"world", "local_rank", "local_world_size", 1},
    {"world", "local_world_size", "world_size", 0},
};

/* ---- messages ------------------------------------------------------------ */

static int fail(const pctx *c, const char *fmt, ...) DDPLUG__PRINTF(2, 3);
static int fail(const pctx *c, const char *fmt, ...) {
  char msg[DDPLUG__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->len == 0) return ddplug__err(DDPLUG_E_CONFIG, "%s: %s", c->origin, msg);
  return ddplug__err(DDPLUG_E_CONFIG, "%s: %s: %s", c->origin, c->path, msg);
}

static int oom(const pctx *c) {
  return ddplug__err(DDPLUG_E_NO_MEMORY,
                     "%s: out of memory while loading the config", c->origin);
}

/* Append ".name" (or "name" at the top) to the path; returns the old length
 * for pop(). An overlong path is cut (messages only). */
static size_t push_key(pctx *c, const char *name) {
  size_t mark = c->len;
  int n = snprintf(c->path + c->len, sizeof c->path - c->len, "%s%s",
                   c->len ? "." : "", name);
  c->len = n < 0 ? c->len : DDPLUG__MIN(c->len + (size_t)n, sizeof c->path - 1);
  return mark;
}

static size_t push_index(pctx *c, size_t i) {
  size_t mark = c->len;
  int n = snprintf(c->path + c->len, sizeof c->path - c->len, "[%zu]", i);
  c->len = n < 0 ? c->len : DDPLUG__MIN(c->len + (size_t)n, sizeof c->path - 1);
  return mark;
}

static void pop(pctx *c, size_t mark) {
  c->len = mark;
  c->path[mark] = '\0';
}

/* Shortest %g rendering of d that reads back as d, with a '.' or exponent
 * so that it reads as a real ("3.0"). */
static void format_real(double d, char *buf, size_t cap) {
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, d);
    if (strtod(buf, NULL) == d) break;
  }
  if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 <= cap) strcat(buf, ".0");
}

/* A JSON string literal of s, cut after 48 bytes of content. */
static void format_string(const char *s, size_t len, char *buf, size_t cap) {
  size_t o = 0, i = 0;
  if (cap < 16) {
    if (cap) buf[0] = '\0';
    return;
  }
  buf[o++] = '"';
  for (; i < len && i < 48 && o + 8 < cap; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') {
      buf[o++] = '\\';
      buf[o++] = (char)ch;
    } else if (ch < 0x20) {
      o += (size_t)snprintf(buf + o, cap - o, "\\u%04x", ch);
    } else {
      buf[o++] = (char)ch;
    }
  }
  if (i < len) {
    while (o > 1 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80) o--; /* UTF-8 */
    if (o > 1 && (unsigned char)buf[o - 1] >= 0xC0) o--;
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o++] = '"';
  buf[o] = '\0';
}

void ddplug__config_describe(const json_t *v, char *buf, size_t cap) {
  switch (json_typeof(v)) {
    case JSON_OBJECT:
      snprintf(buf, cap, "an object");
      break;
    case JSON_ARRAY:
      snprintf(buf, cap, "an array");
      break;
    case JSON_STRING:
      format_string(json_string_value(v), json_string_length(v), buf, cap);
      break;
    case JSON_INTEGER:
      snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
      break;
    case JSON_REAL:
      format_real(json_real_value(v), buf, cap);
      break;
    case JSON_TRUE:
      snprintf(buf, cap, "true");
      break;
    case JSON_FALSE:
      snprintf(buf, cap, "false");
      break;
    default:
      snprintf(buf, cap, "null");
      break;
  }
}

/* "from 0 to 65535" / ">= 0". */
static void int_bounds(int64_t lo, int64_t hi, char *buf, size_t cap) {
  if (hi == DDPLUG__CFG_NO_MAX)
    snprintf(buf, cap, ">= %" PRId64, lo);
  else
    snprintf(buf, cap, "from %" PRId64 " to %" PRId64, lo, hi);
}

/* "an integer from 0 to 65535" / "an integer >= 0". */
static void int_what(int64_t lo, int64_t hi, char *buf, size_t cap) {
  char b[96];
  int_bounds(lo, hi, b, sizeof b);
  snprintf(buf, cap, "an integer %s", b);
}

/* What k allows, in words, for "expected ..., got ...". */
static void expected_what(const ddplug__cfg_key *k, char *buf, size_t cap) {
  char tmp[128], lo[40], hi[40];
  switch (k->type) {
    case DDPLUG__CFG_OBJECT:
    case DDPLUG__CFG_MAP:
    case DDPLUG__CFG_FREE:
      snprintf(buf, cap, "an object");
      break;
    case DDPLUG__CFG_BOOL:
      snprintf(buf, cap, "true or false");
      break;
    case DDPLUG__CFG_INT:
      int_what(k->imin, k->imax, buf, cap);
      break;
    case DDPLUG__CFG_NUMBER: {
      format_real(k->nmin, lo, sizeof lo);
      format_real(k->nmax, hi, sizeof hi);
      /* bounds print as integers when they are */
      if (k->nmin == floor(k->nmin)) snprintf(lo, sizeof lo, "%.0f", k->nmin);
      if (k->nmax == floor(k->nmax)) snprintf(hi, sizeof hi, "%.0f", k->nmax);
      snprintf(buf, cap, "a number %s %s and <= %s",
               k->nmin_exclusive ? ">" : ">=", lo, hi);
      break;
    }
    case DDPLUG__CFG_ENUM: {
      size_t o = (size_t)snprintf(buf, cap, "one of");
      for (size_t i = 0; k->enum_values[i] && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s %s", i ? "," : "",
                              k->enum_values[i]);
      break;
    }
    case DDPLUG__CFG_STRING:
      if (k->pattern_hint)
        snprintf(buf, cap, "%s", k->pattern_hint);
      else if (k->max_len)
        snprintf(buf, cap, "a string of %" PRIu32 " to %" PRIu32 " characters",
                 k->min_len, k->max_len);
      else
        snprintf(buf, cap, "a %sstring", k->min_len ? "non-empty " : "");
      break;
    case DDPLUG__CFG_INT_ARRAY:
      int_bounds(k->imin, k->imax, tmp, sizeof tmp);
      snprintf(buf, cap, "an array of %" PRIu32 " to %" PRIu32 " integers %s%s",
               k->min_len, k->max_len, tmp,
               k->ascending ? ", strictly ascending" : "");
      break;
  }
}

static int wrong(const pctx *c, const ddplug__cfg_key *k, const json_t *v) {
  char what[512], got[128];
  expected_what(k, what, sizeof what);
  ddplug__config_describe(v, got, sizeof got);
  return fail(c, "expected %s, got %s", what, got);
}

/* ---- values -------------------------------------------------------------- */

static int check_object(pctx *c, const char *schema_path, const json_t *in,
                        json_t **out);

/* Characters (UTF-8 code points) in s[0..len); jansson checked the UTF-8. */
static size_t utf8_chars(const char *s, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
  return n;
}

static int check_string(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                        json_t **out) {
  if (!json_is_string(v)) return wrong(c, k, v);
  const char *s = json_string_value(v);
  size_t len = json_string_length(v), chars = utf8_chars(s, len);
  if (chars < k->min_len) return wrong(c, k, v);
  if (k->max_len && chars > k->max_len) {
    char what[256];
    expected_what(k, what, sizeof what);
    return fail(c, "expected %s, got a string of %zu characters", what, chars);
  }
  if (k->pattern) {
    int m = ddplug__config_pattern_match(k->pattern, s, len);
    if (m == -1) return oom(c);
    if (m != 1) return wrong(c, k, v);
  }
  *out = json_stringn(s, len);
  return *out ? DDPLUG_OK : oom(c);
}

static int check_enum(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                      json_t **out) {
  if (!json_is_string(v)) return wrong(c, k, v);
  const char *s = json_string_value(v);
  ddplug__suggest sg;
  ddplug__suggest_init(&sg, s);
  for (size_t i = 0; k->enum_values[i]; i++) {
    if (!strcmp(s, k->enum_values[i]) &&
        strlen(s) == json_string_length(v)) {
      *out = json_string(s);
      return *out ? DDPLUG_OK : oom(c);
    }
    ddplug__suggest_offer(&sg, k->enum_values[i], strlen(k->enum_values[i]));
  }
  char what[512], got[128];
  expected_what(k, what, sizeof what);
  ddplug__config_describe(v, got, sizeof got);
  const char *best = ddplug__suggest_best(&sg);
  if (best) return fail(c, "expected %s, got %s (did you mean '%s'?)", what, got, best);
  return fail(c, "expected %s, got %s", what, got);
}

static int check_int(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                     json_t **out) {
  if (!json_is_integer(v) || json_integer_value(v) < k->imin ||
      json_integer_value(v) > k->imax) {
    char what[128], got[128];
    int_what(k->imin, k->imax, what, sizeof what);
    ddplug__config_describe(v, got, sizeof got);
    return fail(c, "expected %s, got %s", what, got);
  }
  *out = json_integer(json_integer_value(v));
  return *out ? DDPLUG_OK : oom(c);
}

/* 2^53: integral reals up to this are stored as integers. */
#define EXACT_INT_LIMIT 9007199254740992.0

static int check_number(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                        json_t **out) {
  if (!json_is_number(v)) return wrong(c, k, v);
  double d = json_number_value(v);
  int low = k->nmin_exclusive ? !(d > k->nmin) : !(d >= k->nmin);
  if (low || !(d <= k->nmax)) return wrong(c, k, v);
  if (json_is_integer(v))
    *out = json_integer(json_integer_value(v));
  else if (d == floor(d) && fabs(d) <= EXACT_INT_LIMIT)
    *out = json_integer((json_int_t)d);
  else
    *out = json_real(d);
  return *out ? DDPLUG_OK : oom(c);
}

static int check_int_array(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                           json_t **out) {
  if (!json_is_array(v)) return wrong(c, k, v);
  size_t n = json_array_size(v);
  if (n < k->min_len || (k->max_len && n > k->max_len)) {
    char what[256];
    expected_what(k, what, sizeof what);
    if (n == 0) return fail(c, "expected %s, got an empty array", what);
    return fail(c, "expected %s, got %zu items", what, n);
  }
  json_t *arr = json_array();
  if (!arr) return oom(c);
  for (size_t i = 0; i < n; i++) {
    const json_t *item = json_array_get(v, i);
    size_t mark = push_index(c, i);
    json_t *copy = NULL;
    int rc = check_int(c, k, item, &copy);
    if (rc == DDPLUG_OK && k->ascending && i > 0 &&
        json_integer_value(item) <= json_integer_value(json_array_get(v, i - 1))) {
      json_decref(copy);
      rc = fail(c, "expected an integer greater than %" JSON_INTEGER_FORMAT
                   " (the list is strictly ascending), got %" JSON_INTEGER_FORMAT,
                json_integer_value(json_array_get(v, i - 1)), json_integer_value(item));
    }
    if (rc != DDPLUG_OK) {
      json_decref(arr);
      return rc;
    }
    pop(c, mark);
    if (json_array_append_new(arr, copy)) {
      json_decref(arr);
      return oom(c);
    }
  }
  *out = arr;
  return DDPLUG_OK;
}

/* A MAP: every name must match the pattern; every value is checked against
 * the "<path>.*" entry. */
static int check_map(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                     json_t **out) {
  if (!json_is_object(v)) return wrong(c, k, v);
  char item_path[128];
  snprintf(item_path, sizeof item_path, "%s.*", k->path);
  json_t *map = json_object();
  if (!map) return oom(c);
  const char *name;
  json_t *item;
  void *it;
  for (it = json_object_iter((json_t *)v); it;
       it = json_object_iter_next((json_t *)v, it)) {
    name = json_object_iter_key(it);
    item = json_object_iter_value(it);
    size_t mark = push_key(c, name);
    json_t *copy = NULL;
    int rc = DDPLUG_OK;
    int m = ddplug__config_pattern_match(k->pattern, name, strlen(name));
    if (m == -1)
      rc = oom(c);
    else if (m != 1)
      rc = fail(c, "invalid name, expected %s", k->pattern_hint);
    else
      rc = check_object(c, item_path, item, &copy);
    if (rc != DDPLUG_OK) {
      json_decref(map);
      return rc;
    }
    pop(c, mark);
    if (json_object_set_new(map, name, copy)) {
      json_decref(map);
      return oom(c);
    }
  }
  *out = map;
  return DDPLUG_OK;
}

static int check_value(pctx *c, const ddplug__cfg_key *k, const json_t *v,
                       json_t **out) {
  switch (k->type) {
    case DDPLUG__CFG_OBJECT:
      if (!json_is_object(v)) return wrong(c, k, v);
      return check_object(c, k->path, v, out);
    case DDPLUG__CFG_MAP:
      return check_map(c, k, v, out);
    case DDPLUG__CFG_FREE:
      if (!json_is_object(v)) return wrong(c, k, v);
      *out = json_deep_copy(v);
      return *out ? DDPLUG_OK : oom(c);
    case DDPLUG__CFG_STRING:
      return check_string(c, k, v, out);
    case DDPLUG__CFG_ENUM:
      return check_enum(c, k, v, out);
    case DDPLUG__CFG_BOOL:
      if (!json_is_boolean(v)) return wrong(c, k, v);
      *out = json_boolean(json_is_true(v));
      return DDPLUG_OK;
    case DDPLUG__CFG_INT:
      return check_int(c, k, v, out);
    case DDPLUG__CFG_NUMBER:
      return check_number(c, k, v, out);
    case DDPLUG__CFG_INT_ARRAY:
      return check_int_array(c, k, v, out);
  }
  return ddplug__err(DDPLUG_E_INTERNAL, "config key %s has no type", k->path);
}

/* The value an absent DEFAULT key gets. */
static int default_value(pctx *c, const ddplug__cfg_key *k, json_t **out) {
  switch (k->type) {
    case DDPLUG__CFG_OBJECT:
      return check_object(c, k->path, NULL, out);
    case DDPLUG__CFG_MAP:
    case DDPLUG__CFG_FREE:
    case DDPLUG__CFG_INT_ARRAY:
      *out = k->type == DDPLUG__CFG_INT_ARRAY ? json_array() : json_object();
      break;
    case DDPLUG__CFG_STRING:
    case DDPLUG__CFG_ENUM:
      *out = json_string(k->def_str);
      break;
    case DDPLUG__CFG_BOOL:
      *out = json_boolean(k->def_int);
      break;
    case DDPLUG__CFG_INT:
      *out = json_integer(k->def_int);
      break;
    case DDPLUG__CFG_NUMBER:
      *out = k->def_num == floor(k->def_num) ? json_integer((json_int_t)k->def_num)
                                             : json_real(k->def_num);
      break;
  }
  return *out ? DDPLUG_OK : oom(c);
}

/* ---- objects ------------------------------------------------------------- */

static int unknown_key(const pctx *c, const char *schema_path, const char *key) {
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  ddplug__suggest sg;
  ddplug__suggest_init(&sg, key);
  char allowed[512];
  size_t o = 0;
  allowed[0] = '\0';
  for (size_t i = 0; i < count; i++) {
    if (!ddplug__config_key_is_child(&keys[i], schema_path)) continue;
    const char *name = ddplug__config_key_name(&keys[i]);
    ddplug__suggest_offer(&sg, name, strlen(name));
    if (o < sizeof allowed)
      o += (size_t)snprintf(allowed + o, sizeof allowed - o, "%s%s",
                            o ? ", " : "", name);
  }
  const char *best = ddplug__suggest_best(&sg);
  if (best) return fail(c, "unknown key (did you mean '%s'?)", best);
  /* The same name at another level: the key is probably misplaced. */
  for (size_t i = 0; i < count; i++)
    if (!strcmp(ddplug__config_key_name(&keys[i]), key) &&
        !strchr(keys[i].path, '*'))
      return fail(c, "unknown key here (did you mean '%s'?)", keys[i].path);
  return fail(c, "unknown key (allowed: %s%s)", allowed,
              schema_path[0] ? "" : "; options for the plugin go in plugin_options");
}

static int check_cross_rules(pctx *c, const char *schema_path,
                             const json_t *obj) {
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_cross_rules); i++) {
    const struct cross_rule *r = &k_cross_rules[i];
    if (strcmp(r->object, schema_path) != 0) continue;
    const json_t *lo = json_object_get(obj, r->lo), *hi = json_object_get(obj, r->hi);
    if (!lo || !hi) continue;
    json_int_t a = json_integer_value(lo), b = json_integer_value(hi);
    if (r->strict ? a < b : a <= b) continue;
    size_t mark = push_key(c, r->lo);
    /* the parent's part of the path is already in c->path */
    int rc = fail(c, "%" JSON_INTEGER_FORMAT " must be %s %s.%s (%" JSON_INTEGER_FORMAT ")",
                  a, r->strict ? "less than" : "at most", schema_path, r->hi, b);
    pop(c, mark);
    return rc;
  }
  return DDPLUG_OK;
}

/* Check the object in (NULL: absent, only defaults) against the children
 * of schema_path; *out receives the effective object. */
static int check_object(pctx *c, const char *schema_path, const json_t *in,
                        json_t **out) {
  json_t *obj = json_object();
  if (!obj) return oom(c);
  int rc = DDPLUG_OK;
  if (in) {
    void *it;
    for (it = json_object_iter((json_t *)in); it;
         it = json_object_iter_next((json_t *)in, it)) {
      const char *name = json_object_iter_key(it);
      const ddplug__cfg_key *k =
          ddplug__config_key_child(schema_path, name, strlen(name));
      size_t mark = push_key(c, name);
      json_t *val = NULL;
      rc = k ? check_value(c, k, json_object_iter_value(it), &val)
             : unknown_key(c, schema_path, name);
      if (rc != DDPLUG_OK) goto failed;
      pop(c, mark);
      if (json_object_set_new(obj, name, val)) goto no_memory;
    }
  }
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  for (size_t i = 0; i < count; i++) {
    const ddplug__cfg_key *k = &keys[i];
    const char *name = ddplug__config_key_name(k);
    if (!ddplug__config_key_is_child(k, schema_path) || json_object_get(obj, name))
      continue;
    if (k->presence == DDPLUG__CFG_REQUIRED) {
      char what[512];
      expected_what(k, what, sizeof what);
      rc = fail(c, "missing required key '%s' (%s)", name, what);
      goto failed;
    }
    if (k->presence != DDPLUG__CFG_DEFAULT) continue;
    size_t mark = push_key(c, name);
    json_t *val = NULL;
    rc = default_value(c, k, &val);
    if (rc != DDPLUG_OK) goto failed;
    pop(c, mark);
    if (json_object_set_new(obj, name, val)) goto no_memory;
  }
  rc = check_cross_rules(c, schema_path, obj);
  if (rc != DDPLUG_OK) goto failed;
  *out = obj;
  return DDPLUG_OK;
no_memory:
  rc = oom(c);
failed:
  json_decref(obj);
  return rc;
}

/* Rules across sections, on the effective config: port 0 ("any free port")
 * cannot be found by other processes, so it only works for one. */
static int check_across_sections(pctx *c, const json_t *cfg) {
  const json_t *port = json_object_get(json_object_get(cfg, "rendezvous"), "port");
  const json_t *ws = json_object_get(json_object_get(cfg, "world"), "world_size");
  if (port && ws && json_integer_value(port) == 0 && json_integer_value(ws) > 1) {
    push_key(c, "rendezvous");
    push_key(c, "port");
    return fail(c, "0 (any free port) works only for a single process, but "
                   "world.world_size is %" JSON_INTEGER_FORMAT ": the other "
                   "ranks could not find it; give a free port, or leave it out "
                   "to use MASTER_PORT",
                json_integer_value(ws));
  }
  return DDPLUG_OK;
}

int ddplug__config_build(const json_t *doc, const char *origin, json_t **out) {
  pctx c = {.origin = origin, .len = 0};
  c.path[0] = '\0';
  if (!json_is_object(doc)) {
    char got[128];
    ddplug__config_describe(doc, got, sizeof got);
    return fail(&c, "the top level must be a JSON object ({...}), got %s", got);
  }
  int rc = check_object(&c, "", doc, out);
  if (rc == DDPLUG_OK && (rc = check_across_sections(&c, *out)) != DDPLUG_OK) {
    json_decref(*out);
    *out = NULL;
  }
  return rc;
}
