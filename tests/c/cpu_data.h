/*
 * cpu_data.h — test data for collectives with an exact reference.
 *
 * Rank r's element i is a small value chosen per reduce op so that every
 * partial result is exactly representable in every dtype (sums of small
 * integers, products of 1, -1 and 2, ...): the plugin's result can then be
 * compared bit for bit with a reference computed independently here (in
 * 64-bit integers or double, rounded with the compiler's _Float16 and a
 * nearest-even bfloat16 written without the plugin's code). Values repeat
 * with a prime period (HDATA_PERIOD) that never lines up with chunk or
 * segment boundaries, so the reference is a table of one period and
 * checking n elements costs O(n).
 */
#ifndef DDPLUG_TEST_CPU_DATA_H
#define DDPLUG_TEST_CPU_DATA_H

#include <stddef.h>
#include <stdint.h>

#define HDATA_PERIOD 4099

/* Fill buf[0..count) with rank's contribution for (dtype, op). For
 * broadcast/allgather use op 0 (distinct values per rank). */
void hdata_fill(void *buf, int dtype, int op, int rank, uint64_t count);
/* The expected allreduce result over `world` ranks, one period long
 * (HDATA_PERIOD elements of dtype). */
void hdata_ref(void *table, int dtype, int op, int world);
/* Compare buf[0..count) with table (periodic, starting at element
 * `phase`); returns the first bad index or -1. */
int64_t hdata_check(const void *buf, const void *table, int dtype, uint64_t count,
                    uint64_t phase);
/* Describe element i of buf and of the table, for a failure message. */
void hdata_describe(char *out, size_t cap, const void *buf, const void *table,
                    int dtype, uint64_t i, uint64_t phase);
/* Rank's fill compared directly (broadcast / allgather blocks). */
int64_t hdata_check_rank(const void *buf, int dtype, int op, int rank, uint64_t count);

/* float16/bfloat16 data whose reduction is exact in float32 but whose
 * 16-bit partial results are not: for sum/avg one rank (rotating with the
 * element) holds a large value (2048..4094 for float16, 256..510 for
 * bfloat16, even, sometimes negative) and the others small multiples of
 * 0.25 up to 1, so adding small values to the large one one at a time in
 * 16 bits rounds them away while their float32 total does not; for prod,
 * factors in [1, 2) whose products need more significant bits than 16-bit
 * types have (on ranks 0-2; the others multiply by powers of two). hdata_ref_wide is the float32-accumulated result rounded
 * once (avg: the float32 sum divided in float32, then rounded), what a
 * plugin that accumulates in float32 must return bit for bit; world is at
 * most 16. Periodic like the rest (HDATA_PERIOD). */
void hdata_fill_wide(void *buf, int dtype, int op, int rank, int world, uint64_t count);
void hdata_ref_wide(void *table, int dtype, int op, int world);
/* The same reduction rounded to 16 bits after every pairwise step in rank
 * order (what a plugin without float32 accumulation would give); for
 * showing that the data tells the two apart. */
void hdata_ref_pairwise(void *table, int dtype, int op, int world);

#endif
