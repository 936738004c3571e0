/*
 * torch_client.c — a minimal client of torch.distributed's TCPStore, spoken
 * only to find ddplug's own store under torchrun.
 *
 * Why: torchrun (torch >= 2.4) serves its agent's TCPStore on MASTER_PORT
 * and tells the workers so with TORCHELASTIC_USE_AGENT_STORE=True; rank 0
 * cannot listen there. Under torchrun, ddplug's rank 0 therefore listens on
 * a free port and publishes it in the agent's store; the other ranks read it
 * there. Nothing else of ddplug goes through torch's store.
 *
 * The wire protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp, stable
 * since torch 2.0, served by both its classic and libuv backends): every
 * request is a one-byte query type followed by its arguments; a string or a
 * byte vector is a native-endian uint64 length and the bytes. Used here:
 *   VALIDATE (0) uint32 magic 0x3C85F7CE          no reply
 *   SET      (1) key, value                        no reply
 *   GET      (3) key                               reply: value
 *   CHECK    (5) uint64 n, n keys                  reply: uint8 0 ready / 1 not
 * GET is only sent after CHECK said the key exists (a GET of a missing key
 * blocks inside the server). Every call is bounded by a deadline.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "store/store.h"

enum {
  TQ_VALIDATE = 0,
  TQ_SET = 1,
  TQ_GET = 3,
  TQ_CHECK = 5,
};
#define T_MAGIC 0x3C85F7CEu
#define T_CHECK_READY 0
#define T_CHECK_NOT_READY 1
/* A port number as text is all we ever read back. */
#define T_MAX_VALUE 4096

struct ddplug__tstore {
  int fd;
  char where[300];
};

static int t_fail(ddplug__tstore *ts, int err, const char *what) {
  if (err == ETIMEDOUT)
    return ddplug__err(DDPLUG_E_TIMEOUT,
                       "torchrun's store at %s did not answer %s in time (is "
                       "the torchrun agent alive?)",
                       ts->where, what);
  return ddplug__err(DDPLUG_E_PEER_LOST,
                     "torchrun's store at %s: %s failed: %s (did the torchrun "
                     "agent exit, or is MASTER_PORT not torchrun's store?)",
                     ts->where, what, strerror(err));
}

/* Append a length-prefixed string to buf at *len (cap checked by caller). */
static void put_bytes(uint8_t *buf, size_t *len, const void *p, size_t n) {
  uint64_t n64 = n;
  memcpy(buf + *len, &n64, sizeof n64);
  *len += sizeof n64;
  memcpy(buf + *len, p, n);
  *len += n;
}

int ddplug__tstore_connect(const char *host, int port, uint64_t deadline_ns,
                           ddplug__tstore **out) {
  *out = NULL;
  ddplug__tstore *ts = ddplug__calloc(1, sizeof *ts);
  if (!ts)
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "out of memory connecting to torchrun's store");
  ddplug__store_format_where(ts->where, sizeof ts->where, host, port);
  int err = 0, attempts = 0;
  char why[256];
  ts->fd = ddplug__store_tcp_connect_retry(host, port, deadline_ns, &attempts, why, sizeof why);
  if (ts->fd < 0) {
    int s = ddplug__err(
        DDPLUG_E_TIMEOUT,
        "could not connect to torchrun's store at %s (%d attempt%s): %s "
        "(TORCHELASTIC_USE_AGENT_STORE=True says torchrun serves it on "
        "MASTER_ADDR:MASTER_PORT; or set rendezvous.port to a free port "
        "for ddplug's own store)",
        ts->where, attempts, attempts == 1 ? "" : "s", why);
    ddplug__free(ts);
    return s;
  }
  uint8_t hello[1 + 4];
  uint32_t magic = T_MAGIC;
  hello[0] = TQ_VALIDATE;
  memcpy(hello + 1, &magic, sizeof magic);
  if (ddplug__store_send_all(ts->fd, hello, sizeof hello, deadline_ns, &err) != 0) {
    int s = t_fail(ts, err, "the greeting");
    ddplug__tstore_close(ts);
    return s;
  }
  *out = ts;
  return DDPLUG_OK;
}

