// Fusion program -> CUDA C++ source, part 2 of 3 (the others: fusion_codegen_ops.cpp,
// fusion_codegen_reduce.cpp; shared declarations in fusion_codegen_detail.h). This file
// holds the public API (fusion_codegen.h) and assembles the text, in four parts:
//   1. kPrelude (fusion_codegen_ops.cpp): fixed helpers;
//   2. `Args`, the kernels' one parameter: pointers, sizes, collapsed dims, strides;
//   3. ts_body (the instructions on registers) and ts_element (loads through each
//      input's layout, then ts_body);
//   4. the kernels: map (+ map_vec) for elementwise programs (here); rows, warps and
//      finish for fused reductions (fusion_codegen_reduce.cpp).
#include "backend/cuda/kernels/fusion_codegen.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda/kernels/fusion_codegen_detail.h"
#include "tessera/base/error.h"

namespace tessera::cuda {

// Declarations "T0 o0; T1 o1;" of the outputs (shared with fusion_codegen_reduce.cpp).
std::string detail::output_decls(const FusedProgram& p) {
  std::string s;
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format("{} o{}; ", register_type(p.register_dtype(p.outputs[j])), j);
  return s;
}

namespace {

using detail::accumulator_type;
using detail::append_reduce_kernels;
using detail::binary_code;
using detail::convert_code;
using detail::kPrelude;
using detail::load_expr;
using detail::output_decls;
using detail::register_type;
using detail::result_expr;
using detail::storage_type;
using detail::store_expr;
using detail::unary_code;

// ---- the generated part -------------------------------------------------------------

std::string reg(int r) { return "r" + std::to_string(r); }

// "a, b" from two comma-separated lists either of which may be empty.
std::string join_args(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + ", " + b;
}

bool vectorizable(const FusedProgram& p, const FusionLayout& layout) {
  if (p.reduce != FusedReduce::None) return false;
  return std::none_of(layout.kinds.begin(), layout.kinds.end(),
                      [](FusedInputKind k) { return k == FusedInputKind::Strided; });
}

// Elements per vector access: 16 bytes of the widest non-scalar operand, at most 8.
int vector_width(const FusedProgram& p, const FusionLayout& layout) {
  size_t widest = 1;
  for (size_t i = 0; i < p.inputs.size(); ++i)
    if (layout.kinds[i] != FusedInputKind::Scalar) widest = std::max(widest, itemsize(p.inputs[i].dtype));
  for (int r : p.outputs) widest = std::max(widest, itemsize(p.register_dtype(r)));
  return static_cast<int>(std::min<size_t>(8, 16 / widest));
}

void append_args_struct(std::string& s, const FusedProgram& p, const FusionLayout& layout) {
  const int rank = static_cast<int>(layout.dims.size()), ns = layout.num_strided();
  s += "\n// ---- the kernels' parameter (every field 8 bytes: see pack_fusion_args) ----\nstruct Args {\n";
  for (size_t i = 0; i < p.inputs.size(); ++i)
    s += fmt::format("  const {}* in{};\n", storage_type(p.inputs[i].dtype), i);
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format("  {}* out{};\n", storage_type(p.register_dtype(p.outputs[j])), j);
  s += "  void* partial;     // reduction chunk partials\n";
  s += "  long long n;       // elements of the domain\n";
  s += "  long long rows, len, chunk_len, chunks;  // reduction: domain = [rows, len]\n";
  if (ns > 0) {
    s += fmt::format("  long long dims[{}];      // collapsed domain, row-major\n", rank);
    s += fmt::format("  long long st[{}][{}];    // strides of the strided inputs over dims\n", ns, rank);
  }
  const size_t slots = p.inputs.size() + p.outputs.size() + 6 + static_cast<size_t>(ns > 0 ? rank * (1 + ns) : 0);
  s += fmt::format("}};\nstatic_assert(sizeof(Args) == {}, \"Args layout\");\n", 8 * slots);
}

// ts_body: the instructions, from the input registers to the output registers.
void append_body(std::string& s, const FusedProgram& p) {
  const int n_in = static_cast<int>(p.inputs.size());
  s += "\n// ---- the program ----\n__device__ __forceinline__ void ts_body(";
  for (int i = 0; i < n_in; ++i)
    s += fmt::format("{}const {} {}", i ? ", " : "", register_type(p.inputs[i].dtype), reg(i));
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format("{}{}& o{}", n_in + j ? ", " : "", register_type(p.register_dtype(p.outputs[j])), j);
  s += ") {\n";
  for (size_t k = 0; k < p.body.size(); ++k) {
    const FusedInstruction& in = p.body[k];
    const int self = n_in + static_cast<int>(k);
    const DType arg_dtype = p.register_dtype(in.args.at(0));
    for (int a : in.args)
      if (a >= self) fail<ValueError>("fusion codegen: instruction t{} reads register {} before it is defined", k, a);
    const int last_op = in.kind == FusedInstruction::Kind::Unary    ? kNumUnaryKinds - 1
                        : in.kind == FusedInstruction::Kind::Binary ? kNumBinaryKinds - 1
                                                                    : 0;
    if (in.op < 0 || in.op > last_op) fail<ValueError>("fusion codegen: instruction t{} has op {}", k, in.op);
    std::string value;
    switch (in.kind) {
      case FusedInstruction::Kind::Unary:
        value = unary_code(static_cast<FusedUnary>(in.op), arg_dtype, reg(in.args[0]));
        break;
      case FusedInstruction::Kind::Binary:
        value = binary_code(static_cast<FusedBinary>(in.op), arg_dtype, reg(in.args[0]), reg(in.args.at(1)));
        break;
      case FusedInstruction::Kind::Where:
        value = fmt::format("({} ? {} : {})", reg(in.args[0]), reg(in.args.at(1)), reg(in.args.at(2)));
        break;
      case FusedInstruction::Kind::Convert:
        value = convert_code(arg_dtype, in.dtype, reg(in.args[0]));
        break;
    }
    // Where and Convert produce exact values of the dtype already; ops round here.
    const bool exact = in.kind == FusedInstruction::Kind::Where || in.kind == FusedInstruction::Kind::Convert;
    s += fmt::format("  const {} {} = {};\n", register_type(in.dtype), reg(self),
                     exact ? value : result_expr(in.dtype, value));
  }
  for (size_t j = 0; j < p.outputs.size(); ++j) s += fmt::format("  o{} = {};\n", j, reg(p.outputs[j]));
  s += "}\n";
}

// ts_offsets: the strided inputs' element offsets of flat domain index i.
void append_offsets(std::string& s, const FusionLayout& layout) {
  const int rank = static_cast<int>(layout.dims.size()), ns = layout.num_strided();
  if (ns == 0) return;
  s += fmt::format(
      "\n// Offsets of the strided inputs at flat domain index i (I: 32-bit when the domain fits).\n"
      "template <typename I>\n__device__ __forceinline__ void ts_offsets(const Args& a, I i, I (&off)[{}]) {{\n"
      "  I rem = i;\n",
      ns);
  for (int d = rank - 1; d >= 0; --d) {
    if (d > 0) {
      s += fmt::format("  {{\n    const I dim = (I)a.dims[{0}], c = rem % dim;\n    rem /= dim;\n", d);
    } else {
      s += "  {\n    const I c = rem;\n";
    }
    for (int k = 0; k < ns; ++k) s += fmt::format("    off[{0}] += c * (I)a.st[{0}][{1}];\n", k, d);
    s += "  }\n";
  }
  s += "}\n";
}

std::string output_args(const FusedProgram& p);

// ts_element: loads every input at flat index i and runs the body.
void append_element(std::string& s, const FusedProgram& p, const FusionLayout& layout) {
  const int ns = layout.num_strided();
  s += "\ntemplate <typename I>\n__device__ __forceinline__ void ts_element(const Args& a, I i";
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format(", {}& o{}", register_type(p.register_dtype(p.outputs[j])), j);
  s += ") {\n";
  if (ns > 0) {
    s += fmt::format("  I off[{}] = {{}};\n  ts_offsets<I>(a, i, off);\n", ns);
  }
  std::string operands;
  int strided = 0;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    std::string at;
    switch (layout.kinds[i]) {
      case FusedInputKind::Scalar:
        at = "0";
        break;
      case FusedInputKind::Contiguous:
        at = "i";
        break;
      case FusedInputKind::Strided:
        at = fmt::format("off[{}]", strided++);
        break;
    }
    operands = join_args(operands, load_expr(p.inputs[i].dtype, fmt::format("a.in{}[{}]", i, at)));
  }
  s += "  ts_body(" + join_args(operands, output_args(p)) + ");\n}\n";
}

// "o0, o1": the output registers as call arguments.
std::string output_args(const FusedProgram& p) {
  std::string s;
  for (size_t j = 0; j < p.outputs.size(); ++j) s = join_args(s, fmt::format("o{}", j));
  return s;
}
std::string output_stores(const FusedProgram& p, const std::string& at) {
  std::string s;
  for (size_t j = 0; j < p.outputs.size(); ++j)
    s += fmt::format(" a.out{}[{}] = {};", j, at, store_expr(p.register_dtype(p.outputs[j]), fmt::format("o{}", j)));
  return s;
}

constexpr const char* kGridStride =
    "  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;\n";

void append_map_kernels(std::string& s, const FusedProgram& p, const FusionLayout& layout, int vec) {
  s += fmt::format(
      "\n// ---- elementwise: one element per thread, grid-stride ----\n"
      "template <typename I>\n__device__ __forceinline__ void ts_map(const Args& a, I first, I n, I step) {{\n"
      "  for (I i = first; i < n; i += step) {{\n"
      "    {}\n    ts_element<I>(a, i, {});\n   {}\n  }}\n}}\n"
      "extern \"C\" __global__ void __launch_bounds__(256) @NAME@(const Args a) {{\n{}"
      "  const unsigned long long n = (unsigned long long)a.n;\n"
      "  if (n + step <= 0xffffffffull)\n"
      "    ts_map<unsigned int>(a, (unsigned int)first, (unsigned int)n, (unsigned int)step);\n"
      "  else\n"
      "    ts_map<unsigned long long>(a, first, n, step);\n"
      "}}\n",
      output_decls(p), output_args(p), output_stores(p, "i"), kGridStride);
  if (vec == 0) return;
  // Vector kernel: every non-scalar operand is contiguous, so element j of a pack is
  // flat index i0 + j everywhere; scalars are loaded per element (cached broadcasts).
  std::string loads, operands, stores;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const DType d = p.inputs[i].dtype;
    if (layout.kinds[i] == FusedInputKind::Scalar) {
      operands = join_args(operands, load_expr(d, fmt::format("a.in{}[0]", i)));
    } else {
      loads +=
          fmt::format("    const ts_pack<{0}, {1}> p{2} = *reinterpret_cast<const ts_pack<{0}, {1}>*>(a.in{2} + i0);\n",
                      storage_type(d), vec, i);
      operands = join_args(operands, load_expr(d, fmt::format("p{}.v[j]", i)));
    }
  }
  std::string packs, pack_stores, assigns;
  for (size_t j = 0; j < p.outputs.size(); ++j) {
    const DType d = p.register_dtype(p.outputs[j]);
    packs += fmt::format("    ts_pack<{}, {}> q{};\n", storage_type(d), vec, j);
    assigns += fmt::format(" q{0}.v[j] = {1};", j, store_expr(d, fmt::format("o{}", j)));
    pack_stores +=
        fmt::format("    *reinterpret_cast<ts_pack<{0}, {1}>*>(a.out{2} + i0) = q{2};\n", storage_type(d), vec, j);
  }
  s += fmt::format(
      "\n// ---- elementwise, {0} elements per thread (aligned contiguous operands) ----\n"
      "extern \"C\" __global__ void __launch_bounds__(256) @NAME@_vec(const Args a) {{\n{1}"
      "  const unsigned long long n = (unsigned long long)a.n, packs = n / {0};\n"
      "  for (unsigned long long v = first; v < packs; v += step) {{\n"
      "    const unsigned long long i0 = v * {0};\n{2}{3}"
      "#pragma unroll\n"
      "    for (int j = 0; j < {0}; ++j) {{\n"
      "      {4}\n      ts_body({5});\n     {7}\n    }}\n{8}"
      "  }}\n"
      "  for (unsigned long long i = packs * {0} + first; i < n; i += step) {{  // the tail\n"
      "    {4}\n    ts_element<unsigned long long>(a, i, {6});\n   {9}\n  }}\n"
      "}}\n",
      vec, kGridStride, loads, packs, output_decls(p), join_args(operands, output_args(p)), output_args(p), assigns,
      pack_stores, output_stores(p, "i"));
}

