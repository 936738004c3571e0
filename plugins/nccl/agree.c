/*
 * agree.c — setup phases that every rank passes together: each rank says
 * whether its local part worked, and every rank learns whether all did.
 *
 * Why: a rank that fails alone (no GPU, a bad device_map entry, NCCL too
 * old) would otherwise leave the others blocked until their timeout, and
 * they would report a timeout instead of the cause. With this exchange a
 * failure on rank 3 is reported on every rank as "rank 3: ...".
 *
 * Keys, under the plugin's store namespace, for phase P:
 *   P/in/<rank>    "1": this rank arrived (to name the missing on timeout)
 *   P/nfail        counter of failed ranks; P/fail/<k> = "<status> <rank> <text>"
 *   P/arrived      counter of arrived ranks; the last one sets P/all
 *   P/left, P/left-all   the same once more on failure, so that the rank
 *                  serving the store does not leave before the others
 *                  have read why
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct phase_ctx {
  const ddplug_host_services *svc;
  const char *phase;
  int32_t rank, world;
  uint64_t deadline_ns;
  char *msg;
  size_t cap;
} phase_ctx;

static void key_of(const phase_ctx *p, char *key, size_t cap, const char *what) {
  ddnccl_fmt(key, cap, "%s/%s", p->phase, what);
}

/* Reports a failed store call in msg and returns its status. */
static int store_failed(const phase_ctx *p, int st, const char *op,
                        const char *key) {
  ddnccl_fmt(p->msg, p->cap,
             "nccl setup (%s): store %s of key '%s' failed with %s "
             "(the rendezvous store is unreachable: did rank 0 exit?)",
             p->phase, op, key, ddnccl_status_name(st));
  return st;
}

/* Counts this rank in counter `what`; the rank that completes the count
 * sets `what`-all. Then waits for `what`-all until the deadline. */
static int count_and_wait(const phase_ctx *p, const char *what) {
  const ddplug_host_services *s = p->svc;
  char key[300], all[300];
  key_of(p, key, sizeof key, what);
  ddnccl_fmt(all, sizeof all, "%s-all", key);
  int64_t n = 0;
  int st = s->store_add(s->host, key, 1, &n);
  if (st != DDPLUG_OK) return store_failed(p, st, "add", key);
  if (n == p->world) {
    st = s->store_set(s->host, all, "1", 1);
    if (st != DDPLUG_OK) return store_failed(p, st, "set", all);
  }
  const char *keys[1] = {all};
  return s->store_wait(s->host, keys, 1, ddnccl_left_ms(p->deadline_ns));
}

/* On timeout: which ranks never announced themselves (at most 8 named). */
static void name_missing(const phase_ctx *p) {
  const ddplug_host_services *s = p->svc;
  char list[200] = "";
  size_t w = 0;
  int32_t missing = 0;
  for (int32_t r = 0; r < p->world; r++) {
    char key[300], v[8];
    uint64_t len = 0;
    ddnccl_fmt(key, sizeof key, "%s/in/%d", p->phase, r);
    if (s->store_get(s->host, key, v, sizeof v, &len, 0) == DDPLUG_OK) continue;
    if (missing < 8 && w < sizeof list)
      w += (size_t)snprintf(list + w, sizeof list - w, "%s%d",
                            missing ? ", " : "", r);
    missing++;
  }
  if (missing > 8 && w < sizeof list)
    snprintf(list + w, sizeof list - w, " and %d more", missing - 8);
  ddnccl_fmt(p->msg, p->cap,
             "nccl setup (%s): rank%s %s did not arrive in time "
             "(crashed, not started, or stuck before opening the group?)",
             p->phase, missing == 1 ? "" : "s", missing ? list : "?");
}

