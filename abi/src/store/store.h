/*
 * store.h — the store layer's header: internal declarations of the
 * rendezvous store (not installed). Depends on base/.
 * The module map of abi/src/store/:
 *   crypto.c        HMAC-SHA256 and the constant-time compare (libcrypto)
 *   proto.c         the wire format (documented there), frame encoding and
 *                   request/reply decoding — pure functions, no sockets
 *   net.c           addresses, sockets, connect/send/recv with deadlines
 *   table.c         the server's key table with parked GET/WAIT waiters
 *   server.c        the server: one background thread, epoll, every client
 *   client.c        the client: ddplug_store_* calls on one connection
 *   torch_client.c  a minimal client of torch's TCPStore (torchrun's agent)
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_STORE_H
#define DDPLUG_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "base/base.h"
#include "ddplug/store.h"

/* ---- HMAC-SHA256 and constant-time compare (crypto.c) --------------------- */

#define DDPLUG__SHA256_LEN 32

/* HMAC-SHA256(key, msg1 || msg2) into out (libcrypto); msg2 may be NULL
 * with len2 == 0, key may be empty. 0, or -1 when libcrypto failed (out of
 * memory): out is then all zeros, which no peer accepts. Thread-safe. */
int ddplug__hmac_sha256(const void *key, size_t key_len, const void *msg1,
                        size_t len1, const void *msg2, size_t len2,
                        uint8_t out[DDPLUG__SHA256_LEN]);
/* 1 if a[0..n) == b[0..n), in time independent of where they differ
 * (CRYPTO_memcmp). */
int ddplug__ct_equal(const void *a, const void *b, size_t n);

/* ---- wire format (proto.c) ----------------------------------------- */

#define DDPLUG__STORE_PROTO_VERSION 2
#define DDPLUG__STORE_KEY_MAX 255u
#define DDPLUG__STORE_VALUE_MAX (1024u * 1024u)
#define DDPLUG__STORE_WAIT_KEYS_MAX 1024u
#define DDPLUG__STORE_NONCE_LEN 32
/* Frame header: u32 length, u8 version, u8 type, u32 request id. */
#define DDPLUG__STORE_HDR_LEN 10
/* After the handshake of a connection with a secret, every frame ends with
 * a u64 sequence number and a MAC over the frame (see proto.c). */
#define DDPLUG__STORE_SEQ_LEN 8u
#define DDPLUG__STORE_MAC_LEN 32u
#define DDPLUG__STORE_TRAILER_LEN (DDPLUG__STORE_SEQ_LEN + DDPLUG__STORE_MAC_LEN)
/* The length field counts the bytes after itself: at least version, type
 * and id; at most a compare-set of two maximal values plus its fields and
 * the trailer. */
#define DDPLUG__STORE_LEN_MIN 6u
#define DDPLUG__STORE_LEN_MAX \
  (2u * DDPLUG__STORE_VALUE_MAX + 1024u + DDPLUG__STORE_TRAILER_LEN)
/* The length field of an AUTH frame: the largest frame a server reads
 * from a connection that has not authenticated yet. */
#define DDPLUG__STORE_AUTH_LEN (6u + 1u + DDPLUG__STORE_NONCE_LEN + DDPLUG__SHA256_LEN)

/* Frame types. Requests go client -> server, the others server -> client. */
enum {
  DDPLUG__STORE_AUTH = 0x01,
  DDPLUG__STORE_SET = 0x02,
  DDPLUG__STORE_GET = 0x03,
  DDPLUG__STORE_ADD = 0x04,
  DDPLUG__STORE_CAS = 0x05,
  DDPLUG__STORE_DELETE = 0x06,
  DDPLUG__STORE_WAIT = 0x07,
  DDPLUG__STORE_ON_DISCONNECT = 0x08,
  DDPLUG__STORE_BYE = 0x09,
  DDPLUG__STORE_CHALLENGE = 0x80,
  DDPLUG__STORE_REPLY = 0x81
};

/* Reply codes (first byte of a REPLY body). */
enum {
  DDPLUG__STORE_R_OK = 0,
  DDPLUG__STORE_R_TIMEOUT = 1,     /* GET/WAIT: keys still missing       */
  DDPLUG__STORE_R_NOT_INTEGER = 2, /* ADD: the value is not an integer   */
  DDPLUG__STORE_R_OVERFLOW = 3,    /* ADD: the sum leaves int64          */
  DDPLUG__STORE_R_REFUSED = 4      /* AUTH: refused (reason byte follows) */
};

