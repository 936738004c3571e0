/* test-cpu-reduce.c — the cpu plugin's kernels, white box (linked from
 * the plugin's sources): float16/bfloat16 conversions against the
 * compiler's _Float16 and an independent nearest-even search, every dtype x
 * op of the n-ary reduction against a naive reference on random data
 * (wrapping integers, aliasing destination, odd lengths across block
 * boundaries), and AVG's division. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

TEST(half_to_float_is_exact_for_every_half) {
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 x;
    uint16_t hh = (uint16_t)h;
    memcpy(&x, &hh, 2);
    float want = (float)x, got = ddcpu_half_to_float(hh);
    if (isnan(want)) {
      CHECK_MSG(isnan(got), "half 0x%04x: NaN lost", h);
      continue;
    }
    CHECK_MSG(u_of(want) == u_of(got), "half 0x%04x: got %a want %a", h, got, want);
    /* and back */
    CHECK_MSG(ddcpu_float_to_half(got) == hh, "half 0x%04x does not round-trip", h);
  }
}

static void check_f2h(float f) {
  _Float16 x = (_Float16)f;
  uint16_t want;
  memcpy(&want, &x, 2);
  uint16_t got = ddcpu_float_to_half(f);
  if (isnan(f)) {
    CHECK_MSG((got & 0x7c00) == 0x7c00 && (got & 0x3ff), "NaN %a became 0x%04x", f, got);
    return;
  }
  CHECK_MSG(got == want, "float %a (0x%08x): got half 0x%04x want 0x%04x", f, u_of(f), got, want);
}

TEST(float_to_half_rounds_to_nearest_even) {
  /* edges: ties, subnormals, overflow, signed zero, infinities */
  const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f,
                        0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f, 0x1p-26f,
                        1.0f + 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-23f, 1.0f + 3 * 0x1p-11f,
                        2049.0f, 2051.0f, 0x1.ffcp-15f, 0x1.ff8p-15f, INFINITY, -INFINITY,
                        NAN};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) check_f2h(edge[i]);
  /* every exponent that matters, random mantissas */
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)next_rand();
    uint32_t e = 100 + (uint32_t)(next_rand() % 50); /* around the half range */
    u = (u & 0x807fffffu) | (e << 23);
    check_f2h(f_of(u));
  }
}

/* Independent nearest-even bfloat16: compare the two neighbours. */
static uint16_t bf16_ref(float f) {
  uint32_t u = u_of(f);
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  double a = (double)f_of((uint32_t)lo << 16), b = (double)f_of((uint32_t)hi << 16);
  double dl = fabs((double)f - a), dh = fabs(b - (double)f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(bfloat16_conversions) {
  for (uint32_t b = 0; b < 65536; b++) {
    float f = ddcpu_bf16_to_float((uint16_t)b);
    if (isnan(f)) continue;
    CHECK(u_of(f) == b << 16);
    CHECK(ddcpu_float_to_bf16(f) == b);
  }
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)next_rand();
    if (((u >> 23) & 0xff) >= 0xfe) continue; /* skip near-overflow and inf/NaN */
    float f = f_of(u);
    CHECK_MSG(ddcpu_float_to_bf16(f) == bf16_ref(f), "float %a: got 0x%04x want 0x%04x", f,
              ddcpu_float_to_bf16(f), bf16_ref(f));
  }
  CHECK((ddcpu_float_to_bf16(NAN) & 0x7f80) == 0x7f80 && (ddcpu_float_to_bf16(NAN) & 0x7f));
  CHECK(ddcpu_float_to_bf16(INFINITY) == 0x7f80);
}

/* ---- n-ary reduction against a naive per-element reference ---------------- */

static double get(int dt, const void *p, uint64_t i) {
  switch (dt) {
    case DDPLUG_FLOAT32: return ((const float *)p)[i];
    case DDPLUG_FLOAT64: return ((const double *)p)[i];
    case DDPLUG_FLOAT16: return ddcpu_half_to_float(((const uint16_t *)p)[i]);
    case DDPLUG_BFLOAT16: return ddcpu_bf16_to_float(((const uint16_t *)p)[i]);
    default: return 0;
  }
}

static int64_t geti(int dt, const void *p, uint64_t i) {
  switch (dt) {
    case DDPLUG_INT8: return ((const int8_t *)p)[i];
    case DDPLUG_UINT8: return ((const uint8_t *)p)[i];
    case DDPLUG_INT32: return ((const int32_t *)p)[i];
    default: return ((const int64_t *)p)[i];
  }
}

