// Fused elementwise kernel and fused trailing-axes reduction (see fused_elementwise.h).
//
// A Plan decides once per call where each register of a tile lives:
//   Direct  - a contiguous full-shape input, read where it is;
//   Scalar  - a one-element input used only by binary/where (read with stride 0);
//   Slot    - a kFusedTile-element scratch buffer (gathered inputs, intermediates);
//   Output  - an output buffer, written where it ends up.
// Slots are reused once a register is dead (a dying operand's slot is taken over by
// the result when the element sizes match), so a chain of any length touches only a
// few tile buffers, which stay in L1/L2.
#include "backend/cpu/kernels/fused_elementwise.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/elementwise_detail.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/small_vector.h"

namespace tessera::cpu {

enum class Home : uint8_t { Direct, Scalar, Slot, Output };

struct FusedPlan {
  struct Register {
    Home home = Home::Slot;
    int index = 0;  // slot or output index
    DType dtype = DType::Float32;
    size_t size = 0;
  };
  std::vector<Register> regs;
  int num_slots = 0;
  std::vector<detail::Layout<1>> layouts;      // per input: broadcast layout over the shape
  std::vector<int> gathered;                   // inputs copied into their slot each tile
  std::vector<std::pair<int, int>> copy_outs;  // (output, register) written by a copy
};

namespace {

using Plan = FusedPlan;

using detail::Compute;

// Elements per parallel chunk of the elementwise kernel (a whole number of tiles).
constexpr int64_t kChunk = kFusedTile * 16;

bool bool_result(BinaryOp op) { return is_comparison(op) || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr; }

void check_program(const FusedProgram& p, size_t num_inputs, size_t num_strides) {
  const int n_in = static_cast<int>(p.input_dtypes.size());
  if (num_inputs != p.input_dtypes.size() || num_strides != p.input_dtypes.size())
    fail<ValueError>("fused_elementwise: {} inputs and {} stride lists for a program of {} inputs", num_inputs,
                     num_strides, n_in);
  std::vector<DType> dt(p.input_dtypes);
  for (size_t k = 0; k < p.body.size(); ++k) {
    const FusedInstruction& in = p.body[k];
    const int self = n_in + static_cast<int>(k);
    const int arity = in.kind == FusedOpKind::Binary ? 2 : in.kind == FusedOpKind::Where ? 3 : 1;
    for (int a = 0; a < arity; ++a)
      if (in.args[a] < 0 || in.args[a] >= self)
        fail<ValueError>("fused_elementwise: instruction {} reads register {} (expected one of 0..{})", k, in.args[a],
                         self - 1);
    const DType x = dt[in.args[0]];
    bool ok = true;
    switch (in.kind) {
      case FusedOpKind::Unary:
        ok = in.dtype == (static_cast<UnaryOp>(in.op) == UnaryOp::LogicalNot ? DType::Bool : x);
        break;
      case FusedOpKind::Binary:
        ok = dt[in.args[1]] == x && in.dtype == (bool_result(static_cast<BinaryOp>(in.op)) ? DType::Bool : x);
        break;
      case FusedOpKind::Where:
        ok = x == DType::Bool && dt[in.args[1]] == in.dtype && dt[in.args[2]] == in.dtype;
        break;
      case FusedOpKind::Cast:
        break;
    }
    if (!ok) fail<DTypeError>("fused_elementwise: instruction {} has operand / result dtypes that do not match", k);
    dt.push_back(in.dtype);
  }
  for (int r : p.outputs)
    if (r < 0 || r >= static_cast<int>(dt.size()))
      fail<ValueError>("fused_elementwise: output register {} does not exist", r);
}

DType register_dtype(const FusedProgram& p, int reg) {
  const int n_in = static_cast<int>(p.input_dtypes.size());
  return reg < n_in ? p.input_dtypes[reg] : p.body[reg - n_in].dtype;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// `direct_outputs`: outputs are written in place (false for the reduction, whose
// output register is reduced from a slot). `aliased[i]`: input i shares memory with
// an output, so it must be copied before the tile is written.
Plan make_plan(const FusedProgram& p, const std::vector<Strides>& strides, const Shape& shape,
               const std::vector<uint8_t>& aliased, bool direct_outputs) {
  const int n_in = static_cast<int>(p.input_dtypes.size());
  const int n_regs = n_in + static_cast<int>(p.body.size());
  Plan plan;
  plan.regs.resize(n_regs);
  for (int r = 0; r < n_regs; ++r) {
    plan.regs[r].dtype = r < n_in ? p.input_dtypes[r] : p.body[r - n_in].dtype;
    plan.regs[r].size = itemsize(plan.regs[r].dtype);
  }
  // Last instruction reading each register; outputs live to the end.
  const int end = static_cast<int>(p.body.size());
  std::vector<int> last_use(n_regs, -1);
  std::vector<bool> only_binary_uses(n_regs, true), is_output(n_regs, false);
  for (int k = 0; k < end; ++k) {
    const FusedInstruction& in = p.body[k];
    const int arity = in.kind == FusedOpKind::Binary ? 2 : in.kind == FusedOpKind::Where ? 3 : 1;
    for (int a = 0; a < arity; ++a) {
      last_use[in.args[a]] = k;
      if (in.kind != FusedOpKind::Binary && in.kind != FusedOpKind::Where) only_binary_uses[in.args[a]] = false;
    }
  }
  for (int r : p.outputs) {
    last_use[r] = end;
    is_output[r] = true;
  }

  std::vector<int> free_slots;
  auto take_slot = [&]() {
    if (free_slots.empty()) return plan.num_slots++;
    int s = free_slots.back();
    free_slots.pop_back();
    return s;
  };
  plan.layouts.reserve(n_in);
  for (int i = 0; i < n_in; ++i) {
    plan.layouts.push_back(detail::collapse<1>(shape, std::array<DimsRef, 1>{strides[i]}));
    const auto& layout = plan.layouts.back();
    bool contiguous = layout.shape.size() == 1 && layout.strides[0][0] == 1;
    bool all_zero = std::all_of(layout.strides[0].begin(), layout.strides[0].end(), [](int64_t s) { return s == 0; });
    auto& reg = plan.regs[i];
    if (contiguous && !aliased[i]) {
      reg.home = Home::Direct;
    } else if (all_zero && only_binary_uses[i] && !is_output[i] && !aliased[i]) {
      reg.home = Home::Scalar;
    } else {
      reg.home = Home::Slot;
      reg.index = take_slot();
      plan.gathered.push_back(i);
    }
    if (last_use[i] < 0 && reg.home == Home::Slot) {  // unused: never gathered
      free_slots.push_back(reg.index);
      plan.gathered.pop_back();
    }
  }
  std::vector<bool> output_taken(p.outputs.size(), false);
  for (int k = 0; k < end; ++k) {
    const FusedInstruction& in = p.body[k];
    const int self = n_in + k;
    auto& reg = plan.regs[self];
    const int arity = in.kind == FusedOpKind::Binary ? 2 : in.kind == FusedOpKind::Where ? 3 : 1;
    bool placed = false;
    if (direct_outputs && is_output[self]) {
      for (size_t j = 0; j < p.outputs.size() && !placed; ++j)
        if (p.outputs[j] == self && !output_taken[j]) {
          reg.home = Home::Output;
          reg.index = static_cast<int>(j);
          output_taken[j] = true;
          placed = true;
        }
    }
    // Operands dying here: an elementwise op may write over one of the same element size.
    std::vector<int> dying;
    for (int a = 0; a < arity; ++a) {
      const int r = in.args[a];
      if (last_use[r] == k && plan.regs[r].home == Home::Slot &&
          std::find(dying.begin(), dying.end(), plan.regs[r].index) == dying.end())
        dying.push_back(plan.regs[r].index);
    }
    if (!placed) {
      reg.home = Home::Slot;
      reg.index = -1;
      if (in.kind != FusedOpKind::Cast)
        for (int a = 0; a < arity && reg.index < 0; ++a) {
          const auto& op = plan.regs[in.args[a]];
          if (last_use[in.args[a]] == k && op.home == Home::Slot && op.size == reg.size) reg.index = op.index;
        }
      if (reg.index < 0) reg.index = take_slot();
    }
    for (int s : dying)
      if (!(reg.home == Home::Slot && reg.index == s)) free_slots.push_back(s);
    if (last_use[self] < 0 && reg.home == Home::Slot) free_slots.push_back(reg.index);  // dead result
  }
  for (size_t j = 0; j < p.outputs.size() && direct_outputs; ++j)
    if (!output_taken[j]) plan.copy_outs.emplace_back(static_cast<int>(j), p.outputs[j]);
  return plan;
}

// A chunk's state: the slot buffers and each register's address for the current tile,
// in the chunk's lease of a ChunkScratch of tile_state_bytes(plan).
size_t slot_bytes(const Plan& plan) { return sizeof(double) * std::max(1, plan.num_slots) * kFusedTile; }
size_t tile_state_bytes(const Plan& plan) {
  return slot_bytes(plan) + plan.regs.size() * (sizeof(const unsigned char*) + sizeof(int64_t));
}

struct TileState {
  double* slots;
  const unsigned char** ptr;
  int64_t* stride;  // 0 (Scalar) or 1
  TileState(const Plan& plan, const ChunkScratch::Lease& lease) {
    const size_t n = plan.regs.size();
    slots = lease.as<double>();
    ptr = lease.as<const unsigned char*>(slot_bytes(plan));
    stride = lease.as<int64_t>(slot_bytes(plan) + n * sizeof(const unsigned char*));
    std::fill(ptr, ptr + n, nullptr);
    std::fill(stride, stride + n, int64_t{1});
  }
  unsigned char* slot(int s) { return reinterpret_cast<unsigned char*>(slots + s * kFusedTile); }
};

// Gathers elements [begin, begin + n) of a broadcast input into dst.
void gather(const detail::Layout<1>& layout, const unsigned char* src, size_t size, int64_t begin, int64_t n,
            unsigned char* dst) {
  detail::dispatch_bytes(size == 1   ? DType::UInt8
                         : size == 2 ? DType::Float16
                         : size == 4 ? DType::Float32
                                     : DType::Float64,
                         [&](auto tag) {
                           using U = typename decltype(tag)::type;
                           const U* s = reinterpret_cast<const U*>(src);
                           U* d = reinterpret_cast<U*>(dst);
                           const int64_t inner = layout.strides[0].back();
                           detail::for_each_run<1>(layout, begin, begin + n,
                                                   [&](const std::array<int64_t, 1>& off, int64_t m) {
                                                     const U* row = s + off[0];
                                                     if (inner == 1)
                                                       std::memcpy(d, row, m * sizeof(U));
                                                     else if (inner == 0)
                                                       std::fill(d, d + m, row[0]);
                                                     else
                                                       for (int64_t i = 0; i < m; ++i) d[i] = row[i * inner];
                                                     d += m;
                                                   });
                         });
}

template <typename U>
void select(const bool* c, int64_t sc, const U* x, int64_t sx, const U* y, int64_t sy, U* o, int64_t n) {
  if (sc == 1 && sx == 1 && sy == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = c[i * sc] ? x[i * sx] : y[i * sy];
  }
}

// Runs the program over elements [begin, begin + n) (n <= kFusedTile).
void run_tile(const FusedProgram& p, const Plan& plan, const void* const* inputs, void* const* outputs, int64_t begin,
              int64_t n, TileState& st) {
  const int n_in = static_cast<int>(p.input_dtypes.size());
  for (int i = 0; i < n_in; ++i) {
    const auto& reg = plan.regs[i];
    const auto* base = static_cast<const unsigned char*>(inputs[i]);
    switch (reg.home) {
      case Home::Direct:
        st.ptr[i] = base + begin * reg.size;
        break;
      case Home::Scalar:
        st.ptr[i] = base;
        st.stride[i] = 0;
        break;
      default:
        st.ptr[i] = st.slot(reg.index);
        break;
    }
  }
  for (int i : plan.gathered)
    gather(plan.layouts[i], static_cast<const unsigned char*>(inputs[i]), plan.regs[i].size, begin, n,
           st.slot(plan.regs[i].index));
  for (size_t k = 0; k < p.body.size(); ++k) {
    const FusedInstruction& in = p.body[k];
    const int self = n_in + static_cast<int>(k);
    const auto& reg = plan.regs[self];
    unsigned char* dst = reg.home == Home::Output ? static_cast<unsigned char*>(outputs[reg.index]) + begin * reg.size
                                                  : st.slot(reg.index);
    st.ptr[self] = dst;
    const int a = in.args[0], b = in.args[1], c = in.args[2];
    switch (in.kind) {
      case FusedOpKind::Unary:
        unary_span(static_cast<UnaryOp>(in.op), plan.regs[a].dtype, st.ptr[a], dst, n);
        break;
      case FusedOpKind::Binary:
        binary_span(static_cast<BinaryOp>(in.op), plan.regs[a].dtype, st.ptr[a], st.stride[a], st.ptr[b], st.stride[b],
                    dst, n);
        break;
      case FusedOpKind::Cast:
        cast_span(plan.regs[a].dtype, st.ptr[a], in.dtype, dst, n);
        break;
      case FusedOpKind::Where:
        detail::dispatch_bytes(in.dtype, [&](auto tag) {
          using U = typename decltype(tag)::type;
          select<U>(reinterpret_cast<const bool*>(st.ptr[a]), st.stride[a], reinterpret_cast<const U*>(st.ptr[b]),
                    st.stride[b], reinterpret_cast<const U*>(st.ptr[c]), st.stride[c], reinterpret_cast<U*>(dst), n);
        });
        break;
    }
  }
  for (const auto& [j, r] : plan.copy_outs) {
    unsigned char* dst = static_cast<unsigned char*>(outputs[j]) + begin * plan.regs[r].size;
    if (st.stride[r] == 0) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * plan.regs[r].size, st.ptr[r], plan.regs[r].size);
    } else {
      std::memcpy(dst, st.ptr[r], n * plan.regs[r].size);
    }
  }
}

}  // namespace

