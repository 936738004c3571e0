/* fault_store.c — the rendezvous store of a fault-injection run, served
 * outside the ranks (config rendezvous.external) so that the orchestrator
 * (tests/faults/faults.py) sees every stage of joining as it happens and
 * can strike a rank at exactly that stage. It serves on 127.0.0.1 with the
 * secret in DDPLUG_SECRET (none if unset), prints "port <P>", then waits
 * for each KEY in turn and prints "key <KEY> <t> <value>" (t: CLOCK_MONOTONIC
 * ns; the value's first 200 bytes, one line) the moment it exists. In a
 * KEY, "{run}" stands for the run id, read from ddplug/verdict (so watch
 * ddplug/verdict before such a key). After the last key it serves until
 * its standard input closes. With --strangers N, a key whose value is a
 * ring endpoint ("a.b.c.d:port/...") gets N silent connections and one
 * that sends a forged hello, the moment it appears (before the real peer
 * can connect): they stay open until fault-store exits.
 * usage: fault-store [--strangers N] KEY... */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "ddplug/ddplug.h"
#include "ddplug/store.h"

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Strangers at the ring endpoint "a.b.c.d:port/..." in value: n silent
 * connections and one forged hello. Prints "strangers <M> <n>": how many of
 * the silent ones the listener accepted (it sent them its challenge). */
static void strangers(const char *value, int n) {
  char host[64];
  int port = 0;
  if (sscanf(value, "%63[0-9.]:%d/", host, &port) != 2) return;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return;
  int fds[64], nfd = 0;
  for (int i = 0; i <= n && nfd < 64; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) continue;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
      close(fd);
      continue;
    }
    if (i == n) { /* a forged hello: about the right size, the wrong bytes */
      char junk[1024];
      for (size_t j = 0; j < sizeof junk; j++) junk[j] = (char)(j * 7 + 1);
      if (send(fd, junk, sizeof junk, MSG_NOSIGNAL) < 0) {
        close(fd);
        continue;
      }
    } else {
      fds[nfd++] = fd;
    }
    /* left open on purpose: closed at exit */
  }
  int accepted = 0;
  for (int i = 0; i < nfd; i++) {
    struct timeval tv = {1, 0};
    setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char nonce[32];
    if (recv(fds[i], nonce, sizeof nonce, MSG_WAITALL) == (ssize_t)sizeof nonce) accepted++;
  }
  printf("strangers %d %d\n", accepted, n);
  fflush(stdout);
}

int main(int argc, char **argv) {
  const char *secret = getenv("DDPLUG_SECRET");
  int nstrangers = 0;
  if (argc > 2 && !strcmp(argv[1], "--strangers")) {
    nstrangers = atoi(argv[2]);
    argv += 2;
    argc -= 2;
  }
  ddplug_store_server *srv = NULL;
  ddplug_store *st = NULL;
  if (ddplug_store_serve("127.0.0.1", 0, secret, &srv) != DDPLUG_OK ||
      ddplug_store_connect("127.0.0.1", ddplug_store_server_port(srv), secret, 10000, &st) !=
          DDPLUG_OK) {
    fprintf(stderr, "fault-store: %s\n", ddplug_last_error());
    return 1;
  }
  printf("port %d\n", ddplug_store_server_port(srv));
  fflush(stdout);
  char run_id[64] = "";
  for (int i = 1; i < argc; i++) {
    char key[512];
    const char *at = strstr(argv[i], "{run}");
    if (at)
      snprintf(key, sizeof key, "%.*s%s%s", (int)(at - argv[i]), argv[i], run_id, at + 5);
    else
      snprintf(key, sizeof key, "%s", argv[i]);
    void *v = NULL;
    uint64_t len = 0;
    int s;
    while ((s = ddplug_store_get(st, key, 600000, &v, &len)) == DDPLUG_E_TIMEOUT) {
    }
    if (s != DDPLUG_OK) {
      fprintf(stderr, "fault-store: %s\n", ddplug_last_error());
      return 1;
    }
    long long t = now_ns();
    char *text = v;
    for (char *p = text; *p; p++)
      if (*p == '\n') *p = ' ';
    if (!strcmp(key, "ddplug/verdict")) {
      const char *r = strstr(text, "\"run_id\":\"");
      if (r) sscanf(r + 10, "%63[A-Za-z0-9_]", run_id);
    }
    printf("key %s %lld %.200s\n", key, t, text);
    fflush(stdout);
    if (nstrangers > 0 && strchr(text, '/')) strangers(text, nstrangers);
    fflush(stdout);
    ddplug_free(v);
  }
  char c;
  while (read(0, &c, 1) > 0) {
  }
  ddplug_store_close(st);
  ddplug_store_server_stop(srv);
  return 0;
}
