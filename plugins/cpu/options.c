/*
 * options.c — the plugin's knobs, from the config's "plugin_options" object.
 *
 *   chunk_bytes      shared-memory pipeline chunk per rank (default 256 KiB;
 *                    4 KiB .. 16 MiB, a multiple of 4096). Each of `slots`
 *                    pipeline slots holds one chunk per local rank, so the
 *                    in-flight working set is slots * local ranks * chunk:
 *                    keep it inside the last-level cache.
 *   small_msg_bytes  messages up to this many bytes per rank take the
 *                    one-shot path (every rank copies its data into shared
 *                    memory once and reduces all of it itself: one
 *                    synchronisation instead of three per chunk). Default
 *                    16 KiB; 0 .. 1 MiB; 0 disables the path.
 *   spin_us          how long a waiting rank spins before it sleeps on a
 *                    futex. Default: 50 when the node's ranks fit its
 *                    online CPUs, else 2 (ranks outnumbering cores must
 *                    yield the CPU to the rank they wait for). 0 .. 100000.
 *   slots            pipeline depth: chunks a rank may run ahead (2, 4, 8
 *                    or 16; default 8).
 *   tcp_chunk_bytes  unit of pipelining between nodes (default 256 KiB;
 *                    4 KiB .. 64 MiB, a multiple of 64).
 *   nt_store_bytes   outputs of at least this many bytes (per rank) are
 *                    written with non-temporal (streaming) stores: no
 *                    read-for-ownership of the output, and the output does
 *                    not evict the staging slots; smaller outputs stay in
 *                    cache for the caller. Default 8 MiB; 0 disables.
 *   addr             the address other nodes connect to, an IPv4 literal.
 *                    Default: the first non-loopback IPv4 address of an
 *                    interface that is up (127.0.0.1 if none).
 *   registered_bytes registered memory (mem_alloc) per local rank: the
 *                    size of its arena in the node segment, which costs
 *                    address space only until allocated. Left out
 *                    (default): the size of /dev/shm; an integer, a
 *                    multiple of 4096 up to 2^46; 0: mem_alloc hands out
 *                    ordinary memory.
 *   cma              whether allreduces of unregistered buffers copy straight
 *                    between the ranks' address spaces (process_vm_readv/
 *                    writev). "auto" (default): where the system allows it
 *                    and the kernel's copy is at least DDCPU_CMA_MIN_SPEED of
 *                    memcpy's speed (local rank 0 times both in CPU time at
 *                    group_create, direct.c; on some virtual machines it is
 *                    a third, and the pipeline wins);
 *                    "on": wherever the system allows it; "off": never.
 *   cma_min_bytes    unregistered allreduces of at least this many bytes
 *                    per rank take that single copy; smaller ones the
 *                    pipeline (default 65536; 0 .. 2^40).
 *   progress_thread  "auto" (default), "on" or "off": whether the group's
 *                    progress thread runs collectives nobody waits for yet
 *                    (a trainer's gradient buckets during backward) or
 *                    leaves them to the caller's wait. "auto" is on, by
 *                    measurement (README.md, "Overlap"). The thread
 *                    watches peers either way.
 *
 * The plugin declares these (ddcpu_option_decls, plugin ABI 1.3): the runtime
 * checks the user's plugin_options against the declarations (unknown keys,
 * types, ranges, multiples: DDPLUG_E_CONFIG naming plugin_options.<key>)
 * and hands the values over typed; what only the plugin can judge (slots a
 * power of two, addr an IPv4 literal) is checked here.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define DECL(n, lo, hi, mul, def, d)                                              \
  static const ddplug_option opt_##n = {                                          \
      .struct_size = sizeof(ddplug_option), .abi_version = DDPLUG_PLUGIN_ABI_VERSION, \
      .name = #n, .type = DDPLUG_OPTION_INT, .int_min = lo, .int_max = hi,         \
      .int_multiple = mul, .default_json = def, .description = d}

DECL(chunk_bytes, 4096, 16 << 20, 4096, "262144",
     "Shared-memory pipeline chunk per rank and slot, in bytes; keep slots x local ranks x "
     "chunk inside the last-level cache.");
DECL(small_msg_bytes, 0, 1 << 20, 0, "16384",
     "Messages up to this many bytes per rank take the one-shot path (one synchronisation); "
     "0 disables it.");
DECL(spin_us, 0, 100000, 0, NULL,
     "How long a waiting rank spins before it sleeps; default 50 when the node's ranks fit "
     "its CPUs, else 2.");
DECL(slots, 2, 16, 0, "8", "Pipeline depth: chunks a rank may run ahead (2, 4, 8 or 16).");
DECL(tcp_chunk_bytes, 4096, 64 << 20, 64, "262144",
     "Unit of pipelining between nodes, in bytes.");
DECL(nt_store_bytes, 0, INT64_MAX, 0, "8388608",
     "Outputs of at least this many bytes per rank are written with streaming stores; 0 "
     "disables them.");
DECL(registered_bytes, 0, 1ll << 46, 4096, NULL,
     "Registered memory per local rank (its arena in the node segment); left out: the size of "
     "/dev/shm; 0: mem_alloc hands out ordinary memory.");
DECL(cma_min_bytes, 0, 1ll << 40, 0, "65536",
     "Unregistered allreduces of at least this many bytes per rank take the kernel's single "
     "copy (where cma allows it).");
#undef DECL
static const char *const k_auto_on_off[] = {"auto", "on", "off", NULL};
static const ddplug_option opt_cma = {
    .struct_size = sizeof(ddplug_option), .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "cma", .type = DDPLUG_OPTION_STRING, .choices = k_auto_on_off,
    .default_json = "\"auto\"",
    .description = "Whether allreduces of unregistered buffers copy straight between the "
                   "ranks' address spaces: auto (where allowed and fast enough), on, off."};
static const ddplug_option opt_progress_thread = {
    .struct_size = sizeof(ddplug_option), .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "progress_thread", .type = DDPLUG_OPTION_STRING, .choices = k_auto_on_off,
    .default_json = "\"auto\"",
    .description = "Whether the progress thread runs collectives nobody waits for yet (auto: "
                   "on, by measurement) or leaves them to the caller's wait."};
static const ddplug_option opt_addr = {
    .struct_size = sizeof(ddplug_option), .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "addr", .type = DDPLUG_OPTION_STRING,
    .description = "The IPv4 address other nodes connect to; default: the first "
                   "non-loopback IPv4 address of an interface that is up."};

const ddplug_option *const ddcpu_option_decls[] = {
    &opt_chunk_bytes,      &opt_small_msg_bytes, &opt_spin_us,
    &opt_slots,            &opt_tcp_chunk_bytes, &opt_nt_store_bytes,
    &opt_addr,             &opt_registered_bytes, &opt_cma,
    &opt_cma_min_bytes,    &opt_progress_thread, NULL,
};

/* How a declared option lands in ddcpu_options. */
enum {
  READ_BYTES,        /* an int, stored as uint64_t                          */
  READ_INT_OR_AUTO,  /* an int64_t, -1 when left out (the plugin decides)   */
  READ_POWER_OF_TWO, /* an int that must be a power of two, as uint32_t     */
  READ_AUTO_ON_OFF,  /* "auto" / "on" / "off" as DDCPU_*_AUTO / _ON / _OFF  */
  READ_IPV4          /* an IPv4 literal, kept as text; "" when left out     */
};
/* READ_AUTO_ON_OFF serves both option enums. */
_Static_assert((int)DDCPU_CMA_AUTO == (int)DDCPU_PROGRESS_AUTO &&
                   (int)DDCPU_CMA_ON == (int)DDCPU_PROGRESS_ON &&
                   (int)DDCPU_CMA_OFF == (int)DDCPU_PROGRESS_OFF,
               "cma and progress_thread share one auto/on/off mapping");

