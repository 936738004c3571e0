/* p2p.c — point-to-point (plugin ABI 1.4, p2p_start; the host API's
 * ddplug_isend / _irecv / _send / _recv): messages of one tag arrive in the
 * order they were sent, small and large; tags are matched, not taken in
 * order; a receive from any source names its sender (with
 * DDPLUG_CAP_P2P_ANY_SOURCE); zero elements; a count mismatch fails the
 * receive and the run goes on (with DDPLUG_CAP_MISMATCH_CHECK); sending to
 * oneself is refused; a receive nobody sends to times out and stays
 * pending; a peer killed while another waits to receive from it gives
 * PEER_LOST naming it, promptly. A plugin without the slot must be refused
 * by the runtime with UNSUPPORTED naming the operation. Payloads are bytes
 * (a pattern per message), so any dtype the plugin takes serves. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define SMALL 16
#define LARGE (1u << 20) /* elements: past any eager protocol */
#define P2P_SLOTS (CF_BIT(p2p_start) | CF_BIT(request_wait) | CF_BIT(request_free))
#define WAIT_MS 30000

static void pattern(unsigned char *b, uint64_t bytes, unsigned seed) {
  for (uint64_t i = 0; i < bytes; i++) b[i] = (unsigned char)(seed * 131u + i * 31u + (i >> 11));
}

/* 0 when b holds seed's pattern; else writes why. */
static int unpattern(const unsigned char *b, uint64_t bytes, unsigned seed, char *why, size_t cap) {
  for (uint64_t i = 0; i < bytes; i++)
    if (b[i] != (unsigned char)(seed * 131u + i * 31u + (i >> 11))) {
      snprintf(why, cap, "byte %llu of the message with pattern %u is wrong",
               (unsigned long long)i, seed);
      return -1;
    }
  return 0;
}

typedef struct p2p_env {
  cf_rank *r;
  ddplug_context *ctx;
  int dt;
  size_t es;
  int dead; /* the run ended: skip what follows */
} p2p_env;

