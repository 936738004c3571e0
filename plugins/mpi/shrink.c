/*
 * shrink.c — group_shrink: after a lost rank, the survivors' group is
 * re-formed in place with ULFM (User Level Failure Mitigation: Open MPI 5's
 * MPIX_Comm_revoke, MPIX_Comm_shrink, MPIX_Comm_agree), without a new
 * communicator from MPI_COMM_WORLD.
 *
 * When. The symbols are looked up at run time (the backend is built
 * against the oldest headers of its family, which have no ULFM; Debian's
 * Open MPI 4.1 and MPICH's ch4 builds lack them or cannot run with fault
 * tolerance), and ULFM only keeps survivors when the job runs with fault
 * tolerance (mpirun --with-ft ulfm). Where either is missing the table has
 * no group_shrink and no DDPLUG_CAP_SHRINK, and the runtime re-forms the
 * group with group_create over the survivors, as for any plugin without
 * the slot. plugin_options.shrink = "recreate" makes the slot decline
 * (DDPLUG_E_UNSUPPORTED) after step 3 below, leaving the shrunk
 * communicator to the runtime's group_create as the parent of the new
 * group's (MPI_COMM_WORLD holds the dead process: creating from it fails
 * once MPI knows of the loss).
 *
 * How, on every survivor:
 *   1. the old group fails (its requests end with PEER_LOST) and its
 *      communicators are revoked, so that nothing of it is waited for again
 *      — MPI's pending operations on them complete with MPI_ERR_REVOKED,
 *      and are completed here (tested until they end, at most
 *      DDMPI_DRAIN_MS), so that MPI no longer writes into the old group's
 *      requests once group_destroy frees them;
 *   2. every survivor publishes its MPI_COMM_WORLD rank under the new
 *      generation's store prefix and waits for the others (bounded by the
 *      collective timeout, ended early by a failure of the run): MPI's
 *      shrink and agree cannot time out, so they are entered only once
 *      every survivor the runtime counted is here;
 *   3. MPIX_Comm_shrink of the old collectives' communicator;
 *   4. the shrunk communicator must hold exactly the runtime's survivors in
 *      the runtime's order (its size, and each rank's MPI_COMM_WORLD rank
 *      against init's renumbering through old_rank_of); MPIX_Comm_agree
 *      makes that verdict every survivor's, so either every survivor gets
 *      the new group or every one fails with a sentence saying why;
 *   5. the rest of the group as group_create makes it (the duplicated
 *      communicators, the hierarchical part, the progress thread).
 * The old group stays failed: group_destroy neither waits for its requests
 * nor frees its communicators, and the process does not call MPI_Finalize
 * (group.c: Open MPI 5 with ULFM was seen waiting there for a dead rank).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

typedef int (*ddmpi_revoke_fn)(MPI_Comm);
typedef int (*ddmpi_shrink_fn)(MPI_Comm, MPI_Comm *);
typedef int (*ddmpi_agree_fn)(MPI_Comm, int *);

static struct {
  int resolved;
  int usable;
  char why[256];
  ddmpi_revoke_fn revoke;
  ddmpi_shrink_fn shrink;
  ddmpi_agree_fn agree;
} ulfm;

/* The family's switch for fault tolerance. */
#if defined(OPEN_MPI)
#define DDMPI_FT_VARIABLE "OMPI_MCA_mpi_ft_enable"
#else
#define DDMPI_FT_VARIABLE "MPIR_CVAR_ENABLE_FT"
#endif

static int truthy(const char *v) {
  return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
               !strcasecmp(v, "on") || !strcasecmp(v, "enabled"));
}

/* See internal.h. */
int ddmpi_shrink_usable(char *why, size_t cap) {
  if (!ulfm.resolved) {
    ulfm.resolved = 1;
    ulfm.revoke = (ddmpi_revoke_fn)dlsym(RTLD_DEFAULT, "MPIX_Comm_revoke");
    ulfm.shrink = (ddmpi_shrink_fn)dlsym(RTLD_DEFAULT, "MPIX_Comm_shrink");
    ulfm.agree = (ddmpi_agree_fn)dlsym(RTLD_DEFAULT, "MPIX_Comm_agree");
    if (!ulfm.revoke || !ulfm.shrink || !ulfm.agree)
      ddmpi_fmt(ulfm.why, sizeof ulfm.why, "this MPI has no ULFM (MPIX_Comm_shrink)");
    else if (!truthy(getenv(DDMPI_FT_VARIABLE)))
      ddmpi_fmt(ulfm.why, sizeof ulfm.why,
                "this MPI has ULFM but the job runs without fault tolerance (%s is not set: "
                "Open MPI's mpirun --with-ft ulfm sets it)",
                DDMPI_FT_VARIABLE);
    else
      ulfm.usable = 1;
  }
  ddmpi_fmt(why, cap, "%s", ulfm.why);
  return ulfm.usable;
}