const char* kind_code(FusedInputKind k) {
  switch (k) {
    case FusedInputKind::Scalar:
      return "S";
    case FusedInputKind::Contiguous:
      return "C";
    case FusedInputKind::Strided:
      return "X";
  }
  return "?";
}

// FNV-1a, 64 bits: a stable hash (std::hash may differ between libraries).
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

}  // namespace

DType FusedProgram::register_dtype(int r) const {
  const int n_in = static_cast<int>(inputs.size());
  if (r < 0 || r >= n_in + static_cast<int>(body.size()))
    fail<ValueError>("fusion codegen: register {} out of range (the program has {})", r, n_in + body.size());
  return r < n_in ? inputs[r].dtype : body[r - n_in].dtype;
}

int FusionLayout::num_strided() const {
  return static_cast<int>(std::count(kinds.begin(), kinds.end(), FusedInputKind::Strided));
}

FusionLayout fusion_layout(const FusedProgram& p) {
  FusionLayout layout;
  const Shape& shape = p.shape;
  layout.numel = numel(shape, "fusion");
  if (p.reduce_axes < 0 || p.reduce_axes > static_cast<int>(shape.size()) ||
      (p.reduce == FusedReduce::None && p.reduce_axes != 0))
    fail<ValueError>("fusion codegen: {} reduce axes for a domain of rank {}", p.reduce_axes, shape.size());
  const size_t out_rank = shape.size() - static_cast<size_t>(p.reduce_axes);
  layout.rows = 1;
  layout.len = 1;
  for (size_t d = 0; d < shape.size(); ++d) (d < out_rank ? layout.rows : layout.len) *= shape[d];
  const Strides dense = contiguous_strides(shape);
  std::vector<Strides> full;  // broadcast strides over the uncollapsed domain
  for (const FusedInput& in : p.inputs) {
    Strides st = broadcast_strides(in.shape, shape);
    FusedInputKind kind = FusedInputKind::Strided;
    if (numel(in.shape, "fusion") == 1) {
      kind = FusedInputKind::Scalar;
    } else {
      bool contiguous = true;
      for (size_t d = 0; d < shape.size(); ++d) contiguous = contiguous && (shape[d] == 1 || st[d] == dense[d]);
      if (contiguous) kind = FusedInputKind::Contiguous;
    }
    layout.kinds.push_back(kind);
    full.push_back(kind == FusedInputKind::Strided ? std::move(st) : Strides{});
  }
  layout.strides.resize(p.inputs.size());
  if (layout.num_strided() == 0) return layout;
  // Collapse: drop size-1 dims; merge dim d into the previous kept dim when every
  // strided input steps over it contiguously (stride[prev] == stride[d] * size[d]).
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !layout.dims.empty();
    for (size_t i = 0; i < p.inputs.size() && merge; ++i)
      if (layout.kinds[i] == FusedInputKind::Strided) merge = layout.strides[i].back() == full[i][d] * shape[d];
    if (merge) {
      layout.dims.back() *= shape[d];
      for (size_t i = 0; i < p.inputs.size(); ++i)
        if (layout.kinds[i] == FusedInputKind::Strided) layout.strides[i].back() = full[i][d];
    } else {
      layout.dims.push_back(shape[d]);
      for (size_t i = 0; i < p.inputs.size(); ++i)
        if (layout.kinds[i] == FusedInputKind::Strided) layout.strides[i].push_back(full[i][d]);
    }
  }
  return layout;
}

