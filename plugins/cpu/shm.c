/*
 * shm.c — the node's shared-memory segment: create, attach, unlink, and the
 * safe cleanup of segments that crashed runs left behind.
 *
 * One segment per node and run, named /ddplug-cpu-<run_id>-n<node>. The node's
 * first local rank creates it exclusively (O_EXCL), sizes it, writes the
 * header and publishes the header's magic last; the others attach and check
 * that the layout (ranks, chunk size, slots, arenas) matches theirs. The
 * segment ends with one arena of registered memory per local rank (mem.c):
 * the file is sized to hold them all, but only the fixed part before them is
 * reserved (posix_fallocate) at creation; an arena's pages are reserved when
 * they are allocated and released when freed, so the arenas cost address
 * space, not memory. After the arenas come the point-to-point rings (one
 * per ordered pair of local ranks), sparse too: a sender reserves its
 * ring's pages before it writes its first frame (p2p_link.c). Every process
 * records its pid and start time in the segment. Once every local rank has
 * attached, the creator unlinks the name: the mappings stay valid and
 * nothing is left in /dev/shm even if the whole job is killed. A name can
 * only be left behind by a crash between creation and the last attach; the
 * next group_create on the machine removes such a segment when every
 * process it recorded (creator and attached ranks) is dead — a pid is
 * "alive" only if it exists and started at the recorded time, so a reused
 * pid does not keep garbage alive, and a live run is never touched.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define ARENA_ALIGN (2ull << 20)
/* Address space all of a node segment's arenas may take in one process. */
#define ARENA_VA_BUDGET (32ull << 40)

/* Layout of a segment for params p; offsets into the header, total size. */
static void layout(const ddcpu_shm_params *p, ddcpu_shm_hdr *h) {
  uint64_t off = ALIGN_UP(sizeof(ddcpu_shm_hdr), 4096);
  h->procs_off = off;
  off = ALIGN_UP(off + sizeof(ddcpu_proc) * (uint64_t)p->local_world, 64);
  h->ctl_off = off;
  off = ALIGN_UP(off + sizeof(ddcpu_rank_ctl) * (uint64_t)p->local_world, 64);
  h->arrived_off = off;
  off = ALIGN_UP(off + sizeof(uint64_t) * (uint64_t)p->num_nodes, 4096);
  h->small_off = off;
  off = ALIGN_UP(off + 2 * p->small_bytes * (uint64_t)p->local_world, 4096);
  h->stage_off = off;
  off += (uint64_t)p->slots * (uint64_t)p->local_world * p->chunk_bytes;
  h->bell_off = ALIGN_UP(off, 4096);
  off = h->bell_off + sizeof(ddcpu_ctr) * (uint64_t)p->local_world;
  h->p2p_ctl_off = ALIGN_UP(off, 64);
  off = h->p2p_ctl_off +
        sizeof(ddcpu_p2p_ring_ctl) * (uint64_t)p->local_world * (uint64_t)p->local_world;
  h->arena_off = ALIGN_UP(off, ARENA_ALIGN);
  h->arena_bytes = p->arena_bytes;
  off = h->arena_off + (uint64_t)p->local_world * p->arena_bytes;
  h->p2p_ring_bytes = ddcpu_p2p_ring_bytes(p->local_world);
  h->p2p_off = ALIGN_UP(off, 4096);
  h->total_bytes = h->p2p_off + (uint64_t)p->local_world * (uint64_t)p->local_world *
                                    h->p2p_ring_bytes;
}

/* See internal.h. */
uint64_t ddcpu_shm_arena_auto(int local_world) {
  struct statvfs v;
  if (local_world < 1 || statvfs("/dev/shm", &v) != 0) return 0;
  uint64_t total = (uint64_t)v.f_blocks * (uint64_t)(v.f_frsize ? v.f_frsize : v.f_bsize);
  uint64_t budget = ARENA_VA_BUDGET / (uint64_t)local_world;
  uint64_t a = total < budget ? total : budget;
  return a / ARENA_ALIGN * ARENA_ALIGN;
}

