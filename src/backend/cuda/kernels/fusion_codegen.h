// CUDA source for a fusion program (ir/primitives/fusion.h): one generated kernel per
// program that computes every output element in registers, compiled with NVRTC
// (nvrtc_module.h). Standalone elementwise primitives (unary, binary, where,
// convert) are one-instruction programs and take the same path.
//
// Semantics are the CPU kernels' (backend/cpu/kernels/elementwise_*.cpp,
// tessera/base/dtype.h): an instruction computes in its dtype's compute type
// (float32 for float32/bfloat16/float16, float64, or the integer itself) and a
// bfloat16/float16 result is rounded to its storage type (round to nearest even)
// right where the CPU stores it; integer arithmetic wraps, x / 0 = 0 for integers;
// float -> integer truncates, saturates and sends NaN to 0; to bfloat16/float16 is one
// correct rounding from the exact source value. Transcendentals use CUDA's libdevice
// functions (not the CPU's AVX2 polynomials): results agree to ~1 ulp, not bitwise.
//
// What a generated source depends on (and so what the NVRTC cache is keyed by): the
// body, the dtypes, the reduction kind, how each input is read (scalar, contiguous,
// strided) and the number of collapsed dims the strided inputs need. Sizes and
// strides are kernel arguments, so one compiled kernel serves every shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/op_list.h"
#include "tessera/base/shape.h"

namespace tessera::cuda {

// Op codes: the op lists of base/op_list.h (the IR's kinds).
using FusedUnary = UnaryKind;
using FusedBinary = BinaryKind;

// A fusion program as the generator reads it: ir/primitives/fusion.h's FusionProgram
// (registers in0..in{N-1}, then one per instruction; every instruction's result
// dtype given), without the dependency on the IR headers.
struct FusedInstruction {
  enum class Kind : uint8_t { Unary, Binary, Where, Convert };
  Kind kind = Kind::Unary;
  int op = 0;                    // FusedUnary / FusedBinary value
  DType dtype = DType::Float32;  // result dtype (Convert: the target)
  std::vector<int> args;         // registers
};

struct FusedInput {
  Shape shape;  // broadcasts (numpy rules) to the program's shape
  DType dtype = DType::Float32;
};

enum class FusedReduce : uint8_t { None, Sum, Max };

struct FusedProgram {
  Shape shape;  // the elementwise domain
  std::vector<FusedInput> inputs;
  std::vector<FusedInstruction> body;
  std::vector<int> outputs;                // registers
  FusedReduce reduce = FusedReduce::None;  // Sum / Max: the one output is reduced
  int reduce_axes = 0;                     // ... over this many trailing axes of `shape`

  DType register_dtype(int reg) const;  // throws ValueError out of range
};

// How a kernel reads one input: one element for every output element (Scalar), the
// element at the output's flat index (Contiguous: the input has the domain's shape
// up to size-1 dims), or through broadcast strides over the collapsed domain (Strided).
enum class FusedInputKind : uint8_t { Scalar, Contiguous, Strided };

// A program's inputs over its domain (program.shape). The domain is collapsed for the
// strided inputs: size-1 dims dropped, neighbours merged where every strided input
// walks them as one dim.
struct FusionLayout {
  std::vector<FusedInputKind> kinds;  // per input
  Shape dims;                         // collapsed domain (empty when no input is Strided)
  std::vector<Strides> strides;       // per input: element strides over `dims` (Strided inputs only)
  int64_t numel = 0;                  // elements of the domain
  int64_t rows = 0, len = 0;          // fused reduction: the domain as [rows, len] (len: the reduced axes)
  int num_strided() const;
};

FusionLayout fusion_layout(const FusedProgram& program);

// Indices into FusionSource::kernels. Elementwise programs:
inline constexpr size_t kFusedMap = 0;     // any layout: one element per thread, grid-stride
inline constexpr size_t kFusedMapVec = 1;  // vector_width elements per thread ("" when not generated)
// Fused reductions:
inline constexpr size_t kFusedRows = 0;    // a 256-thread block per (row, chunk of chunk_len elements)
inline constexpr size_t kFusedWarps = 1;   // a warp per row (chunks must be 1)
inline constexpr size_t kFusedFinish = 2;  // a warp per row combining the rows kernel's chunk partials

struct FusionSource {
  std::string source;
  std::vector<std::string> kernels;  // extern "C" names (see FusedKernelIndex)
  // The vector kernel reads and writes vector_width consecutive elements per access;
  // every non-scalar input and output pointer must be aligned to vector_width * its
  // itemsize. 0 when there is no vector kernel (a strided input, or a reduction).
  int vector_width = 0;
  size_t accumulator_bytes = 0;  // reduction: bytes of one chunk partial (float, double or int64)
};

// A short text that determines generate_fusion_source's result (a cache key).
std::string fusion_signature(const FusedProgram& program, const FusionLayout& layout);

// The kernels' source. Deterministic: the same program and layout kinds give the same
// text and kernel names (tessera_fused_<hash of the text>). Throws DTypeError for an
// op the CPU backend does not define on a dtype (e.g. exp on int32).
FusionSource generate_fusion_source(const FusedProgram& program, const FusionLayout& layout);

// The bytes of the kernels' single `Args` parameter: the input and output pointers,
// `partial` (the reduction's chunk partials, or null), the sizes and the strides.
// For reductions chunk_len is the elements of a row per rows-kernel block and chunks
// = ceil(len / chunk_len) (chunk_len = len, chunks = 1 when there are no partials).
std::vector<uint64_t> pack_fusion_args(const FusedProgram& program, const FusionLayout& layout,
                                       const void* const* inputs, void* const* outputs, void* partial,
                                       int64_t chunk_len, int64_t chunks);

}  // namespace tessera::cuda
