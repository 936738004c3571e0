/*
 * tcp.c — sockets between nodes: the ring's persistent connections.
 *
 * Only node leaders (local rank 0) talk TCP. Each leader listens on an
 * ephemeral port, publishes "addr:port" in the store under tcp/<node>,
 * connects to the next node's leader and accepts the previous one's; a
 * hello record (magic, run hash, node indices) proves that a connection
 * belongs to this run and comes from the expected node. Data flows forward
 * (node i → i+1) on the connection leader i opened; control records (abort,
 * goodbye) flow backward on the same socket, so a leader blocked sending
 * data still hears an abort. Sockets are non-blocking with TCP_NODELAY,
 * large buffers and keepalive.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

static int remaining_ms(uint64_t deadline) {
  uint64_t now = ddcpu_now_ns();
  if (now >= deadline) return 0;
  uint64_t ms = (deadline - now + 999999ull) / 1000000ull;
  return (int)DDCPU_MIN(ms, (uint64_t)1000);
}

int ddcpu_tcp_listen(int *fd, int *port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ddcpu_err_errno(DDPLUG_E_SYSTEM, errno, "socket() failed");
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 16) != 0 ||
      getsockname(s, (struct sockaddr *)&a, &len) != 0) {
    int e = errno;
    close(s);
    return ddcpu_err_errno(DDPLUG_E_SYSTEM, e, "cannot listen for ring connections");
  }
  *fd = s;
  *port = ntohs(a.sin_port);
  return DDPLUG_OK;
}

void ddcpu_tcp_local_addr(const char *opt, char *out, size_t cap) {
  if (opt && *opt) {
    snprintf(out, cap, "%s", opt);
    return;
  }
  snprintf(out, cap, "127.0.0.1");
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN];
    const struct sockaddr_in *sin = (const struct sockaddr_in *)i->ifa_addr;
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf)) {
      snprintf(out, cap, "%s", buf);
      break;
    }
  }
  freeifaddrs(ifs);
}

/* A control record of `type` from this rank, everything else zero. */
void ddcpu_ctl_init(const ddcpu_group *g, ddcpu_ctl_msg *m, uint32_t type) {
  memset(m, 0, sizeof *m);
  m->magic = DDCPU_TCP_MAGIC;
  m->type = type;
  m->origin = g->rank;
  m->origin_node = g->node;
  m->run_hash = g->run_hash;
}

void ddcpu_tcp_tune(int fd) {
  int one = 1, buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle = 10, intvl = 2, cnt = 5;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Exact send with a deadline, on blocking or non-blocking sockets. */
int ddcpu_tcp_send_all(int fd, const void *buf, size_t len, uint64_t deadline) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return ddcpu_err_errno(DDPLUG_E_PEER_LOST, errno, "send failed");
    if (ddcpu_now_ns() >= deadline) return ddcpu_err(DDPLUG_E_TIMEOUT, "send timed out");
    struct pollfd pf = {fd, POLLOUT, 0};
    poll(&pf, 1, remaining_ms(deadline));
  }
  return DDPLUG_OK;
}

/* ---- setting up the ring ----------------------------------------------------
 *
 * Leader i publishes "addr:port/key" under tcp/<i>: where it listens and a
 * random 32-byte key made for this run (the store is authenticated by the
 * run's secret, so only the run's ranks read it). Leader i-1 connects; the
 * listener sends a fresh 32-byte nonce at once; the connector answers with
 * its hello record and HMAC-SHA256(key, DDCPU_RING_LABEL || nonce || hello);
 * the listener checks both and answers one byte, DDCPU_RING_ACK. Before that a
 * connection costs the listener a fixed buffer, gets DDCPU_RING_HELLO_MS to
 * send its hello, and counts against DDCPU_RING_PENDING_MAX (the oldest is
 * dropped beyond it): a stranger — a port scanner, a silent connection, a
 * process of another run — is logged and dropped, and never fails startup.
 * Both directions are set up in one poll loop (every leader connects and
 * accepts at once: waiting for one before the other would deadlock the
 * ring), which also watches for the run's failure (ddcpu_startup_check). */

#define DDCPU_RING_KEY_LEN 32
#define DDCPU_RING_NONCE_LEN 32
#define DDCPU_RING_MAC_LEN 32
#define DDCPU_RING_LABEL "ddplug-cpu-ring-v1 hello"
#define DDCPU_RING_ACK 'A'
#define DDCPU_RING_HELLO_MS 2000
#define DDCPU_RING_PENDING_MAX 16
/* Strangers logged at warning level; beyond that at debug level. */
#define DDCPU_RING_LOUD_REFUSALS 8

