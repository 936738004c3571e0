/*
 * p2p.h — the cpu plugin's point-to-point state: a send or receive (the
 * request p2p_start returns), the messages that arrived before their
 * receive, and one link per peer with its transport — a pair of byte rings
 * in the node segment for a peer on this node, a pair of TCP connections
 * for a peer on another node (p2p_link.c). The protocol and the engine are
 * p2p.c's; README.md, "Point-to-point", says why it is built this way.
 * Everything here is guarded by ddcpu_p2p.mu unless marked otherwise.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_CPU_P2P_H
#define DDPLUG_CPU_P2P_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ddplug/plugin.h"
#include "request.h"
#include "shm_layout.h"
#include "wire.h"

typedef struct ddcpu_p2p_op ddcpu_p2p_op;

/* A list of ops (FIFO); an op is in at most one, which it remembers. */
typedef struct ddcpu_p2p_list {
  ddcpu_p2p_op *head, *tail;
} ddcpu_p2p_list;

/* A send or receive; its first member is the head every request has
 * (request.h), so the request slots tell it from a collective. */
struct ddcpu_p2p_op {
  ddcpu_req_head head;     /* kind DDCPU_REQ_P2P                            */
  int send;                /* 1 send, 0 receive                             */
  int peer;                /* the other rank; a receive: -1 = any           */
  int64_t tag;
  unsigned char *buf;
  uint64_t count;
  int32_t dtype;
  uint64_t bytes;
  int32_t *source;         /* a receive: where the sender's rank goes       */
  int state;               /* DDCPU_OP_*                                    */
  int src;                 /* a receive: the matched sender, once matched   */
  uint64_t id;             /* the message's number on its (sender, receiver)
                              pair                                          */
  uint64_t moved;          /* payload bytes handed to the transport (send)
                              or received                                   */
  uint64_t written;        /* send: payload bytes the transport wrote       */
  uint64_t start_ns;
  _Atomic int done;        /* 1 once complete: status and msg are final     */
  int status;
  char msg[DDCPU_MSG_MAX];
  int user_freed;          /* request_free came before completion           */
  ddcpu_p2p_list *in;      /* the list its state keeps it in, or NULL       */
  ddcpu_p2p_op *next, *prev;
  ddcpu_p2p_op *anext, *aprev; /* every op not yet released                 */
};

/* ddcpu_p2p_op.state */
enum {
  DDCPU_OP_QUEUED = 1, /* send: its MSG or RTS frame not yet written         */
  DDCPU_OP_WAIT_CTS,   /* send: RTS written, waiting for the receiver        */
  DDCPU_OP_DATA,       /* send: cleared to send, DATA frames going out        */
  DDCPU_OP_POSTED,     /* receive: waiting for a matching message             */
  DDCPU_OP_RECEIVING,  /* receive: matched an RTS, DATA frames coming in      */
  DDCPU_OP_DONE
};

/* A message that arrived before a receive matched it: an eager message with
 * its payload, or a large message's announcement (RTS: the payload waits at
 * the sender until a receive matches). */
typedef struct ddcpu_p2p_unexpected {
  int src;
  int rts;
  int64_t tag;
  uint64_t id, count, len;
  int32_t dtype;
  unsigned char *data;     /* eager payload (len bytes), malloc'd           */
  struct ddcpu_p2p_unexpected *next;
} ddcpu_p2p_unexpected;

/* Where a frame's payload is being delivered while it is read: a receive
 * (op) or a message nobody asked for yet (ux); neither: discarded. */
typedef struct ddcpu_p2p_rx {
  ddcpu_p2p_op *op;
  ddcpu_p2p_unexpected *ux;
} ddcpu_p2p_rx;

/* One direction of a TCP link: a socket, its handshake and its partial
 * frames (p2p_link.c). */
typedef struct ddcpu_p2p_sock {
  int fd;
  int state;               /* DDCPU_SOCK_*                                  */
  uint64_t retry_at;       /* CONNECT_LATER: when to try again              */
  uint64_t deadline;       /* the handshake's                               */
  int last_err;
  uint8_t nonce[32];
  size_t hs_got;
  /* the frame being written (header, then payload) */
  int tx_busy;
  unsigned char tx_hdr[sizeof(ddcpu_frame)];
  const unsigned char *tx_pay;
  uint64_t tx_len, tx_off; /* header + payload bytes, written so far        */
  ddcpu_p2p_op *tx_op;     /* DATA: the send whose bytes these are          */
  /* the frame being read */
  unsigned char rx_hdr[sizeof(ddcpu_frame)];
  size_t rx_hgot;
  ddcpu_p2p_rx rx;         /* whose payload it is                           */
  unsigned char *rx_dst;   /* where its payload goes (NULL: discarded)      */
  uint64_t rx_len, rx_got;
  int bye;                 /* the peer said goodbye on it                   */
} ddcpu_p2p_sock;

