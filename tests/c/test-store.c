/* test-store.c — the rendezvous store's semantics over real sockets and
 * real processes: set/get/add/compare_set/delete/wait, blocking gets served
 * by other processes, timeouts naming the keys, many concurrent clients,
 * connect retries, argument checks, and the per-handle error text.
 * Failure handling (dead servers and clients, secrets, malformed input,
 * fuzzing) is in test-store-fault.c and test-store-robust.c. */
#include <pthread.h>

#include "store-testlib.h"

TEST(set_get_roundtrip_binary_empty_and_max) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);

  CHECK_OK(ddplug_store_set(st, "k", "hello", 5));
  void *v = NULL;
  uint64_t len = 99;
  CHECK_OK(ddplug_store_get(st, "k", 0, &v, &len));
  CHECK_EQ_INT(len, 5);
  CHECK_EQ_STR((char *)v, "hello"); /* NUL-terminated for convenience */
  ddplug_free(v);

  /* Overwrite, binary bytes with NULs, empty value (NULL pointer allowed). */
  const uint8_t bin[6] = {0, 1, 0, 255, 0, 7};
  CHECK_OK(ddplug_store_set(st, "k", bin, sizeof bin));
  CHECK_OK(ddplug_store_get(st, "k", 0, &v, &len));
  CHECK_EQ_INT(len, 6);
  CHECK(memcmp(v, bin, 6) == 0);
  ddplug_free(v);
  CHECK_OK(ddplug_store_set(st, "empty", NULL, 0));
  st_expect_value(st, "empty", 0, "");

  /* The largest value and the longest key. */
  size_t big = DDPLUG__STORE_VALUE_MAX;
  uint8_t *b = malloc(big);
  for (size_t i = 0; i < big; i++) b[i] = (uint8_t)(i * 31 + 7);
  char key[256];
  memset(key, 'K', 255);
  key[255] = '\0';
  CHECK_OK(ddplug_store_set(st, key, b, big));
  CHECK_OK(ddplug_store_get(st, key, 1000, &v, &len));
  CHECK_EQ_INT(len, big);
  CHECK(memcmp(v, b, big) == 0);
  ddplug_free(v);
  free(b);

  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(add_is_decimal_text_and_rejects_non_integers) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  int64_t r = 0;
  CHECK_OK(ddplug_store_add(st, "n", 40, &r)); /* missing = 0 */
  CHECK_EQ_INT(r, 40);
  CHECK_OK(ddplug_store_add(st, "n", 2, NULL));
  st_expect_value(st, "n", 0, "42");
  CHECK_OK(ddplug_store_add(st, "n", -50, &r));
  CHECK_EQ_INT(r, -8);
  CHECK_OK(ddplug_store_set(st, "n2", "-17", 3)); /* set text, then add */
  CHECK_OK(ddplug_store_add(st, "n2", 0, &r));
  CHECK_EQ_INT(r, -17);

  CHECK_OK(ddplug_store_set(st, "word", "abc", 3));
  r = 7;
  CHECK_STATUS(ddplug_store_add(st, "word", 1, &r), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "key 'word' holds 'abc'");
  CHECK_CONTAINS(ddplug_last_error(), "not a decimal integer");
  CHECK_EQ_INT(r, 7); /* untouched on failure */
  CHECK_OK(ddplug_store_set(st, "sp", " 5", 2));
  CHECK_STATUS(ddplug_store_add(st, "sp", 1, NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_OK(ddplug_store_set(st, "e", "", 0));
  CHECK_STATUS(ddplug_store_add(st, "e", 1, NULL), DDPLUG_E_INVALID_ARGUMENT);

  CHECK_OK(ddplug_store_set(st, "max", "9223372036854775807", 19));
  CHECK_STATUS(ddplug_store_add(st, "max", 1, NULL), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "overflows int64");
  CHECK_OK(ddplug_store_add(st, "max", -1, &r));
  CHECK_EQ_INT(r, INT64_MAX - 1);
  CHECK_OK(ddplug_store_add(st, "min", INT64_MIN, &r));
  CHECK_EQ_INT(r, INT64_MIN);
  st_expect_value(st, "min", 0, "-9223372036854775808");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(compare_set_semantics) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  int swapped = -1;
  void *actual = NULL;
  uint64_t alen = 99;

  /* expected NULL/0 = "absent": swaps on a missing key... */
  CHECK_OK(ddplug_store_compare_set(st, "c", NULL, 0, "one", 3, &swapped,
                                    &actual, &alen));
  CHECK_EQ_INT(swapped, 1);
  CHECK_EQ_STR((char *)actual, "one");
  CHECK_EQ_INT(alen, 3);
  ddplug_free(actual);
  /* ...and not on a present one; actual shows the current value. */
  CHECK_OK(ddplug_store_compare_set(st, "c", NULL, 0, "two", 3, &swapped,
                                    &actual, &alen));
  CHECK_EQ_INT(swapped, 0);
  CHECK_EQ_STR((char *)actual, "one");
  ddplug_free(actual);
  /* Wrong expected value: no swap. */
  CHECK_OK(ddplug_store_compare_set(st, "c", "uno", 3, "two", 3, &swapped,
                                    NULL, NULL));
  CHECK_EQ_INT(swapped, 0);
  /* Right expected value: swap. */
  CHECK_OK(ddplug_store_compare_set(st, "c", "one", 3, "two", 3, &swapped,
                                    &actual, &alen));
  CHECK_EQ_INT(swapped, 1);
  CHECK_EQ_STR((char *)actual, "two");
  ddplug_free(actual);
  /* Expecting a value on an absent key: no swap, actual NULL/0. */
  actual = (void *)1;
  CHECK_OK(ddplug_store_compare_set(st, "absent", "x", 1, "y", 1, &swapped,
                                    &actual, &alen));
  CHECK_EQ_INT(swapped, 0);
  CHECK(actual == NULL);
  CHECK_EQ_INT(alen, 0);
  /* A present empty value is not "absent". */
  CHECK_OK(ddplug_store_set(st, "e", "", 0));
  CHECK_OK(ddplug_store_compare_set(st, "e", NULL, 0, "z", 1, &swapped, NULL,
                                    NULL));
  CHECK_EQ_INT(swapped, 0);
  CHECK_OK(ddplug_store_compare_set(st, "e", "", 0, "z", 1, &swapped, NULL,
                                    NULL));
  CHECK_EQ_INT(swapped, 1);
  /* Setting an empty desired value keeps the key present. */
  CHECK_OK(ddplug_store_compare_set(st, "e", "z", 1, NULL, 0, &swapped,
                                    &actual, &alen));
  CHECK_EQ_INT(swapped, 1);
  CHECK(actual != NULL);
  CHECK_EQ_INT(alen, 0);
  ddplug_free(actual);
  CHECK_STATUS(ddplug_store_compare_set(st, "e", NULL, 5, "z", 1, NULL, NULL,
                                        NULL),
               DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "expected for key 'e' is NULL but its length is 5");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(delete_semantics) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  int existed = -1;
  CHECK_OK(ddplug_store_delete(st, "d", &existed));
  CHECK_EQ_INT(existed, 0);
  CHECK_OK(ddplug_store_set(st, "d", "1", 1));
  CHECK_OK(ddplug_store_delete(st, "d", &existed));
  CHECK_EQ_INT(existed, 1);
  void *v = NULL;
  CHECK_STATUS(ddplug_store_get(st, "d", 0, &v, NULL), DDPLUG_E_TIMEOUT);
  CHECK(v == NULL);
  CHECK_CONTAINS(ddplug_last_error(), "key 'd' is not set");
  CHECK_OK(ddplug_store_delete(st, "d", NULL));
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(wait_semantics_and_missing_keys_named) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  const char *keys[] = {"w/a", "w/b", "w/c"};
  CHECK_OK(ddplug_store_wait(st, NULL, 0, 0)); /* nothing to wait for */
  CHECK_OK(ddplug_store_set(st, "w/b", "", 0));
  CHECK_STATUS(ddplug_store_wait(st, keys, 3, 0), DDPLUG_E_TIMEOUT);
  CHECK_CONTAINS(ddplug_last_error(), "2 of 3 key(s)");
  CHECK_CONTAINS(ddplug_last_error(), "still missing: 'w/a', 'w/c'");
  CHECK(strstr(ddplug_last_error(), "'w/b'") == NULL);

  double t0 = st_now_s();
  CHECK_STATUS(ddplug_store_wait(st, keys, 3, 200), DDPLUG_E_TIMEOUT);
  dt_note("wait(200 ms) returned after %.0f ms", (st_now_s() - t0) * 1000);
  CHECK_CONTAINS(ddplug_last_error(), "timeout 200 ms");
  CHECK_CONTAINS(ddplug_last_error(), "still missing: 'w/a', 'w/c'");
  CHECK_CONTAINS(ddplug_last_error(), "127.0.0.1:");

  CHECK_OK(ddplug_store_set(st, "w/a", "", 0));
  CHECK_OK(ddplug_store_set(st, "w/c", "", 0));
  CHECK_OK(ddplug_store_wait(st, keys, 3, 0));
  const char *dup[] = {"w/a", "w/a"};
  CHECK_OK(ddplug_store_wait(st, dup, 2, 1000));
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(get_timeout_names_key_and_time) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  void *v = (void *)1;
  uint64_t len = 5;
  double t0 = st_now_s();
  CHECK_STATUS(ddplug_store_get(st, "never/set", 250, &v, &len),
               DDPLUG_E_TIMEOUT);
  dt_note("get(250 ms) returned after %.0f ms", (st_now_s() - t0) * 1000);
  CHECK(v == (void *)1 && len == 5); /* out-parameters untouched */
  CHECK_CONTAINS(ddplug_last_error(), "key 'never/set' was not set within 250 ms");
  CHECK_CONTAINS(ddplug_store_error(st), "key 'never/set' was not set within 250 ms");
  /* The connection is still fine after a timeout. */
  CHECK_OK(ddplug_store_set(st, "never/set", "now", 3));
  st_expect_value(st, "never/set", 250, "now");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

/* ---- blocking calls served by other processes ---------------------------- */

/* The setter is forked before the test's server thread exists (as in the
 * hammer test below: a fork while another thread holds an allocator lock
 * can leave the child stuck), and connects once the server is up. */
typedef struct setter_arg {
  int port;
  int delay_ms;
  const char *key;
  const char *value;
  const char *gate; /* NULL, or a key to wait for before the delay */
} setter_arg;

static void setter_main(void *p) {
  setter_arg *a = p;
  ddplug_store *st = st_connect(a->port, NULL);
  if (a->gate) {
    void *v = NULL;
    CHECK_OK(ddplug_store_get(st, a->gate, 20000, &v, NULL));
    ddplug_free(v);
  }
  ddplug__sleep_ms(a->delay_ms);
  CHECK_OK(ddplug_store_set(st, a->key, a->value, strlen(a->value)));
  ddplug_store_close(st);
}

static ddplug_store_server *serve_on(int port) {
  ddplug_store_server *srv = NULL;
  CHECK_OK(ddplug_store_serve("127.0.0.1", port, NULL, &srv));
  return srv;
}

TEST(get_waits_for_key_set_later_by_another_process) {
  int port = dt_free_port();
  setter_arg a = {port, 300, "late/key", "arrived", NULL};
  pid_t pid = dt_fork(setter_main, &a);
  ddplug_store_server *srv = serve_on(port);
  ddplug_store *st = st_connect(port, NULL);
  void *v = NULL;
  double t0 = st_now_s();
  CHECK_OK(ddplug_store_get(st, "late/key", 20000, &v, NULL));
  dt_note("get returned %.0f ms after start (setter waited 300 ms)",
          (st_now_s() - t0) * 1000);
  CHECK_EQ_STR((char *)v, "arrived");
  ddplug_free(v);
  st_join_child(pid, 10000, "the setter");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(wait_is_woken_by_another_process_and_delete_rearms) {
  int port = dt_free_port();
  setter_arg a = {port, 200, "x/1", "v", "x/go"};
  pid_t pid = dt_fork(setter_main, &a);
  ddplug_store_server *srv = serve_on(port);
  ddplug_store *st = st_connect(port, NULL);
  /* A key set and deleted again before the wait must not count. */
  CHECK_OK(ddplug_store_set(st, "x/1", "", 0));
  CHECK_OK(ddplug_store_delete(st, "x/1", NULL));
  CHECK_OK(ddplug_store_set(st, "x/go", "", 0)); /* now the setter may set x/1 */
  const char *keys[] = {"x/1"};
  CHECK_OK(ddplug_store_wait(st, keys, 1, 20000));
  st_join_child(pid, 10000, "the setter");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

/* Several parked waiters on overlapping keys, answered in any order. */
typedef struct waiter_arg {
  ddplug_store *st;
  const char *keys[3];
  uint32_t nkeys;
  int rc;
} waiter_arg;

static void *waiter_thread(void *p) {
  waiter_arg *a = p;
  a->rc = ddplug_store_wait(a->st, a->keys, a->nkeys, 20000);
  return NULL;
}

TEST(overlapping_waiters_all_woken) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  waiter_arg w[3] = {{NULL, {"o/a", "o/b"}, 2, -1},
                     {NULL, {"o/b", "o/c", "o/a"}, 3, -1},
                     {NULL, {"o/c"}, 1, -1}};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    w[i].st = st_connect(port, NULL);
    pthread_create(&th[i], NULL, waiter_thread, &w[i]);
  }
  ddplug_store *setter = st_connect(port, NULL);
  ddplug__sleep_ms(100);
  CHECK_OK(ddplug_store_set(setter, "o/c", "", 0));
  CHECK_OK(ddplug_store_set(setter, "o/b", "", 0));
  CHECK_OK(ddplug_store_set(setter, "o/a", "", 0));
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    CHECK_OK(w[i].rc);
    ddplug_store_close(w[i].st);
  }
  ddplug_store_close(setter);
  ddplug_store_server_stop(srv);
}

/* ---- many clients --------------------------------------------------------- */

#define HAMMER_PROCS 64
#define HAMMER_ADDS 100

static void hammer_main(void *p) {
  int port = *(int *)p;
  ddplug_store *st = st_connect(port, NULL);
  for (int i = 0; i < HAMMER_ADDS; i++) CHECK_OK(ddplug_store_add(st, "total", 1, NULL));
  CHECK_OK(ddplug_store_add(st, "done", 1, NULL));
  ddplug_store_close(st);
}

TEST_T(many_processes_hammer_add_exact_total, 120) {
  /* Fork the clients before the server thread exists: forking a process
   * with a running thread can leave a child with an allocator lock held
   * (seen under ASan). The clients retry connecting until the server is up. */
  int port = dt_free_port();
  pid_t pids[HAMMER_PROCS];
  double t0 = st_now_s();
  for (int i = 0; i < HAMMER_PROCS; i++) pids[i] = dt_fork(hammer_main, &port);
  ddplug_store_server *srv = NULL;
  CHECK_OK(ddplug_store_serve("127.0.0.1", port, NULL, &srv));
  for (int i = 0; i < HAMMER_PROCS; i++) st_join_child(pids[i], 100000, "a client");
  double secs = st_now_s() - t0;
  ddplug_store *st = st_connect(port, NULL);
  void *v = NULL;
  CHECK_OK(ddplug_store_get(st, "total", 0, &v, NULL));
  char want[32];
  snprintf(want, sizeof want, "%d", HAMMER_PROCS * HAMMER_ADDS);
  CHECK_EQ_STR((char *)v, want);
  ddplug_free(v);
  dt_note("%d processes x %d adds in %.2f s (%.0f adds/s)", HAMMER_PROCS,
          HAMMER_ADDS, secs, HAMMER_PROCS * HAMMER_ADDS / secs);
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

typedef struct thread_arg {
  ddplug_store *st;
  int n;
} thread_arg;

static void *adder_thread(void *p) {
  thread_arg *a = p;
  for (int i = 0; i < a->n; i++)
    if (ddplug_store_add(a->st, "shared", 1, NULL) != DDPLUG_OK) return (void *)1;
  return NULL;
}

TEST(threads_share_one_handle) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  pthread_t th[8];
  thread_arg a = {st, 250};
  for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, adder_thread, &a);
  for (int i = 0; i < 8; i++) {
    void *rv;
    pthread_join(th[i], &rv);
    CHECK(rv == NULL);
  }
  int64_t r;
  CHECK_OK(ddplug_store_add(st, "shared", 0, &r));
  CHECK_EQ_INT(r, 2000);
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

/* 64 ranks start before the server exists: each must retry its connect,
 * then all meet through set + wait (a rendezvous). */
#define STARTUP_RANKS 64
typedef struct startup_arg {
  int port;
} startup_arg;

static void startup_rank(int rank, int world, void *p) {
  startup_arg *a = p;
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", a->port, NULL, 30000, &st));
  char key[32];
  snprintf(key, sizeof key, "rank/%d", rank);
  CHECK_OK(ddplug_store_set(st, key, "up", 2));
  static char names[STARTUP_RANKS][32];
  const char *keys[STARTUP_RANKS];
  for (int r = 0; r < world; r++) {
    snprintf(names[r], sizeof names[r], "rank/%d", r);
    keys[r] = names[r];
  }
  CHECK_OK(ddplug_store_wait(st, keys, (uint32_t)world, 30000));
  ddplug_store_close(st);
}

TEST_T(startup_of_64_clients_before_the_server, 120) {
  startup_arg a = {dt_free_port()};
  /* The server comes up 300 ms after the ranks (on the port they use). */
  fflush(stdout); /* a child must not repeat buffered output */
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int failed = dt_run_ranks(STARTUP_RANKS, startup_rank, &a, NULL, 100, NULL);
    _exit(failed ? 1 : 0);
  }
  ddplug__sleep_ms(300);
  ddplug_store_server *srv = NULL;
  CHECK_OK(ddplug_store_serve("127.0.0.1", a.port, NULL, &srv));
  st_join_child(pid, 110000, "the 64 ranks' launcher (some ranks failed to meet)");
  ddplug_store_server_stop(srv);
}

