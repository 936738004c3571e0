/*
 * allreduce_perf.c — ddplug-allreduce-perf, an allreduce benchmark in the
 * manner of nccl-tests' all_reduce_perf, through the public API.
 *
 *   ddplug-allreduce-perf -b 8 -e 256M -f 2 -n 2 --plugin cpu
 *
 *   -b SIZE        smallest message in bytes (K, M, G suffixes)     [8]
 *   -e SIZE        largest message                                   [64M]
 *   -f FACTOR      multiply the size by FACTOR each step            [2]
 *   -n RANKS       launch RANKS processes on this machine (torchrun-style
 *                  environment); without -n, run as the rank the
 *                  environment describes (RANK, WORLD_SIZE, ...; or an
 *                  MPI launcher's: mpirun -n 2 ddplug-allreduce-perf
 *                  --plugin mpi)                                     [1]
 *   -N NODES       with -n: simulate NODES nodes on this machine (rank r
 *                  gets DDPLUG_HOST_ID=simnode<r mod NODES>)          [1]
 *   -d DTYPE       float32 float64 float16 bfloat16 int8 uint8 int32 int64
 *   -o OP          sum avg min max prod bor band                      [sum]
 *   -w N           warm-up iterations per size                       [5]
 *   -i N           timed iterations per size; 0 = automatic (at least 20,
 *                  and enough for about 0.1 s per size)              [0]
 *   -I             in place (send == recv)
 *   -R             registered buffers: send and recv from ddplug_mem_alloc
 *                  (the plugin's registered memory) instead of malloc
 *   -c 0|1         check results (one extra, verified run per size)  [1]
 *   --plugin NAME  plugin to load                                     [cpu]
 *                  nccl: runs ddplug-nccl-overhead (beside this program)
 *                  with -n -b -e -f -w -i --json, which times the plugin
 *                  against direct ncclAllReduce on the same device buffers,
 *                  stream and run (float32 sum in place)
 *   --options JSON plugin_options                                     [{}]
 *   --json FILE    also write the table as JSON
 *   --copy-bw      measure this machine's memory copy bandwidth (STREAM
 *                  "copy", bytes read + written, one thread per rank) and
 *                  print the memory-traffic bound of an allreduce: n ranks
 *                  must move at least 2·n·S bytes through memory for S bytes
 *                  (read every input, write every output)
 *
 * Columns: size (bytes), count (elements), type, redop, time (µs per
 * allreduce: the slowest rank's average), algbw = size / time, busbw =
 * algbw · 2(n-1)/n (the bandwidth each rank's links see in a ring), #wrong
 * (elements that differ from the exact expected result). The exit status
 * is non-zero if any result was wrong or a call failed.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ddplug/ddplug.h"

#define PERIOD 1009 /* values repeat with this prime period */

typedef struct opts {
  uint64_t min_bytes, max_bytes;
  double factor;
  int ranks, nodes, dtype, op, warmup, iters, inplace, check, copy_bw, registered;
  const char *plugin, *options, *json;
  /* What the command line set, as given: forwarded for --plugin nccl. */
  const char *given[8][2];
  int ngiven, other_given;
} opts;

