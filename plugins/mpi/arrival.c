/*
 * arrival.c — who has reached a collective that is late.
 *
 * MPI does not say which ranks have called a collective. So a rank whose
 * collective has been pending options.slow_ms (250 ms by default) writes
 * the newest collective it has started into the store, "at/<rank>" = its
 * seq; a rank whose wait or collective timeout runs out reads every
 * rank's record: those below the collective's seq (or without one) have
 * not reached it. Nothing is written on the fast path — a collective that
 * completes within slow_ms costs nothing here — and a record is written
 * once per slow collective per rank. A rank that passed the collective
 * (possible only where MPI lets a rank finish before the others arrive, a
 * broadcast's root) and computes without starting another counts as not
 * arrived; the sentence says "not heard from".
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* See internal.h. */
void ddmpi_arrival_publish(ddplug_plugin_group *g, uint64_t seq) {
  uint_fast64_t was = atomic_load(&g->arrived_published);
  if (was >= seq) return;
  char key[48], val[32];
  snprintf(key, sizeof key, "at/%d", g->rank);
  int n = snprintf(val, sizeof val, "%llu", (unsigned long long)seq);
  if (g->svc->store_set(g->svc->host, key, val, (uint64_t)n) != DDPLUG_OK) return;
  while (was < seq && !atomic_compare_exchange_weak(&g->arrived_published, &was, seq)) {
  }
}

/* See internal.h. */
void ddmpi_arrival_text(ddplug_plugin_group *g, uint64_t seq, char *buf, size_t cap) {
  ddmpi_arrival_publish(g, seq);
  unsigned char *missing = calloc((size_t)g->world, 1), *here = calloc((size_t)g->world, 1);
  if (!missing || !here) {
    ddmpi_fmt(buf, cap, "the ranks that have not reached it are unknown (out of memory)");
    free(missing);
    free(here);
    return;
  }
  for (int r = 0; r < g->world; r++) {
    if (r == g->rank) {
      here[r] = 1;
      continue;
    }
    char key[48], val[32];
    uint64_t len = 0;
    snprintf(key, sizeof key, "at/%d", r);
    unsigned long long at = 0;
    if (g->svc->store_get(g->svc->host, key, val, sizeof val - 1, &len, 0) == DDPLUG_OK) {
      val[len < sizeof val ? len : sizeof val - 1] = '\0';
      at = strtoull(val, NULL, 10);
    }
    if (at >= seq) here[r] = 1;
    else missing[r] = 1;
  }
  char miss[300], got[300];
  int nmiss = 0, ngot = 0;
  ddmpi_rank_list(missing, g->world, miss, sizeof miss, &nmiss);
  ddmpi_rank_list(here, g->world, got, sizeof got, &ngot);
  if (nmiss)
    ddmpi_fmt(buf, cap, "rank%s %s %s not reached it (not heard from; rank%s %s ha%s)",
              nmiss == 1 ? "" : "s", miss, nmiss == 1 ? "has" : "have", ngot == 1 ? "" : "s", got,
              ngot == 1 ? "s" : "ve");
  else
    ddmpi_fmt(buf, cap,
              "every rank has reached it, but MPI did not complete it (a stalled network or "
              "MPI transport)");
  free(missing);
  free(here);
}