/* Why AUTH was refused (byte after DDPLUG__STORE_R_REFUSED). */
enum {
  DDPLUG__STORE_REFUSE_NO_SECRET = 1,   /* server has one, client none  */
  DDPLUG__STORE_REFUSE_BAD_MAC = 2,     /* both have one; they differ   */
  DDPLUG__STORE_REFUSE_UNEXPECTED = 3   /* client has one, server none  */
};

/* Context strings bound into the authentication MACs, so a client MAC can
 * never be replayed as a server MAC or the other way round. */
#define DDPLUG__STORE_MAC_CLIENT "ddplug-store-v2 client"
#define DDPLUG__STORE_MAC_SERVER "ddplug-store-v2 server"
/* ... and into the session keys, one per direction. */
#define DDPLUG__STORE_KEY_C2S "ddplug-store-v2 session client->server"
#define DDPLUG__STORE_KEY_S2C "ddplug-store-v2 session server->client"

/* One side of an authenticated connection's frame protection: when `on`
 * (the handshake used a secret), every frame sent carries seq_tx and a MAC
 * under key_tx, and every frame received must carry seq_rx and a valid MAC
 * under key_rx. */
typedef struct ddplug__store_session {
  int on;
  uint8_t key_tx[DDPLUG__SHA256_LEN];
  uint8_t key_rx[DDPLUG__SHA256_LEN];
  uint64_t seq_tx, seq_rx;
} ddplug__store_session;

/* Derive both directions' keys from the secret and the handshake's nonces
 * (server: 1 on the server's side) and turn the session on; a secret of
 * length 0 leaves it off. 0, or -1 (libcrypto failed). */
int ddplug__store_session_init(ddplug__store_session *s, const void *secret,
                               size_t secret_len,
                               const uint8_t snonce[DDPLUG__STORE_NONCE_LEN],
                               const uint8_t cnonce[DDPLUG__STORE_NONCE_LEN],
                               int server);
/* Forget the keys. */
void ddplug__store_session_clear(ddplug__store_session *s);

/* A growable byte buffer for building frames. Allocation failure is sticky:
 * `failed` is set and later appends do nothing. */
typedef struct ddplug__sbuf {
  uint8_t *data;
  size_t len;
  size_t cap;
  size_t frame_start; /* offset of the frame being built */
  int failed;
} ddplug__sbuf;

void ddplug__sbuf_free(ddplug__sbuf *b);
/* Make room for n more bytes; 0 on success, -1 (and failed) otherwise. */
int ddplug__sbuf_reserve(ddplug__sbuf *b, size_t n);
void ddplug__sbuf_put(ddplug__sbuf *b, const void *data, size_t n);
void ddplug__sbuf_u8(ddplug__sbuf *b, uint8_t v);
void ddplug__sbuf_u16(ddplug__sbuf *b, uint16_t v);
void ddplug__sbuf_u32(ddplug__sbuf *b, uint32_t v);
void ddplug__sbuf_i64(ddplug__sbuf *b, int64_t v);
/* u16 length + bytes. */
void ddplug__sbuf_key(ddplug__sbuf *b, const void *key, size_t len);
/* u32 length + bytes. */
void ddplug__sbuf_value(ddplug__sbuf *b, const void *value, size_t len);
/* Start a frame (header with a placeholder length) / patch its length. */
void ddplug__sbuf_frame_begin(ddplug__sbuf *b, uint8_t type, uint32_t id);
void ddplug__sbuf_frame_end(ddplug__sbuf *b);
/* End the frame like ddplug__sbuf_frame_end; with a session that is on,
 * first append its sequence number and MAC (and count it). s may be NULL. */
void ddplug__sbuf_frame_seal(ddplug__sbuf *b, ddplug__store_session *s);
/* Drop the first n bytes (already sent). */
void ddplug__sbuf_consume(ddplug__sbuf *b, size_t n);

/* A bounds-checked reader over a received frame body. Reading past the end
 * sets `bad` (1, or DDPLUG__RD_TOO_BIG for a value over 1 MiB) and yields
 * zeros/NULL from then on. */