int ddplug__tstore_set(ddplug__tstore *ts, const char *key, const void *val,
                       size_t len, uint64_t deadline_ns) {
  size_t klen = strlen(key);
  if (klen > 1024 || len > T_MAX_VALUE)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "torchrun store key or value too long");
  uint8_t buf[1 + 8 + 1024 + 8 + T_MAX_VALUE];
  size_t n = 0;
  buf[n++] = TQ_SET;
  put_bytes(buf, &n, key, klen);
  put_bytes(buf, &n, val, len);
  int err = 0;
  if (ddplug__store_send_all(ts->fd, buf, n, deadline_ns, &err) != 0)
    return t_fail(ts, err, "a set");
  return DDPLUG_OK;
}

/* CHECK one key: 1 present, 0 absent, or a negative status (error set). */
static int t_check(ddplug__tstore *ts, const char *key, size_t klen,
                   uint64_t deadline_ns) {
  uint8_t buf[1 + 8 + 8 + 1024];
  size_t n = 0;
  uint64_t one = 1;
  buf[n++] = TQ_CHECK;
  memcpy(buf + n, &one, sizeof one);
  n += sizeof one;
  put_bytes(buf, &n, key, klen);
  int err = 0;
  uint8_t reply = 0xff;
  if (ddplug__store_send_all(ts->fd, buf, n, deadline_ns, &err) != 0 ||
      ddplug__store_recv_all(ts->fd, &reply, 1, deadline_ns, &err) != 0)
    return -t_fail(ts, err, "a check");
  if (reply != T_CHECK_READY && reply != T_CHECK_NOT_READY)
    return -ddplug__err(DDPLUG_E_PEER_LOST,
                        "torchrun's store at %s answered a check with %u: is "
                        "MASTER_PORT really torchrun's TCPStore?",
                        ts->where, (unsigned)reply);
  return reply == T_CHECK_READY;
}

int ddplug__tstore_wait_get(ddplug__tstore *ts, const char *key, char *out,
                            size_t cap, uint64_t deadline_ns) {
  size_t klen = strlen(key);
  if (klen > 1024 || cap == 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "torchrun store key too long");
  int64_t pause = 5;
  for (;;) {
    int r = t_check(ts, key, klen, deadline_ns);
    if (r < 0) return -r;
    if (r == 1) break;
    int64_t left = ddplug__remaining_ms(deadline_ns);
    if (left <= 0)
      return ddplug__err(DDPLUG_E_TIMEOUT,
                         "key '%s' did not appear in torchrun's store at %s",
                         key, ts->where);
    ddplug__sleep_ms(DDPLUG__MIN(pause, left));
    pause = DDPLUG__MIN(pause * 2, 100);
  }
  uint8_t buf[1 + 8 + 1024];
  size_t n = 0;
  buf[n++] = TQ_GET;
  put_bytes(buf, &n, key, klen);
  int err = 0;
  uint64_t vlen = 0;
  if (ddplug__store_send_all(ts->fd, buf, n, deadline_ns, &err) != 0 ||
      ddplug__store_recv_all(ts->fd, &vlen, sizeof vlen, deadline_ns, &err) != 0)
    return t_fail(ts, err, "a get");
  if (vlen >= cap || vlen > T_MAX_VALUE)
    return ddplug__err(DDPLUG_E_PEER_LOST,
                       "torchrun's store at %s returned %llu bytes for '%s' "
                       "(at most %zu expected): something else wrote that key",
                       ts->where, (unsigned long long)vlen, key, cap - 1);
  if (ddplug__store_recv_all(ts->fd, out, (size_t)vlen, deadline_ns, &err) != 0)
    return t_fail(ts, err, "a get");
  out[vlen] = '\0';
  return DDPLUG_OK;
}

void ddplug__tstore_close(ddplug__tstore *ts) {
  if (!ts) return;
  if (ts->fd >= 0) close(ts->fd);
  ddplug__free(ts);
}
