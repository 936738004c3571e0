/* loader.c — find a plugin, dlopen it, negotiate the ABI, lift its table to
 * the latest layout.
 *
 * Search for a name ("cpu" → libddplug-cpu.so), in order:
 *   1. each directory of DDPLUG_PLUGIN_PATH (':'-separated);
 *   2. <dir>/ddplug, where <dir> holds libddplug itself (the plugin
 *      directory of an install, wherever it was moved: `cmake --install
 *      --prefix`, the Python wheel's ddplug/_lib);
 *   3. the configured prefix's plugin directory (DDPLUG_PLUGIN_INSTALL_DIR;
 *      empty in the wheel), when it is not the directory of step 2;
 *   4. <dir> itself (the build tree, where plugins sit beside the library).
 * Anything containing '/' is a path and is loaded as is; a relative path
 * resolves against the working directory (the error says which one).
 *
 * Negotiation: the runtime speaks plugin ABI major 1 (DDPLUG_PLUGIN_ABI_*).
 * It looks up ddplug_plugin_entry_v1; if absent, it looks for entry points of
 * other majors to say precisely why the plugin cannot be used (too new, too
 * old, or not a plugin at all). The table returned is copied: min(struct_size,
 * sizeof(ddplug_plugin)) bytes into a zeroed latest-layout struct, so slots a
 * plugin built against an older minor did not know are NULL and take the
 * runtime's defaults (NCCL's parseCommConfig pattern).
 * SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plugin/plugin.h"

#ifndef DDPLUG_PLUGIN_INSTALL_DIR
#define DDPLUG_PLUGIN_INSTALL_DIR ""
#endif
#ifndef DDPLUG_PLUGIN_RELATIVE_DIR
#define DDPLUG_PLUGIN_RELATIVE_DIR "ddplug"
#endif

/* Highest and lowest majors we look for when explaining a refusal. */
#define PROBE_MAJOR_MAX 9

static int valid_name(const char *name) {
  if (!*name || strlen(name) > 64) return 0;
  for (const char *p = name; *p; p++) {
    char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return 0;
  }
  return name[0] != '.';
}

/* Directory holding libddplug (or the executable it is linked into), with
 * "..", "." and symlinks resolved: a program whose RPATH is $ORIGIN/../lib
 * loads it as <bin>/../lib/libddplug.so.1. */
static int self_dir(char *buf, size_t cap) {
  Dl_info info;
  if (!dladdr((void *)&ddplug__plugin_load, &info) || !info.dli_fname) return 0;
  char *real = realpath(info.dli_fname, NULL);
  const char *file = real ? real : info.dli_fname;
  const char *slash = strrchr(file, '/');
  size_t n = slash ? (size_t)(slash - file) : 0;
  int ok = slash && n + 1 <= cap;
  if (ok) {
    memcpy(buf, file, n);
    buf[n] = '\0';
  }
  free(real);
  return ok;
}

/* The plugin directory relative to libddplug (<self>/ddplug); 0 if unknown. */
static int relative_dir(const char *self, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/%s", self, DDPLUG_PLUGIN_RELATIVE_DIR);
  return n > 0 && (size_t)n < cap;
}

/* Whether two directory names denote the same directory. */
static int same_dir(const char *a, const char *b) {
  if (!strcmp(a, b)) return 1;
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

typedef struct searchlog {
  char text[DDPLUG__ERRMSG_MAX];
  size_t len;
  int count;
} searchlog;

static void searchlog_add(searchlog *log, const char *path, const char *why) {
  if (log->len >= sizeof log->text - 1) return;
  int n = snprintf(log->text + log->len, sizeof log->text - log->len, "%s%s (%s)",
                   log->count ? ", " : "", path, why);
  if (n > 0) log->len = DDPLUG__MIN(log->len + (size_t)n, sizeof log->text - 1);
  log->count++;
}

/* Try dir/libddplug-<name>.so; 1 found (path written), 0 not. */
static int try_dir(const char *dir, const char *name, char *path, size_t cap,
                   searchlog *log) {
  if (!*dir) return 0;
  int n = snprintf(path, cap, "%s/libddplug-%s.so", dir, name);
  if (n < 0 || (size_t)n >= cap) return 0;
  struct stat st;
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) return 1;
  searchlog_add(log, path, errno == ENOENT ? "no such file" : strerror(errno));
  return 0;
}

