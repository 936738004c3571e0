/* test-cpu-options.c — plugin_options of the cpu plugin: defaults, every
 * knob accepted, and a table of bad inputs with the exact sentence each
 * must produce (unknown key listing the known ones, wrong type, out of
 * range, not a multiple, not a power of two, bad address, not an object,
 * JSON syntax). Also through group_create: a bad option fails the group
 * with DDPLUG_E_CONFIG on every rank and leaves nothing behind; and bad
 * world descriptions are refused. */
#include <string.h>

#include "harness.h"
#include "cpu.h"
#include "cpu_driver.h"

TEST(defaults) {
  cp_options o;
  CHECK_OK(cp_options_parse("{}", &o));
  CHECK_EQ_INT(o.chunk_bytes, 256 << 10);
  CHECK_EQ_INT(o.small_msg_bytes, 16 << 10);
  CHECK_EQ_INT(o.spin_us, -1);
  CHECK_EQ_INT(o.slots, 8);
  CHECK_EQ_INT(o.tcp_chunk_bytes, 256 << 10);
  CHECK_EQ_INT(o.nt_bytes, 8 << 20);
  CHECK_EQ_STR(o.addr, "");
  CHECK_EQ_INT(o.registered_bytes, -1);
  CHECK_EQ_INT(o.cma, CP_CMA_AUTO);
  CHECK_EQ_INT(o.cma_min_bytes, 64 << 10);
  CHECK_EQ_INT(o.progress_thread, CP_PROGRESS_AUTO);
  CHECK_OK(cp_options_parse(NULL, &o));
  CHECK_OK(cp_options_parse("", &o));
}

TEST(every_knob) {
  cp_options o;
  CHECK_OK(cp_options_parse("{\"chunk_bytes\": 65536, \"small_msg_bytes\": 0, \"spin_us\": 7, "
                            "\"slots\": 8, \"tcp_chunk_bytes\": 4096, \"addr\": \"10.1.2.3\", "
                            "\"nt_store_bytes\": 0}",
                            &o));
  CHECK_EQ_INT(o.chunk_bytes, 65536);
  CHECK_EQ_INT(o.small_msg_bytes, 0);
  CHECK_EQ_INT(o.spin_us, 7);
  CHECK_EQ_INT(o.slots, 8);
  CHECK_EQ_INT(o.tcp_chunk_bytes, 4096);
  CHECK_EQ_STR(o.addr, "10.1.2.3");
  CHECK_EQ_INT(o.nt_bytes, 0);
  CHECK_OK(cp_options_parse("{\"registered_bytes\": 8192, \"cma\": false, "
                            "\"cma_min_bytes\": 0, \"progress_thread\": \"off\"}", &o));
  CHECK_EQ_INT(o.registered_bytes, 8192);
  CHECK_EQ_INT(o.cma, CP_CMA_OFF);
  CHECK_EQ_INT(o.cma_min_bytes, 0);
  CHECK_EQ_INT(o.progress_thread, CP_PROGRESS_OFF);
  CHECK_OK(cp_options_parse("{\"registered_bytes\": \"auto\", \"progress_thread\": \"on\", "
                            "\"cma\": true}", &o));
  CHECK_EQ_INT(o.registered_bytes, -1);
  CHECK_EQ_INT(o.cma, CP_CMA_ON);
  CHECK_EQ_INT(o.progress_thread, CP_PROGRESS_ON);
  CHECK_OK(cp_options_parse("{\"registered_bytes\": 0, \"progress_thread\": \"auto\"}", &o));
  CHECK_EQ_INT(o.registered_bytes, 0);
  CHECK_EQ_INT(o.progress_thread, CP_PROGRESS_AUTO);
}