typedef struct ddplug__rd {
  const uint8_t *p;
  size_t left;
  int bad;
} ddplug__rd;
#define DDPLUG__RD_TOO_BIG 2

uint8_t ddplug__rd_u8(ddplug__rd *r);
uint16_t ddplug__rd_u16(ddplug__rd *r);
uint32_t ddplug__rd_u32(ddplug__rd *r);
int64_t ddplug__rd_i64(ddplug__rd *r);
const uint8_t *ddplug__rd_bytes(ddplug__rd *r, size_t n);
/* A u16-length key; checks 1..255 bytes and no NUL (sets bad otherwise). */
const uint8_t *ddplug__rd_key(ddplug__rd *r, uint16_t *len);
/* A u32-length value; checks <= 1 MiB (sets bad otherwise). */
const uint8_t *ddplug__rd_value(ddplug__rd *r, uint32_t *len);

uint32_t ddplug__store_get_u32be(const uint8_t *p);

/* A decoded request. Pointers point into the frame; nothing is owned. */
typedef struct ddplug__store_req {
  uint8_t type;
  uint32_t id;
  const uint8_t *key; /* SET GET ADD CAS DELETE ON_DISCONNECT */
  uint16_t klen;
  const uint8_t *value; /* SET ON_DISCONNECT; CAS: desired */
  uint32_t vlen;
  int expect_present;        /* CAS: 0 = expect the key absent */
  const uint8_t *expected;   /* CAS */
  uint32_t elen;
  int64_t delta;             /* ADD */
  uint32_t timeout_ms;       /* GET WAIT */
  uint32_t nkeys;            /* WAIT */
  const uint8_t *keys;       /* WAIT: nkeys encoded keys, already checked */
  size_t keys_len;
  uint8_t has_secret;        /* AUTH */
  const uint8_t *nonce;      /* AUTH: client nonce */
  const uint8_t *mac;        /* AUTH: client MAC */
} ddplug__store_req;

/* Decode one request frame: frame[0..len) starts at the version byte (the
 * length field already stripped). On failure returns -1 and *why names the
 * problem ("unknown frame type 0x42", "key of 300 bytes", ...). Never reads
 * outside frame[0..len). */
int ddplug__store_decode_request(const uint8_t *frame, size_t len,
                                 ddplug__store_req *req, const char **why);
/* Check one whole received frame, frame[0..total) from its length field
 * (total = 4 + the length field): with a session that is on, its sequence
 * number must be the next expected one and its MAC valid (then it is
 * counted). Returns 0 and *body_len, the length to decode from frame + 4
 * (the trailer removed), or -1 and *why ("MAC mismatch", "sequence number
 * 7, expected 5", "frame too short for its MAC"). Pure; never reads outside
 * frame[0..total). */
int ddplug__store_frame_open(ddplug__store_session *s, const uint8_t *frame,
                             size_t total, size_t *body_len, const char **why);
/* Iterate the keys of a decoded WAIT (already validated by decode). */
const uint8_t *ddplug__store_next_key(ddplug__rd *r, uint16_t *len);

/* The handshake MACs (see the wire format in proto.c): the client's
 * proof (server_proof 0) = HMAC(secret, "ddplug-store-v1 client" || snonce
 * || cnonce); the server's (1) = HMAC(secret, "ddplug-store-v1 server" ||
 * cnonce || snonce). */
int ddplug__store_auth_mac(const void *secret, size_t secret_len,
                           int server_proof,
                           const uint8_t snonce[DDPLUG__STORE_NONCE_LEN],
                           const uint8_t cnonce[DDPLUG__STORE_NONCE_LEN],
                           uint8_t out[DDPLUG__SHA256_LEN]);

/* Parse a whole decimal int64 ("-12"; no spaces, no '+'): 0 or -1. */
int ddplug__store_parse_int(const uint8_t *s, size_t len, int64_t *out);

/* ---- sockets (net.c) ----------------------------------------------- */

/* "H:P" or "[H]:P" (IPv6 literal) into buf. */
void ddplug__store_format_where(char *buf, size_t cap, const char *host,
                                int port);
/* "a.b.c.d:P" / "[v6]:P" of a socket address, for logs. */
void ddplug__store_format_sockaddr(char *buf, size_t cap,
                                   const struct sockaddr *sa);
