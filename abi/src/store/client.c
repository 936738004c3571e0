/*
 * client.c — the rendezvous store client: the ddplug_store_* calls.
 *
 * One TCP connection per handle; a mutex serializes calls on it, so a
 * handle is thread-safe. Every call is bounded by a deadline (poll on a
 * non-blocking socket), connect included. Requests carry an id; a reply
 * that arrives after its call gave up locally is recognised by its id and
 * discarded, so a local timeout never desynchronizes the connection.
 * A connection that breaks (server gone, reset, protocol violation, a frame
 * whose MAC or sequence number is wrong) makes the handle fail fast with
 * PEER_LOST from then on; it never reconnects (reconnecting would hide a
 * restarted rank 0 that lost every key). Only a connection the server
 * closes during the handshake is tried again (a busy server drops the
 * oldest connections that have not authenticated).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

struct ddplug_store {
  pthread_mutex_t mu;
  int fd;              /* -1 once the connection is gone */
  int lost_status;     /* non-zero once broken: the status to report */
  int closed;          /* the server closed the connection (or reset it) */
  char lost_msg[512];  /* ... and why */
  uint32_t next_id;
  _Atomic int64_t default_timeout_ms;
  pid_t pid;           /* the process that connected */
  char where[320];     /* "H:P" for messages */
  uint8_t *in;         /* received bytes; in[in_pos..in_len) unread */
  size_t in_len, in_pos, in_cap;
  ddplug__sbuf req;    /* the request being sent */
  ddplug__store_session session; /* frame MACs after a handshake with a secret */
  ddplug__errslot err;
};

/* ---- messages ------------------------------------------------------------ */

/* Quote key bytes for a message: printable ASCII as is, others as \xNN. */
static void quote(char *buf, size_t cap, const void *data, size_t len,
                  size_t max_shown) {
  const uint8_t *p = data;
  size_t o = 0;
  size_t shown = DDPLUG__MIN(len, max_shown);
  for (size_t i = 0; i < shown && o + 5 < cap; i++) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\'')
      buf[o++] = (char)p[i];
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", p[i]);
  }
  if (shown < len && o + 4 < cap) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o < cap ? o : cap - 1] = '\0';
}

/* Mark st broken: later calls fail at once with the same status and text.
 * The socket is closed now (the server then applies on_disconnect keys:
 * this handle can no longer vouch for its process). Returns status. */
static int lose(ddplug_store *st, int status, const char *fmt, ...)
    DDPLUG__PRINTF(3, 4);
static int lose(ddplug_store *st, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->lost_msg, sizeof st->lost_msg, fmt, ap);
  va_end(ap);
  st->lost_status = status;
  if (st->fd >= 0) close(st->fd);
  st->fd = -1;
  return ddplug__err(status, "%s", st->lost_msg);
}

static int closed_by_server(ddplug_store *st) {
  st->closed = 1;
  return lose(st, DDPLUG_E_PEER_LOST,
              "rendezvous store at %s closed the connection (did rank 0 "
              "exit?)",
              st->where);
}

/* A handle inherited across fork() shares its socket with the parent: a
 * child must not speak on it (its BYE would cancel the parent's disconnect
 * keys, its replies would be read by the wrong process), nor take its mutex
 * (another parent thread may have held it at the fork). */
static int forked_away(const ddplug_store *st) { return getpid() != st->pid; }

static int check_usable(ddplug_store *st) {
  if (st->lost_status == 0) return DDPLUG_OK;
  return ddplug__err(st->lost_status, "%s", st->lost_msg);
}

/* ---- frames -------------------------------------------------------------- */

/* Read the next frame before deadline_ns. On success *type, *id and the
 * body (after the header; valid until the next read) are set. Broken
 * connections and protocol violations mark st lost; the deadline passing
 * is TIMEOUT with st still usable. what: the call, for messages. */
static int read_frame(ddplug_store *st, uint64_t deadline_ns, uint8_t *type,
                      uint32_t *id, const uint8_t **body, size_t *blen) {
  if (st->in_pos > 0) { /* drop what the previous frame used */
    memmove(st->in, st->in + st->in_pos, st->in_len - st->in_pos);
    st->in_len -= st->in_pos;
    st->in_pos = 0;
  }
  if (st->in_len == 0 && st->in_cap > 256 * 1024) { /* after a big value */
    ddplug__free(st->in);
    st->in = NULL;
    st->in_cap = 0;
  }
  for (;;) {
    size_t need = DDPLUG__STORE_HDR_LEN;
    if (st->in_len >= 4) {
      uint32_t flen = ddplug__store_get_u32be(st->in);
      if (flen < DDPLUG__STORE_LEN_MIN || flen > DDPLUG__STORE_LEN_MAX)
        return lose(st, DDPLUG_E_PEER_LOST,
                    "rendezvous store at %s sent a malformed frame (length "
                    "%u): is another service listening on that port?",
                    st->where, flen);
      if (st->in_len >= 5 && st->in[4] != DDPLUG__STORE_PROTO_VERSION)
        return lose(st, DDPLUG_E_ABI_MISMATCH,
                    "rendezvous store at %s speaks store protocol version %u, "
                    "this rank speaks %u (are all ranks running the same "
                    "ddplug version?)",
                    st->where, st->in[4], DDPLUG__STORE_PROTO_VERSION);
      need = 4 + (size_t)flen;
    }
    if (st->in_len >= need) {
      size_t inner = 0;
      const char *why = NULL;
      if (ddplug__store_frame_open(&st->session, st->in, need, &inner, &why) != 0) {
        DDPLUG__WARN("rendezvous store at %s: a frame failed its integrity check "
                     "(%s); closing the connection", st->where, why);
        return lose(st, DDPLUG_E_PEER_LOST,
                    "rendezvous store at %s sent a frame that failed its "
                    "integrity check (%s): the connection is closed (is "
                    "something on the network between this rank and rank 0 "
                    "altering traffic?)",
                    st->where, why);
      }
      if (inner < DDPLUG__STORE_LEN_MIN)
        return lose(st, DDPLUG_E_PEER_LOST,
                    "rendezvous store at %s sent a frame too short for its "
                    "header", st->where);
      *type = st->in[5];
      *id = ddplug__store_get_u32be(st->in + 6);
      *body = st->in + DDPLUG__STORE_HDR_LEN;
      *blen = 4 + inner - DDPLUG__STORE_HDR_LEN;
      st->in_pos = need;
      return DDPLUG_OK;
    }
    size_t want = DDPLUG__MAX(need, (size_t)16384);
    if (st->in_cap < want) {
      uint8_t *p = ddplug__realloc(st->in, want);
      if (!p)
        return lose(st, DDPLUG_E_NO_MEMORY,
                    "out of memory receiving %zu bytes from the rendezvous "
                    "store at %s",
                    want, st->where);
      st->in = p;
      st->in_cap = want;
    }
    int err = 0;
    int r = ddplug__store_wait_readable(st->fd, deadline_ns, &err);
    if (r == 0) return DDPLUG_E_TIMEOUT; /* the caller words the message */
    if (r < 0) return closed_by_server(st);
    ssize_t n = recv(st->fd, st->in + st->in_len, st->in_cap - st->in_len, 0);
    if (n == 0) return closed_by_server(st);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return closed_by_server(st);
    }
    st->in_len += (size_t)n;
  }
}

