/* Times getCollInfo of a tuner plugin the way NCCL calls it (ncclTunerPlugin_v6, a fresh
 * [algo][proto] cost table per call). Usage: driver PLUGIN.so NRANKS NNODES CALLS < sizes
 * Prints: "<ns per call> <ns per loop without the call> <calls that matched> <init us>". */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_tuner_abi.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc != 5) { fprintf(stderr, "usage: %s PLUGIN NRANKS NNODES CALLS < sizes\n", argv[0]); return 2; }
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  ncclTuner_v6_t* t = (ncclTuner_v6_t*)dlsym(h, "ncclTunerPlugin_v6");
  if (!t) { fprintf(stderr, "no ncclTunerPlugin_v6\n"); return 2; }
  long calls = atol(argv[4]);
  size_t cap = 1 << 16, n = 0;
  size_t* sizes = malloc(cap * sizeof *sizes);
  unsigned long long v;
  while (n < cap && scanf("%llu", &v) == 1) sizes[n++] = (size_t)v;
  if (n == 0) { fprintf(stderr, "no sizes on stdin\n"); return 2; }
  void* ctx = NULL;
  double i0 = now();
  if (t->init(&ctx, 1, (size_t)atol(argv[2]), (size_t)atol(argv[3]), NULL, NULL, NULL) != ncclSuccess) return 1;
  double initNs = now() - i0;
  float fresh[CCLTUNE_NUM_ALGOS][CCLTUNE_NUM_PROTOS], table[CCLTUNE_NUM_ALGOS][CCLTUNE_NUM_PROTOS];
  for (int a = 0; a < CCLTUNE_NUM_ALGOS; a++)
    for (int p = 0; p < CCLTUNE_NUM_PROTOS; p++) fresh[a][p] = 100.0f + a + p;
  volatile long matched = 0, sink = 0;
  double t0 = now();
  for (long i = 0; i < calls; i++) {  /* the loop without the plugin: table copy and size fetch */
    memcpy(table, fresh, sizeof table);
    sink += (long)sizes[i % n] + (long)table[1][2];
  }
  double t1 = now();
  for (long i = 0; i < calls; i++) {
    memcpy(table, fresh, sizeof table);
    int nc = 0;
    t->getCollInfo(ctx, ncclFuncAllReduce, sizes[i % n], 1, (float**)table, CCLTUNE_NUM_ALGOS, CCLTUNE_NUM_PROTOS,
                   0, &nc);
    matched += nc != 0;
  }
  double t2 = now();
  t->finalize(ctx);
  printf("%.2f %.2f %ld %.1f\n", (t2 - t1) / calls, (t1 - t0) / calls, (long)matched, initNs / 1e3);
  free(sizes);
  return 0;
}
