// The state layout checks the optimizer rules share (optim/rules.h).
#include <algorithm>

#include "optim/rules.h"
#include "tessera/base/error.h"

namespace tessera::optim::detail {

std::vector<std::string> state_keys(const std::string& name) {
  if (name == "adamw") return {"m", "v"};
  if (name == "sgd") return {"momentum"};
  if (name == "lion") return {"m"};
  if (name == "adafactor") return {"v", "v_col", "v_row"};
  if (name == "muon") return {"m", "v"};
  fail<ValueError>("optimizer: name = \"{}\" is unknown (expected one of: adamw, sgd, lion, adafactor, muon)", name);
}

void check_state_leaves(const char* what, const Tree& params, const Tree& tree,
                        const std::function<Shape(const Array& param, size_t index)>& shape_of) {
  const std::vector<std::string> p_paths = params.paths(), t_paths = tree.paths();
  if (p_paths != t_paths)
    fail<ValueError>(
        "optimizer: {} does not have the params' paths ({} leaves, the params {}; make it with "
        "Optimizer::init)",
        what, t_paths.size(), p_paths.size());
  const std::vector<Array> p = params.leaves(), t = tree.leaves();
  for (size_t i = 0; i < p.size(); ++i) {
    const Shape want = shape_of(p[i], i);
    const DType dtype = accumulation_dtype(p[i].dtype());
    if (t[i].shape() != want || t[i].dtype() != dtype)
      fail<ValueError>("optimizer: {} \"{}\" is {} (expected {}{} for the parameter {})", what, t_paths[i],
                       type_string(t[i]), short_name(dtype), to_string(want), type_string(p[i]));
  }
}

}  // namespace tessera::optim::detail
