/* port.c — a free TCP port, for the subcommands that start a rendezvous:
 * `ddplug run` (when --master-port is not given) and `ddplug conformance`
 * (two per scenario, handed to the suite through its plan). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commands.h"

/* See commands.h. */
int ddplug_cmd_free_port(int loopback, int *keep_fd) {
  if (keep_fd) *keep_fd = -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (keep_fd)
    *keep_fd = fd;
  else
    close(fd);
  return port;
}
