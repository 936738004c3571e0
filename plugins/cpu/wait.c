/*
 * wait.c — how a rank waits for another: counters in shared memory, spin
 * briefly, then sleep on a futex.
 *
 * A waiter spins for the group's spin time (cheap when the peer runs on
 * another core), then announces itself in the counter's `waiters` field and
 * sleeps on the counter word with FUTEX_WAIT; a poster stores the new value
 * and issues FUTEX_WAKE only when someone announced itself. Both sides use
 * sequentially consistent accesses, so a post cannot slip between the
 * waiter's check and its sleep (the kernel re-checks the word atomically).
 * Sleeping is sliced (at most DDCPU_SLICE_NS at a time): between slices the
 * waiter checks the group's failure state and its peers' liveness, so a
 * peer that dies without posting is noticed within a slice. Ranks may
 * outnumber cores: after the short spin a waiter yields its CPU to the rank
 * it waits for.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Longest sleep between liveness checks; node leaders of a multi-node group
 * also watch their ring sockets for abort records then, so they sleep less. */
#define DDCPU_SLICE_NS (50ull * 1000 * 1000)
#define DDCPU_LEADER_SLICE_NS (10ull * 1000 * 1000)
/* Poll slice for socket waits (shm failure flags are checked in between). */
#define DDCPU_POLL_SLICE_MS 20

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

uint64_t ddcpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ddcpu_deadline(int64_t timeout_ms) {
  if (timeout_ms < 0) return UINT64_MAX;
  return ddcpu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val,
                  const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* Publish v and wake sleepers. Callable from any thread or process. */
void ddcpu_ctr_post(ddcpu_ctr *c, uint32_t v) {
  atomic_store_explicit(&c->val, v, memory_order_seq_cst);
  if (atomic_load_explicit(&c->waiters, memory_order_seq_cst) != 0)
    futex(&c->val, FUTEX_WAKE, INT_MAX, NULL);
}

/* Wake all sleepers without changing the value (they re-check state). */
void ddcpu_ctr_wake(ddcpu_ctr *c) {
  if (atomic_load_explicit(&c->waiters, memory_order_seq_cst) != 0)
    futex(&c->val, FUTEX_WAKE, INT_MAX, NULL);
}

/* Sleep while c->val == seen, at most timeout_ns. shared: the counter lives
 * in memory shared between processes (no FUTEX_PRIVATE_FLAG). */
void ddcpu_ctr_sleep(ddcpu_ctr *c, uint32_t seen, uint64_t timeout_ns, int shared) {
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull),
                        (long)(timeout_ns % 1000000000ull)};
  atomic_fetch_add_explicit(&c->waiters, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&c->val, memory_order_seq_cst) == seen)
    futex(&c->val, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, seen, &ts);
  atomic_fetch_sub_explicit(&c->waiters, 1, memory_order_seq_cst);
}

/* A local rank that left (group_destroy) without reaching arrival `until`:
 * it never will. (One that departed after arriving is no reason to stop
 * waiting for another: returning at once would turn the wait into a spin.) */
static int never_arrives(ddcpu_group *g, uint32_t until) {
  for (int j = 0; j < g->local_world; j++)
    if (atomic_load_explicit(&g->shm.procs[j].departed, memory_order_acquire) &&
        !ddcpu_ctr_ge(&g->shm.ctl[j].arrive, until))
      return 1;
  return 0;
}

