/*
 * frontend.h — what the mpi plugin's front end (libddplug-mpi.so, no MPI
 * dependency) and a family backend (libddplug-mpi-openmpi.so,
 * libddplug-mpi-mpich.so, each compiled against its family's mpi.h and
 * linked against no libmpi) agree on: the library the front end loaded and
 * the backend's one exported symbol.
 *
 * The front end finds a libmpi (detect.c), loads it RTLD_GLOBAL (the
 * backend's MPI symbols resolve against it), loads the backend of the
 * library's family from its own directory and returns the backend's table
 * as the plugin's. The backend is never a plugin by itself: it exports
 * DDMPI_BACKEND_SYMBOL, not ddplug_plugin_entry_v1.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_MPI_FRONTEND_H
#define DDPLUG_MPI_FRONTEND_H

#include <stdint.h>

#include "ddplug/plugin.h"

/* The MPI ABI families, each with its backend file. */
typedef enum ddmpi_family {
  DDMPI_FAMILY_NONE = 0,
  DDMPI_FAMILY_OPENMPI = 1, /* libmpi.so.40: Open MPI 4.x, 5.x           */
  DDMPI_FAMILY_MPICH = 2    /* libmpi.so.12 / libmpich.so.12: MPICH and its
                               derivatives (Intel MPI, MVAPICH, Cray)     */
} ddmpi_family;

/* The library the front end chose and loaded, handed to the backend. */
typedef struct ddmpi_library {
  uint32_t struct_size;
  int32_t family;          /* ddmpi_family                                 */
  void *handle;            /* dlopen handle of libmpi (RTLD_GLOBAL)        */
  char path[4096];         /* the file, as dladdr resolved it              */
  char version[256];       /* MPI_Get_library_version's first line         */
  char how[256];           /* why this one: "already loaded (mpi4py?)",
                              "DDPLUG_MPI_LIBRARY", "found in /usr/lib/..." */
} ddmpi_library;

/* The backend's entry: its plugin table for host_abi_version, working on
 * lib (copied), or NULL when it cannot serve that runtime. */
typedef const ddplug_plugin *(*ddmpi_backend_entry_fn)(uint32_t host_abi_version,
                                                       const ddmpi_library *lib);
#define DDMPI_BACKEND_SYMBOL "ddmpi_backend_entry_v1"

/* The plugin's identity: the front end's fallback table and every backend
 * table carry the same (name, description, capabilities, masks). */
#define DDMPI_NAME "mpi"
#define DDMPI_CAPS                                                          \
  (DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_ASYNC | DDPLUG_CAP_MULTI_NODE |     \
   DDPLUG_CAP_MISMATCH_CHECK | DDPLUG_CAP_ABORT | DDPLUG_CAP_P2P |         \
   DDPLUG_CAP_P2P_ANY_SOURCE | DDPLUG_CAP_BOOTSTRAP)
#define DDMPI_DTYPE_MASK                                                     \
  (DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32) | DDPLUG_DTYPE_BIT(DDPLUG_FLOAT64) |     \
   DDPLUG_DTYPE_BIT(DDPLUG_FLOAT16) | DDPLUG_DTYPE_BIT(DDPLUG_BFLOAT16) |    \
   DDPLUG_DTYPE_BIT(DDPLUG_INT8) | DDPLUG_DTYPE_BIT(DDPLUG_UINT8) |          \
   DDPLUG_DTYPE_BIT(DDPLUG_INT32) | DDPLUG_DTYPE_BIT(DDPLUG_INT64))
#define DDMPI_OP_MASK                                                        \
  (DDPLUG_OP_BIT(DDPLUG_OP_SUM) | DDPLUG_OP_BIT(DDPLUG_OP_AVG) |             \
   DDPLUG_OP_BIT(DDPLUG_OP_MIN) | DDPLUG_OP_BIT(DDPLUG_OP_MAX) |             \
   DDPLUG_OP_BIT(DDPLUG_OP_PROD) | DDPLUG_OP_BIT(DDPLUG_OP_BOR) |            \
   DDPLUG_OP_BIT(DDPLUG_OP_BAND))
#define DDMPI_DESCRIPTION                                                    \
  "MPI backend (Open MPI or MPICH, picked at load like mpi4py): nonblocking " \
  "collectives under ddplug's deadlines, point-to-point, the world and the "  \
  "store's address from mpirun/srun"

/* The options every table declares (options.c, built into both). */
extern const ddplug_option *const ddmpi_option_decls[];

/* The identity part of every table (designated initialisers). */
#define DDMPI_TABLE_IDENTITY                                                  \
  .struct_size = sizeof(ddplug_plugin), .abi_version = DDPLUG_PLUGIN_ABI_VERSION, \
  .name = DDMPI_NAME, .version = DDPLUG_LIB_VERSION_STRING,                  \
  .description = DDMPI_DESCRIPTION, .caps = DDMPI_CAPS,                      \
  .dtype_mask = DDMPI_DTYPE_MASK, .op_mask = DDMPI_OP_MASK,                  \
  .options = ddmpi_option_decls

#endif /* DDPLUG_MPI_FRONTEND_H */
