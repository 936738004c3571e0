/*
 * direct.c — the single-copy allreduce inside a node.
 *
 * Each local rank owns a slice of the elements (a multiple of 64 bytes, as
 * in the pipeline). It reads its slice from every rank's input, reduces it
 * in local-rank order — the same kernel and order as every other path, so
 * the bits are the same — and writes the result into every rank's output.
 * Every byte of input is read once and every byte of output written once,
 * by one rank: 2·n·S bytes of memory traffic for n ranks and S bytes, the
 * bound, where the staging pipeline also copies through its slots. It is a
 * reduce-scatter and an allgather fused: the owner of a slice does both
 * halves, so nobody waits between them.
 *
 * How a rank reaches a peer's buffer:
 *   registered   the buffer lies in the peer's arena of the node segment
 *                (mem.c), which every rank maps: plain loads and stores;
 *   kernel copy  otherwise, process_vm_readv/process_vm_writev between the
 *                two address spaces (one copy, in blocks of `dblock` bytes
 *                through a small scratch that stays in cache), where the
 *                system allows it: ptrace rules (kernel.yama.ptrace_scope,
 *                PR_SET_DUMPABLE, a container's seccomp profile) can refuse
 *                it. group_create probes every peer once (read a word, write
 *                it back) and every local rank publishes its verdict; with
 *                cma "auto", local rank 0 alone also times the kernel's copy
 *                against memcpy, in CPU time (below), and its verdict holds
 *                for every rank. The outcome is logged once at debug level.
 *   push         two ranks whose outputs are registered but an input is not
 *                (an ordinary buffer reduced out of place into registered
 *                memory): each rank first copies the part of its
 *                input that the other rank owns into that rank's output, at
 *                that slice (a place nobody else writes before the result);
 *                then the owner reduces its own input and what was pushed,
 *                in local-rank order, into both outputs. 3·S bytes per rank
 *                instead of the pipeline's copies through its slots, and no
 *                per-chunk synchronisation.
 * Every rank decides the same way after the handshake, from every rank's
 * published buffers (ddcpu_bufref) and verdicts: the direct path when each
 * rank's buffers are registered; the push when there are two ranks and
 * every output is registered; the kernel's copy when every rank is
 * reachable through it and the message has at least cma_min_bytes per
 * rank; otherwise the phase turns into the shared-memory pipeline
 * (shm_coll.c).
 *
 * Synchronisation: the handshake (every rank arrived, so every buffer is
 * ready), then each rank writes its slice everywhere and posts `done`, and
 * returns once every rank's `done` says its output is complete. Two
 * synchronisations per allreduce; the push posts `done` once more in
 * between (pushed), so `done` counts two per collective index k: 2k-1
 * pushed, 2k written.
 *
 * Failures: a rank that gives up on a collective after arriving (a peer
 * died, an abort) gets its buffer back while peers may still be writing
 * into it. So a writer announces itself (`writing` = the collective's
 * index) before it checks that nobody has withdrawn, and a rank that gives
 * up announces `withdrawn` before it waits for the live writers to leave:
 * both are sequentially consistent, so either the writer sees the
 * withdrawal and writes nothing, or the withdrawing rank sees the writer
 * and waits for it (a writer never blocks inside, so that is short).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define PAGE 4096ull
/* Scratch for kernel copies, all peers together: small enough to stay in
 * the L2 cache between the read and the reduction. */
#define CMA_SCRATCH_BUDGET (2ull << 20)
#define CMA_BLOCK_MIN (64ull << 10)
/* How long a withdrawing rank waits for a live peer to finish writing into
 * its output (a writer never blocks while writing: this is only a bound). */
#define WITHDRAW_WAIT_NS (10ull * 1000 * 1000 * 1000)

static ddcpu_bufref *bufref(ddcpu_group *g, int j, uint64_t k) {
  return &g->shm.ctl[j].buf[k & 1];
}

/* See internal.h. Executor only, before the arrival is posted. */
void ddcpu_direct_publish(ddcpu_group *g, ddcpu_req *r) {
  const ddplug_coll_args *a = &r->args;
  uint64_t bytes = a->count * ddcpu_dtype_size(a->dtype);
  ddcpu_bufref *b = bufref(g, g->local_rank, r->k);
  b->send = (uint64_t)(uintptr_t)a->send;
  b->recv = (uint64_t)(uintptr_t)a->recv;
  b->send_off = ddcpu_mem_offset(g, a->send, bytes);
  b->recv_off = a->recv == a->send ? b->send_off : ddcpu_mem_offset(g, a->recv, bytes);
}

