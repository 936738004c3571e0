/*
 * p2p_link.c — how point-to-point frames (wire.h, ddcpu_frame) travel:
 * through a byte ring of the node segment to a peer on this node, over a
 * TCP connection of the pair to a peer on another node. What the frames
 * mean is p2p.c's; this file writes them whole or not at all (rings) or
 * keeps the one being written (sockets), reads them and hands each header
 * and payload to p2p.c.
 *
 * Rings: one per ordered pair of local ranks (shm_layout.h). The sender
 * owns head, the receiver tail; a frame is written only when it fits
 * whole, then head moves (release) and the receiver's doorbell rings; the
 * receiver copies the payload out, moves tail and rings the sender's bell
 * (it may wait for room). The ring's pages are reserved (fallocate) before
 * the sender's first frame, so a full /dev/shm is NO_MEMORY there, not a
 * SIGBUS later.
 *
 * Sockets: every rank of a several-node group listens on a port of its own
 * and publishes "addr:port/key" under p2p/<rank> (a random key made for
 * the run: the store is authenticated by the run's secret). The sender
 * connects when it first sends to a peer on another node (out); the
 * receiver accepts (in). As on the ring between node leaders (tcp.c) the
 * listener sends a fresh nonce, the connector answers with a hello naming
 * both ranks and HMAC-SHA256 over it under the receiver's key, and the
 * listener acknowledges; strangers are logged and dropped. A connection
 * carries one sender's messages forward and the receiver's answers (CTS,
 * NAK) backward. Everything is non-blocking: whoever progresses
 * point-to-point (a waiting caller, the progress thread) also accepts,
 * completes handshakes and moves partial frames.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

#define P2P_LABEL "ddplug-cpu-p2p-v1 hello"
#define P2P_ACK 'A'
#define P2P_HELLO_MS 2000
#define P2P_RETRY_NS (20ull * 1000 * 1000)

static uint64_t pad64(uint64_t n) { return (n + 63) & ~63ull; }

/* ---- doorbells ------------------------------------------------------------- */

/* See internal.h. */
void ddcpu_p2p_bell_ring(ddcpu_ctr *bell) {
  atomic_fetch_add_explicit(&bell->val, 1, memory_order_seq_cst);
  ddcpu_ctr_wake(bell);
}

static ddcpu_ctr *peer_bell(ddcpu_group *g, const ddcpu_p2p_link *l) {
  return &g->shm.bell[l->j];
}

/* ---- rings ------------------------------------------------------------------ */

static void ring_write(unsigned char *data, uint64_t size, uint64_t pos, const void *src,
                       uint64_t n) {
  uint64_t at = pos & (size - 1), first = DDCPU_MIN(n, size - at);
  ddcpu_copy(data + at, src, (size_t)first, 0);
  if (n > first) ddcpu_copy(data, (const unsigned char *)src + first, (size_t)(n - first), 0);
}

static void ring_read(void *dst, const unsigned char *data, uint64_t size, uint64_t pos,
                      uint64_t n, int stream) {
  uint64_t at = pos & (size - 1), first = DDCPU_MIN(n, size - at);
  ddcpu_copy(dst, data + at, (size_t)first, stream);
  if (n > first) ddcpu_copy((unsigned char *)dst + first, data, (size_t)(n - first), stream);
  ddcpu_copy_fence(stream);
}

/* Reserve the out ring's pages once (the segment is sparse there). */
static int ring_reserve(ddcpu_group *g, ddcpu_p2p_link *l) {
  if (l->out_reserved) return DDPLUG_OK;
  uint64_t rb = g->p2p->ring_bytes;
  uint64_t off = (uint64_t)(l->out_data - (unsigned char *)g->shm.base);
  int e = posix_fallocate(g->shm.fd, (off_t)off, (off_t)rb);
  if (e == EINVAL || e == EOPNOTSUPP) e = 0; /* no reservation here: pages come on use */
  if (e != 0)
    return ddcpu_err_errno(DDPLUG_E_NO_MEMORY, e,
                           "rank %d: cannot reserve %llu bytes of /dev/shm for the "
                           "point-to-point ring to rank %d (is /dev/shm full?)",
                           g->rank, (unsigned long long)rb, l->peer);
  l->out_reserved = 1;
  return DDPLUG_OK;
}