static int lookup(const char *name, const char *(*fn)(int), int max) {
  for (int i = 1; i <= max; i++)
    if (fn(i) && strcmp(fn(i), name) == 0) return i;
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: ddplug-allreduce-perf [-b MIN] [-e MAX] [-f FACTOR] [-n RANKS] [-N NODES] [-d DTYPE]\n"
          "                             [-o OP] [-w WARMUP] [-i ITERS] [-I] [-R] [-c 0|1]\n"
          "                             [--plugin NAME] [--options JSON] [--json FILE] [--copy-bw]\n"
          "  -b/-e/-f  sizes in bytes (K, M, G): MIN to MAX, times FACTOR [8 .. 64M, x2]\n"
          "  -n/-N     RANKS local processes, simulating NODES nodes    [env / 1]\n"
          "  -d/-o     dtype (float32 ... int64) and op (sum ... band)  [float32 sum]\n"
          "  -w/-i     warm-up and timed iterations per size (-i 0: ~0.1 s per size)\n"
          "  -I        in place (send == recv)\n"
          "  -R        registered buffers (ddplug_mem_alloc) instead of malloc'd ones\n"
          "  -c 0|1    check results: one extra run per size whose result is verified\n"
          "            against the expected values (a wrong result fails the run)  [1];\n"
          "            it checks allreduce only: `ddplug conformance` checks a plugin\n"
          "  --plugin  plugin to load [cpu]; --options its plugin_options JSON\n"
          "  --json    also write the table as JSON; --copy-bw: measure memory copy bandwidth\n");
}

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){.min_bytes = 8, .max_bytes = 64ull << 20, .factor = 2.0, .ranks = 1, .nodes = 1,
              .dtype = DDPLUG_FLOAT32, .op = DDPLUG_OP_SUM, .warmup = 5, .check = 1,
              .plugin = "cpu", .options = "{}"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
    if (!strcmp(a, "-I")) { o->inplace = 1; used = 0; }
    else if (!strcmp(a, "-R")) { o->registered = 1; used = 0; }
    else if (!strcmp(a, "--copy-bw")) { o->copy_bw = 1; used = 0; }
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); exit(0); }
    else if (!v) { fprintf(stderr, "%s needs a value\n", a); return -1; }
    else if (!strcmp(a, "-b")) { if (bench_parse_size(v, &o->min_bytes)) goto bad; }
    else if (!strcmp(a, "-e")) { if (bench_parse_size(v, &o->max_bytes)) goto bad; }
    else if (!strcmp(a, "-f")) { o->factor = atof(v); if (o->factor <= 1.0) goto bad; }
    else if (!strcmp(a, "-n")) { o->ranks = atoi(v); if (o->ranks < 1 || o->ranks > 256) goto bad; }
    else if (!strcmp(a, "-N")) { o->nodes = atoi(v); if (o->nodes < 1 || o->nodes > 256) goto bad; }
    else if (!strcmp(a, "-d")) { if (!(o->dtype = lookup(v, ddplug_dtype_name, 8))) goto bad; }
    else if (!strcmp(a, "-o")) { if (!(o->op = lookup(v, ddplug_op_name, 7))) goto bad; }
    else if (!strcmp(a, "-w")) { o->warmup = atoi(v); if (o->warmup < 0) goto bad; }
    else if (!strcmp(a, "-i")) { o->iters = atoi(v); if (o->iters < 0) goto bad; }
    else if (!strcmp(a, "-c")) { o->check = atoi(v); }
    else if (!strcmp(a, "--plugin")) { o->plugin = v; }
    else if (!strcmp(a, "--options")) { o->options = v; }
    else if (!strcmp(a, "--json")) { o->json = v; }
    else { fprintf(stderr, "unknown option %s\n", a); usage(); return -1; }
    if (used && (!strcmp(a, "-b") || !strcmp(a, "-e") || !strcmp(a, "-f") || !strcmp(a, "-n") ||
                 !strcmp(a, "-w") || !strcmp(a, "-i") || !strcmp(a, "--json"))) {
      if (o->ngiven < 8) { o->given[o->ngiven][0] = a; o->given[o->ngiven++][1] = v; }
    } else if (strcmp(a, "--plugin") != 0 && strcmp(a, "-c") != 0) {
      o->other_given = 1;
    }
    i += used;
    continue;
  bad:
    fprintf(stderr, "bad value '%s' for %s\n", v, a);
    return -1;
  }
  if (o->min_bytes > o->max_bytes) o->max_bytes = o->min_bytes;
  return 0;
}

/* ---- data with an exact expected result ------------------------------------ */

static int is_float(int dt) {
  return dt == DDPLUG_FLOAT32 || dt == DDPLUG_FLOAT64 || dt == DDPLUG_FLOAT16 ||
         dt == DDPLUG_BFLOAT16;
}

