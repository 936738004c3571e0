/* test-config.c — the strict JSON configuration: data-driven bad inputs
 * with their exact errors (tests/data/config/bad), good inputs and their
 * canonical round trips (tests/data/config/good, examples/configs), the
 * defaults, the run hash, getters, DDPLUG_CONFIG, file errors, the JSON
 * Schema against the key table, and malloc failure at every allocation. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "harness.h"

/* ---- helpers ------------------------------------------------------------- */

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) dt_fail(__FILE__, __LINE__, "cannot open %s: %s", path, strerror(errno));
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t r;
  while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  buf[n] = '\0';
  return buf;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted paths of the files in dir ending in suffix; returns the count. */
static size_t list_dir(const char *dir, const char *suffix, char ***out) {
  DIR *d = opendir(dir);
  if (!d) dt_fail(__FILE__, __LINE__, "cannot open %s: %s", dir, strerror(errno));
  size_t n = 0, cap = 16, sl = strlen(suffix);
  char **names = malloc(cap * sizeof *names);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len <= sl || strcmp(e->d_name + len - sl, suffix) != 0) continue;
    if (n == cap) names = realloc(names, (cap *= 2) * sizeof *names);
    names[n] = malloc(strlen(dir) + len + 2);
    sprintf(names[n++], "%s/%s", dir, e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  *out = names;
  return n;
}

static void free_list(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

static const char *data_dir(const char *sub) {
  static char buf[4][1024];
  static int slot;
  char *b = buf[slot++ % 4];
  snprintf(b, sizeof buf[0], "%s/tests/data/config/%s", dt_source_dir(), sub);
  return b;
}

static ddplug_config *load(const char *json) {
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string(json, "t.json", &cfg));
  return cfg;
}

static char *to_json(const ddplug_config *cfg) {
  char *text = NULL;
  CHECK_OK(ddplug_config_to_json(cfg, &text));
  return text;
}

static uint64_t hash_of(const char *json) {
  ddplug_config *cfg = load(json);
  uint64_t h = 0;
  CHECK_OK(ddplug_config_hash(cfg, &h));
  ddplug_config_free(cfg);
  return h;
}

/* Replace every "{file}" in tmpl by file; strip one trailing newline. */
static char *expand_err(const char *tmpl, const char *file) {
  size_t cap = strlen(tmpl) * 2 + strlen(file) * 8 + 1, o = 0;
  char *out = malloc(cap);
  for (const char *p = tmpl; *p;) {
    if (!strncmp(p, "{file}", 6)) {
      o += (size_t)sprintf(out + o, "%s", file);
      p += 6;
    } else {
      out[o++] = *p++;
    }
  }
  while (o > 0 && out[o - 1] == '\n') o--;
  out[o] = '\0';
  return out;
}

/* ---- data-driven: bad inputs with their exact errors --------------------- */

TEST(bad_configs_give_their_exact_error) {
  char **files;
  size_t n = list_dir(data_dir("bad"), ".json", &files);
  CHECK_MSG(n >= 30, "only %zu bad cases in %s", n, data_dir("bad"));
  for (size_t i = 0; i < n; i++) {
    char errpath[1200];
    snprintf(errpath, sizeof errpath, "%.*s.err", (int)(strlen(files[i]) - 5), files[i]);
    char *tmpl = read_all(errpath);
    char *want = expand_err(tmpl, files[i]);
    ddplug_config *sentinel = (ddplug_config *)&n, *cfg = sentinel;
    int rc = ddplug_config_load_file(files[i], &cfg);
    CHECK_MSG(rc == DDPLUG_E_CONFIG, "%s: expected CONFIG, got %s (%s)", files[i],
              ddplug_status_name(rc), ddplug_last_error());
    CHECK_MSG(cfg == sentinel, "%s: *out was written on failure", files[i]);
    CHECK_MSG(!strcmp(ddplug_last_error(), want), "%s:\n   got  '%s'\n   want '%s'",
              files[i], ddplug_last_error(), want);
    free(want);
    free(tmpl);
  }
  dt_note("%zu bad configs checked", n);
  free_list(files, n);
}

/* The same text through load_string names the given origin, or "<string>". */
TEST(load_string_errors_name_the_origin) {
  ddplug_config *cfg = NULL;
  CHECK_STATUS(ddplug_config_load_string("{\"a\":1,}", NULL, &cfg), DDPLUG_E_CONFIG);
  CHECK_EQ_STR(ddplug_last_error(), "<string>:1:8: string or '}' expected near '}'");
  CHECK_STATUS(ddplug_config_load_string("{\n  \"sampler\": {\"seed\": -1}\n}", "run.json", &cfg),
               DDPLUG_E_CONFIG);
  CHECK_EQ_STR(ddplug_last_error(),
               "run.json: sampler.seed: expected an integer from 0 to 9007199254740992, got -1");
  CHECK(cfg == NULL);
  CHECK_OK(ddplug_config_load_string("{}", NULL, &cfg));
  CHECK_EQ_STR(ddplug_config_origin(cfg), "<string>");
  ddplug_config_free(cfg);
}

/* ---- good inputs: load, canonical round trip ----------------------------- */

static void round_trip(const char *path) {
  ddplug_config *a = NULL, *b = NULL;
  CHECK_MSG(ddplug_config_load_file(path, &a) == DDPLUG_OK, "%s: %s", path,
            ddplug_last_error());
  CHECK_EQ_STR(ddplug_config_origin(a), path);
  char *ja = to_json(a);
  CHECK_OK(ddplug_config_load_string(ja, "round-trip", &b));
  char *jb = to_json(b);
  CHECK_MSG(!strcmp(ja, jb), "%s: canonical JSON changed on a round trip:\n  %s\n  %s", path,
            ja, jb);
  uint64_t ha, hb;
  CHECK_OK(ddplug_config_hash(a, &ha));
  CHECK_OK(ddplug_config_hash(b, &hb));
  CHECK_EQ_INT(ha, hb);
  /* canonical: no white space outside strings, keys sorted (spot check) */
  CHECK(strncmp(ja, "{\"checks\":", 10) == 0);
  CHECK(strstr(ja, "\n") == NULL && strstr(ja, ": ") == NULL);
  free(ja);
  free(jb);
  ddplug_config_free(a);
  ddplug_config_free(b);
}

