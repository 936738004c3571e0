/* bootstrap.c — a run started by an MPI launcher (mpirun, mpiexec, srun
 * with PMI or PMIx) that gave no rendezvous address: the plugin's engine
 * knows the world, so the plugin's bootstrap slots (plugin ABI 1.4) say it,
 * and carry rank 0's store address and a per-run secret to every rank.
 *
 * Which plugin: the one the caller or the config names; under an MPI
 * launcher with none named, "mpi" (an info line says so). A plugin without
 * bootstrap slots under such a launcher is a CONFIG error saying what to do.
 *
 * The flow, before the store exists: bootstrap_world (rank, world size,
 * local ranks where the launcher says them; checked against what the
 * launcher's variables said); rank 0 serves the store on every interface,
 * on rendezvous.port or any free port, with the secret of
 * rendezvous.secret_env when set, else a fresh random one; one
 * bootstrap_broadcast carries the record below from rank 0 to all; every
 * other rank connects to the first of rank 0's addresses it can reach (its
 * own machine's addresses first). The channel is private to the job, so a
 * run under mpirun is authenticated by default. A rank 0 that cannot serve
 * broadcasts its failure instead, so the others fail with its sentence
 * rather than a timeout.
 * SPDX-License-Identifier: Apache-2.0 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "run/context.h"
#include "store/store.h"

#define BOOT_MAGIC "ddplug-bootstrap-1"
#define BOOT_ADDRS 8

/* What rank 0 broadcasts (every field NUL-terminated text or fixed-width). */
typedef struct boot_record {
  char magic[24];
  int32_t status;               /* rank 0's failure, or OK              */
  int32_t port;
  int32_t naddrs;
  int32_t reserved;
  char secret[80];              /* the store's secret (hex)              */
  char addrs[BOOT_ADDRS][64];   /* rank 0's IPv4 addresses, loopback last */
  char error[DDPLUG__ERRMSG_MAX];
} boot_record;

/* See context.h. */
int ddplug__bootstrap_needed(const ddplug_context *ctx) {
  return !strcmp(ctx->world.source, "mpi") && !ctx->world.master_addr[0];
}

/* See context.h. */
int ddplug__plugin_choice(ddplug_context *ctx, const ddplug_open_options *opts, char *buf,
                          size_t cap) {
  if (opts && opts->plugin) {
    ddplug__strlcpy(buf, opts->plugin, cap);
    return DDPLUG_OK;
  }
  int set = 0;
  ddplug_config_is_set(ctx->cfg, "plugin", &set);
  if (!set && !strcmp(ctx->world.source, "mpi")) {
    ddplug__strlcpy(buf, "mpi", cap);
    DDPLUG__INFO("started by an MPI launcher and the config names no plugin: using plugin mpi "
                 "(set \"plugin\" to choose another)");
    return DDPLUG_OK;
  }
  char *name = NULL;
  int s = ddplug_config_get_string(ctx->cfg, "plugin", &name);
  if (s != DDPLUG_OK) return s;
  ddplug__strlcpy(buf, name, cap);
  ddplug_free(name);
  return DDPLUG_OK;
}

/* This machine's IPv4 addresses of interfaces that are up, loopback
 * excluded. */
static int local_addrs(char out[][64], int cap) {
  struct ifaddrs *ifs = NULL;
  int n = 0;
  if (getifaddrs(&ifs) != 0) return 0;
  for (struct ifaddrs *i = ifs; i && n < cap; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)i->ifa_addr;
    if (inet_ntop(AF_INET, &a->sin_addr, out[n], 64)) n++;
  }
  freeifaddrs(ifs);
  return n;
}

