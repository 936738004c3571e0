/* version.c — versions and the static name tables for dtypes, ops, owners.
 * SPDX-License-Identifier: Apache-2.0 */
#include "base/base.h"

DDPLUG_API const char *ddplug_version_string(void) {
  return DDPLUG_LIB_VERSION_STRING;
}
DDPLUG_API uint32_t ddplug_abi_version(void) { return DDPLUG_ABI_VERSION; }
DDPLUG_API uint32_t ddplug_plugin_abi_version(void) {
  return DDPLUG_PLUGIN_ABI_VERSION;
}

DDPLUG_API uint32_t ddplug_dtype_size(int dtype) {
  switch (dtype) {
#define X(name, value, str, size) \
  case value:                     \
    return size;
    DDPLUG_DTYPE_MAP(X)
#undef X
    default:
      return 0;
  }
}

DDPLUG_API const char *ddplug_dtype_name(int dtype) {
  switch (dtype) {
#define X(name, value, str, size) \
  case value:                     \
    return str;
    DDPLUG_DTYPE_MAP(X)
#undef X
    default:
      return NULL;
  }
}

DDPLUG_API const char *ddplug_op_name(int op) {
  switch (op) {
#define X(name, value, str) \
  case value:               \
    return str;
    DDPLUG_OP_MAP(X)
#undef X
    default:
      return NULL;
  }
}

DDPLUG_API const char *ddplug_owner_name(int owner) {
  switch (owner) {
    case DDPLUG_OWNER_UNSET: return "unset";
    case DDPLUG_OWNER_PLUGIN: return "plugin";
    case DDPLUG_OWNER_FRAMEWORK: return "framework";
    case DDPLUG_OWNER_USER: return "user";
    default: return NULL;
  }
}
