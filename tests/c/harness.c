/* harness.c — see harness.h. */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DT_MAX_CASES 512

typedef struct dt_case {
  const char *name;
  dt_fn fn;
  int timeout_s;
} dt_case;

static dt_case g_cases[DT_MAX_CASES];
static int g_ncases;
static const char *g_current = "?";

void dt_register(const char *name, dt_fn fn, int timeout_s) {
  if (g_ncases >= DT_MAX_CASES) {
    fprintf(stderr, "harness: too many cases\n");
    _exit(2);
  }
  g_cases[g_ncases++] = (dt_case){name, fn, timeout_s};
}

void dt_fail(const char *file, int line, const char *fmt, ...) {
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "  FAIL %s (pid %d) at %s:%d: %s\n", g_current, (int)getpid(),
          file, line, buf);
  fflush(stderr);
  _exit(1);
}

void dt_skip(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "  SKIP %s: %s\n", g_current, buf);
  fflush(stdout);
  fflush(stderr);
  _exit(DT_SKIP_EXIT);
}

void dt_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  note: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the DIR's own fd */
}

static void list_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], target[512];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) continue;
    target[n] = '\0';
    fprintf(stderr, "    fd %s -> %s\n", e->d_name, target);
  }
  closedir(d);
}

static int g_fds_kept;

void dt_fds_kept_by_process(const char *why) {
  if (!g_fds_kept) dt_note("descriptor leak check off for this case: %s", why);
  g_fds_kept = 1;
}

static void run_case_inline(const dt_case *c) {
  g_current = c->name;
  g_fds_kept = 0;
  int before = count_fds();
  c->fn();
  int after = count_fds();
  if (before >= 0 && after > before && !g_fds_kept) {
    fprintf(stderr, "  FAIL %s: leaked %d file descriptor(s):\n", c->name,
            after - before);
    list_fds();
    _exit(1);
  }
}

pid_t dt_fork(void (*fn)(void *), void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    fn(arg);
    _exit(0);
  }
  return pid;
}

int dt_wait_pid(pid_t pid, int timeout_ms, int *status) {
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (status) *status = st;
      return 0;
    }
    if (r < 0 && errno != EINTR) return -1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long elapsed = (now.tv_sec - start.tv_sec) * 1000 +
                   (now.tv_nsec - start.tv_nsec) / 1000000;
    if (elapsed >= timeout_ms) return -1;
    usleep(2000);
  }
}

static void describe_status(const char *what, int st, char *buf, size_t cap) {
  if (WIFEXITED(st))
    snprintf(buf, cap, "%s exited with %d", what, WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, cap, "%s killed by signal %d (%s)", what, WTERMSIG(st),
             strsignal(WTERMSIG(st)));
  else
    snprintf(buf, cap, "%s ended oddly (status %d)", what, st);
}

static int run_case_forked(const dt_case *c) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0); /* own process group: a timeout kills the case's ranks too */
    run_case_inline(c);
    /* exit(), not _exit(): LeakSanitizer (ASan builds) checks at exit. */
    exit(0);
  }
  setpgid(pid, pid);
  int st = 0;
  int timed_out = dt_wait_pid(pid, c->timeout_s * 1000, &st) != 0;
  if (timed_out) {
    kill(-pid, SIGKILL);
    waitpid(pid, &st, 0);
  } else {
    kill(-pid, SIGKILL); /* stray grandchildren of a finished case */
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) +
                (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  int ok = !timed_out && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  if (!timed_out && WIFEXITED(st) && WEXITSTATUS(st) == DT_SKIP_EXIT) {
    printf("skip    %-50s %7.2fs\n", c->name, secs);
    fflush(stdout);
    return 2;
  }
  if (ok) {
    printf("ok      %-50s %7.2fs\n", c->name, secs);
  } else if (timed_out) {
    printf("TIMEOUT %-50s after %ds\n", c->name, c->timeout_s);
  } else {
    char why[256];
    describe_status("case", st, why, sizeof why);
    printf("FAIL    %-50s %s\n", c->name, why);
  }
  fflush(stdout);
  return ok;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc > 1 && strcmp(argv[1], "--list") == 0) {
    for (int i = 0; i < g_ncases; i++) printf("%s\n", g_cases[i].name);
    return 0;
  }
  int nofork = getenv("DT_NOFORK") && *getenv("DT_NOFORK") == '1';
  int failed = 0, ran = 0, skipped = 0;
  for (int i = 0; i < g_ncases; i++) {
    int selected = argc <= 1;
    for (int a = 1; a < argc && !selected; a++)
      selected = strcmp(argv[a], g_cases[i].name) == 0;
    if (!selected) continue;
    ran++;
    if (nofork) {
      run_case_inline(&g_cases[i]);
      printf("ok      %s\n", g_cases[i].name);
    } else {
      int r = run_case_forked(&g_cases[i]);
      if (r == 0) failed++;
      if (r == 2) skipped++;
    }
  }
  if (ran == 0) {
    fprintf(stderr, "no case matched\n");
    return 2;
  }
  if (skipped)
    printf("%d of %d cases passed, %d skipped\n", ran - failed - skipped, ran,
           skipped);
  else
    printf("%d of %d cases passed\n", ran - failed, ran);
  if (!failed && skipped == ran) return DT_SKIP_EXIT;
  return failed ? 1 : 0;
}

