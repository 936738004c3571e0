/* elastic_perf.c — ddplug-elastic-perf: what losing a rank costs.
 *
 * In place (elastic.on_peer_lost = "shrink", the cpu plugin, one machine):
 * W ranks train "steps" — draw a batch from ddplug's sampler, spin for the
 * compute time (-c), allreduce a gradient of -s bytes, commit — and the last
 * rank SIGKILLs itself while its allreduce of step -k is in flight. Each
 * survivor records when it saw the loss (PEER_LOST), when the group was
 * re-formed (ddplug_shrink) and the sampler re-dealt (ddplug_sampler_reform),
 * and when its next step completed; the table gives the times from the kill
 * (the slowest survivor's), and the step rate before the loss and after.
 *
 * Restart: W fresh processes (fork + exec of this program) open a run; the
 * table gives the time from the fork to every rank's ddplug_open returning
 * (process start + rendezvous), and separately the checkpoint load: the
 * sampler state of an epoch half done (its digest is checked: O(samples))
 * plus reading a model checkpoint file of -s bytes.
 *
 * Usage: ddplug-elastic-perf [-n 2,3,4] [-s 4M] [-c 2000] [-k 20] [-i 60]
 *                            [-N 1000000] [--json]
 * Times are printed, never checked (the smoke test only runs it).
 * SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "ddplug/ddplug.h"

#define MAXW 64

typedef struct shared {
  double t_kill;
  double t_lost[MAXW], t_shrunk[MAXW], t_reformed[MAXW], t_next[MAXW];
  double t_first[MAXW], t_before[MAXW], t_end[MAXW];
  int steps_before[MAXW], steps_after[MAXW], failed[MAXW];
  char error[MAXW][256];
  double t_open[MAXW], t_state[MAXW], t_model[MAXW];
} shared;

typedef struct opts {
  int worlds[8], nworlds;
  uint64_t bytes, samples;
  int compute_us, kill_step, steps, json;
} opts;

static void spin_us(int us) {
  double end = bench_now_s() + us * 1e-6;
  while (bench_now_s() < end) {
  }
}

static void fail(shared *sh, int rank, const char *what, int st) {
  snprintf(sh->error[rank], sizeof sh->error[rank], "%s: %s: %s", what, ddplug_status_name(st),
           ddplug_last_error());
  sh->failed[rank] = 1;
  _exit(1);
}

#define TRY(sh, rank, expr)               \
  do {                                    \
    int st_ = (expr);                     \
    if (st_ != DDPLUG_OK) fail(sh, rank, #expr, st_); \
  } while (0)

static void in_place_rank(const opts *o, shared *sh, int rank, int world) {
  ddplug_context *ctx = NULL;
  TRY(sh, rank, ddplug_open(NULL, NULL, &ctx));
  ddplug_sampler_options so = DDPLUG_SAMPLER_OPTIONS_INIT;
  so.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  so.num_samples = o->samples;
  so.shuffle = 1;
  so.batch_size = 32;
  ddplug_sampler *s = NULL;
  TRY(sh, rank, ddplug_context_sampler_new(ctx, &so, &s));
  TRY(sh, rank, ddplug_sampler_set_epoch(s, 0));
  uint64_t count = o->bytes / 4;
  float *grad = calloc(count ? count : 1, sizeof *grad);
  int64_t batch[32];
  uint64_t n;
  int lost = 0, after = 0;
  for (int step = 0; step < o->steps; step++) {
    TRY(sh, rank, ddplug_sampler_next_batch(s, batch, 32, &n));
    if (n == 0) break;
    if (step == 2) sh->t_first[rank] = bench_now_s();
    for (;;) {
      spin_us(o->compute_us);
      for (uint64_t i = 0; i < count; i += 1024) grad[i] = (float)rank;
      int st;
      if (!lost && step == o->kill_step && rank == world - 1) {
        ddplug_request *req = NULL;
        TRY(sh, rank, ddplug_iallreduce(ctx, grad, grad, count, DDPLUG_FLOAT32, DDPLUG_OP_AVG,
                                        NULL, &req));
        sh->t_kill = bench_now_s();
        raise(SIGKILL);
      }
      st = ddplug_allreduce(ctx, grad, grad, count, DDPLUG_FLOAT32, DDPLUG_OP_AVG, NULL);
      if (st == DDPLUG_OK) {
        TRY(sh, rank, ddplug_sampler_commit(s, 1));
        break;
      }
      if (st != DDPLUG_E_PEER_LOST) fail(sh, rank, "allreduce", st);
      lost = 1;
      sh->t_lost[rank] = bench_now_s();
      sh->t_before[rank] = sh->t_lost[rank];
      sh->steps_before[rank] = step - 2;
      TRY(sh, rank, ddplug_shrink(ctx, 60000, NULL));
      sh->t_shrunk[rank] = bench_now_s();
      uint64_t adopted = 0;
      TRY(sh, rank, ddplug_sampler_reform(s, 60000, &adopted));
      sh->t_reformed[rank] = bench_now_s();
      if (adopted) break;
    }
    if (lost && !sh->t_next[rank]) sh->t_next[rank] = bench_now_s();
    else if (lost) after++;
  }
  sh->t_end[rank] = bench_now_s();
  sh->steps_after[rank] = after;
  ddplug_sampler_free(s);
  free(grad);
  TRY(sh, rank, ddplug_close(ctx));
}

static void set_world_env(int rank, int world, int port) {
  char b[32];
  snprintf(b, sizeof b, "%d", rank);
  setenv("RANK", b, 1);
  setenv("LOCAL_RANK", b, 1);
  snprintf(b, sizeof b, "%d", world);
  setenv("WORLD_SIZE", b, 1);
  setenv("LOCAL_WORLD_SIZE", b, 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(b, sizeof b, "%d", port);
  setenv("MASTER_PORT", b, 1);
}

static double worst(const double *t, int world, int skip) {
  double w = 0;
  for (int r = 0; r < world; r++)
    if (r != skip && t[r] > w) w = t[r];
  return w;
}

static int run_in_place(const opts *o, int world, shared *sh) {
  memset(sh, 0, sizeof *sh);
  int port = bench_free_port();
  setenv("DDPLUG_CONFIG",
         "{\"plugin\": \"cpu\", \"elastic\": {\"on_peer_lost\": \"shrink\"}, "
         "\"data_split\": {\"audit\": \"off\"}, \"log_level\": \"error\"}",
         1);
  pid_t pids[MAXW];
  for (int r = 0; r < world; r++) {
    fflush(stdout);
    pids[r] = fork();
    if (pids[r] == 0) {
      set_world_env(r, world, port);
      in_place_rank(o, sh, r, world);
      _exit(0);
    }
  }
  int bad = 0;
  for (int r = 0; r < world; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (r == world - 1) continue; /* the victim */
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "ddplug-elastic-perf: %d ranks: rank %d failed: %s\n", world, r,
              sh->error[r][0] ? sh->error[r] : "(killed)");
      bad = 1;
    }
  }
  return bad;
}

