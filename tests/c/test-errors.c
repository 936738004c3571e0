/* test-errors.c — the status table, names, thread-local last error,
 * dtype/op/owner name tables, and the small utilities others rely on. */
#include <pthread.h>
#include <stdlib.h>

#include "harness.h"
#include "base/base.h"

TEST(every_status_has_name_and_message) {
  for (int s = 0; s < DDPLUG_STATUS_COUNT_; s++) {
    CHECK(strcmp(ddplug_status_name(s), "UNKNOWN") != 0);
    CHECK(strcmp(ddplug_strerror(s), "unknown status") != 0);
  }
  CHECK_EQ_STR(ddplug_status_name(DDPLUG_E_PEER_LOST), "PEER_LOST");
  CHECK_EQ_STR(ddplug_strerror(DDPLUG_E_TIMEOUT), "timed out");
  CHECK_EQ_STR(ddplug_status_name(-1), "UNKNOWN");
  CHECK_EQ_STR(ddplug_strerror(999), "unknown status");
}

TEST(dtype_and_op_tables) {
  CHECK_EQ_INT(ddplug_dtype_size(DDPLUG_BFLOAT16), 2);
  CHECK_EQ_INT(ddplug_dtype_size(DDPLUG_INT64), 8);
  CHECK_EQ_INT(ddplug_dtype_size(0), 0);
  CHECK_EQ_STR(ddplug_dtype_name(DDPLUG_FLOAT16), "float16");
  CHECK(ddplug_dtype_name(99) == NULL);
  CHECK_EQ_STR(ddplug_op_name(DDPLUG_OP_BAND), "band");
  CHECK_EQ_STR(ddplug_owner_name(DDPLUG_OWNER_FRAMEWORK), "framework");
}

static void *other_thread(void *arg) {
  (void)arg;
  ddplug__err(DDPLUG_E_TIMEOUT, "thread-local %d", 7);
  return strcmp(ddplug_last_error(), "thread-local 7") == 0 ? (void *)1 : NULL;
}

TEST(last_error_is_thread_local) {
  ddplug__err(DDPLUG_E_CONFIG, "main %s", "thread");
  pthread_t t;
  void *ok = NULL;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, &ok);
  CHECK(ok == (void *)1);
  CHECK_EQ_STR(ddplug_last_error(), "main thread");
}

TEST(error_prefix_and_truncation) {
  ddplug__err(DDPLUG_E_CONFIG, "inner");
  CHECK_EQ_INT(ddplug__err_prefix(DDPLUG_E_CONFIG, "outer %d", 1), DDPLUG_E_CONFIG);
  CHECK_EQ_STR(ddplug_last_error(), "outer 1: inner");
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ddplug__err(DDPLUG_E_INTERNAL, "%s", big);
  size_t len = strlen(ddplug_last_error());
  CHECK(len == DDPLUG__ERRMSG_MAX - 1);
  CHECK_EQ_STR(ddplug_last_error() + len - 3, "...");
}

TEST(errno_errors_name_the_cause) {
  ddplug__err_errno(DDPLUG_E_SYSTEM, 2, "opening %s", "/nope");
  CHECK_EQ_STR(ddplug_last_error(), "opening /nope: No such file or directory");
}

TEST(edit_distance) {
  CHECK_EQ_INT(ddplug__edit_distance("shuffle", "shufle", 3), 1);
  CHECK_EQ_INT(ddplug__edit_distance("seed", "seed", 3), 0);
  CHECK_EQ_INT(ddplug__edit_distance("abc", "xyzxyzxyz", 3), 4);
}

TEST(hash_is_stable) {
  /* A fixed value: the config hash is compared across machines, so the
   * function must never change silently. */
  CHECK(ddplug__hash64("ddplug", 6, 0) == ddplug__hash64("ddplug", 6, 0));
  CHECK(ddplug__hash64("ddplug", 6, 0) != ddplug__hash64("ddplug", 6, 1));
}

TEST(parse_i64) {
  int64_t v;
  CHECK(ddplug__parse_i64("42", &v) == 0 && v == 42);
  CHECK(ddplug__parse_i64("-3", &v) == 0 && v == -3);
  CHECK(ddplug__parse_i64("4x", &v) == -1);
  CHECK(ddplug__parse_i64("", &v) == -1);
  CHECK(ddplug__parse_i64("99999999999999999999", &v) == -1);
}

static int g_cb_calls;
static char g_cb_line[512];
static void log_cb(void *user, int level, int rank, const char *line) {
  (void)user; (void)level; (void)rank;
  g_cb_calls++;
  snprintf(g_cb_line, sizeof g_cb_line, "%s", line);
}

TEST(log_callback_and_rank_prefix) {
  CHECK_OK(ddplug_log_set_callback(log_cb, NULL));
  CHECK_OK(ddplug_log_set_level(DDPLUG_LOG_INFO));
  ddplug__log_set_rank(3);
  DDPLUG__INFO("hello %d", 5);
  DDPLUG__DEBUG("not shown");
  CHECK_EQ_INT(g_cb_calls, 1);
  CHECK_EQ_STR(g_cb_line, "[ddplug r3] hello 5");
  ddplug__log_config_level(DDPLUG_LOG_TRACE); /* the API setting wins */
  DDPLUG__DEBUG("still not shown");
  CHECK_EQ_INT(g_cb_calls, 1);
  int lvl;
  CHECK_OK(ddplug_log_level_parse("DEBUG", &lvl));
  CHECK_EQ_INT(lvl, DDPLUG_LOG_DEBUG);
  CHECK_STATUS(ddplug_log_level_parse("loud", &lvl), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "unknown log level 'loud'");
  CHECK_STATUS(ddplug_log_set_level(9), DDPLUG_E_INVALID_ARGUMENT);
  ddplug_log_set_callback(NULL, NULL);
}

TEST(alloc_failure_injection) {
  setenv("DDPLUG_TEST_FAIL_ALLOC", "1", 1);
  /* The injector reads the variable once, on the first allocation. */
  CHECK(ddplug__malloc(8) == NULL);
  void *p = ddplug__malloc(8);
  CHECK(p != NULL);
  ddplug__free(p);
}

static int g_env_calls;
static void count_cb(void *user, int level, int rank, const char *line) {
  (void)user; (void)level; (void)rank; (void)line;
  g_env_calls++;
}

TEST(log_level_from_environment_beats_config) {
  /* Each case runs in a fresh process, so the variable is read here first. */
  setenv("DDPLUG_LOG", "debug", 1);
  ddplug_log_set_callback(count_cb, NULL);
  ddplug__log_config_level(DDPLUG_LOG_ERROR); /* config says error: env wins */
  DDPLUG__DEBUG("shown at debug");
  DDPLUG__TRACE("not shown");
  CHECK_EQ_INT(g_env_calls, 1);
  ddplug_log_set_callback(NULL, NULL);
}

TEST(bad_log_environment_keeps_the_default) {
  setenv("DDPLUG_LOG", "chatty", 1);
  ddplug_log_set_callback(count_cb, NULL);
  CHECK(!ddplug__log_enabled(DDPLUG_LOG_INFO)); /* default warn */
  CHECK(ddplug__log_enabled(DDPLUG_LOG_WARN));
  ddplug__log_config_level(DDPLUG_LOG_INFO); /* config applies */
  CHECK(ddplug__log_enabled(DDPLUG_LOG_INFO));
  ddplug_log_set_callback(NULL, NULL);
}