/* Start building a request; returns its id (never 0). */
static uint32_t req_begin(ddplug_store *st, uint8_t type) {
  st->req.len = 0;
  st->req.failed = 0;
  if (++st->next_id == 0) st->next_id = 1;
  ddplug__sbuf_frame_begin(&st->req, type, st->next_id);
  return st->next_id;
}

/* Send the request built since req_begin and wait for its reply before
 * deadline_ns. On OK, *code is the reply code and *rd reads the rest of
 * the reply body. On TIMEOUT nothing is recorded yet: the caller words the
 * message (it knows the keys). Other failures are recorded. */
static int transact(ddplug_store *st, uint32_t id, uint64_t deadline_ns,
                    uint8_t *code, ddplug__rd *rd) {
  ddplug__sbuf_frame_seal(&st->req, &st->session);
  if (st->req.failed) {
    ddplug__sbuf_free(&st->req);
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "out of memory building a rendezvous store request");
  }
  int err = 0;
  int rc = DDPLUG_OK;
  if (ddplug__store_send_all(st->fd, st->req.data, st->req.len, deadline_ns,
                             &err) != 0) {
    if (err == ETIMEDOUT)
      rc = lose(st, DDPLUG_E_TIMEOUT,
                "rendezvous store at %s did not accept a request in time; "
                "the connection is no longer usable (is rank 0 stuck?)",
                st->where);
    else
      rc = closed_by_server(st);
  }
  if (st->req.cap > 256 * 1024) ddplug__sbuf_free(&st->req);
  if (rc != DDPLUG_OK) return rc;
  for (;;) {
    uint8_t type;
    uint32_t rid;
    const uint8_t *body;
    size_t blen;
    rc = read_frame(st, deadline_ns, &type, &rid, &body, &blen);
    if (rc != DDPLUG_OK) return rc;
    if (type != DDPLUG__STORE_REPLY || blen < 1)
      return lose(st, DDPLUG_E_PEER_LOST,
                  "rendezvous store at %s sent an unexpected frame (type "
                  "0x%02x): is another service listening on that port?",
                  st->where, type);
    if (rid != id) continue; /* a late reply to a call that gave up */
    *code = body[0];
    *rd = (ddplug__rd){body + 1, blen - 1, 0};
    return DDPLUG_OK;
  }
}

static int bad_reply(ddplug_store *st, const char *call) {
  return lose(st, DDPLUG_E_PEER_LOST,
              "%s: rendezvous store at %s sent a malformed reply", call,
              st->where);
}

/* GET and WAIT: send the request built so far; the server answers by
 * timeout_ms, and the client waits for that answer up to
 * DDPLUG__STORE_REPLY_GRACE_MS longer. *waited_s: how long the call took. */
static int timed_call(ddplug_store *st, uint32_t id, int64_t timeout_ms,
                      int64_t grace_ms, uint8_t *code, ddplug__rd *rd,
                      double *waited_s) {
  uint64_t start = ddplug__now_ns();
  int rc = transact(st, id, ddplug__deadline_ns(timeout_ms + grace_ms), code, rd);
  *waited_s = (double)(ddplug__now_ns() - start) / 1e9;
  return rc;
}

/* ---- argument checks ----------------------------------------------------- */

static int check_key(const char *call, const char *what, const char *key) {
  if (!key)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: %s is NULL", call, what);
  size_t n = strnlen(key, DDPLUG__STORE_KEY_MAX + 1);
  if (n == 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: %s is empty (keys are 1 to 255 bytes)", call, what);
  if (n > DDPLUG__STORE_KEY_MAX) {
    char q[64];
    quote(q, sizeof q, key, n, 32);
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: %s '%s' is %zu bytes long; keys are at most 255 "
                       "bytes",
                       call, what, q, strlen(key));
  }
  return DDPLUG_OK;
}

static int check_value(const char *call, const char *what, const char *key,
                       const void *value, uint64_t len) {
  if (!value && len > 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: %s for key '%s' is NULL but its length is %llu",
                       call, what, key, (unsigned long long)len);
  if (len > DDPLUG__STORE_VALUE_MAX)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: %s for key '%s' is %llu bytes; values are at most "
                       "%u bytes (1 MiB)",
                       call, what, key, (unsigned long long)len,
                       DDPLUG__STORE_VALUE_MAX);
  return DDPLUG_OK;
}

