/* cmd_conformance.c — `ddplug conformance [-n RANKS] [-o JSON] [-v] NAME|PATH`:
 * runs the suite a backend author runs against a plugin (the suite is
 * plugins/conformance/; its conformance.h lists its files and what each
 * checks). This file reads the arguments, makes the plan, runs the
 * scenarios and prints one row per check (PASS, FAIL with the rank and the
 * reason, SKIP with the reason), then one row per slot of the plugin's
 * table (declared, and exercised by which checks), then "conformance: P
 * passed, F failed, S skipped". Exit 0 when nothing failed, 1 otherwise, 2
 * on usage. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "conformance.h"

/* The scenarios' names, comma-separated, for the usage text and errors. */
static const char *scenario_names(void) {
  static char names[512];
  if (!names[0])
    for (int i = 0; i < cf_scenario_count; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
               cf_scenarios[i].name);
  return names;
}

/* Whether `name` is in the comma-separated `list`. */
static int listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

/* Every name of the comma-separated `list` is a scenario, or say which is not. */
static int check_scenarios(const char *list) {
  for (const char *p = list;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    int known = 0;
    for (int i = 0; i < cf_scenario_count && !known; i++)
      known = strlen(cf_scenarios[i].name) == len && !strncmp(cf_scenarios[i].name, p, len);
    if (!known) {
      fprintf(stderr, "ddplug conformance: --scenario: no scenario '%.*s'; the scenarios are: %s\n",
              (int)len, p, scenario_names());
      return 0;
    }
    if (!end) return 1;
    p = end + 1;
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ddplug conformance [-n RANKS] [-o JSON] [-t SEC] [-v] [--shared-gpu]\n"
          "                          [--launcher CMD] [-s SCENARIO[,SCENARIO...]] NAME|PATH\n"
          "  Runs the conformance suite against a plugin: its table (entry point, name,\n"
          "  capabilities, masks), the group's life cycle, every advertised dtype x op in\n"
          "  place and out of place, async requests, abort from another thread, a killed\n"
          "  rank, mismatched collectives, a failure in group_create, the sampler slots.\n"
          "  Each scenario runs RANKS local processes of its own. Checks that need what\n"
          "  the plugin does not declare (or this machine lacks, e.g. a GPU) are skipped\n"
          "  with the reason. Exit status 0 when no check failed, 1 otherwise.\n"
          "  NAME|PATH       a plugin name (looked up like `ddplug info`) or a file\n"
          "  -n, --ranks N   ranks per scenario (default 2; 2 to 16)\n"
          "  -o, --options J the plugin_options every rank gets (JSON object, default {})\n"
          "  -t, --timeout S the collective timeout of the failure scenarios (default 40);\n"
          "                  an abort, a lost peer or a failed group_create must end the\n"
          "                  others' calls within a third of it\n"
          "  -v, --verbose   also print the library's log lines of every rank\n"
          "  --launcher CMD  start each scenario's ranks with CMD -n RANKS ... instead of forking\n"
          "                  them (a plugin whose ranks must be one MPI job: --launcher\n"
          "                  \"mpirun --oversubscribe\", \"mpiexec\", \"srun\"); the ranks open\n"
          "                  without a world or rendezvous, so the plugin's bootstrap runs\n"
          "  -s, --scenario S run only these scenarios (comma-separated; the table and the\n"
          "                  group's life cycle always run), of:\n                  %s\n"
          "  --shared-gpu    let ranks share a GPU (checks.duplicate_gpu = \"warn\"), for a\n"
          "                  device plugin on a machine with fewer GPUs than RANKS (nccl:\n"
          "                  NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1)\n",
          scenario_names());
}

/* The fault wrapper plugin, relative to libddplug: <libdir>/ddplug/
 * conformance/ when installed, <build>/lib/conformance/ in the build tree. */
static void find_shim(char *out, size_t cap) {
  out[0] = '\0';
  Dl_info dl;
  if (!dladdr((void *)&ddplug_version_string, &dl) || !dl.dli_fname) return;
  char *real = realpath(dl.dli_fname, NULL);
  if (!real) return;
  char *slash = strrchr(real, '/');
  if (slash) *slash = '\0';
  static const char *const subdirs[] = {"ddplug/conformance", "conformance"};
  for (size_t i = 0; i < sizeof subdirs / sizeof subdirs[0]; i++) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s/%s", real, subdirs[i], CF_SHIM_FILE);
    size_t len = strlen(path);
    if (access(path, R_OK) == 0 && len < cap) {
      memcpy(out, path, len + 1);
      break;
    }
  }
  free(real);
}

