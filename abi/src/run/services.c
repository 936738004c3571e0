/* services.c — the host services table lent to the plugin: a namespaced view
 * of the store (its own connection, waits that end early when the run is
 * aborted), logging with the plugin's name, the clock, error reporting, and
 * the plugin's declared options, typed.
 * SPDX-License-Identifier: Apache-2.0 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "run/context.h"

#define MAX_KEY 255

static int full_key(ddplug_context *ctx, const char *key, char *buf, size_t cap) {
  if (!key || !*key)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "plugin store key is empty");
  int n = snprintf(buf, cap, "%s%s", ctx->plugin_prefix, key);
  if (n < 0 || (size_t)n >= cap || n > MAX_KEY)
    return ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                       "plugin store key '%.64s...' is too long (at most %d "
                       "bytes with the prefix '%s')",
                       key, MAX_KEY, ctx->plugin_prefix);
  return DDPLUG_OK;
}

/* Failures inside services are reported to the plugin through the status and
 * recorded as the plugin's error text, so the runtime can show them. */
static int svc_fail(ddplug_context *ctx, int status) {
  pthread_mutex_lock(&ctx->plugin_err_mu);
  if (!ctx->plugin_err_set) {
    ctx->plugin_err_set = 1;
    ctx->plugin_err_status = status;
    ddplug__strlcpy(ctx->plugin_err, ddplug_last_error(), sizeof ctx->plugin_err);
  }
  pthread_mutex_unlock(&ctx->plugin_err_mu);
  return status;
}

static int svc_store_set(void *host, const char *key, const void *value, uint64_t len) {
  ddplug_context *ctx = host;
  char k[MAX_KEY + 64];
  int s = full_key(ctx, key, k, sizeof k);
  if (s == DDPLUG_OK) s = ddplug_store_set(ctx->plugin_store, k, value, len);
  return s == DDPLUG_OK ? s : svc_fail(ctx, s);
}

static int svc_store_get(void *host, const char *key, void *buf, uint64_t cap,
                         uint64_t *len, int64_t timeout_ms) {
  ddplug_context *ctx = host;
  char k[MAX_KEY + 64];
  int s = full_key(ctx, key, k, sizeof k);
  if (s != DDPLUG_OK) return svc_fail(ctx, s);
  if (timeout_ms < 0) timeout_ms = ctx->coll_timeout_ms;
  void *val = NULL;
  uint64_t vlen = 0;
  if (timeout_ms > 0) {
    s = ddplug__wait_get(ctx, ctx->plugin_store, k, ddplug__deadline_ns(timeout_ms),
                         "plugin store get", 1, &val, &vlen);
    if (ddplug__own_timeout(ctx, s))
      ddplug__err(s, "waited %.1f s for store key '%s' (plugin %s)",
                  (double)timeout_ms / 1000.0, key, ctx->plugin->table.name);
    if (s != DDPLUG_OK) return svc_fail(ctx, s);
  } else {
    s = ddplug_store_get(ctx->plugin_store, k, 0, &val, &vlen);
    /* A poll (timeout 0) that finds nothing is not a failure to explain. */
    if (s == DDPLUG_E_TIMEOUT) return s;
    if (s != DDPLUG_OK) return svc_fail(ctx, s);
  }
  if (len) *len = vlen;
  if (vlen > cap) {
    ddplug_free(val);
    ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                "store key '%s' holds %llu bytes, more than the %llu-byte buffer",
                key, (unsigned long long)vlen, (unsigned long long)cap);
    return svc_fail(ctx, DDPLUG_E_INVALID_ARGUMENT);
  }
  if (vlen) memcpy(buf, val, vlen);
  ddplug_free(val);
  return DDPLUG_OK;
}

static int svc_store_add(void *host, const char *key, int64_t delta, int64_t *result) {
  ddplug_context *ctx = host;
  char k[MAX_KEY + 64];
  int s = full_key(ctx, key, k, sizeof k);
  if (s == DDPLUG_OK) s = ddplug_store_add(ctx->plugin_store, k, delta, result);
  return s == DDPLUG_OK ? s : svc_fail(ctx, s);
}