enum {
  DDCPU_SOCK_NONE = 0,
  DDCPU_SOCK_CONNECT_LATER, /* connector: refused or not yet tried         */
  DDCPU_SOCK_CONNECTING,    /* connector: connect() in progress            */
  DDCPU_SOCK_NONCE,         /* connector: reading the listener's challenge */
  DDCPU_SOCK_ACK,           /* connector: hello sent, reading the ack      */
  DDCPU_SOCK_READY,
  DDCPU_SOCK_CLOSED
};

/* A control frame (CTS, NAK) waiting to be written. */
typedef struct ddcpu_p2p_ctl {
  ddcpu_frame f;
  struct ddcpu_p2p_ctl *next;
} ddcpu_p2p_ctl;

/* Everything about one peer. */
typedef struct ddcpu_p2p_link {
  int peer;
  int local;               /* the peer is on this node: rings, else TCP     */
  int j;                   /* local: the peer's local index                 */
  /* rings (local) */
  ddcpu_p2p_ring_ctl *out_ctl, *in_ctl;
  unsigned char *out_data, *in_data;
  int out_reserved;        /* the out ring's pages are reserved             */
  /* TCP (remote): out carries this rank's sends (and the peer's answers
   * to them), in the peer's sends (and this rank's answers) */
  ddcpu_p2p_sock out, in;
  struct sockaddr_in addr; /* where the peer listens (known once out is used) */
  uint8_t key[32];         /* and the key that proves a connection to it    */
  /* what this rank still has to write to the peer */
  ddcpu_p2p_ctl *ctl_head, *ctl_tail; /* answers (CTS, NAK)                 */
  ddcpu_p2p_list queued;   /* sends whose first frame (MSG, RTS) is due     */
  ddcpu_p2p_list data;     /* sends cleared to send their DATA frames       */
  ddcpu_p2p_list waiting;  /* sends whose RTS went out, waiting for CTS     */
  ddcpu_p2p_list receiving; /* receives matched to an RTS of this peer      */
  uint64_t next_id;        /* the last message id this rank sent it         */
  int bye;                 /* the peer closed its group                     */
} ddcpu_p2p_link;

/* A connection accepted but not yet proven (p2p_link.c). */
typedef struct ddcpu_p2p_pending {
  int fd;
  uint64_t deadline;
  size_t got;
  uint8_t nonce[32];
  unsigned char buf[sizeof(ddcpu_ctl_msg) + 32];
} ddcpu_p2p_pending;
#define DDCPU_P2P_PENDING_MAX 16

typedef struct ddcpu_p2p {
  pthread_mutex_t mu;
  ddcpu_p2p_link *links;   /* [world]; links[rank] unused                   */
  ddcpu_p2p_list posted;   /* receives waiting for a message, as posted    */
  ddcpu_p2p_unexpected *unexp, *unexp_tail; /* in the order they arrived    */
  ddcpu_p2p_op *all;       /* every op not yet released                     */
  int live;                /* ops started and not complete                 */
  uint64_t ring_bytes;     /* of one ring (0: no local peers)               */
  uint64_t eager_bytes;    /* messages up to this size go without RTS       */
  ddcpu_ctr own_bell;      /* the doorbell without a node segment           */
  ddcpu_ctr *bell;         /* this rank's doorbell (shm or own_bell)        */
  /* TCP (several nodes) */
  int lfd;                 /* listener, -1 without remote peers             */
  uint8_t key[32];         /* proves a connection to this rank              */
  ddcpu_p2p_pending pend[DDCPU_P2P_PENDING_MAX];
  int npend;
  int refused;
  _Atomic int waiters;     /* callers waiting in request_wait (the
                              progress thread leaves them the work)         */
  _Atomic int pending;     /* = live, readable without the lock             */
  /* Callers wait right after starting (within DDCPU_SYNC_WAIT_NS): a start
   * then leaves the progress thread asleep (it would only take the CPU from
   * the caller), and the thread moves what nobody waits for once the last
   * start is DDCPU_STRANDED_NS old, which turns this off again (as for
   * collectives: progress.c). */
  _Atomic int lazy;
  _Atomic uint64_t last_start_ns;
} ddcpu_p2p;

#endif /* DDPLUG_CPU_P2P_H */
