/*
 * store_perf.c — ddplug-store-perf: latency and throughput of the
 * rendezvous store over loopback, through the public API only.
 *
 *   ddplug-store-perf [--iters N] [--json]
 *
 * Rows: round trips of set/get/add/compare_set with a 16-byte value, from a
 * client in the server's process (like rank 0) and from a client in another
 * process (like every other rank); get of a 1 MiB value; aggregate add
 * throughput of 8 client threads; and a 64-process rendezvous (connect, set
 * own key, wait for all 64, close). Prints a table, or one JSON object per
 * row with --json. Timing noise on a shared machine is expected: re-run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include "bench_util.h"
#include "ddplug/ddplug.h"
#include "ddplug/store.h"

static int g_json;

static double now_us(void) { return bench_now_s() * 1e6; }

static void die(const char *what, int rc) {
  fprintf(stderr, "ddplug-store-perf: %s failed: %s: %s\n", what,
          ddplug_status_name(rc), ddplug_last_error());
  exit(1);
}
#define TRY(what, expr)          \
  do {                           \
    int rc_ = (expr);            \
    if (rc_) die(what, rc_);     \
  } while (0)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One result row: per-op latencies (µs) -> mean, p50, p99, ops/s. */
static void report(const char *name, const char *where, double *lat, int n) {
  qsort(lat, (size_t)n, sizeof *lat, cmp_double);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += lat[i];
  double mean = sum / n, p50 = lat[n / 2], p99 = lat[(int)(n * 0.99)];
  if (g_json)
    printf("{\"bench\":\"store\",\"op\":\"%s\",\"client\":\"%s\",\"n\":%d,"
           "\"mean_us\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"ops_per_s\":%.0f}\n",
           name, where, n, mean, p50, p99, 1e6 / mean);
  else
    printf("%-22s %-14s %8d %9.1f %9.1f %9.1f %11.0f\n", name, where, n, mean,
           p50, p99, 1e6 / mean);
  fflush(stdout);
}

enum { OP_SET, OP_GET, OP_ADD, OP_CAS, OP_GET_1MIB };
static const char *const k_op_names[] = {"set (16 B)", "get (16 B)", "add",
                                         "compare_set (16 B)", "get (1 MiB)"};

static void run_op(ddplug_store *st, int op, int iters, const char *where) {
  double *lat = malloc(sizeof(double) * (size_t)iters);
  const char *v16 = "0123456789abcdef";
  void *out = NULL;
  uint64_t len;
  int swapped;
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    switch (op) {
      case OP_SET: TRY("set", ddplug_store_set(st, "bench/k", v16, 16)); break;
      case OP_GET:
        TRY("get", ddplug_store_get(st, "bench/k", 0, &out, &len));
        ddplug_free(out);
        break;
      case OP_ADD: TRY("add", ddplug_store_add(st, "bench/n", 1, NULL)); break;
      case OP_CAS:
        TRY("compare_set", ddplug_store_compare_set(st, "bench/k", v16, 16, v16, 16,
                                                    &swapped, NULL, NULL));
        break;
      default:
        TRY("get", ddplug_store_get(st, "bench/big", 0, &out, &len));
        ddplug_free(out);
        break;
    }
    lat[i] = now_us() - t0;
  }
  report(k_op_names[op], where, lat, iters);
  free(lat);
}

static void run_all_ops(ddplug_store *st, int iters, const char *where) {
  TRY("set", ddplug_store_set(st, "bench/k", "0123456789abcdef", 16));
  for (int i = 0; i < 50; i++) TRY("warm-up", ddplug_store_add(st, "bench/warm", 1, NULL));
  for (int op = OP_SET; op <= OP_CAS; op++) run_op(st, op, iters, where);
  run_op(st, OP_GET_1MIB, iters / 20 > 10 ? iters / 20 : 10, where);
}

typedef struct adder {
  int port, iters;
} adder;

