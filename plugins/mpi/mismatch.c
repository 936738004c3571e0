/*
 * mismatch.c — every collective compared across ranks before its data
 * moves (plugin_options.check_mismatch, on by default).
 *
 * Each rank contributes its (seq, kind, count, dtype, op, root) twice, as
 * v and as -v, in MPI_LONG_INT pairs with its rank; one MPI_Iallreduce
 * with MPI_MINLOC on the group's descriptor communicator gives every rank
 * each field's minimum and maximum and a rank holding each. Equal minimum
 * and maximum everywhere: the calls agree and the data is posted. A
 * difference: MISMATCH on every rank (every rank computed the same
 * result), naming two ranks and what each called; the data is never
 * posted, so nothing moves and the group stays usable.
 *
 * Cost: one 192-byte allreduce per collective, waited for before the data
 * is posted (a second round trip for small messages; plugins/mpi/README.md
 * has the numbers). A barrier needs nothing more: the descriptor
 * allreduce already synchronised every rank.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static void fields(const ddplug_coll_args *a, long out[DDMPI_DESC_FIELDS]) {
  out[0] = (long)a->seq;
  out[1] = a->kind;
  out[2] = a->kind == DDPLUG_COLL_BARRIER ? 0 : (long)a->count;
  out[3] = a->kind == DDPLUG_COLL_BARRIER ? 0 : a->dtype;
  out[4] = a->kind == DDPLUG_COLL_ALLREDUCE ? a->op : 0;
  out[5] = a->kind == DDPLUG_COLL_BROADCAST ? a->root : 0;
}

/* See internal.h. */
int ddmpi_mismatch_post(ddplug_plugin_request *r) {
  long f[DDMPI_DESC_FIELDS];
  fields(&r->a, f);
  for (int i = 0; i < DDMPI_DESC_FIELDS; i++) {
    r->desc_in[i].v = f[i];
    r->desc_in[i].r = r->group->rank;
    r->desc_in[DDMPI_DESC_FIELDS + i].v = -f[i];
    r->desc_in[DDMPI_DESC_FIELDS + i].r = r->group->rank;
  }
  int rc = MPI_Iallreduce(r->desc_in, r->desc_out, 2 * DDMPI_DESC_FIELDS, MPI_LONG_INT, MPI_MINLOC,
                          r->group->check_comm, &r->check);
  if (rc != MPI_SUCCESS) {
    char e[400];
    ddmpi_mpi_error(rc, e, sizeof e);
    ddmpi_fmt(r->msg, sizeof r->msg, "%s: posting its mismatch check failed: %s", r->what, e);
  }
  return rc;
}

static void value_text(int field, long v, char *buf, size_t cap) {
  switch (field) {
    case 0:
      ddmpi_fmt(buf, cap, "sequence number %ld", v);
      break;
    case 1:
      ddmpi_fmt(buf, cap, "%s", ddmpi_kind_name((int32_t)v));
      break;
    case 2:
      ddmpi_fmt(buf, cap, "count %ld", v);
      break;
    case 3:
      ddmpi_fmt(buf, cap, "dtype %s", ddmpi_dtype_name((int32_t)v));
      break;
    case 4:
      ddmpi_fmt(buf, cap, "op %s", ddmpi_op_name((int32_t)v));
      break;
    default:
      ddmpi_fmt(buf, cap, "root %ld", v);
      break;
  }
}

/* See internal.h. */
int ddmpi_mismatch_judge(ddplug_plugin_request *r) {
  for (int i = 0; i < DDMPI_DESC_FIELDS; i++) {
    long lo = r->desc_out[i].v, hi = -r->desc_out[DDMPI_DESC_FIELDS + i].v;
    if (lo == hi) continue;
    int rlo = r->desc_out[i].r, rhi = r->desc_out[DDMPI_DESC_FIELDS + i].r;
    char a[64], b[64];
    value_text(i, lo, a, sizeof a);
    value_text(i, hi, b, sizeof b);
    if (i == 1)
      ddmpi_fmt(r->msg, sizeof r->msg,
                "collective seq %llu differs across ranks: rank %d called %s but rank %d called %s "
                "(this rank, %d: %s); nothing was moved",
                (unsigned long long)r->seq, rlo, a, rhi, b, r->group->rank, r->what);
    else
      ddmpi_fmt(r->msg, sizeof r->msg,
                "collective seq %llu differs across ranks: rank %d called it with %s but rank %d "
                "with %s (this rank, %d: %s); nothing was moved",
                (unsigned long long)r->seq, rlo, a, rhi, b, r->group->rank, r->what);
    return -1;
  }
  return 0;
}
