/* nccl_fake_store.h — for the nccl plugin's tests: an in-process fake of
 * the host services (one store shared by thread-ranks, the runtime's
 * set_error/log), and the ddplug_group_init a runtime would pass. Include
 * after harness.h and the plugin's internal.h. */
#ifndef DDPLUG_NCCL_FAKE_STORE_H
#define DDPLUG_NCCL_FAKE_STORE_H

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "option_getters.h"

/* ---- a fake of the host services: one store shared by thread-ranks ---- */

#define FS_MAX 512
typedef struct fake_store {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n;
  char *keys[FS_MAX];
  char *vals[FS_MAX];
  uint64_t lens[FS_MAX];
  int run_status; /* non-OK: the "runtime" aborted the run (waits end) */
  int timeouts;   /* FS_TIMEOUTS_*: how a wait for a missing key ends      */
} fake_store;

/* fake_store.timeouts: by the clock (the default); never, until the test
 * says (store_expire_timeouts); or at once, as if every deadline had
 * passed. A test whose ranks must time out on a key that never comes holds
 * the timeouts until what it checks is in place, so the outcome does not
 * depend on how long its threads take to get there. */
enum { FS_TIMEOUTS_CLOCK = 0, FS_TIMEOUTS_HELD, FS_TIMEOUTS_EXPIRED };

typedef struct fake_rank {
  fake_store *st;
  int rank;
  int err_status;
  char err[DDNCCL_MSG_MAX + 256];
  ddplug_host_services svc;
} fake_rank;

static inline int fs_find(fake_store *s, const char *key) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->keys[i], key) == 0) return i;
  return -1;
}

static inline void fs_put(fake_store *s, const char *key, const void *v, uint64_t len) {
  int i = fs_find(s, key);
  if (i < 0) {
    CHECK(s->n < FS_MAX);
    i = s->n++;
    s->keys[i] = strdup(key);
  } else {
    free(s->vals[i]);
  }
  s->vals[i] = malloc(len + 1);
  memcpy(s->vals[i], v, len);
  s->vals[i][len] = '\0';
  s->lens[i] = len;
  pthread_cond_broadcast(&s->cv);
}

static inline int fs_set(void *host, const char *key, const void *v, uint64_t len) {
  fake_rank *r = host;
  pthread_mutex_lock(&r->st->mu);
  fs_put(r->st, key, v, len);
  pthread_mutex_unlock(&r->st->mu);
  return DDPLUG_OK;
}

