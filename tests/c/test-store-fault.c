/* test-store-fault.c — the rendezvous store when things go wrong: the
 * server process is SIGKILLed or stopped under blocked clients, secrets are
 * missing, wrong or unexpected, the "server" is an impostor, speaks another
 * protocol version or is no store at all, replies arrive late, and clients
 * die (on_disconnect). */
#include <pthread.h>

#include "store-testlib.h"

/* ---- blocked clients and a dying server ---------------------------------- */

typedef struct blocked_arg {
  int port;
  int use_wait;
  ddplug_store *st;
  int rc;
  double returned_at;
  char err[DDPLUG__ERRMSG_MAX];
} blocked_arg;

static void *blocked_thread(void *p) {
  blocked_arg *a = p;
  if (a->use_wait) {
    const char *keys[] = {"never/1", "never/2"};
    a->rc = ddplug_store_wait(a->st, keys, 2, 60000);
  } else {
    void *v = NULL;
    a->rc = ddplug_store_get(a->st, "never", 60000, &v, NULL);
    ddplug_free(v);
  }
  a->returned_at = st_now_s();
  snprintf(a->err, sizeof a->err, "%s", ddplug_last_error());
  return NULL;
}

static void blocked_process(void *p) {
  blocked_arg *a = p;
  a->st = st_connect(a->port, NULL);
  CHECK_OK(ddplug_store_set(a->st, "child-connected", "1", 1));
  blocked_thread(a);
  CHECK_STATUS(a->rc, DDPLUG_E_PEER_LOST);
  CHECK_CONTAINS(a->err, "closed the connection (did rank 0 exit?)");
  ddplug_store_close(a->st);
}

/* The 60 s timeouts exceed the case's 30 s limit: only a prompt PEER_LOST
 * (not a TIMEOUT) can pass. */
TEST_T(server_killed_while_clients_block_gives_peer_lost, 30) {
  int port, ctl;
  pid_t server = st_spawn_server(NULL, &port, &ctl);
  blocked_arg a[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    memset(&a[i], 0, sizeof a[i]);
    a[i].port = port;
    a[i].use_wait = i % 2;
    a[i].st = st_connect(port, NULL);
    pthread_create(&th[i], NULL, blocked_thread, &a[i]);
  }
  blocked_arg pa = {port, 0, NULL, 0, 0, {0}};
  pid_t other = dt_fork(blocked_process, &pa);
  /* the other process connected (else the kill would fail its connect,
   * not its call), then a moment for every call to park in the server */
  ddplug_store *probe = st_connect(port, NULL);
  void *v = NULL;
  CHECK_OK(ddplug_store_get(probe, "child-connected", 20000, &v, NULL));
  ddplug_free(v);
  ddplug__sleep_ms(300);
  double killed_at = st_now_s();
  CHECK(kill(server, SIGKILL) == 0);
  waitpid(server, NULL, 0);
  close(ctl);
  char where[64];
  snprintf(where, sizeof where, "rendezvous store at 127.0.0.1:%d closed the connection", port);
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK_STATUS(a[i].rc, DDPLUG_E_PEER_LOST);
    CHECK_CONTAINS(a[i].err, where);
    CHECK_CONTAINS(a[i].err, "(did rank 0 exit?)");
    CHECK_CONTAINS(ddplug_store_error(a[i].st), "(did rank 0 exit?)");
    dt_note("%s returned PEER_LOST %.1f ms after the kill",
            a[i].use_wait ? "wait" : "get ", (a[i].returned_at - killed_at) * 1000);
    /* Later calls fail at once with the same status and text. */
    CHECK_STATUS(ddplug_store_set(a[i].st, "k", "v", 1), DDPLUG_E_PEER_LOST);
    CHECK_CONTAINS(ddplug_last_error(), where);
    ddplug_store_close(a[i].st);
  }
  ddplug_store_close(probe);
  st_join_child(other, 20000, "the client process expecting PEER_LOST");
}

