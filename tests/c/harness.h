/*
 * harness.h — the test harness (libuv-style): one test-<feature>.c per
 * feature, a declared list of cases (TEST), each case run in its own forked
 * process with a timeout, and a leak check at the end of every case (file
 * descriptors opened by the case and not closed fail it).
 *
 *   ./test-config            run every case, each in a child process
 *   ./test-config --list     list the cases
 *   ./test-config NAME...    run only these cases (still forked)
 *   DT_NOFORK=1 ./test-config NAME   run in-process (for gdb)
 *
 * A test file that must link the shared libddplug.so instead of the static
 * internal archive contains the word DT_LINK_SHARED in a comment.
 */
#ifndef DDPLUG_TEST_HARNESS_H
#define DDPLUG_TEST_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "ddplug/ddplug.h"

typedef void (*dt_fn)(void);
void dt_register(const char *name, dt_fn fn, int timeout_s);
void dt_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void dt_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Skip the current case (e.g. no GPU visible): it is reported as skipped,
 * not failed, and a run in which every selected case skipped exits with
 * DT_SKIP_EXIT (register the test with ctest SKIP_RETURN_CODE 77). Call it
 * in the case's own process (not in a dt_run_ranks rank). */
#define DT_SKIP_EXIT 77
void dt_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* The current case's process keeps descriptors it cannot close (a loaded
 * CUDA driver holds its device files, pipes and sockets until exit): the
 * leak check is skipped for this case, with `why` noted. Call it in the
 * case's own process, right after the call that opened them. */
void dt_fds_kept_by_process(const char *why);

/* TEST(name) { ... }  — 60 s timeout. TEST_T(name, seconds) for others. */
#define TEST_T(name, timeout_s)                                              \
  static void dt_case_##name(void);                                          \
  __attribute__((constructor)) static void dt_reg_##name(void) {            \
    dt_register(#name, dt_case_##name, timeout_s);                           \
  }                                                                          \
  static void dt_case_##name(void)
#define TEST(name) TEST_T(name, 60)

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) dt_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);     \
  } while (0)

#define CHECK_MSG(cond, ...)                                                 \
  do {                                                                       \
    if (!(cond)) dt_fail(__FILE__, __LINE__, __VA_ARGS__);                   \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                   \
  do {                                                                       \
    long long dt_a_ = (long long)(a), dt_b_ = (long long)(b);                \
    if (dt_a_ != dt_b_)                                                      \
      dt_fail(__FILE__, __LINE__, "%s == %s failed: %lld != %lld", #a, #b,   \
              dt_a_, dt_b_);                                                 \
  } while (0)

#define CHECK_EQ_STR(a, b)                                                   \
  do {                                                                       \
    const char *dt_a_ = (a), *dt_b_ = (b);                                   \
    if (!dt_a_ || !dt_b_ || strcmp(dt_a_, dt_b_) != 0)                       \
      dt_fail(__FILE__, __LINE__, "%s == %s failed:\n  '%s'\n  '%s'", #a, #b,\
              dt_a_ ? dt_a_ : "(null)", dt_b_ ? dt_b_ : "(null)");           \
  } while (0)

/* Substring check, the usual way to pin an error message. */
#define CHECK_CONTAINS(hay, needle)                                          \
  do {                                                                       \
    const char *dt_h_ = (hay), *dt_n_ = (needle);                            \
    if (!dt_h_ || !strstr(dt_h_, dt_n_))                                     \
      dt_fail(__FILE__, __LINE__, "'%s' does not contain '%s'",              \
              dt_h_ ? dt_h_ : "(null)", dt_n_);                              \
  } while (0)

/* expr must return DDPLUG_OK; otherwise print the status and last error. */
#define CHECK_OK(expr)                                                       \
  do {                                                                       \
    int dt_s_ = (expr);                                                      \
    if (dt_s_ != DDPLUG_OK)                                                  \
      dt_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr,               \
              ddplug_status_name(dt_s_), ddplug_last_error());               \
  } while (0)

/* expr must return status st. */
#define CHECK_STATUS(expr, st)                                               \
  do {                                                                       \
    int dt_s_ = (expr);                                                      \
    if (dt_s_ != (st))                                                       \
      dt_fail(__FILE__, __LINE__, "%s returned %s, expected %s (last error: %s)", \
              #expr, ddplug_status_name(dt_s_), ddplug_status_name(st),      \
              ddplug_last_error());                                          \
  } while (0)

/* ---- multi-process helpers ---------------------------------------------- */

/* A TCP port that was free a moment ago on 127.0.0.1, chosen below the
 * kernel's ephemeral port range (so no outgoing connection, a rank's own
 * included, can be given it meanwhile). */
int dt_free_port(void);

/* Run fn(rank, world, arg) in `world` forked children with the environment
 * of a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>) plus extra_env entries
 * ("NAME=value", NULL-terminated, may be NULL). A rank passes by returning
 * (exit 0); a CHECK failing in it exits 1. Waits at most timeout_s, killing
 * stragglers (reported as failing). statuses (may be NULL) gets each
 * child's wait status. Returns the number of ranks that failed. */
typedef void (*dt_rank_fn)(int rank, int world, void *arg);
int dt_run_ranks(int world, dt_rank_fn fn, void *arg,
                 const char *const *extra_env, int timeout_s, int *statuses);

/* Fork one child running fn(arg); returns its pid. */
pid_t dt_fork(void (*fn)(void *), void *arg);
/* Wait for pid at most timeout_ms; returns 0 and the wait status, or -1 on
 * timeout (the child is left running). */
int dt_wait_pid(pid_t pid, int timeout_ms, int *status);

/* Paths the build passes through the environment. */
const char *dt_source_dir(void); /* DDPLUG_SOURCE_DIR */
const char *dt_build_dir(void);  /* DDPLUG_BUILD_DIR  */

/* Write text to a fresh temporary file; returns its path (static buffer per
 * call slot, freed at exit). */
const char *dt_temp_file(const char *suffix, const char *text);

#endif
