/*
 * shm_layout.h — the cpu plugin's node segment: the shared memory that
 * every rank of a node maps (/dev/shm/ddplug-cpu-<run_id>-n<node>, shm.c),
 * byte for byte. Processes read and write these structs concurrently, and
 * a later process reads a dead one's segment to clean it up, so this is a
 * format shared across processes, not a private struct.
 *
 * The segment, in order (offsets in the header; shm.c's layout() computes
 * them and their alignment):
 *   ddcpu_shm_hdr                     the header (page-aligned end)
 *   ddcpu_proc[local_world]           who attached
 *   ddcpu_rank_ctl[local_world]       each rank's counters and descriptors
 *   uint64_t arrived[num_nodes]       last collective index heard from each
 *                                     node (multi-node)
 *   small[local_world][2][small_bytes]  the one-shot path's data slots
 *   stage[slots][local_world][chunk_bytes]  the chunk pipeline's staging
 *   ddcpu_ctr bell[local_world]       point-to-point doorbells (p2p.c)
 *   ddcpu_p2p_ring_ctl ring[local_world][local_world]  the byte rings'
 *                                     positions, ring[i][j]: i sends to j
 *   arena[local_world][arena_bytes]   registered memory (mem.c)
 *   ring data[local_world][local_world][p2p_ring_bytes]  point-to-point
 *                                     (sparse: a sender reserves its
 *                                     ring's pages before its first frame)
 *
 * Version rule: bump DDCPU_SHM_VERSION whenever the bytes change: a field
 * added, removed, moved, resized or retyped in any struct of this file, a
 * new value given a different meaning, DDCPU_MSG_MAX changed (it sizes
 * several fields), or the regions' order or alignment changed. Renaming a
 * field or editing a comment changes nothing. A rank that finds another
 * version refuses to attach; the stale-segment cleanup skips a segment of
 * another version. magic and version therefore stay the header's first two
 * fields, at these offsets, in every version.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_SHM_LAYOUT_H
#define DDPLUG_CPU_SHM_LAYOUT_H

#include <stdatomic.h>
#include <stdint.h>

#define DDCPU_SHM_MAGIC 0x3148677570646464ull /* "dddpugH1" */
#define DDCPU_SHM_VERSION 4u
#define DDCPU_SHM_PREFIX "ddplug-cpu-"

/* Longest human sentence the plugin produces (and stores in the segment). */
#define DDCPU_MSG_MAX 768

/* A monotonically increasing 32-bit counter on its own cache line, with a
 * count of sleepers so that posting costs no system call when nobody sleeps
 * (wait.c). Comparisons are wrap-safe. */
typedef struct ddcpu_ctr {
  _Atomic uint32_t val;
  _Atomic uint32_t waiters;
  char pad[56];
} ddcpu_ctr;

/* A process that attached, for stale-segment cleanup and liveness. */
typedef struct ddcpu_proc {
  _Atomic int64_t pid;
  _Atomic uint64_t start_time; /* /proc/<pid>/stat starttime (clock ticks) */
  _Atomic uint32_t departed;   /* 1: left through group_destroy            */
  _Atomic uint32_t cma;        /* DDCPU_SC_*: can this rank read and write
                                  every local peer's memory (direct.c)    */
  uint64_t probe_addr;         /* address of a word peers probe with
                                  process_vm_readv/writev                  */
} ddcpu_proc;

/* Values of ddcpu_proc.cma: the rank's single-copy verdict. */
enum { DDCPU_SC_UNKNOWN = 0, DDCPU_SC_NO = 1, DDCPU_SC_YES = 2 };

/* One collective as a rank saw it: compared across ranks at every
 * collective's handshake (mismatch detection). Also travels between nodes
 * inside ddcpu_hs_rec (wire.h). */
typedef struct ddcpu_desc {
  uint64_t seq;   /* runtime sequence number (args.seq)                   */
  uint64_t count;
  int32_t kind, dtype, op, root;
  int32_t rank;   /* who wrote it                                         */
  int32_t small;  /* 1 if the writer also put its data in its small slot  */
} ddcpu_desc;

/* The first failure of a group (abort, peer loss) as every rank reports it
 * (failure.c). */
typedef struct ddcpu_fail_rec {
  _Atomic uint32_t state; /* 0 none, 1 being written, 2 set              */
  int32_t status;         /* DDPLUG_E_ABORTED, _PEER_LOST, ...            */
  int32_t rank;           /* the rank lost, or the rank that aborted      */
  int32_t origin;         /* the rank that detected or called abort       */
  char msg[DDCPU_MSG_MAX];
} ddcpu_fail_rec;

