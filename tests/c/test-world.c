/* test-world.c — world discovery from a table of environments: torchrun,
 * Lightning's launcher, MPI launchers, SLURM, single process, precedence, and every kind
 * of inconsistent input with the variables named. */
#include "harness.h"
#include "run/context.h"

typedef struct envcase {
  const char *name;
  const char *env[16]; /* "NAME=value", NULL-terminated */
  int status;
  /* expected on success */
  int rank, world_size, local_rank, local_world_size, node_rank;
  const char *source, *addr;
  int port;
  /* expected on failure: substring of the error */
  const char *error;
} envcase;

static const char *table_get(const char *name, void *user) {
  const char *const *env = user;
  size_t n = strlen(name);
  for (int i = 0; env[i]; i++)
    if (!strncmp(env[i], name, n) && env[i][n] == '=') return env[i] + n + 1;
  return NULL;
}

static const envcase cases[] = {
    {"nothing set: single process", {NULL}, DDPLUG_OK, 0, 1, 0, 1, 0, "single", "", 0, NULL},
    {"torchrun",
     {"RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
      "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", NULL},
     DDPLUG_OK, 3, 8, 1, 2, 1, "torchrun", "10.0.0.1", 29500, NULL},
    {"torchrun without local variables",
     {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1234", NULL},
     DDPLUG_OK, 0, 2, -1, -1, -1, "torchrun", "h", 1234, NULL},
    {"torchrun beats Lightning and SLURM",
     {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "NODE_RANK=0", "SLURM_PROCID=0",
      "SLURM_NTASKS=4", "MASTER_ADDR=a", "MASTER_PORT=5", NULL},
     DDPLUG_OK, 1, 2, 1, -1, -1, "torchrun", "a", 5, NULL},
    {"Lightning launcher, node 0",
     {"LOCAL_RANK=1", "NODE_RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
      "MASTER_PORT=40000", NULL},
     DDPLUG_OK, 1, 2, 1, -1, 0, "lightning", "127.0.0.1", 40000, NULL},
    {"Lightning launcher, node 1 with LOCAL_WORLD_SIZE",
     {"LOCAL_RANK=1", "NODE_RANK=1", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2",
      "MASTER_ADDR=m", "MASTER_PORT=7", NULL},
     DDPLUG_OK, 3, 4, 1, 2, 1, "lightning", "m", 7, NULL},
    {"SLURM with launch node address and job-id port",
     {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NODEID=2",
      "SLURM_LAUNCH_NODE_IPADDR=192.168.1.9", "SLURM_JOB_ID=123456", NULL},
     DDPLUG_OK, 5, 8, 1, -1, 2, "slurm", "192.168.1.9", 10000 + 123456 % 20000, NULL},
    {"SLURM, MASTER_ADDR/PORT win",
     {"SLURM_PROCID=0", "SLURM_NTASKS=2", "MASTER_ADDR=x", "MASTER_PORT=99",
      "SLURM_LAUNCH_NODE_IPADDR=y", "SLURM_JOB_ID=1", NULL},
     DDPLUG_OK, 0, 2, -1, -1, -1, "slurm", "x", 99, NULL},
    {"Open MPI's mpirun without a rendezvous: the plugin's bootstrap finds it",
     {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0",
      "OMPI_COMM_WORLD_LOCAL_SIZE=2", "PMIX_RANK=2", NULL},
     DDPLUG_OK, 2, 4, 0, 2, -1, "mpi", "", 0, NULL},
    {"hydra's PMI variables",
     {"PMI_RANK=1", "PMI_SIZE=3", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=3", "PMI_FD=8", NULL},
     DDPLUG_OK, 1, 3, 1, 3, -1, "mpi", "", 0, NULL},
    {"srun --mpi=pmix: PMIx rank, SLURM's size; MPI launchers before SLURM",
     {"PMIX_RANK=3", "SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=1",
      "SLURM_LAUNCH_NODE_IPADDR=10.1.1.1", "SLURM_JOB_ID=7", NULL},
     DDPLUG_OK, 3, 8, 1, -1, -1, "mpi", "", 0, NULL},
    {"PMIx alone: the size comes from the plugin's bootstrap", {"PMIX_RANK=5", NULL},
     DDPLUG_OK, 5, 0, -1, -1, -1, "mpi", "", 0, NULL},
    {"mpirun with MASTER_ADDR/PORT uses them",
     {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=9", NULL},
     DDPLUG_OK, 0, 2, -1, -1, -1, "mpi", "h", 9, NULL},
    {"torchrun beats an MPI launcher",
     {"RANK=1", "WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
      "MASTER_ADDR=a", "MASTER_PORT=5", NULL},
     DDPLUG_OK, 1, 2, -1, -1, -1, "torchrun", "a", 5, NULL},
    {"world of one needs no address", {"RANK=0", "WORLD_SIZE=1", NULL},
     DDPLUG_OK, 0, 1, -1, -1, -1, "torchrun", "", 0, NULL},
    /* ---- inconsistent input ---- */
    {"rank not below world size", {"RANK=4", "WORLD_SIZE=4", "MASTER_ADDR=a", "MASTER_PORT=1", NULL},
     DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "RANK=4 is not below WORLD_SIZE=4 (torchrun variables): every rank must be in 0..3"},
    {"negative rank", {"RANK=-1", "WORLD_SIZE=4", NULL}, DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "RANK=-1 is negative (torchrun variables)"},
    {"non-numeric world size", {"RANK=0", "WORLD_SIZE=four", NULL}, DDPLUG_E_CONFIG, 0, 0, 0, 0, 0,
     NULL, NULL, 0, "WORLD_SIZE=four is not an integer (torchrun variables)"},
    {"zero world size", {"RANK=0", "WORLD_SIZE=0", NULL}, DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "WORLD_SIZE=0 is out of range 1..65536"},
    {"RANK without WORLD_SIZE", {"RANK=0", NULL}, DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "RANK is set but WORLD_SIZE is not"},
    {"WORLD_SIZE alone", {"WORLD_SIZE=4", NULL}, DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "WORLD_SIZE=4 is set but neither RANK (torchrun) nor LOCAL_RANK"},
    {"missing master address", {"RANK=0", "WORLD_SIZE=4", "MASTER_PORT=1", NULL}, DDPLUG_E_CONFIG,
     0, 0, 0, 0, 0, NULL, NULL, 0,
     "world size is 4 (torchrun) but no rendezvous address is set: set MASTER_ADDR"},
    {"missing master port", {"RANK=0", "WORLD_SIZE=4", "MASTER_ADDR=a", NULL}, DDPLUG_E_CONFIG,
     0, 0, 0, 0, 0, NULL, NULL, 0, "but no rendezvous port is set: set MASTER_PORT"},
    {"port out of range", {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=70000", NULL},
     DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0, "MASTER_PORT=70000 is out of range 0..65535"},
    {"local rank not below local world size",
     {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=a",
      "MASTER_PORT=1", NULL},
     DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
    {"Lightning node 1 without processes per node",
     {"LOCAL_RANK=0", "NODE_RANK=1", "WORLD_SIZE=4", "MASTER_ADDR=a", "MASTER_PORT=1", NULL},
     DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "NODE_RANK=1 and LOCAL_RANK=0 are set without RANK or LOCAL_WORLD_SIZE"},
    {"Lightning rank beyond world",
     {"LOCAL_RANK=1", "NODE_RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=a",
      "MASTER_PORT=1", NULL},
     DDPLUG_E_CONFIG, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "NODE_RANK=1, LOCAL_RANK=1 give rank 3, which is not below WORLD_SIZE=2"},
    {"SLURM rank beyond tasks", {"SLURM_PROCID=2", "SLURM_NTASKS=2", NULL}, DDPLUG_E_CONFIG,
     0, 0, 0, 0, 0, NULL, NULL, 0, "SLURM_PROCID=2 is not below SLURM_NTASKS=2 (SLURM variables)"},
    {"MPI rank not below its size", {"PMI_RANK=3", "PMI_SIZE=3", NULL}, DDPLUG_E_CONFIG,
     0, 0, 0, 0, 0, NULL, NULL, 0,
     "PMI_RANK=3 is not below PMI_SIZE=3 (PMI launcher variables): every rank must be in 0..2"},
    {"PMIx without a size but with a rendezvous",
     {"PMIX_RANK=1", "MASTER_ADDR=h", "MASTER_PORT=9", NULL}, DDPLUG_E_CONFIG, 0, 0, 0, 0, 0,
     NULL, NULL, 0, "PMIX_RANK=1 is set without a world size (no SLURM_NTASKS) but a rendezvous"},
    {"SLURM without any address", {"SLURM_PROCID=0", "SLURM_NTASKS=2", NULL}, DDPLUG_E_CONFIG,
     0, 0, 0, 0, 0, NULL, NULL, 0, "world size is 2 (slurm) but no rendezvous address is set"},
};

TEST(environment_table) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const envcase *c = &cases[i];
    ddplug_world w = DDPLUG_WORLD_INIT;
    int s = ddplug__world_discover_env(NULL, table_get, (void *)c->env, &w);
    CHECK_MSG(s == c->status, "case '%s': status %s, expected %s (%s)", c->name,
              ddplug_status_name(s), ddplug_status_name(c->status), ddplug_last_error());
    if (s != DDPLUG_OK) {
      CHECK_MSG(strstr(ddplug_last_error(), c->error) != NULL,
                "case '%s': error '%s' does not contain '%s'", c->name,
                ddplug_last_error(), c->error);
      continue;
    }
    CHECK_MSG(w.rank == c->rank && w.world_size == c->world_size &&
                  w.local_rank == c->local_rank &&
                  w.local_world_size == c->local_world_size &&
                  w.node_rank == c->node_rank,
              "case '%s': got rank %d/%d local %d/%d node %d", c->name, w.rank,
              w.world_size, w.local_rank, w.local_world_size, w.node_rank);
    CHECK_MSG(!strcmp(w.source, c->source), "case '%s': source %s", c->name, w.source);
    CHECK_MSG(!strcmp(w.master_addr, c->addr), "case '%s': addr '%s'", c->name, w.master_addr);
    CHECK_MSG(w.master_port == c->port, "case '%s': port %d", c->name, w.master_port);
  }
}

TEST(public_entry_reads_the_process_environment) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "3", 1);
  setenv("MASTER_ADDR", "example.invalid", 1);
  setenv("MASTER_PORT", "4242", 1);
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug_world_discover(NULL, &w));
  CHECK_EQ_INT(w.rank, 1);
  CHECK_EQ_INT(w.world_size, 3);
  CHECK_EQ_STR(w.master_addr, "example.invalid");
}

