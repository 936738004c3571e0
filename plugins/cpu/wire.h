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

#endif /* DDPLUG_CPU_WIRE_H */
