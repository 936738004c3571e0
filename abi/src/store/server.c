/*
 * server.c — the rendezvous store server: one background thread that
 * serves every connection with epoll (no thread per client).
 *
 * Rank 0 runs it inside its own process, so it must never crash, block or
 * leak because of what a client sends: every frame is bounded and checked
 * (proto.c); a malformed one closes that connection only. Blocking
 * GET/WAIT requests are parked in the key table (table.c) and answered
 * when their keys appear or their deadline passes — no polling. Output is
 * buffered per connection; a client that does not read its replies stops
 * being read (back-pressure) instead of growing the server's memory.
 *
 * Nothing is spent on a client before it proves the secret: until its AUTH
 * succeeds a connection holds a fixed 128-byte input buffer (a frame longer
 * than an AUTH frame closes it), must authenticate within a few seconds
 * (HANDSHAKE_TIMEOUT_MS, not the rendezvous timeout), and counts against
 * two caps — connections waiting to authenticate in all, and from one
 * address — beyond which the oldest waiting connection is dropped. A
 * joining rank is always the newest and authenticates in one round trip,
 * so a flood of idle or slow connections cannot keep it out (and a client
 * dropped during its handshake connects again). Running out of file
 * descriptors drops the oldest waiting connection too, instead of pausing.
 * After a handshake with a secret every frame carries a sequence number and
 * a MAC (proto.c); one that fails either check closes the connection
 * with a warning.
 *
 * Connections are never freed while an epoll batch or a table callback may
 * still refer to them: conn_kill() only marks and queues, settle() flushes
 * output and reaps the dead at a safe point of the loop.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/store.h"

/* A connection must authenticate within this long after accept, unless
 * changed with ddplug__store_server_set_handshake_timeout. A client answers
 * the challenge in one round trip; seconds leave room for a loaded machine
 * without letting idle connections pile up for the rendezvous timeout. */
#define HANDSHAKE_TIMEOUT_MS 5000
/* Input buffer of a connection that has not authenticated: an AUTH frame
 * (75 bytes) fits, nothing more is read. */
#define IN_PREAUTH_CAP 128u
/* Caps on connections waiting to authenticate: in all (also at most a
 * quarter of the process's file descriptor limit), and from one address. */
#define MAX_PENDING 1024u
#define MAX_PENDING_PER_ADDR 256u
/* At most one warning about dropped connections this often. */
#define EVICT_WARN_INTERVAL_NS (10ull * 1000000000ull)
/* Stop reading a connection while this much of its output is unsent. */
#define OUT_HIGH_WATER (4u * 1024u * 1024u)
/* Per-connection bounds against a client that floods the server. */
#define MAX_PARKED_PER_CONN 256u
#define MAX_REGS_PER_CONN 1024u
#define MAX_REG_BYTES_PER_CONN (16u * 1024u * 1024u)
/* How long to stop accepting after running out of file descriptors. */
#define ACCEPT_PAUSE_MS 100
#define IN_MIN_CAP 4096u

typedef struct reg { /* one on_disconnect registration */
  struct reg *next;
  uint8_t *value;
  uint32_t vlen;
  uint16_t klen;
  uint8_t key[];
} reg;

typedef struct conn {
  struct conn *prev, *next;  /* every live connection */
  struct conn *flush_next;   /* queued for flushing */
  struct conn *dead_next;    /* queued for reaping */
  struct conn *pend_prev, *pend_next; /* waiting to authenticate, oldest first */
  int fd;
  uint32_t events;           /* current epoll mask */
  uint8_t authed, bye, dead, flush_queued, close_after_flush, pending;
  uint8_t addr_len;          /* the peer's address bytes, for the caps */
  uint8_t addr[16];
  uint64_t handshake_deadline_ns;
  uint8_t nonce[DDPLUG__STORE_NONCE_LEN];
  ddplug__store_session session; /* frame MACs after a handshake with a secret */
  uint8_t *in;               /* received bytes not yet processed */
  size_t in_len, in_cap;
  ddplug__sbuf out;          /* replies not yet sent: out.data[out_off..] */
  size_t out_off;
  uint32_t nparked, nregs;
  size_t reg_bytes;
  reg *regs;
  char peer[64];
} conn;

struct ddplug_store_server {
  int listen_fd, wake_fd, ep;
  int port;
  pid_t pid;        /* the process that started the server thread */
  _Atomic int64_t handshake_timeout_ms;
  int forked_copy;  /* freeing a fork's copy: leave the shared epoll alone */
  atomic_int stop;
  pthread_t thread;
  char where[320];
  uint8_t *secret;
  size_t secret_len;
  ddplug__store_table *table;
  conn *conns;
  conn *pend_head, *pend_tail;    /* waiting to authenticate, oldest first */
  size_t nconns, nhandshaking;
  size_t max_pending;
  uint64_t evicted, evict_warned_ns;
  int accept_again;               /* accept once more after settling */
  atomic_size_t nconns_shown; /* nconns, readable from other threads */
  conn *flush_list, *dead_list;
  uint64_t accept_paused_until_ns; /* 0 = accepting */
};

/* epoll data for the two non-connection fds. */
static char k_listen_tag, k_wake_tag;

