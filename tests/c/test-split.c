/* test-split.c — split ownership rules on the data-split state: first claim
 * wins, same owner again is fine, a different owner is a conflict naming
 * both claimants and what to change, config-forced owners (per stream and
 * the default, read from a real config by the one function every caller
 * asks), resolution order, the agreement check across ranks, stream names
 * (the one public check), and thread safety of concurrent claims. */
#include <pthread.h>

#include "data/data.h"
#include "harness.h"

static ddplug__data_state *state_with(int fallback, const char *stream,
                                      int stream_owner) {
  ddplug__data_policy p;
  memset(&p, 0, sizeof p);
  p.fallback.owner = fallback;
  snprintf(p.fallback.by, sizeof p.fallback.by, "data_split.owner in cfg.json");
  if (stream) {
    p.streams = calloc(1, sizeof *p.streams);
    p.nstreams = 1;
    snprintf(p.streams[0].stream, sizeof p.streams[0].stream, "%s", stream);
    p.streams[0].owner = stream_owner;
    p.streams[0].set = 1;
    snprintf(p.streams[0].by, sizeof p.streams[0].by,
             "data_split.streams.%s.owner in cfg.json", stream);
  }
  ddplug__data_state *st = NULL;
  CHECK_OK(ddplug__data_state_new(&p, &st));
  return st;
}

TEST(first_claim_wins_and_same_owner_again_is_fine) {
  ddplug__data_state *st = state_with(0, NULL, 0);
  int owner;
  char who[DDPLUG__CLAIMANT_MAX];
  ddplug__split_resolve(st, "train", &owner, who, sizeof who);
  CHECK_EQ_INT(owner, DDPLUG_OWNER_UNSET);
  CHECK_EQ_STR(who, "");
  CHECK_OK(ddplug__split_claim(st, "train", DDPLUG_OWNER_USER, "BucketSampler (rank-aware)"));
  CHECK_OK(ddplug__split_claim(st, "train", DDPLUG_OWNER_USER, "lightning adapter"));
  ddplug__split_resolve(st, "train", &owner, who, sizeof who);
  CHECK_EQ_INT(owner, DDPLUG_OWNER_USER);
  CHECK_EQ_STR(who, "BucketSampler (rank-aware)");
  /* other streams are independent */
  CHECK_OK(ddplug__split_claim(st, "val", DDPLUG_OWNER_PLUGIN, "ddplug sampler"));
  ddplug__split_resolve(st, "val", &owner, NULL, 0);
  CHECK_EQ_INT(owner, DDPLUG_OWNER_PLUGIN);
  ddplug__data_state_free(st);
}

TEST(a_different_claim_names_both_claimants_and_the_fix) {
  ddplug__data_state *st = state_with(0, NULL, 0);
  CHECK_OK(ddplug__split_claim(st, "train", DDPLUG_OWNER_USER, "GPTSoVITS BucketSampler"));
  CHECK_STATUS(ddplug__split_claim(st, "train", DDPLUG_OWNER_FRAMEWORK,
                                   "lightning DistributedSampler injection"),
               DDPLUG_E_SPLIT_CONFLICT);
  CHECK_EQ_STR(ddplug_last_error(),
               "stream 'train' is already split by user (claimed by 'GPTSoVITS "
               "BucketSampler'); 'lightning DistributedSampler injection' claims "
               "it for framework: exactly one layer may split the data — turn "
               "off the framework's sampler injection (Lightning: "
               "use_distributed_sampler=False) or make the user's sampler "
               "rank-unaware");
  /* the failed claim changed nothing */
  int owner;
  char who[DDPLUG__CLAIMANT_MAX];
  ddplug__split_resolve(st, "train", &owner, who, sizeof who);
  CHECK_EQ_INT(owner, DDPLUG_OWNER_USER);
  CHECK_EQ_STR(who, "GPTSoVITS BucketSampler");
  CHECK_OK(ddplug__split_claim(st, "val", DDPLUG_OWNER_PLUGIN, "ddplug sampler"));
  CHECK_STATUS(ddplug__split_claim(st, "val", DDPLUG_OWNER_USER, "MySampler"),
               DDPLUG_E_SPLIT_CONFLICT);
  CHECK_CONTAINS(ddplug_last_error(), "use ddplug's sampler with a rank-unaware dataset");
  ddplug__data_state_free(st);
}