static int check_handle(const char *call, const ddplug_store *st) {
  if (!st)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: st is NULL", call);
  if (forked_away(st))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: this rendezvous store handle (%s) was opened by "
                       "process %d and cannot be used in forked process %d; "
                       "connect again in the child",
                       call, st->where, (int)st->pid, (int)getpid());
  return DDPLUG_OK;
}

/* Longest wait a call honours (the wire carries u32 milliseconds, about
 * 49 days); longer timeouts are clamped to it. */
#define TIMEOUT_CAP_MS ((int64_t)UINT32_MAX)

/* The effective timeout of a call, or INVALID_ARGUMENT. */
static int resolve_timeout(const char *call, const ddplug_store *st,
                           int64_t timeout_ms, int64_t *out) {
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT) {
    *out = atomic_load(&st->default_timeout_ms);
    return DDPLUG_OK;
  }
  if (timeout_ms < 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: timeout_ms %lld is negative (use a positive "
                       "number of milliseconds, 0 to poll, or "
                       "DDPLUG_TIMEOUT_DEFAULT)",
                       call, (long long)timeout_ms);
  *out = DDPLUG__MIN(timeout_ms, TIMEOUT_CAP_MS);
  return DDPLUG_OK;
}

/* Copy a reply value into a fresh NUL-terminated buffer for the caller. */
static int copy_out(ddplug_store *st, const uint8_t *v, uint32_t len,
                    void **out) {
  uint8_t *p = ddplug__malloc((size_t)len + 1);
  if (!p)
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "out of memory copying a %u-byte value from the "
                       "rendezvous store at %s",
                       len, st->where);
  if (len) memcpy(p, v, len);
  p[len] = '\0';
  *out = p;
  return DDPLUG_OK;
}

/* Take st's lock, waiting for another thread's call at most until
 * deadline_ns: a call's timeout bounds the whole call, its turn included.
 * On failure the lock is not held and the error is recorded on st. */
static int lock_until(ddplug_store *st, const char *call, uint64_t deadline_ns) {
  struct timespec ts = {(time_t)(deadline_ns / 1000000000ull),
                        (long)(deadline_ns % 1000000000ull)};
  uint64_t start = ddplug__now_ns();
  int e = pthread_mutex_clocklock(&st->mu, CLOCK_MONOTONIC, &ts);
  if (e == 0) return DDPLUG_OK;
  int rc = ddplug__err(DDPLUG_E_TIMEOUT,
                       "%s: the rendezvous store handle for %s stayed busy with "
                       "another thread's call for %.1f s (is rank 0 stuck?)",
                       call, st->where, (double)(ddplug__now_ns() - start) / 1e9);
  ddplug__errslot_capture(&st->err);
  return rc;
}

/* Every public call on a handle ends here: record the failure on st too. */
static int finish(ddplug_store *st, int rc) {
  if (rc != DDPLUG_OK) ddplug__errslot_capture(&st->err);
  pthread_mutex_unlock(&st->mu);
  return rc;
}

/* ---- connect ------------------------------------------------------------- */


static const char k_secret_hint[] =
    "set the variable named by rendezvous.secret_env to the same value on "
    "every rank";

/* Answer the server's challenge and check its proof. */
static int handshake(ddplug_store *st, const char *secret,
                     uint64_t deadline_ns, int64_t timeout_ms) {
  uint8_t type;
  uint32_t rid;
  const uint8_t *body;
  size_t blen;
  int rc = read_frame(st, deadline_ns, &type, &rid, &body, &blen);
  if (rc == DDPLUG_E_TIMEOUT)
    return ddplug__err(DDPLUG_E_TIMEOUT,
                       "rendezvous store at %s accepted the connection but "
                       "sent no greeting within %lld ms (is a ddplug store "
                       "listening there? is rank 0 overloaded?)",
                       st->where, (long long)timeout_ms);
  if (rc != DDPLUG_OK) return rc;
  if (type != DDPLUG__STORE_CHALLENGE || rid != 0 ||
      blen != 1 + DDPLUG__STORE_NONCE_LEN || body[0] > 1)
    return lose(st, DDPLUG_E_PEER_LOST,
                "rendezvous store at %s sent an unexpected greeting: is "
                "another service listening on that port?",
                st->where);
  uint8_t snonce[DDPLUG__STORE_NONCE_LEN], cnonce[DDPLUG__STORE_NONCE_LEN];
  memcpy(snonce, body + 1, sizeof snonce);
  if (ddplug__store_random(cnonce, sizeof cnonce) != 0)
    return ddplug__err_errno(DDPLUG_E_SYSTEM, errno,
                             "cannot read random bytes for the rendezvous "
                             "store handshake");
  size_t slen = secret ? strlen(secret) : 0;
  uint8_t mac[DDPLUG__SHA256_LEN] = {0};
  if (slen && ddplug__store_auth_mac(secret, slen, 0, snonce, cnonce, mac) != 0)
    return lose(st, DDPLUG_E_NO_MEMORY,
                "out of memory computing the rendezvous store handshake");
  uint32_t id = req_begin(st, DDPLUG__STORE_AUTH);
  ddplug__sbuf_u8(&st->req, slen > 0);
  ddplug__sbuf_put(&st->req, cnonce, sizeof cnonce);
  ddplug__sbuf_put(&st->req, mac, sizeof mac);
  uint8_t code;
  ddplug__rd rd;
  rc = transact(st, id, deadline_ns, &code, &rd);
  if (rc == DDPLUG_E_TIMEOUT)
    return ddplug__err(DDPLUG_E_TIMEOUT,
                       "rendezvous store at %s did not answer the "
                       "authentication within %lld ms (is rank 0 overloaded?)",
                       st->where, (long long)timeout_ms);
  if (rc != DDPLUG_OK) return rc;
  if (code == DDPLUG__STORE_R_REFUSED) {
    uint8_t reason = ddplug__rd_u8(&rd);
    if (reason == DDPLUG__STORE_REFUSE_UNEXPECTED)
      return lose(st, DDPLUG_E_CONFIG,
                  "rendezvous store at %s refused this client: this rank has "
                  "a shared secret but the store has none (%s, or unset it "
                  "on every rank)",
                  st->where, k_secret_hint);
    return lose(st, DDPLUG_E_CONFIG,
                "rendezvous store at %s refused this client: shared secret "
                "missing or wrong (%s)",
                st->where, k_secret_hint);
  }
  const uint8_t *smac = ddplug__rd_bytes(&rd, DDPLUG__SHA256_LEN);
  if (code != DDPLUG__STORE_R_OK || !smac || rd.left != 0)
    return bad_reply(st, "ddplug_store_connect");
  if (slen) {
    if (ddplug__store_auth_mac(secret, slen, 1, snonce, cnonce, mac) != 0 ||
        !ddplug__ct_equal(mac, smac, sizeof mac))
      return lose(st, DDPLUG_E_CONFIG,
                  "rendezvous store at %s could not prove that it knows the "
                  "shared secret (is another service or a misconfigured rank "
                  "0 listening there? %s)",
                  st->where, k_secret_hint);
    /* From here on every frame carries a sequence number and a MAC. */
    if (ddplug__store_session_init(&st->session, secret, slen, snonce, cnonce, 0) != 0)
      return lose(st, DDPLUG_E_NO_MEMORY,
                  "out of memory computing the rendezvous store session keys");
  }
  return DDPLUG_OK;
}