/* ---- connection lifetime ------------------------------------------------- */

static void pending_remove(ddplug_store_server *s, conn *c) {
  if (!c->pending) return;
  c->pending = 0;
  if (c->pend_prev) c->pend_prev->pend_next = c->pend_next;
  else s->pend_head = c->pend_next;
  if (c->pend_next) c->pend_next->pend_prev = c->pend_prev;
  else s->pend_tail = c->pend_prev;
  c->pend_prev = c->pend_next = NULL;
  s->nhandshaking--;
}

static void conn_kill(ddplug_store_server *s, conn *c, const char *why) {
  if (c->dead) return;
  pending_remove(s, c);
  c->dead = 1;
  c->dead_next = s->dead_list;
  s->dead_list = c;
  if (why) DDPLUG__DEBUG("rendezvous store: closing connection from %s: %s", c->peer, why);
}

static void process_input(ddplug_store_server *s, conn *c);

static void set_events(ddplug_store_server *s, conn *c) {
  if (c->dead) return;
  size_t pending = c->out.len - c->out_off;
  uint32_t want = 0;
  if (!c->close_after_flush && pending < OUT_HIGH_WATER) want |= EPOLLIN;
  if (pending > 0) want |= EPOLLOUT;
  if (want == c->events) return;
  struct epoll_event ev = {.events = want, .data.ptr = c};
  if (epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev) != 0) {
    conn_kill(s, c, "epoll_ctl failed");
    return;
  }
  c->events = want;
}

static void queue_flush(ddplug_store_server *s, conn *c) {
  if (c->flush_queued || c->dead) return;
  c->flush_queued = 1;
  c->flush_next = s->flush_list;
  s->flush_list = c;
}

/* Send what the kernel takes now; the rest waits for EPOLLOUT. */
static void conn_flush(ddplug_store_server *s, conn *c) {
  while (!c->dead && c->out_off < c->out.len) {
    ssize_t w = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off,
                     MSG_NOSIGNAL);
    if (w > 0) {
      c->out_off += (size_t)w;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      conn_kill(s, c, "send failed (peer gone)");
      return;
    }
  }
  if (c->out_off == c->out.len) {
    c->out.len = 0;
    c->out_off = 0;
    if (c->out.cap > 1024 * 1024) ddplug__sbuf_free(&c->out);
    if (c->close_after_flush) {
      conn_kill(s, c, NULL);
      return;
    }
  }
  /* Frames held back by back-pressure: no new EPOLLIN will announce them. */
  if (!c->dead && c->in_len >= 4 && c->out.len - c->out_off < OUT_HIGH_WATER)
    process_input(s, c);
  set_events(s, c);
}

/* Set every on_disconnect key that is still absent (the peer vanished). */
static void fire_on_disconnect(ddplug_store_server *s, conn *c) {
  for (reg *r = c->regs; r; r = r->next) {
    uint32_t len;
    if (ddplug__store_table_get(s->table, r->key, r->klen, &len)) continue;
    if (ddplug__store_table_set(s->table, r->key, r->klen, r->value,
                                r->vlen) != 0)
      DDPLUG__WARN("rendezvous store: out of memory setting the disconnect "
                   "key of %s", c->peer);
  }
}

static void free_regs(conn *c) {
  while (c->regs) {
    reg *r = c->regs;
    c->regs = r->next;
    ddplug__free(r->value);
    ddplug__free(r);
  }
  c->nregs = 0;
  c->reg_bytes = 0;
}

/* Release everything of c. fire: apply its on_disconnect registrations. */
static void conn_free(ddplug_store_server *s, conn *c, int fire) {
  ddplug__store_table_drop_owner(s->table, c);
  if (fire && !c->bye && c->regs) {
    DDPLUG__DEBUG("rendezvous store: %s disconnected without closing; "
                  "applying its %u disconnect key(s)", c->peer, c->nregs);
    fire_on_disconnect(s, c);
  }
  free_regs(c);
  pending_remove(s, c);
  ddplug__store_session_clear(&c->session);
  /* After fork the epoll instance is shared with the parent: removing the
   * fd there would unregister the parent's connection. */
  if (!s->forked_copy) epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->nconns--;
  atomic_store(&s->nconns_shown, s->nconns);
  ddplug__free(c->in);
  ddplug__sbuf_free(&c->out);
  ddplug__free(c);
}

/* Flush queued output and reap dead connections until neither is left
 * (reaping fires disconnect keys, which may answer other connections). */
static void settle(ddplug_store_server *s) {
  while (s->flush_list || s->dead_list) {
    while (s->flush_list) {
      conn *c = s->flush_list;
      s->flush_list = c->flush_next;
      c->flush_queued = 0;
      conn_flush(s, c);
    }
    while (s->dead_list) {
      conn *c = s->dead_list;
      s->dead_list = c->dead_next;
      conn_free(s, c, 1);
    }
  }
}

/* ---- replies ------------------------------------------------------------- */

static void reply_begin(conn *c, uint32_t id, uint8_t code) {
  ddplug__sbuf_frame_begin(&c->out, DDPLUG__STORE_REPLY, id);
  ddplug__sbuf_u8(&c->out, code);
}

