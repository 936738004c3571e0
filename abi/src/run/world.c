/* world.c — world discovery: who am I, how many are we, where is the
 * rendezvous. Order (first that applies wins):
 *   1. explicit config "world" (rank + world_size present);
 *   2. torchrun / torch.distributed launchers: RANK and WORLD_SIZE (plus
 *      LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK);
 *   3. Lightning's subprocess launcher: LOCAL_RANK, NODE_RANK, WORLD_SIZE
 *      (no RANK; rank = NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK, so on a
 *      node other than 0 the processes per node must be known);
 *   4. MPI launchers (source "mpi"): Open MPI's mpirun
 *      (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), hydra's mpiexec
 *      and srun --mpi=pmi2 (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
 *      MPI_LOCALNRANKS), PMIx launchers such as srun --mpi=pmix (PMIX_RANK;
 *      the size from SLURM_NTASKS, else unknown: 0, and the plugin's
 *      bootstrap says it);
 *   5. SLURM: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID;
 *   6. a single process.
 * The rendezvous address is config rendezvous.addr/port, else MASTER_ADDR/
 * MASTER_PORT, else (SLURM only) SLURM_LAUNCH_NODE_IPADDR and port
 * 10000 + SLURM_JOB_ID % 20000. Under an MPI launcher without any of
 * these, the address stays empty: ddplug_open then learns the world and
 * rank 0's store address from the plugin's bootstrap slots (bootstrap.c).
 * Locality is NOT decided here: local ranks
 * from the environment are only what the launcher said; ddplug_open learns
 * the real layout by exchanging host identities.
 * SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run/context.h"

#define MAX_WORLD 65536

typedef struct envctx {
  ddplug__env_fn get;
  void *user;
  const char *source; /* for messages: "torchrun variables" */
} envctx;

/* Read an integer variable. Returns 1 if set and valid, 0 if unset, or an
 * error status (negative of nothing: we use a separate out) via *status. */
static int read_int_var(const envctx *e, const char *name, int64_t min,
                        int64_t max, int64_t *out, int *status) {
  const char *v = e->get(name, e->user);
  if (!v || !*v) return 0;
  int64_t x;
  if (ddplug__parse_i64(v, &x) != 0) {
    *status = ddplug__err(DDPLUG_E_CONFIG,
                          "%s=%s is not an integer (%s); fix the launcher's "
                          "environment or set the world explicitly in the "
                          "config (\"world\": {\"rank\": .., \"world_size\": ..})",
                          name, v, e->source);
    return -1;
  }
  if (x < min || x > max) {
    if (x < 0)
      *status = ddplug__err(DDPLUG_E_CONFIG, "%s=%s is negative (%s)", name,
                            v, e->source);
    else
      *status = ddplug__err(DDPLUG_E_CONFIG,
                            "%s=%s is out of range %lld..%lld (%s)", name, v,
                            (long long)min, (long long)max, e->source);
    return -1;
  }
  *out = x;
  return 1;
}

static int has_var(const envctx *e, const char *name) {
  const char *v = e->get(name, e->user);
  return v && *v;
}

/* Config integer at path, if set. 1 set, 0 absent, -1 error (status set). */
static int cfg_int(const ddplug_config *cfg, const char *path, int64_t *out,
                   int *status) {
  if (!cfg) return 0;
  int s = ddplug_config_get_int(cfg, path, out);
  if (s == DDPLUG_OK) return 1;
  if (s == DDPLUG_E_NOT_FOUND) return 0;
  *status = s;
  return -1;
}

static int cfg_str(const ddplug_config *cfg, const char *path, char *buf,
                   size_t cap, int *status) {
  if (!cfg) return 0;
  char *v = NULL;
  int s = ddplug_config_get_string(cfg, path, &v);
  if (s == DDPLUG_E_NOT_FOUND) return 0;
  if (s != DDPLUG_OK) {
    *status = s;
    return -1;
  }
  ddplug__strlcpy(buf, v, cap);
  ddplug_free(v);
  return 1;
}

