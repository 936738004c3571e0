/* coll.c — the group's life cycle and the collectives: every
 * dtype the plugin advertises, with every op it advertises (allreduce),
 * from the first and the last rank (broadcast), in place and out of place,
 * at 1, 1031 and 65543 elements (odd sizes cross any chunking); the send
 * buffer of an out-of-place call must come back unchanged. The same on
 * ranks that the host ids put on two nodes, for a multi-node plugin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

static const uint64_t k_counts[] = {1, 1031, 65543};
#define N_COUNTS (sizeof k_counts / sizeof k_counts[0])
#define MAX_COUNT 65543

static const char *kind_name(int kind) {
  return kind == DDPLUG_COLL_ALLREDUCE ? "allreduce"
         : kind == DDPLUG_COLL_BROADCAST ? "broadcast"
                                         : "allgather";
}

/* A value no input takes, to see what a collective did not write. */
static double sentinel(int dtype) { return dtype == DDPLUG_UINT8 ? 251 : -101; }

int cf_coll_once(ddplug_context *ctx, int rank, int world, int kind, int dtype, int op, int root,
                 uint64_t count, int inplace, char *why, size_t cap) {
  size_t es = ddplug_dtype_size(dtype);
  uint64_t total = kind == DDPLUG_COLL_ALLGATHER ? count * (uint64_t)world : count;
  char *send = malloc((size_t)count * es), *recv = malloc((size_t)total * es);
  if (!send || !recv) {
    free(send);
    free(recv);
    snprintf(why, cap, "out of memory for %llu elements", (unsigned long long)total);
    return DDPLUG_E_NO_MEMORY;
  }
  int data_op = kind == DDPLUG_COLL_ALLREDUCE ? op : 0;
  for (uint64_t i = 0; i < total; i++) cf_put(dtype, recv, i, sentinel(dtype));
  for (uint64_t i = 0; i < count; i++) cf_put(dtype, send, i, cf_input(dtype, data_op, rank, i));
  const void *src = send;
  void *dst = recv;
  if (inplace) {
    char *mine = kind == DDPLUG_COLL_ALLGATHER ? recv + (size_t)rank * count * es : recv;
    memcpy(mine, send, (size_t)count * es);
    src = mine;
  }
  int s;
  const char *what = inplace ? "in place" : "out of place";
  if (kind == DDPLUG_COLL_ALLREDUCE)
    s = ddplug_allreduce(ctx, src, dst, count, dtype, op, NULL);
  else if (kind == DDPLUG_COLL_BROADCAST)
    s = ddplug_broadcast(ctx, src, dst, count, dtype, root, NULL);
  else
    s = ddplug_allgather(ctx, src, dst, count, dtype, NULL);
  char call[160];
  if (kind == DDPLUG_COLL_ALLREDUCE)
    snprintf(call, sizeof call, "allreduce %s %s, %s, %llu elements", ddplug_dtype_name(dtype),
             ddplug_op_name(op), what, (unsigned long long)count);
  else if (kind == DDPLUG_COLL_BROADCAST)
    snprintf(call, sizeof call, "broadcast %s from rank %d, %s, %llu elements",
             ddplug_dtype_name(dtype), root, what, (unsigned long long)count);
  else
    snprintf(call, sizeof call, "allgather %s, %s, %llu elements", ddplug_dtype_name(dtype), what,
             (unsigned long long)count);
  if (s != DDPLUG_OK) {
    snprintf(why, cap, "%s: %s: %s", call, ddplug_status_name(s), cf_error(ctx));
    free(send);
    free(recv);
    return s;
  }
  int bad = 0;
  for (uint64_t i = 0; i < total && !bad; i++) {
    double got = cf_get(dtype, recv, i), want;
    if (kind == DDPLUG_COLL_ALLREDUCE)
      want = cf_expected(dtype, op, world, i);
    else if (kind == DDPLUG_COLL_BROADCAST)
      want = cf_input(dtype, 0, root, i);
    else
      want = cf_input(dtype, 0, (int)(i / count), i % count);
    if (!cf_same(dtype, op, got, want)) {
      snprintf(why, cap, "%s: element %llu is %g, expected %g", call, (unsigned long long)i, got,
               want);
      bad = 1;
    }
  }
  for (uint64_t i = 0; i < count && !bad && !inplace; i++)
    if (cf_get(dtype, send, i) != cf_input(dtype, data_op, rank, i)) {
      snprintf(why, cap, "%s: the send buffer changed (element %llu)", call,
               (unsigned long long)i);
      bad = 1;
    }
  free(send);
  free(recv);
  return bad ? -1 : DDPLUG_OK;
}

