/*
 * base.h — the base layer's header, included by every other layer (see
 * abi/src/README.md for the layers). Internal symbols use the ddplug__ prefix
 * (or are static); they are hidden by -fvisibility=hidden and never
 * exported. Depends on nothing but ddplug.h. The module map of abi/src/base/:
 *   error.c    status table, thread-local last-error, error formatting
 *   log.c      log threshold, rank prefix, callback
 *   util.c     clock, hashing, string helpers, safe allocation, rank lists
 *   suggest.c  "did you mean": edit distance, the closest candidate
 *   version.c  the library's and the ABIs' version numbers
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_BASE_H
#define DDPLUG_BASE_H

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
 * malloc-failure tests (in the test build of the library, ddplug_internal,
 * DDPLUG_TEST_FAIL_ALLOC=N fails the N-th call). */
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
/* The ranks r < n with flag[r] set, as "0, 1, 3" or "0-5, 7" in buf[cap]
 * ("..." when cut); returns how many are set. */
int ddplug__rank_list(const int *flag, int n, char *buf, size_t cap);

/* ---- "did you mean" (suggest.c) ------------------------------------------ */

/* Edit distance (Levenshtein), capped at cap+1. */
int ddplug__edit_distance(const char *a, const char *b, int cap);
/* "Did you mean": offer candidates one by one; best holds the closest one
 * that is close enough to word to be worth suggesting (NULL if none). */
typedef struct ddplug__suggest {
  const char *word;
  char best[128];
  int best_dist;
} ddplug__suggest;
void ddplug__suggest_init(ddplug__suggest *s, const char *word);
void ddplug__suggest_offer(ddplug__suggest *s, const char *cand, size_t len);
/* The suggestion, or NULL. */
const char *ddplug__suggest_best(const ddplug__suggest *s);

#endif /* DDPLUG_BASE_H */
