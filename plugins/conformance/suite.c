/* suite.c — the conformance suite's scenarios, in the order they run, and
 * the rows that judge the plugin's table slot by slot from what the
 * scenarios found. */
#include <stdio.h>
#include <string.h>

#include "conformance.h"

const cf_scenario cf_scenarios[] = {
    {"table", cf_table_rank, 1, 0, 30, 0},
    {"lifecycle", cf_lifecycle_rank, 0, 0, 150, 0},
    {"coll", cf_coll_rank, 0, 1, 300, 0},
    {"nodes", cf_nodes_rank, 0, 1, 150, 0},
    {"async", cf_async_rank, 0, 1, 120, 0},
    {"abort", cf_abort_rank, 0, 1, 90, 0},
    {"peer-waiting", cf_killed_waiting_rank, 0, 1, 90, 1},
    {"peer-inside", cf_killed_inside_rank, 0, 1, 90, 1},
    {"mismatch", cf_mismatch_rank, 0, 1, 120, 0},
    {"create-fails", cf_create_fails_rank, 0, 1, 90, 0},
    {"create-dies", cf_create_dies_rank, 0, 1, 90, 1},
    {"sampler", cf_sampler_rank, 0, 1, 120, 0},
    {"p2p", cf_p2p_rank, 0, 1, 120, 0},
    {"p2p-peer", cf_p2p_dead_rank, 0, 1, 90, 1},
};
const int cf_scenario_count = (int)(sizeof cf_scenarios / sizeof cf_scenarios[0]);

/* See conformance.h. */
void cf_slot_rows(cf_results *res, const char *no_group) {
  for (int s = 0; s < CF_SLOT_COUNT; s++) {
    int pass = 0, fail = 0, skip = 0;
    for (int i = 0; i < res->n; i++) {
      const cf_row *row = &res->rows[i];
      if (!(row->slots & (1ull << s)) || !strncmp(row->id, "slot.", 5)) continue;
      if (row->verdict == CF_PASS) pass++;
      else if (row->verdict == CF_FAIL) fail++;
      else skip++;
    }
    char id[64], title[160], detail[256];
    snprintf(id, sizeof id, "slot.%s", cf_slots[s].name);
    snprintf(title, sizeof title, "slot %s (ABI 1.%d, %s)", cf_slots[s].name, cf_slots[s].minor,
             cf_slots[s].mandatory ? "mandatory" : "optional");
    if (!res->have_declared) continue;
    if (!(res->declared & (1ull << s))) {
      if (cf_slots[s].mandatory) {
        cf_add_row(res, id, 0, CF_FAIL, title, "not declared, but mandatory", -1);
      }
      continue; /* an optional slot left NULL: nothing to check */
    }
    int verdict = fail ? CF_FAIL : pass ? CF_PASS : skip ? CF_SKIP : no_group ? CF_SKIP : CF_FAIL;
    if (!pass && !fail && !skip && no_group)
      snprintf(detail, sizeof detail, "declared; not exercised: %.200s", no_group);
    else if (!pass && !fail && !skip)
      snprintf(detail, sizeof detail,
               "declared, but no check of this suite exercised it (plugins/conformance/ "
               "needs one)");
    else
      snprintf(detail, sizeof detail, "declared; exercised by %d check(s): %d passed, %d failed, "
               "%d skipped", pass + fail + skip, pass, fail, skip);
    cf_add_row(res, id, 0, verdict, title, detail, -1);
  }
}
