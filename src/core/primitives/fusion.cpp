// Fusion: program construction and checks, IR text (print and parse), cost.
#include "tessera/ir/primitives/fusion.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "tessera/core/array.h"
#include "tessera/ir/attributes.h"

namespace tessera {
namespace {

DType parse_dtype(const std::string& text) {
  DType dtype;
  if (!dtype_from_name(text, &dtype)) fail<ValueError>("fusion: unknown dtype '{}'", text);
  return dtype;
}

bool bool_result(BinaryKind kind) { return kind >= BinaryKind::Equal && kind <= BinaryKind::LogicalOr; }

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n"), e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Splits at top-level occurrences of `sep` (brackets and parentheses nest).
std::vector<std::string> split_top(const std::string& s, char sep) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '[' || c == '(' || c == '{') ++depth;
    if (c == ']' || c == ')' || c == '}') --depth;
    if (c == sep && depth == 0) {
      parts.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!trim(cur).empty() || !parts.empty()) parts.push_back(trim(cur));
  return parts;
}

// "[a, b, c]" -> {"a", "b", "c"}.
std::vector<std::string> bracket_list(const std::string& text, char open, char close, const char* what) {
  std::string t = trim(text);
  if (t.size() < 2 || t.front() != open || t.back() != close)
    fail<ValueError>("fusion: {} must be written {}...{} (got '{}')", what, open, close, text);
  return split_top(t.substr(1, t.size() - 2), open == '{' ? ';' : ',');
}

Shape parse_shape(const std::string& text) {
  Shape shape;
  for (const std::string& d : bracket_list(text, '[', ']', "a shape")) {
    try {
      shape.push_back(std::stoll(d));
    } catch (const std::exception&) {
      fail<ValueError>("fusion: bad dimension '{}' in shape {}", d, text);
    }
  }
  return shape;
}

std::string register_name(const FusionProgram& p, int reg) {
  const int n_in = static_cast<int>(p.inputs.size());
  return reg < n_in ? "in" + std::to_string(reg) : "t" + std::to_string(reg - n_in);
}

int parse_register(const FusionProgram& p, const std::string& text) {
  const int n_in = static_cast<int>(p.inputs.size());
  auto number = [&](size_t skip) {
    const std::string digits = text.substr(skip);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); }))
      fail<ValueError>("fusion: '{}' is not a register (expected inN or tN)", text);
    return std::stoi(digits);
  };
  if (text.rfind("in", 0) == 0) return number(2);
  if (text.rfind("t", 0) == 0) return n_in + number(1);
  fail<ValueError>("fusion: '{}' is not a register (expected inN or tN)", text);
}

void check_register(const FusionProgram& p, int reg, const char* op) {
  if (reg < 0 || reg >= p.num_registers())
    fail<ValueError>("fusion: {} reads register {} (the program has {})", op, reg, p.num_registers());
}

}  // namespace

DType FusionProgram::register_dtype(int reg) const {
  check_register(*this, reg, "a register read");
  const int n_in = static_cast<int>(inputs.size());
  return reg < n_in ? inputs[reg].dtype : body[reg - n_in].dtype;
}

int FusionProgram::add_unary(UnaryKind kind, int x) {
  const DType dx = register_dtype(x);
  body.push_back(
      {FusionInstruction::Kind::Unary, static_cast<int>(kind), kind == UnaryKind::LogicalNot ? DType::Bool : dx, {x}});
  return num_registers() - 1;
}

int FusionProgram::add_binary(BinaryKind kind, int a, int b) {
  const DType da = register_dtype(a), db = register_dtype(b);
  if (da != db)
    fail<DTypeError>("fusion: {} operands must have one dtype (got {} and {})", binary_name(kind), name(da), name(db));
  body.push_back(
      {FusionInstruction::Kind::Binary, static_cast<int>(kind), bool_result(kind) ? DType::Bool : da, {a, b}});
  return num_registers() - 1;
}

int FusionProgram::add_where(int cond, int a, int b) {
  const DType dc = register_dtype(cond), da = register_dtype(a), db = register_dtype(b);
  if (dc != DType::Bool || da != db)
    fail<DTypeError>("fusion: where needs a bool condition and one value dtype (got {}, {}, {})", name(dc), name(da),
                     name(db));
  body.push_back({FusionInstruction::Kind::Where, 0, da, {cond, a, b}});
  return num_registers() - 1;
}

int FusionProgram::add_convert(int x, DType dtype) {
  register_dtype(x);
  body.push_back({FusionInstruction::Kind::Convert, 0, dtype, {x}});
  return num_registers() - 1;
}

Shape FusionProgram::output_shape() const {
  if (!reduce) return shape;
  Shape out;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d)
    if (std::find(reduce_axes.begin(), reduce_axes.end(), d) == reduce_axes.end()) out.push_back(shape[d]);
  return out;
}