/* Offer every plugin name found in dir (libddplug-<name>.so) to s. */
static void offer_dir(ddplug__suggest *s, const char *dir) {
  DIR *d = dir && *dir ? opendir(dir) : NULL;
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len > 13 && !strncmp(e->d_name, "libddplug-", 10) &&
        !strcmp(e->d_name + len - 3, ".so"))
      ddplug__suggest_offer(s, e->d_name + 10, len - 13);
  }
  closedir(d);
}

/* The plugin name closest to name among those in the search directories,
 * or a built-in plugin's former name ("host" is now "cpu"); NULL if none.
 * The result lives in static storage of this thread. */
static const char *suggest_name(const char *name, const char *path_env, const char *self) {
  static const char *const renamed[][2] = {{"host", "cpu"}};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(renamed); i++)
    if (!strcmp(name, renamed[i][0])) return renamed[i][1];
  static _Thread_local ddplug__suggest s;
  ddplug__suggest_init(&s, name);
  char *copy = path_env && *path_env ? ddplug__strdup(path_env) : NULL;
  char *save = NULL;
  for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save))
    offer_dir(&s, d);
  ddplug__free(copy);
  char rel[4096];
  if (self && relative_dir(self, rel, sizeof rel)) offer_dir(&s, rel);
  offer_dir(&s, DDPLUG_PLUGIN_INSTALL_DIR);
  offer_dir(&s, self);
  return ddplug__suggest_best(&s);
}

static int locate(const char *name, char *path, size_t cap) {
  if (strchr(name, '/')) {
    struct stat st;
    if (stat(name, &st) != 0) {
      int err = errno;
      char cwd[4096];
      if (name[0] != '/' && getcwd(cwd, sizeof cwd))
        return ddplug__err(DDPLUG_E_NOT_FOUND,
                           "plugin file '%s' does not exist (%s): a relative "
                           "path resolves against the working directory, %s; "
                           "give an absolute path, or a plugin name without "
                           "'/' to search the plugin directories",
                           name, strerror(err), cwd);
      return ddplug__err(DDPLUG_E_NOT_FOUND,
                         "plugin file '%s' does not exist (%s)", name,
                         strerror(err));
    }
    if (!S_ISREG(st.st_mode))
      return ddplug__err(DDPLUG_E_NOT_FOUND,
                         "plugin path '%s' is not a regular file", name);
    ddplug__strlcpy(path, name, cap);
    return DDPLUG_OK;
  }
  if (!valid_name(name))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin name '%s' is not valid: use letters, digits, "
                       "'_', '-', '.' (or give a path containing '/')",
                       name);
  searchlog log = {.len = 0, .count = 0};
  log.text[0] = '\0';
  const char *env = getenv("DDPLUG_PLUGIN_PATH");
  if (env && *env) {
    char *copy = ddplug__strdup(env);
    if (!copy) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
      if (try_dir(dir, name, path, cap, &log)) {
        ddplug__free(copy);
        return DDPLUG_OK;
      }
    }
    ddplug__free(copy);
  }
  char dir[4096], rel[4096];
  int have_self = self_dir(dir, sizeof dir);
  int have_rel = have_self && relative_dir(dir, rel, sizeof rel);
  if (have_rel && try_dir(rel, name, path, cap, &log)) return DDPLUG_OK;
  if (!(have_rel && same_dir(rel, DDPLUG_PLUGIN_INSTALL_DIR)) &&
      try_dir(DDPLUG_PLUGIN_INSTALL_DIR, name, path, cap, &log))
    return DDPLUG_OK;
  if (have_self && try_dir(dir, name, path, cap, &log)) return DDPLUG_OK;
  char hint[160] = "";
  const char *best = suggest_name(name, env, have_self ? dir : NULL);
  if (best) snprintf(hint, sizeof hint, " Did you mean \"%s\"?", best);
  return ddplug__err(DDPLUG_E_NOT_FOUND,
                     "plugin '%s' not found; searched: %s.%s Set "
                     "DDPLUG_PLUGIN_PATH to the directory holding "
                     "libddplug-%s.so, or give the plugin's path",
                     name, log.count ? log.text : "(nothing)", hint, name);
}

int ddplug__plugin_file_name(const char *path, char *name, size_t cap) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t len = strlen(base);
  if (len <= 13 || strncmp(base, "libddplug-", 10) != 0 || strcmp(base + len - 3, ".so") != 0)
    return 0;
  if (len - 13 + 1 > cap) return 0;
  memcpy(name, base + 10, len - 13);
  name[len - 13] = '\0';
  return 1;
}