TEST(server_stop_with_clients_connected) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  blocked_arg a[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    memset(&a[i], 0, sizeof a[i]);
    a[i].use_wait = i % 2;
    a[i].st = st_connect(port, NULL);
    pthread_create(&th[i], NULL, blocked_thread, &a[i]);
  }
  ddplug_store *idle = st_connect(port, NULL);
  CHECK_OK(ddplug_store_on_disconnect(idle, "gone", "x", 1));
  int raw = raw_connect(port); /* one still in its handshake */
  ddplug__sleep_ms(200);
  ddplug_store_server_stop(srv);
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    CHECK_STATUS(a[i].rc, DDPLUG_E_PEER_LOST);
    ddplug_store_close(a[i].st);
  }
  CHECK_STATUS(ddplug_store_set(idle, "k", "v", 1), DDPLUG_E_PEER_LOST);
  ddplug_store_close(idle);
  CHECK(raw_closed_within(raw, 5000));
  close(raw);
}

/* ---- secrets ------------------------------------------------------------- */

static void expect_refused(int port, const char *secret, const char *text) {
  ddplug_store *st = NULL;
  CHECK_STATUS(ddplug_store_connect("127.0.0.1", port, secret, 5000, &st),
               DDPLUG_E_CONFIG);
  CHECK(st == NULL);
  CHECK_CONTAINS(ddplug_last_error(), text);
}

TEST(secret_right_works_wrong_or_missing_refused) {
  ddplug_store_server *srv = st_serve("s3cret-value");
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, "s3cret-value");
  CHECK_OK(ddplug_store_set(st, "k", "v", 1));

  char msg[512];
  snprintf(msg, sizeof msg,
           "rendezvous store at 127.0.0.1:%d refused this client: shared "
           "secret missing or wrong (set the variable named by "
           "rendezvous.secret_env to the same value on every rank)",
           port);
  expect_refused(port, "s3cret-valuf", msg);
  CHECK_EQ_STR(ddplug_last_error(), msg); /* exactly this sentence */
  expect_refused(port, NULL, msg);
  CHECK_EQ_STR(ddplug_last_error(), msg);
  expect_refused(port, "", msg); /* "" means no secret */
  expect_refused(port, "s3cret-value-and-more", msg);
  /* The authenticated client was not disturbed. */
  st_expect_value(st, "k", 0, "v");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(secret_offered_to_a_server_without_one_is_refused) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  char msg[256];
  snprintf(msg, sizeof msg,
           "rendezvous store at 127.0.0.1:%d refused this client: this rank "
           "has a shared secret but the store has none",
           port);
  expect_refused(port, "abc", msg);
  CHECK_CONTAINS(ddplug_last_error(), "or unset it on every rank");
  ddplug_store *st = st_connect(port, ""); /* "" = none: fine */
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(long_binary_like_secret_works) {
  char secret[200];
  for (int i = 0; i < 199; i++) secret[i] = (char)(1 + (i * 37) % 250);
  secret[199] = '\0';
  ddplug_store_server *srv = st_serve(secret);
  ddplug_store *st = st_connect(ddplug_store_server_port(srv), secret);
  CHECK_OK(ddplug_store_set(st, "k", "v", 1));
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

/* A raw client must authenticate before anything else, and an
 * unauthenticated request closes its connection. */
TEST(raw_client_cannot_skip_authentication) {
  ddplug_store_server *srv = st_serve("sekrit");
  int port = ddplug_store_server_port(srv);
  int fd = raw_connect(port);
  uint8_t buf[128];
  CHECK_EQ_INT(raw_recv_frame(fd, buf, sizeof buf), 33);
  CHECK_EQ_INT(buf[10], 1); /* the server says it has a secret */
  ddplug__sbuf b = {0};
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_SET, 1);
  ddplug__sbuf_key(&b, "k", 1);
  ddplug__sbuf_value(&b, "v", 1);
  ddplug__sbuf_frame_end(&b);
  raw_send(fd, b.data, b.len);
  ddplug__sbuf_free(&b);
  CHECK(raw_closed_within(fd, 5000));
  close(fd);
  /* Replaying a MAC made for another nonce fails: all-zero MAC here. */
  fd = raw_connect(port);
  CHECK_EQ_INT(raw_recv_frame(fd, buf, sizeof buf), 33);
  raw_send_auth(fd, 1);
  CHECK_EQ_INT(raw_recv_frame(fd, buf, sizeof buf), 2);
  CHECK_EQ_INT(buf[10], DDPLUG__STORE_R_REFUSED);
  CHECK_EQ_INT(buf[11], DDPLUG__STORE_REFUSE_BAD_MAC);
  CHECK(raw_closed_within(fd, 5000));
  close(fd);
  ddplug_store_server_stop(srv);
}

