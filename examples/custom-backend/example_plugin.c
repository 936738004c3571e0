/*
 * example_plugin.c — a complete ddplug backend written only against
 * abi/include (plugin.h): libddplug-example.so.
 *
 * It is the smallest correct plugin we can write, meant to be read: every
 * collective goes through the rendezvous store that the runtime lends the
 * plugin (ddplug_host_services). Each rank publishes a header describing its
 * call and its data in chunks; every rank reads everything and reduces in rank
 * order, so results are bit-identical on all ranks. It is slow (everything
 * crosses rank 0's store) and synchronous (no DDPLUG_CAP_ASYNC): use it to
 * learn the ABI, to test hosts, or as a fallback — not for training speed.
 *
 * What it shows:
 *   - one exported symbol, ddplug_plugin_entry_v1, returning a const table;
 *   - identity, capabilities and masks first, then the slots;
 *   - errors explained through set_error (rank, sequence number, what to do);
 *   - mismatch detection from the runtime-assigned sequence numbers;
 *   - declared plugin_options: the runtime checks the user's values and hands
 *     them over typed (plugin ABI 1.3), so the plugin parses no JSON.
 *
 * Build it out of tree with find_package(ddplug CONFIG) and
 * ddplug_add_plugin(example SOURCES example_plugin.c) — see CMakeLists.txt.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddplug/plugin.h"

#define EX_MAX_CHUNK (512u * 1024u) /* bytes per store value */
#ifndef EXAMPLE_VERSION
#define EXAMPLE_VERSION "0.2.0"
#endif

struct ddplug_plugin_group {
  const ddplug_host_services *svc;
  int rank;
  int world_size;
  int64_t timeout_ms;
  size_t chunk;
  atomic_int aborted;
};

struct ddplug_plugin_request {
  int status;
};

/* The header every rank publishes for collective number seq. */
typedef struct ex_header {
  uint64_t seq, count;
  int32_t kind, dtype, op, root, rank, pad;
} ex_header;

static int fail(ddplug_plugin_group *g, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(msg, sizeof msg, "plugin example, rank %d: ", g ? g->rank : -1);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  if (g) g->svc->set_error(g->svc->host, status, msg);
  return status;
}

static size_t dtype_size(int dt) {
  switch (dt) {
    case DDPLUG_FLOAT64: case DDPLUG_INT64: return 8;
    case DDPLUG_FLOAT32: case DDPLUG_INT32: return 4;
    case DDPLUG_INT8: case DDPLUG_UINT8: return 1;
    default: return 0;
  }
}

/* ---- reductions: acc[i] = acc[i] (op) in[i] ------------------------------ */
#define EX_REDUCE_FLOAT(T)                                                   \
  static void reduce_##T(T *acc, const T *in, uint64_t n, int op) {         \
    for (uint64_t i = 0; i < n; i++) switch (op) {                          \
        case DDPLUG_OP_SUM: case DDPLUG_OP_AVG: acc[i] += in[i]; break;      \
        case DDPLUG_OP_PROD: acc[i] *= in[i]; break;                         \
        case DDPLUG_OP_MIN: if (in[i] < acc[i]) acc[i] = in[i]; break;       \
        case DDPLUG_OP_MAX: if (in[i] > acc[i]) acc[i] = in[i]; break;       \
      }                                                                      \
  }
#define EX_REDUCE_INT(T)                                                     \
  static void reduce_##T(T *acc, const T *in, uint64_t n, int op) {         \
    for (uint64_t i = 0; i < n; i++) switch (op) {                          \
        case DDPLUG_OP_SUM: case DDPLUG_OP_AVG: acc[i] = (T)(acc[i] + in[i]); break; \
        case DDPLUG_OP_PROD: acc[i] = (T)(acc[i] * in[i]); break;            \
        case DDPLUG_OP_MIN: if (in[i] < acc[i]) acc[i] = in[i]; break;       \
        case DDPLUG_OP_MAX: if (in[i] > acc[i]) acc[i] = in[i]; break;       \
        case DDPLUG_OP_BOR: acc[i] |= in[i]; break;                          \
        case DDPLUG_OP_BAND: acc[i] &= in[i]; break;                         \
      }                                                                      \
  }
#define EX_DIVIDE(T)                                                         \
  static void divide_##T(T *acc, uint64_t n, int by) {                      \
    for (uint64_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)by);           \
  }
