/*
 * entry.c — the nccl plugin's table and its one exported symbol,
 * ddplug_plugin_entry_v1.
 *
 * Capabilities: host and device memory, asynchronous requests backed by
 * CUDA events, several nodes, abort from any thread, CUDA streams, sends
 * and receives (tag 0, named peers: p2p.c), group_shrink (shrink.c:
 * declines unless plugin_options.shrink = "auto"). Not
 * advertised: DDPLUG_CAP_MISMATCH_CHECK (the check exists but is opt-in,
 * plugin_options.check_mismatch, because it costs store round trips on
 * every collective) and the sampler slots (the runtime's defaults apply).
 * Ops: every NCCL op; BOR and BAND are not NCCL ops and are left out.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "internal.h"

#define DDNCCL_STR2(x) #x
#define DDNCCL_STR(x) DDNCCL_STR2(x)
#define DDNCCL_HEADER_VERSION                           \
  DDNCCL_STR(NCCL_MAJOR) "." DDNCCL_STR(NCCL_MINOR) "." \
      DDNCCL_STR(NCCL_PATCH)
#ifndef DDNCCL_BUILD_CUDA
#define DDNCCL_BUILD_CUDA "?"
#endif

/* Masks as constants (tests check they equal what types.c maps). */
#define DDNCCL_DTYPES                                                     \
  (DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32) | DDPLUG_DTYPE_BIT(DDPLUG_FLOAT64) |  \
   DDPLUG_DTYPE_BIT(DDPLUG_FLOAT16) | DDPLUG_DTYPE_BIT(DDPLUG_BFLOAT16) | \
   DDPLUG_DTYPE_BIT(DDPLUG_INT8) | DDPLUG_DTYPE_BIT(DDPLUG_UINT8) |       \
   DDPLUG_DTYPE_BIT(DDPLUG_INT32) | DDPLUG_DTYPE_BIT(DDPLUG_INT64))
#define DDNCCL_OPS                                                        \
  (DDPLUG_OP_BIT(DDPLUG_OP_SUM) | DDPLUG_OP_BIT(DDPLUG_OP_AVG) |          \
   DDPLUG_OP_BIT(DDPLUG_OP_MIN) | DDPLUG_OP_BIT(DDPLUG_OP_MAX) |          \
   DDPLUG_OP_BIT(DDPLUG_OP_PROD))

static const ddplug_plugin ddnccl_table = {
    .struct_size = sizeof(ddplug_plugin),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "nccl",
    .version = DDPLUG_LIB_VERSION_STRING,
    .description = "NCCL collectives on CUDA devices: device and host buffers, "
                   "CUDA streams, bfloat16, abort and timeouts (built with NCCL "
                   DDNCCL_HEADER_VERSION ", CUDA " DDNCCL_BUILD_CUDA ")",
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_DEVICE_MEMORY |
            DDPLUG_CAP_ASYNC | DDPLUG_CAP_MULTI_NODE | DDPLUG_CAP_ABORT |
            DDPLUG_CAP_STREAMS | DDPLUG_CAP_P2P | DDPLUG_CAP_SHRINK,
    .dtype_mask = DDNCCL_DTYPES,
    .op_mask = DDNCCL_OPS,
    .group_create = ddnccl_group_create,
    .group_destroy = ddnccl_group_destroy,
    .group_abort = ddnccl_group_abort,
    .collective_start = ddnccl_collective_start,
    .request_wait = ddnccl_request_wait,
    .request_test = ddnccl_request_test,
    .request_free = ddnccl_request_free,
    /* sampler slots: NULL, the runtime's default samplers apply */
    .options = ddnccl_option_decls,
    .p2p_start = ddnccl_p2p_start,
    /* shrink: declines (UNSUPPORTED, the runtime re-creates) unless
     * plugin_options.shrink = "auto" and NCCL can (shrink.c) */
    .group_shrink = ddnccl_group_shrink,
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
  return &ddnccl_table;
}
