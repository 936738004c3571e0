/*
 * fuzz-store-frames.c — libFuzzer target for the rendezvous store's input
 * path without sockets: the input is cut into frames exactly as the server
 * does (u32 length, bounds), each frame is checked by the integrity layer
 * (ddplug__store_frame_open) and decoded, and the decoded requests are
 * applied to a key table (set, delete, add's integer parsing, parked
 * GET/WAIT waiters on a fake clock, expiry). The input's first byte picks
 * the mode: bit 0 set, every frame is first sealed under a session (a
 * sequence number and a MAC, as after a handshake with a secret) and must
 * then open; bit 1 also set, one byte of each sealed frame is changed
 * (where the next input byte says) and the frame must be refused — the
 * target aborts if a changed frame opens or an intact one does not. Built
 * with clang (tests/cmake/store.cmake); run e.g.
 * `fuzz-store-frames -max_total_time=60`.
 * The gcc build covers the same code with the seeded fuzz cases in
 * tests/c/test-store-proto.c and tests/c/test-store-robust.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fuzz_ctx {
  ddplug__store_table *t;
  unsigned answered;
} fuzz_ctx;

static void on_ready(void *p, ddplug__store_waiter *w) {
  fuzz_ctx *c = p;
  /* Read what the server would put in its reply. */
  for (uint32_t i = 0; i < ddplug__store_waiter_nkeys(w); i++) {
    uint16_t klen;
    int present;
    const uint8_t *k = ddplug__store_waiter_key(w, i, &klen, &present);
    uint32_t vlen;
    if (present && !ddplug__store_table_get(c->t, k, klen, &vlen)) abort();
  }
  c->answered++;
  ddplug__store_waiter_free(c->t, w);
}

/* Seal frame[0..4+flen) under tx, change one byte if asked, and open it
 * under rx into *out (ddplug__malloc'ed); returns the body length or -1. */
static long seal_and_open(ddplug__store_session *tx, ddplug__store_session *rx,
                          const uint8_t *frame, uint32_t flen, int flip, uint8_t where,
                          uint8_t **out) {
  ddplug__sbuf b = {0};
  ddplug__sbuf_frame_begin(&b, frame[5], ddplug__store_get_u32be(frame + 6));
  if (flen > 6) ddplug__sbuf_put(&b, frame + 10, flen - 6);
  if (b.data) b.data[4] = frame[4]; /* keep the input's version byte */
  ddplug__sbuf_frame_seal(&b, tx);
  if (b.failed) {
    ddplug__sbuf_free(&b);
    return -2;
  }
  if (flip) b.data[where % b.len] ^= (uint8_t)(1u << (where % 8));
  size_t body = 0;
  const char *why;
  int rc = ddplug__store_frame_open(rx, b.data, b.len, &body, &why);
  if (rc != 0 && !flip) abort(); /* an intact sealed frame must open */
  if (rc == 0 && flip) abort();  /* a changed one must not */
  if (rc != 0) {
    ddplug__sbuf_free(&b);
    return -1;
  }
  *out = b.data;
  return (long)body;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int sealed = data[0] & 1, flip = sealed && (data[0] & 2);
  data++;
  size--;
  ddplug__store_session tx, rx;
  static const uint8_t sn[DDPLUG__STORE_NONCE_LEN] = {1}, cn[DDPLUG__STORE_NONCE_LEN] = {2};
  if (ddplug__store_session_init(&tx, "s3cret", 6, sn, cn, 0) != 0 ||
      ddplug__store_session_init(&rx, "s3cret", 6, sn, cn, 1) != 0)
    return 0;
  fuzz_ctx c = {0};
  c.t = ddplug__store_table_new(on_ready, &c);
  if (!c.t) return 0;
  uint64_t now = 1;
  int owner;
  size_t pos = 0;
  while (size - pos >= 4) {
    uint32_t flen = ddplug__store_get_u32be(data + pos);
    if (flen < DDPLUG__STORE_LEN_MIN || flen > DDPLUG__STORE_LEN_MAX) break;
    if (size - pos - 4 < flen) break;
    const uint8_t *frame = data + pos + 4;
    uint8_t *opened = NULL;
    size_t body = flen;
    if (sealed) {
      uint8_t where = size - pos - 4 > flen ? data[pos + 4 + flen] : 0;
      long n = seal_and_open(&tx, &rx, data + pos, flen, flip, where, &opened);
      if (n == -2) break;
      if (n < 0) {
        pos += 4 + (size_t)flen;
        continue;
      }
      frame = opened + 4;
      body = (size_t)n;
    } else {
      size_t inner = 0;
      const char *why;
      ddplug__store_session off = {0};
      if (ddplug__store_frame_open(&off, data + pos, 4 + (size_t)flen, &inner, &why) != 0 ||
          inner != flen)
        abort(); /* without a session a frame passes unchanged */
    }
    ddplug__store_req q;
    const char *why;
    int bad = ddplug__store_decode_request(frame, body, &q, &why) != 0;
    if (bad) {
      ddplug__free(opened);
      break;
    }
    pos += 4 + (size_t)flen;
    uint32_t vlen;
    const uint8_t *v;
    int64_t n;
    switch (q.type) {
      case DDPLUG__STORE_SET:
      case DDPLUG__STORE_ON_DISCONNECT:
        ddplug__store_table_set(c.t, q.key, q.klen, q.value, q.vlen);
        break;
      case DDPLUG__STORE_DELETE:
        ddplug__store_table_delete(c.t, q.key, q.klen);
        break;
      case DDPLUG__STORE_ADD:
        v = ddplug__store_table_get(c.t, q.key, q.klen, &vlen);
        if (v && ddplug__store_parse_int(v, vlen, &n) == 0)
          ddplug__store_table_set(c.t, q.key, q.klen, (const uint8_t *)"1", 1);
        break;
      case DDPLUG__STORE_CAS:
        v = ddplug__store_table_get(c.t, q.key, q.klen, &vlen);
        if (q.expect_present ? (v && vlen == q.elen && !memcmp(v, q.expected, vlen))
                             : !v)
          ddplug__store_table_set(c.t, q.key, q.klen, q.value, q.vlen);
        break;
      case DDPLUG__STORE_GET:
        if (q.timeout_ms)
          ddplug__store_waiter_park(c.t, q.key - 2, (size_t)q.klen + 2, 1,
                                    now + q.timeout_ms % 64, &owner, q.id, q.type);
        break;
      case DDPLUG__STORE_WAIT:
        if (q.timeout_ms)
          ddplug__store_waiter_park(c.t, q.keys, q.keys_len, q.nkeys,
                                    now + q.timeout_ms % 64, &owner, q.id, q.type);
        break;
      case DDPLUG__STORE_BYE:
        ddplug__store_table_drop_owner(c.t, &owner);
        break;
      default:
        break;
    }
    now += 8;
    ddplug__store_table_expire(c.t, now);
    ddplug__free(opened);
  }
  ddplug__store_table_free(c.t);
  return 0;
}