static void set_source(ddplug_world *w, const char *src) {
  ddplug__strlcpy(w->source, src, sizeof w->source);
}

/* Each source fills rank, world_size, local ranks, node_rank; returns 1 if it
 * applied, 0 if not, -1 on error (status set). */
static int from_config(const ddplug_config *cfg, ddplug_world *w, int *status) {
  int64_t rank, ws, v;
  int r1 = cfg_int(cfg, "world.rank", &rank, status);
  if (r1 < 0) return -1;
  int r2 = cfg_int(cfg, "world.world_size", &ws, status);
  if (r2 < 0) return -1;
  if (r1 == 0 && r2 == 0) return 0;
  if (r1 == 0 || r2 == 0) {
    *status = ddplug__err(DDPLUG_E_CONFIG,
                          "%s: world: explicit world needs both 'rank' and "
                          "'world_size'",
                          ddplug_config_origin(cfg));
    return -1;
  }
  if (rank >= ws) {
    *status = ddplug__err(DDPLUG_E_CONFIG,
                          "%s: world.rank=%lld is not below "
                          "world.world_size=%lld",
                          ddplug_config_origin(cfg), (long long)rank,
                          (long long)ws);
    return -1;
  }
  w->rank = (int32_t)rank;
  w->world_size = (int32_t)ws;
  int r;
  if ((r = cfg_int(cfg, "world.local_rank", &v, status)) < 0) return -1;
  if (r) w->local_rank = (int32_t)v;
  if ((r = cfg_int(cfg, "world.local_world_size", &v, status)) < 0) return -1;
  if (r) w->local_world_size = (int32_t)v;
  if ((r = cfg_int(cfg, "world.node_rank", &v, status)) < 0) return -1;
  if (r) w->node_rank = (int32_t)v;
  set_source(w, "config");
  return 1;
}

static int check_rank_below(const char *rank_name, int64_t rank,
                            const char *ws_name, int64_t ws, const char *src,
                            int *status) {
  if (rank < ws) return 0;
  *status = ddplug__err(DDPLUG_E_CONFIG,
                        "%s=%lld is not below %s=%lld (%s): every rank must "
                        "be in 0..%lld",
                        rank_name, (long long)rank, ws_name, (long long)ws, src,
                        (long long)(ws - 1));
  return -1;
}

static int from_torchrun(const envctx *env, ddplug_world *w, int *status) {
  if (!has_var(env, "RANK")) return 0; /* maybe Lightning's launcher */
  envctx e = *env;
  e.source = "torchrun variables";
  if (!has_var(&e, "WORLD_SIZE")) {
    *status = ddplug__err(DDPLUG_E_CONFIG,
                          "RANK is set but WORLD_SIZE is not (torchrun "
                          "variables): set both, or neither");
    return -1;
  }
  int64_t rank = 0, ws = 0, v;
  if (read_int_var(&e, "RANK", 0, MAX_WORLD - 1, &rank, status) < 0) return -1;
  if (read_int_var(&e, "WORLD_SIZE", 1, MAX_WORLD, &ws, status) < 0) return -1;
  if (check_rank_below("RANK", rank, "WORLD_SIZE", ws, e.source, status) < 0)
    return -1;
  w->rank = (int32_t)rank;
  w->world_size = (int32_t)ws;
  int r;
  int64_t lws = -1;
  if ((r = read_int_var(&e, "LOCAL_WORLD_SIZE", 1, MAX_WORLD, &v, status)) < 0)
    return -1;
  if (r) w->local_world_size = (int32_t)(lws = v);
  if ((r = read_int_var(&e, "LOCAL_RANK", 0, MAX_WORLD - 1, &v, status)) < 0)
    return -1;
  if (r) {
    if (lws > 0 &&
        check_rank_below("LOCAL_RANK", v, "LOCAL_WORLD_SIZE", lws, e.source,
                         status) < 0)
      return -1;
    w->local_rank = (int32_t)v;
  }
  if ((r = read_int_var(&e, "GROUP_RANK", 0, MAX_WORLD - 1, &v, status)) < 0)
    return -1;
  if (r) w->node_rank = (int32_t)v;
  set_source(w, "torchrun");
  return 1;
}

