/*
 * entry.c — the cpu plugin's table and its one exported symbol,
 * ddplug_plugin_entry_v1.
 *
 * libddplug-cpu.so: the CPU backend. Shared memory inside a node, a TCP
 * ring between nodes, hierarchical when both; point-to-point sends and
 * receives (rings in a node, TCP between nodes); asynchronous requests with a
 * progress thread; peer loss, abort and mismatched collectives reported on
 * every rank. See README.md beside this file for the design, the options
 * and the guarantees, and internal.h for where each part lives.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include "internal.h"

static const ddplug_plugin ddcpu_table = {
    .struct_size = sizeof(ddplug_plugin),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "cpu",
    .version = DDPLUG_LIB_VERSION_STRING,
    .description = "CPU backend: shared-memory collectives in a node, TCP "
                   "ring between nodes, async requests, failure and mismatch "
                   "detection",
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_ASYNC | DDPLUG_CAP_MULTI_NODE |
            DDPLUG_CAP_MISMATCH_CHECK | DDPLUG_CAP_ABORT | DDPLUG_CAP_REGISTERED_MEMORY |
            DDPLUG_CAP_P2P | DDPLUG_CAP_P2P_ANY_SOURCE,
    .dtype_mask = DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32) | DDPLUG_DTYPE_BIT(DDPLUG_FLOAT64) |
                  DDPLUG_DTYPE_BIT(DDPLUG_FLOAT16) | DDPLUG_DTYPE_BIT(DDPLUG_BFLOAT16) |
                  DDPLUG_DTYPE_BIT(DDPLUG_INT8) | DDPLUG_DTYPE_BIT(DDPLUG_UINT8) |
                  DDPLUG_DTYPE_BIT(DDPLUG_INT32) | DDPLUG_DTYPE_BIT(DDPLUG_INT64),
    .op_mask = DDPLUG_OP_BIT(DDPLUG_OP_SUM) | DDPLUG_OP_BIT(DDPLUG_OP_AVG) |
               DDPLUG_OP_BIT(DDPLUG_OP_MIN) | DDPLUG_OP_BIT(DDPLUG_OP_MAX) |
               DDPLUG_OP_BIT(DDPLUG_OP_PROD) | DDPLUG_OP_BIT(DDPLUG_OP_BOR) |
               DDPLUG_OP_BIT(DDPLUG_OP_BAND),
    .group_create = ddcpu_group_create,
    .group_destroy = ddcpu_group_destroy,
    .group_abort = ddcpu_group_abort,
    .collective_start = ddcpu_collective_start,
    .request_wait = ddcpu_request_wait,
    .request_test = ddcpu_request_test,
    .request_free = ddcpu_request_free,
    /* sampler slots NULL: the runtime's default samplers serve */
    .options = ddcpu_option_decls,
    .mem_alloc = ddcpu_mem_alloc,
    .mem_free = ddcpu_mem_free,
    .mem_query = ddcpu_mem_query,
    .p2p_start = ddcpu_p2p_start,
};

/* The plugin's only exported symbol. Returns the table for an ABI 1.x
 * runtime from 1.3 on (it reads its options through the host services
 * 1.3 added), NULL for an older one or another major: the loader then
 * names the mismatch. */
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  if (DDPLUG_VERSION_MAJOR_OF(host_abi_version) != DDPLUG_PLUGIN_ABI_MAJOR ||
      DDPLUG_VERSION_MINOR_OF(host_abi_version) < 3)
    return NULL;
  return &ddcpu_table;
}
