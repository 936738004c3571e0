/*
 * options.c — the mpi plugin's knobs, from the config's "plugin_options":
 *
 *   check_mismatch  "on" (default) / "off": compare every collective's
 *                   (seq, kind, count, dtype, op, root) across ranks before
 *                   its data moves: one allreduce of a 192-byte descriptor
 *                   on a communicator of its own (README.md, "Mismatched
 *                   collectives", says what it costs). A mismatch is
 *                   MISMATCH on every rank naming two ranks and what each
 *                   called; nothing moves, the group stays usable. "off":
 *                   MPI gets the calls as they are (a mismatch is then
 *                   garbage, an MPI error or a hang until the timeout).
 *   intra_node      "auto" (default), "mpi" or "cpu": who reduces inside a
 *                   node in an allreduce. "mpi": MPI, flat over all ranks
 *                   (its own shared-memory transport). "cpu": hierarchical —
 *                   the node's ranks reduce through the cpu plugin's shared
 *                   memory, the node leaders allreduce through MPI, the
 *                   leaders broadcast in the node. "auto": what README.md,
 *                   "Inside a node", decided from the measurement.
 *   slow_ms         a collective still pending after this many ms
 *                   publishes this rank's arrival in the store, so that a
 *                   TIMEOUT can name the ranks that never came (default
 *                   250; 1 .. 3600000). Nothing is published on the fast
 *                   path.
 *   shrink          "auto" (default) or "recreate": how the group is
 *                   re-formed in place after a lost rank (elastic.on_peer_lost
 *                   = "shrink"). "auto": ULFM's MPIX_Comm_shrink where the
 *                   MPI has ULFM and the job runs with fault tolerance
 *                   (shrink.c), else a new group over the survivors.
 *                   "recreate": always a new group (group_shrink declines).
 *
 * Built into the front end too (its table declares the same options, so
 * `ddplug info mpi` lists them on a machine without MPI).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "frontend.h"

static const char *const k_on_off[] = {"on", "off", NULL};
static const char *const k_intra[] = {"auto", "mpi", "cpu", NULL};
static const char *const k_shrink[] = {"auto", "recreate", NULL};

static const ddplug_option opt_check_mismatch = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "check_mismatch",
    .type = DDPLUG_OPTION_STRING,
    .choices = k_on_off,
    .default_json = "\"on\"",
    .description = "Compare every collective's seq, kind, count, dtype, op and root across "
                   "ranks before its data moves (one small allreduce): MISMATCH instead of "
                   "garbage or a hang."};
static const ddplug_option opt_intra_node = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "intra_node",
    .type = DDPLUG_OPTION_STRING,
    .choices = k_intra,
    .default_json = "\"auto\"",
    .description = "Who reduces inside a node in an allreduce: mpi (flat, MPI's shared "
                   "memory), cpu (hierarchical: the cpu plugin's shared memory in the node, MPI "
                   "between node leaders), auto (the measured choice, plugins/mpi/README.md)."};
static const ddplug_option opt_slow_ms = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "slow_ms",
    .type = DDPLUG_OPTION_INT,
    .int_min = 1,
    .int_max = 3600000,
    .default_json = "250",
    .description = "A collective pending this long publishes this rank's arrival in the "
                   "store, so that a timeout names the ranks that never came."};

static const ddplug_option opt_shrink = {
    .struct_size = sizeof(ddplug_option),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "shrink",
    .type = DDPLUG_OPTION_STRING,
    .choices = k_shrink,
    .default_json = "\"auto\"",
    .description = "How the group is re-formed after a lost rank (elastic.on_peer_lost = "
                   "shrink): auto (ULFM's MPIX_Comm_shrink where the MPI has ULFM and the job "
                   "runs with fault tolerance, else a new group over the survivors), recreate "
                   "(always a new group)."};

const ddplug_option *const ddmpi_option_decls[] = {&opt_check_mismatch, &opt_intra_node,
                                                   &opt_slow_ms, &opt_shrink, NULL};

#ifdef DDMPI_BACKEND
#include "internal.h"

/* See internal.h. */
int ddmpi_options_read(const ddplug_host_services *svc, ddmpi_options *out, char *err,
                       size_t cap) {
  memset(out, 0, sizeof *out);
  char word[16];
  uint64_t len = 0;
  int st = svc->option_string(svc->host, "check_mismatch", word, sizeof word, &len);
  if (st != DDPLUG_OK) {
    ddmpi_fmt(err, cap, "plugin_options.check_mismatch: cannot be read (status %d)", st);
    return st;
  }
  out->check_mismatch = strcmp(word, "off") != 0;
  st = svc->option_string(svc->host, "intra_node", word, sizeof word, &len);
  if (st != DDPLUG_OK) {
    ddmpi_fmt(err, cap, "plugin_options.intra_node: cannot be read (status %d)", st);
    return st;
  }
  out->intra_node = !strcmp(word, "mpi")   ? DDMPI_INTRA_MPI
                    : !strcmp(word, "cpu") ? DDMPI_INTRA_CPU
                                           : DDMPI_INTRA_AUTO;
  st = svc->option_int(svc->host, "slow_ms", &out->slow_ms);
  if (st != DDPLUG_OK) {
    ddmpi_fmt(err, cap, "plugin_options.slow_ms: cannot be read (status %d)", st);
    return st;
  }
  st = svc->option_string(svc->host, "shrink", word, sizeof word, &len);
  if (st != DDPLUG_OK) {
    ddmpi_fmt(err, cap, "plugin_options.shrink: cannot be read (status %d)", st);
    return st;
  }
  out->shrink_recreate = !strcmp(word, "recreate");
  return DDPLUG_OK;
}
#endif
