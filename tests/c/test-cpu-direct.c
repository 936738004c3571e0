/* test-cpu-direct.c — registered memory and the single-copy allreduce of the
 * cpu plugin: mem_alloc/mem_free/mem_query (reuse, exhaustion with a clear
 * sentence, double free, ordinary memory with registered_bytes 0, buffers
 * still live at group_destroy stay readable); allreduces of registered,
 * unregistered, mixed buffers and unregistered inputs into registered
 * outputs (the push, on 2 ranks) give the same bits, equal to a reference
 * reduced here in rank order with the plugin's own kernel, for every dtype
 * x op, 2, 3 and 4 ranks, in place and out of place, odd sizes and odd
 * offsets, with the kernel's single copy allowed (every size takes it) and
 * refused (unregistered buffers take the pipeline); a system that refuses
 * process_vm_readv (non-dumpable ranks without CAP_SYS_PTRACE) falls back
 * silently, says why once at debug level, and still reduces registered
 * buffers directly; a rank killed inside a registered allreduce is
 * PEER_LOST naming it on every survivor; a rank that gives up on a
 * collective waits until no peer writes into its output any more. */
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"
#include "cpu_driver.h"

#define MIB (1ull << 20)
#define GUARD 64

static const int dtypes[] = {DDPLUG_FLOAT32, DDPLUG_FLOAT64, DDPLUG_FLOAT16, DDPLUG_BFLOAT16,
                             DDPLUG_INT8,    DDPLUG_UINT8,   DDPLUG_INT32,   DDPLUG_INT64};
static const int ops[] = {DDPLUG_OP_SUM, DDPLUG_OP_AVG, DDPLUG_OP_MIN, DDPLUG_OP_MAX,
                          DDPLUG_OP_PROD, DDPLUG_OP_BOR, DDPLUG_OP_BAND};

/* ---- data whose reduction depends on the order ----------------------------- */

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* Rank's element i for a case (seed): arbitrary fractions for floats (sums
 * round differently in another order), near 1 for float products, any bits
 * for integers (wrapping). */
static void fill(void *buf, int dt, int op, int rank, uint64_t count, uint64_t seed) {
  for (uint64_t i = 0; i < count; i++) {
    uint64_t u = mix(seed * 1000003ull + (uint64_t)rank * 7919ull + i);
    double f = ((double)(u >> 11) / 9007199254740992.0 - 0.5) * 200.0;
    if (op == DDPLUG_OP_PROD) f = 1.0 + f / 4000.0;
    switch (dt) {
      case DDPLUG_FLOAT32: ((float *)buf)[i] = (float)f; break;
      case DDPLUG_FLOAT64: ((double *)buf)[i] = f; break;
      case DDPLUG_FLOAT16: ((uint16_t *)buf)[i] = ddcpu_float_to_half((float)f); break;
      case DDPLUG_BFLOAT16: ((uint16_t *)buf)[i] = ddcpu_float_to_bf16((float)f); break;
      case DDPLUG_INT8: ((uint8_t *)buf)[i] = (uint8_t)u; break;
      case DDPLUG_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(u >> 8); break;
      case DDPLUG_INT32: ((uint32_t *)buf)[i] = (uint32_t)u; break;
      default: ((uint64_t *)buf)[i] = u; break;
    }
  }
}

static int op_valid(int dt, int op) {
  int integer = dt == DDPLUG_INT8 || dt == DDPLUG_UINT8 || dt == DDPLUG_INT32 || dt == DDPLUG_INT64;
  return integer || (op != DDPLUG_OP_BOR && op != DDPLUG_OP_BAND);
}

/* ---- registered memory ------------------------------------------------------- */

static void *reg_alloc(hd_rank *r, uint64_t bytes) {
  void *p = NULL;
  int s = r->p->mem_alloc(r->g, bytes, &p);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: mem_alloc(%llu): %s: %s", r->rank,
            (unsigned long long)bytes, ddplug_status_name(s), r->error);
  return p;
}

static int reach_of(hd_rank *r, const void *p, uint64_t bytes) {
  int32_t reach = -1;
  CHECK_OK(r->p->mem_query(r->g, p, bytes, &reach));
  return reach;
}

