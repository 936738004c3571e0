/* test-nccl-plugin.c — the nccl plugin without a GPU and without the
 * runtime: the built libddplug-nccl.so loads (no driver needed) and
 * describes itself; plugin_options validation; device choice; the
 * duplicate-GPU verdict; the cross-rank agreement and mismatch protocols
 * and the group's failure/abort state, driven through an in-process fake of
 * the host services (ranks are threads sharing one fake store); and
 * group_create failing cleanly with "no CUDA device visible" here.
 *
 * Links the plugin's objects (tests/cmake/nccl.cmake); when the plugin is
 * not built (no CUDA or NCCL found) every case skips (exit 77). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#ifndef DDPLUG_TEST_NCCL

TEST(nccl_plugin_not_built) {
  dt_skip("the nccl plugin was not built (no CUDA toolkit or NCCL found)");
}

#else

#include "internal.h"
#include "nccl_fake_store.h"

/* ---- the built shared object ------------------------------------------ */

static const char *plugin_path(void) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/lib/libddplug-nccl.so", dt_build_dir());
  return path;
}

TEST(shared_object_loads_without_a_driver_and_describes_itself) {
  void *h = dlopen(plugin_path(), RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(h != NULL, "dlopen %s: %s", plugin_path(), dlerror());
  ddplug_plugin_entry_fn entry =
      (ddplug_plugin_entry_fn)dlsym(h, DDPLUG_PLUGIN_ENTRY_SYMBOL);
  CHECK(entry != NULL);
  const ddplug_plugin *t = entry(DDPLUG_PLUGIN_ABI_VERSION);
  CHECK(t != NULL);
  CHECK_EQ_STR(t->name, "nccl");
  CHECK_EQ_STR(t->version, DDPLUG_LIB_VERSION_STRING);
  CHECK_CONTAINS(t->description, "NCCL");
  CHECK_EQ_INT(t->struct_size, sizeof(ddplug_plugin));
  CHECK_EQ_INT(DDPLUG_VERSION_MAJOR_OF(t->abi_version), DDPLUG_PLUGIN_ABI_MAJOR);
  uint64_t want = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_DEVICE_MEMORY |
                  DDPLUG_CAP_ASYNC | DDPLUG_CAP_MULTI_NODE | DDPLUG_CAP_ABORT |
                  DDPLUG_CAP_STREAMS | DDPLUG_CAP_P2P | DDPLUG_CAP_SHRINK;
  CHECK_EQ_INT(t->caps, want);
  CHECK(t->group_shrink != NULL);
  for (int d = 1; d < DDPLUG_DTYPE_COUNT_; d++)
    CHECK_MSG(t->dtype_mask & DDPLUG_DTYPE_BIT(d), "dtype %d missing", d);
  CHECK(t->dtype_mask & DDPLUG_DTYPE_BIT(DDPLUG_BFLOAT16));
  CHECK(!(t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BOR)));
  CHECK(!(t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BAND)));
  CHECK(t->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_AVG));
  /* Masks are what the code maps to NCCL types and ops. */
  CHECK_EQ_INT(t->dtype_mask, ddnccl_dtype_mask());
  CHECK_EQ_INT(t->op_mask, ddnccl_op_mask());
  CHECK(t->group_create && t->group_destroy && t->group_abort &&
        t->collective_start && t->request_wait && t->request_test &&
        t->request_free);
  CHECK(t->sampler_create == NULL);
  /* Another major: no table. Only the entry point is exported. */
  CHECK(entry(DDPLUG_MAKE_VERSION(2, 0)) == NULL);
  CHECK(dlsym(h, "ddnccl_group_create") == NULL);
  CHECK(dlsym(h, "ddnccl_fail") == NULL);
  dlclose(h);
}

/* ---- plugin_options --------------------------------------------------- */

/* The declared options, read back through the host services as the plugin
 * reads them (the fake stands in for the runtime's check). */
