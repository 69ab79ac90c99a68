// CPU evaluation of layout primitives and reductions.
#include <cstring>

#include "backend/cpu/kernels/copy.h"
#include "backend/cpu/kernels/elementwise.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/layout.h"

namespace tessera {

void Reshape::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].share_storage(inputs[0]);
}

void Transpose::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  SmallDims in, src(perm_.size());
  contiguous_strides_into(x.shape(), in);
  for (size_t i = 0; i < perm_.size(); ++i) src[i] = in[perm_[i]];
  cpu::strided_copy(x.dtype(), x.raw_data(), 0, src, out.shape(), out.mutable_raw_data());
}

void BroadcastTo::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  SmallDims src;
  broadcast_strides_into(x.shape(), shape_, src);
  cpu::strided_copy(x.dtype(), x.raw_data(), 0, src, shape_, out.mutable_raw_data());
}

void Slice::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  SmallDims in, src(x.shape().size());
  contiguous_strides_into(x.shape(), in);
  int64_t offset = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    offset += start_[i] * in[i];
    src[i] = in[i] * step_[i];
  }
  if (out.size() == 0) return;
  cpu::strided_copy(x.dtype(), x.raw_data(), offset, src, out.shape(), out.mutable_raw_data());
}

void SlicePad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  Array& out = outputs[0];
  out.allocate();
  cpu::fill(out.dtype(), 0.0, out.mutable_raw_data(), out.size());
  if (x.size() == 0) return;
  SmallDims full, dst(shape_.size());
  contiguous_strides_into(shape_, full);
  int64_t offset = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    offset += start_[i] * full[i];
    dst[i] = full[i] * step_[i];
  }
  cpu::strided_store(x.dtype(), x.raw_data(), x.shape(), out.mutable_raw_data(), offset, dst);
}

void Concatenate::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  Array& out = outputs[0];
  out.allocate();
  SmallDims dst;
  contiguous_strides_into(out.shape(), dst);
  int64_t offset = 0;
  for (const Array& in : inputs) {
    if (in.size() > 0) cpu::strided_store(in.dtype(), in.raw_data(), in.shape(), out.mutable_raw_data(), offset, dst);
    offset += in.shape()[axis_] * dst[axis_];
  }
}

// The executable binds the output to the host arena (offload) or the device arena
// (load); on the CPU both are host memory, so the move is a plain copy.
void OffloadToHost::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].allocate();
  if (inputs[0].nbytes() > 0) std::memcpy(outputs[0].mutable_raw_data(), inputs[0].raw_data(), inputs[0].nbytes());
}

void LoadFromHost::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].allocate();
  if (inputs[0].nbytes() > 0) std::memcpy(outputs[0].mutable_raw_data(), inputs[0].raw_data(), inputs[0].nbytes());
}

}  // namespace tessera