/* Explain why a shared object without ddplug_plugin_entry_v1 is refused. */
static int explain_missing_entry(void *dl, const char *path) {
  for (int major = PROBE_MAJOR_MAX; major >= 0; major--) {
    if (major == DDPLUG_PLUGIN_ABI_MAJOR) continue;
    char sym[64];
    snprintf(sym, sizeof sym, "ddplug_plugin_entry_v%d", major);
    if (dlsym(dl, sym)) {
      if (major > DDPLUG_PLUGIN_ABI_MAJOR)
        return ddplug__err(
            DDPLUG_E_ABI_MISMATCH,
            "plugin '%s' was built for plugin ABI %d (it exports %s), which "
            "is newer than this libddplug %s speaks (ABI %d): use a newer "
            "libddplug, or rebuild the plugin against ABI %d headers",
            path, major, sym, DDPLUG_LIB_VERSION_STRING,
            DDPLUG_PLUGIN_ABI_MAJOR, DDPLUG_PLUGIN_ABI_MAJOR);
      return ddplug__err(
          DDPLUG_E_ABI_MISMATCH,
          "plugin '%s' was built for plugin ABI %d (it exports %s), which is "
          "older than the oldest this libddplug %s supports (ABI %d): "
          "rebuild the plugin against the current headers",
          path, major, sym, DDPLUG_LIB_VERSION_STRING, DDPLUG_PLUGIN_ABI_MAJOR);
    }
  }
  return ddplug__err(DDPLUG_E_ABI_MISMATCH,
                     "'%s' is not a ddplug plugin: it does not export %s "
                     "(a plugin exports ddplug_plugin_entry_v<MAJOR>; see "
                     "abi/include/ddplug/plugin.h)",
                     path, DDPLUG_PLUGIN_ENTRY_SYMBOL);
}

typedef struct slot_name {
  size_t offset;
  const char *name;
} slot_name;

#define SLOT(f) {offsetof(ddplug_plugin, f), #f}
static const slot_name mandatory_slots[] = {
    SLOT(group_create),  SLOT(group_destroy), SLOT(collective_start),
    SLOT(request_wait),  SLOT(request_test),  SLOT(request_free),
};
static const slot_name sampler_slots[] = {
    SLOT(sampler_create), SLOT(sampler_set_epoch), SLOT(sampler_next),
    SLOT(sampler_seek),   SLOT(sampler_length),    SLOT(sampler_destroy),
};
static const slot_name mem_slots[] = {
    SLOT(mem_alloc), SLOT(mem_free), SLOT(mem_query),
};
static const slot_name bootstrap_slots[] = {
    SLOT(bootstrap_world), SLOT(bootstrap_broadcast),
};
/* An optional slot and the capability bit that announces it: both or neither. */
static const struct {
  slot_name slot;
  uint64_t cap;
  const char *cap_name;
} cap_slots[] = {
    {SLOT(p2p_start), DDPLUG_CAP_P2P, "DDPLUG_CAP_P2P"},
    {SLOT(bootstrap_world), DDPLUG_CAP_BOOTSTRAP, "DDPLUG_CAP_BOOTSTRAP"},
    {SLOT(group_shrink), DDPLUG_CAP_SHRINK, "DDPLUG_CAP_SHRINK"},
};
#undef SLOT

static int slot_set(const ddplug_plugin *t, size_t offset) {
  void *fn;
  memcpy(&fn, (const char *)t + offset, sizeof fn);
  return fn != NULL;
}

