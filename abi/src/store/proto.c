/*
 * proto.c — the rendezvous store's wire format: frame building and
 * bounds-checked decoding. Pure functions; no sockets, no state.
 *
 * WIRE FORMAT (protocol version 2). All integers are big-endian.
 *
 *   frame   u32 length   bytes after this field: 6 .. 2 MiB + 1064
 *           u8  version  2 (DDPLUG__STORE_PROTO_VERSION)
 *           u8  type     below
 *           u32 id       request id chosen by the client, echoed by the
 *                        reply; 0 in CHALLENGE
 *           ... body     by type
 *           [u64 seq, 32-byte mac]   the trailer, on a connection whose
 *                        handshake used a secret, after the handshake (the
 *                        first frame after it in each direction is seq 0)
 *           the fields must fill `length` exactly
 *   key     u16 n + n bytes: 1 <= n <= 255, no NUL byte
 *   value   u32 n + n bytes: 0 <= n <= 1 MiB
 *
 * Handshake (always, with or without a secret):
 *   S->C CHALLENGE 0x80  u8 server_has_secret, 32-byte server nonce
 *   C->S AUTH      0x01  u8 client_has_secret, 32-byte client nonce,
 *                        32-byte client mac
 *   S->C REPLY     0x81  OK, 32-byte server mac      (then requests)
 *                     or REFUSED, u8 reason           (then the server closes)
 *   client mac = HMAC-SHA256(secret, "ddplug-store-v2 client" || server nonce
 *                || client nonce); server mac = HMAC-SHA256(secret,
 *   "ddplug-store-v2 server" || client nonce || server nonce); both are 32
 *   zero bytes when that side has no secret. The server refuses a missing
 *   secret (reason 1), a wrong one (2) and a secret it does not expect (3);
 *   the client refuses a server whose mac is wrong. Until AUTH succeeds the
 *   server accepts no other frame, and no frame longer than an AUTH frame
 *   (71 bytes after the length field): a connection that has not proven the
 *   secret costs the server a fixed few hundred bytes.
 *
 * Integrity after the handshake (connections with a secret): each
 *   direction has its own session key, HMAC-SHA256(secret, "ddplug-store-v2
 *   session client->server" or "... server->client" || server nonce ||
 *   client nonce), fresh for every connection. A frame's mac is
 *   HMAC-SHA256(key of its direction, every byte of the frame from the
 *   length field through seq). A receiver that finds a wrong mac or a seq
 *   other than the next one (a frame altered, injected, replayed, dropped
 *   or reordered) closes the connection and logs it. There is no
 *   encryption: anyone on the path can read keys and values.
 *
 * Requests (C->S) and their REPLY bodies (first byte: the reply code):
 *   SET           0x02  key, value                 -> OK
 *   GET           0x03  u32 timeout_ms, key        -> OK value | TIMEOUT
 *   ADD           0x04  key, i64 delta             -> OK i64 new value
 *                                                     | NOT_INTEGER value
 *                                                     | OVERFLOW value
 *   CAS           0x05  key, u8 expect_present, [value expected, if 1],
 *                       value desired              -> OK u8 swapped,
 *                                                     u8 present,
 *                                                     [value actual, if 1]
 *   DELETE        0x06  key                        -> OK u8 existed
 *   WAIT          0x07  u32 timeout_ms, u16 n (1..1024), n keys
 *                                                  -> OK | TIMEOUT u16 m,
 *                                                     m keys still missing
 *   ON_DISCONNECT 0x08  key, value                 -> OK
 *   BYE           0x09  (empty)                    -> OK; the client closes
 *                       and its ON_DISCONNECT registrations are dropped.
 * Reply codes: OK 0, TIMEOUT 1, NOT_INTEGER 2, OVERFLOW 3, REFUSED 4.
 *
 * GET and WAIT are parked by the server until their keys exist or
 * timeout_ms passes (0 = answer at once). A client may send a request while
 * an earlier one is still parked (after a local timeout); replies carry the
 * request id, and a client discards replies to ids it no longer waits for.
 * Anything else — a length out of range, another version, an unknown type,
 * a field out of bounds, trailing bytes — makes the server close that
 * connection (logged at debug level; a failed mac or sequence number at
 * warning level); other connections are unaffected.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <string.h>

#include "store/store.h"

/* ---- building ------------------------------------------------------------ */

void ddplug__sbuf_free(ddplug__sbuf *b) {
  ddplug__free(b->data);
  memset(b, 0, sizeof *b);
}

int ddplug__sbuf_reserve(ddplug__sbuf *b, size_t n) {
  if (b->failed) return -1;
  if (b->cap - b->len >= n) return 0;
  size_t need = b->len + n;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap *= 2;
  uint8_t *d = ddplug__realloc(b->data, cap);
  if (!d) {
    b->failed = 1;
    return -1;
  }
  b->data = d;
  b->cap = cap;
  return 0;
}