/* ---- fake servers ---------------------------------------------------------- */

typedef void (*fake_script)(int fd, void *arg);
typedef struct fake {
  int lfd, port;
  pthread_t th;
  fake_script script;
  void *arg;
} fake;

static void *fake_main(void *p) {
  fake *f = p;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  f->script(fd, f->arg);
  /* Wait for the client to hang up, then close. */
  uint8_t junk[256];
  while (recv(fd, junk, sizeof junk, 0) > 0) {
  }
  close(fd);
  return NULL;
}

static void fake_start(fake *f, fake_script script, void *arg) {
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  CHECK(bind(f->lfd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(listen(f->lfd, 4) == 0);
  CHECK(getsockname(f->lfd, (struct sockaddr *)&a, &len) == 0);
  f->port = ntohs(a.sin_port);
  f->script = script;
  f->arg = arg;
  pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_stop(fake *f) {
  pthread_join(f->th, NULL);
  close(f->lfd);
}

static void send_frame(int fd, ddplug__sbuf *b) {
  ddplug__sbuf_frame_end(b);
  raw_send(fd, b->data, b->len);
  ddplug__sbuf_free(b);
}

static void send_challenge(int fd, int has_secret) {
  ddplug__sbuf b = {0};
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_CHALLENGE, 0);
  ddplug__sbuf_u8(&b, (uint8_t)has_secret);
  uint8_t nonce[32];
  memset(nonce, 0x42, sizeof nonce);
  ddplug__sbuf_put(&b, nonce, sizeof nonce);
  send_frame(fd, &b);
}

/* Challenge, read AUTH, accept it with the given 32-byte server MAC. */
static void accept_auth(int fd, int has_secret, uint8_t mac_byte) {
  send_challenge(fd, has_secret);
  uint8_t buf[256];
  if (raw_recv_frame(fd, buf, sizeof buf) < 0) return;
  uint32_t id = ddplug__store_get_u32be(buf + 6);
  ddplug__sbuf b = {0};
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_REPLY, id);
  ddplug__sbuf_u8(&b, DDPLUG__STORE_R_OK);
  uint8_t mac[32];
  memset(mac, mac_byte, sizeof mac);
  ddplug__sbuf_put(&b, mac, sizeof mac);
  send_frame(fd, &b);
}

/* Connecting to a fake server running script must fail with status and a
 * last error containing text. */
static void expect_connect_fails(fake_script script, const char *secret,
                                 int64_t timeout_ms, int status,
                                 const char *text) {
  fake f;
  fake_start(&f, script, NULL);
  ddplug_store *st = NULL;
  CHECK_STATUS(ddplug_store_connect("127.0.0.1", f.port, secret, timeout_ms, &st),
               status);
  CHECK(st == NULL);
  CHECK_CONTAINS(ddplug_last_error(), text);
  fake_stop(&f);
}

static void impostor_script(int fd, void *arg) { accept_auth(fd, 1, 0x55); }

TEST(impostor_server_is_refused_by_the_client) {
  expect_connect_fails(impostor_script, "secret", 5000, DDPLUG_E_CONFIG,
                       "could not prove that it knows the shared secret");
}

static void other_version_script(int fd, void *arg) {
  uint8_t frame[43] = {0, 0, 0, 39, 3, DDPLUG__STORE_CHALLENGE};
  raw_send(fd, frame, sizeof frame);
}

TEST(server_with_another_protocol_version_is_named) {
  expect_connect_fails(other_version_script, NULL, 5000, DDPLUG_E_ABI_MISMATCH,
                       "speaks store protocol version 3, this rank speaks 2");
}

static void http_script(int fd, void *arg) {
  const char *r = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
  raw_send(fd, r, strlen(r));
}

TEST(a_service_that_is_not_a_store_is_detected) {
  expect_connect_fails(http_script, NULL, 5000, DDPLUG_E_PEER_LOST,
                       "sent a malformed frame (length 1213486160): is another "
                       "service listening on that port?");
}

static void silent_script(int fd, void *arg) { (void)fd; }

TEST(a_silent_server_times_out_the_handshake) {
  expect_connect_fails(silent_script, NULL, 200, DDPLUG_E_TIMEOUT,
                       "accepted the connection but sent no greeting");
}

/* The server answers a GET only after the client gave up locally, then
 * answers the next request: the client must skip the stale reply. */
static void late_script(int fd, void *arg) {
  accept_auth(fd, 0, 0);
  uint8_t buf[512];
  if (raw_recv_frame(fd, buf, sizeof buf) < 0) return; /* the GET */
  uint32_t get_id = ddplug__store_get_u32be(buf + 6);
  if (raw_recv_frame(fd, buf, sizeof buf) < 0) return; /* the SET, later */
  uint32_t set_id = ddplug__store_get_u32be(buf + 6);
  ddplug__sbuf b = {0};
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_REPLY, get_id);
  ddplug__sbuf_u8(&b, DDPLUG__STORE_R_OK);
  ddplug__sbuf_value(&b, "stale", 5);
  send_frame(fd, &b);
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_REPLY, set_id);
  ddplug__sbuf_u8(&b, DDPLUG__STORE_R_OK);
  send_frame(fd, &b);
  if (raw_recv_frame(fd, buf, sizeof buf) < 0) return; /* BYE */
  ddplug__sbuf_frame_begin(&b, DDPLUG__STORE_REPLY, ddplug__store_get_u32be(buf + 6));
  ddplug__sbuf_u8(&b, DDPLUG__STORE_R_OK);
  send_frame(fd, &b);
}

