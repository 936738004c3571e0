/*
 * copy.c — the plugin's bulk copies between user buffers and shared memory.
 *
 * glibc's memcpy copies mid-size blocks (a few KiB to about 1 MiB) with
 * `rep movsb` on CPUs that advertise ERMS/FSRM. On AMD Zen that instruction
 * runs about 20x slower when the destination starts 1..31 bytes past the
 * source modulo 4 KiB (measured on this project's CI machine, an AMD EPYC:
 * 2.1-2.7 GB/s instead of 30-48 GB/s for 4 KiB..128 KiB blocks). A malloc'd
 * user buffer is 16 bytes past a page boundary, the shared-memory slots are
 * page-aligned: every copy of such a buffer hit it, and allreduces of 32 KiB
 * to 4 MiB ran at a quarter of their speed. Those copies (skew 1..31)
 * go through a plain vector loop instead; every other copy is glibc's, which
 * is as fast or faster there (skews 32..63 included). Large outputs may use
 * streaming stores (see ddcpu_copy in kernels.h). `build/bin/ddplug-copy-perf`
 * prints both, by size and skew.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels.h"

#if defined(__x86_64__)
/* 64 bytes per step, unaligned loads; stores streaming or not. */
static void vector_copy(unsigned char *d, const unsigned char *s, size_t n, int stream) {
  if (stream) { /* streaming stores want 16-byte aligned destinations */
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
  }
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
    if (stream) {
      _mm_stream_si128((__m128i *)(d + i), x0);
      _mm_stream_si128((__m128i *)(d + i + 16), x1);
      _mm_stream_si128((__m128i *)(d + i + 32), x2);
      _mm_stream_si128((__m128i *)(d + i + 48), x3);
    } else {
      _mm_storeu_si128((__m128i *)(d + i), x0);
      _mm_storeu_si128((__m128i *)(d + i + 16), x1);
      _mm_storeu_si128((__m128i *)(d + i + 32), x2);
      _mm_storeu_si128((__m128i *)(d + i + 48), x3);
    }
  }
  memcpy(d + body, s + body, n - body);
}
#endif

void ddcpu_copy(void *dst, const void *src, size_t n, int stream) {
#if defined(__x86_64__)
  uintptr_t skew = ((uintptr_t)dst - (uintptr_t)src) & 4095;
  if (n >= 256 && (stream || (skew >= 1 && skew <= 31))) {
    vector_copy(dst, src, n, stream);
    return;
  }
#endif
  (void)stream;
  memcpy(dst, src, n);
}

void ddcpu_copy_fence(int stream) {
#if defined(__x86_64__)
  if (stream) _mm_sfence();
#endif
  (void)stream;
}
