/*
 * net.c — socket plumbing shared by the store's server and client:
 * address formatting, socket options, randomness, and send/receive bounded
 * by a deadline (poll on non-blocking sockets).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/store.h"

void ddplug__store_format_where(char *buf, size_t cap, const char *host,
                                int port) {
  if (host && strchr(host, ':'))
    snprintf(buf, cap, "[%s]:%d", host, port);
  else
    snprintf(buf, cap, "%s:%d", host && *host ? host : "0.0.0.0", port);
}

void ddplug__store_format_sockaddr(char *buf, size_t cap,
                                   const struct sockaddr *sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  ddplug__store_format_where(buf, cap, host, port);
}

int ddplug__store_resolve(const char *host, int port, int passive,
                          struct addrinfo **res) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints = {0};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  return getaddrinfo(host, portstr, &hints, res);
}

/* Keepalive lets either side notice a peer whose machine vanished without
 * a FIN or RST (power loss, network partition) within about half a minute,
 * even on an idle connection; a live but busy process still answers. */
int ddplug__store_tune_socket(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
  int fdfl = fcntl(fd, F_GETFD);
  if (fdfl >= 0) fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC);
  int one = 1, idle = 10, intvl = 5, cnt = 4;
  /* Options below are best effort (not every socket family has them). */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  return 0;
}

int ddplug__store_random(void *buf, size_t n) {
  uint8_t *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (got == n) return 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  return got == n ? 0 : -1;
}

/* poll one fd for events until deadline_ns: 1 ready, 0 deadline, -1 error. */
static int wait_fd(int fd, short events, uint64_t deadline_ns, int *err) {
  for (;;) {
    int64_t left = ddplug__remaining_ms(deadline_ns);
    struct pollfd p = {fd, events, 0};
    int r = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
    if (r > 0) return 1;
    if (r == 0) {
      if (ddplug__now_ns() >= deadline_ns) return 0;
      continue;
    }
    if (errno == EINTR) continue;
    *err = errno;
    return -1;
  }
}

int ddplug__store_wait_readable(int fd, uint64_t deadline_ns, int *err) {
  return wait_fd(fd, POLLIN, deadline_ns, err);
}

int ddplug__store_wait_writable(int fd, uint64_t deadline_ns, int *err) {
  return wait_fd(fd, POLLOUT, deadline_ns, err);
}

int ddplug__store_send_all(int fd, const void *b, size_t n,
                           uint64_t deadline_ns, int *err) {
  const uint8_t *p = b;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int r = wait_fd(fd, POLLOUT, deadline_ns, err);
      if (r == 1) continue;
      if (r == 0) *err = ETIMEDOUT;
      return -1;
    }
    *err = w < 0 ? errno : EPIPE;
    return -1;
  }
  return 0;
}

/* One connection attempt to every address of host:port before deadline_ns.
 * Returns the connected, tuned fd, or -1 with *err (an errno) or *gai (a
 * getaddrinfo error) saying why. */
int ddplug__store_tcp_connect(const char *host, int port, uint64_t deadline_ns,
                       int *err, int *gai) {
  struct addrinfo *res = NULL;
  *gai = ddplug__store_resolve(host, port, 0, &res);
  if (*gai != 0) {
    *err = *gai == EAI_SYSTEM ? errno : 0;
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    int e = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      e = errno;
      if (e == EINPROGRESS) {
        /* Writable once connected or failed; SO_ERROR tells which. */
        int r = ddplug__store_wait_writable(fd, deadline_ns, &e);
        socklen_t el = sizeof e;
        if (r == 0)
          e = ETIMEDOUT;
        else if (r > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
          e = errno;
      }
    }
    if (e == 0 && ddplug__store_tune_socket(fd) != 0) e = errno;
    if (e != 0) {
      *err = e;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

int ddplug__store_recv_all(int fd, void *b, size_t n, uint64_t deadline_ns,
                           int *err) {
  uint8_t *p = b;
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r == 0) {
      *err = ECONNRESET;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(fd, POLLIN, deadline_ns, err);
      if (w == 1) continue;
      if (w == 0) *err = ETIMEDOUT;
      return -1;
    }
    *err = errno;
    return -1;
  }
  return 0;
}

int ddplug__store_tcp_connect_retry(const char *host, int port,
                                    uint64_t deadline_ns, int *attempts,
                                    char *why, size_t why_cap) {
  int64_t backoff = 10;
  *attempts = 0;
  for (;;) {
    int err = 0, gai = 0;
    int fd = ddplug__store_tcp_connect(host, port, deadline_ns, &err, &gai);
    ++*attempts;
    if (fd >= 0) return fd;
    int64_t left = ddplug__remaining_ms(deadline_ns);
    if (left <= 0) {
      if (gai != 0 && gai != EAI_SYSTEM)
        snprintf(why, why_cap, "cannot resolve '%s': %s", host, gai_strerror(gai));
      else
        snprintf(why, why_cap, "%s", strerror(err));
      return -1;
    }
    ddplug__sleep_ms(DDPLUG__MIN(backoff, left));
    backoff = DDPLUG__MIN(backoff * 2, 250);
  }
}
