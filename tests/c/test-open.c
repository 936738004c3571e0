/* test-open.c — ddplug_open/ddplug_close in real multi-process runs (forked
 * ranks, the real store over TCP, the example plugin): ranks agree and
 * close; locality from host identity; every startup check failing on every
 * rank with the difference named; missing ranks reported by rank 0; a rank
 * killed (PEER_LOST naming it), rank 0 killed, abort from one rank, a
 * collective timeout and a mismatched collective. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ddplug/store.h"
#include "store-testlib.h"

#define EXAMPLE_CONFIG "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 20}}"

static void use_config(const char *json) { setenv("DDPLUG_CONFIG", json, 1); }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static ddplug_context *open_ok(void) {
  ddplug_context *ctx = NULL;
  CHECK_OK(ddplug_open(NULL, NULL, &ctx));
  CHECK(ctx != NULL);
  return ctx;
}

/* Block until another rank aborts the run (the status it ended the run
 * with is returned; after it, every call on ctx fails with its reason).
 * ddplug_split_agree on a stream the other ranks never agree on waits on
 * the store and, like every runtime wait, ends when the run is aborted;
 * its timeout is only a hang guard. */
static int wait_until_the_run_ends(ddplug_context *ctx) {
  int s = ddplug_split_agree(ctx, "test-waits-for-the-end", 45000);
  CHECK_MSG(s != DDPLUG_OK && !strstr(ddplug_last_error(), "did not call it within"),
            "the run did not end: %s: %s", ddplug_status_name(s), ddplug_last_error());
  return s;
}

/* A flag the forked ranks of a case share (MAP_SHARED, made before they
 * fork). */
static _Atomic int *shared_flag(void) {
  void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED);
  return p;
}

static void wait_for_flag(_Atomic int *flag, const char *what) {
  for (int i = 0; !atomic_load(flag); i++) {
    CHECK_MSG(i < 45000, "%s never happened", what);
    usleep(1000);
  }
}

/* ---- success ----------------------------------------------------------- */

static void rank_agree(int rank, int world, void *arg) {
  (void)arg;
  use_config(EXAMPLE_CONFIG);
  ddplug_context *ctx = open_ok();
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug_context_world(ctx, &w));
  CHECK_EQ_INT(w.rank, rank);
  CHECK_EQ_INT(w.world_size, world);
  CHECK_EQ_INT(w.local_rank, rank);
  CHECK_EQ_INT(w.local_world_size, world);
  CHECK_EQ_INT(ddplug_context_num_nodes(ctx), 1);
  CHECK_EQ_STR(w.source, "torchrun");
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  CHECK_OK(ddplug_context_plugin(ctx, &info));
  CHECK_EQ_STR(info.name, "example");

  int64_t v[3] = {rank, 10 * rank, 1}, out[3];
  CHECK_OK(ddplug_allreduce(ctx, v, out, 3, DDPLUG_INT64, DDPLUG_OP_SUM, NULL));
  CHECK_EQ_INT(out[0], world * (world - 1) / 2);
  CHECK_EQ_INT(out[1], 10 * world * (world - 1) / 2);
  CHECK_EQ_INT(out[2], world);
  double d[2] = {rank, -rank}, dmax[2];
  CHECK_OK(ddplug_allreduce(ctx, d, dmax, 2, DDPLUG_FLOAT64, DDPLUG_OP_MAX, NULL));
  CHECK(dmax[0] == world - 1 && dmax[1] == 0);
  float avg = (float)rank;
  CHECK_OK(ddplug_allreduce(ctx, &avg, &avg, 1, DDPLUG_FLOAT32, DDPLUG_OP_AVG, NULL));
  CHECK(avg == (float)(world - 1) / 2.0f);
  int32_t b = rank == 2 ? 42 : -1;
  CHECK_OK(ddplug_broadcast(ctx, &b, &b, 1, DDPLUG_INT32, 2, NULL));
  CHECK_EQ_INT(b, 42);
  int32_t mine = 100 + rank, all[8];
  CHECK_OK(ddplug_allgather(ctx, &mine, all, 1, DDPLUG_INT32, NULL));
  for (int r = 0; r < world; r++) CHECK_EQ_INT(all[r], 100 + r);
  ddplug_request *req = NULL;
  uint8_t flags = (uint8_t)(1u << rank), ored;
  CHECK_OK(ddplug_iallreduce(ctx, &flags, &ored, 1, DDPLUG_UINT8, DDPLUG_OP_BOR, NULL, &req));
  CHECK(ddplug_request_seq(req) > 0);
  CHECK_OK(ddplug_request_wait(req, DDPLUG_TIMEOUT_DEFAULT));
  ddplug_request_free(req);
  CHECK_EQ_INT(ored, (1 << world) - 1);
  CHECK_OK(ddplug_barrier(ctx, 10000));
  CHECK_OK(ddplug_close(ctx));
}

TEST(four_ranks_open_agree_and_close) {
  CHECK_EQ_INT(dt_run_ranks(4, rank_agree, NULL, NULL, 60, NULL), 0);
}

