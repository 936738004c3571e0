/* test-store-proto.c — the store's wire codec and key table, without
 * sockets: every request type round-trips through the encoder and the
 * decoder, a table of malformed frames gives the exact reason, the decoder
 * survives random and mutated input (run under ASan to see out-of-bounds
 * reads), integer parsing, and the table's waiter bookkeeping (readiness,
 * delete re-arming, expiry order, dropping a connection's waiters). */
#include <stdlib.h>

#include "harness.h"
#include "store-fuzzgen.h"
#include "store/store.h"

/* Decode the frame in b (skipping its length field). */
static int decode(const ddplug__sbuf *b, ddplug__store_req *q, const char **why) {
  CHECK(!b->failed && b->len >= 4);
  CHECK_EQ_INT(ddplug__store_get_u32be(b->data), b->len - 4);
  *why = NULL;
  return ddplug__store_decode_request(b->data + 4, b->len - 4, q, why);
}

TEST(every_request_type_round_trips) {
  ddplug__sbuf b = {0};
  ddplug__store_req q;
  const char *why;

  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_SET, 77);
  ddplug__sbuf_key(&b, "key", 3);
  ddplug__sbuf_value(&b, "value", 5);
  ddplug__sbuf_frame_end(&b);
  CHECK_EQ_INT(decode(&b, &q, &why), 0);
  CHECK_EQ_INT(q.type, DDPLUG__STORE_SET);
  CHECK_EQ_INT(q.id, 77);
  CHECK(q.klen == 3 && memcmp(q.key, "key", 3) == 0);
  CHECK(q.vlen == 5 && memcmp(q.value, "value", 5) == 0);

  b.len = 0;
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_GET, 0xfffffffe);
  ddplug__sbuf_u32(&b, 123456);
  ddplug__sbuf_key(&b, "g", 1);
  ddplug__sbuf_frame_end(&b);
  CHECK_EQ_INT(decode(&b, &q, &why), 0);
  CHECK(q.id == 0xfffffffeu && q.timeout_ms == 123456 && q.klen == 1);

  b.len = 0;
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_ADD, 1);
  ddplug__sbuf_key(&b, "n", 1);
  ddplug__sbuf_i64(&b, INT64_MIN);
  ddplug__sbuf_frame_end(&b);
  CHECK_EQ_INT(decode(&b, &q, &why), 0);
  CHECK(q.delta == INT64_MIN);

  b.len = 0;
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_CAS, 2);
  ddplug__sbuf_key(&b, "c", 1);
  ddplug__sbuf_u8(&b, 1);
  ddplug__sbuf_value(&b, "old", 3);
  ddplug__sbuf_value(&b, "", 0);
  ddplug__sbuf_frame_end(&b);
  CHECK_EQ_INT(decode(&b, &q, &why), 0);
  CHECK(q.expect_present == 1 && q.elen == 3 && memcmp(q.expected, "old", 3) == 0);
  CHECK(q.vlen == 0);

  b.len = 0;
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_WAIT, 3);
  ddplug__sbuf_u32(&b, 5);
  ddplug__sbuf_u16(&b, 2);
  ddplug__sbuf_key(&b, "a", 1);
  ddplug__sbuf_key(&b, "bb", 2);
  ddplug__sbuf_frame_end(&b);
  CHECK_EQ_INT(decode(&b, &q, &why), 0);
  CHECK(q.nkeys == 2 && q.keys_len == 7);
  ddplug__rd r = {q.keys, q.keys_len, 0};
  uint16_t kl;
  const uint8_t *k = ddplug__store_next_key(&r, &kl);
  CHECK(kl == 1 && k[0] == 'a');
  k = ddplug__store_next_key(&r, &kl);
  CHECK(kl == 2 && memcmp(k, "bb", 2) == 0 && r.left == 0);

  b.len = 0;
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_BYE, 4);
  ddplug__sbuf_frame_end(&b);
  CHECK_EQ_INT(decode(&b, &q, &why), 0);
  CHECK_EQ_INT(q.type, DDPLUG__STORE_BYE);
  ddplug__sbuf_free(&b);
}

typedef struct bad_frame {
  const char *why;
  uint8_t bytes[40];
  size_t len;
} bad_frame;