/* Every declared option, in the order it is read (the first problem is the
 * one reported). */
static const struct option_field {
  const ddplug_option *decl;
  int how;
  size_t offset; /* in ddcpu_options */
} k_fields[] = {
    {&opt_chunk_bytes, READ_BYTES, offsetof(ddcpu_options, chunk_bytes)},
    {&opt_small_msg_bytes, READ_BYTES, offsetof(ddcpu_options, small_msg_bytes)},
    {&opt_spin_us, READ_INT_OR_AUTO, offsetof(ddcpu_options, spin_us)},
    {&opt_slots, READ_POWER_OF_TWO, offsetof(ddcpu_options, slots)},
    {&opt_tcp_chunk_bytes, READ_BYTES, offsetof(ddcpu_options, tcp_chunk_bytes)},
    {&opt_nt_store_bytes, READ_BYTES, offsetof(ddcpu_options, nt_bytes)},
    {&opt_registered_bytes, READ_INT_OR_AUTO, offsetof(ddcpu_options, registered_bytes)},
    {&opt_cma_min_bytes, READ_BYTES, offsetof(ddcpu_options, cma_min_bytes)},
    {&opt_cma, READ_AUTO_ON_OFF, offsetof(ddcpu_options, cma)},
    {&opt_progress_thread, READ_AUTO_ON_OFF, offsetof(ddcpu_options, progress_thread)},
    {&opt_addr, READ_IPV4, offsetof(ddcpu_options, addr)},
};