static int serve(ddplug_context *ctx, boot_record *rec, const char *secret) {
  int64_t port = 0;
  ddplug_config_get_int(ctx->cfg, "rendezvous.port", &port);
  int s = ddplug_store_serve("0.0.0.0", (int)port, secret, &ctx->server);
  if (s != DDPLUG_OK)
    return ddplug__err_prefix(s, "rank 0 could not serve the rendezvous store on port %d",
                              (int)port);
  rec->port = ddplug_store_server_port(ctx->server);
  rec->naddrs = local_addrs(rec->addrs, BOOT_ADDRS - 1);
  ddplug__strlcpy(rec->addrs[rec->naddrs++], "127.0.0.1", sizeof rec->addrs[0]);
  return DDPLUG_OK;
}

/* Rank 0's address this rank reaches: its own machine's first (the same
 * host, or network namespace), then the others in rank 0's order; each
 * tried with a short connection. */
static int reach(ddplug_context *ctx, const boot_record *rec, const char *secret) {
  char mine[BOOT_ADDRS][64];
  int nmine = local_addrs(mine, BOOT_ADDRS);
  int order[BOOT_ADDRS], n = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < rec->naddrs && i < BOOT_ADDRS; i++) {
      int local = 0;
      for (int k = 0; k < nmine; k++) local |= !strcmp(mine[k], rec->addrs[i]);
      if (local == (pass == 0) && strcmp(rec->addrs[i], "127.0.0.1") != 0) order[n++] = i;
    }
  char tried[1024] = "";
  size_t w = 0;
  for (int k = 0; k < n; k++) {
    const char *a = rec->addrs[order[k]];
    int64_t left = ddplug__remaining_ms(ctx->open_deadline_ns);
    ddplug_store *probe = NULL;
    int s = ddplug_store_connect(a, rec->port, secret, left < 3000 ? left : 3000, &probe);
    if (s == DDPLUG_OK) {
      ddplug_store_close(probe);
      ddplug__strlcpy(ctx->world.master_addr, a, sizeof ctx->world.master_addr);
      ctx->world.master_port = rec->port;
      return DDPLUG_OK;
    }
    if (w < sizeof tried)
      w += (size_t)snprintf(tried + w, sizeof tried - w, "%s%s (%s)", w ? ", " : "", a,
                            ddplug_status_name(s));
  }
  return ddplug__err(DDPLUG_E_PEER_LOST,
                     "rank %d cannot reach rank 0's rendezvous store at any of its addresses "
                     "(port %d: %s): a firewall between the nodes, or rank 0's machine has no "
                     "address the others can route to; set MASTER_ADDR to one that works",
                     ctx->world.rank, rec->port, n ? tried : "none but loopback");
}

