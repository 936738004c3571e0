/*
 * device.c — which GPU a rank uses, and whether the ranks' choices fit
 * together.
 *
 *   1. pick_device: local rank → CUDA ordinal (or plugin_options.device_map)
 *   2. devrec_fill: the device's identity (UUID, PCI bus id, name), which is
 *      what two processes can compare even when CUDA_VISIBLE_DEVICES gives
 *      them different ordinals for the same GPU
 *   3. check_devices: the verdict over the records of ranks on one host —
 *      the same GPU twice is an error naming both ranks, unless the config
 *      allows sharing and NCCL can do it (>= 2.30, NCCL_MULTI_RANK_GPU_ENABLE)
 * And the sentence for the machine without a usable GPU.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *visible_devices(char *buf, size_t cap) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v)
    ddnccl_fmt(buf, cap, "CUDA_VISIBLE_DEVICES unset");
  else
    ddnccl_fmt(buf, cap, "CUDA_VISIBLE_DEVICES=\"%s\"", v);
  return buf;
}

/* See internal.h. Pure: reads only its arguments and the environment. */
int ddnccl_pick_device(const ddnccl_options *o, int32_t local_rank,
                       int32_t local_world, int32_t count,
                       int32_t *ordinal, char *err, size_t cap) {
  char vis[160];
  if (o->device_map) {
    if ((int64_t)o->device_map_len < (int64_t)local_world) {
      ddnccl_fmt(err, cap,
                 "plugin_options.device_map has %u entries but this node "
                 "runs %d ranks: give one CUDA device ordinal per local "
                 "rank",
                 o->device_map_len, local_world);
      return DDPLUG_E_CONFIG;
    }
    int32_t d = o->device_map[local_rank];
    if (d >= count) {
      ddnccl_fmt(err, cap,
                 "plugin_options.device_map[%d] = %d, but this process "
                 "sees only %d CUDA device%s (%s)",
                 local_rank, d, count, count == 1 ? "" : "s",
                 visible_devices(vis, sizeof vis));
      return DDPLUG_E_CONFIG;
    }
    *ordinal = d;
    return DDPLUG_OK;
  }
  if (count == 1) {
    *ordinal = 0; /* the launcher gave this process exactly one GPU */
    return DDPLUG_OK;
  }
  if (local_rank < count) {
    *ordinal = local_rank;
    return DDPLUG_OK;
  }
  if (o->allow_shared_gpu) {
    *ordinal = local_rank % count;
    return DDPLUG_OK;
  }
  ddnccl_fmt(err, cap,
             "local rank %d of %d on this node has no GPU of its own: "
             "this process sees %d CUDA devices (%s). Start at most %d "
             "ranks per node, map ranks to GPUs with "
             "plugin_options.device_map, or let ranks share GPUs with "
             "checks.duplicate_gpu = \"warn\" or \"allow\" (or "
             "plugin_options.allow_shared_gpu=true; NCCL >= 2.30, "
             "NCCL_MULTI_RANK_GPU_ENABLE=1)",
             local_rank, local_world, count,
             visible_devices(vis, sizeof vis), count);
  return DDPLUG_E_CONFIG;
}

/* See internal.h. Safe without a driver: cudaDriverGetVersion reports 0
 * when libcuda cannot be loaded. */
void ddnccl_no_device_text(cudaError_t err, char *buf, size_t cap) {
  char vis[160], drv[96];
  int dv = 0;
  if (cudaDriverGetVersion(&dv) != cudaSuccess) dv = 0;
  if (dv == 0)
    ddnccl_fmt(drv, sizeof drv, "none loaded (libcuda.so.1 not found)");
  else
    ddnccl_fmt(drv, sizeof drv, "CUDA %d.%d", dv / 1000, (dv % 1000) / 10);
  int rv = 0;
  (void)cudaRuntimeGetVersion(&rv);
  ddnccl_fmt(buf, cap,
             "no CUDA device visible (%s, driver: %s, runtime: CUDA "
             "%d.%d; cudaGetDeviceCount: %s: %s). The nccl plugin needs "
             "one GPU per rank; on a machine without GPUs use the "
             "\"cpu\" plugin",
             visible_devices(vis, sizeof vis), drv, rv / 1000,
             (rv % 1000) / 10, cudaGetErrorName(err),
             cudaGetErrorString(err));
}

