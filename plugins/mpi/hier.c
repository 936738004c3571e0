/*
 * hier.c — the hierarchical allreduce: the node's part through the cpu
 * plugin's shared memory, the part between nodes through MPI.
 *
 * The cpu plugin is composed through the plugin ABI itself, never copied:
 * this backend loads libddplug-cpu.so from its own directory, takes its
 * table from its entry point, and creates one cpu group per node over the
 * node's ranks with a group_init of its own (local ranks renumbered 0..n-1,
 * one node, the run id plus the node's index so nodes simulated on one
 * machine get segments of their own) and a copy of the host services
 * whose store keys carry the prefix "h<node>/" and whose options answer
 * the cpu plugin's declared defaults. The two plugins stay independent:
 * each knows the other only through plugin.h.
 *
 * An allreduce of a (not float16/bfloat16: their float32 partial sums would
 * be rounded twice) takes three steps, one allreduce at a time per group
 * (the node's cpu group must see the same sequence of collectives on every
 * local rank, and a leader's second step takes longer than the others'):
 *   1. the node's allreduce through the cpu group (send -> recv; avg as a
 *      sum);
 *   2. the node leaders (local rank 0) allreduce recv in place through MPI
 *      on a communicator of the leaders, when there are several nodes;
 *   3. the leader's result broadcast in the node through the cpu group;
 * then avg divides by the world size. With one node, step 1 is the whole
 * allreduce. Why an allreduce in step 1 and not a reduce to the leader:
 * the ABI has no reduce, and the cost of writing the node's sum into every
 * local rank's output instead of the leader's alone is one extra pass over
 * the output on the others, small beside the transfer between nodes
 * (README.md, "Inside a node", weighs it).
 *
 * Which allreduces take this path: intra_node "cpu" — every allreduce of a
 * group with ranks sharing a node; "auto" — those of at least
 * DDMPI_HIER_AUTO_MIN_BYTES per rank (README.md says how that number is
 * decided); "mpi" — none.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"

/* intra_node "auto": allreduces of at least this many bytes per rank go
 * through the node's shared memory, per MPI family (each backend is built
 * against one). Measured by bench/mpi_allreduce_perf.py on one node, 2
 * ranks, quiet machine (README.md, "Inside a node", has the table): the
 * smallest size from which "mpi via cpu" beats "mpi, flat" at every larger
 * size — Open MPI 4.1's vader from 8 MiB, MPICH 4.0's ch4 shm from 2 MiB. */
#ifndef DDMPI_HIER_AUTO_MIN_BYTES
#if defined(OPEN_MPI)
#define DDMPI_HIER_AUTO_MIN_BYTES (8ull << 20)
#else
#define DDMPI_HIER_AUTO_MIN_BYTES (2ull << 20)
#endif
#endif

struct ddmpi_hier {
  const ddplug_plugin *cpu;        /* the cpu plugin's table              */
  ddplug_plugin_group *node;       /* the node's cpu group                */
  ddplug_group_init init;          /* what it was created with            */
  ddplug_host_services svc;        /* the wrapped services (host = this)  */
  const ddplug_host_services *outer;
  int32_t *zeros, *local_of;       /* [local world]                       */
  int64_t *pids;                   /* [local world]                       */
  char run_id[40];
  char prefix[24];                 /* "h<node>/"                          */
  MPI_Comm leaders;                /* local rank 0 of every node, or NULL */
  int nodes;
  uint64_t min_bytes;
  uint64_t seq;                    /* the cpu group's collectives         */
  ddplug_plugin_request *active;   /* the allreduce in its steps          */
};

/* ---- the wrapped host services ------------------------------------------------ */