/* getaddrinfo for a TCP host:port (passive: for bind). Returns its code;
 * on success *res is freed with freeaddrinfo. May block in the resolver. */
struct addrinfo;
int ddplug__store_resolve(const char *host, int port, int passive,
                          struct addrinfo **res);
/* Non-blocking, close-on-exec, TCP_NODELAY and keepalive on fd. */
int ddplug__store_tune_socket(int fd);
/* Fill buf with n random bytes (getrandom, then /dev/urandom). 0 or -1. */
int ddplug__store_random(void *buf, size_t n);
/* Send all of b[0..n) on a non-blocking fd before deadline_ns.
 * 0 on success; -1 with *err = errno (ETIMEDOUT at the deadline). */
int ddplug__store_send_all(int fd, const void *b, size_t n,
                           uint64_t deadline_ns, int *err);
/* Receive exactly n bytes into b on a non-blocking fd before deadline_ns.
 * 0 on success; -1 with *err = errno (ETIMEDOUT at the deadline,
 * ECONNRESET when the peer closed the connection first). */
int ddplug__store_recv_all(int fd, void *b, size_t n, uint64_t deadline_ns,
                           int *err);
/* One connection attempt to every address of host:port before deadline_ns:
 * the connected fd (non-blocking, tuned), or -1 with *err (an errno) or
 * *gai (a getaddrinfo error, then *err is 0 unless EAI_SYSTEM). */
int ddplug__store_tcp_connect(const char *host, int port, uint64_t deadline_ns,
                              int *err, int *gai);
/* Connect to host:port, retrying while nothing accepts (10 ms doubling to
 * 250 ms) until deadline_ns: the fd, or -1 with why[] saying the last
 * reason. *attempts counts the tries. */
int ddplug__store_tcp_connect_retry(const char *host, int port,
                                    uint64_t deadline_ns, int *attempts,
                                    char *why, size_t why_cap);
/* Wait until fd is readable before deadline_ns: 1 readable, 0 deadline,
 * -1 with *err = errno. */
int ddplug__store_wait_readable(int fd, uint64_t deadline_ns, int *err);
/* Same for writable (a connecting socket is writable once it is done). */
int ddplug__store_wait_writable(int fd, uint64_t deadline_ns, int *err);

/* ---- torch.distributed's TCPStore (torch_client.c) ------------------------ */

/* A client of torchrun's agent store, only to publish and find ddplug's
 * store port under torchrun (TORCHELASTIC_USE_AGENT_STORE=True). Every call
 * is bounded by deadline_ns; errors are set in the thread's last error. */
typedef struct ddplug__tstore ddplug__tstore;
int ddplug__tstore_connect(const char *host, int port, uint64_t deadline_ns,
                           ddplug__tstore **out);
int ddplug__tstore_set(ddplug__tstore *ts, const char *key, const void *val,
                       size_t len, uint64_t deadline_ns);
/* Wait until key exists, then read it as text into out[cap] (NUL added). */
int ddplug__tstore_wait_get(ddplug__tstore *ts, const char *key, char *out,
                            size_t cap, uint64_t deadline_ns);
void ddplug__tstore_close(ddplug__tstore *ts);

/* ---- key table with waiters (table.c) ------------------------------ */

typedef struct ddplug__store_table ddplug__store_table;
typedef struct ddplug__store_waiter ddplug__store_waiter;

/* Called when a waiter's keys are all present (ready) or when it expires;
 * the callback sends the reply and must call ddplug__store_waiter_free. */
typedef void (*ddplug__store_ready_fn)(void *ctx, ddplug__store_waiter *w);

ddplug__store_table *ddplug__store_table_new(ddplug__store_ready_fn ready,
                                             void *ctx);
/* Frees every key and waiter (without calling ready). */
void ddplug__store_table_free(ddplug__store_table *t);
/* The value of key or NULL if absent; *len gets its length. The pointer is
 * valid until the key changes. */
const uint8_t *ddplug__store_table_get(ddplug__store_table *t,
                                       const uint8_t *key, size_t klen,
                                       uint32_t *len);
/* Set key (copying value); wakes waiters that become ready. 0 or -1 (out of
 * memory: nothing changed). */
int ddplug__store_table_set(ddplug__store_table *t, const uint8_t *key,
                            size_t klen, const uint8_t *value, uint32_t vlen);