static int from_lightning(const envctx *env, ddplug_world *w, int *status) {
  if (!has_var(env, "LOCAL_RANK") || !has_var(env, "WORLD_SIZE")) return 0;
  envctx e = *env;
  e.source = "Lightning launcher variables";
  int64_t local_rank = 0, ws = 0, node_rank = 0, lws = -1, v;
  if (read_int_var(&e, "WORLD_SIZE", 1, MAX_WORLD, &ws, status) < 0) return -1;
  if (read_int_var(&e, "LOCAL_RANK", 0, MAX_WORLD - 1, &local_rank, status) < 0)
    return -1;
  int r = read_int_var(&e, "NODE_RANK", 0, MAX_WORLD - 1, &v, status);
  if (r < 0) return -1;
  if (r) node_rank = v;
  r = read_int_var(&e, "LOCAL_WORLD_SIZE", 1, MAX_WORLD, &v, status);
  if (r < 0) return -1;
  if (r) lws = v;
  int64_t rank;
  if (node_rank == 0) {
    rank = local_rank;
  } else if (lws > 0) {
    rank = node_rank * lws + local_rank;
  } else {
    *status = ddplug__err(
        DDPLUG_E_CONFIG,
        "NODE_RANK=%lld and LOCAL_RANK=%lld are set without RANK or "
        "LOCAL_WORLD_SIZE (Lightning launcher variables): the global rank "
        "cannot be computed; set LOCAL_WORLD_SIZE (processes per node) or "
        "RANK, or set the world explicitly in the config",
        (long long)node_rank, (long long)local_rank);
    return -1;
  }
  if (lws > 0 && check_rank_below("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE",
                                  lws, e.source, status) < 0)
    return -1;
  if (rank >= ws) {
    *status = ddplug__err(DDPLUG_E_CONFIG,
                          "NODE_RANK=%lld, LOCAL_RANK=%lld give rank %lld, "
                          "which is not below WORLD_SIZE=%lld (%s)",
                          (long long)node_rank, (long long)local_rank,
                          (long long)rank, (long long)ws, e.source);
    return -1;
  }
  w->rank = (int32_t)rank;
  w->world_size = (int32_t)ws;
  w->local_rank = (int32_t)local_rank;
  w->local_world_size = (int32_t)lws;
  w->node_rank = (int32_t)node_rank;
  set_source(w, "lightning");
  return 1;
}

/* One MPI launcher's variables: rank and size (both, or neither), and the
 * local ones where it sets them. 1 applied, 0 not, -1 error. */
static int mpi_vars(const envctx *env, const char *rank_var, const char *size_var,
                    const char *local_var, const char *local_size_var, const char *src,
                    ddplug_world *w, int *status) {
  if (!has_var(env, rank_var)) return 0;
  envctx e = *env;
  e.source = src;
  int64_t rank = 0, ws = 0, v;
  if (read_int_var(&e, rank_var, 0, MAX_WORLD - 1, &rank, status) < 0) return -1;
  int r = size_var ? read_int_var(&e, size_var, 1, MAX_WORLD, &ws, status) : 0;
  if (r < 0) return -1;
  if (r && check_rank_below(rank_var, rank, size_var, ws, e.source, status) < 0) return -1;
  w->rank = (int32_t)rank;
  w->world_size = (int32_t)ws; /* 0: unknown until the plugin's bootstrap */
  int64_t lws = -1;
  if (local_size_var && (r = read_int_var(&e, local_size_var, 1, MAX_WORLD, &v, status)) != 0) {
    if (r < 0) return -1;
    w->local_world_size = (int32_t)(lws = v);
  }
  if (local_var && (r = read_int_var(&e, local_var, 0, MAX_WORLD - 1, &v, status)) != 0) {
    if (r < 0) return -1;
    if (lws > 0 && check_rank_below(local_var, v, local_size_var, lws, e.source, status) < 0)
      return -1;
    w->local_rank = (int32_t)v;
  }
  set_source(w, "mpi");
  return 1;
}