static void reply_end(ddplug_store_server *s, conn *c) {
  ddplug__sbuf_frame_seal(&c->out, &c->session);
  if (c->out.failed) {
    DDPLUG__WARN("rendezvous store: out of memory replying to %s; closing "
                 "that connection", c->peer);
    conn_kill(s, c, NULL);
    return;
  }
  queue_flush(s, c);
}

static void reply_simple(ddplug_store_server *s, conn *c, uint32_t id,
                         uint8_t code) {
  reply_begin(c, id, code);
  reply_end(s, c);
}

/* Answer a GET/WAIT waiter: complete (the value, or OK) or expired (GET:
 * TIMEOUT; WAIT: TIMEOUT and the keys still missing). Frees w. The table
 * calls this when a parked request is complete or expires. */
static void on_waiter_ready(void *ctx, ddplug__store_waiter *w) {
  ddplug_store_server *s = ctx;
  conn *c = ddplug__store_waiter_owner(w);
  uint32_t id = ddplug__store_waiter_id(w);
  c->nparked--;
  if (c->dead) {
    ddplug__store_waiter_free(s->table, w);
    return;
  }
  uint32_t missing = ddplug__store_waiter_missing(w);
  uint16_t klen;
  int present;
  const uint8_t *key = ddplug__store_waiter_key(w, 0, &klen, &present);
  if (ddplug__store_waiter_type(w) == DDPLUG__STORE_GET) {
    uint32_t vlen = 0;
    const uint8_t *v = ddplug__store_table_get(s->table, key, klen, &vlen);
    reply_begin(c, id, v ? DDPLUG__STORE_R_OK : DDPLUG__STORE_R_TIMEOUT);
    if (v) ddplug__sbuf_value(&c->out, v, vlen);
  } else if (missing == 0) {
    reply_begin(c, id, DDPLUG__STORE_R_OK);
  } else {
    reply_begin(c, id, DDPLUG__STORE_R_TIMEOUT);
    ddplug__sbuf_u16(&c->out, (uint16_t)missing);
    for (uint32_t i = 0; i < ddplug__store_waiter_nkeys(w); i++) {
      key = ddplug__store_waiter_key(w, i, &klen, &present);
      if (!present) ddplug__sbuf_key(&c->out, key, klen);
    }
  }
  ddplug__store_waiter_free(s->table, w);
  reply_end(s, c);
}

/* ---- requests ------------------------------------------------------------ */

static void handle_auth(ddplug_store_server *s, conn *c,
                        const ddplug__store_req *q) {
  uint8_t reason = 0;
  uint8_t mac[DDPLUG__SHA256_LEN] = {0};
  if (s->secret && !q->has_secret) {
    reason = DDPLUG__STORE_REFUSE_NO_SECRET;
  } else if (!s->secret && q->has_secret) {
    reason = DDPLUG__STORE_REFUSE_UNEXPECTED;
  } else if (s->secret) {
    if (ddplug__store_auth_mac(s->secret, s->secret_len, 0, c->nonce, q->nonce, mac) != 0 ||
        !ddplug__ct_equal(mac, q->mac, sizeof mac))
      reason = DDPLUG__STORE_REFUSE_BAD_MAC;
  }
  if (reason) {
    static const char *const why[] = {"", "it has no shared secret",
                                      "its shared secret is wrong",
                                      "it has a shared secret, this store none"};
    DDPLUG__INFO("rendezvous store %s: refused a client from %s: %s", s->where,
                 c->peer, why[reason]);
    reply_begin(c, q->id, DDPLUG__STORE_R_REFUSED);
    ddplug__sbuf_u8(&c->out, reason);
    reply_end(s, c);
    c->close_after_flush = 1;
    return;
  }
  /* Prove to the client that this server knows the secret too. */
  memset(mac, 0, sizeof mac);
  if (s->secret &&
      (ddplug__store_auth_mac(s->secret, s->secret_len, 1, c->nonce, q->nonce, mac) != 0 ||
       ddplug__store_session_init(&c->session, s->secret, s->secret_len, c->nonce,
                                  q->nonce, 1) != 0)) {
    conn_kill(s, c, "out of memory computing the session keys");
    return;
  }
  c->authed = 1;
  pending_remove(s, c);
  /* The reply is the handshake's last frame: sent without the trailer. */
  int on = c->session.on;
  c->session.on = 0;
  reply_begin(c, q->id, DDPLUG__STORE_R_OK);
  ddplug__sbuf_put(&c->out, mac, sizeof mac);
  reply_end(s, c);
  c->session.on = on;
}

/* GET/WAIT: answer at once when every key is present (the common case,
 * without allocating); otherwise park until the keys appear or the deadline
 * passes — with timeout 0 the deadline has passed already, and the waiter is
 * answered (TIMEOUT, naming the missing keys) right away. */