/* "MPI processes 0, 2" of n world ranks. */
static void world_list(const int32_t *wr, int n, char *buf, size_t cap) {
  size_t len = 0;
  ddmpi_fmt(buf, cap, "none");
  for (int i = 0; i < n && len + 16 < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", (int)wr[i]);
}

/* Whether the shrunk communicator holds the runtime's survivors in the
 * runtime's order: 1, or 0 with the sentence in err. */
static int same_survivors(ddplug_plugin_group *old, ddplug_plugin_group *g,
                          const int32_t *old_rank_of, char *err, size_t cap) {
  char ours[256], mpis[256];
  for (int r = 0; r < g->world; r++) {
    int o = old_rank_of[r];
    if (o < 0 || o >= old->world || old->world_rank_of[o] != g->world_rank_of[r]) {
      ddmpi_fmt(err, cap,
                "plugin mpi: group_shrink: the runtime's new rank %d was rank %d of the old "
                "group, but it is MPI process %d, which was old rank %d's: the runtime's "
                "renumbering and the old group disagree; the group is not re-formed",
                r, o, (int)g->world_rank_of[r],
                o >= 0 && o < old->world ? (int)old->world_rank_of[o] : -1);
      return 0;
    }
  }
  int size = -1, me = -1;
  MPI_Comm_size(g->comm, &size);
  MPI_Comm_rank(g->comm, &me);
  int32_t *wr = calloc((size_t)(size > 0 ? size : 1), sizeof *wr);
  int *in = calloc((size_t)(size > 0 ? size : 1), sizeof *in);
  int ok = wr && in;
  if (ok) {
    MPI_Group sg = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    MPI_Comm_group(g->comm, &sg);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int *out = calloc((size_t)(size > 0 ? size : 1), sizeof *out);
    for (int i = 0; i < size; i++) in[i] = i;
    ok = out && MPI_Group_translate_ranks(sg, size, in, wg, out) == MPI_SUCCESS;
    for (int i = 0; ok && i < size; i++) wr[i] = out[i];
    free(out);
    MPI_Group_free(&sg);
    MPI_Group_free(&wg);
  }
  if (!ok) {
    ddmpi_fmt(err, cap, "plugin mpi: group_shrink: out of memory or MPI_Group_translate_ranks failed");
    free(wr);
    free(in);
    return 0;
  }
  int same = size == g->world && me == g->rank;
  for (int i = 0; same && i < size; i++) same = wr[i] == g->world_rank_of[i];
  if (!same) {
    world_list(wr, size, mpis, sizeof mpis);
    world_list(g->world_rank_of, g->world, ours, sizeof ours);
    ddmpi_fmt(err, cap,
              "plugin mpi: group_shrink: MPIX_Comm_shrink kept %d rank%s (MPI processes %s, this "
              "one as rank %d) but the runtime re-formed the group over %d (MPI processes %s, "
              "this one as rank %d): MPI and the rendezvous store disagree on who survived or "
              "in which order; the group is not re-formed (plugin_options.shrink = \"recreate\" "
              "makes a new group over the runtime's survivors instead)",
              size, size == 1 ? "" : "s", mpis, me, g->world, ours, g->rank);
  }
  free(wr);
  free(in);
  return same;
}

/* How long the old group's MPI operations may take to end after their
 * communicators were revoked. Revocation ends them locally, without the
 * dead (measured: within the first poll or two), so this only bounds an MPI
 * that behaves otherwise. */
#define DDMPI_DRAIN_MS 1000

/* Complete the MPI requests of old's requests, which the revocation ends
 * with MPI_ERR_REVOKED, so that MPI no longer points into them when
 * group_destroy frees them. Until deadline_ns; how many are still pending. */
static int drain_revoked(ddplug_plugin_group *old, uint64_t deadline_ns) {
  for (;;) {
    int pending = 0;
    pthread_mutex_lock(&ddmpi_p.mu);
    for (ddplug_plugin_request *r = old->live; r; r = r->lnext) {
      for (int i = -1; i < r->nreq; i++) {
        MPI_Request *q = i < 0 ? &r->check : &r->mreq[i];
        if (*q == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1; /* ended in error */
        if (done) *q = MPI_REQUEST_NULL;
        else pending++;
      }
    }
    pthread_mutex_unlock(&ddmpi_p.mu);
    if (!pending || ddmpi_now_ns() >= deadline_ns) return pending;
    ddmpi_sleep_us(200);
  }
}

/* See internal.h. */
int ddmpi_group_shrink(ddplug_plugin_group *old, const ddplug_group_init *init,
                       const ddplug_host_services *svc, const int32_t *old_rank_of,
                       ddplug_plugin_group **out) {
  if (!old || !init || !svc || !old_rank_of || !out)
    return ddmpi_fail(svc, DDPLUG_E_INVALID_ARGUMENT,
                      "plugin mpi: group_shrink: group, init, svc, old_rank_of and out must not "
                      "be NULL");
  char why[256];
  if (!ddmpi_shrink_usable(why, sizeof why))
    return ddmpi_fail(svc, DDPLUG_E_UNSUPPORTED, "plugin mpi: cannot shrink in place: %s", why);
  ddplug_plugin_group *g = NULL;
  int st = ddmpi_group_begin(init, svc, &g);
  if (st != DDPLUG_OK) return st;
  char err[DDMPI_MSG_MAX] = "";

  /* 1. the old group: failed, its communicators revoked, MPI's operations
   * on them ended */
  pthread_mutex_lock(&ddmpi_p.mu);
  ddmpi_group_fail_locked(old, DDPLUG_E_PEER_LOST,
                          "plugin mpi: the group was re-formed without its lost rank(s)");
  MPI_Comm olds[5] = {old->comm, old->check_comm, old->p2p_comm, old->p2p_data_comm,
                      ddmpi_hier_leaders(old)};
  for (int i = 0; i < 5; i++)
    if (olds[i] != MPI_COMM_NULL) ulfm.revoke(olds[i]); /* revoked already: no harm */
  pthread_mutex_unlock(&ddmpi_p.mu);
  int left = drain_revoked(old, ddmpi_now_ns() + DDMPI_DRAIN_MS * 1000000ull);

  /* 2. every survivor here */
  st = ddmpi_world_ranks(g, err, sizeof err);
  if (st != DDPLUG_OK) return ddmpi_group_finish(g, st, 0, err, sizeof err, out);

  /* 3. shrink */
  int rc = ulfm.shrink(old->comm, &g->comm);
  if (rc == MPI_SUCCESS && g->opts.shrink_recreate) {
    /* "recreate": decline, and the runtime makes a new group with
     * group_create. Its communicator cannot come from MPI_COMM_WORLD, which
     * holds the dead process: once MPI knows of the loss,
     * MPI_Comm_create_group on it fails with MPI_ERR_PROC_FAILED (seen in the
     * wheel test under load). The shrunk one is left to that group_create
     * as its parent (make_comm in group.c). */
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    pthread_mutex_lock(&ddmpi_p.mu);
    if (ddmpi_p.recreate_parent != MPI_COMM_NULL) MPI_Comm_free(&ddmpi_p.recreate_parent);
    ddmpi_p.recreate_parent = g->comm;
    pthread_mutex_unlock(&ddmpi_p.mu);
    g->comm = MPI_COMM_NULL;
    ddmpi_fmt(err, sizeof err, "plugin mpi: plugin_options.shrink is \"recreate\"");
    return ddmpi_group_finish(g, DDPLUG_E_UNSUPPORTED, 0, err, sizeof err, out);
  }
  if (rc != MPI_SUCCESS) {
    char e[512];
    ddmpi_mpi_error(rc, e, sizeof e);
    ddmpi_fmt(err, sizeof err, "plugin mpi: group_shrink: MPIX_Comm_shrink failed: %s", e);
    g->comm = MPI_COMM_NULL;
    return ddmpi_group_finish(g, ddmpi_status_of(rc), 1, err, sizeof err, out);
  }
  MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);

  /* 4. the runtime's survivors, in its order, on every survivor */
  int mine = same_survivors(old, g, old_rank_of, err, sizeof err);
  int all = mine;
  rc = ulfm.agree(g->comm, &all);
  if (rc != MPI_SUCCESS) {
    char e[512];
    ddmpi_mpi_error(rc, e, sizeof e);
    ddmpi_fmt(err, sizeof err,
              "plugin mpi: group_shrink: MPIX_Comm_agree over the shrunk communicator failed "
              "(%s): another survivor was lost while the group was re-formed",
              e);
    return ddmpi_group_finish(g, ddmpi_status_of(rc), 1, err, sizeof err, out);
  }
  if (!all) {
    if (mine)
      ddmpi_fmt(err, sizeof err,
                "plugin mpi: group_shrink: another survivor found that MPIX_Comm_shrink's "
                "survivors differ from the runtime's (its own error says how); the group is not "
                "re-formed");
    return ddmpi_group_finish(g, DDPLUG_E_INTERNAL, 1, err, sizeof err, out);
  }

  /* 5. the rest, as group_create */
  st = ddmpi_group_finish(g, DDPLUG_OK, 1, err, sizeof err, &g);
  if (st != DDPLUG_OK) return st;
  ddmpi_log(svc, g->log_level, DDPLUG_LOG_INFO,
            "the group was shrunk in place with ULFM's MPIX_Comm_shrink: %d of %d ranks "
            "remain, this one (MPI process %d) was rank %d and is rank %d",
            g->world, old->world, ddmpi_p.world_rank, (int)old_rank_of[g->rank], g->rank);
  if (left)
    ddmpi_log(svc, g->log_level, DDPLUG_LOG_DEBUG,
              "mpi: %d MPI operation(s) of the old group did not end within %d ms of its "
              "revocation; they stay pending (the old group's requests are kept)",
              left, DDMPI_DRAIN_MS);
  *out = g;
  return DDPLUG_OK;
}
