/* ccltune's tuner table: parse, validate, index one communicator's rows, look a call up.
 * Format and rules: docs/tuner-plugin.md (the Python writer and reference: ccltune/tune/table.py). */
#ifndef CCLTUNE_TABLE_H
#define CCLTUNE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define CCLT_TABLE_VERSION 1
#define CCLT_ERROR_LEN 320

typedef struct {
  int8_t algo;
  int8_t proto;
  int16_t channels;  /* as written; the caller clamps */
  uint64_t chunk;    /* 0: the row gives none */
  int row;           /* 1-based position among the file's rows ("tuner row N") */
} ccltChoice;

/* Rows with the same byte range are alternatives, tried in file order. */
typedef struct {
  uint64_t lo, hi;
  int first, count;  /* into ccltTable.choices */
} ccltRange;

typedef struct {
  ccltRange* ranges[5];  /* per ncclFunc_t, sorted by lo, disjoint */
  int nRanges[5];
  ccltChoice* choices;
  int nChoices;
  int rowsTotal;   /* rows in the file, every shape */
  int nvlsChannels;
  uint64_t digest;
  char error[CCLT_ERROR_LEN];
} ccltTable;

/* 0: loaded (rows of shape nRanks x nNodes kept); -1: t->error says why, nothing kept. */
int ccltTableLoad(ccltTable* t, const char* path, size_t nRanks, size_t nNodes);
void ccltTableFree(ccltTable* t);

/* The first alternative of the range holding nBytes whose cost-table cell NCCL offers (>= 0),
 * or NULL. cost is NCCL's [numAlgo][numProto] table. */
const ccltChoice* ccltTableLookup(const ccltTable* t, int coll, uint64_t nBytes, const float* cost, int numAlgo,
                                  int numProto);

/* The first alternative of that range with this algorithm and protocol, or NULL. */
const ccltChoice* ccltTableFind(const ccltTable* t, int coll, uint64_t nBytes, int algo, int proto);

/* Channels NCCL can run for the algorithm (MAXCHANNELS; NVLS: the table's nvls-channels). */
int ccltClampChannels(const ccltTable* t, int algo, int channels);

/* NCCL_ALGO_* / NCCL_PROTO_* id of a table name ("ring", "ll128", ...), or -1. */
int ccltAlgoId(const char* name);
int ccltProtoId(const char* name);

uint64_t ccltFnv1a64(uint64_t h, const char* s, size_t n);
#define CCLT_FNV_OFFSET 0xcbf29ce484222325ULL

#endif