TEST(good_configs_load_and_round_trip) {
  char **files;
  size_t n = list_dir(data_dir("good"), ".json", &files);
  CHECK(n >= 5);
  for (size_t i = 0; i < n; i++) round_trip(files[i]);
  free_list(files, n);
  char examples[1024];
  snprintf(examples, sizeof examples, "%s/examples/configs", dt_source_dir());
  n = list_dir(examples, ".json", &files);
  CHECK_EQ_INT(n, 3);
  for (size_t i = 0; i < n; i++) round_trip(files[i]);
  free_list(files, n);
}

/* Every default, pinned: a change here is a change of behaviour. */
TEST(defaults_are_the_documented_ones) {
  static const char want[] =
      "{\"checks\":{\"duplicate_gpu\":\"error\",\"param_sync_every\":0},"
      "\"data_split\":{\"audit\":\"first_epoch\",\"audit_exact_max\":100000000,"
      "\"on_violation\":\"error\",\"owner\":\"auto\",\"streams\":{}},"
      "\"elastic\":{\"min_world_size\":1,\"on_peer_lost\":\"stop\"},"
      "\"gradients\":{\"average\":true,\"bucket_mb\":25,\"first_bucket_mb\":1},"
      "\"log_level\":\"warn\",\"plugin\":\"cpu\",\"plugin_options\":{},"
      "\"rendezvous\":{\"external\":false,\"secret_env\":\"DDPLUG_SECRET\",\"timeout_s\":300},"
      "\"sampler\":{\"bucket\":{\"batch_size\":8,\"num_buckets\":8,\"pad\":\"repeat\"},"
      "\"drop_last\":false,\"kind\":\"distributed\",\"seed\":0,\"shuffle\":true},"
      "\"timeouts\":{\"collective_s\":300,\"run_once_s\":0},\"torch_distributed\":true}";
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_default(&cfg));
  CHECK_EQ_STR(ddplug_config_origin(cfg), "<defaults>");
  char *text = to_json(cfg);
  CHECK_EQ_STR(text, want);
  free(text);
  ddplug_config *empty = load("{}");
  uint64_t h1, h2;
  CHECK_OK(ddplug_config_hash(cfg, &h1));
  CHECK_OK(ddplug_config_hash(empty, &h2));
  CHECK_EQ_INT(h1, h2);
  ddplug_config_free(cfg);
  ddplug_config_free(empty);
}

TEST(absent_optional_keys_stay_absent) {
  ddplug_config *cfg = load("{\"world\": {\"world_size\": 2, \"rank\": 1}}");
  char *text = to_json(cfg);
  CHECK_CONTAINS(text, "\"world\":{\"rank\":1,\"world_size\":2}");
  CHECK(strstr(text, "local_rank") == NULL && strstr(text, "\"addr\"") == NULL &&
        strstr(text, "\"port\"") == NULL && strstr(text, "boundaries") == NULL);
  free(text);
  ddplug_config_free(cfg);
}

/* Numbers: integral values of number keys are stored as integers, so 300
 * and 300.0 are the same config; reals keep their shortest exact form. */
TEST(numbers_are_canonical) {
  ddplug_config *cfg = load(
      "{\"rendezvous\": {\"timeout_s\": 300.0}, \"gradients\": {\"bucket_mb\": 0.1,"
      " \"first_bucket_mb\": 1e0}, \"plugin_options\": {\"x\": 2.50, \"y\": 3.0}}");
  char *text = to_json(cfg);
  CHECK_CONTAINS(text, "\"timeout_s\":300}");
  CHECK_CONTAINS(text, "\"bucket_mb\":0.1,\"first_bucket_mb\":1}");
  CHECK_CONTAINS(text, "\"plugin_options\":{\"x\":2.5,\"y\":3.0}");
  free(text);
  ddplug_config_free(cfg);
  /* a value that needs 17 digits keeps them */
  cfg = load("{\"timeouts\": {\"collective_s\": 0.30000000000000004}}");
  text = to_json(cfg);
  CHECK_CONTAINS(text, "\"collective_s\":0.30000000000000004,");
  free(text);
  ddplug_config_free(cfg);
}

/* ---- hash ----------------------------------------------------------------- */