static void *adder_main(void *p) {
  adder *a = p;
  ddplug_store *st = NULL;
  TRY("connect", ddplug_store_connect("127.0.0.1", a->port, NULL, 10000, &st));
  for (int i = 0; i < a->iters; i++)
    TRY("add", ddplug_store_add(st, "bench/agg", 1, NULL));
  ddplug_store_close(st);
  return NULL;
}

static void rendezvous_rank(int port, int rank, int world) {
  ddplug_store *st = NULL;
  TRY("connect", ddplug_store_connect("127.0.0.1", port, NULL, 30000, &st));
  char key[32];
  snprintf(key, sizeof key, "bench/rank/%d", rank);
  TRY("set", ddplug_store_set(st, key, "", 0));
  char names[64][32];
  const char *keys[64];
  for (int r = 0; r < world; r++) {
    snprintf(names[r], sizeof names[r], "bench/rank/%d", r);
    keys[r] = names[r];
  }
  TRY("wait", ddplug_store_wait(st, keys, (uint32_t)world, 30000));
  ddplug_store_close(st);
}

int main(int argc, char **argv) {
  int iters = 20000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      g_json = 1;
    else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
      iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--iters N] [--json]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 100) iters = 100;
  ddplug_store_server *srv = NULL;
  TRY("serve", ddplug_store_serve("127.0.0.1", 0, "bench-secret", &srv));
  int port = ddplug_store_server_port(srv);
  if (!g_json)
    printf("%-22s %-14s %8s %9s %9s %9s %11s\n", "operation", "client", "n",
           "mean_us", "p50_us", "p99_us", "ops/s");

  ddplug_store *st = NULL;
  TRY("connect", ddplug_store_connect("127.0.0.1", port, "bench-secret", 10000, &st));
  char *big = calloc(1, 1024 * 1024);
  TRY("set", ddplug_store_set(st, "bench/big", big, 1024 * 1024));
  free(big);
  run_all_ops(st, iters, "same process");

  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    ddplug_store *c = NULL;
    TRY("connect", ddplug_store_connect("127.0.0.1", port, "bench-secret", 10000, &c));
    run_all_ops(c, iters, "other process");
    ddplug_store_close(c);
    fflush(stdout);
    _exit(0);
  }
  waitpid(pid, NULL, 0);

  /* Aggregate: 8 threads, each with its own connection. */
  ddplug_store_server_stop(srv);
  TRY("serve", ddplug_store_serve("127.0.0.1", 0, NULL, &srv));
  port = ddplug_store_server_port(srv);
  ddplug_store_close(st);
  pthread_t th[8];
  adder a = {port, iters / 4};
  double t0 = now_us();
  for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, adder_main, &a);
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  double per_op = (now_us() - t0) / (8.0 * a.iters);
  double agg[1] = {per_op};
  report("add, 8 clients (agg.)", "threads", agg, 1);

  /* 64 processes meet: connect, set own key, wait for all, close. */
  const int world = 64;
  double rounds[5];
  for (int r = 0; r < 5; r++) {
    t0 = now_us();
    pid_t pids[64];
    for (int i = 0; i < world; i++) {
      fflush(stdout);
      pids[i] = fork();
      if (pids[i] == 0) {
        rendezvous_rank(port, i, world);
        _exit(0);
      }
    }
    for (int i = 0; i < world; i++) waitpid(pids[i], NULL, 0);
    rounds[r] = now_us() - t0;
    ddplug_store *cl = NULL;
    TRY("connect", ddplug_store_connect("127.0.0.1", port, NULL, 10000, &cl));
    for (int i = 0; i < world; i++) {
      char key[32];
      snprintf(key, sizeof key, "bench/rank/%d", i);
      TRY("delete", ddplug_store_delete(cl, key, NULL));
    }
    ddplug_store_close(cl);
  }
  report("64-rank rendezvous", "processes", rounds, 5);
  ddplug_store_server_stop(srv);
  return 0;
}