static int from_mpi(const envctx *env, ddplug_world *w, int *status) {
  int r = mpi_vars(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                   "Open MPI launcher variables", w, status);
  if (r == 0 && has_var(env, "PMI_SIZE"))
    r = mpi_vars(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                 "PMI launcher variables", w, status);
  if (r == 0 && has_var(env, "PMIX_RANK"))
    r = mpi_vars(env, "PMIX_RANK", has_var(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : NULL,
                 has_var(env, "SLURM_NTASKS") ? "SLURM_LOCALID" : NULL, NULL,
                 "PMIx launcher variables", w, status);
  return r;
}

static int from_slurm(const envctx *env, ddplug_world *w, int *status) {
  if (!has_var(env, "SLURM_PROCID") || !has_var(env, "SLURM_NTASKS")) return 0;
  envctx e = *env;
  e.source = "SLURM variables";
  int64_t rank = 0, ws = 0, v;
  if (read_int_var(&e, "SLURM_PROCID", 0, MAX_WORLD - 1, &rank, status) < 0)
    return -1;
  if (read_int_var(&e, "SLURM_NTASKS", 1, MAX_WORLD, &ws, status) < 0) return -1;
  if (check_rank_below("SLURM_PROCID", rank, "SLURM_NTASKS", ws, e.source,
                       status) < 0)
    return -1;
  w->rank = (int32_t)rank;
  w->world_size = (int32_t)ws;
  int r;
  if ((r = read_int_var(&e, "SLURM_LOCALID", 0, MAX_WORLD - 1, &v, status)) < 0)
    return -1;
  if (r) w->local_rank = (int32_t)v;
  if ((r = read_int_var(&e, "SLURM_NODEID", 0, MAX_WORLD - 1, &v, status)) < 0)
    return -1;
  if (r) w->node_rank = (int32_t)v;
  set_source(w, "slurm");
  return 1;
}

/* Rendezvous address and port. */
static int resolve_master(const ddplug_config *cfg, const envctx *env,
                          ddplug_world *w, int *status) {
  char addr[256] = "";
  int64_t port = -1;
  int r = cfg_str(cfg, "rendezvous.addr", addr, sizeof addr, status);
  if (r < 0) return -1;
  const char *addr_from = r ? "config rendezvous.addr" : NULL;
  int64_t v;
  r = cfg_int(cfg, "rendezvous.port", &v, status);
  if (r < 0) return -1;
  if (r) port = v;
  const char *port_from = r ? "config rendezvous.port" : NULL;

  /* What the caller's world said (ddplug_open_options.world). */
  if (!addr_from && w->master_addr[0]) {
    ddplug__strlcpy(addr, w->master_addr, sizeof addr);
    addr_from = "the caller's world";
  }
  if (!port_from && w->master_port > 0) {
    port = w->master_port;
    port_from = "the caller's world";
  }
  envctx e = *env;
  e.source = "rendezvous variables";
  if (!addr_from && has_var(&e, "MASTER_ADDR")) {
    ddplug__strlcpy(addr, e.get("MASTER_ADDR", e.user), sizeof addr);
    addr_from = "MASTER_ADDR";
  }
  if (!port_from) {
    r = read_int_var(&e, "MASTER_PORT", 0, 65535, &v, status);
    if (r < 0) return -1;
    if (r) {
      port = v;
      port_from = "MASTER_PORT";
    }
  }
  if (!strcmp(w->source, "slurm")) {
    if (!addr_from && has_var(&e, "SLURM_LAUNCH_NODE_IPADDR")) {
      ddplug__strlcpy(addr, e.get("SLURM_LAUNCH_NODE_IPADDR", e.user),
                      sizeof addr);
      addr_from = "SLURM_LAUNCH_NODE_IPADDR";
    }
    if (!port_from) {
      r = read_int_var(&e, "SLURM_JOB_ID", 0, INT64_MAX, &v, status);
      if (r < 0) return -1;
      if (r) {
        port = 10000 + v % 20000;
        port_from = "SLURM_JOB_ID";
      }
    }
  }
  /* An MPI launcher without a rendezvous: the plugin's bootstrap finds
   * rank 0 (ddplug_open). */
  if (!addr_from && !port_from && !strcmp(w->source, "mpi")) {
    w->master_addr[0] = '\0';
    w->master_port = 0;
    return 0;
  }
  if (!strcmp(w->source, "mpi") && w->world_size == 0) {
    *status = ddplug__err(DDPLUG_E_CONFIG,
                          "PMIX_RANK=%d is set without a world size (no SLURM_NTASKS) but a "
                          "rendezvous %s is: set WORLD_SIZE and RANK as well, or leave the "
                          "rendezvous out and let the mpi plugin learn the world from MPI",
                          w->rank, addr_from ? addr_from : port_from);
    return -1;
  }
  if (w->world_size > 1) {
    if (!addr_from) {
      *status = ddplug__err(
          DDPLUG_E_CONFIG,
          "world size is %d (%s) but no rendezvous address is set: set "
          "MASTER_ADDR (and MASTER_PORT) to rank 0's host, or "
          "rendezvous.addr/port in the config",
          w->world_size, w->source);
      return -1;
    }
    if (!port_from || port == 0) {
      *status = ddplug__err(
          DDPLUG_E_CONFIG,
          "world size is %d (%s) but no rendezvous port is set: set "
          "MASTER_PORT, or rendezvous.port in the config (a free TCP port on "
          "rank 0's host, the same on every rank)",
          w->world_size, w->source);
      return -1;
    }
  }
  ddplug__strlcpy(w->master_addr, addr, sizeof w->master_addr);
  w->master_port = port < 0 ? 0 : (int32_t)port;
  return 0;
}

int ddplug__world_discover_env(const ddplug_config *cfg, ddplug__env_fn get,
                               void *env_user, ddplug_world *out) {
  if (!out || !get)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_world_discover: out must not be NULL");
  if (out->struct_size < offsetof(ddplug_world, source) + sizeof out->source)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_world_discover: out->struct_size %u is too "
                       "small (initialise it with DDPLUG_WORLD_INIT)",
                       out->struct_size);
  ddplug_world w;
  memset(&w, 0, sizeof w);
  w.struct_size = sizeof w;
  w.abi_version = DDPLUG_ABI_VERSION;
  w.local_rank = w.local_world_size = w.node_rank = -1;
  envctx e = {get, env_user, "environment"};
  int status = DDPLUG_OK;
  int r = from_config(cfg, &w, &status);
  if (r == 0) r = from_torchrun(&e, &w, &status);
  if (r == 0) r = from_lightning(&e, &w, &status);
  if (r == 0) r = from_mpi(&e, &w, &status);
  if (r == 0) r = from_slurm(&e, &w, &status);
  if (r < 0) return status;
  if (r == 0 && has_var(&e, "WORLD_SIZE")) {
    const char *ws = get("WORLD_SIZE", env_user);
    if (strcmp(ws, "1") != 0)
      return ddplug__err(DDPLUG_E_CONFIG,
                         "WORLD_SIZE=%s is set but neither RANK (torchrun) "
                         "nor LOCAL_RANK (Lightning's launcher) is: this "
                         "process cannot know its rank; set RANK, or the "
                         "world explicitly in the config",
                         ws);
  }
  if (r == 0) {
    w.rank = 0;
    w.world_size = 1;
    w.local_rank = 0;
    w.local_world_size = 1;
    w.node_rank = 0;
    set_source(&w, "single");
  }
  if (resolve_master(cfg, &e, &w, &status) < 0) return status;
  uint32_t keep_size = out->struct_size;
  memcpy(out, &w, DDPLUG__MIN((size_t)keep_size, sizeof w));
  out->struct_size = keep_size;
  return DDPLUG_OK;
}