/* ---- addresses and connect ------------------------------------------------ */

TEST(serve_on_any_loopback_hostname_and_ipv6) {
  const char *addrs[] = {"0.0.0.0", NULL, "127.0.0.1", "localhost", "::1", "::"};
  const char *dial[] = {"127.0.0.1", "127.0.0.1", "127.0.0.1", "localhost", "::1", "::1"};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(addrs); i++) {
    ddplug_store_server *srv = NULL;
    int rc = ddplug_store_serve(addrs[i], 0, NULL, &srv);
    if (rc != DDPLUG_OK && addrs[i] && strchr(addrs[i], ':')) {
      dt_note("IPv6 unavailable here (%s); skipped %s", ddplug_last_error(), addrs[i]);
      continue;
    }
    CHECK_OK(rc);
    ddplug_store *st = NULL;
    CHECK_OK(ddplug_store_connect(dial[i], ddplug_store_server_port(srv), NULL,
                                  5000, &st));
    CHECK_OK(ddplug_store_set(st, "a", "b", 1));
    ddplug_store_close(st);
    ddplug_store_server_stop(srv);
  }
}

TEST(serve_on_a_busy_port_fails_naming_it) {
  ddplug_store_server *a = st_serve(NULL);
  int port = ddplug_store_server_port(a);
  ddplug_store_server *b = NULL;
  CHECK_STATUS(ddplug_store_serve("127.0.0.1", port, NULL, &b), DDPLUG_E_SYSTEM);
  CHECK(b == NULL);
  char where[64];
  snprintf(where, sizeof where, "cannot listen on 127.0.0.1:%d", port);
  CHECK_CONTAINS(ddplug_last_error(), where);
  CHECK_CONTAINS(ddplug_last_error(), "Address already in use");
  ddplug_store_server_stop(a);
  /* SO_REUSEADDR: the port can be served again at once after a stop. */
  CHECK_OK(ddplug_store_serve("127.0.0.1", port, NULL, &b));
  ddplug_store_server_stop(b);
}