static void store_free(ddplug_store *st) {
  ddplug__store_session_clear(&st->session);
  if (st->fd >= 0) close(st->fd);
  ddplug__sbuf_free(&st->req);
  ddplug__free(st->in);
  ddplug__errslot_destroy(&st->err);
  pthread_mutex_destroy(&st->mu);
  ddplug__free(st);
}

/* ddplug_store_connect — connect to the rendezvous store at addr:port.
 * addr: a hostname or an IPv4/IPv6 literal (not NULL or empty); port
 * 1..65535; secret: NULL or "" for none, otherwise the shared secret the
 * server requires. While nothing accepts the connection (refused, not
 * resolvable yet), or the server closes it before the handshake completes,
 * the call retries with a short backoff (10 ms doubling to 250 ms) until
 * timeout_ms; 0 makes a single attempt; DDPLUG_TIMEOUT_DEFAULT
 * is 300 s. The handshake's round trips may take up to 500 ms
 * (DDPLUG__STORE_REPLY_GRACE_MS) beyond timeout_ms.
 * Returns OK and *out, to release with ddplug_store_close. Failure leaves
 * *out untouched and nothing open: INVALID_ARGUMENT (naming the argument),
 * TIMEOUT ("could not connect to the rendezvous store at H:P within N ms:
 * <last error>"), CONFIG (secret missing, wrong or unexpected — the server
 * refused, or the server could not prove it knows the secret),
 * ABI_MISMATCH (another store protocol version), PEER_LOST (the server
 * closed the connection or is not a ddplug store), NO_MEMORY.
 * Timeouts beyond 2^32-1 ms (about 49 days) are clamped to it; so are those
 * of the other calls. A handle belongs to the process that connected: in a
 * forked child every call fails with INVALID_ARGUMENT (connect again there).
 * Blocks at most as said. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_connect(const char *addr, int port,
                                    const char *secret, int64_t timeout_ms,
                                    ddplug_store **out) {
  static const char call[] = "ddplug_store_connect";
  if (!out)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "%s: out is NULL", call);
  if (!addr || !*addr)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: addr is NULL or empty (give the rendezvous host, "
                       "e.g. MASTER_ADDR)",
                       call);
  if (port <= 0 || port > 65535)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: port %d is out of range (1..65535)", call, port);
  if (timeout_ms == DDPLUG_TIMEOUT_DEFAULT)
    timeout_ms = DDPLUG__STORE_DEFAULT_TIMEOUT_MS;
  if (timeout_ms < 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: timeout_ms %lld is negative", call,
                       (long long)timeout_ms);
  timeout_ms = DDPLUG__MIN(timeout_ms, TIMEOUT_CAP_MS);
  ddplug_store *st = ddplug__calloc(1, sizeof *st);
  if (!st || ddplug__errslot_init(&st->err) != DDPLUG_OK) {
    ddplug__free(st);
    return ddplug__err(DDPLUG_E_NO_MEMORY,
                       "out of memory creating a rendezvous store client");
  }
  pthread_mutex_init(&st->mu, NULL);
  st->fd = -1;
  st->pid = getpid();
  atomic_store(&st->default_timeout_ms, DDPLUG__STORE_DEFAULT_TIMEOUT_MS);
  ddplug__store_format_where(st->where, sizeof st->where, addr, port);

  uint64_t start = ddplug__now_ns();
  uint64_t deadline = ddplug__deadline_ns(timeout_ms);
  int attempts = 0, rc;
  int64_t backoff = 10;
  char why[256];
again:
  st->fd = ddplug__store_tcp_connect_retry(addr, port, deadline, &attempts, why, sizeof why);
  if (st->fd < 0) {
    double waited = (double)(ddplug__now_ns() - start) / 1e9;
    ddplug__err(DDPLUG_E_TIMEOUT,
                "could not connect to the rendezvous store at %s within "
                "%lld ms (%d attempt%s in %.1f s): %s (is rank 0 running "
                "and reachable? check MASTER_ADDR/MASTER_PORT or "
                "rendezvous.addr/port)",
                st->where, (long long)timeout_ms, attempts,
                attempts == 1 ? "" : "s", waited, why);
    store_free(st);
    return DDPLUG_E_TIMEOUT;
  }
  int64_t hs_ms = ddplug__remaining_ms(deadline) + DDPLUG__STORE_REPLY_GRACE_MS;
  rc = handshake(st, secret, ddplug__deadline_ns(hs_ms), hs_ms);
  if (rc == DDPLUG_E_PEER_LOST && st->closed && ddplug__remaining_ms(deadline) > 0) {
    /* Dropped before authenticating (a busy server sheds the oldest
     * waiting connections): connect again while time is left. */
    DDPLUG__DEBUG("rendezvous store at %s closed the connection during the "
                  "handshake; connecting again", st->where);
    st->fd = -1;
    st->lost_status = 0;
    st->closed = 0;
    st->in_len = st->in_pos = 0;
    ddplug__store_session_clear(&st->session);
    ddplug__sleep_ms(DDPLUG__MIN(backoff, ddplug__remaining_ms(deadline)));
    backoff = DDPLUG__MIN(backoff * 2, 250);
    goto again;
  }
  if (rc != DDPLUG_OK) {
    store_free(st);
    return rc;
  }
  DDPLUG__DEBUG("connected to the rendezvous store at %s", st->where);
  *out = st;
  return DDPLUG_OK;
}