EX_REDUCE_FLOAT(float)
EX_REDUCE_FLOAT(double)
EX_REDUCE_INT(int8_t)
EX_REDUCE_INT(uint8_t)
EX_REDUCE_INT(int32_t)
EX_REDUCE_INT(int64_t)
EX_DIVIDE(float)
EX_DIVIDE(double)
EX_DIVIDE(int8_t)
EX_DIVIDE(uint8_t)
EX_DIVIDE(int32_t)
EX_DIVIDE(int64_t)

static void reduce(void *acc, const void *in, uint64_t n, int dtype, int op) {
  switch (dtype) {
    case DDPLUG_FLOAT32: reduce_float(acc, in, n, op); break;
    case DDPLUG_FLOAT64: reduce_double(acc, in, n, op); break;
    case DDPLUG_INT8: reduce_int8_t(acc, in, n, op); break;
    case DDPLUG_UINT8: reduce_uint8_t(acc, in, n, op); break;
    case DDPLUG_INT32: reduce_int32_t(acc, in, n, op); break;
    case DDPLUG_INT64: reduce_int64_t(acc, in, n, op); break;
  }
}

static void divide(void *acc, uint64_t n, int dtype, int by) {
  switch (dtype) {
    case DDPLUG_FLOAT32: divide_float(acc, n, by); break;
    case DDPLUG_FLOAT64: divide_double(acc, n, by); break;
    case DDPLUG_INT8: divide_int8_t(acc, n, by); break;
    case DDPLUG_UINT8: divide_uint8_t(acc, n, by); break;
    case DDPLUG_INT32: divide_int32_t(acc, n, by); break;
    case DDPLUG_INT64: divide_int64_t(acc, n, by); break;
  }
}

/* ---- plugin_options: {"chunk_bytes": N} ---------------------------------- */

/* The one option, declared: the runtime refuses unknown keys (with a "did
 * you mean"), wrong types and values out of range before group_create, fills
 * in the default, and group_create reads the value with option_int. */
static const ddplug_option opt_chunk_bytes = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "chunk_bytes",
    .type = DDPLUG_OPTION_INT,
    .int_min = 64,
    .int_max = EX_MAX_CHUNK,
    .default_json = "524288",
    .description = "Bytes of a rank's data per store value.",
};
static const ddplug_option *const example_options[] = {&opt_chunk_bytes, NULL};

static int read_options(ddplug_plugin_group *g) {
  int64_t v = 0;
  int s = g->svc->option_int(g->svc->host, "chunk_bytes", &v);
  if (s == DDPLUG_E_NOT_FOUND) v = EX_MAX_CHUNK; /* a table without the declaration */
  else if (s != DDPLUG_OK) return s;             /* the runtime explained it */
  g->chunk = (size_t)v;
  return DDPLUG_OK;
}

/* ---- process group ------------------------------------------------------- */

static int ex_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                           ddplug_plugin_group **out) {
  ddplug_plugin_group *g = calloc(1, sizeof *g);
  if (!g) return DDPLUG_E_NO_MEMORY;
  g->svc = svc;
  g->rank = init->rank;
  g->world_size = init->world_size;
  g->timeout_ms = init->timeout_ms > 0 ? init->timeout_ms : 300000;
  int s = read_options(g);
  if (s) {
    free(g);
    return s;
  }
  *out = g;
  return DDPLUG_OK;
}

static int ex_group_destroy(ddplug_plugin_group *g) {
  free(g);
  return DDPLUG_OK;
}

static int ex_group_abort(ddplug_plugin_group *g, const char *reason) {
  (void)reason;
  /* Our waits go through the runtime's store, which ends them when the run
   * is aborted; the flag stops new collectives. */
  atomic_store(&g->aborted, 1);
  return DDPLUG_OK;
}

/* ---- collectives --------------------------------------------------------- */

static const char *kind_name(int k) {
  static const char *const names[] = {"?", "allreduce", "broadcast", "allgather", "barrier"};
  return k >= 1 && k <= 4 ? names[k] : "?";
}

static int put_chunks(ddplug_plugin_group *g, uint64_t seq, int rank, const char *data,
                      uint64_t bytes) {
  char key[96];
  for (uint64_t off = 0, c = 0; off < bytes; off += g->chunk, c++) {
    uint64_t n = bytes - off < g->chunk ? bytes - off : g->chunk;
    snprintf(key, sizeof key, "d/%" PRIu64 "/%d/%" PRIu64, seq, rank, c);
    int s = g->svc->store_set(g->svc->host, key, data + off, n);
    if (s) return s;
  }
  return 0;
}

