/* test-nccl-open.c — the nccl plugin through the runtime, on a machine
 * without a GPU: the loader finds and describes it. When the plugin is not
 * built, every case skips (exit 77). */
#include <stdlib.h>

#include "harness.h"

#ifndef DDPLUG_TEST_NCCL

TEST(nccl_plugin_not_built) {
  dt_skip("the nccl plugin was not built (no CUDA toolkit or NCCL found)");
}

#else

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

#endif /* DDPLUG_TEST_NCCL */
