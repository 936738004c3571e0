/* test-loader.c — finding, loading and negotiating plugins: a plugin built
 * against the older 1.0 table, wrong major, too new, too old, no entry
 * symbol, a shared object that is not a plugin, a file that is not a shared
 * object, a path that does not exist, a table too small, a missing
 * mandatory slot, partial sampler slots, partial registered-memory slots
 * and the registered-memory capability without its slots. */
#include <dlfcn.h>
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "run/context.h"

static char g_path[4096];
static const char *fixture(const char *name) {
  snprintf(g_path, sizeof g_path, "%s/lib/test-plugins/libddplug-%s.so",
           dt_build_dir(), name);
  return g_path;
}

TEST(older_table_is_lifted_to_latest) {
  ddplug__plugin *p = NULL;
  CHECK_OK(ddplug__plugin_load("oldtable", &p));
  CHECK_EQ_INT(p->built_abi, DDPLUG_MAKE_VERSION(1, 0));
  CHECK_EQ_INT(p->built_size, DDPLUG_PLUGIN_SIZE_1_0);
  CHECK_EQ_INT(p->table.struct_size, sizeof(ddplug_plugin));
  /* Slots the 1.0 plugin did not know read as NULL (runtime defaults). */
  CHECK(p->table.sampler_create == NULL);
  CHECK(p->table.sampler_destroy == NULL);
  CHECK(p->table.collective_start != NULL);
  CHECK_EQ_STR(p->table.name, "oldtable");
  ddplug__plugin_unload(p);

  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_plugin_inspect("oldtable", &info));
  CHECK_EQ_INT(info.plugin_abi_version, DDPLUG_MAKE_VERSION(1, 0));
  CHECK_EQ_INT(info.has_sampler, 0);
  CHECK_EQ_STR(info.version, "0.0.1");
  CHECK_CONTAINS(info.path, "/lib/test-plugins/libddplug-oldtable.so");
}

TEST(info_struct_from_an_older_host_is_not_overrun) {
  /* A host built when ddplug_plugin_info ended before 'caps' ... */
  unsigned char buf[sizeof(ddplug_plugin_info) + 16];
  memset(buf, 0xAB, sizeof buf);
  ddplug_plugin_info *info = (ddplug_plugin_info *)buf;
  info->struct_size = (uint32_t)offsetof(ddplug_plugin_info, name);
  info->abi_version = DDPLUG_ABI_VERSION;
  CHECK_OK(ddplug_plugin_inspect("oldtable", info));
  CHECK_EQ_INT(info->struct_size, offsetof(ddplug_plugin_info, name));
  CHECK_EQ_INT(buf[offsetof(ddplug_plugin_info, name)], 0xAB);
}

TEST(by_path) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_plugin_inspect(fixture("oldtable"), &info));
  CHECK_EQ_STR(info.name, "oldtable");
}

TEST(not_found_lists_every_path_searched) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  setenv("DDPLUG_PLUGIN_PATH", "/nonexistent-a:/nonexistent-b", 1);
  CHECK_STATUS(ddplug_plugin_inspect("nosuch", &info), DDPLUG_E_NOT_FOUND);
  const char *e = ddplug_last_error();
  CHECK_CONTAINS(e, "plugin 'nosuch' not found; searched: ");
  CHECK_CONTAINS(e, "/nonexistent-a/libddplug-nosuch.so (no such file)");
  CHECK_CONTAINS(e, "/nonexistent-b/libddplug-nosuch.so (no such file)");
  CHECK_CONTAINS(e, DDPLUG_PLUGIN_INSTALL_DIR "/libddplug-nosuch.so");
  CHECK_CONTAINS(e, "Set DDPLUG_PLUGIN_PATH");
}

/* A name close to an installed plugin's, or the CPU plugin's former name,
 * gets a "did you mean". */
TEST(not_found_suggests_the_closest_plugin_name) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/lib", dt_build_dir());
  setenv("DDPLUG_PLUGIN_PATH", dir, 1);
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("cpuu", &info), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "plugin 'cpuu' not found; searched: ");
  CHECK_CONTAINS(ddplug_last_error(), " Did you mean \"cpu\"? Set DDPLUG_PLUGIN_PATH");
  CHECK_STATUS(ddplug_plugin_inspect("host", &info), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "Did you mean \"cpu\"?");
  CHECK_STATUS(ddplug_plugin_inspect("zzzzzz", &info), DDPLUG_E_NOT_FOUND);
  CHECK(strstr(ddplug_last_error(), "Did you mean") == NULL);
}

