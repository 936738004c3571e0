/* cmd_info.c — `ddplug info [--json] NAME|PATH`: what a plugin is.
 * Exit 0 with a description, 1 with the loader's error (not found with every
 * path searched, not a plugin, ABI mismatch, missing slot), 2 on usage. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>
#include <stdlib.h>

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
    {DDPLUG_CAP_P2P, "p2p"},                   {DDPLUG_CAP_P2P_ANY_SOURCE, "p2p-any-source"},
    {DDPLUG_CAP_BOOTSTRAP, "bootstrap"},       {DDPLUG_CAP_SHRINK, "shrink"},
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

/* "options       chunk_bytes  int 4096..16777216, multiple of 4096; default
 *                            262144: what it does" — one per option. */
static void print_options(const char *text) {
  json_t *list = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
  if (!json_is_array(list)) {
    printf("options       (the plugin reads plugin_options itself)\n");
    json_decref(list);
    return;
  }
  if (json_array_size(list) == 0) printf("options       (none)\n");
  size_t i;
  json_t *o;
  json_array_foreach(list, i, o) {
    char rule[256] = "";
    size_t n = 0;
    json_t *lo = json_object_get(o, "minimum"), *hi = json_object_get(o, "maximum");
    if (lo && hi) {
      char *a = json_dumps(lo, JSON_ENCODE_ANY), *b = json_dumps(hi, JSON_ENCODE_ANY);
      n += (size_t)snprintf(rule + n, sizeof rule - n, " %s..%s", a ? a : "?", b ? b : "?");
      free(a);
      free(b);
    }
    json_t *mul = json_object_get(o, "multiple_of");
    if (mul && n < sizeof rule)
      n += (size_t)snprintf(rule + n, sizeof rule - n, ", multiple of %lld",
                            (long long)json_integer_value(mul));
    json_t *choices = json_object_get(o, "choices");
    if (choices && n < sizeof rule) {
      char *c = json_dumps(choices, JSON_COMPACT);
      n += (size_t)snprintf(rule + n, sizeof rule - n, " one of %s", c ? c : "?");
      free(c);
    }
    json_t *d = json_object_get(o, "default");
    char *dt = d && !json_is_null(d) ? json_dumps(d, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    printf("%s%-16s %s%s; default %s: %s\n", i ? "              " : "options       ",
           json_string_value(json_object_get(o, "name")),
           json_string_value(json_object_get(o, "type")), rule, dt ? dt : "none",
           json_string_value(json_object_get(o, "description")));
    free(dt);
  }
  json_decref(list);
}

int ddplug_cmd_info(int argc, char **argv) {
  int json = 0;
  const char *what = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: ddplug info [--json] NAME|PATH\n"
             "  NAME: a plugin name (cpu, nccl, example, ...), looked up in\n"
             "        DDPLUG_PLUGIN_PATH, then ddplug/ beside libddplug (the install's plugin\n"
             "        directory, wherever it was moved), the configured prefix's plugin\n"
             "        directory, then beside libddplug\n"
             "  PATH: a plugin file (anything containing '/'; a relative path resolves\n"
             "        against the working directory)\n");
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
  char *options = NULL;
  if (ddplug_plugin_options(what, &options) != DDPLUG_OK) {
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
    printf(", \"capabilities\": [%s], \"dtypes\": [%s], \"ops\": [%s], \"sampler\": \"%s\", "
           "\"options\": %s}\n",
           caps, dtypes, ops, info.has_sampler ? "plugin" : "runtime default",
           options ? options : "null");
    ddplug_free(options);
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
  print_options(options);
  ddplug_free(options);
  return 0;
}