static void handle_wait(ddplug_store_server *s, conn *c,
                        const ddplug__store_req *q, const uint8_t *keys,
                        size_t keys_len, uint32_t nkeys) {
  uint32_t missing = 0;
  ddplug__rd r = {keys, keys_len, 0};
  for (uint32_t i = 0; i < nkeys; i++) {
    uint16_t klen = 0;
    uint32_t vlen;
    const uint8_t *k = ddplug__store_next_key(&r, &klen);
    if (!ddplug__store_table_get(s->table, k, klen, &vlen)) missing++;
  }
  if (missing == 0) {
    reply_begin(c, q->id, DDPLUG__STORE_R_OK);
    if (q->type == DDPLUG__STORE_GET) {
      uint32_t vlen = 0;
      const uint8_t *v = ddplug__store_table_get(s->table, q->key, q->klen, &vlen);
      ddplug__sbuf_value(&c->out, v, vlen);
    }
    reply_end(s, c);
    return;
  }
  if (c->nparked >= MAX_PARKED_PER_CONN) {
    conn_kill(s, c, "too many parked GET/WAIT requests");
    return;
  }
  uint64_t deadline = ddplug__deadline_ns((int64_t)q->timeout_ms);
  ddplug__store_waiter *w = ddplug__store_waiter_park(
      s->table, keys, keys_len, nkeys, deadline, c, q->id, q->type);
  if (!w) {
    DDPLUG__WARN("rendezvous store: out of memory parking a request of %s; "
                 "closing that connection", c->peer);
    conn_kill(s, c, NULL);
    return;
  }
  c->nparked++;
  if (q->timeout_ms == 0) on_waiter_ready(s, w);
}

static void handle_add(ddplug_store_server *s, conn *c,
                       const ddplug__store_req *q) {
  uint32_t vlen = 0;
  const uint8_t *v = ddplug__store_table_get(s->table, q->key, q->klen, &vlen);
  int64_t cur = 0, sum;
  uint8_t code = DDPLUG__STORE_R_OK;
  if (v && ddplug__store_parse_int(v, vlen, &cur) != 0)
    code = DDPLUG__STORE_R_NOT_INTEGER;
  else if (__builtin_add_overflow(cur, q->delta, &sum))
    code = DDPLUG__STORE_R_OVERFLOW;
  if (code != DDPLUG__STORE_R_OK) {
    reply_begin(c, q->id, code);
    ddplug__sbuf_value(&c->out, v, v ? vlen : 0);
    reply_end(s, c);
    return;
  }
  char text[24];
  int n = snprintf(text, sizeof text, "%lld", (long long)sum);
  if (ddplug__store_table_set(s->table, q->key, q->klen, (const uint8_t *)text,
                              (uint32_t)n) != 0) {
    conn_kill(s, c, "out of memory");
    return;
  }
  reply_begin(c, q->id, DDPLUG__STORE_R_OK);
  ddplug__sbuf_i64(&c->out, sum);
  reply_end(s, c);
}

static void handle_cas(ddplug_store_server *s, conn *c,
                       const ddplug__store_req *q) {
  uint32_t vlen = 0;
  const uint8_t *v = ddplug__store_table_get(s->table, q->key, q->klen, &vlen);
  int match = q->expect_present
                  ? (v && vlen == q->elen && memcmp(v, q->expected, vlen) == 0)
                  : !v;
  if (match && ddplug__store_table_set(s->table, q->key, q->klen, q->value,
                                       q->vlen) != 0) {
    conn_kill(s, c, "out of memory");
    return;
  }
  v = ddplug__store_table_get(s->table, q->key, q->klen, &vlen);
  reply_begin(c, q->id, DDPLUG__STORE_R_OK);
  ddplug__sbuf_u8(&c->out, (uint8_t)match);
  ddplug__sbuf_u8(&c->out, v != NULL);
  if (v) ddplug__sbuf_value(&c->out, v, vlen);
  reply_end(s, c);
}

static void handle_on_disconnect(ddplug_store_server *s, conn *c,
                                 const ddplug__store_req *q) {
  if (c->nregs >= MAX_REGS_PER_CONN ||
      c->reg_bytes + q->klen + q->vlen > MAX_REG_BYTES_PER_CONN) {
    conn_kill(s, c, "too many disconnect keys (over 1024 or 16 MiB)");
    return;
  }
  reg *r = ddplug__calloc(1, sizeof *r + q->klen);
  uint8_t *val = q->vlen ? ddplug__malloc(q->vlen) : NULL;
  if (!r || (q->vlen && !val)) {
    ddplug__free(r);
    ddplug__free(val);
    conn_kill(s, c, "out of memory");
    return;
  }
  memcpy(r->key, q->key, q->klen);
  r->klen = q->klen;
  if (val) memcpy(val, q->value, q->vlen);
  r->value = val;
  r->vlen = q->vlen;
  r->next = c->regs;
  c->regs = r;
  c->nregs++;
  c->reg_bytes += (size_t)q->klen + q->vlen;
  reply_simple(s, c, q->id, DDPLUG__STORE_R_OK);
}