FusedKernel::FusedKernel(FusedProgram program, std::vector<Strides> input_strides, Shape shape)
    : program_(std::move(program)), strides_(std::move(input_strides)), shape_(std::move(shape)) {
  check_program(program_, program_.input_dtypes.size(), strides_.size());
  for (const Strides& s : strides_)
    if (s.size() != shape_.size())
      fail<ShapeError>("fused_elementwise: input stride rank {} does not match the shape {}", s.size(),
                       to_string(shape_));
}

FusedKernel::~FusedKernel() = default;

std::shared_ptr<const FusedPlan> FusedKernel::plan_for(const void* const* inputs, void* const* outputs,
                                                       bool direct_outputs) const {
  const int64_t total = numel(shape_);
  const size_t n_in = program_.input_dtypes.size();
  // Which inputs share memory with an output (decided per call: buffers may change).
  SmallVec<uint8_t, 32> aliased(n_in, 0);
  if (direct_outputs)
    for (size_t i = 0; i < n_in; ++i)
      for (size_t j = 0; j < program_.outputs.size(); ++j)
        if (overlaps(inputs[i], total * itemsize(program_.input_dtypes[i]), outputs[j],
                     total * itemsize(register_dtype(program_, program_.outputs[j]))))
          aliased[i] = 1;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const CachedPlan& c : plans_)
    if (c.direct_outputs == direct_outputs && std::equal(aliased.begin(), aliased.end(), c.aliased.begin()))
      return c.plan;
  CachedPlan c;
  c.aliased.assign(aliased.begin(), aliased.end());
  c.direct_outputs = direct_outputs;
  c.plan = std::make_shared<const FusedPlan>(make_plan(program_, strides_, shape_, c.aliased, direct_outputs));
  plans_.push_back(c);
  return c.plan;
}