/* Copies src into dst[cap] replacing line breaks (records are line-based). */
static void copy_field(char *dst, size_t cap, const char *src) {
  size_t i = 0;
  for (; src && src[i] && i + 1 < cap; i++)
    dst[i] = (src[i] == '\n' || src[i] == '\r') ? ' ' : src[i];
  dst[i] = '\0';
}

/* See internal.h. Calls cudaGetDeviceProperties (ms-scale, once). */
int ddnccl_devrec_fill(ddnccl_devrec *rec, int32_t rank,
                       int32_t ordinal, const char *host, char *err,
                       size_t cap) {
  memset(rec, 0, sizeof *rec);
  rec->rank = rank;
  rec->ordinal = ordinal;
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) v = 0;
  rec->nccl_version = v;
  const char *mr = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  rec->multi_rank_env = mr && strcmp(mr, "1") == 0;
  copy_field(rec->host, sizeof rec->host, host ? host : "?");

  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, ordinal);
  if (e != cudaSuccess) {
    ddnccl_fmt(err, cap, "cannot describe CUDA device %d: %s: %s",
               ordinal, cudaGetErrorName(e), cudaGetErrorString(e));
    return DDPLUG_E_SYSTEM;
  }
  const unsigned char *u = (const unsigned char *)p.uuid.bytes;
  snprintf(rec->uuid, sizeof rec->uuid,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
  copy_field(rec->name, sizeof rec->name, p.name);
  char pci[32] = "?";
  if (cudaDeviceGetPCIBusId(pci, (int)sizeof pci, ordinal) != cudaSuccess)
    strcpy(pci, "?");
  copy_field(rec->pci, sizeof rec->pci, pci);
  return DDPLUG_OK;
}

size_t ddnccl_devrec_format(const ddnccl_devrec *r, char *buf,
                            size_t cap) {
  int n = snprintf(buf, cap,
                   "rank=%d\nordinal=%d\nnccl=%d\nmulti_rank_env=%d\n"
                   "uuid=%s\npci=%s\nhost=%s\nname=%s\n",
                   r->rank, r->ordinal, r->nccl_version, r->multi_rank_env,
                   r->uuid, r->pci, r->host, r->name);
  if (n < 0) return 0;
  return (size_t)n < cap ? (size_t)n : cap - 1;
}

/* Copies the value of line "key=value" into dst when key matches. */
static int take(const char *line, size_t len, const char *key, char *dst,
                size_t cap) {
  size_t k = strlen(key);
  if (len <= k || strncmp(line, key, k) != 0 || line[k] != '=') return 0;
  size_t n = len - k - 1;
  if (n >= cap) n = cap - 1;
  memcpy(dst, line + k + 1, n);
  dst[n] = '\0';
  return 1;
}

int ddnccl_devrec_parse(const char *text, size_t len,
                        ddnccl_devrec *out) {
  memset(out, 0, sizeof *out);
  char num[4][24] = {{0}};
  unsigned seen = 0;
  size_t i = 0;
  while (i < len) {
    size_t j = i;
    while (j < len && text[j] != '\n') j++;
    const char *l = text + i;
    size_t n = j - i;
    if (take(l, n, "rank", num[0], sizeof num[0])) seen |= 1u;
    else if (take(l, n, "ordinal", num[1], sizeof num[1])) seen |= 2u;
    else if (take(l, n, "nccl", num[2], sizeof num[2])) seen |= 4u;
    else if (take(l, n, "multi_rank_env", num[3], sizeof num[3])) seen |= 8u;
    else if (take(l, n, "uuid", out->uuid, sizeof out->uuid)) seen |= 16u;
    else if (take(l, n, "pci", out->pci, sizeof out->pci)) seen |= 32u;
    else if (take(l, n, "host", out->host, sizeof out->host)) seen |= 64u;
    else if (take(l, n, "name", out->name, sizeof out->name)) seen |= 128u;
    i = j + 1;
  }
  if (seen != 255u) return -1;
  out->rank = (int32_t)strtol(num[0], NULL, 10);
  out->ordinal = (int32_t)strtol(num[1], NULL, 10);
  out->nccl_version = (int32_t)strtol(num[2], NULL, 10);
  out->multi_rank_env = (int32_t)strtol(num[3], NULL, 10);
  return 0;
}

