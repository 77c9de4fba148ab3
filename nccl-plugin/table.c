/* ccltune tuner table: parse and validate the whole file, keep one communicator's rows indexed by
 * (collective, byte range) so a call costs one binary search. */
#define _POSIX_C_SOURCE 200809L
#include "table.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_tuner_abi.h"

#define MAX_FIELDS 10
#define MAX_LINE 4096
#define CCLT_VERSION_TEXT "1" /* CCLT_TABLE_VERSION as text */

static const char* const kColls[CCLTUNE_NUM_FUNCS] = {"broadcast", "reduce", "allgather", "reducescatter",
                                                       "allreduce"};
/* Indexed by NCCL_ALGO_* / NCCL_PROTO_* ids (nccl_tuner.h). */
static const char* const kAlgos[CCLTUNE_NUM_ALGOS] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                                      "nvls", "nvls_tree", "pat"};
static const char* const kProtos[CCLTUNE_NUM_PROTOS] = {"ll", "ll128", "simple"};

/* The most NVLS channels NCCL builds on any GPU (NVLS_NCHANNELS_SM100, src/transport/nvls.cc). */
#define NVLS_CHANNELS_ANY_ARCH 32

typedef struct {
  int coll;
  uint64_t nRanks, nNodes, lo, hi;
  ccltChoice choice;
} rowRec;

uint64_t ccltFnv1a64(uint64_t h, const char* s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

static int fail(ccltTable* t, const char* path, int line, const char* fmt, ...) {
  int n = line > 0 ? snprintf(t->error, CCLT_ERROR_LEN, "%s line %d: ", path, line)
                   : snprintf(t->error, CCLT_ERROR_LEN, "%s: ", path);
  if (n < 0 || n >= CCLT_ERROR_LEN) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->error + n, (size_t)(CCLT_ERROR_LEN - n), fmt, ap);
  va_end(ap);
  return -1;
}

static int lookupName(const char* s, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

int ccltAlgoId(const char* name) { return lookupName(name, kAlgos, CCLTUNE_NUM_ALGOS); }
int ccltProtoId(const char* name) { return lookupName(name, kProtos, CCLTUNE_NUM_PROTOS); }

/* Decimal digits only (no sign, no blanks), within uint64_t. */
static int parseU64(const char* s, uint64_t* out) {
  if (*s == '\0') return -1;
  for (const char* p = s; *p; p++)
    if (*p < '0' || *p > '9') return -1;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno == ERANGE) return -1;
  *out = (uint64_t)v;
  return 0;
}

static int parseHex64(const char* s, uint64_t* out) {
  if (strlen(s) != 16) return -1;
  uint64_t v = 0;
  for (const char* p = s; *p; p++) {
    int d = (*p >= '0' && *p <= '9') ? *p - '0' : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = (v << 4) | (uint64_t)d;
  }
  *out = v;
  return 0;
}

