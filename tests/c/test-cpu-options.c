/* test-cpu-options.c — plugin_options of the cpu plugin: defaults, every
 * knob accepted, and a table of bad inputs with the exact sentence each
 * must produce (unknown key listing the known ones, wrong type, out of
 * range, not a multiple, not a power of two, bad address, not an object,
 * JSON syntax). Also through group_create: a bad option fails the group
 * with DDPLUG_E_CONFIG on every rank and leaves nothing behind; and bad
 * world descriptions are refused. */
#include <string.h>

#include "harness.h"
#include "internal.h"
#include "cpu_driver.h"
#include "run/context.h"

#include <jansson.h>

/* The options as the runtime checks them (plugin/options.c) and the plugin
 * reads them (ddcpu_options_read) — the driver stands in for the runtime. */
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);

static int check(const char *json) {
  json_t *v = NULL;
  int s = ddplug__options_check(ddplug_plugin_entry_v1(DDPLUG_PLUGIN_ABI_VERSION), json, &v);
  json_decref(v);
  return s;
}

/* Open one rank with options through the driver (the runtime's check, then
 * group_create's ddcpu_options_read), and give back what group_create saw. */
static void read_one(int rank, int world, void *arg) {
  (void)rank;
  (void)world;
  hd_world *w = arg;
  hd_rank r;
  CHECK_OK(hd_open(&r, w, 0));
  ddcpu_options o;
  CHECK_OK(ddcpu_options_read(&r.svc, &o));
  char path[700];
  snprintf(path, sizeof path, "%s/read", w->dir);
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(&o, sizeof o, 1, f) == 1);
  fclose(f);
  hd_close(&r);
}

static ddcpu_options read_through_driver(const char *json) {
  hd_world w;
  hd_world_init(&w, 1, NULL, json);
  CHECK_EQ_INT(dt_run_ranks(1, read_one, &w, NULL, 30, NULL), 0);
  char path[700];
  snprintf(path, sizeof path, "%s/read", w.dir);
  ddcpu_options o;
  FILE *f = fopen(path, "rb");
  CHECK(f && fread(&o, sizeof o, 1, f) == 1);
  fclose(f);
  hd_world_cleanup(&w);
  return o;
}

TEST(defaults) {
  ddcpu_options o = read_through_driver("{}");
  CHECK_EQ_INT(o.chunk_bytes, 256 << 10);
  CHECK_EQ_INT(o.small_msg_bytes, 16 << 10);
  CHECK_EQ_INT(o.spin_us, -1);
  CHECK_EQ_INT(o.slots, 8);
  CHECK_EQ_INT(o.tcp_chunk_bytes, 256 << 10);
  CHECK_EQ_INT(o.nt_bytes, 8 << 20);
  CHECK_EQ_STR(o.addr, "");
  CHECK_EQ_INT(o.registered_bytes, -1);
  CHECK_EQ_INT(o.cma, DDCPU_CMA_AUTO);
  CHECK_EQ_INT(o.cma_min_bytes, 64 << 10);
  CHECK_EQ_INT(o.progress_thread, DDCPU_PROGRESS_AUTO);
}