/* Read one option through svc's typed getters into its field of out. */
static int read_field(const ddplug_host_services *svc, const struct option_field *f,
                      ddcpu_options *out) {
  const char *name = f->decl->name;
  char *field = (char *)out + f->offset;
  int64_t v = 0;
  int st;
  switch (f->how) {
    case READ_BYTES:
      if ((st = svc->option_int(svc->host, name, &v)) != DDPLUG_OK) return st;
      *(uint64_t *)(void *)field = (uint64_t)v;
      return DDPLUG_OK;
    case READ_INT_OR_AUTO:
      st = svc->option_int(svc->host, name, &v);
      if (st != DDPLUG_OK && st != DDPLUG_E_NOT_FOUND) return st;
      *(int64_t *)(void *)field = st == DDPLUG_OK ? v : -1;
      return DDPLUG_OK;
    case READ_POWER_OF_TWO:
      if ((st = svc->option_int(svc->host, name, &v)) != DDPLUG_OK) return st;
      if (v & (v - 1))
        return ddcpu_err(DDPLUG_E_CONFIG,
                         "plugin_options.%s: %lld is not a power of two (2, 4, 8 or 16)",
                         name, (long long)v);
      *(uint32_t *)(void *)field = (uint32_t)v;
      return DDPLUG_OK;
    case READ_AUTO_ON_OFF: {
      char word[8];
      uint64_t len = 0;
      if ((st = svc->option_string(svc->host, name, word, sizeof word, &len)) != DDPLUG_OK)
        return st;
      *(int *)(void *)field = !strcmp(word, "on")    ? DDCPU_CMA_ON
                              : !strcmp(word, "off") ? DDCPU_CMA_OFF
                                                     : DDCPU_CMA_AUTO;
      return DDPLUG_OK;
    }
    case READ_IPV4: {
      char addr[256];
      uint64_t len = 0;
      st = svc->option_string(svc->host, name, addr, sizeof addr, &len);
      if (st == DDPLUG_E_NOT_FOUND) return DDPLUG_OK;
      struct in_addr a;
      if (st != DDPLUG_OK || len >= sizeof out->addr || inet_pton(AF_INET, addr, &a) != 1)
        return ddcpu_err(DDPLUG_E_CONFIG,
                         "plugin_options.%s: '%.64s' is not an IPv4 address (e.g. \"10.0.0.5\")",
                         name, st == DDPLUG_OK ? addr : "(too long)");
      memcpy(field, addr, len + 1); /* len < sizeof out->addr: checked */
      return DDPLUG_OK;
    }
  }
  return DDPLUG_E_INTERNAL;
}

/* See internal.h. */
int ddcpu_options_read(const ddplug_host_services *svc, ddcpu_options *out) {
  memset(out, 0, sizeof *out);
  for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++) {
    int st = read_field(svc, &k_fields[i], out);
    if (st != DDPLUG_OK) return st;
  }
  return DDPLUG_OK;
}
