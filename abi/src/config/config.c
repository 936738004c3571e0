/* config.c — the config handle: load from a file, a string or the
 * DDPLUG_CONFIG environment variable (strict JSON through jansson), the
 * defaults, canonical JSON, the run hash, the origin. Validation is in
 * config_parse.c, the key table in config_schema.c, getters in config_get.c.
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"

/* A config is immutable after load, so it may be shared between threads. */
struct ddplug_config {
  char *origin;         /* file path, "<string>", "DDPLUG_CONFIG", ...      */
  json_t *root;         /* the effective config (defaults filled in)        */
  json_t *given;        /* the document as given (what the user set)        */
  char *canonical;      /* canonical JSON of root                           */
  char *plugin_options; /* canonical JSON of root.plugin_options            */
  uint64_t hash;        /* of root without world and log_level              */
};

/* Files larger than this are refused: a config is a few KiB. */
#define CONFIG_FILE_MAX (16u << 20)
/* A path longer than this is shown with its middle elided in messages (and
 * as the config's origin), so the reason at the end of a message is never
 * cut off. */
#define SHOWN_PATH_MAX 512

/* path, or its first and last characters around "..." when it is long. */
static const char *shown_path(const char *path, char buf[SHOWN_PATH_MAX + 1]) {
  size_t n = strlen(path);
  if (n <= SHOWN_PATH_MAX) return path;
  size_t head = SHOWN_PATH_MAX / 4, tail = SHOWN_PATH_MAX - head - 3;
  memcpy(buf, path, head);
  memcpy(buf + head, "...", 3);
  memcpy(buf + head + 3, path + n - tail, tail + 1);
  return buf;
}

/* In the test build under DDPLUG_TEST_FAIL_ALLOC (the malloc-failure
 * tests), jansson allocates through ddplug__malloc too, so that every
 * allocation of a load can be failed in turn, and a failure is remembered:
 * jansson reports some of its allocation failures as syntax errors.
 * Otherwise jansson's allocator is left alone (the process may have set its
 * own); a real out-of-memory inside jansson's parser may then read as a
 * syntax error. */
static pthread_once_t g_alloc_once = PTHREAD_ONCE_INIT;
static _Thread_local int t_json_alloc_failed;

#ifdef DDPLUG_TEST_HOOKS
static void *json_alloc(size_t n) {
  void *p = ddplug__malloc(n);
  if (!p) t_json_alloc_failed = 1;
  return p;
}
#endif

static void init_alloc(void) {
#ifdef DDPLUG_TEST_HOOKS
  if (getenv("DDPLUG_TEST_FAIL_ALLOC")) json_set_alloc_funcs(json_alloc, ddplug__free);
#endif
}

/* ---- canonical text, hash ------------------------------------------------ */