/* Small values whose reductions are exact in every dtype. */
static int64_t value(int op, int rank, uint64_t j) {
  switch (op) {
    case DDPLUG_OP_PROD: return ((uint64_t)rank + j) % 3 == 0 ? 2 : 1;
    case DDPLUG_OP_MIN:
    case DDPLUG_OP_MAX: return (int64_t)(((uint64_t)rank * 7 + j) % 11);
    case DDPLUG_OP_BOR:
    case DDPLUG_OP_BAND: return (int64_t)(((uint64_t)rank * 3 + j) & 0x3f);
    default: return (int64_t)(((uint64_t)rank + j) % 5);
  }
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void store(void *buf, int dt, uint64_t i, double x) {
  switch (dt) {
    case DDPLUG_FLOAT32: ((float *)buf)[i] = (float)x; break;
    case DDPLUG_FLOAT64: ((double *)buf)[i] = x; break;
    case DDPLUG_FLOAT16: { _Float16 h = (_Float16)(float)x; memcpy((uint16_t *)buf + i, &h, 2); break; }
    case DDPLUG_BFLOAT16: ((uint16_t *)buf)[i] = to_bf16((float)x); break;
    case DDPLUG_INT8: ((int8_t *)buf)[i] = (int8_t)x; break;
    case DDPLUG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)x; break;
    case DDPLUG_INT32: ((int32_t *)buf)[i] = (int32_t)x; break;
    default: ((int64_t *)buf)[i] = (int64_t)x; break;
  }
}

static void fill(void *buf, int dt, int op, int rank, uint64_t count) {
  uint32_t es = ddplug_dtype_size(dt);
  uint64_t first = count < PERIOD ? count : PERIOD;
  for (uint64_t i = 0; i < first; i++) store(buf, dt, i, (double)value(op, rank, i));
  for (uint64_t i = first; i < count; i += first) {
    uint64_t n = count - i < first ? count - i : first;
    memcpy((char *)buf + i * es, buf, n * es);
  }
}

/* Expected result, one period long. */
static void expected(void *table, int dt, int op, int world) {
  for (uint64_t j = 0; j < PERIOD; j++) {
    int64_t acc = value(op, 0, j);
    for (int r = 1; r < world; r++) {
      int64_t v = value(op, r, j);
      switch (op) {
        case DDPLUG_OP_PROD: acc *= v; break;
        case DDPLUG_OP_MIN: acc = v < acc ? v : acc; break;
        case DDPLUG_OP_MAX: acc = v > acc ? v : acc; break;
        case DDPLUG_OP_BOR: acc |= v; break;
        case DDPLUG_OP_BAND: acc &= v; break;
        default: acc += v; break;
      }
    }
    double x = (double)acc;
    if (op == DDPLUG_OP_AVG)
      x = dt == DDPLUG_FLOAT64 ? x / world
          : is_float(dt)       ? (double)((float)acc / (float)world)
                               : (double)(acc / world);
    store(table, dt, j, x);
  }
}

static uint64_t count_wrong(const void *buf, const void *table, int dt, uint64_t count) {
  uint32_t es = ddplug_dtype_size(dt);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < count; i++)
    if (memcmp((const char *)buf + i * es, (const char *)table + (i % PERIOD) * es, es) != 0)
      wrong++;
  return wrong;
}

/* ---- copy bandwidth ------------------------------------------------------------ */

typedef struct copy_job {
  size_t bytes;
  int reps;
  pthread_barrier_t *bar;
  double seconds;
} copy_job;

static void *copy_thread(void *p) {
  copy_job *j = p;
  char *a = malloc(j->bytes), *b = malloc(j->bytes);
  memset(a, 1, j->bytes);
  memset(b, 2, j->bytes);
  memcpy(b, a, j->bytes); /* warm */
  pthread_barrier_wait(j->bar);
  double t0 = bench_now_s();
  for (int r = 0; r < j->reps; r++) {
    memcpy(b, a, j->bytes);
    /* the compiler must not drop copies into a buffer nobody reads */
    __asm__ volatile("" : : "r"(a), "r"(b) : "memory");
  }
  j->seconds = bench_now_s() - t0;
  pthread_barrier_wait(j->bar);
  free(a);
  free(b);
  return NULL;
}