TEST(connect_to_nothing_times_out_naming_the_address) {
  int port = dt_free_port();
  ddplug_store *st = NULL;
  double t0 = st_now_s();
  CHECK_STATUS(ddplug_store_connect("127.0.0.1", port, NULL, 300, &st),
               DDPLUG_E_TIMEOUT);
  dt_note("connect(300 ms) to nothing returned after %.0f ms",
          (st_now_s() - t0) * 1000);
  CHECK(st == NULL);
  char where[64];
  snprintf(where, sizeof where, "rendezvous store at 127.0.0.1:%d within 300 ms", port);
  CHECK_CONTAINS(ddplug_last_error(), where);
  CHECK_CONTAINS(ddplug_last_error(), "Connection refused");
  CHECK_CONTAINS(ddplug_last_error(), "attempts");
  /* timeout 0: a single attempt. */
  CHECK_STATUS(ddplug_store_connect("127.0.0.1", port, NULL, 0, &st),
               DDPLUG_E_TIMEOUT);
  CHECK_CONTAINS(ddplug_last_error(), "(1 attempt in");
}

TEST(connect_retries_until_the_server_is_up) {
  int port = dt_free_port();
  fflush(stdout); /* a child must not repeat buffered output */
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    ddplug__sleep_ms(400);
    ddplug_store_server *srv = NULL;
    if (ddplug_store_serve("127.0.0.1", port, NULL, &srv) != DDPLUG_OK) _exit(2);
    ddplug__sleep_ms(20000); /* killed by the test */
    _exit(0);
  }
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", port, NULL, 15000, &st));
  CHECK_OK(ddplug_store_set(st, "k", "v", 1));
  ddplug_store_close(st);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* ---- arguments ------------------------------------------------------------ */

