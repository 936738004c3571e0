/* log.c — threshold, rank prefix, host callback.
 * SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

/* Who decided the threshold: higher wins. */
enum { SRC_DEFAULT = 0, SRC_CONFIG = 1, SRC_ENV = 2, SRC_API = 3 };

static atomic_int g_level = DDPLUG_LOG_WARN;
static atomic_int g_level_src = SRC_DEFAULT;
static atomic_int g_rank = -1;
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_cb_mutex = PTHREAD_MUTEX_INITIALIZER;
static ddplug_log_fn g_cb;
static void *g_cb_user;

static const char *const level_names[] = {"off", "error", "warn",
                                          "info", "debug", "trace"};

DDPLUG_API int ddplug_log_level_parse(const char *text, int *level) {
  if (!text || !level)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_log_level_parse: text and level must not be NULL");
  for (int i = 0; i < (int)DDPLUG__ARRAY_LEN(level_names); i++) {
    if (strcasecmp(text, level_names[i]) == 0) {
      *level = i;
      return DDPLUG_OK;
    }
  }
  if (strcasecmp(text, "warning") == 0) {
    *level = DDPLUG_LOG_WARN;
    return DDPLUG_OK;
  }
  return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                     "unknown log level '%s' (use off, error, warn, info, "
                     "debug or trace)",
                     text);
}

static void read_env_once(void) {
  const char *env = getenv("DDPLUG_LOG");
  if (!env || !*env) return;
  int level;
  if (ddplug_log_level_parse(env, &level) == DDPLUG_OK) {
    if (atomic_load(&g_level_src) < SRC_ENV) {
      atomic_store(&g_level, level);
      atomic_store(&g_level_src, SRC_ENV);
    }
  } else {
    fprintf(stderr,
            "[ddplug] DDPLUG_LOG='%s' is not a log level (use off, error, "
            "warn, info, debug or trace); keeping 'warn'\n",
            env);
  }
}

DDPLUG_API int ddplug_log_set_level(int level) {
  if (level < DDPLUG_LOG_OFF || level > DDPLUG_LOG_TRACE)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "log level %d is out of range (0=off .. 5=trace)", level);
  pthread_once(&g_env_once, read_env_once);
  atomic_store(&g_level, level);
  atomic_store(&g_level_src, SRC_API);
  return DDPLUG_OK;
}

void ddplug__log_config_level(int level) {
  pthread_once(&g_env_once, read_env_once);
  if (level < DDPLUG_LOG_OFF || level > DDPLUG_LOG_TRACE) return;
  if (atomic_load(&g_level_src) <= SRC_CONFIG) {
    atomic_store(&g_level, level);
    atomic_store(&g_level_src, SRC_CONFIG);
  }
}

DDPLUG_API int ddplug_log_set_callback(ddplug_log_fn fn, void *user) {
  pthread_mutex_lock(&g_cb_mutex);
  g_cb = fn;
  g_cb_user = user;
  pthread_mutex_unlock(&g_cb_mutex);
  return DDPLUG_OK;
}

void ddplug__log_set_rank(int rank) { atomic_store(&g_rank, rank); }

int ddplug__log_enabled(int level) {
  pthread_once(&g_env_once, read_env_once);
  return level > DDPLUG_LOG_OFF && level <= atomic_load(&g_level);
}

void ddplug__vlog(int level, const char *fmt, va_list ap) {
  if (!ddplug__log_enabled(level)) return;
  char msg[4096];
  int rank = atomic_load(&g_rank);
  int off;
  if (rank >= 0)
    off = snprintf(msg, sizeof msg, "[ddplug r%d] ", rank);
  else
    off = snprintf(msg, sizeof msg, "[ddplug] ");
  if (level == DDPLUG_LOG_ERROR)
    off += snprintf(msg + off, sizeof msg - (size_t)off, "error: ");
  else if (level == DDPLUG_LOG_WARN)
    off += snprintf(msg + off, sizeof msg - (size_t)off, "warning: ");
  vsnprintf(msg + off, sizeof msg - (size_t)off, fmt, ap);
  size_t len = strlen(msg);
  while (len > 0 && msg[len - 1] == '\n') msg[--len] = '\0';

  pthread_mutex_lock(&g_cb_mutex);
  ddplug_log_fn cb = g_cb;
  void *user = g_cb_user;
  pthread_mutex_unlock(&g_cb_mutex);
  if (cb) {
    cb(user, level, rank, msg);
  } else {
    /* One write per line so lines of concurrent ranks do not interleave. */
    msg[len] = '\n';
    fwrite(msg, 1, len + 1, stderr);
    fflush(stderr);
  }
}

void ddplug__log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ddplug__vlog(level, fmt, ap);
  va_end(ap);
}
