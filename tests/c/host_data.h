/*
 * host_data.h — test data for collectives with an exact reference.
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
#ifndef DDPLUG_TEST_HOST_DATA_H
#define DDPLUG_TEST_HOST_DATA_H

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

#endif