/* One complete frame (starting at the version byte). */
static void handle_frame(ddplug_store_server *s, conn *c, const uint8_t *frame,
                         size_t len) {
  ddplug__store_req q;
  const char *why = NULL;
  if (ddplug__store_decode_request(frame, len, &q, &why) != 0) {
    conn_kill(s, c, why);
    return;
  }
  if (c->bye) {
    conn_kill(s, c, "request after BYE");
    return;
  }
  if (!c->authed && q.type != DDPLUG__STORE_AUTH) {
    conn_kill(s, c, "request before authentication");
    return;
  }
  switch (q.type) {
    case DDPLUG__STORE_AUTH:
      if (c->authed)
        conn_kill(s, c, "second AUTH");
      else
        handle_auth(s, c, &q);
      break;
    case DDPLUG__STORE_SET:
      if (ddplug__store_table_set(s->table, q.key, q.klen, q.value, q.vlen) != 0)
        conn_kill(s, c, "out of memory");
      else
        reply_simple(s, c, q.id, DDPLUG__STORE_R_OK);
      break;
    case DDPLUG__STORE_GET: {
      /* A GET is a WAIT for one key whose reply carries the value; pass the
       * key in its wire encoding (it directly follows the timeout). */
      handle_wait(s, c, &q, q.key - 2, (size_t)q.klen + 2, 1);
      break;
    }
    case DDPLUG__STORE_ADD:
      handle_add(s, c, &q);
      break;
    case DDPLUG__STORE_CAS:
      handle_cas(s, c, &q);
      break;
    case DDPLUG__STORE_DELETE: {
      int existed = ddplug__store_table_delete(s->table, q.key, q.klen);
      reply_begin(c, q.id, DDPLUG__STORE_R_OK);
      ddplug__sbuf_u8(&c->out, (uint8_t)existed);
      reply_end(s, c);
      break;
    }
    case DDPLUG__STORE_WAIT:
      handle_wait(s, c, &q, q.keys, q.keys_len, q.nkeys);
      break;
    case DDPLUG__STORE_ON_DISCONNECT:
      handle_on_disconnect(s, c, &q);
      break;
    case DDPLUG__STORE_BYE:
      c->bye = 1;
      free_regs(c);
      reply_simple(s, c, q.id, DDPLUG__STORE_R_OK);
      break;
    default:
      conn_kill(s, c, "unexpected frame type");
      break;
  }
}

/* Grow c->in to hold at least need bytes. */
static int in_reserve(conn *c, size_t need) {
  if (c->in_cap >= need) return 0;
  size_t cap = c->in_cap ? c->in_cap : c->authed ? IN_MIN_CAP : IN_PREAUTH_CAP;
  while (cap < need) cap *= 2;
  uint8_t *p = ddplug__realloc(c->in, cap);
  if (!p) return -1;
  c->in = p;
  c->in_cap = cap;
  return 0;
}

static size_t out_pending(const conn *c) { return c->out.len - c->out_off; }

/* Process the complete frames in c->in until its unsent output reaches the
 * high-water mark (the rest waits until it drains); keep a partial one. */
static void process_input(ddplug_store_server *s, conn *c) {
  size_t pos = 0;
  while (!c->dead && !c->close_after_flush && c->in_len - pos >= 4 &&
         out_pending(c) < OUT_HIGH_WATER) {
    uint32_t flen = ddplug__store_get_u32be(c->in + pos);
    if (flen < DDPLUG__STORE_LEN_MIN || flen > DDPLUG__STORE_LEN_MAX) {
      conn_kill(s, c, flen < DDPLUG__STORE_LEN_MIN ? "frame length too small"
                                                   : "frame length over the cap");
      return;
    }
    if (!c->authed && flen > DDPLUG__STORE_AUTH_LEN) {
      conn_kill(s, c, "a frame longer than AUTH before authenticating");
      return;
    }
    /* Refuse another protocol version before buffering a large frame. */
    if (c->in_len - pos >= 5 && c->in[pos + 4] != DDPLUG__STORE_PROTO_VERSION) {
      conn_kill(s, c, "wrong protocol version");
      return;
    }
    if (c->in_len - pos < 4 + (size_t)flen) {
      if (pos == 0 && in_reserve(c, 4 + (size_t)flen) != 0) {
        DDPLUG__WARN("rendezvous store: out of memory receiving from %s; "
                     "closing that connection", c->peer);
        conn_kill(s, c, NULL);
        return;
      }
      break;
    }
    size_t body = 0;
    const char *why = NULL;
    if (ddplug__store_frame_open(&c->session, c->in + pos, 4 + (size_t)flen, &body,
                                 &why) != 0) {
      DDPLUG__WARN("rendezvous store %s: a frame from %s failed its integrity "
                   "check (%s); closing that connection (is something on the "
                   "network altering traffic, or another program speaking to "
                   "the store?)", s->where, c->peer, why);
      conn_kill(s, c, NULL);
      return;
    }
    handle_frame(s, c, c->in + pos + 4, body);
    pos += 4 + (size_t)flen;
  }
  if (c->dead) return;
  if (pos > 0) {
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
  }
  if (c->in_len == 0 && c->in_cap > 64 * 1024) {
    ddplug__free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
}

static void conn_readable(ddplug_store_server *s, conn *c) {
  /* Before authentication the buffer never grows past IN_PREAUTH_CAP. */
  size_t want = c->authed ? c->in_len + IN_MIN_CAP / 2 : IN_PREAUTH_CAP;
  if (!c->authed && c->in_len == c->in_cap && c->in_cap) {
    conn_kill(s, c, "input buffer full before authenticating");
    return;
  }
  if (in_reserve(c, want) != 0 && c->in_len == c->in_cap) {
    conn_kill(s, c, "out of memory");
    return;
  }
  ssize_t n;
  do {
    n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
  } while (n < 0 && errno == EINTR);
  if (n == 0) {
    conn_kill(s, c, c->bye ? NULL : "peer closed without BYE");
    return;
  }
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      conn_kill(s, c, "receive failed (connection reset)");
    return;
  }
  c->in_len += (size_t)n;
  process_input(s, c);
  set_events(s, c);
}