static int same_gpu(const ddnccl_devrec *a, const ddnccl_devrec *b) {
  return strcmp(a->host, b->host) == 0 && strcmp(a->uuid, b->uuid) == 0;
}

/* "ranks 0 and 1" / "ranks 0, 2 and 5 (and 3 more)" with every rank that
 * uses the GPU of recs[first], plus "(rank 0 as cuda:0, ...)". */
static void sharers(const ddnccl_devrec *recs, int32_t n, int32_t first,
                    char *who, size_t wcap, char *how, size_t hcap) {
  int32_t list[8];
  int32_t k = 0, total = 0;
  for (int32_t i = first; i < n; i++) {
    if (!same_gpu(&recs[first], &recs[i])) continue;
    if (k < 8) list[k++] = i;
    total++;
  }
  size_t w = 0, h = 0;
  w += (size_t)snprintf(who + w, wcap - w, "ranks ");
  for (int32_t i = 0; i < k && w < wcap && h < hcap; i++) {
    const char *sep = i == 0 ? "" : (i == k - 1 && total == k) ? " and " : ", ";
    w += (size_t)snprintf(who + w, wcap - w, "%s%d", sep, recs[list[i]].rank);
    h += (size_t)snprintf(how + h, hcap - h, "%srank %d as cuda:%d",
                          i == 0 ? "" : ", ", recs[list[i]].rank,
                          recs[list[i]].ordinal);
  }
  if (total > k && w < wcap)
    snprintf(who + w, wcap - w, " (and %d more)", total - k);
}

static void version_text(int32_t code, char *buf, size_t cap) {
  ddnccl_fmt(buf, cap, "%d.%d.%d", code / 10000, (code % 10000) / 100,
             code % 100);
}

/* See internal.h. O(n^2) over one node's ranks. */
int ddnccl_check_devices(const ddnccl_devrec *recs, int32_t n,
                         int allow_shared_gpu, int *shared, char *err,
                         size_t cap) {
  if (shared) *shared = 0;
  for (int32_t i = 0; i < n; i++) {
    for (int32_t j = i + 1; j < n; j++) {
      if (!same_gpu(&recs[i], &recs[j])) continue;
      char who[160], how[320];
      sharers(recs, n, i, who, sizeof who, how, sizeof how);
      const ddnccl_devrec *d = &recs[i];
      if (!allow_shared_gpu) {
        ddnccl_fmt(err, cap,
                   "%s are bound to the same GPU %s (%s, PCI %s) on host "
                   "%s (%s): NCCL needs one GPU per rank. Give each rank "
                   "its own GPU (CUDA_VISIBLE_DEVICES or "
                   "plugin_options.device_map), or allow sharing with "
                   "checks.duplicate_gpu = \"warn\" or \"allow\" (NCCL "
                   ">= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1)",
                   who, d->uuid, d->name, d->pci, d->host, how);
        return DDPLUG_E_CONFIG;
      }
      for (int32_t k = i; k < n; k++) {
        if (!same_gpu(d, &recs[k])) continue;
        if (recs[k].nccl_version < DDNCCL_MULTI_RANK_MIN_VERSION) {
          char v[32];
          version_text(recs[k].nccl_version, v, sizeof v);
          ddnccl_fmt(err, cap,
                     "%s share GPU %s (%s) on host %s as "
                     "plugin_options.allow_shared_gpu allows, but rank "
                     "%d runs NCCL %s, which cannot put two ranks on one "
                     "GPU (NCCL >= 2.30 can)",
                     who, d->uuid, d->name, d->host, recs[k].rank, v);
          return DDPLUG_E_UNSUPPORTED;
        }
        if (!recs[k].multi_rank_env) {
          ddnccl_fmt(err, cap,
                     "%s share GPU %s (%s) on host %s as "
                     "plugin_options.allow_shared_gpu allows, but rank "
                     "%d runs without NCCL_MULTI_RANK_GPU_ENABLE=1 in "
                     "its environment, which NCCL requires for that: "
                     "set it for every rank",
                     who, d->uuid, d->name, d->host, recs[k].rank);
          return DDPLUG_E_CONFIG;
        }
      }
      if (shared) *shared = 1;
    }
  }
  return DDPLUG_OK;
}