static int registered(const ddcpu_bufref *b) { return b->send_off >= 0 && b->recv_off >= 0; }

/* See internal.h. */
int ddcpu_direct_cma_for(ddcpu_group *g, uint64_t bytes) {
  return g->num_nodes == 1 && g->has_shm && g->cma_all &&
         bytes >= g->opt.cma_min_bytes && bytes > g->opt.small_msg_bytes;
}

/* How this allreduce moves (DDCPU_DIRECT_*, request.h), the same answer on
 * every rank: it reads only what every rank published. */
static int direct_mode(ddcpu_group *g, const ddcpu_req *r, const ddcpu_direct *d) {
  int all_registered = 1, outputs_apart = 1;
  for (int j = 0; j < g->local_world; j++) {
    const ddcpu_bufref *b = bufref(g, j, r->k);
    if (!registered(b)) all_registered = 0;
    /* the push writes into outputs before their owners read their inputs */
    if (b->recv_off < 0 || b->recv == b->send) outputs_apart = 0;
  }
  if (all_registered) return DDCPU_DIRECT_ALL;
  if (g->local_world == 2 && outputs_apart) return DDCPU_DIRECT_PUSH;
  if (ddcpu_direct_cma_for(g, d->count * ddcpu_dtype_size(d->dtype))) return DDCPU_DIRECT_ALL;
  return DDCPU_DIRECT_NO;
}

/* The values this rank posts on its `done` for collective index k. */
static uint32_t pushed_mark(uint64_t k) { return (uint32_t)(2 * k - 1); }
static uint32_t written_mark(uint64_t k) { return (uint32_t)(2 * k); }

/* See internal.h. Executor only, after the handshake. */
void ddcpu_direct_enter(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph) {
  ddcpu_direct d = ph->u.direct;
  int mode = direct_mode(g, r, &d);
  if (mode != DDCPU_DIRECT_NO) {
    ph->u.direct.mode = mode;
    ph->u.direct.pushed = 0;
    ph->u.direct.wrote = 0;
    return;
  }
  memset(&ph->u, 0, sizeof ph->u);
  ph->kind = DDCPU_PH_PIPE;
  ddcpu_pipe *p = &ph->u.pipe;
  p->mode = DDCPU_PIPE_ALLREDUCE;
  p->dtype = d.dtype;
  p->in = d.send;
  p->out = d.recv;
  p->elems = d.count;
  p->op = d.op;
  p->divisor = d.divisor;
  ddcpu_pipe_init(g, p);
}

/* Local index k's slice [*off, *off + *len) of count elements: a multiple
 * of 64 bytes, so no two ranks write the same cache line of an aligned
 * buffer. */
static void slice_of(const ddcpu_group *g, uint64_t count, uint32_t es, int k,
                     uint64_t *off, uint64_t *len) {
  uint64_t unit = 64 / es;
  uint64_t per = (count + (uint64_t)g->local_world - 1) / (uint64_t)g->local_world;
  per = (per + unit - 1) / unit * unit;
  uint64_t s = DDCPU_MIN(count, per * (uint64_t)k);
  *off = s;
  *len = DDCPU_MIN(count, s + per) - s;
}

/* Move bytes between this process and local index j's, through the
 * kernel. write: local -> remote. */
static int cma_xfer(ddcpu_group *g, int j, int write, unsigned char *local,
                    uint64_t remote, uint64_t bytes, const char *what) {
  int peer = g->local_ranks[j];
  pid_t pid = (pid_t)g->pid_of[peer];
  while (bytes > 0) {
    struct iovec l = {local, (size_t)bytes};
    struct iovec rm = {(void *)(uintptr_t)remote, (size_t)bytes};
    ssize_t n = write ? process_vm_writev(pid, &l, 1, &rm, 1, 0)
                      : process_vm_readv(pid, &l, 1, &rm, 1, 0);
    if (n > 0) {
      local += n;
      remote += (uint64_t)n;
      bytes -= (uint64_t)n;
      continue;
    }
    int e = n < 0 ? errno : EFAULT; /* 0 bytes: the range ends there */
    if (e == EINTR) continue;
    if (e == ESRCH) {
      ddcpu_peer_exited(g, j);
      int st = ddcpu_fail_report(g);
      if (st) return st;
    }
    if (e == EFAULT)
      return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                       "rank %d: rank %d's %s buffer (pid %lld, address 0x%llx) "
                       "cannot be %s for the next %llu bytes: is it shorter than "
                       "the collective's count?", g->rank, peer, what,
                       (long long)pid, (unsigned long long)remote,
                       write ? "written" : "read", (unsigned long long)bytes);
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e,
                           "rank %d: process_vm_%s of rank %d's %s buffer (pid %lld) "
                           "failed although it worked at group_create", g->rank,
                           write ? "writev" : "readv", peer, what, (long long)pid);
  }
  return DDPLUG_OK;
}

