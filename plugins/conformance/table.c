/* table.c — the plugin's table, read the way the runtime reads
 * it but checked more strictly: the entry point, the table's size and
 * version, identity (the name must match the file name), capabilities
 * against the slots filled, masks, and which slots are declared (reported
 * to the command as a "D" line, for the slot summary). Runs in a process
 * of its own: the plugin is dlopen'ed here, not in the command. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"

#define CF_KNOWN_CAPS                                                                  \
  (DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_DEVICE_MEMORY | DDPLUG_CAP_ASYNC |              \
   DDPLUG_CAP_MULTI_NODE | DDPLUG_CAP_MISMATCH_CHECK | DDPLUG_CAP_ABORT |              \
   DDPLUG_CAP_STREAMS | DDPLUG_CAP_SAMPLER | DDPLUG_CAP_REGISTERED_MEMORY |              \
   DDPLUG_CAP_P2P | DDPLUG_CAP_P2P_ANY_SOURCE | DDPLUG_CAP_BOOTSTRAP | DDPLUG_CAP_SHRINK)

static int slot_filled(const void *table, uint32_t size, int slot) {
  size_t off = cf_slots[slot].offset;
  if (off + sizeof(void *) > size) return 0;
  void *fn;
  memcpy(&fn, (const char *)table + off, sizeof fn);
  return fn != NULL;
}

/* The table size each minor version of ABI 1 defines (this header's own
 * minor: the whole struct, whatever minor plugin.h is at). */
static size_t size_of_minor(uint32_t minor) {
  if (minor >= DDPLUG_PLUGIN_ABI_MINOR) return sizeof(ddplug_plugin);
  return minor == 0   ? DDPLUG_PLUGIN_SIZE_1_0
         : minor == 1 ? DDPLUG_PLUGIN_SIZE_1_1
         : minor == 2 ? DDPLUG_PLUGIN_SIZE_1_2
                      : DDPLUG_PLUGIN_SIZE_1_3;
}

