/* test-mpi.c — the mpi plugin under real MPI launchers, for each family
 * built (Open MPI's mpirun.openmpi, MPICH's mpiexec.hydra): every case
 * starts a job of this same executable, whose ranks (DT_MPI_RANK=<case> in
 * their environment) run the case's rank function instead of the harness
 * and print one line per result ("R<rank> <word> <detail>"), unbuffered;
 * the case checks the job's output, its exit status and that none of its
 * processes is left behind. A family whose backend or launcher is missing
 * is skipped (exit 77) with the reason.
 *
 * Covered: the bootstrap (no MASTER_ADDR; the store refuses a client
 * without the per-run secret), plugin selection under a launcher and the
 * refusal of a plugin without bootstrap, point-to-point (order per tag,
 * any-source, a count mismatch naming both ranks with nothing delivered,
 * zero counts, a receive that times out and completes later), the
 * mismatch sentence, the collective timeout naming the rank that never
 * came, a frozen rank (SIGSTOP: TIMEOUT on the others, the job ends, no
 * process left), a killed rank (ddplug's line names it; non-zero exit; no
 * process left), an MPI the program initialised itself (used, not
 * finalized by ddplug), the hierarchical allreduce through the cpu plugin
 * on two simulated nodes, a library of the wrong family under a launcher,
 * and the error naming every library tried. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "run/context.h"

/* ---- the families ------------------------------------------------------------ */

typedef struct family {
  const char *name;       /* "openmpi", "mpich" */
  const char *launcher;   /* on PATH */
  const char *extra;      /* a launcher flag, or NULL */
  const char *lib;        /* the system library */
} family;

static const family k_families[] = {
    {"openmpi", "mpirun.openmpi", "--oversubscribe", "/usr/lib/x86_64-linux-gnu/libmpi.so.40"},
    {"mpich", "mpiexec.hydra", NULL, "/usr/lib/x86_64-linux-gnu/libmpich.so.12"},
};

static int on_path(const char *prog) {
  const char *path = getenv("PATH");
  char buf[4096];
  for (const char *p = path ? path : "/usr/bin"; p && *p;) {
    const char *c = strchr(p, ':');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
    if (access(buf, X_OK) == 0) return 1;
    p = c ? c + 1 : NULL;
  }
  return 0;
}

static int family_ready(const family *f, char *why, size_t cap) {
  char backend[4096];
  snprintf(backend, sizeof backend, "%s/lib/libddplug-mpi-%s.so", dt_build_dir(), f->name);
  if (access(backend, R_OK) != 0) {
    snprintf(why, cap, "%s backend not built (%.400s)", f->name, backend);
    return 0;
  }
  if (!on_path(f->launcher)) {
    snprintf(why, cap, "%s not on PATH", f->launcher);
    return 0;
  }
  return 1;
}

/* ---- running a job -------------------------------------------------------- */

typedef struct job {
  int status;        /* the launcher's wait status */
  int timed_out;
  char *out;         /* stdout and stderr of every rank and the launcher */
  char marker[64];   /* DT_MPI_JOB: finds processes left behind */
  char dir[128];     /* DT_MPI_OUT: each rank's own copy of its lines */
} job;

/* The lines the ranks wrote to their own files (DT_MPI_OUT) that the
 * launcher's output lacks, appended to it: a launcher may lose what its
 * processes printed when they exit without ever talking to it (seen with
 * hydra under load: "HYDU_sock_write: write error (Broken pipe)"). Then the
 * files are removed. */
static void add_rank_records(job *j, size_t *cap) {
  DIR *d = opendir(j->dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "rank", 4) != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", j->dir, e->d_name);
    FILE *f = fopen(path, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
      if (strstr(j->out, line)) continue;
      size_t n = strlen(line), len = strlen(j->out);
      if (len + n + 1 > *cap) {
        *cap = (len + n + 1) * 2;
        j->out = realloc(j->out, *cap + 1);
      }
      memcpy(j->out + len, line, n + 1);
    }
    if (f) fclose(f);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(j->dir);
}

/* Processes whose environment carries the job's marker. */
static int leftovers(const char *marker) {
  DIR *d = opendir("/proc");
  int count = 0;
  char needle[96];
  snprintf(needle, sizeof needle, "DT_MPI_JOB=%s", marker);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[65536];
    snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
      buf[n] = '\0';
      if (!strcmp(buf + i, needle)) count++;
    }
  }
  if (d) closedir(d);
  return count;
}

