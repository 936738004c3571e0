/* cmd_run.c — `ddplug run`: a small launcher that starts the local ranks of a
 * run with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and a random
 * per-run secret in DDPLUG_SECRET (the config's default secret_env: the
 * rendezvous store then refuses whoever does not know it), forwards Ctrl-C
 * and SIGTERM, and makes sure one failing rank ends the run: the others
 * normally fail by themselves (PEER_LOST through the store); stragglers get
 * SIGTERM after a grace period, then SIGKILL. The ranks die with the
 * launcher, even when it is SIGKILLed (PR_SET_PDEATHSIG). Exit status: 0,
 * or that of the rank that failed first (128 + signal for a killed rank),
 * not a survivor's reaction to it.
 *
 * --max-restarts K: a failed run (not one stopped by Ctrl-C/SIGTERM) is
 * started again, up to K times, with a fresh rendezvous port and
 * DDPLUG_RESTART_COUNT set to the attempt; the program resumes from its
 * last checkpoint (ddplug's sampler state resumes on any world size).
 * --shrink-on-restart starts it with the ranks that were not lost: the
 * ranks killed by a signal (at least one) leave the world, down to
 * --min-nproc.
 *
 * --tolerate-loss (in-place shrink, elastic.on_peer_lost = "shrink"): a rank
 * killed by a signal is lost, not a failure — the survivors re-form the group
 * and go on, and the run's status is theirs; a rank that exits with an error
 * still ends the run as above. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"

#define MAX_LOCAL 1024
#define SECRET_ENV "DDPLUG_SECRET"
/* Which rank failed first is decided this long after the first failure is
 * seen: a killed process's exit becomes visible only after the kernel tore
 * it down (its sockets close first), so a survivor reacting to its closed
 * connection may be reaped a moment before it. */
#define BLAME_WINDOW_S 0.25

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
          "                         to stop by themselves (default 30)\n"
          "      --no-secret        do not hand the ranks a random " SECRET_ENV " (the\n"
          "                         rendezvous store then admits anyone who can\n"
          "                         reach it; not recommended)\n"
          "      --max-restarts K   start a failed run again, up to K times (it\n"
          "                         resumes from its checkpoint; the ranks get\n"
          "                         DDPLUG_RESTART_COUNT); default 0\n"
          "      --shrink-on-restart  restart with the ranks that were not lost (those\n"
          "                         killed by a signal leave; at least one)\n"
          "      --min-nproc M      with --shrink-on-restart: the fewest ranks a\n"
          "                         restart may have (default 1)\n"
          "      --tolerate-loss    a rank killed by a signal is lost, not a failure:\n"
          "                         the others go on (in-place shrink, config\n"
          "                         elastic.on_peer_lost = \"shrink\")\n"
          "The ranks get a random per-run " SECRET_ENV " unless it is set already;\n"
          "with --nnodes > 1 set it to the same value on every machine.\n");
}

/* getopt_long's table; the values above 255 name options without a short
 * form. */
enum { OPT_NNODES = 256, OPT_NODE_RANK, OPT_ADDR, OPT_PORT, OPT_SIM, OPT_GRACE, OPT_NO_SECRET,
       OPT_MAX_RESTARTS, OPT_SHRINK, OPT_MIN_NPROC, OPT_TOLERATE };