static void bind_pointers(ddcpu_shm *s) {
  unsigned char *b = s->base;
  s->hdr = (ddcpu_shm_hdr *)b;
  s->procs = (ddcpu_proc *)(b + s->hdr->procs_off);
  s->ctl = (ddcpu_rank_ctl *)(b + s->hdr->ctl_off);
  s->arrived = (_Atomic uint64_t *)(b + s->hdr->arrived_off);
  s->small = b + s->hdr->small_off;
  s->stage = b + s->hdr->stage_off;
  s->arena = b + s->hdr->arena_off;
  s->bell = (ddcpu_ctr *)(b + s->hdr->bell_off);
  s->p2p_ctl = (ddcpu_p2p_ring_ctl *)(b + s->hdr->p2p_ctl_off);
  s->p2p = b + s->hdr->p2p_off;
}

void ddcpu_shm_name(char *out, size_t cap, const char *run_id, int node) {
  snprintf(out, cap, "/" DDCPU_SHM_PREFIX "%s-n%d", run_id, node);
}

/* Start time (field 22 of /proc/<pid>/stat, clock ticks since boot); 0 if
 * the process does not exist or has exited (a zombie). */
uint64_t ddcpu_proc_start_time(int64_t pid) {
  char path[64], buf[1024];
  if (pid <= 0) return 0;
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may contain spaces */
  if (!p || !p[1] || !p[2]) return 0;
  if (p[2] == 'Z' || p[2] == 'X') return 0; /* exited, not yet reaped */
  /* after ')' come fields 3.. ; starttime is field 22 */
  int field = 2;
  for (p++; *p && field < 22; p++)
    if (*p == ' ') field++;
  return strtoull(p, NULL, 10);
}

int ddcpu_proc_alive(int64_t pid, uint64_t start_time) {
  if (pid <= 0) return 0;
  uint64_t st = ddcpu_proc_start_time(pid);
  if (st == 0) return 0;
  return start_time == 0 || st == start_time;
}

/* Create, size, map and initialise a new segment. On failure nothing is
 * left (the name is unlinked) and the sentence says why. */
int ddcpu_shm_create(ddcpu_shm *s, const ddcpu_shm_params *p) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  ddcpu_shm_hdr proto;
  memset(&proto, 0, sizeof proto);
  layout(p, &proto);
  ddcpu_shm_name(s->name, sizeof s->name, p->run_id, p->node);
  int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, errno,
                           "shm_open(%s) for the node's shared memory failed%s",
                           s->name,
                           errno == EEXIST ? " (a segment of the same run id "
                                          "exists and is in use)" : "");
  /* Reserve the pages of the fixed part now: a /dev/shm too small for it
   * is then an error here, not a SIGBUS in the middle of a collective. The
   * arenas after it stay sparse (mem.c reserves what it allocates). */
  int e = posix_fallocate(fd, 0, (off_t)proto.arena_off);
  if (e == EINVAL || e == EOPNOTSUPP)
    e = ftruncate(fd, (off_t)proto.arena_off) == 0 ? 0 : errno;
  if (e == 0 && proto.total_bytes > proto.arena_off &&
      ftruncate(fd, (off_t)proto.total_bytes) != 0)
    e = errno;
  if (e != 0) {
    close(fd);
    shm_unlink(s->name);
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e,
                           "reserving %llu bytes of shared memory for %s failed "
                           "(is /dev/shm large enough? lower plugin_options "
                           "chunk_bytes or slots)", (unsigned long long)proto.total_bytes,
                           s->name);
  }
  void *base = mmap(NULL, proto.total_bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_NORESERVE, fd, 0);
  e = errno;
  if (base == MAP_FAILED) {
    close(fd);
    shm_unlink(s->name);
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e, "mmap of %s (%llu bytes) failed",
                           s->name, (unsigned long long)proto.total_bytes);
  }
  s->base = base;
  s->size = proto.total_bytes;
  s->fd = fd;
  s->creator = 1;
  ddcpu_shm_hdr *h = base;
  /* a new segment is zero-filled: counters, flags and records start at 0 */
  h->version = DDCPU_SHM_VERSION;
  h->local_world = p->local_world;
  h->node = p->node;
  h->num_nodes = p->num_nodes;
  h->slots = p->slots;
  h->total_bytes = proto.total_bytes;
  h->chunk_bytes = p->chunk_bytes;
  h->small_bytes = p->small_bytes;
  snprintf(h->run_id, sizeof h->run_id, "%s", p->run_id);
  h->procs_off = proto.procs_off;
  h->ctl_off = proto.ctl_off;
  h->arrived_off = proto.arrived_off;
  h->small_off = proto.small_off;
  h->stage_off = proto.stage_off;
  h->arena_off = proto.arena_off;
  h->arena_bytes = proto.arena_bytes;
  h->bell_off = proto.bell_off;
  h->p2p_ctl_off = proto.p2p_ctl_off;
  h->p2p_off = proto.p2p_off;
  h->p2p_ring_bytes = proto.p2p_ring_bytes;
  atomic_store(&h->creator_pid, (int64_t)getpid());
  atomic_store(&h->creator_start, ddcpu_proc_start_time(getpid()));
  atomic_store_explicit(&h->magic, DDCPU_SHM_MAGIC, memory_order_release);
  bind_pointers(s);
  return DDPLUG_OK;
}

