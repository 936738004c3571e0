/*
 * mem.c — registered memory: buffers every local rank reaches directly.
 *
 * The node segment ends with one arena per local rank (shm.c): local rank
 * j allocates only from arena j, and every rank maps the whole segment, so
 * a peer reaches any registered buffer at (its mapping + segment offset).
 * The single-copy allreduce (direct.c) then reduces straight from the
 * peers' inputs and writes straight into their outputs: nothing is staged.
 *
 * An arena is a sparse range of the segment's file. Allocation is first fit
 * over this rank's live allocations (kept sorted, page granular); the pages
 * of a new allocation are reserved with fallocate, so a full /dev/shm is a
 * NO_MEMORY here rather than a SIGBUS when the buffer is first written, and
 * freeing punches them out of the file again. A group without a segment
 * (one rank on its node) or with registered_bytes 0 hands out ordinary
 * page-aligned memory, which mem_query reports as not registered.
 *
 * At group_destroy the segment is unmapped, but an allocation still live
 * keeps its addresses: its pages are replaced by a private copy of its
 * contents (mremap of an anonymous copy over it), so a tensor the host
 * forgot to release reads its last values instead of faulting. That copy
 * stays until the process exits; a warning says how much was left.
 *
 * All functions take mem_mu: the host may allocate from any thread while
 * another thread runs a collective.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

#define PAGE 4096ull

typedef struct ddcpu_alloc {
  uintptr_t addr;   /* start, in this process                          */
  uint64_t len;     /* bytes, page granular                            */
  uint64_t asked;   /* bytes the host asked for                        */
  int plain;        /* 1: ordinary memory (no arena), 0: in the arena   */
} ddcpu_alloc;

/* Whether this rank allocates from its arena. */
static int has_arena(const ddcpu_group *g) {
  return g->has_shm && g->shm.hdr && g->shm.hdr->arena_bytes > 0;
}

static unsigned char *my_arena(const ddcpu_group *g) {
  return g->shm.arena + (uint64_t)g->local_rank * g->shm.hdr->arena_bytes;
}