/* Reads the first reported failure into msg; returns its status. */
static int first_failure(const phase_ctx *p, int64_t nfail) {
  const ddplug_host_services *s = p->svc;
  char key[300], buf[DDNCCL_MSG_MAX + 64];
  uint64_t len = 0;
  key_of(p, key, sizeof key, "fail/1");
  int st = s->store_get(s->host, key, buf, sizeof buf - 1, &len,
                        ddnccl_left_ms(p->deadline_ns));
  if (st != DDPLUG_OK) return store_failed(p, st, "get", key);
  buf[len < sizeof buf ? len : sizeof buf - 1] = '\0';
  int fst = DDPLUG_E_INTERNAL, frank = -1, off = 0;
  if (sscanf(buf, "%d %d %n", &fst, &frank, &off) < 2) off = 0;
  if (nfail > 1)
    ddnccl_fmt(p->msg, p->cap, "rank %d: %s (and %lld more rank%s failed)",
               frank, buf + off, (long long)(nfail - 1),
               nfail == 2 ? "" : "s");
  else
    ddnccl_fmt(p->msg, p->cap, "rank %d: %s", frank, buf + off);
  return fst;
}

/* See internal.h. */
int ddnccl_agree(const ddplug_host_services *svc, const char *phase,
                 int32_t rank, int32_t world, int local_status,
                 const char *local_msg, uint64_t deadline_ns, char *msg,
                 size_t cap) {
  phase_ctx p = {svc, phase, rank, world, deadline_ns, msg, cap};
  const ddplug_host_services *s = svc;
  char key[300];
  int st;

  if (local_status != DDPLUG_OK) {
    char rec[DDNCCL_MSG_MAX + 64];
    int64_t k = 0;
    key_of(&p, key, sizeof key, "nfail");
    st = s->store_add(s->host, key, 1, &k);
    if (st != DDPLUG_OK) return store_failed(&p, st, "add", key);
    int n = snprintf(rec, sizeof rec, "%d %d %s", local_status, rank,
                     local_msg ? local_msg : "");
    ddnccl_fmt(key, sizeof key, "%s/fail/%lld", phase, (long long)k);
    st = s->store_set(s->host, key, rec,
                      (uint64_t)(n < (int)sizeof rec ? n : (int)sizeof rec - 1));
    if (st != DDPLUG_OK) return store_failed(&p, st, "set", key);
  }
  ddnccl_fmt(key, sizeof key, "%s/in/%d", phase, rank);
  st = s->store_set(s->host, key, "1", 1);
  if (st != DDPLUG_OK) return store_failed(&p, st, "set", key);

  st = count_and_wait(&p, "arrived");
  if (st != DDPLUG_OK) {
    if (local_status != DDPLUG_OK) {
      ddnccl_fmt(msg, cap, "rank %d: %s", rank, local_msg ? local_msg : "");
      return local_status;
    }
    if (st == DDPLUG_E_TIMEOUT) name_missing(&p);
    else store_failed(&p, st, "wait", "arrived-all");
    return st;
  }

  int64_t nfail = 0;
  key_of(&p, key, sizeof key, "nfail");
  st = s->store_add(s->host, key, 0, &nfail);
  if (st != DDPLUG_OK) return store_failed(&p, st, "add", key);
  if (nfail == 0) return DDPLUG_OK;

  int result;
  if (local_status != DDPLUG_OK) {
    ddnccl_fmt(msg, cap, "rank %d: %s", rank, local_msg ? local_msg : "");
    result = local_status;
  } else {
    result = first_failure(&p, nfail);
  }
  /* Leave together (best effort, at most 10 s more: a store error here
   * changes nothing). */
  char keep[DDNCCL_MSG_MAX];
  ddnccl_fmt(keep, sizeof keep, "%s", msg);
  uint64_t soon = ddnccl_now_ns() + 10000000000ull;
  if (soon < p.deadline_ns) p.deadline_ns = soon;
  (void)count_and_wait(&p, "left");
  ddnccl_fmt(msg, cap, "%s", keep);
  return result;
}