/* DDPLUG_PLUGIN_PATH is searched in order, first match wins, entries that
 * do not exist are passed over ("test-plugins-alt" holds an "example" of
 * another version). */
TEST(plugin_path_is_searched_in_order) {
  char alt[4096], main_dir[4096], path[8300];
  snprintf(alt, sizeof alt, "%s/lib/test-plugins-alt", dt_build_dir());
  snprintf(main_dir, sizeof main_dir, "%s/lib", dt_build_dir());
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  snprintf(path, sizeof path, "/no/such/dir:%s:%s", alt, main_dir);
  setenv("DDPLUG_PLUGIN_PATH", path, 1);
  CHECK_OK(ddplug_plugin_inspect("example", &info));
  CHECK_EQ_STR(info.version, "0.0.9-test");
  CHECK_CONTAINS(info.path, "test-plugins-alt/libddplug-example.so");
  snprintf(path, sizeof path, "%s:%s", main_dir, alt);
  setenv("DDPLUG_PLUGIN_PATH", path, 1);
  info = (ddplug_plugin_info)DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_plugin_inspect("example", &info));
  CHECK(strcmp(info.version, "0.0.9-test") != 0);
  CHECK_CONTAINS(info.path, "/lib/libddplug-example.so");
}

TEST(path_that_does_not_exist) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("/no/such/libddplug-x.so", &info),
               DDPLUG_E_NOT_FOUND);
  CHECK_EQ_STR(ddplug_last_error(),
               "plugin file '/no/such/libddplug-x.so' does not exist (No such "
               "file or directory)");
}

/* A relative path resolves against the working directory, and the error
 * names that directory. */
TEST(relative_path_names_the_working_directory) {
  char cwd[4096];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("./no-such-dir/libddplug-x.so", &info),
               DDPLUG_E_NOT_FOUND);
  const char *e = ddplug_last_error();
  CHECK_CONTAINS(e, "plugin file './no-such-dir/libddplug-x.so' does not exist");
  CHECK_CONTAINS(e, "a relative path resolves against the working directory, ");
  CHECK_CONTAINS(e, cwd);
}

static char g_warning[2048];
static void keep_warning(void *user, int level, int rank, const char *line) {
  (void)user;
  (void)rank;
  if (level == DDPLUG_LOG_WARN) snprintf(g_warning, sizeof g_warning, "%s", line);
}

/* The name in the file name (libddplug-<name>.so) and the table's name must
 * agree; loading a file whose names differ warns, by name or by path. */
TEST(file_name_and_table_name_must_agree) {
  char dir[] = "/tmp/ddplug-loader-XXXXXX", copy[4200], cmd[8600];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(copy, sizeof copy, "%s/libddplug-renamed.so", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", fixture("oldtable"), copy);
  CHECK_EQ_INT(system(cmd), 0);
  ddplug_log_set_callback(keep_warning, NULL);
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  g_warning[0] = '\0';
  CHECK_OK(ddplug_plugin_inspect(fixture("oldtable"), &info));
  CHECK_EQ_STR(g_warning, ""); /* names agree: silent */
  CHECK_OK(ddplug_plugin_inspect(copy, &info));
  CHECK_CONTAINS(g_warning, "calls itself 'oldtable', not 'renamed'");
  CHECK_CONTAINS(g_warning, "rename the file libddplug-oldtable.so");
  g_warning[0] = '\0';
  setenv("DDPLUG_PLUGIN_PATH", dir, 1);
  CHECK_OK(ddplug_plugin_inspect("renamed", &info));
  CHECK_CONTAINS(g_warning, "calls itself 'oldtable', not 'renamed'");
  ddplug_log_set_callback(NULL, NULL);
  unlink(copy);
  rmdir(dir);
}

TEST(shared_object_without_entry_is_not_a_plugin) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect(fixture("nosymbol"), &info),
               DDPLUG_E_ABI_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(), "is not a ddplug plugin: it does not "
                                      "export ddplug_plugin_entry_v1");
  /* A real shared library that has nothing to do with ddplug: jansson,
   * wherever this system keeps it (found through a symbol we link). */
  Dl_info where;
  CHECK(dladdr((void *)json_object, &where) != 0 && where.dli_fname != NULL);
  CHECK_CONTAINS(where.dli_fname, "libjansson");
  CHECK_STATUS(ddplug_plugin_inspect(where.dli_fname, &info), DDPLUG_E_ABI_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(), "' is not a ddplug plugin");
  CHECK_CONTAINS(ddplug_last_error(), "libjansson");
}

