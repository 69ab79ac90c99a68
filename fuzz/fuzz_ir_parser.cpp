// The IR's text form (compiler/parser.h): graphs as tests and `tessera compile --dump`
// write them, and single types.
#include "fuzz_util.h"
#include "tessera/compiler/parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string text(fuzz::as_text(data, size));
  fuzz::expect_errors([&] { compiler::parse_graph(text); });
  fuzz::expect_errors([&] { compiler::parse_type(text); });
  return 0;
}