/* Start n ranks of case name with the family's launcher; env: extra
 * "NAME=value" entries (NULL-terminated, may be NULL). */
static void run_job(const family *f, int n, const char *name, const char *const *env,
                    int timeout_s, job *j) {
  memset(j, 0, sizeof *j);
  snprintf(j->marker, sizeof j->marker, "%d-%ld", (int)getpid(), (long)time(NULL));
  snprintf(j->dir, sizeof j->dir, "/tmp/ddplug-test-mpi-XXXXXX");
  CHECK(mkdtemp(j->dir) != NULL);
  int p[2];
  CHECK(pipe(p) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    setenv("DT_MPI_RANK", name, 1);
    setenv("DT_MPI_JOB", j->marker, 1);
    setenv("DT_MPI_OUT", j->dir, 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    /* Under AddressSanitizer (the second pass of make test) the ranks run
     * without LeakSanitizer: MPI keeps allocations until exit, also in the
     * components it unloads at MPI_Finalize (whose stacks no suppression can
     * name). Address errors are still caught; the harness's own leak check
     * of this driver process stays. */
    char asan[1024];
    const char *given = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "%s%sdetect_leaks=0", given ? given : "", given && *given ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    char self[4096], nstr[16];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    snprintf(nstr, sizeof nstr, "%d", n);
    const char *argv[8];
    int a = 0;
    argv[a++] = f->launcher;
    if (f->extra) argv[a++] = f->extra;
    argv[a++] = "-n";
    argv[a++] = nstr;
    argv[a++] = self;
    argv[a] = NULL;
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  setpgid(pid, pid);
  int flags = fcntl(p[0], F_GETFL);
  fcntl(p[0], F_SETFL, flags | O_NONBLOCK);
  size_t cap = 65536, len = 0;
  j->out = malloc(cap + 1);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int done = 0, st = 0, eof = 0;
  for (;;) {
    if (len + 4096 > cap) {
      cap *= 2;
      j->out = realloc(j->out, cap + 1);
    }
    ssize_t got = read(p[0], j->out + len, cap - len);
    if (got > 0) len += (size_t)got;
    else if (got == 0) eof = 1;
    if (!done && waitpid(pid, &st, WNOHANG) == pid) done = 1;
    if (done && eof) break;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!j->timed_out && now.tv_sec - t0.tv_sec > timeout_s) {
      j->timed_out = 1; /* a hang guard, never a timing assertion */
      kill(-pid, SIGKILL);
    }
    if (done && j->timed_out) break;
    if (got <= 0) {
      struct timespec nap = {0, 20000000};
      nanosleep(&nap, NULL);
    }
  }
  close(p[0]);
  j->out[len] = '\0';
  add_rank_records(j, &cap);
  j->status = st;
  dt_note("%s -n %d (%s): exit %d\n%s", f->launcher, n, name,
          WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), j->out);
}

static int exit_code(const job *j) { return WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -1; }

/* The job left no process behind (the launcher cleaned up), checked after
 * a grace period the launcher's own cleanup may take. */
static void check_no_leftovers(const job *j) {
  int left = 0;
  for (int i = 0; i < 100 && (left = leftovers(j->marker)) > 0; i++) {
    struct timespec nap = {0, 100000000};
    nanosleep(&nap, NULL);
  }
  CHECK_MSG(left == 0, "%d process(es) of the job are still running", left);
}

/* Every family this machine can run, each with fn. */
static void each_family(void (*fn)(const family *)) {
  int ran = 0;
  char why[2][512];
  for (int i = 0; i < 2; i++) {
    if (!family_ready(&k_families[i], why[i], sizeof why[i])) continue;
    fn(&k_families[i]);
    ran++;
  }
  if (!ran) dt_skip("no MPI family to run: %s; %s", why[0], why[1]);
}

/* ---- the ranks' side ---------------------------------------------------------- */

static int g_rank = -1;

