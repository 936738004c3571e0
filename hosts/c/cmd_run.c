/* cmd_run.c — `ddplug run`: a small launcher that starts the local ranks of a
 * run with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), forwards Ctrl-C,
 * and makes sure one failing rank ends the run: the others normally fail by
 * themselves (PEER_LOST through the store); stragglers get SIGTERM after a
 * grace period, then SIGKILL. Exit status: 0, or the first failing rank's. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"

#define MAX_LOCAL 1024

static volatile sig_atomic_t g_signal;
static void on_signal(int sig) { g_signal = sig; }

static void usage(FILE *f) {
  fprintf(f,
          "usage: ddplug run -n N [options] -- PROGRAM [ARGS...]\n"
          "  -n, --nproc N          processes (ranks) on this machine\n"
          "      --nnodes M         machines in the run (default 1)\n"
          "      --node-rank K      this machine's index (default 0)\n"
          "      --master-addr A    rank 0's host (default 127.0.0.1)\n"
          "      --master-port P    rendezvous port (default: a free port; required\n"
          "                         with --nnodes > 1)\n"
          "      --simulate-nodes S split the local ranks into S simulated nodes\n"
          "                         (sets DDPLUG_HOST_ID; for testing)\n"
          "      --grace SEC        after a rank fails, how long the others may take\n"
          "                         to stop by themselves (default 30)\n");
}

static int parse_int(const char *opt, const char *v, int min, int max, int *out) {
  char *end;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || *end || x < min || x > max) {
    fprintf(stderr, "ddplug run: %s needs an integer from %d to %d, got '%s'\n", opt, min,
            max, v ? v : "");
    return -1;
  }
  *out = (int)x;
  return 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void describe(int st, char *buf, size_t cap) {
  if (WIFEXITED(st)) snprintf(buf, cap, "exited with %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else snprintf(buf, cap, "ended with status %d", st);
}

int ddplug_cmd_run(int argc, char **argv) {
  int nproc = 0, nnodes = 1, node_rank = 0, port = 0, sim_nodes = 0, grace = 30;
  const char *addr = "127.0.0.1";
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--")) { i++; break; }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
    int r = 0;
    if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) r = parse_int(a, v, 1, MAX_LOCAL, &nproc);
    else if (!strcmp(a, "--nnodes")) r = parse_int(a, v, 1, 65536, &nnodes);
    else if (!strcmp(a, "--node-rank")) r = parse_int(a, v, 0, 65535, &node_rank);
    else if (!strcmp(a, "--master-port")) r = parse_int(a, v, 1, 65535, &port);
    else if (!strcmp(a, "--simulate-nodes")) r = parse_int(a, v, 1, MAX_LOCAL, &sim_nodes);
    else if (!strcmp(a, "--grace")) r = parse_int(a, v, 0, 86400, &grace);
    else if (!strcmp(a, "--master-addr")) { if (!v) r = -1; else addr = v; }
    else if (a[0] != '-') break; /* the program, without "--" */
    else {
      fprintf(stderr, "ddplug run: unknown option '%s'\n", a);
      usage(stderr);
      return 2;
    }
    if (r < 0) return 2;
    i++;
  }
  if (nproc == 0 || i >= argc) {
    usage(stderr);
    return 2;
  }
  if (node_rank >= nnodes) {
    fprintf(stderr, "ddplug run: --node-rank %d is not below --nnodes %d\n", node_rank, nnodes);
    return 2;
  }
  if (nnodes > 1 && port == 0) {
    fprintf(stderr, "ddplug run: with --nnodes > 1 every machine needs the same "
                    "--master-port (and --master-addr of node 0)\n");
    return 2;
  }
  if (sim_nodes > nproc) {
    fprintf(stderr, "ddplug run: --simulate-nodes %d is more than -n %d\n", sim_nodes, nproc);
    return 2;
  }
  if (port == 0 && (port = free_port()) < 0) {
    fprintf(stderr, "ddplug run: cannot find a free port: %s\n", strerror(errno));
    return 1;
  }
  char **prog = argv + i;
  int world = nproc * nnodes;
  pid_t pids[MAX_LOCAL];
  int status[MAX_LOCAL], done[MAX_LOCAL];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  for (int lr = 0; lr < nproc; lr++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "ddplug run: fork: %s\n", strerror(errno));
      for (int k = 0; k < lr; k++) kill(pids[k], SIGTERM);
      return 1;
    }
    if (pid == 0) {
      char b[64];
      int rank = node_rank * nproc + lr;
      snprintf(b, sizeof b, "%d", rank); setenv("RANK", b, 1);
      snprintf(b, sizeof b, "%d", world); setenv("WORLD_SIZE", b, 1);
      snprintf(b, sizeof b, "%d", lr); setenv("LOCAL_RANK", b, 1);
      snprintf(b, sizeof b, "%d", nproc); setenv("LOCAL_WORLD_SIZE", b, 1);
      snprintf(b, sizeof b, "%d", node_rank); setenv("GROUP_RANK", b, 1);
      setenv("MASTER_ADDR", addr, 1);
      snprintf(b, sizeof b, "%d", port); setenv("MASTER_PORT", b, 1);
      if (sim_nodes > 0) {
        int per = (nproc + sim_nodes - 1) / sim_nodes;
        snprintf(b, sizeof b, "simnode%d", lr / per);
        setenv("DDPLUG_HOST_ID", b, 1);
      }
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      execvp(prog[0], prog);
      fprintf(stderr, "ddplug run: cannot start '%s': %s\n", prog[0], strerror(errno));
      _exit(127);
    }
    pids[lr] = pid;
    done[lr] = 0;
  }
  int remaining = nproc, first_fail = -1, forwarded = 0, termed = 0;
  double fail_at = 0;
  while (remaining > 0) {
    if (g_signal && !forwarded) {
      for (int lr = 0; lr < nproc; lr++)
        if (!done[lr]) kill(pids[lr], g_signal);
      forwarded = 1;
      if (fail_at == 0) fail_at = now_s();
    }
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int lr = 0; lr < nproc; lr++)
        if (pids[lr] == p) {
          done[lr] = 1;
          status[lr] = st;
          remaining--;
          if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && first_fail < 0) {
            first_fail = lr;
            fail_at = now_s();
            char why[128];
            describe(st, why, sizeof why);
            fprintf(stderr, "ddplug run: rank %d (pid %d) %s; waiting up to %d s for the "
                    "others to stop\n", node_rank * nproc + lr, (int)p, why, grace);
          }
        }
      continue;
    }
    if (fail_at > 0 && !termed && now_s() - fail_at > grace) {
      for (int lr = 0; lr < nproc; lr++)
        if (!done[lr]) kill(pids[lr], SIGTERM);
      termed = 1;
    } else if (termed && now_s() - fail_at > grace + 5.0) {
      for (int lr = 0; lr < nproc; lr++)
        if (!done[lr]) kill(pids[lr], SIGKILL);
    }
    usleep(20000);
  }
  if (first_fail < 0) return 0;
  for (int lr = 0; lr < nproc; lr++) {
    char why[128];
    describe(status[lr], why, sizeof why);
    fprintf(stderr, "ddplug run:   rank %d %s\n", node_rank * nproc + lr, why);
  }
  int st = status[first_fail];
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
