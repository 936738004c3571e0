/*
 * misbehaving.c — libddplug-misbehaving.so, a test plugin that `ddplug
 * conformance` must fail (tests/cmake/conformance.cmake). Its collectives are
 * the example backend's (examples/custom-backend/example_plugin.c, included,
 * not copied), with two mistakes a backend author can make:
 *   - group_create waits for the other ranks by polling the store with
 *     store_get(timeout 0) and sleeping: such polls never return early, so
 *     when another rank fails in group_create this one waits out its whole
 *     timeout (the wait plugin.h describes ends at once);
 *   - allreduce of int32 with MAX returns the minimum.
 * SPDX-License-Identifier: Apache-2.0
 */
#define ddplug_plugin_entry_v1 ddplug_example_entry_v1_inner
#include "example_plugin.c"
#undef ddplug_plugin_entry_v1

#include <time.h>

static ddplug_plugin g_table;

static int mb_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                           ddplug_plugin_group **out) {
  char key[32];
  snprintf(key, sizeof key, "here/%d", init->rank);
  int s = svc->store_set(svc->host, key, "1", 1);
  uint64_t deadline = svc->clock_ns(svc->host) + (uint64_t)init->timeout_ms * 1000000ull;
  for (int r = 0; !s && r < init->world_size; r++) {
    char v[4];
    uint64_t len = 0;
    snprintf(key, sizeof key, "here/%d", r);
    while ((s = svc->store_get(svc->host, key, v, sizeof v, &len, 0)) == DDPLUG_E_TIMEOUT &&
           svc->clock_ns(svc->host) < deadline) {
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  if (s) {
    svc->set_error(svc->host, s, "misbehaving: rank never arrived");
    return s;
  }
  return ex_group_create(init, svc, out);
}

static int mb_collective_start(ddplug_plugin_group *g, const ddplug_coll_args *a,
                               ddplug_plugin_request **req) {
  ddplug_coll_args b = *a;
  if (a->kind == DDPLUG_COLL_ALLREDUCE && a->dtype == DDPLUG_INT32 && a->op == DDPLUG_OP_MAX)
    b.op = DDPLUG_OP_MIN;
  return ex_collective_start(g, &b, req);
}

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  g_table = *ddplug_example_entry_v1_inner(host_abi_version);
  g_table.name = "misbehaving";
  g_table.group_create = mb_group_create;
  g_table.collective_start = mb_collective_start;
  return &g_table;
}