/* A caller's world field: -1 (unknown) or lo..hi. */
static int caller_field(const char *name, int32_t v, int32_t lo, int32_t hi, int unknown_ok) {
  if ((unknown_ok && v == -1) || (v >= lo && v <= hi)) return DDPLUG_OK;
  return ddplug__err(DDPLUG_E_CONFIG,
                     "ddplug_open: options.world.%s = %d is out of range %d..%d%s", name, v,
                     lo, hi, unknown_ok ? " (or -1: unknown)" : "");
}

int ddplug__world_from_caller(const ddplug_config *cfg, ddplug__env_fn get, void *env_user,
                              const ddplug_world *given, const char *rdzv_addr,
                              int32_t rdzv_port, ddplug_world *out) {
  if (!given || given->struct_size < offsetof(ddplug_world, source))
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "ddplug_open: options.world must be initialised with "
                       "DDPLUG_WORLD_INIT (struct_size %u)",
                       given ? given->struct_size : 0);
  ddplug_world w;
  memset(&w, 0, sizeof w);
  memcpy(&w, given, DDPLUG__MIN((size_t)given->struct_size, sizeof w));
  w.struct_size = sizeof w;
  w.abi_version = DDPLUG_ABI_VERSION;
  w.master_addr[sizeof w.master_addr - 1] = '\0';
  int s = caller_field("world_size", w.world_size, 1, MAX_WORLD, 0);
  if (s == DDPLUG_OK) s = caller_field("rank", w.rank, 0, w.world_size - 1, 0);
  if (s == DDPLUG_OK) s = caller_field("local_world_size", w.local_world_size, 1, w.world_size, 1);
  if (s == DDPLUG_OK)
    s = caller_field("local_rank", w.local_rank, 0,
                     w.local_world_size > 0 ? w.local_world_size - 1 : w.world_size - 1, 1);
  if (s == DDPLUG_OK) s = caller_field("node_rank", w.node_rank, 0, w.world_size - 1, 1);
  if (s == DDPLUG_OK) s = caller_field("master_port", w.master_port, 0, 65535, 0);
  if (s == DDPLUG_OK && (rdzv_addr || rdzv_port))
    s = caller_field("rendezvous_port", rdzv_port, rdzv_port < 0 ? -1 : 1,
                     rdzv_port < 0 ? -1 : 65535, 0);
  if (s == DDPLUG_OK && rdzv_port < 0 && w.world_size > 1)
    s = ddplug__err(DDPLUG_E_CONFIG,
                    "ddplug_open: options.rendezvous_port -1 (any free port) needs a world of "
                    "one, not %d: the other ranks must know the port",
                    w.world_size);
  if (s != DDPLUG_OK) return s;
  set_source(&w, "caller");
  /* An override replaces the config's rendezvous and the environment. */
  const ddplug_config *rdzv_cfg = cfg;
  if (rdzv_addr) ddplug__strlcpy(w.master_addr, rdzv_addr, sizeof w.master_addr);
  if (rdzv_port) w.master_port = rdzv_port > 0 ? rdzv_port : 0;
  if (rdzv_addr || rdzv_port) rdzv_cfg = NULL;
  envctx e = {get, env_user, "environment"};
  int status = DDPLUG_OK;
  if (resolve_master(rdzv_cfg, &e, &w, &status) < 0) return status;
  if (rdzv_port < 0) w.master_port = 0; /* any free port: not MASTER_PORT either */
  *out = w;
  return DDPLUG_OK;
}

static const char *real_getenv(const char *name, void *user) {
  DDPLUG__UNUSED(user);
  return getenv(name);
}

DDPLUG_API int ddplug_world_discover(const ddplug_config *cfg,
                                     ddplug_world *out) {
  return ddplug__world_discover_env(cfg, real_getenv, NULL, out);
}

int ddplug__world_given(const ddplug_config *cfg, const ddplug_world *given,
                        const char *rdzv_addr, int32_t rdzv_port, ddplug_world *out) {
  return ddplug__world_from_caller(cfg, real_getenv, NULL, given, rdzv_addr, rdzv_port, out);
}
