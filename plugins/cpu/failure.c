/*
 * failure.c — the group's failure record and how failures travel.
 *
 * A group fails once: the first of an abort (group_abort on any rank), a
 * lost peer, or a broken socket wins, on every rank — except that a peer
 * found dead after an abort upgrades the abort to PEER_LOST (the runtime's
 * failure watcher may pass a peer's death on as an abort before the plugin
 * sees it; a blocked collective woken by an abort waits up to 150 ms for
 * such an upgrade, ddcpu_fail_settle). The record (status,
 * the rank lost or aborting, who noticed, a sentence) lives in the process
 * and in the node's shared memory; a rank that fails first writes it there,
 * every other local rank adopts it from there, so all ranks of a node
 * report the same cause. Node leaders also send it backwards around the
 * TCP ring (each leader forwards the first record it learns to its
 * previous node), so the record reaches every node even when one leader is
 * dead: the dead leader's previous node notices the broken socket itself
 * and starts the propagation that covers the rest.
 *
 * Liveness: a rank holds a pidfd for every other rank of its node; a pidfd
 * becomes readable when that process exits, whatever the cause (SIGKILL
 * included). Where pidfd_open is missing (kernels before 5.3, valgrind)
 * the peers' /proc entries are checked instead at every liveness poll (a
 * zombie or a process with another start time counts as gone). A rank that leaves through group_destroy marks itself departed
 * in shared memory first, so a clean exit is not mistaken for a loss.
 * Remote peers are watched through the ring sockets: end-of-file without a
 * goodbye record means the neighbouring leader is gone.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static int prev_node(const ddcpu_group *g) {
  return (g->node + g->num_nodes - 1) % g->num_nodes;
}
static int next_node(const ddcpu_group *g) {
  return (g->node + 1) % g->num_nodes;
}

/* ---- the record ------------------------------------------------------------
 * Two write-once slots (in the process and in the node's segment): slot 0
 * holds the first failure; slot 1 a PEER_LOST that arrives after slot 0
 * said something else (an abort the runtime's watcher passed on before the
 * plugin itself saw the peer die). The effective failure is slot 1 if set,
 * else slot 0. Write-once slots need no lock: a writer claims a slot by
 * CAS, fills it, and publishes it with a release store; readers read only
 * published slots. */

static int slot_write(ddcpu_fail_rec *f, int status, int rank, int origin, const char *msg) {
  uint32_t expect = 0;
  if (!atomic_compare_exchange_strong(&f->state, &expect, 1)) return 0;
  f->status = status;
  f->rank = rank;
  f->origin = origin;
  snprintf(f->msg, sizeof f->msg, "%s", msg);
  atomic_store_explicit(&f->state, 2, memory_order_release);
  return 1;
}

static int slot_ready(ddcpu_fail_rec *f) {
  uint32_t st = atomic_load_explicit(&f->state, memory_order_acquire);
  while (st == 1) st = atomic_load_explicit(&f->state, memory_order_acquire);
  return st == 2;
}

/* The effective record of a pair of slots, or NULL. */
static ddcpu_fail_rec *effective(ddcpu_fail_rec *f) {
  if (slot_ready(&f[1])) return &f[1];
  if (slot_ready(&f[0])) return &f[0];
  return NULL;
}

/* Write (status, ...) into the pair: slot 0 if free, else slot 1 when it
 * upgrades slot 0 to PEER_LOST. Returns 1 if the effective record changed. */
static int pair_write(ddcpu_fail_rec *f, int status, int rank, int origin, const char *msg) {
  if (slot_write(&f[0], status, rank, origin, msg)) return 1;
  slot_ready(&f[0]);
  if (status == DDPLUG_E_PEER_LOST && f[0].status != DDPLUG_E_PEER_LOST)
    return slot_write(&f[1], status, rank, origin, msg);
  return 0;
}

/* Send the effective record backwards around the ring, once per slot. A
 * record whose origin is on the previous node came from there: the circle
 * is closed. */
