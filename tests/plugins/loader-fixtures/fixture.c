/* fixture.c — plugins for the loader tests, one source compiled several
 * times with -DFIXTURE=<kind>. Each is a real shared object loaded by the
 * real loader; most are deliberately broken in exactly one way.
 *   FIX_OLDTABLE        built against the frozen ABI 1.0 header (see
 *                       tests/plugins/abi-1.0): a working single-process
 *                       plugin whose table is smaller than today's
 *   FIX_WRONGMAJOR      ddplug_plugin_entry_v1 returns a table saying 2.0
 *   FIX_TOONEW          exports only ddplug_plugin_entry_v2
 *   FIX_TOOOLD          exports only ddplug_plugin_entry_v0
 *   FIX_NOSYMBOL        a shared object without any entry point
 *   FIX_TOOSMALL        struct_size smaller than ABI 1.0's table
 *   FIX_MISSINGSLOT     request_wait is NULL
 *   FIX_PARTIALSAMPLER  one sampler slot filled, the others NULL
 *   FIX_REFUSES         the entry point returns NULL
 *   FIX_PARTIALMEM      mem_alloc filled, mem_free and mem_query NULL
 *   FIX_MEMCAP          DDPLUG_CAP_REGISTERED_MEMORY without the mem slots
 *   FIX_P2PCAP          DDPLUG_CAP_P2P without p2p_start
 *   FIX_HALFBOOT        bootstrap_world filled, bootstrap_broadcast NULL
 *   FIX_SHRINKSLOT      group_shrink filled without DDPLUG_CAP_SHRINK */
#include <stdlib.h>
#include <string.h>

#include "ddplug/plugin.h"

#define FIX_OLDTABLE 1
#define FIX_WRONGMAJOR 2
#define FIX_TOONEW 3
#define FIX_TOOOLD 4
#define FIX_NOSYMBOL 5
#define FIX_TOOSMALL 6
#define FIX_MISSINGSLOT 7
#define FIX_PARTIALSAMPLER 8
#define FIX_REFUSES 9
#define FIX_PARTIALMEM 10
#define FIX_MEMCAP 11
#define FIX_P2PCAP 12
#define FIX_HALFBOOT 13
#define FIX_SHRINKSLOT 14

struct ddplug_plugin_group {
  int world_size;
  const ddplug_host_services *svc;
};
struct ddplug_plugin_request {
  int done;
};

static int fx_group_create(const ddplug_group_init *init,
                           const ddplug_host_services *svc,
                           ddplug_plugin_group **out) {
  if (init->world_size != 1) {
    svc->set_error(svc->host, 5 /* UNSUPPORTED */,
                   "fixture plugin: only a world of one process is supported");
    return 5;
  }
  ddplug_plugin_group *g = calloc(1, sizeof *g);
  if (!g) return 14;
  g->world_size = init->world_size;
  g->svc = svc;
  *out = g;
  return 0;
}

static int fx_group_destroy(ddplug_plugin_group *g) {
  free(g);
  return 0;
}

static size_t dtype_size(int dt) {
  switch (dt) {
    case DDPLUG_FLOAT64: case DDPLUG_INT64: return 8;
    case DDPLUG_FLOAT32: case DDPLUG_INT32: return 4;
    case DDPLUG_FLOAT16: case DDPLUG_BFLOAT16: return 2;
    default: return 1;
  }
}

/* With one rank every collective is a copy (avg of one value is itself). */
static int fx_collective_start(ddplug_plugin_group *g,
                               const ddplug_coll_args *a,
                               ddplug_plugin_request **req) {
  (void)g;
  if (a->kind != DDPLUG_COLL_BARRIER && a->count && a->send != a->recv)
    memmove(a->recv, a->send, a->count * dtype_size(a->dtype));
  ddplug_plugin_request *r = calloc(1, sizeof *r);
  if (!r) return 14;
  r->done = 1;
  *req = r;
  return 0;
}