void ddplug__sbuf_put(ddplug__sbuf *b, const void *data, size_t n) {
  if (n == 0 || ddplug__sbuf_reserve(b, n) != 0) return;
  memcpy(b->data + b->len, data, n);
  b->len += n;
}

void ddplug__sbuf_u8(ddplug__sbuf *b, uint8_t v) { ddplug__sbuf_put(b, &v, 1); }

void ddplug__sbuf_u16(ddplug__sbuf *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  ddplug__sbuf_put(b, x, 2);
}

static void put_u32_at(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

void ddplug__sbuf_u32(ddplug__sbuf *b, uint32_t v) {
  uint8_t x[4];
  put_u32_at(x, v);
  ddplug__sbuf_put(b, x, 4);
}

void ddplug__sbuf_i64(ddplug__sbuf *b, int64_t v) {
  uint64_t u = (uint64_t)v;
  ddplug__sbuf_u32(b, (uint32_t)(u >> 32));
  ddplug__sbuf_u32(b, (uint32_t)u);
}

void ddplug__sbuf_key(ddplug__sbuf *b, const void *key, size_t len) {
  ddplug__sbuf_u16(b, (uint16_t)len);
  ddplug__sbuf_put(b, key, len);
}

void ddplug__sbuf_value(ddplug__sbuf *b, const void *value, size_t len) {
  ddplug__sbuf_u32(b, (uint32_t)len);
  ddplug__sbuf_put(b, value, len);
}

void ddplug__sbuf_frame_begin(ddplug__sbuf *b, uint8_t type, uint32_t id) {
  b->frame_start = b->len;
  ddplug__sbuf_u32(b, 0);
  ddplug__sbuf_u8(b, DDPLUG__STORE_PROTO_VERSION);
  ddplug__sbuf_u8(b, type);
  ddplug__sbuf_u32(b, id);
}

void ddplug__sbuf_frame_end(ddplug__sbuf *b) {
  if (b->failed) return;
  put_u32_at(b->data + b->frame_start, (uint32_t)(b->len - b->frame_start - 4));
}

void ddplug__sbuf_frame_seal(ddplug__sbuf *b, ddplug__store_session *s) {
  if (!s || !s->on) {
    ddplug__sbuf_frame_end(b);
    return;
  }
  ddplug__sbuf_i64(b, (int64_t)s->seq_tx);
  if (ddplug__sbuf_reserve(b, DDPLUG__STORE_MAC_LEN) != 0) return;
  /* The length field covers the mac, which is computed over the length. */
  put_u32_at(b->data + b->frame_start,
             (uint32_t)(b->len + DDPLUG__STORE_MAC_LEN - b->frame_start - 4));
  if (ddplug__hmac_sha256(s->key_tx, sizeof s->key_tx, b->data + b->frame_start,
                          b->len - b->frame_start, NULL, 0,
                          b->data + b->len) != 0) {
    b->failed = 1;
    return;
  }
  b->len += DDPLUG__STORE_MAC_LEN;
  s->seq_tx++;
}

void ddplug__sbuf_consume(ddplug__sbuf *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
}

/* ---- reading ------------------------------------------------------------- */

uint32_t ddplug__store_get_u32be(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

const uint8_t *ddplug__rd_bytes(ddplug__rd *r, size_t n) {
  if (r->bad || r->left < n) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *p = r->p;
  r->p += n;
  r->left -= n;
  return p;
}

uint8_t ddplug__rd_u8(ddplug__rd *r) {
  const uint8_t *p = ddplug__rd_bytes(r, 1);
  return p ? p[0] : 0;
}

uint16_t ddplug__rd_u16(ddplug__rd *r) {
  const uint8_t *p = ddplug__rd_bytes(r, 2);
  return p ? (uint16_t)((unsigned)p[0] << 8 | p[1]) : 0;
}

uint32_t ddplug__rd_u32(ddplug__rd *r) {
  const uint8_t *p = ddplug__rd_bytes(r, 4);
  return p ? ddplug__store_get_u32be(p) : 0;
}

int64_t ddplug__rd_i64(ddplug__rd *r) {
  uint64_t hi = ddplug__rd_u32(r);
  uint64_t lo = ddplug__rd_u32(r);
  return (int64_t)(hi << 32 | lo);
}

const uint8_t *ddplug__rd_key(ddplug__rd *r, uint16_t *len) {
  uint16_t n = ddplug__rd_u16(r);
  if (r->bad || n == 0 || n > DDPLUG__STORE_KEY_MAX) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *p = ddplug__rd_bytes(r, n);
  if (p && memchr(p, 0, n)) r->bad = 1;
  if (r->bad) return NULL;
  *len = n;
  return p;
}

const uint8_t *ddplug__rd_value(ddplug__rd *r, uint32_t *len) {
  uint32_t n = ddplug__rd_u32(r);
  if (!r->bad && n > DDPLUG__STORE_VALUE_MAX) r->bad = DDPLUG__RD_TOO_BIG;
  if (r->bad) return NULL;
  const uint8_t *p = ddplug__rd_bytes(r, n);
  if (r->bad) return NULL;
  *len = n;
  return p;
}

const uint8_t *ddplug__store_next_key(ddplug__rd *r, uint16_t *len) {
  return ddplug__rd_key(r, len);
}

/* A key field that failed: say why (for the debug log). */
static const char *key_problem(const uint8_t *start, size_t left) {
  if (left < 2) return "truncated key length";
  unsigned n = (unsigned)start[0] << 8 | start[1];
  if (n == 0) return "empty key";
  if (n > DDPLUG__STORE_KEY_MAX) return "key longer than 255 bytes";
  if (left - 2 < n) return "truncated key";
  return "key contains a NUL byte";
}

int ddplug__store_decode_request(const uint8_t *frame, size_t len,
                                 ddplug__store_req *req, const char **why) {
  memset(req, 0, sizeof *req);
  ddplug__rd r = {frame, len, 0};
  uint8_t version = ddplug__rd_u8(&r);
  req->type = ddplug__rd_u8(&r);
  req->id = ddplug__rd_u32(&r);
  if (r.bad) {
    *why = "frame shorter than its header";
    return -1;
  }
  if (version != DDPLUG__STORE_PROTO_VERSION) {
    *why = "wrong protocol version";
    return -1;
  }
  const uint8_t *field = r.p;
  size_t field_left = r.left;
#define KEY_FIELD()                                              \
  do {                                                           \
    field = r.p;                                                 \
    field_left = r.left;                                         \
    req->key = ddplug__rd_key(&r, &req->klen);                   \
    if (r.bad) {                                                 \
      *why = key_problem(field, field_left);                     \
      return -1;                                                 \
    }                                                            \
  } while (0)
  switch (req->type) {
    case DDPLUG__STORE_AUTH:
      req->has_secret = ddplug__rd_u8(&r);
      if (!r.bad && req->has_secret > 1) {
        *why = "bad secret flag";
        return -1;
      }
      req->nonce = ddplug__rd_bytes(&r, DDPLUG__STORE_NONCE_LEN);
      req->mac = ddplug__rd_bytes(&r, DDPLUG__SHA256_LEN);
      break;
    case DDPLUG__STORE_SET:
    case DDPLUG__STORE_ON_DISCONNECT:
      KEY_FIELD();
      req->value = ddplug__rd_value(&r, &req->vlen);
      break;
    case DDPLUG__STORE_GET:
      req->timeout_ms = ddplug__rd_u32(&r);
      KEY_FIELD();
      break;
    case DDPLUG__STORE_ADD:
      KEY_FIELD();
      req->delta = ddplug__rd_i64(&r);
      break;
    case DDPLUG__STORE_CAS:
      KEY_FIELD();
      req->expect_present = ddplug__rd_u8(&r);
      if (!r.bad && req->expect_present > 1) {
        *why = "bad expect_present flag";
        return -1;
      }
      if (req->expect_present) req->expected = ddplug__rd_value(&r, &req->elen);
      req->value = ddplug__rd_value(&r, &req->vlen);
      break;
    case DDPLUG__STORE_DELETE:
      KEY_FIELD();
      break;
    case DDPLUG__STORE_WAIT: {
      req->timeout_ms = ddplug__rd_u32(&r);
      req->nkeys = ddplug__rd_u16(&r);
      if (r.bad) break;
      if (req->nkeys == 0 || req->nkeys > DDPLUG__STORE_WAIT_KEYS_MAX) {
        *why = "WAIT with 0 or more than 1024 keys";
        return -1;
      }
      req->keys = r.p;
      for (uint32_t i = 0; i < req->nkeys; i++) {
        uint16_t kl;
        field = r.p;
        field_left = r.left;
        ddplug__rd_key(&r, &kl);
        if (r.bad) {
          *why = key_problem(field, field_left);
          return -1;
        }
      }
      req->keys_len = (size_t)(r.p - req->keys);
      break;
    }
    case DDPLUG__STORE_BYE:
      break;
    default:
      *why = "unknown frame type";
      return -1;
  }
#undef KEY_FIELD
  if (r.bad) {
    *why = r.bad == DDPLUG__RD_TOO_BIG ? "value longer than 1 MiB"
                                       : "field beyond the end of the frame";
    return -1;
  }
  if (r.left != 0) {
    *why = "trailing bytes after the last field";
    return -1;
  }
  return 0;
}

int ddplug__store_auth_mac(const void *secret, size_t secret_len,
                           int server_proof,
                           const uint8_t snonce[DDPLUG__STORE_NONCE_LEN],
                           const uint8_t cnonce[DDPLUG__STORE_NONCE_LEN],
                           uint8_t out[DDPLUG__SHA256_LEN]) {
  const char *ctx = server_proof ? DDPLUG__STORE_MAC_SERVER : DDPLUG__STORE_MAC_CLIENT;
  uint8_t nonces[2 * DDPLUG__STORE_NONCE_LEN];
  /* Each side's proof ends with its own nonce. */
  memcpy(nonces, server_proof ? cnonce : snonce, DDPLUG__STORE_NONCE_LEN);
  memcpy(nonces + DDPLUG__STORE_NONCE_LEN, server_proof ? snonce : cnonce,
         DDPLUG__STORE_NONCE_LEN);
  return ddplug__hmac_sha256(secret, secret_len, ctx, strlen(ctx), nonces,
                             sizeof nonces, out);
}

/* ---- frame integrity ----------------------------------------------------- */

int ddplug__store_session_init(ddplug__store_session *s, const void *secret,
                               size_t secret_len,
                               const uint8_t snonce[DDPLUG__STORE_NONCE_LEN],
                               const uint8_t cnonce[DDPLUG__STORE_NONCE_LEN],
                               int server) {
  memset(s, 0, sizeof *s);
  if (secret_len == 0) return 0;
  uint8_t nonces[2 * DDPLUG__STORE_NONCE_LEN];
  memcpy(nonces, snonce, DDPLUG__STORE_NONCE_LEN);
  memcpy(nonces + DDPLUG__STORE_NONCE_LEN, cnonce, DDPLUG__STORE_NONCE_LEN);
  const char *c2s = DDPLUG__STORE_KEY_C2S, *s2c = DDPLUG__STORE_KEY_S2C;
  if (ddplug__hmac_sha256(secret, secret_len, c2s, strlen(c2s), nonces,
                          sizeof nonces, server ? s->key_rx : s->key_tx) != 0 ||
      ddplug__hmac_sha256(secret, secret_len, s2c, strlen(s2c), nonces,
                          sizeof nonces, server ? s->key_tx : s->key_rx) != 0) {
    ddplug__store_session_clear(s);
    return -1;
  }
  s->on = 1;
  return 0;
}

void ddplug__store_session_clear(ddplug__store_session *s) {
  volatile uint8_t *p = (volatile uint8_t *)s;
  for (size_t i = 0; i < sizeof *s; i++) p[i] = 0;
}

int ddplug__store_frame_open(ddplug__store_session *s, const uint8_t *frame,
                             size_t total, size_t *body_len, const char **why) {
  if (total < 4) {
    *why = "frame shorter than its length field";
    return -1;
  }
  if (!s || !s->on) {
    *body_len = total - 4;
    return 0;
  }
  if (total < 4 + DDPLUG__STORE_LEN_MIN + DDPLUG__STORE_TRAILER_LEN) {
    *why = "frame too short to carry its sequence number and MAC";
    return -1;
  }
  uint8_t mac[DDPLUG__STORE_MAC_LEN];
  const uint8_t *tag = frame + total - DDPLUG__STORE_MAC_LEN;
  if (ddplug__hmac_sha256(s->key_rx, sizeof s->key_rx, frame,
                          total - DDPLUG__STORE_MAC_LEN, NULL, 0, mac) != 0) {
    *why = "cannot compute the frame's MAC (out of memory)";
    return -1;
  }
  if (!ddplug__ct_equal(mac, tag, sizeof mac)) {
    *why = "MAC mismatch: the frame was altered or forged";
    return -1;
  }
  const uint8_t *sp = tag - DDPLUG__STORE_SEQ_LEN;
  uint64_t seq = (uint64_t)ddplug__store_get_u32be(sp) << 32 |
                 ddplug__store_get_u32be(sp + 4);
  if (seq != s->seq_rx) {
    *why = seq < s->seq_rx ? "sequence number already seen: a replayed frame"
                           : "sequence number ahead of the expected one: a frame was dropped";
    return -1;
  }
  s->seq_rx++;
  *body_len = total - 4 - DDPLUG__STORE_TRAILER_LEN;
  return 0;
}

int ddplug__store_parse_int(const uint8_t *s, size_t len, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (len > 0 && s[0] == '-') {
    neg = 1;
    i = 1;
  }
  if (i == len || len > 20) return -1;
  /* Accumulate as a negative number: its range includes INT64_MIN. */
  int64_t v = 0;
  for (; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    int d = s[i] - '0';
    if (v < (INT64_MIN + d) / 10) return -1;
    v = v * 10 - d;
  }
  if (!neg) {
    if (v == INT64_MIN) return -1;
    v = -v;
  }
  *out = v;
  return 0;
}