static void rank_two_nodes(int rank, int world, void *arg) {
  (void)arg;
  (void)world;
  use_config(EXAMPLE_CONFIG);
  /* ranks 0, 2 on node "a"; ranks 1, 3 on node "b" */
  setenv("DDPLUG_HOST_ID", rank % 2 ? "b" : "a", 1);
  ddplug_context *ctx = open_ok();
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug_context_world(ctx, &w));
  CHECK_EQ_INT(ddplug_context_num_nodes(ctx), 2);
  CHECK_EQ_INT(w.node_rank, rank % 2);
  CHECK_EQ_INT(w.local_rank, rank / 2);
  CHECK_EQ_INT(w.local_world_size, 2);
  CHECK_OK(ddplug_close(ctx));
}

TEST(locality_comes_from_host_identity) {
  CHECK_EQ_INT(dt_run_ranks(4, rank_two_nodes, NULL, NULL, 60, NULL), 0);
}

TEST(single_process_without_any_environment) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  use_config("{\"plugin\": \"example\"}");
  ddplug_context *ctx = open_ok();
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug_context_world(ctx, &w));
  CHECK_EQ_INT(w.world_size, 1);
  CHECK_EQ_STR(w.source, "single");
  int32_t x = 7;
  CHECK_OK(ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL));
  CHECK_EQ_INT(x, 7);
  CHECK(ddplug_context_store(ctx) != NULL);
  CHECK(ddplug_context_config(ctx) != NULL);
  CHECK_OK(ddplug_close(ctx));
}

TEST(older_table_plugin_runs_through_the_runtime) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  use_config("{\"plugin\": \"oldtable\"}");
  ddplug_context *ctx = open_ok();
  double x[2] = {1.5, 2.5}, y[2];
  CHECK_OK(ddplug_allreduce(ctx, x, y, 2, DDPLUG_FLOAT64, DDPLUG_OP_SUM, NULL));
  CHECK(y[0] == 1.5 && y[1] == 2.5);
  CHECK_OK(ddplug_close(ctx));
}

/* The config's log_level applies when neither DDPLUG_LOG nor
 * ddplug_log_set_level() says otherwise; every line carries the rank. */
static int g_debug_lines, g_unprefixed;
static void count_lines(void *user, int level, int rank, const char *line) {
  (void)user;
  (void)line;
  if (level == DDPLUG_LOG_DEBUG && rank == 0) g_debug_lines++;
  if (rank != 0 && rank != -1) g_unprefixed++;
}

TEST(config_log_level_applies) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("DDPLUG_LOG");
  CHECK_OK(ddplug_log_set_callback(count_lines, NULL));
  use_config("{\"plugin\": \"example\", \"log_level\": \"debug\"}");
  ddplug_context *ctx = open_ok();
  CHECK_OK(ddplug_close(ctx));
  CHECK_MSG(g_debug_lines > 0, "no debug line reached the callback");
  CHECK_EQ_INT(g_unprefixed, 0);
  g_debug_lines = 0;
  use_config("{\"plugin\": \"example\", \"log_level\": \"warn\"}");
  ctx = open_ok();
  CHECK_OK(ddplug_close(ctx));
  CHECK_EQ_INT(g_debug_lines, 0);
  CHECK_OK(ddplug_log_set_callback(NULL, NULL));
}

/* rendezvous.external: the store is served elsewhere (here by a process of
 * its own) and every rank, rank 0 included, connects to it. The server runs
 * in a forked child, not in a thread of this process: the ranks are forked
 * from here, and a fork taken while another thread holds a lock (malloc's,
 * ASan's) can leave the child waiting for it forever. */
static void rank_external(int rank, int world, void *arg) {
  char cfg[256];
  snprintf(cfg, sizeof cfg,
           "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 20, "
           "\"external\": true, \"addr\": \"127.0.0.1\", \"port\": %d}}",
           *(const int *)arg);
  use_config(cfg);
  setenv("MASTER_PORT", "1", 1); /* the config's port wins */
  ddplug_context *ctx = open_ok();
  int64_t v = rank + 1, sum = 0;
  CHECK_OK(ddplug_allreduce(ctx, &v, &sum, 1, DDPLUG_INT64, DDPLUG_OP_SUM, NULL));
  CHECK_EQ_INT(sum, world * (world + 1) / 2);
  CHECK_OK(ddplug_close(ctx));
}