__attribute__((unused)) static int fx_request_wait(ddplug_plugin_group *g, ddplug_plugin_request *r,
                           int64_t timeout_ms) {
  (void)g; (void)r; (void)timeout_ms;
  return 0;
}

static int fx_request_test(ddplug_plugin_group *g, ddplug_plugin_request *r,
                           int32_t *done) {
  (void)g;
  *done = r->done;
  return 0;
}

static void fx_request_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  (void)g;
  free(r);
}

#if FIXTURE == FIX_PARTIALSAMPLER
static int fx_sampler_create(ddplug_plugin_group *g, const ddplug_sampler_desc *d,
                             ddplug_plugin_sampler **out) {
  (void)g; (void)d; (void)out;
  return 5;
}
#endif

#if FIXTURE == FIX_PARTIALMEM
static int fx_mem_alloc(ddplug_plugin_group *g, uint64_t bytes, void **ptr) {
  (void)g; (void)bytes; (void)ptr;
  return 14;
}
#endif

#if FIXTURE == FIX_HALFBOOT
static int fx_bootstrap_world(const ddplug_host_services *svc, ddplug_bootstrap_world *out) {
  (void)svc; (void)out;
  return 5;
}
#endif

#if FIXTURE == FIX_SHRINKSLOT
static int fx_group_shrink(ddplug_plugin_group *g, const ddplug_group_init *init,
                           const ddplug_host_services *svc, const int32_t *old_rank_of,
                           ddplug_plugin_group **out) {
  (void)g; (void)init; (void)svc; (void)old_rank_of; (void)out;
  return 5;
}
#endif

static ddplug_plugin fixture_table = {
    .struct_size = sizeof(ddplug_plugin),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = FIXTURE_NAME,
    .version = "0.0.1",
    .description = "loader test fixture",
#if FIXTURE == FIX_MEMCAP
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_REGISTERED_MEMORY,
#elif FIXTURE == FIX_P2PCAP
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_P2P,
#else
    .caps = DDPLUG_CAP_HOST_MEMORY,
#endif
    .dtype_mask = 0x1feu, /* all eight dtypes */
    .op_mask = 0xfeu,     /* all seven ops */
    .group_create = fx_group_create,
    .group_destroy = fx_group_destroy,
    .collective_start = fx_collective_start,
#if FIXTURE != FIX_MISSINGSLOT
    .request_wait = fx_request_wait,
#endif
    .request_test = fx_request_test,
    .request_free = fx_request_free,
#if FIXTURE == FIX_PARTIALSAMPLER
    .sampler_create = fx_sampler_create,
#endif
#if FIXTURE == FIX_PARTIALMEM
    .mem_alloc = fx_mem_alloc,
#endif
#if FIXTURE == FIX_HALFBOOT
    .bootstrap_world = fx_bootstrap_world,
#endif
#if FIXTURE == FIX_SHRINKSLOT
    .group_shrink = fx_group_shrink,
#endif
};

static const ddplug_plugin *fixture_entry(uint32_t host_abi_version) {
  (void)host_abi_version;
#if FIXTURE == FIX_WRONGMAJOR
  fixture_table.abi_version = DDPLUG_MAKE_VERSION(2, 0);
#elif FIXTURE == FIX_TOOSMALL
  fixture_table.struct_size = 16;
#elif FIXTURE == FIX_REFUSES
  return NULL;
#endif
  return &fixture_table;
}

#if FIXTURE == FIX_TOONEW
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v2(uint32_t v);
const ddplug_plugin *ddplug_plugin_entry_v2(uint32_t v) { return fixture_entry(v); }
#elif FIXTURE == FIX_TOOOLD
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v0(uint32_t v);
const ddplug_plugin *ddplug_plugin_entry_v0(uint32_t v) { return fixture_entry(v); }
#elif FIXTURE == FIX_NOSYMBOL
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v9_not_really(void);
const ddplug_plugin *ddplug_plugin_entry_v9_not_really(void) { return fixture_entry(0); }
#else
DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t v);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t v) { return fixture_entry(v); }
#endif