static int get_chunks(ddplug_plugin_group *g, uint64_t seq, int rank, char *data,
                      uint64_t bytes) {
  char key[96];
  for (uint64_t off = 0, c = 0; off < bytes; off += g->chunk, c++) {
    uint64_t n = bytes - off < g->chunk ? bytes - off : g->chunk, got = 0;
    snprintf(key, sizeof key, "d/%" PRIu64 "/%d/%" PRIu64, seq, rank, c);
    int s = g->svc->store_get(g->svc->host, key, data + off, n, &got, g->timeout_ms);
    if (s) return s;
  }
  return 0;
}

/* Delete this collective's keys once every rank has read them. */
static void cleanup(ddplug_plugin_group *g, uint64_t seq, const ex_header *hdrs,
                    uint64_t bytes_per_rank) {
  char key[96];
  int64_t done = 0;
  snprintf(key, sizeof key, "done/%" PRIu64, seq);
  if (g->svc->store_add(g->svc->host, key, 1, &done) || done != g->world_size) return;
  g->svc->store_delete(g->svc->host, key);
  for (int r = 0; r < g->world_size; r++) {
    snprintf(key, sizeof key, "h/%" PRIu64 "/%d", seq, r);
    g->svc->store_delete(g->svc->host, key);
    int has_data = hdrs[0].kind != DDPLUG_COLL_BROADCAST || r == hdrs[0].root;
    uint64_t chunks = has_data ? (bytes_per_rank + g->chunk - 1) / g->chunk : 0;
    for (uint64_t c = 0; c < chunks; c++) {
      snprintf(key, sizeof key, "d/%" PRIu64 "/%d/%" PRIu64, seq, r, c);
      g->svc->store_delete(g->svc->host, key);
    }
  }
}

static int check_headers(ddplug_plugin_group *g, const ex_header *h) {
  for (int r = 1; r < g->world_size; r++) {
    const ex_header *a = &h[0], *b = &h[r];
    if (a->kind != b->kind || a->count != b->count || a->dtype != b->dtype ||
        a->op != b->op || a->root != b->root)
      return fail(g, DDPLUG_E_MISMATCH,
                  "collective #%" PRIu64 " differs across ranks: rank 0 called "
                  "%s(count %" PRIu64 ", dtype %d, op %d, root %d), rank %d "
                  "called %s(count %" PRIu64 ", dtype %d, op %d, root %d); "
                  "every rank must issue the same collectives in the same order",
                  a->seq, kind_name(a->kind), a->count, a->dtype, a->op, a->root, r,
                  kind_name(b->kind), b->count, b->dtype, b->op, b->root);
  }
  return 0;
}

static int run(ddplug_plugin_group *g, const ddplug_coll_args *a) {
  if (atomic_load(&g->aborted)) return fail(g, DDPLUG_E_ABORTED, "the group was aborted");
  const int ws = g->world_size;
  const size_t es = dtype_size(a->dtype);
  const uint64_t bytes = a->kind == DDPLUG_COLL_BARRIER ? 0 : a->count * es;
  ex_header mine = {a->seq, a->count, a->kind, a->dtype, a->op, a->root, g->rank, 0};
  int publish = a->kind != DDPLUG_COLL_BROADCAST || g->rank == a->root;
  int s = publish ? put_chunks(g, a->seq, g->rank, a->send, bytes) : 0;
  char key[96];
  snprintf(key, sizeof key, "h/%" PRIu64 "/%d", a->seq, g->rank);
  if (!s) s = g->svc->store_set(g->svc->host, key, &mine, sizeof mine);
  if (s) return s;

  ex_header *h = calloc((size_t)ws, sizeof *h);
  char *acc = bytes ? malloc(bytes) : NULL;     /* the running result       */
  char *peer = bytes ? malloc(bytes) : NULL;    /* one peer's contribution  */
  if (!h || (bytes && (!acc || !peer))) {
    free(h);
    free(acc);
    free(peer);
    return fail(g, DDPLUG_E_NO_MEMORY, "out of memory for %" PRIu64 " bytes", bytes);
  }
  for (int r = 0; r < ws && !s; r++) {
    uint64_t got = 0;
    snprintf(key, sizeof key, "h/%" PRIu64 "/%d", a->seq, r);
    s = g->svc->store_get(g->svc->host, key, &h[r], sizeof h[r], &got, g->timeout_ms);
    if (s == DDPLUG_E_TIMEOUT)
      fail(g, s, "collective #%" PRIu64 " (%s): rank %d did not arrive within %.1f s",
           a->seq, kind_name(a->kind), r, (double)g->timeout_ms / 1000.0);
  }
  if (!s) s = check_headers(g, h);
  if (!s && a->kind == DDPLUG_COLL_ALLREDUCE && bytes) {
    /* Reduce in rank order, so every rank gets identical bits; recv is only
     * written at the end, so in-place (send == recv) works. */
    for (int r = 0; r < ws && !s; r++) {
      const char *src = a->send;
      if (r != g->rank) {
        s = get_chunks(g, a->seq, r, peer, bytes);
        src = peer;
      }
      if (s) break;
      if (r == 0)
        memcpy(acc, src, bytes);
      else
        reduce(acc, src, a->count, a->dtype, a->op);
    }
    if (!s && a->op == DDPLUG_OP_AVG) divide(acc, a->count, a->dtype, ws);
    if (!s) memcpy(a->recv, acc, bytes);
  } else if (!s && a->kind == DDPLUG_COLL_BROADCAST && bytes) {
    if (g->rank == a->root)
      memmove(a->recv, a->send, bytes);
    else
      s = get_chunks(g, a->seq, a->root, a->recv, bytes);
  } else if (!s && a->kind == DDPLUG_COLL_ALLGATHER && bytes) {
    memcpy(acc, a->send, bytes); /* send may alias our block of recv */
    for (int r = 0; r < ws && !s; r++) {
      char *dst = (char *)a->recv + (uint64_t)r * bytes;
      if (r == g->rank)
        memcpy(dst, acc, bytes);
      else
        s = get_chunks(g, a->seq, r, dst, bytes);
    }
  }
  if (!s) cleanup(g, a->seq, h, bytes);
  free(h);
  free(acc);
  free(peer);
  return s;
}

