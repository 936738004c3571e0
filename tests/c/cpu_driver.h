/*
 * cpu_driver.h — a test-only driver for the `cpu` plugin: it loads
 * libddplug-cpu.so with dlopen and plays the runtime's part for one rank
 * (ddplug_group_init, a host-services table whose store is a directory of
 * files shared by the ranks of one test world). It lets the plugin tests
 * lay out nodes freely (several simulated nodes on one machine) and call
 * the plugin's slots directly. The multi-process tests fork ranks with the
 * harness (dt_run_ranks) and each rank calls hd_open.
 */
#ifndef DDPLUG_TEST_CPU_DRIVER_H
#define DDPLUG_TEST_CPU_DRIVER_H

#include <stdint.h>

#include "ddplug/plugin.h"

#define HD_MAX_RANKS 16

typedef struct hd_world {
  int world;
  int32_t node_of[HD_MAX_RANKS]; /* simulated node of each rank           */
  char options[512];             /* plugin_options JSON                    */
  int64_t timeout_ms;            /* group_create timeout                   */
  char dir[256];                 /* the file store                         */
  char run_id[40];
  int log_level;                 /* the group's threshold (0: WARN); lines
                                    at WARN or above also go to stderr    */
} hd_world;

typedef struct hd_rank {
  const hd_world *w;
  int rank;
  void *dl;
  const ddplug_plugin *p;
  ddplug_plugin_group *g;
  ddplug_host_services svc;
  ddplug_group_init init;
  int32_t node_of[HD_MAX_RANKS], local_of[HD_MAX_RANKS];
  int64_t pid_of[HD_MAX_RANKS];
  uint64_t seq;
  char error[1024]; /* last set_error text */
  char log[8192];   /* every line the plugin logged (as much as fits) */
} hd_rank;

/* In the test process, before forking: a world of `world` ranks, on nodes
 * node_of (NULL: all on one node), with plugin options (NULL: "{}"). Makes
 * a fresh store directory and a run id unique to this process and call. */
void hd_world_init(hd_world *w, int world, const int *node_of, const char *options);
/* Remove the store directory. */
void hd_world_cleanup(hd_world *w);

/* In a rank: load the plugin and create the group. Returns the plugin's
 * status; r->error has its sentence. */
int hd_open(hd_rank *r, const hd_world *w, int rank);
/* group_destroy, dlclose. */
void hd_close(hd_rank *r);

/* Start one collective (seq numbered by the driver). */
int hd_start(hd_rank *r, int kind, const void *send, void *recv,
             uint64_t count, int dtype, int op, int root,
             ddplug_plugin_request **req);
int hd_wait(hd_rank *r, ddplug_plugin_request *req, int64_t timeout_ms);
void hd_free(hd_rank *r, ddplug_plugin_request *req);
/* start + wait + free. */
int hd_coll(hd_rank *r, int kind, const void *send, void *recv,
            uint64_t count, int dtype, int op, int root, int64_t timeout_ms);

/* Fork w->world ranks running fn(r, arg) after hd_open succeeded (a failed
 * open fails the rank); hd_close afterwards. Returns the number of ranks
 * that failed; statuses (may be NULL) receives their wait statuses. */
int hd_run(const hd_world *w, void (*fn)(hd_rank *r, void *arg), void *arg,
           int timeout_s, int *statuses);

/* hd_world_init + hd_run + a check that the run left no segment +
 * hd_world_cleanup. Returns the number of ranks that failed. */
int hd_run_world(int world, const int *node_of, const char *options,
                 void (*fn)(hd_rank *r, void *arg), void *arg, int timeout_s,
                 int *statuses);

/* Wall clock for latency notes. */
double hd_now_s(void);
/* Count /dev/shm entries starting with prefix. */
int hd_shm_count(const char *prefix);
/* Segments of this world's run still in /dev/shm. */
int hd_world_shm_left(const hd_world *w);
/* Shared scratch for the ranks of a test (MAP_SHARED, made before forking). */
void *hd_shared_page(size_t bytes);

#endif
