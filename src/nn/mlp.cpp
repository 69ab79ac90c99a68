#include "tessera/nn/mlp.h"

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/nn/linear.h"

namespace tessera::nn {

namespace {
void check_sizes(const char* what, const ParamScope& scope, int64_t dim, int64_t hidden) {
  if (dim <= 0 || hidden <= 0)
    fail<ValueError>("{} '{}': dim {} and hidden {} must be positive", what, scope.path(), dim, hidden);
}
}  // namespace

Tree GeluMLP::init(ParamScope scope) const {
  check_sizes("GeluMLP", scope, dim, hidden);
  Tree p;
  p["fc"] = Linear{dim, hidden, bias, {"embed", "mlp"}, Initializer::normal(init_std)}.init(scope.child("fc"));
  p["proj"] = Linear{hidden, dim, bias, {"mlp", "embed"}, Initializer::normal(out_std)}.init(scope.child("proj"));
  return p;
}

Array GeluMLP::operator()(const Tree& p, const Array& x) const {
  const Tree& fc = p.at("fc");
  const Tree& proj = p.at("proj");
  Array h = project(projection, x, fc.at("w").leaf(), 0);
  if (bias) h = h + fc.at("b").leaf();
  h = gelu(h, /*approximate=*/true);
  Array y = project(projection, h, proj.at("w").leaf(), 1);
  return bias ? y + proj.at("b").leaf() : y;
}

Tree SwiGLU::init(ParamScope scope) const {
  check_sizes("SwiGLU", scope, dim, hidden);
  Tree p;
  p["gate"] = Linear{dim, hidden, false, {"embed", "mlp"}, Initializer::normal(init_std)}.init(scope.child("gate"));
  p["up"] = Linear{dim, hidden, false, {"embed", "mlp"}, Initializer::normal(init_std)}.init(scope.child("up"));
  p["down"] = Linear{hidden, dim, false, {"mlp", "embed"}, Initializer::normal(out_std)}.init(scope.child("down"));
  return p;
}

Array SwiGLU::operator()(const Tree& p, const Array& x) const {
  Array gate = silu(project(projection, x, p.at("gate").at("w").leaf(), 0));
  Array up = project(projection, x, p.at("up").at("w").leaf(), 1);
  return project(projection, gate * up, p.at("down").at("w").leaf(), 2);
}

}  // namespace tessera::nn
