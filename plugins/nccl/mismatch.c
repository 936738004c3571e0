/*
 * mismatch.c — plugin_options.check_mismatch: compare every collective
 * across ranks through the store before NCCL sees it.
 *
 * NCCL itself cannot detect mismatched collectives: different counts or
 * dtypes produce garbage or overrun buffers, different kinds or a missing
 * call hang until the collective timeout. With the check on, for check
 * number N every rank R > 0 publishes its description as "mm/N/R"; rank 0
 * reads them all, compares with its own and publishes one verdict
 * "mm/N/verdict" that every rank reads. So a mismatch is reported on every
 * rank, naming the first rank that differs and both calls, and nothing is
 * enqueued: the group stays usable. N counts checks, not collectives: the
 * runtime gives the next call the refused call's seq again (it was never
 * started), and keys of that seq would find the refused call's verdict.
 * Cost: one store write and one read per
 * collective per rank (rank 0: world - 1 reads), i.e. milliseconds; meant
 * for debugging, off by default.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* "allreduce count=1024 dtype=float32 op=sum"; what must match. */
static void describe(const ddplug_coll_args *a, char *buf, size_t cap) {
  switch (a->kind) {
    case DDPLUG_COLL_ALLREDUCE:
      ddnccl_fmt(buf, cap, "allreduce(count=%llu, %s, %s)",
                 (unsigned long long)a->count,
                 ddnccl_dtype_name(a->dtype),
                 ddnccl_op_name(a->op));
      break;
    case DDPLUG_COLL_BROADCAST:
      ddnccl_fmt(buf, cap, "broadcast(count=%llu, %s, root=%d)",
                 (unsigned long long)a->count,
                 ddnccl_dtype_name(a->dtype), a->root);
      break;
    case DDPLUG_COLL_ALLGATHER:
      ddnccl_fmt(buf, cap, "allgather(count=%llu, %s)",
                 (unsigned long long)a->count,
                 ddnccl_dtype_name(a->dtype));
      break;
    default:
      ddnccl_fmt(buf, cap, "%s()", ddnccl_kind_name(a->kind));
      break;
  }
}

/* Rank 0: read every description, decide, publish "<status> <text>". */
static int judge(ddplug_plugin_group *g, uint64_t round, uint64_t seq,
                 const char *mine, uint64_t deadline, char *verdict, size_t cap) {
  const ddplug_host_services *s = g->svc;
  int st = DDPLUG_OK;
  int32_t differ = 0;
  char first[DDNCCL_MSG_MAX] = "";
  for (int32_t r = 1; r < g->world && st == DDPLUG_OK; r++) {
    char key[64], theirs[256];
    uint64_t len = 0;
    snprintf(key, sizeof key, "mm/%llu/%d", (unsigned long long)round, r);
    int gs = s->store_get(s->host, key, theirs, sizeof theirs - 1, &len,
                          ddnccl_left_ms(deadline));
    if (gs != DDPLUG_OK) {
      st = gs == DDPLUG_E_TIMEOUT ? DDPLUG_E_TIMEOUT : gs;
      ddnccl_fmt(first, sizeof first,
                 "collective seq %llu: rank %d did not reach it within "
                 "%.1f s (rank 0 called %s)",
                 (unsigned long long)seq, r, (double)g->timeout_ms / 1e3,
                 mine);
      break;
    }
    theirs[len] = '\0';
    (void)s->store_delete(s->host, key);
    if (strcmp(theirs, mine) != 0 && differ++ == 0)
      ddnccl_fmt(first, sizeof first,
                 "collective seq %llu differs across ranks: rank %d "
                 "called %s but rank 0 called %s",
                 (unsigned long long)seq, r, theirs, mine);
  }
  if (st == DDPLUG_OK && differ) {
    st = DDPLUG_E_MISMATCH;
    if (differ > 1) {
      size_t n = strlen(first);
      ddnccl_fmt(first + n, sizeof first - n, " (%d ranks differ)", differ);
    }
  }
  int n = snprintf(verdict, cap, "%d %s", st, st == DDPLUG_OK ? "ok" : first);
  if (n < 0) n = 0;
  if ((size_t)n >= cap) n = (int)cap - 1;
  char key[64];
  snprintf(key, sizeof key, "mm/%llu/verdict", (unsigned long long)round);
  int ps = s->store_set(s->host, key, verdict, (uint64_t)n);
  /* Every rank read verdict round-1 before publishing for round. */
  if (round > 1) {
    snprintf(key, sizeof key, "mm/%llu/verdict", (unsigned long long)(round - 1));
    (void)s->store_delete(s->host, key);
  }
  return ps;
}

/* See internal.h. */
int ddnccl_check_mismatch(ddplug_plugin_group *g,
                          const ddplug_coll_args *a) {
  const ddplug_host_services *s = g->svc;
  uint64_t deadline = ddnccl_now_ns() + (uint64_t)g->timeout_ms * 1000000ull;
  char mine[256], key[64], verdict[DDNCCL_MSG_MAX + 32];
  describe(a, mine, sizeof mine);
  uint64_t len = 0;
  int st;
  if (g->world == 1) return DDPLUG_OK;
  uint64_t round = ++g->mm_round;
  if (g->rank == 0) {
    st = judge(g, round, a->seq, mine, deadline, verdict, sizeof verdict);
    if (st != DDPLUG_OK)
      return ddnccl_fail(s, st,
                         "collective seq %llu: cannot publish the "
                         "mismatch verdict: %s",
                         (unsigned long long)a->seq,
                         ddnccl_status_name(st));
    len = strlen(verdict);
  } else {
    snprintf(key, sizeof key, "mm/%llu/%d", (unsigned long long)round, g->rank);
    st = s->store_set(s->host, key, mine, strlen(mine));
    if (st == DDPLUG_OK) {
      /* Rank 0 gives up on a missing rank after the timeout and says so in
       * its verdict: wait longer than that for the verdict. */
      snprintf(key, sizeof key, "mm/%llu/verdict", (unsigned long long)round);
      st = s->store_get(s->host, key, verdict, sizeof verdict - 1, &len,
                        ddnccl_left_ms(deadline) + g->timeout_ms);
    }
    if (st != DDPLUG_OK)
      return ddnccl_fail(s, st,
                         "collective seq %llu (%s on rank %d): no "
                         "mismatch verdict from rank 0 within %.1f s "
                         "(%s; has rank 0 reached this collective?)",
                         (unsigned long long)a->seq, mine, g->rank,
                         2.0 * (double)g->timeout_ms / 1e3,
                         ddnccl_status_name(st));
  }
  verdict[len < sizeof verdict ? len : sizeof verdict - 1] = '\0';
  int vst = DDPLUG_E_INTERNAL, off = 0;
  if (sscanf(verdict, "%d %n", &vst, &off) < 1) off = 0;
  if (vst == DDPLUG_OK) return DDPLUG_OK;
  return ddnccl_fail(s, vst, "%s", verdict + off);
}