/* json_dumpb into a fresh ddplug__malloc'ed, NUL-terminated buffer. */
static char *dump(const json_t *v, size_t flags) {
  size_t n = json_dumpb(v, NULL, 0, flags);
  if (n == 0) return NULL; /* jansson ran out of memory */
  char *buf = ddplug__malloc(n + 1);
  if (!buf) return NULL;
  if (json_dumpb(v, buf, n, flags) != n) {
    ddplug__free(buf);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

char *ddplug__config_canonical(const json_t *v) {
  const size_t base = JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY;
  char *text = dump(v, base | JSON_REAL_PRECISION(15));
  if (text) {
    /* 15 digits are prettier ("0.1"); keep them only if exact. */
    json_t *back = json_loads(text, JSON_DECODE_ANY, NULL);
    int exact = back && json_equal(back, v);
    json_decref(back);
    if (!back) {
      ddplug__free(text);
      text = NULL;
    } else if (!exact) {
      ddplug__free(text);
      text = dump(v, base | JSON_REAL_PRECISION(17));
    }
  }
  if (!text)
    ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory writing the config as JSON");
  return text;
}

/* The run hash covers everything but what describes this process. */
static int run_hash(const json_t *root, uint64_t *out) {
  json_t *copy = json_copy((json_t *)root);
  if (!copy)
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory hashing the config");
  json_object_del(copy, "world");
  json_object_del(copy, "log_level");
  char *text = ddplug__config_canonical(copy);
  json_decref(copy);
  if (!text) return DDPLUG_E_NO_MEMORY;
  *out = ddplug__hash64(text, strlen(text), 0);
  ddplug__free(text);
  return DDPLUG_OK;
}

/* ---- handles ------------------------------------------------------------- */

DDPLUG_API void ddplug_config_free(ddplug_config *cfg) {
  if (!cfg) return;
  json_decref(cfg->root);
  json_decref(cfg->given);
  ddplug__free(cfg->origin);
  ddplug__free(cfg->canonical);
  ddplug__free(cfg->plugin_options);
  ddplug__free(cfg);
}

/* Wrap an effective tree and the document it came from (steals both, also
 * on failure) into a handle. */
static int make_config(json_t *root, json_t *given, const char *origin,
                       ddplug_config **out) {
  ddplug_config *cfg = ddplug__calloc(1, sizeof *cfg);
  if (!cfg || !given) {
    ddplug__free(cfg);
    json_decref(given);
    json_decref(root);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory loading the config",
                       origin);
  }
  cfg->root = root;
  cfg->given = given;
  cfg->origin = ddplug__strdup(origin);
  cfg->canonical = ddplug__config_canonical(root);
  cfg->plugin_options =
      ddplug__config_canonical(json_object_get(root, "plugin_options"));
  int rc = cfg->origin && cfg->canonical && cfg->plugin_options
               ? run_hash(root, &cfg->hash)
               : ddplug__err(DDPLUG_E_NO_MEMORY,
                             "%s: out of memory loading the config", origin);
  if (rc != DDPLUG_OK) {
    ddplug_config_free(cfg);
    return rc;
  }
  *out = cfg;
  return DDPLUG_OK;
}

/* Validate a parsed document (borrowed) and make the handle. */
static int from_document(const json_t *doc, const char *origin,
                         ddplug_config **out) {
  json_t *root = NULL;
  int rc = ddplug__config_build(doc, origin, &root);
  if (rc != DDPLUG_OK) return rc;
  return make_config(root, json_deep_copy(doc), origin, out);
}

static int only_space(const char *s, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (!strchr(" \t\r\n", s[i])) return 0;
  return 1;
}

/* The key path ("sampler.seed", "a[2].b") of the object key that ends
 * just before text[pos] (where jansson stops at a duplicate key): a small
 * scan of the JSON up to pos that tracks the enclosing objects' keys and
 * arrays' indices. The text up to pos parsed, so it is well formed. */
static void duplicate_key_path(const char *text, size_t len, size_t pos, char *out,
                               size_t cap) {
  enum { DEPTH = 64 };
  struct { int array; long index; const char *key; size_t klen; } st[DEPTH];
  int depth = 0, in_key = 0;
  const char *last = NULL;
  size_t last_len = 0;
  if (pos > len) pos = len;
  for (size_t i = 0; i < pos; i++) {
    char c = text[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < pos && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      last = text + i + 1;
      last_len = (j < pos ? j : pos) - i - 1;
      if (depth > 0 && depth <= DEPTH && !st[depth - 1].array && in_key) {
        st[depth - 1].key = last;
        st[depth - 1].klen = last_len;
      }
      i = j;
    } else if (c == '{' || c == '[') {
      if (depth < DEPTH) {
        st[depth].array = c == '[';
        st[depth].index = 0;
        st[depth].key = NULL;
        st[depth].klen = 0;
      }
      depth++;
      in_key = c == '{';
    } else if (c == '}' || c == ']') {
      if (depth > 0) depth--;
      in_key = 0;
    } else if (c == ':') {
      in_key = 0;
    } else if (c == ',' && depth > 0 && depth <= DEPTH) {
      if (st[depth - 1].array) st[depth - 1].index++;
      else in_key = 1;
    }
  }
  size_t o = 0;
  out[0] = '\0';
  for (int d = 0; d < depth && d < DEPTH && o + 8 < cap; d++) {
    if (st[d].array) {
      o += (size_t)snprintf(out + o, cap - o, "[%ld]", st[d].index);
    } else if (st[d].key) {
      o += (size_t)snprintf(out + o, cap - o, "%s%.*s", o ? "." : "",
                            (int)DDPLUG__MIN(st[d].klen, cap - o - 2), st[d].key);
    }
    if (o >= cap) o = cap - 1;
  }
  if (!out[0] && last)
    snprintf(out, cap, "%.*s", (int)DDPLUG__MIN(last_len, cap - 1), last);
}

/* Parse text[0..len) strictly and load it. */
static int load_text(const char *text, size_t len, const char *origin,
                     ddplug_config **out) {
  pthread_once(&g_alloc_once, init_alloc);
  json_error_t e;
  memset(&e, 0, sizeof e); /* jansson may fail before it fills e in */
  t_json_alloc_failed = 0;
  json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &e);
  if (!doc) {
    /* jansson reports some allocation failures without any text */
    if (json_error_code(&e) == json_error_out_of_memory || e.text[0] == '\0' ||
        t_json_alloc_failed)
      return ddplug__err(DDPLUG_E_NO_MEMORY,
                         "%s: out of memory parsing the config", origin);
    int line = e.line > 0 ? e.line : 1, col = e.column > 0 ? e.column : 1;
    if (only_space(text, len))
      return ddplug__err(DDPLUG_E_CONFIG,
                         "%s:%d:%d: empty document, expected a JSON object ({...})",
                         origin, line, col);
    if (json_error_code(&e) == json_error_duplicate_key) {
      char path[512];
      duplicate_key_path(text, len, (size_t)e.position, path, sizeof path);
      return ddplug__err(DDPLUG_E_CONFIG,
                         "%s:%d:%d: duplicate key '%s': a key may appear only once "
                         "in an object (keep one of them)",
                         origin, line, col, path);
    }
    /* jansson names its own flag here; say what it means instead */
    const char *flag = strstr(e.text, " without JSON_ALLOW_NUL");
    if (flag)
      return ddplug__err(DDPLUG_E_CONFIG, "%s:%d:%d: %.*s in a string%s", origin, line, col,
                         (int)(flag - e.text), e.text, flag + strlen(" without JSON_ALLOW_NUL"));
    return ddplug__err(DDPLUG_E_CONFIG, "%s:%d:%d: %s", origin, line, col, e.text);
  }
  if (t_json_alloc_failed) {
    /* jansson 2.14 can drop bytes of a string it failed to grow and carry on */
    json_decref(doc);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory parsing the config", origin);
  }
  int rc = from_document(doc, origin, out);
  json_decref(doc);
  return rc;
}