/* Scratch block for local index j's input (slots for peers 0..n-2, then
 * the output block), placed at the same offset within a page as the
 * remote address: the kernel's page-by-page copy then has no skew. */
static unsigned char *scratch(ddcpu_group *g, int slot, uint64_t remote) {
  return g->dscratch + (uint64_t)slot * (g->dblock + PAGE) + (remote & (PAGE - 1));
}

/* Reduce this rank's slice and write it into every output. */
static int move(ddcpu_group *g, ddcpu_req *r, const ddcpu_direct *d, uint64_t off,
                uint64_t len, uint32_t es) {
  const int n = g->local_world, me = g->local_rank;
  const unsigned char *in[DDCPU_MAX_LOCAL];
  unsigned char *out[DDCPU_MAX_LOCAL];
  const ddcpu_bufref *ref[DDCPU_MAX_LOCAL];
  int cma[DDCPU_MAX_LOCAL], ncma = 0, first_cma = -1;
  unsigned char *seg = g->shm.base;
  for (int j = 0; j < n; j++) {
    ref[j] = bufref(g, j, r->k);
    cma[j] = 0;
    if (j == me) {
      in[j] = d->send;
      out[j] = d->recv;
    } else if (d->mode == DDCPU_DIRECT_PUSH) {
      in[j] = d->recv; /* its share of this rank's slice, pushed into this output */
      out[j] = seg + ref[j]->recv_off;
    } else if (registered(ref[j])) {
      in[j] = seg + ref[j]->send_off;
      out[j] = seg + ref[j]->recv_off;
    } else {
      in[j] = NULL;
      out[j] = NULL;
      cma[j] = 1;
      if (first_cma < 0) first_cma = j;
      ncma++;
    }
  }
  const int stream = g->opt.nt_bytes > 0 && d->count * es >= g->opt.nt_bytes;
  const uint64_t block = ncma ? g->dblock / es : len;
  for (uint64_t b = off; b < off + len; b += block) {
    uint64_t m = DDCPU_MIN(block, off + len - b);
    const void *srcs[DDCPU_MAX_LOCAL];
    void *dsts[DDCPU_MAX_LOCAL + 1];
    int nd = 0, slot = 0;
    unsigned char *tmp_out = NULL;
    for (int j = 0; j < n; j++) {
      if (!cma[j]) {
        srcs[j] = in[j] + b * es;
        continue;
      }
      uint64_t at = ref[j]->send + b * es;
      unsigned char *t = scratch(g, slot++, at);
      int st = cma_xfer(g, j, 0, t, at, m * es, "send");
      if (st != DDPLUG_OK) return st;
      srcs[j] = t;
    }
    if (ncma) {
      tmp_out = scratch(g, n - 1, ref[first_cma]->recv + b * es);
      dsts[nd++] = tmp_out;
    }
    for (int j = 0; j < n; j++)
      if (!cma[j]) dsts[nd++] = out[j] + b * es;
    ddcpu_reduce_bcast(d->dtype, d->op, dsts, nd, srcs, n, m, d->divisor, stream);
    for (int j = 0; j < n; j++) {
      if (!cma[j]) continue;
      int st = cma_xfer(g, j, 1, tmp_out, ref[j]->recv + b * es, m * es, "receive");
      if (st != DDPLUG_OK) return st;
    }
  }
  ddcpu_copy_fence(stream);
  return DDPLUG_OK;
}

/* The push: the part of this rank's input that each peer owns, into that
 * peer's output at the same place. */
static int push(ddcpu_group *g, ddcpu_req *r, const ddcpu_direct *d, uint32_t es) {
  unsigned char *seg = g->shm.base;
  const int stream = g->opt.nt_bytes > 0 && d->count * es >= g->opt.nt_bytes;
  for (int j = 0; j < g->local_world; j++) {
    if (j == g->local_rank) continue;
    uint64_t off, len;
    slice_of(g, d->count, es, j, &off, &len);
    if (len)
      ddcpu_copy(seg + bufref(g, j, r->k)->recv_off + off * es, d->send + off * es, len * es,
                 stream);
  }
  ddcpu_copy_fence(stream);
  return DDPLUG_OK;
}

