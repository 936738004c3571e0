/*
 * p2p.c — p2p_start: sends and receives, on two communicators of the
 * group's own (never the collectives').
 *
 * A send is two messages with the caller's tag: a 16-byte header (count,
 * dtype, element size) on the header communicator, then the payload on the
 * payload communicator. A receive takes the header first (from its peer,
 * or MPI_ANY_SOURCE), which tells the sender and what it sent; then the
 * payload from that sender. So a count or dtype that differs is found
 * before any data lands: the payload goes into a scratch buffer and is
 * dropped, and the receive fails with MISMATCH naming both ranks, the tag
 * and both counts (the send completes: the sender cannot tell). MPI's
 * non-overtaking rule on each communicator keeps a sender's messages of
 * one tag in order; a receive posts its payload only once no earlier
 * receive that could match the same sender and tag is still waiting for
 * its header, so payloads pair with their headers. Payloads beyond 2^30
 * bytes go in several messages, the same split on both sides.
 *
 * A receive nobody sends to stays pending: request_wait returns TIMEOUT
 * each time its own timeout passes. group_abort fails pending operations;
 * pending receives are cancelled (MPI_Cancel), sends are left to MPI.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DDMPI_P2P_CHUNK (1ull << 30)

static int chunks(uint64_t bytes) {
  return bytes == 0 ? 1 : (int)((bytes + DDMPI_P2P_CHUNK - 1) / DDMPI_P2P_CHUNK);
}

/* Post count bytes of buf as chunked sends or receives on the payload
 * communicator. */
static int post_payload(ddplug_plugin_request *r, void *buf, uint64_t bytes, int peer, int send) {
  ddplug_plugin_group *g = r->group;
  int n = chunks(bytes), rc = MPI_SUCCESS;
  int first = send ? 1 : 0; /* a send's mreq[0] is its header */
  if (ddmpi_request_reqs(r, n + first) != 0) return MPI_ERR_NO_MEM;
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++) {
    uint64_t off = (uint64_t)i * DDMPI_P2P_CHUNK;
    int c = (int)(bytes - off < DDMPI_P2P_CHUNK ? bytes - off : DDMPI_P2P_CHUNK);
    if (send)
      rc = MPI_Isend((char *)buf + off, c, MPI_BYTE, peer, (int)r->p.tag, g->p2p_data_comm,
                     &r->mreq[first + i]);
    else
      rc = MPI_Irecv((char *)buf + off, c, MPI_BYTE, peer, (int)r->p.tag, g->p2p_data_comm,
                     &r->mreq[i]);
  }
  return rc;
}

/* See internal.h. */
int ddmpi_p2p_start(ddplug_plugin_group *g, const ddplug_p2p_args *args,
                    ddplug_plugin_request **out) {
  if (args->tag > ddmpi_p.tag_ub)
    return ddmpi_fail(g->svc, DDPLUG_E_INVALID_ARGUMENT,
                      "plugin mpi: tag %lld is beyond this MPI's largest tag (MPI_TAG_UB = %d)",
                      (long long)args->tag, ddmpi_p.tag_ub);
  size_t es = ddmpi_dtype_size(args->dtype);
  ddplug_plugin_request *r =
      ddmpi_request_new(g, args->kind == DDPLUG_P2P_SEND ? DDMPI_REQ_SEND : DDMPI_REQ_RECV);
  if (!r) return ddmpi_fail(g->svc, DDPLUG_E_NO_MEMORY, "plugin mpi: p2p_start: out of memory");
  memcpy(&r->p, args, args->struct_size < sizeof r->p ? args->struct_size : sizeof r->p);
  int any = args->kind == DDPLUG_P2P_RECV && args->peer == DDPLUG_ANY_SOURCE;
  if (args->kind == DDPLUG_P2P_SEND)
    ddmpi_fmt(r->what, sizeof r->what, "send to rank %d (tag %lld, %llu x %s)", args->peer,
              (long long)args->tag, (unsigned long long)args->count, ddmpi_dtype_name(args->dtype));
  else if (any)
    ddmpi_fmt(r->what, sizeof r->what, "receive from any rank (tag %lld, %llu x %s)",
              (long long)args->tag, (unsigned long long)args->count, ddmpi_dtype_name(args->dtype));
  else
    ddmpi_fmt(r->what, sizeof r->what, "receive from rank %d (tag %lld, %llu x %s)", args->peer,
              (long long)args->tag, (unsigned long long)args->count, ddmpi_dtype_name(args->dtype));
  pthread_mutex_lock(&ddmpi_p.mu);
  if (g->failed) {
    pthread_mutex_unlock(&ddmpi_p.mu);
    ddmpi_request_release(r);
    return ddmpi_group_failed(g);
  }
  int rc;
  if (args->kind == DDPLUG_P2P_SEND) {
    r->hdr.count = (int64_t)args->count;
    r->hdr.dtype = args->dtype;
    r->hdr.esize = (int32_t)es;
    r->stage = DDMPI_ST_DATA;
    rc = post_payload(r, args->buf, args->count * es, args->peer, 1);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(&r->hdr, (int)sizeof r->hdr, MPI_BYTE, args->peer, (int)args->tag,
                     g->p2p_comm, &r->mreq[0]);
  } else {
    r->stage = DDMPI_ST_HEADER;
    rc = MPI_Irecv(&r->hdr, (int)sizeof r->hdr, MPI_BYTE, any ? MPI_ANY_SOURCE : args->peer,
                   (int)args->tag, g->p2p_comm, &r->check);
  }
  if (rc != MPI_SUCCESS) {
    char e[400];
    ddmpi_mpi_error(rc, e, sizeof e);
    int st = rc == MPI_ERR_NO_MEM ? DDPLUG_E_NO_MEMORY : ddmpi_status_of(rc);
    ddmpi_group_fail_locked(g, st, "plugin mpi: %s: posting it to MPI failed: %s", r->what, e);
    g->abandoned = 1;
    r->stage = DDMPI_ST_FAILED;
    ddmpi_live_add(g, r); /* MPI may still write its buffers: keep it until destroy */
    pthread_mutex_unlock(&ddmpi_p.mu);
    return ddmpi_group_failed(g);
  }
  ddmpi_enqueue_locked(g, r, &g->p2p_head, &g->p2p_tail);
  pthread_mutex_unlock(&ddmpi_p.mu);
  ddmpi_progress_kick();
  *out = r;
  return DDPLUG_OK;
}

