// Builders, attributes, vjp and cost of expert_dispatch / expert_combine
// (ir/primitives/expert_dispatch.h).
#include "tessera/ir/primitives/expert_dispatch.h"

#include <fmt/format.h>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera {

namespace {

void check_sizes(const char* op, const Array& sizes, int64_t groups, int64_t shards) {
  if (sizes.dtype() != DType::Int32 && sizes.dtype() != DType::Int64)
    fail<DTypeError>("{}: expert sizes of dtype {} (expected int32 or int64)", op, name(sizes.dtype()));
  if (sizes.ndim() != 2 || sizes.shape(0) != groups)
    fail<ShapeError>("{}: expert sizes {} (expected [{}, experts]: one row per routing group)", op,
                     to_string(sizes.shape()), groups);
  if (sizes.shape(1) % shards != 0)
    fail<ShapeError>("{}: {} experts do not split into {} equal expert shards", op, sizes.shape(1), shards);
}

}  // namespace

std::string axis_list_text(const std::vector<std::string>& axes) {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + axes[i];
  return s + "]";
}

std::vector<std::string> parse_axis_list(const std::string& text, const std::string& op) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']')
    fail<ValueError>("{}: attribute axes = '{}' is not a list of mesh axes (expected e.g. [expert])", op, text);
  std::vector<std::string> axes;
  std::string item;
  for (size_t i = 1; i + 1 < text.size(); ++i) {
    const char c = text[i];
    if (c == ',') {
      axes.push_back(item);
      item.clear();
    } else if (c != ' ') {
      item += c;
    }
  }
  if (!item.empty()) axes.push_back(item);
  for (const std::string& a : axes)
    if (a.empty()) fail<ValueError>("{}: attribute axes = '{}' has an empty axis name", op, text);
  return axes;
}

std::string ExpertDispatch::attributes() const {
  return fmt::format("shards={}, axes={}", shards_, axis_list_text(axes_));
}

Array expert_dispatch(const Array& x, const Array& sizes, int64_t shards, const std::vector<std::string>& axes) {
  if (shards < 1) fail<ValueError>("expert_dispatch: {} expert shards (expected >= 1)", shards);
  if (x.ndim() != 3) fail<ShapeError>("expert_dispatch: x {} (expected [groups, rows, width])", to_string(x.shape()));
  check_sizes("expert_dispatch", sizes, x.shape(0), shards);
  return Array::make({shards, x.shape(0), x.shape(1), x.shape(2)}, x.dtype(),
                     std::make_shared<ExpertDispatch>(false, shards, axes), {x, sizes});
}

Array expert_combine(const Array& y, const Array& sizes, const std::vector<std::string>& axes) {
  if (y.ndim() != 4)
    fail<ShapeError>("expert_combine: y {} (expected [shards, groups, rows, width])", to_string(y.shape()));
  check_sizes("expert_combine", sizes, y.shape(1), y.shape(0));
  return Array::make({y.shape(1), y.shape(2), y.shape(3)}, y.dtype(),
                     std::make_shared<ExpertDispatch>(true, y.shape(0), axes), {y, sizes});
}

// Each is the other's transpose: the same rows moved the other way.
std::vector<Array> ExpertDispatch::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                       const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& sizes = primals[1];
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0)
      result.push_back(combine_ ? expert_dispatch(cotangents[0], sizes, shards_, axes_)
                                : expert_combine(cotangents[0], sizes, axes_));
    else
      result.push_back(zeros(sizes.shape(), sizes.dtype()));
  }
  return result;
}

Cost ExpertDispatch::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  // A copy: reads the groups' rows once and writes the shards' buffers (zeros included).
  return {0, static_cast<double>(inputs[0].nbytes() + outputs[0].nbytes())};
}

}  // namespace tessera