static void say(const char *word, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const char *word, const char *fmt, ...) {
  char detail[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  for (char *p = detail; *p; p++)
    if (*p == '\n') *p = ' ';
  char line[2200];
  int n = snprintf(line, sizeof line, "R%d %s %s\n", g_rank, word, detail);
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  if (write(1, line, (size_t)n) < 0) _exit(3);
  /* and a copy of its own, in case the launcher loses its output (run_job) */
  const char *dir = getenv("DT_MPI_OUT");
  if (dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rank%d", dir, g_rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (write(fd, line, (size_t)n) < 0) _exit(3);
      close(fd);
    }
  }
}

static int env_rank(void) {
  const char *v = getenv("OMPI_COMM_WORLD_RANK");
  if (!v) v = getenv("PMI_RANK");
  return v ? atoi(v) : -1;
}

static ddplug_context *open_run(const char *json, const char *host_id) {
  ddplug_config *cfg = NULL;
  if (ddplug_config_load_string(json, "test-mpi", &cfg) != DDPLUG_OK) {
    say("FAIL", "config: %s", ddplug_last_error());
    _exit(1);
  }
  ddplug_open_options o = DDPLUG_OPEN_OPTIONS_INIT;
  o.host_id = host_id;
  ddplug_context *ctx = NULL;
  int s = ddplug_open(cfg, &o, &ctx);
  ddplug_config_free(cfg);
  if (s != DDPLUG_OK) {
    say("OPENFAIL", "%s: %s", ddplug_status_name(s), ddplug_last_error());
    return NULL;
  }
  return ctx;
}

static void rank_bootstrap(void) {
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 30}}", NULL);
  if (!ctx) _exit(1);
  ddplug_world w = DDPLUG_WORLD_INIT;
  ddplug_context_world(ctx, &w);
  say("WORLD", "rank %d of %d source %s", w.rank, w.world_size, w.source);
  /* A client without the run's secret is refused by rank 0's store. */
  if (g_rank == 1) {
    ddplug_store *st = NULL;
    int s = ddplug_store_connect(w.master_addr, w.master_port, NULL, 5000, &st);
    if (s == DDPLUG_OK) {
      /* The refusal may come with the first request. */
      s = ddplug_store_set(st, "user/intruder", "x", 1);
      ddplug_store_close(st);
    }
    say(s == DDPLUG_OK ? "INTRUDER-IN" : "INTRUDER-REFUSED", "%s", ddplug_status_name(s));
  }
  int32_t x = g_rank + 1;
  int s = ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL);
  say(s ? "FAIL" : "SUM", "%d %s", x, s ? ddplug_last_error() : "");
  ddplug_close(ctx);
}

static void rank_cpu_refused(void) {
  ddplug_context *ctx = open_run("{\"plugin\": \"cpu\"}", NULL);
  if (ctx) {
    say("FAIL", "the cpu plugin opened under an MPI launcher without a rendezvous");
    ddplug_close(ctx);
  }
}

/* White-box: the plugin's p2p_start through the context's group, below the
 * host API's ddplug_isend/ddplug_irecv (the conformance suite covers those). */
static int p2p(ddplug_context *ctx, int kind, int peer, int64_t tag, void *buf, uint64_t count,
               int dtype, int32_t *source, int64_t wait_ms) {
  ddplug_p2p_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  a.kind = kind;
  a.peer = peer;
  a.tag = tag;
  a.buf = buf;
  a.count = count;
  a.dtype = dtype;
  a.mem = DDPLUG_MEM_HOST;
  a.source = source;
  const ddplug_plugin *t = &ctx->plugin->table;
  ddplug_plugin_request *req = NULL;
  ddplug__plugin_err_clear(ctx);
  int s = t->p2p_start(ctx->group, &a, &req);
  if (s != DDPLUG_OK) return s;
  s = t->request_wait(ctx->group, req, wait_ms);
  if (s == DDPLUG_E_TIMEOUT) {
    /* Still pending: it must complete once the peer sends (below). */
    ddplug__plugin_err_take(ctx, s, "request_wait");
    say("P2P-TIMEOUT", "%s", ddplug_last_error());
    ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT); /* now the peer sends */
    s = t->request_wait(ctx->group, req, 30000);
  }
  if (s != DDPLUG_OK) ddplug__plugin_err_take(ctx, s, "request_wait");
  t->request_free(ctx->group, req);
  return s;
}