static int svc_store_wait(void *host, const char *const *keys, uint32_t nkeys,
                          int64_t timeout_ms) {
  ddplug_context *ctx = host;
  if (nkeys == 0) return DDPLUG_OK;
  if (!keys || nkeys > 1024) {
    ddplug__err(DDPLUG_E_INVALID_ARGUMENT, "plugin store wait: 1..1024 keys");
    return svc_fail(ctx, DDPLUG_E_INVALID_ARGUMENT);
  }
  char(*buf)[MAX_KEY + 64] = ddplug__malloc(nkeys * sizeof *buf);
  const char **ptrs = ddplug__malloc(nkeys * sizeof *ptrs);
  int s = (buf && ptrs) ? DDPLUG_OK : ddplug__err(DDPLUG_E_NO_MEMORY, "out of memory");
  for (uint32_t i = 0; s == DDPLUG_OK && i < nkeys; i++) {
    s = full_key(ctx, keys[i], buf[i], sizeof buf[i]);
    ptrs[i] = buf[i];
  }
  if (s == DDPLUG_OK) {
    if (timeout_ms < 0) timeout_ms = ctx->coll_timeout_ms;
    s = ddplug__wait_keys(ctx, ctx->plugin_store, ptrs, nkeys,
                          ddplug__deadline_ns(timeout_ms), "plugin store wait", 1);
  }
  ddplug__free(buf);
  ddplug__free(ptrs);
  if (s == DDPLUG_E_TIMEOUT && timeout_ms == 0) return s; /* a poll */
  return s == DDPLUG_OK ? s : svc_fail(ctx, s);
}

static int svc_store_delete(void *host, const char *key) {
  ddplug_context *ctx = host;
  char k[MAX_KEY + 64];
  int s = full_key(ctx, key, k, sizeof k);
  if (s == DDPLUG_OK) s = ddplug_store_delete(ctx->plugin_store, k, NULL);
  return s == DDPLUG_OK ? s : svc_fail(ctx, s);
}

static void svc_log(void *host, int32_t level, const char *message) {
  ddplug_context *ctx = host;
  if (!ddplug__log_enabled(level)) return;
  ddplug__log(level, "%s: %s", ctx->plugin->table.name, message ? message : "");
}

static uint64_t svc_clock_ns(void *host) {
  DDPLUG__UNUSED(host);
  return ddplug__now_ns();
}

static void svc_set_error(void *host, int32_t status, const char *message) {
  ddplug_context *ctx = host;
  pthread_mutex_lock(&ctx->plugin_err_mu);
  ctx->plugin_err_set = 1;
  ctx->plugin_err_status = status;
  ddplug__strlcpy(ctx->plugin_err, message ? message : "", sizeof ctx->plugin_err);
  pthread_mutex_unlock(&ctx->plugin_err_mu);
}

/* ---- typed options (the plugin's declarations, plugin/options.c) ----------- */

static int option(ddplug_context *ctx, const char *name, int32_t type, const json_t **v) {
  int s = ddplug__option_value(&ctx->plugin->table, ctx->option_values, name, type, v);
  return s == DDPLUG_OK ? s : svc_fail(ctx, s);
}

static int svc_option_bool(void *host, const char *name, int32_t *out) {
  const json_t *v;
  int s = option(host, name, DDPLUG_OPTION_BOOL, &v);
  if (s == DDPLUG_OK && out) *out = json_is_true(v);
  return s;
}

static int svc_option_int(void *host, const char *name, int64_t *out) {
  const json_t *v;
  int s = option(host, name, DDPLUG_OPTION_INT, &v);
  if (s == DDPLUG_OK && out) *out = json_integer_value(v);
  return s;
}

static int svc_option_number(void *host, const char *name, double *out) {
  const json_t *v;
  int s = option(host, name, DDPLUG_OPTION_NUMBER, &v);
  if (s == DDPLUG_OK && out) *out = json_number_value(v);
  return s;
}

static int svc_option_string(void *host, const char *name, char *buf, uint64_t cap,
                             uint64_t *len) {
  ddplug_context *ctx = host;
  const json_t *v;
  int s = option(ctx, name, DDPLUG_OPTION_STRING, &v);
  if (s != DDPLUG_OK) return s;
  size_t n = json_string_length(v);
  if (len) *len = n;
  if (!buf || cap <= n)
    return svc_fail(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                     "plugin option '%s': %zu bytes do not fit a buffer of %llu",
                                     name, n + 1, (unsigned long long)cap));
  memcpy(buf, json_string_value(v), n + 1);
  return DDPLUG_OK;
}

static int svc_option_int_list(void *host, const char *name, int64_t *out, uint64_t cap,
                               uint64_t *count) {
  ddplug_context *ctx = host;
  const json_t *v;
  int s = option(ctx, name, DDPLUG_OPTION_INT_LIST, &v);
  if (s != DDPLUG_OK) return s;
  size_t n = json_array_size(v);
  if (count) *count = n;
  if (n > cap || (n && !out))
    return svc_fail(ctx, ddplug__err(DDPLUG_E_INVALID_ARGUMENT,
                                     "plugin option '%s': %zu items do not fit a buffer of %llu",
                                     name, n, (unsigned long long)cap));
  for (size_t i = 0; i < n; i++) out[i] = json_integer_value(json_array_get(v, i));
  return DDPLUG_OK;
}