static int split(char* line, char** fields) {
  int n = 0;
  char* save = NULL;  /* strtok_r: communicators may be initialized from several threads */
  for (char* tok = strtok_r(line, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
    if (n == MAX_FIELDS) return MAX_FIELDS + 1;
    fields[n++] = tok;
  }
  return n;
}

static int parseRow(ccltTable* t, const char* path, int lineNo, char** f, int row, rowRec* r) {
  uint64_t ch;
  int algo, proto;
  if ((r->coll = lookupName(f[0], kColls, CCLTUNE_NUM_FUNCS)) < 0)
    return fail(t, path, lineNo, "unknown collective '%s'", f[0]);
  if (parseU64(f[1], &r->lo) || parseU64(f[2], &r->hi) || r->lo > r->hi)
    return fail(t, path, lineNo, "byte range '%s %s' is not two integers min <= max", f[1], f[2]);
  if (parseU64(f[3], &r->nRanks) || parseU64(f[4], &r->nNodes) || r->nNodes < 1 || r->nRanks < r->nNodes)
    return fail(t, path, lineNo, "shape '%s %s' is not nRanks >= nNodes >= 1", f[3], f[4]);
  if ((algo = lookupName(f[5], kAlgos, CCLTUNE_NUM_ALGOS)) < 0)
    return fail(t, path, lineNo, "unknown algorithm '%s'", f[5]);
  if ((proto = lookupName(f[6], kProtos, CCLTUNE_NUM_PROTOS)) < 0)
    return fail(t, path, lineNo, "unknown protocol '%s'", f[6]);
  if (parseU64(f[7], &ch) || ch < 1 || ch > NCCL_MAXCHANNELS)
    return fail(t, path, lineNo, "channels '%s' is not 1..%d", f[7], NCCL_MAXCHANNELS);
  r->choice.chunk = 0;
  if (strcmp(f[8], "-") != 0 && (parseU64(f[8], &r->choice.chunk) || r->choice.chunk == 0))
    return fail(t, path, lineNo, "chunk size '%s' is not '-' or a positive integer", f[8]);
  r->choice.algo = (int8_t)algo;
  r->choice.proto = (int8_t)proto;
  r->choice.channels = (int16_t)ch;
  r->choice.row = row;
  return 0;
}

static int rowOrder(const void* a, const void* b) {
  const rowRec* x = a;
  const rowRec* y = b;
#define CMP(f) if (x->f != y->f) return x->f < y->f ? -1 : 1
  CMP(coll);
  CMP(nRanks);
  CMP(nNodes);
  CMP(lo);
  CMP(choice.row);
#undef CMP
  return 0;
}

/* Reads every row; checks version, digest and row count. */
static int readRows(ccltTable* t, const char* path, FILE* fp, rowRec** rowsOut, int* nOut) {
  char* line = NULL;
  size_t cap = 0;
  ssize_t len;
  int lineNo = 0, n = 0, rc = -1, declared = -1;
  uint64_t digest = CCLT_FNV_OFFSET, wanted = 0;
  rowRec* rows = NULL;
  int rowsCap = 0;
  char* f[MAX_FIELDS];
  while ((len = getline(&line, &cap, fp)) >= 0) {
    lineNo++;
    if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
    if (len > MAX_LINE) { fail(t, path, lineNo, "line longer than %d bytes", MAX_LINE); goto out; }
    if (memchr(line, '\r', (size_t)len) || (size_t)len != strlen(line)) {
      fail(t, path, lineNo, "carriage return or NUL byte in the line");
      goto out;
    }
    if (lineNo == 1) {
      static const char magic[] = "ccltune-tuner-table ";
      if (strncmp(line, magic, sizeof magic - 1) != 0) {
        fail(t, path, lineNo, "not a ccltune tuner table (first line must be '%s%d')", magic, CCLT_TABLE_VERSION);
        goto out;
      }
      if (strcmp(line + sizeof magic - 1, CCLT_VERSION_TEXT) != 0) {
        fail(t, path, lineNo, "table version '%.32s', this plugin reads version %d", line + sizeof magic - 1,
             CCLT_TABLE_VERSION);
        goto out;
      }
      continue;
    }
    if (lineNo == 2) {
      uint64_t count;
      if (split(line, f) != 5 || strcmp(f[0], "digest") || strcmp(f[1], "fnv1a64") || parseHex64(f[2], &wanted) ||
          strcmp(f[3], "rows") || parseU64(f[4], &count) || count > 100000000ULL) {
        fail(t, path, lineNo, "expected 'digest fnv1a64 <16 hex digits> rows <count>'");
        goto out;
      }
      declared = (int)count;
      continue;
    }
    if (len == 0 || line[0] == '#') continue;
    digest = ccltFnv1a64(digest, line, (size_t)len);
    digest = ccltFnv1a64(digest, "\n", 1);
    int nf = split(line, f);
    if (nf >= 1 && strcmp(f[0], "nvls-channels") == 0) {
      uint64_t v;
      if (nf != 2 || parseU64(f[1], &v) || v < 1 || v > NCCL_MAXCHANNELS) {
        fail(t, path, lineNo, "expected 'nvls-channels <1..%d>'", NCCL_MAXCHANNELS);
        goto out;
      }
      t->nvlsChannels = (int)v;
      continue;
    }
    if (nf != 9) {
      fail(t, path, lineNo,
           "expected 9 fields (collective min_bytes max_bytes nRanks nNodes algorithm protocol channels chunk), "
           "got %d", nf > MAX_FIELDS ? MAX_FIELDS + 1 : nf);
      goto out;
    }
    if (n == declared) { fail(t, path, lineNo, "more rows than the %d the digest line declares", declared); goto out; }
    if (n == rowsCap) {
      int grow = rowsCap ? rowsCap * 2 : 64;
      rowRec* more = realloc(rows, (size_t)grow * sizeof(rowRec));
      if (!more) { fail(t, path, lineNo, "out of memory"); goto out; }
      rows = more;
      rowsCap = grow;
    }
    if (parseRow(t, path, lineNo, f, n + 1, &rows[n])) goto out;
    n++;
  }
  if (ferror(fp)) { fail(t, path, 0, "read error"); goto out; }
  if (lineNo < 2) { fail(t, path, 0, "missing the header and digest lines"); goto out; }
  if (n != declared) { fail(t, path, 0, "%d rows, the digest line declares %d (truncated?)", n, declared); goto out; }
  if (digest != wanted) {
    fail(t, path, 0, "digest fnv1a64 %016llx, the file declares %016llx (edited or truncated)",
         (unsigned long long)digest, (unsigned long long)wanted);
    goto out;
  }
  t->digest = digest;
  *rowsOut = rows;
  *nOut = n;
  rows = NULL;
  rc = 0;
out:
  free(line);
  free(rows);
  return rc;
}

/* Same (collective, shape): equal ranges are alternatives; any other overlap is an error. */
static int checkOverlaps(ccltTable* t, const char* path, const rowRec* rows, int n) {
  for (int i = 1, start = 0; i < n; i++) {
    const rowRec* a = &rows[start];
    const rowRec* b = &rows[i];
    if (a->coll != b->coll || a->nRanks != b->nRanks || a->nNodes != b->nNodes) { start = i; continue; }
    if (a->lo == b->lo && a->hi == b->hi) continue;
    if (b->lo <= a->hi)
      return fail(t, path, 0, "rows %d and %d overlap (%s, %llu ranks, %llu nodes): ranges must be equal or disjoint",
                  a->choice.row, b->choice.row, kColls[a->coll], (unsigned long long)a->nRanks,
                  (unsigned long long)a->nNodes);
    start = i;
  }
  return 0;
}

int ccltTableLoad(ccltTable* t, const char* path, size_t nRanks, size_t nNodes) {
  memset(t, 0, sizeof *t);
  t->nvlsChannels = NVLS_CHANNELS_ANY_ARCH;
  FILE* fp = fopen(path, "r");
  if (!fp) return fail(t, path, 0, "cannot open: %s", strerror(errno));
  rowRec* rows = NULL;
  int n = 0;
  int rc = readRows(t, path, fp, &rows, &n);
  fclose(fp);
  if (rc) return -1;
  if (n > 1) qsort(rows, (size_t)n, sizeof *rows, rowOrder);
  if (checkOverlaps(t, path, rows, n)) { free(rows); return -1; }
  t->rowsTotal = n;
  int mine = 0;
  for (int i = 0; i < n; i++) mine += rows[i].nRanks == nRanks && rows[i].nNodes == nNodes;
  t->choices = calloc((size_t)(mine ? mine : 1), sizeof(ccltChoice));
  for (int c = 0; c < CCLTUNE_NUM_FUNCS; c++) t->ranges[c] = calloc((size_t)(mine ? mine : 1), sizeof(ccltRange));
  for (int c = 0; c < CCLTUNE_NUM_FUNCS; c++)
    if (!t->ranges[c] || !t->choices) { free(rows); ccltTableFree(t); return fail(t, path, 0, "out of memory"); }
  for (int i = 0; i < n; i++) {
    const rowRec* r = &rows[i];
    if (r->nRanks != nRanks || r->nNodes != nNodes) continue;
    ccltRange* ranges = t->ranges[r->coll];
    int* nr = &t->nRanges[r->coll];
    if (*nr == 0 || ranges[*nr - 1].lo != r->lo) ranges[(*nr)++] = (ccltRange){r->lo, r->hi, t->nChoices, 0};
    ranges[*nr - 1].count++;
    t->choices[t->nChoices++] = r->choice;
  }
  free(rows);
  return 0;
}

void ccltTableFree(ccltTable* t) {
  for (int c = 0; c < CCLTUNE_NUM_FUNCS; c++) {
    free(t->ranges[c]);
    t->ranges[c] = NULL;
    t->nRanges[c] = 0;
  }
  free(t->choices);
  t->choices = NULL;
  t->nChoices = 0;
}

static const ccltRange* findRange(const ccltTable* t, int coll, uint64_t nBytes) {
  if (coll < 0 || coll >= CCLTUNE_NUM_FUNCS) return NULL;
  const ccltRange* r = t->ranges[coll];
  int lo = 0, hi = t->nRanges[coll];  /* first range with r.lo > nBytes */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (r[mid].lo <= nBytes) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0 || r[lo - 1].hi < nBytes) return NULL;
  return &r[lo - 1];
}

