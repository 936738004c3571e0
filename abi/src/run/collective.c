/* collective.c — the host API's collectives: validate arguments against the
 * plugin's capabilities (before the plugin sees them), number them (seq),
 * start them through the plugin's collective_start, and wrap the plugin's
 * request. A failed wait that leaves the group unusable (timeout of a
 * blocking call, peer lost, mismatch) aborts the context, so every later
 * call says why instead of hanging.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <string.h>

#include "run/context.h"
#include "store/store.h"

static const char *kind_name(int kind) {
  switch (kind) {
    case DDPLUG_COLL_ALLREDUCE: return "allreduce";
    case DDPLUG_COLL_BROADCAST: return "broadcast";
    case DDPLUG_COLL_ALLGATHER: return "allgather";
    case DDPLUG_COLL_BARRIER: return "barrier";
    default: return "collective";
  }
}

/* See context.h. */
const char *ddplug__request_what(ddplug_request *req) {
  if (req->what[0]) return req->what;
  if (req->kind >= DDPLUG__REQ_SEND) {
    const int recv = req->kind == DDPLUG__REQ_RECV;
    char peer[32];
    if (req->peer == DDPLUG_ANY_SOURCE) snprintf(peer, sizeof peer, "any rank");
    else snprintf(peer, sizeof peer, "rank %d", req->peer);
    snprintf(req->what, sizeof req->what, "%s of %llu %s %s %s (tag %lld)",
             recv ? "receive" : "send", (unsigned long long)req->count,
             ddplug_dtype_name(req->dtype), recv ? "from" : "to", peer, (long long)req->tag);
  } else if (req->kind == DDPLUG_COLL_BARRIER) {
    snprintf(req->what, sizeof req->what, "collective #%llu (barrier)",
             (unsigned long long)req->seq);
  } else {
    snprintf(req->what, sizeof req->what, "collective #%llu (%s of %llu %s%s%s)",
             (unsigned long long)req->seq, kind_name(req->kind),
             (unsigned long long)req->count, ddplug_dtype_name(req->dtype),
             req->kind == DDPLUG_COLL_ALLREDUCE ? ", " : "",
             req->kind == DDPLUG_COLL_ALLREDUCE ? ddplug_op_name(req->op) : "");
  }
  return req->what;
}

static int is_integer(int dtype) {
  return dtype == DDPLUG_INT8 || dtype == DDPLUG_UINT8 || dtype == DDPLUG_INT32 ||
         dtype == DDPLUG_INT64;
}

static void mask_names(uint32_t mask, const char *(*name)(int), char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 1; i < 32 && len + 16 < cap; i++)
    if ((mask & (1u << i)) && name(i))
      len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", name(i));
}

static int validate(ddplug_context *ctx, const ddplug_coll_args *a, const char *fn) {
  const ddplug_plugin *t = &ctx->plugin->table;
  const int ws = ctx->world.world_size;
  if (a->kind == DDPLUG_COLL_BARRIER) return DDPLUG_OK;
  uint32_t esize = ddplug_dtype_size(a->dtype);
  if (!esize)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: dtype %d is not a ddplug dtype "
                       "(use DDPLUG_FLOAT32 ... DDPLUG_INT64)", fn, a->dtype);
  if (!(t->dtype_mask & DDPLUG_DTYPE_BIT(a->dtype))) {
    char names[256];
    mask_names(t->dtype_mask, ddplug_dtype_name, names, sizeof names);
    return ddplug__err(DDPLUG_E_UNSUPPORTED, "%s: plugin %s does not support dtype %s "
                       "(it supports %s)", fn, t->name, ddplug_dtype_name(a->dtype), names);
  }
  if (a->kind == DDPLUG_COLL_ALLREDUCE) {
    if (!ddplug_op_name(a->op))
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: op %d is not a ddplug reduce op "
                         "(use DDPLUG_OP_SUM ... DDPLUG_OP_BAND)", fn, a->op);
    if ((a->op == DDPLUG_OP_BOR || a->op == DDPLUG_OP_BAND) && !is_integer(a->dtype))
      return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: op %s needs an integer dtype, "
                         "got %s", fn, ddplug_op_name(a->op), ddplug_dtype_name(a->dtype));
    if (!(t->op_mask & DDPLUG_OP_BIT(a->op))) {
      char names[256];
      mask_names(t->op_mask, ddplug_op_name, names, sizeof names);
      return ddplug__err(DDPLUG_E_UNSUPPORTED, "%s: plugin %s does not support op %s "
                         "(it supports %s)", fn, t->name, ddplug_op_name(a->op), names);
    }
  }
  if (a->kind == DDPLUG_COLL_BROADCAST && (a->root < 0 || a->root >= ws))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: root %d is not a rank (world "
                       "size %d)", fn, a->root, ws);
  uint64_t per = a->kind == DDPLUG_COLL_ALLGATHER ? (uint64_t)ws : 1;
  if (a->count > UINT64_MAX / esize / per)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: count %llu overflows the buffer size",
                       fn, (unsigned long long)a->count);
  if (a->count > 0 && (!a->recv || (!a->send && a->kind != DDPLUG_COLL_BROADCAST)))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: %s buffer is NULL with count %llu",
                       fn, !a->recv ? "receive" : "send", (unsigned long long)a->count);
  if (a->kind == DDPLUG_COLL_BROADCAST && a->count > 0 && !a->send &&
      ctx->world.rank == a->root)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: the root's send buffer is NULL", fn);
  if (a->stream && !(t->caps & DDPLUG_CAP_STREAMS))
    DDPLUG__DEBUG("%s: plugin %s ignores the stream argument", fn, t->name);
  return DDPLUG_OK;
}

