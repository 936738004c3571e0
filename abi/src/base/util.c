/* util.c — clock, hashing, strings, allocation with failure injection.
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

uint64_t ddplug__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ddplug__deadline_ns(int64_t timeout_ms) {
  if (timeout_ms < 0) timeout_ms = 0;
  return ddplug__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int64_t ddplug__remaining_ms(uint64_t deadline_ns) {
  uint64_t now = ddplug__now_ns();
  if (now >= deadline_ns) return 0;
  return (int64_t)((deadline_ns - now + 999999ull) / 1000000ull);
}

void ddplug__sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* 64-bit hash: FNV-1a over the bytes, then a final avalanche (splitmix64).
 * Stable across machines and runs; not cryptographic. */
uint64_t ddplug__hash64(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

#ifdef DDPLUG_TEST_HOOKS
/* Failure injection, in the test build only: DDPLUG_TEST_FAIL_ALLOC=N
 * makes the N-th allocation (1-based, counted from process start) fail. */
static atomic_long g_alloc_count;
static long g_fail_at = -1;

static int should_fail(void) {
  if (g_fail_at == -1) {
    const char *env = getenv("DDPLUG_TEST_FAIL_ALLOC");
    long v = env ? strtol(env, NULL, 10) : 0;
    g_fail_at = v > 0 ? v : 0;
  }
  if (g_fail_at == 0) return 0;
  return atomic_fetch_add(&g_alloc_count, 1) + 1 == g_fail_at;
}
#else
static inline int should_fail(void) { return 0; }
#endif

void *ddplug__malloc(size_t n) {
  if (should_fail()) return NULL;
  return malloc(n ? n : 1);
}

void *ddplug__calloc(size_t n, size_t size) {
  if (should_fail()) return NULL;
  return calloc(n ? n : 1, size ? size : 1);
}

void *ddplug__realloc(void *p, size_t n) {
  if (should_fail()) return NULL;
  return realloc(p, n ? n : 1);
}

void ddplug__free(void *p) { free(p); }

DDPLUG_API void ddplug_free(void *ptr) { free(ptr); }

char *ddplug__strndup(const char *s, size_t n) {
  size_t len = strnlen(s, n);
  char *d = ddplug__malloc(len + 1);
  if (!d) return NULL;
  memcpy(d, s, len);
  d[len] = '\0';
  return d;
}

char *ddplug__strdup(const char *s) { return ddplug__strndup(s, SIZE_MAX); }

char *ddplug__asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *buf = ddplug__malloc((size_t)n + 1);
  if (!buf) return NULL;
  va_start(ap, fmt);
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return buf;
}

size_t ddplug__strlcpy(char *dst, const char *src, size_t cap) {
  size_t len = strlen(src);
  if (cap > 0) {
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
  }
  return len;
}

int ddplug__parse_i64(const char *s, int64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0' || end == s) return -1;
  *out = (int64_t)v;
  return 0;
}

int ddplug__rank_list(const int *flag, int n, char *buf, size_t cap) {
  size_t len = 0;
  int count = 0;
  if (cap == 0) return 0;
  buf[0] = '\0';
  for (int r = 0; r < n; r++) count += flag[r] != 0;
  for (int r = 0; r < n && len + 24 < cap; r++) {
    if (!flag[r]) continue;
    int end = r;
    while (end + 1 < n && flag[end + 1]) end++;
    if (end - r >= 2)
      len += (size_t)snprintf(buf + len, cap - len, "%s%d-%d", len ? ", " : "", r, end);
    else if (end - r == 1)
      len += (size_t)snprintf(buf + len, cap - len, "%s%d, %d", len ? ", " : "", r, end);
    else
      len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", r);
    r = end;
  }
  if (len + 24 >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
  return count;
}