/* ---- accepting ----------------------------------------------------------- */

static void addr_bytes(const struct sockaddr *sa, uint8_t out[16], uint8_t *len) {
  *len = 0;
  if (sa->sa_family == AF_INET) {
    memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    *len = 4;
  } else if (sa->sa_family == AF_INET6) {
    memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    *len = 16;
  }
}

/* Drop the oldest connection waiting to authenticate (of address a, if not
 * NULL): a cap was reached. Returns 1 if one was dropped. */
static int evict_oldest(ddplug_store_server *s, const conn *like, const char *cap) {
  conn *v = s->pend_head;
  while (v && like && (v->addr_len != like->addr_len ||
                       memcmp(v->addr, like->addr, like->addr_len) != 0))
    v = v->pend_next;
  if (!v) return 0;
  s->evicted++;
  uint64_t now = ddplug__now_ns();
  if (s->evict_warned_ns == 0 || now - s->evict_warned_ns >= EVICT_WARN_INTERVAL_NS) {
    DDPLUG__WARN("rendezvous store %s: %s; dropping the oldest connections "
                 "that have not authenticated (%s first; %llu dropped so far): "
                 "is something flooding this port?",
                 s->where, cap, v->peer, (unsigned long long)s->evicted);
    s->evict_warned_ns = now;
  }
  conn_kill(s, v, "dropped: too many connections waiting to authenticate");
  return 1;
}

static void accept_one(ddplug_store_server *s, int fd,
                       const struct sockaddr *sa) {
  conn *c = ddplug__calloc(1, sizeof *c);
  if (!c || ddplug__store_tune_socket(fd) != 0 ||
      ddplug__store_random(c->nonce, sizeof c->nonce) != 0) {
    DDPLUG__WARN("rendezvous store: could not set up an incoming connection "
                 "(out of memory or no randomness); dropped it");
    ddplug__free(c);
    close(fd);
    return;
  }
  c->fd = fd;
  ddplug__store_format_sockaddr(c->peer, sizeof c->peer, sa);
  addr_bytes(sa, c->addr, &c->addr_len);
  /* The caps: the newest connection always gets its chance. */
  size_t same = 0;
  for (conn *p = s->pend_head; p; p = p->pend_next)
    if (p->addr_len == c->addr_len && !memcmp(p->addr, c->addr, c->addr_len)) same++;
  if (same >= MAX_PENDING_PER_ADDR) {
    char cap[160];
    snprintf(cap, sizeof cap, "%u connections from %s wait to authenticate",
             MAX_PENDING_PER_ADDR, c->peer);
    evict_oldest(s, c, cap);
  }
  if (s->nhandshaking >= s->max_pending) {
    char cap[160];
    snprintf(cap, sizeof cap, "%zu connections wait to authenticate", s->max_pending);
    evict_oldest(s, NULL, cap);
  }
  c->handshake_deadline_ns =
      ddplug__deadline_ns(atomic_load(&s->handshake_timeout_ms));
  c->events = EPOLLIN;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
  if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
    ddplug__free(c);
    close(fd);
    return;
  }
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->nconns++;
  atomic_store(&s->nconns_shown, s->nconns);
  c->pending = 1;
  c->pend_prev = s->pend_tail;
  if (s->pend_tail) s->pend_tail->pend_next = c;
  else s->pend_head = c;
  s->pend_tail = c;
  s->nhandshaking++;
  ddplug__sbuf_frame_begin(&c->out, DDPLUG__STORE_CHALLENGE, 0);
  ddplug__sbuf_u8(&c->out, s->secret != NULL);
  ddplug__sbuf_put(&c->out, c->nonce, sizeof c->nonce);
  ddplug__sbuf_frame_end(&c->out);
  if (c->out.failed)
    conn_kill(s, c, "out of memory");
  else
    queue_flush(s, c);
}

static void listener_ready(ddplug_store_server *s) {
  for (int i = 0; i < 128; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      accept_one(s, fd, (struct sockaddr *)&ss);
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    /* Out of descriptors: free one held by a connection that has not
     * authenticated, and accept again once it is closed (after this batch:
     * connections are freed only at a safe point). */
    if ((errno == EMFILE || errno == ENFILE) &&
        evict_oldest(s, NULL, "out of file descriptors")) {
      s->accept_again = 1;
      return;
    }
    /* Out of descriptors or memory with nothing to drop: pause accepting
     * briefly rather than spinning on a listener that stays readable. */
    DDPLUG__WARN("rendezvous store %s: accept failed (%s); pausing new "
                 "connections for %d ms",
                 s->where, strerror(errno), ACCEPT_PAUSE_MS);
    struct epoll_event ev = {.events = 0, .data.ptr = &k_listen_tag};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, s->listen_fd, &ev);
    s->accept_paused_until_ns = ddplug__deadline_ns(ACCEPT_PAUSE_MS);
    return;
  }
}

