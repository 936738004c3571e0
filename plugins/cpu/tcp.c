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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cpu.h"

static int remaining_ms(uint64_t deadline) {
  uint64_t now = cp_now_ns();
  if (now >= deadline) return 0;
  uint64_t ms = (deadline - now + 999999ull) / 1000000ull;
  return (int)CP_MIN(ms, (uint64_t)1000);
}

int cp_tcp_listen(int *fd, int *port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return cp_err_errno(DDPLUG_E_SYSTEM, errno, "socket() failed");
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
    return cp_err_errno(DDPLUG_E_SYSTEM, e, "cannot listen for ring connections");
  }
  *fd = s;
  *port = ntohs(a.sin_port);
  return DDPLUG_OK;
}

void cp_tcp_local_addr(const char *opt, char *out, size_t cap) {
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
void cp_ctl_init(const cp_group *g, cp_ctl_msg *m, uint32_t type) {
  memset(m, 0, sizeof *m);
  m->magic = CP_TCP_MAGIC;
  m->type = type;
  m->origin = g->rank;
  m->origin_node = g->node;
  m->run_hash = g->run_hash;
}

void cp_tcp_tune(int fd) {
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

/* Connect to "a.b.c.d:port", retrying until the deadline. */
int cp_tcp_connect(const char *hostport, uint64_t deadline, int *fd) {
  char host[64];
  const char *colon = strrchr(hostport, ':');
  if (!colon || (size_t)(colon - hostport) >= sizeof host)
    return cp_err(DDPLUG_E_INTERNAL, "bad ring address '%s'", hostport);
  memcpy(host, hostport, (size_t)(colon - hostport));
  host[colon - hostport] = '\0';
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)atoi(colon + 1));
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return cp_err(DDPLUG_E_INTERNAL, "bad ring address '%s'", hostport);
  int last = 0;
  for (;;) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return cp_err_errno(DDPLUG_E_SYSTEM, errno, "socket() failed");
    int r = connect(s, (struct sockaddr *)&a, sizeof a);
    if (r != 0 && errno == EINPROGRESS) {
      struct pollfd p = {s, POLLOUT, 0};
      int pr = poll(&p, 1, remaining_ms(deadline));
      int err = 0;
      socklen_t el = sizeof err;
      if (pr == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
        r = 0;
      else
        errno = pr == 1 ? err : ETIMEDOUT;
    }
    if (r == 0) {
      int fl = fcntl(s, F_GETFL);
      fcntl(s, F_SETFL, fl & ~O_NONBLOCK);
      *fd = s;
      return DDPLUG_OK;
    }
    last = errno;
    close(s);
    if (cp_now_ns() >= deadline) break;
    usleep(20000);
  }
  return cp_err_errno(DDPLUG_E_TIMEOUT, last, "cannot connect to %s", hostport);
}

int cp_tcp_accept(int lfd, uint64_t deadline, int *fd) {
  for (;;) {
    struct pollfd p = {lfd, POLLIN, 0};
    int ms = remaining_ms(deadline);
    if (ms == 0 && cp_now_ns() >= deadline)
      return cp_err(DDPLUG_E_TIMEOUT, "no ring connection arrived in time");
    int r = poll(&p, 1, ms);
    if (r < 0 && errno != EINTR)
      return cp_err_errno(DDPLUG_E_SYSTEM, errno, "poll on listener failed");
    if (r <= 0) continue;
    int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (s >= 0) {
      *fd = s;
      return DDPLUG_OK;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
      return cp_err_errno(DDPLUG_E_SYSTEM, errno, "accept failed");
  }
}

/* Exact send with a deadline, on blocking or non-blocking sockets. */
int cp_tcp_send_all(int fd, const void *buf, size_t len, uint64_t deadline) {
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
      return cp_err_errno(DDPLUG_E_PEER_LOST, errno, "send failed");
    if (cp_now_ns() >= deadline) return cp_err(DDPLUG_E_TIMEOUT, "send timed out");
    struct pollfd pf = {fd, POLLOUT, 0};
    poll(&pf, 1, remaining_ms(deadline));
  }
  return DDPLUG_OK;
}

int cp_tcp_recv_all(int fd, void *buf, size_t len, uint64_t deadline) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0) return cp_err(DDPLUG_E_PEER_LOST, "connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return cp_err_errno(DDPLUG_E_PEER_LOST, errno, "recv failed");
    if (cp_now_ns() >= deadline) return cp_err(DDPLUG_E_TIMEOUT, "receive timed out");
    struct pollfd pf = {fd, POLLIN, 0};
    poll(&pf, 1, remaining_ms(deadline));
  }
  return DDPLUG_OK;
}

/* See cpu.h. Blocks at most until deadline. On failure every socket it
 * opened is closed. */
