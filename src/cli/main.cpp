#include <cstdio>

#include "tessera/version.h"

int main() {
  std::printf("tessera %s\n", tessera::version());
  return 0;
}