/* STREAM-style copy with `threads` threads of 256 MiB arrays; returns GB/s
 * counting bytes read and written (best of 3). */
static double copy_bandwidth(int threads) {
  double best = 0;
  for (int trial = 0; trial < 3; trial++) {
    pthread_t t[256];
    copy_job j[256];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
      j[i] = (copy_job){256u << 20, 6, &bar, 0};
      pthread_create(&t[i], NULL, copy_thread, &j[i]);
    }
    double slowest = 0;
    for (int i = 0; i < threads; i++) {
      pthread_join(t[i], NULL);
      if (j[i].seconds > slowest) slowest = j[i].seconds;
    }
    pthread_barrier_destroy(&bar);
    double gbs = 2.0 * (double)(256u << 20) * 6 * threads / slowest / 1e9;
    if (gbs > best) best = gbs;
  }
  return best;
}

/* ---- one rank --------------------------------------------------------------------- */

#define CHECKED(call)                                                          \
  do {                                                                         \
    int s_ = (call);                                                           \
    if (s_ != DDPLUG_OK) {                                                     \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call,             \
              ddplug_status_name(s_), ddplug_last_error());                    \
      return 2;                                                                \
    }                                                                          \
  } while (0)

static int run_rank(const opts *o) {
  int rank = -1;
  char json[4096];
  snprintf(json, sizeof json, "{\"plugin\": \"%s\", \"plugin_options\": %s}", o->plugin,
           o->options);
  ddplug_config *cfg = NULL;
  CHECKED(ddplug_config_load_string(json, "ddplug-allreduce-perf", &cfg));
  ddplug_context *ctx = NULL;
  ddplug_open_options oo = DDPLUG_OPEN_OPTIONS_INIT;
  oo.framework = "ddplug-allreduce-perf";
  CHECKED(ddplug_open(cfg, &oo, &ctx));
  ddplug_config_free(cfg);
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECKED(ddplug_context_world(ctx, &w));
  rank = w.rank;
  int W = w.world_size, dt = o->dtype, op = o->op;
  uint32_t es = ddplug_dtype_size(dt);
  uint64_t max_count = o->max_bytes / es;
  char *send = NULL, *recv = NULL;
  if (o->registered) {
    void *sp = NULL, *rp = NULL;
    CHECKED(ddplug_mem_alloc(ctx, max_count * es + es, &sp));
    CHECKED(ddplug_mem_alloc(ctx, max_count * es + es, &rp));
    send = sp;
    recv = rp;
  } else {
    send = malloc(max_count * es + es);
    recv = malloc(max_count * es + es);
  }
  char *table = malloc((size_t)PERIOD * es);
  if (!send || !recv || !table) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    return 2;
  }
  memset(send, 0, max_count * es);
  memset(recv, 0, max_count * es);
  expected(table, dt, op, W);
  FILE *js = NULL;
  if (rank == 0) {
    printf("# ddplug-allreduce-perf: plugin %s, %d ranks (%d nodes), %s %s, %s, %s buffers, "
           "warmup %d, iters %s\n#\n", o->plugin, W, ddplug_context_num_nodes(ctx),
           ddplug_dtype_name(dt), ddplug_op_name(op), o->inplace ? "in place" : "out of place",
           o->registered ? "registered" : "malloc'd", o->warmup, o->iters ? "fixed" : "auto");
    printf("# %12s %12s %9s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop",
           "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    fflush(stdout);
    if (o->json && (js = fopen(o->json, "w")) != NULL)
      fprintf(js, "{\"tool\": \"ddplug-allreduce-perf\", \"plugin\": \"%s\", \"ranks\": %d, "
                  "\"dtype\": \"%s\", \"op\": \"%s\", \"inplace\": %d, \"registered\": %d, "
                  "\"rows\": [",
              o->plugin, W, ddplug_dtype_name(dt), ddplug_op_name(op), o->inplace, o->registered);
  }
  uint64_t total_wrong = 0;
  int first_row = 1;
  for (double bytes_d = (double)o->min_bytes; bytes_d <= (double)o->max_bytes * 1.000001;
       bytes_d *= o->factor) {
    uint64_t count = (uint64_t)bytes_d / es;
    if (count == 0) count = 1;
    uint64_t bytes = count * es;
    void *sp = o->inplace ? recv : send;
    if (o->inplace) memset(recv, 0, bytes); /* repeated in-place sums stay 0 */
    for (int i = 0; i < o->warmup; i++)
      CHECKED(ddplug_allreduce(ctx, sp, recv, count, dt, op, NULL));
    /* iterations: fixed, or rank 0's estimate for ~0.1 s, shared */
    int64_t iters = o->iters;
    if (iters == 0) {
      double t0 = bench_now_s();
      CHECKED(ddplug_allreduce(ctx, sp, recv, count, dt, op, NULL));
      double one = bench_now_s() - t0;
      iters = one > 0 ? (int64_t)(0.1 / one) : 1000;
      if (iters < 20) iters = 20;
      if (iters > 20000) iters = 20000;
      CHECKED(ddplug_broadcast(ctx, &iters, &iters, 1, DDPLUG_INT64, 0, NULL));
    }
    CHECKED(ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT));
    double t0 = bench_now_s();
    for (int64_t i = 0; i < iters; i++)
      CHECKED(ddplug_allreduce(ctx, sp, recv, count, dt, op, NULL));
    double per = (bench_now_s() - t0) / (double)iters;
    CHECKED(ddplug_allreduce(ctx, &per, &per, 1, DDPLUG_FLOAT64, DDPLUG_OP_MAX, NULL));
    uint64_t wrong = 0;
    if (o->check) {
      fill(o->inplace ? recv : send, dt, op, rank, count);
      if (!o->inplace) memset(recv, 0, bytes);
      CHECKED(ddplug_allreduce(ctx, o->inplace ? recv : send, recv, count, dt, op, NULL));
      wrong = count_wrong(recv, table, dt, count);
      CHECKED(ddplug_allreduce(ctx, &wrong, &wrong, 1, DDPLUG_INT64, DDPLUG_OP_SUM, NULL));
    }
    total_wrong += wrong;
    double algbw = (double)bytes / per / 1e9, busbw = algbw * 2.0 * (W - 1) / W;
    if (rank == 0) {
      printf("  %12llu %12llu %9s %6s %12.2f %12.2f %12.2f %8llu\n", (unsigned long long)bytes,
             (unsigned long long)count, ddplug_dtype_name(dt), ddplug_op_name(op), per * 1e6,
             algbw, busbw, (unsigned long long)wrong);
      fflush(stdout);
      if (js)
        fprintf(js, "%s\n  {\"size\": %llu, \"count\": %llu, \"time_us\": %.3f, \"algbw\": %.4f, "
                    "\"busbw\": %.4f, \"wrong\": %llu, \"iters\": %lld}",
                first_row ? "" : ",", (unsigned long long)bytes, (unsigned long long)count,
                per * 1e6, algbw, busbw, (unsigned long long)wrong, (long long)iters);
    }
    first_row = 0;
  }
  if (js) {
    fprintf(js, "\n]}\n");
    fclose(js);
  }
  if (rank == 0) printf("# total wrong elements: %llu\n", (unsigned long long)total_wrong);
  fflush(stdout);
  if (o->registered) {
    CHECKED(ddplug_mem_free(ctx, send));
    CHECKED(ddplug_mem_free(ctx, recv));
  } else {
    free(send);
    free(recv);
  }
  free(table);
  int s = ddplug_close(ctx);
  if (s != DDPLUG_OK) fprintf(stderr, "rank %d: ddplug_close: %s\n", rank, ddplug_last_error());
  return total_wrong ? 1 : s != DDPLUG_OK ? 2 : 0;
}

