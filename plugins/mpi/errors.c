/*
 * errors.c — the mpi backend's sentences and logging: set_error, log lines
 * through the host services, MPI's own error strings, names of dtypes, ops
 * and collectives for messages, rank lists and time.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

void ddmpi_fmt(char *buf, size_t cap, const char *fmt, ...) {
  if (!cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}

int ddmpi_fail(const ddplug_host_services *svc, int status, const char *fmt, ...) {
  char msg[DDMPI_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (svc && svc->set_error) svc->set_error(svc->host, status, msg);
  return status;
}

void ddmpi_log(const ddplug_host_services *svc, int32_t threshold, int32_t level,
               const char *fmt, ...) {
  if (!svc || !svc->log || level > threshold) return;
  char line[DDMPI_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  svc->log(svc->host, level, line);
}

void ddmpi_mpi_error(int code, char *buf, size_t cap) {
  char text[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0, cls = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "?");
  MPI_Error_class(code, &cls);
  ddmpi_fmt(buf, cap, "MPI error %d (class %d): %s", code, cls, text);
}

const char *ddmpi_dtype_name(int32_t dtype) {
  switch (dtype) {
#define DDMPI__DT(name, value, str, size) \
  case value:                             \
    return str;
    DDPLUG_DTYPE_MAP(DDMPI__DT)
#undef DDMPI__DT
    default:
      return "?";
  }
}

const char *ddmpi_op_name(int32_t op) {
  switch (op) {
#define DDMPI__OP(name, value, str) \
  case value:                       \
    return str;
    DDPLUG_OP_MAP(DDMPI__OP)
#undef DDMPI__OP
    default:
      return "?";
  }
}

const char *ddmpi_kind_name(int32_t kind) {
  switch (kind) {
    case DDPLUG_COLL_ALLREDUCE:
      return "allreduce";
    case DDPLUG_COLL_BROADCAST:
      return "broadcast";
    case DDPLUG_COLL_ALLGATHER:
      return "allgather";
    case DDPLUG_COLL_BARRIER:
      return "barrier";
    default:
      return "?";
  }
}

void ddmpi_rank_list(const unsigned char *flags, int n, char *buf, size_t cap, int *count) {
  size_t w = 0;
  int c = 0;
  buf[0] = '\0';
  for (int r = 0; r < n; r++) {
    if (!flags[r]) continue;
    if (c < 16 && w + 16 < cap) w += (size_t)snprintf(buf + w, cap - w, "%s%d", c ? ", " : "", r);
    c++;
  }
  if (c > 16 && w + 24 < cap) snprintf(buf + w, cap - w, " and %d more", c - 16);
  if (count) *count = c;
}

uint64_t ddmpi_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t ddmpi_left_ms(uint64_t deadline_ns) {
  uint64_t now = ddmpi_now_ns();
  return now >= deadline_ns ? 0 : (int64_t)((deadline_ns - now + 999999) / 1000000);
}

void ddmpi_sleep_us(int64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