int cp_tcp_ring_setup(cp_group *g, uint64_t deadline) {
  int lfd = -1, port = 0, st;
  int L = g->num_nodes, nn = (g->node + 1) % L, pn = (g->node + L - 1) % L;
  if ((st = cp_tcp_listen(&lfd, &port)) != DDPLUG_OK) return st;
  char addr[64], value[96], key[32];
  cp_tcp_local_addr(g->opt.addr, addr, sizeof addr);
  snprintf(value, sizeof value, "%s:%d", addr, port);
  snprintf(key, sizeof key, "tcp/%d", g->node);
  st = g->svc->store_set(g->svc->host, key, value, strlen(value));
  if (st != DDPLUG_OK) {
    close(lfd);
    return cp_err(st, "rank %d: publishing the ring address %s failed", g->rank, value);
  }
  char peer[96];
  uint64_t plen = 0;
  snprintf(key, sizeof key, "tcp/%d", nn);
  int64_t wait_ms = (int64_t)((deadline - CP_MIN(deadline, cp_now_ns())) / 1000000ull);
  st = g->svc->store_get(g->svc->host, key, peer, sizeof peer - 1, &plen, wait_ms);
  if (st != DDPLUG_OK) {
    close(lfd);
    return cp_err(st, "rank %d: node %d's leader (rank %d) never published its "
                  "ring address (key %s)", g->rank, nn, g->leaders[nn], key);
  }
  peer[plen] = '\0';

  cp_ctl_msg hello;
  cp_ctl_init(g, &hello, CP_MSG_HELLO);
  hello.rank = g->leaders[nn];
  int out = -1, in = -1;
  if ((st = cp_tcp_connect(peer, deadline, &out)) != DDPLUG_OK ||
      (st = cp_tcp_send_all(out, &hello, sizeof hello, deadline)) != DDPLUG_OK) {
    st = cp_err_prefix(st, "rank %d: connecting to node %d's leader (rank %d) at %s",
                       g->rank, nn, g->leaders[nn], peer);
    goto fail;
  }
  /* The previous leader says through the store that it connected; waiting
   * for that in the store (not in accept alone) ends at once when another
   * rank fails before connecting. */
  snprintf(key, sizeof key, "tcp/%d/connected", g->node);
  if ((st = g->svc->store_set(g->svc->host, key, "1", 1)) != DDPLUG_OK) {
    st = cp_err(st, "rank %d: announcing its ring connection failed", g->rank);
    goto fail;
  }
  snprintf(key, sizeof key, "tcp/%d/connected", pn);
  const char *pkey = key;
  wait_ms = (int64_t)((deadline - CP_MIN(deadline, cp_now_ns())) / 1000000ull);
  if ((st = g->svc->store_wait(g->svc->host, &pkey, 1, wait_ms)) != DDPLUG_OK) {
    st = cp_err(st, "rank %d: node %d's leader (rank %d) never connected to the ring", g->rank,
                pn, g->leaders[pn]);
    goto fail;
  }
  while (in < 0) {
    int s = -1;
    if ((st = cp_tcp_accept(lfd, deadline, &s)) != DDPLUG_OK) {
      st = cp_err_prefix(st, "rank %d: waiting for node %d's leader (rank %d) to "
                         "connect", g->rank, pn, g->leaders[pn]);
      goto fail;
    }
    cp_ctl_msg h;
    if (cp_tcp_recv_all(s, &h, sizeof h, deadline) == DDPLUG_OK &&
        h.magic == CP_TCP_MAGIC && h.type == CP_MSG_HELLO &&
        h.run_hash == g->run_hash && h.origin_node == pn && h.rank == g->rank) {
      in = s;
    } else {
      cp_log(g, DDPLUG_LOG_WARN,
             "cpu plugin: rank %d refused a ring connection that is not "
             "from node %d of this run", g->rank, pn);
      close(s);
    }
  }
  close(lfd);
  cp_tcp_tune(out);
  cp_tcp_tune(in);
  g->next_fd = out;
  g->prev_fd = in;
  return DDPLUG_OK;
fail:
  if (out >= 0) close(out);
  close(lfd);
  return st;
}

/* Drain whatever is readable so close() sends FIN rather than RST. */
static void drain(int fd) {
  char buf[4096];
  while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

void cp_tcp_ring_close(cp_group *g) {
  cp_ctl_msg bye;
  cp_ctl_init(g, &bye, CP_MSG_BYE);
  if (g->prev_fd >= 0) {
    pthread_mutex_lock(&g->ctl_mu);
    (void)cp_tcp_send_all(g->prev_fd, &bye, sizeof bye, cp_deadline(100));
    pthread_mutex_unlock(&g->ctl_mu);
  }
  /* After a failure the data direction may be mid-stream: no goodbye there
   * (the neighbour learnt of the failure through the abort record). */
  if (g->next_fd >= 0 && !cp_fail_status(g))
    (void)cp_tcp_send_all(g->next_fd, &bye, sizeof bye, cp_deadline(100));
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