/* Launch o->ranks processes with a torchrun-style environment. */
static int launch(const opts *o) {
  int port = bench_free_port();
  pid_t pids[256];
  for (int r = 0; r < o->ranks; r++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      char v[32];
      snprintf(v, sizeof v, "%d", r);
      setenv("RANK", v, 1);
      setenv("LOCAL_RANK", v, 1);
      snprintf(v, sizeof v, "%d", o->ranks);
      setenv("WORLD_SIZE", v, 1);
      setenv("LOCAL_WORLD_SIZE", v, 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      snprintf(v, sizeof v, "%d", port);
      setenv("MASTER_PORT", v, 1);
      if (o->nodes > 1) {
        snprintf(v, sizeof v, "simnode%d", r % o->nodes);
        setenv("DDPLUG_HOST_ID", v, 1);
      }
      int rc = run_rank(o);
      fflush(stdout); /* _exit does not flush stdio */
      _exit(rc);
    }
    pids[r] = pid;
  }
  int worst = 0;
  for (int r = 0; r < o->ranks; r++) {
    int st = 0;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 3;
    if (code > worst) worst = code;
  }
  return worst;
}

/* --plugin nccl: device buffers and a direct-NCCL baseline need CUDA, which
 * this program does not link; ddplug-nccl-overhead (built with the nccl
 * plugin) does both, so run it with the options that apply. */