static void rank_p2p(void) {
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 30}}", NULL);
  if (!ctx) _exit(1);
  int32_t v[8] = {0}, src = -1;
  /* Order per tag, tags independent: 0 sends tag 5 (1), tag 5 (2), tag 7 (3). */
  if (g_rank == 0) {
    for (int i = 0; i < 3; i++) {
      int32_t x = i + 1;
      if (p2p(ctx, DDPLUG_P2P_SEND, 1, i < 2 ? 5 : 7, &x, 1, DDPLUG_INT32, NULL, 30000))
        say("FAIL", "send %d: %s", i, ddplug_last_error());
    }
  } else if (g_rank == 1) {
    int32_t a = 0, b = 0, c = 0;
    int s = p2p(ctx, DDPLUG_P2P_RECV, 0, 7, &c, 1, DDPLUG_INT32, NULL, 30000);
    s = s ? s : p2p(ctx, DDPLUG_P2P_RECV, 0, 5, &a, 1, DDPLUG_INT32, NULL, 30000);
    s = s ? s : p2p(ctx, DDPLUG_P2P_RECV, 0, 5, &b, 1, DDPLUG_INT32, NULL, 30000);
    say(s ? "FAIL" : "ORDER", "%d %d %d %s", c, a, b, s ? ddplug_last_error() : "");
  }
  ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
  /* Any source: ranks 1 and 2 send to 0 with tag 9. */
  if (g_rank == 0) {
    int32_t a = 0, b = 0, s1 = -1, s2 = -1;
    int s = p2p(ctx, DDPLUG_P2P_RECV, DDPLUG_ANY_SOURCE, 9, &a, 1, DDPLUG_INT32, &s1, 30000);
    s = s ? s : p2p(ctx, DDPLUG_P2P_RECV, DDPLUG_ANY_SOURCE, 9, &b, 1, DDPLUG_INT32, &s2, 30000);
    say(s ? "FAIL" : "ANY", "%d %d from %d %d %s", a + b, a * b, s1 + s2, s1 * s2,
        s ? ddplug_last_error() : "");
  } else {
    int32_t x = 10 * g_rank;
    if (p2p(ctx, DDPLUG_P2P_SEND, 0, 9, &x, 1, DDPLUG_INT32, NULL, 30000))
      say("FAIL", "any-source send: %s", ddplug_last_error());
  }
  ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
  /* A count mismatch: 1 sends 4 floats, 0 expects 8; nothing delivered;
   * then the same tag works. And zero counts. */
  if (g_rank == 0) {
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = -1.0f;
    int s = p2p(ctx, DDPLUG_P2P_RECV, 1, 11, f, 8, DDPLUG_FLOAT32, &src, 30000);
    say(s == DDPLUG_E_MISMATCH ? "MISMATCH" : "FAIL", "%s untouched=%d %s",
        ddplug_status_name(s), f[0] == -1.0f && f[3] == -1.0f, ddplug_last_error());
    s = p2p(ctx, DDPLUG_P2P_RECV, 1, 11, f, 8, DDPLUG_FLOAT32, &src, 30000);
    say(s ? "FAIL" : "AFTER", "%g from %d %s", f[7], src, s ? ddplug_last_error() : "");
    s = p2p(ctx, DDPLUG_P2P_RECV, 1, 12, v, 0, DDPLUG_INT32, NULL, 30000);
    say(s ? "FAIL" : "ZERO", "%s", s ? ddplug_last_error() : "ok");
  } else if (g_rank == 1) {
    float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int s = p2p(ctx, DDPLUG_P2P_SEND, 0, 11, f, 4, DDPLUG_FLOAT32, NULL, 30000);
    s = s ? s : p2p(ctx, DDPLUG_P2P_SEND, 0, 11, f, 8, DDPLUG_FLOAT32, NULL, 30000);
    s = s ? s : p2p(ctx, DDPLUG_P2P_SEND, 0, 12, v, 0, DDPLUG_INT32, NULL, 30000);
    if (s) say("FAIL", "mismatch sends: %s", ddplug_last_error());
  }
  ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
  /* A receive nobody has sent to yet: TIMEOUT, then it completes. */
  if (g_rank == 2) {
    int32_t x = 0;
    int s = p2p(ctx, DDPLUG_P2P_RECV, 0, 13, &x, 1, DDPLUG_INT32, NULL, 200);
    say(s ? "FAIL" : "LATE", "%d %s", x, s ? ddplug_last_error() : "");
  } else {
    ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
    if (g_rank == 0) {
      int32_t x = 42;
      if (p2p(ctx, DDPLUG_P2P_SEND, 2, 13, &x, 1, DDPLUG_INT32, NULL, 30000))
        say("FAIL", "late send: %s", ddplug_last_error());
    }
  }
  ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
  ddplug_close(ctx);
}

