/*
 * group.c — the cpu plugin's group slots: group_create (the topology from
 * the runtime's arrays, the node segment, liveness, the single-copy probe,
 * the TCP ring between node leaders, point-to-point, the progress thread),
 * group_destroy and group_abort.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define DEFAULT_CREATE_TIMEOUT_MS 300000

static int valid_run_id(const char *s) {
  if (!s || !*s || strlen(s) > 32) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9') || *s == '_'))
      return 0;
  return 1;
}

/* CPUs this process may run on: its affinity mask (taskset, cgroup
 * cpusets, a launcher's binding), not every CPU the machine has online;
 * the online count if the mask cannot be read. */
static long usable_cpus(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  long conf = sysconf(_SC_NPROCESSORS_CONF);
  int n = (int)DDCPU_MAX(DDCPU_MAX(online, conf), 1024L);
  for (int tries = 0; tries < 4; tries++, n *= 4) {
    cpu_set_t *set = CPU_ALLOC(n);
    if (!set) break;
    size_t sz = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(sz, set);
    if (sched_getaffinity(0, sz, set) == 0) {
      int c = CPU_COUNT_S(sz, set);
      CPU_FREE(set);
      if (c > 0) return c;
      break;
    }
    int e = errno;
    CPU_FREE(set);
    if (e != EINVAL) break; /* EINVAL: the kernel's mask is larger */
  }
  return online;
}

/* Check the world description; fills the derived topology of g. */
static int topology(ddcpu_group *g, const ddplug_group_init *in) {
  if (in->world_size < 1 || in->rank < 0 || in->rank >= in->world_size)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "group_create: rank %d / world size %d is not a valid rank",
                     in->rank, in->world_size);
  if (in->num_nodes < 1 || in->num_nodes > in->world_size ||
      in->node_rank < 0 || in->node_rank >= in->num_nodes)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "group_create: node %d of %d nodes is not valid for a world "
                     "of %d", in->node_rank, in->num_nodes, in->world_size);
  if (!in->node_of_rank || !in->local_rank_of || !in->pid_of_rank)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "group_create: node_of_rank, local_rank_of and pid_of_rank "
                     "are required");
  if (!valid_run_id(in->run_id))
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "group_create: run_id '%s' must be 1-32 characters of "
                     "[A-Za-z0-9_]", in->run_id ? in->run_id : "(null)");
  int W = in->world_size, L = in->num_nodes;
  g->rank = in->rank;
  g->world = W;
  g->node = in->node_rank;
  g->num_nodes = L;
  g->node_of = calloc((size_t)W, sizeof *g->node_of);
  g->local_of = calloc((size_t)W, sizeof *g->local_of);
  g->pid_of = calloc((size_t)W, sizeof *g->pid_of);
  g->leaders = calloc((size_t)L, sizeof *g->leaders);
  g->node_size = calloc((size_t)L, sizeof *g->node_size);
  g->node_ranks = calloc((size_t)L, sizeof *g->node_ranks);
  if (!g->node_of || !g->local_of || !g->pid_of || !g->leaders ||
      !g->node_size || !g->node_ranks)
    return ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory");
  memcpy(g->node_of, in->node_of_rank, sizeof(int32_t) * (size_t)W);
  memcpy(g->local_of, in->local_rank_of, sizeof(int32_t) * (size_t)W);
  memcpy(g->pid_of, in->pid_of_rank, sizeof(int64_t) * (size_t)W);
  for (int r = 0; r < W; r++) {
    if (g->node_of[r] < 0 || g->node_of[r] >= L)
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "group_create: node_of_rank[%d] = %d is not in [0, %d)",
                       r, g->node_of[r], L);
    g->node_size[g->node_of[r]]++;
  }
  for (int n = 0; n < L; n++) {
    if (g->node_size[n] == 0)
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "group_create: node %d has no ranks", n);
    if (g->node_size[n] > DDCPU_MAX_LOCAL)
      return ddcpu_err(DDPLUG_E_UNSUPPORTED,
                       "group_create: %d ranks on node %d; plugin cpu supports "
                       "at most %d per node", g->node_size[n], n, DDCPU_MAX_LOCAL);
    g->node_ranks[n] = calloc((size_t)g->node_size[n], sizeof(int32_t));
    if (!g->node_ranks[n]) return ddcpu_err(DDPLUG_E_NO_MEMORY, "out of memory");
    g->node_size[n] = 0;
  }
  for (int r = 0; r < W; r++) {
    int n = g->node_of[r];
    g->node_ranks[n][g->node_size[n]++] = r;
  }
  g->local_world = g->node_size[g->node];
  g->local_rank = g->local_of[g->rank];
  if (in->local_rank != g->local_rank || in->local_world_size != g->local_world ||
      g->node_of[g->rank] != g->node)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "group_create: rank %d: local rank %d of %d on node %d "
                     "disagrees with the arrays (local %d of %d on node %d)",
                     g->rank, in->local_rank, in->local_world_size, in->node_rank,
                     g->local_rank, g->local_world, g->node_of[g->rank]);
  g->local_ranks = calloc((size_t)g->local_world, sizeof *g->local_ranks);
  g->pidfd = calloc((size_t)g->local_world, sizeof *g->pidfd);
  g->pid_gone = calloc((size_t)g->local_world, sizeof *g->pid_gone);
  if (!g->local_ranks || !g->pidfd || !g->pid_gone)
    return ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory");
  for (int j = 0; j < g->local_world; j++) g->local_ranks[j] = -1;
  for (int j = 0; j < g->local_world; j++) g->pidfd[j] = -1;
  for (int n = 0; n < L; n++) g->leaders[n] = -1;
  for (int r = 0; r < W; r++) {
    int n = g->node_of[r], lr = g->local_of[r];
    if (lr < 0 || lr >= g->node_size[n])
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "group_create: local_rank_of[%d] = %d is not in [0, %d) "
                       "(node %d)", r, lr, g->node_size[n], n);
    if (lr == 0) g->leaders[n] = r;
    if (n == g->node) {
      if (g->local_ranks[lr] >= 0)
        return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                         "group_create: ranks %d and %d both have local rank %d "
                         "on node %d", g->local_ranks[lr], r, lr, n);
      g->local_ranks[lr] = r;
    }
  }
  g->leader = g->local_rank == 0;
  snprintf(g->run_id, sizeof g->run_id, "%s", in->run_id);
  snprintf(g->host_id, sizeof g->host_id, "%s", in->host_id ? in->host_id : "");
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = g->run_id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  g->run_hash = h;
  return DDPLUG_OK;
}