void cf_table_rank(cf_rank *r) {
  const char *path = r->plan->path;
  const char *T_ENTRY = "entry point: ddplug_plugin_entry_v1 returns a table";
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    cf_report(r, "table.entry", 0, CF_FAIL, T_ENTRY, "dlopen: %s", dlerror());
    return;
  }
  void *sym = dlsym(dl, DDPLUG_PLUGIN_ENTRY_SYMBOL);
  if (!sym) {
    cf_report(r, "table.entry", 0, CF_FAIL, T_ENTRY,
              "%s does not export %s (build it with ddplug_add_plugin(), which exports "
              "exactly that symbol)", path, DDPLUG_PLUGIN_ENTRY_SYMBOL);
    return;
  }
  ddplug_plugin_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  const ddplug_plugin *t = entry(DDPLUG_PLUGIN_ABI_VERSION);
  if (!t) {
    cf_report(r, "table.entry", 0, CF_FAIL, T_ENTRY,
              "the entry point returned NULL for plugin ABI %u.%u, the version of this ddplug",
              DDPLUG_PLUGIN_ABI_MAJOR, DDPLUG_PLUGIN_ABI_MINOR);
    return;
  }
  const ddplug_plugin *again = entry(DDPLUG_PLUGIN_ABI_VERSION);
  if (again != t)
    cf_report(r, "table.entry", 0, CF_FAIL, T_ENTRY,
              "two calls returned different tables (%p, %p): return one static const table",
              (const void *)t, (const void *)again);
  else
    cf_report(r, "table.entry", 0, CF_PASS, T_ENTRY, "the same static table on every call");

  /* Size and version. */
  uint32_t major = DDPLUG_VERSION_MAJOR_OF(t->abi_version);
  uint32_t minor = DDPLUG_VERSION_MINOR_OF(t->abi_version);
  const char *T_SIZE = "table: abi_version and struct_size agree";
  if (major != DDPLUG_PLUGIN_ABI_MAJOR)
    cf_report(r, "table.size", 0, CF_FAIL, T_SIZE, "abi_version says ABI %u.%u, expected %d.x",
              major, minor, DDPLUG_PLUGIN_ABI_MAJOR);
  else if (t->struct_size < size_of_minor(minor))
    cf_report(r, "table.size", 0, CF_FAIL, T_SIZE,
              "struct_size %u is smaller than ABI 1.%u's table (%zu bytes): set it to "
              "sizeof(ddplug_plugin)", t->struct_size, minor, size_of_minor(minor));
  else if (minor <= DDPLUG_PLUGIN_ABI_MINOR && t->struct_size != size_of_minor(minor))
    cf_report(r, "table.size", 0, CF_FAIL, T_SIZE,
              "struct_size %u is not ABI 1.%u's table size (%zu bytes): set it to "
              "sizeof(ddplug_plugin) of the headers abi_version names",
              t->struct_size, minor, size_of_minor(minor));
  else
    cf_report(r, "table.size", 0, CF_PASS, T_SIZE, "ABI %u.%u, %u bytes%s", major, minor,
              t->struct_size,
              minor > DDPLUG_PLUGIN_ABI_MINOR ? " (newer than this ddplug: its prefix is used)" : "");
  uint32_t size = t->struct_size < sizeof(ddplug_plugin) ? t->struct_size
                                                          : (uint32_t)sizeof(ddplug_plugin);
  if (minor <= DDPLUG_PLUGIN_ABI_MINOR && size > size_of_minor(minor))
    size = (uint32_t)size_of_minor(minor);

  /* Identity. */
  const char *T_NAME = "identity: the table's name is the file's libddplug-<name>.so";
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char expect[300];
  snprintf(expect, sizeof expect, "libddplug-%s.so", t->name ? t->name : "");
  if (!t->name || !*t->name)
    cf_report(r, "table.name", 0, CF_FAIL, T_NAME, "the table has no name");
  else if (strcmp(base, expect) != 0)
    cf_report(r, "table.name", 0, CF_FAIL, T_NAME,
              "the table says '%s' but the file is %s: name the file %s (the runtime finds "
              "plugins by file name, and keys their store namespace by the table's name)",
              t->name, base, expect);
  else
    cf_report(r, "table.name", 0, CF_PASS, T_NAME, "%s", base);
  const char *T_ID = "identity: version and description are set";
  if (!t->version || !*t->version || !t->description || !*t->description)
    cf_report(r, "table.identity", 0, CF_FAIL, T_ID,
              "version '%s', description '%s': both should be non-empty static strings "
              "(ddplug info and the startup checks show them)",
              t->version ? t->version : "(null)", t->description ? t->description : "(null)");
  else
    cf_report(r, "table.identity", 0, CF_PASS, T_ID, "version %s", t->version);

  /* Slots, capabilities, masks. */
  uint64_t declared = 0;
  int mandatory_missing = -1, sampler_filled = 0, sampler_slots = 0;
  for (int s = 0; s < CF_SLOT_COUNT; s++) {
    int filled = slot_filled(t, size, s);
    if (filled) declared |= 1ull << s;
    if (cf_slots[s].mandatory && !filled && mandatory_missing < 0) mandatory_missing = s;
    if (!strncmp(cf_slots[s].name, "sampler_", 8) && s != CF_SLOT_sampler_declared) {
      sampler_slots++;
      sampler_filled += filled;
    }
  }
  char line[64];
  snprintf(line, sizeof line, "D\t%llx\n", (unsigned long long)declared);
  if (write(r->out_fd, line, strlen(line)) < 0) {
  }
  const char *T_SLOTS = "slots: every mandatory slot filled; sampler slots all or none";
  if (mandatory_missing >= 0)
    cf_report(r, "table.slots", 0, CF_FAIL, T_SLOTS, "the mandatory slot %s is NULL",
              cf_slots[mandatory_missing].name);
  else if (sampler_filled != 0 && sampler_filled != sampler_slots)
    cf_report(r, "table.slots", 0, CF_FAIL, T_SLOTS,
              "%d of the %d sampler slots are filled: fill all of them or none",
              sampler_filled, sampler_slots);
  else if (slot_filled(t, size, CF_SLOT_sampler_declared) && sampler_filled == 0)
    cf_report(r, "table.slots", 0, CF_FAIL, T_SLOTS,
              "sampler_declared is filled without the sampler slots");
  else
    cf_report(r, "table.slots", 0, CF_PASS, T_SLOTS, "%s",
              sampler_filled ? "with sampler slots" : "no sampler slots (the runtime's samplers serve)");

  const char *T_CAPS = "capabilities: known bits, consistent with the slots";
  uint64_t caps = t->caps;
  int mem_filled = slot_filled(t, size, CF_SLOT_mem_alloc) + slot_filled(t, size, CF_SLOT_mem_free) +
                   slot_filled(t, size, CF_SLOT_mem_query);
  if (caps & ~(uint64_t)CF_KNOWN_CAPS)
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS, "unknown capability bits 0x%llx",
              (unsigned long long)(caps & ~(uint64_t)CF_KNOWN_CAPS));
  else if (!(caps & (DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_DEVICE_MEMORY)))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS,
              "neither DDPLUG_CAP_HOST_MEMORY nor DDPLUG_CAP_DEVICE_MEMORY: no buffer can be used");
  else if (!!(caps & DDPLUG_CAP_SAMPLER) != (sampler_filled > 0))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS,
              "DDPLUG_CAP_SAMPLER is %s but the sampler slots are %s",
              caps & DDPLUG_CAP_SAMPLER ? "set" : "not set", sampler_filled ? "filled" : "NULL");
  else if ((caps & DDPLUG_CAP_ABORT) && !slot_filled(t, size, CF_SLOT_group_abort))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS,
              "DDPLUG_CAP_ABORT is set but group_abort is NULL");
  else if (!!(caps & DDPLUG_CAP_P2P) != slot_filled(t, size, CF_SLOT_p2p_start))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS, "DDPLUG_CAP_P2P is %s but p2p_start is %s",
              caps & DDPLUG_CAP_P2P ? "set" : "not set",
              slot_filled(t, size, CF_SLOT_p2p_start) ? "filled" : "NULL");
  else if ((caps & DDPLUG_CAP_P2P_ANY_SOURCE) && !(caps & DDPLUG_CAP_P2P))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS,
              "DDPLUG_CAP_P2P_ANY_SOURCE is set without DDPLUG_CAP_P2P");
  else if (slot_filled(t, size, CF_SLOT_bootstrap_world) !=
               slot_filled(t, size, CF_SLOT_bootstrap_broadcast) ||
           !!(caps & DDPLUG_CAP_BOOTSTRAP) != slot_filled(t, size, CF_SLOT_bootstrap_world))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS,
              "DDPLUG_CAP_BOOTSTRAP is %s but bootstrap_world and bootstrap_broadcast are not "
              "both %s", caps & DDPLUG_CAP_BOOTSTRAP ? "set" : "not set",
              caps & DDPLUG_CAP_BOOTSTRAP ? "filled" : "NULL");
  else if (!!(caps & DDPLUG_CAP_SHRINK) != slot_filled(t, size, CF_SLOT_group_shrink))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS, "DDPLUG_CAP_SHRINK is %s but group_shrink is %s",
              caps & DDPLUG_CAP_SHRINK ? "set" : "not set",
              slot_filled(t, size, CF_SLOT_group_shrink) ? "filled" : "NULL");
  else if (mem_filled % 3 != 0 || !!(caps & DDPLUG_CAP_REGISTERED_MEMORY) != (mem_filled == 3))
    cf_report(r, "table.caps", 0, CF_FAIL, T_CAPS,
              "DDPLUG_CAP_REGISTERED_MEMORY is %s but mem_alloc, mem_free and mem_query are "
              "not all %s",
              caps & DDPLUG_CAP_REGISTERED_MEMORY ? "set" : "not set",
              caps & DDPLUG_CAP_REGISTERED_MEMORY ? "filled" : "NULL");
  else
    cf_report(r, "table.caps", 0, CF_PASS, T_CAPS, "0x%llx", (unsigned long long)caps);

  const char *T_MASKS = "masks: dtypes and ops are known and not empty";
  uint32_t dtypes_known = 0, ops_known = 0;
  for (int d = 1; d < DDPLUG_DTYPE_COUNT_; d++) dtypes_known |= DDPLUG_DTYPE_BIT(d);
  for (int o = 1; o < DDPLUG_OP_COUNT_; o++) ops_known |= DDPLUG_OP_BIT(o);
  if (!t->dtype_mask || (t->dtype_mask & ~dtypes_known))
    cf_report(r, "table.masks", 0, CF_FAIL, T_MASKS,
              "dtype_mask 0x%x: use DDPLUG_DTYPE_BIT() of ddplug_dtype values (bits 1..%d)",
              t->dtype_mask, DDPLUG_DTYPE_COUNT_ - 1);
  else if (!t->op_mask || (t->op_mask & ~ops_known))
    cf_report(r, "table.masks", 0, CF_FAIL, T_MASKS,
              "op_mask 0x%x: use DDPLUG_OP_BIT() of ddplug_op values (bits 1..%d)", t->op_mask,
              DDPLUG_OP_COUNT_ - 1);
  else
    cf_report(r, "table.masks", 0, CF_PASS, T_MASKS, "dtypes 0x%x, ops 0x%x", t->dtype_mask,
              t->op_mask);

  /* The runtime's own loader accepts it. */
  const char *T_LOAD = "the runtime loads it (ddplug_plugin_inspect)";
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  if (ddplug_plugin_inspect(path, &info) != DDPLUG_OK)
    cf_report(r, "table.load", 0, CF_FAIL, T_LOAD, "%s", ddplug_last_error());
  else
    cf_report(r, "table.load", 0, CF_PASS, T_LOAD, "%s", "");
  /* The plugin stays loaded until the process exits (no dlclose): a
   * plugin's own exit handlers may need its code. */
}