TEST(an_external_store_serves_the_run) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t server = fork();
  CHECK(server >= 0);
  if (server == 0) { /* the external store: serve until killed */
    close(fds[0]);
    ddplug_store_server *srv = NULL;
    int port = ddplug_store_serve("127.0.0.1", 0, NULL, &srv) == DDPLUG_OK
                   ? ddplug_store_server_port(srv)
                   : -1;
    if (write(fds[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(1);
    for (;;) pause();
  }
  close(fds[1]);
  int port = -1;
  CHECK(read(fds[0], &port, sizeof port) == (ssize_t)sizeof port && port > 0);
  close(fds[0]);
  CHECK_EQ_INT(dt_run_ranks(3, rank_external, &port, NULL, 60, NULL), 0);
  /* The run's keys are in the external store (rank 0 served nothing). */
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", port, NULL, 5000, &st));
  void *val = NULL;
  uint64_t len = 0;
  CHECK_OK(ddplug_store_get(st, "ddplug/verdict", 0, &val, &len));
  CHECK_CONTAINS((const char *)val, "\"ok\":true");
  ddplug_free(val);
  ddplug_store_close(st);
  kill(server, SIGKILL);
  CHECK(waitpid(server, NULL, 0) == server);
}

/* ---- a loaded rank 0: the store answers late ---------------------------- */

/* A store whose answers to reads come late: what a rank sees when rank 0's
 * store thread waits for a CPU on a loaded machine. A forked child serves a
 * real store and, in front of it, a proxy on another port that passes every
 * byte through, except that it holds back one GET per client connection
 * (and what that connection sends after it) for three times the client's
 * reply grace, so a read that waits for its answer only that grace fails
 * every time, and one bounded by its caller's deadline never does. It holds
 * the first GET of every connection when started armed, or the next one
 * after the parent writes a byte to its control pipe. */
#define LATE_HOLD_MS (3 * DDPLUG__STORE_REPLY_GRACE_MS)
#define LATE_MAX_CONNS 16

typedef struct late_conn {
  int client, server; /* -1 when closed */
  int hold_next;      /* hold this connection's next GET */
  double release_at;  /* the held frame at the head goes then (0: none) */
  uint8_t buf[1 << 17];
  size_t len;         /* client bytes not yet passed on */
} late_conn;

static int late_write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void late_close(late_conn *c) {
  if (c->client >= 0) close(c->client);
  if (c->server >= 0) close(c->server);
  c->client = c->server = -1;
}

/* Pass on the complete frames at the head of c's buffer, holding a GET. */
static void late_pump(late_conn *c, double now) {
  for (;;) {
    if (c->len < 4) return;
    size_t flen = 4 + ((size_t)c->buf[0] << 24 | (size_t)c->buf[1] << 16 |
                       (size_t)c->buf[2] << 8 | c->buf[3]);
    if (c->len < flen || flen < DDPLUG__STORE_HDR_LEN) return;
    if (c->release_at > 0 && now < c->release_at) return;
    if (c->release_at == 0 && c->hold_next && c->buf[5] == DDPLUG__STORE_GET) {
      c->hold_next = 0;
      c->release_at = now + LATE_HOLD_MS / 1000.0;
      return;
    }
    c->release_at = 0;
    if (late_write_all(c->server, c->buf, flen) != 0) {
      late_close(c);
      return;
    }
    memmove(c->buf, c->buf + flen, c->len - flen);
    c->len -= flen;
  }
}

static int late_listen(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &al) != 0)
    return -1;
  *port = ntohs(a.sin_port);
  return fd;
}

