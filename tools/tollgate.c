/* tollgate.c - the tollgate command-line program (placeholder while the demo is written). */
#include "tollgate.h"

#include <stdio.h>

int main(void) {
  printf("tollgate %s\n", tg_version_string());
  return 0;
}
