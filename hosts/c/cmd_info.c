/* cmd_info.c — `ddplug info [--json] NAME|PATH`: what a plugin is.
 * Exit 0 with a description, 1 with the loader's error (not found with every
 * path searched, not a plugin, ABI mismatch, missing slot), 2 on usage. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "ddplug/ddplug.h"

static const struct {
  uint64_t bit;
  const char *name;
} cap_names[] = {
    {DDPLUG_CAP_HOST_MEMORY, "host-memory"},   {DDPLUG_CAP_DEVICE_MEMORY, "device-memory"},
    {DDPLUG_CAP_ASYNC, "async"},               {DDPLUG_CAP_MULTI_NODE, "multi-node"},
    {DDPLUG_CAP_MISMATCH_CHECK, "mismatch-check"}, {DDPLUG_CAP_ABORT, "abort"},
    {DDPLUG_CAP_STREAMS, "streams"},           {DDPLUG_CAP_SAMPLER, "sampler"},
    {DDPLUG_CAP_REGISTERED_MEMORY, "registered-memory"},
};

static void list_caps(char *buf, size_t cap, uint64_t caps, const char *quote) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof cap_names / sizeof cap_names[0]; i++)
    if (caps & cap_names[i].bit)
      len += (size_t)snprintf(buf + len, cap - len, "%s%s%s%s", len ? ", " : "", quote,
                              cap_names[i].name, quote);
}

static void list_mask(char *buf, size_t cap, uint32_t mask, const char *(*name)(int),
                      const char *quote) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 1; i < 32; i++)
    if ((mask & (1u << i)) && name(i))
      len += (size_t)snprintf(buf + len, cap - len, "%s%s%s%s", len ? ", " : "", quote,
                              name(i), quote);
}

/* JSON string escaping for the few free-text fields. */
static void print_json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

int ddplug_cmd_info(int argc, char **argv) {
  int json = 0;
  const char *what = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: ddplug info [--json] NAME|PATH\n"
             "  NAME: a plugin name (host, nccl, example, ...), looked up in\n"
             "        DDPLUG_PLUGIN_PATH, the installed plugin directory, then beside libddplug\n"
             "  PATH: a plugin file (anything containing '/')\n");
      return 0;
    } else if (!what) what = argv[i];
    else {
      fprintf(stderr, "ddplug info: unexpected argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!what) {
    fprintf(stderr, "usage: ddplug info [--json] NAME|PATH\n");
    return 2;
  }
  ddplug_plugin_info info = DDPLUG_PLUGIN_INFO_INIT;
  int s = ddplug_plugin_inspect(what, &info);
  if (s != DDPLUG_OK) {
    fprintf(stderr, "ddplug info: %s\n", ddplug_last_error());
    return 1;
  }
  char caps[256], dtypes[256], ops[256];
  const char *q = json ? "\"" : "";
  list_caps(caps, sizeof caps, info.caps, q);
  list_mask(dtypes, sizeof dtypes, info.dtype_mask, ddplug_dtype_name, q);
  list_mask(ops, sizeof ops, info.op_mask, ddplug_op_name, q);
  unsigned maj = DDPLUG_VERSION_MAJOR_OF(info.plugin_abi_version);
  unsigned min = DDPLUG_VERSION_MINOR_OF(info.plugin_abi_version);
  if (json) {
    printf("{\"name\": ");
    print_json_string(info.name);
    printf(", \"version\": ");
    print_json_string(info.version);
    printf(", \"abi_version\": \"%u.%u\", \"path\": ", maj, min);
    print_json_string(info.path);
    printf(", \"description\": ");
    print_json_string(info.description);
    printf(", \"capabilities\": [%s], \"dtypes\": [%s], \"ops\": [%s], \"sampler\": \"%s\"}\n",
           caps, dtypes, ops, info.has_sampler ? "plugin" : "runtime default");
    return 0;
  }
  printf("plugin        %s\n", info.name);
  printf("version       %s\n", info.version);
  printf("ABI version   %u.%u (this libddplug %s speaks plugin ABI %u.%u)\n", maj, min,
         ddplug_version_string(), DDPLUG_VERSION_MAJOR_OF(ddplug_plugin_abi_version()),
         DDPLUG_VERSION_MINOR_OF(ddplug_plugin_abi_version()));
  printf("file          %s\n", info.path);
  printf("description   %s\n", info.description);
  printf("capabilities  %s\n", *caps ? caps : "(none)");
  printf("dtypes        %s\n", dtypes);
  printf("ops           %s\n", ops);
  printf("sampler       %s\n", info.has_sampler ? "supplied by the plugin" : "runtime default");
  return 0;
}