/* Frames without their length field: version, type, id(4), body. */
static const bad_frame k_bad[] = {
    {"frame shorter than its header", {2, 2, 0, 0}, 4},
    {"wrong protocol version", {9, 2, 0, 0, 0, 1, 0, 1, 'k', 0, 0, 0, 0}, 13},
    {"unknown frame type", {2, 0x7f, 0, 0, 0, 1}, 6},
    {"unknown frame type", {2, DDPLUG__STORE_REPLY, 0, 0, 0, 1, 0}, 7},
    {"empty key", {2, 6, 0, 0, 0, 1, 0, 0}, 8},
    {"key longer than 255 bytes", {2, 6, 0, 0, 0, 1, 1, 0}, 8},
    {"truncated key", {2, 6, 0, 0, 0, 1, 0, 5, 'a', 'b'}, 10},
    {"truncated key length", {2, 6, 0, 0, 0, 1, 0}, 7},
    {"key contains a NUL byte", {2, 6, 0, 0, 0, 1, 0, 2, 'a', 0}, 10},
    {"trailing bytes after the last field", {2, 6, 0, 0, 0, 1, 0, 1, 'k', 9}, 10},
    {"value longer than 1 MiB", {2, 2, 0, 0, 0, 1, 0, 1, 'k', 0, 0x10, 0, 1}, 13},
    {"field beyond the end of the frame", {2, 2, 0, 0, 0, 1, 0, 1, 'k', 0, 0, 0, 9, 'x'}, 14},
    {"field beyond the end of the frame", {2, 4, 0, 0, 0, 1, 0, 1, 'k', 0, 0, 0}, 12},
    {"bad expect_present flag", {2, 5, 0, 0, 0, 1, 0, 1, 'k', 2}, 10},
    {"WAIT with 0 or more than 1024 keys", {2, 7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}, 12},
    {"WAIT with 0 or more than 1024 keys", {2, 7, 0, 0, 0, 1, 0, 0, 0, 0, 4, 1}, 12},
    {"truncated key length", {2, 7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 1, 'a'}, 15},
    {"bad secret flag", {2, 1, 0, 0, 0, 1, 2}, 7},
    {"field beyond the end of the frame", {2, 1, 0, 0, 0, 1, 0, 1, 2, 3}, 10},
    {"trailing bytes after the last field", {2, 9, 0, 0, 0, 1, 0}, 7},
};

TEST(malformed_frames_give_the_exact_reason) {
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_bad); i++) {
    ddplug__store_req q;
    const char *why = NULL;
    int rc = ddplug__store_decode_request(k_bad[i].bytes, k_bad[i].len, &q, &why);
    CHECK_MSG(rc == -1, "bad frame %zu decoded", i);
    CHECK_MSG(why && strcmp(why, k_bad[i].why) == 0,
              "bad frame %zu: got '%s', want '%s'", i, why ? why : "(null)",
              k_bad[i].why);
  }
}

/* On success every pointer must lie inside the frame and every length
 * within its bound. */
static void check_decoded(const uint8_t *f, size_t len, const ddplug__store_req *q) {
#define INSIDE(p, n) CHECK((p) >= f && (p) + (n) <= f + len)
  if (q->key) {
    INSIDE(q->key, q->klen);
    CHECK(q->klen >= 1 && q->klen <= 255);
    CHECK(memchr(q->key, 0, q->klen) == NULL);
  }
  if (q->value) INSIDE(q->value, q->vlen);
  if (q->expected) INSIDE(q->expected, q->elen);
  CHECK(q->vlen <= DDPLUG__STORE_VALUE_MAX && q->elen <= DDPLUG__STORE_VALUE_MAX);
  if (q->keys) {
    INSIDE(q->keys, q->keys_len);
    CHECK(q->nkeys >= 1 && q->nkeys <= 1024);
  }
#undef INSIDE
}

static void decode_one(const uint8_t *bytes, size_t len, long *ok) {
  /* Copy into an exact-size heap block so ASan sees any overread. */
  uint8_t *f = malloc(len ? len : 1);
  memcpy(f, bytes, len);
  ddplug__store_req q;
  const char *why = NULL;
  if (ddplug__store_decode_request(f, len, &q, &why) == 0) {
    (*ok)++;
    check_decoded(f, len, &q);
  } else {
    CHECK(why != NULL);
  }
  free(f);
}