/* Index of the first allocation whose address is >= addr. */
static int lower_bound(const ddcpu_group *g, uintptr_t addr) {
  int lo = 0, hi = g->nallocs;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (g->allocs[mid].addr < addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The allocation containing [p, p + n), or NULL. Caller holds mem_mu. */
static const ddcpu_alloc *find(const ddcpu_group *g, uintptr_t p, uint64_t n) {
  int i = lower_bound(g, p + 1) - 1;
  if (i < 0) return NULL;
  const ddcpu_alloc *a = &g->allocs[i];
  if (p < a->addr || p - a->addr > a->len || n > a->len - (p - a->addr)) return NULL;
  return a;
}

static int insert(ddcpu_group *g, ddcpu_alloc a) {
  if (g->nallocs == g->allocs_cap) {
    int cap = g->allocs_cap ? 2 * g->allocs_cap : 16;
    ddcpu_alloc *na = realloc(g->allocs, (size_t)cap * sizeof *na);
    if (!na) return DDPLUG_E_NO_MEMORY;
    g->allocs = na;
    g->allocs_cap = cap;
  }
  int i = lower_bound(g, a.addr);
  memmove(&g->allocs[i + 1], &g->allocs[i], (size_t)(g->nallocs - i) * sizeof a);
  g->allocs[i] = a;
  g->nallocs++;
  return DDPLUG_OK;
}

/* First fit in this rank's arena: the segment offset of len free bytes, or
 * UINT64_MAX. Caller holds mem_mu. */
static uint64_t first_fit(const ddcpu_group *g, uint64_t len) {
  uintptr_t start = (uintptr_t)my_arena(g), end = start + g->shm.hdr->arena_bytes;
  uintptr_t at = start;
  for (int i = 0; i < g->nallocs; i++) {
    const ddcpu_alloc *a = &g->allocs[i];
    if (a->plain || a->addr < start || a->addr >= end) continue;
    if (a->addr - at >= len) break;
    at = a->addr + a->len;
  }
  if (end - at < len) return UINT64_MAX;
  return (uint64_t)(at - (uintptr_t)g->shm.base);
}

static int alloc_plain(ddcpu_group *g, uint64_t bytes, uint64_t len, void **ptr) {
  void *p = NULL;
  if (len > SIZE_MAX || posix_memalign(&p, PAGE, (size_t)len) != 0)
    return ddcpu_err(DDPLUG_E_NO_MEMORY,
                     "mem_alloc: rank %d: out of memory for %llu bytes", g->rank,
                     (unsigned long long)bytes);
  ddcpu_alloc a = {(uintptr_t)p, len, bytes, 1};
  if (insert(g, a) != DDPLUG_OK) {
    free(p);
    return ddcpu_err(DDPLUG_E_NO_MEMORY, "mem_alloc: rank %d: out of memory", g->rank);
  }
  *ptr = p;
  return DDPLUG_OK;
}

/* The mem_alloc slot's work (below). Thread-safe. */
static int mem_alloc(ddcpu_group *g, uint64_t bytes, void **ptr) {
  if (bytes == 0)
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT, "mem_alloc: bytes is 0");
  if (bytes > UINT64_MAX - PAGE)
    return ddcpu_err(DDPLUG_E_NO_MEMORY, "mem_alloc: %llu bytes is too large",
                     (unsigned long long)bytes);
  uint64_t len = (bytes + PAGE - 1) / PAGE * PAGE;
  pthread_mutex_lock(&g->mem_mu);
  int st;
  if (!has_arena(g)) {
    st = alloc_plain(g, bytes, len, ptr);
    pthread_mutex_unlock(&g->mem_mu);
    return st;
  }
  uint64_t off = first_fit(g, len);
  if (off == UINT64_MAX) {
    st = ddcpu_err(DDPLUG_E_NO_MEMORY,
                   "mem_alloc: rank %d: no room for %llu bytes of registered memory: "
                   "%llu of its %llu bytes are in use in %d buffer(s) (raise "
                   "plugin_options.registered_bytes, free buffers, or allocate "
                   "ordinary memory: collectives accept any buffer)",
                   g->rank, (unsigned long long)bytes, (unsigned long long)g->mem_used,
                   (unsigned long long)g->shm.hdr->arena_bytes, g->nallocs);
    pthread_mutex_unlock(&g->mem_mu);
    return st;
  }
  /* Reserve the pages: a full /dev/shm is an error now, not a SIGBUS. */
  int e = fallocate(g->shm.fd, 0, (off_t)off, (off_t)len) == 0 ? 0 : errno;
  if (e == EOPNOTSUPP || e == ENOSYS) e = 0; /* no reservation here: touch-time */
  if (e != 0) {
    st = ddcpu_err_errno(DDPLUG_E_NO_MEMORY, e,
                         "mem_alloc: rank %d: reserving %llu bytes of registered memory "
                         "in %s failed (is /dev/shm full? %llu bytes are in use by this "
                         "rank; df /dev/shm shows the rest)", g->rank,
                         (unsigned long long)len, g->shm.name, (unsigned long long)g->mem_used);
    pthread_mutex_unlock(&g->mem_mu);
    return st;
  }
  ddcpu_alloc a = {(uintptr_t)g->shm.base + off, len, bytes, 0};
  if (insert(g, a) != DDPLUG_OK) {
    (void)fallocate(g->shm.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    pthread_mutex_unlock(&g->mem_mu);
    return ddcpu_err(DDPLUG_E_NO_MEMORY, "mem_alloc: rank %d: out of memory", g->rank);
  }
  g->mem_used += len;
  *ptr = (void *)a.addr;
  pthread_mutex_unlock(&g->mem_mu);
  return DDPLUG_OK;
}

/* The mem_free slot's work (below). Thread-safe. */
static int mem_free(ddcpu_group *g, void *ptr) {
  if (!ptr) return DDPLUG_OK;
  pthread_mutex_lock(&g->mem_mu);
  int i = lower_bound(g, (uintptr_t)ptr);
  if (i >= g->nallocs || g->allocs[i].addr != (uintptr_t)ptr) {
    pthread_mutex_unlock(&g->mem_mu);
    return ddcpu_err(DDPLUG_E_INVALID_ARGUMENT,
                     "mem_free: rank %d: %p is not a live allocation of this group's "
                     "mem_alloc (freed twice, or from another group or allocator?); "
                     "nothing was freed", g->rank, ptr);
  }
  ddcpu_alloc a = g->allocs[i];
  memmove(&g->allocs[i], &g->allocs[i + 1], (size_t)(g->nallocs - i - 1) * sizeof a);
  g->nallocs--;
  if (a.plain) {
    free(ptr);
  } else {
    g->mem_used -= a.len;
    /* give the pages back to /dev/shm (every mapping sees zeros there) */
    (void)fallocate(g->shm.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)(a.addr - (uintptr_t)g->shm.base), (off_t)a.len);
  }
  pthread_mutex_unlock(&g->mem_mu);
  return DDPLUG_OK;
}

/* See internal.h. Thread-safe. */
int64_t ddcpu_mem_offset(ddcpu_group *g, const void *ptr, uint64_t bytes) {
  if (!has_arena(g) || !ptr) return -1;
  uintptr_t p = (uintptr_t)ptr;
  uintptr_t lo = (uintptr_t)my_arena(g), hi = lo + g->shm.hdr->arena_bytes;
  if (p < lo || p >= hi) return -1; /* cheap test first: no lock */
  pthread_mutex_lock(&g->mem_mu);
  const ddcpu_alloc *a = find(g, p, bytes);
  int64_t off = a && !a->plain ? (int64_t)(p - (uintptr_t)g->shm.base) : -1;
  pthread_mutex_unlock(&g->mem_mu);
  return off;
}

/* The mem_query slot's work (below). Thread-safe. */
static int mem_query(ddcpu_group *g, const void *ptr, uint64_t bytes, int32_t *reach) {
  if (g->num_nodes > 1 || !g->has_shm) {
    *reach = DDPLUG_REACH_STAGED; /* only the in-node algorithms use them */
    return DDPLUG_OK;
  }
  if (ddcpu_mem_offset(g, ptr, bytes) >= 0)
    *reach = DDPLUG_REACH_REGISTERED;
  else
    *reach = ddcpu_direct_cma_for(g, bytes) ? DDPLUG_REACH_SINGLE_COPY : DDPLUG_REACH_STAGED;
  return DDPLUG_OK;
}

/* ---- the slots (see plugin.h): any thread, the runtime told why on failure */

int ddcpu_mem_alloc(ddplug_plugin_group *g, uint64_t bytes, void **ptr) {
  if (!g || !ptr) return DDPLUG_E_INVALID_ARGUMENT;
  return ddcpu_report(g->svc, mem_alloc(g, bytes, ptr));
}

int ddcpu_mem_free(ddplug_plugin_group *g, void *ptr) {
  if (!g) return DDPLUG_E_INVALID_ARGUMENT;
  return ddcpu_report(g->svc, mem_free(g, ptr));
}

int ddcpu_mem_query(ddplug_plugin_group *g, const void *ptr, uint64_t bytes, int32_t *reach) {
  if (!g || !reach) return DDPLUG_E_INVALID_ARGUMENT;
  return ddcpu_report(g->svc, mem_query(g, ptr, bytes, reach));
}

/* Put a private copy of [addr, addr + len) in place of the shared pages
 * there. Returns 0 on success. */
static int keep_private(uintptr_t addr, uint64_t len) {
  void *tmp = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (tmp == MAP_FAILED) return -1;
  memcpy(tmp, (void *)addr, (size_t)len);
  if (mremap(tmp, (size_t)len, (size_t)len, MREMAP_MAYMOVE | MREMAP_FIXED,
             (void *)addr) == MAP_FAILED) {
    munmap(tmp, (size_t)len);
    return -1;
  }
  return 0;
}

/* See internal.h. Called once, from teardown. */
void ddcpu_mem_detach(ddcpu_group *g) {
  pthread_mutex_lock(&g->mem_mu);
  uint64_t left_bytes = 0;
  int left = 0, kept_all = 1;
  if (g->has_shm && g->shm.base) {
    uintptr_t base = (uintptr_t)g->shm.base, end = base + g->shm.size;
    uintptr_t at = base; /* unmap [at, next kept range) piece by piece */
    for (int i = 0; i < g->nallocs; i++) {
      ddcpu_alloc *a = &g->allocs[i];
      if (a->plain) continue;
      left++;
      left_bytes += a->asked;
      if (keep_private(a->addr, a->len) != 0) {
        kept_all = 0; /* leave the rest of the segment mapped: never fault */
        break;
      }
      if (a->addr > at) munmap((void *)at, a->addr - at);
      at = a->addr + a->len;
    }
    if (kept_all) {
      if (end > at) munmap((void *)at, end - at);
      g->shm.base = NULL; /* unmapped above */
    } else {
      g->shm.base = NULL; /* deliberately left mapped */
    }
    g->shm.hdr = NULL;
    if (g->shm.fd >= 0) close(g->shm.fd);
    g->shm.fd = -1;
  }
  for (int i = 0; i < g->nallocs; i++)
    if (g->allocs[i].plain) {
      left++;
      left_bytes += g->allocs[i].asked; /* ordinary memory: it just stays */
    }
  if (left > 0)
    ddcpu_log(g, DDPLUG_LOG_WARN,
              "cpu plugin: rank %d closed its group with %d registered buffer(s) "
              "(%llu bytes) still allocated: they stay readable %s until the "
              "process exits; release them with ddplug_mem_free before "
              "ddplug_close", g->rank, left, (unsigned long long)left_bytes,
              kept_all ? "as private copies" : "(the node segment stays mapped)");
  free(g->allocs);
  g->allocs = NULL;
  g->nallocs = g->allocs_cap = 0;
  pthread_mutex_unlock(&g->mem_mu);
}
