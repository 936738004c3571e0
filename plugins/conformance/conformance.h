/* conformance.h — the conformance suite every plugin must pass, run by
 * `ddplug conformance` (hosts/cli/cmd_conformance.c: the arguments, the
 * plan, the printed report). This folder is built into a static archive
 * that the command links; nothing here depends on the command. Its files:
 *   suite.c     the scenarios in the order they run, and the per-slot rows
 *               that judge the plugin's table
 *   run.c       runs a scenario: forks its ranks, collects their result
 *               rows through pipes, enforces deadlines; or (--launcher)
 *               starts them with a launcher such as mpirun, each rank
 *               writing its rows into a file of its own
 *   table.c     the plugin's table read directly: entry point, identity,
 *               capabilities, masks, declared slots
 *   values.c    test values per dtype and op, and their results
 *   elements.h  one element of any dtype as a double (float16 and
 *               bfloat16 conversions); also the nccl tests' reference
 *   coll.c      collectives: every dtype x op, in and out of place; ranks
 *               on simulated nodes
 *   async.c     async requests, request_test, request_wait
 *   faults.c    abort from another thread, a killed rank, mismatched
 *               collectives, failure in group_create
 *   sampler.c   the plugin's sampler slots
 *   p2p.c       point-to-point: order per tag, tags, any source, zero
 *               count, count mismatch, self refused, a receive that times
 *               out, a dead peer; UNSUPPORTED without the slot
 *   fault/      the wrapper plugin that makes one rank's group_create fail
 *               (or die) on purpose
 * A scenario runs in fresh rank processes (each opens its own context with
 * an explicit world and a fresh port), so one crash or hang fails that
 * scenario only. Every rank reports rows (check id, verdict, the slots it
 * exercised, a sentence); the command merges them over the ranks. */
#ifndef DDPLUG_CONFORMANCE_H
#define DDPLUG_CONFORMANCE_H

#include <stdint.h>

#include "ddplug/ddplug.h"
#include "ddplug/plugin.h"
#include "elements.h"

/* The slots of ddplug_plugin, by name: X(slot, minor version that added it,
 * mandatory). A slot added to plugin.h gets a line here and a check that
 * exercises it; the report lists every declared slot no check exercised. */
#define CF_SLOT_MAP(X)              \
  X(group_create, 0, 1)             \
  X(group_destroy, 0, 1)            \
  X(group_abort, 0, 0)              \
  X(collective_start, 0, 1)         \
  X(request_wait, 0, 1)             \
  X(request_test, 0, 1)             \
  X(request_free, 0, 1)             \
  X(sampler_create, 1, 0)           \
  X(sampler_set_epoch, 1, 0)        \
  X(sampler_next, 1, 0)             \
  X(sampler_seek, 1, 0)             \
  X(sampler_length, 1, 0)           \
  X(sampler_destroy, 1, 0)          \
  X(sampler_declared, 2, 0)         \
  X(mem_alloc, 3, 0)                \
  X(mem_free, 3, 0)                 \
  X(mem_query, 3, 0)                \
  X(p2p_start, 4, 0)                \
  X(bootstrap_world, 4, 0)          \
  X(bootstrap_broadcast, 4, 0)      \
  X(group_shrink, 4, 0)

enum {
#define CF__SLOT_ENUM(slot, minor, mandatory) CF_SLOT_##slot,
  CF_SLOT_MAP(CF__SLOT_ENUM)
#undef CF__SLOT_ENUM
  CF_SLOT_COUNT
};
#define CF_BIT(slot) (1ull << CF_SLOT_##slot)
/* The slots every collective goes through. */
#define CF_COLL_SLOTS \
  (CF_BIT(collective_start) | CF_BIT(request_wait) | CF_BIT(request_free))

typedef struct cf_slot_info {
  const char *name;
  size_t offset;
  int minor;
  int mandatory;
} cf_slot_info;
extern const cf_slot_info cf_slots[CF_SLOT_COUNT];

/* Verdicts of a row. */
enum { CF_PASS = 'P', CF_FAIL = 'F', CF_SKIP = 'S' };