TEST(a_late_reply_is_discarded_and_the_connection_survives) {
  fake f;
  fake_start(&f, late_script, NULL);
  ddplug_store *st = NULL;
  CHECK_OK(ddplug_store_connect("127.0.0.1", f.port, NULL, 5000, &st));
  void *v = NULL;
  CHECK_STATUS(ddplug_store_get(st, "k", 10, &v, NULL), DDPLUG_E_TIMEOUT);
  CHECK_CONTAINS(ddplug_last_error(), "did not answer");
  CHECK_OK(ddplug_store_set(st, "k", "v", 1));
  ddplug_store_close(st);
  fake_stop(&f);
}

/* ---- on_disconnect ----------------------------------------------------------- */

typedef struct dying_arg {
  int port;
  int how; /* 0: block until killed, 1: clean close, 2: exit without close */
  const char *key;
  const char *value;
} dying_arg;

static void dying_main(void *p) {
  dying_arg *a = p;
  ddplug_store *st = st_connect(a->port, NULL);
  CHECK_OK(ddplug_store_on_disconnect(st, a->key, a->value, strlen(a->value)));
  CHECK_OK(ddplug_store_on_disconnect(st, "dead/any", "1", 1));
  char ready[64];
  snprintf(ready, sizeof ready, "ready/%s", a->key);
  CHECK_OK(ddplug_store_set(st, ready, "", 0));
  if (a->how == 1) {
    ddplug_store_close(st);
    _exit(0);
  }
  if (a->how == 2) _exit(0); /* the kernel closes the socket, no BYE */
  for (;;) pause();
}

typedef struct wait_arg {
  ddplug_store *st;
  const char *key;
  int rc;
} wait_arg;

static void *wait_key_thread(void *p) {
  wait_arg *w = p;
  const char *keys[] = {w->key};
  w->rc = ddplug_store_wait(w->st, keys, 1, 20000);
  return NULL;
}