TEST(file_that_is_not_a_shared_object) {
  const char *path = dt_temp_file(".so", "this is a text file, not an ELF shared object; the loader must say so clearly\n");
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect(path, &info), DDPLUG_E_SYSTEM);
  CHECK_CONTAINS(ddplug_last_error(), "cannot load plugin '");
  CHECK_CONTAINS(ddplug_last_error(), "invalid ELF header");
}

TEST(major_too_new) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("toonew", &info), DDPLUG_E_ABI_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(),
                 "was built for plugin ABI 2 (it exports "
                 "ddplug_plugin_entry_v2), which is newer than this libddplug");
}

TEST(major_too_old) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("tooold", &info), DDPLUG_E_ABI_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(),
                 "was built for plugin ABI 0 (it exports "
                 "ddplug_plugin_entry_v0), which is older than the oldest");
}

TEST(wrong_major_in_table) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("wrongmajor", &info), DDPLUG_E_ABI_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(), "its table says plugin ABI 2.0");
}

TEST(table_too_small) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("toosmall", &info), DDPLUG_E_ABI_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(), "its table is too small (16 bytes)");
}

TEST(missing_mandatory_slot) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("missingslot", &info),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "mandatory slot 'request_wait' is NULL");
}

TEST(partial_sampler_slots) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("partialsampler", &info),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "fills some sampler slots but not sampler_set_epoch, "
                 "sampler_next, sampler_seek, sampler_length, sampler_destroy");
}

TEST(partial_registered_memory_slots) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("partialmem", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "fills the registered-memory slot(s) mem_alloc but not mem_free, "
                 "mem_query: provide all three or none");
  CHECK_STATUS(ddplug_plugin_inspect("memcap", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "declares DDPLUG_CAP_REGISTERED_MEMORY but its mem_alloc, mem_free "
                 "and mem_query slots are NULL");
}

TEST(new_slots_agree_with_their_capabilities) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("p2pcap", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "declares DDPLUG_CAP_P2P but its p2p_start slot is NULL");
  CHECK_STATUS(ddplug_plugin_inspect("halfboot", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "fills bootstrap_world but not bootstrap_broadcast: provide both "
                 "bootstrap slots or neither");
  CHECK_STATUS(ddplug_plugin_inspect("shrinkslot", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(),
                 "does not declare DDPLUG_CAP_SHRINK but its group_shrink slot is filled");
}

TEST(entry_refuses) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("refuses", &info), DDPLUG_E_ABI_MISMATCH);
  char want[64];
  snprintf(want, sizeof want, "refused to serve plugin ABI %d.%d", DDPLUG_PLUGIN_ABI_MAJOR,
           DDPLUG_PLUGIN_ABI_MINOR);
  CHECK_CONTAINS(ddplug_last_error(), want);
}

TEST(bad_names_and_arguments) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_STATUS(ddplug_plugin_inspect("", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_plugin_inspect("a b", &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "plugin name 'a b' is not valid");
  CHECK_STATUS(ddplug_plugin_inspect(NULL, &info), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_plugin_inspect("oldtable", NULL), DDPLUG_E_INVALID_ARGUMENT);
  ddplug_plugin_info zero;
  memset(&zero, 0, sizeof zero);
  CHECK_STATUS(ddplug_plugin_inspect("oldtable", &zero), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "DDPLUG_PLUGIN_INFO_INIT");
}

TEST(load_failures_do_not_leak) {
  /* Every failing kind, many times: the harness's fd check and valgrind/ASan
   * runs catch a dlopen handle or allocation kept on a failure path. */
  const char *names[] = {"toonew", "tooold", "wrongmajor", "toosmall",
                         "missingslot", "partialsampler", "refuses", "nosuch",
                         "partialmem", "memcap", "p2pcap", "halfboot", "shrinkslot"};
  for (int round = 0; round < 50; round++)
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      ddplug__plugin *p = NULL;
      CHECK(ddplug__plugin_load(names[i], &p) != DDPLUG_OK);
      CHECK(p == NULL);
    }
}