TEST(struct_size_is_honoured) {
  ddplug_world w;
  memset(&w, 0, sizeof w);
  CHECK_STATUS(ddplug_world_discover(NULL, &w), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "DDPLUG_WORLD_INIT");
  CHECK_STATUS(ddplug_world_discover(NULL, NULL), DDPLUG_E_INVALID_ARGUMENT);
}

TEST(explicit_config_world_wins_over_the_environment) {
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string(
      "{\"world\": {\"rank\": 2, \"world_size\": 4, \"local_rank\": 0, \"node_rank\": 1},"
      " \"rendezvous\": {\"addr\": \"10.1.2.3\", \"port\": 5555}}",
      "w.json", &cfg));
  const char *env[] = {"RANK=0", "WORLD_SIZE=8", "MASTER_ADDR=elsewhere", "MASTER_PORT=1", NULL};
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug__world_discover_env(cfg, table_get, (void *)env, &w));
  CHECK_EQ_INT(w.rank, 2);
  CHECK_EQ_INT(w.world_size, 4);
  CHECK_EQ_INT(w.local_rank, 0);
  CHECK_EQ_INT(w.node_rank, 1);
  CHECK_EQ_STR(w.source, "config");
  CHECK_EQ_STR(w.master_addr, "10.1.2.3");
  CHECK_EQ_INT(w.master_port, 5555);
  ddplug_config_free(cfg);
}

