/*
 * entry.c — a family backend's table and its one exported symbol,
 * ddmpi_backend_entry_v1 (frontend.h): the front end, libddplug-mpi.so,
 * calls it once it has loaded the family's libmpi, and returns the table
 * as the plugin's. The same source is compiled against each family's
 * mpi.h (libddplug-mpi-openmpi.so, libddplug-mpi-mpich.so).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The description names the library this process loaded (`ddplug info mpi`
 * shows it), and group_shrink depends on that library and the job, so the
 * table is filled once, at the first entry. */
static char ddmpi_description[sizeof(DDMPI_DESCRIPTION) + 4096 + 256 + 64];

static ddplug_plugin ddmpi_table = {
    DDMPI_TABLE_IDENTITY,
    .group_create = ddmpi_group_create,
    .group_destroy = ddmpi_group_destroy,
    .group_abort = ddmpi_group_abort,
    .collective_start = ddmpi_collective_start,
    .request_wait = ddmpi_request_wait,
    .request_test = ddmpi_request_test,
    .request_free = ddmpi_request_free,
    /* sampler slots NULL: the runtime's default samplers serve */
    .p2p_start = ddmpi_p2p_start,
    .bootstrap_world = ddmpi_bootstrap_world,
    .bootstrap_broadcast = ddmpi_bootstrap_broadcast,
};

__attribute__((visibility("default"))) const ddplug_plugin *ddmpi_backend_entry_v1(
    uint32_t host_abi_version, const ddmpi_library *lib);
__attribute__((visibility("default"))) const ddplug_plugin *ddmpi_backend_entry_v1(
    uint32_t host_abi_version, const ddmpi_library *lib) {
  if (DDPLUG_VERSION_MAJOR_OF(host_abi_version) != DDPLUG_PLUGIN_ABI_MAJOR ||
      DDPLUG_VERSION_MINOR_OF(host_abi_version) < 4 || !lib)
    return NULL;
  pthread_mutex_lock(&ddmpi_p.mu);
  if (!ddmpi_p.lib.struct_size) {
    memcpy(&ddmpi_p.lib, lib, lib->struct_size < sizeof ddmpi_p.lib ? lib->struct_size
                                                                     : sizeof ddmpi_p.lib);
    /* What was loaded first: hosts show at most 255 characters. */
    snprintf(ddmpi_description, sizeof ddmpi_description, "on %s (%s). %s",
             ddmpi_p.lib.version[0] ? ddmpi_p.lib.version : "MPI", ddmpi_p.lib.path,
             DDMPI_DESCRIPTION);
    ddmpi_table.description = ddmpi_description;
    /* In-place shrink only where it can work (shrink.c); elsewhere the
     * runtime re-forms the group with group_create. */
    char why[256];
    if (ddmpi_shrink_usable(why, sizeof why)) {
      ddmpi_table.group_shrink = ddmpi_group_shrink;
      ddmpi_table.caps |= DDPLUG_CAP_SHRINK;
    }
  }
  pthread_mutex_unlock(&ddmpi_p.mu);
  return &ddmpi_table;
}
