/*
 * ddplug/common.h — the vocabulary shared by the host API (ddplug.h) and the
 * plugin ABI (plugin.h): export macro, version encoding, status codes, dtypes,
 * reduce ops, capability bits, log levels and timeouts.
 *
 * Everything here is part of the stable ABI. Values are never renumbered or
 * reused within a major version; new values are only appended.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_COMMON_H
#define DDPLUG_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Export macro. Everything not marked DDPLUG_API is hidden
 * (-fvisibility=hidden); the linker version script (abi/src/ddplug.map)
 * puts ddplug/store.h's functions in the node DDPLUG_EXPERIMENTAL and every
 * other ddplug_* name in DDPLUG_1.0, and tests/c/test-exports.c checks that
 * the exported names are exactly the DDPLUG_API declarations.             */
#if defined(DDPLUG_BUILDING_LIBRARY)
#  define DDPLUG_API __attribute__((visibility("default")))
#else
#  define DDPLUG_API
#endif

/* A plugin's entry point is the only symbol a plugin exports. */
#define DDPLUG_PLUGIN_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* Versions are encoded as (major << 16) | minor. Every struct that crosses
 * the boundary starts with {uint32_t struct_size; uint32_t abi_version;}.
 * A reader copies min(struct_size, sizeof(its struct)) bytes and gives any
 * field the writer did not know about its documented default ("0 = unset"). */
#define DDPLUG_MAKE_VERSION(major, minor) \
  ((uint32_t)(((uint32_t)(major) << 16) | ((uint32_t)(minor) & 0xffffu)))
#define DDPLUG_VERSION_MAJOR_OF(v) ((uint32_t)(v) >> 16)
#define DDPLUG_VERSION_MINOR_OF(v) ((uint32_t)(v) & 0xffffu)

/* The library's own release version (not an ABI version). */
#define DDPLUG_LIB_VERSION_MAJOR 0
#define DDPLUG_LIB_VERSION_MINOR 2
#define DDPLUG_LIB_VERSION_PATCH 0
#define DDPLUG_LIB_VERSION_STRING "0.2.0"

/* ------------------------------------------------------------------------ */
/* Status codes. Every call of the host API and of the plugin ABI returns one
 * of these (as int). 0 is success; the others are positive. The detail — which
 * rank, which key, FILE:LINE:COLUMN, which sequence number — is in the last-
 * error text (ddplug_last_error(), ddplug_context_error()).
 * X(NAME, value, short message): one table generates the enum, the names and
 * the messages (ddplug_strerror, ddplug_status_name).                        */
#define DDPLUG_STATUS_MAP(X)                                                   \
  X(OK, 0, "success")                                                          \
  X(INVALID_ARGUMENT, 1, "invalid argument")                                   \
  X(CONFIG, 2, "invalid configuration")                                        \
  X(NOT_FOUND, 3, "not found")                                                 \
  X(ABI_MISMATCH, 4, "ABI version mismatch")                                   \
  X(UNSUPPORTED, 5, "not supported")                                           \
  X(TIMEOUT, 6, "timed out")                                                   \
  X(PEER_LOST, 7, "peer lost")                                                 \
  X(MISMATCH, 8, "collectives differ across ranks")                            \
  X(ABORTED, 9, "aborted")                                                     \
  X(SPLIT_CONFLICT, 10, "data split ownership conflict")                      \
  X(AUDIT_FAILED, 11, "data split audit failed")                               \
  X(SYSTEM, 12, "system error")                                                \
  X(INTERNAL, 13, "internal error")                                            \
  X(NO_MEMORY, 14, "out of memory")

typedef enum ddplug_status {
#define DDPLUG__STATUS_ENUM(name, value, msg) DDPLUG_E_##name = value,
  DDPLUG_STATUS_MAP(DDPLUG__STATUS_ENUM)
#undef DDPLUG__STATUS_ENUM
  DDPLUG_STATUS_COUNT_ = 15
} ddplug_status;
#define DDPLUG_OK DDPLUG_E_OK

/* ------------------------------------------------------------------------ */
/* Element types. 0 is "unset" and is rejected where a dtype is required.   */
#define DDPLUG_DTYPE_MAP(X)                                                    \
  X(FLOAT32, 1, "float32", 4)                                                  \
  X(FLOAT64, 2, "float64", 8)                                                  \
  X(FLOAT16, 3, "float16", 2)                                                  \
  X(BFLOAT16, 4, "bfloat16", 2)                                                \
  X(INT8, 5, "int8", 1)                                                        \
  X(UINT8, 6, "uint8", 1)                                                      \
  X(INT32, 7, "int32", 4)                                                      \
  X(INT64, 8, "int64", 8)

