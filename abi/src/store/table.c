/*
 * table.c — the rendezvous server's key table and its parked waiters.
 *
 * Keys live in a chained hash table. An entry exists while its key is
 * present OR while some parked GET/WAIT watches it; each watch is a node in
 * its entry's watcher list. A waiter counts how many of its keys are
 * missing: setting an absent key decrements the count of every watcher,
 * deleting a present key increments it, so readiness is exact (a key set and
 * deleted again does not wake anyone) and costs O(watchers of that key).
 * Waiters also sit in a binary min-heap by deadline, so the server's loop
 * finds the next expiry in O(1) and expires in O(log n).
 *
 * Single-threaded: only the server thread touches a table.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdlib.h>
#include <string.h>

#include "store/store.h"

typedef struct entry entry;

typedef struct watch {
  entry *e; /* NULL until linked */
  ddplug__store_waiter *w;
  struct watch *prev, *next; /* in e->watchers */
} watch;

struct entry {
  entry *chain; /* next in the bucket */
  uint64_t hash;
  uint8_t *value; /* NULL when vlen == 0 or absent */
  uint32_t vlen;
  int present;
  watch *watchers;
  uint16_t klen;
  uint8_t key[];
};

struct ddplug__store_waiter {
  void *owner;
  uint64_t deadline_ns;
  size_t heap_idx; /* SIZE_MAX when not in the heap */
  ddplug__store_waiter *ready_next;
  uint32_t id;
  uint32_t missing;
  uint32_t nkeys;
  uint8_t type;
  uint8_t ready_queued;
  watch watches[];
};

struct ddplug__store_table {
  entry **buckets;
  size_t nbuckets; /* a power of two */
  size_t nentries;
  size_t npresent;
  ddplug__store_waiter **heap;
  size_t heap_len, heap_cap;
  ddplug__store_ready_fn ready;
  void *ctx;
};

/* ---- hash table ---------------------------------------------------------- */

static uint64_t key_hash(const uint8_t *key, size_t klen) {
  return ddplug__hash64(key, klen, 0x5354u);
}

static entry *find(const ddplug__store_table *t, const uint8_t *key,
                   size_t klen, uint64_t h) {
  for (entry *e = t->buckets[h & (t->nbuckets - 1)]; e; e = e->chain)
    if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
      return e;
  return NULL;
}

/* Double the bucket array when the load passes 1; on allocation failure
 * keep the old (longer chains, still correct). */
static void maybe_grow(ddplug__store_table *t) {
  if (t->nentries <= t->nbuckets) return;
  size_t n = t->nbuckets * 2;
  entry **b = ddplug__calloc(n, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i < t->nbuckets; i++) {
    entry *e = t->buckets[i];
    while (e) {
      entry *next = e->chain;
      e->chain = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
      e = next;
    }
  }
  ddplug__free(t->buckets);
  t->buckets = b;
  t->nbuckets = n;
}

static entry *find_or_add(ddplug__store_table *t, const uint8_t *key,
                          size_t klen) {
  uint64_t h = key_hash(key, klen);
  entry *e = find(t, key, klen, h);
  if (e) return e;
  e = ddplug__calloc(1, sizeof *e + klen);
  if (!e) return NULL;
  e->hash = h;
  e->klen = (uint16_t)klen;
  memcpy(e->key, key, klen);
  size_t b = h & (t->nbuckets - 1);
  e->chain = t->buckets[b];
  t->buckets[b] = e;
  t->nentries++;
  maybe_grow(t);
  return e;
}

/* Remove e if it holds nothing: absent and unwatched. */
static void maybe_remove(ddplug__store_table *t, entry *e) {
  if (e->present || e->watchers) return;
  entry **pp = &t->buckets[e->hash & (t->nbuckets - 1)];
  while (*pp != e) pp = &(*pp)->chain;
  *pp = e->chain;
  t->nentries--;
  ddplug__free(e->value);
  ddplug__free(e);
}

ddplug__store_table *ddplug__store_table_new(ddplug__store_ready_fn ready,
                                             void *ctx) {
  ddplug__store_table *t = ddplug__calloc(1, sizeof *t);
  if (!t) return NULL;
  t->nbuckets = 64;
  t->buckets = ddplug__calloc(t->nbuckets, sizeof *t->buckets);
  if (!t->buckets) {
    ddplug__free(t);
    return NULL;
  }
  t->ready = ready;
  t->ctx = ctx;
  return t;
}