TEST(config_forced_owner_wins_and_names_the_key) {
  ddplug__data_state *st = state_with(DDPLUG_OWNER_PLUGIN, "val", DDPLUG_OWNER_USER);
  int owner;
  char who[DDPLUG__CLAIMANT_MAX];
  /* unclaimed: the forced owner resolves, naming the key */
  ddplug__split_resolve(st, "train", &owner, who, sizeof who);
  CHECK_EQ_INT(owner, DDPLUG_OWNER_PLUGIN);
  CHECK_EQ_STR(who, "data_split.owner in cfg.json");
  ddplug__split_resolve(st, "val", &owner, who, sizeof who);
  CHECK_EQ_INT(owner, DDPLUG_OWNER_USER);
  CHECK_EQ_STR(who, "data_split.streams.val.owner in cfg.json");
  CHECK_STATUS(ddplug__split_claim(st, "val", DDPLUG_OWNER_PLUGIN, "ddplug sampler"),
               DDPLUG_E_SPLIT_CONFLICT);
  CHECK_EQ_STR(ddplug_last_error(),
               "stream 'val': 'ddplug sampler' claims the split for plugin, but "
               "data_split.streams.val.owner in cfg.json forces owner user: "
               "change that setting, or stop 'ddplug sampler' from splitting "
               "the data");
  CHECK_STATUS(ddplug__split_claim(st, "train", DDPLUG_OWNER_FRAMEWORK, "lightning"),
               DDPLUG_E_SPLIT_CONFLICT);
  CHECK_CONTAINS(ddplug_last_error(), "data_split.owner in cfg.json forces owner plugin");
  CHECK_OK(ddplug__split_claim(st, "val", DDPLUG_OWNER_USER, "MySampler"));
  ddplug__split_resolve(st, "val", &owner, who, sizeof who);
  CHECK_EQ_STR(who, "MySampler");
  ddplug__data_state_free(st);
}

TEST(agreement_names_the_ranks_that_differ) {
  const int owners[4] = {DDPLUG_OWNER_PLUGIN, DDPLUG_OWNER_PLUGIN,
                         DDPLUG_OWNER_USER, DDPLUG_OWNER_PLUGIN};
  const char *who[4] = {"ddplug sampler", "ddplug sampler", "MyRankAwareSampler",
                        "ddplug sampler"};
  CHECK_STATUS(ddplug__split_agree_check("train", 4, owners, who),
               DDPLUG_E_SPLIT_CONFLICT);
  CHECK_EQ_STR(ddplug_last_error(),
               "stream 'train': ranks disagree on who splits the data: rank(s) "
               "2 resolved user (rank 2: claimed by 'MyRankAwareSampler') while "
               "rank(s) 0, 1, 3 resolved plugin (rank 0: claimed by 'ddplug "
               "sampler') — every rank must make the same claim: check that the "
               "sampler setup and the config are the same on every rank");
  const int same[3] = {DDPLUG_OWNER_USER, DDPLUG_OWNER_USER, DDPLUG_OWNER_USER};
  const char *w3[3] = {"a", "b", "c"};
  CHECK_OK(ddplug__split_agree_check("val", 3, same, w3));
  const int unset[2] = {DDPLUG_OWNER_UNSET, DDPLUG_OWNER_FRAMEWORK};
  const char *w2[2] = {"", "lightning"};
  CHECK_STATUS(ddplug__split_agree_check("test", 2, unset, w2), DDPLUG_E_SPLIT_CONFLICT);
  CHECK_CONTAINS(ddplug_last_error(), "not claimed");
}

typedef struct race {
  ddplug__data_state *st;
  int owner;
  int ok;
} race;

static void *claimer(void *arg) {
  race *r = arg;
  char name[32];
  snprintf(name, sizeof name, "thread %d", r->owner);
  for (int i = 0; i < 200; i++) {
    char stream[16];
    snprintf(stream, sizeof stream, "s%d", i);
    r->ok += ddplug__split_claim(r->st, stream, r->owner, name) == DDPLUG_OK;
  }
  return NULL;
}

TEST(concurrent_claims_have_exactly_one_winner_per_stream) {
  ddplug__data_state *st = state_with(0, NULL, 0);
  race r[3] = {{st, DDPLUG_OWNER_PLUGIN, 0}, {st, DDPLUG_OWNER_FRAMEWORK, 0},
               {st, DDPLUG_OWNER_USER, 0}};
  pthread_t t[3];
  for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, claimer, &r[i]);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  CHECK_EQ_INT(r[0].ok + r[1].ok + r[2].ok, 200);
  for (int i = 0; i < 200; i++) {
    char stream[16];
    int owner;
    snprintf(stream, sizeof stream, "s%d", i);
    ddplug__split_resolve(st, stream, &owner, NULL, 0);
    CHECK(owner >= DDPLUG_OWNER_PLUGIN && owner <= DDPLUG_OWNER_USER);
  }
  ddplug__data_state_free(st);
}