/* ---- the loop ------------------------------------------------------------ */

/* Expire waiters and handshakes, resume accepting; returns the next moment
 * something is due (UINT64_MAX if nothing). */
static uint64_t run_timers(ddplug_store_server *s) {
  uint64_t now = ddplug__now_ns();
  uint64_t next = ddplug__store_table_expire(s->table, now);
  for (conn *c = s->pend_head, *n; c; c = n) {
    n = c->pend_next;
    if (c->handshake_deadline_ns <= now)
      conn_kill(s, c, "no authentication within the handshake timeout");
    else
      next = DDPLUG__MIN(next, c->handshake_deadline_ns);
  }
  if (s->accept_paused_until_ns) {
    if (s->accept_paused_until_ns <= now) {
      struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &k_listen_tag};
      epoll_ctl(s->ep, EPOLL_CTL_MOD, s->listen_fd, &ev);
      s->accept_paused_until_ns = 0;
    } else {
      next = DDPLUG__MIN(next, s->accept_paused_until_ns);
    }
  }
  return next;
}

static void *server_main(void *arg) {
  ddplug_store_server *s = arg;
  struct epoll_event events[64];
  while (!atomic_load(&s->stop)) {
    uint64_t next = run_timers(s);
    settle(s);
    int timeout = -1;
    if (next != UINT64_MAX) {
      int64_t ms = ddplug__remaining_ms(next);
      timeout = ms > INT32_MAX ? INT32_MAX : (int)ms;
    }
    int n = epoll_wait(s->ep, events, (int)DDPLUG__ARRAY_LEN(events), timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      DDPLUG__ERROR("rendezvous store %s: epoll_wait failed (%s); the store "
                    "stops serving", s->where, strerror(errno));
      break;
    }
    for (int i = 0; i < n; i++) {
      void *tag = events[i].data.ptr;
      uint32_t ev = events[i].events;
      if (tag == &k_wake_tag) continue; /* the loop condition decides */
      if (tag == &k_listen_tag) {
        listener_ready(s);
        continue;
      }
      conn *c = tag;
      if (c->dead) continue;
      if (ev & EPOLLOUT) conn_flush(s, c);
      if (c->dead) continue;
      if (ev & EPOLLIN) {
        conn_readable(s, c);
      } else if (ev & (EPOLLERR | EPOLLHUP)) {
        conn_kill(s, c, "connection reset");
      }
    }
    settle(s);
    while (s->accept_again && !atomic_load(&s->stop)) {
      s->accept_again = 0;
      listener_ready(s);
      settle(s);
    }
  }
  return NULL;
}

/* ---- public API ---------------------------------------------------------- */

/* A listening socket on one resolved address: the fd and its port, or -1
 * with *err set. */
static int listen_on(const struct addrinfo *ai, int *port, int *err) {
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 4096) != 0 ||
      getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
    *err = errno;
    close(fd);
    return -1;
  }
  *port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  return fd;
}

/* Bind and listen on the first address of addr:port that works: IPv4
 * addresses first (a hostname such as "localhost" often resolves to ::1
 * first, but launchers hand out IPv4 addresses), then IPv6. */
static int open_listener(ddplug_store_server *s, const char *addr, int port) {
  struct addrinfo *res = NULL;
  int g = ddplug__store_resolve(addr, port, 1, &res);
  if (g != 0)
    return ddplug__err(DDPLUG_E_CONFIG,
                       "rendezvous store cannot serve on %s: cannot resolve "
                       "'%s': %s (check rendezvous.addr / MASTER_ADDR)",
                       s->where, addr, gai_strerror(g));
  int err = 0;
  for (int want_v4 = 1; want_v4 >= 0 && s->listen_fd < 0; want_v4--) {
    for (struct addrinfo *ai = res; ai && s->listen_fd < 0; ai = ai->ai_next) {
      if ((ai->ai_family == AF_INET) == want_v4)
        s->listen_fd = listen_on(ai, &s->port, &err);
    }
  }
  freeaddrinfo(res);
  if (s->listen_fd >= 0) return DDPLUG_OK;
  return ddplug__err_errno(
      DDPLUG_E_SYSTEM, err,
      "rendezvous store cannot listen on %s%s", s->where,
      err == EADDRINUSE ? " (another process uses this port: is another run "
                          "still active? choose another rendezvous.port or "
                          "MASTER_PORT)"
                        : "");
}

static void server_free(ddplug_store_server *s) {
  while (s->conns) conn_free(s, s->conns, 0);
  ddplug__store_table_free(s->table);
  if (s->ep >= 0) close(s->ep);
  if (s->wake_fd >= 0) close(s->wake_fd);
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (s->secret) memset(s->secret, 0, s->secret_len);
  ddplug__free(s->secret);
  ddplug__free(s);
}