static int key_of(ddmpi_hier *h, const char *key, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s%s", h->prefix, key ? key : "");
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

static int w_set(void *host, const char *key, const void *v, uint64_t len) {
  ddmpi_hier *h = host;
  char k[256];
  if (key_of(h, key, k, sizeof k)) return DDPLUG_E_INVALID_ARGUMENT;
  return h->outer->store_set(h->outer->host, k, v, len);
}
static int w_get(void *host, const char *key, void *buf, uint64_t cap, uint64_t *len,
                 int64_t timeout_ms) {
  ddmpi_hier *h = host;
  char k[256];
  if (key_of(h, key, k, sizeof k)) return DDPLUG_E_INVALID_ARGUMENT;
  return h->outer->store_get(h->outer->host, k, buf, cap, len, timeout_ms);
}
static int w_add(void *host, const char *key, int64_t delta, int64_t *result) {
  ddmpi_hier *h = host;
  char k[256];
  if (key_of(h, key, k, sizeof k)) return DDPLUG_E_INVALID_ARGUMENT;
  return h->outer->store_add(h->outer->host, k, delta, result);
}
static int w_wait(void *host, const char *const *keys, uint32_t nkeys, int64_t timeout_ms) {
  ddmpi_hier *h = host;
  char **k = calloc(nkeys ? nkeys : 1, sizeof *k);
  int st = k ? DDPLUG_OK : DDPLUG_E_NO_MEMORY;
  for (uint32_t i = 0; i < nkeys && st == DDPLUG_OK; i++) {
    k[i] = malloc(256);
    if (!k[i] || key_of(h, keys[i], k[i], 256)) st = DDPLUG_E_INVALID_ARGUMENT;
  }
  if (st == DDPLUG_OK)
    st = h->outer->store_wait(h->outer->host, (const char *const *)k, nkeys, timeout_ms);
  for (uint32_t i = 0; k && i < nkeys; i++) free(k[i]);
  free(k);
  return st;
}
static int w_delete(void *host, const char *key) {
  ddmpi_hier *h = host;
  char k[256];
  if (key_of(h, key, k, sizeof k)) return DDPLUG_E_INVALID_ARGUMENT;
  return h->outer->store_delete(h->outer->host, k);
}
static void w_log(void *host, int32_t level, const char *msg) {
  ddmpi_hier *h = host;
  char line[DDMPI_MSG_MAX];
  snprintf(line, sizeof line, "(the node's cpu group) %s", msg);
  h->outer->log(h->outer->host, level, line);
}
static uint64_t w_clock(void *host) {
  ddmpi_hier *h = host;
  return h->outer->clock_ns(h->outer->host);
}
static void w_set_error(void *host, int32_t status, const char *msg) {
  ddmpi_hier *h = host;
  char line[DDMPI_MSG_MAX];
  snprintf(line, sizeof line, "the node's cpu group: %s", msg);
  h->outer->set_error(h->outer->host, status, line);
}

/* The cpu plugin's declared default of name (its JSON text), or NULL. */
static const char *default_of(ddmpi_hier *h, const char *name, int32_t type) {
  for (const ddplug_option *const *o = h->cpu->options; o && *o; o++)
    if (!strcmp((*o)->name, name) && (*o)->type == type) return (*o)->default_json;
  return NULL;
}
static int w_opt_bool(void *host, const char *name, int32_t *out) {
  const char *d = default_of(host, name, DDPLUG_OPTION_BOOL);
  if (!d) return DDPLUG_E_NOT_FOUND;
  *out = !strcmp(d, "true");
  return DDPLUG_OK;
}
static int w_opt_int(void *host, const char *name, int64_t *out) {
  const char *d = default_of(host, name, DDPLUG_OPTION_INT);
  if (!d) return DDPLUG_E_NOT_FOUND;
  *out = strtoll(d, NULL, 10);
  return DDPLUG_OK;
}
static int w_opt_number(void *host, const char *name, double *out) {
  const char *d = default_of(host, name, DDPLUG_OPTION_NUMBER);
  if (!d) return DDPLUG_E_NOT_FOUND;
  *out = strtod(d, NULL);
  return DDPLUG_OK;
}
static int w_opt_string(void *host, const char *name, char *buf, uint64_t cap, uint64_t *len) {
  const char *d = default_of(host, name, DDPLUG_OPTION_STRING);
  if (!d) return DDPLUG_E_NOT_FOUND;
  size_t n = strlen(d);
  if (n >= 2 && d[0] == '"') d++, n -= 2;
  *len = n;
  if (n + 1 > cap) return DDPLUG_E_INVALID_ARGUMENT;
  memcpy(buf, d, n);
  buf[n] = '\0';
  return DDPLUG_OK;
}
static int w_opt_int_list(void *host, const char *name, int64_t *out, uint64_t cap,
                          uint64_t *count) {
  (void)host;
  (void)name;
  (void)out;
  (void)cap;
  (void)count;
  return DDPLUG_E_NOT_FOUND; /* the cpu plugin declares no list */
}

/* ---- set-up ------------------------------------------------------------------- */

static const ddplug_plugin *load_cpu(char *err, size_t cap) {
  Dl_info info;
  char path[PATH_MAX + 32] = "libddplug-cpu.so";
  if (dladdr((void *)&load_cpu, &info) && info.dli_fname) {
    char *real = realpath(info.dli_fname, NULL);
    char *slash = real ? strrchr(real, '/') : NULL;
    if (slash) {
      *slash = '\0';
      snprintf(path, sizeof path, "%s/libddplug-cpu.so", real);
    }
    free(real);
  }
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  ddplug_plugin_entry_fn entry = dl ? (ddplug_plugin_entry_fn)dlsym(dl, DDPLUG_PLUGIN_ENTRY_SYMBOL)
                                    : NULL;
  const ddplug_plugin *t = entry ? entry(DDPLUG_PLUGIN_ABI_VERSION) : NULL;
  if (!t) {
    const char *e = dl ? "its entry point refused this ABI" : dlerror();
    ddmpi_fmt(err, cap,
              "plugin mpi: plugin_options.intra_node \"cpu\" needs the cpu plugin beside this one "
              "(%s): %s",
              path, e ? e : "cannot be loaded");
    return NULL;
  }
  return t; /* dl stays loaded: its table is used until exit */
}

/* See internal.h. */
int ddmpi_hier_create(ddplug_plugin_group *g, char *err, size_t cap) {
  const ddplug_group_init *in = g->init;
  int shared = 0, nodes = in->num_nodes > 0 ? in->num_nodes : 1;
  if (in->node_of_rank && in->local_rank_of)
    for (int r = 0; r < g->world; r++) shared |= in->local_rank_of[r] > 0;
  uint64_t min_bytes = g->opts.intra_node == DDMPI_INTRA_CPU    ? 0
                       : g->opts.intra_node == DDMPI_INTRA_AUTO ? DDMPI_HIER_AUTO_MIN_BYTES
                                                                : UINT64_MAX;
  g->hier = NULL;
  if (!shared || min_bytes == UINT64_MAX || !in->pid_of_rank) return DDPLUG_OK;
  ddmpi_hier *h = calloc(1, sizeof *h);
  int lws = in->local_world_size;
  if (h) {
    h->zeros = calloc((size_t)lws, sizeof *h->zeros);
    h->local_of = calloc((size_t)lws, sizeof *h->local_of);
    h->pids = calloc((size_t)lws, sizeof *h->pids);
  }
  if (!h || !h->zeros || !h->local_of || !h->pids) {
    if (h) {
      free(h->zeros);
      free(h->local_of);
      free(h->pids);
    }
    free(h);
    ddmpi_fmt(err, cap, "plugin mpi: group_create: out of memory");
    return DDPLUG_E_NO_MEMORY;
  }
  h->leaders = MPI_COMM_NULL;
  h->nodes = nodes;
  h->min_bytes = min_bytes;
  h->outer = g->svc;
  h->cpu = load_cpu(err, cap);
  g->hier = h;
  if (!h->cpu) return DDPLUG_E_NOT_FOUND;
  for (int r = 0, k = 0; r < g->world; r++)
    if (in->node_of_rank[r] == in->node_rank && k < lws) {
      h->local_of[in->local_rank_of[r]] = in->local_rank_of[r];
      h->pids[in->local_rank_of[r]] = in->pid_of_rank[r];
      k++;
    }
  snprintf(h->prefix, sizeof h->prefix, "h%d/", in->node_rank);
  snprintf(h->run_id, sizeof h->run_id, "%.24sn%d", in->run_id ? in->run_id : "run",
           in->node_rank);
  ddplug_group_init *s = &h->init;
  s->struct_size = sizeof *s;
  s->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  s->rank = in->local_rank;
  s->world_size = lws;
  s->local_rank = in->local_rank;
  s->local_world_size = lws;
  s->node_rank = 0;
  s->num_nodes = 1;
  s->node_of_rank = h->zeros;
  s->local_rank_of = h->local_of;
  s->pid_of_rank = h->pids;
  s->host_id = in->host_id;
  s->run_id = h->run_id;
  s->options_json = "{}";
  s->timeout_ms = in->timeout_ms;
  s->log_level = in->log_level;
  s->duplicate_gpu = DDPLUG_CHECK_ERROR;
  ddplug_host_services *w = &h->svc;
  w->struct_size = sizeof *w;
  w->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  w->host = h;
  w->store_set = w_set;
  w->store_get = w_get;
  w->store_add = w_add;
  w->store_wait = w_wait;
  w->store_delete = w_delete;
  w->log = w_log;
  w->clock_ns = w_clock;
  w->set_error = w_set_error;
  w->option_bool = w_opt_bool;
  w->option_int = w_opt_int;
  w->option_number = w_opt_number;
  w->option_string = w_opt_string;
  w->option_int_list = w_opt_int_list;
  int st = h->cpu->group_create(s, w, &h->node);
  if (st != DDPLUG_OK) {
    h->node = NULL;
    ddmpi_fmt(err, cap, "%s", ""); /* the cpu plugin said why (set_error) */
    return st;
  }
  if (nodes > 1) {
    int color = in->local_rank == 0 ? 0 : MPI_UNDEFINED;
    int rc = MPI_Comm_split(g->comm, color, in->node_rank, &h->leaders);
    if (rc == MPI_SUCCESS && h->leaders != MPI_COMM_NULL)
      rc = MPI_Comm_set_errhandler(h->leaders, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      char e[400];
      ddmpi_mpi_error(rc, e, sizeof e);
      ddmpi_fmt(err, cap, "plugin mpi: creating the node leaders' communicator failed: %s", e);
      return ddmpi_status_of(rc);
    }
  }
  return DDPLUG_OK;
}

/* See internal.h. */
MPI_Comm ddmpi_hier_leaders(const ddplug_plugin_group *g) {
  return g->hier ? g->hier->leaders : MPI_COMM_NULL;
}

/* See internal.h. */
void ddmpi_hier_destroy(ddplug_plugin_group *g) {
  ddmpi_hier *h = g->hier;
  if (!h) return;
  if (h->node) h->cpu->group_destroy(h->node);
  if (h->leaders != MPI_COMM_NULL && !g->abandoned) MPI_Comm_free(&h->leaders);
  free(h->zeros);
  free(h->local_of);
  free(h->pids);
  free(h);
  g->hier = NULL;
}

/* See internal.h. */
void ddmpi_hier_abort(ddplug_plugin_group *g, const char *reason) {
  if (g->hier && g->hier->node && g->hier->cpu->group_abort)
    g->hier->cpu->group_abort(g->hier->node, reason);
}

/* See internal.h. */
int ddmpi_hier_takes(const ddplug_plugin_group *g, const ddplug_coll_args *a) {
  const ddmpi_hier *h = g->hier;
  if (!h || !h->node || a->kind != DDPLUG_COLL_ALLREDUCE) return 0;
  if (a->dtype == DDPLUG_FLOAT16 || a->dtype == DDPLUG_BFLOAT16) return 0;
  if (a->count > (uint64_t)INT32_MAX) return 0; /* the leaders' MPI call takes an int */
  return a->count * ddmpi_dtype_size(a->dtype) >= h->min_bytes;
}

/* Start a cpu collective on the node's group. */
static int node_start(ddplug_plugin_request *r, int kind) {
  ddmpi_hier *h = r->group->hier;
  ddplug_coll_args c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  c.kind = kind;
  c.dtype = r->a.dtype;
  c.op = kind == DDPLUG_COLL_ALLREDUCE ? (r->a.op == DDPLUG_OP_AVG ? DDPLUG_OP_SUM : r->a.op) : 0;
  c.root = 0;
  c.send = kind == DDPLUG_COLL_ALLREDUCE ? r->a.send : r->a.recv;
  c.recv = r->a.recv;
  c.count = r->a.count;
  c.seq = ++h->seq;
  c.mem = DDPLUG_MEM_HOST;
  int st = h->cpu->collective_start(h->node, &c, &r->sub);
  if (st != DDPLUG_OK) {
    r->sub = NULL;
    r->status = st;
    ddmpi_fmt(r->msg, sizeof r->msg, "%s: the node's cpu group refused its part (%s)", r->what,
              ddmpi_kind_name(kind));
  }
  return st;
}

/* Test the node's request: 1 done, 0 pending, -1 failed. */
static int node_test(ddplug_plugin_request *r) {
  ddmpi_hier *h = r->group->hier;
  int32_t done = 0;
  int st = h->cpu->request_test(h->node, r->sub, &done);
  if (st != DDPLUG_OK) {
    h->cpu->request_free(h->node, r->sub);
    r->sub = NULL;
    r->status = st;
    ddmpi_fmt(r->msg, sizeof r->msg, "%s: its part inside the node failed (the cpu group's "
              "status %d; its sentence was logged)", r->what, st);
    return -1;
  }
  if (!done) return 0;
  h->cpu->request_free(h->node, r->sub);
  r->sub = NULL;
  return 1;
}

/* See internal.h. Steps: 0 wait for the turn, 1 node allreduce, 2 leaders
 * (MPI), 3 node broadcast, 4 done. */
int ddmpi_hier_step(ddplug_plugin_request *r) {
  ddmpi_hier *h = r->group->hier;
  ddplug_plugin_group *g = r->group;
  for (;;) {
    switch (r->hier_step) {
      case 0:
        if (h->active && h->active != r) return 0;
        h->active = r;
        if (node_start(r, DDPLUG_COLL_ALLREDUCE) != DDPLUG_OK) return -1;
        r->hier_step = 1;
        break;
      case 1: {
        int t = node_test(r);
        if (t <= 0) return t;
        if (h->nodes == 1) {
          r->hier_step = 4;
          break;
        }
        if (h->leaders != MPI_COMM_NULL) {
          MPI_Datatype t2;
          MPI_Op op;
          int widen = 0, divide = 0;
          ddmpi_mpi_reduction(r->a.dtype, r->a.op, &t2, &op, &widen, &divide);
          if (ddmpi_request_reqs(r, 1) != 0) {
            r->status = DDPLUG_E_NO_MEMORY;
            ddmpi_fmt(r->msg, sizeof r->msg, "%s: out of memory", r->what);
            return -1;
          }
          int rc = MPI_Iallreduce(MPI_IN_PLACE, r->a.recv, (int)r->a.count, t2, op, h->leaders,
                                  &r->mreq[0]);
          if (rc != MPI_SUCCESS) {
            char e[400];
            ddmpi_mpi_error(rc, e, sizeof e);
            r->status = ddmpi_status_of(rc);
            ddmpi_fmt(r->msg, sizeof r->msg, "%s: the node leaders' allreduce failed: %s", r->what,
                      e);
            return -1;
          }
        }
        r->hier_step = 2;
        break;
      }
      case 2: {
        int code = MPI_SUCCESS;
        int t = ddmpi_test_all(r->mreq, r->nreq, &code);
        if (t < 0) {
          char why[DDMPI_MSG_MAX];
          ddmpi_peer_failure_text(g, h->leaders, code, why, sizeof why);
          r->status = ddmpi_status_of(code);
          ddmpi_fmt(r->msg, sizeof r->msg, "%s: the node leaders' allreduce failed: %s", r->what,
                    why);
          return -1;
        }
        if (!t) return 0;
        if (node_start(r, DDPLUG_COLL_BROADCAST) != DDPLUG_OK) return -1;
        r->hier_step = 3;
        break;
      }
      case 3: {
        int t = node_test(r);
        if (t <= 0) return t;
        r->hier_step = 4;
        break;
      }
      default:
        if (r->a.op == DDPLUG_OP_AVG && r->a.count)
          ddcpu_divide(r->a.dtype, r->a.recv, r->a.count, g->world);
        if (h->active == r) h->active = NULL;
        return 1;
    }
  }
}
