// CUDA evaluation of the elementwise primitives. One mechanism for all of them: a
// Fusion's program, or a one-instruction program for unary / binary / where / convert,
// is lowered to the generator's FusedProgram (kernels/fusion_codegen.h), compiled with
// NVRTC once per distinct signature (kernels/nvrtc_module.h) and launched on the
// context's stream. identity / stop_gradient alias their input; when the executable
// gave them a separate output buffer they copy. A run of converts (the schedule puts a
// step's float32 -> bf16 weight casts together) is one multi-tensor launch
// (kernels/convert_multi_tensor.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/kernels/convert_multi_tensor.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/fusion_codegen.h"
#include "backend/cuda/kernels/launch_config.h"
#include "backend/cuda/kernels/nvrtc_module.h"
#include "tessera/base/error.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/fusion.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;
// Fused reductions (shape-only choices, so results are deterministic):
constexpr int64_t kWarpRowMax = 512;  // rows this short: a warp per row
// Rows longer than kLongRow, when fewer than kFewRows, run as kRowChunk-element chunks
// plus a finishing pass. 4096-element chunks (16 scalar loads a thread): the gradient
// norm's sums of squares of GPT-2's [768, 3072] weights in 576 blocks, not 144 (with
// 16384, ~150 such reductions took 2.2 ms of an H100 step).
constexpr int64_t kLongRow = 8192;
constexpr int64_t kFewRows = 256;
constexpr int64_t kRowChunk = 4096;

// ---- compiled programs ---------------------------------------------------------------

struct CompiledFusion {
  FusionSource source;  // kernel names and launch facts (the text is kept for errors)
  std::shared_ptr<const NvrtcModule> module;
};

// Process-wide: signature (+ the device's architecture) -> compiled kernels. Generating
// and compiling happens outside the map lock, under the entry's own lock.
const CompiledFusion& compiled(const FusedProgram& program, const FusionLayout& layout, const KernelContext& ctx) {
  struct Entry {
    std::mutex mutex;
    std::unique_ptr<CompiledFusion> compiled;
  };
  static std::mutex map_mutex;
  static auto* entries = new std::unordered_map<std::string, std::shared_ptr<Entry>>;  // never destroyed
  std::string key = fusion_signature(program, layout);
  key += "|sm" + std::to_string(ctx.sm_major * 10 + ctx.sm_minor);
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(map_mutex);
    std::shared_ptr<Entry>& slot = (*entries)[key];
    if (!slot) slot = std::make_shared<Entry>();
    entry = slot;
  }
  std::lock_guard<std::mutex> lock(entry->mutex);
  if (!entry->compiled) {
    auto c = std::make_unique<CompiledFusion>();
    c->source = generate_fusion_source(program, layout);
    std::vector<std::string> names;
    for (const std::string& n : c->source.kernels)
      if (!n.empty()) names.push_back(n);
    c->module = compile_module(c->source.source, names);
    entry->compiled = std::move(c);
  }
  return *entry->compiled;
}

unsigned blocks_for(int64_t units, int64_t per_block, const KernelContext& ctx) {
  const int64_t cap = static_cast<int64_t>(ctx.multiprocessors > 0 ? ctx.multiprocessors : 132) * 16;
  return static_cast<unsigned>(std::clamp<int64_t>((units + per_block - 1) / per_block, 1, cap));
}

void launch(const CompiledFusion& c, size_t kernel, std::vector<uint64_t>& args, unsigned blocks,
            const KernelContext& ctx) {
  void* params[] = {args.data()};
  launch_kernel(c.module->kernel(kernel), dim3(blocks), dim3(kThreads), params, 0, ctx.stream);
}

// ---- running a program -------------------------------------------------------------------