/* Reference for integers: wrap to the dtype's width after every step. */
static int64_t wrap(int dt, uint64_t v) {
  switch (dt) {
    case DDPLUG_INT8: return (int8_t)(uint8_t)v;
    case DDPLUG_UINT8: return (uint8_t)v;
    case DDPLUG_INT32: return (int32_t)(uint32_t)v;
    default: return (int64_t)v;
  }
}

static void fill_random(int dt, void *p, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = next_rand();
    switch (dt) {
      case DDPLUG_FLOAT32: ((float *)p)[i] = (float)((int)(r % 2001) - 1000) / 64.0f; break;
      case DDPLUG_FLOAT64: ((double *)p)[i] = (double)((int)(r % 2001) - 1000) / 64.0; break;
      case DDPLUG_FLOAT16:
        ((uint16_t *)p)[i] = ddcpu_float_to_half((float)((int)(r % 201) - 100) / 8.0f);
        break;
      case DDPLUG_BFLOAT16:
        ((uint16_t *)p)[i] = ddcpu_float_to_bf16((float)((int)(r % 201) - 100) / 8.0f);
        break;
      case DDPLUG_INT8: ((int8_t *)p)[i] = (int8_t)r; break;
      case DDPLUG_UINT8: ((uint8_t *)p)[i] = (uint8_t)r; break;
      case DDPLUG_INT32: ((int32_t *)p)[i] = (int32_t)(uint32_t)r; break;
      default: ((int64_t *)p)[i] = (int64_t)r; break;
    }
  }
}

static int is_int(int dt) { return ddcpu_dtype_is_int(dt); }

static void check_kernel(int dt, int op, int nsrc, uint64_t n, int alias) {
  uint32_t es = ddcpu_dtype_size(dt);
  void *src[8];
  for (int k = 0; k < nsrc; k++) {
    src[k] = malloc(n * es + 1);
    fill_random(dt, src[k], n);
  }
  void *copy[8];
  for (int k = 0; k < nsrc; k++) {
    copy[k] = malloc(n * es + 1);
    memcpy(copy[k], src[k], n * es);
  }
  void *dst = alias ? src[nsrc - 1] : malloc(n * es + 1);
  int divisor = op == DDPLUG_OP_AVG ? nsrc : 0;
  ddcpu_reduce_n(dt, op, dst, (const void *const *)src, nsrc, n, divisor);
  for (uint64_t i = 0; i < n; i++) {
    if (is_int(dt)) {
      int64_t acc = geti(dt, copy[0], i);
      for (int k = 1; k < nsrc; k++) {
        int64_t v = geti(dt, copy[k], i);
        switch (op) {
          case DDPLUG_OP_SUM: case DDPLUG_OP_AVG: acc = wrap(dt, (uint64_t)acc + (uint64_t)v); break;
          case DDPLUG_OP_PROD: acc = wrap(dt, (uint64_t)acc * (uint64_t)v); break;
          case DDPLUG_OP_MIN: acc = v < acc ? v : acc; break;
          case DDPLUG_OP_MAX: acc = v > acc ? v : acc; break;
          case DDPLUG_OP_BOR: acc = wrap(dt, (uint64_t)(acc | v)); break;
          case DDPLUG_OP_BAND: acc = wrap(dt, (uint64_t)(acc & v)); break;
        }
      }
      if (divisor) acc = acc / divisor;
      CHECK_MSG(geti(dt, dst, i) == acc, "%s %s n=%d element %llu: got %lld want %lld",
                ddcpu_dtype_name(dt), ddcpu_op_name(op), nsrc, (unsigned long long)i,
                (long long)geti(dt, dst, i), (long long)acc);
    } else {
      /* floats: accumulate as the kernel does (float32 for the half
       * types, the dtype otherwise), then compare exactly */
      double acc = get(dt, copy[0], i);
      float accf = (float)acc;
      for (int k = 1; k < nsrc; k++) {
        double v = get(dt, copy[k], i);
        switch (op) {
          case DDPLUG_OP_SUM: case DDPLUG_OP_AVG: acc += v; accf += (float)v; break;
          case DDPLUG_OP_PROD: acc *= v; accf *= (float)v; break;
          case DDPLUG_OP_MIN: acc = v < acc ? v : acc; accf = (float)acc; break;
          case DDPLUG_OP_MAX: acc = v > acc ? v : acc; accf = (float)acc; break;
        }
      }
      double want;
      if (dt == DDPLUG_FLOAT64) want = divisor ? acc / divisor : acc;
      else if (dt == DDPLUG_FLOAT32) want = divisor ? accf / (float)divisor : accf;
      else {
        float q = divisor ? accf / (float)divisor : accf;
        want = dt == DDPLUG_FLOAT16 ? ddcpu_half_to_float(ddcpu_float_to_half(q))
                                    : ddcpu_bf16_to_float(ddcpu_float_to_bf16(q));
      }
      CHECK_MSG(get(dt, dst, i) == want, "%s %s n=%d element %llu: got %g want %g",
                ddcpu_dtype_name(dt), ddcpu_op_name(op), nsrc, (unsigned long long)i,
                get(dt, dst, i), want);
    }
  }
  for (int k = 0; k < nsrc; k++) {
    free(src[k]);
    free(copy[k]);
  }
  if (!alias) free(dst);
}

