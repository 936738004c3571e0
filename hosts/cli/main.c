/* main.c — the `ddplug` command: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "ddplug/ddplug.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *summary;
} commands[] = {
    {"check-config", ddplug_cmd_check_config,
     "FILE           validate a config file (exit 0 and a summary, or the error)"},
    {"info", ddplug_cmd_info,
     "NAME|PATH      show a plugin's name, version, ABI version, capabilities"},
    {"run", ddplug_cmd_run,
     "-n N -- PROG   launch N local ranks of PROG with a rendezvous"},
    {"conformance", ddplug_cmd_conformance,
     "NAME|PATH      run the conformance suite against a plugin (-n RANKS)"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: ddplug COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\nddplug %s (host ABI %u.%u, plugin ABI %u.%u)\n",
          ddplug_version_string(), DDPLUG_VERSION_MAJOR_OF(ddplug_abi_version()),
          DDPLUG_VERSION_MINOR_OF(ddplug_abi_version()),
          DDPLUG_VERSION_MAJOR_OF(ddplug_plugin_abi_version()),
          DDPLUG_VERSION_MINOR_OF(ddplug_plugin_abi_version()));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
    printf("ddplug %s\n", ddplug_version_string());
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "ddplug: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
