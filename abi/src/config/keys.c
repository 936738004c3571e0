/* keys.c — the one table of configuration keys (name, type, range, enum
 * values, default, description) that drives the parser, the defaults, the
 * getters, the messages and the JSON Schema (schema.c). Also: matching the
 * table's name patterns (POSIX regcomp).
 * SPDX-License-Identifier: Apache-2.0 */
#include <regex.h>
#include <string.h>

#include "config/config.h"

static const char *const k_log_levels[] = {"off",  "error", "warn", "info",
                                           "debug", "trace", NULL};
static const char *const k_owners[] = {"auto", "plugin", "framework", "user",
                                       NULL};
static const char *const k_audits[] = {"off", "first_epoch", "every_epoch",
                                       NULL};
static const char *const k_on_violation[] = {"error", "warn", NULL};
static const char *const k_sampler_kinds[] = {"distributed", "bucket", NULL};
static const char *const k_pads[] = {"repeat", "drop", NULL};
static const char *const k_duplicate_gpu[] = {"error", "warn", "allow", NULL};
static const char *const k_on_peer_lost[] = {"stop", "shrink", NULL};

#define ENV_NAME_PATTERN "^[A-Za-z_][A-Za-z0-9_]*$"
#define ENV_NAME_HINT \
  "an environment variable name (letters, digits and '_', not starting " \
  "with a digit)"
#define STREAM_NAME_PATTERN "^[A-Za-z0-9_.-]{1,63}$"
#define STREAM_NAME_HINT \
  "a stream name of 1 to 63 characters of A-Z a-z 0-9 _ . -"

/* 2^53: the largest integer every JSON reader keeps exactly. */
#define MAX_SAFE_INT 9007199254740992LL

#define OBJECT(p, pres, d) \
  {.path = p, .type = DDPLUG__CFG_OBJECT, .presence = pres, .description = d}
#define ENUM(p, values, def, d)                                           \
  {.path = p, .type = DDPLUG__CFG_ENUM, .presence = DDPLUG__CFG_DEFAULT, \
   .enum_values = values, .def_str = def, .description = d}
#define BOOL(p, def, d)                                                   \
  {.path = p, .type = DDPLUG__CFG_BOOL, .presence = DDPLUG__CFG_DEFAULT, \
   .def_int = def, .description = d}
#define INT(p, pres, lo, hi, def, d)                                 \
  {.path = p, .type = DDPLUG__CFG_INT, .presence = pres, .imin = lo, \
   .imax = hi, .def_int = def, .description = d}
/* An optional key without a default (absent: inherited from elsewhere). */
#define OPT_ENUM(p, values, d)                                             \
  {.path = p, .type = DDPLUG__CFG_ENUM, .presence = DDPLUG__CFG_OPTIONAL, \
   .enum_values = values, .description = d}
#define OPT_BOOL(p, d) \
  {.path = p, .type = DDPLUG__CFG_BOOL, .presence = DDPLUG__CFG_OPTIONAL, .description = d}
/* A number lo < v <= hi. */
#define NUMBER(p, lo, hi, def, d)                                           \
  {.path = p, .type = DDPLUG__CFG_NUMBER, .presence = DDPLUG__CFG_DEFAULT, \
   .nmin = lo, .nmin_exclusive = 1, .nmax = hi, .def_num = def,           \
   .description = d}
/* A bucket sampler's boundaries: 1..1024 strictly ascending lengths >= 1. */
#define BOUNDARIES(p, d)                                                  \
  {.path = p, .type = DDPLUG__CFG_INT_ARRAY, .presence = DDPLUG__CFG_OPTIONAL, \
   .imin = 1, .imax = DDPLUG__CFG_NO_MAX, .min_len = 1, .max_len = 1024,  \
   .ascending = 1, .description = d}
#define STRING(p, pres, lo, hi, def, d)                                    \
  {.path = p, .type = DDPLUG__CFG_STRING, .presence = pres, .min_len = lo, \
   .max_len = hi, .def_str = def, .description = d}

