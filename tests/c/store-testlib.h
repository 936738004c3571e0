/*
 * store-testlib.h — helpers for the rendezvous store tests (test-store*.c):
 * start servers (in this process or in a forked one), connect clients, and
 * speak the wire protocol by hand on raw sockets.
 */
#ifndef DDPLUG_STORE_TESTLIB_H
#define DDPLUG_STORE_TESTLIB_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ddplug/store.h"
#include "store/store.h"

static inline ddplug_store_server *st_serve(const char *secret) {
  ddplug_store_server *srv = NULL;
  CHECK_OK(ddplug_store_serve("127.0.0.1", 0, secret, &srv));
  CHECK(ddplug_store_server_port(srv) > 0);
  return srv;
}

static inline ddplug_store *st_connect(int port, const char *secret) {
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", port, secret, 10000, &st));
  return st;
}

/* key must hold the string want, waiting at most timeout_ms for it. */
static inline void st_expect_value(ddplug_store *st, const char *key,
                                   int64_t timeout_ms, const char *want) {
  void *v = NULL;
  uint64_t len = 0;
  CHECK_OK(ddplug_store_get(st, key, timeout_ms, &v, &len));
  CHECK_EQ_STR((char *)v, want);
  CHECK_EQ_INT(len, strlen(want));
  ddplug_free(v);
}

/* Wait at most timeout_ms for the forked child pid; it must exit with 0. */
static inline void st_join_child(pid_t pid, int timeout_ms, const char *what) {
  int status = 0;
  CHECK_MSG(dt_wait_pid(pid, timeout_ms, &status) == 0, "%s (pid %d) hung", what,
            (int)pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "%s (pid %d) failed (wait status %d)", what, (int)pid, status);
}

static inline double st_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A server in a forked process (so a test can SIGKILL it). Returns its pid;
 * *port gets the port. The child stops cleanly when *ctl is closed. */
static inline pid_t st_spawn_server(const char *secret, int *port, int *ctl) {
  int up[2], down[2];
  CHECK(pipe(up) == 0 && pipe(down) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    ddplug_store_server *srv = NULL;
    int p = ddplug_store_serve("127.0.0.1", 0, secret, &srv) == DDPLUG_OK
                ? ddplug_store_server_port(srv)
                : -1;
    if (write(up[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(3);
    char c;
    while (read(down[0], &c, 1) < 0 && errno == EINTR) {
    }
    ddplug_store_server_stop(srv);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  int p = -1;
  CHECK(read(up[0], &p, sizeof p) == (ssize_t)sizeof p);
  close(up[0]);
  CHECK_MSG(p > 0, "server process could not start");
  *port = p;
  *ctl = down[1];
  return pid;
}

/* ---- raw protocol -------------------------------------------------------- */

/* A blocking TCP connection to 127.0.0.1:port with 5 s I/O timeouts. */
static inline int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_MSG(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
            strerror(errno));
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static inline void raw_send(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return; /* the server may have closed: that is allowed */
    b += w;
    n -= (size_t)w;
  }
}

/* Read exactly n bytes; 0 on success, -1 on EOF/error/timeout. */
static inline int raw_recv(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n > 0) {
    ssize_t r = recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Read one frame into buf (cap bytes); returns the body length after the
 * 10-byte header, or -1. */
static inline long raw_recv_frame(int fd, uint8_t *buf, size_t cap) {
  if (raw_recv(fd, buf, 4) != 0) return -1;
  uint32_t len = ddplug__store_get_u32be(buf);
  if (len < 6 || 4 + (size_t)len > cap) return -1;
  if (raw_recv(fd, buf + 4, len) != 0) return -1;
  return (long)len - 6;
}

/* Send an AUTH frame with the secret flag and an all-zero nonce and MAC
 * (right for a server without a secret, wrong for one with). */
static inline void raw_send_auth(int fd, int has_secret) {
  ddplug__sbuf b = {0};
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_AUTH, 1);
  ddplug__sbuf_u8(&b, (uint8_t)has_secret);
  uint8_t zeros[64] = {0};
  ddplug__sbuf_put(&b, zeros, 64);
  ddplug__sbuf_frame_end(&b);
  raw_send(fd, b.data, b.len);
  ddplug__sbuf_free(&b);
}

/* Read the CHALLENGE and authenticate without a secret. */
static inline void raw_auth(int fd) {
  uint8_t buf[256];
  CHECK_EQ_INT(raw_recv_frame(fd, buf, sizeof buf), 33);
  CHECK_EQ_INT(buf[5], DDPLUG__STORE_CHALLENGE);
  raw_send_auth(fd, 0);
  long n = raw_recv_frame(fd, buf, sizeof buf);
  CHECK_EQ_INT(n, 33);
  CHECK_EQ_INT(buf[10], DDPLUG__STORE_R_OK);
}

/* 1 if the peer closes fd within timeout_ms (EOF or reset), 0 otherwise.
 * Data that arrives meanwhile is discarded. */
static inline int raw_closed_within(int fd, int timeout_ms) {
  double end = st_now_s() + timeout_ms / 1000.0;
  for (;;) {
    int left = (int)((end - st_now_s()) * 1000);
    if (left <= 0) return 0;
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, left);
    if (r == 0) return 0;
    if (r < 0) continue;
    uint8_t junk[4096];
    ssize_t n = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return 1;
  }
}

#endif