TEST(hash_ignores_process_keys_and_form_but_not_content) {
  uint64_t base = hash_of("{}");
  /* equal: form, explicit defaults, and what describes the process */
  static const char *const same[] = {
      " { } ",
      "{\"plugin\": \"cpu\", \"sampler\": {\"shuffle\": true, \"seed\": 0}}",
      "{\"sampler\": {\"seed\": 0, \"shuffle\": true}, \"plugin\": \"cpu\"}",
      "{\"rendezvous\": {\"timeout_s\": 300.0}}",
      "{\"log_level\": \"trace\"}",
      "{\"world\": {\"rank\": 3, \"world_size\": 4, \"host_id\": \"n1\"}}",
      "{\"world\": {\"rank\": 0, \"world_size\": 4}, \"log_level\": \"off\"}",
      "{\"data_split\": {\"streams\": {}}, \"plugin_options\": {}}",
  };
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(same); i++)
    CHECK_MSG(hash_of(same[i]) == base, "hash differs for %s", same[i]);
  /* different: anything about the run */
  static const char *const differ[] = {
      "{\"plugin\": \"nccl\"}",
      "{\"sampler\": {\"seed\": 1}}",
      "{\"sampler\": {\"shuffle\": false}}",
      "{\"sampler\": {\"bucket\": {\"boundaries\": [8]}}}",
      "{\"rendezvous\": {\"timeout_s\": 300.5}}",
      "{\"rendezvous\": {\"port\": 29500}}",
      "{\"timeouts\": {\"collective_s\": 299}}",
      "{\"data_split\": {\"streams\": {\"train\": {\"owner\": \"user\"}}}}",
      "{\"data_split\": {\"audit\": \"every_epoch\"}}",
      "{\"gradients\": {\"average\": false}}",
      "{\"checks\": {\"param_sync_every\": 10}}",
      "{\"plugin_options\": {\"device_map\": {}}}",
  };
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(differ); i++) {
    uint64_t h = hash_of(differ[i]);
    CHECK_MSG(h != base, "hash equals the default's for %s", differ[i]);
    for (size_t j = 0; j < i; j++)
      CHECK_MSG(h != hash_of(differ[j]), "%s and %s hash equal", differ[i], differ[j]);
  }
  /* the hash is of the documented text: stable across machines and runs */
  ddplug_config *cfg = load("{\"world\": {\"rank\": 1, \"world_size\": 2}}");
  char *text = to_json(cfg);
  json_t *doc = json_loads(text, 0, NULL);
  json_object_del(doc, "world");
  json_object_del(doc, "log_level");
  char *canon = json_dumps(doc, JSON_SORT_KEYS | JSON_COMPACT);
  uint64_t h;
  CHECK_OK(ddplug_config_hash(cfg, &h));
  CHECK_EQ_INT(h, ddplug__hash64(canon, strlen(canon), 0));
  free(canon);
  json_decref(doc);
  free(text);
  ddplug_config_free(cfg);
}

/* ---- getters -------------------------------------------------------------- */

static const char k_getter_config[] =
    "{\"plugin\": \"./libddplug-x.so\", \"world\": {\"rank\": 1, \"world_size\": 2},"
    " \"rendezvous\": {\"timeout_s\": 12.5, \"port\": 29500},"
    " \"gradients\": {\"bucket_mb\": 50.0},"
    " \"data_split\": {\"streams\": {\"train\": {\"owner\": \"user\"},"
    "                               \"v1.val\": {\"owner\": \"plugin\"}}},"
    " \"sampler\": {\"kind\": \"bucket\", \"bucket\": {\"boundaries\": [16, 64]}},"
    " \"plugin_options\": {\"device_map\": {\"0\": \"cuda:0\"}, \"n\": 2.0, \"f\": 0.5,"
    "                      \"s\": \"x\", \"b\": true}}";

/* Read path with the getter for type ('i', 'd', 'b', 's'); returns its
 * status, renders the value as text into buf on success, and checks that the
 * out value stayed untouched on failure. */
static int read_value(const ddplug_config *cfg, char type, const char *path, char *buf,
                      size_t cap) {
  int64_t i = 77;
  double d = 77;
  int b = 77, rc;
  char *s = NULL;
  switch (type) {
    case 'i': rc = ddplug_config_get_int(cfg, path, &i); snprintf(buf, cap, "%lld", (long long)i); break;
    case 'd': rc = ddplug_config_get_double(cfg, path, &d); snprintf(buf, cap, "%g", d); break;
    case 'b': rc = ddplug_config_get_bool(cfg, path, &b); snprintf(buf, cap, "%d", b); break;
    default:
      rc = ddplug_config_get_string(cfg, path, &s);
      snprintf(buf, cap, "%s", s ? s : "(null)");
      ddplug_free(s);
  }
  if (rc != DDPLUG_OK) CHECK(i == 77 && d == 77 && b == 77 && s == NULL);
  return rc;
}

TEST(getters_read_typed_values) {
  static const struct {
    char type;
    const char *path, *want;
  } reads[] = {
      {'i', "sampler.bucket.batch_size", "8"},
      {'i', "world.rank", "1"},
      {'i', "gradients.bucket_mb", "50"}, /* a number key with an integral value */
      {'d', "rendezvous.timeout_s", "12.5"},
      {'d', "rendezvous.port", "29500"}, /* an integer as a double */
      {'b', "sampler.shuffle", "1"},
      {'s', "plugin", "./libddplug-x.so"},
      {'s', "sampler.kind", "bucket"}, /* an enum */
      {'s', "sampler.bucket.boundaries", "[16,64]"},
      {'s', "plugin_options", "{\"b\":true,\"device_map\":{\"0\":\"cuda:0\"},\"f\":0.5,\"n\":2.0,\"s\":\"x\"}"},
      {'s', "rendezvous", "{\"external\":false,\"port\":29500,\"secret_env\":\"DDPLUG_SECRET\",\"timeout_s\":12.5}"},
      /* streams, also one whose name has a dot */
      {'s', "data_split.streams.train.owner", "user"},
      {'s', "data_split.streams.v1.val.owner", "plugin"},
      {'s', "data_split.streams.v1.val", "{\"owner\":\"plugin\"}"},
      /* inside plugin_options, the value decides */
      {'s', "plugin_options.device_map.0", "cuda:0"},
      {'i', "plugin_options.n", "2"},
      {'b', "plugin_options.b", "1"},
  };
  ddplug_config *cfg = load(k_getter_config);
  for (size_t r = 0; r < DDPLUG__ARRAY_LEN(reads); r++) {
    char got[512];
    CHECK_MSG(read_value(cfg, reads[r].type, reads[r].path, got, sizeof got) == DDPLUG_OK,
              "%s: %s", reads[r].path, ddplug_last_error());
    CHECK_MSG(!strcmp(got, reads[r].want), "%s: got '%s', want '%s'", reads[r].path, got,
              reads[r].want);
  }
  CHECK_EQ_STR(ddplug__config_plugin_options(cfg),
               "{\"b\":true,\"device_map\":{\"0\":\"cuda:0\"},\"f\":0.5,\"n\":2.0,\"s\":\"x\"}");
  ddplug_config_free(cfg);
}

