/* Trial mode: one benchmark launch measures many configurations (docs/live-tuning.md).
 * CCLTUNE_TRIALS="warmup=W;period=P;algo/proto/channels,algo/proto/channels,..." (names as in the
 * tuner table). Call i of a communicator uses entry (i - W) / P (entry 0 before W); nccl-tests' call
 * sequence is the same on every rank, so every rank picks the same entry for the same call. */
#ifndef CCLTUNE_TRIAL_H
#define CCLTUNE_TRIAL_H

#include <stdint.h>

#include "table.h"

#define CCLT_MAX_TRIALS 256

typedef struct {
  uint64_t warmup, period, calls;
  int n;
  ccltChoice entries[CCLT_MAX_TRIALS];
  char error[CCLT_ERROR_LEN];
} ccltTrials;

/* 0: parsed; -1: t->error says why. */
int ccltTrialsParse(ccltTrials* t, const char* text);

/* The entry for this call (counts it), and its index in *index. */
const ccltChoice* ccltTrialsNext(ccltTrials* t, int* index);

#endif
