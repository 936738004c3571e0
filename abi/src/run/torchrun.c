/* torchrun.c — living beside torchrun's agent store. Under torchrun
 * (torch >= 2.4) the agent itself serves a TCPStore on MASTER_ADDR:
 * MASTER_PORT and tells the workers so with TORCHELASTIC_USE_AGENT_STORE=True:
 * rank 0 cannot listen on that port. Then (unless the config names a port)
 * rank 0 serves ddplug's store on a free port and publishes it in the
 * agent's store (store/torch_client.c speaks its protocol), where the other
 * ranks read it.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/context.h"
#include "store/store.h"

/* See context.h. */
int ddplug__torchrun_agent_store(const ddplug_context *ctx, int external) {
  /* A world of one too: torchrun's agent still holds MASTER_PORT (an elastic
   * job restarted on the one node left). */
  const char *v = getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (external || !v ||
      (strcmp(v, "True") != 0 && strcmp(v, "true") != 0 && strcmp(v, "1") != 0))
    return 0;
  int64_t cfg_port = 0;
  if (ddplug_config_get_int(ctx->cfg, "rendezvous.port", &cfg_port) == DDPLUG_OK)
    return 0;
  const char *mp = getenv("MASTER_PORT");
  int64_t port = 0;
  return mp && ddplug__parse_i64(mp, &port) == 0 && port == ctx->world.master_port;
}

/* Every ddplug_open of a process under torchrun gets its own key, in the
 * same order on every rank (each rank opens the same runs in turn). */
static atomic_uint g_agent_opens;

void ddplug__torchrun_port_key(char *buf, size_t cap) {
  const char *run = getenv("TORCHELASTIC_RUN_ID");
  const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
  snprintf(buf, cap, "ddplug/store_port/%.64s/%.16s/%u", run && *run ? run : "-",
           restart && *restart ? restart : "0", atomic_fetch_add(&g_agent_opens, 1));
}

/* See context.h. */
int ddplug__torchrun_exchange_port(ddplug_context *ctx, const char *key, int *port) {
  ddplug__tstore *ts = NULL;
  uint64_t deadline = ctx->open_deadline_ns;
  int s = ddplug__tstore_connect(ctx->world.master_addr, ctx->world.master_port,
                                 deadline, &ts);
  if (s == DDPLUG_OK && ctx->world.rank == 0) {
    char val[16];
    int n = snprintf(val, sizeof val, "%d", *port);
    s = ddplug__tstore_set(ts, key, val, (size_t)n, deadline);
  } else if (s == DDPLUG_OK) {
    char val[32];
    int64_t p = 0;
    s = ddplug__tstore_wait_get(ts, key, val, sizeof val, deadline);
    if (s == DDPLUG_E_TIMEOUT)
      s = ddplug__err(DDPLUG_E_TIMEOUT,
                      "rank 0 did not publish ddplug's store port in "
                      "torchrun's store at %s:%d within %.1f s (is rank 0 "
                      "running? did it fail to open?)",
                      ctx->world.master_addr, ctx->world.master_port,
                      (double)ctx->rdzv_timeout_ms / 1000.0);
    else if (s == DDPLUG_OK && (ddplug__parse_i64(val, &p) != 0 || p <= 0 || p > 65535))
      s = ddplug__err(DDPLUG_E_PEER_LOST,
                      "torchrun's store holds '%.20s' under %s, not a port",
                      val, key);
    *port = (int)p;
  }
  ddplug__tstore_close(ts);
  if (s != DDPLUG_OK)
    return ddplug__err_prefix(s, "rank %d, under torchrun (TORCHELASTIC_USE_"
                              "AGENT_STORE=True)", ctx->world.rank);
  return DDPLUG_OK;
}

