/* run.c — one scenario of `ddplug conformance`: fork its ranks,
 * collect their rows through one pipe per rank, enforce the deadline, merge
 * the rows (a row fails if it failed on any rank), and report a rank that
 * crashed, hung or exited with an error. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conformance.h"

const cf_slot_info cf_slots[CF_SLOT_COUNT] = {
#define CF__SLOT_INFO(slot, minor, mandatory) \
  {#slot, offsetof(ddplug_plugin, slot), minor, mandatory},
    CF_SLOT_MAP(CF__SLOT_INFO)
#undef CF__SLOT_INFO
};

double cf_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void cf_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Tabs and newlines would break the row protocol. */
static void flatten(char *s) {
  for (; *s; s++)
    if (*s == '\t' || *s == '\n' || *s == '\r') *s = ' ';
}

void cf_report(cf_rank *r, const char *id, uint64_t slots, int verdict, const char *title,
               const char *fmt, ...) {
  char detail[2048], t[160], line[3072];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  snprintf(t, sizeof t, "%s", title);
  flatten(detail);
  flatten(t);
  int n = snprintf(line, sizeof line, "R\t%s\t%c\t%llx\t%s\t%s\n", id, verdict,
                   (unsigned long long)slots, t, detail);
  if (n >= (int)sizeof line) {
    n = (int)sizeof line - 1;
    line[n - 1] = '\n';
  }
  for (int off = 0; off < n;) {
    ssize_t w = write(r->out_fd, line + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (int)w;
  }
}

const char *cf_error(ddplug_context *ctx) {
  const char *e = ctx ? ddplug_context_error(ctx) : NULL;
  return e && *e ? e : ddplug_last_error();
}

/* JSON string body of s (quotes and backslashes escaped). */
static void json_escape(char *out, size_t cap, const char *s) {
  size_t o = 0;
  for (; *s && o + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
    } else if (c < 0x20) {
      o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = '\0';
}

int cf_open(cf_rank *r, const char *plugin, int collective_s, const char *host_id,
            ddplug_context **out) {
  char path[8200], host[600] = "", json[16384];
  json_escape(path, sizeof path, r->plan->path);
  if (host_id) {
    char h[512];
    json_escape(h, sizeof h, host_id);
    snprintf(host, sizeof host, ", \"host_id\": \"%s\"", h);
  }
  if (r->plan->launched) /* the launcher's world; the plugin's bootstrap finds rank 0 */
    snprintf(json, sizeof json,
             "{\"plugin\": \"%s\", \"rendezvous\": {\"timeout_s\": 60},"
             " \"timeouts\": {\"collective_s\": %d}, \"data_split\": {\"audit\": \"off\"},"
             " \"checks\": {\"duplicate_gpu\": \"%s\"}, \"plugin_options\": %s}",
             path, collective_s, r->plan->shared_gpu ? "warn" : "error",
             r->plan->options);
  else
    snprintf(json, sizeof json,
             "{\"plugin\": \"%s\", \"world\": {\"rank\": %d, \"world_size\": %d%s},"
             " \"rendezvous\": {\"addr\": \"127.0.0.1\", \"port\": %d, \"timeout_s\": 60},"
             " \"timeouts\": {\"collective_s\": %d}, \"data_split\": {\"audit\": \"off\"},"
             " \"checks\": {\"duplicate_gpu\": \"%s\"}, \"plugin_options\": %s}",
             path, r->rank, r->world, host, r->port, collective_s,
             r->plan->shared_gpu ? "warn" : "error", r->plan->options);
  ddplug_config *cfg = NULL;
  int s = ddplug_config_load_string(json, "ddplug conformance", &cfg);
  if (s != DDPLUG_OK) return s;
  ddplug_open_options o = DDPLUG_OPEN_OPTIONS_INIT;
  o.plugin = plugin;
  o.host_id = r->plan->launched ? host_id : NULL; /* the config's world needs a rank */
  o.framework = "ddplug conformance";
  s = ddplug_open(cfg, &o, out);
  ddplug_config_free(cfg);
  return s;
}

static const cf_plan *g_log_plan;
static int g_log_rank;
static void rank_log(void *user, int level, int rank, const char *line) {
  (void)user;
  (void)level;
  (void)rank;
  if (g_log_plan && g_log_plan->verbose) fprintf(stderr, "    [rank %d] %s\n", g_log_rank, line);
}

/* ---- rows ---------------------------------------------------------------- */

const cf_row *cf_find_row(const cf_results *res, const char *id) {
  for (int i = 0; i < res->n; i++)
    if (!strcmp(res->rows[i].id, id)) return &res->rows[i];
  return NULL;
}

static const char *verdict_word(int v) {
  return v == CF_PASS ? "passed" : v == CF_SKIP ? "skipped" : "failed";
}

/* A rank's skip because the launcher ended the job before it could see the
 * death it was checking (the detail starts as CF_LAUNCHER_TOOK_THE_STORE). */
static int launcher_cut(int verdict, const char *detail) {
  static const char lead[] = "the launcher ended rank 0 (which serves the rendezvous store)";
  return verdict == CF_SKIP && !strncmp(detail, lead, sizeof lead - 1);
}

void cf_add_row(cf_results *res, const char *id, uint64_t slots, int verdict, const char *title,
                const char *detail, int rank) {
  cf_row *row = (cf_row *)cf_find_row(res, id);
  if (!row) {
    if (res->n == res->cap) {
      int cap = res->cap ? res->cap * 2 : 64;
      cf_row *rows = realloc(res->rows, (size_t)cap * sizeof *rows);
      if (!rows) return;
      res->rows = rows;
      res->cap = cap;
    }
    row = &res->rows[res->n++];
    memset(row, 0, sizeof *row);
    snprintf(row->id, sizeof row->id, "%s", id);
    snprintf(row->title, sizeof row->title, "%s", title);
    row->verdict = verdict;
    if (verdict == CF_FAIL && rank >= 0 && *detail)
      snprintf(row->detail, sizeof row->detail, "rank %d: %s", rank, detail);
    else
      snprintf(row->detail, sizeof row->detail, "%s", detail);
    row->slots = slots;
    row->ranks = 1;
    return;
  }
  row->ranks++;
  row->slots |= slots;
  if (verdict == row->verdict || row->verdict == CF_FAIL) return;
  if (verdict == CF_FAIL) {
    row->verdict = CF_FAIL;
    if (rank >= 0)
      snprintf(row->detail, sizeof row->detail, "rank %d: %s", rank, detail);
    else
      snprintf(row->detail, sizeof row->detail, "%s", detail);
    return;
  }
  /* One rank passed, another was cut short by a launcher that ends the
   * whole job when a rank dies (CF_LAUNCHER_TOOK_THE_STORE): the check
   * passed where the launcher let it be observed. */
  if (launcher_cut(verdict, detail) || launcher_cut(row->verdict, row->detail)) {
    if (verdict == CF_PASS) {
      row->verdict = CF_PASS;
      snprintf(row->detail, sizeof row->detail, "%s", detail);
    }
    return;
  }
  /* One rank passed, another skipped: the ranks disagree. */
  char was[400];
  snprintf(was, sizeof was, "%.399s", row->detail);
  int old = row->verdict;
  row->verdict = CF_FAIL;
  snprintf(row->detail, sizeof row->detail, "ranks disagree: rank %d %s (%.400s), another %s%s%s",
           rank, verdict_word(verdict), *detail ? detail : "-", verdict_word(old),
           *was ? ": " : "", was);
}

/* Parse one rank's output (rows and the declared-slots line). */
static void parse_output(cf_results *res, char *buf, int rank) {
  char *save = NULL;
  for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == 'D' && line[1] == '\t') {
      res->declared = strtoull(line + 2, NULL, 16);
      res->have_declared = 1;
      continue;
    }
    if (line[0] != 'R' || line[1] != '\t') continue;
    char *f[6] = {0};
    char *p = line + 2;
    for (int k = 0; k < 6 && p; k++) {
      f[k] = p;
      p = k < 4 ? strchr(p, '\t') : NULL;
      if (p) *p++ = '\0';
    }
    if (!f[4]) continue;
    cf_add_row(res, f[0], strtoull(f[2], NULL, 16), f[1][0], f[3], f[4] ? f[4] : "", rank);
  }
}