/* The node's segment was published but is gone when this rank attaches:
 * its creator removed it, which it does only when its group_create failed —
 * because the run failed (a rank died while joining) or it did itself. The
 * run's failure, which names the cause, reaches this rank within moments:
 * wait for it (at most 2 s, within deadline), or for the creator's death,
 * rather than report the missing file. The sentence of the attach stays in
 * the thread's buffer when neither comes. */
#define DDCPU_GONE_WAIT_NS (2000ull * 1000 * 1000)
static int segment_gone(ddcpu_group *g, const char *key, uint64_t deadline) {
  char attach[DDCPU_MSG_MAX];
  snprintf(attach, sizeof attach, "%s", ddcpu_errmsg());
  int creator = g->local_ranks[0];
  uint64_t until = DDCPU_MIN(deadline, ddcpu_now_ns() + DDCPU_GONE_WAIT_NS), next_probe = 0;
  while (ddcpu_now_ns() < until) {
    int st = ddcpu_startup_check(g, key, "attaching to the node's shared memory", &next_probe);
    if (st != DDPLUG_OK) return st;
    if (!ddcpu_proc_alive(g->pid_of[creator], 0))
      return ddcpu_err(DDPLUG_E_PEER_LOST,
                       "rank %d (pid %lld, local rank 0 of node %d) exited while the node's "
                       "ranks attached to its shared memory: killed or crashed while joining "
                       "(noticed by rank %d)", creator, (long long)g->pid_of[creator], g->node,
                       g->rank);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return ddcpu_err(DDPLUG_E_SYSTEM, "%s: rank %d (local rank 0 of node %d) removed it before "
                   "every rank attached (its group_create failed: its log says why)", attach,
                   creator, g->node);
}

/* Create or attach the node's segment; wait until every local rank is in,
 * then unlink its name. */
static int setup_shm(ddcpu_group *g, uint64_t deadline) {
  uint64_t arena = g->opt.registered_bytes >= 0 ? (uint64_t)g->opt.registered_bytes
                                                : ddcpu_shm_arena_auto(g->local_world);
  ddcpu_shm_params p = {g->run_id, g->local_world, g->node, g->num_nodes,
                     g->opt.slots, g->opt.chunk_bytes, g->opt.small_msg_bytes, arena};
  char key[32];
  snprintf(key, sizeof key, "shm/%d", g->node);
  int st;
  if (g->local_rank == 0) {
    ddcpu_shm_cleanup_stale(g);
    st = ddcpu_shm_create(&g->shm, &p);
    if (st != DDPLUG_OK) return st;
    g->has_shm = 1;
    st = g->svc->store_set(g->svc->host, key, g->shm.name, strlen(g->shm.name));
    if (st != DDPLUG_OK)
      return ddcpu_err(st, "rank %d: publishing the shared memory name failed", g->rank);
  } else {
    char name[128];
    uint64_t len = 0;
    int64_t ms = (int64_t)((deadline - DDCPU_MIN(deadline, ddcpu_now_ns())) / 1000000ull);
    st = g->svc->store_get(g->svc->host, key, name, sizeof name - 1, &len, ms);
    if (st != DDPLUG_OK)
      return ddcpu_err(st, "rank %d: rank %d (local rank 0 of node %d) never "
                       "published the node's shared memory (store key %s)",
                       g->rank, g->local_ranks[0], g->node, key);
    name[len] = '\0';
    if ((st = ddcpu_shm_attach(&g->shm, name, &p)) == DDPLUG_E_NOT_FOUND)
      st = segment_gone(g, key, deadline);
    if (st != DDPLUG_OK) return st;
    g->has_shm = 1;
  }
  ddcpu_shm_register(&g->shm, g->local_rank);
  /* the word peers probe the single copy with (direct.c) */
  atomic_store(&g->probe_word, g->run_hash);
  g->shm.procs[g->local_rank].probe_addr = (uint64_t)(uintptr_t)&g->probe_word;
  ddcpu_ctr *att = &g->shm.hdr->attached;
  atomic_fetch_add(&att->val, 1);
  ddcpu_ctr_wake(att);
  uint64_t next_probe = 0;
  while (!ddcpu_ctr_ge(att, (uint32_t)g->local_world)) {
    /* A local rank that died before attaching never will; a rank that died
     * anywhere else fails the run (the runtime says so). */
    for (int j = 0; j < g->local_world; j++) {
      int r = g->local_ranks[j];
      if (r == g->rank || atomic_load(&g->shm.procs[j].pid) != 0) continue;
      if (!ddcpu_proc_alive(g->pid_of[r], 0))
        return ddcpu_err(DDPLUG_E_PEER_LOST,
                         "rank %d (pid %lld, node %d) exited before it attached "
                         "to the node's shared memory: killed or crashed while "
                         "joining (noticed by rank %d)", r, (long long)g->pid_of[r],
                         g->node, g->rank);
    }
    if ((st = ddcpu_startup_check(g, key, "waiting for the node's ranks to attach "
                                  "to its shared memory", &next_probe)) != DDPLUG_OK)
      return st;
    uint64_t now = ddcpu_now_ns();
    if (now >= deadline) {
      char who[256] = "";
      size_t n = 0;
      for (int j = 0; j < g->local_world && n < sizeof who; j++)
        if (atomic_load(&g->shm.procs[j].pid) == 0)
          n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", n ? ", " : "",
                                g->local_ranks[j]);
      return ddcpu_err(DDPLUG_E_TIMEOUT,
                       "rank %d: ranks %s of node %d did not attach to the node's "
                       "shared memory in time", g->rank, who, g->node);
    }
    ddcpu_ctr_sleep(att, atomic_load(&att->val), DDCPU_MIN(deadline - now, 50000000ull), 1);
  }
  if (g->local_rank == 0) ddcpu_shm_unlink(&g->shm);
  for (int j = 0; j < g->local_world; j++) {
    int64_t pid = atomic_load(&g->shm.procs[j].pid);
    if (pid != g->pid_of[g->local_ranks[j]])
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "rank %d: pid_of_rank[%d] = %lld but the process that "
                       "attached as local rank %d is pid %lld", g->rank,
                       g->local_ranks[j], (long long)g->pid_of[g->local_ranks[j]],
                       j, (long long)pid);
  }
  return DDPLUG_OK;
}