TEST(options_read_valid) {
  fake_store *s = store_new();
  fake_rank fr;
  rank_init(&fr, s, 0);
  fake_world w;
  world_init(&w, 1, "{\"device_map\":[1,0,3],\"allow_shared_gpu\":true,\"check_mismatch\":false}",
             1000);
  ddnccl_options o;
  char err[512] = "";
  CHECK_OK(ddnccl_options_read(&fr.svc, &o, err, sizeof err));
  CHECK_EQ_INT(o.device_map_len, 3);
  CHECK_EQ_INT(o.device_map[0], 1);
  CHECK_EQ_INT(o.device_map[2], 3);
  CHECK_EQ_INT(o.allow_shared_gpu, 1);
  CHECK_EQ_INT(o.check_mismatch, 0);
  CHECK_EQ_INT(o.shrink_auto, 0);
  ddnccl_options_free(&o);
  world_init(&w, 1, "{}", 1000);
  CHECK_OK(ddnccl_options_read(&fr.svc, &o, err, sizeof err));
  CHECK(o.device_map == NULL && !o.allow_shared_gpu && !o.check_mismatch && !o.shrink_auto);
  world_init(&w, 1, "{\"shrink\": \"auto\"}", 1000);
  CHECK_OK(ddnccl_options_read(&fr.svc, &o, err, sizeof err));
  CHECK_EQ_INT(o.shrink_auto, 1);
  store_free(s);
}

/* Data-driven: bad plugin_options and the exact sentence the runtime gives
 * from the plugin's declarations. */
static const struct {
  const char *json, *error;
} bad_options[] = {
    {"{\"devcie_map\":[0]}",
     "plugin_options.devcie_map: plugin nccl has no such option (did you mean 'device_map'? "
     "its options: device_map, allow_shared_gpu, check_mismatch, shrink)"},
    {"{\"device_map\":\"0,1\"}",
     "plugin_options.device_map: expected an array of 1..4096 integers, got \"0,1\""},
    {"{\"device_map\":[0,-1]}", "plugin_options.device_map[1]: -1 is out of range 0..1023"},
    {"{\"device_map\":[0,1.5]}",
     "plugin_options.device_map[1]: expected an integer in 0..1023, got 1.5"},
    {"{\"device_map\":[]}",
     "plugin_options.device_map: expected an array of 1..4096 integers, got an array"},
    {"{\"allow_shared_gpu\":1}", "plugin_options.allow_shared_gpu: expected true or false, got 1"},
    {"{\"check_mismatch\":\"yes\"}",
     "plugin_options.check_mismatch: expected true or false, got \"yes\""},
    {"{\"shrink\":\"in_place\"}",
     "plugin_options.shrink: \"in_place\" is not one of \"recreate\", \"auto\""},
};

TEST(options_errors_name_the_key) {
  const ddplug_plugin *t = ddplug_plugin_entry_v1(DDPLUG_PLUGIN_ABI_VERSION);
  for (size_t i = 0; i < sizeof bad_options / sizeof bad_options[0]; i++) {
    json_t *v = NULL;
    CHECK_EQ_INT(ddplug__options_check(t, bad_options[i].json, &v), DDPLUG_E_CONFIG);
    CHECK_MSG(!strcmp(ddplug_last_error(), bad_options[i].error),
              "options %s:\n  got      '%s'\n  expected '%s'", bad_options[i].json,
              ddplug_last_error(), bad_options[i].error);
  }
}

/* ---- device choice ---------------------------------------------------- */