static int ring_put(ddcpu_group *g, ddcpu_p2p_link *l, const ddcpu_frame *h, const void *pay,
                    uint64_t len) {
  uint64_t rb = g->p2p->ring_bytes;
  uint64_t need = pad64(sizeof *h + len);
  uint64_t head = atomic_load_explicit(&l->out_ctl->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&l->out_ctl->tail, memory_order_acquire);
  if (rb - (head - tail) < need) return DDCPU_AGAIN;
  int st = ring_reserve(g, l);
  if (st != DDPLUG_OK) return st;
  ring_write(l->out_data, rb, head, h, sizeof *h);
  if (len) ring_write(l->out_data, rb, head + sizeof *h, pay, len);
  atomic_store_explicit(&l->out_ctl->head, head + need, memory_order_release);
  ddcpu_p2p_bell_ring(peer_bell(g, l));
  return DDPLUG_OK;
}

/* Read every frame the peer's ring holds. Returns how many. */
static int ring_drain(ddcpu_group *g, ddcpu_p2p_link *l) {
  uint64_t rb = g->p2p->ring_bytes;
  uint64_t tail = atomic_load_explicit(&l->in_ctl->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&l->in_ctl->head, memory_order_acquire);
  int n = 0;
  while (tail != head) {
    ddcpu_frame h;
    ring_read(&h, l->in_data, rb, tail, sizeof h, 0);
    if (h.magic != DDCPU_FRAME_MAGIC || h.len > rb) {
      ddcpu_fail_set(g, DDPLUG_E_INTERNAL, l->peer, g->rank,
                     "rank %d: garbage in the point-to-point ring from rank %d "
                     "(not a ddplug cpu-plugin frame)", g->rank, l->peer);
      return n;
    }
    ddcpu_p2p_rx rx = {0};
    unsigned char *dst = ddcpu_p2p_rx_begin(g, l, &h, &rx);
    /* a large receive's payload goes to memory past the cache, as the
     * collectives' large outputs do (nt_store_bytes): the ring stays in the
     * cache for the chunks that follow */
    int stream = rx.op && g->opt.nt_bytes > 0 && rx.op->bytes >= g->opt.nt_bytes;
    if (dst && h.len) ring_read(dst, l->in_data, rb, tail + sizeof h, h.len, stream);
    ddcpu_p2p_rx_end(g, l, &h, &rx);
    tail += pad64(sizeof h + h.len);
    atomic_store_explicit(&l->in_ctl->tail, tail, memory_order_release);
    ddcpu_p2p_bell_ring(peer_bell(g, l));
    n++;
    if (tail == head) head = atomic_load_explicit(&l->in_ctl->head, memory_order_acquire);
  }
  return n;
}

/* ---- sockets ----------------------------------------------------------------- */

static void sock_init(ddcpu_p2p_sock *s) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
}

static void sock_close(ddcpu_p2p_sock *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  s->state = DDCPU_SOCK_CLOSED;
  s->tx_busy = 0;
}

/* The connection to (or from) the peer broke: a goodbye before it is a
 * clean exit, anything else the peer's loss. */
static void sock_broken(ddcpu_group *g, ddcpu_p2p_link *l, ddcpu_p2p_sock *s, int err) {
  int clean = s->bye || l->bye;
  sock_close(s);
  if (clean) {
    ddcpu_p2p_peer_gone(g, l, 1, 0);
    return;
  }
  if (ddcpu_fail_status(g)) return; /* expected once the group failed */
  ddcpu_p2p_peer_gone(g, l, 0, err);
}

/* Write as much of the pending frame as the socket takes; a frame written
 * whole is reported to p2p.c (it may complete a send). */
static void sock_flush(ddcpu_group *g, ddcpu_p2p_link *l, ddcpu_p2p_sock *s) {
  while (s->tx_busy && s->state == DDCPU_SOCK_READY) {
    struct iovec iov[2];
    int n = 0;
    uint64_t hl = sizeof(ddcpu_frame);
    if (s->tx_off < hl) iov[n++] = (struct iovec){s->tx_hdr + s->tx_off, (size_t)(hl - s->tx_off)};
    uint64_t poff = s->tx_off > hl ? s->tx_off - hl : 0;
    if (s->tx_len > hl && poff < s->tx_len - hl)
      iov[n++] = (struct iovec){(void *)(s->tx_pay + poff), (size_t)(s->tx_len - hl - poff)};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)n;
    ssize_t w = sendmsg(s->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      sock_broken(g, l, s, errno);
      return;
    }
    s->tx_off += (uint64_t)w;
    if (s->tx_off == s->tx_len) {
      ddcpu_frame h;
      memcpy(&h, s->tx_hdr, sizeof h);
      ddcpu_p2p_op *op = s->tx_op;
      s->tx_busy = 0;
      s->tx_op = NULL;
      ddcpu_p2p_tx_done(g, l, &h, op);
    }
  }
}

