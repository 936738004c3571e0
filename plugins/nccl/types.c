/*
 * types.c — ddplug's dtypes, reduce ops and collective kinds as NCCL sees
 * them, and their names for messages.
 *
 * Every ddplug dtype has an NCCL type (bfloat16 included). Of the ops,
 * SUM, PROD, MIN, MAX and AVG (ncclAvg: floats pre-multiply by 1/n, integers
 * sum then divide truncating toward zero, as ddplug defines AVG) exist in
 * NCCL; BOR and BAND do not, so the plugin leaves them out of op_mask and
 * the runtime answers DDPLUG_E_UNSUPPORTED before calling the plugin.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "internal.h"

int ddnccl_dtype(int32_t dtype, ncclDataType_t *out) {
  switch (dtype) {
    case DDPLUG_FLOAT32: *out = ncclFloat32; return 0;
    case DDPLUG_FLOAT64: *out = ncclFloat64; return 0;
    case DDPLUG_FLOAT16: *out = ncclFloat16; return 0;
    case DDPLUG_BFLOAT16: *out = ncclBfloat16; return 0;
    case DDPLUG_INT8: *out = ncclInt8; return 0;
    case DDPLUG_UINT8: *out = ncclUint8; return 0;
    case DDPLUG_INT32: *out = ncclInt32; return 0;
    case DDPLUG_INT64: *out = ncclInt64; return 0;
    default: return -1;
  }
}

int ddnccl_op(int32_t op, ncclRedOp_t *out) {
  switch (op) {
    case DDPLUG_OP_SUM: *out = ncclSum; return 0;
    case DDPLUG_OP_AVG: *out = ncclAvg; return 0;
    case DDPLUG_OP_MIN: *out = ncclMin; return 0;
    case DDPLUG_OP_MAX: *out = ncclMax; return 0;
    case DDPLUG_OP_PROD: *out = ncclProd; return 0;
    default: return -1; /* BOR, BAND: not NCCL ops */
  }
}

size_t ddnccl_dtype_size(int32_t dtype) {
  switch (dtype) {
#define DDNCCL_DT_SIZE(name, value, str, size)      \
  case value:                                       \
    return size;
    DDPLUG_DTYPE_MAP(DDNCCL_DT_SIZE)
#undef DDNCCL_DT_SIZE
    default:
      return 0;
  }
}

const char *ddnccl_dtype_name(int32_t dtype) {
  switch (dtype) {
#define DDNCCL_DT_NAME(name, value, str, size)      \
  case value:                                       \
    return str;
    DDPLUG_DTYPE_MAP(DDNCCL_DT_NAME)
#undef DDNCCL_DT_NAME
    default:
      return "?";
  }
}

const char *ddnccl_op_name(int32_t op) {
  switch (op) {
#define DDNCCL_OP_NAME(name, value, str) \
  case value:                            \
    return str;
    DDPLUG_OP_MAP(DDNCCL_OP_NAME)
#undef DDNCCL_OP_NAME
    default:
      return "?";
  }
}

const char *ddnccl_kind_name(int32_t kind) {
  switch (kind) {
    case DDPLUG_COLL_ALLREDUCE: return "allreduce";
    case DDPLUG_COLL_BROADCAST: return "broadcast";
    case DDPLUG_COLL_ALLGATHER: return "allgather";
    case DDPLUG_COLL_BARRIER: return "barrier";
    default: return "?";
  }
}

uint32_t ddnccl_dtype_mask(void) {
  uint32_t m = 0;
  ncclDataType_t t;
  for (int32_t d = 1; d < DDPLUG_DTYPE_COUNT_; d++)
    if (ddnccl_dtype(d, &t) == 0) m |= DDPLUG_DTYPE_BIT(d);
  return m;
}

uint32_t ddnccl_op_mask(void) {
  uint32_t m = 0;
  ncclRedOp_t o;
  for (int32_t op = 1; op < DDPLUG_OP_COUNT_; op++)
    if (ddnccl_op(op, &o) == 0) m |= DDPLUG_OP_BIT(op);
  return m;
}
