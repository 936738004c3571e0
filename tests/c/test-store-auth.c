/* test-store-auth.c — the store's cryptography and the integrity of its
 * frames: HMAC-SHA256 (libcrypto) against the RFC 4231 vectors, the
 * constant-time compare, a sealed frame that is altered, replayed, dropped
 * or reordered is refused with the reason, and on a live connection with a
 * secret an on-path attacker (a relay between client and server) who flips
 * one byte after the handshake makes the receiving side close the
 * connection and say why — in either direction — while the same relay left
 * alone changes nothing. */
#include <pthread.h>
#include <stdatomic.h>

#include "store-testlib.h"

static void hex(const uint8_t *d, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_hmac(const void *key, size_t klen, const void *msg, size_t mlen,
                       const char *want, size_t want_bytes) {
  uint8_t d[32], d2[32];
  char h[65];
  CHECK_EQ_INT(ddplug__hmac_sha256(key, klen, msg, mlen, NULL, 0, d), 0);
  hex(d, want_bytes, h);
  CHECK_EQ_STR(h, want);
  /* Splitting the message over msg1/msg2 gives the same MAC. */
  size_t half = mlen / 2;
  CHECK_EQ_INT(ddplug__hmac_sha256(key, klen, msg, half, (const uint8_t *)msg + half,
                                   mlen - half, d2),
               0);
  CHECK(memcmp(d, d2, 32) == 0);
}

TEST(hmac_sha256_rfc4231_vectors) {
  uint8_t k[131], m[50];
  memset(k, 0x0b, 20);
  check_hmac(k, 20, "Hi There", 8,
             "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32);
  check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32);
  memset(k, 0xaa, 20);
  memset(m, 0xdd, 50);
  check_hmac(k, 20, m, 50,
             "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32);
  memset(k, 0x0c, 20);
  check_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b", 16);
  memset(k, 0xaa, 131);
  const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  check_hmac(k, 131, t6, strlen(t6),
             "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32);
}

TEST(constant_time_compare) {
  CHECK(ddplug__ct_equal("abcd", "abcd", 4));
  CHECK(!ddplug__ct_equal("abcd", "abce", 4));
  CHECK(!ddplug__ct_equal("xbcd", "abcd", 4));
  CHECK(ddplug__ct_equal("", "", 0));
}

/* ---- sealed frames without sockets --------------------------------------- */

typedef struct pair {
  ddplug__store_session client, server;
} pair;

static void make_pair(pair *p, const char *secret) {
  uint8_t sn[32], cn[32];
  memset(sn, 1, sizeof sn);
  memset(cn, 2, sizeof cn);
  CHECK_EQ_INT(ddplug__store_session_init(&p->client, secret, strlen(secret), sn, cn, 0), 0);
  CHECK_EQ_INT(ddplug__store_session_init(&p->server, secret, strlen(secret), sn, cn, 1), 0);
}

/* A SET frame of key k sealed by the client side. */
static void sealed_set(ddplug__sbuf *b, pair *p, const char *k) {
  b->len = 0;
  ddplug__sbuf_frame_begin(b, DDPLUG__STORE_SET, 7);
  ddplug__sbuf_key(b, k, strlen(k));
  ddplug__sbuf_value(b, "v", 1);
  ddplug__sbuf_frame_seal(b, &p->client);
  CHECK(!b->failed);
}

static int open_frame(pair *p, const ddplug__sbuf *b, const char **why) {
  uint8_t copy[512];
  memcpy(copy, b->data, b->len);
  size_t body = 0;
  int rc = ddplug__store_frame_open(&p->server, copy, b->len, &body, why);
  if (rc == 0) {
    ddplug__store_req q;
    CHECK_EQ_INT(ddplug__store_decode_request(copy + 4, body, &q, why), 0);
    CHECK_EQ_INT(q.type, DDPLUG__STORE_SET);
  }
  return rc;
}

TEST(a_sealed_frame_that_is_altered_replayed_or_lost_is_refused) {
  pair p;
  make_pair(&p, "s3cret");
  ddplug__sbuf f0 = {0}, f1 = {0}, f2 = {0};
  sealed_set(&f0, &p, "a");
  sealed_set(&f1, &p, "b");
  sealed_set(&f2, &p, "c");
  CHECK_EQ_INT(f0.len, 4 + 6 + 2 + 1 + 4 + 1 + DDPLUG__STORE_TRAILER_LEN);
  const char *why = NULL;
  CHECK_EQ_INT(open_frame(&p, &f0, &why), 0);
  /* Replayed: the MAC is right, the sequence number already seen. */
  CHECK_EQ_INT(open_frame(&p, &f0, &why), -1);
  CHECK_CONTAINS(why, "already seen");
  /* Every single-bit change anywhere, length field included, is caught. */
  for (size_t i = 0; i < f1.len; i++) {
    f1.data[i] ^= 0x10;
    CHECK_MSG(open_frame(&p, &f1, &why) == -1, "a flipped byte %zu was accepted", i);
    f1.data[i] ^= 0x10;
  }
  /* A frame lost on the way: the next one is ahead of the expected. */
  CHECK_EQ_INT(open_frame(&p, &f2, &why), -1);
  CHECK_CONTAINS(why, "ahead of the expected");
  CHECK_EQ_INT(open_frame(&p, &f1, &why), 0);
  CHECK_EQ_INT(open_frame(&p, &f2, &why), 0);
  /* The other direction's key does not verify this direction's frames. */
  pair q;
  make_pair(&q, "s3cret");
  ddplug__sbuf r = {0};
  ddplug__sbuf_frame_begin(&r, DDPLUG__STORE_REPLY, 1);
  ddplug__sbuf_u8(&r, 0);
  ddplug__sbuf_frame_seal(&r, &q.server);
  size_t body;
  uint8_t copy[128];
  memcpy(copy, r.data, r.len);
  CHECK_EQ_INT(ddplug__store_frame_open(&q.server, copy, r.len, &body, &why), -1);
  CHECK_CONTAINS(why, "MAC mismatch");
  CHECK_EQ_INT(ddplug__store_frame_open(&q.client, copy, r.len, &body, &why), 0);
  /* Another secret, same nonces: nothing verifies. */
  pair other;
  make_pair(&other, "s3cre7");
  sealed_set(&f0, &p, "a");
  CHECK_EQ_INT(open_frame(&other, &f0, &why), -1);
  ddplug__sbuf_free(&f0);
  ddplug__sbuf_free(&f1);
  ddplug__sbuf_free(&f2);
  ddplug__sbuf_free(&r);
}

/* ---- a relay on the path -------------------------------------------------- */

/* Forwards bytes between a client and the server. After `arm` the first
 * chunk in direction `dir` (0: client to server, 1: server to client) gets
 * one byte flipped. */
typedef struct relay {
  int lfd, port, target;
  _Atomic int armed;
  int dir;
  _Atomic int flipped;
  pthread_t th;
} relay;

static void *relay_main(void *arg) {
  relay *r = arg;
  int c = accept(r->lfd, NULL, NULL);
  if (c < 0) return NULL;
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)r->target);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
    close(c);
    close(s);
    return NULL;
  }
  int fds[2] = {c, s};
  for (;;) {
    struct pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
    if (poll(p, 2, 10000) <= 0) break;
    int done = 0;
    for (int d = 0; d < 2 && !done; d++) {
      if (!p[d].revents) continue;
      uint8_t buf[65536];
      ssize_t n = recv(fds[d], buf, sizeof buf, 0);
      if (n <= 0) {
        done = 1;
        break;
      }
      if (atomic_load(&r->armed) && d == r->dir && !atomic_exchange(&r->flipped, 1))
        buf[n - 1] ^= 0x01; /* the last byte: inside the MAC */
      raw_send(fds[1 - d], buf, (size_t)n);
    }
    if (done) break;
  }
  close(c);
  close(s);
  return NULL;
}