static int sock_put(ddcpu_group *g, ddcpu_p2p_link *l, ddcpu_p2p_sock *s, const ddcpu_frame *h,
                    const void *pay, uint64_t len, ddcpu_p2p_op *op) {
  if (s->state != DDCPU_SOCK_READY || s->tx_busy) return DDCPU_AGAIN;
  memcpy(s->tx_hdr, h, sizeof *h);
  s->tx_pay = pay;
  s->tx_len = sizeof *h + len;
  s->tx_off = 0;
  s->tx_op = op;
  s->tx_busy = 1;
  sock_flush(g, l, s);
  return DDPLUG_OK;
}

/* Read what the socket has: headers, then payloads into where p2p.c says. */
static int sock_read(ddcpu_group *g, ddcpu_p2p_link *l, ddcpu_p2p_sock *s) {
  static _Thread_local unsigned char discard[65536];
  int frames = 0;
  while (s->state == DDCPU_SOCK_READY) {
    ssize_t n;
    if (s->rx_hgot < sizeof(ddcpu_frame)) {
      n = recv(s->fd, s->rx_hdr + s->rx_hgot, sizeof(ddcpu_frame) - s->rx_hgot, MSG_DONTWAIT);
    } else {
      uint64_t left = s->rx_len - s->rx_got;
      unsigned char *dst = s->rx_dst ? s->rx_dst + s->rx_got : discard;
      size_t want = (size_t)(s->rx_dst ? left : DDCPU_MIN(left, (uint64_t)sizeof discard));
      n = recv(s->fd, dst, want, MSG_DONTWAIT);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return frames;
      sock_broken(g, l, s, errno);
      return frames;
    }
    if (n == 0) {
      sock_broken(g, l, s, 0);
      return frames;
    }
    if (s->rx_hgot < sizeof(ddcpu_frame)) {
      s->rx_hgot += (size_t)n;
      if (s->rx_hgot < sizeof(ddcpu_frame)) continue;
      ddcpu_frame h;
      memcpy(&h, s->rx_hdr, sizeof h);
      if (h.magic != DDCPU_FRAME_MAGIC || h.from != l->peer) {
        ddcpu_fail_set(g, DDPLUG_E_INTERNAL, l->peer, g->rank,
                       "rank %d: garbage on the point-to-point connection with rank %d "
                       "(not a ddplug cpu-plugin frame)", g->rank, l->peer);
        sock_close(s);
        return frames;
      }
      if (h.type == DDCPU_FR_BYE) {
        s->bye = 1;
        l->bye = 1;
        s->rx_hgot = 0;
        continue;
      }
      memset(&s->rx, 0, sizeof s->rx);
      s->rx_dst = ddcpu_p2p_rx_begin(g, l, &h, &s->rx);
      s->rx_len = h.len;
      s->rx_got = 0;
    } else {
      s->rx_got += (uint64_t)n;
    }
    if (s->rx_got == s->rx_len) {
      ddcpu_frame h;
      memcpy(&h, s->rx_hdr, sizeof h);
      s->rx_hgot = 0;
      ddcpu_p2p_rx_end(g, l, &h, &s->rx);
      frames++;
    }
  }
  return frames;
}

/* ---- connecting (the sender's side) -------------------------------------------- */

static void connect_later(ddcpu_p2p_sock *s, int err) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  s->last_err = err;
  s->state = DDCPU_SOCK_CONNECT_LATER;
  s->retry_at = ddcpu_now_ns() + P2P_RETRY_NS;
}

/* See internal.h. */
int ddcpu_p2p_connect(ddcpu_group *g, ddcpu_p2p_link *l) {
  ddcpu_p2p_sock *s = &l->out;
  if (s->state != DDCPU_SOCK_NONE) return DDPLUG_OK;
  char key[32], value[192];
  uint64_t len = 0;
  snprintf(key, sizeof key, "p2p/%d", l->peer);
  /* Published in the peer's group_create, which the runtime's ddplug_open
   * waits for on every rank: there at once. */
  int st = g->svc->store_get(g->svc->host, key, value, sizeof value - 1, &len, g->timeout_ms);
  if (st != DDPLUG_OK)
    return ddcpu_err(st, "rank %d: rank %d (node %d) never published where it takes "
                     "point-to-point connections (store key %s)", g->rank, l->peer,
                     g->node_of[l->peer], key);
  value[len] = '\0';
  if (ddcpu_tcp_parse_endpoint(value, &l->addr, l->key) != 0)
    return ddcpu_err(DDPLUG_E_INTERNAL, "rank %d: rank %d published '%s' for point-to-point "
                     "connections, not 'a.b.c.d:port/key'", g->rank, l->peer, value);
  s->state = DDCPU_SOCK_CONNECT_LATER;
  s->retry_at = 0;
  s->deadline = ddcpu_deadline(g->timeout_ms);
  return DDPLUG_OK;
}

