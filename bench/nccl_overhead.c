/*
 * nccl_overhead.c — ddplug-nccl-overhead: what the nccl plugin adds on top of
 * NCCL. In every rank process it opens ddplug with plugin "nccl" and, beside
 * it, two communicators of its own (their ncclUniqueIds travel through the
 * same ddplug store):
 *
 *   nccl-nb  non-blocking (config.blocking = 0), the mode the plugin uses:
 *            every call may answer ncclInProgress (recent NCCL launches each
 *            non-blocking collective from a background thread) and the
 *            caller busy-polls ncclCommGetAsyncError until it settles —
 *            the least any caller of a non-blocking communicator must do;
 *   nccl-b   blocking (NCCL's default), the fastest way to call NCCL.
 *
 * The plugin's own cost is ddplug - nccl-nb; the cost of non-blocking mode
 * itself is nccl-nb - nccl-b; ddplug - nccl-b is what a user gives up
 * against plain blocking NCCL. All three are timed on the same device
 * buffers, the same stream and in the same run, per message size:
 *
 *   sync   one blocking call after the other:
 *            ddplug_allreduce(ctx, buf, buf, count, float32, sum, stream)
 *            vs  ncclAllReduce(...) [+ settle] + cudaStreamSynchronize(stream)
 *   async  iters calls issued back to back, then one wait for all:
 *            ddplug_iallreduce x iters, ddplug_request_wait x iters
 *            vs  ncclAllReduce [+ settle] x iters, cudaStreamSynchronize
 *
 * and prints (rank 0, nccl-tests style) the device name and NCCL version,
 * the time per call of each, ddplug's overhead against each in µs and %,
 * and the bus bandwidth. The contenders are measured in alternating blocks
 * and the best block of each is reported, so that clock changes and noise
 * hit all alike.
 *
 * usage: ddplug-nccl-overhead [-n RANKS] [-b MIN] [-e MAX] [-f FACTOR]
 *                             [-w WARMUP] [-i ITERS] [-r REPEATS] [--json FILE]
 *   RANKS defaults to the number of visible GPUs (at least 2 share GPU 0 when
 *   there is only one: NCCL_MULTI_RANK_GPU_ENABLE=1 and allow_shared_gpu);
 *   sizes in bytes accept K/M/G suffixes (default 8 .. 256M, factor 2).
 *   --json FILE also writes the table as JSON.
 * `ddplug-allreduce-perf --plugin nccl ...` runs this program.
 * It needs a GPU; without one it says so and exits 2.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "bench_util.h"
#include "ddplug/ddplug.h"
#include "ddplug/store.h"

typedef struct opts {
  int ranks;
  const char *json; /* also write the table as JSON to this file */
  size_t min_bytes, max_bytes;
  double factor;
  int warmup, iters, repeats;
} opts;

#define DIE(...)                     \
  do {                               \
    fprintf(stderr, "ddplug-nccl-overhead: " __VA_ARGS__); \
    fprintf(stderr, "\n");           \
    exit(1);                         \
  } while (0)

#define CUDA(expr)                                                          \
  do {                                                                      \
    cudaError_t e_ = (expr);                                                \
    if (e_ != cudaSuccess) DIE("%s: %s", #expr, cudaGetErrorString(e_));    \
  } while (0)
#define NCCL(expr)                                                          \
  do {                                                                      \
    ncclResult_t r_ = (expr);                                               \
    if (r_ != ncclSuccess) DIE("%s: %s", #expr, ncclGetErrorString(r_));    \
  } while (0)
#define DDP(expr)                                                           \
  do {                                                                      \
    int s_ = (expr);                                                        \
    if (s_ != DDPLUG_OK)                                                    \
      DIE("%s: %s: %s", #expr, ddplug_status_name(s_), ddplug_last_error()); \
  } while (0)

static double now_us(void) { return bench_now_s() * 1e6; }

static size_t parse_size(const char *s) {
  uint64_t v;
  if (bench_parse_size(s, &v) != 0) DIE("bad size '%s'", s);
  if (v < 4) DIE("size '%s' below 4 bytes", s);
  return (size_t)v;
}

/* Asked in a child: CUDA must stay uninitialised in the launcher. */
static int visible_gpus(char *name, size_t cap) {
  int pfd[2];
  if (pipe(pfd) != 0) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    int n = 0;
    struct cudaDeviceProp p;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    char buf[300];
    int len = snprintf(buf, sizeof buf, "%d %s", n,
                       n > 0 && cudaGetDeviceProperties(&p, 0) == cudaSuccess
                           ? p.name : "-");
    if (write(pfd[1], buf, (size_t)len) < 0) _exit(1);
    _exit(0);
  }
  close(pfd[1]);
  char buf[300] = "";
  ssize_t got = read(pfd[0], buf, sizeof buf - 1);
  close(pfd[0]);
  waitpid(pid, NULL, 0);
  if (got <= 0) return 0;
  buf[got] = '\0';
  int n = 0, off = 0;
  if (sscanf(buf, "%d %n", &n, &off) < 1) return 0;
  snprintf(name, cap, "%s", buf + off);
  return n;
}

/* Best (smallest) average µs per call over `repeats` blocks. */
typedef struct timing {
  double ddplug_sync, nb_sync, b_sync, ddplug_async, nb_async, b_async;
} timing;

static double min_d(double a, double b) { return a < b ? a : b; }

/* A call on a non-blocking communicator: wait until NCCL has enqueued it
 * (busy poll, no timeout: the least such a caller must do). */
static void nb_settle(ncclComm_t comm, ncclResult_t r, const char *what) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress) DIE("%s: %s", what, ncclGetErrorString(r));
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) NCCL(ncclCommGetAsyncError(comm, &st));
  if (st != ncclSuccess) DIE("%s: %s", what, ncclGetErrorString(st));
}