/* Attach to the segment named name and check its layout against p. */
int ddcpu_shm_attach(ddcpu_shm *s, const char *name, const ddcpu_shm_params *p) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  snprintf(s->name, sizeof s->name, "%s", name);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) /* NOT_FOUND: its creator removed it (setup_shm says why) */
    return ddcpu_err_errno(errno == ENOENT ? DDPLUG_E_NOT_FOUND : DDPLUG_E_SYSTEM, errno,
                           "cannot open the node's shared memory %s", name);
  struct stat stt;
  if (fstat(fd, &stt) != 0 || (uint64_t)stt.st_size < sizeof(ddcpu_shm_hdr)) {
    close(fd);
    return ddcpu_err(DDPLUG_E_INTERNAL, "shared memory %s is too small", name);
  }
  void *base = mmap(NULL, (size_t)stt.st_size, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_NORESERVE, fd, 0);
  int e = errno;
  if (base == MAP_FAILED) {
    close(fd);
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e, "mmap of %s failed", name);
  }
  s->base = base;
  s->size = (size_t)stt.st_size;
  s->fd = fd;
  ddcpu_shm_hdr *h = base;
  ddcpu_shm_hdr want;
  memset(&want, 0, sizeof want);
  layout(p, &want);
  if (atomic_load_explicit(&h->magic, memory_order_acquire) != DDCPU_SHM_MAGIC ||
      h->version != DDCPU_SHM_VERSION) {
    ddcpu_shm_detach(s);
    return ddcpu_err(DDPLUG_E_INTERNAL,
                     "shared memory %s is not an initialised ddplug cpu "
                     "segment of this version", name);
  }
  if (h->local_world != p->local_world || h->slots != p->slots ||
      h->chunk_bytes != p->chunk_bytes || h->small_bytes != p->small_bytes ||
      h->num_nodes != p->num_nodes || h->total_bytes != want.total_bytes ||
      h->arena_bytes != want.arena_bytes || s->size < want.total_bytes ||
      strcmp(h->run_id, p->run_id) != 0) {
    char msg[DDCPU_MSG_MAX];
    snprintf(msg, sizeof msg,
             "the node's ranks disagree on the shared-memory layout of %s: "
             "creator has %d local ranks, chunk_bytes %llu, slots %u, "
             "small_msg_bytes %llu, registered_bytes %llu; this rank has %d, "
             "%llu, %u, %llu, %llu (plugin_options must be identical on every "
             "rank, and an automatic registered_bytes follows the size of "
             "/dev/shm, which must be the same file system for every rank)",
             name, h->local_world, (unsigned long long)h->chunk_bytes,
             h->slots, (unsigned long long)h->small_bytes,
             (unsigned long long)h->arena_bytes, p->local_world,
             (unsigned long long)p->chunk_bytes, p->slots,
             (unsigned long long)p->small_bytes,
             (unsigned long long)p->arena_bytes);
    ddcpu_shm_detach(s);
    return ddcpu_err(DDPLUG_E_CONFIG, "%s", msg);
  }
  bind_pointers(s);
  return DDPLUG_OK;
}

