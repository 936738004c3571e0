/*
 * kernels.h — the cpu plugin's compute kernels: reductions of every dtype x
 * op (reduce.c), the bulk copy (copy.c), float16/bfloat16 conversions, and
 * the names and sizes of dtypes, ops and collectives. Pure functions of
 * their arguments: nothing here knows the group, so reduce.c and copy.c
 * include only this header (and the benchmarks and tests can call them
 * alone).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_KERNELS_H
#define DDPLUG_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "ddplug/plugin.h"

/* ---- names and sizes (reduce.c) ----------------------------------------- */

uint32_t ddcpu_dtype_size(int dtype);
const char *ddcpu_dtype_name(int dtype);
const char *ddcpu_op_name(int op);
const char *ddcpu_kind_name(int kind);
int ddcpu_dtype_is_int(int dtype);
static inline int ddcpu_dtype_is_half(int dtype) {
  return dtype == DDPLUG_FLOAT16 || dtype == DDPLUG_BFLOAT16;
}

/* ---- reductions (reduce.c) ------------------------------------------------ */

/* dst[i] = op over k of srcs[k][i] for i < count, combining the sources in
 * order k = 0..nsrc-1 (so every rank computing the same reduction gets the
 * same bits). fp16/bf16 accumulate in float32 and round once. If divisor > 0
 * the result is divided by it (AVG): floats after accumulation, integers
 * truncated toward zero. op AVG accumulates as SUM. dst may alias srcs[k]. */
void ddcpu_reduce_n(int dtype, int op, void *dst, const void *const *srcs,
                    int nsrc, uint64_t count, int divisor);
/* The same, writing the result to every one of dsts[0..ndst) (block by
 * block: each block is reduced once, in L1, then stored ndst times), with
 * non-temporal stores when stream (call ddcpu_copy_fence before publishing).
 * No dst may alias a source other than at the same offset (in place). */
void ddcpu_reduce_bcast(int dtype, int op, void *const *dsts, int ndst,
                        const void *const *srcs, int nsrc, uint64_t count,
                        int divisor, int stream);
/* dst[i] = dst[i] op src[i] (two-operand form, used by the TCP ring). */
void ddcpu_reduce_into(int dtype, int op, void *dst, const void *src,
                       uint64_t count);
/* x[i] /= divisor (AVG finalisation after a SUM). */
void ddcpu_divide(int dtype, void *x, uint64_t count, int divisor);

/* ---- float16 and bfloat16 (reduce.c) --------------------------------------- */

/* float16/bfloat16 buffer <-> float32 buffer (count elements; narrowing
 * rounds to nearest even). Used where a reduction spans several steps
 * (the multi-node allreduce): partial results stay float32 and are rounded
 * once at the end. */
void ddcpu_half_widen(int dtype, float *out, const void *in, uint64_t count);
void ddcpu_half_narrow(int dtype, void *out, const float *in, uint64_t count);

/* IEEE binary16 and bfloat16 conversions (round to nearest even). */
float ddcpu_half_to_float(uint16_t h);
uint16_t ddcpu_float_to_half(float f);
float ddcpu_bf16_to_float(uint16_t b);
uint16_t ddcpu_float_to_bf16(float f);

/* ---- the bulk copy (copy.c) ------------------------------------------------- */

/* Copy n bytes: glibc's memcpy, except where it is slow (a destination
 * 1..31 bytes past the source modulo 4 KiB, on CPUs whose `rep movsb`
 * stalls there) and, with stream, through non-temporal stores that bypass
 * the cache (then call ddcpu_copy_fence before publishing). */
void ddcpu_copy(void *dst, const void *src, size_t n, int stream);
void ddcpu_copy_fence(int stream);

#endif /* DDPLUG_CPU_KERNELS_H */