static void connect_step(ddcpu_group *g, ddcpu_p2p_link *l) {
  ddcpu_p2p_sock *s = &l->out;
  uint64_t now = ddcpu_now_ns();
  if (s->state == DDCPU_SOCK_CONNECT_LATER) {
    if (now >= s->deadline) {
      char where[INET_ADDRSTRLEN] = "?";
      inet_ntop(AF_INET, &l->addr.sin_addr, where, sizeof where);
      s->state = DDCPU_SOCK_CLOSED;
      ddcpu_err(DDPLUG_E_PEER_LOST, "rank %d could not connect to rank %d (node %d) at %s:%d "
                "for point-to-point within %lld ms: %s", g->rank, l->peer,
                g->node_of[l->peer], where, ntohs(l->addr.sin_port), (long long)g->timeout_ms,
                s->last_err ? strerror(s->last_err) : "no answer");
      ddcpu_p2p_link_failed(g, l, DDPLUG_E_PEER_LOST);
      return;
    }
    if (now < s->retry_at) return;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      connect_later(s, errno);
      return;
    }
    s->fd = fd;
    if (connect(fd, (struct sockaddr *)&l->addr, sizeof l->addr) != 0 && errno != EINPROGRESS) {
      connect_later(s, errno);
      return;
    }
    s->state = DDCPU_SOCK_CONNECTING;
    s->hs_got = 0;
  }
  if (s->state == DDCPU_SOCK_CONNECTING) {
    struct pollfd p = {s->fd, POLLOUT, 0};
    if (poll(&p, 1, 0) <= 0) return;
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err || (p.revents & (POLLERR | POLLHUP))) {
      connect_later(s, err ? err : ECONNREFUSED);
      return;
    }
    s->state = DDCPU_SOCK_NONCE;
  }
  if (s->state == DDCPU_SOCK_NONCE) {
    ssize_t n = recv(s->fd, s->nonce + s->hs_got, sizeof s->nonce - s->hs_got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      connect_later(s, n == 0 ? ECONNRESET : errno);
      return;
    }
    s->hs_got += (size_t)n;
    if (s->hs_got < sizeof s->nonce) return;
    struct {
      ddcpu_ctl_msg h;
      uint8_t mac[32];
    } hello;
    ddcpu_ctl_init(g, &hello.h, DDCPU_MSG_HELLO);
    hello.h.rank = l->peer;
    if (ddcpu_tcp_mac(l->key, P2P_LABEL, s->nonce, &hello.h, hello.mac) != 0 ||
        ddcpu_tcp_send_all(s->fd, &hello, sizeof hello, ddcpu_deadline(P2P_HELLO_MS)) !=
            DDPLUG_OK) {
      connect_later(s, EPIPE);
      return;
    }
    s->state = DDCPU_SOCK_ACK;
  }
  if (s->state == DDCPU_SOCK_ACK) {
    char ack = 0;
    ssize_t n = recv(s->fd, &ack, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n != 1 || ack != P2P_ACK) {
      connect_later(s, n == 0 ? ECONNRESET : n < 0 ? errno : EPROTO);
      return;
    }
    ddcpu_tcp_tune(s->fd);
    s->state = DDCPU_SOCK_READY;
  }
}

/* ---- accepting (the receiver's side) --------------------------------------------- */

static void refuse(ddcpu_group *g, int i, const char *why) {
  ddcpu_p2p *p = g->p2p;
  int loud = ++p->refused <= 8;
  ddcpu_log(g, loud ? DDPLUG_LOG_WARN : DDPLUG_LOG_DEBUG,
            "cpu plugin: rank %d refused a point-to-point connection: %s (only ranks of "
            "this run on other nodes may connect)", g->rank, why);
  close(p->pend[i].fd);
  p->pend[i] = p->pend[--p->npend];
}

