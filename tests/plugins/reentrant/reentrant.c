/* reentrant.c — a test plugin that does what real plugins do and the
 * runtime must survive: a slot holds the plugin's own lock while it waits in
 * the host services' store, and group_abort takes that same lock. If the
 * runtime called group_abort while holding its own lock, or from inside the
 * waiting slot, a ddplug_abort from another rank would deadlock here.
 * Barriers wait for a key nobody sets (until the run is aborted); an
 * allreduce of 7 elements fails to start with TIMEOUT, one of 9 waits for
 * the run to end and then fails to start with ABORTED; other collectives
 * are refused. */
#include <pthread.h>
#include <stdlib.h>

#include "ddplug/plugin.h"

struct ddplug_plugin_group {
  const ddplug_host_services *svc;
  pthread_mutex_t lock;
  int aborted;
};
struct ddplug_plugin_request {
  int status;
};

static int rt_create(const ddplug_group_init *init, const ddplug_host_services *svc,
                     ddplug_plugin_group **out) {
  (void)init;
  ddplug_plugin_group *g = calloc(1, sizeof *g);
  if (!g) return DDPLUG_E_NO_MEMORY;
  g->svc = svc;
  pthread_mutex_init(&g->lock, NULL);
  *out = g;
  return DDPLUG_OK;
}

static int rt_destroy(ddplug_plugin_group *g) {
  pthread_mutex_destroy(&g->lock);
  free(g);
  return DDPLUG_OK;
}

static int rt_abort(ddplug_plugin_group *g, const char *reason) {
  (void)reason;
  pthread_mutex_lock(&g->lock);
  g->aborted = 1;
  pthread_mutex_unlock(&g->lock);
  return DDPLUG_OK;
}

static int rt_start(ddplug_plugin_group *g, const ddplug_coll_args *a, ddplug_plugin_request **out) {
  if (a->kind == DDPLUG_COLL_ALLREDUCE && a->count == 7) {
    /* A start that fails the way a stuck device collective does. */
    g->svc->set_error(g->svc->host, DDPLUG_E_TIMEOUT,
                      "reentrant: the collective did not start in time (test)");
    return DDPLUG_E_TIMEOUT;
  }
  if (a->kind == DDPLUG_COLL_ALLREDUCE && a->count == 9) {
    /* A start that waits in the store until the run ends, then fails the
     * way an aborted plugin does: its generic ABORTED. */
    char buf[8];
    uint64_t len = 0;
    g->svc->store_get(g->svc->host, "never-set", buf, sizeof buf, &len, 60000);
    g->svc->set_error(g->svc->host, DDPLUG_E_ABORTED, "reentrant: the start was aborted (test)");
    return DDPLUG_E_ABORTED;
  }
  if (a->kind != DDPLUG_COLL_BARRIER) {
    g->svc->set_error(g->svc->host, DDPLUG_E_UNSUPPORTED, "reentrant: barriers only");
    return DDPLUG_E_UNSUPPORTED;
  }
  ddplug_plugin_request *r = calloc(1, sizeof *r);
  if (!r) return DDPLUG_E_NO_MEMORY;
  char buf[8];
  uint64_t len = 0;
  pthread_mutex_lock(&g->lock); /* held across the wait, on purpose */
  r->status = g->svc->store_get(g->svc->host, "never-set", buf, sizeof buf, &len, 60000);
  pthread_mutex_unlock(&g->lock);
  *out = r;
  return DDPLUG_OK;
}

static int rt_wait(ddplug_plugin_group *g, ddplug_plugin_request *r, int64_t t) {
  (void)g;
  (void)t;
  return r->status;
}

static int rt_test(ddplug_plugin_group *g, ddplug_plugin_request *r, int32_t *done) {
  (void)g;
  *done = 1;
  return r->status;
}

static void rt_free(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  (void)g;
  free(r);
}

static const ddplug_plugin table = {
    .struct_size = sizeof(ddplug_plugin),
    .abi_version = DDPLUG_PLUGIN_ABI_VERSION,
    .name = "reentrant",
    .version = "0.0.1",
    .description = "test plugin: waits in host services while holding its own lock",
    .caps = DDPLUG_CAP_HOST_MEMORY | DDPLUG_CAP_ABORT,
    .dtype_mask = DDPLUG_DTYPE_BIT(DDPLUG_FLOAT32),
    .op_mask = DDPLUG_OP_BIT(DDPLUG_OP_SUM),
    .group_create = rt_create,
    .group_destroy = rt_destroy,
    .group_abort = rt_abort,
    .collective_start = rt_start,
    .request_wait = rt_wait,
    .request_test = rt_test,
    .request_free = rt_free,
};

DDPLUG_PLUGIN_EXPORT const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t v);
const ddplug_plugin *ddplug_plugin_entry_v1(uint32_t v) {
  (void)v;
  return &table;
}