static const struct option k_options[] = {
    {"nproc", required_argument, NULL, 'n'},
    {"nnodes", required_argument, NULL, OPT_NNODES},
    {"node-rank", required_argument, NULL, OPT_NODE_RANK},
    {"master-addr", required_argument, NULL, OPT_ADDR},
    {"master-port", required_argument, NULL, OPT_PORT},
    {"simulate-nodes", required_argument, NULL, OPT_SIM},
    {"grace", required_argument, NULL, OPT_GRACE},
    {"no-secret", no_argument, NULL, OPT_NO_SECRET},
    {"max-restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"shrink-on-restart", no_argument, NULL, OPT_SHRINK},
    {"min-nproc", required_argument, NULL, OPT_MIN_NPROC},
    {"tolerate-loss", no_argument, NULL, OPT_TOLERATE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

static const char *option_name(int c) {
  for (const struct option *o = k_options; o->name; o++)
    if (o->val == c) return o->name;
  return "?";
}

static int parse_int(int c, const char *v, int min, int max, int *out) {
  char *end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || errno || x < min || x > max) {
    fprintf(stderr, "ddplug run: --%s needs an integer from %d to %d, got '%s'\n",
            option_name(c), min, max, v ? v : "");
    return -1;
  }
  *out = (int)x;
  return 0;
}

/* 32 random bytes as 64 hex digits. */
static int make_secret(char out[65]) {
  unsigned char b[32];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t r = getrandom(b + got, sizeof b - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  for (size_t i = 0; i < sizeof b; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
  return 0;
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

static int failed(int st) { return !(WIFEXITED(st) && WEXITSTATUS(st) == 0); }

typedef struct launch {
  int nproc, nnodes, node_rank, port, sim_nodes, grace, no_secret;
  int max_restarts, shrink, min_nproc, fixed_port, tolerate;
  const char *addr;
  char **prog;
} launch;

/* In the child, before exec: the torchrun-style environment, and death
 * with the launcher. */
static void child(const launch *l, int lr, pid_t launcher) {
  /* SIGKILL when the launcher dies, whatever kills it. It may have died
   * between fork and prctl: then the parent is someone else already. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(128 + SIGKILL);
  char b[64];
  int rank = l->node_rank * l->nproc + lr;
  snprintf(b, sizeof b, "%d", rank); setenv("RANK", b, 1);
  snprintf(b, sizeof b, "%d", l->nproc * l->nnodes); setenv("WORLD_SIZE", b, 1);
  snprintf(b, sizeof b, "%d", lr); setenv("LOCAL_RANK", b, 1);
  snprintf(b, sizeof b, "%d", l->nproc); setenv("LOCAL_WORLD_SIZE", b, 1);
  snprintf(b, sizeof b, "%d", l->node_rank); setenv("GROUP_RANK", b, 1);
  setenv("MASTER_ADDR", l->addr, 1);
  snprintf(b, sizeof b, "%d", l->port); setenv("MASTER_PORT", b, 1);
  if (l->sim_nodes > 0) {
    int per = (l->nproc + l->sim_nodes - 1) / l->sim_nodes;
    snprintf(b, sizeof b, "simnode%d", lr / per);
    setenv("DDPLUG_HOST_ID", b, 1);
  }
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  execvp(l->prog[0], l->prog);
  fprintf(stderr, "ddplug run: cannot start '%s': %s\n", l->prog[0], strerror(errno));
  _exit(127);
}

static int parse_args(int argc, char **argv, launch *l) {
  memset(l, 0, sizeof *l);
  l->nnodes = 1;
  l->grace = 30;
  l->addr = "127.0.0.1";
  l->min_nproc = 1;
  opterr = 0;
  optind = 0; /* a fresh scan (glibc) */
  int c;
  /* '+': stop at the program's name, so its own options stay its own. */
  while ((c = getopt_long(argc, argv, "+:n:h", k_options, NULL)) != -1) {
    int r = 0;
    switch (c) {
      case 'n': r = parse_int(c, optarg, 1, MAX_LOCAL, &l->nproc); break;
      case OPT_NNODES: r = parse_int(c, optarg, 1, 65536, &l->nnodes); break;
      case OPT_NODE_RANK: r = parse_int(c, optarg, 0, 65535, &l->node_rank); break;
      case OPT_PORT: r = parse_int(c, optarg, 1, 65535, &l->port); break;
      case OPT_SIM: r = parse_int(c, optarg, 1, MAX_LOCAL, &l->sim_nodes); break;
      case OPT_GRACE: r = parse_int(c, optarg, 0, 86400, &l->grace); break;
      case OPT_ADDR: l->addr = optarg; break;
      case OPT_NO_SECRET: l->no_secret = 1; break;
      case OPT_MAX_RESTARTS: r = parse_int(c, optarg, 0, 1000000, &l->max_restarts); break;
      case OPT_SHRINK: l->shrink = 1; break;
      case OPT_TOLERATE: l->tolerate = 1; break;
      case OPT_MIN_NPROC: r = parse_int(c, optarg, 1, MAX_LOCAL, &l->min_nproc); break;
      case 'h': usage(stdout); return 0;
      case ':':
        fprintf(stderr, "ddplug run: %s needs a value\n", argv[optind - 1]);
        usage(stderr);
        return 2;
      default:
        fprintf(stderr, "ddplug run: unknown option '%s'\n", argv[optind - 1]);
        usage(stderr);
        return 2;
    }
    if (r < 0) return 2;
  }
  if (l->nproc == 0 || optind >= argc) {
    usage(stderr);
    return 2;
  }
  l->prog = argv + optind;
  if (l->node_rank >= l->nnodes) {
    fprintf(stderr, "ddplug run: --node-rank %d is not below --nnodes %d\n", l->node_rank,
            l->nnodes);
    return 2;
  }
  if (l->nnodes > 1 && l->port == 0) {
    fprintf(stderr, "ddplug run: with --nnodes > 1 every machine needs the same "
                    "--master-port (and --master-addr of node 0)\n");
    return 2;
  }
  if (l->shrink && l->nnodes > 1) {
    fprintf(stderr, "ddplug run: --shrink-on-restart works on one machine (--nnodes 1): "
                    "every machine's launcher would shrink on its own\n");
    return 2;
  }
  if (l->min_nproc > l->nproc) {
    fprintf(stderr, "ddplug run: --min-nproc %d is more than -n %d\n", l->min_nproc, l->nproc);
    return 2;
  }
  if (l->sim_nodes > l->nproc) {
    fprintf(stderr, "ddplug run: --simulate-nodes %d is more than -n %d\n", l->sim_nodes,
            l->nproc);
    return 2;
  }
  return -1; /* go on */
}

static int launch_ranks(const launch *lp, int *lost);

int ddplug_cmd_run(int argc, char **argv) {
  launch l;
  int rc = parse_args(argc, argv, &l);
  if (rc >= 0) return rc;
  const char *have = getenv(SECRET_ENV);
  if (l.no_secret) {
    unsetenv(SECRET_ENV);
  } else if (!have || !*have) {
    if (l.nnodes > 1) {
      fprintf(stderr, "ddplug run: with --nnodes > 1 every machine needs the same "
                      "secret: set " SECRET_ENV " to the same random value on each "
                      "(e.g. " SECRET_ENV "=$(openssl rand -hex 32)), or pass "
                      "--no-secret to run without one\n");
      return 2;
    }
    char secret[65];
    if (make_secret(secret) != 0) {
      fprintf(stderr, "ddplug run: cannot read random bytes for the run's secret: %s\n",
              strerror(errno));
      return 1;
    }
    setenv(SECRET_ENV, secret, 1); /* the ranks inherit it */
  }
  l.fixed_port = l.port != 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  for (int attempt = 0;; attempt++) {
    char b[32];
    snprintf(b, sizeof b, "%d", attempt);
    setenv("DDPLUG_RESTART_COUNT", b, 1);
    if (!l.fixed_port && (l.port = ddplug_cmd_free_port(0, NULL)) < 0) {
      fprintf(stderr, "ddplug run: cannot find a free port: %s\n", strerror(errno));
      return 1;
    }
    int lost = 0;
    rc = launch_ranks(&l, &lost);
    if (rc == 0 || g_signal || attempt >= l.max_restarts) return rc;
    int next = l.shrink ? l.nproc - (lost > 0 ? lost : 1) : l.nproc;
    if (next < l.min_nproc) {
      fprintf(stderr, "ddplug run: %d rank%s lost; %d would remain, fewer than --min-nproc "
              "%d: not restarting\n", lost, lost == 1 ? "" : "s", next, l.min_nproc);
      return rc;
    }
    fprintf(stderr, "ddplug run: restarting the run (restart %d of %d) with %d rank%s%s\n",
            attempt + 1, l.max_restarts, next, next == 1 ? "" : "s",
            next != l.nproc ? " (the lost ones left)" : "");
    l.nproc = next;
  }
}

/* Start the ranks and wait for them (see the file's doc). *lost: ranks
 * killed by a signal. Returns the run's exit status. */
static int launch_ranks(const launch *lp, int *lost) {
  launch l = *lp;
  int nproc = l.nproc;
  pid_t pids[MAX_LOCAL];
  int pidfd[MAX_LOCAL], status[MAX_LOCAL], done[MAX_LOCAL];
  fflush(stdout);
  fflush(stderr);
  pid_t self = getpid();
  for (int lr = 0; lr < nproc; lr++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "ddplug run: fork: %s\n", strerror(errno));
      for (int k = 0; k < lr; k++) kill(pids[k], SIGTERM);
      return 1;
    }
    if (pid == 0) child(&l, lr, self);
    pids[lr] = pid;
    done[lr] = 0;
    /* A descriptor that becomes readable the moment the rank exits: the
     * launcher sees deaths in the order they happen, not in the order a
     * periodic waitpid happens to return them. */
    pidfd[lr] = (int)syscall(SYS_pidfd_open, pid, 0);
  }
  int remaining = nproc, first_fail = -1, forwarded = 0, termed = 0;
  int failures[MAX_LOCAL], nfailures = 0;
  double fail_at = 0;
  while (remaining > 0) {
    if (g_signal && !forwarded) {
      for (int lr = 0; lr < nproc; lr++)
        if (!done[lr]) kill(pids[lr], g_signal);
      forwarded = 1;
      if (fail_at == 0) fail_at = now_s();
    }
    struct pollfd pfd[MAX_LOCAL];
    int idx[MAX_LOCAL], n = 0, all_fds = 1;
    for (int lr = 0; lr < nproc; lr++) {
      if (done[lr]) continue;
      if (pidfd[lr] < 0) all_fds = 0;
      else {
        idx[n] = lr;
        pfd[n++] = (struct pollfd){pidfd[lr], POLLIN, 0};
      }
    }
    int r = poll(pfd, (nfds_t)n, all_fds && fail_at == 0 ? 100 : 5);
    /* Reap every rank that has exited now. Among those that ended in the
     * same instant, a rank killed by a signal failed first: the others
     * reacted to it. */
    int batch[MAX_LOCAL], nb = 0;
    for (int lr = 0; lr < nproc; lr++) {
      if (done[lr]) continue;
      int ready = pidfd[lr] < 0;
      for (int i = 0; i < n && r > 0 && !ready; i++)
        if (idx[i] == lr && pfd[i].revents) ready = 1;
      if (!ready) continue;
      int st;
      if (waitpid(pids[lr], &st, WNOHANG) != pids[lr]) continue;
      done[lr] = 1;
      status[lr] = st;
      remaining--;
      if (pidfd[lr] >= 0) close(pidfd[lr]);
      pidfd[lr] = -1;
      if (l.tolerate && WIFSIGNALED(st) && !forwarded) {
        fprintf(stderr, "ddplug run: rank %d (pid %d) was lost (signal %d, %s); the others go on "
                "(--tolerate-loss)\n", l.node_rank * nproc + lr, (int)pids[lr], WTERMSIG(st),
                strsignal(WTERMSIG(st)));
        status[lr] = 0; /* lost, not failed: the survivors' status is the run's */
        continue;
      }
      if (failed(st)) batch[nb++] = lr;
    }
    for (int i = 0; i < nb; i++) failures[nfailures++] = batch[i];
    if (nfailures > 0 && fail_at == 0) fail_at = now_s();
    /* The first failure: among those seen within BLAME_WINDOW_S of the
     * first one, a rank killed by a signal (the others reacted to it), else
     * the first seen. After a forwarded signal: the first to go. */
    if (first_fail < 0 && nfailures > 0 &&
        (forwarded || remaining == 0 || now_s() - fail_at >= BLAME_WINDOW_S)) {
      first_fail = failures[0];
      for (int i = 0; i < nfailures && !forwarded; i++)
        if (WIFSIGNALED(status[failures[i]])) {
          first_fail = failures[i];
          break;
        }
      if (!forwarded) {
        char why[128];
        describe(status[first_fail], why, sizeof why);
        fprintf(stderr, "ddplug run: rank %d (pid %d) %s first; waiting up to %d s for "
                "the others to stop\n", l.node_rank * nproc + first_fail,
                (int)pids[first_fail], why, l.grace);
      }
    }
    if (fail_at > 0 && !termed && now_s() - fail_at > l.grace) {
      for (int lr = 0; lr < nproc; lr++)
        if (!done[lr]) kill(pids[lr], SIGTERM);
      termed = 1;
    } else if (termed && now_s() - fail_at > l.grace + 5.0) {
      for (int lr = 0; lr < nproc; lr++)
        if (!done[lr]) kill(pids[lr], SIGKILL);
    }
  }
  if (first_fail < 0) return 0;
  *lost = 0;
  for (int lr = 0; lr < nproc; lr++)
    if (WIFSIGNALED(status[lr]) && WTERMSIG(status[lr]) != SIGTERM) (*lost)++;
  for (int lr = 0; lr < nproc; lr++) {
    char why[128];
    describe(status[lr], why, sizeof why);
    fprintf(stderr, "ddplug run:   rank %d %s%s\n", l.node_rank * nproc + lr, why,
            lr == first_fail ? " (first)" : "");
  }
  int st = status[first_fail];
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