/* ---- restart ----------------------------------------------------------------- */

static int restart_rank(const char *model_path, uint64_t samples, shared *sh, int rank) {
  double t0 = bench_now_s();
  ddplug_context *ctx = NULL;
  TRY(sh, rank, ddplug_open(NULL, NULL, &ctx));
  sh->t_open[rank] = bench_now_s();
  /* the sampler state of an epoch half done, on another world size */
  ddplug_sampler_options so = DDPLUG_SAMPLER_OPTIONS_INIT;
  so.kind = DDPLUG_SAMPLER_DISTRIBUTED;
  so.num_samples = samples;
  so.shuffle = 1;
  so.batch_size = 32;
  so.world_size = 2;
  ddplug_sampler *old = NULL;
  TRY(sh, rank, ddplug_sampler_new(&so, &old));
  int64_t batch[32];
  uint64_t n;
  for (uint64_t k = 0; k < samples / 64 / 2; k++) {
    TRY(sh, rank, ddplug_sampler_next_batch(old, batch, 32, &n));
    TRY(sh, rank, ddplug_sampler_commit(old, 1));
  }
  char *state = NULL;
  TRY(sh, rank, ddplug_sampler_state_save(old, &state));
  ddplug_sampler_free(old);
  so.world_size = 0;
  ddplug_sampler *s = NULL;
  TRY(sh, rank, ddplug_context_sampler_new(ctx, &so, &s));
  double t1 = bench_now_s();
  TRY(sh, rank, ddplug_sampler_state_load(s, state));
  sh->t_state[rank] = bench_now_s() - t1;
  ddplug_free(state);
  t1 = bench_now_s();
  int fd = open(model_path, O_RDONLY);
  char buf[1 << 16];
  while (fd >= 0 && read(fd, buf, sizeof buf) > 0) {
  }
  if (fd >= 0) close(fd);
  sh->t_model[rank] = bench_now_s() - t1;
  (void)t0;
  ddplug_sampler_free(s);
  TRY(sh, rank, ddplug_close(ctx));
  return 0;
}