TEST(getters_explain_what_is_wrong) {
  static const struct {
    char type;
    const char *path;
    int status;
    const char *message; /* a part of the last error */
  } cases[] = {
      /* unknown paths, with a suggestion where one is close */
      {'i', "sampler.sed", DDPLUG_E_NOT_FOUND,
       "t.json: sampler.sed: no such config key (did you mean 'sampler.seed'?)"},
      {'i', "seed", DDPLUG_E_NOT_FOUND, "seed: no such config key (did you mean 'sampler.seed'?)"},
      {'i', "nothing.like.it", DDPLUG_E_NOT_FOUND,
       "t.json: nothing.like.it: no such config key (see `ddplug check-config --schema` for every key)"},
      {'i', "sampler.seed.x", DDPLUG_E_NOT_FOUND, "no such config key"},
      {'i', "sampler.", DDPLUG_E_NOT_FOUND, "no such config key"},
      {'i', "", DDPLUG_E_NOT_FOUND, "no such config key"},
      {'s', "data_split.streams.train.ownr", DDPLUG_E_NOT_FOUND,
       "t.json: data_split.streams.train.ownr: no such config key (did you mean 'owner'?)"},
      {'s', "data_split.streams.bad name", DDPLUG_E_NOT_FOUND, "no such config key"},
      /* optional and absent */
      {'s', "rendezvous.addr", DDPLUG_E_NOT_FOUND,
       "t.json: rendezvous.addr: not set (an optional key absent from the config)"},
      {'i', "world.local_rank", DDPLUG_E_NOT_FOUND, "world.local_rank: not set"},
      {'s', "data_split.streams.test.owner", DDPLUG_E_NOT_FOUND, "not set"},
      {'s', "data_split.streams.test", DDPLUG_E_NOT_FOUND, "not set"},
      {'i', "plugin_options.missing", DDPLUG_E_NOT_FOUND, "plugin_options.missing: not set"},
      /* wrong type */
      {'b', "sampler.seed", DDPLUG_E_INVALID_ARGUMENT,
       "ddplug_config_get_bool: t.json: sampler.seed holds an integer (read it with "
       "ddplug_config_get_int)"},
      {'i', "plugin", DDPLUG_E_INVALID_ARGUMENT,
       "holds a string (read it with ddplug_config_get_string)"},
      {'s', "sampler.shuffle", DDPLUG_E_INVALID_ARGUMENT, "holds a boolean"},
      {'d', "sampler", DDPLUG_E_INVALID_ARGUMENT, "holds an object"},
      {'i', "rendezvous.timeout_s", DDPLUG_E_INVALID_ARGUMENT, "12.5 is not an integer"},
      {'i', "plugin_options.f", DDPLUG_E_INVALID_ARGUMENT, "0.5 is not an integer"},
      {'b', "plugin_options.s", DDPLUG_E_INVALID_ARGUMENT, "holds a string"},
      /* a type mismatch is reported even for an absent optional key */
      {'b', "rendezvous.addr", DDPLUG_E_INVALID_ARGUMENT, "holds a string"},
  };
  ddplug_config *cfg = load(k_getter_config);
  for (size_t c = 0; c < DDPLUG__ARRAY_LEN(cases); c++) {
    char got[512];
    int rc = read_value(cfg, cases[c].type, cases[c].path, got, sizeof got);
    CHECK_MSG(rc == cases[c].status, "%s: %s, want %s (%s)", cases[c].path,
              ddplug_status_name(rc), ddplug_status_name(cases[c].status), ddplug_last_error());
    CHECK_CONTAINS(ddplug_last_error(), cases[c].message);
  }
  /* NULL arguments */
  int64_t i;
  CHECK_STATUS(ddplug_config_get_int(NULL, "sampler.seed", &i), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_get_int(cfg, NULL, &i), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_get_double(cfg, "sampler.seed", NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_get_bool(cfg, "sampler.shuffle", NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_get_string(cfg, "plugin", NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "ddplug_config_get_string: out is NULL");
  ddplug_config_free(cfg);
}

/* Every key of the table can be read through its getter on the defaults
 * (or is optional and "not set"). */
TEST(every_table_key_is_readable) {
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_default(&cfg));
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  for (size_t k = 0; k < count; k++) {
    if (strchr(keys[k].path, '*')) continue;
    int64_t i;
    double d;
    int b;
    char *s = NULL;
    int rc;
    switch (keys[k].type) {
      case DDPLUG__CFG_INT: rc = ddplug_config_get_int(cfg, keys[k].path, &i); break;
      case DDPLUG__CFG_NUMBER: rc = ddplug_config_get_double(cfg, keys[k].path, &d); break;
      case DDPLUG__CFG_BOOL: rc = ddplug_config_get_bool(cfg, keys[k].path, &b); break;
      default: rc = ddplug_config_get_string(cfg, keys[k].path, &s); break;
    }
    int absent_ok = keys[k].presence != DDPLUG__CFG_DEFAULT && rc == DDPLUG_E_NOT_FOUND;
    CHECK_MSG(rc == DDPLUG_OK || absent_ok, "%s: %s", keys[k].path, ddplug_last_error());
    ddplug_free(s);
  }
  ddplug_config_free(cfg);
}

/* ---- environment, files, handles ----------------------------------------- */

TEST(load_env_picks_defaults_json_or_file) {
  ddplug_config *cfg = NULL;
  unsetenv("DDPLUG_CONFIG");
  CHECK_OK(ddplug_config_load_env(&cfg));
  CHECK_EQ_STR(ddplug_config_origin(cfg), "<defaults>");
  ddplug_config_free(cfg);
  static const char *const empty[] = {"", "  \n\t "};
  for (size_t i = 0; i < 2; i++) {
    setenv("DDPLUG_CONFIG", empty[i], 1);
    CHECK_OK(ddplug_config_load_env(&cfg));
    CHECK_EQ_STR(ddplug_config_origin(cfg), "<defaults>");
    ddplug_config_free(cfg);
  }
  setenv("DDPLUG_CONFIG", "  {\"sampler\": {\"seed\": 42}}", 1);
  CHECK_OK(ddplug_config_load_env(&cfg));
  CHECK_EQ_STR(ddplug_config_origin(cfg), "DDPLUG_CONFIG");
  int64_t seed = 0;
  CHECK_OK(ddplug_config_get_int(cfg, "sampler.seed", &seed));
  CHECK_EQ_INT(seed, 42);
  ddplug_config_free(cfg);
  cfg = NULL;
  setenv("DDPLUG_CONFIG", "{\"sampler\": {\"sed\": 42}}", 1);
  CHECK_STATUS(ddplug_config_load_env(&cfg), DDPLUG_E_CONFIG);
  CHECK_EQ_STR(ddplug_last_error(), "DDPLUG_CONFIG: sampler.sed: unknown key (did you mean 'seed'?)");
  setenv("DDPLUG_CONFIG", "{\"sampler\": ", 1);
  CHECK_STATUS(ddplug_config_load_env(&cfg), DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), "DDPLUG_CONFIG:1:");
  const char *path = dt_temp_file(".json", "{\"plugin\": \"nccl\"}\n");
  setenv("DDPLUG_CONFIG", path, 1);
  CHECK_OK(ddplug_config_load_env(&cfg));
  CHECK_EQ_STR(ddplug_config_origin(cfg), path);
  ddplug_config_free(cfg);
  cfg = NULL;
  setenv("DDPLUG_CONFIG", "/nonexistent/ddplug.json", 1);
  CHECK_STATUS(ddplug_config_load_env(&cfg), DDPLUG_E_NOT_FOUND);
  CHECK_EQ_STR(ddplug_last_error(),
               "DDPLUG_CONFIG: cannot open config file '/nonexistent/ddplug.json': No such file or directory");
  CHECK(cfg == NULL);
  CHECK_STATUS(ddplug_config_load_env(NULL), DDPLUG_E_INVALID_ARGUMENT);
}

TEST(file_errors_name_the_path_and_reason) {
  ddplug_config *cfg = NULL;
  CHECK_STATUS(ddplug_config_load_file("/nonexistent/x.json", &cfg), DDPLUG_E_NOT_FOUND);
  CHECK_EQ_STR(ddplug_last_error(), "cannot open config file '/nonexistent/x.json': No such file or directory");
  CHECK_STATUS(ddplug_config_load_file(dt_source_dir(), &cfg), DDPLUG_E_SYSTEM);
  CHECK_CONTAINS(ddplug_last_error(), "Is a directory");
  CHECK_CONTAINS(ddplug_last_error(), dt_source_dir());
  CHECK_STATUS(ddplug_config_load_file(NULL, &cfg), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_load_file("x.json", NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_load_string(NULL, NULL, &cfg), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_default(NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK(cfg == NULL);
  /* a NUL byte inside a file is a syntax error at its position */
  char path[] = "/tmp/ddplug-config-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  CHECK(write(fd, "{\"plugin\": \"a\0b\"}", 17) == 17);
  close(fd);
  CHECK_STATUS(ddplug_config_load_file(path, &cfg), DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), path);
  CHECK_CONTAINS(ddplug_last_error(), ":1:");
  unlink(path);
}

TEST_T(oversized_file_is_refused, 120) {
  char path[] = "/tmp/ddplug-config-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  CHECK(ftruncate(fd, (16 << 20) + 1) == 0);
  close(fd);
  ddplug_config *cfg = NULL;
  CHECK_STATUS(ddplug_config_load_file(path, &cfg), DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), "larger than 16 MiB");
  unlink(path);
}

/* Exactly 16 MiB is within the limit: "{}" and white space. */
TEST_T(file_of_exactly_16_mib_loads, 120) {
  char path[] = "/tmp/ddplug-config-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  static char spaces[1 << 16];
  memset(spaces, ' ', sizeof spaces);
  CHECK(write(fd, "{}", 2) == 2);
  size_t left = (16u << 20) - 2;
  while (left > 0) {
    size_t n = left < sizeof spaces ? left : sizeof spaces;
    CHECK(write(fd, spaces, n) == (ssize_t)n);
    left -= n;
  }
  close(fd);
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_file(path, &cfg));
  ddplug_config_free(cfg);
  unlink(path);
}

