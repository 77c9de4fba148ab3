/* libccltune-tuner.so: NCCL tuner plugin reading ccltune's table (path in CCLTUNE_TUNER_TABLE).
 *
 * Exports ncclTunerPlugin_v6 (NCCL >= 2.29), _v5 (2.25-2.28) and _v3 (msccl-executor-nccl's 2.23.4).
 * Per call: the row covering (collective, nBytes) on this communicator's shape; its alternatives in
 * file order, skipping any whose algorithm/protocol NCCL marked unusable; the choice is marked by a
 * 0 cost (NCCL takes the cheapest cell, enqueue.cc topoGetAlgoInfo) and channels are set clamped.
 * No row, or no usable alternative: nothing is touched, so NCCL's own choice stands (*nChannels 0).
 * A missing or malformed table disables the plugin for the communicator; init never fails.
 * CCLTUNE_TRIALS set: trial mode for benchmark launches instead (trial.h, docs/live-tuning.md).
 */
#include <stdlib.h>
#include <string.h>

#include "nccl_tuner_abi.h"
#include "table.h"
#include "trial.h"

#define TABLE_ENV "CCLTUNE_TUNER_TABLE"
#define TRIALS_ENV "CCLTUNE_TRIALS"
#define PLUGIN_NAME "ccltune"

typedef struct {
  int enabled;
  ccltTable table;
  int trialMode;  /* CCLTUNE_TRIALS set: benchmark launches switch configuration per call */
  ccltTrials trials;
  int warnedIndex;  /* the last unusable (entry, size) logged, so a size's calls log it once */
  size_t warnedBytes;
  ncclDebugLogger_t log;
} context;

static ncclResult_t initCommon(void** ctxOut, size_t nRanks, size_t nNodes, ncclDebugLogger_t log) {
  context* ctx = calloc(1, sizeof *ctx);
  *ctxOut = ctx;
  if (!ctx) return ncclSuccess;  /* a NULL context changes nothing, like a disabled one */
  ctx->log = log;
  const char* trials = getenv(TRIALS_ENV);
  if (trials && *trials) {
    if (ccltTrialsParse(&ctx->trials, trials) != 0) {
      if (log)
        log(NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __FILE__, __LINE__, "ccltune tuner: disabled, %s",
            ctx->trials.error);
      return ncclSuccess;
    }
    ctx->trialMode = 1;
    ctx->warnedIndex = -1;
    if (log)
      log(NCCL_LOG_INFO, NCCL_INIT | NCCL_TUNING, __FILE__, __LINE__,
          "ccltune tuner: trial mode, %d entries, warmup %llu, period %llu calls", ctx->trials.n,
          (unsigned long long)ctx->trials.warmup, (unsigned long long)ctx->trials.period);
    return ncclSuccess;
  }
  const char* path = getenv(TABLE_ENV);
  if (!path || !*path) {
    if (log)
      log(NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __FILE__, __LINE__,
          "ccltune tuner: disabled, " TABLE_ENV " is not set; NCCL chooses every call");
    return ncclSuccess;
  }
  if (ccltTableLoad(&ctx->table, path, nRanks, nNodes) != 0) {
    if (log)
      log(NCCL_LOG_WARN, NCCL_INIT | NCCL_TUNING, __FILE__, __LINE__,
          "ccltune tuner: disabled, bad table %s; NCCL chooses every call", ctx->table.error);
    return ncclSuccess;
  }
  ctx->enabled = 1;
  if (log)
    log(NCCL_LOG_INFO, NCCL_INIT | NCCL_TUNING, __FILE__, __LINE__,
        "ccltune tuner: table %s digest fnv1a64 %016llx, %d rows, %d for this communicator (nRanks %zu, nNodes %zu)",
        path, (unsigned long long)ctx->table.digest, ctx->table.rowsTotal, ctx->table.nChoices, nRanks, nNodes);
  return ncclSuccess;
}

/* The call's trial entry, when NCCL offers its cell; otherwise NCCL chooses and a WARN line names
 * the entry and size (once per run of such calls) so the benchmark's parser records that point
 * missing. */