TEST(every_knob) {
  ddcpu_options o = read_through_driver(
      "{\"chunk_bytes\": 65536, \"small_msg_bytes\": 0, \"spin_us\": 7, "
      "\"slots\": 8, \"tcp_chunk_bytes\": 4096, \"addr\": \"10.1.2.3\", "
      "\"nt_store_bytes\": 0}");
  CHECK_EQ_INT(o.chunk_bytes, 65536);
  CHECK_EQ_INT(o.small_msg_bytes, 0);
  CHECK_EQ_INT(o.spin_us, 7);
  CHECK_EQ_INT(o.slots, 8);
  CHECK_EQ_INT(o.tcp_chunk_bytes, 4096);
  CHECK_EQ_STR(o.addr, "10.1.2.3");
  CHECK_EQ_INT(o.nt_bytes, 0);
  o = read_through_driver("{\"registered_bytes\": 8192, \"cma\": \"off\", "
                          "\"cma_min_bytes\": 0, \"progress_thread\": \"off\"}");
  CHECK_EQ_INT(o.registered_bytes, 8192);
  CHECK_EQ_INT(o.cma, DDCPU_CMA_OFF);
  CHECK_EQ_INT(o.cma_min_bytes, 0);
  CHECK_EQ_INT(o.progress_thread, DDCPU_PROGRESS_OFF);
  o = read_through_driver("{\"progress_thread\": \"on\", \"cma\": \"on\"}");
  CHECK_EQ_INT(o.registered_bytes, -1); /* left out: the size of /dev/shm */
  CHECK_EQ_INT(o.cma, DDCPU_CMA_ON);
  CHECK_EQ_INT(o.progress_thread, DDCPU_PROGRESS_ON);
  o = read_through_driver("{\"registered_bytes\": 0, \"progress_thread\": \"auto\"}");
  CHECK_EQ_INT(o.registered_bytes, 0);
  CHECK_EQ_INT(o.progress_thread, DDCPU_PROGRESS_AUTO);
}

/* What the runtime refuses from the declarations, with the exact sentence. */
static const struct bad {
  const char *json, *error;
} bad[] = {
    {"{\"chunk_byte\": 4096}",
     "plugin_options.chunk_byte: plugin cpu has no such option (did you mean 'chunk_bytes'? "
     "its options: chunk_bytes, small_msg_bytes, spin_us, slots, tcp_chunk_bytes, "
     "nt_store_bytes, addr, registered_bytes, cma, cma_min_bytes, progress_thread)"},
    {"{\"registered_bytes\": 5000}",
     "plugin_options.registered_bytes: 5000 is not a multiple of 4096"},
    {"{\"registered_bytes\": -4096}",
     "plugin_options.registered_bytes: -4096 is out of range 0..70368744177664"},
    {"{\"registered_bytes\": \"lots\"}",
     "plugin_options.registered_bytes: expected an integer in 0..70368744177664, a multiple of "
     "4096, got \"lots\""},
    {"{\"cma\": true}", "plugin_options.cma: expected a string, got true"},
    {"{\"cma\": \"yes\"}", "plugin_options.cma: \"yes\" is not one of \"auto\", \"on\", \"off\""},
    {"{\"cma_min_bytes\": -1}", "plugin_options.cma_min_bytes: -1 is out of range 0..1099511627776"},
    {"{\"progress_thread\": \"sometimes\"}",
     "plugin_options.progress_thread: \"sometimes\" is not one of \"auto\", \"on\", \"off\""},
    {"{\"progress_thread\": true}", "plugin_options.progress_thread: expected a string, got true"},
    {"{\"nt_store_bytes\": -5}",
     "plugin_options.nt_store_bytes: -5 is out of range 0..9223372036854775807"},
    {"{\"chunk_bytes\": \"big\"}",
     "plugin_options.chunk_bytes: expected an integer in 4096..16777216, a multiple of 4096, "
     "got \"big\""},
    {"{\"chunk_bytes\": 1.5}",
     "plugin_options.chunk_bytes: expected an integer in 4096..16777216, a multiple of 4096, "
     "got 1.5"},
    {"{\"chunk_bytes\": 1024}", "plugin_options.chunk_bytes: 1024 is out of range 4096..16777216"},
    {"{\"chunk_bytes\": 5000}", "plugin_options.chunk_bytes: 5000 is not a multiple of 4096"},
    {"{\"small_msg_bytes\": -1}", "plugin_options.small_msg_bytes: -1 is out of range 0..1048576"},
    {"{\"spin_us\": true}", "plugin_options.spin_us: expected an integer in 0..100000, got true"},
    {"{\"slots\": 32}", "plugin_options.slots: 32 is out of range 2..16"},
    {"{\"tcp_chunk_bytes\": 4100}", "plugin_options.tcp_chunk_bytes: 4100 is not a multiple of 64"},
    {"{\"addr\": 5}", "plugin_options.addr: expected a string, got 5"},
    {"[1, 2]", "plugin_options: expected an object"},
};