static void rank_mismatch(void) {
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 30}}", NULL);
  if (!ctx) _exit(1);
  float buf[32] = {0};
  int s = ddplug_allreduce(ctx, buf, buf, g_rank == 0 ? 16 : 32, DDPLUG_FLOAT32, DDPLUG_OP_SUM,
                           NULL);
  say(s == DDPLUG_E_MISMATCH ? "MISMATCH" : "FAIL", "%s", ddplug_last_error());
  s = ddplug_allreduce(ctx, buf, buf, 8, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  say(s ? "FAIL" : "AGAIN", "%s", s ? ddplug_last_error() : "ok");
  ddplug_close(ctx);
}

static void rank_late(void) {
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 2}}", NULL);
  if (!ctx) _exit(1);
  float x[4] = {1, 2, 3, 4};
  if (g_rank == 2) {
    struct timespec nap = {5, 0};
    nanosleep(&nap, NULL); /* the others time out meanwhile */
  }
  int s = ddplug_allreduce(ctx, x, x, 4, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  say(ddplug_status_name(s), "%s", ddplug_last_error());
  ddplug_close(ctx);
}

static void rank_frozen(void) {
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 2}}", NULL);
  if (!ctx) _exit(1);
  float x[4] = {1, 2, 3, 4};
  int s = ddplug_allreduce(ctx, x, x, 4, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  if (s) say("FAIL", "warm-up: %s", ddplug_last_error());
  if (g_rank == 1) raise(SIGSTOP);
  s = ddplug_allreduce(ctx, x, x, 4, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
  say(ddplug_status_name(s), "%s", ddplug_last_error());
  ddplug_close(ctx);
  _exit(s ? 3 : 0); /* a failed run exits non-zero, as a trainer would */
}

static void rank_killed(void) {
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 60}}", NULL);
  if (!ctx) _exit(1);
  float x[4] = {1, 2, 3, 4};
  for (int i = 0;; i++) {
    if (i == 3 && g_rank == 2) raise(SIGKILL);
    int s = ddplug_allreduce(ctx, x, x, 4, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
    if (s) {
      say(ddplug_status_name(s), "%s", ddplug_last_error());
      _exit(3);
    }
  }
}

/* The program initialised MPI itself (as mpi4py does): the plugin uses
 * that MPI and leaves finalizing it to the program. */
static void rank_program_mpi(void) {
  const char *lib = getenv("DT_MPI_LIB");
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  typedef int (*init_fn)(int *, char ***, int, int *);
  typedef int (*fin_fn)(void);
  typedef int (*flag_fn)(int *);
  init_fn init = h ? (init_fn)dlsym(h, "MPI_Init_thread") : NULL;
  fin_fn fin = h ? (fin_fn)dlsym(h, "MPI_Finalize") : NULL;
  flag_fn finalized = h ? (flag_fn)dlsym(h, "MPI_Finalized") : NULL;
  int provided = 0;
  if (!init || !fin || !finalized || init(NULL, NULL, 3 /* MPI_THREAD_MULTIPLE */, &provided)) {
    say("FAIL", "the program's own MPI_Init_thread (%s): %s", lib, dlerror());
    _exit(1);
  }
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 30}}", NULL);
  if (!ctx) _exit(1);
  int32_t x = 1;
  int s = ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL);
  say(s ? "FAIL" : "SUM", "%d %s", x, s ? ddplug_last_error() : "");
  ddplug_close(ctx);
  int done = 1;
  finalized(&done);
  say(done ? "FAIL" : "STILL-INITIALISED", "ddplug left MPI to the program");
  fin();
}

