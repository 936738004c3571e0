/*
 * detect.h — the front end's choice of an MPI library (detect.c) and the
 * front end itself (frontend.c): libddplug-mpi.so, which depends on no MPI.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_MPI_DETECT_H
#define DDPLUG_MPI_DETECT_H

#include <stddef.h>

#include "frontend.h"

/* Find, classify and load (RTLD_GLOBAL) the MPI library this process should
 * use (detect.c says in which order). 0 and *out filled; -1 with a sentence
 * in err naming every library tried and why it was not taken, and what to
 * do. Loads libraries; never initialises MPI. */
int ddmpi_detect(ddmpi_library *out, char *err, size_t cap);
/* "openmpi", "mpich" ("none" otherwise). Static. */
const char *ddmpi_family_name(int family);

#endif /* DDPLUG_MPI_DETECT_H */