/* What every rank knows before a scenario starts (set by the command,
 * copied into each rank by fork). */
typedef struct cf_plan {
  char path[4096];        /* the plugin file every rank loads            */
  char shim[4096];        /* the fault wrapper plugin, "" if not found   */
  ddplug_plugin_info info;
  int world;              /* ranks per scenario (-n)                     */
  const char *options;    /* plugin_options JSON text ("{}")             */
  int verbose;            /* pass the library's log lines through        */
  int shared_gpu;         /* checks.duplicate_gpu = "warn" (--shared-gpu) */
  int fault_timeout_s;    /* collective timeout of the fault scenarios;
                             "promptly" means within a third of it (-t)  */
  /* A TCP port that was free a moment ago, on 127.0.0.1 (loopback != 0),
   * or -1; keep_fd (may be NULL) keeps the socket bound until the caller
   * closes it, so that two calls give two ports. The command hands its own
   * (hosts/cli/port.c), so the suite needs nothing from the command. */
  int (*free_port)(int loopback, int *keep_fd);
  /* --launcher: the command that starts a scenario's ranks ("mpirun
   * --oversubscribe"; " -n N <the ddplug command> conformance --worker ..."
   * is appended), or NULL to fork them. */
  const char *launcher;
  char self[4096];        /* the ddplug command, for the launcher        */
  int launched;           /* this process is a launched rank (--worker)  */
} cf_plan;

/* One rank of a running scenario. */
typedef struct cf_rank {
  const cf_plan *plan;
  int rank, world;
  int port;               /* the scenario's rendezvous port              */
  int port2;              /* a second one, for a second run              */
  int out_fd;             /* rows go here                                */
} cf_rank;

/* Report one row: id (stable, short), the slots exercised, the verdict, the
 * title (what was checked), and a sentence (why it failed or was skipped;
 * may be empty). Rows are merged over ranks by id. */