/* Wait for a counter: spin, then sliced futex sleeps with liveness checks. */
static int wait_ctr(ddcpu_group *g, ddcpu_ctr *c, uint32_t until, int poster,
                    uint64_t deadline) {
  if (ddcpu_ctr_ge(c, until)) return 0;
  int arrival = poster >= 0 && g->has_shm;
  uint64_t start = ddcpu_now_ns();
  /* The progress thread spinning while this rank's caller computes (nobody
   * waits for it) would take the CPU from that computation when the node's
   * ranks have no CPU to spare: it sleeps at once instead. */
  uint64_t spin = g->exec_by_thread && !g->spare_cpu &&
                          atomic_load_explicit(&g->callers_waiting, memory_order_relaxed) == 0
                      ? 0 : g->spin_ns;
  uint64_t spin_end = DDCPU_MIN(start + spin, deadline);
  unsigned iter = 0;
  while (ddcpu_now_ns() < spin_end) {
    for (int i = 0; i < 64; i++) {
      if (ddcpu_ctr_ge(c, until)) return 0;
      cpu_relax();
    }
    if ((++iter & 15u) == 0) {
      int fs = ddcpu_fail_status(g);
      if (fs) return fs;
    }
  }
  for (;;) {
    if (ddcpu_ctr_ge(c, until)) return 0;
    int fs = ddcpu_fail_status(g);
    if (fs) return fs;
    /* waiting for arrivals and a local rank left (group_destroy): it will
     * never arrive; the step sees that and reports it */
    if (arrival && never_arrives(g, until)) return 0;
    uint64_t now = ddcpu_now_ns();
    if (now >= deadline) return DDCPU_AGAIN;
    uint64_t max_slice = g->leader && g->num_nodes > 1 ? DDCPU_LEADER_SLICE_NS : DDCPU_SLICE_NS;
    uint64_t slice = DDCPU_MIN(max_slice, deadline - now);
    uint32_t seen = atomic_load_explicit(&c->val, memory_order_seq_cst);
    if (ddcpu_seq_ge(seen, until)) return 0;
    ddcpu_ctr_sleep(c, seen, slice, 1);
    if (ddcpu_ctr_ge(c, until)) return 0;
    /* Woken by a failure, a slice end or a spurious wake: check peers. */
    if (ddcpu_now_ns() - now >= slice / 2) {
      fs = ddcpu_liveness_poll(g, 0);
      if (fs) return fs;
    }
  }
}

/* Wait for socket readiness with liveness descriptors in the same poll. */
static int wait_fds(ddcpu_group *g, const ddcpu_wait_target *t, uint64_t deadline) {
  struct pollfd pfd[2 + DDCPU_MAX_LOCAL + 8];
  for (;;) {
    int fs = ddcpu_fail_status(g);
    if (fs) return fs;
    uint64_t now = ddcpu_now_ns();
    if (now >= deadline) return DDCPU_AGAIN;
    int n = 0;
    for (int i = 0; i < t->nfds; i++) pfd[n++] = t->fds[i];
    n += ddcpu_liveness_fds(g, pfd + n, (int)(sizeof pfd / sizeof pfd[0]) - n);
    uint64_t left_ms = (deadline - now + 999999ull) / 1000000ull;
    int timeout = (int)DDCPU_MIN(left_ms, (uint64_t)DDCPU_POLL_SLICE_MS);
    int r = poll(pfd, (nfds_t)n, timeout);
    if (r < 0 && errno != EINTR)
      return ddcpu_fail_set(g, DDPLUG_E_SYSTEM, g->rank, g->rank,
                            "rank %d: poll failed: %s", g->rank, strerror(errno));
    if (r <= 0) continue;
    int ready = 0;
    for (int i = 0; i < t->nfds; i++)
      if (pfd[i].revents) ready = 1;
    int live = 0;
    for (int i = t->nfds; i < n; i++)
      if (pfd[i].revents) live = 1;
    if (live) {
      fs = ddcpu_liveness_poll(g, 0);
      if (fs) return fs;
    }
    if (ready) return 0;
  }
}

/* See internal.h. Called only by the thread executing collectives. */
int ddcpu_wait(ddcpu_group *g, const ddcpu_wait_target *t, uint64_t deadline_ns) {
  if (t->kind == DDCPU_WAIT_CTR) return wait_ctr(g, t->ctr, t->until, t->poster, deadline_ns);
  return wait_fds(g, t, deadline_ns);
}