static void describe_status(int st, char *buf, size_t cap) {
  if (WIFEXITED(st))
    snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, cap, "ended with status %d", st);
}

#define CF_MAX_RANKS 64

/* ---- scenarios started by a launcher (--launcher) ----------------------- */

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap) break;
    char *b = realloc(buf, 2 * cap + 1);
    if (!b) break;
    buf = b;
    cap *= 2;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

/* Whether a rank's rows file says it finished its scenario function. */
static int finished_rows(const char *text) {
  return text && (!strncmp(text, "E\t", 2) || strstr(text, "\nE\t"));
}

static int is_victim(const cf_scenario *sc, int rank, int world) {
  return sc->dies && rank == world - 1;
}

static void run_launched(const cf_plan *plan, const cf_scenario *sc, cf_results *res) {
  int n = plan->world;
  char id[96], why[1400], dir[] = "/tmp/ddplug-conformance-XXXXXX";
  if (!mkdtemp(dir)) {
    snprintf(id, sizeof id, "%s.start", sc->name);
    snprintf(why, sizeof why, "cannot make a folder for the ranks' rows: %s", strerror(errno));
    cf_add_row(res, id, 0, CF_FAIL, "the scenario starts", why, -1);
    return;
  }
  char *words = strdup(plan->launcher), nstr[16], tstr[16], log[64];
  char *argv[96];
  int argc = 0;
  char *save = NULL;
  for (char *w = words ? strtok_r(words, " \t", &save) : NULL; w && argc < 64;
       w = strtok_r(NULL, " \t", &save))
    argv[argc++] = w;
  snprintf(nstr, sizeof nstr, "%d", n);
  snprintf(tstr, sizeof tstr, "%d", plan->fault_timeout_s);
  const char *tail[] = {"-n", nstr, plan->self, "conformance", "--worker", sc->name, "--rows", dir,
                        "-n", nstr, "-o", plan->options, "-t", tstr};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[argc++] = (char *)tail[i];
  if (plan->verbose) argv[argc++] = "-v";
  if (plan->shared_gpu) argv[argc++] = "--shared-gpu";
  argv[argc++] = (char *)plan->path;
  argv[argc] = NULL;
  snprintf(log, sizeof log, "%s/launcher.log", dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    FILE *f = freopen(log, "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    execvp(argv[0], argv);
    fprintf(stderr, "cannot run the launcher '%s': %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int st = 0, timed_out = 0;
  int limit_s = sc->timeout_s;
  if (sc->needs_group && limit_s < 2 * plan->fault_timeout_s + 30)
    limit_s = 2 * plan->fault_timeout_s + 30;
  if (pid > 0) {
    setpgid(pid, pid);
    double deadline = cf_now() + limit_s;
    int signalled = 0;
    for (;;) {
      if (waitpid(pid, &st, WNOHANG) == pid) break;
      if (cf_now() > deadline && signalled < 2) {
        timed_out = 1;
        kill(-pid, signalled ? SIGKILL : SIGTERM); /* the launcher ends its ranks on TERM */
        signalled++;
        deadline = cf_now() + 5;
      }
      cf_sleep_ms(50);
    }
  }
  size_t loglen = 0;
  char *out = slurp(log, &loglen);
  /* -v: the ranks' log lines went to the launcher's output. */
  if (plan->verbose && out) {
    fprintf(stderr, "    [scenario %s: what the launcher and its ranks printed]\n%s", sc->name, out);
    fflush(stderr);
  }
  /* The launcher's last words, on one line, without its banners. */
  char last[400] = "";
  if (out) {
    size_t w = 0;
    for (const char *p = out + (loglen > 2000 ? loglen - 2000 : 0); *p && w + 1 < sizeof last; p++) {
      char c = *p == '\n' || *p == '\t' ? ' ' : *p;
      if ((c == ' ' || c == '=' || c == '-') && w && (last[w - 1] == ' ' || last[w - 1] == c))
        continue;
      last[w++] = c;
    }
    last[w] = '\0';
    if (w > 300) memmove(last, last + w - 300, 301);
  }
  if (pid < 0 || (WIFEXITED(st) && WEXITSTATUS(st) == 127)) {
    snprintf(id, sizeof id, "%s.start", sc->name);
    snprintf(why, sizeof why, "the launcher did not start: %s", pid < 0 ? strerror(errno) : last);
    cf_add_row(res, id, 0, CF_FAIL, "the scenario starts", why, -1);
  } else {
    if (timed_out) {
      snprintf(id, sizeof id, "%s.deadline", sc->name);
      snprintf(why, sizeof why,
               "scenario %s did not finish within %d s; a call that should have returned (an "
               "abort, a lost peer, a timeout) blocked; the launcher's last output: %s",
               sc->name, limit_s, *last ? last : "(none)");
      cf_add_row(res, id, 0, CF_FAIL, "every rank finishes in time", why, -1);
    }
    for (int r = 0; r < n; r++) {
      char path[128];
      snprintf(path, sizeof path, "%s/rows.%d", dir, r);
      char *rows = slurp(path, NULL);
      int done = finished_rows(rows), reported = rows && strstr(rows, "R\t") != NULL;
      if (rows) parse_output(res, rows, r);
      free(rows);
      unlink(path);
      /* Without a fault-tolerant MPI the launcher ends the whole job when
       * the victim dies: a survivor that reported counts, one it ended
       * before that is skipped with the reason. */
      if (done || is_victim(sc, r, n) || (sc->dies && reported) || timed_out) continue;
      if (sc->dies) {
        snprintf(id, sizeof id, "%s.rank%d", sc->name, r);
        snprintf(why, sizeof why,
                 "the launcher ended rank %d before it reported: it ends the whole job when a "
                 "rank dies (exit status %d); a fault-tolerant MPI (Open MPI 5, mpirun --with-ft "
                 "ulfm) keeps the survivors",
                 r, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        cf_add_row(res, id, 0, CF_SKIP, "survivors of a killed rank report", why, -1);
        continue;
      }
      snprintf(id, sizeof id, "%s.rank%d", sc->name, r);
      snprintf(why, sizeof why,
               "rank %d did not finish (the launcher exited with status %d; its last words: %s)",
               r, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), last);
      cf_add_row(res, id, 0, CF_FAIL, "every rank finishes cleanly", why, -1);
    }
  }
  free(out);
  free(words);
  unlink(log);
  rmdir(dir);
}

int cf_run_worker(const cf_plan *plan, const char *name, const char *rows_dir) {
  const cf_scenario *sc = NULL;
  for (int i = 0; i < cf_scenario_count; i++)
    if (!strcmp(cf_scenarios[i].name, name)) sc = &cf_scenarios[i];
  ddplug_world w = DDPLUG_WORLD_INIT;
  if (!sc) {
    fprintf(stderr, "ddplug conformance --worker: no scenario '%s'\n", name);
    return 2;
  }
  if (ddplug_world_discover(NULL, &w) != DDPLUG_OK || w.world_size < 1) {
    fprintf(stderr, "ddplug conformance --worker: this process's rank: %s\n",
            w.world_size < 1 ? "the launcher did not say the world size" : ddplug_last_error());
    return 1;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/rows.%d", rows_dir, w.rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "ddplug conformance --worker: %s: %s\n", path, strerror(errno));
    return 1;
  }
  cf_rank me = {plan, w.rank, w.world_size, 0, 0, fd};
  g_log_plan = plan;
  g_log_rank = w.rank;
  ddplug_log_set_callback(rank_log, NULL);
  signal(SIGPIPE, SIG_IGN);
  sc->rank_fn(&me);
  if (write(fd, "E\t0\n", 4) != 4) return 1;
  close(fd);
  /* Leave only once every rank that should finish has: a rank that exits
   * early may make the launcher end the others (an MPI finalized by one
   * rank only, or not at all after a failure). */
  double deadline = cf_now() + 15;
  for (int r = 0; r < w.world_size && cf_now() < deadline;) {
    snprintf(path, sizeof path, "%s/rows.%d", rows_dir, r);
    char *rows = r == w.rank || is_victim(sc, r, w.world_size) ? NULL : slurp(path, NULL);
    int ok = r == w.rank || is_victim(sc, r, w.world_size) || finished_rows(rows);
    free(rows);
    if (ok) r++;
    else cf_sleep_ms(20);
  }
  return 0;
}

void cf_run_scenario(const cf_plan *plan, const cf_scenario *sc, cf_results *res) {
  if (plan->launcher && !sc->single) {
    run_launched(plan, sc, res);
    return;
  }
  int n = sc->single ? 1 : plan->world;
  int hold1 = -1, hold2 = -1;
  int port = plan->free_port(1, &hold1), port2 = plan->free_port(1, &hold2);
  if (hold1 >= 0) close(hold1);
  if (hold2 >= 0) close(hold2);
  char id[96], why[512];
  pid_t pids[CF_MAX_RANKS];
  int fds[CF_MAX_RANKS], status[CF_MAX_RANKS], done[CF_MAX_RANKS];
  char *out[CF_MAX_RANKS];
  size_t len[CF_MAX_RANKS], cap[CF_MAX_RANKS];
  if (port < 0 || port2 < 0) {
    snprintf(id, sizeof id, "%s.start", sc->name);
    snprintf(why, sizeof why, "no free TCP port on 127.0.0.1: %s", strerror(errno));
    cf_add_row(res, id, 0, CF_FAIL, "the scenario starts", why, -1);
    return;
  }
  fflush(stdout);
  fflush(stderr);
  int started = 0;
  for (int r = 0; r < n; r++) {
    int p[2];
    if (pipe(p) != 0) break;
    pid_t pid = fork();
    if (pid < 0) {
      close(p[0]);
      close(p[1]);
      break;
    }
    if (pid == 0) {
      close(p[0]);
      for (int k = 0; k < r; k++) close(fds[k]);
      cf_rank me = {plan, r, n, port, port2, p[1]};
      g_log_plan = plan;
      g_log_rank = r;
      ddplug_log_set_callback(rank_log, NULL);
      signal(SIGPIPE, SIG_IGN);
      sc->rank_fn(&me);
      close(p[1]);
      _exit(0);
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
    done[r] = 0;
    status[r] = 0;
    out[r] = NULL;
    len[r] = cap[r] = 0;
    started++;
  }
  if (started < n) {
    snprintf(id, sizeof id, "%s.start", sc->name);
    snprintf(why, sizeof why, "could not start rank %d: %s", started, strerror(errno));
    cf_add_row(res, id, 0, CF_FAIL, "the scenario starts", why, -1);
    for (int r = 0; r < started; r++) kill(pids[r], SIGKILL);
  }
  int limit_s = sc->timeout_s;
  if (sc->needs_group && limit_s < 2 * plan->fault_timeout_s + 30)
    limit_s = 2 * plan->fault_timeout_s + 30;
  double deadline = cf_now() + limit_s;
  int open_fds = started, running = started, timed_out = 0;
  while (open_fds > 0 || running > 0) {
    struct pollfd pfd[CF_MAX_RANKS];
    int map[CF_MAX_RANKS], np = 0;
    for (int r = 0; r < started; r++)
      if (fds[r] >= 0) {
        pfd[np].fd = fds[r];
        pfd[np].events = POLLIN;
        map[np++] = r;
      }
    if (np > 0) poll(pfd, (nfds_t)np, 100);
    else cf_sleep_ms(20);
    for (int k = 0; k < np; k++) {
      if (!(pfd[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = map[k];
      if (len[r] + 4096 + 1 > cap[r]) {
        size_t c = cap[r] ? cap[r] * 2 : 16384;
        char *b = realloc(out[r], c);
        if (!b) continue;
        out[r] = b;
        cap[r] = c;
      }
      ssize_t got = read(fds[r], out[r] + len[r], 4096);
      if (got > 0) {
        len[r] += (size_t)got;
      } else if (got == 0 || errno != EINTR) {
        close(fds[r]);
        fds[r] = -1;
        open_fds--;
      }
    }
    for (int r = 0; r < started; r++) {
      if (done[r]) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = 1;
        status[r] = st;
        running--;
      }
    }
    if (!timed_out && cf_now() > deadline && (running > 0 || open_fds > 0)) {
      timed_out = 1;
      char who[256] = "";
      size_t w = 0;
      for (int r = 0; r < started && w < sizeof who - 8; r++)
        if (!done[r]) w += (size_t)snprintf(who + w, sizeof who - w, "%s%d", w ? ", " : "", r);
      snprintf(id, sizeof id, "%s.deadline", sc->name);
      snprintf(why, sizeof why,
               "the scenario did not finish within %d s (still running: rank %s); a call "
               "that should have returned (an abort, a lost peer, a timeout) blocked",
               limit_s, who);
      cf_add_row(res, id, 0, CF_FAIL, "every rank finishes in time", why, -1);
      for (int r = 0; r < started; r++)
        if (!done[r]) kill(pids[r], SIGKILL);
      deadline = cf_now() + 5; /* collect what they wrote */
    } else if (timed_out && cf_now() > deadline) {
      break;
    }
  }
  for (int r = 0; r < started; r++) {
    if (fds[r] >= 0) close(fds[r]);
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
    }
    if (out[r]) {
      out[r][len[r]] = '\0';
      parse_output(res, out[r], r);
    }
    free(out[r]);
    int st = status[r];
    int expected_death = sc->dies && r == n - 1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    if (!timed_out && !expected_death && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      char how[160];
      describe_status(st, how, sizeof how);
      snprintf(id, sizeof id, "%s.rank%d", sc->name, r);
      snprintf(why, sizeof why, "rank %d %s", r, how);
      cf_add_row(res, id, 0, CF_FAIL, "every rank finishes cleanly", why, -1);
    }
  }
}