/* A FIFO without a writer (or any other file that is not a regular file)
 * is refused at once with what it is; nothing blocks. */
TEST_T(a_fifo_is_refused_without_blocking, 20) {
  char dir[] = "/tmp/ddplug-config-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[64];
  snprintf(path, sizeof path, "%s/run.json", dir);
  CHECK(mkfifo(path, 0600) == 0);
  ddplug_config *cfg = NULL;
  CHECK_STATUS(ddplug_config_load_file(path, &cfg), DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), "is a FIFO (named pipe), not a regular file");
  CHECK_CONTAINS(ddplug_last_error(), path);
  setenv("DDPLUG_CONFIG", path, 1);
  CHECK_STATUS(ddplug_config_load_env(&cfg), DDPLUG_E_CONFIG);
  unsetenv("DDPLUG_CONFIG");
  CHECK(cfg == NULL);
  unlink(path);
  rmdir(dir);
}

/* However long the path, the reason ends the message (the path's middle
 * is elided). */
TEST(a_very_long_path_keeps_the_reason) {
  static char path[5100];
  strcpy(path, "/tmp/");
  memset(path + 5, 'x', 5000);
  strcpy(path + 5005, ".json");
  ddplug_config *cfg = NULL;
  CHECK(ddplug_config_load_file(path, &cfg) != DDPLUG_OK);
  const char *e = ddplug_last_error();
  CHECK_MSG(strlen(e) < 1024, "message of %zu characters", strlen(e));
  CHECK_CONTAINS(e, "cannot open config file '/tmp/xxx");
  CHECK_CONTAINS(e, "...xxx");
  CHECK_CONTAINS(e, "x.json': File name too long");
}