static const ddplug__cfg_key k_keys[] = {
    STRING("plugin", DDPLUG__CFG_DEFAULT, 1, 0, "cpu",
           "The strategy plugin: a name (looked up as libddplug-NAME.so) or a "
           "path to a plugin file (contains '/')."),
    BOOL("torch_distributed", 1,
         "Whether the Python strategies (Lightning, Fabric) and "
         "ddplug.torch.init initialise torch.distributed on the run with the "
         "\"ddplug\" backend, so torch.distributed's users (torchmetrics, "
         "SyncBatchNorm, WebDataset, dist.get_rank()) see the run."),
    ENUM("log_level", k_log_levels, "warn",
         "Log threshold of this process (DDPLUG_LOG and "
         "ddplug_log_set_level() take precedence). Not part of the config "
         "hash."),

    OBJECT("world", DDPLUG__CFG_OPTIONAL,
           "An explicit world, used instead of the launcher's environment; "
           "rank and world_size are then required. Describes this process, "
           "so it is not part of the config hash."),
    INT("world.rank", DDPLUG__CFG_REQUIRED, 0, 65535, 0,
        "This process's rank, less than world_size."),
    INT("world.world_size", DDPLUG__CFG_REQUIRED, 1, 65536, 0,
        "Number of processes in the run."),
    INT("world.local_rank", DDPLUG__CFG_OPTIONAL, 0, 65535, 0,
        "Rank among the processes on this node, less than local_world_size."),
    INT("world.local_world_size", DDPLUG__CFG_OPTIONAL, 1, 65536, 0,
        "Number of processes on this node, at most world_size."),
    INT("world.node_rank", DDPLUG__CFG_OPTIONAL, 0, 65535, 0,
        "Index of this node."),
    STRING("world.host_id", DDPLUG__CFG_OPTIONAL, 1, 255, NULL,
           "Node identity: ranks with equal host ids share a node (default: "
           "DDPLUG_HOST_ID, then hostname and boot id)."),

    OBJECT("rendezvous", DDPLUG__CFG_DEFAULT,
           "Where and how the ranks meet (the rendezvous store)."),
    STRING("rendezvous.addr", DDPLUG__CFG_OPTIONAL, 1, 255, NULL,
           "Store address (default: from world discovery, e.g. "
           "MASTER_ADDR)."),
    INT("rendezvous.port", DDPLUG__CFG_OPTIONAL, 0, 65535, 0,
        "Store port (default: from world discovery, e.g. MASTER_PORT)."),
    NUMBER("rendezvous.timeout_s", 0, 86400, 300,
           "Seconds to wait for every rank to join at startup."),
    {.path = "rendezvous.secret_env",
     .type = DDPLUG__CFG_STRING,
     .presence = DDPLUG__CFG_DEFAULT,
     .pattern = ENV_NAME_PATTERN,
     .pattern_hint = ENV_NAME_HINT,
     .def_str = "DDPLUG_SECRET",
     .description = "Name of the environment variable holding the store's "
                    "shared secret (no secret if it is unset)."},
    BOOL("rendezvous.external", 0,
         "true: the store is served elsewhere and every rank connects to "
         "addr:port (it must be a fresh store for every run); false: rank 0 "
         "serves it."),

    OBJECT("timeouts", DDPLUG__CFG_DEFAULT, "Timeouts of blocking calls."),
    NUMBER("timeouts.collective_s", 0, 86400, 300,
           "Seconds a collective may wait for the other ranks before the run "
           "is aborted."),
    {.path = "timeouts.run_once_s",
     .type = DDPLUG__CFG_NUMBER,
     .presence = DDPLUG__CFG_DEFAULT,
     .nmin = 0,
     .nmax = 604800,
     .def_num = 0,
     .description = "Seconds a run-once waiter (e.g. Lightning's prepare_data "
                    "on the other ranks) waits for its runner's outcome; 0: "
                    "no limit while the runner is alive (it heartbeats; a "
                    "runner that dies or fails ends the wait at once)."},

    OBJECT("data_split", DDPLUG__CFG_DEFAULT,
           "Which layer splits the data among ranks, and the audit that "
           "proves it."),
    ENUM("data_split.owner", k_owners, "auto",
         "Split owner of every stream not listed in streams: plugin "
         "(ddplug's sampler), framework (the trainer's own), user (the "
         "dataset is rank-aware) or auto (user if a rank-aware sampler is "
         "found, else plugin)."),
    {.path = "data_split.streams",
     .type = DDPLUG__CFG_MAP,
     .presence = DDPLUG__CFG_DEFAULT,
     .pattern = STREAM_NAME_PATTERN,
     .pattern_hint = STREAM_NAME_HINT,
     .description = "Per-stream split settings, by stream name (train, val, "
                    "test, predict or any name)."},
    OBJECT("data_split.streams.*", DDPLUG__CFG_OPTIONAL,
           "The split settings of one stream."),
    {.path = "data_split.streams.*.owner",
     .type = DDPLUG__CFG_ENUM,
     .presence = DDPLUG__CFG_OPTIONAL,
     .enum_values = k_owners,
     .description = "Split owner of this stream (absent: data_split.owner; "
                    "auto: decided for this stream, whatever data_split.owner "
                    "says)."},
    OBJECT("data_split.streams.*.sampler", DDPLUG__CFG_OPTIONAL,
           "ddplug's sampler for this stream: each key given overrides the "
           "same key of the top-level sampler (e.g. bucketing and padding "
           "for train only). Evaluation streams (val, test, predict) are "
           "split exactly whatever the top-level sampler says: no repeats, "
           "no drops, uneven counts per rank."),
    OPT_ENUM("data_split.streams.*.sampler.kind", k_sampler_kinds,
             "The sampler kind for this stream (see sampler.kind)."),
    OPT_BOOL("data_split.streams.*.sampler.shuffle",
             "Shuffle this stream each epoch."),
    INT("data_split.streams.*.sampler.seed", DDPLUG__CFG_OPTIONAL, 0,
        MAX_SAFE_INT, 0, "Seed of this stream's shuffle."),
    OPT_BOOL("data_split.streams.*.sampler.drop_last",
             "Drop this stream's tail instead of padding it."),
    OBJECT("data_split.streams.*.sampler.bucket", DDPLUG__CFG_OPTIONAL,
           "This stream's bucket sampler settings (see sampler.bucket)."),
    BOUNDARIES("data_split.streams.*.sampler.bucket.boundaries",
               "Upper length bounds of the buckets, strictly ascending."),
    INT("data_split.streams.*.sampler.bucket.num_buckets", DDPLUG__CFG_OPTIONAL,
        1, 1024, 0, "Number of quantile buckets when boundaries are absent."),
    INT("data_split.streams.*.sampler.bucket.batch_size", DDPLUG__CFG_OPTIONAL,
        1, 1048576, 0, "Samples per batch on each rank."),
    OPT_ENUM("data_split.streams.*.sampler.bucket.pad", k_pads,
             "Repeat samples, or drop the excess."),
    ENUM("data_split.audit", k_audits, "first_epoch",
         "When to audit that the ranks together saw each sample exactly "
         "once."),
    ENUM("data_split.on_violation", k_on_violation, "error",
         "What a failed audit does: fail the run, or log a warning."),
    INT("data_split.audit_exact_max", DDPLUG__CFG_DEFAULT,
        DDPLUG__AUDIT_EXACT_MIN, DDPLUG__CFG_NO_MAX, 100000000,
        "Audit exactly up to this many samples per epoch; beyond, follow "
        "this many sampled ones (one bit each). At least 1024: fewer cannot "
        "tell a lost or repeated sample from sampling error (0 would check "
        "nothing)."),

    OBJECT("sampler", DDPLUG__CFG_DEFAULT,
           "ddplug's default samplers (used where the plugin owns the "
           "split)."),
    ENUM("sampler.kind", k_sampler_kinds, "distributed",
         "distributed: an index sampler, equal length per rank; bucket: "
         "length-bucketed batches, equal number per rank."),
    BOOL("sampler.shuffle", 1, "Shuffle each epoch (seed + epoch)."),
    INT("sampler.seed", DDPLUG__CFG_DEFAULT, 0, MAX_SAFE_INT, 0,
        "Seed of the shuffle; identical on every rank."),
    BOOL("sampler.drop_last", 0,
         "Drop the tail so every rank gets equal whole parts (false: pad by "
         "repeating samples)."),
    OBJECT("sampler.bucket", DDPLUG__CFG_DEFAULT,
           "Settings of the bucket sampler."),
    BOUNDARIES("sampler.bucket.boundaries",
               "Upper length bounds of the buckets, strictly ascending (absent: "
               "num_buckets quantile buckets)."),
    INT("sampler.bucket.num_buckets", DDPLUG__CFG_DEFAULT, 1, 1024, 8,
        "Number of quantile buckets when boundaries are absent."),
    INT("sampler.bucket.batch_size", DDPLUG__CFG_DEFAULT, 1, 1048576, 8,
        "Samples per batch on each rank."),
    ENUM("sampler.bucket.pad", k_pads, "repeat",
         "How batches are made equal in number across ranks: repeat "
         "samples, or drop the excess."),

    OBJECT("gradients", DDPLUG__CFG_DEFAULT, "Gradient allreduce."),
    NUMBER("gradients.bucket_mb", 0, 4096, 25,
           "Size of a gradient bucket in MiB."),
    NUMBER("gradients.first_bucket_mb", 0, 4096, 1,
           "Size of the first gradient bucket in MiB (small, so that "
           "communication starts early)."),
    BOOL("gradients.average", 1,
         "Divide the summed gradients by the world size."),

    OBJECT("checks", DDPLUG__CFG_DEFAULT, "Startup and runtime checks."),
    ENUM("checks.duplicate_gpu", k_duplicate_gpu, "error",
         "Two ranks bound to one GPU: fail, warn, or allow."),
    INT("checks.param_sync_every", DDPLUG__CFG_DEFAULT, 0, DDPLUG__CFG_NO_MAX,
        0,
        "Check every N steps that parameters are identical on all ranks "
        "(0: never)."),

    OBJECT("elastic", DDPLUG__CFG_DEFAULT,
           "What the run does when a rank is lost (README, \"When a rank "
           "dies\")."),
    ENUM("elastic.on_peer_lost", k_on_peer_lost, "stop",
         "stop: the run ends on every rank, naming the lost rank (a launcher "
         "may restart it from a checkpoint: ddplug run --max-restarts, "
         "torchrun --max-restarts); shrink: the survivors re-form the group "
         "in place (ddplug_shrink) and go on, the lost rank's unfinished "
         "samples dealt among them."),
    INT("elastic.min_world_size", DDPLUG__CFG_DEFAULT, 1, 1 << 20, 1,
        "With on_peer_lost = shrink: the fewest ranks a re-formed group may "
        "have; a loss that leaves fewer ends the run."),

    {.path = "plugin_options",
     .type = DDPLUG__CFG_FREE,
     .presence = DDPLUG__CFG_DEFAULT,
     .description = "Options for the plugin, passed to it as JSON; the "
                    "plugin validates them."},
};

