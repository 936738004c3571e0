/* fake_cuda_nccl.h — controls of the in-process CUDA runtime + NCCL fake
 * (fake_cuda_nccl.c) that test-nccl-fake links instead of the real ones.
 * See the .c file for what it models. */
#ifndef DDPLUG_FAKE_CUDA_NCCL_H
#define DDPLUG_FAKE_CUDA_NCCL_H

#include <nccl.h>

typedef struct fake_cfg {
  int devices;           /* what cudaGetDeviceCount reports (0: none)       */
  int nccl_version;      /* what ncclGetVersion reports (default 23007)     */
  int init_polls;        /* ncclCommGetAsyncError answers ncclInProgress this
                            many more times after every rank joined         */
  int launch_polls;      /* every collective on a non-blocking communicator
                            answers ncclInProgress and stays so for this
                            many polls (NCCL launches it from a thread);
                            default 1                                       */
  int lazy_connect;      /* 1 (default): a communicator's first collective
                            stays ncclInProgress until every rank of the
                            clique has issued its first collective too
                            (NCCL_RUNTIME_CONNECT=1)                        */
  int connect_polls;     /* ... and then this many polls more               */
  int enqueue_inprogress;/* the next N collectives stay ncclInProgress for
                            enqueue_polls polls (instead of launch_polls)  */
  int enqueue_polls;     /* default 3                                       */
  ncclResult_t init_result; /* != ncclSuccess: ncclCommInitRankConfig fails */
} fake_cfg;

/* Set before the ranks start; read under the fake's lock. */
extern fake_cfg fake;

/* Restore the defaults (2 devices, NCCL 2.30.7, nothing injected). */
void fake_reset(void);
/* From now on, ncclCommGetAsyncError on rank's communicator(s) reports err
 * (an asynchronous NCCL failure such as ncclRemoteError). */
void fake_inject_async_error(int rank, ncclResult_t err);
/* rank's next collective stays ncclInProgress until its communicator is
 * aborted (NCCL waiting inside the call, e.g. setting up connections with a
 * peer that never comes). */
void fake_stall_next_collective(int rank);
/* Communicators currently alive (created, neither destroyed nor aborted). */
int fake_live_comms(void);
/* Collectives completed so far (all ranks arrived). */
int fake_completed_collectives(void);
/* Communicators whose lazy connection setup has completed. */
int fake_connected_comms(void);
/* NCCL calls refused because the communicator was still ncclInProgress from
 * the previous one (NCCL: "Attempt to use communicator before the previous
 * operation returned ncclSuccess"). Must stay 0. */
int fake_misuses(void);

#endif
