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
 *                    address space only until allocated. "auto" (default):
 *                    the size of /dev/shm; an integer, a multiple of 4096
 *                    up to 2^46; 0: mem_alloc hands out ordinary memory.
 *   cma              whether allreduces of unregistered buffers copy straight
 *                    between the ranks' address spaces (process_vm_readv/
 *                    writev). "auto" (default): where the system allows it
 *                    and the kernel's copy is at least CP_CMA_MIN_SPEED of
 *                    memcpy's speed (group_create measures both; on some
 *                    virtual machines it is a third, and the pipeline wins);
 *                    true: wherever the system allows it; false: never.
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
 * Unknown keys, wrong types and out-of-range values are DDPLUG_E_CONFIG
 * naming plugin_options.<key>.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <arpa/inet.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cpu.h"

const char cp_option_keys[] =
    "addr, chunk_bytes, cma, cma_min_bytes, nt_store_bytes, progress_thread, "
    "registered_bytes, slots, small_msg_bytes, spin_us, tcp_chunk_bytes";

typedef struct int_knob {
  const char *key;
  int64_t min, max, multiple;
  size_t offset; /* of the field in cp_options */
  int size;      /* 4: uint32_t, 8: uint64_t/int64_t */
} int_knob;

static const int_knob knobs[] = {
    {"chunk_bytes", 4096, 16 << 20, 4096, offsetof(cp_options, chunk_bytes), 8},
    {"small_msg_bytes", 0, 1 << 20, 1, offsetof(cp_options, small_msg_bytes), 8},
    {"spin_us", 0, 100000, 1, offsetof(cp_options, spin_us), 8},
    {"slots", 2, 16, 1, offsetof(cp_options, slots), 4},
    {"tcp_chunk_bytes", 4096, 64 << 20, 64, offsetof(cp_options, tcp_chunk_bytes), 8},
    {"nt_store_bytes", 0, INT64_MAX, 1, offsetof(cp_options, nt_bytes), 8},
    {"registered_bytes", 0, 1ll << 46, 4096, offsetof(cp_options, registered_bytes), 8},
    {"cma_min_bytes", 0, 1ll << 40, 1, offsetof(cp_options, cma_min_bytes), 8},
};

static const char *json_type_name(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number with a fraction";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
  }
}

static int read_int(const json_t *v, const int_knob *k, int64_t *out) {
  if (!json_is_integer(v))
    return cp_err(DDPLUG_E_CONFIG,
                  "plugin_options.%s: expected an integer, got %s", k->key,
                  json_type_name(v));
  json_int_t x = json_integer_value(v);
  if (x < k->min || x > k->max)
    return cp_err(DDPLUG_E_CONFIG,
                  "plugin_options.%s: %lld is out of range [%lld, %lld]",
                  k->key, (long long)x, (long long)k->min, (long long)k->max);
  if (x % k->multiple != 0)
    return cp_err(DDPLUG_E_CONFIG,
                  "plugin_options.%s: %lld is not a multiple of %lld", k->key,
                  (long long)x, (long long)k->multiple);
  *out = x;
  return DDPLUG_OK;
}

/* Parse options_json into *out (defaults first). Returns DDPLUG_OK or
 * DDPLUG_E_CONFIG with the sentence naming the key. *out is written even on
 * failure (with defaults and whatever parsed); callers discard it then.
 * Thread-safe. */