std::string fusion_signature(const FusedProgram& p, const FusionLayout& layout) {
  std::string s;
  s.reserve(64 + 16 * p.body.size());
  for (size_t i = 0; i < p.inputs.size(); ++i) (s += short_name(p.inputs[i].dtype)) += kind_code(layout.kinds[i]);
  s += '|';
  for (const FusedInstruction& in : p.body) {
    s += fmt::format("{}{}{}", static_cast<int>(in.kind), in.op, short_name(in.dtype));
    for (int a : in.args) s += fmt::format(",{}", a);
    s += ';';
  }
  s += '|';
  for (int r : p.outputs) s += fmt::format("{},", r);
  s += fmt::format("|R{}|{}", layout.dims.size(), static_cast<int>(p.reduce));
  return s;
}

FusionSource generate_fusion_source(const FusedProgram& p, const FusionLayout& layout) {
  if (layout.kinds.size() != p.inputs.size())
    fail<ValueError>("fusion codegen: layout has {} inputs (the program has {})", layout.kinds.size(), p.inputs.size());
  if (p.outputs.empty()) fail<ValueError>("fusion codegen: the program has no outputs");
  FusionSource out;
  std::string s = kPrelude;
  append_args_struct(s, p, layout);
  append_body(s, p);
  append_offsets(s, layout);
  append_element(s, p, layout);
  if (p.reduce != FusedReduce::None) {
    if (p.outputs.size() != 1) fail<ValueError>("fusion codegen: a fused reduction has one output");
    append_reduce_kernels(s, p);
    const std::string acc = accumulator_type(p.register_dtype(p.outputs[0]));
    out.accumulator_bytes = acc == "float" ? 4 : 8;
  } else {
    out.vector_width = vectorizable(p, layout) ? vector_width(p, layout) : 0;
    append_map_kernels(s, p, layout, out.vector_width);
  }
  const std::string name = fmt::format("tessera_fused_{:016x}", fnv1a(s));
  replace_all(s, "@NAME@", name);
  if (p.reduce != FusedReduce::None) {
    out.kernels = {name + "_rows", name + "_warps", name + "_finish"};
  } else {
    out.kernels = {name, out.vector_width > 0 ? name + "_vec" : std::string()};
  }
  out.source = std::move(s);
  return out;
}

std::vector<uint64_t> pack_fusion_args(const FusedProgram& p, const FusionLayout& layout, const void* const* inputs,
                                       void* const* outputs, void* partial, int64_t chunk_len, int64_t chunks) {
  std::vector<uint64_t> slots;
  auto ptr = [](const void* q) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(q)); };
  auto num = [](int64_t v) { return static_cast<uint64_t>(v); };
  for (size_t i = 0; i < p.inputs.size(); ++i) slots.push_back(ptr(inputs[i]));
  for (size_t j = 0; j < p.outputs.size(); ++j) slots.push_back(ptr(outputs[j]));
  slots.push_back(ptr(partial));
  for (int64_t v : {layout.numel, layout.rows, layout.len, chunk_len, chunks}) slots.push_back(num(v));
  if (layout.num_strided() > 0) {
    for (int64_t d : layout.dims) slots.push_back(num(d));
    for (size_t i = 0; i < p.inputs.size(); ++i)
      if (layout.kinds[i] == FusedInputKind::Strided)
        for (int64_t st : layout.strides[i]) slots.push_back(num(st));
  }
  return slots;
}

}  // namespace tessera::cuda