static int late_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* The child: serve, proxy, never return. */
static void late_store_main(int report, int control, int armed) {
  ddplug_store_server *srv = NULL;
  int lport = -1;
  int store_port = ddplug_store_serve("127.0.0.1", 0, NULL, &srv) == DDPLUG_OK
                       ? ddplug_store_server_port(srv)
                       : -1;
  int lfd = store_port > 0 ? late_listen(&lport) : -1;
  if (write(report, &lport, sizeof lport) != (ssize_t)sizeof lport || lfd < 0) _exit(1);
  static late_conn conns[LATE_MAX_CONNS];
  int n = 0;
  for (;;) {
    struct pollfd p[2 + 2 * LATE_MAX_CONNS];
    int np = 0, timeout = -1;
    double now = st_now_s();
    p[np++] = (struct pollfd){lfd, POLLIN, 0};
    p[np++] = (struct pollfd){control, POLLIN, 0};
    for (int i = 0; i < n; i++) {
      p[np++] = (struct pollfd){conns[i].client, POLLIN, 0};
      p[np++] = (struct pollfd){conns[i].server, POLLIN, 0};
      if (conns[i].release_at > 0) {
        int ms = (int)((conns[i].release_at - now) * 1000.0) + 1;
        timeout = timeout < 0 || ms < timeout ? (ms > 0 ? ms : 0) : timeout;
      }
    }
    if (poll(p, (nfds_t)np, timeout) < 0 && errno != EINTR) _exit(2);
    now = st_now_s();
    if (p[0].revents & POLLIN) {
      int cfd = accept(lfd, NULL, NULL);
      int sfd = cfd >= 0 ? late_connect(store_port) : -1;
      if (sfd < 0 || n == LATE_MAX_CONNS) _exit(3);
      int one = 1;
      setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      conns[n++] = (late_conn){.client = cfd, .server = sfd, .hold_next = armed};
    }
    if (p[1].revents & (POLLIN | POLLHUP)) {
      char b;
      if (read(control, &b, 1) != 1) _exit(0); /* the parent is done */
      armed = 1;
      for (int i = 0; i < n; i++) conns[i].hold_next = 1;
    }
    for (int i = 0; i < n; i++) {
      late_conn *c = &conns[i];
      if (c->client < 0) continue;
      if (p[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t r = read(c->client, c->buf + c->len, sizeof c->buf - c->len);
        if (r <= 0) {
          late_close(c);
          continue;
        }
        c->len += (size_t)r;
      }
      if (p[3 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) {
        uint8_t b[1 << 16];
        ssize_t r = read(c->server, b, sizeof b);
        if (r <= 0 || late_write_all(c->client, b, (size_t)r) != 0) {
          late_close(c);
          continue;
        }
      }
      late_pump(c, now);
    }
  }
}

/* Start the late store; *control arms it (write a byte) or stops it
 * (close). Returns the child's pid and the proxy's port in *port. */
static pid_t late_store_start(int armed, int *port, int *control) {
  int up[2], down[2];
  CHECK(pipe(up) == 0 && pipe(down) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    late_store_main(up[1], down[0], armed);
  }
  close(up[1]);
  close(down[0]);
  CHECK(read(up[0], port, sizeof *port) == (ssize_t)sizeof *port && *port > 0);
  close(up[0]);
  *control = down[1];
  return pid;
}

static ddplug_context *open_through(int port) {
  char cfg[256];
  snprintf(cfg, sizeof cfg,
           "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 60, "
           "\"external\": true, \"addr\": \"127.0.0.1\", \"port\": %d}, "
           "\"timeouts\": {\"collective_s\": 60}}",
           port);
  use_config(cfg);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  return open_ok();
}

/* An allreduce and a broadcast through the example plugin, which reads
 * every rank's contribution with the host services' store_get. */
static void collectives_work(ddplug_context *ctx) {
  int64_t v = 41, sum = 0;
  CHECK_OK(ddplug_allreduce(ctx, &v, &sum, 1, DDPLUG_INT64, DDPLUG_OP_SUM, NULL));
  CHECK_EQ_INT(sum, 41);
  CHECK_OK(ddplug_broadcast(ctx, &v, &sum, 1, DDPLUG_INT64, 0, NULL));
  CHECK_EQ_INT(sum, 41);
}

static void late_store_stop(pid_t pid, int control) {
  close(control);
  st_join_child(pid, 10000, "the late store");
}

TEST(a_store_that_answers_reads_late_does_not_fail_the_open) {
  int port = 0, control = -1;
  pid_t pid = late_store_start(1, &port, &control);
  ddplug_context *ctx = open_through(port);
  collectives_work(ctx);
  CHECK_OK(ddplug_close(ctx));
  late_store_stop(pid, control);
}

TEST(a_store_that_answers_reads_late_does_not_fail_a_collective) {
  int port = 0, control = -1;
  pid_t pid = late_store_start(0, &port, &control);
  ddplug_context *ctx = open_through(port);
  CHECK(write(control, "a", 1) == 1);
  collectives_work(ctx);
  CHECK_OK(ddplug_close(ctx));
  late_store_stop(pid, control);
}

/* ---- startup checks ---------------------------------------------------- */

typedef struct expect {
  int status;
  const char *text[3];
} expect;

static void check_failure(const expect *e) {
  ddplug_context *ctx = (ddplug_context *)0x1;
  int s = ddplug_open(NULL, NULL, &ctx);
  CHECK_MSG(s == e->status, "ddplug_open returned %s, expected %s: %s", ddplug_status_name(s),
            ddplug_status_name(e->status), ddplug_last_error());
  CHECK(ctx == (ddplug_context *)0x1); /* untouched on failure */
  for (int i = 0; i < 3 && e->text[i]; i++) CHECK_CONTAINS(ddplug_last_error(), e->text[i]);
}

static void rank_config_differs(int rank, int world, void *arg) {
  (void)world;
  use_config(rank == 2 ? "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 20}, "
                         "\"sampler\": {\"seed\": 7}}"
                       : EXAMPLE_CONFIG);
  check_failure(arg);
}

TEST(a_different_config_fails_on_every_rank_naming_it) {
  expect e = {DDPLUG_E_MISMATCH,
              {"the config differs across ranks", "first difference 'sampler.seed': 0 vs 7",
               "ranks 0, 1, 3"}};
  CHECK_EQ_INT(dt_run_ranks(4, rank_config_differs, &e, NULL, 60, NULL), 0);
}

static void rank_world_differs(int rank, int world, void *arg) {
  (void)world;
  use_config(EXAMPLE_CONFIG);
  if (rank == 3) setenv("WORLD_SIZE", "5", 1);
  check_failure(arg);
}

TEST(a_different_world_size_fails_on_every_rank) {
  expect e = {DDPLUG_E_MISMATCH, {"world size differs", "rank 3 has 5", NULL}};
  expect e3 = {DDPLUG_E_MISMATCH, {"world size", NULL, NULL}};
  (void)e3;
  CHECK_EQ_INT(dt_run_ranks(4, rank_world_differs, &e, NULL, 60, NULL), 0);
}

static void rank_zero_world_larger(int rank, int world, void *arg) {
  (void)world;
  use_config(EXAMPLE_CONFIG);
  if (rank == 0) setenv("WORLD_SIZE", "5", 1);
  check_failure(arg);
}

/* Rank 0 waits for ranks 0..4 and rank 4 never comes: the others must name
 * the mismatch (not leave rank 0 to report "rank 4 never joined"). */
TEST(a_larger_world_size_on_rank_zero_fails_on_every_rank) {
  expect e = {DDPLUG_E_MISMATCH, {"world size differs", "rank 0 has 5", "has 4"}};
  CHECK_EQ_INT(dt_run_ranks(4, rank_zero_world_larger, &e, NULL, 60, NULL), 0);
}

static void rank_plugin_version_differs(int rank, int world, void *arg) {
  (void)world;
  use_config(EXAMPLE_CONFIG);
  if (rank == 3) {
    char path[4096];
    snprintf(path, sizeof path, "%s/lib/test-plugins-alt", dt_build_dir());
    setenv("DDPLUG_PLUGIN_PATH", path, 1);
  }
  check_failure(arg);
}

TEST(a_different_plugin_version_fails_on_every_rank) {
  expect e = {DDPLUG_E_MISMATCH,
              {"the plugin version differs across ranks", "ranks 0-2: 0.2.0",
               "rank 3: 0.0.9-test"}};
  CHECK_EQ_INT(dt_run_ranks(4, rank_plugin_version_differs, &e, NULL, 60, NULL), 0);
}

static void rank_plugin_differs(int rank, int world, void *arg) {
  (void)world;
  const expect *e = arg;
  use_config(EXAMPLE_CONFIG);
  ddplug_open_options opts = DDPLUG_OPEN_OPTIONS_INIT;
  if (rank == 3) opts.plugin = "oldtable"; /* same config, another plugin */
  ddplug_context *ctx = (ddplug_context *)0x1;
  int s = ddplug_open(NULL, &opts, &ctx);
  CHECK_MSG(s == e->status, "ddplug_open returned %s: %s", ddplug_status_name(s),
            ddplug_last_error());
  CHECK(ctx == (ddplug_context *)0x1);
  for (int i = 0; i < 3 && e->text[i]; i++) CHECK_CONTAINS(ddplug_last_error(), e->text[i]);
}

TEST(a_different_plugin_fails_on_every_rank) {
  expect e = {DDPLUG_E_MISMATCH,
              {"the plugin differs across ranks", "ranks 0-2: example", "rank 3: oldtable"}};
  CHECK_EQ_INT(dt_run_ranks(4, rank_plugin_differs, &e, NULL, 60, NULL), 0);
}

static void rank_duplicate(int rank, int world, void *arg) {
  (void)world;
  use_config(EXAMPLE_CONFIG);
  if (rank == 2) setenv("RANK", "1", 1);
  check_failure(arg);
}

TEST(a_rank_started_twice_fails_the_run) {
  expect e = {DDPLUG_E_CONFIG, {"rank 1 was started twice", "every process needs its own rank",
                                NULL}};
  CHECK_EQ_INT(dt_run_ranks(3, rank_duplicate, &e, NULL, 60, NULL), 0);
}

static void rank_missing(int rank, int world, void *arg) {
  (void)world;
  if (rank >= 2) return; /* never started */
  /* 5 s: rank 1 must join within it on a loaded machine too */
  use_config("{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 5}}");
  check_failure(arg);
}

TEST_T(rank_zero_reports_ranks_that_never_joined, 60) {
  expect e = {DDPLUG_E_TIMEOUT,
              /* after how long is measured, and longer on a loaded machine */
              {"ranks 2, 3 never joined after ", "(2 of 4 processes joined): started 2 of 4 "
                                                   "processes?",
               NULL}};
  CHECK_EQ_INT(dt_run_ranks(4, rank_missing, &e, NULL, 60, NULL), 0);
}

/* Rank 0 starts 4 s after the others (a slow node, a loaded machine): its
 * deadline, when it reports the missing ranks, is 4 s later than theirs,
 * past their own deadline plus the grace (2 s). They wait for its verdict
 * as long as its checks said they may take, and report the missing ranks
 * too, not "rank 0 did not finish the startup checks". */
static void rank_zero_late_missing(int rank, int world, void *arg) {
  (void)world;
  if (rank >= 2) return; /* never started */
  if (rank == 0) usleep(4000 * 1000);
  /* 6 s: rank 1 reaches rank 0's store 4 s in, within its own deadline */
  use_config("{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 6}}");
  check_failure(arg);
}

TEST_T(a_rank_that_began_before_rank_zero_waits_for_its_verdict, 60) {
  expect e = {DDPLUG_E_TIMEOUT, {"ranks 2, 3 never joined after ", NULL}};
  CHECK_EQ_INT(dt_run_ranks(4, rank_zero_late_missing, &e, NULL, 60, NULL), 0);
}

/* "At once": the rendezvous timeout is ten minutes, so a rank that waited
 * it out instead of being told would trip the case's hang guard. */
#define LONG_RENDEZVOUS "{\"plugin\": \"example\", \"rendezvous\": {\"timeout_s\": 600}}"

static void rank_plugin_missing(int rank, int world, void *arg) {
  (void)world;
  use_config(LONG_RENDEZVOUS);
  if (rank == 1) {
    ddplug_open_options o = DDPLUG_OPEN_OPTIONS_INIT;
    o.plugin = "nosuchplugin";
    ddplug_context *ctx = NULL;
    CHECK_STATUS(ddplug_open(NULL, &o, &ctx), DDPLUG_E_NOT_FOUND);
    CHECK_CONTAINS(ddplug_last_error(), "plugin 'nosuchplugin' not found; searched:");
    return;
  }
  check_failure(arg);
}

TEST(a_rank_whose_plugin_is_missing_fails_everyone_at_once) {
  expect e = {DDPLUG_E_NOT_FOUND, {"rank 1 failed to open: plugin 'nosuchplugin' not found", NULL,
                                   NULL}};
  CHECK_EQ_INT(dt_run_ranks(3, rank_plugin_missing, &e, NULL, 60, NULL), 0);
}

static void rank_secret(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config(EXAMPLE_CONFIG);
  setenv("DDPLUG_SECRET", "s3cret", 1);
  (void)rank;
  ddplug_context *ctx = open_ok();
  CHECK_OK(ddplug_barrier(ctx, 10000));
  CHECK_OK(ddplug_close(ctx));
}

TEST(shared_secret) {
  CHECK_EQ_INT(dt_run_ranks(3, rank_secret, NULL, NULL, 60, NULL), 0);
}

/* ---- failures during the run --------------------------------------------- */

static void rank_killed(int rank, int world, void *arg) {
  (void)world;
  int victim = *(int *)arg;
  use_config(EXAMPLE_CONFIG);
  ddplug_context *ctx = open_ok();
  int32_t x = 1;
  double t0 = now_s();
  int s = DDPLUG_OK;
  /* The victim dies after its third collective; a survivor may notice in
   * that collective already or in a later one. */
  for (int i = 0; i < 1000 && s == DDPLUG_OK; i++) {
    s = ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_MAX, NULL);
    if (i == 2 && rank == victim) raise(SIGKILL);
  }
  CHECK_STATUS(s, DDPLUG_E_PEER_LOST);
  char want[64];
  snprintf(want, sizeof want, "rank %d", victim);
  CHECK_CONTAINS(ddplug_last_error(), want);
  dt_note("rank %d saw the loss after %.3f s: %s", rank, now_s() - t0, ddplug_last_error());
  /* Later calls say the same; close reports it and frees everything. */
  CHECK_STATUS(ddplug_barrier(ctx, 1000), DDPLUG_E_PEER_LOST);
  CHECK_STATUS(ddplug_close(ctx), DDPLUG_E_PEER_LOST);
}

TEST(a_killed_rank_is_named_on_every_survivor) {
  int victim = 2, st[4];
  dt_run_ranks(4, rank_killed, &victim, NULL, 60, st);
  for (int r = 0; r < 4; r++)
    if (r != victim) CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d failed", r);
}

TEST(losing_rank_zero_and_its_store_is_reported) {
  int victim = 0, st[3];
  dt_run_ranks(3, rank_killed, &victim, NULL, 60, st);
  for (int r = 1; r < 3; r++)
    CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d failed", r);
}

static void rank_abort(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config(EXAMPLE_CONFIG);
  ddplug_context *ctx = open_ok();
  if (rank == 1) {
    usleep(200000);
    CHECK_OK(ddplug_abort(ctx, "disk full"));
  }
  CHECK_STATUS(ddplug_barrier(ctx, 20000), DDPLUG_E_ABORTED);
  CHECK_CONTAINS(ddplug_last_error(), "rank 1 aborted the run: disk full");
  CHECK_CONTAINS(ddplug_context_error(ctx), "rank 1 aborted the run: disk full");
  CHECK_STATUS(ddplug_close(ctx), DDPLUG_E_ABORTED);
}

TEST(abort_from_one_rank_reaches_all) {
  CHECK_EQ_INT(dt_run_ranks(3, rank_abort, NULL, NULL, 60, NULL), 0);
}

/* Ranks 1 and 2 join collective #1 only once rank 0's timeout has ended
 * the run, so rank 0 times out whatever the load, and the first rank it
 * finds missing (the example plugin looks in rank order) is rank 1. */
static void rank_timeout(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config("{\"plugin\": \"example\", \"timeouts\": {\"collective_s\": 1}}");
  ddplug_context *ctx = open_ok();
  int32_t x = 1;
  if (rank != 0) {
    CHECK_EQ_INT(wait_until_the_run_ends(ctx), DDPLUG_E_TIMEOUT);
    CHECK(ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL) != DDPLUG_OK);
    CHECK_CONTAINS(ddplug_last_error(), "rank 1 did not arrive");
  } else {
    CHECK_STATUS(ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL),
                 DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), "collective #1 (allreduce of 1 int32, sum)");
    CHECK_CONTAINS(ddplug_last_error(), "rank 1 did not arrive");
  }
  ddplug_close(ctx);
}