TEST(decoder_survives_random_and_mutated_input) {
  fuzz_seed(0x9e3779b97f4a7c15ull);
  uint8_t noise[512];
  long ok_noise = 0, ok_mutated = 0;
  for (int iter = 0; iter < 150000; iter++) {
    size_t len = rnd_below(sizeof noise);
    for (size_t i = 0; i < len; i++) noise[i] = (uint8_t)rnd();
    decode_one(noise, len, &ok_noise);
  }
  for (int iter = 0; iter < 150000; iter++) {
    ddplug__sbuf b = {0};
    fuzz_valid(&b);
    if (iter % 4) fuzz_mutate(&b);
    if (b.len >= 4) decode_one(b.data + 4, b.len - 4, &ok_mutated);
    ddplug__sbuf_free(&b);
  }
  dt_note("decoded as valid: %ld of 150000 noise frames, %ld of 150000 "
          "generated/mutated frames", ok_noise, ok_mutated);
  /* A quarter is unmutated: the generator does produce valid frames. */
  CHECK(ok_mutated >= 150000 / 4);
}

TEST(parse_int_is_strict) {
  int64_t v;
  CHECK(ddplug__store_parse_int((const uint8_t *)"42", 2, &v) == 0 && v == 42);
  CHECK(ddplug__store_parse_int((const uint8_t *)"-0", 2, &v) == 0 && v == 0);
  CHECK(ddplug__store_parse_int((const uint8_t *)"9223372036854775807", 19, &v) == 0 &&
        v == INT64_MAX);
  CHECK(ddplug__store_parse_int((const uint8_t *)"-9223372036854775808", 20, &v) == 0 &&
        v == INT64_MIN);
  const char *bad[] = {"", "-", "+1", " 1", "1 ", "1x", "9223372036854775808",
                       "-9223372036854775809", "99999999999999999999", "0x10"};
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(bad); i++)
    CHECK_MSG(ddplug__store_parse_int((const uint8_t *)bad[i], strlen(bad[i]), &v) != 0,
              "'%s' parsed", bad[i]);
  CHECK(ddplug__store_parse_int((const uint8_t *)"12\0", 3, &v) != 0);
}

/* ---- the key table ------------------------------------------------------- */

typedef struct seen {
  int calls;
  uint32_t ids[16];
  uint32_t missing[16];
  ddplug__store_table *t;
} seen;

static void on_ready(void *ctx, ddplug__store_waiter *w) {
  seen *s = ctx;
  if (s->calls < 16) {
    s->ids[s->calls] = ddplug__store_waiter_id(w);
    s->missing[s->calls] = ddplug__store_waiter_missing(w);
  }
  s->calls++;
  ddplug__store_waiter_free(s->t, w);
}

/* Encode keys as a WAIT body does. */
static size_t keys_of(uint8_t *out, const char *const *keys, int n) {
  size_t o = 0;
  for (int i = 0; i < n; i++) {
    size_t l = strlen(keys[i]);
    out[o++] = (uint8_t)(l >> 8);
    out[o++] = (uint8_t)l;
    memcpy(out + o, keys[i], l);
    o += l;
  }
  return o;
}

#define K(s) (const uint8_t *)(s), strlen(s)

/* A table whose ready callback records into s. */
static ddplug__store_table *seen_table(seen *s) {
  memset(s, 0, sizeof *s);
  s->t = ddplug__store_table_new(on_ready, s);
  CHECK(s->t != NULL);
  return s->t;
}

