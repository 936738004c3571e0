/* bench_util.h — helpers shared by the C benchmark programs under bench/: a
 * monotonic clock, a size parser for -b/-e style arguments, and a free
 * loopback port for a launcher's rendezvous. Header-only, so each program
 * stays one file plus this.
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef DDPLUG_BENCH_UTIL_H
#define DDPLUG_BENCH_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Seconds on the monotonic clock. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "8", "1.5K", "64M", "2GB" → bytes (binary units). 0 on success, -1 when
 * the text is not a non-negative size. */
static inline int bench_parse_size(const char *s, uint64_t *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return -1;
  switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  *out = (uint64_t)v;
  return 0;
}

/* A TCP port on loopback that was free a moment ago (-1 if none). */
static inline int bench_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

#endif /* DDPLUG_BENCH_UTIL_H */
