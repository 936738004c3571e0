/*
 * config.h — the config layer's header: internals of the strict JSON
 * configuration, shared by its files and by tests/c/test-config.c.
 * Everything here is internal (ddplug__ prefix, hidden). Depends on base/.
 * The module map of abi/src/config/:
 *   keys.c    the key table, its name patterns, "did you mean"
 *   parse.c   validation of parsed JSON against the table, defaults
 *   config.c  load from file/string/environment, to_json, hash
 *   get.c     typed getters by dotted path
 *   schema.c  the JSON Schema, generated from the key table
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CONFIG_H
#define DDPLUG_CONFIG_H

#include <jansson.h>
#include <stdint.h>

#include "base/base.h"

/* The least data_split.audit_exact_max the config accepts (keys.c): fewer
 * tracked samples cannot tell a lost or repeated one from sampling error. */
#define DDPLUG__AUDIT_EXACT_MIN 1024

/* What a key holds. The JSON Schema type of each is in brackets. */
typedef enum ddplug__cfg_type {
  DDPLUG__CFG_OBJECT = 1, /* [object] fixed keys: the table entries below it */
  DDPLUG__CFG_MAP,        /* [object] keys are names matching `pattern`; each
                             value is described by the entry "<path>.*"     */
  DDPLUG__CFG_FREE,       /* [object] any JSON object, kept as given        */
  DDPLUG__CFG_STRING,     /* [string] min_len..max_len characters, pattern  */
  DDPLUG__CFG_ENUM,       /* [string] one of enum_values                    */
  DDPLUG__CFG_BOOL,       /* [boolean] true or false                        */
  DDPLUG__CFG_INT,        /* [integer] imin..imax, written without fraction */
  DDPLUG__CFG_NUMBER,     /* [number] nmin < v (or <=) and v <= nmax       */
  DDPLUG__CFG_INT_ARRAY   /* [array] min_len..max_len integers in imin..imax,
                             strictly ascending if `ascending`              */
} ddplug__cfg_type;

/* What happens when a key is absent from its (present) parent object. */
typedef enum ddplug__cfg_presence {
  DDPLUG__CFG_DEFAULT = 1, /* the default is filled in                       */
  DDPLUG__CFG_OPTIONAL,    /* stays absent (getters say "not set")           */
  DDPLUG__CFG_REQUIRED     /* an error: "missing required key"               */
} ddplug__cfg_presence;

/* No upper bound for an INT (the schema has no "maximum"). */
#define DDPLUG__CFG_NO_MAX INT64_MAX

/* One key of the configuration. The table lists parents before children;
 * `path` is the dotted schema path, with '*' standing for any name of a MAP
 * ("data_split.streams.*.owner"). */
typedef struct ddplug__cfg_key {
  const char *path;
  ddplug__cfg_type type;
  ddplug__cfg_presence presence;
  /* INT, and the items of an INT_ARRAY: inclusive bounds. */
  int64_t imin, imax;
  /* NUMBER: nmin < v (nmin_exclusive) or nmin <= v, and v <= nmax. */
  double nmin, nmax;
  int nmin_exclusive;
  /* STRING: length in characters (UTF-8 code points); INT_ARRAY: number of
   * items. 0 = no bound. */
  uint32_t min_len, max_len;
  /* STRING values and MAP names must match this anchored pattern, a POSIX
   * extended regular expression that reads the same in ECMA-262 (the JSON
   * Schema's dialect: bracket classes, '*', '+', '{m,n}', '^', '$');
   * pattern_hint says it in words. */
  const char *pattern;
  const char *pattern_hint;
  /* ENUM: the allowed values, NULL-terminated. */
  const char *const *enum_values;
  /* INT_ARRAY: items must be strictly ascending. */
  int ascending;
  /* Default (presence DEFAULT): def_int for INT and BOOL (0/1), def_num for
   * NUMBER, def_str for STRING and ENUM; OBJECT/MAP/FREE default to {} (an
   * OBJECT's keys then get their own defaults). */
  int64_t def_int;
  double def_num;
  const char *def_str;
  /* One or two sentences for users; the schema's "description" equals it. */
  const char *description;
} ddplug__cfg_key;

/* The key table (config_schema.c): static, parents before children. */
const ddplug__cfg_key *ddplug__config_keys(size_t *count);

/* The entry whose schema path is exactly path (length len), or NULL. */
const ddplug__cfg_key *ddplug__config_key_find(const char *path, size_t len);

/* The child `name` (length len) of the entry at schema path parent ("" for
 * the top level), or NULL. */
const ddplug__cfg_key *ddplug__config_key_child(const char *parent,
                                                const char *name, size_t len);

/* Whether k is a direct child of the schema path parent ("" = top level). */
int ddplug__config_key_is_child(const ddplug__cfg_key *k, const char *parent);

/* The last segment of k's path ("batch_size" for "sampler.bucket.batch_size"). */
const char *ddplug__config_key_name(const ddplug__cfg_key *k);

/* Whether the bytes text[0..len) match pattern (see ddplug__cfg_key).
 * 1 match, 0 no match (also for text containing NUL), -1 out of memory,
 * -2 the pattern does not compile. */
int ddplug__config_pattern_match(const char *pattern, const char *text,
                                 size_t len);

/* Validate doc (parsed JSON) against the table and build the effective
 * config (defaults filled in, integral numbers as integers) into *out (a new
 * reference). On failure nothing is allocated, and the last error is
 * "origin: key.path: message" (DDPLUG_E_CONFIG) or names the allocation
 * that failed (DDPLUG_E_NO_MEMORY). config_parse.c. */
int ddplug__config_build(const json_t *doc, const char *origin, json_t **out);

/* Write a short, single-line rendering of v for messages ("70000", "3.0",
 * "\"yes\"", "an object") into buf[cap]. Allocates nothing. */
void ddplug__config_describe(const json_t *v, char *buf, size_t cap);

/* Canonical text of v: sorted keys, compact, reals with the fewest digits
 * (15, else 17) that read back to the same value. Allocated with
 * ddplug__malloc; NULL when out of memory (last error set). config.c. */
char *ddplug__config_canonical(const json_t *v);

/* The effective config tree of cfg (borrowed, immutable). config.c. */
/* The document as the user gave it (before defaults), borrowed. */
const json_t *ddplug__config_given(const ddplug_config *cfg);
const json_t *ddplug__config_root(const ddplug_config *cfg);

/* A deep copy of cfg with the same origin (for a context that keeps its own
 * config). On failure *out is untouched. config.c. */
int ddplug__config_clone(const ddplug_config *cfg, ddplug_config **out);

/* "plugin_options" of cfg as compact JSON text (owned by cfg, "{}" if none). */
const char *ddplug__config_plugin_options(const ddplug_config *cfg);


/* The config's JSON Schema, built from the key table (schema.c); a new
 * reference, NULL when out of memory. */
json_t *ddplug__config_schema(void);

#endif /* DDPLUG_CONFIG_H */