TEST(bad_options_table) {
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int s = check(bad[i].json);
    CHECK_MSG(s == DDPLUG_E_CONFIG, "%s: expected CONFIG, got %d", bad[i].json, s);
    CHECK_MSG(strcmp(ddplug_last_error(), bad[i].error) == 0, "%s:\n   got  '%s'\n   want '%s'",
              bad[i].json, ddplug_last_error(), bad[i].error);
  }
}

/* What only the plugin judges, at group_create (the runtime passed it). */
typedef struct plugin_judged {
  hd_world w;
  const char *error;
} plugin_judged;

static void open_fails_with(int rank, int world, void *arg) {
  (void)world;
  plugin_judged *c = arg;
  hd_rank r;
  CHECK_STATUS(hd_open(&r, &c->w, rank), DDPLUG_E_CONFIG);
  CHECK_EQ_STR(r.error, c->error);
}

TEST(group_create_judges_what_declarations_cannot_say) {
  static const struct {
    const char *json, *error;
  } cases[] = {
      {"{\"slots\": 3}", "plugin_options.slots: 3 is not a power of two (2, 4, 8 or 16)"},
      {"{\"addr\": \"node7\"}",
       "plugin_options.addr: 'node7' is not an IPv4 address (e.g. \"10.0.0.5\")"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    plugin_judged c;
    hd_world_init(&c.w, 1, NULL, cases[i].json);
    c.error = cases[i].error;
    CHECK_EQ_INT(dt_run_ranks(1, open_fails_with, &c, NULL, 30, NULL), 0);
    CHECK_EQ_INT(hd_world_shm_left(&c.w), 0);
    hd_world_cleanup(&c.w);
  }
}

static void open_must_fail(int rank, int world, void *arg) {
  (void)world;
  hd_rank r;
  int s = hd_open(&r, arg, rank);
  CHECK_STATUS(s, DDPLUG_E_CONFIG);
  CHECK_CONTAINS(r.error, "plugin_options.chunk_size: plugin cpu has no such option");
}

TEST(group_create_refuses_bad_options_on_every_rank) {
  hd_world w;
  hd_world_init(&w, 2, NULL, "{\"chunk_size\": 1}");
  CHECK_EQ_INT(dt_run_ranks(2, open_must_fail, &w, NULL, 30, NULL), 0);
  CHECK_EQ_INT(hd_world_shm_left(&w), 0);
  hd_world_cleanup(&w);
}

/* A world description the plugin cannot accept. */
static int fake_set(void *h, const char *k, const void *v, uint64_t l) {
  (void)h; (void)k; (void)v; (void)l;
  return DDPLUG_OK;
}
static int fake_get(void *h, const char *k, void *b, uint64_t c, uint64_t *l, int64_t t) {
  (void)h; (void)k; (void)b; (void)c; (void)l; (void)t;
  return DDPLUG_E_TIMEOUT;
}
static int fake_add(void *h, const char *k, int64_t d, int64_t *r) {
  (void)h; (void)k; (void)d; (void)r;
  return DDPLUG_OK;
}
static int fake_wait(void *h, const char *const *k, uint32_t n, int64_t t) {
  (void)h; (void)k; (void)n; (void)t;
  return DDPLUG_OK;
}
static int fake_del(void *h, const char *k) {
  (void)h; (void)k;
  return DDPLUG_OK;
}
static void fake_log(void *h, int32_t l, const char *m) { (void)h; (void)l; (void)m; }
static uint64_t fake_clock(void *h) {
  (void)h;
  return 0;
}
static char last[1024];
static void fake_err(void *h, int32_t s, const char *m) {
  (void)h; (void)s;
  snprintf(last, sizeof last, "%s", m);
}

/* The declared defaults, as a runtime hands them over. */
static int fake_opt_int(void *h, const char *name, int64_t *out) {
  (void)h;
  static const struct {
    const char *name;
    int64_t v;
  } d[] = {{"chunk_bytes", 262144}, {"small_msg_bytes", 16384}, {"slots", 8},
           {"tcp_chunk_bytes", 262144}, {"nt_store_bytes", 8388608}, {"cma_min_bytes", 65536}};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
    if (!strcmp(name, d[i].name)) {
      *out = d[i].v;
      return DDPLUG_OK;
    }
  return DDPLUG_E_NOT_FOUND;
}
static int fake_opt_bool(void *h, const char *n, int32_t *o) {
  (void)h; (void)n; (void)o;
  return DDPLUG_E_NOT_FOUND;
}
static int fake_opt_number(void *h, const char *n, double *o) {
  (void)h; (void)n; (void)o;
  return DDPLUG_E_NOT_FOUND;
}
static int fake_opt_string(void *h, const char *n, char *b, uint64_t c, uint64_t *l) {
  (void)h;
  if (strcmp(n, "cma") != 0 && strcmp(n, "progress_thread") != 0) return DDPLUG_E_NOT_FOUND;
  snprintf(b, c, "auto");
  *l = 4;
  return DDPLUG_OK;
}
static int fake_opt_int_list(void *h, const char *n, int64_t *o, uint64_t c, uint64_t *k) {
  (void)h; (void)n; (void)o; (void)c; (void)k;
  return DDPLUG_E_NOT_FOUND;
}

TEST(group_create_refuses_bad_worlds) {
  const ddplug_plugin *p = ddplug_plugin_entry_v1(DDPLUG_PLUGIN_ABI_VERSION);
  CHECK(p != NULL);
  CHECK(ddplug_plugin_entry_v1(DDPLUG_MAKE_VERSION(2, 0)) == NULL);
  CHECK(ddplug_plugin_entry_v1(DDPLUG_MAKE_VERSION(1, 2)) == NULL); /* no option getters */
  CHECK_EQ_STR(p->name, "cpu");
  ddplug_host_services svc = {sizeof svc,   DDPLUG_PLUGIN_ABI_VERSION,
                              NULL,          fake_set,
                              fake_get,      fake_add,
                              fake_wait,     fake_del,
                              fake_log,      fake_clock,
                              fake_err,      fake_opt_bool,
                              fake_opt_int,  fake_opt_number,
                              fake_opt_string, fake_opt_int_list};
  int32_t node_of[2] = {0, 0}, local_of[2] = {0, 0};
  int64_t pid_of[2] = {1, 2};
  ddplug_group_init in;
  memset(&in, 0, sizeof in);
  in.struct_size = sizeof in;
  in.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  in.rank = 0;
  in.world_size = 2;
  in.local_world_size = 2;
  in.num_nodes = 1;
  in.node_of_rank = node_of;
  in.local_rank_of = local_of;
  in.pid_of_rank = pid_of;
  in.run_id = "t1";
  in.options_json = "{}";
  ddplug_plugin_group *g = NULL;
  CHECK_STATUS(p->group_create(&in, &svc, &g), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(last, "ranks 0 and 1 both have local rank 0 on node 0");
  local_of[1] = 1;
  in.run_id = "bad-id!";
  CHECK_STATUS(p->group_create(&in, &svc, &g), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(last, "run_id 'bad-id!' must be 1-32 characters");
  in.run_id = "t1";
  in.rank = 2;
  CHECK_STATUS(p->group_create(&in, &svc, &g), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(last, "rank 2 / world size 2 is not a valid rank");
  in.rank = 0;
  node_of[1] = 3;
  CHECK_STATUS(p->group_create(&in, &svc, &g), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(last, "node_of_rank[1] = 3 is not in [0, 1)");
  CHECK(g == NULL);
}