TEST(every_dtype_and_op_against_reference) {
  const int dts[] = {DDPLUG_FLOAT32, DDPLUG_FLOAT64, DDPLUG_FLOAT16, DDPLUG_BFLOAT16,
                     DDPLUG_INT8, DDPLUG_UINT8, DDPLUG_INT32, DDPLUG_INT64};
  const uint64_t lens[] = {1, 7, 1023, 1024, 1025, 5000};
  for (size_t d = 0; d < 8; d++)
    for (int op = DDPLUG_OP_SUM; op <= DDPLUG_OP_BAND; op++) {
      if ((op == DDPLUG_OP_BOR || op == DDPLUG_OP_BAND) && !is_int(dts[d])) continue;
      for (int nsrc = 1; nsrc <= 8; nsrc += 3)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
          check_kernel(dts[d], op, nsrc, lens[l], (int)(l & 1));
    }
}

TEST(two_operand_and_divide_forms) {
  float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50};
  ddcpu_reduce_into(DDPLUG_FLOAT32, DDPLUG_OP_SUM, a, b, 5);
  CHECK(a[0] == 11 && a[4] == 55);
  ddcpu_reduce_into(DDPLUG_FLOAT32, DDPLUG_OP_AVG, a, b, 5); /* AVG combines as SUM */
  CHECK(a[0] == 21);
  ddcpu_divide(DDPLUG_FLOAT32, a, 5, 3);
  CHECK(a[0] == 7);
  int8_t x[3] = {-7, 7, -128};
  ddcpu_divide(DDPLUG_INT8, x, 3, 2);
  CHECK(x[0] == -3 && x[1] == 3 && x[2] == -64); /* truncation toward zero */
  int64_t big[2] = {INT64_MAX, 5};
  int64_t one[2] = {1, 0};
  ddcpu_reduce_into(DDPLUG_INT64, DDPLUG_OP_SUM, big, one, 2); /* wraps, no UB */
  CHECK(big[0] == INT64_MIN);
}

TEST(names_and_sizes) {
  CHECK_EQ_INT(ddcpu_dtype_size(DDPLUG_BFLOAT16), 2);
  CHECK_EQ_INT(ddcpu_dtype_size(0), 0);
  CHECK_EQ_STR(ddcpu_dtype_name(DDPLUG_INT64), "int64");
  CHECK_EQ_STR(ddcpu_op_name(DDPLUG_OP_BAND), "band");
  CHECK_EQ_STR(ddcpu_kind_name(DDPLUG_COLL_ALLGATHER), "allgather");
}

/* ddcpu_copy: every size around the vector loop's edges, every skew between
 * destination and source within a page (the slow-memcpy band 1..63 takes
 * the vector loop), streaming or not: the bytes arrive, and nothing around
 * the destination is touched. */
TEST(copies_are_exact_at_every_skew_and_size) {
  const size_t sizes[] = {0, 1, 63, 64, 255, 256, 257, 1000, 4096, 65536 + 17};
  const size_t cap = 20 * 4096; /* aligned_alloc wants a multiple of the alignment */
  unsigned char *src = aligned_alloc(4096, cap), *dst = aligned_alloc(4096, cap);
  CHECK(src && dst);
  for (size_t i = 0; i < cap; i++) src[i] = (unsigned char)(i * 131 + 7);
  const size_t skews[] = {0, 1, 8, 16, 31, 32, 63, 64, 100, 4095};
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
    for (size_t k = 0; k < sizeof skews / sizeof *skews; k++)
      for (int stream = 0; stream <= 1; stream++) {
        size_t n = sizes[si], at = skews[k] % 4096, from = 8;
        if (at + n + 64 > cap || from + n > cap) continue;
        memset(dst, 0xEE, cap);
        ddcpu_copy(dst + at, src + from, n, stream);
        ddcpu_copy_fence(stream);
        CHECK_MSG(memcmp(dst + at, src + from, n) == 0, "n %zu skew %zu stream %d", n, at, stream);
        for (size_t i = 0; i < at; i++) CHECK(dst[i] == 0xEE);
        for (size_t i = at + n; i < at + n + 64; i++) CHECK(dst[i] == 0xEE);
      }
  free(src);
  free(dst);
}