/* Write into other ranks' outputs — this rank's reduced slice, or with
 * `pushing` its shares of theirs — unless a peer has withdrawn. */
static int write_slice(ddcpu_group *g, ddcpu_req *r, const ddcpu_direct *d, int pushing) {
  uint32_t es = ddcpu_dtype_size(d->dtype);
  uint64_t off, len;
  slice_of(g, d->count, es, g->local_rank, &off, &len);
  ddcpu_rank_ctl *mine = &g->shm.ctl[g->local_rank];
  atomic_store_explicit(&mine->writing, r->k, memory_order_seq_cst);
  for (int j = 0; j < g->local_world; j++) {
    if (j == g->local_rank ||
        atomic_load_explicit(&g->shm.ctl[j].withdrawn, memory_order_seq_cst) != r->k)
      continue;
    atomic_store_explicit(&mine->writing, 0, memory_order_release);
    int st = ddcpu_fail_report(g);
    return st ? st : ddcpu_err(DDPLUG_E_INTERNAL,
                               "rank %d abandoned collective #%llu after arriving",
                               g->local_ranks[j], (unsigned long long)r->args.seq);
  }
  int st = pushing ? push(g, r, d, es) : len ? move(g, r, d, off, len, es) : DDPLUG_OK;
  atomic_store_explicit(&mine->writing, 0, memory_order_release);
  return st;
}

/* DDCPU_DONE once every local rank's `done` reached `mark`, else BLOCKED on
 * the first that has not. */
static int wait_all(ddcpu_group *g, uint32_t mark, ddcpu_wait_target *wt) {
  for (int j = 0; j < g->local_world; j++) {
    ddcpu_ctr *c = &g->shm.ctl[j].done;
    if (ddcpu_ctr_ge(c, mark)) continue;
    wt->kind = DDCPU_WAIT_CTR;
    wt->ctr = c;
    wt->until = mark;
    return DDCPU_BLOCKED;
  }
  return DDCPU_DONE;
}

/* See internal.h. Executor only. */
int ddcpu_direct_step(ddcpu_group *g, ddcpu_req *r, ddcpu_phase *ph, ddcpu_wait_target *wt) {
  ddcpu_direct *d = &ph->u.direct;
  ddcpu_ctr *mine = &g->shm.ctl[g->local_rank].done;
  if (d->mode == DDCPU_DIRECT_PUSH && !d->wrote) {
    if (!d->pushed) {
      int st = write_slice(g, r, d, 1);
      if (st != DDPLUG_OK) return st;
      ddcpu_ctr_post(mine, pushed_mark(r->k));
      d->pushed = 1;
    }
    int w = wait_all(g, pushed_mark(r->k), wt); /* every share of this rank's slice is here */
    if (w != DDCPU_DONE) return w;
  }
  if (!d->wrote) {
    int st = write_slice(g, r, d, 0);
    if (st != DDPLUG_OK) return st;
    ddcpu_ctr_post(mine, written_mark(r->k));
    d->wrote = 1;
  }
  return wait_all(g, written_mark(r->k), wt);
}

/* See internal.h. Executor only; keeps the thread's error sentence. */
void ddcpu_direct_withdraw(ddcpu_group *g, ddcpu_req *r) {
  if (!g->has_shm) return;
  char saved[DDCPU_MSG_MAX];
  snprintf(saved, sizeof saved, "%s", ddcpu_errmsg());
  atomic_store_explicit(&g->shm.ctl[g->local_rank].withdrawn, r->k, memory_order_seq_cst);
  uint64_t until = ddcpu_now_ns() + WITHDRAW_WAIT_NS;
  for (int j = 0; j < g->local_world; j++) {
    if (j == g->local_rank) continue;
    while (atomic_load_explicit(&g->shm.ctl[j].writing, memory_order_seq_cst) == r->k) {
      if (atomic_load(&g->pid_gone[j]) ||
          !ddcpu_proc_alive(g->pid_of[g->local_ranks[j]],
                            atomic_load(&g->shm.procs[j].start_time)))
        break;
      if (ddcpu_now_ns() >= until) {
        ddcpu_log(g, DDPLUG_LOG_ERROR,
                  "cpu plugin: rank %d gives up waiting for rank %d to finish "
                  "writing its result of collective #%llu (stopped?): that rank "
                  "may still write into the buffer this rank gets back",
                  g->rank, g->local_ranks[j], (unsigned long long)r->args.seq);
        break;
      }
      usleep(100);
    }
  }
  ddcpu_errmsg_set(saved);
}

