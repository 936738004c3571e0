/* fault_rank.c — one rank of a fault-injection run (tests/faults/faults.py
 * launches these and injects the faults). It joins the run (config from
 * DDPLUG_CONFIG, the world from the launcher's variables), then runs
 * allreduces until it has done COUNT of them (0: until one fails), then
 * closes. Every event goes to stdout as one line, flushed at once, stamped
 * with CLOCK_MONOTONIC nanoseconds (one clock for every process of the
 * machine, so the orchestrator can time detection):
 *   ready <t> <rank> <pid>              ddplug_open succeeded
 *   open-error <t> <STATUS> <sentence>  ddplug_open failed
 *   error <t> <STATUS> <sentence>       a collective failed
 *   done <t>                            COUNT collectives done
 *   closed <t> <STATUS>                 ddplug_close returned
 * Exit status: 0 after a clean run, 1 after a failure.
 * usage: fault-rank COUNT ELEMS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddplug/ddplug.h"

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* One line per event; the sentence on one line. */
static void event(const char *what, int status, const char *msg) {
  char clean[4096];
  snprintf(clean, sizeof clean, "%s", msg ? msg : "");
  for (char *p = clean; *p; p++)
    if (*p == '\n') *p = ' ';
  printf("%s %lld %s %s\n", what, now_ns(), ddplug_status_name(status), clean);
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fault-rank COUNT ELEMS\n");
    return 2;
  }
  long count = atol(argv[1]);
  size_t elems = (size_t)atol(argv[2]);
  ddplug_context *ctx = NULL;
  int s = ddplug_open(NULL, NULL, &ctx);
  if (s != DDPLUG_OK) {
    event("open-error", s, ddplug_last_error());
    return 1;
  }
  ddplug_world w = DDPLUG_WORLD_INIT;
  ddplug_context_world(ctx, &w);
  printf("ready %lld %d %d\n", now_ns(), w.rank, (int)getpid());
  fflush(stdout);
  float *buf = calloc(elems ? elems : 1, sizeof *buf);
  for (long i = 0; s == DDPLUG_OK && (count == 0 || i < count); i++) {
    for (size_t j = 0; j < elems; j++) buf[j] = (float)w.rank;
    s = ddplug_allreduce(ctx, buf, buf, elems, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL);
    if (s != DDPLUG_OK) event("error", s, ddplug_last_error());
  }
  if (s == DDPLUG_OK) {
    printf("done %lld\n", now_ns());
    fflush(stdout);
  }
  free(buf);
  int c = ddplug_close(ctx);
  event("closed", c, c == DDPLUG_OK ? "" : ddplug_last_error());
  return s == DDPLUG_OK && c == DDPLUG_OK ? 0 : 1;
}