/* ---- multi-process ------------------------------------------------------ */

/* Bind 127.0.0.1:port (0: any) and close again; the port, or -1. */
static int try_port(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  socklen_t len = sizeof a;
  int got = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    got = ntohs(a.sin_port);
  close(fd);
  return got;
}

/* Below the kernel's ephemeral range, not in it: a port from that range
 * can be handed to any process's outgoing connection before the test binds
 * it, and a rank that retries connecting to it before rank 0 listens can
 * be given it as its own local port (a TCP self-connect: the rank talks to
 * itself and rank 0 cannot bind). Random, checked by binding. */
int dt_free_port(void) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  int top = lo - 4, bottom = lo - 10000; /* room for port + 1, + 2 (a second store) */
  if (bottom >= 1024) {
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int i = 0; i < 200; i++) {
      seed = seed * 1103515245u + 12345u;
      int port = bottom + (int)((seed >> 8) % (unsigned)(top - bottom + 1));
      if (try_port(port) == port) return port;
    }
  }
  return try_port(0);
}

int dt_run_ranks(int world, dt_rank_fn fn, void *arg,
                 const char *const *extra_env, int timeout_s, int *statuses) {
  int port = dt_free_port();
  pid_t pids[256];
  if (world > 256) dt_fail(__FILE__, __LINE__, "world too large");
  for (int r = 0; r < world; r++) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      char buf[32];
      snprintf(buf, sizeof buf, "%d", r);
      setenv("RANK", buf, 1);
      setenv("LOCAL_RANK", buf, 1);
      snprintf(buf, sizeof buf, "%d", world);
      setenv("WORLD_SIZE", buf, 1);
      setenv("LOCAL_WORLD_SIZE", buf, 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      snprintf(buf, sizeof buf, "%d", port);
      setenv("MASTER_PORT", buf, 1);
      for (int i = 0; extra_env && extra_env[i]; i++) putenv((char *)extra_env[i]);
      fn(r, world, arg);
      exit(0); /* runs LeakSanitizer in ASan builds */
    }
    pids[r] = pid;
  }
  int failed = 0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int r = 0; r < world; r++) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long left = (long)timeout_s * 1000 -
                ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
    int st = 0;
    if (dt_wait_pid(pids[r], left > 0 ? (int)left : 0, &st) != 0) {
      fprintf(stderr, "  rank %d did not finish within %d s; killing it\n", r, timeout_s);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &st, 0);
      failed++;
    } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      char what[32], why[256];
      snprintf(what, sizeof what, "rank %d", r);
      describe_status(what, st, why, sizeof why);
      fprintf(stderr, "  %s\n", why);
      failed++;
    }
    if (statuses) statuses[r] = st;
  }
  return failed;
}

const char *dt_source_dir(void) {
  const char *s = getenv("DDPLUG_SOURCE_DIR");
  return s ? s : ".";
}
const char *dt_build_dir(void) {
  const char *s = getenv("DDPLUG_BUILD_DIR");
  return s ? s : ".";
}

static char *g_temp_paths[64];
static int g_ntemp;
static void cleanup_temps(void) {
  for (int i = 0; i < g_ntemp; i++) {
    unlink(g_temp_paths[i]);
    free(g_temp_paths[i]);
  }
}

const char *dt_temp_file(const char *suffix, const char *text) {
  char tmpl[256];
  snprintf(tmpl, sizeof tmpl, "/tmp/ddplug-test-XXXXXX%s", suffix ? suffix : "");
  int fd = mkstemps(tmpl, suffix ? (int)strlen(suffix) : 0);
  if (fd < 0) dt_fail(__FILE__, __LINE__, "mkstemps: %s", strerror(errno));
  size_t len = strlen(text);
  if (write(fd, text, len) != (ssize_t)len) dt_fail(__FILE__, __LINE__, "write failed");
  close(fd);
  if (g_ntemp == 0) atexit(cleanup_temps);
  if (g_ntemp < 64) g_temp_paths[g_ntemp++] = strdup(tmpl);
  return g_ntemp <= 64 ? g_temp_paths[g_ntemp - 1] : NULL;
}
