/*
 * report.c — how the nccl plugin explains itself: error sentences handed to
 * the runtime (host services set_error), log lines, status names, and the
 * clock helpers every module uses.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <time.h>

#include "nccl_plugin.h"

/* Formats into a stack buffer and calls svc->set_error. Returns status.
 * Thread-safe (set_error is). Never fails. */
int ddplug_nccl__fail(const ddplug_host_services *svc, int status,
                      const char *fmt, ...) {
  char buf[DDPLUG_NCCL__MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  ddplug_nccl__vfmt(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (svc && svc->set_error) svc->set_error(svc->host, status, buf);
  return status;
}

/* Formats only when level passes threshold, then calls svc->log (which
 * adds the rank and the plugin's name). Thread-safe. */
void ddplug_nccl__log(const ddplug_host_services *svc, int32_t threshold,
                      int32_t level, const char *fmt, ...) {
  if (!svc || !svc->log || level > threshold) return;
  char buf[DDPLUG_NCCL__MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  ddplug_nccl__vfmt(buf, sizeof buf, fmt, ap);
  va_end(ap);
  svc->log(svc->host, level, buf);
}

/* Names generated from the status table in common.h. Static strings. */
const char *ddplug_nccl__status_name(int status) {
  switch (status) {
#define DDPLUG_NCCL__STATUS_CASE(name, value, msg) \
  case value:                                     \
    return #name;
    DDPLUG_STATUS_MAP(DDPLUG_NCCL__STATUS_CASE)
#undef DDPLUG_NCCL__STATUS_CASE
    default:
      return "UNKNOWN";
  }
}

/* Bounded (v)snprintf; a zero-capacity buffer is left alone. */
void ddplug_nccl__vfmt(char *buf, size_t cap, const char *fmt, va_list ap) {
  if (buf && cap > 0) vsnprintf(buf, cap, fmt, ap);
}

void ddplug_nccl__fmt(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ddplug_nccl__vfmt(buf, cap, fmt, ap);
  va_end(ap);
}

uint64_t ddplug_nccl__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t ddplug_nccl__left_ms(uint64_t deadline_ns) {
  uint64_t now = ddplug_nccl__now_ns();
  if (now >= deadline_ns) return 0;
  return (int64_t)((deadline_ns - now + 999999ull) / 1000000ull);
}

/* Sleeps us microseconds (restarting after signals). */
void ddplug_nccl__sleep_us(int64_t us) {
  if (us <= 0) return;
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