static void unlink_p2p(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  if (r->prev) r->prev->next = r->next;
  else g->p2p_head = r->next;
  if (r->next) r->next->prev = r->prev;
  else g->p2p_tail = r->prev;
  r->next = r->prev = NULL;
}

/* Whether an earlier receive could still take a header of r's sender and
 * tag (then r's payload must wait: it would take that one's payload). */
static int blocked(ddplug_plugin_group *g, ddplug_plugin_request *r) {
  for (ddplug_plugin_request *q = g->p2p_head; q && q != r; q = q->next)
    if (q->kind == DDMPI_REQ_RECV && q->stage == DDMPI_ST_HEADER && !q->hdr_done &&
        q->p.tag == r->p.tag && (q->p.peer == DDPLUG_ANY_SOURCE || q->p.peer == r->source))
      return 1;
  return 0;
}

static int take_header(ddplug_plugin_request *r) {
  size_t es = ddmpi_dtype_size(r->p.dtype);
  uint64_t bytes;
  void *dst = r->p.buf;
  if (r->hdr.count != (int64_t)r->p.count || r->hdr.dtype != r->p.dtype) {
    r->p2p_mismatch = 1;
    bytes = (uint64_t)(r->hdr.count > 0 ? r->hdr.count : 0) * (uint64_t)(r->hdr.esize > 0 ? r->hdr.esize : 1);
    r->scratch = malloc(bytes ? bytes : 1);
    if (!r->scratch) return MPI_ERR_NO_MEM;
    dst = r->scratch;
  } else {
    bytes = r->p.count * es;
  }
  r->stage = DDMPI_ST_DATA;
  return post_payload(r, dst, bytes, r->source, 0);
}

/* See internal.h. */
void ddmpi_p2p_poll_locked(ddplug_plugin_group *g, int *moved) {
  for (ddplug_plugin_request *r = g->p2p_head, *next; r && !g->failed; r = next) {
    next = r->next;
    int code = MPI_SUCCESS;
    if (r->stage == DDMPI_ST_HEADER) {
      if (!r->hdr_done) {
        int flag = 0;
        MPI_Status s;
        s.MPI_ERROR = MPI_SUCCESS;
        int rc = MPI_Test(&r->check, &flag, &s);
        if (rc != MPI_SUCCESS) {
          char why[DDMPI_MSG_MAX];
          ddmpi_peer_failure_text(g, g->p2p_comm, rc, why, sizeof why);
          ddmpi_group_fail_locked(g, ddmpi_status_of(rc), "plugin mpi: %s failed: %s", r->what, why);
          return;
        }
        if (!flag) continue;
        r->hdr_done = 1;
        r->source = s.MPI_SOURCE;
        *moved = 1;
      }
      if (blocked(g, r)) continue;
      int rc = take_header(r);
      if (rc != MPI_SUCCESS) {
        char e[400];
        ddmpi_mpi_error(rc, e, sizeof e);
        ddmpi_group_fail_locked(g, rc == MPI_ERR_NO_MEM ? DDPLUG_E_NO_MEMORY : ddmpi_status_of(rc),
                                "plugin mpi: %s: posting its payload failed: %s", r->what, e);
        return;
      }
    }
    if (r->stage != DDMPI_ST_DATA) continue;
    int t = ddmpi_test_all(r->mreq, r->nreq, &code);
    if (t < 0) {
      char why[DDMPI_MSG_MAX];
      ddmpi_peer_failure_text(g, g->p2p_data_comm, code, why, sizeof why);
      ddmpi_group_fail_locked(g, ddmpi_status_of(code), "plugin mpi: %s failed: %s", r->what, why);
      return;
    }
    if (!t) continue;
    *moved = 1;
    unlink_p2p(g, r);
    if (r->p2p_mismatch) {
      r->stage = DDMPI_ST_FAILED;
      r->status = DDPLUG_E_MISMATCH;
      ddmpi_fmt(r->msg, sizeof r->msg,
                "%s: rank %d sent %lld x %s with tag %lld, rank %d expected %llu x %s; nothing "
                "was delivered",
                r->what, r->source, (long long)r->hdr.count, ddmpi_dtype_name(r->hdr.dtype),
                (long long)r->p.tag, g->rank, (unsigned long long)r->p.count,
                ddmpi_dtype_name(r->p.dtype));
      free(r->scratch);
      r->scratch = NULL;
    } else {
      if (r->kind == DDMPI_REQ_RECV && r->p.source) *r->p.source = r->source;
      r->stage = DDMPI_ST_DONE;
      r->status = DDPLUG_OK;
    }
    if (r->freed) ddmpi_request_release(r);
  }
}
