/* async.c — requests: several in flight complete in the order
 * they were started with the right data; with DDPLUG_CAP_ASYNC, a request
 * whose peers are late is reported pending by request_test without
 * blocking, and request_wait with a short timeout returns TIMEOUT and
 * leaves the request usable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "ddplug/store.h"

#define COUNT 1031
#define INFLIGHT 6

/* "Late" ranks start their collective only once rank 0 has looked at its
 * request (a key in the scenario's store, under "user/"), so nothing can
 * complete before that, however long anything takes. A request_test or a
 * short request_wait that blocked instead of returning would keep them
 * waiting: the scenario's limit reports it as a call that blocked. */
#define LATE_WAIT_MS (10 * 60 * 1000)

static void let_the_late_ranks_start(ddplug_context *ctx, const char *key) {
  (void)ddplug_store_set(ddplug_context_store(ctx), key, "1", 1);
}

static int wait_for_rank0(ddplug_context *ctx, const char *key) {
  const char *keys[1] = {key};
  return ddplug_store_wait(ddplug_context_store(ctx), keys, 1, LATE_WAIT_MS);
}

/* The dtype and op the request checks use: float32 sum where advertised. */
static void pick(const ddplug_plugin_info *in, int *dtype, int *op) {
  *dtype = (in->dtype_mask & DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32)) ? DDPLUG_FLOAT32 : 0;
  for (int d = 1; !*dtype && d < DDPLUG_DTYPE_COUNT_; d++)
    if (in->dtype_mask & DDPLUG_DTYPE_BIT(d)) *dtype = d;
  *op = (in->op_mask & DDPLUG_OP_BIT(DDPLUG_OP_SUM)) ? DDPLUG_OP_SUM : 0;
  for (int o = 1; !*op && o < DDPLUG_OP_COUNT_; o++)
    if ((in->op_mask & DDPLUG_OP_BIT(o)) && cf_op_valid(*dtype, o)) *op = o;
}

static void fill(int dtype, int op, int rank, void *buf, uint64_t shift) {
  for (uint64_t i = 0; i < COUNT; i++) cf_put(dtype, buf, i, cf_input(dtype, op, rank, i + shift));
}

/* 0 when buf holds the result for shift; else writes why. */
static int verify(int dtype, int op, int world, const void *buf, uint64_t shift, char *why,
                  size_t cap) {
  for (uint64_t i = 0; i < COUNT; i++) {
    double got = cf_get(dtype, buf, i), want = cf_expected(dtype, op, world, i + shift);
    if (!cf_same(dtype, op, got, want)) {
      snprintf(why, cap, "element %llu is %g, expected %g", (unsigned long long)i, got, want);
      return -1;
    }
  }
  return 0;
}

#define REQ_SLOTS (CF_COLL_SLOTS | CF_BIT(request_test))