/* ---- life cycle -------------------------------------------------------- */

/* The bootstrap slots run inside ddplug_open when a launcher started the
 * ranks without a rendezvous (--launcher): the world they reported is the
 * one the context has. (Point-to-point has rows of its own: p2p.c.) */
static void bootstrap_rows(cf_rank *r, ddplug_context *ctx) {
  const uint64_t caps = r->plan->info.caps;
  const char *T = "bootstrap: the world and the store's address came from the plugin";
  const uint64_t slots = CF_BIT(bootstrap_world) | CF_BIT(bootstrap_broadcast);
  if (caps & DDPLUG_CAP_BOOTSTRAP) {
    ddplug_world w = DDPLUG_WORLD_INIT;
    int s = ddplug_context_world(ctx, &w);
    if (!r->plan->launched)
      cf_report(r, "bootstrap.world", slots, CF_SKIP, T,
                "the ranks were forked with an explicit world and rendezvous; the bootstrap runs "
                "when a launcher starts them (--launcher \"mpirun\")");
    else if (s != DDPLUG_OK || w.rank != r->rank || w.world_size != r->world ||
             strcmp(w.source, "mpi") != 0)
      cf_report(r, "bootstrap.world", slots, CF_FAIL, T,
                "the context has rank %d of %d from '%s' (%s), the launcher said rank %d of %d",
                w.rank, w.world_size, w.source, ddplug_status_name(s), r->rank, r->world);
    else
      cf_report(r, "bootstrap.world", slots, CF_PASS, T, "rank %d of %d, rendezvous at %s:%d",
                w.rank, w.world_size, w.master_addr, w.master_port);
  }
}

void cf_lifecycle_rank(cf_rank *r) {
  const char *T = "group: created on every rank (ddplug_open)";
  ddplug_context *ctx = NULL;
  double t0 = cf_now();
  int s = cf_open(r, NULL, 60, NULL, &ctx);
  if (s != DDPLUG_OK) {
    char err[1024];
    snprintf(err, sizeof err, "%s", ddplug_last_error());
    if (s == DDPLUG_E_UNSUPPORTED) {
      cf_report(r, "group.create", CF_BIT(group_create), CF_SKIP, T,
                "this machine cannot run the plugin: %s", err);
      double took = cf_now() - t0;
      cf_report(r, "group.refuse", CF_BIT(group_create), took < 30 ? CF_PASS : CF_FAIL,
                "group: refused cleanly where the plugin cannot run (UNSUPPORTED, promptly)",
                "%s after %.1f s", ddplug_status_name(s), took);
    } else {
      cf_report(r, "group.create", CF_BIT(group_create), CF_FAIL, T, "%s: %s",
                ddplug_status_name(s), err);
    }
    return;
  }
  cf_report(r, "group.create", CF_BIT(group_create), CF_PASS, T, "%s", "");
  bootstrap_rows(r, ctx);
  s = ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
  cf_report(r, "group.barrier", CF_COLL_SLOTS, s ? CF_FAIL : CF_PASS, "group: barrier", "%s%s%s",
            s ? ddplug_status_name(s) : "", s ? ": " : "", s ? cf_error(ctx) : "");
  s = ddplug_close(ctx);
  cf_report(r, "group.destroy", CF_BIT(group_destroy), s ? CF_FAIL : CF_PASS,
            "group: destroyed on every rank (ddplug_close)", "%s%s%s",
            s ? ddplug_status_name(s) : "", s ? ": " : "", s ? ddplug_last_error() : "");
  /* A second run in the same process: no state left behind by the first
   * (shared-memory names, sockets, globals); on a port of its own, as
   * rank 0 may still serve the first run's store while others reopen. */
  r->port = r->port2;
  const char *T2 = "group: a second group in the same process, after the first";
  s = cf_open(r, NULL, 60, NULL, &ctx);
  if (s == DDPLUG_OK) {
    int b = ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
    int c = ddplug_close(ctx);
    s = b ? b : c;
  }
  cf_report(r, "group.again", CF_BIT(group_create) | CF_BIT(group_destroy),
            s ? CF_FAIL : CF_PASS, T2, "%s%s%s", s ? ddplug_status_name(s) : "", s ? ": " : "",
            s ? ddplug_last_error() : "");
}

/* ---- every dtype x op ---------------------------------------------------- */

