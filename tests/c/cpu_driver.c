/* cpu_driver.c — see cpu_driver.h. The store is a directory: a key is a
 * file (written to a temporary name and renamed, so readers never see half
 * a value); waits poll every millisecond; add takes an flock. */
#include "cpu_driver.h"

#include <dirent.h>
#include <dlfcn.h>
#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "option_getters.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double hd_now_s(void) { return (double)now_ns() / 1e9; }

void hd_world_init(hd_world *w, int world, const int *node_of, const char *options) {
  static int counter;
  memset(w, 0, sizeof *w);
  if (world > HD_MAX_RANKS) dt_fail(__FILE__, __LINE__, "world too large");
  w->world = world;
  for (int r = 0; r < world; r++) w->node_of[r] = node_of ? node_of[r] : 0;
  snprintf(w->options, sizeof w->options, "%s", options ? options : "{}");
  w->timeout_ms = 30000;
  snprintf(w->run_id, sizeof w->run_id, "hosttest%d_%d", (int)getpid(), ++counter);
  snprintf(w->dir, sizeof w->dir, "/tmp/ddplug-hd-%s", w->run_id);
  /* A directory of the same name is left by a killed earlier process that
   * had this pid: its keys (shm/0 among them) would be read as this world's
   * (a rank then opened the new segment before its creator sized it: "too
   * small", seen once in a loaded loop). Start from an empty store. */
  hd_world_cleanup(w);
  if (mkdir(w->dir, 0700) != 0)
    dt_fail(__FILE__, __LINE__, "mkdir %s: %s", w->dir, strerror(errno));
}

void hd_world_cleanup(hd_world *w) {
  DIR *d = opendir(w->dir);
  if (!d) return;
  struct dirent *e;
  char p[600];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || e->d_name[1] == '.')) continue;
    snprintf(p, sizeof p, "%s/%s", w->dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(w->dir);
}

/* ---- the file store ------------------------------------------------------- */

static void key_path(hd_rank *r, const char *key, char *out, size_t cap) {
  char k[300];
  snprintf(k, sizeof k, "%s", key);
  for (char *p = k; *p; p++)
    if (*p == '/') *p = '_';
  snprintf(out, cap, "%s/k_%s", r->w->dir, k);
}

static int svc_set(void *host, const char *key, const void *value, uint64_t len) {
  hd_rank *r = host;
  char path[600], tmp[700];
  key_path(r, key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return DDPLUG_E_SYSTEM;
  if (len && write(fd, value, len) != (ssize_t)len) {
    close(fd);
    return DDPLUG_E_SYSTEM;
  }
  close(fd);
  return rename(tmp, path) == 0 ? DDPLUG_OK : DDPLUG_E_SYSTEM;
}

static int read_file(const char *path, void *buf, uint64_t cap, uint64_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char tmp[65536];
  ssize_t n = read(fd, tmp, sizeof tmp);
  close(fd);
  if (n < 0) return -1;
  *len = (uint64_t)n;
  if ((uint64_t)n > cap) return 1;
  memcpy(buf, tmp, (size_t)n);
  return 0;
}

static int svc_get(void *host, const char *key, void *buf, uint64_t cap,
                   uint64_t *len, int64_t timeout_ms) {
  hd_rank *r = host;
  char path[600];
  key_path(r, key, path, sizeof path);
  uint64_t deadline = now_ns() + (uint64_t)(timeout_ms < 0 ? 300000 : timeout_ms) * 1000000ull;
  for (;;) {
    uint64_t l = 0;
    int s = read_file(path, buf, cap, &l);
    if (s == 0) {
      *len = l;
      return DDPLUG_OK;
    }
    if (s == 1) {
      *len = l;
      return DDPLUG_E_INVALID_ARGUMENT;
    }
    if (now_ns() >= deadline) {
      r->svc.set_error(r, DDPLUG_E_TIMEOUT, "driver store: key never appeared");
      return DDPLUG_E_TIMEOUT;
    }
    usleep(1000);
  }
}

static int svc_add(void *host, const char *key, int64_t delta, int64_t *result) {
  hd_rank *r = host;
  char lock[600], path[600];
  snprintf(lock, sizeof lock, "%s/.lock", r->w->dir);
  key_path(r, key, path, sizeof path);
  int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lfd < 0) return DDPLUG_E_SYSTEM;
  flock(lfd, LOCK_EX);
  char buf[64] = "0";
  uint64_t l = 0;
  if (read_file(path, buf, sizeof buf - 1, &l) == 0) buf[l] = '\0';
  long long v = atoll(buf) + delta;
  snprintf(buf, sizeof buf, "%lld", v);
  int s = svc_set(host, key, buf, strlen(buf));
  flock(lfd, LOCK_UN);
  close(lfd);
  if (result) *result = v;
  return s;
}