/* See context.h. */
int ddplug__bootstrap(ddplug_context *ctx, const ddplug_open_options *opts) {
  char name[4096];
  int s = ddplug__plugin_choice(ctx, opts, name, sizeof name);
  if (s == DDPLUG_OK) s = ddplug__plugin_load(name, &ctx->plugin);
  if (s != DDPLUG_OK) return s;
  const ddplug_plugin *t = &ctx->plugin->table;
  const char *launcher = getenv("OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_RANK"
                         : getenv("PMI_RANK")            ? "PMI_RANK"
                                                         : "PMIX_RANK";
  if (!t->bootstrap_world)
    return ddplug__err(DDPLUG_E_CONFIG,
                       "this process was started by an MPI launcher (%s=%s) without a rendezvous "
                       "address, and plugin %s cannot learn the world over MPI (it has no "
                       "bootstrap slots): use \"plugin\": \"mpi\" (or name no plugin), or set "
                       "MASTER_ADDR and MASTER_PORT (rank 0's host and a free port) on every rank",
                       launcher, getenv(launcher) ? getenv(launcher) : "?", t->name);
  ddplug_host_services svc;
  ddplug__services_bootstrap(ctx, &svc);
  ddplug_bootstrap_world bw;
  memset(&bw, 0, sizeof bw);
  bw.struct_size = sizeof bw;
  bw.abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  bw.local_rank = bw.local_world_size = bw.node_rank = -1;
  ddplug__plugin_err_clear(ctx);
  s = t->bootstrap_world(&svc, &bw);
  if (s != DDPLUG_OK) return ddplug__plugin_err_take(ctx, s, "bootstrap_world");
  if (bw.world_size < 1 || bw.rank < 0 || bw.rank >= bw.world_size)
    return ddplug__err(DDPLUG_E_INTERNAL, "plugin %s's bootstrap_world says rank %d of %d",
                       t->name, bw.rank, bw.world_size);
  if ((ctx->world.world_size > 0 && bw.world_size != ctx->world.world_size) ||
      bw.rank != ctx->world.rank)
    return ddplug__err(DDPLUG_E_CONFIG,
                       "the launcher's variables say rank %d of %d but plugin %s (MPI) says rank "
                       "%d of %d: the MPI library is not the launcher's (see the plugin's "
                       "README: DDPLUG_MPI_LIBRARY)",
                       ctx->world.rank, ctx->world.world_size, t->name, bw.rank, bw.world_size);
  ctx->world.world_size = bw.world_size;
  if (ctx->world.local_rank < 0) ctx->world.local_rank = bw.local_rank;
  if (ctx->world.local_world_size < 0) ctx->world.local_world_size = bw.local_world_size;
  if (bw.world_size == 1) return DDPLUG_OK; /* one process: a local store, as always */

  boot_record *rec = ddplug__calloc(1, sizeof *rec);
  if (!rec) return ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  char *var = NULL;
  const char *given = NULL;
  if (ddplug_config_get_string(ctx->cfg, "rendezvous.secret_env", &var) == DDPLUG_OK) {
    given = getenv(var);
    ddplug_free(var);
  }
  if (ctx->world.rank == 0) {
    ddplug__strlcpy(rec->magic, BOOT_MAGIC, sizeof rec->magic);
    if (given && *given && strlen(given) < sizeof rec->secret) {
      ddplug__strlcpy(rec->secret, given, sizeof rec->secret);
    } else {
      unsigned char raw[32];
      if (ddplug__store_random(raw, sizeof raw) != 0) {
        rec->status = ddplug__err(DDPLUG_E_SYSTEM, "rank 0 cannot read random bytes for the "
                                                   "run's secret");
      } else {
        for (size_t i = 0; i < sizeof raw; i++) snprintf(rec->secret + 2 * i, 3, "%02x", raw[i]);
      }
    }
    if (rec->status == DDPLUG_OK) rec->status = serve(ctx, rec, rec->secret);
    if (rec->status != DDPLUG_OK)
      ddplug__strlcpy(rec->error, ddplug_last_error(), sizeof rec->error);
  }
  ddplug__plugin_err_clear(ctx);
  s = t->bootstrap_broadcast(&svc, rec, sizeof *rec, ddplug__remaining_ms(ctx->open_deadline_ns));
  if (s != DDPLUG_OK) {
    ddplug__free(rec);
    return ddplug__plugin_err_take(ctx, s, "bootstrap_broadcast");
  }
  rec->magic[sizeof rec->magic - 1] = rec->secret[sizeof rec->secret - 1] = '\0';
  rec->error[sizeof rec->error - 1] = '\0';
  if (strcmp(rec->magic, BOOT_MAGIC) != 0)
    s = ddplug__err(DDPLUG_E_ABI_MISMATCH,
                    "rank 0's bootstrap record is not this ddplug's (%.23s): every rank must run "
                    "the same ddplug",
                    rec->magic);
  else if (rec->status != DDPLUG_OK)
    s = ctx->world.rank == 0 ? rec->status
                             : ddplug__err(rec->status, "rank 0 failed to start the run: %s",
                                           rec->error);
  else if (ctx->world.rank == 0)
    ddplug__strlcpy(ctx->world.master_addr, "127.0.0.1", sizeof ctx->world.master_addr),
        ctx->world.master_port = rec->port;
  else
    s = reach(ctx, rec, rec->secret);
  if (s == DDPLUG_OK) ddplug__strlcpy(ctx->boot_secret, rec->secret, sizeof ctx->boot_secret);
  ddplug__free(rec);
  return s;
}
