// eval_cpu of attention and attention_packed (ir/primitives/nn.h): the flash-style CPU
// kernels, forward and backward (CUDA: backend/cuda/eval_attention.cpp). The packed
// primitives copy q, k, v out of qkv into the kernels' layout and the results back: the
// copies the transposes made before the attention-layout pass, so the values are bitwise
// those of the unpacked program.
#include <cstring>
#include <vector>

#include "backend/cpu/kernels/attention.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera {

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
  if (c.has_segments) s.segments = static_cast<const int32_t*>(inputs[c.segments_index()].raw_data());  // [B, T]
  return s;
}

// Where row (b, h, t) of head_dim elements starts, in elements: b batch + (h / group_size)
// group + (h % group_size) head + t row.
struct RowLayout {
  int64_t batch, group, head, row, group_size;
  int64_t at(int64_t b, int64_t h, int64_t t) const {
    return b * batch + (h / group_size) * group + (h % group_size) * head + t * row;
  }
};

// The layouts of qkv's q, k, v (the q slots of kv head j, then its k and v), of out
// [B, T, H, D] and of the kernels' [B, heads, T, D].
struct PackedLayouts {
  PackedQkvShape s;
  RowLayout q, kv, out;
  int64_t k_offset, v_offset;  // k's and v's first row in qkv
  explicit PackedLayouts(const PackedQkvShape& shape) : s(shape) {
    const int64_t w = s.kv_heads * (s.group + 2) * s.head_dim;  // one position of qkv
    q = {s.seq * w, (s.group + 2) * s.head_dim, s.head_dim, w, s.group};
    kv = {s.seq * w, (s.group + 2) * s.head_dim, 0, w, 1};
    out = {s.seq * s.heads() * s.head_dim, s.head_dim, 0, s.heads() * s.head_dim, 1};
    k_offset = s.group * s.head_dim;
    v_offset = (s.group + 1) * s.head_dim;
  }
  RowLayout dense(int64_t heads) const { return {heads * s.seq * s.head_dim, s.seq * s.head_dim, 0, s.head_dim, 1}; }
};

// Copies the rows (b < B, h < heads, t < T) of head_dim elements of `from` to `to`.
void copy_rows(const PackedLayouts& l, int64_t heads, size_t item, const char* src, const RowLayout& from, char* dst,
               const RowLayout& to) {
  const size_t bytes = static_cast<size_t>(l.s.head_dim) * item;
  for (int64_t b = 0; b < l.s.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < l.s.seq; ++t)
        std::memcpy(dst + static_cast<size_t>(to.at(b, h, t)) * item,
                    src + static_cast<size_t>(from.at(b, h, t)) * item, bytes);
}

cpu::AttentionShape packed_attention_shape(const AttentionConfig& c, const PackedQkvShape& s,
                                           const std::vector<Array>& inputs) {
  cpu::AttentionShape shape;
  shape.batch = s.batch;
  shape.heads = s.heads();
  shape.kv_heads = s.kv_heads;
  shape.q_len = shape.kv_len = s.seq;
  shape.head_dim = s.head_dim;
  shape.causal = c.causal;
  shape.scale = c.scale;
  if (c.has_mask) {
    const Array& m = inputs[1];
    const int64_t plane = s.seq * s.seq;
    shape.mask = m.raw_data();
    shape.mask_h_stride = m.shape(1) == 1 ? 0 : plane;
    shape.mask_b_stride = m.shape(0) == 1 ? 0 : m.shape(1) * plane;
  }
  if (c.has_segments) shape.segments = static_cast<const int32_t*>(inputs[c.segments_index() - 2].raw_data());
  return shape;
}

// The packed primitives' temporaries in the kernels' layout, carved from one per-thread
// scratch buffer (a compiled program's runs allocate nothing): q-sized and kv-sized
// pieces, in the order asked for.
class UnpackedBuffers {
 public:
  UnpackedBuffers(const PackedLayouts& l, size_t item, int q_like, int kv_like)
      : q_bytes_(static_cast<size_t>(l.s.batch * l.s.heads() * l.s.seq * l.s.head_dim) * item),
        kv_bytes_(static_cast<size_t>(l.s.batch * l.s.kv_heads * l.s.seq * l.s.head_dim) * item),
        base_(
            cpu::thread_scratch<char>(static_cast<size_t>(q_like) * q_bytes_ + static_cast<size_t>(kv_like) * kv_bytes_,
                                      cpu::Scratch::AttentionPacked)) {}
  char* q_like(int i) const { return base_ + static_cast<size_t>(i) * q_bytes_; }
  char* kv_like(int q_count, int i) const { return q_like(q_count) + static_cast<size_t>(i) * kv_bytes_; }