static const struct bad {
  const char *json, *error;
} bad[] = {
    {"{\"chunk_byte\": 4096}",
     "plugin_options.chunk_byte: unknown key for plugin cpu (known: addr, chunk_bytes, cma, "
     "cma_min_bytes, nt_store_bytes, progress_thread, registered_bytes, slots, "
     "small_msg_bytes, spin_us, tcp_chunk_bytes)"},
    {"{\"registered_bytes\": 5000}",
     "plugin_options.registered_bytes: 5000 is not a multiple of 4096"},
    {"{\"registered_bytes\": -4096}",
     "plugin_options.registered_bytes: -4096 is out of range [0, 70368744177664]"},
    {"{\"registered_bytes\": \"lots\"}",
     "plugin_options.registered_bytes: expected \"auto\" or an integer, got a string"},
    {"{\"registered_bytes\": 1.5}",
     "plugin_options.registered_bytes: expected \"auto\" or an integer, got a number with a "
     "fraction"},
    {"{\"cma\": 1}", "plugin_options.cma: expected \"auto\", true or false, got an integer"},
    {"{\"cma\": \"yes\"}",
     "plugin_options.cma: expected \"auto\", true or false, got a string 'yes'"},
    {"{\"cma_min_bytes\": -1}",
     "plugin_options.cma_min_bytes: -1 is out of range [0, 1099511627776]"},
    {"{\"progress_thread\": \"sometimes\"}",
     "plugin_options.progress_thread: 'sometimes' is not one of \"auto\", \"on\", \"off\""},
    {"{\"progress_thread\": true}",
     "plugin_options.progress_thread: expected \"auto\", \"on\" or \"off\", got a boolean"},
    {"{\"nt_store_bytes\": -5}",
     "plugin_options.nt_store_bytes: -5 is out of range [0, 9223372036854775807]"},
    {"{\"chunk_bytes\": \"big\"}", "plugin_options.chunk_bytes: expected an integer, got a string"},
    {"{\"chunk_bytes\": 1.5}",
     "plugin_options.chunk_bytes: expected an integer, got a number with a fraction"},
    {"{\"chunk_bytes\": 1024}", "plugin_options.chunk_bytes: 1024 is out of range [4096, 16777216]"},
    {"{\"chunk_bytes\": 5000}", "plugin_options.chunk_bytes: 5000 is not a multiple of 4096"},
    {"{\"small_msg_bytes\": -1}", "plugin_options.small_msg_bytes: -1 is out of range [0, 1048576]"},
    {"{\"spin_us\": true}", "plugin_options.spin_us: expected an integer, got a boolean"},
    {"{\"slots\": 3}", "plugin_options.slots: 3 is not a power of two (2, 4, 8 or 16)"},
    {"{\"slots\": 32}", "plugin_options.slots: 32 is out of range [2, 16]"},
    {"{\"tcp_chunk_bytes\": 4100}", "plugin_options.tcp_chunk_bytes: 4100 is not a multiple of 64"},
    {"{\"addr\": 5}", "plugin_options.addr: expected a string, got an integer"},
    {"{\"addr\": \"node7\"}",
     "plugin_options.addr: 'node7' is not an IPv4 address (e.g. \"10.0.0.5\")"},
    {"[1, 2]", "plugin_options: expected an object for plugin cpu, got an array"},
    {"{\"slots\": 4,}", "plugin_options:1:"},
    {"{\"slots\": 4, \"slots\": 8}", "plugin_options:1:"},
};

TEST(bad_options_table) {
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cp_options o;
    int s = cp_options_parse(bad[i].json, &o);
    CHECK_MSG(s == DDPLUG_E_CONFIG, "%s: expected CONFIG, got %d", bad[i].json, s);
    CHECK_MSG(strncmp(cp_errmsg(), bad[i].error, strlen(bad[i].error)) == 0,
              "%s:\n   got  '%s'\n   want '%s'", bad[i].json, cp_errmsg(), bad[i].error);
  }
}

static void open_must_fail(int rank, int world, void *arg) {
  (void)world;
  hd_rank r;
  int s = hd_open(&r, arg, rank);
  CHECK_STATUS(s, DDPLUG_E_CONFIG);
  CHECK_CONTAINS(r.error, "plugin_options.chunk_size: unknown key for plugin cpu");
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
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
static void fake_err(void *h, int32_t s, const char *m) {
  (void)h; (void)s;
  snprintf(last, sizeof last, "%s", m);
}

TEST(group_create_refuses_bad_worlds) {
  const ddplug_plugin *p = ddplug_plugin_entry_v1(DDPLUG_PLUGIN_ABI_VERSION);
  CHECK(p != NULL);
  CHECK(ddplug_plugin_entry_v1(DDPLUG_MAKE_VERSION(2, 0)) == NULL);
  CHECK_EQ_STR(p->name, "cpu");
  ddplug_host_services svc = {sizeof svc, DDPLUG_PLUGIN_ABI_VERSION, NULL, fake_set, fake_get,
                              fake_add, fake_wait, fake_del, fake_log, fake_clock, fake_err};
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