static void nb_allreduce(ncclComm_t nb, float *buf, size_t count, cudaStream_t s) {
  nb_settle(nb, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, nb, s),
            "ncclAllReduce (non-blocking communicator)");
}

static void time_size(ddplug_context *ctx, ncclComm_t b, ncclComm_t nb,
                      cudaStream_t s, float *buf, size_t count, const opts *o,
                      timing *t) {
  ddplug_request **reqs = calloc((size_t)o->iters, sizeof *reqs);
  if (!reqs) DIE("out of memory");
  /* Warm-up also makes each communicator connect whatever algorithm this
   * size uses (NCCL connects lazily, on first use). */
  for (int w = 0; w < o->warmup; w++) {
    DDP(ddplug_allreduce(ctx, buf, buf, count, DDPLUG_FLOAT32, DDPLUG_OP_SUM, s));
    NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, b, s));
    nb_allreduce(nb, buf, count, s);
    CUDA(cudaStreamSynchronize(s));
  }
  t->ddplug_sync = t->nb_sync = t->b_sync = 1e30;
  t->ddplug_async = t->nb_async = t->b_async = 1e30;
  for (int r = 0; r < o->repeats; r++) {
    /* sync */
    DDP(ddplug_barrier(ctx, 60000));
    double t0 = now_us();
    for (int i = 0; i < o->iters; i++)
      DDP(ddplug_allreduce(ctx, buf, buf, count, DDPLUG_FLOAT32, DDPLUG_OP_SUM, s));
    t->ddplug_sync = min_d(t->ddplug_sync, (now_us() - t0) / o->iters);

    DDP(ddplug_barrier(ctx, 60000));
    t0 = now_us();
    for (int i = 0; i < o->iters; i++) {
      nb_allreduce(nb, buf, count, s);
      CUDA(cudaStreamSynchronize(s));
    }
    t->nb_sync = min_d(t->nb_sync, (now_us() - t0) / o->iters);

    DDP(ddplug_barrier(ctx, 60000));
    t0 = now_us();
    for (int i = 0; i < o->iters; i++) {
      NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, b, s));
      CUDA(cudaStreamSynchronize(s));
    }
    t->b_sync = min_d(t->b_sync, (now_us() - t0) / o->iters);

    /* async */
    DDP(ddplug_barrier(ctx, 60000));
    t0 = now_us();
    for (int i = 0; i < o->iters; i++)
      DDP(ddplug_iallreduce(ctx, buf, buf, count, DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                            s, &reqs[i]));
    for (int i = 0; i < o->iters; i++) {
      DDP(ddplug_request_wait(reqs[i], 60000));
      ddplug_request_free(reqs[i]);
    }
    t->ddplug_async = min_d(t->ddplug_async, (now_us() - t0) / o->iters);

    DDP(ddplug_barrier(ctx, 60000));
    t0 = now_us();
    for (int i = 0; i < o->iters; i++) nb_allreduce(nb, buf, count, s);
    CUDA(cudaStreamSynchronize(s));
    t->nb_async = min_d(t->nb_async, (now_us() - t0) / o->iters);

    DDP(ddplug_barrier(ctx, 60000));
    t0 = now_us();
    for (int i = 0; i < o->iters; i++)
      NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, b, s));
    CUDA(cudaStreamSynchronize(s));
    t->b_async = min_d(t->b_async, (now_us() - t0) / o->iters);
  }
  free(reqs);
}

