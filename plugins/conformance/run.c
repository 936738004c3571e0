/* run.c — one scenario of `ddplug conformance`: fork its ranks,
 * collect their rows through one pipe per rank, enforce the deadline, merge
 * the rows (a row fails if it failed on any rank), and report a rank that
 * crashed, hung or exited with an error. */
#include <errno.h>
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

void cf_run_scenario(const cf_plan *plan, const cf_scenario *sc, cf_results *res) {
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