static void teardown(ddcpu_group *g) {
  ddcpu_engine_stop(g);
  ddcpu_p2p_destroy(g);
  if (g->next_fd >= 0 || g->prev_fd >= 0) ddcpu_tcp_ring_close(g);
  if (g->has_shm) {
    atomic_store(&g->shm.procs[g->local_rank].departed, 1);
    /* a peer already waiting for this rank's arrival re-checks at once */
    ddcpu_ctr_wake(&g->shm.ctl[g->local_rank].arrive);
    if (g->shm.creator) ddcpu_shm_unlink(&g->shm);
    ddcpu_mem_detach(g); /* unmaps, keeping live registered buffers readable */
    ddcpu_shm_detach(&g->shm);
    g->has_shm = 0;
  } else {
    if (g->shm.creator) ddcpu_shm_unlink(&g->shm);
    ddcpu_mem_detach(g);
  }
  ddcpu_liveness_close(g);
  if (g->abort_fd >= 0) close(g->abort_fd);
  if (g->wake_fd >= 0) close(g->wake_fd);
  ddcpu_free_all_requests(g);
  pthread_mutex_destroy(&g->q_mu);
  pthread_mutex_destroy(&g->ctl_mu);
  pthread_mutex_destroy(&g->mem_mu);
  free(g->dscratch);
  if (g->node_ranks)
    for (int n = 0; n < g->num_nodes; n++) free(g->node_ranks[n]);
  free(g->node_ranks);
  free(g->node_of);
  free(g->local_of);
  free(g->pid_of);
  free(g->local_ranks);
  free(g->leaders);
  free(g->node_size);
  free(g->pidfd);
  free(g->pid_gone);
  free(g->ring_tmp);
  free(g->recs);
  free(g->arrived_local);
  free(g);
}