/* A unique id from rank 0 through the ddplug store, under `key`. */
static void share_id(ddplug_store *st, int rank, const char *key, ncclUniqueId *id) {
  if (rank == 0) {
    NCCL(ncclGetUniqueId(id));
    DDP(ddplug_store_set(st, key, id, sizeof *id));
    return;
  }
  void *v = NULL;
  uint64_t len = 0;
  DDP(ddplug_store_get(st, key, 60000, &v, &len));
  if (len != sizeof *id) DIE("bad ncclid of %llu bytes under %s", (unsigned long long)len, key);
  memcpy(id, v, sizeof *id);
  ddplug_free(v);
}

static void print_row(FILE *js, int first, size_t bytes, size_t count,
                      const timing *t, double bus) {
  if (js)
    fprintf(js, "%s{\"bytes\":%zu,\"count\":%zu,"
            "\"sync_ddplug_us\":%.3f,\"sync_nccl_nonblocking_us\":%.3f,"
            "\"sync_nccl_blocking_us\":%.3f,\"async_ddplug_us\":%.3f,"
            "\"async_nccl_nonblocking_us\":%.3f,\"async_nccl_blocking_us\":%.3f,"
            "\"busbw_gbs\":%.3f}",
            first ? "" : ",", bytes, count, t->ddplug_sync, t->nb_sync, t->b_sync,
            t->ddplug_async, t->nb_async, t->b_async, bus);
  printf("%12zu %10zu | %8.2f %8.2f %8.2f %6.2f %5.1f %6.2f %5.1f %8.2f |"
         " %8.2f %8.2f %8.2f %6.2f %5.1f %6.2f %5.1f\n",
         bytes, count, t->ddplug_sync, t->nb_sync, t->b_sync,
         t->ddplug_sync - t->nb_sync, 100.0 * (t->ddplug_sync - t->nb_sync) / t->nb_sync,
         t->ddplug_sync - t->b_sync, 100.0 * (t->ddplug_sync - t->b_sync) / t->b_sync, bus,
         t->ddplug_async, t->nb_async, t->b_async,
         t->ddplug_async - t->nb_async, 100.0 * (t->ddplug_async - t->nb_async) / t->nb_async,
         t->ddplug_async - t->b_async, 100.0 * (t->ddplug_async - t->b_async) / t->b_async);
  fflush(stdout);
}

static void rank_main(int rank, const opts *o, const char *gpu) {
  alarm(1800); /* a bench must not hang forever if a peer dies */
  ddplug_context *ctx = NULL;
  DDP(ddplug_open(NULL, NULL, &ctx));
  int dev = 0;
  CUDA(cudaGetDevice(&dev)); /* the plugin made its device current */
  struct cudaDeviceProp prop;
  CUDA(cudaGetDeviceProperties(&prop, dev));
  int nccl_version = 0;
  NCCL(ncclGetVersion(&nccl_version));

  /* The direct communicators: ids through the same store. */
  ddplug_store *st = ddplug_context_store(ctx);
  ncclUniqueId id_b, id_nb;
  share_id(st, rank, "user/bench/ncclid-blocking", &id_b);
  share_id(st, rank, "user/bench/ncclid-nonblocking", &id_nb);
  ncclComm_t b = NULL, nb = NULL;
  NCCL(ncclCommInitRank(&b, o->ranks, id_b, rank));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t init = ncclCommInitRankConfig(&nb, o->ranks, id_nb, rank, &cfg);
  if (!nb || (init != ncclSuccess && init != ncclInProgress))
    DIE("ncclCommInitRankConfig (non-blocking): %s", ncclGetErrorString(init));
  nb_settle(nb, ncclInProgress, "ncclCommInitRankConfig (non-blocking)");

  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *buf;
  CUDA(cudaMalloc((void **)&buf, o->max_bytes));
  CUDA(cudaMemset(buf, 0, o->max_bytes));

  FILE *js = NULL;
  if (rank == 0) {
    if (o->json && !(js = fopen(o->json, "w")))
      DIE("cannot write %s: %s", o->json, strerror(errno));
    if (js)
      fprintf(js, "{\"bench\":\"nccl-overhead\",\"ranks\":%d,\"device\":\"%s\","
              "\"devices_visible\":\"%s\",\"nccl_version\":%d,"
              "\"dtype\":\"float32\",\"op\":\"sum\",\"rows\":[",
              o->ranks, prop.name, gpu, nccl_version);
    printf("# ddplug-nccl-overhead: ddplug (plugin nccl) vs direct ncclAllReduce on a\n"
           "#   non-blocking communicator (nccl-nb, the plugin's mode; busy-polled) and on a\n"
           "#   blocking one (nccl-b, NCCL's default); float32 sum in place, %d ranks,\n"
           "#   device %s (cuda:%d on rank 0), NCCL %d.%d.%d, best of %d x %d iters.\n"
           "#   +us/+%% nb: the plugin's own cost; +us/+%% b: against plain blocking NCCL\n"
           "#      bytes      count |            sync (us per call)                       "
           "         busbw |           async (us per call)\n"
           "#                       |   ddplug  nccl-nb   nccl-b  +us nb  +%% nb   +us b   +%% b   (GB/s) |"
           "   ddplug  nccl-nb   nccl-b  +us nb  +%% nb   +us b   +%% b\n",
           o->ranks, prop.name, dev, nccl_version / 10000, nccl_version / 100 % 100,
           nccl_version % 100, o->repeats, o->iters);
  }
  int first = 1;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
    size_t count = bytes / sizeof(float);
    timing t;
    time_size(ctx, b, nb, s, buf, count, o, &t);
    double bus = (double)(count * sizeof(float)) * 2.0 * (o->ranks - 1) /
                 o->ranks / (t.ddplug_sync * 1e3);
    if (rank == 0) print_row(js, first, count * sizeof(float), count, &t, bus);
    first = 0;
    size_t next = (size_t)((double)bytes * o->factor);
    bytes = next > bytes ? next : bytes + 4;
  }
  if (js) {
    fprintf(js, "]}\n");
    fclose(js);
  }
  CUDA(cudaFree(buf));
  CUDA(cudaStreamDestroy(s));
  NCCL(ncclCommDestroy(b));
  /* A non-blocking communicator is finalized (polled) before destroy. */
  nb_settle(nb, ncclCommFinalize(nb), "ncclCommFinalize (non-blocking)");
  ncclResult_t gone = ncclCommDestroy(nb); /* may finish in NCCL's thread */
  if (gone != ncclSuccess && gone != ncclInProgress)
    DIE("ncclCommDestroy (non-blocking): %s", ncclGetErrorString(gone));
  DDP(ddplug_close(ctx));
}