 private:
  size_t q_bytes_, kv_bytes_;
  char* base_;
};

// Copies q, k, v out of qkv to the kernels' layout.
void unpack_qkv(const PackedLayouts& l, size_t item, const char* qkv, char* q, char* k, char* v) {
  copy_rows(l, l.s.heads(), item, qkv, l.q, q, l.dense(l.s.heads()));
  copy_rows(l, l.s.kv_heads, item, qkv + l.k_offset * static_cast<int64_t>(item), l.kv, k, l.dense(l.s.kv_heads));
  copy_rows(l, l.s.kv_heads, item, qkv + l.v_offset * static_cast<int64_t>(item), l.kv, v, l.dense(l.s.kv_heads));
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
  const size_t m = config_.optional_inputs();
  cpu::AttentionShape s = attention_shape(config_, inputs);
  cpu::attention_backward(inputs[0].dtype(), s, inputs[0].raw_data(), inputs[1].raw_data(), inputs[2].raw_data(),
                          inputs[3 + m].raw_data(), inputs[4 + m].raw_data(), inputs[5 + m].raw_data(),
                          outputs[0].mutable_raw_data(), outputs[1].mutable_raw_data(), outputs[2].mutable_raw_data());
}

void AttentionPacked::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  for (Array& o : outputs) o.allocate();
  const PackedLayouts l(packed_qkv_shape("attention_packed", inputs[0].shape()));
  const DType dtype = inputs[0].dtype();
  const size_t item = itemsize(dtype);
  const UnpackedBuffers buf(l, item, 2, 2);  // q, out; k, v
  char *q = buf.q_like(0), *out = buf.q_like(1), *k = buf.kv_like(2, 0), *v = buf.kv_like(2, 1);
  unpack_qkv(l, item, static_cast<const char*>(inputs[0].raw_data()), q, k, v);
  cpu::attention_forward(dtype, packed_attention_shape(config_, l.s, inputs), q, k, v, out,
                         outputs[1].mutable_raw_data());
  copy_rows(l, l.s.heads(), item, out, l.dense(l.s.heads()), static_cast<char*>(outputs[0].mutable_raw_data()), l.out);
}

void AttentionPackedGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  for (Array& o : outputs) o.allocate();
  const size_t m = config_.optional_inputs();
  const PackedLayouts l(packed_qkv_shape("attention_packed_grad", inputs[0].shape()));
  const DType dtype = inputs[0].dtype();
  const size_t item = itemsize(dtype);
  const UnpackedBuffers buf(l, item, 4, 4);  // q, out, dout, dq; k, v, dk, dv
  char *q = buf.q_like(0), *out = buf.q_like(1), *dout = buf.q_like(2), *dq = buf.q_like(3);
  char *k = buf.kv_like(4, 0), *v = buf.kv_like(4, 1), *dk = buf.kv_like(4, 2), *dv = buf.kv_like(4, 3);
  unpack_qkv(l, item, static_cast<const char*>(inputs[0].raw_data()), q, k, v);
  const RowLayout q_dense = l.dense(l.s.heads()), kv_dense = l.dense(l.s.kv_heads);
  copy_rows(l, l.s.heads(), item, static_cast<const char*>(inputs[1 + m].raw_data()), l.out, out, q_dense);
  copy_rows(l, l.s.heads(), item, static_cast<const char*>(inputs[3 + m].raw_data()), l.out, dout, q_dense);
  cpu::attention_backward(dtype, packed_attention_shape(config_, l.s, inputs), q, k, v, out, inputs[2 + m].raw_data(),
                          dout, dq, dk, dv);
  char* dqkv = static_cast<char*>(outputs[0].mutable_raw_data());
  copy_rows(l, l.s.heads(), item, dq, q_dense, dqkv, l.q);
  copy_rows(l, l.s.kv_heads, item, dk, kv_dense, dqkv + l.k_offset * static_cast<int64_t>(item), l.kv);
  copy_rows(l, l.s.kv_heads, item, dv, kv_dense, dqkv + l.v_offset * static_cast<int64_t>(item), l.kv);
}

}  // namespace tessera
