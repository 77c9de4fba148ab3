/* Test helper: an NCCL-style variadic logger that keeps every formatted line (ctypes callbacks
 * cannot be variadic). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static char lines[64][512];
static int levels[64];
static int count;

void shimLog(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (count == 64) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(lines[count], sizeof lines[count], fmt, ap);
  va_end(ap);
  levels[count++] = level;
}

int shimCount(void) { return count; }
const char* shimLine(int i) { return i >= 0 && i < count ? lines[i] : ""; }
int shimLevel(int i) { return i >= 0 && i < count ? levels[i] : -1; }
void shimReset(void) { count = 0; }
