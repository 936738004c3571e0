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
  int enqueue_inprogress;/* the next N collectives answer ncclInProgress    */
  ncclResult_t init_result; /* != ncclSuccess: ncclCommInitRankConfig fails */
} fake_cfg;

/* Set before the ranks start; read under the fake's lock. */
extern fake_cfg fake;

/* Restore the defaults (2 devices, NCCL 2.30.7, nothing injected). */
void fake_reset(void);
/* From now on, ncclCommGetAsyncError on rank's communicator(s) reports err
 * (an asynchronous NCCL failure such as ncclRemoteError). */
void fake_inject_async_error(int rank, ncclResult_t err);
/* Communicators currently alive (created, neither destroyed nor aborted). */
int fake_live_comms(void);
/* Collectives completed so far (all ranks arrived). */
int fake_completed_collectives(void);

#endif