static void ring_tell(ddcpu_group *g) {
  if (!g->leader || g->num_nodes < 2 || g->prev_fd < 0) return;
  ddcpu_fail_rec *f = effective(g->fail);
  if (!f) return;
  int slot = f == &g->fail[1];
  if (atomic_exchange(&g->ring_told[slot], 1)) return;
  if (f->origin >= 0 && f->origin < g->world && g->node_of[f->origin] == prev_node(g)) return;
  ddcpu_ctl_msg m;
  ddcpu_ctl_init(g, &m, DDCPU_MSG_ABORT);
  m.status = f->status;
  m.rank = f->rank;
  m.origin = f->origin;
  m.origin_node = f->origin >= 0 && f->origin < g->world ? g->node_of[f->origin] : g->node;
  snprintf(m.msg, sizeof m.msg, "%s", f->msg);
  pthread_mutex_lock(&g->ctl_mu);
  (void)ddcpu_tcp_send_all(g->prev_fd, &m, sizeof m, ddcpu_deadline(200));
  pthread_mutex_unlock(&g->ctl_mu);
}

/* Wake every sleeper: shm counters of the node, the engine's event. */
void ddcpu_wake_all(ddcpu_group *g) {
  if (g->has_shm && g->shm.hdr) {
    for (int j = 0; j < g->local_world; j++) {
      ddcpu_rank_ctl *c = &g->shm.ctl[j];
      ddcpu_ctr_wake(&c->arrive);
      ddcpu_ctr_wake(&c->copied_in);
      ddcpu_ctr_wake(&c->reduced);
      ddcpu_ctr_wake(&c->copied_out);
      ddcpu_p2p_bell_ring(&g->shm.bell[j]);
    }
    ddcpu_ctr_wake(&g->shm.hdr->attached);
    ddcpu_ctr_wake(&g->shm.hdr->verdict);
  }
  atomic_fetch_add(&g->ev.val, 1);
  ddcpu_ctr_wake(&g->ev);
  if (g->p2p) ddcpu_p2p_bell_ring(g->p2p->bell); /* point-to-point waiters */
}

/* Record a failure: shared memory first (so the node agrees), then the
 * process; tell the ring and wake everything. Returns the status now in
 * force. */
static int record(ddcpu_group *g, int status, int rank, int origin, const char *msg) {
  const ddcpu_fail_rec *src = NULL;
  ddcpu_fail_rec mine = {0};
  if (g->has_shm && g->shm.hdr) {
    pair_write(g->shm.hdr->fail, status, rank, origin, msg);
    src = effective(g->shm.hdr->fail);
  } else {
    mine.status = status;
    mine.rank = rank;
    mine.origin = origin;
    snprintf(mine.msg, sizeof mine.msg, "%s", msg);
    src = &mine;
  }
  if (pair_write(g->fail, src->status, src->rank, src->origin, src->msg)) {
    ddcpu_fail_rec *f = effective(g->fail);
    atomic_store_explicit(&g->fail_status, f->status, memory_order_release);
    uint64_t one = 1;
    if (g->abort_fd >= 0) (void)!write(g->abort_fd, &one, sizeof one);
    ddcpu_log(g, f->status == DDPLUG_E_ABORTED ? DDPLUG_LOG_INFO : DDPLUG_LOG_WARN,
              "cpu plugin: group failed (%s): %s",
              f->status == DDPLUG_E_PEER_LOST ? "peer lost" :
              f->status == DDPLUG_E_ABORTED ? "aborted" : "error", f->msg);
  }
  ring_tell(g);
  ddcpu_wake_all(g);
  return atomic_load_explicit(&g->fail_status, memory_order_acquire);
}