int main(int argc, char **argv) {
  opts o = {0, NULL, 8, (size_t)256 << 20, 2.0, 5, 50, 5};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) DIE("%s needs a value (see the comment at the top of nccl_overhead.c)", a);
    if (strcmp(a, "-n") == 0) o.ranks = atoi(v);
    else if (strcmp(a, "-b") == 0) o.min_bytes = parse_size(v);
    else if (strcmp(a, "-e") == 0) o.max_bytes = parse_size(v);
    else if (strcmp(a, "-f") == 0) o.factor = atof(v);
    else if (strcmp(a, "-w") == 0) o.warmup = atoi(v);
    else if (strcmp(a, "-i") == 0) o.iters = atoi(v);
    else if (strcmp(a, "-r") == 0) o.repeats = atoi(v);
    else if (strcmp(a, "--json") == 0) o.json = v;
    else DIE("unknown option %s", a);
    i++;
  }
  char gpu[256] = "-";
  int gpus = visible_gpus(gpu, sizeof gpu);
  if (gpus <= 0) {
    fprintf(stderr, "ddplug-nccl-overhead: no CUDA device visible: nothing to measure\n");
    return 2;
  }
  if (o.ranks <= 0) o.ranks = gpus >= 2 ? gpus : 2;
  if (o.factor <= 1.0 || o.iters <= 0 || o.repeats <= 0 || o.min_bytes > o.max_bytes)
    DIE("bad options");
  int share = gpus < o.ranks;
  char map[512] = "";
  size_t w = 0;
  for (int r = 0; r < o.ranks && w < sizeof map; r++)
    w += (size_t)snprintf(map + w, sizeof map - w, "%s%d", r ? "," : "", share ? 0 : r);
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "{\"plugin\":\"nccl\",\"plugin_options\":{\"device_map\":[%s]%s}}", map,
           share ? ",\"allow_shared_gpu\":true" : "");
  char port[16], world[16];
  snprintf(port, sizeof port, "%d", bench_free_port());
  snprintf(world, sizeof world, "%d", o.ranks);
  pid_t *pids = calloc((size_t)o.ranks, sizeof *pids);
  for (int r = 0; r < o.ranks; r++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) DIE("fork: %s", strerror(errno));
    if (pid == 0) {
      char rank[16];
      snprintf(rank, sizeof rank, "%d", r);
      setenv("RANK", rank, 1);
      setenv("LOCAL_RANK", rank, 1);
      setenv("WORLD_SIZE", world, 1);
      setenv("LOCAL_WORLD_SIZE", world, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port, 1);
      setenv("DDPLUG_CONFIG", cfg, 1);
      if (share) setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
      rank_main(r, &o, gpu);
      fflush(stdout);
      _exit(0);
    }
    pids[r] = pid;
  }
  int failed = 0;
  for (int r = 0; r < o.ranks; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "ddplug-nccl-overhead: rank %d failed\n", r);
      failed = 1;
    }
  }
  free(pids);
  return failed;
}
