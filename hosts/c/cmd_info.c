/* cmd_info.c — placeholder until implemented. */
#include <stdio.h>

#include "commands.h"

int ddplug_cmd_info(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "ddplug: 'info' is not implemented yet\n");
  return 1;
}
