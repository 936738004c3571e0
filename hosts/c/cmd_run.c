/* cmd_run.c — placeholder until implemented. */
#include <stdio.h>

#include "commands.h"

int ddplug_cmd_run(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "ddplug: 'run' is not implemented yet\n");
  return 1;
}