TEST(pick_device_rules) {
  ddnccl_options none = {0}, shared = {0};
  shared.allow_shared_gpu = 1;
  int32_t map[3] = {2, 0, 1};
  ddnccl_options mapped = {.device_map = map, .device_map_len = 3};
  char err[512];
  int32_t d = -1;
  /* one visible device (the launcher bound it): always 0 */
  CHECK_OK(ddnccl_pick_device(&none, 3, 4, 1, &d, err, sizeof err));
  CHECK_EQ_INT(d, 0);
  /* local rank → device */
  CHECK_OK(ddnccl_pick_device(&none, 2, 4, 4, &d, err, sizeof err));
  CHECK_EQ_INT(d, 2);
  /* more ranks than devices: error, or round robin when sharing is allowed */
  CHECK_EQ_INT(ddnccl_pick_device(&none, 2, 3, 2, &d, err, sizeof err),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(err, "local rank 2 of 3 on this node has no GPU of its own");
  CHECK_CONTAINS(err, "checks.duplicate_gpu = \"warn\" or \"allow\"");
  CHECK_OK(ddnccl_pick_device(&shared, 2, 3, 2, &d, err, sizeof err));
  CHECK_EQ_INT(d, 0);
  /* device_map */
  CHECK_OK(ddnccl_pick_device(&mapped, 0, 3, 3, &d, err, sizeof err));
  CHECK_EQ_INT(d, 2);
  CHECK_EQ_INT(ddnccl_pick_device(&mapped, 0, 3, 2, &d, err, sizeof err),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(err, "plugin_options.device_map[0] = 2, but this process sees "
                      "only 2 CUDA devices");
  CHECK_EQ_INT(ddnccl_pick_device(&mapped, 1, 4, 3, &d, err, sizeof err),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(err, "plugin_options.device_map has 3 entries but this node "
                      "runs 4 ranks");
}

TEST(no_device_text_says_why) {
  char buf[1024];
  ddnccl_no_device_text(cudaErrorInsufficientDriver, buf, sizeof buf);
  CHECK_CONTAINS(buf, "no CUDA device visible (");
  CHECK_CONTAINS(buf, "CUDA_VISIBLE_DEVICES");
  CHECK_CONTAINS(buf, "driver: ");
  CHECK_CONTAINS(buf, "cudaErrorInsufficientDriver");
  CHECK_CONTAINS(buf, "use the \"cpu\" plugin");
  setenv("CUDA_VISIBLE_DEVICES", "7", 1);
  ddnccl_no_device_text(cudaErrorNoDevice, buf, sizeof buf);
  CHECK_CONTAINS(buf, "CUDA_VISIBLE_DEVICES=\"7\"");
  int dv = -1;
  if (cudaDriverGetVersion(&dv) == cudaSuccess && dv == 0)
    CHECK_CONTAINS(buf, "driver: none loaded");
  if (dv > 0)
    dt_fds_kept_by_process("the CUDA driver the text asked for keeps its files open until exit");
}

/* ---- device records and the duplicate-GPU verdict --------------------- */

static ddnccl_devrec rec(int rank, int ordinal, const char *uuid,
                         const char *host, int version, int env) {
  ddnccl_devrec r;
  memset(&r, 0, sizeof r);
  r.rank = rank;
  r.ordinal = ordinal;
  r.nccl_version = version;
  r.multi_rank_env = env;
  snprintf(r.uuid, sizeof r.uuid, "%s", uuid);
  snprintf(r.pci, sizeof r.pci, "0000:3b:00.0");
  snprintf(r.name, sizeof r.name, "NVIDIA H100 80GB HBM3");
  snprintf(r.host, sizeof r.host, "%s", host);
  return r;
}

TEST(device_record_round_trip) {
  ddnccl_devrec a = rec(5, 1, "GPU-0a1b2c3d-0000-1111-2222-333344445555",
                        "node-b", 23007, 1), b;
  char buf[1024];
  size_t n = ddnccl_devrec_format(&a, buf, sizeof buf);
  CHECK(n > 0 && n < sizeof buf);
  CHECK_EQ_INT(ddnccl_devrec_parse(buf, n, &b), 0);
  CHECK_EQ_INT(b.rank, 5);
  CHECK_EQ_INT(b.ordinal, 1);
  CHECK_EQ_INT(b.nccl_version, 23007);
  CHECK_EQ_INT(b.multi_rank_env, 1);
  CHECK_EQ_STR(b.uuid, a.uuid);
  CHECK_EQ_STR(b.host, "node-b");
  CHECK_EQ_STR(b.name, a.name);
  CHECK_EQ_INT(ddnccl_devrec_parse("rank=1\nordinal=0\n", 18, &b), -1);
}

#define U0 "GPU-00000000-0000-0000-0000-000000000000"
#define U1 "GPU-11111111-1111-1111-1111-111111111111"

TEST(duplicate_gpu_names_both_ranks_and_the_device) {
  char err[1024];
  int shared = -1;
  ddnccl_devrec ok[3] = {rec(0, 0, U0, "node-a", 23007, 0),
                              rec(1, 1, U1, "node-a", 23007, 0),
                              rec(2, 0, U0, "node-b", 23007, 0)};
  CHECK_OK(ddnccl_check_devices(ok, 3, 0, &shared, err, sizeof err));
  CHECK_EQ_INT(shared, 0);

  /* Two processes with CUDA_VISIBLE_DEVICES pointing at the same GPU. */
  ddnccl_devrec dup[2] = {rec(0, 0, U1, "node-a", 23007, 0),
                               rec(1, 0, U1, "node-a", 23007, 0)};
  CHECK_EQ_INT(ddnccl_check_devices(dup, 2, 0, &shared, err, sizeof err),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(err, "ranks 0 and 1 are bound to the same GPU " U1
                      " (NVIDIA H100 80GB HBM3, PCI 0000:3b:00.0) on host node-a "
                      "(rank 0 as cuda:0, rank 1 as cuda:0)");
  CHECK_CONTAINS(err, "checks.duplicate_gpu = \"warn\" or \"allow\"");

  ddnccl_devrec three[3] = {rec(0, 0, U0, "h", 23007, 0),
                                 rec(1, 0, U0, "h", 23007, 0),
                                 rec(2, 0, U0, "h", 23007, 0)};
  CHECK_EQ_INT(ddnccl_check_devices(three, 3, 0, NULL, err, sizeof err),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(err, "ranks 0, 1 and 2 are bound to the same GPU");
}

TEST(shared_gpu_needs_nccl_2_30_and_the_env) {
  char err[1024];
  int shared = -1;
  ddnccl_devrec good[2] = {rec(0, 0, U0, "h", 23007, 1),
                                rec(1, 0, U0, "h", 23007, 1)};
  CHECK_OK(ddnccl_check_devices(good, 2, 1, &shared, err, sizeof err));
  CHECK_EQ_INT(shared, 1);
  ddnccl_devrec old[2] = {rec(0, 0, U0, "h", 22703, 1),
                               rec(1, 0, U0, "h", 22703, 1)};
  CHECK_EQ_INT(ddnccl_check_devices(old, 2, 1, &shared, err, sizeof err),
               DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(err, "rank 0 runs NCCL 2.27.3, which cannot put two ranks on one GPU");
  ddnccl_devrec noenv[2] = {rec(0, 0, U0, "h", 23007, 1),
                                 rec(1, 0, U0, "h", 23007, 0)};
  CHECK_EQ_INT(ddnccl_check_devices(noenv, 2, 1, &shared, err, sizeof err),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(err, "rank 1 runs without NCCL_MULTI_RANK_GPU_ENABLE=1");
}

/* ---- agreement across thread-ranks ------------------------------------ */

typedef struct agree_arg {
  fake_rank fr;
  int world, local_status;
  int64_t timeout_ms;
  int result;
  char msg[DDNCCL_MSG_MAX];
} agree_arg;

static void *agree_thread(void *p) {
  agree_arg *a = p;
  char local[64];
  snprintf(local, sizeof local, "broken on purpose (%d)", a->fr.rank);
  uint64_t dl = ddnccl_now_ns() + (uint64_t)a->timeout_ms * 1000000ull;
  a->result = ddnccl_agree(&a->fr.svc, "t", a->fr.rank, a->world,
                           a->local_status, local, dl, a->msg, sizeof a->msg);
  return NULL;
}

/* Ranks 0..arrive-1 of world agree on phase "t"; rank r's local outcome is
 * status[r] (NULL: all OK). Returns the store (free it). */
static fake_store *agree_run(agree_arg *a, int world, int arrive,
                             int64_t timeout_ms, const int *status) {
  fake_store *s = store_new();
  for (int r = 0; r < arrive; r++) {
    memset(&a[r], 0, sizeof a[r]);
    rank_init(&a[r].fr, s, r);
    a[r].world = world;
    a[r].timeout_ms = timeout_ms;
    a[r].local_status = status ? status[r] : DDPLUG_OK;
  }
  run_threads(arrive, agree_thread, a, sizeof a[0]);
  return s;
}

TEST(agree_reports_a_failure_on_every_rank) {
  agree_arg a[3];
  const int status[3] = {DDPLUG_OK, DDPLUG_E_UNSUPPORTED, DDPLUG_OK};
  fake_store *s = agree_run(a, 3, 3, 60000, status);
  for (int r = 0; r < 3; r++) {
    CHECK_EQ_INT(a[r].result, DDPLUG_E_UNSUPPORTED);
    CHECK_EQ_STR(a[r].msg, "rank 1: broken on purpose (1)");
  }
  store_free(s);
}

TEST(agree_all_ok_and_two_failures) {
  agree_arg a[3];
  fake_store *s = agree_run(a, 3, 3, 60000, NULL);
  for (int r = 0; r < 3; r++) CHECK_OK(a[r].result);
  CHECK(!store_has(s, "t/left-all")); /* success needs no second round */
  store_free(s);

  const int status[3] = {DDPLUG_OK, DDPLUG_E_CONFIG, DDPLUG_E_CONFIG};
  s = agree_run(a, 3, 3, 60000, status);
  CHECK_EQ_INT(a[0].result, DDPLUG_E_CONFIG);
  CHECK_CONTAINS(a[0].msg, "(and 1 more rank failed)");
  CHECK_EQ_STR(a[1].msg, "rank 1: broken on purpose (1)"); /* own cause */
  CHECK_EQ_STR(a[2].msg, "rank 2: broken on purpose (2)");
  store_free(s);
}

TEST(agree_names_ranks_that_never_arrive) {
  agree_arg a[3];
  /* Rank 2 never comes. The waits time out once both other ranks have
   * announced themselves (the store holds the timeouts until then), so each
   * names rank 2 alone however late the other thread started. */
  fake_store *s = store_new();
  store_hold_timeouts(s);
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    memset(&a[r], 0, sizeof a[r]);
    rank_init(&a[r].fr, s, r);
    a[r].world = 3;
    a[r].timeout_ms = 60000;
    CHECK(pthread_create(&t[r], NULL, agree_thread, &a[r]) == 0);
  }
  for (int i = 0; !store_has(s, "t/in/0") || !store_has(s, "t/in/1"); i++) {
    CHECK_MSG(i < 30000, "ranks 0 and 1 never announced themselves");
    usleep(1000);
  }
  store_expire_timeouts(s);
  for (int r = 0; r < 2; r++) CHECK(pthread_join(t[r], NULL) == 0);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(a[r].result, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(a[r].msg, "nccl setup (t): rank 2 did not arrive in time");
  }
  store_free(s);
}

/* ---- group_create without a GPU --------------------------------------- */

typedef struct create_arg {
  fake_rank fr;
  const ddplug_group_init *init;
  const ddplug_plugin *table; /* NULL: the linked objects */
  int result;
  ddplug_plugin_group *group;
} create_arg;

static void *create_thread(void *p) {
  create_arg *a = p;
  a->group = NULL;
  a->result = a->table ? a->table->group_create(a->init, &a->fr.svc, &a->group)
                       : ddnccl_group_create(a->init, &a->fr.svc, &a->group);
  return NULL;
}

/* world thread-ranks call group_create with plugin_options `options`
 * through table (NULL: the linked objects). Returns the store. */
static fake_store *create_run(create_arg *a, fake_world *w, int world,
                              const char *options, const ddplug_plugin *table) {
  fake_store *s = store_new();
  world_init(w, world, options, 60000); /* a hang guard */
  for (int r = 0; r < world; r++) {
    memset(&a[r], 0, sizeof a[r]);
    rank_init(&a[r].fr, s, r);
    a[r].init = &w->init[r];
    a[r].table = table;
  }
  run_threads(world, create_thread, a, sizeof a[0]);
  return s;
}

static int have_gpu(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(group_create_fails_cleanly_without_a_gpu_one_rank) {
  if (have_gpu()) dt_skip("a GPU is visible: the no-GPU path cannot be shown");
  void *h = dlopen(plugin_path(), RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(h != NULL, "dlopen: %s", dlerror());
  ddplug_plugin_entry_fn entry =
      (ddplug_plugin_entry_fn)dlsym(h, DDPLUG_PLUGIN_ENTRY_SYMBOL);
  create_arg a[1];
  fake_world w;
  fake_store *s = create_run(a, &w, 1, "{}", entry(DDPLUG_PLUGIN_ABI_VERSION));
  CHECK_EQ_INT(a[0].result, DDPLUG_E_UNSUPPORTED);
  CHECK(a[0].group == NULL);
  CHECK_EQ_INT(a[0].fr.err_status, DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(a[0].fr.err,
                 "nccl: rank 0: no CUDA device visible (CUDA_VISIBLE_DEVICES");
  CHECK_CONTAINS(a[0].fr.err, "driver: ");
  dt_note("%s", a[0].fr.err);
  store_free(s);
  dlclose(h);
}

TEST(group_create_fails_on_every_rank_without_a_gpu) {
  if (have_gpu()) dt_skip("a GPU is visible: the no-GPU path cannot be shown");
  create_arg a[2];
  fake_world w;
  fake_store *s = create_run(a, &w, 2, "{\"allow_shared_gpu\":true}", NULL);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(a[r].result, DDPLUG_E_UNSUPPORTED);
    CHECK(a[r].group == NULL);
    char want[64];
    snprintf(want, sizeof want, "nccl: rank %d: no CUDA device visible", r);
    CHECK_CONTAINS(a[r].fr.err, want);
  }
  /* Both ranks left the setup phase together. */
  CHECK(store_has(s, "setup/left-all"));
  store_free(s);
}

TEST(group_create_checks_options_before_the_device) {
  create_arg a[2];
  fake_world w;
  fake_store *s =
      create_run(a, &w, 2, "{\"device_map\":[0,0],\"nope\":1}", NULL);
  for (int r = 0; r < 2; r++) {
    /* (the runtime refuses these before group_create; a plugin called
     * anyway fails on the options, before touching the device) */
    CHECK_EQ_INT(a[r].result, DDPLUG_E_CONFIG);
    CHECK_CONTAINS(a[r].fr.err, "plugin_options: the runtime refused them (CONFIG)");
  }
  store_free(s);
}

TEST(group_create_rejects_bad_arguments) {
  fake_store *s = store_new();
  fake_rank fr;
  rank_init(&fr, s, 0);
  fake_world w;
  world_init(&w, 2, "{}", 1000);
  ddplug_plugin_group *g = NULL;
  w.init[0].rank = 2;
  CHECK_EQ_INT(ddnccl_group_create(&w.init[0], &fr.svc, &g),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(fr.err, "rank 2 of world 2");
  w.init[0].rank = 0;
  w.init[0].struct_size = 16;
  CHECK_EQ_INT(ddnccl_group_create(&w.init[0], &fr.svc, &g),
               DDPLUG_E_ABI_MISMATCH);
  ddplug_host_services small = fr.svc;
  small.struct_size = 16;
  CHECK_EQ_INT(ddnccl_group_create(&w.init[0], &small, &g),
               DDPLUG_E_ABI_MISMATCH);
  CHECK(g == NULL);
  store_free(s);
}

/* ---- failure state, abort propagation, mismatch check ----------------- */

/* A group as group_create leaves it, minus NCCL and CUDA (comm NULL). */
static ddplug_plugin_group *bare_group(fake_rank *fr, int rank, int world,
                                       int64_t timeout_ms) {
  ddplug_plugin_group *g = calloc(1, sizeof *g);
  g->svc = &fr->svc;
  g->rank = rank;
  g->world = world;
  g->timeout_ms = timeout_ms;
  g->log_level = DDPLUG_LOG_WARN;
  g->device = 0;
  pthread_mutex_init(&g->comm_mu, NULL);
  atomic_init(&g->failed, 0);
  return g;
}

static void bare_free(ddplug_plugin_group *g) {
  pthread_mutex_destroy(&g->comm_mu);
  free(g);
}

static ddplug_coll_args allreduce_args(uint64_t seq, uint64_t count) {
  return coll_args(DDPLUG_COLL_ALLREDUCE, NULL, NULL, count, DDPLUG_FLOAT32,
                   DDPLUG_OP_SUM, 0, NULL, seq);
}

TEST(abort_is_published_and_later_calls_fail) {
  fake_store *s = store_new();
  fake_rank r0, r1;
  rank_init(&r0, s, 0);
  rank_init(&r1, s, 1);
  ddplug_plugin_group *g0 = bare_group(&r0, 0, 2, 5000);
  ddplug_plugin_group *g1 = bare_group(&r1, 1, 2, 5000);
  CHECK_OK(ddnccl_group_abort(g0, "user pressed ctrl-c"));
  CHECK(atomic_load(&g0->failed));
  char buf[256];
  uint64_t len = 0;
  CHECK_OK(fs_get(&r0, "abort", buf, sizeof buf - 1, &len, 0));
  buf[len] = '\0';
  CHECK_EQ_STR(buf, "rank 0: aborted on rank 0: user pressed ctrl-c");
  /* Every later call on the aborted group says so, before touching CUDA. */
  ddplug_coll_args a = allreduce_args(1, 4);
  ddplug_plugin_request *req = NULL;
  CHECK_EQ_INT(ddnccl_collective_start(g0, &a, &req), DDPLUG_E_ABORTED);
  CHECK(req == NULL);
  CHECK_CONTAINS(r0.err, "the nccl group failed earlier and cannot be used any "
                         "more (ABORTED: aborted on rank 0: user pressed ctrl-c)");
  /* The peer sees it at its next look at the store. */
  CHECK_EQ_INT(ddnccl_check_peer_abort(g1), DDPLUG_E_ABORTED);
  CHECK_CONTAINS(r1.err, "aborted through the store by rank 0: aborted on rank 0");
  /* A second abort keeps the first reason. */
  CHECK_OK(ddnccl_group_abort(g1, "later"));
  CHECK_OK(fs_get(&r0, "abort", buf, sizeof buf - 1, &len, 0));
  buf[len] = '\0';
  CHECK_CONTAINS(buf, "user pressed ctrl-c");
  bare_free(g0);
  bare_free(g1);
  store_free(s);
}

TEST(a_run_aborted_by_the_runtime_fails_the_group) {
  fake_store *s = store_new();
  fake_rank r0;
  rank_init(&r0, s, 0);
  ddplug_plugin_group *g = bare_group(&r0, 0, 2, 5000);
  CHECK_OK(ddnccl_check_peer_abort(g)); /* nothing happened yet */
  CHECK(!atomic_load(&g->failed));
  s->run_status = DDPLUG_E_PEER_LOST; /* e.g. rank 1 was killed */
  CHECK_EQ_INT(ddnccl_check_peer_abort(g), DDPLUG_E_PEER_LOST);
  CHECK(atomic_load(&g->failed));
  CHECK_CONTAINS(r0.err, "the run was aborted or lost its store (PEER_LOST)");
  ddplug_coll_args a = allreduce_args(1, 4);
  ddplug_plugin_request *req = NULL;
  CHECK_EQ_INT(ddnccl_collective_start(g, &a, &req), DDPLUG_E_ABORTED);
  bare_free(g);
  store_free(s);
}

typedef struct mm_arg {
  fake_rank fr;
  ddplug_plugin_group *g;
  ddplug_coll_args a;
  int result;
} mm_arg;

static void *mm_thread(void *p) {
  mm_arg *m = p;
  m->result = ddnccl_check_mismatch(m->g, &m->a);
  return NULL;
}

/* n thread-ranks of a world of `world`, each with a bare group. */
static fake_store *mm_init(mm_arg *m, int n, int world, int64_t timeout_ms) {
  fake_store *s = store_new();
  for (int r = 0; r < n; r++) {
    memset(&m[r], 0, sizeof m[r]);
    rank_init(&m[r].fr, s, r);
    m[r].g = bare_group(&m[r].fr, r, world, timeout_ms);
  }
  return s;
}

static void mm_free(mm_arg *m, int n, fake_store *s) {
  for (int r = 0; r < n; r++) bare_free(m[r].g);
  store_free(s);
}

TEST(mismatch_check_names_the_rank_and_both_calls) {
  mm_arg m[3];
  fake_store *s = mm_init(m, 3, 3, 60000); /* a hang guard: every rank comes */
  /* seq 1 agrees */
  for (int r = 0; r < 3; r++) m[r].a = allreduce_args(1, 10);
  run_threads(3, mm_thread, m, sizeof m[0]);
  for (int r = 0; r < 3; r++) CHECK_OK(m[r].result);
  /* seq 2: rank 2 reduces 12 elements */
  for (int r = 0; r < 3; r++) m[r].a = allreduce_args(2, r == 2 ? 12 : 10);
  run_threads(3, mm_thread, m, sizeof m[0]);
  for (int r = 0; r < 3; r++) {
    CHECK_EQ_INT(m[r].result, DDPLUG_E_MISMATCH);
    CHECK_EQ_STR(m[r].fr.err,
                 "collective seq 2 differs across ranks: rank 2 called "
                 "allreduce(count=12, float32, sum) but rank 0 called "
                 "allreduce(count=10, float32, sum)");
  }
  /* seq 3: rank 1 broadcasts instead */
  for (int r = 0; r < 3; r++) m[r].a = allreduce_args(3, 10);
  m[1].a.kind = DDPLUG_COLL_BROADCAST;
  m[1].a.op = 0;
  run_threads(3, mm_thread, m, sizeof m[0]);
  CHECK_EQ_INT(m[1].result, DDPLUG_E_MISMATCH);
  CHECK_CONTAINS(m[1].fr.err, "rank 1 called broadcast(count=10, float32, root=0)");
  /* Old keys are cleaned up: only the last verdict remains. */
  CHECK(!store_has(s, "mm/1/verdict"));
  CHECK(!store_has(s, "mm/2/1"));
  CHECK(store_has(s, "mm/3/verdict"));
  mm_free(m, 3, s);
}

TEST(mismatch_check_times_out_naming_the_missing_rank) {
  mm_arg m[2];
  /* Rank 2 never calls. Rank 0 gives up on it after its timeout and
   * publishes that verdict; rank 1 waits for the verdict. The outcome
   * depends on no clock: rank 0 starts only once rank 1's description is
   * in the store (so rank 2 is the only one missing when rank 0 gives up),
   * and rank 1's own timeout, a minute, is only a hang guard (the verdict
   * comes); rank 0's can be short, since waiting for a rank that never
   * comes always times out. */
  fake_store *s = mm_init(m, 2, 3, 300);
  m[1].g->timeout_ms = 60000;
  for (int r = 0; r < 2; r++) m[r].a = allreduce_args(1, 10);
  pthread_t t0, t1;
  CHECK(pthread_create(&t1, NULL, mm_thread, &m[1]) == 0);
  for (int i = 0; !store_has(s, "mm/1/1"); i++) {
    CHECK_MSG(i < 30000, "rank 1 never published its description");
    usleep(1000);
  }
  CHECK(pthread_create(&t0, NULL, mm_thread, &m[0]) == 0);
  CHECK(pthread_join(t0, NULL) == 0 && pthread_join(t1, NULL) == 0);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(m[r].result, DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(m[r].fr.err, "collective seq 1: rank 2 did not reach it within 0.3 s");
  }
  mm_free(m, 2, s);
}

#endif /* DDPLUG_TEST_NCCL */