TEST(table_waiters_wake_exactly_when_all_keys_exist) {
  seen s;
  ddplug__store_table *t = seen_table(&s);
  uint8_t enc[64];
  const char *ab[] = {"a", "b"};
  size_t n = keys_of(enc, ab, 2);
  int owner;
  ddplug__store_waiter *w = ddplug__store_waiter_park(t, enc, n, 2, UINT64_MAX - 1,
                                                      &owner, 11, DDPLUG__STORE_WAIT);
  CHECK(w && ddplug__store_waiter_missing(w) == 2);
  CHECK_EQ_INT(ddplug__store_table_size(t), 0); /* watched, not present */
  CHECK_EQ_INT(ddplug__store_table_set(t, K("a"), (const uint8_t *)"1", 1), 0);
  CHECK_EQ_INT(s.calls, 0);
  CHECK_EQ_INT(ddplug__store_table_delete(t, K("a")), 1); /* re-arms */
  CHECK_EQ_INT(ddplug__store_table_set(t, K("b"), (const uint8_t *)"2", 1), 0);
  CHECK_EQ_INT(s.calls, 0);
  CHECK_EQ_INT(ddplug__store_table_set(t, K("b"), (const uint8_t *)"3", 1), 0);
  CHECK_EQ_INT(s.calls, 0); /* overwriting a present key wakes no one */
  CHECK_EQ_INT(ddplug__store_table_set(t, K("a"), NULL, 0), 0);
  CHECK_EQ_INT(s.calls, 1);
  CHECK(s.ids[0] == 11 && s.missing[0] == 0);
  uint32_t len = 9;
  CHECK(ddplug__store_table_get(t, K("a"), &len) != NULL && len == 0);
  CHECK_EQ_INT(ddplug__store_table_size(t), 2);
  CHECK_EQ_INT(ddplug__store_table_delete(t, K("zz")), 0);
  ddplug__store_table_free(t);
}

TEST(table_expiry_is_in_deadline_order_and_drop_owner_frees) {
  seen s;
  ddplug__store_table *t = seen_table(&s);
  uint8_t enc[16];
  const char *x[] = {"x"};
  size_t n = keys_of(enc, x, 1);
  int o1, o2;
  uint64_t deadlines[] = {50, 10, 40, 20, 30, 60};
  for (int i = 0; i < 6; i++)
    CHECK(ddplug__store_waiter_park(t, enc, n, 1, deadlines[i], i % 2 ? &o1 : &o2,
                                    (uint32_t)deadlines[i], DDPLUG__STORE_GET));
  /* The odd ones (deadlines 10, 20, 60) belong to o1: dropped silently. */
  ddplug__store_table_drop_owner(t, &o1);
  CHECK_EQ_INT(s.calls, 0);
  CHECK(ddplug__store_table_expire(t, 5) == 30);
  CHECK_EQ_INT(s.calls, 0);
  CHECK(ddplug__store_table_expire(t, 45) == 50);
  CHECK_EQ_INT(s.calls, 2);
  CHECK(s.ids[0] == 30 && s.ids[1] == 40 && s.missing[0] == 1);
  CHECK(ddplug__store_table_expire(t, 1000) == UINT64_MAX);
  CHECK_EQ_INT(s.calls, 3);
  /* Nothing is left behind for the key nobody set. */
  CHECK_EQ_INT(ddplug__store_table_size(t), 0);
  ddplug__store_table_free(t);
}

TEST(table_many_keys_grow_and_free_with_parked_waiters) {
  seen s;
  ddplug__store_table *t = seen_table(&s);
  char key[32];
  for (int i = 0; i < 5000; i++) {
    int n = snprintf(key, sizeof key, "k/%d", i);
    CHECK_EQ_INT(ddplug__store_table_set(t, (const uint8_t *)key, (size_t)n,
                                         (const uint8_t *)key, (uint32_t)n), 0);
  }
  CHECK_EQ_INT(ddplug__store_table_size(t), 5000);
  for (int i = 0; i < 5000; i += 7) {
    int n = snprintf(key, sizeof key, "k/%d", i);
    uint32_t len;
    const uint8_t *v = ddplug__store_table_get(t, (const uint8_t *)key, (size_t)n, &len);
    CHECK(v && len == (uint32_t)n && memcmp(v, key, len) == 0);
  }
  uint8_t enc[16];
  const char *x[] = {"parked"};
  size_t n = keys_of(enc, x, 1);
  int owner;
  CHECK(ddplug__store_waiter_park(t, enc, n, 1, 100, &owner, 1, DDPLUG__STORE_GET));
  ddplug__store_table_free(t); /* frees the parked waiter too (ASan/valgrind) */
  CHECK_EQ_INT(s.calls, 0);
}