void ddplug__store_table_free(ddplug__store_table *t) {
  if (!t) return;
  for (size_t i = 0; i < t->heap_len; i++) ddplug__free(t->heap[i]);
  ddplug__free(t->heap);
  for (size_t i = 0; i < t->nbuckets; i++) {
    entry *e = t->buckets[i];
    while (e) {
      entry *next = e->chain;
      ddplug__free(e->value);
      ddplug__free(e);
      e = next;
    }
  }
  ddplug__free(t->buckets);
  ddplug__free(t);
}

size_t ddplug__store_table_size(const ddplug__store_table *t) {
  return t->npresent;
}

const uint8_t *ddplug__store_table_get(ddplug__store_table *t,
                                       const uint8_t *key, size_t klen,
                                       uint32_t *len) {
  entry *e = find(t, key, klen, key_hash(key, klen));
  if (!e || !e->present) return NULL;
  *len = e->vlen;
  /* A present empty value still needs a non-NULL pointer. */
  return e->value ? e->value : (const uint8_t *)"";
}

int ddplug__store_table_set(ddplug__store_table *t, const uint8_t *key,
                            size_t klen, const uint8_t *value, uint32_t vlen) {
  uint8_t *copy = NULL;
  if (vlen > 0) {
    copy = ddplug__malloc(vlen);
    if (!copy) return -1;
    memcpy(copy, value, vlen);
  }
  entry *e = find_or_add(t, key, klen);
  if (!e) {
    ddplug__free(copy);
    return -1;
  }
  ddplug__free(e->value);
  e->value = copy;
  e->vlen = vlen;
  if (e->present) return 0;
  e->present = 1;
  t->npresent++;
  /* Collect the waiters this completes first, then answer them: answering
   * frees waiters and unlinks their watches from this very list. */
  ddplug__store_waiter *ready = NULL;
  for (watch *x = e->watchers; x; x = x->next) {
    ddplug__store_waiter *w = x->w;
    if (--w->missing == 0 && !w->ready_queued) {
      w->ready_queued = 1;
      w->ready_next = ready;
      ready = w;
    }
  }
  while (ready) {
    ddplug__store_waiter *w = ready;
    ready = w->ready_next;
    t->ready(t->ctx, w);
  }
  return 0;
}

int ddplug__store_table_delete(ddplug__store_table *t, const uint8_t *key,
                               size_t klen) {
  entry *e = find(t, key, klen, key_hash(key, klen));
  if (!e || !e->present) return 0;
  e->present = 0;
  t->npresent--;
  ddplug__free(e->value);
  e->value = NULL;
  e->vlen = 0;
  for (watch *x = e->watchers; x; x = x->next) x->w->missing++;
  maybe_remove(t, e);
  return 1;
}

/* ---- deadline heap ------------------------------------------------------- */

static void heap_place(ddplug__store_table *t, size_t i,
                       ddplug__store_waiter *w) {
  t->heap[i] = w;
  w->heap_idx = i;
}

static void heap_up(ddplug__store_table *t, size_t i) {
  ddplug__store_waiter *w = t->heap[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (t->heap[parent]->deadline_ns <= w->deadline_ns) break;
    heap_place(t, i, t->heap[parent]);
    i = parent;
  }
  heap_place(t, i, w);
}

static void heap_down(ddplug__store_table *t, size_t i) {
  ddplug__store_waiter *w = t->heap[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= t->heap_len) break;
    if (c + 1 < t->heap_len &&
        t->heap[c + 1]->deadline_ns < t->heap[c]->deadline_ns)
      c++;
    if (w->deadline_ns <= t->heap[c]->deadline_ns) break;
    heap_place(t, i, t->heap[c]);
    i = c;
  }
  heap_place(t, i, w);
}

static void heap_remove(ddplug__store_table *t, ddplug__store_waiter *w) {
  size_t i = w->heap_idx;
  if (i == SIZE_MAX) return;
  w->heap_idx = SIZE_MAX;
  ddplug__store_waiter *last = t->heap[--t->heap_len];
  if (last == w) return;
  heap_place(t, i, last);
  heap_up(t, i);
  heap_down(t, last->heap_idx);
}