TEST(a_collective_timeout_names_sequence_and_late_rank) {
  CHECK_EQ_INT(dt_run_ranks(3, rank_timeout, NULL, NULL, 60, NULL), 0);
}

static void rank_mismatch(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config(EXAMPLE_CONFIG);
  ddplug_context *ctx = open_ok();
  int32_t x[5] = {1, 2, 3, 4, 5};
  CHECK_STATUS(ddplug_allreduce(ctx, x, x, rank == 1 ? 5 : 4, DDPLUG_INT32, DDPLUG_OP_SUM, NULL),
               DDPLUG_E_MISMATCH);
  CHECK_CONTAINS(ddplug_last_error(), "collective #1 differs across ranks");
  /* Reported alike on every rank: the run goes on. */
  CHECK_OK(ddplug_allreduce(ctx, x, x, 4, DDPLUG_INT32, DDPLUG_OP_SUM, NULL));
  CHECK_EQ_INT(x[0], 3);
  CHECK_OK(ddplug_close(ctx));
}

TEST(mismatched_collectives_fail_on_every_rank) {
  CHECK_EQ_INT(dt_run_ranks(3, rank_mismatch, NULL, NULL, 60, NULL), 0);
}

/* ---- argument checks ------------------------------------------------------ */

TEST(bad_collective_arguments_are_refused_before_the_plugin) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  use_config("{\"plugin\": \"example\"}");
  ddplug_context *ctx = open_ok();
  float f[2] = {0, 0};
  CHECK_STATUS(ddplug_allreduce(ctx, f, f, 2, 99, DDPLUG_OP_SUM, NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "dtype 99 is not a ddplug dtype");
  CHECK_STATUS(ddplug_allreduce(ctx, f, f, 2, DDPLUG_FLOAT32, DDPLUG_OP_BOR, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "op bor needs an integer dtype, got float32");
  CHECK_STATUS(ddplug_allreduce(ctx, f, f, 1, DDPLUG_BFLOAT16, DDPLUG_OP_SUM, NULL),
               DDPLUG_E_UNSUPPORTED);
  CHECK_CONTAINS(ddplug_last_error(), "plugin example does not support dtype bfloat16 (it "
                                      "supports float32, float64, int8, uint8, int32, int64)");
  CHECK_STATUS(ddplug_allreduce(ctx, NULL, f, 2, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "send buffer is NULL with count 2");
  CHECK_STATUS(ddplug_broadcast(ctx, f, f, 2, DDPLUG_FLOAT32, 1, NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "root 1 is not a rank (world size 1)");
  CHECK_STATUS(ddplug_iallreduce(ctx, f, f, 2, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  /* Validation failures do not poison the context. */
  CHECK_OK(ddplug_allreduce(ctx, f, f, 0, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  CHECK_OK(ddplug_allreduce(ctx, f, f, 2, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL));
  CHECK_OK(ddplug_close(ctx));
  CHECK_OK(ddplug_close(NULL));
  CHECK_STATUS(ddplug_open(NULL, NULL, NULL), DDPLUG_E_INVALID_ARGUMENT);
}

/* ---- found in review ------------------------------------------------------ */

static void rank_reentrant(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config("{\"plugin\": \"reentrant\", \"rendezvous\": {\"timeout_s\": 20}}");
  ddplug_context *ctx = open_ok();
  if (rank == 1) {
    usleep(300000); /* rank 0 is inside the plugin's barrier, holding its lock */
    CHECK_OK(ddplug_abort(ctx, "operator stop"));
  } else {
    CHECK_STATUS(ddplug_barrier(ctx, 30000), DDPLUG_E_ABORTED);
    CHECK_CONTAINS(ddplug_last_error(), "rank 1 aborted the run: operator stop");
  }
  ddplug_close(ctx);
}

TEST(abort_while_a_plugin_waits_holding_its_own_lock_does_not_deadlock) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_reentrant, NULL, NULL, 60, NULL), 0);
}

/* A collective the plugin fails to start (not a caller error) leaves this
 * rank out of step: the run ends, and the others hear why. */
static void rank_start_fails(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config("{\"plugin\": \"reentrant\", \"rendezvous\": {\"timeout_s\": 20}}");
  ddplug_context *ctx = open_ok();
  /* Rank 0 fails only once rank 1 has finished opening (else rank 1's open
   * is what the abort ends): a key of the test's own in the run's store. */
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", atoi(getenv("MASTER_PORT")), NULL, 10000, &st));
  if (rank == 1) CHECK_OK(ddplug_store_set(st, "test/rank1-opened", "1", 1));
  void *v = NULL;
  if (rank == 0) CHECK_OK(ddplug_store_get(st, "test/rank1-opened", 10000, &v, NULL));
  ddplug_free(v);
  ddplug_store_close(st);
  if (rank == 0) {
    float x[7] = {0};
    ddplug_request *req = NULL;
    CHECK_STATUS(ddplug_iallreduce(ctx, x, x, 7, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL, &req),
                 DDPLUG_E_TIMEOUT);
    CHECK(req == NULL);
    CHECK_CONTAINS(ddplug_last_error(), "did not start in time (test)");
  } else {
    CHECK_STATUS(ddplug_barrier(ctx, 30000), DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), "rank 0 ended the run: ");
    CHECK_CONTAINS(ddplug_last_error(), "did not start in time (test)");
  }
  ddplug_close(ctx);
}

TEST(a_collective_that_fails_to_start_ends_the_run_for_everyone) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_start_fails, NULL, NULL, 60, NULL), 0);
}