/* Read local index j's probe word and write it back through the kernel.
 * Returns 0, or the errno that refused it (with the call in *which). */
static int probe_peer(ddcpu_group *g, int j, const char **which) {
  pid_t pid = (pid_t)g->pid_of[g->local_ranks[j]];
  uint64_t word = 0;
  uint64_t at = g->shm.procs[j].probe_addr;
  struct iovec l = {&word, sizeof word}, rm = {(void *)(uintptr_t)at, sizeof word};
  *which = "process_vm_readv";
  ssize_t n = process_vm_readv(pid, &l, 1, &rm, 1, 0);
  if (n != (ssize_t)sizeof word) return n < 0 ? errno : EFAULT;
  if (word != g->run_hash) return EPROTO;
  *which = "process_vm_writev";
  n = process_vm_writev(pid, &l, 1, &rm, 1, 0);
  if (n != (ssize_t)sizeof word) return n < 0 ? errno : EFAULT;
  return 0;
}

/* CPU time of the calling thread, ns: what a copy costs, whether or not
 * the thread was descheduled meanwhile. */
static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The kernel's copy between address spaces against memcpy, on this
 * process (process_vm_readv of itself takes the same path as of a peer):
 * bytes per second of CPU time of the first over the second, each the best
 * of SPEED_ROUNDS interleaved rounds of 1 MiB (a few milliseconds).
 *
 * Why CPU time: timed on the wall clock, a rank descheduled during one
 * round on a busy machine measured that copy arbitrarily slow, and the one
 * probe at group_create decided the run's path for good, either way. A
 * copy's CPU time does not count the time its thread waited for a CPU;
 * what other processes still change (memory bandwidth, caches) slows both
 * copies. Why rank 0 alone: two ranks measuring near the threshold could
 * disagree; one measurement, adopted by every rank, gives one verdict and
 * one sentence for the whole node. */
#define SPEED_BYTES (1u << 20)
#define SPEED_ROUNDS 7
static double kernel_copy_share(void) {
  unsigned char *a = NULL, *b = NULL;
  if (posix_memalign((void **)&a, PAGE, SPEED_BYTES) != 0) return 0;
  if (posix_memalign((void **)&b, PAGE, SPEED_BYTES) != 0) {
    free(a);
    return 0;
  }
  memset(a, 1, SPEED_BYTES);
  memset(b, 2, SPEED_BYTES);
  uint64_t best_k = UINT64_MAX, best_m = UINT64_MAX;
  for (int round = 0; round < SPEED_ROUNDS; round++) {
    struct iovec l = {b, SPEED_BYTES}, rm = {a, SPEED_BYTES};
    uint64_t t0 = thread_cpu_ns();
    ssize_t n = process_vm_readv(getpid(), &l, 1, &rm, 1, 0);
    uint64_t t1 = thread_cpu_ns();
    memcpy(b, a, SPEED_BYTES);
    __asm__ volatile("" : : "r"(b) : "memory");
    uint64_t t2 = thread_cpu_ns();
    if (n != (ssize_t)SPEED_BYTES) break;
    best_k = DDCPU_MIN(best_k, t1 - t0);
    best_m = DDCPU_MIN(best_m, t2 - t1);
  }
  free(a);
  free(b);
  if (best_k == UINT64_MAX || best_k == 0) return 0;
  return (double)best_m / (double)best_k;
}

/* See internal.h. group_create only (after every local rank attached and the
 * liveness watch is open). */