/* ddplug_store_close — say goodbye (so the server does not apply this
 * connection's on_disconnect keys), close the connection and free st.
 * Waits at most 2 s (or the default timeout if smaller) for the server to
 * acknowledge; a broken connection is just closed. In a process forked
 * after connecting, it only releases this process's copy (the parent's
 * connection and its disconnect keys are untouched). NULL is a no-op. No
 * other thread may use st during or after the call. Leaves the calling
 * thread's last error as it was. Since 1.0. */
DDPLUG_API void ddplug_store_close(ddplug_store *st) {
  if (!st) return;
  if (forked_away(st)) { /* release this process's copies only */
    store_free(st);
    return;
  }
  pthread_mutex_lock(&st->mu); /* no other thread may use st now */
  if (st->lost_status == 0 && st->fd >= 0) {
    char saved[DDPLUG__ERRMSG_MAX];
    ddplug__strlcpy(saved, ddplug_last_error(), sizeof saved);
    uint32_t id = req_begin(st, DDPLUG__STORE_BYE);
    uint8_t code;
    ddplug__rd rd;
    int64_t ms = DDPLUG__MIN(atomic_load(&st->default_timeout_ms), 2000);
    transact(st, id, ddplug__deadline_ns(ms), &code, &rd);
    ddplug__set_last_error(saved);
  }
  pthread_mutex_unlock(&st->mu);
  store_free(st);
}

void ddplug__store_close_now(ddplug_store *st) {
  if (st) store_free(st);
}

/* ---- calls --------------------------------------------------------------- */

/* A failure found before taking the lock: record it on st too. */
static int arg_fail(ddplug_store *st, int rc) {
  ddplug__errslot_capture(&st->err);
  return rc;
}

static int no_answer(ddplug_store *st, const char *call, const char *key,
                     int64_t ms) {
  return ddplug__err(DDPLUG_E_TIMEOUT,
                     "%s: rendezvous store at %s did not answer within %lld "
                     "ms (key '%s'; is rank 0 stuck or overloaded?)",
                     call, st->where, (long long)ms, key);
}

/* The simple exchanges: send the request built so far, answered before
 * deadline_ns (timeout ms from the call's start), and expect a reply code. */
static int simple_call(ddplug_store *st, const char *call, const char *key,
                       uint32_t id, uint64_t deadline_ns, int64_t ms,
                       uint8_t *code, ddplug__rd *rd) {
  int rc = transact(st, id, deadline_ns, code, rd);
  if (rc == DDPLUG_E_TIMEOUT && st->lost_status == 0)
    return no_answer(st, call, key, ms);
  return rc;
}

/* SET and ON_DISCONNECT: a key and a value, answered by a bare OK. */
static int key_value_call(ddplug_store *st, const char *call, uint8_t type,
                          const char *key, const void *value, uint64_t len) {
  int rc = check_handle(call, st);
  if (rc) return rc;
  if ((rc = check_key(call, "key", key)) ||
      (rc = check_value(call, "value", key, value, len)))
    return arg_fail(st, rc);
  int64_t ms = atomic_load(&st->default_timeout_ms);
  uint64_t deadline = ddplug__deadline_ns(ms);
  if ((rc = lock_until(st, call, deadline))) return rc;
  if ((rc = check_usable(st)) == DDPLUG_OK) {
    uint32_t id = req_begin(st, type);
    ddplug__sbuf_key(&st->req, key, strlen(key));
    ddplug__sbuf_value(&st->req, value, (size_t)len);
    uint8_t code;
    ddplug__rd rd;
    rc = simple_call(st, call, key, id, deadline, ms, &code, &rd);
    if (rc == DDPLUG_OK && (code != DDPLUG__STORE_R_OK || rd.left != 0))
      rc = bad_reply(st, call);
  }
  return finish(st, rc);
}

/* ddplug_store_set — set key (1..255 bytes) to value[0..len) (at most
 * 1 MiB, copied; value may be NULL when len is 0). Wakes every GET/WAIT
 * waiting for key. Blocks at most st's default timeout (300 s unless the
 * runtime changed it) for the server's acknowledgement. Errors:
 * INVALID_ARGUMENT (naming the argument), PEER_LOST, TIMEOUT, NO_MEMORY.
 * Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_set(ddplug_store *st, const char *key,
                                const void *value, uint64_t len) {
  return key_value_call(st, "ddplug_store_set", DDPLUG__STORE_SET, key, value,
                        len);
}

/* ddplug_store_get — wait at most timeout_ms (0 = do not wait,
 * DDPLUG_TIMEOUT_DEFAULT = st's default) until key exists, then return a
 * copy of its value in *value (NUL-terminated, the NUL not counted in *len;
 * release with ddplug_free) and its length in *len (len may be NULL).
 * The wait happens in the server (no polling). The call returns when the
 * server answers, at the latest 500 ms past timeout_ms if it does not.
 * Errors: TIMEOUT ("key 'k' was not set within N ms ..."), PEER_LOST
 * ("rendezvous store at H:P closed the connection (did rank 0 exit?)"),
 * INVALID_ARGUMENT, NO_MEMORY. On failure *value and *len are untouched.
 * Thread-safe (calls on one handle run one at a time). Since 1.0. */
