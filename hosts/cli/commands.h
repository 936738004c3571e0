/* commands.h — the `ddplug` command (hosts/cli/): main.c dispatches to its
 * subcommands, one file each:
 *   cmd_check_config.c  ddplug check-config FILE
 *   cmd_info.c          ddplug info NAME|PATH
 *   cmd_run.c           ddplug run -n N [options] -- PROGRAM ARGS...
 *   cmd_conformance.c   ddplug conformance [-n RANKS] NAME|PATH (the suite
 *                       itself: plugins/conformance/, linked in)
 * and the helpers they share:
 *   port.c              a free TCP port
 * Each subcommand returns the process exit status (0 success, 1 failure,
 * 2 usage). */
#ifndef DDPLUG_CLI_COMMANDS_H
#define DDPLUG_CLI_COMMANDS_H

int ddplug_cmd_check_config(int argc, char **argv);
int ddplug_cmd_info(int argc, char **argv);
int ddplug_cmd_run(int argc, char **argv);
int ddplug_cmd_conformance(int argc, char **argv);

/* A TCP port that was free a moment ago, on 127.0.0.1 (loopback != 0) or on
 * every interface; -1 if none. keep_fd (may be NULL): the socket stays bound
 * there until the caller closes it, so that two calls give two ports
 * (port.c). */
int ddplug_cmd_free_port(int loopback, int *keep_fd);

#endif