/* Caller errors and a mismatch (reported alike on every rank, group still
 * usable) leave the run going; anything else that left a collective
 * unstarted or unfinished ends it, with this rank's explanation (the last
 * error) for everyone. */
void ddplug__end_run_if_broken(ddplug_context *ctx, int s) {
  if (s == DDPLUG_OK || s == DDPLUG_E_MISMATCH || s == DDPLUG_E_INVALID_ARGUMENT ||
      s == DDPLUG_E_UNSUPPORTED || atomic_load(&ctx->state) != DDPLUG__CTX_OPEN)
    return;
  char msg[DDPLUG__ERRMSG_MAX + 64];
  snprintf(msg, sizeof msg, "rank %d ended the run: %s", ctx->world.rank, ddplug_last_error());
  ddplug__ctx_abort(ctx, s, msg, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
  ddplug__set_last_error(msg);
}

/* A request that failed, or could not start, with ABORTED/PEER_LOST takes
 * the run's own explanation (ddplug/abort, which names the lost rank) over
 * the plugin's generic ABORTED, waiting this long for it when the watcher
 * has not read it yet: the plugin may learn of a peer's abort or death
 * through its own channels first. */
#define RUN_REASON_WAIT_MS 300
#define RUN_REASON_GRACE_MS 100

static void adopt_run_reason(ddplug_context *ctx, int can_block) {
  if (atomic_load(&ctx->state) != DDPLUG__CTX_OPEN) return;
  void *val = NULL;
  uint64_t len = 0;
  /* On a failure path: the store may be what failed; wait for it only a
   * little past the wait itself. */
  int s = ddplug__store_get_within(ctx->store, ctx->abort_key, can_block ? RUN_REASON_WAIT_MS : 0,
                                   RUN_REASON_GRACE_MS, &val, &len);
  if (s != DDPLUG_OK) {
    /* A store whose connection closed (rather than one with no record yet,
     * or a slow one) is gone with rank 0: that is the run's reason, as the
     * watcher would find. Without it, a peer's abort for that loss reached
     * this rank's plugin first and would end the run as ABORTED instead of
     * PEER_LOST. */
    if (s == DDPLUG_E_PEER_LOST) ddplug__ctx_store_lost(ctx);
    return;
  }
  ddplug__ctx_adopt_abort(ctx, val, DDPLUG__ABORT_NOTIFY);
  ddplug_free(val);
}

int ddplug__request_new(ddplug_context *ctx, const char *fn, ddplug_request **out) {
  ddplug_request *req = ddplug__calloc(1, sizeof *req);
  if (!req) return ddplug__ctx_capture_error(
      ctx, ddplug__err(DDPLUG_E_NO_MEMORY, "%s: out of memory", fn));
  req->ctx = ctx;
  *out = req;
  return DDPLUG_OK;
}

int ddplug__request_start_failed(ddplug_context *ctx, ddplug_request *req, int s,
                                 const char *slot, const char *prefix) {
  if (!req->on_stack) ddplug__free(req);
  /* A peer's abort (or the plugin's own news of a lost rank) may reach the
   * plugin before this rank's watcher has read the run's reason: adopt it,
   * so an elastic run sees the PEER_LOST that a survivor can recover from. */
  if (s == DDPLUG_E_ABORTED || s == DDPLUG_E_PEER_LOST) adopt_run_reason(ctx, 1);
  /* The run ended meanwhile: its status, not the plugin's ABORTED */
  int run = ddplug__ctx_check(ctx);
  if (run != DDPLUG_OK) return ddplug__ctx_capture_error(ctx, run);
  ddplug__plugin_err_take(ctx, s, slot);
  if (prefix) ddplug__err_prefix(s, "%s", prefix);
  ddplug__end_run_if_broken(ctx, s);
  return ddplug__ctx_capture_error(ctx, s);
}

int ddplug__start_check(ddplug_context *ctx, const char *fn, ddplug_request **out) {
  if (!ctx) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
  if (!out) return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                                     "%s: req must not be NULL", fn));
  int s = ddplug__ctx_check(ctx);
  return s != DDPLUG_OK ? ddplug__ctx_capture_error(ctx, s) : DDPLUG_OK;
}