static int get(ddplug_store *st, const char *key, int64_t timeout_ms,
               int64_t grace_ms, void **value, uint64_t *len) {
  static const char call[] = "ddplug_store_get";
  int rc = check_handle(call, st);
  if (rc) return rc;
  int64_t t = 0;
  if ((rc = check_key(call, "key", key)) ||
      (rc = resolve_timeout(call, st, timeout_ms, &t)))
    return arg_fail(st, rc);
  if (!value)
    return arg_fail(st, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                    "%s: value is NULL (key '%s')", call, key));
  if ((rc = lock_until(st, call, ddplug__deadline_ns(t + grace_ms)))) return rc;
  if ((rc = check_usable(st)) != DDPLUG_OK) return finish(st, rc);
  uint32_t id = req_begin(st, DDPLUG__STORE_GET);
  ddplug__sbuf_u32(&st->req, (uint32_t)t);
  ddplug__sbuf_key(&st->req, key, strlen(key));
  uint8_t code;
  ddplug__rd rd;
  double waited;
  rc = timed_call(st, id, t, grace_ms, &code, &rd, &waited);
  if (rc == DDPLUG_E_TIMEOUT && st->lost_status == 0) {
    rc = ddplug__err(DDPLUG_E_TIMEOUT,
                     "%s: timed out after %.1f s waiting for key '%s': the "
                     "rendezvous store at %s did not answer (is rank 0 stuck "
                     "or overloaded?)",
                     call, waited, key, st->where);
  } else if (rc == DDPLUG_OK && code == DDPLUG__STORE_R_TIMEOUT &&
             rd.left == 0) {
    if (t == 0)
      rc = ddplug__err(DDPLUG_E_TIMEOUT,
                       "%s: key '%s' is not set in the rendezvous store at %s "
                       "(timeout 0: did not wait)",
                       call, key, st->where);
    else
      rc = ddplug__err(DDPLUG_E_TIMEOUT,
                       "%s: key '%s' was not set within %lld ms (waited %.1f "
                       "s) in the rendezvous store at %s; did the rank that "
                       "sets it start and reach that point?",
                       call, key, (long long)t, waited, st->where);
  } else if (rc == DDPLUG_OK) {
    uint32_t vlen = 0;
    const uint8_t *v = ddplug__rd_value(&rd, &vlen);
    if (code != DDPLUG__STORE_R_OK || !v || rd.left != 0) {
      rc = bad_reply(st, call);
    } else if ((rc = copy_out(st, v, vlen, value)) == DDPLUG_OK && len) {
      *len = vlen;
    }
  }
  return finish(st, rc);
}

DDPLUG_API int ddplug_store_get(ddplug_store *st, const char *key,
                                int64_t timeout_ms, void **value,
                                uint64_t *len) {
  return get(st, key, timeout_ms, DDPLUG__STORE_REPLY_GRACE_MS, value, len);
}

int ddplug__store_get_within(ddplug_store *st, const char *key, int64_t timeout_ms,
                             int64_t grace_ms, void **value, uint64_t *len) {
  return get(st, key, timeout_ms, grace_ms > 0 ? grace_ms : 1, value, len);
}

/* ddplug_store_add — atomically add delta to the decimal integer stored at
 * key (absent = 0), store the sum as decimal text ("42") and return it in
 * *result (may be NULL). Errors: INVALID_ARGUMENT when the value is not a
 * decimal integer or the sum overflows int64 (the message shows the value;
 * nothing changes), PEER_LOST, TIMEOUT (st's default timeout), NO_MEMORY.
 * Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_add(ddplug_store *st, const char *key,
                                int64_t delta, int64_t *result) {
  static const char call[] = "ddplug_store_add";
  int rc = check_handle(call, st);
  if (rc) return rc;
  if ((rc = check_key(call, "key", key))) return arg_fail(st, rc);
  int64_t ms = atomic_load(&st->default_timeout_ms);
  uint64_t deadline = ddplug__deadline_ns(ms);
  if ((rc = lock_until(st, call, deadline))) return rc;
  if ((rc = check_usable(st)) != DDPLUG_OK) return finish(st, rc);
  uint32_t id = req_begin(st, DDPLUG__STORE_ADD);
  ddplug__sbuf_key(&st->req, key, strlen(key));
  ddplug__sbuf_i64(&st->req, delta);
  uint8_t code;
  ddplug__rd rd;
  rc = simple_call(st, call, key, id, deadline, ms, &code, &rd);
  if (rc != DDPLUG_OK) return finish(st, rc);
  if (code == DDPLUG__STORE_R_OK) {
    int64_t v = ddplug__rd_i64(&rd);
    if (rd.bad || rd.left != 0)
      rc = bad_reply(st, call);
    else if (result)
      *result = v;
  } else if (code == DDPLUG__STORE_R_NOT_INTEGER ||
             code == DDPLUG__STORE_R_OVERFLOW) {
    uint32_t vlen = 0;
    const uint8_t *v = ddplug__rd_value(&rd, &vlen);
    char q[128];
    quote(q, sizeof q, v, v ? vlen : 0, 40);
    if (code == DDPLUG__STORE_R_NOT_INTEGER)
      rc = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: key '%s' holds '%s' (%u bytes), which is not a "
                       "decimal integer; add needs one (or an absent key)",
                       call, key, q, vlen);
    else
      rc = ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "%s: adding %lld to key '%s' (value %s) overflows int64",
                       call, (long long)delta, key, q);
  } else {
    rc = bad_reply(st, call);
  }
  return finish(st, rc);
}

/* ddplug_store_compare_set — atomically: if key's value equals
 * expected[0..elen) (expected == NULL with elen == 0: "key absent"; a
 * non-NULL expected with elen == 0 expects a present, empty value), set it
 * to desired[0..dlen). *swapped (may be NULL) = 1 if it did. *actual (may
 * be NULL; released with ddplug_free; NUL-terminated) and *alen (may be
 * NULL) receive the value after the operation; if the key is absent then,
 * *actual = NULL and *alen = 0. Errors: INVALID_ARGUMENT, PEER_LOST,
 * TIMEOUT (st's default timeout), NO_MEMORY (the swap may then have
 * happened). Thread-safe. Since 1.0. */
