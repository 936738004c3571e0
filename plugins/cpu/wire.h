/*
 * wire.h — the records the cpu plugin's node leaders send each other over
 * the TCP ring (tcp.c): control records (hello, abort, goodbye) and the
 * per-collective handshake records. They are sent as raw structs: every
 * leader of a run runs the same build of the plugin (the runtime's startup
 * checks refuse a run whose ranks loaded different plugin versions), and
 * each record starts with DDCPU_TCP_MAGIC, which the receiver checks. Change
 * DDCPU_TCP_MAGIC when a record's bytes change (as for shm_layout.h's
 * version rule), so that two builds that disagree fail on the magic
 * instead of misreading each other.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_WIRE_H
#define DDPLUG_CPU_WIRE_H

#include <stdint.h>

#include "shm_layout.h"

#define DDCPU_TCP_MAGIC 0x48504c47u /* "GLPH" */

/* ddcpu_ctl_msg.type */
enum { DDCPU_MSG_HELLO = 1, DDCPU_MSG_ABORT = 2, DDCPU_MSG_BYE = 3 };

/* Control record travelling backwards around the ring (and BYE forwards);
 * HELLO, with a MAC, proves a new connection belongs to the run (tcp.c). */
typedef struct ddcpu_ctl_msg {
  uint32_t magic;
  uint32_t type;
  int32_t status;
  int32_t rank;        /* lost or aborting rank                           */
  int32_t origin;      /* detecting rank                                  */
  int32_t origin_node;
  uint64_t run_hash;
  char msg[DDCPU_MSG_MAX];
} ddcpu_ctl_msg;

/* Record of one node sent around the ring at a collective's handshake
 * (handshake.c). */
typedef struct ddcpu_hs_rec {
  uint32_t magic;
  int32_t node;
  int32_t leader;       /* global rank of the node's leader               */
  int32_t status;       /* OK, or MISMATCH found inside the node          */
  uint64_t index;       /* internal collective index                      */
  ddcpu_desc desc;      /* the leader's descriptor                        */
  char detail[DDCPU_MSG_MAX];
} ddcpu_hs_rec;

/* A point-to-point frame (p2p.c): between two ranks of one node through a
 * byte ring of the node segment, between nodes over a TCP connection of
 * the pair (p2p_link.c); a payload of len bytes follows the header. On a
 * ring, frames are padded to a multiple of 64 bytes.
 *   MSG   a whole message (eager: at most the eager size), payload = data
 *   RTS   a large message announced (ready to send), no payload
 *   CTS   the receiver matched message id: send it (clear to send)
 *   NAK   the receiver matched message id but refuses it (count or dtype
 *         differ: count/dtype are the receive's, status MISMATCH)
 *   DATA  len bytes of message id at offset
 *   BYE   the sender closed its group (TCP; on a ring the segment's
 *         departed flag says it)                                          */
#define DDCPU_FRAME_MAGIC 0x50325044u /* "DP2P" */
enum { DDCPU_FR_MSG = 1, DDCPU_FR_RTS, DDCPU_FR_CTS, DDCPU_FR_NAK, DDCPU_FR_DATA, DDCPU_FR_BYE };

typedef struct ddcpu_frame {
  uint32_t magic;
  uint32_t type;
  int32_t from;         /* the rank that wrote the frame                  */
  int32_t dtype;
  uint64_t id;          /* message number on its (sender, receiver) pair  */
  int64_t tag;
  uint64_t count;       /* elements of the message (NAK: of the receive)  */
  uint64_t len;         /* payload bytes after the header                 */
  uint64_t offset;      /* DATA: where in the message                      */
  int32_t status;       /* NAK: why                                        */
  int32_t pad;
} ddcpu_frame;

#endif /* DDPLUG_CPU_WIRE_H */