void FusedKernel::run(const void* const* inputs, void* const* outputs) const {
  const int64_t total = numel(shape_);
  if (total == 0) return;
  const std::shared_ptr<const FusedPlan> plan = plan_for(inputs, outputs, /*direct_outputs=*/true);
  const ChunkScratch scratch(tile_state_bytes(*plan), Scratch::FusedChunks);
  parallel_for(total, kChunk, [&](int64_t b, int64_t e) {
    ChunkScratch::Lease lease(scratch);
    TileState st(*plan, lease);
    for (int64_t t = b; t < e; t += kFusedTile)
      run_tile(program_, *plan, inputs, outputs, t, std::min(kFusedTile, e - t), st);
  });
}

void fused_elementwise(const FusedProgram& program, const std::vector<const void*>& inputs,
                       const std::vector<Strides>& input_strides, const std::vector<void*>& outputs,
                       const Shape& shape) {
  check_program(program, inputs.size(), input_strides.size());
  if (outputs.size() != program.outputs.size())
    fail<ValueError>("fused_elementwise: {} output buffers for {} outputs", outputs.size(), program.outputs.size());
  FusedKernel(program, input_strides, shape).run(inputs.data(), outputs.data());
}

// ---- fused reduction ---------------------------------------------------------------

namespace {

// The blocked order of cpu::reduce's row reduction (reduce.cpp): rows cut into
// kReduceBlock-element blocks; in a block element i goes to lane i % kLanes, lanes are
// combined by a halving tree; block partials are combined by a pairwise tree.
constexpr int64_t kReduceBlock = 4096;
constexpr int kLanes = 32;

template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<Compute<T>>, Compute<T>, int64_t>;

template <FusedReduceOp Op, typename A>
struct Combine {
  static A identity() {
    if constexpr (Op == FusedReduceOp::Sum)
      return A(0);
    else  // -inf for floats: the max of an all -inf row is -inf
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
  }
  static A apply(A a, A b) {
    if constexpr (Op == FusedReduceOp::Sum) {
      if constexpr (std::is_integral_v<A>)
        return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      else
        return a + b;
    } else {
      return (b > a || b != b) ? b : a;
    }
  }
};

template <FusedReduceOp Op, typename A>
A combine_tree(const A* partials, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return partials[lo];
  int64_t mid = lo + (hi - lo) / 2;
  return Combine<Op, A>::apply(combine_tree<Op>(partials, lo, mid), combine_tree<Op>(partials, mid, hi));
}

// Lane accumulators of the block being reduced; `pos` is the next element's offset in it.
template <FusedReduceOp Op, typename T>
struct BlockState {
  using A = Acc<T>;
  using C = Combine<Op, A>;
  A acc[kLanes];
  int64_t pos = 0;
  void reset() {
    for (auto& a : acc) a = C::identity();
    pos = 0;
  }
  void feed(const T* x, int64_t n) {
    int64_t i = 0;
    for (; i < n && (pos & (kLanes - 1)) != 0; ++i, ++pos)
      acc[pos & (kLanes - 1)] = C::apply(acc[pos & (kLanes - 1)], load(x[i]));
    for (; i + kLanes <= n; i += kLanes, pos += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] = C::apply(acc[j], load(x[i + j]));
    for (; i < n; ++i, ++pos) acc[pos & (kLanes - 1)] = C::apply(acc[pos & (kLanes - 1)], load(x[i]));
  }
  A finish() {
    for (int s = kLanes / 2; s >= 1; s /= 2)
      for (int j = 0; j < s; ++j) acc[j] = C::apply(acc[j], acc[j + s]);
    return acc[0];
  }
  static A load(T v) { return static_cast<A>(detail::load(v)); }
};

template <FusedReduceOp Op, typename T>
void fused_reduce_typed(const FusedProgram& p, const Plan& plan, const void* const* inputs, int64_t rows, int64_t len,
                        T* out) {
  using A = Acc<T>;
  const int reg = p.outputs[0];
  void* const* no_outputs = nullptr;
  if (len == 1) {  // no combining at all (keeps -0.0 like cpu::reduce)
    const ChunkScratch scratch(tile_state_bytes(plan), Scratch::FusedChunks);
    parallel_for(rows, kChunk, [&](int64_t b, int64_t e) {
      ChunkScratch::Lease lease(scratch);
      TileState st(plan, lease);
      for (int64_t t = b; t < e; t += kFusedTile) {
        const int64_t n = std::min(kFusedTile, e - t);
        run_tile(p, plan, inputs, no_outputs, t, n, st);
        const T* x = reinterpret_cast<const T*>(st.ptr[reg]);
        for (int64_t i = 0; i < n; ++i)
          out[t + i] = detail::store<T>(static_cast<Compute<T>>(BlockState<Op, T>::load(x[i])));
      }
    });
    return;
  }
  // Work units are (row, block) pairs in row-major order: a run of units is one
  // contiguous range of elements, computed tile by tile and fed to the blocks in order.
  const int64_t nb = (len + kReduceBlock - 1) / kReduceBlock;
  const int64_t units = rows * nb;
  A* partials = thread_scratch<A>(static_cast<size_t>(units), Scratch::FusedPartials);
  const int64_t grain = std::max<int64_t>(1, kChunk / std::min(len, kReduceBlock));
  const ChunkScratch scratch(tile_state_bytes(plan), Scratch::FusedChunks);
  parallel_for(units, grain, [&](int64_t u0, int64_t u1) {
    ChunkScratch::Lease lease(scratch);
    TileState st(plan, lease);
    BlockState<Op, T> block;
    block.reset();
    auto unit_begin = [&](int64_t u) { return (u / nb) * len + (u % nb) * kReduceBlock; };
    auto unit_size = [&](int64_t u) { return std::min(kReduceBlock, len - (u % nb) * kReduceBlock); };
    const int64_t begin = unit_begin(u0), end = unit_begin(u1 - 1) + unit_size(u1 - 1);
    int64_t u = u0;
    for (int64_t t = begin; t < end; t += kFusedTile) {
      const int64_t n = std::min(kFusedTile, end - t);
      run_tile(p, plan, inputs, no_outputs, t, n, st);
      const T* x = reinterpret_cast<const T*>(st.ptr[reg]);
      for (int64_t i = 0; i < n;) {
        const int64_t m = std::min(n - i, unit_size(u) - block.pos);
        block.feed(x + i, m);  // an output register is never a stride-0 Scalar
        i += m;
        if (block.pos == unit_size(u)) {
          partials[u++] = block.finish();
          block.reset();
        }
      }
    }
  });
  parallel_for(rows, 1024, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      out[r] =
          detail::store<T>(static_cast<Compute<T>>(nb == 1 ? partials[r] : combine_tree<Op>(partials + r * nb, 0, nb)));
  });
}

}  // namespace

