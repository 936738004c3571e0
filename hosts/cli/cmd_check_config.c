/* cmd_check_config.c — `ddplug check-config [--json] FILE|-`: validate a
 * config through the public API only. Valid: exit 0 and one summary line on
 * stdout (or, with --json, the effective config as canonical JSON). Invalid:
 * exit 1 and exactly the library's error line on stderr
 * ("FILE:LINE:COLUMN: message" or "FILE: key.path: message"). Usage errors
 * exit 2. "-" reads the config from standard input (named "<stdin>").
 * plugin_options belong to the plugin: they are checked the way ddplug_open
 * checks them, by the plugin while it creates its group, in a run of this
 * process alone (the runtime checks them against the plugin's declared
 * options first). `ddplug check-config --schema` prints the config's JSON
 * Schema. */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ddplug/ddplug.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ddplug check-config [--json] FILE\n"
          "       ddplug check-config --schema\n"
          "  Validate the ddplug config FILE ('-' reads standard input).\n"
          "  Prints one summary line and exits 0 if it is valid; prints the\n"
          "  error (FILE:LINE:COLUMN or FILE: key.path) and exits 1 if not.\n"
          "  --json    print the effective config (defaults filled in) instead\n"
          "  --schema  print the config's JSON Schema (every key, its type,\n"
          "            range, default and meaning) and exit\n");
}

/* A growing text buffer for the summary line. */
typedef struct line {
  char text[2048];
  size_t len;
} line;

static void add(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(line *l, const char *fmt, ...) {
  if (l->len >= sizeof l->text) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
  va_end(ap);
  if (n > 0) l->len += (size_t)n;
  if (l->len >= sizeof l->text) l->len = sizeof l->text - 1;
}

/* Readers for keys the summary shows. They cannot fail on a loaded config
 * except for optional keys, which the callers ask about with *_opt. */
static int get_int_opt(const ddplug_config *cfg, const char *path, int64_t *v) {
  return ddplug_config_get_int(cfg, path, v) == DDPLUG_OK;
}
static int64_t get_int(const ddplug_config *cfg, const char *path) {
  int64_t v = 0;
  get_int_opt(cfg, path, &v);
  return v;
}
static double get_double(const ddplug_config *cfg, const char *path) {
  double v = 0;
  ddplug_config_get_double(cfg, path, &v);
  return v;
}
static int get_bool(const ddplug_config *cfg, const char *path) {
  int v = 0;
  ddplug_config_get_bool(cfg, path, &v);
  return v;
}
/* Copies the string at path into buf ("" if absent); returns 1 if set. */
static int get_str(const ddplug_config *cfg, const char *path, char *buf,
                   size_t cap) {
  char *s = NULL;
  buf[0] = '\0';
  if (ddplug_config_get_string(cfg, path, &s) != DDPLUG_OK) return 0;
  snprintf(buf, cap, "%s", s);
  ddplug_free(s);
  return 1;
}

static void summarize_sampler(const ddplug_config *cfg, line *l) {
  char kind[32], pad[32], bounds[1024];
  get_str(cfg, "sampler.kind", kind, sizeof kind);
  add(l, ", sampler %s (%s, seed %" PRId64 ", drop_last %s", kind,
      get_bool(cfg, "sampler.shuffle") ? "shuffle" : "no shuffle",
      get_int(cfg, "sampler.seed"), get_bool(cfg, "sampler.drop_last") ? "on" : "off");
  if (!strcmp(kind, "bucket")) {
    get_str(cfg, "sampler.bucket.pad", pad, sizeof pad);
    add(l, ", batch_size %" PRId64 " per rank", get_int(cfg, "sampler.bucket.batch_size"));
    if (get_str(cfg, "sampler.bucket.boundaries", bounds, sizeof bounds))
      add(l, ", boundaries %s", bounds);
    else
      add(l, ", %" PRId64 " quantile buckets", get_int(cfg, "sampler.bucket.num_buckets"));
    add(l, ", pad %s", pad);
  }
  add(l, ")");
}

static void summarize(const ddplug_config *cfg, line *l) {
  char buf[1024], buf2[64];
  int64_t v, v2;
  get_str(cfg, "plugin", buf, sizeof buf);
  add(l, "plugin %s", buf);
  if (get_int_opt(cfg, "world.rank", &v) && get_int_opt(cfg, "world.world_size", &v2))
    add(l, ", world rank %" PRId64 " of %" PRId64, v, v2);
  summarize_sampler(cfg, l);
  get_str(cfg, "data_split.owner", buf, sizeof buf);
  add(l, ", data_split owner %s", buf);
  get_str(cfg, "data_split.streams", buf, sizeof buf);
  if (strcmp(buf, "{}") != 0) add(l, ", streams %s", buf);
  get_str(cfg, "data_split.audit", buf, sizeof buf);
  get_str(cfg, "data_split.on_violation", buf2, sizeof buf2);
  add(l, ", audit %s (on violation: %s)", buf, buf2);
  add(l, ", rendezvous");
  if (get_str(cfg, "rendezvous.addr", buf, sizeof buf)) add(l, " %s", buf);
  if (get_int_opt(cfg, "rendezvous.port", &v)) add(l, " port %" PRId64, v);
  if (get_bool(cfg, "rendezvous.external")) add(l, " (external)");
  add(l, " timeout %g s, collective timeout %g s",
      get_double(cfg, "rendezvous.timeout_s"), get_double(cfg, "timeouts.collective_s"));
  add(l, ", gradients %g MiB buckets%s", get_double(cfg, "gradients.bucket_mb"),
      get_bool(cfg, "gradients.average") ? " (average)" : " (sum)");
  uint64_t hash = 0;
  ddplug_config_hash(cfg, &hash);
  add(l, ", hash %016" PRIx64, hash);
}

static void discard_log(void *user, int level, int rank, const char *text) {
  (void)user, (void)level, (void)rank, (void)text;
}

/* plugin_options are the plugin's to check, and ddplug_open has it check
 * them while creating its group: open a run of this one process with a copy
 * of the config whose world is this process alone and whose store is on
 * loopback, and close it. A CONFIG failure is the config's: the sentence
 * goes to *why, and 1 is returned. Anything else (the plugin is not
 * installed here, no GPU for it) means the options could not be checked on
 * this machine: *note says so, and 0 is returned. */
static int check_plugin_options(const ddplug_config *cfg, char *why, size_t why_cap,
                                char *note, size_t note_cap) {
  char *text = NULL;
  json_t *j = NULL;
  ddplug_config *alone = NULL;
  ddplug_context *ctx = NULL;
  why[0] = note[0] = '\0';
  if (ddplug_config_to_json(cfg, &text) != DDPLUG_OK || !(j = json_loads(text, 0, NULL))) {
    snprintf(note, note_cap, "plugin_options not checked (out of memory)");
    ddplug_free(text);
    return 0;
  }
  ddplug_free(text);
  json_object_del(j, "rendezvous");
  json_object_set_new(j, "world", json_pack("{s:i, s:i}", "rank", 0, "world_size", 1));
  json_object_set_new(j, "log_level", json_string("off"));
  char *alone_text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  ddplug_log_set_callback(discard_log, NULL);
  int rc = alone_text ? ddplug_config_load_string(alone_text, "<check>", &alone)
                      : DDPLUG_E_NO_MEMORY;
  free(alone_text);
  ddplug_open_options opts = DDPLUG_OPEN_OPTIONS_INIT;
  opts.framework = "ddplug check-config";
  opts.timeout_ms = 10000;
  if (rc == DDPLUG_OK) rc = ddplug_open(alone, &opts, &ctx);
  if (rc == DDPLUG_E_CONFIG)
    snprintf(why, why_cap, "%s", ddplug_last_error());
  else if (rc != DDPLUG_OK)
    snprintf(note, note_cap, "plugin_options not checked here (%s: %s)",
             ddplug_status_name(rc), ddplug_last_error());
  if (ctx) ddplug_close(ctx);
  ddplug_config_free(alone);
  ddplug_log_set_callback(NULL, NULL);
  return rc == DDPLUG_E_CONFIG;
}

/* Read all of standard input; NULL on failure (message printed). */
static char *read_stdin(void) {
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    if (n + 1 >= cap) {
      char *bigger = realloc(buf, cap * 2);
      if (!bigger) break;
      buf = bigger;
      cap *= 2;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, stdin);
    n += r;
    if (r == 0) {
      if (ferror(stdin)) break;
      buf[n] = '\0';
      if (strlen(buf) != n) {
        fprintf(stderr, "<stdin>: contains a NUL byte: not a JSON config\n");
        free(buf);
        return NULL;
      }
      return buf;
    }
  }
  fprintf(stderr, "<stdin>: cannot read standard input\n");
  free(buf);
  return NULL;
}