TEST(stream_names_are_checked) {
  CHECK_OK(ddplug__stream_name_check("train", "t"));
  CHECK_OK(ddplug__stream_name_check("val.en-2_x", "t"));
  CHECK_STATUS(ddplug__stream_name_check("a/b", "claim"), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_EQ_STR(ddplug_last_error(),
               "claim: stream name 'a/b' has character '/' at 1; use letters, "
               "digits, '_', '-' and '.'");
  char longname[80];
  memset(longname, 'x', 64);
  longname[64] = '\0';
  CHECK_STATUS(ddplug__stream_name_check(longname, "claim"), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "must have 1 to 63 characters (it has 64)");
  /* the public check is the same rule */
  CHECK_OK(ddplug_stream_name_check("predict.3"));
  CHECK_STATUS(ddplug_stream_name_check("tr ain"), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_EQ_STR(ddplug_last_error(),
               "ddplug_stream_name_check: stream name 'tr ain' has character ' ' "
               "at 2; use letters, digits, '_', '-' and '.'");
  CHECK_STATUS(ddplug_stream_name_check("\xc3\xa9t\xc3\xa9"), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_CONTAINS(ddplug_last_error(), "has byte 0xc3 at 0");
  CHECK_STATUS(ddplug_stream_name_check(""), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_stream_name_check(NULL), DDPLUG_E_INVALID_ARGUMENT);
}

/* ddplug_split_forced_owner: the one answer to "which owner does the config
 * force for this stream, by which key" (the runtime's claims and the Python
 * package ask it). */
TEST(the_forced_owner_comes_from_one_function) {
  static const struct {
    const char *data_split, *stream;
    int owner;
    const char *by;
  } cases[] = {
      {"{}", "train", DDPLUG_OWNER_UNSET, ""},
      {"{\"owner\": \"auto\"}", "train", DDPLUG_OWNER_UNSET, ""},
      {"{\"owner\": \"user\"}", "val", DDPLUG_OWNER_USER, "data_split.owner in t.json"},
      {"{\"owner\": \"user\", \"streams\": {\"val\": {\"owner\": \"plugin\"}}}", "val",
       DDPLUG_OWNER_PLUGIN, "data_split.streams.val.owner in t.json"},
      {"{\"owner\": \"user\", \"streams\": {\"val\": {\"owner\": \"plugin\"}}}", "train",
       DDPLUG_OWNER_USER, "data_split.owner in t.json"},
      /* a stream's own "auto" overrides data_split.owner */
      {"{\"owner\": \"framework\", \"streams\": {\"val\": {\"owner\": \"auto\"}}}", "val",
       DDPLUG_OWNER_UNSET, ""},
      /* a stream with sampler settings only inherits data_split.owner */
      {"{\"owner\": \"framework\", \"streams\": {\"val\": {\"sampler\": {\"shuffle\": false}}}}",
       "val", DDPLUG_OWNER_FRAMEWORK, "data_split.owner in t.json"},
  };
  for (size_t i = 0; i < DDPLUG__ARRAY_LEN(cases); i++) {
    char json[512];
    snprintf(json, sizeof json, "{\"data_split\": %s}", cases[i].data_split);
    ddplug_config *cfg = NULL;
    CHECK_MSG(ddplug_config_load_string(json, "t.json", &cfg) == DDPLUG_OK, "%s: %s", json,
              ddplug_last_error());
    int owner = -1;
    char by[DDPLUG__CLAIMANT_MAX] = "x";
    CHECK_OK(ddplug_split_forced_owner(cfg, cases[i].stream, &owner, by, sizeof by));
    CHECK_MSG(owner == cases[i].owner && strcmp(by, cases[i].by) == 0,
              "%s, stream %s: owner %d by '%s'", json, cases[i].stream, owner, by);
    /* the context's state reads the same policy */
    ddplug__data_policy p;
    CHECK_OK(ddplug__data_policy_read(cfg, &p));
    ddplug__data_state *st = NULL;
    CHECK_OK(ddplug__data_state_new(&p, &st));
    char who[DDPLUG__CLAIMANT_MAX];
    ddplug__split_resolve(st, cases[i].stream, &owner, who, sizeof who);
    CHECK_EQ_INT(owner, cases[i].owner);
    CHECK_EQ_STR(who, cases[i].by);
    ddplug__data_state_free(st);
    ddplug_config_free(cfg);
  }
  int owner = -1;
  CHECK_OK(ddplug_split_forced_owner(NULL, "train", &owner, NULL, 0));
  CHECK_EQ_INT(owner, DDPLUG_OWNER_UNSET);
  CHECK_STATUS(ddplug_split_forced_owner(NULL, "a b", &owner, NULL, 0), DDPLUG_E_INVALID_ARGUMENT);
  CHECK_STATUS(ddplug_split_forced_owner(NULL, "train", NULL, NULL, 0), DDPLUG_E_INVALID_ARGUMENT);
  char tiny[1];
  CHECK_STATUS(ddplug_split_forced_owner(NULL, "train", &owner, tiny, 0), DDPLUG_E_INVALID_ARGUMENT);
}
