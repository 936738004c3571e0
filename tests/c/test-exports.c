/* test-exports.c — the export list is exactly what we intend (DT_LINK_SHARED):
 * every function declared DDPLUG_API in ddplug.h is exported by libddplug.so
 * under the version node DDPLUG_1.0, and nothing else is; every plugin we
 * build exports its entry point and nothing else. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

#define MAX_SYMS 512

typedef struct symset {
  char *name[MAX_SYMS];
  int n;
} symset;

static void add(symset *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->name[i], name)) return;
  if (s->n < MAX_SYMS) s->name[s->n++] = strdup(name);
}

static int has(const symset *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->name[i], name)) return 1;
  return 0;
}

static void free_set(symset *s) {
  for (int i = 0; i < s->n; i++) free(s->name[i]);
  s->n = 0;
}

/* Declared: "DDPLUG_API <type> <name>(" possibly across a line break. */
static void declared(symset *out, const char *header) {
  FILE *f = fopen(header, "r");
  CHECK_MSG(f != NULL, "cannot open %s", header);
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  regex_t re;
  CHECK(regcomp(&re, "DDPLUG_API[^;(]*[^a-z_0-9](ddplug_[a-z_0-9]+)[[:space:]]*\\(",
                REG_EXTENDED) == 0);
  const char *p = text;
  regmatch_t m[2];
  while (regexec(&re, p, 2, m, 0) == 0) {
    char name[128];
    int len = (int)(m[1].rm_eo - m[1].rm_so);
    snprintf(name, sizeof name, "%.*s", len, p + m[1].rm_so);
    add(out, name);
    p += m[0].rm_eo;
  }
  regfree(&re);
}

/* Exported: defined dynamic symbols, with their version node: in
 * require_version (a NULL-terminated list of nodes) when given; a symbol
 * declared in store.h (experimental) must be in DDPLUG_EXPERIMENTAL, every
 * other in DDPLUG_1.0. */
static symset g_experimental;
static void exported(symset *out, const char *lib, int require_version) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only --with-symbol-versions '%s'", lib);
  FILE *p = popen(cmd, "r");
  CHECK_MSG(p != NULL, "cannot run nm");
  char line[1024];
  while (fgets(line, sizeof line, p)) {
    char addr[64], type[8], sym[512];
    if (sscanf(line, "%63s %7s %511s", addr, type, sym) != 3) continue;
    if (!strcmp(type, "A")) continue; /* the version node itself */
    char *at = strchr(sym, '@');
    if (at) *at = '\0';
    if (require_version) {
      const char *node = has(&g_experimental, sym) ? "DDPLUG_EXPERIMENTAL" : "DDPLUG_1.0";
      CHECK_MSG(at && strstr(at + 1, node), "%s: symbol %s is not in the version node %s", lib,
                sym, node);
    }
    add(out, sym);
  }
  pclose(p);
}

TEST(library_exports_exactly_the_declared_api) {
  char header[4096], store[4096], lib[4096];
  snprintf(header, sizeof header, "%s/abi/include/ddplug/ddplug.h", dt_source_dir());
  snprintf(store, sizeof store, "%s/abi/include/ddplug/store.h", dt_source_dir());
  snprintf(lib, sizeof lib, "%s/lib/libddplug.so", dt_build_dir());
  symset decl = {.n = 0}, exp = {.n = 0};
  declared(&decl, header);
  declared(&g_experimental, store);
  CHECK_MSG(g_experimental.n >= 10, "only %d declarations found in %s", g_experimental.n, store);
  for (int i = 0; i < g_experimental.n; i++) {
    CHECK_MSG(!has(&decl, g_experimental.name[i]), "%s is declared in both headers",
              g_experimental.name[i]);
    add(&decl, g_experimental.name[i]);
  }
  exported(&exp, lib, 1);
  CHECK_MSG(decl.n > 50, "only %d declarations found in %s", decl.n, header);
  for (int i = 0; i < decl.n; i++)
    CHECK_MSG(has(&exp, decl.name[i]), "%s is declared DDPLUG_API but not exported by %s",
              decl.name[i], lib);
  for (int i = 0; i < exp.n; i++)
    CHECK_MSG(has(&decl, exp.name[i]), "%s is exported by %s but not declared DDPLUG_API",
              exp.name[i], lib);
  free_set(&decl);
  free_set(&exp);
  free_set(&g_experimental);
}

TEST(plugins_export_only_their_entry_point) {
  const char *plugins[] = {"example", "cpu", "nccl"};
  int checked = 0;
  for (size_t i = 0; i < sizeof plugins / sizeof plugins[0]; i++) {
    char lib[4096];
    snprintf(lib, sizeof lib, "%s/lib/libddplug-%s.so", dt_build_dir(), plugins[i]);
    FILE *f = fopen(lib, "r");
    if (!f) continue; /* not built in this configuration (nccl without CUDA) */
    fclose(f);
    symset exp = {.n = 0};
    exported(&exp, lib, 0);
    for (int k = 0; k < exp.n; k++)
      CHECK_MSG(!strncmp(exp.name[k], "ddplug_plugin_entry_v", 21),
                "plugin %s exports '%s'; a plugin exports only ddplug_plugin_entry_v<N>", lib,
                exp.name[k]);
    CHECK_MSG(has(&exp, "ddplug_plugin_entry_v1"), "%s does not export ddplug_plugin_entry_v1", lib);
    free_set(&exp);
    checked++;
  }
  CHECK(checked >= 1);
}

TEST(soname_is_versioned) {
  char cmd[4200], lib[4096];
  snprintf(lib, sizeof lib, "%s/lib/libddplug.so", dt_build_dir());
  snprintf(cmd, sizeof cmd, "readelf -d '%s' | grep -q 'Library soname: \\[libddplug.so.1\\]'", lib);
  CHECK_MSG(system(cmd) == 0, "%s has no SONAME libddplug.so.1", lib);
}

/* The test hooks (allocation failure injection, plugins kept mapped) are
 * compiled into the test build of the library only, never the shipped one. */
TEST(shipped_library_has_no_test_hooks) {
  char lib[4096];
  snprintf(lib, sizeof lib, "%s/lib/libddplug.so", dt_build_dir());
  FILE *f = fopen(lib, "rb");
  CHECK_MSG(f != NULL, "cannot open %s", lib);
  static char buf[16 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  CHECK(n > 0 && n < sizeof buf);
  static const char *const hooks[] = {"DDPLUG_TEST_FAIL_ALLOC", "DDPLUG_KEEP_PLUGINS_LOADED"};
  for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
    CHECK_MSG(memmem(buf, n, hooks[i], strlen(hooks[i])) == NULL, "%s contains the test hook %s", lib,
              hooks[i]);
}