static void kind_rows(cf_rank *r, ddplug_context *ctx, int kind, int *dead, const char *host,
                      uint32_t dtypes) {
  const ddplug_plugin_info *in = &r->plan->info;
  for (int dt = 1; dt < DDPLUG_DTYPE_COUNT_ && !*dead; dt++) {
    if (!(dtypes & DDPLUG_DTYPE_BIT(dt))) continue;
    char id[64], title[160], why[1024] = "", ops[128] = "";
    snprintf(id, sizeof id, "%s%s.%s", host ? "nodes." : "", kind_name(kind),
             ddplug_dtype_name(dt));
    int calls = 0, failed = 0;
    for (int op = 1; op < DDPLUG_OP_COUNT_; op++) {
      if (kind == DDPLUG_COLL_ALLREDUCE &&
          (!(in->op_mask & DDPLUG_OP_BIT(op)) || !cf_op_valid(dt, op)))
        continue;
      if (kind == DDPLUG_COLL_ALLREDUCE)
        snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", *ops ? " " : "",
                 ddplug_op_name(op));
      int nroots = kind == DDPLUG_COLL_BROADCAST ? (r->world > 1 ? 2 : 1) : 1;
      for (int ri = 0; ri < nroots; ri++)
        for (int inplace = 0; inplace < 2; inplace++)
          for (size_t c = 0; c < N_COUNTS; c++) {
            if (failed || *dead) continue;
            int root = ri == 0 ? 0 : r->world - 1;
            int s = cf_coll_once(ctx, r->rank, r->world, kind, dt, op, root, k_counts[c],
                                 inplace, why, sizeof why);
            calls++;
            if (s != DDPLUG_OK) failed = 1;
            if (s > 0) *dead = 1; /* the context is aborted: stop here */
          }
      if (kind != DDPLUG_COLL_ALLREDUCE) break; /* one pass: op is unused */
    }
    if (kind == DDPLUG_COLL_ALLREDUCE)
      snprintf(title, sizeof title, "%sallreduce %s: %s", host ? "two nodes: " : "",
               ddplug_dtype_name(dt), ops);
    else if (kind == DDPLUG_COLL_BROADCAST)
      snprintf(title, sizeof title, "%sbroadcast %s from the first and last rank",
               host ? "two nodes: " : "", ddplug_dtype_name(dt));
    else
      snprintf(title, sizeof title, "%sallgather %s", host ? "two nodes: " : "",
               ddplug_dtype_name(dt));
    if (failed)
      cf_report(r, id, CF_COLL_SLOTS, CF_FAIL, title, "%s", why);
    else
      cf_report(r, id, CF_COLL_SLOTS, CF_PASS, title, "%d calls, in place and out of place", calls);
  }
}

/* Registered memory (DDPLUG_CAP_REGISTERED_MEMORY): buffers from
 * ddplug_mem_alloc are reported registered, an allreduce in and out of them
 * gives the expected values, ordinary memory is not reported registered, and
 * every buffer is released. */