/* Parse the JSON text `json`; origin names it in messages and in
 * ddplug_config_origin ("<string>" if NULL). Returns OK and a new handle in
 * *out (released with ddplug_config_free), or CONFIG ("origin:L:C: ..." or
 * "origin: key.path: ..."), NO_MEMORY, INVALID_ARGUMENT (NULL json/out);
 * *out is untouched on failure. Thread-safe. */
DDPLUG_API int ddplug_config_load_string(const char *json, const char *origin,
                                         ddplug_config **out) {
  if (!json || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_load_string: %s is NULL",
                       !json ? "json" : "out");
  return load_text(json, strlen(json), origin ? origin : "<string>", out);
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO (named pipe)" : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISDIR(m) ? "a directory" : "not a regular file";
}

/* Read the whole file at path into a ddplug__malloc'ed buffer. Only a
 * regular file is read: it is opened without blocking (a FIFO without a
 * writer would block open and read forever) and refused if it is anything
 * else. */
static int read_file(const char *path, char **text, size_t *len) {
  char sbuf[SHOWN_PATH_MAX + 1];
  const char *shown = shown_path(path, sbuf);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    return ddplug__err_errno(err == ENOENT || err == ENOTDIR ? DDPLUG_E_NOT_FOUND
                                                             : DDPLUG_E_SYSTEM,
                             err, "cannot open config file '%s'", shown);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ddplug__err_errno(DDPLUG_E_SYSTEM, err, "cannot read config file '%s'", shown);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return ddplug__err_errno(DDPLUG_E_SYSTEM, EISDIR, "cannot read config file '%s'",
                             shown);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return ddplug__err(DDPLUG_E_CONFIG,
                       "config file '%s' is %s, not a regular file: give the path of "
                       "a JSON file (DDPLUG_CONFIG also takes the JSON itself; "
                       "ddplug check-config reads standard input with '-')",
                       shown, file_kind(st.st_mode));
  }
  size_t cap = 4096, n = 0;
  char *buf = ddplug__malloc(cap);
  int rc = buf ? DDPLUG_OK
               : ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory reading '%s'", shown);
  while (rc == DDPLUG_OK) {
    if (n == cap) {
      if (cap >= CONFIG_FILE_MAX) {
        /* Exactly CONFIG_FILE_MAX bytes is allowed: is there one more? */
        char one;
        ssize_t r;
        do {
          r = read(fd, &one, 1);
        } while (r < 0 && errno == EINTR);
        if (r == 0) break;
        rc = r < 0 ? ddplug__err_errno(DDPLUG_E_SYSTEM, errno,
                                       "cannot read config file '%s'", shown)
                   : ddplug__err(DDPLUG_E_CONFIG,
                                 "%s: larger than %u MiB; a config is a few KiB: is it "
                                 "the right file?",
                                 shown, CONFIG_FILE_MAX >> 20);
        break;
      }
      char *bigger = ddplug__realloc(buf, cap * 2);
      if (!bigger) {
        rc = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory reading '%s'", shown);
        break;
      }
      buf = bigger;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r == 0) break;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      rc = ddplug__err_errno(DDPLUG_E_SYSTEM, errno,
                             "cannot read config file '%s'", shown);
    else
      n += (size_t)r;
  }
  close(fd);
  if (rc != DDPLUG_OK) {
    ddplug__free(buf);
    return rc;
  }
  *text = buf;
  *len = n;
  return DDPLUG_OK;
}