void ddcpu_shm_register(ddcpu_shm *s, int local_index) {
  ddcpu_proc *pr = &s->procs[local_index];
  atomic_store(&pr->start_time, ddcpu_proc_start_time(getpid()));
  atomic_store(&pr->pid, (int64_t)getpid());
}

void ddcpu_shm_unlink(ddcpu_shm *s) {
  if (!s->unlinked && s->name[0]) {
    shm_unlink(s->name);
    s->unlinked = 1;
  }
}

void ddcpu_shm_detach(ddcpu_shm *s) {
  if (s->base) munmap(s->base, s->size);
  s->base = NULL;
  s->hdr = NULL;
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* Is the segment at path (already opened as fd) abandoned? 1 = every
 * recorded process is dead; 0 = in use or cannot tell (kept). */
static int segment_abandoned(int fd, time_t mtime) {
  struct stat stt;
  if (fstat(fd, &stt) != 0) return 0;
  /* Shorter than its header (zero bytes, typically): a creator killed
   * between shm_open and sizing it — or one doing that right now, which
   * takes microseconds. Only an old one is garbage. */
  if ((uint64_t)stt.st_size < sizeof(ddcpu_shm_hdr)) return time(NULL) - mtime > 60;
  void *base = mmap(NULL, (size_t)stt.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return 0;
  const ddcpu_shm_hdr *h = base;
  int abandoned = 0;
  if (atomic_load(&h->magic) != DDCPU_SHM_MAGIC) {
    /* Not (yet) initialised: a creator between ftruncate and its header, or
     * one that died there. Only an old one is garbage. */
    abandoned = time(NULL) - mtime > 60; /* our prefix: our creator died */
  } else if (h->version == DDCPU_SHM_VERSION && h->procs_off < (uint64_t)stt.st_size &&
             h->local_world > 0 &&
             h->procs_off + sizeof(ddcpu_proc) * (uint64_t)h->local_world <=
                 (uint64_t)stt.st_size) {
    abandoned = !ddcpu_proc_alive(atomic_load(&h->creator_pid),
                                  atomic_load(&h->creator_start));
    const ddcpu_proc *procs = (const ddcpu_proc *)((const char *)base + h->procs_off);
    for (int i = 0; abandoned && i < h->local_world; i++)
      if (ddcpu_proc_alive(atomic_load(&procs[i].pid),
                           atomic_load(&procs[i].start_time)))
        abandoned = 0;
  }
  munmap(base, (size_t)stt.st_size);
  return abandoned;
}

/* See internal.h. Only segments this user owns are considered. */
int ddcpu_shm_cleanup_stale(const ddcpu_group *g) { return ddcpu_shm_stale(g, 1); }

int ddcpu_shm_stale(const ddcpu_group *g, int remove) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, DDCPU_SHM_PREFIX, strlen(DDCPU_SHM_PREFIX)) != 0) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;
    struct stat stt;
    int mine = fstat(fd, &stt) == 0 && stt.st_uid == getuid();
    int gone = mine && segment_abandoned(fd, stt.st_mtime);
    close(fd);
    if (gone && !remove) {
      removed++;
      continue;
    }
    if (gone && shm_unlink(name) == 0) {
      removed++;
      ddcpu_log(g, DDPLUG_LOG_INFO,
                "removed stale shared memory /dev/shm/%s (every process that "
                "used it has exited)", e->d_name);
    }
  }
  closedir(d);
  return removed;
}
