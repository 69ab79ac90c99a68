#include <charconv>

#include "tessera/base/error.h"
#include "tessera/compiler/device_program.h"

namespace tessera::compiler {

DeviceSpec DeviceSpec::parse(const std::string& text) {
  DeviceSpec spec;
  if (text.empty() || text == "cpu") return spec;
  if (text == "cuda" || text == "gpu") {
    spec.cuda = true;
    return spec;
  }
  if (text.rfind("cuda:", 0) == 0) {
    const char* first = text.data() + 5;
    const char* last = text.data() + text.size();
    int index = -1;
    auto [ptr, ec] = std::from_chars(first, last, index);
    if (ec == std::errc() && ptr == last && first != last && index >= 0) {
      spec.cuda = true;
      spec.index = index;
      return spec;
    }
  }
  fail<ValueError>("device: unknown device '{}' (expected cpu, cuda or cuda:N)", text);
}

}  // namespace tessera::compiler