void cf_report(cf_rank *r, const char *id, uint64_t slots, int verdict, const char *title,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Open this rank's context on the scenario's port: plugin (NULL: the
 * plan's), collective timeout in seconds, host id (NULL: the machine's).
 * Returns the status; on failure the sentence is in ddplug_last_error(). */
int cf_open(cf_rank *r, const char *plugin, int collective_s, const char *host_id,
            ddplug_context **out);
/* The detail of the last failure on ctx (or of the process). */
const char *cf_error(ddplug_context *ctx);
/* One collective (kind, dtype, op, root, count, in place or not) with
 * the suite's values, checked: OK, -1 with why for a wrong result, or the
 * failing status (the context is then aborted) with why. */
int cf_coll_once(ddplug_context *ctx, int rank, int world, int kind, int dtype, int op, int root,
                 uint64_t count, int inplace, char *why, size_t cap);
/* faults.c, for every scenario: the dtype checks use (float32 where the
 * plugin has it); whether text names "rank <rank>"; whether the plugin
 * takes host buffers (else the row id is reported skipped, and 0). */
int cf_first_dtype(const ddplug_plugin_info *in);
int cf_mentions_rank(const char *text, int rank);
/* Under a launcher that ends the whole job when a rank dies (no fault
 * tolerance), it may kill rank 0 — which serves the rendezvous store — before
 * a survivor has seen the victim's death: the survivor's PEER_LOST then
 * names rank 0's store instead of the victim. Whether err says so (only for
 * a launched rank and a victim other than 0): the caller skips its check,
 * saying why, instead of failing the plugin for the launcher's race. */
int cf_launcher_took_the_store(const cf_rank *r, const char *err, int victim);
/* The skip's sentence (victim, the error). */
#define CF_LAUNCHER_TOOK_THE_STORE                                                          \
  "the launcher ended rank 0 (which serves the rendezvous store) before this rank saw rank " \
  "%d die: it ends the whole job when a rank dies; a fault-tolerant MPI (Open MPI 5, mpirun " \
  "--with-ft ulfm) keeps the survivors: %s"
int cf_need_host_memory(cf_rank *r, const char *id, const char *title);
/* Monotonic seconds. */
double cf_now(void);
void cf_sleep_ms(int ms);

/* A scenario: rank_fn runs in every rank process. */
typedef struct cf_scenario {
  const char *name;
  void (*rank_fn)(cf_rank *r);
  int single;             /* one process instead of the world            */
  int needs_group;        /* skipped when no group could be created      */
  int timeout_s;
  int dies;               /* 1: the last rank is expected to die (SIGKILL) */
} cf_scenario;

/* One merged row of the report. */
typedef struct cf_row {
  char id[64];
  char title[160];
  char detail[1024];
  uint64_t slots;
  int verdict;
  int ranks;              /* how many ranks reported it                  */
} cf_row;

typedef struct cf_results {
  cf_row *rows;
  int n, cap;
  uint64_t declared;      /* slots the plugin's table fills (table check) */
  int have_declared;
} cf_results;

/* Run one scenario and merge its rows into res. */
void cf_run_scenario(const cf_plan *plan, const cf_scenario *sc, cf_results *res);
/* A launched rank (--worker): run scenario name's rank function with the
 * rank the launcher gave, rows into <rows_dir>/rows.<rank>, then wait
 * (bounded) until every rank that should finish has. Returns the exit
 * status for the process. */
int cf_run_worker(const cf_plan *plan, const char *name, const char *rows_dir);
/* Add or merge a row (also used by the command for its own rows). */
void cf_add_row(cf_results *res, const char *id, uint64_t slots, int verdict, const char *title,
                const char *detail, int rank);
const cf_row *cf_find_row(const cf_results *res, const char *id);

/* ---- suite.c ----------------------------------------------------------- */
/* The scenarios, in the order they run. */
extern const cf_scenario cf_scenarios[];
extern const int cf_scenario_count;
/* One row per slot of ddplug_plugin: declared or not, and what the checks
 * that exercised it found. A declared slot that no check exercised fails:
 * the suite must grow a check when plugin.h grows a slot. no_group (NULL
 * when a group was created) says why the group's checks did not run. */
void cf_slot_rows(cf_results *res, const char *no_group);

/* The scenarios' rank functions. */
void cf_table_rank(cf_rank *r);        /* table.c (single)  */
void cf_lifecycle_rank(cf_rank *r);    /* coll.c            */
void cf_coll_rank(cf_rank *r);
void cf_nodes_rank(cf_rank *r);
void cf_async_rank(cf_rank *r);        /* async.c           */
void cf_abort_rank(cf_rank *r);        /* faults.c          */
void cf_killed_waiting_rank(cf_rank *r);
void cf_killed_inside_rank(cf_rank *r);
void cf_mismatch_rank(cf_rank *r);
void cf_create_fails_rank(cf_rank *r);
void cf_create_dies_rank(cf_rank *r);
void cf_sampler_rank(cf_rank *r);      /* sampler.c         */
void cf_p2p_rank(cf_rank *r);          /* p2p.c             */
void cf_p2p_dead_rank(cf_rank *r);

/* ---- values.c ------------------------------------------------------------ */
/* Element i of rank r's input for op (0 = broadcast/allgather data). */
double cf_input(int dtype, int op, int rank, uint64_t i);
/* The exact result of op over ranks 0..world-1 of element i. */
double cf_expected(int dtype, int op, int world, uint64_t i);
/* Store / load element i of a buffer of dtype: cf_put, cf_get
 * (elements.h). */
/* Whether got equals want for dtype and op (AVG of floats: within the
 * rounding of one division). */
int cf_same(int dtype, int op, double got, double want);
int cf_is_integer(int dtype);
/* Whether the runtime accepts op on dtype (BOR/BAND: integers only). */
int cf_op_valid(int dtype, int op);

/* Environment variables the fault wrapper plugin reads. */
#define CF_WRAP_ENV "DDPLUG_CONFORMANCE_WRAP"    /* the real plugin's path */
#define CF_FAULT_ENV "DDPLUG_CONFORMANCE_FAULT"  /* "fail" or "die"        */
#define CF_SHIM_FILE "libddplug-conformance-fault.so"

#endif