static void registered_rows(cf_rank *r, ddplug_context *ctx, int *dead) {
  const char *id = "coll.registered", *title =
      "registered memory: mem_alloc'd buffers are reached as registered, an allreduce in them is "
      "right, mem_free releases them";
  uint64_t slots = CF_BIT(mem_alloc) | CF_BIT(mem_free) | CF_BIT(mem_query) | CF_COLL_SLOTS;
  if (!(r->plan->info.caps & DDPLUG_CAP_REGISTERED_MEMORY)) return;
  const uint64_t n = 1031; /* not a multiple of anything */
  float *a = NULL, *b = NULL, ordinary[4];
  int reach = -1, st = ddplug_mem_alloc(ctx, n * sizeof(float), (void **)&a);
  if (st == DDPLUG_OK) st = ddplug_mem_alloc(ctx, n * sizeof(float), (void **)&b);
  if (st != DDPLUG_OK) {
    cf_report(r, id, slots, CF_FAIL, title, "ddplug_mem_alloc: %s: %s", ddplug_status_name(st),
              ddplug_last_error());
    goto out;
  }
  if ((st = ddplug_mem_reach(ctx, a, n * sizeof(float), &reach)) != DDPLUG_OK ||
      reach != DDPLUG_REACH_REGISTERED) {
    cf_report(r, id, slots, CF_FAIL, title, "mem_reach of a mem_alloc'd buffer: %s, reach %d",
              ddplug_status_name(st), reach);
    goto out;
  }
  if ((st = ddplug_mem_reach(ctx, ordinary, sizeof ordinary, &reach)) != DDPLUG_OK ||
      reach == DDPLUG_REACH_REGISTERED) {
    cf_report(r, id, slots, CF_FAIL, title, "mem_reach of a stack buffer: %s, reach %d",
              ddplug_status_name(st), reach);
    goto out;
  }
  for (uint64_t i = 0; i < n; i++) a[i] = (float)(r->rank + 1) * (float)(i % 97);
  st = ddplug_allreduce(ctx, a, b, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  if (st == DDPLUG_OK) st = ddplug_allreduce(ctx, a, a, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  if (st != DDPLUG_OK) {
    *dead = 1;
    cf_report(r, id, slots, CF_FAIL, title, "allreduce of registered buffers: %s: %s",
              ddplug_status_name(st), ddplug_last_error());
    goto out;
  }
  float ranks = (float)r->world * (float)(r->world + 1) / 2.0f;
  for (uint64_t i = 0; i < n; i++)
    if (a[i] != ranks * (float)(i % 97) || b[i] != a[i]) {
      cf_report(r, id, slots, CF_FAIL, title, "element %llu is %g (out of place %g), expected %g",
                (unsigned long long)i, (double)a[i], (double)b[i], (double)(ranks * (float)(i % 97)));
      goto out;
    }
  st = ddplug_mem_free(ctx, a);
  a = NULL;
  if (st == DDPLUG_OK) st = ddplug_mem_free(ctx, b);
  b = NULL;
  if (st != DDPLUG_OK) {
    cf_report(r, id, slots, CF_FAIL, title, "ddplug_mem_free: %s: %s", ddplug_status_name(st),
              ddplug_last_error());
    goto out;
  }
  cf_report(r, id, slots, CF_PASS, title, "%llu floats in place and out of place", (unsigned long long)n);
out:
  if (a) ddplug_mem_free(ctx, a);
  if (b) ddplug_mem_free(ctx, b);
}

static void run_all_kinds(cf_rank *r, const char *host) {
  const ddplug_plugin_info *in = &r->plan->info;
  const char *id = host ? "nodes.open" : "coll.open";
  if (!(in->caps & DDPLUG_CAP_HOST_MEMORY)) {
    cf_report(r, id, 0, CF_SKIP, "collectives on host buffers",
              "the plugin takes device buffers only (no DDPLUG_CAP_HOST_MEMORY); this suite "
              "passes host buffers");
    return;
  }
  ddplug_context *ctx = NULL;
  int s = cf_open(r, NULL, 60, host, &ctx);
  if (s != DDPLUG_OK) {
    cf_report(r, id, CF_BIT(group_create), CF_FAIL, "the scenario's group is created", "%s: %s",
              ddplug_status_name(s), ddplug_last_error());
    return;
  }
  if (host) {
    int nodes = ddplug_context_num_nodes(ctx);
    cf_report(r, "nodes.layout", 0, nodes == 2 ? CF_PASS : CF_FAIL,
              "two nodes: the ranks see two nodes (host ids differ)", "%d node(s)", nodes);
  }
  /* Across nodes, one dtype (float32 where advertised) is enough to reach
   * the plugin's inter-node path with every kind and op. */
  uint32_t dtypes = in->dtype_mask;
  if (host) {
    uint32_t f32 = DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32);
    dtypes = (dtypes & f32) ? f32 : dtypes & (~dtypes + 1);
  }
  int dead = 0;
  kind_rows(r, ctx, DDPLUG_COLL_ALLREDUCE, &dead, host, dtypes);
  kind_rows(r, ctx, DDPLUG_COLL_BROADCAST, &dead, host, dtypes);
  kind_rows(r, ctx, DDPLUG_COLL_ALLGATHER, &dead, host, dtypes);
  if (!host && !dead) registered_rows(r, ctx, &dead);
  ddplug_close(ctx);
}

void cf_coll_rank(cf_rank *r) { run_all_kinds(r, NULL); }

void cf_nodes_rank(cf_rank *r) {
  if (!(r->plan->info.caps & DDPLUG_CAP_MULTI_NODE)) {
    cf_report(r, "nodes.open", 0, CF_SKIP, "two nodes: collectives across nodes",
              "the plugin does not declare DDPLUG_CAP_MULTI_NODE");
    return;
  }
  if (r->world < 2) {
    cf_report(r, "nodes.open", 0, CF_SKIP, "two nodes: collectives across nodes",
              "needs at least 2 ranks (-n)");
    return;
  }
  char host[64];
  snprintf(host, sizeof host, "conformance-node-%d", r->rank % 2);
  run_all_kinds(r, host);
}