/* Load the config file at path (origin = path; beyond 512 characters its
 * middle is elided, here and in messages). Returns OK and a new handle in
 * *out, or NOT_FOUND (no such file: names path and reason), SYSTEM
 * (unreadable, a directory), CONFIG (syntax "path:L:C: ...", semantics
 * "path: key.path: ...", a file over 16 MiB, not a regular file: a FIFO is
 * refused without blocking), NO_MEMORY, INVALID_ARGUMENT; *out is untouched
 * on failure. Reads the file; thread-safe. */
DDPLUG_API int ddplug_config_load_file(const char *path, ddplug_config **out) {
  if (!path || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_load_file: %s is NULL",
                       !path ? "path" : "out");
  char *text = NULL;
  size_t len = 0;
  int rc = read_file(path, &text, &len);
  if (rc != DDPLUG_OK) return rc;
  char sbuf[SHOWN_PATH_MAX + 1];
  rc = load_text(text, len, shown_path(path, sbuf), out);
  ddplug__free(text);
  return rc;
}

/* All defaults (origin "<defaults>"). Returns OK and a new handle in *out,
 * NO_MEMORY or INVALID_ARGUMENT (out NULL). Thread-safe. */
DDPLUG_API int ddplug_config_default(ddplug_config **out) {
  if (!out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_default: out is NULL");
  pthread_once(&g_alloc_once, init_alloc);
  json_t *empty = json_object();
  if (!empty)
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory making the default config");
  int rc = from_document(empty, "<defaults>", out);
  json_decref(empty);
  return rc;
}

/* From DDPLUG_CONFIG: unset, empty or only white space → the defaults
 * (origin "<defaults>"); first non-space character '{' → JSON text (origin
 * "DDPLUG_CONFIG"); anything else → a file path (origin = the path; a file
 * that cannot be opened is NOT_FOUND/SYSTEM "DDPLUG_CONFIG: cannot open
 * config file 'PATH': reason"). Otherwise as ddplug_config_load_string.
 * Reads the environment (getenv); thread-safe as long as nobody calls
 * setenv concurrently. */
DDPLUG_API int ddplug_config_load_env(ddplug_config **out) {
  if (!out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_load_env: out is NULL");
  const char *v = getenv("DDPLUG_CONFIG");
  size_t skip = v ? strspn(v, " \t\r\n") : 0;
  if (!v || v[skip] == '\0') return ddplug_config_default(out);
  if (v[skip] == '{') return load_text(v, strlen(v), "DDPLUG_CONFIG", out);
  int rc = ddplug_config_load_file(v, out);
  if (rc == DDPLUG_E_NOT_FOUND || rc == DDPLUG_E_SYSTEM)
    ddplug__err_prefix(rc, "DDPLUG_CONFIG");
  return rc;
}

/* The effective config as canonical JSON (sorted keys, compact; absent
 * optional keys stay absent) in *out, released with ddplug_free. Returns
 * OK, NO_MEMORY or INVALID_ARGUMENT (NULL argument); *out untouched on
 * failure. Thread-safe. */
DDPLUG_API int ddplug_config_to_json(const ddplug_config *cfg, char **out) {
  if (!cfg || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_to_json: %s is NULL", !cfg ? "cfg" : "out");
  char *copy = ddplug__strdup(cfg->canonical);
  if (!copy)
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory copying the config JSON");
  *out = copy;
  return DDPLUG_OK;
}

/* The run hash, computed at load: ddplug__hash64 (seed 0) of the canonical
 * JSON of the effective config without "world" and "log_level". Returns OK
 * or INVALID_ARGUMENT (NULL argument). Never blocks; thread-safe. */
DDPLUG_API int ddplug_config_hash(const ddplug_config *cfg, uint64_t *out) {
  if (!cfg || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_config_hash: %s is NULL", !cfg ? "cfg" : "out");
  *out = cfg->hash;
  return DDPLUG_OK;
}

/* Where cfg came from (owned by cfg); NULL for a NULL cfg. */
DDPLUG_API const char *ddplug_config_origin(const ddplug_config *cfg) {
  return cfg ? cfg->origin : NULL;
}

const char *ddplug__config_plugin_options(const ddplug_config *cfg) {
  return cfg ? cfg->plugin_options : "{}";
}

const json_t *ddplug__config_root(const ddplug_config *cfg) {
  return cfg->root;
}

const json_t *ddplug__config_given(const ddplug_config *cfg) {
  return cfg->given;
}

int ddplug__config_clone(const ddplug_config *cfg, ddplug_config **out) {
  if (!cfg || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug__config_clone: %s is NULL", !cfg ? "cfg" : "out");
  json_t *root = json_deep_copy(cfg->root);
  if (!root)
    return ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory copying the config",
                       cfg->origin);
  return make_config(root, json_deep_copy(cfg->given), cfg->origin, out);
}