static void print_row(const cf_row *row) {
  const char *v = row->verdict == CF_PASS ? "PASS" : row->verdict == CF_SKIP ? "SKIP" : "FAIL";
  printf("  %s  %s\n", v, row->title);
  if (row->verdict != CF_PASS && row->detail[0]) printf("        %s\n", row->detail);
}

int ddplug_cmd_conformance(int argc, char **argv) {
  cf_plan *plan = calloc(1, sizeof *plan);
  if (!plan) return 1;
  plan->world = 2;
  plan->options = "{}";
  plan->fault_timeout_s = 40;
  plan->free_port = ddplug_cmd_free_port;
  const char *what = NULL, *worker = NULL, *rows_dir = NULL, *only = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      free(plan);
      return 0;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--ranks")) {
      char *end;
      long n = v ? strtol(v, &end, 10) : 0;
      if (!v || *end || n < 2 || n > 16) {
        fprintf(stderr, "ddplug conformance: %s needs a number of ranks from 2 to 16, got '%s'\n",
                a, v ? v : "");
        free(plan);
        return 2;
      }
      plan->world = (int)n;
      i++;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--timeout")) {
      char *end;
      long t = v ? strtol(v, &end, 10) : 0;
      if (!v || *end || t < 3 || t > 3600) {
        fprintf(stderr, "ddplug conformance: %s needs seconds from 3 to 3600, got '%s'\n", a,
                v ? v : "");
        free(plan);
        return 2;
      }
      plan->fault_timeout_s = (int)t;
      i++;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--options")) {
      if (!v) {
        fprintf(stderr, "ddplug conformance: %s needs a JSON object\n", a);
        free(plan);
        return 2;
      }
      plan->options = v;
      i++;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
      plan->verbose = 1;
    } else if (!strcmp(a, "--shared-gpu")) {
      plan->shared_gpu = 1;
    } else if (!strcmp(a, "-s") || !strcmp(a, "--scenario")) {
      if (!v || !*v || !check_scenarios(v)) {
        if (!v || !*v)
          fprintf(stderr, "ddplug conformance: %s needs scenario names: %s\n", a, scenario_names());
        free(plan);
        return 2;
      }
      only = v;
      i++;
    } else if (!strcmp(a, "--launcher") || !strcmp(a, "--worker") || !strcmp(a, "--rows")) {
      if (!v || !*v) {
        fprintf(stderr, "ddplug conformance: %s needs a value\n", a);
        free(plan);
        return 2;
      }
      if (!strcmp(a, "--launcher")) plan->launcher = v;
      else if (!strcmp(a, "--worker")) worker = v;
      else rows_dir = v;
      i++;
    } else if (a[0] == '-' || what) {
      fprintf(stderr, "ddplug conformance: unexpected argument '%s'\n", a);
      usage(stderr);
      free(plan);
      return 2;
    } else {
      what = a;
    }
  }
  if (!what) {
    usage(stderr);
    free(plan);
    return 2;
  }
  /* The options must be a valid plugin_options value (the config says why). */
  char probe[8192];
  snprintf(probe, sizeof probe, "{\"plugin_options\": %s}", plan->options);
  ddplug_config *cfg = NULL;
  if (ddplug_config_load_string(probe, "-o", &cfg) != DDPLUG_OK) {
    fprintf(stderr, "ddplug conformance: -o: %s\n", ddplug_last_error());
    free(plan);
    return 2;
  }
  ddplug_config_free(cfg);
  if (!plan->verbose) ddplug_log_set_level(DDPLUG_LOG_OFF);

  plan->info = (ddplug_plugin_info)DDPLUG_PLUGIN_INFO_INIT;
  int loaded = ddplug_plugin_inspect(what, &plan->info) == DDPLUG_OK;
  char load_error[1024];
  snprintf(load_error, sizeof load_error, "%s", ddplug_last_error());
  if (!loaded && !strchr(what, '/')) {
    fprintf(stderr, "ddplug conformance: %s\n", load_error);
    free(plan);
    return 1;
  }
  char *real = realpath(loaded ? plan->info.path : what, NULL);
  snprintf(plan->path, sizeof plan->path, "%s", real ? real : (loaded ? plan->info.path : what));
  free(real);
  find_shim(plan->shim, sizeof plan->shim);
  char *self = realpath("/proc/self/exe", NULL);
  snprintf(plan->self, sizeof plan->self, "%s", self ? self : argv[0]);
  free(self);
  if (worker) { /* one rank of a launched scenario (run.c) */
    plan->launched = 1;
    int rc = rows_dir ? cf_run_worker(plan, worker, rows_dir) : 2;
    free(plan);
    return rc;
  }

  if (loaded)
    printf("ddplug conformance: plugin %s %s (plugin ABI %u.%u), %s, %d ranks per scenario\n\n",
           plan->info.name, plan->info.version,
           DDPLUG_VERSION_MAJOR_OF(plan->info.plugin_abi_version),
           DDPLUG_VERSION_MINOR_OF(plan->info.plugin_abi_version), plan->path, plan->world);
  else
    printf("ddplug conformance: %s (the runtime refuses it: %s)\n\n", plan->path, load_error);
  fflush(stdout);

  cf_results res = {0};
  int group_ok = 1;
  char group_why[1200] = "";
  for (int i = 0; i < cf_scenario_count; i++) {
    const cf_scenario *sc = &cf_scenarios[i];
    if (!loaded && !sc->single) continue;
    if (only && !listed(only, sc->name) && strcmp(sc->name, "table") &&
        strcmp(sc->name, "lifecycle"))
      continue;
    if (sc->needs_group && !group_ok) {
      char id[64];
      snprintf(id, sizeof id, "%s.skipped", sc->name);
      char title[96];
      snprintf(title, sizeof title, "scenario '%s'", sc->name);
      cf_add_row(&res, id, 0, CF_SKIP, title, group_why, -1);
      continue;
    }
    int before = res.n;
    cf_run_scenario(plan, sc, &res);
    for (int k = before; k < res.n; k++) print_row(&res.rows[k]);
    fflush(stdout);
    if (!strcmp(sc->name, "lifecycle")) {
      const cf_row *g = cf_find_row(&res, "group.create");
      if (!g || g->verdict != CF_PASS) {
        group_ok = 0;
        snprintf(group_why, sizeof group_why, "needs a group, and none could be created here%s%s",
                 g && g->detail[0] ? ": " : "", g ? g->detail : "");
      }
    }
  }
  if (!loaded) {
    cf_add_row(&res, "table.runtime", 0, CF_FAIL, "the runtime loads the plugin", load_error, -1);
    print_row(&res.rows[res.n - 1]);
  }
  if (!group_ok) {
    int skipped = 0;
    for (int k = 0; k < res.n; k++) {
      size_t len = strlen(res.rows[k].id);
      skipped += len > 8 && !strcmp(res.rows[k].id + len - 8, ".skipped");
    }
    printf("  SKIP  %d scenarios that need a group\n        %s\n", skipped, group_why);
  }
  if (loaded) {
    /* Declared options (plugin ABI 1.3): the loader checked every
     * declaration (name, type, bounds, a default that passes its own rules)
     * when it loaded the plugin; the runs above used the declared defaults. */
    char *options = NULL;
    if (ddplug_plugin_options(what, &options) != DDPLUG_OK)
      cf_add_row(&res, "table.options", 0, CF_FAIL, "option declarations", ddplug_last_error(), -1);
    else if (!strcmp(options, "null"))
      cf_add_row(&res, "table.options", 0, CF_SKIP, "option declarations",
                 "none: the plugin reads plugin_options itself, unchecked by the runtime", -1);
    else {
      int n = 0;
      for (const char *p = options; (p = strstr(p, "\"name\":")) != NULL; p++) n++;
      char detail[128];
      snprintf(detail, sizeof detail, "%d declared; the runtime accepts every declaration", n);
      cf_add_row(&res, "table.options", 0, CF_PASS, "option declarations", detail, -1);
    }
    ddplug_free(options);
    print_row(&res.rows[res.n - 1]);
  }
  int before_slots = res.n;
  /* With --scenario, the slot rows would judge slots by a part of the suite. */
  if (!only) cf_slot_rows(&res, group_ok ? NULL : "no group could be created here");
  if (res.n > before_slots) printf("\nslots (this suite knows plugin ABI %d.%d):\n",
                                   DDPLUG_PLUGIN_ABI_MAJOR, DDPLUG_PLUGIN_ABI_MINOR);
  for (int k = before_slots; k < res.n; k++) print_row(&res.rows[k]);
  int pass = 0, fail = 0, skip = 0;
  for (int k = 0; k < res.n; k++) {
    if (res.rows[k].verdict == CF_PASS) pass++;
    else if (res.rows[k].verdict == CF_FAIL) fail++;
    else skip++;
  }
  printf("\nconformance: %d passed, %d failed, %d skipped\n", pass, fail, skip);
  free(res.rows);
  free(plan);
  return fail ? 1 : 0;
}
