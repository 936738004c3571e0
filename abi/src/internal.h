/*
 * internal.h — the single internal header of libddplug. Internal symbols use
 * the ddplug__ prefix (or are static); they are hidden by -fvisibility=hidden
 * and never exported. Modules (one concept per file):
 *   error.c    status table, thread-local last-error, error formatting
 *   log.c      log threshold, rank prefix, callback
 *   util.c     clock, hashing, string helpers, safe allocation
 *   config.c   strict JSON config (jansson)
 *   world.c    world discovery from config and environment
 *   store_*.c  rendezvous store protocol, server, client
 *   loader.c   plugin search, dlopen, version negotiation, table adaptation
 *   context.c  ddplug_open/close/abort, startup checks, host services
 *   collective.c  argument validation, sequence numbers, requests
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_INTERNAL_H
#define DDPLUG_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "ddplug/ddplug.h"

#define DDPLUG__UNUSED(x) ((void)(x))
#define DDPLUG__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DDPLUG__PRINTF(f, a) __attribute__((format(printf, f, a)))
#define DDPLUG__MIN(a, b) ((a) < (b) ? (a) : (b))
#define DDPLUG__MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors (error.c) ---------------------------------------------------- */

/* Longest detail sentence kept; longer ones are truncated with "...". */
#define DDPLUG__ERRMSG_MAX 2048

/* Record status with a printf-style detail as this thread's last error and
 * return status, so callers can write `return ddplug__err(E, "...", ...)`. */
int ddplug__err(int status, const char *fmt, ...) DDPLUG__PRINTF(2, 3);
int ddplug__verr(int status, const char *fmt, va_list ap);
/* Same, with strerror(errno_value) appended: "...: Connection refused". */
int ddplug__err_errno(int status, int errno_value, const char *fmt, ...)
    DDPLUG__PRINTF(3, 4);
/* Set this thread's last error to an already formatted text. */
void ddplug__set_last_error(const char *text);
/* Prefix the current last error: "prefix: <old text>". Returns status. */
int ddplug__err_prefix(int status, const char *fmt, ...) DDPLUG__PRINTF(2, 3);

/* A per-handle last-error slot, safe to write from several threads. */
typedef struct ddplug__errslot {
  void *mutex; /* pthread_mutex_t*, allocated by ddplug__errslot_init */
  char text[DDPLUG__ERRMSG_MAX];
} ddplug__errslot;
int ddplug__errslot_init(ddplug__errslot *slot);
void ddplug__errslot_destroy(ddplug__errslot *slot);
/* Copy this thread's last error into slot. */
void ddplug__errslot_capture(ddplug__errslot *slot);
void ddplug__errslot_set(ddplug__errslot *slot, const char *text);
const char *ddplug__errslot_get(const ddplug__errslot *slot);

/* ---- logging (log.c) ----------------------------------------------------- */

/* Rank shown in this process's log prefix (-1 = unknown). */
void ddplug__log_set_rank(int rank);
/* Threshold from the config, applied unless DDPLUG_LOG or
 * ddplug_log_set_level() decided already. */
void ddplug__log_config_level(int level);
int ddplug__log_enabled(int level);
void ddplug__log(int level, const char *fmt, ...) DDPLUG__PRINTF(2, 3);
void ddplug__vlog(int level, const char *fmt, va_list ap);
#define DDPLUG__LOG(level, ...)                                                \
  do {                                                                         \
    if (ddplug__log_enabled(level)) ddplug__log(level, __VA_ARGS__);           \
  } while (0)
#define DDPLUG__ERROR(...) DDPLUG__LOG(DDPLUG_LOG_ERROR, __VA_ARGS__)
#define DDPLUG__WARN(...) DDPLUG__LOG(DDPLUG_LOG_WARN, __VA_ARGS__)
#define DDPLUG__INFO(...) DDPLUG__LOG(DDPLUG_LOG_INFO, __VA_ARGS__)
#define DDPLUG__DEBUG(...) DDPLUG__LOG(DDPLUG_LOG_DEBUG, __VA_ARGS__)
#define DDPLUG__TRACE(...) DDPLUG__LOG(DDPLUG_LOG_TRACE, __VA_ARGS__)

/* ---- utilities (util.c) -------------------------------------------------- */

uint64_t ddplug__now_ns(void);              /* CLOCK_MONOTONIC */
/* Remaining ms until deadline_ns (>= 0). */
int64_t ddplug__remaining_ms(uint64_t deadline_ns);
/* Deadline for a timeout in ms from now. */
uint64_t ddplug__deadline_ns(int64_t timeout_ms);
void ddplug__sleep_ms(int64_t ms);

uint64_t ddplug__hash64(const void *data, size_t len, uint64_t seed);

/* malloc/calloc/strdup that go through the failure injector used by the
 * malloc-failure tests (DDPLUG_TEST_FAIL_ALLOC=N fails the N-th call). */
void *ddplug__malloc(size_t n);
void *ddplug__calloc(size_t n, size_t size);
void *ddplug__realloc(void *p, size_t n);
char *ddplug__strdup(const char *s);
char *ddplug__strndup(const char *s, size_t n);
void ddplug__free(void *p);
/* asprintf through ddplug__malloc; NULL on failure. */
char *ddplug__asprintf(const char *fmt, ...) DDPLUG__PRINTF(1, 2);

/* Copy src into dst[cap] always NUL-terminating; returns strlen(src). */
size_t ddplug__strlcpy(char *dst, const char *src, size_t cap);
/* Parse a whole decimal integer; 0 on success, -1 on junk/overflow. */
int ddplug__parse_i64(const char *s, int64_t *out);
/* Edit distance, capped at cap+1 (for "did you mean"). */
int ddplug__edit_distance(const char *a, const char *b, int cap);

/* ---- world discovery (world.c) ------------------------------------------- */

/* Environment lookup used by world discovery (getenv in production, a table
 * in tests). Returns NULL for an unset variable. */
typedef const char *(*ddplug__env_fn)(const char *name, void *user);
int ddplug__world_discover_env(const ddplug_config *cfg, ddplug__env_fn env,
                               void *env_user, ddplug_world *out);

/* ---- plugin loading (loader.c) ------------------------------------------- */

typedef struct ddplug__plugin {
  void *dl;                 /* dlopen handle                              */
  ddplug_plugin table;      /* the plugin's table lifted to the latest ABI:
                               slots it did not know are NULL             */
  uint32_t built_abi;       /* abi_version the plugin was built against   */
  uint32_t built_size;      /* its struct_size                            */
  char path[4096];          /* the file loaded                            */
} ddplug__plugin;

/* Find, load and validate a plugin (see ddplug_plugin_inspect). On failure
 * *out is untouched and nothing stays loaded. */
int ddplug__plugin_load(const char *name_or_path, ddplug__plugin **out);
void ddplug__plugin_unload(ddplug__plugin *p);
/* Fill a public info struct (honouring its struct_size) from a plugin. */
void ddplug__plugin_fill_info(const ddplug__plugin *p, ddplug_plugin_info *info);

/* ---- config internals (config.c) ---------------------------------------- */

/* "plugin_options" of cfg as compact JSON text (owned by cfg, "{}" if none). */
const char *ddplug__config_plugin_options(const ddplug_config *cfg);

#endif /* DDPLUG_INTERNAL_H */
