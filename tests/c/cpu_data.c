/* cpu_data.c — see cpu_data.h. */
#include "cpu_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddplug/common.h"

static int is_signed_int(int dt) { return dt == DDPLUG_INT8 || dt == DDPLUG_INT32 || dt == DDPLUG_INT64; }
static int is_float(int dt) {
  return dt == DDPLUG_FLOAT32 || dt == DDPLUG_FLOAT64 || dt == DDPLUG_FLOAT16 || dt == DDPLUG_BFLOAT16;
}
static size_t esize(int dt) {
  switch (dt) {
    case DDPLUG_INT8: case DDPLUG_UINT8: return 1;
    case DDPLUG_FLOAT16: case DDPLUG_BFLOAT16: return 2;
    case DDPLUG_FLOAT32: case DDPLUG_INT32: return 4;
    default: return 8;
  }
}

/* The value of rank r at period position j. */
static int64_t value(int dt, int op, int r, uint64_t j) {
  int sgn = is_signed_int(dt) || is_float(dt);
  switch (op) {
    case DDPLUG_OP_SUM:
    case DDPLUG_OP_AVG: {
      int64_t v = (int64_t)((j * 7 + (uint64_t)r * 13) % 15);
      return sgn ? v - 7 : v;
    }
    case DDPLUG_OP_PROD: {
      uint64_t c = (j * 5 + (uint64_t)r * 3) % 7;
      if (c == 0) return 2;
      if (c == 1 && sgn) return -1;
      return 1;
    }
    case DDPLUG_OP_MIN:
    case DDPLUG_OP_MAX: {
      int64_t v = (int64_t)((j * 31 + (uint64_t)r * 17) % 200);
      if (dt == DDPLUG_INT8 || dt == DDPLUG_UINT8) v = v % 120;
      return sgn ? v - 100 : v;
    }
    case DDPLUG_OP_BOR:
    case DDPLUG_OP_BAND: return (int64_t)((j * 37 + (uint64_t)r * 11) & 0x7f);
    default: /* broadcast / allgather: distinct per rank, fits every dtype */
      return (int64_t)((j * 3 + (uint64_t)r * 29) % 97) + (sgn ? -40 : 0);
  }
}

