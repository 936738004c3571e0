/*
 * fuzz-store-frames.c — libFuzzer target for the rendezvous store's input
 * path without sockets: the input is cut into frames exactly as the server
 * does (u32 length, bounds), each frame is decoded, and the decoded
 * requests are applied to a key table (set, delete, add's integer parsing,
 * parked GET/WAIT waiters on a fake clock, expiry). Built only with clang
 * (tests/cmake/store.cmake); run e.g. `fuzz-store-frames -max_total_time=60`.
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
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
    ddplug__store_req q;
    const char *why;
    if (ddplug__store_decode_request(data + pos + 4, flen, &q, &why) != 0) break;
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
  }
  ddplug__store_table_free(c.t);
  return 0;
}