void run_program(const FusedProgram& p, const std::vector<DeviceTensor>& inputs,
                 const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  if (inputs.size() != p.inputs.size() || outputs.size() != p.outputs.size())
    fail<ValueError>("fusion: called with {} inputs and {} outputs (the program has {} and {})", inputs.size(),
                     outputs.size(), p.inputs.size(), p.outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].shape != p.inputs[i].shape || inputs[i].dtype != p.inputs[i].dtype)
      fail<ShapeError>("fusion: input {} is {}{} (the program expects {}{})", i, name(inputs[i].dtype),
                       to_string(inputs[i].shape), name(p.inputs[i].dtype), to_string(p.inputs[i].shape));
  for (const FusedInput& in : p.inputs)
    if (broadcast_shapes(in.shape, p.shape, "fusion") != p.shape)
      fail<ShapeError>("fusion: input of shape {} does not broadcast to {}", to_string(in.shape), to_string(p.shape));
  const FusionLayout layout = fusion_layout(p);
  const int64_t out_numel = p.reduce == FusedReduce::None ? layout.numel : layout.rows;
  for (size_t j = 0; j < outputs.size(); ++j)
    if (outputs[j].numel() != out_numel || outputs[j].dtype != p.register_dtype(p.outputs[j]))
      fail<ShapeError>("fusion: output {} is {}{} (the program gives {} elements of {})", j, name(outputs[j].dtype),
                       to_string(outputs[j].shape), out_numel, name(p.register_dtype(p.outputs[j])));
  if (out_numel == 0) return;
  const CompiledFusion& c = compiled(p, layout, ctx);
  std::vector<const void*> in_ptrs;
  for (const DeviceTensor& t : inputs) in_ptrs.push_back(t.data);
  std::vector<void*> out_ptrs;
  for (const DeviceTensor& t : outputs) out_ptrs.push_back(t.data);

  if (p.reduce == FusedReduce::None) {
    // The vector kernel needs every non-scalar pointer aligned to its vector access.
    const int vec = c.source.vector_width;
    bool use_vec = vec > 0;
    for (size_t i = 0; i < inputs.size() && use_vec; ++i)
      if (layout.kinds[i] != FusedInputKind::Scalar)
        use_vec = aligned_to(inputs[i].data, vec * static_cast<int>(itemsize(inputs[i].dtype)));
    for (size_t j = 0; j < outputs.size() && use_vec; ++j)
      use_vec = aligned_to(outputs[j].data, vec * static_cast<int>(itemsize(outputs[j].dtype)));
    std::vector<uint64_t> args = pack_fusion_args(p, layout, in_ptrs.data(), out_ptrs.data(), nullptr, layout.len, 1);
    if (use_vec)
      launch(c, kFusedMapVec, args, blocks_for(layout.numel, int64_t{kThreads} * vec, ctx), ctx);
    else
      launch(c, kFusedMap, args, blocks_for(layout.numel, kThreads, ctx), ctx);
    return;
  }

  // Fused reduction over [rows, len]: a warp per short row; a block per row otherwise;
  // few long rows are cut into chunks whose partials a second kernel combines in order.
  const int64_t rows = layout.rows, len = layout.len;
  if (len <= kWarpRowMax) {
    std::vector<uint64_t> args = pack_fusion_args(p, layout, in_ptrs.data(), out_ptrs.data(), nullptr, len, 1);
    launch(c, kFusedWarps, args, blocks_for(rows, kThreads / 32, ctx), ctx);
    return;
  }
  const int64_t chunks = rows < kFewRows && len > kLongRow ? (len + kRowChunk - 1) / kRowChunk : 1;
  const int64_t chunk_len = chunks > 1 ? kRowChunk : len;
  void* partial = nullptr;
  if (chunks > 1) {
    if (!ctx.scratch) fail<Error>("fusion: a chunked reduction needs scratch and the context has none");
    partial = ctx.scratch(static_cast<size_t>(rows * chunks) * c.source.accumulator_bytes);
  }
  std::vector<uint64_t> args = pack_fusion_args(p, layout, in_ptrs.data(), out_ptrs.data(), partial, chunk_len, chunks);
  launch(c, kFusedRows, args, blocks_for(rows * chunks, 1, ctx), ctx);
  if (chunks > 1) launch(c, kFusedFinish, args, blocks_for(rows, kThreads / 32, ctx), ctx);
}

// ---- primitives as programs ------------------------------------------------------------------

void check_counts(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, size_t n_in) {
  if (inputs.size() != n_in || outputs.size() != 1)
    fail<ValueError>("{}: called with {} inputs and {} outputs (expected {} and 1)", primitive.name(), inputs.size(),
                     outputs.size(), n_in);
}

// A one-instruction program over the output's shape.
FusedProgram single(const std::vector<DeviceTensor>& inputs, const DeviceTensor& out, FusedInstruction::Kind kind,
                    int op, DType dtype) {
  FusedProgram p;
  p.shape = out.shape;
  std::vector<int> args;
  for (const DeviceTensor& t : inputs) {
    args.push_back(static_cast<int>(p.inputs.size()));
    p.inputs.push_back({t.shape, t.dtype});
  }
  p.body.push_back({kind, op, dtype, std::move(args)});
  p.outputs = {static_cast<int>(p.inputs.size())};
  return p;
}

void unary_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const UnaryKind kind = primitive_as<Unary>(primitive, "unary").kind();
  check_counts(primitive, inputs, outputs, 1);
  const DType dtype = kind == UnaryKind::LogicalNot ? DType::Bool : inputs[0].dtype;
  run_program(single(inputs, outputs[0], FusedInstruction::Kind::Unary, static_cast<int>(kind), dtype), inputs, outputs,
              ctx);
}

void binary_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                   const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  const BinaryKind kind = primitive_as<Binary>(primitive, "binary").kind();
  check_counts(primitive, inputs, outputs, 2);
  if (inputs[0].dtype != inputs[1].dtype)
    fail<DTypeError>("{}: operands must have one dtype (got {} and {})", primitive.name(), name(inputs[0].dtype),
                     name(inputs[1].dtype));
  const bool bool_result = kind >= BinaryKind::Equal && kind <= BinaryKind::LogicalOr;
  run_program(single(inputs, outputs[0], FusedInstruction::Kind::Binary, static_cast<int>(kind),
                     bool_result ? DType::Bool : inputs[0].dtype),
              inputs, outputs, ctx);
}