static ncclResult_t trialInfo(context* ctx, size_t nBytes, float* cost, int numAlgo, int numProto, int* nChannels) {
  int index;
  const ccltChoice* c = ccltTrialsNext(&ctx->trials, &index);
  if (!c) return ncclSuccess;
  if (c->algo >= numAlgo || c->proto >= numProto || cost[c->algo * numProto + c->proto] < 0.0f) {
    if (ctx->log && (index != ctx->warnedIndex || nBytes != ctx->warnedBytes))
      ctx->log(NCCL_LOG_WARN, NCCL_TUNING, __FILE__, __LINE__, "ccltune trial %d unusable at %zu bytes", index,
               nBytes);
    ctx->warnedIndex = index;
    ctx->warnedBytes = nBytes;
    return ncclSuccess;
  }
  cost[c->algo * numProto + c->proto] = 0.0f;
  if (nChannels) *nChannels = c->channels;
  return ncclSuccess;
}

static ncclResult_t collInfo(void* vctx, ncclFunc_t coll, size_t nBytes, float** costTable, int numAlgo,
                             int numProto, int* nChannels) {
  context* ctx = vctx;
  if (ctx && ctx->trialMode && costTable && numAlgo > 0 && numProto > 0)
    return trialInfo(ctx, nBytes, (float*)costTable, numAlgo, numProto, nChannels);
  if (!ctx || !ctx->enabled || !costTable || numAlgo <= 0 || numProto <= 0) return ncclSuccess;
  /* NCCL passes its float[numAlgo][numProto] array cast to float** (enqueue.cc ncclGetAlgoInfo). */
  float* cost = (float*)costTable;
  const ccltChoice* c = ccltTableLookup(&ctx->table, (int)coll, (uint64_t)nBytes, cost, numAlgo, numProto);
  if (!c) return ncclSuccess;
  cost[c->algo * numProto + c->proto] = 0.0f;
  if (nChannels) *nChannels = ccltClampChannels(&ctx->table, c->algo, c->channels);
  return ncclSuccess;
}

static ncclResult_t finalizeCommon(void* vctx) {
  context* ctx = vctx;
  if (!ctx) return ncclSuccess;
  ccltTableFree(&ctx->table);
  free(ctx);
  return ncclSuccess;
}

static ncclResult_t initV5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                           ncclNvlDomainInfo_v5_t* nvl, ncclTunerConstants_v5_t* constants) {
  (void)commId; (void)nvl; (void)constants;  /* NCCL's model constants are left as they are */
  return initCommon(ctx, nRanks, nNodes, log);
}

static ncclResult_t collInfoV5(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** costTable,
                               int numAlgo, int numProto, int regBuff, int* nChannels) {
  (void)numPipeOps; (void)regBuff;  /* rows are not keyed by them */
  return collInfo(ctx, coll, nBytes, costTable, numAlgo, numProto, nChannels);
}

/* Only where the row NCCL's selection came from gives a chunk size. */
static ncclResult_t chunkSizeV6(void* vctx, ncclFunc_t coll, size_t nBytes, int algo, int proto, int nChannels,
                                size_t* chunkSize) {
  (void)nChannels;
  context* ctx = vctx;
  if (!ctx || !ctx->enabled || !chunkSize) return ncclSuccess;
  const ccltChoice* c = ccltTableFind(&ctx->table, (int)coll, (uint64_t)nBytes, algo, proto);
  if (c && c->chunk) *chunkSize = (size_t)c->chunk;
  return ncclSuccess;
}

static ncclResult_t initV3(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void** ctx) {
  return initCommon(ctx, nRanks, nNodes, log);
}

static ncclResult_t collInfoV3(void* ctx, ncclFunc_t coll, size_t nBytes, int numPipeOps, float** costTable,
                               int numAlgo, int numProto, int* nChannels) {
  (void)numPipeOps;
  return collInfo(ctx, coll, nBytes, costTable, numAlgo, numProto, nChannels);
}

__attribute__((visibility("default"))) ncclTuner_v6_t ncclTunerPlugin_v6 = {
    PLUGIN_NAME, initV5, collInfoV5, finalizeCommon, chunkSizeV6};
__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {
    PLUGIN_NAME, initV5, collInfoV5, finalizeCommon};
__attribute__((visibility("default"))) ncclTuner_v3_t ncclTunerPlugin_v3 = {
    PLUGIN_NAME, initV3, collInfoV3, finalizeCommon};