/* A rank dies while another's plugin is starting a collective: the start
 * fails with the plugin's generic ABORTED, but the run ended first, and its
 * status (PEER_LOST, naming the dead rank) is what the caller gets. (Found
 * by the conformance suite under load: the mpi plugin's node group saw the
 * death before the runtime did.) */
static void rank_dies_during_a_start(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config("{\"plugin\": \"reentrant\", \"rendezvous\": {\"timeout_s\": 20}}");
  ddplug_context *ctx = open_ok();
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", atoi(getenv("MASTER_PORT")), NULL, 10000, &st));
  if (rank == 1) {
    void *v = NULL;
    CHECK_OK(ddplug_store_get(st, "test/rank0-starting", 10000, &v, NULL));
    ddplug_free(v);
    _exit(0); /* without closing: a lost rank */
  }
  CHECK_OK(ddplug_store_set(st, "test/rank0-starting", "1", 1));
  ddplug_store_close(st);
  float x[9] = {0};
  CHECK_STATUS(ddplug_allreduce(ctx, x, x, 9, DDPLUG_FLOAT32, DDPLUG_OP_SUM, NULL),
               DDPLUG_E_PEER_LOST);
  CHECK_CONTAINS(ddplug_last_error(), "rank 1 (pid ");
  CHECK_CONTAINS(ddplug_last_error(), "exited or was killed");
  ddplug_close(ctx);
}