const ccltChoice* ccltTableLookup(const ccltTable* t, int coll, uint64_t nBytes, const float* cost, int numAlgo,
                                  int numProto) {
  const ccltRange* r = findRange(t, coll, nBytes);
  if (!r) return NULL;
  for (int i = r->first; i < r->first + r->count; i++) {
    const ccltChoice* c = &t->choices[i];
    if (c->algo >= numAlgo || c->proto >= numProto) continue;
    float v = cost[c->algo * numProto + c->proto];
    if (v >= 0.0f) return c;  /* NCCL marks what it cannot run NCCL_ALGO_PROTO_IGNORE (-1) */
  }
  return NULL;
}

const ccltChoice* ccltTableFind(const ccltTable* t, int coll, uint64_t nBytes, int algo, int proto) {
  const ccltRange* r = findRange(t, coll, nBytes);
  if (!r) return NULL;
  for (int i = r->first; i < r->first + r->count; i++)
    if (t->choices[i].algo == algo && t->choices[i].proto == proto) return &t->choices[i];
  return NULL;
}

int ccltClampChannels(const ccltTable* t, int algo, int channels) {
  int most = (algo == NCCL_ALGO_NVLS || algo == NCCL_ALGO_NVLS_TREE) ? t->nvlsChannels : NCCL_MAXCHANNELS;
  return channels > most ? most : channels;
}