TEST(config_rendezvous_overrides_master_variables) {
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string("{\"rendezvous\": {\"port\": 6000}}", "r.json", &cfg));
  const char *env[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=m", "MASTER_PORT=1", NULL};
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug__world_discover_env(cfg, table_get, (void *)env, &w));
  CHECK_EQ_STR(w.source, "torchrun");
  CHECK_EQ_STR(w.master_addr, "m");
  CHECK_EQ_INT(w.master_port, 6000);
  ddplug_config_free(cfg);
}

TEST(config_world_of_several_needs_an_address) {
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string("{\"world\": {\"rank\": 0, \"world_size\": 2}}", "x.json",
                                     &cfg));
  const char *env[] = {NULL};
  ddplug_world w = DDPLUG_WORLD_INIT;
  CHECK_STATUS(ddplug__world_discover_env(cfg, table_get, (void *)env, &w), DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), "world size is 2 (config) but no rendezvous address");
  ddplug_config_free(cfg);
}

/* ddplug_open_options.world: the caller's world replaces discovery; its
 * rendezvous address and port come after the config's and before
 * MASTER_ADDR/MASTER_PORT. */
static ddplug_world caller_world(int rank, int ws, int lr, int lws, int node, const char *addr,
                                 int port) {
  ddplug_world w = DDPLUG_WORLD_INIT;
  w.rank = rank;
  w.world_size = ws;
  w.local_rank = lr;
  w.local_world_size = lws;
  w.node_rank = node;
  w.master_port = port;
  snprintf(w.master_addr, sizeof w.master_addr, "%s", addr);
  return w;
}