typedef struct ring_pending {
  int fd;
  uint64_t deadline;
  size_t got;
  uint8_t nonce[DDCPU_RING_NONCE_LEN];
  unsigned char buf[sizeof(ddcpu_ctl_msg) + DDCPU_RING_MAC_LEN];
  char peer[64];
} ring_pending;

typedef struct ring_setup {
  ddcpu_group *g;
  int lfd;
  uint8_t my_key[DDCPU_RING_KEY_LEN];
  uint8_t next_key[DDCPU_RING_KEY_LEN];
  struct sockaddr_in next_addr;
  char next_where[96];
  /* outgoing: 0 idle (connect at retry_at), 1 connecting, 2 reading the
   * nonce, 3 waiting for the ack, 4 done */
  int out_state, out_fd;
  uint64_t retry_at;
  size_t out_got;
  uint8_t out_nonce[DDCPU_RING_NONCE_LEN];
  int last_err;
  int in_fd;
  ring_pending pend[DDCPU_RING_PENDING_MAX];
  int npend;
  int refused;
} ring_setup;

/* See internal.h. */
int ddcpu_tcp_mac(const uint8_t key[32], const char *label, const uint8_t nonce[32],
                  const ddcpu_ctl_msg *hello, uint8_t out[32]) {
  unsigned char msg[64 + DDCPU_RING_NONCE_LEN + sizeof(ddcpu_ctl_msg)];
  size_t n = strlen(label);
  if (n > 64) return -1;
  memcpy(msg, label, n);
  memcpy(msg + n, nonce, DDCPU_RING_NONCE_LEN);
  n += DDCPU_RING_NONCE_LEN;
  memcpy(msg + n, hello, sizeof *hello);
  n += sizeof *hello;
  size_t len = 0;
  return EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, DDCPU_RING_KEY_LEN, msg, n, out,
                   DDCPU_RING_MAC_LEN, &len) != NULL && len == DDCPU_RING_MAC_LEN
             ? 0
             : -1;
}

static int ring_mac(const uint8_t key[DDCPU_RING_KEY_LEN], const uint8_t *nonce,
                    const ddcpu_ctl_msg *hello, uint8_t out[DDCPU_RING_MAC_LEN]) {
  return ddcpu_tcp_mac(key, DDCPU_RING_LABEL, nonce, hello, out);
}

