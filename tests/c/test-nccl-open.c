/* test-nccl-open.c — the nccl plugin through the runtime (the shared
 * libddplug: DT_LINK_SHARED) on a machine without a GPU: the loader finds
 * and describes it; ddplug_open with plugin "nccl" fails on every rank (1
 * and 2 real rank processes over the real store) with the clear no-device
 * error — DDPLUG_E_UNSUPPORTED, not a crash or a hang; bad plugin_options
 * are DDPLUG_E_CONFIG naming the key on every rank. Cases that need the
 * absence of a GPU skip where one is visible (test-nccl-gpu covers that
 * machine); every case skips when the plugin is not built. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#ifndef DDPLUG_TEST_NCCL

TEST(nccl_plugin_not_built) {
  dt_skip("the nccl plugin was not built (no CUDA toolkit or NCCL found)");
}

#else

#include <cuda_runtime_api.h>

TEST(inspect_reports_nccl) {
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_plugin_inspect("nccl", &info));
  CHECK_EQ_STR(info.name, "nccl");
  CHECK_EQ_STR(info.version, DDPLUG_LIB_VERSION_STRING);
  CHECK_CONTAINS(info.description, "NCCL");
  CHECK_CONTAINS(info.path, "/lib/libddplug-nccl.so");
  CHECK_EQ_INT(DDPLUG_VERSION_MAJOR_OF(info.plugin_abi_version), 1);
  CHECK(info.caps & DDPLUG_CAP_DEVICE_MEMORY);
  CHECK(info.caps & DDPLUG_CAP_HOST_MEMORY);
  CHECK(info.caps & DDPLUG_CAP_STREAMS);
  CHECK(info.caps & DDPLUG_CAP_ABORT);
  CHECK(info.dtype_mask & DDPLUG_DTYPE_BIT(DDPLUG_BFLOAT16));
  CHECK(info.op_mask & DDPLUG_OP_BIT(DDPLUG_OP_AVG));
  CHECK(!(info.op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BOR)));
  CHECK(!(info.op_mask & DDPLUG_OP_BIT(DDPLUG_OP_BAND)));
  CHECK_EQ_INT(info.has_sampler, 0);
}

/* Skips the case where a GPU is visible. Asked in a child so that this
 * process, which forks the ranks, never initialises CUDA. */
static void count_gpus(void *arg) {
  (void)arg;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  _exit(n > 100 ? 100 : n);
}

static void need_no_gpu(void) {
  int st = 0;
  pid_t pid = dt_fork(count_gpus, NULL);
  CHECK(pid > 0 && dt_wait_pid(pid, 30000, &st) == 0);
  if (WIFEXITED(st) && WEXITSTATUS(st) > 0)
    dt_skip("%d GPU(s) visible: the no-GPU path cannot be shown here",
            WEXITSTATUS(st));
}

typedef struct expect {
  int status;
  const char *needles[3];
} expect;

static void open_fails(int rank, int world, void *arg) {
  const expect *e = arg;
  ddplug_context *ctx = NULL;
  int st = ddplug_open(NULL, NULL, &ctx);
  dt_note("rank %d of %d: %s: %s", rank, world, ddplug_status_name(st),
          ddplug_last_error());
  CHECK(ctx == NULL);
  CHECK_EQ_INT(st, e->status);
  for (int i = 0; i < 3 && e->needles[i]; i++)
    CHECK_CONTAINS(ddplug_last_error(), e->needles[i]);
}

#define NCCL_CONFIG(opts)                                                      \
  "DDPLUG_CONFIG={\"plugin\": \"nccl\", \"rendezvous\": {\"timeout_s\": 30}, " \
  "\"timeouts\": {\"collective_s\": 30}, \"plugin_options\": " opts "}"

static const expect no_device = {
    DDPLUG_E_UNSUPPORTED,
    {"no CUDA device visible (CUDA_VISIBLE_DEVICES", "driver: ",
     "use the \"cpu\" plugin"}};

TEST(open_one_rank_without_a_gpu_is_unsupported) {
  need_no_gpu();
  static const char *env[] = {NCCL_CONFIG("{}"), NULL};
  CHECK_EQ_INT(dt_run_ranks(1, open_fails, (void *)&no_device, env, 50, NULL), 0);
}

TEST(open_two_ranks_without_a_gpu_fails_on_every_rank) {
  need_no_gpu();
  static const char *env[] = {NCCL_CONFIG("{\"allow_shared_gpu\": true}"), NULL};
  CHECK_EQ_INT(dt_run_ranks(2, open_fails, (void *)&no_device, env, 50, NULL), 0);
}

TEST(open_with_bad_plugin_options_names_the_key) {
  static const char *env[] = {NCCL_CONFIG("{\"device_mapp\": [0, 1]}"), NULL};
  static const expect bad = {
      DDPLUG_E_CONFIG,
      {"plugin_options.device_mapp: plugin nccl has no such option (did you mean 'device_map'?",
       "its options: device_map, allow_shared_gpu, check_mismatch, shrink)", NULL}};
  CHECK_EQ_INT(dt_run_ranks(2, open_fails, (void *)&bad, env, 50, NULL), 0);
}

#endif /* DDPLUG_TEST_NCCL */