TEST(a_callers_world_replaces_discovery) {
  const char *env[] = {"RANK=0", "WORLD_SIZE=8", "MASTER_ADDR=env-host", "MASTER_PORT=1", NULL};
  ddplug_world given = caller_world(3, 4, 1, 2, 1, "", 0), w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug__world_from_caller(NULL, table_get, (void *)env, &given, NULL, 0, &w));
  CHECK_EQ_INT(w.rank, 3);
  CHECK_EQ_INT(w.world_size, 4);
  CHECK_EQ_INT(w.local_rank, 1);
  CHECK_EQ_INT(w.local_world_size, 2);
  CHECK_EQ_INT(w.node_rank, 1);
  CHECK_EQ_STR(w.source, "caller");
  CHECK_EQ_STR(w.master_addr, "env-host"); /* none given: MASTER_ADDR/PORT */
  CHECK_EQ_INT(w.master_port, 1);
  given = caller_world(3, 4, -1, -1, -1, "lightning-host", 4242);
  CHECK_OK(ddplug__world_from_caller(NULL, table_get, (void *)env, &given, NULL, 0, &w));
  CHECK_EQ_STR(w.master_addr, "lightning-host");
  CHECK_EQ_INT(w.master_port, 4242);
  CHECK_EQ_INT(w.local_rank, -1);
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string("{\"rendezvous\": {\"addr\": \"cfg-host\"}}", "r.json", &cfg));
  CHECK_OK(ddplug__world_from_caller(cfg, table_get, (void *)env, &given, NULL, 0, &w));
  CHECK_EQ_STR(w.master_addr, "cfg-host"); /* the config wins */
  CHECK_EQ_INT(w.master_port, 4242);
  ddplug_config_free(cfg);
}