void ddplug__services_init(ddplug_context *ctx) {
  ddplug_host_services *s = &ctx->services;
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  s->host = ctx;
  s->store_set = svc_store_set;
  s->store_get = svc_store_get;
  s->store_add = svc_store_add;
  s->store_wait = svc_store_wait;
  s->store_delete = svc_store_delete;
  s->log = svc_log;
  s->clock_ns = svc_clock_ns;
  s->set_error = svc_set_error;
  s->option_bool = svc_option_bool;
  s->option_int = svc_option_int;
  s->option_number = svc_option_number;
  s->option_string = svc_option_string;
  s->option_int_list = svc_option_int_list;
  /* Per run and per plugin: plugins never see each other's keys, nor
   * another run's. (The runtime's own ddplug/ keys are not per run: an
   * external store — rendezvous.external — must be fresh for every run.) */
  snprintf(ctx->plugin_prefix, sizeof ctx->plugin_prefix, "p/%s/%s/", ctx->run_id,
           ctx->plugin->table.name);
}

/* Before the store exists (the bootstrap slots): its slots and the
 * options answer UNSUPPORTED; logging, the clock and set_error work. */
static int boot_set(void *host, const char *key, const void *value, uint64_t len) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(key), DDPLUG__UNUSED(value), DDPLUG__UNUSED(len);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_get(void *host, const char *key, void *buf, uint64_t cap, uint64_t *len,
                    int64_t timeout_ms) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(key), DDPLUG__UNUSED(buf), DDPLUG__UNUSED(cap);
  DDPLUG__UNUSED(len), DDPLUG__UNUSED(timeout_ms);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_add(void *host, const char *key, int64_t delta, int64_t *result) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(key), DDPLUG__UNUSED(delta), DDPLUG__UNUSED(result);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_wait(void *host, const char *const *keys, uint32_t nkeys, int64_t timeout_ms) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(keys), DDPLUG__UNUSED(nkeys), DDPLUG__UNUSED(timeout_ms);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_delete(void *host, const char *key) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(key);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_bool(void *host, const char *name, int32_t *out) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(name), DDPLUG__UNUSED(out);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_int(void *host, const char *name, int64_t *out) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(name), DDPLUG__UNUSED(out);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_number(void *host, const char *name, double *out) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(name), DDPLUG__UNUSED(out);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_string(void *host, const char *name, char *buf, uint64_t cap, uint64_t *len) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(name), DDPLUG__UNUSED(buf), DDPLUG__UNUSED(cap);
  DDPLUG__UNUSED(len);
  return DDPLUG_E_UNSUPPORTED;
}
static int boot_int_list(void *host, const char *name, int64_t *out, uint64_t cap,
                         uint64_t *count) {
  DDPLUG__UNUSED(host), DDPLUG__UNUSED(name), DDPLUG__UNUSED(out), DDPLUG__UNUSED(cap);
  DDPLUG__UNUSED(count);
  return DDPLUG_E_UNSUPPORTED;
}

void ddplug__services_bootstrap(ddplug_context *ctx, ddplug_host_services *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->abi_version = DDPLUG_PLUGIN_ABI_VERSION;
  s->host = ctx;
  s->store_set = boot_set;
  s->store_get = boot_get;
  s->store_add = boot_add;
  s->store_wait = boot_wait;
  s->store_delete = boot_delete;
  s->log = svc_log;
  s->clock_ns = svc_clock_ns;
  s->set_error = svc_set_error;
  s->option_bool = boot_bool;
  s->option_int = boot_int;
  s->option_number = boot_number;
  s->option_string = boot_string;
  s->option_int_list = boot_int_list;
}

void ddplug__plugin_err_clear(ddplug_context *ctx) {
  pthread_mutex_lock(&ctx->plugin_err_mu);
  ctx->plugin_err_set = 0;
  ctx->plugin_err[0] = '\0';
  pthread_mutex_unlock(&ctx->plugin_err_mu);
}

int ddplug__plugin_err_take(ddplug_context *ctx, int status, const char *slot) {
  pthread_mutex_lock(&ctx->plugin_err_mu);
  if (ctx->plugin_err_set && ctx->plugin_err[0])
    ddplug__err(status, "%s", ctx->plugin_err);
  else
    ddplug__err(status, "plugin %s: %s returned %s (%s) without an explanation",
                ctx->plugin->table.name, slot, ddplug_status_name(status),
                ddplug_strerror(status));
  pthread_mutex_unlock(&ctx->plugin_err_mu);
  return status;
}