static uint16_t half_of(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Nearest bfloat16, ties to even, by comparing the two candidates. */
static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  double dl = (double)f - (double)bf16_to_float(lo);
  double dh = (double)bf16_to_float(hi) - (double)f;
  if (dl < 0) dl = -dl;
  if (dh < 0) dh = -dh;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

/* Store value x (already rounded as the plugin would compute it) into
 * element i of buf. */
static void put(void *buf, int dt, uint64_t i, double x, int64_t xi) {
  switch (dt) {
    case DDPLUG_FLOAT32: ((float *)buf)[i] = (float)x; break;
    case DDPLUG_FLOAT64: ((double *)buf)[i] = x; break;
    case DDPLUG_FLOAT16: ((uint16_t *)buf)[i] = half_of((float)x); break;
    case DDPLUG_BFLOAT16: ((uint16_t *)buf)[i] = bf16_of((float)x); break;
    case DDPLUG_INT8: ((int8_t *)buf)[i] = (int8_t)(uint8_t)(uint64_t)xi; break;
    case DDPLUG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(uint64_t)xi; break;
    case DDPLUG_INT32: ((int32_t *)buf)[i] = (int32_t)(uint32_t)(uint64_t)xi; break;
    default: ((int64_t *)buf)[i] = xi; break;
  }
}

void hdata_fill(void *buf, int dtype, int op, int rank, uint64_t count) {
  uint64_t first = count < HDATA_PERIOD ? count : HDATA_PERIOD;
  for (uint64_t i = 0; i < first; i++) {
    int64_t v = value(dtype, op, rank, i);
    put(buf, dtype, i, (double)v, v);
  }
  size_t es = esize(dtype);
  unsigned char *b = buf;
  for (uint64_t i = first; i < count; i += first) {
    uint64_t n = count - i < first ? count - i : first;
    memcpy(b + i * es, b, n * es);
  }
}

void hdata_ref(void *table, int dtype, int op, int world) {
  for (uint64_t j = 0; j < HDATA_PERIOD; j++) {
    int64_t acc = value(dtype, op, 0, j);
    for (int r = 1; r < world; r++) {
      int64_t v = value(dtype, op, r, j);
      switch (op) {
        case DDPLUG_OP_SUM: case DDPLUG_OP_AVG: acc += v; break;
        case DDPLUG_OP_PROD: acc *= v; break;
        case DDPLUG_OP_MIN: acc = v < acc ? v : acc; break;
        case DDPLUG_OP_MAX: acc = v > acc ? v : acc; break;
        case DDPLUG_OP_BOR: acc |= v; break;
        case DDPLUG_OP_BAND: acc &= v; break;
        default: break;
      }
    }
    if (op == DDPLUG_OP_AVG) {
      if (dtype == DDPLUG_FLOAT64) {
        put(table, dtype, j, (double)acc / world, 0);
      } else if (is_float(dtype)) {
        put(table, dtype, j, (double)((float)acc / (float)world), 0);
      } else {
        /* wrapped sum in the dtype, then truncating division */
        int64_t w;
        switch (dtype) {
          case DDPLUG_INT8: w = (int8_t)(uint8_t)(uint64_t)acc; break;
          case DDPLUG_UINT8: w = (uint8_t)(uint64_t)acc; break;
          case DDPLUG_INT32: w = (int32_t)(uint32_t)(uint64_t)acc; break;
          default: w = acc; break;
        }
        put(table, dtype, j, 0, w / world);
      }
    } else {
      put(table, dtype, j, (double)acc, acc);
    }
  }
}

int64_t hdata_check(const void *buf, const void *table, int dtype, uint64_t count,
                    uint64_t phase) {
  size_t es = esize(dtype);
  const unsigned char *b = buf, *t = table;
  for (uint64_t i = 0; i < count;) {
    uint64_t j = (i + phase) % HDATA_PERIOD;
    uint64_t run = HDATA_PERIOD - j;
    if (run > count - i) run = count - i;
    if (memcmp(b + i * es, t + j * es, run * es) != 0) {
      for (uint64_t k = 0; k < run; k++)
        if (memcmp(b + (i + k) * es, t + (j + k) * es, es) != 0) return (int64_t)(i + k);
    }
    i += run;
  }
  return -1;
}

static double as_double(const void *buf, int dt, uint64_t i) {
  switch (dt) {
    case DDPLUG_FLOAT32: return ((const float *)buf)[i];
    case DDPLUG_FLOAT64: return ((const double *)buf)[i];
    case DDPLUG_FLOAT16: { _Float16 h; memcpy(&h, (const uint16_t *)buf + i, 2); return (double)h; }
    case DDPLUG_BFLOAT16: return bf16_to_float(((const uint16_t *)buf)[i]);
    case DDPLUG_INT8: return ((const int8_t *)buf)[i];
    case DDPLUG_UINT8: return ((const uint8_t *)buf)[i];
    case DDPLUG_INT32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
  }
}

void hdata_describe(char *out, size_t cap, const void *buf, const void *table,
                    int dtype, uint64_t i, uint64_t phase) {
  snprintf(out, cap, "element %llu: got %g, expected %g", (unsigned long long)i,
           as_double(buf, dtype, i), as_double(table, dtype, (i + phase) % HDATA_PERIOD));
}

int64_t hdata_check_rank(const void *buf, int dtype, int op, int rank, uint64_t count) {
  size_t es = esize(dtype);
  unsigned char *tab = malloc(HDATA_PERIOD * es);
  hdata_fill(tab, dtype, op, rank, HDATA_PERIOD);
  int64_t bad = hdata_check(buf, tab, dtype, count, 0);
  free(tab);
  return bad;
}

/* ---- float16/bfloat16 data that needs float32 accumulation ---------------- */

/* Element j of rank r (exactly representable in dtype). */
static double wide_value(int dt, int op, int r, int world, uint64_t j) {
  if (op == DDPLUG_OP_PROD) {
    /* ranks 0-2: factors in [1, 2) with 8 (float16) or 6 (bfloat16)
     * significant bits, so a product of two needs more bits than the type
     * has and a product of three is still exact in float32; other ranks:
     * powers of two (exact scaling) */
    if (r >= 3) return (j + (uint64_t)r) % 3 == 0 ? 2.0 : (j + (uint64_t)r) % 3 == 1 ? 0.5 : 1.0;
    double steps = dt == DDPLUG_FLOAT16 ? 128.0 : 32.0;
    uint64_t k = (j * 3 + (uint64_t)r * 5 + 1) % (uint64_t)steps;
    double v = 1.0 + (double)(2 * k + 1) / (2.0 * steps);
    return (j % 11 == 0 && r == 0) ? -v : v;
  }
  if ((uint64_t)r == j % (uint64_t)world) {
    double big = dt == DDPLUG_FLOAT16 ? 2048.0 + 2.0 * (double)((j * 7) % 1000)
                                      : 256.0 + 2.0 * (double)((j * 7) % 128);
    return j % 5 == 0 ? -big : big;
  }
  return 0.25 * (double)((j + (uint64_t)r) % 4 + 1);
}

void hdata_fill_wide(void *buf, int dtype, int op, int rank, int world, uint64_t count) {
  uint64_t first = count < HDATA_PERIOD ? count : HDATA_PERIOD;
  for (uint64_t i = 0; i < first; i++) put(buf, dtype, i, wide_value(dtype, op, rank, world, i), 0);
  unsigned char *b = buf;
  for (uint64_t i = first; i < count; i += first) {
    uint64_t n = count - i < first ? count - i : first;
    memcpy(b + i * 2, b, n * 2);
  }
}

void hdata_ref_wide(void *table, int dtype, int op, int world) {
  for (uint64_t j = 0; j < HDATA_PERIOD; j++) {
    /* exact in double, and in float32 (at most 17 significant bits) */
    double acc = wide_value(dtype, op, 0, world, j);
    for (int r = 1; r < world; r++) {
      double v = wide_value(dtype, op, r, world, j);
      acc = op == DDPLUG_OP_PROD ? acc * v : acc + v;
    }
    float f = (float)acc;
    if (op == DDPLUG_OP_AVG) f = f / (float)world;
    put(table, dtype, j, (double)f, 0);
  }
}

/* Round x to dtype and back. */
static double round16(int dt, double x) {
  uint64_t u = 0; /* room for any dtype, though only 16-bit ones come here */
  put(&u, dt, 0, x, 0);
  return as_double(&u, dt, 0);
}

void hdata_ref_pairwise(void *table, int dtype, int op, int world) {
  for (uint64_t j = 0; j < HDATA_PERIOD; j++) {
    double acc = wide_value(dtype, op, 0, world, j);
    for (int r = 1; r < world; r++) {
      double v = wide_value(dtype, op, r, world, j);
      acc = round16(dtype, op == DDPLUG_OP_PROD ? acc * v : acc + v);
    }
    if (op == DDPLUG_OP_AVG) acc = (double)((float)acc / (float)world);
    put(table, dtype, j, acc, 0);
  }
}