static void inflight(cf_rank *r, ddplug_context *ctx, int dt, int op, int *dead) {
  const char *T = "requests: several in flight complete in order, each with its own data";
  size_t es = ddplug_dtype_size(dt);
  char *buf[INFLIGHT] = {0}, why[1024] = "";
  ddplug_request *req[INFLIGHT] = {0};
  int s = DDPLUG_OK, bad = 0, k;
  for (k = 0; k < INFLIGHT; k++) {
    buf[k] = malloc(COUNT * es);
    if (!buf[k]) break;
    fill(dt, op, r->rank, buf[k], (uint64_t)k * 7);
    s = ddplug_iallreduce(ctx, buf[k], buf[k], COUNT, dt, op, NULL, &req[k]);
    if (s) {
      snprintf(why, sizeof why, "iallreduce #%d: %s: %s", k, ddplug_status_name(s), cf_error(ctx));
      break;
    }
  }
  int started = k;
  if (!s && started == INFLIGHT) {
    s = ddplug_request_wait(req[INFLIGHT - 1], 30000);
    if (s)
      snprintf(why, sizeof why, "waiting for the last request: %s: %s", ddplug_status_name(s),
               cf_error(ctx));
  }
  if (!s && started == INFLIGHT) {
    int done = 0;
    s = ddplug_request_test(req[0], &done);
    if (!s && !done) {
      snprintf(why, sizeof why,
               "the last request completed but request_test says the first is still pending: "
               "collectives must complete in the order they were started");
      bad = 1;
    }
  }
  for (k = 0; k < started; k++) {
    if (!s && !bad) {
      s = ddplug_request_wait(req[k], 30000);
      if (s)
        snprintf(why, sizeof why, "request #%d: %s: %s", k, ddplug_status_name(s), cf_error(ctx));
      else if (verify(dt, op, r->world, buf[k], (uint64_t)k * 7, why, sizeof why))
        bad = 1;
    }
    ddplug_request_free(req[k]);
  }
  for (k = 0; k < INFLIGHT; k++) free(buf[k]);
  if (s) *dead = 1;
  cf_report(r, "async.inflight", REQ_SLOTS, s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

/* Rank 0 starts and tests; the others start once it has tested. */
static void pending(cf_rank *r, ddplug_context *ctx, int dt, int op, int *dead) {
  const char *T = "async: request_test never blocks and reports a pending request";
  static const char *const tested = "user/conformance/async/pending-tested";
  size_t es = ddplug_dtype_size(dt);
  char *buf = malloc(COUNT * es), why[1024] = "";
  ddplug_request *req = NULL;
  int bad = 0;
  fill(dt, op, r->rank, buf, 11);
  int s = r->rank != 0 ? wait_for_rank0(ctx, tested) : DDPLUG_OK;
  if (s)
    snprintf(why, sizeof why, "waiting for rank 0 to test its request: %s: %s",
             ddplug_status_name(s), ddplug_last_error());
  else
    s = ddplug_iallreduce(ctx, buf, buf, COUNT, dt, op, NULL, &req);
  if (s) {
    if (!*why)
      snprintf(why, sizeof why, "iallreduce: %s: %s", ddplug_status_name(s), cf_error(ctx));
  } else if (r->rank == 0) {
    int done = 0, calls = 0;
    double slowest = 0, t0 = cf_now();
    s = ddplug_request_test(req, &done);
    slowest = cf_now() - t0;
    let_the_late_ranks_start(ctx, tested);
    if (!s && done) {
      snprintf(why, sizeof why,
               "request_test says done although the other ranks had not started yet");
      bad = 1;
    }
    while (!s && !done && !bad && cf_now() - t0 < 30) {
      double a = cf_now();
      s = ddplug_request_test(req, &done);
      double took = cf_now() - a;
      slowest = took > slowest ? took : slowest;
      calls++;
      if (!done) cf_sleep_ms(1);
    }
    if (s)
      snprintf(why, sizeof why, "request_test: %s: %s", ddplug_status_name(s), cf_error(ctx));
    else if (!bad && !done)
      snprintf(why, sizeof why, "still pending after 30 s of request_test"), bad = 1;
    else if (!bad && !verify(dt, op, r->world, buf, 11, why, sizeof why))
      snprintf(why, sizeof why, "pending for %d polls (slowest %.1f ms), then done", calls,
               slowest * 1e3);
    else
      bad = 1;
  } else {
    s = ddplug_request_wait(req, 30000);
    if (s)
      snprintf(why, sizeof why, "wait: %s: %s", ddplug_status_name(s), cf_error(ctx));
    else
      bad = verify(dt, op, r->world, buf, 11, why, sizeof why) != 0;
  }
  ddplug_request_free(req);
  free(buf);
  if (s) *dead = 1;
  cf_report(r, "async.pending", REQ_SLOTS, s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

static void short_wait(cf_rank *r, ddplug_context *ctx, int dt, int op, int *dead) {
  const char *T = "async: request_wait with a short timeout returns TIMEOUT, the request stays usable";
  static const char *const waited = "user/conformance/async/short-waited";
  size_t es = ddplug_dtype_size(dt);
  char *buf = malloc(COUNT * es), why[1024] = "";
  ddplug_request *req = NULL;
  int bad = 0;
  fill(dt, op, r->rank, buf, 23);
  int s = r->rank != 0 ? wait_for_rank0(ctx, waited) : DDPLUG_OK;
  if (s)
    snprintf(why, sizeof why, "waiting for rank 0's short wait: %s: %s", ddplug_status_name(s),
             ddplug_last_error());
  else
    s = ddplug_iallreduce(ctx, buf, buf, COUNT, dt, op, NULL, &req);
  if (!s && r->rank == 0) {
    int w = ddplug_request_wait(req, 50);
    let_the_late_ranks_start(ctx, waited);
    if (w != DDPLUG_E_TIMEOUT) {
      snprintf(why, sizeof why, "request_wait(50 ms) while the others were late returned %s, "
               "expected TIMEOUT%s%s", ddplug_status_name(w), w ? ": " : "", w ? cf_error(ctx) : "");
      bad = 1;
      if (w != DDPLUG_OK) s = w;
    }
  }
  if (!s && !bad) {
    s = ddplug_request_wait(req, 30000);
    if (s)
      snprintf(why, sizeof why, "waiting again: %s: %s", ddplug_status_name(s), cf_error(ctx));
    else
      bad = verify(dt, op, r->world, buf, 23, why, sizeof why) != 0;
  }
  if (req) ddplug_request_free(req);
  free(buf);
  if (s) *dead = 1;
  cf_report(r, "async.timeout", REQ_SLOTS, s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

void cf_async_rank(cf_rank *r) {
  const ddplug_plugin_info *in = &r->plan->info;
  if (!(in->caps & DDPLUG_CAP_HOST_MEMORY)) {
    cf_report(r, "async.inflight", 0, CF_SKIP, "requests",
              "the plugin takes device buffers only; this suite passes host buffers");
    return;
  }
  int dt, op, dead = 0;
  pick(in, &dt, &op);
  ddplug_context *ctx = NULL;
  int s = cf_open(r, NULL, 60, NULL, &ctx);
  if (s != DDPLUG_OK) {
    cf_report(r, "async.open", CF_BIT(group_create), CF_FAIL, "the scenario's group is created",
              "%s: %s", ddplug_status_name(s), ddplug_last_error());
    return;
  }
  inflight(r, ctx, dt, op, &dead);
  const char *no_async = "the plugin does not declare DDPLUG_CAP_ASYNC: collective_start may "
                         "complete the operation before it returns";
  if (!(in->caps & DDPLUG_CAP_ASYNC)) {
    cf_report(r, "async.pending", 0, CF_SKIP,
              "async: request_test never blocks and reports a pending request", "%s", no_async);
    cf_report(r, "async.timeout", 0, CF_SKIP,
              "async: request_wait with a short timeout returns TIMEOUT, the request stays usable",
              "%s", no_async);
  } else if (r->world < 2) {
    cf_report(r, "async.pending", 0, CF_SKIP, "async: pending requests", "needs 2 ranks (-n)");
  } else {
    if (!dead) pending(r, ctx, dt, op, &dead);
    if (!dead) short_wait(r, ctx, dt, op, &dead);
  }
  ddplug_close(ctx);
}