/* expr must fail with INVALID_ARGUMENT and a last error containing text. */
#define CHECK_BAD_ARG(expr, text)                            \
  do {                                                       \
    CHECK_STATUS(expr, DDPLUG_E_INVALID_ARGUMENT);           \
    CHECK_CONTAINS(ddplug_last_error(), text);               \
  } while (0)

TEST(bad_arguments_are_named) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, NULL);
  char longkey[300];
  memset(longkey, 'q', 256);
  longkey[256] = '\0';
  void *v = NULL;
  CHECK_BAD_ARG(ddplug_store_set(NULL, "k", "v", 1), "ddplug_store_set: st is NULL");
  CHECK_BAD_ARG(ddplug_store_set(st, NULL, "v", 1), "ddplug_store_set: key is NULL");
  CHECK_BAD_ARG(ddplug_store_set(st, "", "v", 1), "ddplug_store_set: key is empty");
  CHECK_BAD_ARG(ddplug_store_set(st, longkey, "v", 1),
                "is 256 bytes long; keys are at most 255 bytes");
  CHECK_BAD_ARG(ddplug_store_set(st, "k", NULL, 3),
                "value for key 'k' is NULL but its length is 3");
  CHECK_BAD_ARG(ddplug_store_set(st, "k", "v", DDPLUG__STORE_VALUE_MAX + 1ull),
                "value for key 'k' is 1048577 bytes; values are at most 1048576 bytes");
  CHECK_BAD_ARG(ddplug_store_get(st, "k", -5, &v, NULL), "timeout_ms -5 is negative");
  CHECK_BAD_ARG(ddplug_store_get(st, "k", 0, NULL, NULL),
                "ddplug_store_get: value is NULL (key 'k')");
  CHECK_BAD_ARG(ddplug_store_add(st, "", 1, NULL), "ddplug_store_add: key is empty");
  CHECK_BAD_ARG(ddplug_store_delete(st, NULL, NULL), "ddplug_store_delete: key is NULL");
  CHECK_BAD_ARG(ddplug_store_compare_set(st, "k", NULL, 0, NULL, 2, NULL, NULL, NULL),
                "desired for key 'k' is NULL but its length is 2");
  CHECK_BAD_ARG(ddplug_store_wait(st, NULL, 2, 0), "keys is NULL but nkeys is 2");
  CHECK_BAD_ARG(ddplug_store_wait(st, (const char *const[]){"a", ""}, 2, 0),
                "ddplug_store_wait: keys[1] is empty");
  CHECK_BAD_ARG(ddplug_store_wait(st, (const char *const[]){"a"}, 1025, 0),
                "nkeys 1025 is over the limit of 1024 keys");
  CHECK_BAD_ARG(ddplug_store_wait(st, (const char *const[]){"a"}, 1, -2),
                "timeout_ms -2 is negative");
  CHECK_BAD_ARG(ddplug_store_on_disconnect(st, "k", NULL, 1),
                "value for key 'k' is NULL");
  /* The per-handle text follows the handle's last failure. */
  CHECK_CONTAINS(ddplug_store_error(st), "value for key 'k' is NULL");
  CHECK(v == NULL);

  ddplug_store *none = NULL;
  CHECK_BAD_ARG(ddplug_store_connect("127.0.0.1", port, NULL, 0, NULL), "out is NULL");
  CHECK_BAD_ARG(ddplug_store_connect(NULL, port, NULL, 0, &none), "addr is NULL or empty");
  CHECK_BAD_ARG(ddplug_store_connect("", port, NULL, 0, &none), "addr is NULL or empty");
  CHECK_BAD_ARG(ddplug_store_connect("127.0.0.1", 0, NULL, 0, &none), "port 0 is out of range");
  CHECK_BAD_ARG(ddplug_store_connect("127.0.0.1", port, NULL, -7, &none),
                "timeout_ms -7 is negative");
  CHECK(none == NULL);
  ddplug_store_server *other = NULL;
  CHECK_BAD_ARG(ddplug_store_serve("127.0.0.1", 70000, NULL, &other),
                "port 70000 is out of range");
  CHECK_BAD_ARG(ddplug_store_serve("127.0.0.1", -1, NULL, &other), "port -1 is out of range");
  CHECK_BAD_ARG(ddplug_store_serve("127.0.0.1", 0, NULL, NULL), "out must not be NULL");
  CHECK(other == NULL);
  CHECK_EQ_STR(ddplug_store_error(NULL), "");
  CHECK_EQ_INT(ddplug_store_server_port(NULL), 0);
  ddplug_store_close(NULL);
  ddplug_store_server_stop(NULL);
  /* Nothing above broke the connection. */
  CHECK_OK(ddplug_store_set(st, "still", "fine", 4));
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(default_timeout_applies_to_calls) {
  ddplug_store_server *srv = st_serve(NULL);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), NULL);
  CHECK_STATUS(ddplug__store_set_default_timeout(st, 0), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_OK(ddplug__store_set_default_timeout(st, 150));
  void *v = NULL;
  CHECK_STATUS(ddplug_store_get(st, "nope", DDPLUG_TIMEOUT_DEFAULT, &v, NULL),
               DDPLUG_E_TIMEOUT);
  CHECK_CONTAINS(ddplug_last_error(), "was not set within 150 ms");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}