/* Remove key; returns 1 if it existed. */
int ddplug__store_table_delete(ddplug__store_table *t, const uint8_t *key,
                               size_t klen);
/* Number of keys present. */
size_t ddplug__store_table_size(const ddplug__store_table *t);

/* Park a waiter for the nkeys keys encoded in keys[0..keys_len) (u16-length
 * keys as on the wire; GET passes its one key). Returns the waiter, or NULL
 * on out of memory. If every key is present already the waiter is returned
 * with ddplug__store_waiter_missing() == 0 and the caller answers it. */
ddplug__store_waiter *ddplug__store_waiter_park(ddplug__store_table *t,
                                                const uint8_t *keys,
                                                size_t keys_len,
                                                uint32_t nkeys,
                                                uint64_t deadline_ns,
                                                void *owner, uint32_t id,
                                                uint8_t type);
void ddplug__store_waiter_free(ddplug__store_table *t, ddplug__store_waiter *w);
uint32_t ddplug__store_waiter_missing(const ddplug__store_waiter *w);
void *ddplug__store_waiter_owner(const ddplug__store_waiter *w);
uint32_t ddplug__store_waiter_id(const ddplug__store_waiter *w);
uint8_t ddplug__store_waiter_type(const ddplug__store_waiter *w);
/* The i-th key of a waiter and whether it is present now. */
const uint8_t *ddplug__store_waiter_key(const ddplug__store_waiter *w,
                                        uint32_t i, uint16_t *len,
                                        int *present);
uint32_t ddplug__store_waiter_nkeys(const ddplug__store_waiter *w);
/* Free every waiter whose owner is `owner` (a closed connection). */
void ddplug__store_table_drop_owner(ddplug__store_table *t, void *owner);
/* Pass every waiter whose deadline is <= now to the ready callback (with
 * keys still missing). Returns the earliest remaining deadline, or
 * UINT64_MAX if no waiter is parked. */
uint64_t ddplug__store_table_expire(ddplug__store_table *t, uint64_t now_ns);

/* ---- server internals (server.c) ----------------------------------- */

/* How long a new connection may take to authenticate before the server
 * drops it (default 30 s); applies to connections accepted afterwards.
 * ms <= 0 is ignored. Thread-safe. */
void ddplug__store_server_set_handshake_timeout(ddplug_store_server *srv,
                                               int64_t ms);

/* Connections open right now (authenticated or not). Thread-safe. */
size_t ddplug__store_server_connections(const ddplug_store_server *srv);

/* ---- client internals (client.c) ----------------------------------- */

/* The timeout used for DDPLUG_TIMEOUT_DEFAULT and by the calls that take no
 * timeout (set, add, compare_set, delete, on_disconnect), until changed. */
#define DDPLUG__STORE_DEFAULT_TIMEOUT_MS ((int64_t)300000)
/* How long a client waits past a GET/WAIT deadline for the server's own
 * TIMEOUT reply (which names the missing keys) before giving up locally. */
#define DDPLUG__STORE_REPLY_GRACE_MS ((int64_t)500)

/* Change st's default timeout (the runtime applies rendezvous.timeout_s).
 * ms must be > 0. Thread-safe. */
int ddplug__store_set_default_timeout(ddplug_store *st, int64_t ms);
/* ddplug_store_compare_set bounded by its own timeout_ms (the handle's
 * lock included) instead of the default: for failure paths, where the
 * store may not answer at all. */
int ddplug__store_compare_set_within(ddplug_store *st, const char *key,
                                     const void *expected, uint64_t elen,
                                     const void *desired, uint64_t dlen,
                                     int *swapped, int64_t timeout_ms);
/* ddplug_store_get waiting at most grace_ms (instead of 500 ms) past
 * timeout_ms for the server's answer: for probes on failure paths, where
 * the server may not answer at all. */
int ddplug__store_get_within(ddplug_store *st, const char *key, int64_t timeout_ms,
                             int64_t grace_ms, void **value, uint64_t *len);
/* Close without saying goodbye and free st; never waits. The server then
 * applies this connection's disconnect keys (set only if still absent).
 * For a failed run: the goodbye could wait for a store that no longer
 * answers. No other thread may use st. */
void ddplug__store_close_now(ddplug_store *st);

#endif /* DDPLUG_STORE_H */
