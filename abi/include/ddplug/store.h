/*
 * ddplug/store.h — EXPERIMENTAL: the rendezvous store's client and server,
 * as the runtime uses them (served by rank 0 of every run, reached by every
 * rank). Outside the stability promise of ddplug.h and plugin.h: names,
 * arguments and the wire protocol may change in any release, minor ones
 * included. Hosts that need a side channel use ddplug_context_store's "user/"
 * keys; plugins get the store through their host services (plugin.h), which
 * are stable. The conventions of ddplug.h (returns, ownership, blocking,
 * threads) hold here too.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef DDPLUG_DDPLUG_STORE_H
#define DDPLUG_DDPLUG_STORE_H

#include "ddplug/ddplug.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ========================================================================
 * The rendezvous store — a small TCP key-value store served by rank 0 (or an
 * external address). Values are bytes (at most 1 MiB), keys 1..255 bytes.
 * Every blocking call has a timeout: calls with a timeout_ms argument take
 * 0 = do not wait (check once), DDPLUG_TIMEOUT_DEFAULT = the handle's
 * default, > 0 = at most that many ms (clamped to 2^32-1); the others
 * (set, add, compare_set, delete, on_disconnect) wait at most the handle's
 * default timeout, 300 s (for the stores ddplug_open makes: the rendezvous
 * timeout), for the server's answer. A reply may arrive up to 500 ms past
 * the timeout before the call gives up; the timeout includes waiting for
 * another thread's call on the same handle. Optional shared secret: a
 * client that cannot prove it knows the secret is refused (HMAC-SHA256
 * challenge-response both ways), and after the handshake every frame
 * carries a sequence number and a MAC under a key of that connection (no
 * encryption: keys and values travel in clear). Without a secret nothing
 * is authenticated. Before authenticating, a connection gets a fixed few
 * hundred bytes of the server and 5 s; the oldest of too many such
 * connections are dropped (a client dropped during its handshake connects
 * again). A client handle is thread-safe: calls on it run one at a time on
 * its connection. A connection that breaks (server gone, reset, protocol
 * violation, a frame whose MAC or sequence number is wrong) makes every
 * later call on the handle fail with PEER_LOST; it never reconnects. A handle belongs to the process
 * that connected: in a forked child every call fails with INVALID_ARGUMENT.
 * Errors common to the calls: INVALID_ARGUMENT (naming the argument),
 * PEER_LOST ("rendezvous store at H:P closed the connection (did rank 0
 * exit?)"), TIMEOUT, NO_MEMORY; the sentence is in ddplug_last_error() and
 * ddplug_store_error(st). On failure out-parameters are untouched.
 * ======================================================================== */
typedef struct ddplug_store ddplug_store;
typedef struct ddplug_store_server ddplug_store_server;

/* Start a server on addr:port in a background thread (every signal blocked
 * there). addr: NULL or "" (every IPv4 interface), an IPv4/IPv6 literal, or
 * a hostname (resolving it may block as long as the system resolver does).
 * port 0..65535 (0 picks a free port; see ddplug_store_server_port). secret:
 * NULL or "" for none. On success *out is the server (stop it with
 * ddplug_store_server_stop); on failure *out is untouched and nothing is
 * left open: INVALID_ARGUMENT, CONFIG (addr does not resolve), SYSTEM
 * (bind/listen failed, e.g. the port is in use; names H:P), NO_MEMORY.
 * Does not block otherwise. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_serve(const char *addr, int port,
                                  const char *secret,
                                  ddplug_store_server **out);
/* The port srv listens on (the chosen one when started with port 0), 0 for
 * NULL. Never blocks; thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_server_port(const ddplug_store_server *srv);
/* Stop serving: close the listener and every connection (clients then get
 * PEER_LOST; no on_disconnect key is applied), free every key and srv. NULL
 * is a no-op. Blocks only until the server thread has left its loop. Must
 * not race with another call on srv. In a forked child it releases only
 * that process's copies. Since 1.0. */
DDPLUG_API void ddplug_store_server_stop(ddplug_store_server *srv);

/* Connect to the store at addr:port (addr a hostname or IP literal, port
 * 1..65535; secret NULL/"" for none). While nothing accepts the connection,
 * or the server drops it before the handshake completes (a busy server
 * sheds the oldest connections that have not authenticated), it retries
 * (10 ms doubling to 250 ms) until timeout_ms (0: one attempt;
 * DDPLUG_TIMEOUT_DEFAULT: 300 s). On success *out is the handle (release
 * with ddplug_store_close). Errors: INVALID_ARGUMENT, TIMEOUT ("could not
 * connect to the rendezvous store at H:P within N ms ... : <reason>"),
 * CONFIG (secret missing, wrong or unexpected), ABI_MISMATCH (another store
 * protocol version), PEER_LOST (not a ddplug store), NO_MEMORY; nothing is
 * left open. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_connect(const char *addr, int port,
                                    const char *secret, int64_t timeout_ms,
                                    ddplug_store **out);
/* Say goodbye (so the server does not apply this connection's
 * on_disconnect keys), close the connection and free st. Waits at most 2 s
 * for the server's acknowledgement; a broken connection is just closed.
 * NULL is a no-op. No other thread may use st during or after the call.
 * Leaves the thread's last error as it was. Since 1.0. */
