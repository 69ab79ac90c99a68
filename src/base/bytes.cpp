#include "tessera/base/bytes.h"

#include "tessera/base/error.h"

namespace tessera {

void ByteReader::truncated(uint64_t need, const char* what) const {
  fail<ValueError>("{}: truncated bytes reading {} (need {} at offset {}, have {})", format_, what, need, pos_,
                   bytes_.size());
}

void ByteReader::too_many(const char* what, uint64_t n) const {
  fail<ValueError>("{}: corrupt bytes: {} {} at offset {} exceeds the {} bytes left", format_, what, n, pos_,
                   remaining());
}

}  // namespace tessera