/* Check a lifted table; path names the file in messages. */
static int validate_table(const ddplug_plugin *t, const char *path) {
  if (!t->name || !*t->name)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin '%s' has no name in its table", path);
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(mandatory_slots); i++)
    if (!slot_set(t, mandatory_slots[i].offset))
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "plugin '%s' (%s): mandatory slot '%s' is NULL",
                         t->name, path, mandatory_slots[i].name);
  int n_sampler = 0;
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(sampler_slots); i++)
    n_sampler += slot_set(t, sampler_slots[i].offset);
  if (n_sampler != 0 && n_sampler != (int)DDPLUG__ARRAY_LEN(sampler_slots)) {
    char missing[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < DDPLUG__ARRAY_LEN(sampler_slots); i++)
      if (!slot_set(t, sampler_slots[i].offset) && len < sizeof missing)
        len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s",
                                len ? ", " : "", sampler_slots[i].name);
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin '%s' (%s) fills some sampler slots but not "
                       "%s: provide all of them or none",
                       t->name, path, missing);
  }
  int n_mem = 0;
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(mem_slots); i++)
    n_mem += slot_set(t, mem_slots[i].offset);
  if (n_mem != 0 && n_mem != (int)DDPLUG__ARRAY_LEN(mem_slots)) {
    char have[256] = "", lack[256] = "";
    size_t lh = 0, ll = 0;
    for (size_t i = 0; i < DDPLUG__ARRAY_LEN(mem_slots); i++) {
      if (slot_set(t, mem_slots[i].offset))
        lh += (size_t)snprintf(have + lh, sizeof have - lh, "%s%s", lh ? ", " : "",
                               mem_slots[i].name);
      else
        ll += (size_t)snprintf(lack + ll, sizeof lack - ll, "%s%s", ll ? ", " : "",
                               mem_slots[i].name);
    }
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin '%s' (%s) fills the registered-memory slot(s) %s "
                       "but not %s: provide all three or none",
                       t->name, path, have, lack);
  }
  if (n_mem == 0 && (t->caps & DDPLUG_CAP_REGISTERED_MEMORY))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin '%s' (%s) declares DDPLUG_CAP_REGISTERED_MEMORY but "
                       "its mem_alloc, mem_free and mem_query slots are NULL",
                       t->name, path);
  if (slot_set(t, bootstrap_slots[0].offset) != slot_set(t, bootstrap_slots[1].offset))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin '%s' (%s) fills %s but not %s: provide both bootstrap "
                       "slots or neither",
                       t->name, path,
                       bootstrap_slots[slot_set(t, bootstrap_slots[0].offset) ? 0 : 1].name,
                       bootstrap_slots[slot_set(t, bootstrap_slots[0].offset) ? 1 : 0].name);
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(cap_slots); i++) {
    int filled = slot_set(t, cap_slots[i].slot.offset);
    if (filled != !!(t->caps & cap_slots[i].cap))
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                         "plugin '%s' (%s) %s %s but its %s slot is %s: set the "
                         "capability exactly when the slot is filled",
                         t->name, path, filled ? "does not declare" : "declares",
                         cap_slots[i].cap_name, cap_slots[i].slot.name,
                         filled ? "filled" : "NULL");
  }
  if ((t->caps & DDPLUG_CAP_P2P_ANY_SOURCE) && !(t->caps & DDPLUG_CAP_P2P))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin '%s' (%s) declares DDPLUG_CAP_P2P_ANY_SOURCE without "
                       "DDPLUG_CAP_P2P (any-source is a kind of receive)",
                       t->name, path);
  return DDPLUG_OK;
}

/* Lift a plugin's table to the latest layout. */
static int lift_table(const ddplug_plugin *src, const char *path,
                      ddplug_plugin *dst) {
  uint32_t major = DDPLUG_VERSION_MAJOR_OF(src->abi_version);
  uint32_t minor = DDPLUG_VERSION_MINOR_OF(src->abi_version);
  if (major != DDPLUG_PLUGIN_ABI_MAJOR)
    return ddplug__err(DDPLUG_E_ABI_MISMATCH,
                       "plugin '%s': its table says plugin ABI %u.%u but it "
                       "was found through %s; this libddplug speaks ABI %d.%d",
                       path, major, minor, DDPLUG_PLUGIN_ENTRY_SYMBOL,
                       DDPLUG_PLUGIN_ABI_MAJOR, DDPLUG_PLUGIN_ABI_MINOR);
  /* The size each minor version's table has: a table must be at least
   * that big, and only that much is read (bytes beyond what its version
   * defines are not slots, whatever struct_size says). */
  size_t need = minor == 0   ? DDPLUG_PLUGIN_SIZE_1_0
                : minor == 1 ? DDPLUG_PLUGIN_SIZE_1_1
                : minor == 2 ? DDPLUG_PLUGIN_SIZE_1_2
                : minor == 3 ? DDPLUG_PLUGIN_SIZE_1_3
                             : DDPLUG_PLUGIN_SIZE_1_4;
  if (src->struct_size < need)
    return ddplug__err(DDPLUG_E_ABI_MISMATCH,
                       "plugin '%s': its table is too small (%u bytes) for "
                       "plugin ABI %u.%u, which needs at least %zu bytes: the "
                       "plugin was built against mismatched headers",
                       path, src->struct_size, major, minor, need);
  size_t known = need;
  memset(dst, 0, sizeof *dst);
  memcpy(dst, src, DDPLUG__MIN((size_t)src->struct_size, known));
  dst->struct_size = sizeof *dst;
  /* Minor versions newer than ours: we use the prefix we understand. */
  int s = validate_table(dst, path);
  if (s == DDPLUG_OK) s = ddplug__options_validate_decls(dst, path);
  return s;
}