static void accept_step(ddcpu_group *g) {
  ddcpu_p2p *p = g->p2p;
  for (;;) {
    int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    if (p->npend == DDCPU_P2P_PENDING_MAX) {
      int oldest = 0;
      for (int i = 1; i < p->npend; i++)
        if (p->pend[i].deadline < p->pend[oldest].deadline) oldest = i;
      refuse(g, oldest, "too many connections waiting to say hello");
    }
    ddcpu_p2p_pending *q = &p->pend[p->npend++];
    memset(q, 0, sizeof *q);
    q->fd = fd;
    q->deadline = ddcpu_deadline(P2P_HELLO_MS);
    if (getrandom(q->nonce, sizeof q->nonce, 0) != (ssize_t)sizeof q->nonce ||
        send(fd, q->nonce, sizeof q->nonce, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)sizeof q->nonce)
      refuse(g, p->npend - 1, "could not send it a challenge");
  }
  uint64_t now = ddcpu_now_ns();
  for (int i = 0; i < p->npend;) {
    ddcpu_p2p_pending *q = &p->pend[i];
    ssize_t n = recv(q->fd, q->buf + q->got, sizeof q->buf - q->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (now > q->deadline) refuse(g, i, "it sent no hello in time");
      else i++;
      continue;
    }
    if (n <= 0) {
      refuse(g, i, "it closed the connection before its hello");
      continue;
    }
    q->got += (size_t)n;
    if (q->got < sizeof q->buf) continue;
    ddcpu_ctl_msg h;
    memcpy(&h, q->buf, sizeof h);
    uint8_t mac[32];
    if (ddcpu_tcp_mac(p->key, P2P_LABEL, q->nonce, &h, mac) != 0 ||
        CRYPTO_memcmp(mac, q->buf + sizeof h, sizeof mac) != 0) {
      refuse(g, i, "its hello does not prove this rank's key (another run, or not a ddplug rank)");
      continue;
    }
    int src = h.origin;
    if (h.magic != DDCPU_TCP_MAGIC || h.type != DDCPU_MSG_HELLO || h.run_hash != g->run_hash ||
        h.rank != g->rank || src < 0 || src >= g->world || g->node_of[src] == g->node ||
        g->p2p->links[src].in.state != DDCPU_SOCK_NONE) {
      refuse(g, i, "its hello names another rank, or a connection that already exists");
      continue;
    }
    char ack = P2P_ACK;
    if (send(q->fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
      refuse(g, i, "it went away before the acknowledgement");
      continue;
    }
    ddcpu_p2p_sock *s = &p->links[src].in;
    s->fd = q->fd;
    ddcpu_tcp_tune(s->fd);
    s->state = DDCPU_SOCK_READY;
    p->pend[i] = p->pend[--p->npend];
  }
}

/* ---- what p2p.c calls ---------------------------------------------------------------- */

/* See internal.h. */
int ddcpu_p2p_link_setup(ddcpu_group *g) {
  ddcpu_p2p *p = g->p2p;
  p->lfd = -1;
  for (int r = 0; r < g->world; r++) {
    ddcpu_p2p_link *l = &p->links[r];
    l->peer = r;
    sock_init(&l->out);
    sock_init(&l->in);
    l->local = g->node_of[r] == g->node;
    if (r == g->rank || !l->local || !g->has_shm) continue;
    int i = g->local_rank, j = g->local_of[r], L = g->local_world;
    l->j = j;
    l->out_ctl = &g->shm.p2p_ctl[i * L + j];
    l->in_ctl = &g->shm.p2p_ctl[j * L + i];
    l->out_data = g->shm.p2p + (uint64_t)(i * L + j) * p->ring_bytes;
    l->in_data = g->shm.p2p + (uint64_t)(j * L + i) * p->ring_bytes;
  }
  if (g->num_nodes < 2) return DDPLUG_OK;
  int port = 0, st = ddcpu_tcp_listen(&p->lfd, &port);
  if (st != DDPLUG_OK) return ddcpu_err_prefix(st, "rank %d: point-to-point listener", g->rank);
  int fl = fcntl(p->lfd, F_GETFL);
  if (fl >= 0) fcntl(p->lfd, F_SETFL, fl | O_NONBLOCK);
  if (getrandom(p->key, sizeof p->key, 0) != (ssize_t)sizeof p->key)
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, errno, "rank %d: no random bytes for the "
                           "point-to-point key", g->rank);
  char addr[64], value[192], key[32], hex[65];
  ddcpu_tcp_local_addr(g->opt.addr, addr, sizeof addr);
  ddcpu_hex_encode(p->key, sizeof p->key, hex);
  snprintf(value, sizeof value, "%s:%d/%s", addr, port, hex);
  snprintf(key, sizeof key, "p2p/%d", g->rank);
  st = g->svc->store_set(g->svc->host, key, value, strlen(value));
  if (st != DDPLUG_OK)
    return ddcpu_err(st, "rank %d: publishing the point-to-point address %s:%d failed",
                     g->rank, addr, port);
  return DDPLUG_OK;
}

