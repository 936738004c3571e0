/*
 * errors.c — the plugin's thread-local error sentence, handing it to the
 * runtime, and logging.
 *
 * A failing internal function writes one sentence (what went wrong, where:
 * rank, sequence number, key; what to do) into this thread's buffer and
 * returns the status; the slot that returns to the runtime hands the
 * sentence to host services set_error. Logging goes through the host
 * services' log(), filtered by the group's threshold.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char tls_msg[DDCPU_MSG_MAX];

static void vset(const char *fmt, va_list ap) {
  int n = vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
  if (n >= (int)sizeof tls_msg) memcpy(tls_msg + sizeof tls_msg - 4, "...", 4);
}

/* Record the sentence and return status. Thread-safe (thread-local). */
int ddcpu_err(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset(fmt, ap);
  va_end(ap);
  return status;
}

/* Record the sentence with ": strerror(errno_value)" appended. */
int ddcpu_err_errno(int status, int errno_value, const char *fmt, ...) {
  char head[DDCPU_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  return ddcpu_err(status, "%s: %s", head, strerror(errno_value));
}

/* Prefix the current sentence: "prefix: old". */
int ddcpu_err_prefix(int status, const char *fmt, ...) {
  char head[DDCPU_MSG_MAX], old[DDCPU_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  snprintf(old, sizeof old, "%s", tls_msg);
  return ddcpu_err(status, "%s: %s", head, old);
}

/* This thread's sentence; valid until the next ddcpu_err on this thread. */
const char *ddcpu_errmsg(void) { return tls_msg; }

void ddcpu_errmsg_set(const char *text) {
  snprintf(tls_msg, sizeof tls_msg, "%s", text ? text : "");
}

/* Log one line through the host services (thread-safe there). */
void ddcpu_log(const ddcpu_group *g, int level, const char *fmt, ...) {
  if (!g || !g->svc || level > g->log_level) return;
  char line[DDCPU_MSG_MAX + 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  g->svc->log(g->svc->host, level, line);
}

/* See internal.h. */
int ddcpu_report(const ddplug_host_services *svc, int status) {
  if (status != DDPLUG_OK && svc && svc->set_error)
    svc->set_error(svc->host, status, ddcpu_errmsg());
  return status;
}
