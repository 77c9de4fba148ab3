/* NCCL's tuner-plugin ABI, restated from NCCL's documented interface (no NCCL headers needed).
 *
 * Sources (NVIDIA/nccl v2.30.7-1, commit 73cf1122):
 *   src/include/nccl_common.h           ncclDebugLogLevel, ncclDebugLogSubSys, ncclDebugLogger_t, ncclFunc_t
 *   src/include/plugin/nccl_tuner.h     NCCL_ALGO_* / NCCL_PROTO_* ids, NCCL_ALGO_PROTO_IGNORE
 *   src/include/plugin/tuner/tuner_v3.h ncclTuner_v3_t (the version msccl-executor-nccl's NCCL 2.23.4 loads)
 *   src/include/plugin/tuner/tuner_v5.h ncclTuner_v5_t, ncclTunerConstants_v5_t, ncclNvlDomainInfo_v5_t
 *   src/include/plugin/tuner/tuner_v6.h ncclTuner_v6_t (NCCL >= 2.29; adds getChunkSize)
 *   src/nccl.h.in                       ncclResult_t (ncclSuccess = 0)
 *   src/include/device.h                MAXCHANNELS 64
 * The struct layouts must match those headers field for field: NCCL reads them through dlsym.
 */
#ifndef CCLTUNE_NCCL_TUNER_ABI_H
#define CCLTUNE_NCCL_TUNER_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ncclSuccess = 0, ncclInternalError = 3 } ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

enum { NCCL_INIT = 0x1, NCCL_TUNING = 0x40 };

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

/* Only the values a tuner is asked about (Send/Recv and later ids never reach getCollInfo). */
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4
} ncclFunc_t;
#define CCLTUNE_NUM_FUNCS 5

#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define CCLTUNE_NUM_ALGOS 7

#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define CCLTUNE_NUM_PROTOS 3

#define NCCL_ALGO_PROTO_IGNORE -1.0f
#define NCCL_MAXCHANNELS 64

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*getChunkSize)(void* ctx, ncclFunc_t collType, size_t nBytes, int algo, int proto, int nChannels,
                               size_t* chunkSize);
} ncclTuner_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
} ncclTuner_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v3_t;

#endif