TEST(a_rank_lost_while_a_start_fails_reports_peer_lost_not_aborted) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_dies_during_a_start, NULL, NULL, 60, NULL), 0);
}

TEST(a_request_outlives_its_closed_context_safely) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  use_config("{\"plugin\": \"example\"}");
  ddplug_context *ctx = open_ok();
  int32_t x = 1;
  ddplug_request *req = NULL;
  CHECK_OK(ddplug_iallreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL, &req));
  CHECK_OK(ddplug_close(ctx));
  CHECK_STATUS(ddplug_request_wait(req, 1000), DDPLUG_E_ABORTED);
  CHECK_CONTAINS(ddplug_last_error(), "the request's context was closed");
  int done = 0;
  CHECK_STATUS(ddplug_request_test(req, &done), DDPLUG_E_ABORTED);
  CHECK_EQ_INT(done, 1);
  ddplug_request_free(req); /* only the wrapper: ASan/valgrind check it */
}

static void rank_close_gives_up(int rank, int world, void *arg) {
  (void)world;
  (void)arg;
  use_config("{\"plugin\": \"example\", \"timeouts\": {\"collective_s\": 1}}");
  ddplug_context *ctx = open_ok();
  if (rank == 0) {
    CHECK_STATUS(ddplug_close(ctx), DDPLUG_E_TIMEOUT);
    CHECK_CONTAINS(ddplug_last_error(), "rank 0 gave up closing the run");
    CHECK_CONTAINS(ddplug_last_error(), "rank 1 did not arrive");
    return;
  }
  /* still working when rank 0 gives up: it joins nothing until then */
  wait_until_the_run_ends(ctx);
  int32_t x = 1;
  CHECK(ddplug_allreduce(ctx, &x, &x, 1, DDPLUG_INT32, DDPLUG_OP_SUM, NULL) != DDPLUG_OK);
  CHECK_CONTAINS(ddplug_last_error(), "rank 0 gave up closing the run");
  ddplug_close(ctx);
}