/* Start a collective into *out: a new request, or with `mine` the caller's
 * (a blocking call's, on its stack: no allocation). */
static int start(ddplug_context *ctx, ddplug_coll_args *a, const char *fn,
                 ddplug_request **out, ddplug_request *mine) {
  int s = ddplug__start_check(ctx, fn, out);
  if (s != DDPLUG_OK) return s;
  s = validate(ctx, a, fn);
  if (s != DDPLUG_OK) return ddplug__ctx_capture_error(ctx, s);
  ddplug_request *req = mine;
  if (req) {
    memset(req, 0, sizeof *req);
    req->ctx = ctx;
    req->on_stack = 1;
  } else if ((s = ddplug__request_new(ctx, fn, &req)) != DDPLUG_OK) {
    return s;
  }
  a->struct_size = sizeof *a;
  a->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  a->seq = ctx->seq + 1;
  req->seq = a->seq;
  req->kind = a->kind;
  req->count = a->count;
  req->dtype = a->dtype;
  req->op = a->op;
  ddplug__plugin_err_clear(ctx);
  s = ctx->plugin->table.collective_start(ctx->group, a, &req->preq);
  if (s != DDPLUG_OK) return ddplug__request_start_failed(ctx, req, s, "collective_start", NULL);
  ctx->seq = a->seq;
  ddplug__request_link(ctx, req);
  *out = req;
  return DDPLUG_OK;
}

void ddplug__request_link(ddplug_context *ctx, ddplug_request *req) {
  pthread_mutex_lock(&ctx->mu);
  req->next = ctx->live;
  if (ctx->live) ctx->live->prev = req;
  ctx->live = req;
  pthread_mutex_unlock(&ctx->mu);
}

void ddplug__requests_orphan(ddplug_context *ctx, ddplug_plugin_group *group) {
  const ddplug_plugin *t = &ctx->plugin->table;
  pthread_mutex_lock(&ctx->mu);
  for (ddplug_request *r = ctx->live; r; r = r->next) {
    /* Finished requests are released here; group_destroy frees the
     * plugin's side of those still pending. */
    int32_t done = r->finished;
    if (!done && t->request_test(group, r->preq, &done) != DDPLUG_OK) done = 1;
    if (done) t->request_free(group, r->preq);
    r->ctx = NULL;
    r->preq = NULL;
  }
  ctx->live = NULL;
  pthread_mutex_unlock(&ctx->mu);
}

static int orphaned(const char *fn) {
  return ddplug__err(DDPLUG_E_ABORTED, "%s: the request's context was closed", fn);
}

static int finish_failed(ddplug_request *req, int s, int can_block, const char *slot) {
  ddplug_context *ctx = req->ctx;
  if (s == DDPLUG_E_ABORTED || s == DDPLUG_E_PEER_LOST) adopt_run_reason(ctx, can_block);
  int run = ddplug__ctx_check(ctx);
  /* Once the run has ended, a request's failure is its consequence (the
   * plugin was aborted, a wait in host services stopped): say why the run
   * ended. Only a caller error or a mismatch is the request's own. */
  if (run != DDPLUG_OK && s != DDPLUG_E_MISMATCH && s != DDPLUG_E_INVALID_ARGUMENT &&
      s != DDPLUG_E_UNSUPPORTED) {
    s = run;
  } else {
    ddplug__plugin_err_take(ctx, s, slot);
    ddplug__err_prefix(s, "%s", ddplug__request_what(req));
  }
  req->finished = 1;
  req->status = s;
  return s;
}