void FusedKernel::reduce(const void* const* inputs, FusedReduceOp op, int64_t rows, int64_t len, void* out) const {
  if (program_.outputs.size() != 1)
    fail<ValueError>("fused_reduce: the program must have one output (got {})", program_.outputs.size());
  if (rows < 0 || len < 0 || rows * len != numel(shape_))
    fail<ShapeError>("fused_reduce: {} rows of {} do not cover the shape {}", rows, len, to_string(shape_));
  const int reg = program_.outputs[0];
  const DType dtype = register_dtype(program_, reg);
  if (rows == 0) return;
  if (len == 0) {
    if (op == FusedReduceOp::Max) fail<ValueError>("fused_reduce: max over an empty axis has no identity");
    fill(dtype, 0.0, out, rows);
    return;
  }
  const std::shared_ptr<const FusedPlan> plan = plan_for(inputs, nullptr, /*direct_outputs=*/false);
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      fail<DTypeError>("fused_reduce: cannot reduce bool values (cast them first)");
    } else {
      if (op == FusedReduceOp::Sum)
        fused_reduce_typed<FusedReduceOp::Sum, T>(program_, *plan, inputs, rows, len, static_cast<T*>(out));
      else
        fused_reduce_typed<FusedReduceOp::Max, T>(program_, *plan, inputs, rows, len, static_cast<T*>(out));
    }
  });
}

void fused_reduce(const FusedProgram& program, const std::vector<const void*>& inputs,
                  const std::vector<Strides>& input_strides, const Shape& shape, FusedReduceOp op, int64_t rows,
                  int64_t len, void* out) {
  check_program(program, inputs.size(), input_strides.size());
  FusedKernel(program, input_strides, shape).reduce(inputs.data(), op, rows, len, out);
}

}  // namespace tessera::cpu