/* Where a rank's buffers of one collective are (direct.c): addresses in
 * its own process (for process_vm_readv/writev) and, when registered,
 * offsets in the node segment (every local rank maps it). */
typedef struct ddcpu_bufref {
  uint64_t send, recv;         /* addresses in the writer's process       */
  int64_t send_off, recv_off;  /* node-segment offsets; -1: not registered */
} ddcpu_bufref;

/* Per-rank control block: the rank's counters and its descriptors. */
typedef struct ddcpu_rank_ctl {
  _Alignas(64) ddcpu_ctr arrive; /* low 32 bits of the last collective it
                                    arrived at                           */
  /* The chunk pipeline (shm_coll.c), in chunks since the group began: */
  ddcpu_ctr copied_in;  /* copied into this rank's staging area        */
  ddcpu_ctr reduced;    /* with this rank's slice reduced over every
                           rank's staging area                         */
  ddcpu_ctr copied_out; /* copied out of the staging slot, which may be
                           reused                                      */
  ddcpu_ctr done;      /* direct path, for collective index k: 2k-1 once
                          this rank pushed its shares into the peers'
                          outputs (the push), 2k once it wrote its slice
                          into every rank's output (low 32 bits)         */
  ddcpu_desc desc[2];  /* by parity of the collective index             */
  ddcpu_bufref buf[2]; /* by parity: this rank's buffers (direct path)  */
  _Atomic uint64_t writing;   /* collective index while this rank writes
                                 into other ranks' outputs, else 0       */
  _Atomic uint64_t withdrawn; /* collective index this rank abandoned
                                 after a failure (writers skip it)       */
} ddcpu_rank_ctl;

/* A byte ring carrying point-to-point frames (wire.h, ddcpu_frame) from one
 * local rank to another (p2p_link.c): the sender owns head, the receiver
 * tail; head - tail bytes are in flight. Frames are written whole, padded to
 * 64 bytes, and may wrap around the ring's end. */
typedef struct ddcpu_p2p_ring_ctl {
  _Alignas(64) _Atomic uint64_t head; /* bytes written so far (sender)     */
  char pad0[56];
  _Atomic uint64_t tail;              /* bytes consumed so far (receiver)  */
  char pad1[56];
} ddcpu_p2p_ring_ctl;

/* A node leader's running ring phase, for TIMEOUT messages on every rank
 * of the node (read by other threads and processes): which collective,
 * whether it still waits to receive / to send, and when it last received /
 * sent a byte (or started). Without a segment (one rank on the node) the
 * group keeps its own (ddcpu_ring_watch_of, group.h). */
typedef struct ddcpu_ring_watch {
  _Atomic uint64_t k;
  _Atomic uint64_t rx_ns, tx_ns;
  _Atomic uint32_t want_rx, want_tx;
} ddcpu_ring_watch;

typedef struct ddcpu_shm_hdr {
  _Atomic uint64_t magic; /* DDCPU_SHM_MAGIC once initialised (written last) */
  uint32_t version;       /* DDCPU_SHM_VERSION                              */
  int32_t local_world;
  int32_t node;
  int32_t num_nodes;
  uint32_t slots;
  uint32_t pad0;
  uint64_t total_bytes;
  uint64_t chunk_bytes;
  uint64_t small_bytes;
  char run_id[48];
  _Atomic int64_t creator_pid;
  _Atomic uint64_t creator_start;
  uint64_t procs_off, ctl_off, arrived_off, small_off, stage_off;
  uint64_t arena_off;   /* registered memory: local rank j's arena is at
                           arena_off + j * arena_bytes (sparse: pages exist
                           only once allocated)                          */
  uint64_t arena_bytes;
  uint64_t bell_off;    /* ddcpu_ctr[local_world], then the rings' ctl     */
  uint64_t p2p_ctl_off; /* ddcpu_p2p_ring_ctl[local_world][local_world]    */
  uint64_t p2p_off;     /* ring data, after the arenas (sparse)            */
  uint64_t p2p_ring_bytes; /* bytes of one ring (a power of two; 0: none)  */
  ddcpu_ctr attached;   /* processes attached so far                    */
  ddcpu_ctr probed;     /* processes that published their cma verdict   */
  ddcpu_ctr verdict;    /* multi-node: collective index of the verdict  */
  int32_t verdict_status;
  int32_t pad1;
  char verdict_msg[DDCPU_MSG_MAX];
  ddcpu_fail_rec fail[2];      /* see failure.c                         */
  ddcpu_ring_watch ring_watch; /* the leader's ring phase (ring.c)      */
} ddcpu_shm_hdr;

#endif /* DDPLUG_CPU_SHM_LAYOUT_H */