static void mem_basics(hd_rank *r, void *arg) {
  (void)arg;
  CHECK(r->p->caps & DDPLUG_CAP_REGISTERED_MEMORY);
  unsigned char *a = reg_alloc(r, 100000), *b = reg_alloc(r, 5 * MIB);
  CHECK(((uintptr_t)a & 4095) == 0 && ((uintptr_t)b & 4095) == 0);
  memset(a, 1, 100000);
  memset(b, 2, 5 * MIB);
  CHECK_EQ_INT(reach_of(r, a, 100000), DDPLUG_REACH_REGISTERED);
  CHECK_EQ_INT(reach_of(r, a + 40000, 60000), DDPLUG_REACH_REGISTERED);
  /* past the allocation's pages: not registered */
  CHECK(reach_of(r, a + 40000, 200000) != DDPLUG_REACH_REGISTERED);
  unsigned char *plain = calloc(1, MIB);
  int pr = reach_of(r, plain, MIB);
  CHECK(pr == DDPLUG_REACH_SINGLE_COPY || pr == DDPLUG_REACH_STAGED);
  CHECK(reach_of(r, plain, 1000) == DDPLUG_REACH_STAGED); /* small: one-shot path */
  free(plain);
  /* exhausted (registered_bytes is 8 MiB here): NO_MEMORY saying why */
  void *p = (void *)0x1;
  CHECK_STATUS(r->p->mem_alloc(r->g, 4 * MIB, &p), DDPLUG_E_NO_MEMORY);
  CHECK(p == (void *)0x1);
  CHECK_CONTAINS(r->error, "no room for 4194304 bytes of registered memory");
  CHECK_CONTAINS(r->error, "plugin_options.registered_bytes");
  CHECK_STATUS(r->p->mem_alloc(r->g, 0, &p), DDPLUG_E_INVALID_ARGUMENT);
  /* freed space is reused; a freed buffer reads as zeros again */
  CHECK_OK(r->p->mem_free(r->g, b));
  CHECK(reach_of(r, b, 4096) != DDPLUG_REACH_REGISTERED);
  unsigned char *c = reg_alloc(r, 4 * MIB);
  CHECK(c == b);
  CHECK(c[0] == 0 && c[4 * MIB - 1] == 0);
  CHECK_STATUS(r->p->mem_free(r->g, b + 4096), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(r->error, "is not a live allocation");
  CHECK_OK(r->p->mem_free(r->g, c));
  CHECK_STATUS(r->p->mem_free(r->g, c), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_OK(r->p->mem_free(r->g, NULL));
  /* left allocated on purpose: it stays readable after group_destroy */
  (void)a;
}

TEST_T(registered_memory_basics, 60) {
  CHECK_EQ_INT(hd_run_world(2, NULL, "{\"registered_bytes\": 8388608}", mem_basics, NULL, 60,
                            NULL), 0);
}

/* A buffer still allocated at group_destroy keeps its contents readable. */
static void outlives(int rank, int world, void *arg) {
  hd_rank r;
  CHECK_OK(hd_open(&r, arg, rank));
  unsigned char *a = reg_alloc(&r, 3 * MIB + 5);
  memset(a, 0x5c, 3 * MIB + 5);
  CHECK_OK(hd_coll(&r, DDPLUG_COLL_BARRIER, NULL, NULL, 0, 0, 0, 0, 20000));
  hd_close(&r);
  CHECK_CONTAINS(r.log, "still allocated");
  for (uint64_t i = 0; i < 3 * MIB + 5; i += 4093) CHECK(a[i] == 0x5c);
  a[0] = 1; /* and writable (a private copy now) */
  (void)world;
}

TEST_T(buffer_left_at_destroy_stays_readable, 60) {
  hd_world w;
  hd_world_init(&w, 2, NULL, NULL);
  CHECK_EQ_INT(dt_run_ranks(2, outlives, &w, NULL, 60, NULL), 0);
  CHECK_EQ_INT(hd_world_shm_left(&w), 0);
  hd_world_cleanup(&w);
}

/* registered_bytes 0: ordinary memory, never reported registered. */
static void no_arena(hd_rank *r, void *arg) {
  (void)arg;
  void *p = reg_alloc(r, 10000);
  CHECK(reach_of(r, p, 10000) != DDPLUG_REACH_REGISTERED);
  memset(p, 3, 10000);
  CHECK_OK(r->p->mem_free(r->g, p));
}

TEST(registered_bytes_zero_gives_ordinary_memory) {
  CHECK_EQ_INT(hd_run_world(2, NULL, "{\"registered_bytes\": 0}", no_arena, NULL, 60, NULL), 0);
}

/* ---- the same bits on every path --------------------------------------------- */

/* M_PUSH: unregistered inputs, registered outputs (out of place only): on 2
 * ranks the push (each rank's shares copied into the owners' outputs first),
 * on more the pipeline or the kernel's copy. M_PUSH_MIXED: the same, but
 * rank 0 reduces its registered buffer in place (no push then). */
enum { M_REGISTERED, M_PLAIN, M_MIXED, M_PUSH, M_PUSH_MIXED, M_COUNT };
static const char *const mode_name[] = {"registered", "unregistered", "mixed",
                                        "unregistered-into-registered",
                                        "registered-in-place-beside-unregistered-into-registered"};

typedef struct bits_case {
  uint64_t counts[2];
} bits_case;

/* The reference: every rank's input, reduced here in rank order. */
static void reference(int W, int dt, int op, uint64_t count, uint64_t seed, unsigned char *ref,
                      unsigned char *tmp) {
  const uint64_t bytes = count * ddplug_dtype_size(dt);
  const void *srcs[HD_MAX_RANKS];
  for (int k = 0; k < W; k++) {
    fill(tmp + (uint64_t)k * bytes, dt, op, k, count, seed);
    srcs[k] = tmp + (uint64_t)k * bytes;
  }
  int red = op == DDPLUG_OP_AVG ? DDPLUG_OP_SUM : op;
  ddcpu_reduce_n(dt, red, ref, srcs, W, count, op == DDPLUG_OP_AVG ? W : 0);
}

static void one(hd_rank *r, unsigned char *reg, unsigned char *plain, int dt, int op,
                uint64_t count, int inplace, int mode, uint64_t seed, const unsigned char *ref,
                unsigned char *tmp) {
  const int W = r->w->world;
  const uint32_t es = ddplug_dtype_size(dt);
  const uint64_t bytes = count * es;
  /* odd offsets inside the buffers (element-aligned only) */
  int mine_registered = mode == M_REGISTERED || (mode == M_MIXED && r->rank == 0);
  unsigned char *base = mine_registered ? reg : plain;
  unsigned char *send = base + 3 * es;
  unsigned char *recv = inplace ? send : base + bytes + 11 * es;
  if (mode == M_PUSH || (mode == M_PUSH_MIXED && r->rank != 0)) {
    send = plain + 3 * es;
    recv = reg + bytes + 11 * es;
  } else if (mode == M_PUSH_MIXED) { /* rank 0 in place: no push, it would overwrite its input */
    send = recv = reg + 3 * es;
  }
  const int apart = send != recv;
  fill(send, dt, op, r->rank, count, seed);
  if (apart) memset(recv, 0x5a, bytes);
  memset(recv + bytes, 0xa5, GUARD);
  int s = hd_coll(r, DDPLUG_COLL_ALLREDUCE, send, recv, count, dt, op, 0, 60000);
  CHECK_MSG(s == DDPLUG_OK, "rank %d: %s allreduce %s %s count %llu: %s: %s", r->rank,
            mode_name[mode], ddplug_dtype_name(dt), ddplug_op_name(op),
            (unsigned long long)count, ddplug_status_name(s), r->error);
  if (memcmp(recv, ref, bytes) != 0) {
    uint64_t i = 0;
    while (memcmp(recv + i * es, ref + i * es, es) == 0) i++;
    dt_fail(__FILE__, __LINE__,
            "rank %d of %d: %s allreduce %s %s count %llu %s: element %llu differs from the "
            "rank-order reference", r->rank, W, mode_name[mode], ddplug_dtype_name(dt),
            ddplug_op_name(op), (unsigned long long)count, apart ? "out of place" : "in place",
            (unsigned long long)i);
  }
  for (int i = 0; i < GUARD; i++)
    CHECK_MSG(recv[bytes + i] == 0xa5, "%s allreduce wrote past the receive buffer",
              mode_name[mode]);
  if (apart) {
    fill(tmp, dt, op, r->rank, count, seed);
    CHECK_MSG(memcmp(send, tmp, bytes) == 0, "%s allreduce modified the send buffer",
              mode_name[mode]);
  }
}

static void same_bits(hd_rank *r, void *arg) {
  const bits_case *bc = arg;
  const uint64_t max = DDCPU_MAX(bc->counts[0], bc->counts[1]) * 8;
  const uint64_t room = 2 * max + 32 * 8 + GUARD;
  unsigned char *reg = reg_alloc(r, room), *plain = malloc(room);
  unsigned char *ref = malloc(max), *tmp = malloc(max * (uint64_t)r->w->world);
  CHECK(plain && ref && tmp);
  uint64_t seed = 1;
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      if (!op_valid(dtypes[d], ops[o])) continue;
      for (int c = 0; c < 2; c++, seed++) {
        reference(r->w->world, dtypes[d], ops[o], bc->counts[c], seed, ref, tmp);
        for (int inplace = 0; inplace < 2; inplace++)
          for (int mode = 0; mode < M_COUNT; mode++)
            if (!(inplace && (mode == M_PUSH || mode == M_PUSH_MIXED)))
              one(r, reg, plain, dtypes[d], ops[o], bc->counts[c], inplace, mode, seed, ref, tmp);
      }
    }
  CHECK_OK(r->p->mem_free(r->g, reg));
  free(plain);
  free(ref);
  free(tmp);
}

/* With the kernel's single copy allowed for every size (where the system
 * allows it) and with it refused by option: unregistered and mixed buffers
 * take the single copy in the first, the pipeline in the second. Small
 * chunks make the single copy work in many blocks (70001 float64 are 9).
 * Counts are primes: int8's 20011 bytes pass the one-shot path's 16 KiB. */
static const char *const worlds_opts[] = {
    "{\"cma\": \"on\", \"cma_min_bytes\": 0, \"chunk_bytes\": 65536}",
    "{\"cma\": \"off\", \"chunk_bytes\": 65536}",
};

static void run_bits(int world) {
  bits_case bc = {{20011, 70001}};
  for (int i = 0; i < 2; i++)
    CHECK_EQ_INT(hd_run_world(world, NULL, worlds_opts[i], same_bits, &bc, 300, NULL), 0);
}

TEST_T(same_bits_every_path_2_ranks, 300) { run_bits(2); }
TEST_T(same_bits_every_path_3_ranks, 300) { run_bits(3); }
TEST_T(same_bits_every_path_4_ranks, 300) { run_bits(4); }

/* ---- refused single copy -------------------------------------------------------- */

/* Make this process refuse ptrace-style access (non-dumpable) and give up
 * the capability that would override that in others (CAP_SYS_PTRACE). */
static void refuse_ptrace(void) {
  CHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof d);
  CHECK(syscall(SYS_capget, &h, d) == 0);
  d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  d[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
  CHECK(syscall(SYS_capset, &h, d) == 0);
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static void refused(int rank, int world, void *arg) {
  refuse_ptrace();
  hd_rank r;
  CHECK_OK(hd_open(&r, arg, rank));
  CHECK_CONTAINS(r.log, "single copy through the kernel is not used");
  CHECK_CONTAINS(r.log, "Operation not permitted");
  uint64_t n = 300007;
  float *plain = calloc(n, 4);
  CHECK_EQ_INT(reach_of(&r, plain, n * 4), DDPLUG_REACH_STAGED);
  float *reg = reg_alloc(&r, n * 4);
  CHECK_EQ_INT(reach_of(&r, reg, n * 4), DDPLUG_REACH_REGISTERED);
  for (int round = 0; round < 3; round++) {
    for (uint64_t i = 0; i < n; i++) plain[i] = reg[i] = (float)(i % 1000) + (float)rank;
    CHECK_OK(hd_coll(&r, DDPLUG_COLL_ALLREDUCE, plain, plain, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                     0, 30000));
    CHECK_OK(hd_coll(&r, DDPLUG_COLL_ALLREDUCE, reg, reg, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                     30000));
    for (uint64_t i = 0; i < n; i++) {
      float want = 2.0f * (float)(i % 1000) + (float)(world * (world - 1) / 2);
      CHECK_MSG(plain[i] == want && reg[i] == want, "element %llu: %g and %g, want %g",
                (unsigned long long)i, plain[i], reg[i], want);
    }
  }
  /* said once, at group_create; collectives fall back silently */
  CHECK_EQ_INT(count_of(r.log, "single copy through the kernel"), 1);
  CHECK_OK(r.p->mem_free(r.g, reg));
  free(plain);
  hd_close(&r);
}

TEST_T(refused_single_copy_falls_back_silently, 60) {
  hd_world w;
  hd_world_init(&w, 2, NULL, "{\"cma\": \"on\", \"cma_min_bytes\": 0}");
  w.log_level = DDPLUG_LOG_DEBUG;
  CHECK_EQ_INT(dt_run_ranks(2, refused, &w, NULL, 60, NULL), 0);
  CHECK_EQ_INT(hd_world_shm_left(&w), 0);
  hd_world_cleanup(&w);
}

static void allowed(hd_rank *r, void *arg) {
  (void)arg;
  /* where the system allows it (it does when the ranks may ptrace each
   * other), the log says so once */
  if (strstr(r->log, "not used")) {
    dt_note("rank %d: this system refuses the single copy: %s", r->rank, r->log);
    return;
  }
  CHECK_CONTAINS(r->log, "single copy through the kernel (process_vm_readv/writev) between the "
                         "2 local ranks: available");
  float *plain = calloc(1, MIB);
  CHECK_EQ_INT(reach_of(r, plain, MIB), DDPLUG_REACH_SINGLE_COPY);
  free(plain);
}

TEST(single_copy_available_is_said_once_at_debug_level) {
  hd_world w;
  hd_world_init(&w, 2, NULL, "{\"cma\": \"on\"}");
  w.log_level = DDPLUG_LOG_DEBUG;
  CHECK_EQ_INT(hd_run(&w, allowed, NULL, 60, NULL), 0);
  hd_world_cleanup(&w);
}

/* cma "auto" (the default): local rank 0 alone times the kernel's copy
 * against memcpy (in CPU time), and its verdict holds for every rank; each
 * rank says what was chosen, once. So whatever the load: rank 1 never
 * reports a measurement of its own, a refusal on rank 1 is the system's
 * (its own probe of rank 0's memory) or rank 0's, named, and an ordinary
 * buffer is reached by the single copy exactly where the log says
 * "available". */
static void auto_says(hd_rank *r, void *arg) {
  (void)arg;
  CHECK_EQ_INT(count_of(r->log, "single copy through the kernel"), 1);
  float *plain = calloc(1, MIB);
  CHECK(plain != NULL);
  int reach = reach_of(r, plain, MIB);
  free(plain);
  if (strstr(r->log, ": available")) {
    CHECK_EQ_INT(reach, DDPLUG_REACH_SINGLE_COPY);
    return;
  }
  CHECK_EQ_INT(reach, DDPLUG_REACH_STAGED);
  if (r->rank == 0) {
    CHECK_MSG(strstr(r->log, "on rank 0 the kernel's copy moves") || strstr(r->log, "not permitted"),
              "rank 0: %s", r->log);
    if (strstr(r->log, "the kernel's copy moves"))
      CHECK_CONTAINS(r->log, "of memcpy's bytes per second of CPU time");
    return;
  }
  CHECK_MSG(!strstr(r->log, "of memcpy's bytes per second"), "rank 1 measured: %s", r->log);
  CHECK_MSG(strstr(r->log, "refused to rank 0: its log says why") || strstr(r->log, "not permitted"),
            "rank 1: %s", r->log);
}

TEST(single_copy_auto_measures_the_kernel_copy) {
  hd_world w;
  hd_world_init(&w, 2, NULL, NULL);
  w.log_level = DDPLUG_LOG_DEBUG;
  CHECK_EQ_INT(hd_run(&w, auto_says, NULL, 60, NULL), 0);
  hd_world_cleanup(&w);
}

/* ---- failures ----------------------------------------------------------------------- */

typedef struct kill_arg {
  int victim;
  int cma; /* ordinary malloc'd buffers, reached with process_vm_readv/writev */
  _Atomic int *warmed; /* ranks done with the first allreduce */
} kill_arg;

static void *die_soon(void *arg) {
  (void)arg;
  usleep(3000);
  raise(SIGKILL);
  return NULL;
}

static void kill_inside(hd_rank *r, void *arg) {
  kill_arg *ka = arg;
  uint64_t n = 16 * MIB; /* float32: 64 MiB, tens of ms per allreduce */
  float *buf = ka->cma ? malloc(n * 4) : reg_alloc(r, n * 4);
  CHECK(buf != NULL);
  memset(buf, 0, n * 4);
  if (ka->cma && reach_of(r, buf, n * 4) != DDPLUG_REACH_SINGLE_COPY) {
    dt_note("rank %d: this system refuses the single copy: nothing to kill inside", r->rank);
    free(buf);
    return;
  }
  CHECK_OK(hd_coll(r, DDPLUG_COLL_ALLREDUCE, buf, buf, 1000, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                   20000));
  /* The victim goes on once every rank has finished that first allreduce
   * (one still finishing it when the victim dies may rightly fail it). */
  atomic_fetch_add(ka->warmed, 1);
  for (int i = 0; r->rank == ka->victim && atomic_load(ka->warmed) < r->w->world; i++) {
    CHECK_MSG(i < 45000, "the victim: the others never finished the first allreduce");
    usleep(1000);
  }
  ddplug_plugin_request *req = NULL;
  CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, buf, buf, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                    &req));
  if (r->rank == ka->victim) {
    /* dies 3 ms into it; should the allreduce end before that thread runs
     * (a loaded machine), the next one is started: the others repeat it
     * until they see the loss */
    pthread_t t;
    pthread_create(&t, NULL, die_soon, NULL);
    for (;;) {
      CHECK_OK(hd_wait(r, req, 30000));
      hd_free(r, req);
      CHECK_OK(hd_start(r, DDPLUG_COLL_ALLREDUCE, buf, buf, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0,
                        &req));
    }
  }
  int s;
  for (;;) { /* as many as the victim completed, then the one it died in */
    s = hd_wait(r, req, 30000); /* a hang guard: the loss ends the wait */
    hd_free(r, req);
    if (s != DDPLUG_OK) break;
    s = hd_start(r, DDPLUG_COLL_ALLREDUCE, buf, buf, n, DDPLUG_FLOAT32, DDPLUG_OP_SUM, 0, &req);
    if (s != DDPLUG_OK) break;
  }
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d (", ka->victim);
  CHECK_MSG(s == DDPLUG_E_PEER_LOST, "rank %d: expected PEER_LOST, got %s: %s", r->rank,
            ddplug_status_name(s), r->error);
  CHECK_CONTAINS(r->error, needle);
  dt_note("rank %d: %s", r->rank, r->error);
  if (ka->cma)
    free(buf);
  else
    CHECK_OK(r->p->mem_free(r->g, buf));
}

TEST_T(kill_inside_registered_allreduce_is_peer_lost, 60) {
  kill_arg ka = {1, 0, hd_shared_page(4096)};
  int st[HD_MAX_RANKS];
  CHECK_EQ_INT(hd_run_world(3, NULL, NULL, kill_inside, &ka, 60, st), 1);
  CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
}

/* The same inside a single-copy allreduce of malloc'd buffers: the survivors'
 * process_vm_readv/writev into the dead rank fail (ESRCH) or its slice never
 * comes; either way PEER_LOST naming it. */
TEST_T(kill_inside_single_copy_allreduce_is_peer_lost, 60) {
  kill_arg ka = {1, 1, hd_shared_page(4096)};
  int st[HD_MAX_RANKS];
  int failed = hd_run_world(3, NULL, "{\"cma\": \"on\", \"cma_min_bytes\": 0}", kill_inside,
                            &ka, 60, st);
  if (failed == 0) return; /* refused here: every rank said so */
  CHECK_EQ_INT(failed, 1);
  CHECK(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
}

/* A rank giving up on collective k waits while a live peer still writes
 * into its output (writing == k), and no longer. White box: rank 1 plays
 * a writer through its control block. */
typedef struct wd_shared {
  _Atomic int phase;
  _Atomic uint64_t released_ns, returned_ns;
} wd_shared;

static void withdraw(hd_rank *r, void *arg) {
  wd_shared *sh = arg;
  ddcpu_group *g = (ddcpu_group *)r->g;
  const uint64_t k = 777;
  if (r->rank == 1) {
    atomic_store(&g->shm.ctl[1].writing, k);
    atomic_store(&sh->phase, 1);
    usleep(300 * 1000);
    atomic_store(&sh->released_ns, (uint64_t)(hd_now_s() * 1e9));
    atomic_store(&g->shm.ctl[1].writing, 0);
    for (int i = 0; i < 10000 && atomic_load(&sh->phase) != 2; i++) usleep(1000);
  } else {
    while (atomic_load(&sh->phase) != 1) usleep(1000);
    ddcpu_req fake;
    memset(&fake, 0, sizeof fake);
    fake.k = k;
    ddcpu_direct_withdraw(g, &fake);
    atomic_store(&sh->returned_ns, (uint64_t)(hd_now_s() * 1e9));
    CHECK(atomic_load(&g->shm.ctl[0].withdrawn) == k);
    atomic_store(&sh->phase, 2);
  }
}

TEST_T(giving_up_waits_for_peers_writing_into_the_buffer, 60) {
  wd_shared *sh = hd_shared_page(4096);
  CHECK_EQ_INT(hd_run_world(2, NULL, NULL, withdraw, sh, 60, NULL), 0);
  CHECK_MSG(atomic_load(&sh->returned_ns) >= atomic_load(&sh->released_ns),
            "the withdrawing rank returned while its peer was still writing");
}