TEST(a_callers_world_is_checked_field_by_field) {
  static const struct {
    int rank, ws, lr, lws, node, port;
    const char *error;
  } bad[] = {
      {0, 0, -1, -1, -1, 1, "options.world.world_size = 0 is out of range 1..65536"},
      {4, 4, -1, -1, -1, 1, "options.world.rank = 4 is out of range 0..3"},
      {-1, 4, -1, -1, -1, 1, "options.world.rank = -1 is out of range 0..3"},
      {0, 4, 2, 2, -1, 1, "options.world.local_rank = 2 is out of range 0..1 (or -1: unknown)"},
      {0, 4, 0, 5, -1, 1, "options.world.local_world_size = 5 is out of range 1..4"},
      {0, 4, 0, 2, 9, 1, "options.world.node_rank = 9 is out of range 0..3"},
      {0, 4, 0, 2, 0, 70000, "options.world.master_port = 70000 is out of range 0..65535"},
  };
  const char *env[] = {"MASTER_ADDR=a", "MASTER_PORT=2", NULL};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ddplug_world given = caller_world(bad[i].rank, bad[i].ws, bad[i].lr, bad[i].lws, bad[i].node, "",
                                      bad[i].port),
                 w = DDPLUG_WORLD_INIT;
    CHECK_STATUS(ddplug__world_from_caller(NULL, table_get, (void *)env, &given, NULL, 0, &w), DDPLUG_E_CONFIG);
    CHECK_CONTAINS(ddplug_last_error(), bad[i].error);
  }
  /* a world of several with no address anywhere */
  const char *none[] = {NULL};
  ddplug_world given = caller_world(0, 2, -1, -1, -1, "", 0), w = DDPLUG_WORLD_INIT;
  CHECK_STATUS(ddplug__world_from_caller(NULL, table_get, (void *)none, &given, NULL, 0, &w), DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), "world size is 2 (caller) but no rendezvous address");
  given.struct_size = 4;
  CHECK_STATUS(ddplug__world_from_caller(NULL, table_get, (void *)none, &given, NULL, 0, &w),
               DDPLUG_E_INVALID_ARGUMENT);
}

/* An override of the rendezvous (options.rendezvous_addr / _port) beats the
 * config and the environment; -1 (any port) only for a world of one. */
TEST(a_callers_rendezvous_override_beats_the_config) {
  const char *env[] = {"MASTER_ADDR=env-host", "MASTER_PORT=1", NULL};
  ddplug_config *cfg = NULL;
  CHECK_OK(ddplug_config_load_string("{\"rendezvous\": {\"addr\": \"cfg\", \"port\": 7000}}", "r.json",
                                     &cfg));
  ddplug_world given = caller_world(1, 2, -1, -1, -1, "", 0), w = DDPLUG_WORLD_INIT;
  CHECK_OK(ddplug__world_from_caller(cfg, table_get, (void *)env, &given, "10.9.8.7", 4321, &w));
  CHECK_EQ_STR(w.master_addr, "10.9.8.7");
  CHECK_EQ_INT(w.master_port, 4321);
  CHECK_OK(ddplug__world_from_caller(cfg, table_get, (void *)env, &given, NULL, 0, &w));
  CHECK_EQ_STR(w.master_addr, "cfg");
  CHECK_EQ_INT(w.master_port, 7000);
  CHECK_STATUS(ddplug__world_from_caller(cfg, table_get, (void *)env, &given, "127.0.0.1", -1, &w),
               DDPLUG_E_CONFIG);
  CHECK_CONTAINS(ddplug_last_error(), "rendezvous_port -1 (any free port) needs a world of one");
  given = caller_world(0, 1, -1, -1, -1, "", 0);
  CHECK_OK(ddplug__world_from_caller(cfg, table_get, (void *)env, &given, "127.0.0.1", -1, &w));
  CHECK_EQ_INT(w.master_port, 0);
  ddplug_config_free(cfg);
}
