/*
 * types.c — ddplug's dtypes and reduce ops in MPI terms.
 *
 * MPI has no bfloat16 and at most an optional float16 (Open MPI 5's
 * shortfloat extension, MPICH 5's MPIX_C_FLOAT16, which MPICH 4.0 aborts
 * on), so both half types travel as MPI_UINT16_T:
 *   - sum, avg and prod widen to a float32 scratch, reduce as MPI_FLOAT and
 *     round to 16 bits once at the end — the cpu plugin's rule (its
 *     README.md, "Half types"): a float16 avg of 40000 over two ranks is
 *     40000, not inf, and no partial sum is rounded on the way;
 *   - min and max are exact in any precision: user-defined MPI ops compare
 *     the 16-bit values in place (no widening, half the bytes).
 * The conversions and comparisons are the cpu plugin's kernels
 * (plugins/cpu/reduce.c, built into this backend unchanged).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "internal.h"
#include "kernels.h"

size_t ddmpi_dtype_size(int32_t dtype) {
  switch (dtype) {
#define DDMPI__SZ(name, value, str, size) \
  case value:                             \
    return size;
    DDPLUG_DTYPE_MAP(DDMPI__SZ)
#undef DDMPI__SZ
    default:
      return 0;
  }
}

MPI_Datatype ddmpi_mpi_type(int32_t dtype) {
  switch (dtype) {
    case DDPLUG_FLOAT32:
      return MPI_FLOAT;
    case DDPLUG_FLOAT64:
      return MPI_DOUBLE;
    case DDPLUG_FLOAT16:
    case DDPLUG_BFLOAT16:
      return MPI_UINT16_T;
    case DDPLUG_INT8:
      return MPI_INT8_T;
    case DDPLUG_UINT8:
      return MPI_UINT8_T;
    case DDPLUG_INT32:
      return MPI_INT32_T;
    case DDPLUG_INT64:
      return MPI_INT64_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

/* The user-defined ops: inout[i] = op(in[i], inout[i]) on 16-bit values. */
static void half_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  ddcpu_reduce_into(DDPLUG_FLOAT16, DDPLUG_OP_MIN, inout, in, (uint64_t)*len);
}
static void half_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  ddcpu_reduce_into(DDPLUG_FLOAT16, DDPLUG_OP_MAX, inout, in, (uint64_t)*len);
}
static void bf16_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  ddcpu_reduce_into(DDPLUG_BFLOAT16, DDPLUG_OP_MIN, inout, in, (uint64_t)*len);
}
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  ddcpu_reduce_into(DDPLUG_BFLOAT16, DDPLUG_OP_MAX, inout, in, (uint64_t)*len);
}

/* See internal.h. */
int ddmpi_types_init(void) {
  int rc = MPI_Op_create(half_min, 1, &ddmpi_p.half_min[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(half_max, 1, &ddmpi_p.half_max[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_min, 1, &ddmpi_p.half_min[1]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(bf16_max, 1, &ddmpi_p.half_max[1]);
  return rc;
}

/* See internal.h. */
void ddmpi_mpi_reduction(int32_t dtype, int32_t op, MPI_Datatype *mtype, MPI_Op *mop,
                         int *widen, int *divide) {
  int half = dtype == DDPLUG_FLOAT16 || dtype == DDPLUG_BFLOAT16;
  *widen = half && (op == DDPLUG_OP_SUM || op == DDPLUG_OP_AVG || op == DDPLUG_OP_PROD);
  *divide = op == DDPLUG_OP_AVG;
  *mtype = *widen ? MPI_FLOAT : ddmpi_mpi_type(dtype);
  switch (op) {
    case DDPLUG_OP_SUM:
    case DDPLUG_OP_AVG:
      *mop = MPI_SUM;
      break;
    case DDPLUG_OP_PROD:
      *mop = MPI_PROD;
      break;
    case DDPLUG_OP_MIN:
      *mop = half ? ddmpi_p.half_min[dtype == DDPLUG_BFLOAT16] : MPI_MIN;
      break;
    case DDPLUG_OP_MAX:
      *mop = half ? ddmpi_p.half_max[dtype == DDPLUG_BFLOAT16] : MPI_MAX;
      break;
    case DDPLUG_OP_BOR:
      *mop = MPI_BOR;
      break;
    case DDPLUG_OP_BAND:
      *mop = MPI_BAND;
      break;
    default:
      *mop = MPI_OP_NULL;
      break;
  }
}
