/*
 * entry.c — the nccl plugin's table and its one exported symbol,
 * ddplug_plugin_entry_v1.
 *
 * Capabilities: host and device memory, asynchronous requests backed by
 * CUDA events, several nodes, abort from any thread, CUDA streams. Not
 * advertised: DDPLUG_CAP_MISMATCH_CHECK (the check exists but is opt-in,
 * plugin_options.check_mismatch, because it costs store round trips on
 * every collective) and the sampler slots (the runtime's defaults apply).
 * Ops: every NCCL op; BOR and BAND are not NCCL ops and are left out.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "nccl_plugin.h"

#define DDPLUG_NCCL__STR2(x) #x
#define DDPLUG_NCCL__STR(x) DDPLUG_NCCL__STR2(x)
#define DDPLUG_NCCL__HEADER_VERSION                        \
  DDPLUG_NCCL__STR(NCCL_MAJOR) "." DDPLUG_NCCL__STR(NCCL_MINOR) "." \
      DDPLUG_NCCL__STR(NCCL_PATCH)
#ifndef DDPLUG_NCCL_BUILD_CUDA
#define DDPLUG_NCCL_BUILD_CUDA "?"
#endif

/* Masks as constants (tests check they equal what types.c maps). */
#define DDPLUG_NCCL__DTYPES                                              \
  (DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32) | DDPLUG_DTYPE_BIT(DDPLUG_FLOAT64) | \
   DDPLUG_DTYPE_BIT(DDPLUG_FLOAT16) | DDPLUG_DTYPE_BIT(DDPLUG_BFLOAT16) | \
   DDPLUG_DTYPE_BIT(DDPLUG_INT8) | DDPLUG_DTYPE_BIT(DDPLUG_UINT8) |     \
   DDPLUG_DTYPE_BIT(DDPLUG_INT32) | DDPLUG_DTYPE_BIT(DDPLUG_INT64))
#define DDPLUG_NCCL__OPS                                                  \
  (DDPLUG_OP_BIT(DDPLUG_OP_SUM) | DDPLUG_OP_BIT(DDPLUG_OP_AVG) |          \
   DDPLUG_OP_BIT(DDPLUG_OP_MIN) | DDPLUG_OP_BIT(DDPLUG_OP_MAX) |          \
   DDPLUG_OP_BIT(DDPLUG_OP_PROD))

static const ddplug_plugin ddplug_nccl__table = {
    .struct_size = sizeof(ddplug_plugin),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "nccl",
    .version = DDPLUG_LIB_VERSION_STRING,
    .description = "NCCL collectives on CUDA devices: device and host buffers, "
                   "CUDA streams, bfloat16, abort and timeouts (built with NCCL "
                   DDPLUG_NCCL__HEADER_VERSION ", CUDA " DDPLUG_NCCL_BUILD_CUDA ")",
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_DEVICE_MEMORY |
            DDPLUG_CAP_ASYNC | DDPLUG_CAP_MULTI_NODE | DDPLUG_CAP_ABORT |
            DDPLUG_CAP_STREAMS,
    .dtype_mask = DDPLUG_NCCL__DTYPES,
    .op_mask = DDPLUG_NCCL__OPS,
    .group_create = ddplug_nccl__group_create,
    .group_destroy = ddplug_nccl__group_destroy,
    .group_abort = ddplug_nccl__group_abort,
    .collective_start = ddplug_nccl__collective_start,
    .request_wait = ddplug_nccl__request_wait,
    .request_test = ddplug_nccl__request_test,
    .request_free = ddplug_nccl__request_free,
    /* sampler slots: NULL, the runtime's default samplers apply */
    .options = ddplug_nccl__option_decls,
};

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(
    uint32_t host_abi_version);

/* The entry point (see plugin.h): the static table for a runtime of plugin
 * ABI 1.3 or newer 1.x (group_create reads the options through the host
 * services 1.3 added), NULL for an older one or another major. Never fails
 * otherwise; touches no CUDA state, so it works on machines without a GPU
 * or driver. Thread-safe. */
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(
    uint32_t host_abi_version) {
  if (DDPLUG_VERSION_MAJOR_OF(host_abi_version) != DDPLUG_PLUGIN_ABI_MAJOR ||
      DDPLUG_VERSION_MINOR_OF(host_abi_version) < 3)
    return NULL;
  return &ddplug_nccl__table;
}
