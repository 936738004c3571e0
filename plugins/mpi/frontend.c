/*
 * frontend.c — libddplug-mpi.so, the mpi plugin as the runtime loads it:
 * its one exported symbol, ddplug_plugin_entry_v1. It depends on no MPI:
 * it picks the MPI library the process can use (detect.c), loads it
 * RTLD_GLOBAL, then the backend built for that library's ABI family from
 * its own directory (libddplug-mpi-openmpi.so, libddplug-mpi-mpich.so:
 * frontend.h), and returns the backend's table. The choice is made once
 * per process and kept (an MPI cannot be unloaded once initialised).
 *
 * When no MPI library or no backend loads, the entry point still returns a
 * table — the same identity, capabilities and options, so `ddplug info
 * mpi` works on any machine — whose group_create and bootstrap_world fail
 * with DDPLUG_E_NOT_FOUND and the sentence naming every library tried and
 * why. Its other slots are never reached (no group can exist).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "detect.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const ddplug_plugin *g_backend_table; /* once loaded, for good */
static char g_why[4096];                     /* the last failure      */

static int report(const ddplug_host_services *svc) {
  char why[sizeof g_why];
  pthread_mutex_lock(&g_mu);
  snprintf(why, sizeof why, "%s", g_why);
  pthread_mutex_unlock(&g_mu);
  if (svc && svc->set_error) svc->set_error(svc->host, DDPLUG_E_NOT_FOUND, why);
  return DDPLUG_E_NOT_FOUND;
}

static int unavailable_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                              ddplug_plugin_group **out) {
  (void)init;
  (void)out;
  return report(svc);
}
static int unavailable_world(const ddplug_host_services *svc, ddplug_bootstrap_world *out) {
  (void)out;
  return report(svc);
}
static int unavailable_bcast(const ddplug_host_services *svc, void *buf, uint64_t len,
                             int64_t timeout_ms) {
  (void)buf;
  (void)len;
  (void)timeout_ms;
  return report(svc);
}
/* No group exists without a backend: the slots below are unreachable. */
static int no_group_destroy(ddplug_plugin_group *g) {
  (void)g;
  return DDPLUG_E_INTERNAL;
}
static int no_group_abort(ddplug_plugin_group *g, const char *reason) {
  (void)g;
  (void)reason;
  return DDPLUG_E_INTERNAL;
}
static int no_start(ddplug_plugin_group *g, const ddplug_coll_args *a, ddplug_plugin_request **r) {
  (void)g;
  (void)a;
  (void)r;
  return DDPLUG_E_INTERNAL;
}
static int no_p2p(ddplug_plugin_group *g, const ddplug_p2p_args *a, ddplug_plugin_request **r) {
  (void)g;
  (void)a;
  (void)r;
  return DDPLUG_E_INTERNAL;
}
static int no_wait(ddplug_plugin_group *g, ddplug_plugin_request *r, int64_t t) {
  (void)g;
  (void)r;
  (void)t;
  return DDPLUG_E_INTERNAL;
}
static int no_test(ddplug_plugin_group *g, ddplug_plugin_request *r, int32_t *d) {
  (void)g;
  (void)r;
  (void)d;
  return DDPLUG_E_INTERNAL;
}
static void no_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  (void)g;
  (void)r;
}

static const ddplug_plugin ddmpi_unavailable_table = {
    DDMPI_TABLE_IDENTITY,
    .group_create = unavailable_create,
    .group_destroy = no_group_destroy,
    .group_abort = no_group_abort,
    .collective_start = no_start,
    .request_wait = no_wait,
    .request_test = no_test,
    .request_free = no_free,
    .p2p_start = no_p2p,
    .bootstrap_world = unavailable_world,
    .bootstrap_broadcast = unavailable_bcast,
};

/* The backend of family, from the directory this file is in. */
static const ddplug_plugin *load_backend(const ddmpi_library *lib, uint32_t host_abi,
                                         char *why, size_t cap) {
  Dl_info info;
  char dir[PATH_MAX] = ".";
  if (dladdr((void *)&load_backend, &info) && info.dli_fname) {
    char *real = realpath(info.dli_fname, NULL);
    if (real) {
      char *slash = strrchr(real, '/');
      if (slash) *slash = '\0';
      snprintf(dir, sizeof dir, "%s", real);
      free(real);
    }
  }
  const char *fam = ddmpi_family_name(lib->family);
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/libddplug-mpi-%s.so", dir, fam);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    int absent = access(path, F_OK) != 0;
    snprintf(why, cap,
             "plugin mpi: %s (%s, %s) is %s, but its backend does not load: %s%s",
             lib->path, lib->version[0] ? lib->version : "version unknown", lib->how,
             lib->family == DDMPI_FAMILY_OPENMPI ? "Open MPI" : "of the MPICH family",
             e ? e : path,
             absent ? "; this ddplug was built without that family's headers (pkg-config "
                      "ompi-c / mpich at build time): rebuild with them, or set "
                      "DDPLUG_MPI_LIBRARY / DDPLUG_MPI_ABI to use the other family"
                    : "");
    return NULL;
  }
  ddmpi_backend_entry_fn entry = (ddmpi_backend_entry_fn)dlsym(h, DDMPI_BACKEND_SYMBOL);
  const ddplug_plugin *t = entry ? entry(host_abi, lib) : NULL;
  if (!t) {
    snprintf(why, cap, "plugin mpi: %s is not a backend for this runtime (no %s, or it refused "
             "plugin ABI %u.%u)", path, DDMPI_BACKEND_SYMBOL,
             DDPLUG_VERSION_MAJOR_OF(host_abi), DDPLUG_VERSION_MINOR_OF(host_abi));
    return NULL; /* h stays loaded: it may have run constructors */
  }
  return t;
}

/* The plugin's only exported symbol. Returns the backend's table for an
 * ABI 1.x runtime from 1.4 on (it bootstraps the world through 1.4's
 * slots), the unavailable table when no MPI or no backend loads, NULL for
 * an older runtime or another major (the loader names the mismatch). */
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  if (DDPLUG_VERSION_MAJOR_OF(host_abi_version) != DDPLUG_PLUGIN_ABI_MAJOR ||
      DDPLUG_VERSION_MINOR_OF(host_abi_version) < 4)
    return NULL;
  pthread_mutex_lock(&g_mu);
  const ddplug_plugin *t = g_backend_table;
  if (!t) {
    ddmpi_library lib;
    char why[sizeof g_why];
    if (ddmpi_detect(&lib, why, sizeof why) == 0) t = load_backend(&lib, host_abi_version, why,
                                                                    sizeof why);
    if (t) g_backend_table = t;
    else snprintf(g_why, sizeof g_why, "%s", why);
  }
  pthread_mutex_unlock(&g_mu);
  return t ? t : &ddmpi_unavailable_table;
}
