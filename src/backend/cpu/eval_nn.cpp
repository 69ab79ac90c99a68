// CPU evaluation of the fused NN primitives and random sampling.
#include "backend/cpu/kernels/nn.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera {
namespace {

struct Rows {
  int64_t rows = 0, cols = 0;
};
Rows rows_of(const Array& x) {
  Rows r;
  r.cols = x.ndim() ? x.shape(-1) : 1;
  r.rows = r.cols ? x.size() / r.cols : 0;
  return r;
}

const void* data_or_null(const Array* a) { return a ? a->raw_data() : nullptr; }

}  // namespace

void Softmax::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  outputs[0].allocate();
  Rows r = rows_of(x);
  cpu::softmax_rows(x.dtype(), x.raw_data(), outputs[0].mutable_raw_data(), r.rows, r.cols, log_);
}

void SoftmaxGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& y = inputs[0];
  outputs[0].allocate();
  Rows r = rows_of(y);
  cpu::softmax_rows_backward(y.dtype(), y.raw_data(), inputs[1].raw_data(), outputs[0].mutable_raw_data(), r.rows,
                             r.cols, log_);
}

void Norm::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  size_t next = 1;
  const Array* w = has_weight_ ? &inputs[next++] : nullptr;
  const Array* b = has_bias_ ? &inputs[next++] : nullptr;
  for (Array& o : outputs) o.allocate();
  Rows r = rows_of(x);
  if (rms_) {
    cpu::rms_norm_rows(x.dtype(), x.raw_data(), data_or_null(w), outputs[0].mutable_raw_data(),
                       outputs[1].mutable_raw_data(), r.rows, r.cols, eps_);
  } else {
    cpu::layer_norm_rows(x.dtype(), x.raw_data(), data_or_null(w), data_or_null(b), outputs[0].mutable_raw_data(),
                         outputs[1].mutable_raw_data(), outputs[2].mutable_raw_data(), r.rows, r.cols, eps_);
  }
}

void NormGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  size_t next = 0;
  const Array& x = inputs[next++];
  const Array* w = has_weight_ ? &inputs[next++] : nullptr;
  const Array* mu = rms_ ? nullptr : &inputs[next++];
  const Array& rstd = inputs[next++];
  const Array& dy = inputs[next++];
  for (Array& o : outputs) o.allocate();
  void* dw = has_weight_ ? outputs[1].mutable_raw_data() : nullptr;
  void* db = has_bias_ ? outputs[has_weight_ ? 2 : 1].mutable_raw_data() : nullptr;
  Rows r = rows_of(x);
  if (rms_) {
    cpu::rms_norm_rows_backward(x.dtype(), x.raw_data(), data_or_null(w), rstd.raw_data(), dy.raw_data(),
                                outputs[0].mutable_raw_data(), dw, r.rows, r.cols);
  } else {
    cpu::layer_norm_rows_backward(x.dtype(), x.raw_data(), data_or_null(w), mu->raw_data(), rstd.raw_data(),
                                  dy.raw_data(), outputs[0].mutable_raw_data(), dw, db, r.rows, r.cols);
  }
}

void CrossEntropy::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& logits = inputs[0];
  for (Array& o : outputs) o.allocate();
  cpu::cross_entropy_rows(logits.dtype(), logits.raw_data(), inputs[1].data<int64_t>(), logits.shape(0),
                          logits.shape(1), classes_in(logits.shape(1)), ignore_index_, outputs[0].mutable_raw_data(),
                          outputs[1].mutable_raw_data());
}

void CrossEntropyGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& logits = inputs[0];
  outputs[0].allocate();
  cpu::cross_entropy_rows_backward(logits.dtype(), logits.raw_data(), inputs[1].data<int64_t>(), inputs[2].raw_data(),
                                   inputs[3].raw_data(), outputs[0].mutable_raw_data(), logits.shape(0),
                                   logits.shape(1), classes_in(logits.shape(1)), ignore_index_);
}

void CrossEntropyWithGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  // The forward over every row, then the backward (whose dlogits may be the logits'
  // buffer: each row is read before it is written).
  const Array& logits = inputs[0];
  for (Array& o : outputs) o.allocate();
  const int64_t rows = logits.shape(0), row = logits.shape(1), classes = classes_in(row);
  cpu::cross_entropy_rows(logits.dtype(), logits.raw_data(), inputs[1].data<int64_t>(), rows, row, classes,
                          ignore_index_, outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data());
  cpu::cross_entropy_rows_backward(logits.dtype(), logits.raw_data(), inputs[1].data<int64_t>(), outputs[1].raw_data(),
                                   inputs[2].raw_data(), outputs[2].mutable_raw_data(), rows, row, classes,
                                   ignore_index_);
}

}  // namespace tessera