void where_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  check_counts(primitive, inputs, outputs, 3);
  if (inputs[0].dtype != DType::Bool || inputs[1].dtype != inputs[2].dtype)
    fail<DTypeError>("where: needs a bool condition and one value dtype (got {}, {}, {})", name(inputs[0].dtype),
                     name(inputs[1].dtype), name(inputs[2].dtype));
  run_program(single(inputs, outputs[0], FusedInstruction::Kind::Where, 0, inputs[1].dtype), inputs, outputs, ctx);
}

void convert_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                    const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  primitive_as<Cast>(primitive, "convert");
  check_counts(primitive, inputs, outputs, 1);
  run_program(single(inputs, outputs[0], FusedInstruction::Kind::Convert, 0, outputs[0].dtype), inputs, outputs, ctx);
}

// A run of equivalent converts (one target dtype): the float32 sources in one
// multi-tensor launch, then the others one by one in their order (one may read a
// converted value, never the other way round: only those have the target dtype).
void convert_group_kernel(const Primitive& primitive, const std::vector<std::vector<DeviceTensor>>& inputs,
                          const std::vector<std::vector<DeviceTensor>>& outputs, KernelContext& ctx) {
  std::vector<ConvertTensor> from_f32;
  std::vector<size_t> from_f32_at, others;
  for (size_t t = 0; t < inputs.size(); ++t) {
    check_counts(primitive, inputs[t], outputs[t], 1);
    const DeviceTensor &in = inputs[t][0], &out = outputs[t][0];
    if (in.numel() != out.numel())
      fail<ShapeError>("convert: output {} for input {}", to_string(out.shape), to_string(in.shape));
    if (in.dtype == DType::Float32 && in.data != out.data) {
      from_f32.push_back({in.data, out.data, in.numel()});
      from_f32_at.push_back(t);
    } else {
      others.push_back(t);
    }
  }
  if (!from_f32.empty() && !convert_multi_tensor(DType::Float32, outputs[0][0].dtype, from_f32, ctx.stream)) {
    others.insert(others.end(), from_f32_at.begin(), from_f32_at.end());  // a pair it does not take
    std::sort(others.begin(), others.end());
  }
  for (size_t t : others) convert_kernel(primitive, inputs[t], outputs[t], ctx);
}

FusedProgram lower(const FusionProgram& f) {
  FusedProgram p;
  p.shape = f.shape;
  for (const FusionInput& in : f.inputs) p.inputs.push_back({in.shape, in.dtype});
  for (const FusionInstruction& in : f.body) {
    FusedInstruction::Kind kind = FusedInstruction::Kind::Unary;
    switch (in.kind) {
      case FusionInstruction::Kind::Unary:
        kind = FusedInstruction::Kind::Unary;
        break;
      case FusionInstruction::Kind::Binary:
        kind = FusedInstruction::Kind::Binary;
        break;
      case FusionInstruction::Kind::Where:
        kind = FusedInstruction::Kind::Where;
        break;
      case FusionInstruction::Kind::Convert:
        kind = FusedInstruction::Kind::Convert;
        break;
    }
    p.body.push_back({kind, in.op, in.dtype, in.args});
  }
  p.outputs = f.outputs;
  if (f.reduce) {
    if (*f.reduce != ReduceKind::Sum && *f.reduce != ReduceKind::Max)
      fail<ValueError>("fusion: a fused reduction is a sum or a max");
    p.reduce = *f.reduce == ReduceKind::Sum ? FusedReduce::Sum : FusedReduce::Max;
    p.reduce_axes = static_cast<int>(f.reduce_axes.size());  // trailing (FusionProgram::validate)
  }
  return p;
}

void fusion_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                   const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  run_program(lower(primitive_as<Fusion>(primitive, "fusion").program()), inputs, outputs, ctx);
}

// identity / stop_gradient: the executable normally makes the output a view of the
// input (Primitive::aliases_input); a separate buffer gets a device-to-device copy.
void alias_kernel(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs, KernelContext& ctx) {
  check_counts(primitive, inputs, outputs, 1);
  const DeviceTensor &in = inputs[0], &out = outputs[0];
  if (in.nbytes() != out.nbytes() || in.dtype != out.dtype)
    fail<ShapeError>("{}: output {}{} does not match input {}{}", primitive.name(), name(out.dtype),
                     to_string(out.shape), name(in.dtype), to_string(in.shape));
  if (out.data != in.data && out.nbytes() > 0)
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, out.nbytes(), cudaMemcpyDeviceToDevice, ctx.stream));
}

}  // namespace

void register_elementwise_kernels() {
  for (int k = 0; k < kNumUnaryKinds; ++k) register_kernel(unary_name(static_cast<UnaryKind>(k)), unary_kernel);
  for (int k = 0; k < kNumBinaryKinds; ++k) register_kernel(binary_name(static_cast<BinaryKind>(k)), binary_kernel);
  register_kernel("where", where_kernel);
  register_kernel("convert", convert_kernel);
  register_group_kernel("convert", convert_group_kernel, 1);  // no shared inputs
  register_kernel("fusion", fusion_kernel);
  register_kernel("identity", alias_kernel);
  register_kernel("stop_gradient", alias_kernel);
}

}  // namespace tessera::cuda