DDPLUG_API int ddplug_request_wait(ddplug_request *req, int64_t timeout_ms) {
  if (!req) return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_request_wait: req is NULL");
  ddplug_context *ctx = req->ctx;
  if (!ctx) return orphaned("ddplug_request_wait");
  if (req->finished) {
    if (req->status == DDPLUG_OK) return DDPLUG_OK;
    int run = ddplug__ctx_check(ctx);
    if (run == DDPLUG_OK) ddplug__err(req->status, "%s already failed", ddplug__request_what(req));
    return ddplug__ctx_capture_error(ctx, run != DDPLUG_OK ? run : req->status);
  }
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT) timeout_ms = ctx->coll_timeout_ms;
  if (timeout_ms < 0)
    return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                             "ddplug_request_wait: timeout %lld ms is negative",
                                             (long long)timeout_ms));
  /* The plugin's explanation is not cleared here: a plugin may have set it
   * while starting the request (a synchronous plugin does all its work in
   * collective_start, which cleared it). */
  int s = ctx->plugin->table.request_wait(ctx->group, req->preq, timeout_ms);
  if (s == DDPLUG_OK) {
    req->finished = 1;
    req->status = DDPLUG_OK;
    return DDPLUG_OK;
  }
  if (ddplug__own_timeout(ctx, s)) {
    ddplug__plugin_err_take(ctx, s, "request_wait");
    ddplug__err_prefix(s, "%s timed out after %.3f s on rank %d", ddplug__request_what(req),
                       (double)timeout_ms / 1000.0, ctx->world.rank);
    return ddplug__ctx_capture_error(ctx, s);
  }
  return ddplug__ctx_capture_error(ctx, finish_failed(req, s, 1, "request_wait"));
}

DDPLUG_API int ddplug_request_test(ddplug_request *req, int *done) {
  if (!req || !done)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "ddplug_request_test: req and done are required");
  ddplug_context *ctx = req->ctx;
  if (!ctx) {
    *done = 1;
    return orphaned("ddplug_request_test");
  }
  if (req->finished) {
    *done = 1;
    return req->status;
  }
  int32_t d = 0;
  int s = ctx->plugin->table.request_test(ctx->group, req->preq, &d);
  if (s != DDPLUG_OK) {
    *done = 1;
    return ddplug__ctx_capture_error(ctx, finish_failed(req, s, 0, "request_test"));
  }
  if (d) {
    req->finished = 1;
    req->status = DDPLUG_OK;
  }
  *done = d ? 1 : 0;
  return DDPLUG_OK;
}

DDPLUG_API uint64_t ddplug_request_seq(const ddplug_request *req) {
  return req ? req->seq : 0;
}

DDPLUG_API void ddplug_request_free(ddplug_request *req) {
  if (!req) return;
  ddplug_context *ctx = req->ctx;
  if (!ctx) { /* its context was closed; the plugin's side is gone */
    if (!req->on_stack) ddplug__free(req);
    return;
  }
  pthread_mutex_lock(&ctx->mu);
  if (req->prev) req->prev->next = req->next;
  else ctx->live = req->next;
  if (req->next) req->next->prev = req->prev;
  pthread_mutex_unlock(&ctx->mu);
  const ddplug_plugin *t = &ctx->plugin->table;
  if (!req->finished) {
    int32_t d = 0;
    int s = t->request_test(ctx->group, req->preq, &d);
    /* Without group_abort nothing can stop it: let it finish first. */
    if (s == DDPLUG_OK && !d && !t->group_abort)
      s = t->request_wait(ctx->group, req->preq, ctx->coll_timeout_ms), d = s == DDPLUG_OK;
    if (s == DDPLUG_OK && !d) {
      char msg[256];
      snprintf(msg, sizeof msg, "rank %d freed %s before it completed", ctx->world.rank,
               ddplug__request_what(req));
      ddplug__ctx_abort(ctx, DDPLUG_E_ABORTED, msg, DDPLUG__ABORT_PUBLISH | DDPLUG__ABORT_NOTIFY);
    }
  }
  t->request_free(ctx->group, req->preq);
  if (!req->on_stack) ddplug__free(req);
}

/* Blocking form: start, wait the collective timeout, free. A collective that
 * did not complete leaves the group unusable: abort the run with the reason. */