int cp_options_parse(const char *options_json, cp_options *out) {
  memset(out, 0, sizeof *out);
  out->chunk_bytes = 256 << 10;
  out->small_msg_bytes = 16 << 10;
  out->spin_us = -1;
  out->slots = 8;
  out->tcp_chunk_bytes = 256 << 10;
  out->nt_bytes = 8 << 20;
  out->registered_bytes = -1;
  out->cma = CP_CMA_AUTO;
  out->cma_min_bytes = 64 << 10;
  out->progress_thread = CP_PROGRESS_AUTO;
  if (!options_json || !*options_json) return DDPLUG_OK;

  json_error_t jerr;
  json_t *root = json_loads(options_json, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return cp_err(DDPLUG_E_CONFIG, "plugin_options:%d:%d: %s", jerr.line,
                  jerr.column, jerr.text);
  int st = DDPLUG_OK;
  if (!json_is_object(root)) {
    st = cp_err(DDPLUG_E_CONFIG,
                "plugin_options: expected an object for plugin cpu, got %s",
                json_type_name(root));
    goto done;
  }
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    const int_knob *k = NULL;
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
      if (strcmp(key, knobs[i].key) == 0) k = &knobs[i];
    if (k && k->offset == offsetof(cp_options, registered_bytes) && json_is_string(v) &&
        strcmp(json_string_value(v), "auto") == 0) {
      out->registered_bytes = -1;
    } else if (k) {
      int64_t x = 0;
      if (k->offset == offsetof(cp_options, registered_bytes) && !json_is_integer(v)) {
        st = cp_err(DDPLUG_E_CONFIG,
                    "plugin_options.registered_bytes: expected \"auto\" or an "
                    "integer, got %s", json_type_name(v));
        goto done;
      }
      if ((st = read_int(v, k, &x)) != DDPLUG_OK) goto done;
      if (k->offset == offsetof(cp_options, slots) && (x & (x - 1))) {
        st = cp_err(DDPLUG_E_CONFIG,
                    "plugin_options.slots: %lld is not a power of two "
                    "(2, 4, 8 or 16)", (long long)x);
        goto done;
      }
      char *field = (char *)out + k->offset;
      if (k->size == 4) {
        uint32_t u = (uint32_t)x;
        memcpy(field, &u, sizeof u);
      } else {
        memcpy(field, &x, sizeof x);
      }
    } else if (strcmp(key, "addr") == 0) {
      struct in_addr a;
      if (!json_is_string(v)) {
        st = cp_err(DDPLUG_E_CONFIG,
                    "plugin_options.addr: expected a string, got %s",
                    json_type_name(v));
        goto done;
      }
      const char *s = json_string_value(v);
      if (strlen(s) >= sizeof out->addr || inet_pton(AF_INET, s, &a) != 1) {
        st = cp_err(DDPLUG_E_CONFIG,
                    "plugin_options.addr: '%s' is not an IPv4 address "
                    "(e.g. \"10.0.0.5\")", s);
        goto done;
      }
      snprintf(out->addr, sizeof out->addr, "%s", s);
    } else if (strcmp(key, "cma") == 0) {
      if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        out->cma = CP_CMA_AUTO;
      } else if (json_is_boolean(v)) {
        out->cma = json_is_true(v) ? CP_CMA_ON : CP_CMA_OFF;
      } else {
        st = cp_err(DDPLUG_E_CONFIG,
                    "plugin_options.cma: expected \"auto\", true or false, got %s%s%s%s",
                    json_type_name(v), json_is_string(v) ? " '" : "",
                    json_is_string(v) ? json_string_value(v) : "", json_is_string(v) ? "'" : "");
        goto done;
      }
    } else if (strcmp(key, "progress_thread") == 0) {
      const char *s = json_is_string(v) ? json_string_value(v) : NULL;
      if (s && strcmp(s, "auto") == 0) out->progress_thread = CP_PROGRESS_AUTO;
      else if (s && strcmp(s, "on") == 0) out->progress_thread = CP_PROGRESS_ON;
      else if (s && strcmp(s, "off") == 0) out->progress_thread = CP_PROGRESS_OFF;
      else {
        if (s)
          st = cp_err(DDPLUG_E_CONFIG,
                      "plugin_options.progress_thread: '%s' is not one of \"auto\", "
                      "\"on\", \"off\"", s);
        else
          st = cp_err(DDPLUG_E_CONFIG,
                      "plugin_options.progress_thread: expected \"auto\", \"on\" or "
                      "\"off\", got %s", json_type_name(v));
        goto done;
      }
    } else {
      st = cp_err(DDPLUG_E_CONFIG,
                  "plugin_options.%s: unknown key for plugin cpu (known: %s)",
                  key, cp_option_keys);
      goto done;
    }
  }
done:
  json_decref(root);
  return st;
}