TEST(handles_free_copy_and_plugin_options) {
  ddplug_config_free(NULL);
  CHECK(ddplug_config_origin(NULL) == NULL);
  CHECK_EQ_STR(ddplug__config_plugin_options(NULL), "{}");
  ddplug_config *cfg = load("{\"plugin_options\": {\"b\": [1, {\"z\": null, \"a\": 1}]}}");
  CHECK_EQ_STR(ddplug__config_plugin_options(cfg), "{\"b\":[1,{\"a\":1,\"z\":null}]}");
  ddplug_config *copy = NULL;
  CHECK_OK(ddplug__config_clone(cfg, &copy));
  CHECK(copy != cfg);
  CHECK_EQ_STR(ddplug_config_origin(copy), "t.json");
  char *a = to_json(cfg), *b = to_json(copy);
  CHECK_EQ_STR(a, b);
  free(a);
  free(b);
  ddplug_config_free(cfg); /* the copy does not depend on the original */
  CHECK_EQ_STR(ddplug__config_plugin_options(copy), "{\"b\":[1,{\"a\":1,\"z\":null}]}");
  ddplug_config_free(copy);
  uint64_t h;
  char *s;
  CHECK_STATUS(ddplug_config_hash(NULL, &h), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_config_to_json(NULL, &s), DDPLUG_E_INVALID_ARGUMENT);
}

/* A config is immutable: many threads may read one at once (run under TSan). */
static void *reader(void *arg) {
  const ddplug_config *cfg = arg;
  for (int i = 0; i < 2000; i++) {
    int64_t v;
    char *s = NULL;
    if (ddplug_config_get_int(cfg, "sampler.bucket.batch_size", &v) != DDPLUG_OK || v != 8)
      return NULL;
    if (ddplug_config_get_string(cfg, "data_split", &s) != DDPLUG_OK) return NULL;
    ddplug_free(s);
    if (ddplug_config_to_json(cfg, &s) != DDPLUG_OK) return NULL;
    ddplug_free(s);
    if (ddplug_config_get_int(cfg, "sampler.nope", &v) != DDPLUG_E_NOT_FOUND) return NULL;
  }
  return arg;
}

TEST(concurrent_readers) {
  ddplug_config *cfg = load(k_getter_config);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, reader, cfg);
  for (int i = 0; i < 4; i++) {
    void *ok = NULL;
    pthread_join(t[i], &ok);
    CHECK(ok == cfg);
  }
  ddplug_config_free(cfg);
}

/* ---- the key table and the JSON Schema ----------------------------------- */

TEST(patterns_match_what_they_say) {
  const char *env = "^[A-Za-z_][A-Za-z0-9_]*$", *stream = "^[A-Za-z0-9_.-]{1,64}$";
  static const char *const env_ok[] = {"A", "_", "DDPLUG_SECRET", "x9_", "_1"};
  static const char *const env_bad[] = {"", "1A", "A-B", "A B", "Ä", "a.b", "$X"};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(env_ok); i++)
    CHECK_MSG(ddplug__config_pattern_match(env, env_ok[i], strlen(env_ok[i])) == 1, "%s", env_ok[i]);
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(env_bad); i++)
    CHECK_MSG(ddplug__config_pattern_match(env, env_bad[i], strlen(env_bad[i])) == 0, "%s", env_bad[i]);
  char name64[65], name65[66];
  memset(name64, 'a', 64);
  name64[64] = '\0';
  memset(name65, 'a', 65);
  name65[65] = '\0';
  static const char *const stream_ok[] = {"train", "v1.val", "a-b_c", "-", "9"};
  static const char *const stream_bad[] = {"", "a b", "a/b", "tr\xc3\xa4in", "a:b"};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(stream_ok); i++)
    CHECK(ddplug__config_pattern_match(stream, stream_ok[i], strlen(stream_ok[i])) == 1);
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(stream_bad); i++)
    CHECK(ddplug__config_pattern_match(stream, stream_bad[i], strlen(stream_bad[i])) == 0);
  CHECK(ddplug__config_pattern_match(stream, name64, 64) == 1);
  CHECK(ddplug__config_pattern_match(stream, name65, 65) == 0);
  /* backtracking: the class of the second atom overlaps the first */
  CHECK(ddplug__config_pattern_match("^[a-z]*[a-c]{2,2}$", "xyab", 4) == 1);
  CHECK(ddplug__config_pattern_match("^[a-z]*[a-c]{2,2}$", "xya", 3) == 0);
  /* a NUL inside the text never matches; a malformed pattern is -1 */
  CHECK(ddplug__config_pattern_match(stream, "a\0b", 3) == 0);
  CHECK(ddplug__config_pattern_match("^[a-$", "a", 1) == -2);
}