static int ex_collective_start(ddplug_plugin_group *g, const ddplug_coll_args *a,
                               ddplug_plugin_request **out) {
  ddplug_plugin_request *r = calloc(1, sizeof *r);
  if (!r) return fail(g, DDPLUG_E_NO_MEMORY, "out of memory");
  /* Synchronous: the whole collective happens here; the request records how
   * it ended. A failure is reported by request_wait, like an async plugin. */
  r->status = run(g, a);
  *out = r;
  return DDPLUG_OK;
}

static int ex_request_wait(ddplug_plugin_group *g, ddplug_plugin_request *r, int64_t t) {
  (void)g;
  (void)t;
  return r->status;
}

static int ex_request_test(ddplug_plugin_group *g, ddplug_plugin_request *r, int32_t *done) {
  (void)g;
  *done = 1;
  return r->status;
}

static void ex_request_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  (void)g;
  free(r);
}

static const ddplug_plugin example_plugin = {
    .struct_size = sizeof(ddplug_plugin),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "example",
    .version = EXAMPLE_VERSION,
    .description = "collectives through the rendezvous store: a readable reference backend",
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_MULTI_NODE | DDPLUG_CAP_MISMATCH_CHECK |
            DDPLUG_CAP_ABORT,
    .dtype_mask = DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32) | DDPLUG_DTYPE_BIT(DDPLUG_FLOAT64) |
                  DDPLUG_DTYPE_BIT(DDPLUG_INT8) | DDPLUG_DTYPE_BIT(DDPLUG_UINT8) |
                  DDPLUG_DTYPE_BIT(DDPLUG_INT32) | DDPLUG_DTYPE_BIT(DDPLUG_INT64),
    .op_mask = DDPLUG_OP_BIT(DDPLUG_OP_SUM) | DDPLUG_OP_BIT(DDPLUG_OP_AVG) |
               DDPLUG_OP_BIT(DDPLUG_OP_MIN) | DDPLUG_OP_BIT(DDPLUG_OP_MAX) |
               DDPLUG_OP_BIT(DDPLUG_OP_PROD) | DDPLUG_OP_BIT(DDPLUG_OP_BOR) |
               DDPLUG_OP_BIT(DDPLUG_OP_BAND),
    .group_create = ex_group_create,
    .group_destroy = ex_group_destroy,
    .group_abort = ex_group_abort,
    .collective_start = ex_collective_start,
    .request_wait = ex_request_wait,
    .request_test = ex_request_test,
    .request_free = ex_request_free,
    .options = example_options,
};

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version) {
  /* Any 1.x runtime from 1.3 on: older ones lack the option getters this
   * table's group_create reads (the loader then names the mismatch). */
  if (DDPLUG_VERSION_MINOR_OF(host_abi_version) < 3) return NULL;
  return &example_plugin;
}