/* Create this rank's member of the group (collective; see plugin.h).
 * Blocks at most init->timeout_ms (5 minutes if unset) while the node's
 * ranks attach to shared memory and the leaders connect the ring. On
 * failure nothing is left allocated or open, *out is untouched and
 * set_error has the sentence. */
int ddcpu_group_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                       ddplug_plugin_group **out) {
  if (!svc || !init || !out) return DDPLUG_E_INVALID_ARGUMENT;
  if (!DDPLUG_HAS_FIELD(svc, ddplug_host_services, option_int_list))
    return DDPLUG_E_ABI_MISMATCH; /* the entry point serves only >= 1.3 */
  if (!DDPLUG_HAS_FIELD(init, ddplug_group_init, log_level))
    return ddcpu_report(svc, ddcpu_err(DDPLUG_E_ABI_MISMATCH,
                                 "group_create: ddplug_group_init of %u bytes is "
                                 "older than ABI 1.0", init->struct_size));
  ddcpu_group *g = calloc(1, sizeof *g);
  if (!g)
    return ddcpu_report(svc, ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory"));
  g->svc = svc;
  g->log_level = init->log_level;
  g->next_fd = g->prev_fd = g->abort_fd = g->wake_fd = -1;
  pthread_mutex_init(&g->q_mu, NULL);
  pthread_mutex_init(&g->ctl_mu, NULL);
  pthread_mutex_init(&g->mem_mu, NULL);
  g->shm.fd = -1;
  int st = ddcpu_options_read(svc, &g->opt);
  if (st == DDPLUG_OK) st = topology(g, init);
  if (st != DDPLUG_OK) {
    teardown(g);
    return ddcpu_report(svc, st);
  }
  g->timeout_ms = init->timeout_ms > 0 ? init->timeout_ms : DEFAULT_CREATE_TIMEOUT_MS;
  uint64_t deadline = ddcpu_deadline(g->timeout_ms);
  /* Spin only while every local rank can have a CPU of its own: when ranks
   * outnumber the CPUs this process may use, a spinning waiter takes the
   * CPU from the rank it waits for, so it sleeps almost at once. */
  long ncpu = usable_cpus();
  int64_t spin_us = g->opt.spin_us >= 0 ? g->opt.spin_us
                    : (ncpu > 0 && g->local_world <= ncpu) ? 50 : 2;
  g->spin_ns = (uint64_t)spin_us * 1000ull;
  g->spare_cpu = ncpu > 0 && g->local_world < ncpu;
  /* "auto" is on: a helper thread reducing buckets during backward was
   * faster than leaving them to the caller in every configuration measured,
   * also with as many or more ranks than CPUs (README.md, "Overlap") */
  g->progress_runs = g->opt.progress_thread != DDCPU_PROGRESS_OFF;
  g->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  g->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (g->abort_fd < 0 || g->wake_fd < 0) {
    st = ddcpu_err_errno(DDPLUG_E_SYSTEM, errno, "group_create: eventfd failed");
    goto fail;
  }
  if (g->num_nodes > 1) {
    g->arrived_local = calloc((size_t)g->num_nodes, sizeof *g->arrived_local);
    if (!g->arrived_local) {
      st = ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory");
      goto fail;
    }
  }
  if (g->local_world > 1 && (st = setup_shm(g, deadline)) != DDPLUG_OK) goto fail;
  if ((st = ddcpu_liveness_open(g)) != DDPLUG_OK) goto fail;
  if ((st = ddcpu_direct_probe(g, deadline)) != DDPLUG_OK) goto fail;
  if (g->num_nodes > 1 && g->leader) {
    g->ring_tmp = malloc(g->opt.tcp_chunk_bytes);
    g->recs = calloc((size_t)g->num_nodes, sizeof *g->recs);
    if (!g->ring_tmp || !g->recs) {
      st = ddcpu_err(DDPLUG_E_NO_MEMORY, "group_create: out of memory");
      goto fail;
    }
    if ((st = ddcpu_tcp_ring_setup(g, deadline)) != DDPLUG_OK) goto fail;
  }
  if ((st = ddcpu_p2p_create(g)) != DDPLUG_OK) goto fail;
  if ((st = ddcpu_engine_start(g)) != DDPLUG_OK) goto fail;
  ddcpu_log(g, DDPLUG_LOG_DEBUG,
            "cpu plugin: rank %d of %d, local %d of %d on node %d of %d; "
            "chunk %llu B x %u slots, small <= %llu B, spin %lld us, registered "
            "memory %llu B per rank, progress thread %s",
            g->rank, g->world, g->local_rank, g->local_world, g->node,
            g->num_nodes, (unsigned long long)g->opt.chunk_bytes, g->opt.slots,
            (unsigned long long)g->opt.small_msg_bytes, (long long)spin_us,
            (unsigned long long)(g->has_shm ? g->shm.hdr->arena_bytes : 0),
            g->progress_runs ? "runs collectives nobody waits for"
                          : "only watches peers (callers run collectives)");
  *out = g;
  return DDPLUG_OK;
fail:
  st = ddcpu_report(svc, st);
  teardown(g);
  return st;
}

/* Release the group (see plugin.h). Never blocks on peers: a collective
 * still pending aborts the group first (peers are told). Marks this rank
 * departed so peers do not take its exit for a crash. */
int ddcpu_group_destroy(ddplug_plugin_group *g) {
  if (!g) return DDPLUG_OK;
  int pending = ddcpu_pending(g);
  if (pending > 0)
    ddcpu_fail_set(g, DDPLUG_E_ABORTED, g->rank, g->rank,
                   "rank %d destroyed its group with %d collective(s) still "
                   "pending", g->rank, pending);
  teardown(g);
  return DDPLUG_OK;
}

/* Abort (see plugin.h). Thread-safe, any thread, never blocks for long (at
 * most ~200 ms telling the previous node over the ring). */
int ddcpu_group_abort(ddplug_plugin_group *g, const char *reason) {
  if (!g) return DDPLUG_E_INVALID_ARGUMENT;
  ddcpu_fail_set(g, DDPLUG_E_ABORTED, g->rank, g->rank, "aborted by rank %d: %s",
                 g->rank, reason && *reason ? reason : "(no reason given)");
  return DDPLUG_OK;
}
