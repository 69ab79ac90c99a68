// Multi-tensor launches (apex / PyTorch multi_tensor_apply): many tensors cut into
// chunks of a fixed number of elements, one block per chunk, packed into launches whose
// by-value parameters hold at most `max_tensors` tensors and `max_blocks` (tensor slot,
// chunk) pairs. The packing of optim.cu (AdamW, Lion) and convert_multi_tensor.cu.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::cuda {

// For tensors 0 .. count - 1 of size(t) elements (empty ones skipped): put(slot, t) stores
// tensor t's pointers in launch slot `slot`, block(b, slot, chunk) records that block b of
// the launch does that chunk of the tensor in `slot`, and launch(blocks) runs the table
// filled so far. A tensor whose chunks do not all fit goes on in the next launch, from
// slot 0.
template <typename Size, typename Put, typename Block, typename Launch>
void pack_chunks(size_t count, int64_t chunk, int max_tensors, int max_blocks, Size&& size, Put&& put, Block&& block,
                 Launch&& launch) {
  int tensors_in = 0, blocks_in = 0;
  for (size_t t = 0; t < count; ++t) {
    const int64_t n = size(t);
    if (n <= 0) continue;
    put(tensors_in++, t);
    const int64_t chunks = (n + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      block(blocks_in++, tensors_in - 1, c);
      const bool last_chunk = c == chunks - 1;
      if (blocks_in == max_blocks || (tensors_in == max_tensors && last_chunk)) {
        launch(blocks_in);
        blocks_in = 0;
        if (last_chunk) {
          tensors_in = 0;
        } else {
          put(0, t);
          tensors_in = 1;
        }
      }
    }
  }
  if (blocks_in > 0) launch(blocks_in);
}

}  // namespace tessera::cuda