void FusionProgram::validate() const {
  numel(shape, "fusion");
  for (size_t i = 0; i < inputs.size(); ++i)
    if (broadcast_shapes(inputs[i].shape, shape, "fusion") != shape)
      fail<ShapeError>("fusion: input {} of shape {} does not broadcast to the fusion's shape {}", i,
                       to_string(inputs[i].shape), to_string(shape));
  // Re-derive every instruction's dtype, as the builders do.
  FusionProgram check;
  check.inputs = inputs;
  for (size_t k = 0; k < body.size(); ++k) {
    const FusionInstruction& in = body[k];
    const int self = static_cast<int>(inputs.size() + k);
    const size_t arity = in.kind == FusionInstruction::Kind::Binary  ? 2
                         : in.kind == FusionInstruction::Kind::Where ? 3
                                                                     : 1;
    if (in.args.size() != arity)
      fail<ValueError>("fusion: instruction t{} has {} operands (expected {})", k, in.args.size(), arity);
    for (int a : in.args)
      if (a < 0 || a >= self) fail<ValueError>("fusion: instruction t{} reads register {} before it is defined", k, a);
    switch (in.kind) {
      case FusionInstruction::Kind::Unary:
        if (in.op < 0 || in.op >= kNumUnaryKinds) fail<ValueError>("fusion: bad unary op {}", in.op);
        check.add_unary(static_cast<UnaryKind>(in.op), in.args[0]);
        break;
      case FusionInstruction::Kind::Binary:
        if (in.op < 0 || in.op >= kNumBinaryKinds) fail<ValueError>("fusion: bad binary op {}", in.op);
        check.add_binary(static_cast<BinaryKind>(in.op), in.args[0], in.args[1]);
        break;
      case FusionInstruction::Kind::Where:
        check.add_where(in.args[0], in.args[1], in.args[2]);
        break;
      case FusionInstruction::Kind::Convert:
        check.add_convert(in.args[0], in.dtype);
        break;
    }
    if (check.body.back().dtype != in.dtype)
      fail<DTypeError>("fusion: instruction t{} has dtype {} (its operands give {})", k, name(in.dtype),
                       name(check.body.back().dtype));
  }
  if (outputs.empty()) fail<ValueError>("fusion: the program has no outputs");
  for (int r : outputs) check_register(*this, r, "an output");
  if (reduce) {
    if (*reduce != ReduceKind::Sum && *reduce != ReduceKind::Max)
      fail<ValueError>("fusion: a fused reduction is a sum or a max");
    if (outputs.size() != 1) fail<ValueError>("fusion: a fused reduction has one output (got {})", outputs.size());
    const int nd = static_cast<int>(shape.size());
    for (size_t i = 0; i < reduce_axes.size(); ++i)
      if (reduce_axes[i] != nd - static_cast<int>(reduce_axes.size() - i))
        fail<ValueError>("fusion: reduce axes must be the trailing axes of shape {} (got axis {})", to_string(shape),
                         reduce_axes[i]);
  } else if (!reduce_axes.empty()) {
    fail<ValueError>("fusion: reduce axes without a reduction");
  }
}

Fusion::Fusion(FusionProgram program) : program_(std::move(program)) { program_.validate(); }

std::string Fusion::attributes() const {
  const FusionProgram& p = program_;
  std::ostringstream os;
  os << "shape=" << to_string(p.shape) << ", inputs=[";
  for (size_t i = 0; i < p.inputs.size(); ++i)
    os << (i ? ", " : "") << short_name(p.inputs[i].dtype) << to_string(p.inputs[i].shape);
  os << "], body={";
  const int n_in = static_cast<int>(p.inputs.size());
  for (size_t k = 0; k < p.body.size(); ++k) {
    const FusionInstruction& in = p.body[k];
    os << register_name(p, n_in + static_cast<int>(k)) << " = ";
    switch (in.kind) {
      case FusionInstruction::Kind::Unary:
        os << unary_name(static_cast<UnaryKind>(in.op));
        break;
      case FusionInstruction::Kind::Binary:
        os << binary_name(static_cast<BinaryKind>(in.op));
        break;
      case FusionInstruction::Kind::Where:
        os << "where";
        break;
      case FusionInstruction::Kind::Convert:
        os << "convert";
        break;
    }
    os << "(";
    for (size_t a = 0; a < in.args.size(); ++a) os << (a ? ", " : "") << register_name(p, in.args[a]);
    if (in.kind == FusionInstruction::Kind::Convert) os << ", " << short_name(in.dtype);
    os << "); ";
  }
  os << "out=[";
  for (size_t j = 0; j < p.outputs.size(); ++j) os << (j ? ", " : "") << register_name(p, p.outputs[j]);
  os << "]}";
  if (p.reduce) {
    os << ", reduce=" << (*p.reduce == ReduceKind::Sum ? "sum" : "max") << ", axes=[";
    for (size_t i = 0; i < p.reduce_axes.size(); ++i) os << (i ? ", " : "") << p.reduce_axes[i];
    os << "]";
  }
  return os.str();
}