int ddplug__plugin_load(const char *name_or_path, ddplug__plugin **out) {
  if (!name_or_path || !out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin name and out must not be NULL");
  char path[4096];
  int s = locate(name_or_path, path, sizeof path);
  if (s != DDPLUG_OK) return s;

  dlerror();
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char *why = dlerror();
    return ddplug__err(DDPLUG_E_SYSTEM,
                       "cannot load plugin '%s': %s (is it a shared object "
                       "for this machine, with its dependencies installed?)",
                       path, why ? why : "unknown dlopen error");
  }
  ddplug_plugin_entry_fn entry;
  void *sym = dlsym(dl, DDPLUG_PLUGIN_ENTRY_SYMBOL);
  if (!sym) {
    s = explain_missing_entry(dl, path);
    dlclose(dl);
    return s;
  }
  memcpy(&entry, &sym, sizeof entry);
  const ddplug_plugin *table = entry(DDPLUG_PLUGIN_ABI_VERSION);
  if (!table) {
    dlclose(dl);
    return ddplug__err(DDPLUG_E_ABI_MISMATCH,
                       "plugin '%s' refused to serve plugin ABI %d.%d (its "
                       "entry point returned NULL): it needs a different "
                       "libddplug",
                       path, DDPLUG_PLUGIN_ABI_MAJOR, DDPLUG_PLUGIN_ABI_MINOR);
  }
  ddplug__plugin *p = ddplug__calloc(1, sizeof *p);
  if (!p) {
    dlclose(dl);
    return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory loading a plugin");
  }
  s = lift_table(table, path, &p->table);
  if (s != DDPLUG_OK) {
    ddplug__free(p);
    dlclose(dl);
    return s;
  }
  p->dl = dl;
  p->built_abi = table->abi_version;
  p->built_size = table->struct_size;
  ddplug__strlcpy(p->path, path, sizeof p->path);
  char file_name[128];
  if (ddplug__plugin_file_name(path, file_name, sizeof file_name) &&
      strcmp(p->table.name, file_name) != 0)
    DDPLUG__WARN("plugin file %s calls itself '%s', not '%s': rename the file "
                 "libddplug-%s.so or the table's name '%s' (a plugin is "
                 "found by the name in its file name; its store keys and the "
                 "startup checks use the table's name)",
                 path, p->table.name, file_name, p->table.name, file_name);
  DDPLUG__DEBUG("loaded plugin %s %s (ABI %u.%u) from %s", p->table.name,
                p->table.version ? p->table.version : "?",
                DDPLUG_VERSION_MAJOR_OF(p->built_abi),
                DDPLUG_VERSION_MINOR_OF(p->built_abi), path);
  *out = p;
  return DDPLUG_OK;
}

void ddplug__plugin_unload(ddplug__plugin *p) {
  if (!p) return;
#ifdef DDPLUG_TEST_HOOKS
  /* Under a leak checker (test build only), keep the object mapped so its
   * symbols resolve in reports. */
  if (getenv("DDPLUG_KEEP_PLUGINS_LOADED")) {
    ddplug__free(p);
    return;
  }
#endif
  dlclose(p->dl);
  ddplug__free(p);
}

void ddplug__plugin_fill_info(const ddplug__plugin *p,
                              ddplug_plugin_info *info) {
  ddplug_plugin_info v;
  memset(&v, 0, sizeof v);
  v.struct_size = sizeof v;
  v.abi_version = DDPLUG_ABI_VERSION;
  v.plugin_abi_version = p->built_abi;
  v.dtype_mask = p->table.dtype_mask;
  v.op_mask = p->table.op_mask;
  v.has_sampler = p->table.sampler_create != NULL;
  v.caps = p->table.caps;
  ddplug__strlcpy(v.name, p->table.name, sizeof v.name);
  ddplug__strlcpy(v.version, p->table.version ? p->table.version : "",
                  sizeof v.version);
  ddplug__strlcpy(v.description,
                  p->table.description ? p->table.description : "",
                  sizeof v.description);
  ddplug__strlcpy(v.path, p->path, sizeof v.path);
  uint32_t keep = info->struct_size;
  memcpy(info, &v, DDPLUG__MIN((size_t)keep, sizeof v));
  info->struct_size = keep;
}