static int run_nccl_overhead(const opts *o) {
  if (o->other_given) {
    fprintf(stderr, "ddplug-allreduce-perf --plugin nccl runs ddplug-nccl-overhead, which "
                    "measures float32 sum in place on one node; of the options only -n -b -e "
                    "-f -w -i --json apply\n");
    return 2;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 64);
  if (n <= 0) {
    fprintf(stderr, "ddplug-allreduce-perf: cannot find its own path: %s\n", strerror(errno));
    return 2;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  strcpy(slash ? slash + 1 : self, "ddplug-nccl-overhead");
  const char *argv[2 + 2 * 8 + 1];
  int k = 0;
  argv[k++] = self;
  for (int i = 0; i < o->ngiven; i++) {
    argv[k++] = o->given[i][0];
    argv[k++] = o->given[i][1];
  }
  argv[k] = NULL;
  fflush(stdout);
  execv(self, (char *const *)argv);
  fprintf(stderr, "ddplug-allreduce-perf: --plugin nccl needs %s: %s (it is built with the nccl "
                  "plugin, when CMake finds CUDA and NCCL)\n", self, strerror(errno));
  return 2;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o) != 0) return 2;
  if (!strcmp(o.plugin, "nccl") && !o.copy_bw) return run_nccl_overhead(&o);
  signal(SIGPIPE, SIG_IGN);
  if (o.copy_bw) {
    int n = o.ranks;
    double bw1 = copy_bandwidth(1), bwn = n > 1 ? copy_bandwidth(n) : bw1;
    printf("# copy bandwidth (STREAM copy, read + write, 256 MiB arrays): %.2f GB/s with 1 "
           "thread, %.2f GB/s with %d threads\n", bw1, bwn, n);
    double bw = bwn > bw1 ? bwn : bw1;
    printf("# memory-traffic bound for an allreduce of S bytes over n=%d ranks: moves >= "
           "2*n*S bytes -> time >= 2*n*S / %.2f GB/s, busbw <= %.2f GB/s\n", n, bw,
           bw / (2.0 * n) * 2.0 * (n - 1) / n);
    if (o.json) {
      FILE *js = fopen(o.json, "w");
      if (js) {
        fprintf(js, "{\"copy_bw_1\": %.4f, \"copy_bw_n\": %.4f, \"threads\": %d}\n", bw1, bwn, n);
        fclose(js);
      }
    }
    return 0;
  }
  /* A rank of a launch that made the world: torchrun's variables, or an MPI
   * launcher's (mpirun/srun: the world and rendezvous come from the mpi
   * plugin's bootstrap). */
  int mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
  if (((getenv("RANK") && getenv("WORLD_SIZE")) || mpi) && o.ranks <= 1) return run_rank(&o);
  return launch(&o);
}