static int compare_set(ddplug_store *st, const char *call, const char *key,
                       const void *expected, uint64_t elen, const void *desired,
                       uint64_t dlen, int *swapped, void **actual, uint64_t *alen,
                       int64_t ms) {
  int rc = check_handle(call, st);
  if (rc) return rc;
  if ((rc = check_key(call, "key", key)) ||
      (rc = check_value(call, "expected", key, expected, elen)) ||
      (rc = check_value(call, "desired", key, desired, dlen)))
    return arg_fail(st, rc);
  uint64_t deadline = ddplug__deadline_ns(ms);
  if ((rc = lock_until(st, call, deadline))) return rc;
  if ((rc = check_usable(st)) != DDPLUG_OK) return finish(st, rc);
  uint32_t id = req_begin(st, DDPLUG__STORE_CAS);
  ddplug__sbuf_key(&st->req, key, strlen(key));
  ddplug__sbuf_u8(&st->req, expected != NULL);
  if (expected) ddplug__sbuf_value(&st->req, expected, (size_t)elen);
  ddplug__sbuf_value(&st->req, desired, (size_t)dlen);
  uint8_t code;
  ddplug__rd rd;
  rc = simple_call(st, call, key, id, deadline, ms, &code, &rd);
  if (rc != DDPLUG_OK) return finish(st, rc);
  uint8_t did = ddplug__rd_u8(&rd);
  uint8_t present = ddplug__rd_u8(&rd);
  uint32_t vlen = 0;
  const uint8_t *v = present ? ddplug__rd_value(&rd, &vlen) : NULL;
  if (code != DDPLUG__STORE_R_OK || rd.bad || rd.left != 0 || did > 1 ||
      present > 1)
    return finish(st, bad_reply(st, call));
  void *copy = NULL;
  if (actual && v && (rc = copy_out(st, v, vlen, &copy)) != DDPLUG_OK)
    return finish(st, rc);
  if (swapped) *swapped = did;
  if (actual) *actual = copy;
  if (alen) *alen = vlen;
  return finish(st, DDPLUG_OK);
}

DDPLUG_API int ddplug_store_compare_set(ddplug_store *st, const char *key,
                                        const void *expected, uint64_t elen,
                                        const void *desired, uint64_t dlen,
                                        int *swapped, void **actual,
                                        uint64_t *alen) {
  return compare_set(st, "ddplug_store_compare_set", key, expected, elen, desired,
                     dlen, swapped, actual, alen,
                     st ? atomic_load(&st->default_timeout_ms) : 0);
}

int ddplug__store_compare_set_within(ddplug_store *st, const char *key,
                                     const void *expected, uint64_t elen,
                                     const void *desired, uint64_t dlen,
                                     int *swapped, int64_t timeout_ms) {
  return compare_set(st, "ddplug_store_compare_set", key, expected, elen, desired,
                     dlen, swapped, NULL, NULL, timeout_ms > 0 ? timeout_ms : 1);
}

/* ddplug_store_delete — remove key; *existed (may be NULL) = 1 if it was
 * there. A missing key is not an error. Parked GET/WAIT calls for the key
 * keep waiting. Errors: INVALID_ARGUMENT, PEER_LOST, TIMEOUT (st's default
 * timeout). Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_delete(ddplug_store *st, const char *key,
                                   int *existed) {
  static const char call[] = "ddplug_store_delete";
  int rc = check_handle(call, st);
  if (rc) return rc;
  if ((rc = check_key(call, "key", key))) return arg_fail(st, rc);
  int64_t ms = atomic_load(&st->default_timeout_ms);
  uint64_t deadline = ddplug__deadline_ns(ms);
  if ((rc = lock_until(st, call, deadline))) return rc;
  if ((rc = check_usable(st)) != DDPLUG_OK) return finish(st, rc);
  uint32_t id = req_begin(st, DDPLUG__STORE_DELETE);
  ddplug__sbuf_key(&st->req, key, strlen(key));
  uint8_t code;
  ddplug__rd rd;
  rc = simple_call(st, call, key, id, deadline, ms, &code, &rd);
  if (rc != DDPLUG_OK) return finish(st, rc);
  uint8_t e = ddplug__rd_u8(&rd);
  if (code != DDPLUG__STORE_R_OK || rd.bad || rd.left != 0 || e > 1)
    return finish(st, bad_reply(st, call));
  if (existed) *existed = e;
  return finish(st, DDPLUG_OK);
}

/* Append "'a', 'b', ... and N more" for the keys in rd to buf. */
static void list_keys(char *buf, size_t cap, ddplug__rd *rd, uint32_t m) {
  size_t o = 0;
  buf[0] = '\0';
  for (uint32_t i = 0; i < m; i++) {
    uint16_t klen = 0;
    const uint8_t *k = ddplug__store_next_key(rd, &klen);
    if (!k) break;
    if (i == 16 || o + 80 > cap) {
      snprintf(buf + o, cap - o, "%sand %u more", i ? ", " : "", m - i);
      return;
    }
    char q[72];
    quote(q, sizeof q, k, klen, 64);
    o += (size_t)snprintf(buf + o, cap - o, "%s'%s'", i ? ", " : "", q);
  }
}