static int run_blocking(ddplug_context *ctx, ddplug_coll_args *a, const char *fn,
                        int64_t timeout_ms) {
  if (ddplug__blocking_timeout_check(ctx, fn, timeout_ms, "collective") != DDPLUG_OK)
    return DDPLUG_E_INVALID_ARGUMENT;
  ddplug_request own, *req = NULL;
  int s = start(ctx, a, fn, &req, &own);
  if (s != DDPLUG_OK) return s;
  return ddplug__request_finish_blocking(ctx, req, ddplug_request_wait(req, timeout_ms));
}

int ddplug__blocking_timeout_check(ddplug_context *ctx, const char *fn, int64_t timeout_ms,
                                   const char *what) {
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT || timeout_ms > 0) return DDPLUG_OK;
  return ddplug__ctx_capture_error(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                           "%s: timeout %lld ms: a blocking %s needs a positive "
                                           "timeout or DDPLUG_TIMEOUT_DEFAULT (to poll, use the "
                                           "i-form and ddplug_request_test)",
                                           fn, (long long)timeout_ms, what));
}

int ddplug__request_finish_blocking(ddplug_context *ctx, ddplug_request *req, int s) {
  if (s == DDPLUG_OK) {
    ddplug_request_free(req);
    return s;
  }
  ddplug__end_run_if_broken(ctx, s);
  char keep[DDPLUG__ERRMSG_MAX];
  ddplug__strlcpy(keep, ddplug_last_error(), sizeof keep);
  ddplug_request_free(req);
  ddplug__set_last_error(keep);
  ddplug__ctx_capture_error(ctx, s);
  return s;
}

static ddplug_coll_args make_args(int kind, const void *send, void *recv, uint64_t count,
                                  int dtype, int op, int root, void *stream) {
  ddplug_coll_args a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.root = root;
  a.stream = stream;
  a.mem = DDPLUG_MEM_AUTO;
  return a;
}

DDPLUG_API int ddplug_iallreduce(ddplug_context *ctx, const void *send, void *recv,
                                 uint64_t count, int dtype, int op, void *stream,
                                 ddplug_request **req) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_ALLREDUCE, send, recv, count, dtype, op, 0, stream);
  return start(ctx, &a, "ddplug_iallreduce", req, NULL);
}

DDPLUG_API int ddplug_ibroadcast(ddplug_context *ctx, const void *send, void *recv,
                                 uint64_t count, int dtype, int root, void *stream,
                                 ddplug_request **req) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_BROADCAST, send, recv, count, dtype, 0, root, stream);
  return start(ctx, &a, "ddplug_ibroadcast", req, NULL);
}

DDPLUG_API int ddplug_iallgather(ddplug_context *ctx, const void *send, void *recv,
                                 uint64_t count, int dtype, void *stream,
                                 ddplug_request **req) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_ALLGATHER, send, recv, count, dtype, 0, 0, stream);
  return start(ctx, &a, "ddplug_iallgather", req, NULL);
}

DDPLUG_API int ddplug_ibarrier(ddplug_context *ctx, ddplug_request **req) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, NULL);
  return start(ctx, &a, "ddplug_ibarrier", req, NULL);
}

DDPLUG_API int ddplug_allreduce(ddplug_context *ctx, const void *send, void *recv,
                                uint64_t count, int dtype, int op, void *stream) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_ALLREDUCE, send, recv, count, dtype, op, 0, stream);
  return run_blocking(ctx, &a, "ddplug_allreduce", DDPLUG_TIMEOUT_DEFAULT);
}

DDPLUG_API int ddplug_broadcast(ddplug_context *ctx, const void *send, void *recv,
                                uint64_t count, int dtype, int root, void *stream) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_BROADCAST, send, recv, count, dtype, 0, root, stream);
  return run_blocking(ctx, &a, "ddplug_broadcast", DDPLUG_TIMEOUT_DEFAULT);
}

DDPLUG_API int ddplug_allgather(ddplug_context *ctx, const void *send, void *recv,
                                uint64_t count, int dtype, void *stream) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_ALLGATHER, send, recv, count, dtype, 0, 0, stream);
  return run_blocking(ctx, &a, "ddplug_allgather", DDPLUG_TIMEOUT_DEFAULT);
}

DDPLUG_API int ddplug_barrier(ddplug_context *ctx, int64_t timeout_ms) {
  ddplug_coll_args a = make_args(DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, NULL);
  return run_blocking(ctx, &a, "ddplug_barrier", timeout_ms);
}