static void skip_all(cf_rank *r, const char *why) {
  static const char *const rows[][2] = {
      {"p2p.order", "point-to-point: messages of one tag arrive in the order sent (small and large)"},
      {"p2p.tags", "point-to-point: a receive takes the message of its tag, not the next one"},
      {"p2p.any_source", "point-to-point: a receive from any source names its sender"},
      {"p2p.zero", "point-to-point: zero elements"},
      {"p2p.mismatch", "point-to-point: a count mismatch fails the receive, the run goes on"},
      {"p2p.self", "point-to-point: sending to oneself is refused"},
      {"p2p.timeout", "point-to-point: a receive nobody sends to times out and stays pending"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    cf_report(r, rows[i][0], 0, CF_SKIP, rows[i][1], "%s", why);
}

/* Rank 0 sends `n` messages of tag 0, alternating small and large, to rank 1,
 * which receives them in order. */
static void order(p2p_env *e) {
  const char *T = "point-to-point: messages of one tag arrive in the order sent (small and large)";
  cf_rank *r = e->r;
  enum { N = 6 };
  char why[1024] = "";
  int s = DDPLUG_OK, bad = 0;
  if (r->rank == 0) {
    unsigned char *buf[N];
    ddplug_request *req[N] = {0};
    int k;
    for (k = 0; k < N; k++) {
      uint64_t count = k % 2 ? LARGE : SMALL;
      buf[k] = malloc(count * e->es);
      pattern(buf[k], count * e->es, (unsigned)k + 1);
      s = ddplug_isend(e->ctx, buf[k], count, e->dt, 1, 0, NULL, &req[k]);
      if (s) {
        snprintf(why, sizeof why, "isend #%d: %s: %s", k, ddplug_status_name(s), cf_error(e->ctx));
        free(buf[k]);
        break;
      }
    }
    int started = k;
    for (k = 0; k < started; k++) {
      int w = ddplug_request_wait(req[k], WAIT_MS);
      if (w && !s) {
        s = w;
        snprintf(why, sizeof why, "send #%d: %s: %s", k, ddplug_status_name(w), cf_error(e->ctx));
      }
      ddplug_request_free(req[k]);
      free(buf[k]);
    }
  } else if (r->rank == 1) {
    for (int k = 0; k < N && !s && !bad; k++) {
      uint64_t count = k % 2 ? LARGE : SMALL;
      unsigned char *b = malloc(count * e->es);
      s = ddplug_recv(e->ctx, b, count, e->dt, 0, 0, NULL, WAIT_MS, NULL);
      if (s)
        snprintf(why, sizeof why, "receive #%d: %s: %s", k, ddplug_status_name(s), cf_error(e->ctx));
      else if (unpattern(b, count * e->es, (unsigned)k + 1, why, sizeof why))
        bad = 1;
      free(b);
    }
  }
  if (s) e->dead = 1;
  cf_report(r, "p2p.order", P2P_SLOTS, s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

/* Rank 0 sends tag 3 then tag 4 (small, then large); rank 1 asks for tag 4 first. */
static void tags(p2p_env *e) {
  const char *T = "point-to-point: a receive takes the message of its tag, not the next one";
  cf_rank *r = e->r;
  char why[1024] = "";
  int s = DDPLUG_OK, bad = 0, refused = 0;
  for (int large = 0; large < 2 && !s && !bad && !refused; large++) {
    uint64_t count = large ? LARGE : SMALL;
    size_t bytes = count * e->es;
    if (r->rank == 0) {
      unsigned char *a = malloc(bytes), *b = malloc(bytes);
      pattern(a, bytes, 30 + (unsigned)large);
      pattern(b, bytes, 40 + (unsigned)large);
      ddplug_request *ra = NULL, *rb = NULL;
      s = ddplug_isend(e->ctx, a, count, e->dt, 1, 3, NULL, &ra);
      if (s == DDPLUG_E_UNSUPPORTED) {
        refused = 1;
        snprintf(why, sizeof why, "the plugin refuses tags other than 0: %s", cf_error(e->ctx));
        s = DDPLUG_OK;
      } else if (!s) {
        s = ddplug_isend(e->ctx, b, count, e->dt, 1, 4, NULL, &rb);
        if (!s) s = ddplug_request_wait(rb, WAIT_MS);
        int w = ddplug_request_wait(ra, WAIT_MS);
        if (!s) s = w;
        if (s) snprintf(why, sizeof why, "sends: %s: %s", ddplug_status_name(s), cf_error(e->ctx));
      }
      if (ra) ddplug_request_free(ra);
      if (rb) ddplug_request_free(rb);
      free(a);
      free(b);
    } else if (r->rank == 1) {
      unsigned char *a = malloc(bytes), *b = malloc(bytes);
      s = ddplug_recv(e->ctx, b, count, e->dt, 0, 4, NULL, WAIT_MS, NULL);
      if (s == DDPLUG_E_UNSUPPORTED) {
        refused = 1;
        snprintf(why, sizeof why, "the plugin refuses tags other than 0: %s", cf_error(e->ctx));
        s = DDPLUG_OK;
      } else {
        if (!s) s = ddplug_recv(e->ctx, a, count, e->dt, 0, 3, NULL, WAIT_MS, NULL);
        if (s)
          snprintf(why, sizeof why, "receives: %s: %s", ddplug_status_name(s), cf_error(e->ctx));
        else if (unpattern(b, bytes, 40 + (unsigned)large, why, sizeof why) ||
                 unpattern(a, bytes, 30 + (unsigned)large, why, sizeof why))
          bad = 1;
      }
      free(a);
      free(b);
    }
  }
  if (s) e->dead = 1;
  cf_report(r, "p2p.tags", P2P_SLOTS, refused ? CF_SKIP : s || bad ? CF_FAIL : CF_PASS, T, "%s",
            why);
}

/* Every rank but 0 sends its rank to rank 0, which receives from any source. */
static void any_source(p2p_env *e) {
  const char *T = "point-to-point: a receive from any source names its sender";
  cf_rank *r = e->r;
  if (!(r->plan->info.caps & DDPLUG_CAP_P2P_ANY_SOURCE)) {
    cf_report(r, "p2p.any_source", 0, CF_SKIP, T,
              "the plugin does not declare DDPLUG_CAP_P2P_ANY_SOURCE");
    return;
  }
  char why[1024] = "";
  int s = DDPLUG_OK, bad = 0;
  if (r->rank == 0) {
    int seen[64] = {0};
    for (int k = 0; k < r->world - 1 && !s && !bad; k++) {
      unsigned char b[SMALL * 8];
      ddplug_request *q = NULL;
      int from = -1;
      s = ddplug_irecv(e->ctx, b, SMALL, e->dt, DDPLUG_ANY_SOURCE, 0, NULL, &q);
      if (!s) s = ddplug_request_wait(q, WAIT_MS);
      if (!s) s = ddplug_request_source(q, &from);
      if (q) ddplug_request_free(q);
      if (s) {
        snprintf(why, sizeof why, "receive #%d: %s: %s", k, ddplug_status_name(s), cf_error(e->ctx));
      } else if (from < 1 || from >= r->world || from >= 64 || seen[from]++) {
        snprintf(why, sizeof why, "ddplug_request_source says %d", from);
        bad = 1;
      } else if (unpattern(b, SMALL * e->es, 50 + (unsigned)from, why, sizeof why)) {
        bad = 1;
      }
    }
  } else {
    unsigned char b[SMALL * 8];
    pattern(b, SMALL * e->es, 50 + (unsigned)r->rank);
    s = ddplug_send(e->ctx, b, SMALL, e->dt, 0, 0, NULL, WAIT_MS);
    if (s) snprintf(why, sizeof why, "send: %s: %s", ddplug_status_name(s), cf_error(e->ctx));
  }
  if (s) e->dead = 1;
  cf_report(r, "p2p.any_source", P2P_SLOTS, s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

static void zero(p2p_env *e) {
  const char *T = "point-to-point: zero elements";
  cf_rank *r = e->r;
  char why[1024] = "";
  int s = DDPLUG_OK;
  if (r->rank == 0)
    s = ddplug_send(e->ctx, NULL, 0, e->dt, 1, 0, NULL, WAIT_MS);
  else if (r->rank == 1)
    s = ddplug_recv(e->ctx, NULL, 0, e->dt, 0, 0, NULL, WAIT_MS, NULL);
  if (s) {
    snprintf(why, sizeof why, "%s: %s", ddplug_status_name(s), cf_error(e->ctx));
    e->dead = 1;
  }
  cf_report(r, "p2p.zero", P2P_SLOTS, s ? CF_FAIL : CF_PASS, T, "%s", why);
}

/* Rank 1 receives fewer elements than rank 0 sends, small and large: its
 * receive fails with MISMATCH; a matching pair afterwards works. */
static void mismatch(p2p_env *e) {
  const char *T = "point-to-point: a count mismatch fails the receive, the run goes on";
  cf_rank *r = e->r;
  if (!(r->plan->info.caps & DDPLUG_CAP_MISMATCH_CHECK)) {
    cf_report(r, "p2p.mismatch", 0, CF_SKIP, T,
              "the plugin does not declare DDPLUG_CAP_MISMATCH_CHECK");
    return;
  }
  char why[1024] = "";
  int s = DDPLUG_OK, bad = 0;
  for (int large = 0; large < 2 && !s && !bad; large++) {
    uint64_t count = large ? LARGE : SMALL;
    unsigned char *b = calloc(count, e->es);
    if (r->rank == 0) {
      s = ddplug_send(e->ctx, b, count, e->dt, 1, 0, NULL, WAIT_MS);
      if (s == DDPLUG_E_MISMATCH) s = DDPLUG_OK; /* where the plugin can tell */
      else if (s)
        snprintf(why, sizeof why, "send: %s: %s", ddplug_status_name(s), cf_error(e->ctx));
    } else if (r->rank == 1) {
      int got = ddplug_recv(e->ctx, b, count - 1, e->dt, 0, 0, NULL, WAIT_MS, NULL);
      if (got != DDPLUG_E_MISMATCH) {
        snprintf(why, sizeof why, "a receive of %llu elements matching a send of %llu returned "
                 "%s, expected MISMATCH%s%s", (unsigned long long)count - 1,
                 (unsigned long long)count, ddplug_status_name(got), got ? ": " : "",
                 got ? cf_error(e->ctx) : "");
        bad = 1;
        if (got) s = got;
      } else if (!cf_mentions_rank(cf_error(e->ctx), 0)) {
        snprintf(why, sizeof why, "the MISMATCH does not name the sender, rank 0: %s",
                 cf_error(e->ctx));
        bad = 1;
      }
    }
    free(b);
  }
  if (!s && !bad) { /* the run goes on */
    unsigned char b[SMALL * 8] = {0};
    if (r->rank == 0) s = ddplug_send(e->ctx, b, SMALL, e->dt, 1, 0, NULL, WAIT_MS);
    else if (r->rank == 1) s = ddplug_recv(e->ctx, b, SMALL, e->dt, 0, 0, NULL, WAIT_MS, NULL);
    if (s)
      snprintf(why, sizeof why, "the exchange after the mismatch: %s: %s", ddplug_status_name(s),
               cf_error(e->ctx));
  }
  if (s) e->dead = 1;
  cf_report(r, "p2p.mismatch", P2P_SLOTS, s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

static void self(p2p_env *e) {
  const char *T = "point-to-point: sending to oneself is refused";
  unsigned char b[8 * 8] = {0};
  ddplug_request *q = NULL;
  int s = ddplug_isend(e->ctx, b, 1, e->dt, e->r->rank, 0, NULL, &q);
  if (s != DDPLUG_E_INVALID_ARGUMENT) {
    if (q) {
      ddplug_request_free(q);
      e->dead = 1;
    }
    cf_report(e->r, "p2p.self", P2P_SLOTS, CF_FAIL, T, "isend to itself returned %s, expected "
              "INVALID_ARGUMENT", ddplug_status_name(s));
  } else {
    cf_report(e->r, "p2p.self", 0, CF_PASS, T, "%s", cf_error(e->ctx));
  }
}

/* Rank 1's receive from rank 0, which never sends, times out and stays
 * pending. The last check: freeing that receive while pending ends the run
 * (ddplug_request_free), as it would for a collective. (Completing it with
 * a late send needs rank 1 to tell rank 0 when, and a device plugin runs
 * that message behind the pending receive on one stream.) */
static void timeout(p2p_env *e) {
  const char *T = "point-to-point: a receive nobody sends to times out and stays pending";
  cf_rank *r = e->r;
  char why[1024] = "";
  int s = DDPLUG_OK, bad = 0;
  unsigned char b[SMALL * 8] = {0};
  if (r->rank == 1) {
    ddplug_request *q = NULL;
    s = ddplug_irecv(e->ctx, b, SMALL, e->dt, 0, 0, NULL, &q);
    if (s) {
      snprintf(why, sizeof why, "irecv: %s: %s", ddplug_status_name(s), cf_error(e->ctx));
    } else {
      int w = ddplug_request_wait(q, 300), done = 1;
      int t = w == DDPLUG_E_TIMEOUT ? ddplug_request_test(q, &done) : DDPLUG_OK;
      if (w != DDPLUG_E_TIMEOUT || t != DDPLUG_OK || done) {
        snprintf(why, sizeof why, "request_wait(300 ms) returned %s%s, expected TIMEOUT with "
                 "the receive still pending", ddplug_status_name(w),
                 w == DDPLUG_E_TIMEOUT ? " but request_test says it is not pending" : "");
        bad = 1;
      }
      ddplug_request_free(q); /* pending: ends the run */
    }
  }
  e->dead = 1;
  cf_report(r, "p2p.timeout", P2P_SLOTS | CF_BIT(request_test),
            s || bad ? CF_FAIL : CF_PASS, T, "%s", why);
}

void cf_p2p_rank(cf_rank *r) {
  const ddplug_plugin_info *in = &r->plan->info;
  if (!cf_need_host_memory(r, "p2p.order", "point-to-point")) return;
  ddplug_context *ctx = NULL;
  int s = cf_open(r, NULL, 60, NULL, &ctx);
  if (s) {
    cf_report(r, "p2p.open", CF_BIT(group_create), CF_FAIL, "the scenario's group is created",
              "%s: %s", ddplug_status_name(s), ddplug_last_error());
    return;
  }
  if (!(in->caps & DDPLUG_CAP_P2P)) {
    /* the runtime refuses, naming the operation */
    const char *T = "a plugin without point-to-point: UNSUPPORTED naming the operation";
    unsigned char b[64] = {0};
    ddplug_request *q = NULL;
    int peer = r->world > 1 ? (r->rank + 1) % r->world : 0;
    s = ddplug_isend(ctx, b, 1, cf_first_dtype(in), peer, 0, NULL, &q);
    if (s == DDPLUG_E_UNSUPPORTED && strstr(cf_error(ctx), "no point-to-point (send)"))
      cf_report(r, "p2p.refused", 0, CF_PASS, T, "%s", cf_error(ctx));
    else
      cf_report(r, "p2p.refused", 0, CF_FAIL, T, "isend returned %s: %s", ddplug_status_name(s),
                cf_error(ctx));
    if (q) ddplug_request_free(q);
    skip_all(r, "the plugin does not declare DDPLUG_CAP_P2P");
    ddplug_close(ctx);
    return;
  }
  if (r->world < 2) {
    skip_all(r, "needs 2 ranks (-n)");
    ddplug_close(ctx);
    return;
  }
  p2p_env e = {r, ctx, cf_first_dtype(in), 0, 0};
  e.es = ddplug_dtype_size(e.dt);
  void (*steps[])(p2p_env *) = {order, tags, any_source, zero, mismatch, self, timeout};
  const char *ids[] = {"p2p.order", "p2p.tags", "p2p.any_source", "p2p.zero", "p2p.mismatch",
                       "p2p.self", "p2p.timeout"};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    if (e.dead) {
      cf_report(r, ids[i], 0, CF_SKIP, ids[i], "an earlier point-to-point check ended the run");
      continue;
    }
    steps[i](&e);
  }
  ddplug_close(ctx);
}

/* The last rank dies while rank 0 waits to receive from it. */
void cf_p2p_dead_rank(cf_rank *r) {
  const char *T = "point-to-point: a peer killed while a receive waits for it: PEER_LOST naming it";
  const ddplug_plugin_info *in = &r->plan->info;
  if (!cf_need_host_memory(r, "p2p.dead", T)) return;
  if (!(in->caps & DDPLUG_CAP_P2P) || r->world < 2) {
    cf_report(r, "p2p.dead", 0, CF_SKIP, T, "%s",
              r->world < 2 ? "needs 2 ranks (-n)" : "the plugin does not declare DDPLUG_CAP_P2P");
    if (r->rank == r->world - 1 && r->world > 1) raise(SIGKILL); /* the scenario expects it */
    return;
  }
  ddplug_context *ctx = NULL;
  int s = cf_open(r, NULL, r->plan->fault_timeout_s, NULL, &ctx);
  if (s) {
    cf_report(r, "p2p.dead", CF_BIT(group_create), CF_FAIL, T, "open: %s: %s",
              ddplug_status_name(s), ddplug_last_error());
    if (r->rank == r->world - 1) raise(SIGKILL);
    return;
  }
  int victim = r->world - 1;
  if (r->rank == victim) {
    cf_sleep_ms(300); /* rank 0 is waiting in its receive now */
    raise(SIGKILL);
  }
  if (r->rank == 0) {
    int dt = cf_first_dtype(in);
    unsigned char b[64];
    double t0 = cf_now();
    s = ddplug_recv(ctx, b, 1, dt, victim, 0, NULL, (int64_t)r->plan->fault_timeout_s * 1000, NULL);
    double took = cf_now() - t0;
    double prompt = (double)r->plan->fault_timeout_s / 3.0;
    if (s != DDPLUG_E_PEER_LOST)
      cf_report(r, "p2p.dead", P2P_SLOTS, CF_FAIL, T, "the receive returned %s, expected "
                "PEER_LOST: %s", ddplug_status_name(s), cf_error(ctx));
    else if (cf_launcher_took_the_store(r, cf_error(ctx), victim))
      cf_report(r, "p2p.dead", P2P_SLOTS, CF_SKIP, T, CF_LAUNCHER_TOOK_THE_STORE, victim,
                cf_error(ctx));
    else if (!cf_mentions_rank(cf_error(ctx), victim))
      cf_report(r, "p2p.dead", P2P_SLOTS, CF_FAIL, T, "PEER_LOST does not name rank %d: %s",
                victim, cf_error(ctx));
    else if (took > prompt)
      cf_report(r, "p2p.dead", P2P_SLOTS, CF_FAIL, T, "PEER_LOST came %.1f s after the call "
                "(the collective timeout is %d s)", took, r->plan->fault_timeout_s);
    else
      cf_report(r, "p2p.dead", P2P_SLOTS, CF_PASS, T, "PEER_LOST naming rank %d after %.2f s",
                victim, took);
  }
  ddplug_close(ctx);
}