TEST(a_rank_that_gives_up_closing_tells_the_others_why) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_close_gives_up, NULL, NULL, 60, NULL), 0);
}

/* Rank 1 opens once rank 0 has failed (its log callback sets a shared
 * flag when rank 0 publishes the failure, before rank 0 waits for the
 * others to read it), and is told, not timed out (LONG_RENDEZVOUS). */
static void flag_rank0_failure(void *user, int level, int rank, const char *line) {
  (void)rank;
  if (level == DDPLUG_LOG_ERROR && strstr(line, "rank 0 failed to open"))
    atomic_store((_Atomic int *)user, 1);
}

static void rank_zero_fails_first(int rank, int world, void *arg) {
  (void)world;
  _Atomic int *failed = arg;
  use_config(LONG_RENDEZVOUS);
  ddplug_context *ctx = NULL;
  if (rank == 0) {
    CHECK_OK(ddplug_log_set_callback(flag_rank0_failure, failed));
    ddplug_open_options o = DDPLUG_OPEN_OPTIONS_INIT;
    o.plugin = "nosuchplugin";
    CHECK_STATUS(ddplug_open(NULL, &o, &ctx), DDPLUG_E_NOT_FOUND);
    CHECK(atomic_load(failed));
    return;
  }
  wait_for_flag(failed, "rank 0's failure");
  CHECK_STATUS(ddplug_open(NULL, NULL, &ctx), DDPLUG_E_NOT_FOUND);
  CHECK_CONTAINS(ddplug_last_error(), "rank 0 failed to open: plugin 'nosuchplugin' not found");
}

TEST(rank_zero_failing_first_still_tells_the_late_ranks) {
  CHECK_EQ_INT(dt_run_ranks(2, rank_zero_fails_first, shared_flag(), NULL, 60, NULL), 0);
}

TEST(bad_timeouts_are_refused_without_ending_the_run) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  use_config("{\"plugin\": \"example\"}");
  ddplug_context *ctx = open_ok();
  CHECK_STATUS(ddplug_barrier(ctx, -5), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "needs a positive timeout or DDPLUG_TIMEOUT_DEFAULT");
  CHECK_STATUS(ddplug_barrier(ctx, 0), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_OK(ddplug_barrier(ctx, 1000));
  CHECK_OK(ddplug_close(ctx));
}