/* ddplug_store_wait — wait at most timeout_ms (0 = check once,
 * DDPLUG_TIMEOUT_DEFAULT = st's default) until every one of keys[0..nkeys)
 * exists (nkeys <= 1024; 0 keys succeed at once). The wait happens in the
 * server; the call returns when it answers, at the latest 500 ms past
 * timeout_ms. On TIMEOUT the last error names the keys still missing
 * ("timed out after 5.0 s waiting for 2 of 4 keys ...; still missing:
 * 'a', 'b'"). Other errors: INVALID_ARGUMENT (naming the bad key's index),
 * PEER_LOST, NO_MEMORY. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_wait(ddplug_store *st, const char *const *keys,
                                 uint32_t nkeys, int64_t timeout_ms) {
  static const char call[] = "ddplug_store_wait";
  int rc = check_handle(call, st);
  if (rc) return rc;
  int64_t t = 0;
  if ((rc = resolve_timeout(call, st, timeout_ms, &t))) return arg_fail(st, rc);
  if (nkeys > DDPLUG__STORE_WAIT_KEYS_MAX)
    return arg_fail(st, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                    "%s: nkeys %u is over the limit of %u keys "
                                    "per wait (split the wait)",
                                    call, nkeys, DDPLUG__STORE_WAIT_KEYS_MAX));
  if (nkeys > 0 && !keys)
    return arg_fail(st, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                    "%s: keys is NULL but nkeys is %u", call,
                                    nkeys));
  for (uint32_t i = 0; i < nkeys; i++) {
    char what[32];
    snprintf(what, sizeof what, "keys[%u]", i);
    if ((rc = check_key(call, what, keys[i]))) return arg_fail(st, rc);
  }
  if ((rc = lock_until(st, call, ddplug__deadline_ns(t + DDPLUG__STORE_REPLY_GRACE_MS))))
    return rc;
  if ((rc = check_usable(st)) != DDPLUG_OK || nkeys == 0)
    return finish(st, rc);
  uint32_t id = req_begin(st, DDPLUG__STORE_WAIT);
  ddplug__sbuf_u32(&st->req, (uint32_t)t);
  ddplug__sbuf_u16(&st->req, (uint16_t)nkeys);
  for (uint32_t i = 0; i < nkeys; i++)
    ddplug__sbuf_key(&st->req, keys[i], strlen(keys[i]));
  uint8_t code;
  ddplug__rd rd;
  double waited;
  rc = timed_call(st, id, t, DDPLUG__STORE_REPLY_GRACE_MS, &code, &rd, &waited);
  if (rc == DDPLUG_E_TIMEOUT && st->lost_status == 0) {
    rc = ddplug__err(DDPLUG_E_TIMEOUT,
                     "%s: timed out after %.1f s waiting for %u key(s) "
                     "(first '%s'): the rendezvous store at %s did not answer "
                     "(is rank 0 stuck or overloaded?)",
                     call, waited, nkeys, keys[0], st->where);
  } else if (rc == DDPLUG_OK && code == DDPLUG__STORE_R_OK) {
    if (rd.left != 0) rc = bad_reply(st, call);
  } else if (rc == DDPLUG_OK && code == DDPLUG__STORE_R_TIMEOUT) {
    uint32_t m = ddplug__rd_u16(&rd);
    char list[1200];
    list_keys(list, sizeof list, &rd, m);
    if (rd.bad || m == 0 || m > nkeys)
      rc = bad_reply(st, call);
    else
      rc = ddplug__err(DDPLUG_E_TIMEOUT,
                       "%s: timed out after %.1f s (timeout %lld ms) waiting "
                       "for %u of %u key(s) in the rendezvous store at %s; "
                       "still missing: %s",
                       call, waited, (long long)t, m, nkeys, st->where, list);
  } else if (rc == DDPLUG_OK) {
    rc = bad_reply(st, call);
  }
  return finish(st, rc);
}

/* ddplug_store_on_disconnect — ask the server to set key to value[0..len)
 * (if key is absent then) when this connection ends without
 * ddplug_store_close: the process was killed, crashed or its connection
 * was reset. Several registrations per connection are allowed (at most
 * 1024 holding at most 16 MiB of keys and values; beyond that the server
 * closes the connection, and the call returns PEER_LOST). A clean
 * ddplug_store_close drops them all. Errors: INVALID_ARGUMENT, PEER_LOST,
 * TIMEOUT (st's default timeout). Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_on_disconnect(ddplug_store *st, const char *key,
                                          const void *value, uint64_t len) {
  return key_value_call(st, "ddplug_store_on_disconnect",
                        DDPLUG__STORE_ON_DISCONNECT, key, value, len);
}

/* ddplug_store_error — the detail sentence of the last failed call on st
 * ("" if none failed; "" for a NULL st). Owned by st; valid until the next
 * failing call on st or ddplug_store_close. Any thread. Since 1.0. */
DDPLUG_API const char *ddplug_store_error(const ddplug_store *st) {
  return st ? ddplug__errslot_get(&st->err) : "";
}

int ddplug__store_set_default_timeout(ddplug_store *st, int64_t ms) {
  if (!st || ms <= 0)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "store default timeout must be positive (got %lld ms)",
                       (long long)ms);
  atomic_store(&st->default_timeout_ms, ms);
  return DDPLUG_OK;
}