int ddplug_cmd_check_config(int argc, char **argv) {
  int json = 0;
  const char *file = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--schema")) {
      char *text = NULL;
      if (ddplug_config_schema(&text) != DDPLUG_OK) {
        fprintf(stderr, "ddplug check-config: %s\n", ddplug_last_error());
        return 1;
      }
      printf("%s\n", text);
      ddplug_free(text);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      json = 1;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "ddplug check-config: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else if (file) {
      fprintf(stderr, "ddplug check-config: one FILE at a time ('%s', '%s')\n", file,
              argv[i]);
      usage(stderr);
      return 2;
    } else {
      file = argv[i];
    }
  }
  if (!file) {
    fprintf(stderr, "ddplug check-config: no FILE given\n");
    usage(stderr);
    return 2;
  }
  ddplug_config *cfg = NULL;
  int rc;
  if (!strcmp(file, "-")) {
    char *text = read_stdin();
    if (!text) return 1;
    file = "<stdin>";
    rc = ddplug_config_load_string(text, file, &cfg);
    free(text);
  } else {
    rc = ddplug_config_load_file(file, &cfg);
  }
  if (rc != DDPLUG_OK) {
    fprintf(stderr, "%s\n", ddplug_last_error());
    return 1;
  }
  char why[2048], note[2048];
  if (check_plugin_options(cfg, why, sizeof why, note, sizeof note)) {
    fprintf(stderr, "%s: %s\n", file, why);
    ddplug_config_free(cfg);
    return 1;
  }
  if (json) {
    char *text = NULL;
    rc = ddplug_config_to_json(cfg, &text);
    if (rc == DDPLUG_OK) printf("%s\n", text);
    else fprintf(stderr, "%s\n", ddplug_last_error());
    ddplug_free(text);
  } else {
    line l = {.len = 0};
    summarize(cfg, &l);
    if (note[0]) add(&l, ", %s", note);
    printf("%s: ok: %s\n", file, l.text);
  }
  ddplug_config_free(cfg);
  return rc == DDPLUG_OK ? 0 : 1;
}