/* ddplug_store_serve — start a rendezvous store server.
 * addr: where to listen: NULL or "" (every IPv4 interface, like "0.0.0.0"),
 * an IPv4/IPv6 literal ("::" is every interface, IPv4 too where the system
 * allows dual-stack) or a hostname (its first IPv4 address, else its first
 * IPv6 address; resolving it may block as long as the system resolver
 * does). port: 0..65535 (0 picks a free port;
 * see ddplug_store_server_port). secret: NULL or "" for none; otherwise
 * clients must prove they know it (HMAC-SHA256 challenge-response), and
 * clients that offer a secret to a server without one are refused too.
 * Returns OK and *out (stop it with ddplug_store_server_stop); on failure
 * *out is untouched and nothing is left open: INVALID_ARGUMENT (bad port,
 * NULL out), CONFIG (address does not resolve), SYSTEM (bind/listen failed,
 * e.g. the port is in use, message names H:P), NO_MEMORY. Does not block:
 * the server runs in a background thread with every signal blocked.
 * Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_serve(const char *addr, int port,
                                  const char *secret,
                                  ddplug_store_server **out) {
  if (!out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_store_serve: out must not be NULL");
  if (port < 0 || port > 65535)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_store_serve: port %d is out of range (0..65535; "
                       "0 picks a free port)",
                       port);
  if (!addr || !*addr) addr = "0.0.0.0";
  ddplug_store_server *s = ddplug__calloc(1, sizeof *s);
  if (!s)
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "out of memory starting the rendezvous store");
  s->listen_fd = s->wake_fd = s->ep = -1;
  atomic_store(&s->handshake_timeout_ms, HANDSHAKE_TIMEOUT_MS);
  s->max_pending = MAX_PENDING;
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    s->max_pending = DDPLUG__MAX(DDPLUG__MIN((size_t)nofile.rlim_cur / 4, s->max_pending),
                                 (size_t)16);
  ddplug__store_format_where(s->where, sizeof s->where, addr, port);
  int rc = DDPLUG_OK;
  if (secret && *secret) {
    s->secret_len = strlen(secret);
    s->secret = (uint8_t *)ddplug__strdup(secret);
    if (!s->secret) rc = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  if (rc == DDPLUG_OK) {
    s->table = ddplug__store_table_new(on_waiter_ready, s);
    if (!s->table) rc = ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  }
  if (rc == DDPLUG_OK) rc = open_listener(s, addr, port);
  s->pid = getpid();
  if (rc == DDPLUG_OK) {
    ddplug__store_format_where(s->where, sizeof s->where, addr, s->port);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &k_listen_tag};
    struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &k_wake_tag};
    if (s->wake_fd < 0 || s->ep < 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->listen_fd, &lev) != 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->wake_fd, &wev) != 0)
      rc = ddplug__err_errno(DDPLUG_E_SYSTEM, errno,
                             "rendezvous store %s: cannot set up epoll",
                             s->where);
  }
  if (rc == DDPLUG_OK) {
    /* The thread inherits this mask: signals stay with the host's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0)
      rc = ddplug__err_errno(DDPLUG_E_SYSTEM, e,
                             "rendezvous store %s: cannot start its thread",
                             s->where);
  }
  if (rc != DDPLUG_OK) {
    server_free(s);
    return rc;
  }
  DDPLUG__INFO("rendezvous store serving on %s (%s)", s->where,
               s->secret ? "shared secret required" : "no shared secret");
  *out = s;
  return DDPLUG_OK;
}

void ddplug__store_server_set_handshake_timeout(ddplug_store_server *srv,
                                               int64_t ms) {
  if (srv && ms > 0) atomic_store(&srv->handshake_timeout_ms, ms);
}

/* The port srv listens on (the chosen one when started with port 0), or 0
 * if srv is NULL. Never blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_server_port(const ddplug_store_server *srv) {
  return srv ? srv->port : 0;
}

/* Stop serving: wake and join the server thread, close the listener and
 * every connection (clients then get PEER_LOST; no on_disconnect key is
 * applied), free all keys and srv. NULL is a no-op. Blocks only until the
 * thread has left its loop (it wakes at once). Must not race with another
 * call on srv. In a process forked from the one that started the server it
 * only releases that process's copies; the server keeps running in its own
 * process. Since 1.0. */
DDPLUG_API void ddplug_store_server_stop(ddplug_store_server *srv) {
  if (!srv) return;
  if (getpid() != srv->pid) {
    /* A forked child's copy: the thread does not exist here and the
     * parent's server must keep running. Release this process's copies. */
    srv->forked_copy = 1;
    server_free(srv);
    return;
  }
  atomic_store(&srv->stop, 1);
  uint64_t one = 1;
  ssize_t w;
  do {
    w = write(srv->wake_fd, &one, sizeof one);
  } while (w < 0 && errno == EINTR);
  pthread_join(srv->thread, NULL);
  DDPLUG__INFO("rendezvous store %s stopped (%zu connection(s) closed, %zu "
               "key(s) dropped)",
               srv->where, srv->nconns, ddplug__store_table_size(srv->table));
  server_free(srv);
}

size_t ddplug__store_server_connections(const ddplug_store_server *srv) {
  return atomic_load(&((ddplug_store_server *)srv)->nconns_shown);
}