/* See internal.h. Thread-safe; may be called from any thread. */
int ddcpu_fail_set(ddcpu_group *g, int status, int rank, int origin,
                   const char *fmt, ...) {
  char msg[DDCPU_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return record(g, status, rank, origin, msg);
}

int ddcpu_fail_adopt(ddcpu_group *g, int status, int rank, int origin,
                     const char *msg, int from_ring) {
  (void)from_ring;
  return record(g, status, rank, origin, msg);
}

/* See internal.h. Lock-free: a few atomic loads on the healthy path. */
int ddcpu_fail_status(ddcpu_group *g) {
  int st = atomic_load_explicit(&g->fail_status, memory_order_acquire);
  if (g->has_shm && g->shm.hdr && st != DDPLUG_E_PEER_LOST) {
    ddcpu_fail_rec *f = g->shm.hdr->fail;
    int shm_set = atomic_load_explicit(&f[0].state, memory_order_acquire) != 0;
    int shm_up = atomic_load_explicit(&f[1].state, memory_order_acquire) != 0;
    if ((shm_set && st == 0) || (shm_up && !atomic_load(&g->fail[1].state))) {
      ddcpu_fail_rec *e = effective(f);
      if (e) return record(g, e->status, e->rank, e->origin, e->msg);
    }
  }
  return st;
}

const ddcpu_fail_rec *ddcpu_fail_get(ddcpu_group *g) {
  ddcpu_fail_status(g);
  return effective(g->fail);
}

int ddcpu_fail_report(ddcpu_group *g) {
  int st = ddcpu_fail_status(g);
  if (st) ddcpu_errmsg_set(effective(g->fail)->msg);
  return st;
}

/* See internal.h. Executor only. */
int ddcpu_fail_settle(ddcpu_group *g, uint64_t deadline_ns) {
  int st = ddcpu_fail_status(g);
  uint64_t until = DDCPU_MIN(ddcpu_now_ns() + 150ull * 1000 * 1000, deadline_ns);
  while (st == DDPLUG_E_ABORTED && ddcpu_now_ns() < until) {
    ddcpu_liveness_poll(g, 10);
    st = ddcpu_fail_status(g);
  }
  return ddcpu_fail_report(g);
}

/* ---- liveness ---------------------------------------------------------------- */

int ddcpu_liveness_open(ddcpu_group *g) {
  for (int j = 0; j < g->local_world; j++) {
    g->pidfd[j] = -1;
    int r = g->local_ranks[j];
    if (r == g->rank) continue;
    long fd = syscall(SYS_pidfd_open, (pid_t)g->pid_of[r], 0);
    if (fd < 0) {
      int e = errno;
      if (e == ENOSYS) {
        ddcpu_log(g, DDPLUG_LOG_INFO,
                  "cpu plugin: pidfd_open unavailable; watching same-node "
                  "peers through /proc instead");
        g->pid_poll = 1;
        continue;
      }
      return ddcpu_err_errno(DDPLUG_E_PEER_LOST, e,
                             "rank %d: cannot watch rank %d (pid %lld) on this "
                             "node: it is not running", g->rank, r,
                             (long long)g->pid_of[r]);
    }
    g->pidfd[j] = (int)fd;
  }
  return DDPLUG_OK;
}

void ddcpu_liveness_close(ddcpu_group *g) {
  if (!g->pidfd) return;
  for (int j = 0; j < g->local_world; j++)
    if (g->pidfd[j] >= 0) {
      close(g->pidfd[j]);
      g->pidfd[j] = -1;
    }
}

/* See internal.h. Only the executing thread (or the idle progress thread while
 * it holds the executor role) calls this. */
int ddcpu_liveness_fds(ddcpu_group *g, struct pollfd *pfd, int cap) {
  int n = 0;
  int st = ddcpu_fail_status(g);
  /* after an abort, keep watching: a peer's death still upgrades it */
  if (st && st != DDPLUG_E_ABORTED) return 0;
  if (!st && g->abort_fd >= 0 && n < cap) pfd[n++] = (struct pollfd){g->abort_fd, POLLIN, 0};
  for (int j = 0; j < g->local_world && n < cap; j++)
    if (g->pidfd[j] >= 0 && !atomic_load(&g->pid_gone[j]))
      pfd[n++] = (struct pollfd){g->pidfd[j], POLLIN, 0};
  if (g->leader && g->num_nodes > 1) {
    if (g->next_fd >= 0 && !g->next_bye && n < cap)
      pfd[n++] = (struct pollfd){g->next_fd, POLLIN, 0};
    if (g->prev_fd >= 0 && !g->prev_bye && !g->ring_active && n < cap)
      pfd[n++] = (struct pollfd){g->prev_fd, POLLRDHUP, 0};
  }
  return n;
}

/* Read control records from the next leader (non-blocking). */
static void read_control(ddcpu_group *g) {
  for (;;) {
    ssize_t n = recv(g->next_fd, g->ctl_rx + g->ctl_rx_len,
                     sizeof(ddcpu_ctl_msg) - g->ctl_rx_len, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      n = 0; /* reset: treat like a hang-up */
    }
    if (n == 0) {
      if (!g->next_bye && !ddcpu_fail_status(g)) {
        int r = g->leaders[next_node(g)];
        ddcpu_fail_set(g, DDPLUG_E_PEER_LOST, r, g->rank,
                       "rank %d (leader of node %d, pid %lld) closed its "
                       "connection without saying goodbye: it exited or was "
                       "killed (noticed by rank %d)", r, next_node(g),
                       (long long)g->pid_of[r], g->rank);
      }
      g->next_bye = 1;
      return;
    }
    g->ctl_rx_len += (size_t)n;
    if (g->ctl_rx_len < sizeof(ddcpu_ctl_msg)) continue;
    ddcpu_ctl_msg m;
    memcpy(&m, g->ctl_rx, sizeof m);
    g->ctl_rx_len = 0;
    if (m.magic != DDCPU_TCP_MAGIC || m.run_hash != g->run_hash) {
      ddcpu_fail_set(g, DDPLUG_E_INTERNAL, g->leaders[next_node(g)], g->rank,
                     "rank %d: garbage on the ring connection from node %d "
                     "(not a ddplug cpu-plugin control record)", g->rank, next_node(g));
      return;
    }
    m.msg[sizeof m.msg - 1] = '\0';
    if (m.type == DDCPU_MSG_BYE) {
      g->next_bye = 1;
    } else if (m.type == DDCPU_MSG_ABORT) {
      ddcpu_fail_adopt(g, m.status, m.rank, m.origin, m.msg, 1);
    }
  }
}

/* See internal.h. The neighbour's socket broke: if it left because its group
 * failed, its abort record travels backwards around the ring and arrives
 * on our control channel (from the next node) within moments; wait for it
 * a little (DDCPU_RING_GRACE_NS from the first break, never past deadline_ns,
 * so request_test does not block) so every rank names the same cause.
 * Otherwise the neighbour itself is lost. Executor only. */
#define DDCPU_RING_GRACE_NS (200ull * 1000 * 1000)
int ddcpu_ring_broken(ddcpu_group *g, int node, const char *what, int err,
                      uint64_t deadline_ns) {
  int st = ddcpu_fail_status(g);
  if (st) return st; /* expected after a failure */
  if (g->next_fd >= 0 && !g->next_bye) read_control(g); /* what is there now */
  if ((st = ddcpu_fail_status(g))) return st;
  /* A neighbour that said goodbye (with the group healthy: a goodbye
   * received after a failure is not looked at) closed its group cleanly:
   * the ring is broken for good, and a failure record from beyond it
   * cannot come round. It is the cause, whichever socket broke. */
  int left = -1;
  if (g->next_fd >= 0 && g->next_bye) left = next_node(g);
  else if (g->prev_bye) left = prev_node(g);
  if (left >= 0) {
    int who = g->leaders[left];
    return ddcpu_fail_set(g, DDPLUG_E_PEER_LOST, who, g->rank,
                          "rank %d (leader of node %d, pid %lld) closed its group "
                          "(group_destroy) and left the ring: no collective of "
                          "this group can complete without it; every rank must "
                          "issue the same collectives before destroying its group "
                          "(noticed by rank %d)", who, left,
                          (long long)g->pid_of[who], g->rank);
  }
  uint64_t now = ddcpu_now_ns();
  if (g->ring_broken_ns == 0) g->ring_broken_ns = now;
  uint64_t until = g->ring_broken_ns + DDCPU_RING_GRACE_NS;
  uint64_t stop = DDCPU_MIN(until, deadline_ns);
  while (!ddcpu_fail_status(g) && g->next_fd >= 0 && !g->next_bye && now < stop) {
    struct pollfd p = {g->next_fd, POLLIN, 0};
    int ms = (int)DDCPU_MIN((stop - now + 999999ull) / 1000000ull, 20ull);
    if (poll(&p, 1, ms) > 0) read_control(g);
    now = ddcpu_now_ns();
  }
  st = ddcpu_fail_status(g);
  if (st) return st;
  if (now < until && g->next_fd >= 0 && !g->next_bye) return DDCPU_AGAIN;
  int who = g->leaders[node];
  return ddcpu_fail_set(g, DDPLUG_E_PEER_LOST, who, g->rank,
                        "rank %d (leader of node %d, pid %lld) is gone: %s "
                        "(noticed by rank %d)%s%s", who, node,
                        (long long)g->pid_of[who], what, g->rank,
                        err ? ": " : "", err ? strerror(err) : "");
}

/* The previous leader hung up while no ring phase reads from it: a goodbye
 * record is a clean exit, anything else a loss. */
static void read_prev_hangup(ddcpu_group *g) {
  ddcpu_ctl_msg m;
  size_t got = 0;
  while (got < sizeof m) {
    ssize_t n = recv(g->prev_fd, (char *)&m + got, sizeof m - got, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (got == sizeof m && m.magic == DDCPU_TCP_MAGIC && m.type == DDCPU_MSG_BYE) {
    g->prev_bye = 1; /* a clean exit: stop watching it */
    return;
  }
  (void)ddcpu_ring_broken(g, prev_node(g),
                          "it closed its connection without saying goodbye: it "
                          "exited or was killed", 0, UINT64_MAX);
  g->prev_bye = 1; /* stop watching it either way */
}

/* See internal.h. Thread-safe (the progress thread calls it while another
 * thread executes). */
void ddcpu_peer_exited(ddcpu_group *g, int j) {
  int peer = g->local_ranks[j];
  atomic_store(&g->pid_gone[j], 1);
  if (g->has_shm && atomic_load(&g->shm.procs[j].departed)) {
    /* a clean exit; a collective waiting for its arrival re-checks and
     * reports that the rank closed its group */
    ddcpu_ctr_wake(&g->shm.ctl[j].arrive);
    return;
  }
  ddcpu_fail_set(g, DDPLUG_E_PEER_LOST, peer, g->rank,
                 "rank %d (pid %lld, node %d) exited while the group was "
                 "running: killed or crashed (noticed by rank %d on the same "
                 "node)", peer, (long long)g->pid_of[peer], g->node, g->rank);
}

/* Without pidfds: is each peer still the process that attached? */
static void poll_proc(ddcpu_group *g) {
  for (int j = 0; j < g->local_world; j++) {
    if (g->local_ranks[j] == g->rank || g->pidfd[j] >= 0 || atomic_load(&g->pid_gone[j]))
      continue;
    uint64_t start = g->has_shm ? atomic_load(&g->shm.procs[j].start_time) : 0;
    if (!ddcpu_proc_alive(g->pid_of[g->local_ranks[j]], start)) ddcpu_peer_exited(g, j);
  }
}

/* See internal.h. */
int ddcpu_liveness_poll(ddcpu_group *g, int timeout_ms) {
  struct pollfd pfd[DDCPU_MAX_LOCAL + 8];
  int st = ddcpu_fail_status(g);
  if (st && st != DDPLUG_E_ABORTED) return st;
  if (g->pid_poll) poll_proc(g);
  int n = ddcpu_liveness_fds(g, pfd, (int)(sizeof pfd / sizeof pfd[0]));
  if (n == 0) return 0;
  int r = poll(pfd, (nfds_t)n, timeout_ms);
  if (r <= 0) return ddcpu_fail_status(g);
  for (int i = 0; i < n; i++) {
    if (!pfd[i].revents) continue;
    int fd = pfd[i].fd;
    if (fd == g->abort_fd) continue;
    for (int j = 0; j < g->local_world; j++)
      if (g->pidfd[j] == fd) ddcpu_peer_exited(g, j);
    if (g->leader && g->num_nodes > 1) {
      if (fd == g->next_fd && !g->next_bye) read_control(g);
      else if (fd == g->prev_fd && !g->prev_bye && !g->ring_active)
        read_prev_hangup(g);
    }
  }
  return ddcpu_fail_status(g);
}

/* ---- while the group is being created ------------------------------------- */

/* How often group_create's waits ask the runtime whether the run failed. */
#define DDCPU_STARTUP_PROBE_NS (100ull * 1000 * 1000)

/* See internal.h. */
int ddcpu_startup_check(ddcpu_group *g, const char *key, const char *what,
                        uint64_t *next_probe_ns) {
  uint64_t now = ddcpu_now_ns();
  if (now < *next_probe_ns) return DDPLUG_OK;
  *next_probe_ns = now + DDCPU_STARTUP_PROBE_NS;
  /* A wait for a key that exists returns at once, unless the run has
   * failed: the runtime's waits end early with the run's failure (a rank
   * that died anywhere is the store's departure signal), and a lost store
   * fails the call. */
  const char *keys[1] = {key};
  int st = g->svc->store_wait(g->svc->host, keys, 1, 0);
  if (st == DDPLUG_OK || st == DDPLUG_E_TIMEOUT) return DDPLUG_OK;
  return ddcpu_err(st, "rank %d: the run failed while %s", g->rank, what);
}