int ddcpu_direct_probe(ddcpu_group *g, uint64_t deadline) {
  if (!g->has_shm) return DDPLUG_OK;
  const int n = g->local_world;
  char why[DDCPU_MSG_MAX] = "";
  int verdict = DDCPU_SC_YES;
  if (g->num_nodes > 1) {
    verdict = DDCPU_SC_NO;
    snprintf(why, sizeof why, "the group spans %d nodes", g->num_nodes);
  } else if (g->opt.cma == DDCPU_CMA_OFF) {
    verdict = DDCPU_SC_NO;
    snprintf(why, sizeof why, "plugin_options.cma is \"off\"");
  } else {
    for (int j = 0; j < n && verdict == DDCPU_SC_YES; j++) {
      if (j == g->local_rank) continue;
      const char *which = "";
      int e = probe_peer(g, j, &which);
      if (e == 0) continue;
      verdict = DDCPU_SC_NO;
      snprintf(why, sizeof why, "%s of rank %d (pid %lld) from rank %d: %s%s", which,
               g->local_ranks[j], (long long)g->pid_of[g->local_ranks[j]], g->rank,
               e == EPROTO ? "read an unexpected value" : strerror(e),
               e == EPERM || e == EACCES
                   ? " (ptrace access between the ranks is refused: "
                     "kernel.yama.ptrace_scope, PR_SET_DUMPABLE or a container's "
                     "security profile)"
                   : "");
    }
    if (verdict == DDCPU_SC_YES && g->opt.cma == DDCPU_CMA_AUTO && g->local_rank == 0) {
      double share = kernel_copy_share();
      if (share < DDCPU_CMA_MIN_SPEED) {
        verdict = DDCPU_SC_NO;
        snprintf(why, sizeof why, "allowed, but on rank %d the kernel's copy moves %.0f%% of "
                 "memcpy's bytes per second of CPU time, less than the %.0f%% that make it "
                 "pay (plugin_options.cma \"on\" forces it)", g->rank, 100.0 * share,
                 100.0 * DDCPU_CMA_MIN_SPEED);
      }
    }
    if (verdict == DDCPU_SC_YES) {
      /* a block per peer plus the output block, each with a page of room
       * to match the remote page offset */
      uint64_t block = CMA_SCRATCH_BUDGET / (uint64_t)n;
      block = DDCPU_MAX(CMA_BLOCK_MIN, DDCPU_MIN(block, g->opt.chunk_bytes)) / PAGE * PAGE;
      void *p = NULL;
      if (posix_memalign(&p, PAGE, (size_t)((uint64_t)n * (block + PAGE))) != 0) {
        verdict = DDCPU_SC_NO;
        snprintf(why, sizeof why, "rank %d could not allocate its %llu-byte scratch",
                 g->rank, (unsigned long long)((uint64_t)n * (block + PAGE)));
      } else {
        g->dscratch = p;
        g->dblock = block;
      }
    }
  }
  atomic_store(&g->shm.procs[g->local_rank].cma, (uint32_t)verdict);
  ddcpu_ctr *c = &g->shm.hdr->probed;
  atomic_fetch_add(&c->val, 1);
  ddcpu_ctr_wake(c);
  while (!ddcpu_ctr_ge(c, (uint32_t)n)) {
    int fs = ddcpu_liveness_poll(g, 0);
    if (fs) return ddcpu_fail_report(g);
    uint64_t now = ddcpu_now_ns();
    if (now >= deadline)
      return ddcpu_err(DDPLUG_E_TIMEOUT,
                       "rank %d: the node's ranks did not all finish group_create's "
                       "single-copy probe in time", g->rank);
    ddcpu_ctr_sleep(c, atomic_load(&c->val), DDCPU_MIN(deadline - now, 20000000ull), 1);
  }
  g->cma_all = 1;
  int refused = -1;
  for (int j = 0; j < n; j++)
    if (atomic_load(&g->shm.procs[j].cma) != DDCPU_SC_YES) {
      g->cma_all = 0;
      if (refused < 0) refused = j;
    }
  if (!g->cma_all) {
    free(g->dscratch);
    g->dscratch = NULL;
  }
  if (g->cma_all)
    ddcpu_log(g, DDPLUG_LOG_DEBUG,
              "cpu plugin: single copy through the kernel (process_vm_readv/writev) "
              "between the %d local ranks: available; unregistered allreduces of at "
              "least %llu bytes use it, in %llu-byte blocks", n,
              (unsigned long long)DDCPU_MAX(g->opt.cma_min_bytes, g->opt.small_msg_bytes + 1),
              (unsigned long long)g->dblock);
  else {
    if (!why[0])
      snprintf(why, sizeof why, "refused to rank %d: its log says why",
               g->local_ranks[refused]);
    ddcpu_log(g, DDPLUG_LOG_DEBUG,
              "cpu plugin: single copy through the kernel is not used (%s); "
              "unregistered buffers go through the shared-memory pipeline, "
              "registered ones (mem_alloc) are still reduced in place", why);
  }
  return DDPLUG_OK;
}