static int svc_wait(void *host, const char *const *keys, uint32_t nkeys, int64_t timeout_ms) {
  hd_rank *r = host;
  char tmp[8];
  for (uint32_t i = 0; i < nkeys; i++) {
    uint64_t l;
    (void)r;
    int s = svc_get(host, keys[i], tmp, sizeof tmp, &l, timeout_ms);
    if (s != DDPLUG_OK && s != DDPLUG_E_INVALID_ARGUMENT) return s;
  }
  return DDPLUG_OK;
}

static int svc_delete(void *host, const char *key) {
  hd_rank *r = host;
  char path[600];
  key_path(r, key, path, sizeof path);
  unlink(path);
  return DDPLUG_OK;
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static void svc_log(void *host, int32_t level, const char *message) {
  hd_rank *r = host;
  if (level <= DDPLUG_LOG_WARN) fprintf(stderr, "  [host r%d L%d] %s\n", r->rank, level, message);
  pthread_mutex_lock(&log_mu);
  size_t n = strlen(r->log);
  if (n + 1 < sizeof r->log) snprintf(r->log + n, sizeof r->log - n, "%s\n", message);
  pthread_mutex_unlock(&log_mu);
}

static uint64_t svc_clock(void *host) {
  (void)host;
  return now_ns();
}

static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static void svc_set_error(void *host, int32_t status, const char *message) {
  hd_rank *r = host;
  pthread_mutex_lock(&err_mu);
  snprintf(r->error, sizeof r->error, "%s", message ? message : "");
  pthread_mutex_unlock(&err_mu);
  (void)status;
}

/* ---- typed options, as the runtime serves them ------------------------------ */

static const ddplug_plugin *driver_table(void *host) { return ((hd_rank *)host)->p; }
static const char *driver_options(void *host) { return ((hd_rank *)host)->w->options; }

/* ---- ranks ------------------------------------------------------------------ */

int hd_open(hd_rank *r, const hd_world *w, int rank) {
  memset(r, 0, sizeof *r);
  r->w = w;
  r->rank = rank;
  r->svc = (ddplug_host_services){sizeof(ddplug_host_services), DDPLUG_PLUGIN_ABI_VERSION,
                                  r, svc_set, svc_get, svc_add, svc_wait, svc_delete,
                                  svc_log, svc_clock, svc_set_error, og_bool,
                                  og_int, og_number, og_string,
                                  og_int_list};
  og_src = (og_source){driver_table, driver_options, svc_set_error};
  char path[512];
  snprintf(path, sizeof path, "%s/lib/libddplug-cpu.so", dt_build_dir());
  r->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!r->dl) dt_fail(__FILE__, __LINE__, "dlopen %s: %s", path, dlerror());
  ddplug_plugin_entry_fn entry = (ddplug_plugin_entry_fn)dlsym(r->dl, DDPLUG_PLUGIN_ENTRY_SYMBOL);
  if (!entry) dt_fail(__FILE__, __LINE__, "no entry symbol in %s", path);
  r->p = entry(DDPLUG_PLUGIN_ABI_VERSION);
  /* The runtime checks the declared options before group_create. */
  json_t *checked = NULL;
  int st = ddplug__options_check(r->p, w->options, &checked);
  json_decref(checked);
  if (st != DDPLUG_OK) {
    svc_set_error(r, st, ddplug_last_error());
    dlclose(r->dl);
    r->dl = NULL;
    return st;
  }
  /* pids through the store */
  char key[64], val[32];
  snprintf(key, sizeof key, "drv/pid/%d", rank);
  snprintf(val, sizeof val, "%d", (int)getpid());
  svc_set(r, key, val, strlen(val));
  int count[HD_MAX_RANKS] = {0};
  for (int i = 0; i < w->world; i++) {
    uint64_t l = 0;
    snprintf(key, sizeof key, "drv/pid/%d", i);
    if (svc_get(r, key, val, sizeof val - 1, &l, 30000) != DDPLUG_OK)
      dt_fail(__FILE__, __LINE__, "rank %d never published its pid", i);
    val[l] = '\0';
    r->pid_of[i] = atoll(val);
    r->node_of[i] = w->node_of[i];
    r->local_of[i] = count[w->node_of[i]]++;
  }
  int nodes = 0;
  for (int i = 0; i < w->world; i++)
    if (w->node_of[i] + 1 > nodes) nodes = w->node_of[i] + 1;
  ddplug_group_init *in = &r->init;
  in->struct_size = sizeof *in;
  in->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  in->rank = rank;
  in->world_size = w->world;
  in->local_rank = r->local_of[rank];
  in->local_world_size = count[w->node_of[rank]];
  in->node_rank = w->node_of[rank];
  in->num_nodes = nodes;
  in->node_of_rank = r->node_of;
  in->local_rank_of = r->local_of;
  in->pid_of_rank = r->pid_of;
  in->host_id = "testhost";
  in->run_id = w->run_id;
  in->options_json = w->options;
  in->timeout_ms = w->timeout_ms;
  in->log_level = w->log_level ? w->log_level : DDPLUG_LOG_WARN;
  int s = r->p->group_create(in, &r->svc, &r->g);
  if (s != DDPLUG_OK) {
    dlclose(r->dl);
    r->dl = NULL;
    r->g = NULL;
  }
  return s;
}