static void rank_hier(void) {
  /* Two simulated nodes of two ranks (host ids), intra_node "cpu". */
  char host[32];
  snprintf(host, sizeof host, "sim-node-%d", g_rank / 2);
  ddplug_context *ctx = open_run("{\"timeouts\": {\"collective_s\": 30},"
                                 " \"plugin_options\": {\"intra_node\": \"cpu\"}}",
                                 host);
  if (!ctx) _exit(1);
  int bad = 0;
  static const int dts[] = {DDPLUG_FLOAT32, DDPLUG_FLOAT64, DDPLUG_INT32, DDPLUG_INT64};
  static const int ops[] = {DDPLUG_OP_SUM, DDPLUG_OP_AVG, DDPLUG_OP_MAX, DDPLUG_OP_PROD};
  for (int d = 0; d < 4 && !bad; d++)
    for (int o = 0; o < 4 && !bad; o++) {
      enum { N = 100003 };
      static double in[N], out[N];
      size_t es = dts[d] == DDPLUG_FLOAT32 || dts[d] == DDPLUG_INT32 ? 4 : 8;
      for (int i = 0; i < N; i++) {
        double v = (double)((i % 7) + g_rank + 1);
        if (es == 4 && dts[d] == DDPLUG_FLOAT32) ((float *)in)[i] = (float)v;
        else if (es == 4) ((int32_t *)in)[i] = (int32_t)v;
        else if (dts[d] == DDPLUG_FLOAT64) in[i] = v;
        else ((int64_t *)in)[i] = (int64_t)v;
      }
      int s = ddplug_allreduce(ctx, in, out, N, dts[d], ops[o], NULL);
      for (int i = 0; i < N && !s && !bad; i++) {
        double want = 0, got;
        double base = (double)(i % 7);
        want = ops[o] == DDPLUG_OP_MAX ? base + 4
               : ops[o] == DDPLUG_OP_PROD ? (base + 1) * (base + 2) * (base + 3) * (base + 4)
                                          : 4 * base + 10;
        if (ops[o] == DDPLUG_OP_AVG) want = dts[d] == DDPLUG_INT32 || dts[d] == DDPLUG_INT64
                                                ? (double)(((long long)(4 * base + 10)) / 4)
                                                : (4 * base + 10) / 4;
        got = es == 4 && dts[d] == DDPLUG_FLOAT32 ? ((float *)out)[i]
              : es == 4                           ? ((int32_t *)out)[i]
              : dts[d] == DDPLUG_FLOAT64          ? out[i]
                                                  : (double)((int64_t *)out)[i];
        if (got != want) {
          say("FAIL", "dtype %d op %d element %d: %g, expected %g", dts[d], ops[o], i, got, want);
          bad = 1;
        }
      }
      if (s) {
        say("FAIL", "%s", ddplug_last_error());
        bad = 1;
      }
    }
  if (!bad) say("HIER", "16 allreduces right");
  ddplug_close(ctx);
}

static void rank_any_open(void) {
  ddplug_context *ctx = open_run("{}", NULL);
  if (ctx) {
    say("FAIL", "opened");
    ddplug_close(ctx);
  }
}

typedef struct rank_case {
  const char *name;
  void (*fn)(void);
} rank_case;
static const rank_case k_rank_cases[] = {
    {"bootstrap", rank_bootstrap}, {"cpu-refused", rank_cpu_refused},
    {"p2p", rank_p2p},             {"mismatch", rank_mismatch},
    {"late", rank_late},           {"frozen", rank_frozen},
    {"killed", rank_killed},       {"program-mpi", rank_program_mpi},
    {"hier", rank_hier},           {"any-open", rank_any_open},
};

/* A rank of a job (DT_MPI_RANK=<case>): run the case's rank function
 * instead of the harness, and exit. */
__attribute__((constructor)) static void rank_main(void) {
  const char *name = getenv("DT_MPI_RANK");
  if (!name || !*name) return;
  g_rank = env_rank();
  for (size_t i = 0; i < sizeof k_rank_cases / sizeof k_rank_cases[0]; i++)
    if (!strcmp(k_rank_cases[i].name, name)) {
      k_rank_cases[i].fn();
      exit(0); /* atexit: the plugin finalizes the MPI it initialised */
    }
  say("FAIL", "no rank case '%s'", name);
  _exit(2);
}

/* ---- the cases ------------------------------------------------------------------ */

static int count_lines(const char *out, const char *prefix) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, prefix)) != NULL; p++) n++;
  return n;
}