typedef enum ddplug_dtype {
  DDPLUG_DTYPE_UNSET = 0,
#define DDPLUG__DTYPE_ENUM(name, value, str, size) DDPLUG_##name = value,
  DDPLUG_DTYPE_MAP(DDPLUG__DTYPE_ENUM)
#undef DDPLUG__DTYPE_ENUM
  DDPLUG_DTYPE_COUNT_ = 9
} ddplug_dtype;

/* Reduce operations. BOR/BAND are defined on integer dtypes only. AVG is
 * SUM divided by the world size (integers: truncated toward zero).         */
#define DDPLUG_OP_MAP(X)                                                       \
  X(SUM, 1, "sum")                                                             \
  X(AVG, 2, "avg")                                                             \
  X(MIN, 3, "min")                                                             \
  X(MAX, 4, "max")                                                             \
  X(PROD, 5, "prod")                                                           \
  X(BOR, 6, "bor")                                                             \
  X(BAND, 7, "band")

typedef enum ddplug_op {
  DDPLUG_OP_UNSET = 0,
#define DDPLUG__OP_ENUM(name, value, str) DDPLUG_OP_##name = value,
  DDPLUG_OP_MAP(DDPLUG__OP_ENUM)
#undef DDPLUG__OP_ENUM
  DDPLUG_OP_COUNT_ = 8
} ddplug_op;

/* Masks over dtypes and ops: bit (1u << value). */
#define DDPLUG_DTYPE_BIT(dt) (1u << (uint32_t)(dt))
#define DDPLUG_OP_BIT(op) (1u << (uint32_t)(op))

/* ------------------------------------------------------------------------ */
/* Plugin capability bits (ddplug_plugin.caps).                              */
#define DDPLUG_CAP_HOST_MEMORY     (1ull << 0) /* buffers in host memory      */
#define DDPLUG_CAP_DEVICE_MEMORY   (1ull << 1) /* buffers in device memory    */
#define DDPLUG_CAP_ASYNC           (1ull << 2) /* start returns before done   */
#define DDPLUG_CAP_MULTI_NODE      (1ull << 3) /* ranks on several hosts      */
#define DDPLUG_CAP_MISMATCH_CHECK  (1ull << 4) /* detects MISMATCH collectives*/
#define DDPLUG_CAP_ABORT           (1ull << 5) /* group_abort interrupts ops  */
#define DDPLUG_CAP_STREAMS         (1ull << 6) /* honours the stream argument */
#define DDPLUG_CAP_SAMPLER         (1ull << 7) /* supplies sampler slots      */
#define DDPLUG_CAP_REGISTERED_MEMORY (1ull << 8) /* mem_alloc/free/query slots */
#define DDPLUG_CAP_P2P             (1ull << 9) /* p2p_start: send and receive  */
#define DDPLUG_CAP_P2P_ANY_SOURCE  (1ull << 10) /* a receive may match any sender */
#define DDPLUG_CAP_BOOTSTRAP       (1ull << 11) /* bootstrap_world/_broadcast  */
#define DDPLUG_CAP_SHRINK          (1ull << 12) /* group_shrink re-forms in place */

/* ------------------------------------------------------------------------ */
/* Memory kind of collective buffers (ddplug_coll_args.mem).                */
typedef enum ddplug_mem {
  DDPLUG_MEM_AUTO = 0,   /* the plugin decides (a device plugin asks CUDA) */
  DDPLUG_MEM_HOST = 1,
  DDPLUG_MEM_DEVICE = 2
} ddplug_mem;

/* ------------------------------------------------------------------------ */
/* Log levels. A threshold of DDPLUG_LOG_OFF logs nothing.                  */
typedef enum ddplug_log_level {
  DDPLUG_LOG_OFF = 0,
  DDPLUG_LOG_ERROR = 1,
  DDPLUG_LOG_WARN = 2,
  DDPLUG_LOG_INFO = 3,
  DDPLUG_LOG_DEBUG = 4,
  DDPLUG_LOG_TRACE = 5
} ddplug_log_level;

/* ------------------------------------------------------------------------ */
/* Timeouts are int64 milliseconds. Every blocking call takes one:
 *   > 0                    wait at most that long, then DDPLUG_E_TIMEOUT;
 *   0                      do not block (poll once);
 *   DDPLUG_TIMEOUT_DEFAULT use the configured default (config "timeouts").
 * There is deliberately no "infinite": no rank may hang forever.           */
#define DDPLUG_TIMEOUT_DEFAULT ((int64_t)-1)

/* Data-split owners (see ddplug.h, "Data split ownership").                */
typedef enum ddplug_owner {
  DDPLUG_OWNER_UNSET = 0,
  DDPLUG_OWNER_PLUGIN = 1,    /* ddplug's (or the plugin's) sampler splits */
  DDPLUG_OWNER_FRAMEWORK = 2, /* the host framework's own injection splits */
  DDPLUG_OWNER_USER = 3       /* the user's dataset/sampler is rank-aware   */
} ddplug_owner;

#ifdef __cplusplus
}
#endif
#endif /* DDPLUG_COMMON_H */