/* ---- waiters ------------------------------------------------------------- */

void ddplug__store_waiter_free(ddplug__store_table *t,
                               ddplug__store_waiter *w) {
  if (!w) return;
  heap_remove(t, w);
  for (uint32_t i = 0; i < w->nkeys; i++) {
    watch *x = &w->watches[i];
    entry *e = x->e;
    if (!e) continue;
    if (x->prev)
      x->prev->next = x->next;
    else
      e->watchers = x->next;
    if (x->next) x->next->prev = x->prev;
    x->e = NULL;
    maybe_remove(t, e);
  }
  ddplug__free(w);
}

ddplug__store_waiter *ddplug__store_waiter_park(ddplug__store_table *t,
                                                const uint8_t *keys,
                                                size_t keys_len,
                                                uint32_t nkeys,
                                                uint64_t deadline_ns,
                                                void *owner, uint32_t id,
                                                uint8_t type) {
  ddplug__store_waiter *w =
      ddplug__calloc(1, sizeof *w + (size_t)nkeys * sizeof(watch));
  if (!w) return NULL;
  w->owner = owner;
  w->id = id;
  w->type = type;
  w->deadline_ns = deadline_ns;
  w->heap_idx = SIZE_MAX;
  w->nkeys = nkeys;
  ddplug__rd r = {keys, keys_len, 0};
  for (uint32_t i = 0; i < nkeys; i++) {
    uint16_t klen = 0;
    const uint8_t *key = ddplug__store_next_key(&r, &klen);
    entry *e = key ? find_or_add(t, key, klen) : NULL;
    if (!e) {
      ddplug__store_waiter_free(t, w);
      return NULL;
    }
    watch *x = &w->watches[i];
    x->w = w;
    x->e = e;
    x->next = e->watchers;
    if (e->watchers) e->watchers->prev = x;
    e->watchers = x;
    if (!e->present) w->missing++;
  }
  if (t->heap_len == t->heap_cap) {
    size_t cap = t->heap_cap ? t->heap_cap * 2 : 16;
    ddplug__store_waiter **h = ddplug__realloc(t->heap, cap * sizeof *h);
    if (!h) {
      ddplug__store_waiter_free(t, w);
      return NULL;
    }
    t->heap = h;
    t->heap_cap = cap;
  }
  t->heap_len++;
  heap_place(t, t->heap_len - 1, w);
  heap_up(t, t->heap_len - 1);
  return w;
}

uint32_t ddplug__store_waiter_missing(const ddplug__store_waiter *w) {
  return w->missing;
}
void *ddplug__store_waiter_owner(const ddplug__store_waiter *w) {
  return w->owner;
}
uint32_t ddplug__store_waiter_id(const ddplug__store_waiter *w) {
  return w->id;
}
uint8_t ddplug__store_waiter_type(const ddplug__store_waiter *w) {
  return w->type;
}
uint32_t ddplug__store_waiter_nkeys(const ddplug__store_waiter *w) {
  return w->nkeys;
}

const uint8_t *ddplug__store_waiter_key(const ddplug__store_waiter *w,
                                        uint32_t i, uint16_t *len,
                                        int *present) {
  const entry *e = w->watches[i].e;
  *len = e->klen;
  *present = e->present;
  return e->key;
}

void ddplug__store_table_drop_owner(ddplug__store_table *t, void *owner) {
  /* Collect first: freeing reorders the heap under an index walk. */
  ddplug__store_waiter *doomed = NULL;
  for (size_t i = 0; i < t->heap_len; i++) {
    ddplug__store_waiter *w = t->heap[i];
    if (w->owner == owner) {
      w->ready_next = doomed;
      doomed = w;
    }
  }
  while (doomed) {
    ddplug__store_waiter *w = doomed;
    doomed = w->ready_next;
    ddplug__store_waiter_free(t, w);
  }
}

uint64_t ddplug__store_table_expire(ddplug__store_table *t, uint64_t now_ns) {
  while (t->heap_len > 0 && t->heap[0]->deadline_ns <= now_ns) {
    ddplug__store_waiter *w = t->heap[0];
    heap_remove(t, w);
    t->ready(t->ctx, w);
  }
  return t->heap_len > 0 ? t->heap[0]->deadline_ns : UINT64_MAX;
}
