/*
 * options.c — the nccl plugin's part of the config: "plugin_options".
 *
 *   {"device_map": [0, 1, 2, 3],   CUDA ordinal of each local rank
 *    "allow_shared_gpu": false,    let two ranks use one GPU (NCCL >= 2.30)
 *    "check_mismatch": false,      compare every collective across ranks
 *    "shrink": "recreate"}         how the group is re-formed after a lost
 *                                  rank (elastic.on_peer_lost = "shrink"):
 *                                  "recreate" a new communicator over the
 *                                  survivors (the runtime's group_create;
 *                                  run on an H100), "auto" in place with
 *                                  ncclCommShrink where the NCCL has it and
 *                                  ncclCommRevoke (shrink.c)
 *
 * Declared (plugin ABI 1.3): the runtime refuses unknown keys, wrong types
 * and out-of-range values (DDPLUG_E_CONFIG naming the key path,
 * "plugin_options.device_map[2]: ...") before group_create and hands the
 * values over typed.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_DEVICE_MAP 4096

static const ddplug_option opt_device_map = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "device_map",
    .type = DDPLUG_OPTION_INT_LIST,
    .int_min = 0,
    .int_max = 1023,
    .max_items = MAX_DEVICE_MAP,
    .description = "The CUDA device ordinal of each local rank, in local-rank order; default: "
                   "local rank i uses device i.",
};
static const ddplug_option opt_allow_shared_gpu = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "allow_shared_gpu",
    .type = DDPLUG_OPTION_BOOL,
    .default_json = "false",
    .description = "Let two ranks use one GPU (needs NCCL >= 2.30 and "
                   "NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank).",
};
static const ddplug_option opt_check_mismatch = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "check_mismatch",
    .type = DDPLUG_OPTION_BOOL,
    .default_json = "false",
    .description = "Compare every collective across ranks through the store before NCCL sees "
                   "it (milliseconds per call: for debugging).",
};

static const char *const k_shrink[] = {"recreate", "auto", NULL};
static const ddplug_option opt_shrink = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "shrink",
    .type = DDPLUG_OPTION_STRING,
    .choices = k_shrink,
    .default_json = "\"recreate\"",
    .description = "How the group is re-formed after a lost rank (elastic.on_peer_lost = "
                   "shrink): recreate (a new communicator over the survivors), auto (in place "
                   "with ncclCommShrink where the loaded NCCL has ncclCommShrink and "
                   "ncclCommRevoke, else recreate)."};

const ddplug_option *const ddnccl_option_decls[] = {
    &opt_device_map, &opt_allow_shared_gpu, &opt_check_mismatch, &opt_shrink, NULL};

/* See internal.h. */
int ddnccl_options_read(const ddplug_host_services *svc, ddnccl_options *out,
                        char *err, size_t cap) {
  memset(out, 0, sizeof *out);
  int32_t b = 0;
  int st = svc->option_bool(svc->host, "allow_shared_gpu", &b);
  out->allow_shared_gpu = b;
  if (st == DDPLUG_OK) st = svc->option_bool(svc->host, "check_mismatch", &b);
  out->check_mismatch = b;
  char shrink[16] = "";
  uint64_t slen = 0;
  if (st == DDPLUG_OK) st = svc->option_string(svc->host, "shrink", shrink, sizeof shrink, &slen);
  out->shrink_auto = st == DDPLUG_OK && !strcmp(shrink, "auto");
  if (st != DDPLUG_OK) {
    ddnccl_fmt(err, cap, "plugin_options: the runtime refused them (%s)",
               ddnccl_status_name(st));
    return st;
  }
  int64_t map[MAX_DEVICE_MAP];
  uint64_t n = 0;
  st = svc->option_int_list(svc->host, "device_map", map, MAX_DEVICE_MAP, &n);
  if (st == DDPLUG_E_NOT_FOUND) return DDPLUG_OK; /* not given */
  if (st != DDPLUG_OK) {
    ddnccl_fmt(err, cap, "plugin_options.device_map: the runtime refused it (%s)",
               ddnccl_status_name(st));
    return st;
  }
  out->device_map = calloc(n, sizeof *out->device_map);
  if (!out->device_map) {
    ddnccl_fmt(err, cap, "plugin_options.device_map: out of memory");
    return DDPLUG_E_NO_MEMORY;
  }
  for (uint64_t i = 0; i < n; i++) out->device_map[i] = (int32_t)map[i];
  out->device_map_len = (uint32_t)n;
  return DDPLUG_OK;
}

void ddnccl_options_free(ddnccl_options *o) {
  if (!o) return;
  free(o->device_map);
  o->device_map = NULL;
  o->device_map_len = 0;
}