static int run_restart(const char *self, const opts *o, int world, shared *sh, double *t_open) {
  memset(sh, 0, sizeof *sh);
  char model[] = "/tmp/ddplug-elastic-perf-XXXXXX";
  int fd = mkstemp(model);
  if (fd < 0) return 1;
  char zeros[1 << 16];
  memset(zeros, 0, sizeof zeros);
  for (uint64_t w = 0; w < o->bytes; w += sizeof zeros)
    if (write(fd, zeros, sizeof zeros) < 0) break;
  close(fd);
  int port = bench_free_port();
  setenv("DDPLUG_CONFIG", "{\"plugin\": \"cpu\", \"log_level\": \"error\"}", 1);
  char shm_fd_text[32], samples_text[32];
  int memfd = memfd_create("ddplug-elastic-perf", 0);
  if (memfd < 0 || ftruncate(memfd, sizeof *sh) != 0) return 1;
  shared *remote = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  memset(remote, 0, sizeof *remote);
  snprintf(shm_fd_text, sizeof shm_fd_text, "%d", memfd);
  snprintf(samples_text, sizeof samples_text, "%llu", (unsigned long long)o->samples);
  double t0 = bench_now_s();
  pid_t pids[MAXW];
  for (int r = 0; r < world; r++) {
    fflush(stdout);
    pids[r] = fork();
    if (pids[r] == 0) {
      set_world_env(r, world, port);
      execl(self, self, "--restart-rank", shm_fd_text, model, samples_text, (char *)NULL);
      _exit(127);
    }
  }
  int bad = 0;
  for (int r = 0; r < world; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "ddplug-elastic-perf: restart on %d ranks: rank %d failed: %s\n", world,
              r, remote->error[r]);
      bad = 1;
    }
  }
  *sh = *remote;
  *t_open = worst(sh->t_open, world, -1) - t0;
  munmap(remote, sizeof *remote);
  close(memfd);
  unlink(model);
  return bad;
}