PrimitivePtr parse_fusion(const AttributeMap& attributes) {
  FusionProgram p;
  p.shape = parse_shape(attributes.raw("shape"));
  for (const std::string& in : bracket_list(attributes.raw("inputs"), '[', ']', "inputs")) {
    const size_t open = in.find('[');
    if (open == std::string::npos) fail<ValueError>("fusion: input type '{}' must be written like f32[4, 8]", in);
    p.inputs.push_back({parse_shape(in.substr(open)), parse_dtype(trim(in.substr(0, open)))});
  }
  for (const std::string& stmt : bracket_list(attributes.raw("body"), '{', '}', "body")) {
    if (stmt.empty()) continue;
    const size_t eq = stmt.find('=');
    if (eq == std::string::npos) fail<ValueError>("fusion: statement '{}' has no '='", stmt);
    const std::string lhs = trim(stmt.substr(0, eq)), rhs = trim(stmt.substr(eq + 1));
    if (lhs == "out") {
      for (const std::string& r : bracket_list(rhs, '[', ']', "out")) p.outputs.push_back(parse_register(p, r));
      continue;
    }
    if (parse_register(p, lhs) != p.num_registers())
      fail<ValueError>("fusion: statement '{}' defines {} out of order (expected {})", stmt, lhs,
                       register_name(p, p.num_registers()));
    const size_t open = rhs.find('(');
    if (open == std::string::npos || rhs.back() != ')')
      fail<ValueError>("fusion: statement '{}' is not an op call", stmt);
    const std::string op = trim(rhs.substr(0, open));
    std::vector<std::string> args = split_top(rhs.substr(open + 1, rhs.size() - open - 2), ',');
    auto reg = [&](size_t i) {
      if (i >= args.size()) fail<ValueError>("fusion: statement '{}' has too few operands", stmt);
      return parse_register(p, args[i]);
    };
    auto arity = [&](size_t n) {
      if (args.size() != n)
        fail<ValueError>("fusion: statement '{}' has {} operands (expected {})", stmt, args.size(), n);
    };
    if (op == "where") {
      arity(3);
      p.add_where(reg(0), reg(1), reg(2));
    } else if (op == "convert") {
      arity(2);
      p.add_convert(reg(0), parse_dtype(args[1]));
    } else {
      bool found = false;
      for (int k = 0; k < kNumUnaryKinds && !found; ++k)
        if (op == unary_name(static_cast<UnaryKind>(k))) {
          arity(1);
          p.add_unary(static_cast<UnaryKind>(k), reg(0));
          found = true;
        }
      for (int k = 0; k < kNumBinaryKinds && !found; ++k)
        if (op == binary_name(static_cast<BinaryKind>(k))) {
          arity(2);
          p.add_binary(static_cast<BinaryKind>(k), reg(0), reg(1));
          found = true;
        }
      if (!found) fail<ValueError>("fusion: unknown op '{}' in statement '{}'", op, stmt);
    }
  }
  if (attributes.has("reduce")) {
    const std::string r = trim(attributes.raw("reduce"));
    if (r == "sum")
      p.reduce = ReduceKind::Sum;
    else if (r == "max")
      p.reduce = ReduceKind::Max;
    else
      fail<ValueError>("fusion: reduce must be sum or max (got '{}')", r);
    for (int64_t a : attributes.get_ints("axes")) p.reduce_axes.push_back(static_cast<int>(a));
  }
  return std::make_shared<Fusion>(std::move(p));
}

std::vector<Array> Fusion::vjp(const std::vector<Array>&, const std::vector<Array>&, const std::vector<int>&,
                               const std::vector<Array>&) {
  fail<TransformError>(
      "grad: 'fusion' is not differentiable (fusion runs after autodiff; differentiate the unfused "
      "function)");
}

Cost Fusion::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  // One FLOP per element per instruction (the unfused ops' count), plus one per
  // reduced element; every input read and every output written once.
  Cost c;
  const double n = static_cast<double>(numel(program_.shape));
  c.flops = n * static_cast<double>(program_.body.size() + (program_.reduce ? 1 : 0));
  for (const Array& in : inputs) c.bytes += static_cast<double>(in.nbytes());
  for (const Array& out : outputs) c.bytes += static_cast<double>(out.nbytes());
  return c;
}

bool Fusion::can_write_in_place(int input, int output) const {
  if (program_.reduce || input < 0 || input >= static_cast<int>(program_.inputs.size()) || output < 0 ||
      output >= static_cast<int>(program_.outputs.size()))
    return false;
  return program_.inputs[input].shape == program_.shape;
}

}  // namespace tessera
