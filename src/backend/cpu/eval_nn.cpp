// CPU evaluation of the fused NN primitives and random sampling.
#include "backend/cpu/kernels/attention.h"
#include "backend/cpu/kernels/nn.h"
#include "backend/cpu/kernels/random.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/ir/primitives/random.h"

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

namespace {
cpu::AttentionShape attention_shape(const AttentionConfig& c, const std::vector<Array>& inputs) {
  const Array& q = inputs[0];
  const Array& k = inputs[1];
  cpu::AttentionShape s;
  s.batch = q.shape(0);
  s.heads = q.shape(1);
  s.q_len = q.shape(2);
  s.head_dim = q.shape(3);
  s.kv_heads = k.shape(1);
  s.kv_len = k.shape(2);
  s.causal = c.causal;
  s.scale = c.scale;
  if (c.has_mask) {
    const Array& m = inputs[3];  // [mb, mh, T, S], mb/mh are 1 or full
    s.mask = m.raw_data();
    int64_t plane = s.q_len * s.kv_len;
    s.mask_h_stride = m.shape(1) == 1 ? 0 : plane;
    s.mask_b_stride = m.shape(0) == 1 ? 0 : m.shape(1) * plane;
  }
  return s;
}
}  // namespace

void Attention::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  for (Array& o : outputs) o.allocate();
  cpu::AttentionShape s = attention_shape(config_, inputs);
  cpu::attention_forward(inputs[0].dtype(), s, inputs[0].raw_data(), inputs[1].raw_data(), inputs[2].raw_data(),
                         outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data());
}

void AttentionGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  for (Array& o : outputs) o.allocate();
  size_t m = config_.has_mask ? 1 : 0;
  cpu::AttentionShape s = attention_shape(config_, inputs);
  cpu::attention_backward(inputs[0].dtype(), s, inputs[0].raw_data(), inputs[1].raw_data(), inputs[2].raw_data(),
                          inputs[3 + m].raw_data(), inputs[4 + m].raw_data(), inputs[5 + m].raw_data(),
                          outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data(), outputs[2].mutable_raw_data());
}

void CrossEntropy::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& logits = inputs[0];
  for (Array& o : outputs) o.allocate();
  cpu::cross_entropy_rows(logits.dtype(), logits.raw_data(), inputs[1].data<int64_t>(), logits.shape(0),
                          logits.shape(1), ignore_index_, outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data());
}

void CrossEntropyGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& logits = inputs[0];
  outputs[0].allocate();
  cpu::cross_entropy_rows_backward(logits.dtype(), logits.raw_data(), inputs[1].data<int64_t>(), inputs[2].raw_data(),
                                   inputs[3].raw_data(), outputs[0].mutable_raw_data(), logits.shape(0),
                                   logits.shape(1), ignore_index_);
}

namespace {
cpu::PhiloxKey philox_key(const Array& key) {
  const uint32_t* k = key.data<uint32_t>();
  return {k[0], k[1]};
}
}  // namespace

void RandomSplit::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  outputs[0].allocate();
  cpu::split_key(philox_key(inputs[0]), outputs[0].mutable_data<uint32_t>(), num_);
}

void RandomSample::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  Array& out = outputs[0];
  out.allocate();
  if (dist_ == Distribution::Uniform) {
    cpu::random_uniform(philox_key(inputs[0]), out.dtype(), a_, b_, out.mutable_raw_data(), out.size());
  } else {
    cpu::random_normal(philox_key(inputs[0]), out.dtype(), a_, b_, out.mutable_raw_data(), out.size());
  }
}

void RandomBernoulli::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  Array& out = outputs[0];
  out.allocate();
  const Array& p = inputs[1];
  cpu::random_bernoulli(philox_key(inputs[0]), p.dtype(), p.raw_data(), p.size() == 1 && out.size() != 1,
                        static_cast<bool*>(out.mutable_raw_data()), out.size());
}

}  // namespace tessera