/* See internal.h. */
void ddcpu_hex_encode(const uint8_t *b, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[b[i] >> 4];
    out[2 * i + 1] = d[b[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hex_decode(const char *s, uint8_t *b, size_t n) {
  for (size_t i = 0; i < 2 * n; i++) {
    char c = s[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return -1;
    b[i / 2] = (uint8_t)(i % 2 ? (b[i / 2] << 4) | v : v);
  }
  return s[2 * n] == '\0' ? 0 : -1;
}

/* See internal.h. */
int ddcpu_tcp_parse_endpoint(const char *v, struct sockaddr_in *a, uint8_t key[32]) {
  char host[64];
  const char *colon = strrchr(v, ':'), *slash = strchr(v, '/');
  if (!colon || !slash || slash < colon || (size_t)(colon - v) >= sizeof host) return -1;
  memcpy(host, v, (size_t)(colon - v));
  host[colon - v] = '\0';
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  long port = strtol(colon + 1, NULL, 10);
  if (port <= 0 || port > 65535 || inet_pton(AF_INET, host, &a->sin_addr) != 1) return -1;
  a->sin_port = htons((uint16_t)port);
  return hex_decode(slash + 1, key, DDCPU_RING_KEY_LEN);
}

static void refuse(ring_setup *rs, ring_pending *p, const char *why) {
  ddcpu_group *g = rs->g;
  int loud = ++rs->refused <= DDCPU_RING_LOUD_REFUSALS;
  ddcpu_log(g, loud ? DDPLUG_LOG_WARN : DDPLUG_LOG_DEBUG,
            "cpu plugin: rank %d refused a ring connection from %s: %s (only "
            "node %d's leader, rank %d, may connect)%s", g->rank, p->peer, why,
            (g->node + g->num_nodes - 1) % g->num_nodes,
            g->leaders[(g->node + g->num_nodes - 1) % g->num_nodes],
            rs->refused == DDCPU_RING_LOUD_REFUSALS ? "; further refusals are logged at "
                                                "debug level" : "");
  close(p->fd);
  *p = rs->pend[--rs->npend];
}

static void accept_pending(ring_setup *rs) {
  for (;;) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int fd = accept4(rs->lfd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return; /* EAGAIN, or out of descriptors: poll says when again */
    if (rs->npend == DDCPU_RING_PENDING_MAX) { /* drop the oldest */
      int oldest = 0;
      for (int i = 1; i < rs->npend; i++)
        if (rs->pend[i].deadline < rs->pend[oldest].deadline) oldest = i;
      refuse(rs, &rs->pend[oldest], "too many connections waiting to say hello");
    }
    ring_pending *p = &rs->pend[rs->npend];
    memset(p, 0, sizeof *p);
    p->fd = fd;
    p->deadline = ddcpu_deadline(DDCPU_RING_HELLO_MS);
    char host[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
    snprintf(p->peer, sizeof p->peer, "%s:%d", host, ntohs(a.sin_port));
    rs->npend++;
    if (getrandom(p->nonce, sizeof p->nonce, 0) != (ssize_t)sizeof p->nonce ||
        send(fd, p->nonce, sizeof p->nonce, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)sizeof p->nonce)
      refuse(rs, p, "could not send it a challenge");
  }
}

/* Read what pending connection i sent; check a complete hello. */
static void read_pending(ring_setup *rs, int i) {
  ddcpu_group *g = rs->g;
  ring_pending *p = &rs->pend[i];
  ssize_t n = recv(p->fd, p->buf + p->got, sizeof p->buf - p->got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    refuse(rs, p, "it closed the connection before its hello");
    return;
  }
  p->got += (size_t)n;
  if (p->got < sizeof p->buf) return;
  ddcpu_ctl_msg h;
  memcpy(&h, p->buf, sizeof h);
  uint8_t mac[DDCPU_RING_MAC_LEN];
  int pn = (g->node + g->num_nodes - 1) % g->num_nodes;
  if (ring_mac(rs->my_key, p->nonce, &h, mac) != 0 ||
      CRYPTO_memcmp(mac, p->buf + sizeof h, sizeof mac) != 0) {
    refuse(rs, p, "its hello does not prove the run's ring key (another run, or "
                  "not a ddplug rank)");
    return;
  }
  if (h.magic != DDCPU_TCP_MAGIC || h.type != DDCPU_MSG_HELLO || h.run_hash != g->run_hash ||
      h.origin_node != pn || h.rank != g->rank) {
    refuse(rs, p, "its hello is for another place in the ring");
    return;
  }
  char ack = DDCPU_RING_ACK;
  if (send(p->fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
    refuse(rs, p, "it went away before the acknowledgement");
    return;
  }
  rs->in_fd = p->fd;
  *p = rs->pend[--rs->npend];
}

/* Advance the outgoing connection by what poll reported. */
static void step_out(ring_setup *rs, short revents) {
  ddcpu_group *g = rs->g;
  int nn = (g->node + 1) % g->num_nodes;
  if (rs->out_state == 1) {
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(rs->out_fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err == 0 && !(revents & (POLLERR | POLLHUP))) {
      rs->out_state = 2;
      rs->out_got = 0;
      return;
    }
    rs->last_err = err ? err : ECONNREFUSED;
  } else if (rs->out_state == 2 || rs->out_state == 3) {
    uint8_t *dst = rs->out_state == 2 ? rs->out_nonce + rs->out_got : NULL;
    char ack = 0;
    ssize_t n = rs->out_state == 2
                    ? recv(rs->out_fd, dst, sizeof rs->out_nonce - rs->out_got, MSG_DONTWAIT)
                    : recv(rs->out_fd, &ack, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n > 0 && rs->out_state == 3) {
      if (ack == DDCPU_RING_ACK) {
        rs->out_state = 4;
        return;
      }
      rs->last_err = EPROTO;
    } else if (n > 0) {
      rs->out_got += (size_t)n;
      if (rs->out_got < sizeof rs->out_nonce) return;
      struct {
        ddcpu_ctl_msg h;
        uint8_t mac[DDCPU_RING_MAC_LEN];
      } hello;
      ddcpu_ctl_init(g, &hello.h, DDCPU_MSG_HELLO);
      hello.h.rank = g->leaders[nn];
      if (ring_mac(rs->next_key, rs->out_nonce, &hello.h, hello.mac) == 0 &&
          ddcpu_tcp_send_all(rs->out_fd, &hello, sizeof hello,
                             ddcpu_deadline(DDCPU_RING_HELLO_MS)) == DDPLUG_OK) {
        rs->out_state = 3;
        return;
      }
      rs->last_err = EPIPE;
    } else {
      rs->last_err = n == 0 ? ECONNRESET : errno;
    }
  }
  /* Refused, reset or dropped before the acknowledgement: again shortly. */
  close(rs->out_fd);
  rs->out_fd = -1;
  rs->out_state = 0;
  rs->retry_at = ddcpu_now_ns() + 20ull * 1000 * 1000;
}

static void start_connect(ring_setup *rs) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    rs->last_err = errno;
    rs->retry_at = ddcpu_now_ns() + 20ull * 1000 * 1000;
    return;
  }
  rs->out_fd = fd;
  if (connect(fd, (struct sockaddr *)&rs->next_addr, sizeof rs->next_addr) == 0 ||
      errno == EINPROGRESS) {
    rs->out_state = 1;
    return;
  }
  rs->last_err = errno;
  close(fd);
  rs->out_fd = -1;
  rs->retry_at = ddcpu_now_ns() + 20ull * 1000 * 1000;
}

static void ring_setup_free(ring_setup *rs) {
  if (rs->lfd >= 0) close(rs->lfd);
  if (rs->out_fd >= 0) close(rs->out_fd);
  if (rs->in_fd >= 0) close(rs->in_fd);
  for (int i = 0; i < rs->npend; i++) close(rs->pend[i].fd);
  OPENSSL_cleanse(rs->my_key, sizeof rs->my_key);
  OPENSSL_cleanse(rs->next_key, sizeof rs->next_key);
}

/* See internal.h. Blocks at most until deadline (or the run's failure). On
 * failure every socket it opened is closed. */
int ddcpu_tcp_ring_setup(ddcpu_group *g, uint64_t deadline) {
  int L = g->num_nodes, nn = (g->node + 1) % L, pn = (g->node + L - 1) % L;
  ring_setup rs;
  memset(&rs, 0, sizeof rs);
  rs.g = g;
  rs.lfd = rs.out_fd = rs.in_fd = -1;
  int port = 0, st;
  if ((st = ddcpu_tcp_listen(&rs.lfd, &port)) != DDPLUG_OK) return st;
  int fl = fcntl(rs.lfd, F_GETFL);
  if (fl >= 0) fcntl(rs.lfd, F_SETFL, fl | O_NONBLOCK);
  char addr[64], value[192], key[32], hex[2 * DDCPU_RING_KEY_LEN + 1];
  if (getrandom(rs.my_key, sizeof rs.my_key, 0) != (ssize_t)sizeof rs.my_key) {
    st = ddcpu_err_errno(DDPLUG_E_SYSTEM, errno, "rank %d: no random bytes for the ring key",
                         g->rank);
    goto out;
  }
  ddcpu_tcp_local_addr(g->opt.addr, addr, sizeof addr);
  ddcpu_hex_encode(rs.my_key, sizeof rs.my_key, hex);
  snprintf(value, sizeof value, "%s:%d/%s", addr, port, hex);
  snprintf(key, sizeof key, "tcp/%d", g->node);
  st = g->svc->store_set(g->svc->host, key, value, strlen(value));
  if (st != DDPLUG_OK) {
    st = ddcpu_err(st, "rank %d: publishing the ring address %s:%d failed", g->rank, addr, port);
    goto out;
  }
  /* The next leader's endpoint is looked up inside the loop: this leader
   * accepts its own peer (and turns strangers away) from the moment it
   * published, whatever the next leader is doing. */
  char peer_key[32];
  snprintf(peer_key, sizeof peer_key, "tcp/%d", nn);
  int known = 0;
  uint64_t next_probe = 0;
  while (rs.out_state != 4 || rs.in_fd < 0) {
    if ((st = ddcpu_startup_check(g, key, "connecting the ring between nodes",
                                  &next_probe)) != DDPLUG_OK)
      goto out;
    uint64_t now = ddcpu_now_ns();
    if (now >= deadline) {
      if (!known)
        st = ddcpu_err(DDPLUG_E_TIMEOUT, "rank %d: node %d's leader (rank %d) never "
                       "published its ring address (store key %s)", g->rank, nn,
                       g->leaders[nn], peer_key);
      else if (rs.out_state != 4)
        st = ddcpu_err_errno(DDPLUG_E_TIMEOUT, rs.last_err ? rs.last_err : ETIMEDOUT,
                             "rank %d: connecting to node %d's leader (rank %d) at %s "
                             "did not succeed in time", g->rank, nn, g->leaders[nn],
                             rs.next_where);
      else
        st = ddcpu_err(DDPLUG_E_TIMEOUT, "rank %d: node %d's leader (rank %d) did not "
                       "connect in time%s", g->rank, pn, g->leaders[pn],
                       rs.refused ? " (strangers that tried were refused and logged)" : "");
      goto out;
    }
    for (int i = 0; i < rs.npend;)
      if (rs.pend[i].deadline <= now) refuse(&rs, &rs.pend[i], "it sent no hello in time");
      else i++;
    if (!known) {
      char peer[192];
      uint64_t plen = 0;
      st = g->svc->store_get(g->svc->host, peer_key, peer, sizeof peer - 1, &plen, 0);
      if (st == DDPLUG_OK) {
        peer[plen] = '\0';
        if (ddcpu_tcp_parse_endpoint(peer, &rs.next_addr, rs.next_key) != 0) {
          st = ddcpu_err(DDPLUG_E_INTERNAL, "rank %d: node %d's ring endpoint '%.80s' is "
                         "malformed (a different ddplug version on rank %d?)", g->rank, nn,
                         peer, g->leaders[nn]);
          goto out;
        }
        snprintf(rs.next_where, sizeof rs.next_where, "%.*s",
                 (int)(strchr(peer, '/') - peer), peer);
        known = 1;
      } else if (st != DDPLUG_E_TIMEOUT) {
        st = ddcpu_err(st, "rank %d: reading node %d's ring endpoint (store key %s) failed",
                       g->rank, nn, peer_key);
        goto out;
      }
    }
    if (known && rs.out_state == 0 && now >= rs.retry_at) start_connect(&rs);
    struct pollfd pfd[DDCPU_RING_PENDING_MAX + 2];
    int n = 0, out_i = -1;
    if (rs.in_fd < 0) pfd[n++] = (struct pollfd){rs.lfd, POLLIN, 0};
    if (rs.out_state >= 1 && rs.out_state <= 3) {
      out_i = n;
      pfd[n++] = (struct pollfd){rs.out_fd, rs.out_state == 1 ? POLLOUT : POLLIN, 0};
    }
    int first_pend = n;
    for (int i = 0; i < rs.npend; i++) pfd[n++] = (struct pollfd){rs.pend[i].fd, POLLIN, 0};
    int ms = (int)DDCPU_MIN((deadline - now + 999999ull) / 1000000ull, 20ull);
    int r = poll(pfd, (nfds_t)n, ms);
    if (r < 0 && errno != EINTR) {
      st = ddcpu_err_errno(DDPLUG_E_SYSTEM, errno, "rank %d: poll while connecting the ring",
                           g->rank);
      goto out;
    }
    if (r <= 0) continue;
    if (out_i >= 0 && pfd[out_i].revents) step_out(&rs, pfd[out_i].revents);
    /* pending connections from the last to the first: refuse() moves the
     * last into the freed place */
    for (int i = n - 1; i >= first_pend; i--)
      if (pfd[i].revents && i - first_pend < rs.npend && rs.in_fd < 0)
        read_pending(&rs, i - first_pend);
    if (rs.in_fd < 0 && pfd[0].fd == rs.lfd && pfd[0].revents) accept_pending(&rs);
  }
  ddcpu_tcp_tune(rs.out_fd);
  ddcpu_tcp_tune(rs.in_fd);
  g->next_fd = rs.out_fd;
  g->prev_fd = rs.in_fd;
  rs.out_fd = rs.in_fd = -1;
  st = DDPLUG_OK;
out:
  ring_setup_free(&rs);
  return st;
}

/* Drain whatever is readable so close() sends FIN rather than RST. */
static void drain(int fd) {
  char buf[4096];
  while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

void ddcpu_tcp_ring_close(ddcpu_group *g) {
  ddcpu_ctl_msg bye;
  ddcpu_ctl_init(g, &bye, DDCPU_MSG_BYE);
  if (g->prev_fd >= 0) {
    pthread_mutex_lock(&g->ctl_mu);
    (void)ddcpu_tcp_send_all(g->prev_fd, &bye, sizeof bye, ddcpu_deadline(100));
    pthread_mutex_unlock(&g->ctl_mu);
  }
  /* After a failure the data direction may be mid-stream: no goodbye there
   * (the neighbour learnt of the failure through the abort record). */
  if (g->next_fd >= 0 && !ddcpu_fail_status(g))
    (void)ddcpu_tcp_send_all(g->next_fd, &bye, sizeof bye, ddcpu_deadline(100));
  if (g->prev_fd >= 0) {
    drain(g->prev_fd);
    close(g->prev_fd);
    g->prev_fd = -1;
  }
  if (g->next_fd >= 0) {
    drain(g->next_fd);
    close(g->next_fd);
    g->next_fd = -1;
  }
}