static void bootstrap_family(const family *f) {
  job j;
  const char *env[] = {"DDPLUG_LOG=info", NULL};
  run_job(f, 2, "bootstrap", env, 120, &j);
  CHECK_EQ_INT(exit_code(&j), 0);
  CHECK_CONTAINS(j.out, "R0 WORLD rank 0 of 2 source mpi");
  CHECK_CONTAINS(j.out, "R1 WORLD rank 1 of 2 source mpi");
  CHECK_CONTAINS(j.out, "using plugin mpi");
  CHECK_CONTAINS(j.out, "R1 INTRUDER-REFUSED");
  CHECK_CONTAINS(j.out, "R0 SUM 3");
  CHECK_CONTAINS(j.out, "R1 SUM 3");
  free(j.out);
}
TEST_T(bootstrap_needs_no_master_addr_and_is_authenticated, 300) { each_family(bootstrap_family); }

static void cpu_refused_family(const family *f) {
  job j;
  run_job(f, 2, "cpu-refused", NULL, 120, &j);
  CHECK_CONTAINS(j.out, "plugin cpu cannot learn the world over MPI (it has no bootstrap slots): "
                        "use \"plugin\": \"mpi\"");
  CHECK(!strstr(j.out, " FAIL "));
  free(j.out);
}
TEST_T(a_plugin_without_bootstrap_under_a_launcher_says_what_to_do, 300) {
  each_family(cpu_refused_family);
}

static void p2p_family(const family *f) {
  job j;
  run_job(f, 3, "p2p", NULL, 180, &j);
  CHECK_EQ_INT(exit_code(&j), 0);
  CHECK(!strstr(j.out, " FAIL "));
  CHECK_CONTAINS(j.out, "R1 ORDER 3 1 2");
  CHECK_CONTAINS(j.out, "R0 ANY 30 200 from 3 2");
  CHECK_CONTAINS(j.out, "R0 MISMATCH MISMATCH untouched=1");
  CHECK_CONTAINS(j.out, "rank 1 sent 4 x float32 with tag 11, rank 0 expected 8 x float32; "
                        "nothing was delivered");
  CHECK_CONTAINS(j.out, "R0 AFTER 8 from 1");
  CHECK_CONTAINS(j.out, "R0 ZERO ok");
  CHECK_CONTAINS(j.out, "R2 P2P-TIMEOUT receive from rank 0 (tag 13, 1 x int32) not complete "
                        "after 0.200 s (no matching send has arrived)");
  CHECK_CONTAINS(j.out, "R2 LATE 42");
  free(j.out);
}
TEST_T(point_to_point_order_any_source_mismatch_and_late_receive, 300) {
  each_family(p2p_family);
}

static void mismatch_family(const family *f) {
  job j;
  run_job(f, 2, "mismatch", NULL, 120, &j);
  CHECK_EQ_INT(exit_code(&j), 0);
  CHECK_EQ_INT(count_lines(j.out, "collective seq 1 differs across ranks: rank 0 called it with "
                                  "count 16 but rank 1 with count 32"), 2);
  CHECK_EQ_INT(count_lines(j.out, " MISMATCH "), 2);
  CHECK_EQ_INT(count_lines(j.out, " AGAIN ok"), 2);
  free(j.out);
}
TEST_T(a_mismatched_collective_names_both_ranks_and_the_run_goes_on, 300) {
  each_family(mismatch_family);
}

static void late_family(const family *f) {
  job j;
  run_job(f, 3, "late", NULL, 120, &j);
  /* Ranks 0 and 1 both time out; the first to do so prints before it leaves
   * (the launcher may end the other as it leaves without MPI_Finalize). */
  CHECK(strstr(j.out, "R0 TIMEOUT") || strstr(j.out, "R1 TIMEOUT"));
  CHECK_CONTAINS(j.out, "did not complete within the collective timeout (2.0 s): rank 2 has not "
                        "reached it (not heard from; ranks 0, 1 have)");
  check_no_leftovers(&j);
  free(j.out);
}
TEST_T(a_collective_timeout_names_the_rank_that_never_came, 300) { each_family(late_family); }

static void frozen_family(const family *f) {
  job j;
  run_job(f, 3, "frozen", NULL, 120, &j);
  CHECK(!j.timed_out);
  CHECK(exit_code(&j) != 0);
  CHECK_CONTAINS(j.out, "rank 1 has not reached it");
  CHECK(strstr(j.out, "R0 TIMEOUT") || strstr(j.out, "R2 TIMEOUT"));
  check_no_leftovers(&j);
  free(j.out);
}
TEST_T(a_frozen_rank_gives_timeout_and_the_job_ends_without_leftovers, 300) {
  each_family(frozen_family);
}

