/* fault_plugin.c — libddplug-conformance-fault.so, used only by `ddplug
 * conformance` (plugins/conformance/faults.c) to make one rank's
 * group_create fail, or the rank die there, on purpose.
 *
 * It impersonates the plugin it wraps: its entry point loads the file named
 * by DDPLUG_CONFORMANCE_WRAP, copies that plugin's table (all of it, also
 * slots newer than this file knows) and replaces group_create. The runtime's
 * startup checks see the wrapped plugin's name and version, so the other
 * ranks, which load the real plugin, run their real group_create: the
 * suite checks that it ends promptly once this rank has failed.
 * DDPLUG_CONFORMANCE_FAULT: "fail" (group_create returns INTERNAL after
 * 500 ms) or "die" (the process kills itself with SIGKILL after 500 ms).
 * Installed in <libdir>/ddplug/conformance/, apart from the plugins that
 * are found by name.
 * SPDX-License-Identifier: Apache-2.0 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddplug/plugin.h"

#define FAULT_DELAY_MS 500

static union {
  ddplug_plugin table;
  unsigned char bytes[4096];
} g_wrapped;

static int fault_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                              ddplug_plugin_group **out) {
  (void)out;
  const char *mode = getenv("DDPLUG_CONFORMANCE_FAULT");
  struct timespec ts = {FAULT_DELAY_MS / 1000, (FAULT_DELAY_MS % 1000) * 1000000L};
  nanosleep(&ts, NULL); /* the other ranks are inside their group_create now */
  if (mode && !strcmp(mode, "die")) raise(SIGKILL);
  char msg[512];
  snprintf(msg, sizeof msg,
           "ddplug conformance: rank %d's group_create fails on purpose (the fault wrapper "
           "around %s)", init->rank, g_wrapped.table.name ? g_wrapped.table.name : "?");
  svc->set_error(svc->host, DDPLUG_E_INTERNAL, msg);
  return DDPLUG_E_INTERNAL;
}

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  const char *path = getenv("DDPLUG_CONFORMANCE_WRAP");
  if (!path) return NULL;
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* kept: the table lives in it */
  if (!dl) return NULL;
  void *sym = dlsym(dl, DDPLUG_PLUGIN_ENTRY_SYMBOL);
  if (!sym) return NULL;
  ddplug_plugin_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  const ddplug_plugin *real = entry(host_abi_version);
  if (!real || real->struct_size > sizeof g_wrapped.bytes ||
      real->struct_size < DDPLUG_PLUGIN_SIZE_1_0)
    return NULL;
  memcpy(g_wrapped.bytes, real, real->struct_size);
  g_wrapped.table.group_create = fault_group_create;
  return &g_wrapped.table;
}