TEST(on_disconnect_fires_when_a_client_is_killed) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, NULL);
  /* Someone is already waiting for the death notice. */
  wait_arg w = {st_connect(port, NULL), "dead/1", -1};
  pthread_t th;
  pthread_create(&th, NULL, wait_key_thread, &w);
  dying_arg a = {port, 0, "dead/1", "rank 1 died"};
  pid_t pid = dt_fork(dying_main, &a);
  void *v = NULL;
  CHECK_OK(ddplug_store_get(st, "ready/dead/1", 10000, &v, NULL));
  ddplug_free(v);
  CHECK_STATUS(ddplug_store_get(st, "dead/1", 0, &v, NULL), DDPLUG_E_TIMEOUT);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  st_expect_value(st, "dead/1", 10000, "rank 1 died");
  st_expect_value(st, "dead/any", 10000, "1");
  pthread_join(th, NULL);
  CHECK_OK(w.rc);
  ddplug_store_close(w.st);
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(on_disconnect_fires_on_exit_without_close_not_on_clean_close) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, NULL);
  dying_arg clean = {port, 1, "gone/clean", "x"};
  st_join_child(dt_fork(dying_main, &clean), 10000, "the cleanly closing client");
  void *v = NULL;
  /* Give a wrong implementation time to fire anyway. */
  CHECK_STATUS(ddplug_store_get(st, "gone/clean", 500, &v, NULL), DDPLUG_E_TIMEOUT);
  CHECK_STATUS(ddplug_store_get(st, "dead/any", 0, &v, NULL), DDPLUG_E_TIMEOUT);

  dying_arg unclean = {port, 2, "gone/exit", "y"};
  st_join_child(dt_fork(dying_main, &unclean), 10000, "the exiting client");
  st_expect_value(st, "gone/exit", 10000, "y");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

TEST(on_disconnect_never_overwrites_a_present_key) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, NULL);
  CHECK_OK(ddplug_store_set(st, "dead/x", "orig", 4));
  dying_arg a = {port, 0, "dead/x", "new"};
  pid_t pid = dt_fork(dying_main, &a);
  void *v = NULL;
  CHECK_OK(ddplug_store_get(st, "ready/dead/x", 10000, &v, NULL));
  ddplug_free(v);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  /* dead/any fires in the same server step as dead/x. */
  CHECK_OK(ddplug_store_get(st, "dead/any", 10000, &v, NULL));
  ddplug_free(v);
  st_expect_value(st, "dead/x", 0, "orig");
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

/* ---- fork ------------------------------------------------------------------ */

typedef struct fork_arg {
  ddplug_store *st;
  ddplug_store_server *srv;
} fork_arg;

static void child_misuses_parent_handle(void *p) {
  fork_arg *a = p;
  CHECK_STATUS(ddplug_store_set(a->st, "k", "child", 5), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "cannot be used in forked process");
  CHECK_CONTAINS(ddplug_last_error(), "connect again in the child");
  ddplug_store_close(a->st); /* must not say BYE on the parent's behalf */
}

TEST(a_forked_child_cannot_use_or_close_the_parents_connection) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, NULL);
  CHECK_OK(ddplug_store_on_disconnect(st, "dead/parent", "x", 1));
  fork_arg a = {st, NULL};
  st_join_child(dt_fork(child_misuses_parent_handle, &a), 10000, "the child");
  /* Had the child sent BYE, the server would now refuse this connection. */
  CHECK_OK(ddplug_store_set(st, "k", "parent", 6));
  void *v = NULL;
  CHECK_STATUS(ddplug_store_get(st, "dead/parent", 0, &v, NULL), DDPLUG_E_TIMEOUT);
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}

static void child_stops_parent_server(void *p) {
  fork_arg *a = p;
  ddplug_store_server_stop(a->srv); /* releases the child's copy only */
}

TEST(server_stop_in_a_forked_child_leaves_the_parent_serving) {
  ddplug_store_server *srv = st_serve(NULL);
  int port = ddplug_store_server_port(srv);
  ddplug_store *st = st_connect(port, NULL);
  CHECK_OK(ddplug__store_set_default_timeout(st, 5000)); /* fail fast */
  fork_arg a = {NULL, srv};
  st_join_child(dt_fork(child_stops_parent_server, &a), 10000, "the child");
  void *v = NULL;
  CHECK_OK(ddplug_store_set(st, "k", "v", 1));
  CHECK_OK(ddplug_store_get(st, "k", 1000, &v, NULL));
  ddplug_free(v);
  ddplug_store *late = st_connect(port, NULL);
  CHECK_OK(ddplug_store_set(late, "k2", "v", 1));
  ddplug_store_close(late);
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
}