TEST(key_table_is_well_formed) {
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  CHECK(count > 30);
  for (size_t i = 0; i < count; i++) {
    const ddplug__cfg_key *k = &keys[i];
    CHECK_MSG(k->description && strlen(k->description) > 10, "%s: no description", k->path);
    CHECK_MSG(ddplug__config_key_find(k->path, strlen(k->path)) == k, "%s: listed twice", k->path);
    if (k->pattern)
      CHECK_MSG(ddplug__config_pattern_match(k->pattern, "", 0) >= 0, "%s: pattern %s does not compile",
                k->path, k->pattern);
    /* parents come first and are objects or maps */
    const char *dot = strrchr(k->path, '.');
    if (dot) {
      const ddplug__cfg_key *parent = ddplug__config_key_find(k->path, (size_t)(dot - k->path));
      CHECK_MSG(parent && parent < k, "%s: parent missing or after it", k->path);
      CHECK_MSG(parent->type == DDPLUG__CFG_OBJECT ||
                    (parent->type == DDPLUG__CFG_MAP && !strcmp(dot + 1, "*")),
                "%s: parent is not an object", k->path);
    }
    if (k->type == DDPLUG__CFG_MAP)
      CHECK_MSG(ddplug__config_pattern_match(k->pattern, "", 0) >= 0, "%s: bad pattern", k->path);
    if (k->pattern) CHECK(k->pattern_hint != NULL);
    if (k->type == DDPLUG__CFG_ENUM) {
      CHECK(k->enum_values && k->enum_values[0]);
      if (k->presence == DDPLUG__CFG_DEFAULT) {
        int found = 0;
        for (size_t j = 0; k->enum_values[j]; j++) found |= !strcmp(k->enum_values[j], k->def_str);
        CHECK_MSG(found, "%s: default '%s' is not an allowed value", k->path, k->def_str);
      }
    }
    if (k->type == DDPLUG__CFG_INT && k->presence == DDPLUG__CFG_DEFAULT)
      CHECK_MSG(k->def_int >= k->imin && k->def_int <= k->imax, "%s: default out of range", k->path);
    if (k->type == DDPLUG__CFG_NUMBER)
      CHECK_MSG((k->nmin_exclusive ? k->def_num > k->nmin : k->def_num >= k->nmin) &&
                    k->def_num <= k->nmax,
                "%s: default out of range", k->path);
    if (k->type == DDPLUG__CFG_STRING && k->def_str && k->pattern)
      CHECK(ddplug__config_pattern_match(k->pattern, k->def_str, strlen(k->def_str)) == 1);
  }
}

/* The schema node for a table path: properties by name, '*' is the map's
 * additionalProperties. */
static json_t *schema_node(json_t *root, const char *path) {
  json_t *node = root;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *seg = strtok(buf, "."); seg && node; seg = strtok(NULL, "."))
    node = !strcmp(seg, "*") ? json_object_get(node, "additionalProperties")
                             : json_object_get(json_object_get(node, "properties"), seg);
  return node;
}

/* Children of schema path parent, as the schema would list them. */
static void expected_children(const char *parent, json_t **names, json_t **required) {
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  *names = json_array();
  *required = json_array();
  for (size_t i = 0; i < count; i++) {
    if (!ddplug__config_key_is_child(&keys[i], parent)) continue;
    json_array_append_new(*names, json_string(ddplug__config_key_name(&keys[i])));
    if (keys[i].presence == DDPLUG__CFG_REQUIRED)
      json_array_append_new(*required, json_string(ddplug__config_key_name(&keys[i])));
  }
}

static json_t *key_names(json_t *obj) {
  json_t *names = json_array();
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) json_array_append_new(names, json_string(key));
  return names;
}

/* Compare one object node's properties and required list with the table. */
static void check_object_node(json_t *node, const char *parent, const char *where) {
  json_t *names, *required;
  expected_children(parent, &names, &required);
  json_t *props = json_object_get(node, "properties");
  CHECK_MSG(props != NULL, "schema %s: no properties", where);
  json_t *have = key_names(props);
  char *a = json_dumps(have, 0), *b = json_dumps(names, 0);
  CHECK_MSG(json_equal(have, names), "schema %s: properties %s, table has %s (same order)", where, a, b);
  free(a);
  free(b);
  json_t *req = json_object_get(node, "required");
  if (json_array_size(required) == 0) {
    CHECK_MSG(req == NULL, "schema %s: 'required' but the table requires nothing", where);
  } else {
    a = json_dumps(req ? req : json_null(), JSON_ENCODE_ANY);
    b = json_dumps(required, 0);
    CHECK_MSG(req && json_equal(req, required), "schema %s: required %s, table %s", where, a, b);
    free(a);
    free(b);
  }
  json_decref(have);
  json_decref(names);
  json_decref(required);
}

/* The schema ddplug_config_schema generates: a draft 2020-12 object schema
 * with exactly the table's keys, in table order, each with its type and
 * description (tests/data/config/schema_check.py checks what it accepts
 * and rejects with an independent validator). */
