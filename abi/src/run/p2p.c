/* p2p.c — the host API's point-to-point operations: check the arguments
 * against the plugin's capabilities (before the plugin sees them), start
 * them through the plugin's p2p_start, and wrap the plugin's request like a
 * collective's (collective.c waits, tests and frees both). Sends and
 * receives take no sequence number: they are not collectives, and a plugin
 * without the slot refuses them with UNSUPPORTED naming the operation.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <string.h>

#include "run/context.h"

static const char *op_name(int kind) { return kind == DDPLUG_P2P_SEND ? "send" : "recv"; }

static int validate(ddplug_context *ctx, const ddplug_p2p_args *a, const char *fn) {
  const ddplug_plugin *t = &ctx->plugin->table;
  const int ws = ctx->world.world_size, me = ctx->world.rank;
  const int recv = a->kind == DDPLUG_P2P_RECV;
  if (!t->p2p_start)
    return ddplug__err(DDPLUG_E_UNSUPPORTED,
                       "%s: plugin %s has no point-to-point (%s): it does collectives only; "
                       "move data between ranks with broadcast or allgather, or use a plugin "
                       "with point-to-point (cpu, nccl)", fn, t->name, op_name(a->kind));
  if (recv && a->peer == DDPLUG_ANY_SOURCE) {
    if (!(t->caps & DDPLUG_CAP_P2P_ANY_SOURCE))
      return ddplug__err(DDPLUG_E_UNSUPPORTED,
                         "%s: plugin %s cannot receive from any source (DDPLUG_ANY_SOURCE); "
                         "name the sending rank", fn, t->name);
  } else if (a->peer < 0 || a->peer >= ws) {
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: %s rank %d is not a rank (world size %d%s)",
                       fn, recv ? "source" : "destination", a->peer, ws,
                       recv ? "; DDPLUG_ANY_SOURCE receives from any rank" : "");
  } else if (a->peer == me) {
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: rank %d %s itself; a rank sends to and receives from other "
                       "ranks only (copy the buffer instead)", fn, me,
                       recv ? "receives from" : "sends to");
  }
  if (a->tag < 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: tag %lld is negative (tags are >= 0)", fn,
                       (long long)a->tag);
  uint32_t esize = ddplug_dtype_size(a->dtype);
  if (!esize)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: dtype %d is not a ddplug dtype "
                       "(use DDPLUG_FLOAT32 ... DDPLUG_INT64)", fn, a->dtype);
  if (!(t->dtype_mask & DDPLUG_DTYPE_BIT(a->dtype)))
    return ddplug__err(DDPLUG_E_UNSUPPORTED, "%s: plugin %s does not support dtype %s", fn,
                       t->name, ddplug_dtype_name(a->dtype));
  if (a->count > UINT64_MAX / esize)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: count %llu overflows the buffer size",
                       fn, (unsigned long long)a->count);
  if (a->count > 0 && !a->buf)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: buffer is NULL with count %llu", fn,
                       (unsigned long long)a->count);
  if (a->stream && !(t->caps & DDPLUG_CAP_STREAMS))
    DDPLUG__DEBUG("%s: plugin %s ignores the stream argument", fn, t->name);
  return DDPLUG_OK;
}

static int start(ddplug_context *ctx, ddplug_p2p_args *a, const char *fn, ddplug_request **out) {
  int s = ddplug__start_check(ctx, fn, out);
  if (s != DDPLUG_OK) return s;
  s = validate(ctx, a, fn);
  if (s != DDPLUG_OK) return ddplug__ctx_capture_error(ctx, s);
  ddplug_request *req = NULL;
  if ((s = ddplug__request_new(ctx, fn, &req)) != DDPLUG_OK) return s;
  const int recv = a->kind == DDPLUG_P2P_RECV;
  req->kind = recv ? DDPLUG__REQ_RECV : DDPLUG__REQ_SEND;
  /* a receive from a named rank can match no other: its source is known now
   * (the plugin writes it for DDPLUG_ANY_SOURCE, and may write it again) */
  req->source = recv && a->peer != DDPLUG_ANY_SOURCE ? a->peer : -1;
  req->count = a->count;
  req->dtype = a->dtype;
  req->peer = a->peer;
  req->tag = a->tag;
  a->struct_size = sizeof *a;
  a->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  a->source = recv ? &req->source : NULL;
  ddplug__plugin_err_clear(ctx);
  s = ctx->plugin->table.p2p_start(ctx->group, a, &req->preq);
  if (s != DDPLUG_OK) return ddplug__request_start_failed(ctx, req, s, "p2p_start", fn);
  ddplug__request_link(ctx, req);
  *out = req;
  return DDPLUG_OK;
}

