/* suggest.c — "did you mean": the closest of a set of candidates to a word
 * the user wrote (config keys and enum values, plugin option names and
 * choices, plugin names), when it is close enough to be worth saying.
 * SPDX-License-Identifier: Apache-2.0 */
#include <string.h>
#include <strings.h>

#include "base/base.h"

/* See base.h. */
int ddplug__edit_distance(const char *a, const char *b, int cap) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return cap + 1;
  int row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int prev = row[0];
    row[0] = (int)i;
    int best = row[0];
    for (size_t j = 1; j <= lb; j++) {
      int cur = row[j];
      int sub = prev + (a[i - 1] != b[j - 1]);
      int del = row[j] + 1;
      int ins = row[j - 1] + 1;
      row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
      prev = cur;
      if (row[j] < best) best = row[j];
    }
    if (best > cap) return cap + 1;
  }
  return row[lb] > cap ? cap + 1 : row[lb];
}

/* See base.h. */
void ddplug__suggest_init(ddplug__suggest *s, const char *word) {
  s->word = word;
  s->best[0] = '\0';
  s->best_dist = -1;
}

/* Close enough: at most 2 edits, and fewer than half the longer word. */
void ddplug__suggest_offer(ddplug__suggest *s, const char *cand, size_t len) {
  char buf[sizeof s->best];
  if (len >= sizeof buf || !s->word) return;
  memcpy(buf, cand, len);
  buf[len] = '\0';
  int d = ddplug__edit_distance(s->word, buf, 2);
  if (d > 1 && strcasecmp(s->word, buf) == 0) d = 1; /* "AUTO" → "auto" */
  size_t longer = DDPLUG__MAX(strlen(s->word), len);
  if (d > 2 || d == 0 || (size_t)(2 * d) >= longer) return;
  if (s->best_dist >= 0 && d >= s->best_dist) return;
  memcpy(s->best, buf, len + 1);
  s->best_dist = d;
}

/* See base.h. */
const char *ddplug__suggest_best(const ddplug__suggest *s) {
  return s->best_dist >= 0 ? s->best : NULL;
}