static int parse_list(const char *s, opts *o) {
  o->nworlds = 0;
  while (*s && o->nworlds < 8) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 2 || v > MAXW) return -1;
    o->worlds[o->nworlds++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return o->nworlds ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "--restart-rank")) {
    int memfd = atoi(argv[2]);
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    int rank = atoi(getenv("RANK"));
    return restart_rank(argv[3], strtoull(argv[4], NULL, 10), sh, rank);
  }
  opts o = {{2, 3, 4}, 3, 4u << 20, 1000000, 2000, 20, 60, 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "--json")) {
      o.json = 1;
      continue;
    }
    if (!v) bad = 1;
    else if (!strcmp(a, "-n")) bad = parse_list(v, &o);
    else if (!strcmp(a, "-s")) bad = bench_parse_size(v, &o.bytes);
    else if (!strcmp(a, "-c")) o.compute_us = atoi(v);
    else if (!strcmp(a, "-k")) o.kill_step = atoi(v);
    else if (!strcmp(a, "-i")) o.steps = atoi(v);
    else if (!strcmp(a, "-N")) o.samples = strtoull(v, NULL, 10);
    else bad = 1;
    if (bad || o.kill_step < 3 || o.steps <= o.kill_step + 2) {
      fprintf(stderr,
              "usage: ddplug-elastic-perf [-n 2,3,4] [-s BYTES] [-c COMPUTE_US] [-k KILL_STEP "
              ">= 3] [-i STEPS > KILL_STEP + 2] [-N SAMPLES] [--json]\n");
      return 2;
    }
    i++;
  }
  shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  int failed = 0;
  if (!o.json)
    printf("# in place: SIGKILL of the last rank inside its allreduce of step %d; %llu-byte "
           "gradient, %d us compute per step\n"
           "# %5s %10s %10s %10s %12s %14s %13s\n",
           o.kill_step, (unsigned long long)o.bytes, o.compute_us, "ranks", "lost_ms",
           "shrunk_ms", "redealt_ms", "next_step_ms", "steps/s_before", "steps/s_after");
  else
    printf("{\"in_place\": [");
  for (int w = 0; w < o.nworlds; w++) {
    int world = o.worlds[w], victim = world - 1;
    if (run_in_place(&o, world, sh)) {
      failed = 1;
      continue;
    }
    double k = sh->t_kill;
    double lost = (worst(sh->t_lost, world, victim) - k) * 1e3;
    double shrunk = (worst(sh->t_shrunk, world, victim) - k) * 1e3;
    double redealt = (worst(sh->t_reformed, world, victim) - k) * 1e3;
    double next = (worst(sh->t_next, world, victim) - k) * 1e3;
    double before = sh->steps_before[0] / (sh->t_before[0] - sh->t_first[0]);
    double after = sh->steps_after[0] / (sh->t_end[0] - sh->t_next[0]);
    if (o.json)
      printf("%s{\"ranks\": %d, \"bytes\": %llu, \"lost_ms\": %.3f, \"shrunk_ms\": %.3f, "
             "\"redealt_ms\": %.3f, \"next_step_ms\": %.3f, \"steps_per_s_before\": %.2f, "
             "\"steps_per_s_after\": %.2f}",
             w ? ", " : "", world, (unsigned long long)o.bytes, lost, shrunk, redealt, next,
             before, after);
    else
      printf("  %5d %10.2f %10.2f %10.2f %12.2f %14.1f %13.1f\n", world, lost, shrunk, redealt,
             next, before, after);
  }
  if (!o.json)
    printf("# restart: process start + ddplug_open, then the checkpoint load (sampler state "
           "of %llu samples half committed, digest checked; a %llu-byte model file)\n"
           "# %5s %16s %14s %14s\n",
           (unsigned long long)o.samples, (unsigned long long)o.bytes, "ranks", "start_open_ms",
           "state_load_ms", "model_read_ms");
  else
    printf("], \"restart\": [");
  for (int w = 0; w < o.nworlds; w++) {
    int world = o.worlds[w];
    double t_open = 0;
    if (run_restart(argv[0], &o, world, sh, &t_open)) {
      failed = 1;
      continue;
    }
    double state = worst(sh->t_state, world, -1) * 1e3, model = worst(sh->t_model, world, -1) * 1e3;
    if (o.json)
      printf("%s{\"ranks\": %d, \"start_open_ms\": %.3f, \"state_load_ms\": %.3f, "
             "\"model_read_ms\": %.3f}",
             w ? ", " : "", world, t_open * 1e3, state, model);
    else
      printf("  %5d %16.2f %14.2f %14.2f\n", world, t_open * 1e3, state, model);
  }
  if (o.json) printf("]}\n");
  return failed;
}