static void killed_family(const family *f) {
  job j;
  run_job(f, 3, "killed", NULL, 120, &j);
  CHECK(!j.timed_out);
  CHECK(exit_code(&j) != 0);
  /* ddplug's failure watcher names the dead rank on a survivor. Open MPI's
   * mpirun takes over a second to end the job, so the line always comes
   * first there; hydra ends it in tenths of a second (noted, not asserted). */
  const char *line = strstr(j.out, "rank 2 (pid ");
  if (!strcmp(f->name, "openmpi"))
    CHECK_MSG(line && strstr(j.out, "exited or was killed"),
              "no survivor's line names the dead rank 2");
  else
    dt_note("hydra: ddplug's line naming rank 2 %s", line ? "came" : "did not come in time");
  check_no_leftovers(&j);
  free(j.out);
}
TEST_T(a_killed_rank_is_named_and_the_job_ends_without_leftovers, 300) {
  each_family(killed_family);
}

static void program_mpi_family(const family *f) {
  job j;
  char lib[600];
  snprintf(lib, sizeof lib, "DT_MPI_LIB=%s", f->lib);
  const char *env[] = {lib, NULL};
  run_job(f, 2, "program-mpi", env, 120, &j);
  CHECK_EQ_INT(exit_code(&j), 0);
  CHECK_EQ_INT(count_lines(j.out, " SUM 2"), 2);
  CHECK_EQ_INT(count_lines(j.out, " STILL-INITIALISED "), 2);
  free(j.out);
}
TEST_T(an_mpi_the_program_initialised_is_used_and_not_finalized, 300) {
  each_family(program_mpi_family);
}

static void hier_family(const family *f) {
  job j;
  run_job(f, 4, "hier", NULL, 300, &j);
  CHECK_EQ_INT(exit_code(&j), 0);
  CHECK_EQ_INT(count_lines(j.out, " HIER 16 allreduces right"), 4);
  free(j.out);
}
TEST_T(hierarchical_allreduce_through_the_cpu_plugin_on_two_nodes, 600) {
  each_family(hier_family);
}

TEST_T(a_library_of_the_other_family_under_a_launcher_is_an_error, 300) {
  char why[512];
  if (!family_ready(&k_families[1], why, sizeof why)) dt_skip("%s", why);
  if (access(k_families[0].lib, R_OK) != 0) dt_skip("no %s", k_families[0].lib);
  job j;
  char lib[600];
  snprintf(lib, sizeof lib, "DDPLUG_MPI_LIBRARY=%s", k_families[0].lib);
  const char *env[] = {lib, NULL};
  run_job(&k_families[1], 2, "any-open", env, 120, &j);
  CHECK_CONTAINS(j.out, "the launcher started 2 processes (PMI_SIZE=2) but Open MPI");
  CHECK_CONTAINS(j.out, "sees an MPI world of 1");
  free(j.out);
}

TEST(no_mpi_library_names_every_library_tried) {
  setenv("DDPLUG_MPI_LIBRARY", "/nonexistent/libmpi.so.40:/nonexistent/dir/", 1);
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_plugin_inspect("mpi", &info)); /* the table loads without MPI */
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string("{\"plugin\": \"mpi\"}", "t", &cfg));
  ddplug_context *ctx = NULL;
  CHECK_STATUS(ddplug_open(cfg, NULL, &ctx), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "DDPLUG_MPI_LIBRARY=/nonexistent/libmpi.so.40:/nonexistent/"
                                      "dir/ names no MPI library that loads (tried: "
                                      "/nonexistent/libmpi.so.40: no such file");
  ddplug_config_free(cfg);
  setenv("DDPLUG_MPI_LIBRARY", "", 1);
  setenv("DDPLUG_MPI_ABI", "lam", 1);
  CHECK_OK(ddplug_config_load_string("{\"plugin\": \"mpi\"}", "t", &cfg));
  CHECK_STATUS(ddplug_open(cfg, NULL, &ctx), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "DDPLUG_MPI_ABI=lam is not an MPI ABI family: use openmpi "
                                      "or mpich");
  ddplug_config_free(cfg);
}