void hd_close(hd_rank *r) {
  if (r->g) r->p->group_destroy(r->g);
  r->g = NULL;
  if (r->dl) dlclose(r->dl);
  r->dl = NULL;
}

int hd_start(hd_rank *r, int kind, const void *send, void *recv, uint64_t count,
             int dtype, int op, int root, ddplug_plugin_request **req) {
  ddplug_coll_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  a.kind = kind;
  a.dtype = kind == DDPLUG_COLL_BARRIER ? 0 : dtype;
  a.op = kind == DDPLUG_COLL_ALLREDUCE ? op : 0;
  a.root = kind == DDPLUG_COLL_BROADCAST ? root : 0;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.seq = ++r->seq;
  a.mem = DDPLUG_MEM_HOST;
  int s = r->p->collective_start(r->g, &a, req);
  if (s != DDPLUG_OK) r->seq--;
  return s;
}

int hd_wait(hd_rank *r, ddplug_plugin_request *req, int64_t timeout_ms) {
  return r->p->request_wait(r->g, req, timeout_ms);
}

void hd_free(hd_rank *r, ddplug_plugin_request *req) { r->p->request_free(r->g, req); }

int hd_coll(hd_rank *r, int kind, const void *send, void *recv, uint64_t count,
            int dtype, int op, int root, int64_t timeout_ms) {
  ddplug_plugin_request *req = NULL;
  int s = hd_start(r, kind, send, recv, count, dtype, op, root, &req);
  if (s != DDPLUG_OK) return s;
  s = hd_wait(r, req, timeout_ms);
  if (s == DDPLUG_E_TIMEOUT) return s; /* still pending: leave it to destroy */
  hd_free(r, req);
  return s;
}

typedef struct run_arg {
  const hd_world *w;
  void (*fn)(hd_rank *r, void *arg);
  void *arg;
} run_arg;

static void trampoline(int rank, int world, void *p) {
  run_arg *a = p;
  (void)world;
  hd_rank r;
  int s = hd_open(&r, a->w, rank);
  if (s != DDPLUG_OK)
    dt_fail(__FILE__, __LINE__, "rank %d: group_create returned %s: %s", rank,
            ddplug_status_name(s), r.error);
  a->fn(&r, a->arg);
  hd_close(&r);
}

int hd_run(const hd_world *w, void (*fn)(hd_rank *r, void *arg), void *arg,
           int timeout_s, int *statuses) {
  run_arg a = {w, fn, arg};
  return dt_run_ranks(w->world, trampoline, &a, NULL, timeout_s, statuses);
}

int hd_shm_count(const char *prefix) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
  closedir(d);
  return n;
}

int hd_world_shm_left(const hd_world *w) {
  char prefix[80];
  snprintf(prefix, sizeof prefix, "ddplug-cpu-%s-", w->run_id);
  return hd_shm_count(prefix);
}

void *hd_shared_page(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) dt_fail(__FILE__, __LINE__, "mmap: %s", strerror(errno));
  return p;
}

int hd_run_world(int world, const int *node_of, const char *options,
                 void (*fn)(hd_rank *r, void *arg), void *arg, int timeout_s,
                 int *statuses) {
  hd_world w;
  hd_world_init(&w, world, node_of, options);
  int failed = hd_run(&w, fn, arg, timeout_s, statuses);
  int left = hd_world_shm_left(&w);
  hd_world_cleanup(&w);
  if (left) dt_fail(__FILE__, __LINE__, "%d shared-memory segment(s) of the run left", left);
  return failed;
}