static void relay_start(relay *r, int target, int dir) {
  memset(r, 0, sizeof *r);
  r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  CHECK(bind(r->lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(r->lfd, 4) == 0);
  CHECK(getsockname(r->lfd, (struct sockaddr *)&a, &len) == 0);
  r->port = ntohs(a.sin_port);
  r->target = target;
  r->dir = dir;
  CHECK(pthread_create(&r->th, NULL, relay_main, r) == 0);
}

static void relay_stop(relay *r) {
  pthread_join(r->th, NULL);
  close(r->lfd);
}

static char g_warned[2048];
static void keep_warnings(void *user, int level, int rank, const char *line) {
  (void)user;
  (void)rank;
  if (level <= DDPLUG_LOG_WARN && !g_warned[0])
    snprintf(g_warned, sizeof g_warned, "%s", line);
}

static void tamper(int dir, const char *secret, int expect_caught) {
  g_warned[0] = '\0';
  ddplug_log_set_callback(keep_warnings, NULL);
  ddplug_store_server *srv = st_serve(secret);
  relay r;
  relay_start(&r, ddplug_store_server_port(srv), dir);
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", r.port, secret, 5000, &st));
  CHECK_OK(ddplug_store_set(st, "before", "1", 1));
  atomic_store(&r.armed, 1);
  int rc = ddplug_store_set(st, "after", "22", 2);
  if (!expect_caught) {
    /* Without a secret nothing protects the frames: the flipped byte is in
     * the value, and the server stored it. */
    CHECK_OK(rc);
    st_expect_value(st, "after", 1000, dir == 0 ? "23" : "22");
  } else if (dir == 1) {
    CHECK_STATUS(rc, DDPLUG_E_PEER_LOST);
    CHECK_CONTAINS(ddplug_last_error(), "failed its integrity check (MAC mismatch");
    CHECK_CONTAINS(g_warned, "failed its integrity check");
  } else {
    CHECK_STATUS(rc, DDPLUG_E_PEER_LOST);
    CHECK_CONTAINS(ddplug_last_error(), "closed the connection");
    /* The server logged why; it has not stored the altered value. */
    for (int i = 0; i < 100 && !g_warned[0]; i++) ddplug__sleep_ms(10);
    CHECK_CONTAINS(g_warned, "failed its integrity check (MAC mismatch");
    ddplug_store *st2 = st_connect(ddplug_store_server_port(srv), secret);
    void *v = NULL;
    CHECK_STATUS(ddplug_store_get(st2, "after", 0, &v, NULL), DDPLUG_E_TIMEOUT);
    st_expect_value(st2, "before", 0, "1");
    ddplug_store_close(st2);
  }
  CHECK(atomic_load(&r.flipped));
  ddplug_store_close(st);
  relay_stop(&r);
  ddplug_store_server_stop(srv);
  ddplug_log_set_callback(NULL, NULL);
}

TEST(an_altered_request_closes_the_connection_and_is_logged) { tamper(0, "s3cret", 1); }
TEST(an_altered_reply_closes_the_connection_and_is_logged) { tamper(1, "s3cret", 1); }
TEST(without_a_secret_nothing_is_protected) { tamper(0, NULL, 0); }