/* See internal.h. */
void ddcpu_p2p_link_close(ddcpu_group *g) {
  ddcpu_p2p *p = g->p2p;
  if (!p || !p->links) return;
  ddcpu_frame bye;
  memset(&bye, 0, sizeof bye);
  bye.magic = DDCPU_FRAME_MAGIC;
  bye.type = DDCPU_FR_BYE;
  bye.from = g->rank;
  for (int r = 0; r < g->world; r++) {
    ddcpu_p2p_link *l = &p->links[r];
    ddcpu_p2p_sock *socks[2] = {&l->out, &l->in};
    for (int k = 0; k < 2; k++) {
      ddcpu_p2p_sock *s = socks[k];
      if (s->fd < 0) continue;
      /* a frame half written cannot be followed by a goodbye: the peer
       * then sees the connection close, as after a crash, but by then the
       * runtime has ended the run or this rank left with work pending */
      if (s->state == DDCPU_SOCK_READY && !s->tx_busy)
        (void)ddcpu_tcp_send_all(s->fd, &bye, sizeof bye, ddcpu_deadline(200));
      close(s->fd);
      s->fd = -1;
    }
  }
  for (int i = 0; i < p->npend; i++) close(p->pend[i].fd);
  p->npend = 0;
  if (p->lfd >= 0) close(p->lfd);
  p->lfd = -1;
  OPENSSL_cleanse(p->key, sizeof p->key);
}

/* See internal.h. */
int ddcpu_p2p_put(ddcpu_group *g, ddcpu_p2p_link *l, int answer, const ddcpu_frame *h,
                  const void *pay, uint64_t len, ddcpu_p2p_op *op) {
  if (l->local) {
    int st = ring_put(g, l, h, pay, len);
    if (st == DDPLUG_OK) ddcpu_p2p_tx_done(g, l, h, op);
    return st;
  }
  return sock_put(g, l, answer ? &l->in : &l->out, h, pay, len, op);
}

/* See internal.h. */
int ddcpu_p2p_link_io(ddcpu_group *g) {
  ddcpu_p2p *p = g->p2p;
  int n = 0;
  if (p->lfd >= 0) accept_step(g);
  for (int r = 0; r < g->world; r++) {
    if (r == g->rank) continue;
    ddcpu_p2p_link *l = &p->links[r];
    if (l->local) {
      if (l->in_ctl) n += ring_drain(g, l);
      continue;
    }
    if (l->out.state != DDCPU_SOCK_NONE && l->out.state < DDCPU_SOCK_READY) connect_step(g, l);
    if (l->out.state == DDCPU_SOCK_READY) {
      sock_flush(g, l, &l->out);
      n += sock_read(g, l, &l->out);
    }
    if (l->in.state == DDCPU_SOCK_READY) {
      sock_flush(g, l, &l->in);
      n += sock_read(g, l, &l->in);
    }
  }
  return n;
}

/* See internal.h. */
int ddcpu_p2p_fds(ddcpu_group *g, struct pollfd *pfd, int cap) {
  ddcpu_p2p *p = g->p2p;
  int n = 0;
  if (!p || p->lfd < 0) return 0;
  if (n < cap) pfd[n++] = (struct pollfd){p->lfd, POLLIN, 0};
  for (int i = 0; i < p->npend && n < cap; i++) pfd[n++] = (struct pollfd){p->pend[i].fd, POLLIN, 0};
  for (int r = 0; r < g->world && n < cap; r++) {
    ddcpu_p2p_link *l = &p->links[r];
    if (l->local) continue;
    ddcpu_p2p_sock *socks[2] = {&l->out, &l->in};
    for (int k = 0; k < 2 && n < cap; k++) {
      ddcpu_p2p_sock *s = socks[k];
      if (s->fd < 0) continue;
      short ev = s->state == DDCPU_SOCK_CONNECTING ? POLLOUT : POLLIN;
      if (s->tx_busy) ev |= POLLOUT;
      pfd[n++] = (struct pollfd){s->fd, ev, 0};
    }
  }
  return n;
}
