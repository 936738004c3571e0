/* cmd_check_config.c — placeholder until implemented. */
#include <stdio.h>

#include "commands.h"

int ddplug_cmd_check_config(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "ddplug: 'check_config' is not implemented yet\n");
  return 1;
}
