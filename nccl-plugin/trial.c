/* Trial mode of the ccltune tuner plugin; see trial.h. */
#include "trial.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_tuner_abi.h"

static int fail(ccltTrials* t, const char* what, const char* near) {
  snprintf(t->error, sizeof t->error, "CCLTUNE_TRIALS: %s near '%.40s'", what, near);
  return -1;
}

static int number(const char** s, uint64_t* out) {
  char* end;
  if (**s < '0' || **s > '9') return -1;
  *out = strtoull(*s, &end, 10);
  *s = end;
  return 0;
}

static int entry(ccltTrials* t, const char* text, size_t len) {
  char buf[64], *algo = buf, *proto, *chan, *end;
  if (len == 0 || len >= sizeof buf) return fail(t, "bad entry", text);
  memcpy(buf, text, len);
  buf[len] = '\0';
  if (!(proto = strchr(algo, '/')) || !(chan = strchr(proto + 1, '/'))) return fail(t, "entry is not algo/proto/channels", text);
  *proto++ = '\0';
  *chan++ = '\0';
  int a = ccltAlgoId(algo), p = ccltProtoId(proto);
  long c = strtol(chan, &end, 10);
  if (a < 0) return fail(t, "unknown algorithm", text);
  if (p < 0) return fail(t, "unknown protocol", text);
  if (*end || c < 1 || c > NCCL_MAXCHANNELS) return fail(t, "channels not in 1..64", text);
  if (t->n == CCLT_MAX_TRIALS) return fail(t, "more than 256 entries", text);
  ccltChoice* e = &t->entries[t->n++];
  memset(e, 0, sizeof *e);
  e->algo = (int8_t)a;
  e->proto = (int8_t)p;
  e->channels = (int16_t)c;
  e->row = t->n;
  return 0;
}

int ccltTrialsParse(ccltTrials* t, const char* text) {
  memset(t, 0, sizeof *t);
  const char* s = text;
  if (strncmp(s, "warmup=", 7) != 0) return fail(t, "expected warmup=", s);
  s += 7;
  if (number(&s, &t->warmup) || strncmp(s, ";period=", 8) != 0) return fail(t, "expected warmup=N;period=", text);
  s += 8;
  if (number(&s, &t->period) || t->period == 0 || *s != ';') return fail(t, "period must be a positive integer", text);
  s++;
  while (*s) {
    const char* comma = strchr(s, ',');
    size_t len = comma ? (size_t)(comma - s) : strlen(s);
    if (entry(t, s, len)) return -1;
    s += len + (comma ? 1 : 0);
  }
  if (t->n == 0) return fail(t, "no entries", text);
  return 0;
}

const ccltChoice* ccltTrialsNext(ccltTrials* t, int* index) {
  uint64_t i = t->calls++;
  uint64_t k = i < t->warmup ? 0 : (i - t->warmup) / t->period;
  if (k >= (uint64_t)t->n) {
    *index = -1;
    return NULL;  /* past the table: NCCL chooses */
  }
  *index = (int)k;
  return &t->entries[k];
}