static ddplug_p2p_args make_args(int kind, const void *buf, uint64_t count, int dtype, int peer,
                                 int64_t tag, void *stream) {
  ddplug_p2p_args a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.buf = (void *)buf; /* a send only reads it (plugin.h) */
  a.count = count;
  a.dtype = dtype;
  a.peer = peer;
  a.tag = tag;
  a.stream = stream;
  a.mem = DDPLUG_MEM_AUTO;
  return a;
}

static int run_blocking(ddplug_context *ctx, ddplug_p2p_args *a, const char *fn,
                        int64_t timeout_ms, int *source) {
  if (ddplug__blocking_timeout_check(ctx, fn, timeout_ms, "send or receive") != DDPLUG_OK)
    return DDPLUG_E_INVALID_ARGUMENT;
  ddplug_request *req = NULL;
  int s = start(ctx, a, fn, &req);
  if (s != DDPLUG_OK) return s;
  s = ddplug_request_wait(req, timeout_ms);
  if (s == DDPLUG_OK && source) *source = req->source;
  return ddplug__request_finish_blocking(ctx, req, s);
}

DDPLUG_API int ddplug_isend(ddplug_context *ctx, const void *buf, uint64_t count, int dtype,
                            int peer, int64_t tag, void *stream, ddplug_request **req) {
  ddplug_p2p_args a = make_args(DDPLUG_P2P_SEND, buf, count, dtype, peer, tag, stream);
  return start(ctx, &a, "ddplug_isend", req);
}

DDPLUG_API int ddplug_irecv(ddplug_context *ctx, void *buf, uint64_t count, int dtype,
                            int peer, int64_t tag, void *stream, ddplug_request **req) {
  ddplug_p2p_args a = make_args(DDPLUG_P2P_RECV, buf, count, dtype, peer, tag, stream);
  return start(ctx, &a, "ddplug_irecv", req);
}

DDPLUG_API int ddplug_send(ddplug_context *ctx, const void *buf, uint64_t count, int dtype,
                           int peer, int64_t tag, void *stream, int64_t timeout_ms) {
  ddplug_p2p_args a = make_args(DDPLUG_P2P_SEND, buf, count, dtype, peer, tag, stream);
  return run_blocking(ctx, &a, "ddplug_send", timeout_ms, NULL);
}

DDPLUG_API int ddplug_recv(ddplug_context *ctx, void *buf, uint64_t count, int dtype,
                           int peer, int64_t tag, void *stream, int64_t timeout_ms,
                           int *source) {
  ddplug_p2p_args a = make_args(DDPLUG_P2P_RECV, buf, count, dtype, peer, tag, stream);
  return run_blocking(ctx, &a, "ddplug_recv", timeout_ms, source);
}

DDPLUG_API int ddplug_request_source(const ddplug_request *req, int *rank) {
  if (!req || !rank)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_request_source: req and rank are required");
  if (req->kind != DDPLUG__REQ_RECV)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_request_source: %s is not a receive",
                       ddplug__request_what((ddplug_request *)req));
  if (!req->finished || req->status != DDPLUG_OK)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_request_source: %s %s",
                       ddplug__request_what((ddplug_request *)req),
                       req->finished ? "failed: it matched no sender"
                                     : "has not completed (wait for it first)");
  *rank = req->source;
  return DDPLUG_OK;
}
