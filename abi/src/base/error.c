/* error.c — the status table, the thread-local last error, per-handle error
 * slots. One table (DDPLUG_STATUS_MAP in common.h) generates codes, names and
 * messages. SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static _Thread_local char tls_last_error[DDPLUG__ERRMSG_MAX];

DDPLUG_API const char *ddplug_strerror(int status) {
  switch (status) {
#define X(name, value, msg) \
  case value:               \
    return msg;
    DDPLUG_STATUS_MAP(X)
#undef X
    default:
      return "unknown status";
  }
}

DDPLUG_API const char *ddplug_status_name(int status) {
  switch (status) {
#define X(name, value, msg) \
  case value:               \
    return #name;
    DDPLUG_STATUS_MAP(X)
#undef X
    default:
      return "UNKNOWN";
  }
}

DDPLUG_API const char *ddplug_last_error(void) { return tls_last_error; }

static void truncate_mark(char *buf, size_t cap, int written) {
  if (written >= 0 && (size_t)written >= cap && cap > 4)
    memcpy(buf + cap - 4, "...", 4);
}

int ddplug__verr(int status, const char *fmt, va_list ap) {
  int n = vsnprintf(tls_last_error, sizeof tls_last_error, fmt, ap);
  truncate_mark(tls_last_error, sizeof tls_last_error, n);
  return status;
}

int ddplug__err(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ddplug__verr(status, fmt, ap);
  va_end(ap);
  return status;
}

int ddplug__err_errno(int status, int errno_value, const char *fmt, ...) {
  char head[DDPLUG__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  char ebuf[128];
  const char *emsg = strerror_r(errno_value, ebuf, sizeof ebuf);
  int n = snprintf(tls_last_error, sizeof tls_last_error, "%s: %s", head,
                   emsg);
  truncate_mark(tls_last_error, sizeof tls_last_error, n);
  return status;
}

int ddplug__err_prefix(int status, const char *fmt, ...) {
  char head[DDPLUG__ERRMSG_MAX];
  char old[DDPLUG__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  memcpy(old, tls_last_error, sizeof old);
  int n = snprintf(tls_last_error, sizeof tls_last_error, "%s: %s", head, old);
  truncate_mark(tls_last_error, sizeof tls_last_error, n);
  return status;
}

void ddplug__set_last_error(const char *text) {
  ddplug__strlcpy(tls_last_error, text ? text : "", sizeof tls_last_error);
}

/* Per-handle slots. The mutex is heap-allocated so the slot struct stays
 * plain data in internal.h. */
int ddplug__errslot_init(ddplug__errslot *slot) {
  slot->text[0] = '\0';
  pthread_mutex_t *m = ddplug__malloc(sizeof *m);
  if (!m) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory creating an error slot");
  pthread_mutex_init(m, NULL);
  slot->mutex = m;
  return DDPLUG_OK;
}

void ddplug__errslot_destroy(ddplug__errslot *slot) {
  if (!slot->mutex) return;
  pthread_mutex_destroy(slot->mutex);
  ddplug__free(slot->mutex);
  slot->mutex = NULL;
}

void ddplug__errslot_set(ddplug__errslot *slot, const char *text) {
  if (!slot->mutex) return;
  pthread_mutex_lock(slot->mutex);
  ddplug__strlcpy(slot->text, text ? text : "", sizeof slot->text);
  pthread_mutex_unlock(slot->mutex);
}

void ddplug__errslot_capture(ddplug__errslot *slot) {
  ddplug__errslot_set(slot, tls_last_error);
}

const char *ddplug__errslot_get(const ddplug__errslot *slot) {
  return slot->text;
}