static inline void deadline_ts(struct timespec *ts, int64_t ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static inline int fs_get(void *host, const char *key, void *buf, uint64_t cap,
                  uint64_t *len, int64_t timeout_ms) {
  fake_rank *r = host;
  fake_store *s = r->st;
  struct timespec ts;
  deadline_ts(&ts, timeout_ms);
  pthread_mutex_lock(&s->mu);
  int i;
  while ((i = fs_find(s, key)) < 0) {
    if (timeout_ms > 0 && s->timeouts == FS_TIMEOUTS_HELD) {
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    if (timeout_ms <= 0 || s->timeouts == FS_TIMEOUTS_EXPIRED ||
        pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0) {
      if ((i = fs_find(s, key)) >= 0) break;
      pthread_mutex_unlock(&s->mu);
      r->svc.set_error(r, DDPLUG_E_TIMEOUT, "fake store: key missing");
      return DDPLUG_E_TIMEOUT;
    }
  }
  *len = s->lens[i];
  if (s->lens[i] > cap) {
    pthread_mutex_unlock(&s->mu);
    return DDPLUG_E_INVALID_ARGUMENT;
  }
  memcpy(buf, s->vals[i], s->lens[i]);
  pthread_mutex_unlock(&s->mu);
  return DDPLUG_OK;
}

static inline int fs_add(void *host, const char *key, int64_t delta, int64_t *result) {
  fake_rank *r = host;
  pthread_mutex_lock(&r->st->mu);
  int i = fs_find(r->st, key);
  int64_t v = i < 0 ? 0 : strtoll(r->st->vals[i], NULL, 10);
  v += delta;
  char buf[32];
  int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
  fs_put(r->st, key, buf, (uint64_t)n);
  pthread_mutex_unlock(&r->st->mu);
  if (result) *result = v;
  return DDPLUG_OK;
}

static inline int fs_wait(void *host, const char *const *keys, uint32_t nkeys,
                   int64_t timeout_ms) {
  fake_rank *r = host;
  if (r->st->run_status != DDPLUG_OK) return r->st->run_status;
  for (uint32_t k = 0; k < nkeys; k++) {
    char buf[8];
    uint64_t len;
    int st = fs_get(host, keys[k], buf, sizeof buf, &len, timeout_ms);
    if (st != DDPLUG_OK && st != DDPLUG_E_INVALID_ARGUMENT) return st;
  }
  return DDPLUG_OK;
}

static inline int fs_delete(void *host, const char *key) {
  fake_rank *r = host;
  pthread_mutex_lock(&r->st->mu);
  int i = fs_find(r->st, key);
  if (i >= 0) {
    free(r->st->keys[i]);
    free(r->st->vals[i]);
    r->st->n--;
    r->st->keys[i] = r->st->keys[r->st->n];
    r->st->vals[i] = r->st->vals[r->st->n];
    r->st->lens[i] = r->st->lens[r->st->n];
  }
  pthread_mutex_unlock(&r->st->mu);
  return DDPLUG_OK;
}

static inline void fs_log(void *host, int32_t level, const char *message) {
  fake_rank *r = host;
  if (getenv("DT_VERBOSE")) fprintf(stderr, "  [r%d L%d] %s\n", r->rank, level, message);
}

static inline uint64_t fs_clock(void *host) {
  (void)host;
  return ddnccl_now_ns();
}

/* Thread-safe like the runtime's (group_abort may run on another thread). */
static pthread_mutex_t fs_err_mu = PTHREAD_MUTEX_INITIALIZER;
static inline void fs_set_error(void *host, int32_t status, const char *message) {
  fake_rank *r = host;
  pthread_mutex_lock(&fs_err_mu);
  r->err_status = status;
  snprintf(r->err, sizeof r->err, "%s", message);
  pthread_mutex_unlock(&fs_err_mu);
}

/* The options the plugin reads: the current world's plugin_options (set by
 * world_init), checked against the plugin's declarations as the runtime
 * does. */
static const char *fs_world_options = "{}";
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t host_abi_version);
static inline const ddplug_plugin *fs_table(void *host) {
  (void)host;
  return ddplug_plugin_entry_v1(DDPLUG_PLUGIN_ABI_VERSION);
}
static inline const char *fs_options(void *host) {
  (void)host;
  return fs_world_options;
}

static inline fake_store *store_new(void) {
  fake_store *s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  return s;
}

static inline void store_free(fake_store *s) {
  for (int i = 0; i < s->n; i++) {
    free(s->keys[i]);
    free(s->vals[i]);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static inline void store_hold_timeouts(fake_store *s) {
  pthread_mutex_lock(&s->mu);
  s->timeouts = FS_TIMEOUTS_HELD;
  pthread_mutex_unlock(&s->mu);
}

/* Every wait for a missing key, held or to come, times out now. */
static inline void store_expire_timeouts(fake_store *s) {
  pthread_mutex_lock(&s->mu);
  s->timeouts = FS_TIMEOUTS_EXPIRED;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static inline int store_has(fake_store *s, const char *key) {
  pthread_mutex_lock(&s->mu);
  int i = fs_find(s, key);
  pthread_mutex_unlock(&s->mu);
  return i >= 0;
}

static inline void rank_init(fake_rank *r, fake_store *s, int rank) {
  memset(r, 0, sizeof *r);
  r->st = s;
  r->rank = rank;
  r->svc = (ddplug_host_services){sizeof(ddplug_host_services),
                                  DDPLUG_PLUGIN_ABI_VERSION,
                                  r,
                                  fs_set,
                                  fs_get,
                                  fs_add,
                                  fs_wait,
                                  fs_delete,
                                  fs_log,
                                  fs_clock,
                                  fs_set_error,
                                  og_bool,
                                  og_int,
                                  og_number,
                                  og_string,
                                  og_int_list};
  og_src = (og_source){fs_table, fs_options, fs_set_error};
}

/* The init a runtime would pass: world ranks on one node "node-a". */
typedef struct fake_world {
  int32_t node_of[8], local_of[8];
  int64_t pid_of[8];
  ddplug_group_init init[8];
} fake_world;

static inline void world_init(fake_world *w, int world, const char *options,
                       int64_t timeout_ms) {
  memset(w, 0, sizeof *w);
  fs_world_options = options ? options : "{}";
  for (int r = 0; r < world; r++) {
    w->node_of[r] = 0;
    w->local_of[r] = r;
    w->pid_of[r] = 1000 + r;
  }
  for (int r = 0; r < world; r++) {
    ddplug_group_init *in = &w->init[r];
    in->struct_size = sizeof *in;
    in->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
    in->rank = r;
    in->world_size = world;
    in->local_rank = r;
    in->local_world_size = world;
    in->node_rank = 0;
    in->num_nodes = 1;
    in->node_of_rank = w->node_of;
    in->local_rank_of = w->local_of;
    in->pid_of_rank = w->pid_of;
    in->host_id = "node-a";
    in->run_id = "test";
    in->options_json = options;
    in->timeout_ms = timeout_ms;
    in->log_level = DDPLUG_LOG_WARN;
  }
}

/* Runs fn(arg_i) on world threads and joins them. */
static inline void run_threads(int world, void *(*fn)(void *), void *args, size_t size) {
  pthread_t t[8];
  for (int i = 0; i < world; i++)
    CHECK(pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * size) == 0);
  for (int i = 0; i < world; i++) pthread_join(t[i], NULL);
}

/* The ddplug_coll_args the runtime would pass for one collective. */
static inline ddplug_coll_args coll_args(int kind, const void *send, void *recv,
                                         uint64_t count, int dtype, int op,
                                         int root, void *stream, uint64_t seq) {
  ddplug_coll_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  a.kind = kind;
  a.dtype = dtype;
  a.op = op;
  a.root = root;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.seq = seq;
  a.stream = stream;
  return a;
}

#endif /* DDPLUG_NCCL_FAKE_STORE_H */