TEST(schema_is_generated_from_the_key_table) {
  char *text = NULL;
  CHECK_OK(ddplug_config_schema(&text));
  json_error_t e;
  json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &e);
  ddplug_free(text);
  CHECK_MSG(root, "generated schema: %d:%d: %s", e.line, e.column, e.text);
  CHECK_EQ_STR(json_string_value(json_object_get(root, "$schema")),
               "https://json-schema.org/draft/2020-12/schema");
  CHECK_EQ_STR(json_string_value(json_object_get(root, "type")), "object");
  CHECK(json_is_false(json_object_get(root, "additionalProperties")));
  CHECK(json_is_string(json_object_get(root, "description")));
  check_object_node(root, "", "top level");
  static const char *const type_names[] = {
      [DDPLUG__CFG_OBJECT] = "object", [DDPLUG__CFG_MAP] = "object",
      [DDPLUG__CFG_FREE] = "object",   [DDPLUG__CFG_STRING] = "string",
      [DDPLUG__CFG_ENUM] = "string",   [DDPLUG__CFG_BOOL] = "boolean",
      [DDPLUG__CFG_INT] = "integer",   [DDPLUG__CFG_NUMBER] = "number",
      [DDPLUG__CFG_INT_ARRAY] = "array"};
  size_t count;
  const ddplug__cfg_key *keys = ddplug__config_keys(&count);
  for (size_t i = 0; i < count; i++) {
    const ddplug__cfg_key *k = &keys[i];
    json_t *node = schema_node(root, k->path);
    CHECK_MSG(node, "the schema has no entry for %s", k->path);
    CHECK_EQ_STR(json_string_value(json_object_get(node, "type")), type_names[k->type]);
    CHECK_EQ_STR(json_string_value(json_object_get(node, "description")), k->description);
    if (k->type == DDPLUG__CFG_OBJECT) check_object_node(node, k->path, k->path);
    if (k->type == DDPLUG__CFG_MAP)
      CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(node, "propertyNames"), "pattern")),
                   k->pattern);
  }
  json_decref(root);
  CHECK_STATUS(ddplug_config_schema(NULL), DDPLUG_E_INVALID_ARGUMENT);
}

/* ---- malloc failure at every allocation in turn -------------------------- */

static const char *g_full_config_path;

/* Child: load a config using every feature, then read it every way. Exits
 * 0 if everything succeeded, 3 if a call failed cleanly with NO_MEMORY, and
 * something else (or crashes; under ASan, leaks) otherwise. */
static void alloc_child(void *arg) {
  setenv("DDPLUG_TEST_FAIL_ALLOC", (const char *)arg, 1);
  ddplug_config *cfg = NULL, *copy = NULL;
  char *s = NULL;
  int rc = ddplug_config_load_file(g_full_config_path, &cfg);
  if (rc != DDPLUG_OK && cfg != NULL) exit(5); /* *out written on failure */
  if (rc == DDPLUG_OK) rc = ddplug_config_to_json(cfg, &s);
  ddplug_free(s);
  s = NULL;
  if (rc == DDPLUG_OK) rc = ddplug_config_get_string(cfg, "data_split.streams", &s);
  ddplug_free(s);
  if (rc == DDPLUG_OK) rc = ddplug__config_clone(cfg, &copy);
  ddplug_config_free(copy);
  ddplug_config_free(cfg);
  if (rc == DDPLUG_OK) {
    ddplug_config *bad = NULL;
    rc = ddplug_config_load_string("{\"sampler\": {\"seed\": 1.5}}", NULL, &bad);
    rc = rc == DDPLUG_E_CONFIG ? DDPLUG_OK : rc;
  }
  if (rc == DDPLUG_OK) exit(0);
  if (rc == DDPLUG_E_NO_MEMORY && strstr(ddplug_last_error(), "out of memory")) exit(3);
  fprintf(stderr, "status %s: %s\n", ddplug_status_name(rc), ddplug_last_error());
  exit(4);
}

TEST_T(every_allocation_may_fail, 300) {
  g_full_config_path = data_dir("good/full.json");
  int n;
  for (n = 1; n < 20000; n++) {
    char arg[16];
    snprintf(arg, sizeof arg, "%d", n);
    pid_t pid = dt_fork(alloc_child, arg);
    int st = 0;
    CHECK(dt_wait_pid(pid, 30000, &st) == 0);
    CHECK_MSG(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3),
              "failing allocation %d: child %s %d", n, WIFEXITED(st) ? "exited" : "killed by",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    if (WEXITSTATUS(st) == 0) break;
  }
  CHECK(n > 20); /* the injection reached jansson's allocations too */
  dt_note("%d allocations failed in turn, each cleanly", n - 1);
}

/* Whether the user's document sets a key itself, or leaves it to the
 * default; paths as the getters take them (map entries included). */
TEST(is_set_tells_given_keys_from_defaults) {
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string(
      "{\"plugin\": \"cpu\", \"sampler\": {\"seed\": 3},"
      " \"data_split\": {\"streams\": {\"v1.val\": {\"owner\": \"user\"}}}}",
      "s.json", &cfg));
  int set = -1;
  CHECK_OK(ddplug_config_is_set(cfg, "plugin", &set));
  CHECK_EQ_INT(set, 1);
  CHECK_OK(ddplug_config_is_set(cfg, "sampler.seed", &set));
  CHECK_EQ_INT(set, 1);
  CHECK_OK(ddplug_config_is_set(cfg, "sampler.shuffle", &set));
  CHECK_EQ_INT(set, 0); /* defaulted, though the getters return it */
  CHECK_OK(ddplug_config_is_set(cfg, "data_split.streams.v1.val.owner", &set));
  CHECK_EQ_INT(set, 1);
  CHECK_OK(ddplug_config_is_set(cfg, "rendezvous.port", &set));
  CHECK_EQ_INT(set, 0);
  CHECK_STATUS(ddplug_config_is_set(cfg, "sampler.sead", &set), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "did you mean 'sampler.seed'");
  CHECK_STATUS(ddplug_config_is_set(cfg, "plugin", NULL), DDPLUG_E_INVALID_ARGUMENT);
  ddplug_config *copy = NULL;
  CHECK_OK(ddplug__config_clone(cfg, &copy));
  CHECK_OK(ddplug_config_is_set(copy, "sampler.shuffle", &set));
  CHECK_EQ_INT(set, 0);
  ddplug_config_free(copy);
  ddplug_config_free(cfg);
  CHECK_OK(ddplug_config_default(&cfg));
  CHECK_OK(ddplug_config_is_set(cfg, "plugin", &set));
  CHECK_EQ_INT(set, 0);
  ddplug_config_free(cfg);
}
