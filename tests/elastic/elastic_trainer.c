/* elastic_trainer.c — ddplug-elastic-trainer: a minimal data-parallel
 * trainer for the elastic tests and the soak (tests/python/test_elastic.py),
 * launched by `ddplug run`. One epoch of ddplug's distributed sampler, one
 * allreduce per step, a commit after it; what it trains is written to record
 * files the test reads (the test's own count, independent of the audit):
 *
 *   <dir>/rec-a<attempt>-p<identity>.txt, one line per event:
 *     resumed <steps>          loaded the checkpoint (epoch steps committed)
 *     drawn <step> <idx>...    drew the batch of epoch step <step>
 *     commit <step>            committed it (its allreduce completed)
 *     adopted <step>           committed on its behalf at a re-formation
 *     lost <committed>         learned of a lost rank having committed that many
 *     done <padded> <summary>  finished the epoch; the sampler's declared padding
 *
 * The environment says what to do: ELASTIC_DIR, ELASTIC_N (samples),
 * ELASTIC_B (batch), ELASTIC_VICTIM (the rank that dies, at open),
 * ELASTIC_STEP (at which epoch step, in the first attempt only),
 * ELASTIC_KILL ("barrier": after a barrier of that step; "inside": with its
 * allreduce in flight), ELASTIC_MODE ("inplace": the config shrinks and the
 * survivors go on; "restart": rank 0 checkpoints the sampler state after
 * every step to <dir>/state.json, and a failed rank exits so that the
 * launcher restarts the run). DDPLUG_RESTART_COUNT is the attempt.
 * SPDX-License-Identifier: Apache-2.0 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddplug/ddplug.h"

#define MAXB 64

static FILE *rec;

static int die(const char *what, int st) {
  fprintf(stderr, "ddplug-elastic-trainer: %s: %s (%s)\n", what, ddplug_last_error(),
          ddplug_status_name(st));
  if (rec) fclose(rec);
  exit(3);
}

#define TRY(what, expr)                  \
  do {                                   \
    int st_ = (expr);                    \
    if (st_ != DDPLUG_OK) die(what, st_); \
  } while (0)

static long env_int(const char *name, long fallback) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : fallback;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

static void checkpoint(const char *dir, ddplug_sampler *s) {
  char *state = NULL;
  TRY("saving the sampler state", ddplug_sampler_state_save(s, &state));
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/state.json.tmp", dir);
  snprintf(path, sizeof path, "%s/state.json", dir);
  FILE *f = fopen(tmp, "w");
  if (!f || fputs(state, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "ddplug-elastic-trainer: cannot write %s\n", path);
    exit(3);
  }
  ddplug_free(state);
}

int main(void) {
  const char *dir = getenv("ELASTIC_DIR");
  if (!dir) {
    fprintf(stderr, "ddplug-elastic-trainer: set ELASTIC_DIR (see the file's doc)\n");
    return 2;
  }
  uint64_t n_samples = (uint64_t)env_int("ELASTIC_N", 301), B = (uint64_t)env_int("ELASTIC_B", 4);
  int victim = (int)env_int("ELASTIC_VICTIM", -1), kill_step = (int)env_int("ELASTIC_STEP", -1);
  int attempt = (int)env_int("DDPLUG_RESTART_COUNT", 0);
  const char *kill_how = getenv("ELASTIC_KILL") ? getenv("ELASTIC_KILL") : "barrier";
  int inplace = getenv("ELASTIC_MODE") && !strcmp(getenv("ELASTIC_MODE"), "inplace");
  if (B > MAXB) B = MAXB;

  ddplug_context *ctx = NULL;
  TRY("ddplug_open", ddplug_open(NULL, NULL, &ctx));
  ddplug_membership m = DDPLUG_MEMBERSHIP_INIT;
  TRY("membership", ddplug_context_membership(ctx, &m));
  char path[4096];
  snprintf(path, sizeof path, "%s/rec-a%d-p%d.txt", dir, attempt, (int)m.identity);
  rec = fopen(path, "w");
  if (!rec) {
    fprintf(stderr, "ddplug-elastic-trainer: cannot write %s\n", path);
    return 3;
  }
  setvbuf(rec, NULL, _IOLBF, 0);

  ddplug_sampler_options o = DDPLUG_SAMPLER_OPTIONS_INIT;
  o.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  o.num_samples = n_samples;
  o.shuffle = 1;
  o.seed = 17;
  o.batch_size = B;
  ddplug_sampler *s = NULL;
  TRY("sampler", ddplug_context_sampler_new(ctx, &o, &s));
  ddplug_audit *a = NULL;
  TRY("audit", ddplug_audit_begin(ctx, "train", n_samples, 0, NULL, &a));
  long step = 0;
  if (!inplace && attempt > 0) {
    snprintf(path, sizeof path, "%s/state.json", dir);
    char *state = read_file(path);
    if (state) {
      TRY("loading the checkpoint", ddplug_sampler_state_load(s, state));
      const char *at = strstr(state, "\"steps\":");
      step = at ? strtol(at + 8, NULL, 10) : 0;
      fprintf(rec, "resumed %ld\n", step);
      free(state);
    }
  }
  TRY("set_epoch", ddplug_sampler_set_epoch(s, 0));
  double param = 0;
  int lost = 0;
  long committed = step;
  int64_t batch[MAXB];
  uint64_t n = 0;
  for (;; step++) {
    TRY("next_batch", ddplug_sampler_next_batch(s, batch, MAXB, &n));
    if (n == 0) break;
    fprintf(rec, "drawn %ld", step);
    for (uint64_t k = 0; k < n; k++) fprintf(rec, " %lld", (long long)batch[k]);
    fprintf(rec, "\n");
    for (;;) {
      double grad = 0, sum = 0;
      for (uint64_t k = 0; k < n; k++) grad += (double)batch[k];
      int st = DDPLUG_OK;
      if (attempt == 0 && !lost && step == kill_step) {
        if (!strcmp(kill_how, "barrier")) st = ddplug_barrier(ctx, DDPLUG_TIMEOUT_DEFAULT);
        if (m.identity == victim) {
          if (strcmp(kill_how, "barrier") != 0) {
            ddplug_request *req = NULL;
            TRY("iallreduce", ddplug_iallreduce(ctx, &grad, &sum, 1, DDPLUG_FLOAT64,
                                                DDPLUG_OP_SUM, NULL, &req));
          }
          fclose(rec);
          raise(SIGKILL);
        }
      }
      if (st == DDPLUG_OK)
        st = ddplug_allreduce(ctx, &grad, &sum, 1, DDPLUG_FLOAT64, DDPLUG_OP_SUM, NULL);
      if (st == DDPLUG_OK) {
        param += sum;
        TRY("commit", ddplug_sampler_commit(s, 1));
        fprintf(rec, "commit %ld\n", step);
        committed = step + 1;
        if (!inplace && m.rank == 0) checkpoint(dir, s);
        break;
      }
      if (!inplace || st != DDPLUG_E_PEER_LOST) die("allreduce", st);
      if (!lost) fprintf(rec, "lost %ld\n", committed);
      lost = 1;
      TRY("shrink", ddplug_shrink(ctx, DDPLUG_TIMEOUT_DEFAULT, &m));
      uint64_t adopted = 0;
      TRY("reform", ddplug_sampler_reform(s, DDPLUG_TIMEOUT_DEFAULT, &adopted));
      /* a survivor behind takes the parameters of one that completed */
      int32_t mine = (int32_t)adopted, all[1024];
      TRY("allgather", ddplug_allgather(ctx, &mine, all, 1, DDPLUG_INT32, NULL));
      int src = 0;
      while (src < m.world_size && all[src]) src++;
      TRY("broadcast", ddplug_broadcast(ctx, &param, &param, 1, DDPLUG_FLOAT64, src, NULL));
      if (adopted) {
        fprintf(rec, "adopted %ld\n", step);
        committed = step + 1;
        break;
      }
    }
  }
  ddplug_audit_report rep = DDPLUG_AUDIT_REPORT_INIT;
  int st = ddplug_audit_finish(a, &rep, DDPLUG_TIMEOUT_DEFAULT);
  double lo = param, hi = param;
  TRY("min", ddplug_allreduce(ctx, &lo, &lo, 1, DDPLUG_FLOAT64, DDPLUG_OP_MIN, NULL));
  TRY("max", ddplug_allreduce(ctx, &hi, &hi, 1, DDPLUG_FLOAT64, DDPLUG_OP_MAX, NULL));
  ddplug_sampler_info info = DDPLUG_SAMPLER_INFO_INIT;
  TRY("info", ddplug_sampler_info_get(s, &info));
  fprintf(rec, "done %llu %s %s\n", (unsigned long long)info.padded,
          lo == hi ? "replicas-identical" : "replicas-differ", rep.summary);
  ddplug_audit_free(a);
  ddplug_sampler_free(s);
  fclose(rec);
  rec = NULL;
  if (st != DDPLUG_OK) die("audit", st);
  TRY("close", ddplug_close(ctx));
  return 0;
}