DDPLUG_API void ddplug_store_close(ddplug_store *st);

/* Set key to value[0..len) (copied; value may be NULL when len is 0). Wakes
 * every get/wait waiting for key. Waits for the server's acknowledgement
 * (the handle's default timeout). Errors: the common ones. Thread-safe.
 * Since 1.0. */
DDPLUG_API int ddplug_store_set(ddplug_store *st, const char *key,
                                const void *value, uint64_t len);
/* Wait at most timeout_ms until key exists (the wait happens in the server,
 * no polling), then *value receives a copy of its value (release with
 * ddplug_free; NUL-terminated for convenience, the NUL not counted) and
 * *len (may be NULL) its length. Errors: TIMEOUT ("key 'k' was not set
 * within N ms ..."), and the common ones. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_get(ddplug_store *st, const char *key,
                                int64_t timeout_ms, void **value,
                                uint64_t *len);
/* Atomically add delta to the decimal integer at key (absent = 0), store
 * the sum as decimal text and return it in *result (may be NULL).
 * INVALID_ARGUMENT when the value is not a decimal integer or the sum
 * overflows int64 (nothing changes); the common errors. Thread-safe.
 * Since 1.0. */
DDPLUG_API int ddplug_store_add(ddplug_store *st, const char *key,
                                int64_t delta, int64_t *result);
/* Atomically: if key's value equals expected[0..elen) (expected == NULL with
 * elen == 0 means "key absent"; a non-NULL expected with elen 0 expects a
 * present, empty value), set it to desired[0..dlen). *swapped (may be NULL)
 * = 1 if it did. *actual (may be NULL; release with ddplug_free;
 * NUL-terminated) and *alen (may be NULL) receive the value after the
 * operation (NULL and 0 if the key is absent then). On NO_MEMORY the swap
 * may have happened. The common errors. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_compare_set(ddplug_store *st, const char *key,
                                        const void *expected, uint64_t elen,
                                        const void *desired, uint64_t dlen,
                                        int *swapped, void **actual,
                                        uint64_t *alen);
/* Remove key; *existed (may be NULL) = 1 if it was there (a missing key is
 * not an error). Get/wait calls parked on key keep waiting. The common
 * errors. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_delete(ddplug_store *st, const char *key,
                                   int *existed);
/* Wait at most timeout_ms until every one of keys[0..nkeys) exists (nkeys
 * <= 1024; 0 keys succeed at once); the wait happens in the server. On
 * TIMEOUT the last error names the keys still missing ("timed out after
 * 5.0 s waiting for 2 of 4 keys ...; still missing: 'a', 'b'"). The common
 * errors (INVALID_ARGUMENT names the bad key's index). Thread-safe.
 * Since 1.0. */
DDPLUG_API int ddplug_store_wait(ddplug_store *st, const char *const *keys,
                                 uint32_t nkeys, int64_t timeout_ms);
/* Ask the server to set key to value[0..len) (if key is absent then) when
 * this connection ends without ddplug_store_close — the process was killed,
 * crashed or its connection was reset: how peers learn that a process died.
 * At most 1024 registrations (16 MiB) per connection; beyond that the server
 * closes the connection (PEER_LOST). ddplug_store_close drops them all. The
 * common errors. Thread-safe. Since 1.0. */
DDPLUG_API int ddplug_store_on_disconnect(ddplug_store *st, const char *key,
                                          const void *value, uint64_t len);
/* The detail sentence of the last failed call on st ("" if none failed or
 * st is NULL). Owned by st; valid until the next failing call on st or
 * ddplug_store_close. Any thread. Since 1.0. */
DDPLUG_API const char *ddplug_store_error(const ddplug_store *st);

/* The store client of a context (borrowed, lives as long as ctx; NULL for
 * NULL). Keys under "user/" are reserved for the host; the runtime and
 * plugins use other prefixes. Since 1.0 (experimental). */
DDPLUG_API ddplug_store *ddplug_context_store(ddplug_context *ctx);

#ifdef __cplusplus
}
#endif
#endif /* DDPLUG_DDPLUG_STORE_H */
