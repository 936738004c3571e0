/*
 * errors.c — how the nccl plugin explains itself: error sentences handed to
 * the runtime (host services set_error), log lines, status names, and the
 * clock helpers every module uses.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <time.h>

#include "internal.h"

/* Formats into a stack buffer and calls svc->set_error. Returns status.
 * Thread-safe (set_error is). Never fails. */
int ddnccl_fail(const ddplug_host_services *svc, int status,
                const char *fmt, ...) {
  char buf[DDNCCL_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  ddnccl_vfmt(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (svc && svc->set_error) svc->set_error(svc->host, status, buf);
  return status;
}

/* Formats only when level passes threshold, then calls svc->log (which
 * adds the rank and the plugin's name). Thread-safe. */
void ddnccl_log(const ddplug_host_services *svc, int32_t threshold,
                int32_t level, const char *fmt, ...) {
  if (!svc || !svc->log || level > threshold) return;
  char buf[DDNCCL_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  ddnccl_vfmt(buf, sizeof buf, fmt, ap);
  va_end(ap);
  svc->log(svc->host, level, buf);
}

/* Names generated from the status table in common.h. Static strings. */
const char *ddnccl_status_name(int status) {
  switch (status) {
#define DDNCCL_STATUS_CASE(name, value, msg)      \
  case value:                                     \
    return #name;
    DDPLUG_STATUS_MAP(DDNCCL_STATUS_CASE)
#undef DDNCCL_STATUS_CASE
    default:
      return "UNKNOWN";
  }
}

/* Bounded (v)snprintf; a zero-capacity buffer is left alone. */
void ddnccl_vfmt(char *buf, size_t cap, const char *fmt, va_list ap) {
  if (buf && cap > 0) vsnprintf(buf, cap, fmt, ap);
}

void ddnccl_fmt(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ddnccl_vfmt(buf, cap, fmt, ap);
  va_end(ap);
}

uint64_t ddnccl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t ddnccl_left_ms(uint64_t deadline_ns) {
  uint64_t now = ddnccl_now_ns();
  if (now >= deadline_ns) return 0;
  return (int64_t)((deadline_ns - now + 999999ull) / 1000000ull);
}

/* Sleeps us microseconds (restarting after signals). */
void ddnccl_sleep_us(int64_t us) {
  if (us <= 0) return;
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