const ddplug__cfg_key *ddplug__config_keys(size_t *count) {
  if (count) *count = DDPLUG__ARRAY_LEN(k_keys);
  return k_keys;
}

const ddplug__cfg_key *ddplug__config_key_find(const char *path, size_t len) {
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_keys); i++)
    if (strlen(k_keys[i].path) == len && !memcmp(k_keys[i].path, path, len))
      return &k_keys[i];
  return NULL;
}

int ddplug__config_key_is_child(const ddplug__cfg_key *k, const char *parent) {
  size_t plen = strlen(parent);
  const char *rest = k->path;
  if (plen) {
    if (strncmp(k->path, parent, plen) != 0 || k->path[plen] != '.') return 0;
    rest = k->path + plen + 1;
  }
  return strchr(rest, '.') == NULL;
}

const ddplug__cfg_key *ddplug__config_key_child(const char *parent,
                                                const char *name, size_t len) {
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(k_keys); i++) {
    const ddplug__cfg_key *k = &k_keys[i];
    const char *kn = ddplug__config_key_name(k);
    if (strlen(kn) == len && !memcmp(kn, name, len) &&
        ddplug__config_key_is_child(k, parent))
      return k;
  }
  return NULL;
}

const char *ddplug__config_key_name(const ddplug__cfg_key *k) {
  const char *dot = strrchr(k->path, '.');
  return dot ? dot + 1 : k->path;
}

/* ---- patterns ------------------------------------------------------------ */

/* POSIX extended regular expressions (the table's patterns are anchored and
 * use only what ERE and ECMA-262 read alike, so the schema can carry them).
 * A pattern is compiled per call: config values are checked once per load. */
int ddplug__config_pattern_match(const char *pattern, const char *text,
                                 size_t len) {
  if (memchr(text, '\0', len)) return 0;
  char *copy = ddplug__strndup(text, len);
  if (!copy) return -1;
  regex_t re;
  int rc = regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    ddplug__free(copy);
    return rc == REG_ESPACE ? -1 : -2;
  }
  rc = regexec(&re, copy, 0, NULL, 0);
  regfree(&re);
  ddplug__free(copy);
  return rc == 0;
}
