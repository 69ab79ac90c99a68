// The line parser of the accelerator catalog (format: goodput/accelerators.h), in one pass:
//   1. strip the comment and surrounding blanks; skip empty lines;
//   2. a header opens an entry [key] (closing the one before) or a level [key.link.name]
//      of the entry opened last;
//   3. key = value: the value is read by its first character ("...", [...], a number) and
//      handed to the key's row of kEntryKeys / kLinkKeys, which checks its type and range;
//   4. closing a table checks that it set every key; closing an entry, that its levels
//      grow outward and only the outermost is unbounded.
// Every error names file:line, the table and the key.
#include "tessera/goodput/accelerators.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "goodput/accelerators_toml.h"
#include "tessera/base/error.h"

namespace tessera::goodput {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Strips a trailing comment that is not inside a string.
std::string_view strip_comment(std::string_view line) {
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') in_string = !in_string;
    if (line[i] == '#' && !in_string) return line.substr(0, i);
  }
  return line;
}

// A right-hand side: a "string", a bare word (a number, read when a key asks for one), or
// a one-line list of those.
struct Value {
  enum class Type { kString, kBare, kList };
  Type type = Type::kBare;
  std::string raw;   // as written, for messages
  std::string text;  // kString: the characters between the quotes
  std::vector<Value> items;
};

// `at` is "file:line: [table] key", the prefix of every message about one value.
Value parse_scalar(std::string_view v, const std::string& at) {
  Value out;
  out.raw = std::string(v);
  if (v.empty()) fail<ConfigError>("{}: expected a value after =", at);
  if (v.front() != '"') return out;
  const std::string_view body = v.size() >= 2 && v.back() == '"' ? v.substr(1, v.size() - 2) : std::string_view{};
  if (v.size() < 2 || v.back() != '"' || body.find_first_of("\"\\") != body.npos)
    fail<ConfigError>("{}: expected a \"string\" without escapes (got {})", at, v);
  out.type = Value::Type::kString;
  out.text = std::string(body);
  return out;
}

Value parse_value(std::string_view v, const std::string& at) {
  if (v.empty() || v.front() != '[') return parse_scalar(v, at);
  if (v.back() != ']') fail<ConfigError>("{}: a list must close on its line with ] (got {})", at, v);
  Value out;
  out.type = Value::Type::kList;
  out.raw = std::string(v);
  std::string_view rest = trim(v.substr(1, v.size() - 2));
  while (!rest.empty()) {
    // An item runs to the next comma outside a string.
    size_t end = 0;
    if (rest.front() == '"') {
      end = rest.find('"', 1);
      end = end == rest.npos ? rest.size() : end + 1;
    }
    end = std::min(rest.find(',', end), rest.size());
    const std::string_view item = trim(rest.substr(0, end));
    if (item.empty() || item.front() == '[') fail<ConfigError>("{}: expected strings or numbers in {}", at, v);
    out.items.push_back(parse_scalar(item, at));
    rest = end == rest.size() ? std::string_view{} : trim(rest.substr(end + 1));
  }
  return out;
}

std::string string_of(const Value& v, const std::string& at) {
  if (v.type != Value::Type::kString || v.text.empty())
    fail<ConfigError>("{}: expected a non-empty \"string\" (got {})", at, v.raw);
  return v.text;
}

// std::from_chars over the whole word: no trailing junk, no digit separators, finite.
double number_of(const Value& v, const std::string& at) {
  std::string_view s = v.raw;
  if (s.size() > 1 && s.front() == '+' && s[1] != '-') s.remove_prefix(1);
  double x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (v.type != Value::Type::kBare || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(x))
    fail<ConfigError>("{}: expected a finite number such as 989.0e12 (got {})", at, v.raw);
  return x;
}

double positive(const Value& v, const std::string& at) {
  const double x = number_of(v, at);
  if (!(x > 0)) fail<ConfigError>("{}: must be > 0 (got {})", at, v.raw);
  return x;
}

double non_negative(const Value& v, const std::string& at) {
  const double x = number_of(v, at);
  if (!(x >= 0)) fail<ConfigError>("{}: must be >= 0 (got {})", at, v.raw);
  return x;
}

double fraction(const Value& v, const std::string& at) {
  const double x = number_of(v, at);
  if (!(x > 0 && x <= 1)) fail<ConfigError>("{}: must be a fraction in (0, 1] (got {})", at, v.raw);
  return x;
}

double unit_interval(const Value& v, const std::string& at) {
  const double x = number_of(v, at);
  if (!(x >= 0 && x <= 1)) fail<ConfigError>("{}: must be in [0, 1] (got {})", at, v.raw);
  return x;
}

// A whole number >= min_value that a double holds exactly (up to 2^53).
int64_t integer(const Value& v, int64_t min_value, const std::string& at) {
  constexpr double kMaxExact = 9007199254740992.0;
  const double x = number_of(v, at);
  if (x != std::floor(x) || x < static_cast<double>(min_value) || x > kMaxExact)
    fail<ConfigError>("{}: must be a whole number >= {} (got {})", at, min_value, v.raw);
  return static_cast<int64_t>(x);
}

std::string one_of(const Value& v, std::initializer_list<std::string_view> allowed, const std::string& at) {
  std::string s = string_of(v, at);
  if (std::find(allowed.begin(), allowed.end(), s) == allowed.end())
    fail<ConfigError>("{}: \"{}\" is not one of {}", at, s, fmt::join(allowed, ", "));
  return s;
}

// Every key of an entry, declared once: its name and how its value is checked and stored.
struct EntryKey {
  std::string_view name;
  void (*set)(AcceleratorSpec&, const Value&, const std::string& at);
};

const EntryKey kEntryKeys[] = {
    {"name", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.name = string_of(v, at); }},
    {"match",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) {
       if (v.type != Value::Type::kList || v.items.empty())
         fail<ConfigError>("{}: expected a list of device-name substrings [\"...\"] (got {})", at, v.raw);
       for (const Value& item : v.items) s.match.push_back(string_of(item, at));
     }},
    {"kind",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) {
       s.kind = one_of(v, {"gpu", "tpu", "cpu"}, at);
     }},
    {"peak_flops", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.peak_flops = positive(v, at); }},
    {"dtype", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.dtype = string_of(v, at); }},
    {"peak_int8", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.peak_int8 = positive(v, at); }},
    {"memory", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.memory = positive(v, at); }},
    {"memory_bandwidth",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.memory_bandwidth = positive(v, at); }},
    {"matrix_tile",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) {
       if (v.type != Value::Type::kList || v.items.size() != 3)
         fail<ConfigError>("{}: expected 3 positive whole numbers [M, N, K] (got {})", at, v.raw);
       for (size_t i = 0; i < 3; ++i) s.matrix_tile[i] = integer(v.items[i], 1, at);
     }},
    {"matrix_units",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.matrix_units = integer(v, 1, at); }},
    {"gemm_efficiency",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.gemm_efficiency = fraction(v, at); }},
    {"attention_efficiency",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) {
       if (v.type != Value::Type::kList || v.items.size() != 2)
         fail<ConfigError>("{}: expected 2 fractions in (0, 1], [forward, backward] (got {})", at, v.raw);
       for (size_t i = 0; i < 2; ++i) s.attention_efficiency[i] = fraction(v.items[i], at);
     }},
    {"memory_efficiency",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.memory_efficiency = fraction(v, at); }},
    {"kernel_overhead",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.kernel_overhead = non_negative(v, at); }},
    {"collective_overlap",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.collective_overlap = unit_interval(v, at); }},
    {"failure_rate",
     [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.failure_rate = non_negative(v, at); }},
    {"price", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.price = non_negative(v, at); }},
    {"price_date", [](AcceleratorSpec& s, const Value& v, const std::string& at) { s.price_date = string_of(v, at); }},
};

// Every key of an interconnect level [entry.link.name].
struct LinkKey {
  std::string_view name;
  void (*set)(InterconnectLevel&, const Value&, const std::string& at);
};

const LinkKey kLinkKeys[] = {
    {"devices", [](InterconnectLevel& l, const Value& v, const std::string& at) { l.devices = integer(v, 0, at); }},
    {"bandwidth", [](InterconnectLevel& l, const Value& v, const std::string& at) { l.bandwidth = positive(v, at); }},
    {"latency", [](InterconnectLevel& l, const Value& v, const std::string& at) { l.latency = non_negative(v, at); }},
    {"topology",
     [](InterconnectLevel& l, const Value& v, const std::string& at) {
       l.topology = one_of(v, {"switch", "ring", "torus-2d", "torus-3d", "network"}, at);
     }},
};

template <typename Row, size_t N>
std::string key_names(const Row (&rows)[N]) {
  std::vector<std::string_view> names;
  for (const Row& row : rows) names.push_back(row.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

bool valid_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

class CatalogParser {
 public:
  explicit CatalogParser(const std::string& source) : source_(source) {}

  std::vector<AcceleratorSpec> parse(std::string_view text) {
    std::istringstream in{std::string(text)};
    std::string raw;
    int line_no = 0;
    while (std::getline(in, raw)) {
      ++line_no;
      const std::string_view line = trim(strip_comment(raw));
      if (line.empty()) continue;
      if (line.front() == '[') {
        header(line, line_no);
        continue;
      }
      const size_t eq = line.find('=');
      if (eq == line.npos)
        fail<ConfigError>("{}:{}: expected key = value or a [table] (got {})", source_, line_no, line);
      const std::string key(trim(line.substr(0, eq)));
      if (table_.empty()) fail<ConfigError>("{}:{}: key '{}' before any [table]", source_, line_no, key);
      set(key, trim(line.substr(eq + 1)), line_no);
    }
    close_entry();
    return std::move(specs_);
  }

 private:
  void header(std::string_view line, int line_no) {
    const std::string_view name = line.size() >= 2 && line.back() == ']' ? trim(line.substr(1, line.size() - 2)) : "";
    std::vector<std::string_view> parts;
    for (std::string_view rest = name;;) {
      const size_t dot = rest.find('.');
      parts.push_back(trim(rest.substr(0, dot)));
      if (dot == rest.npos) break;
      rest = rest.substr(dot + 1);
    }
    const bool entry = parts.size() == 1 && valid_name(parts[0]);
    const bool link = parts.size() == 3 && parts[1] == "link" && valid_name(parts[0]) && valid_name(parts[2]);
    if (!entry && !link)
      fail<ConfigError>(
          "{}:{}: bad table header {} (expected [name] or [name.link.level], names of letters, digits, _ and -)",
          source_, line_no, line);
    if (entry) {
      close_entry();
      open_entry(std::string(parts[0]), line_no);
    } else {
      open_link(parts[0], std::string(parts[2]), line_no);
    }
  }

  void open_entry(std::string key, int line_no) {
    for (size_t i = 0; i < specs_.size(); ++i)
      if (specs_[i].key == key)
        fail<ConfigError>("{}:{}: [{}] is defined twice (first at {})", source_, line_no, key, specs_[i].source);
    AcceleratorSpec& spec = specs_.emplace_back();
    spec.key = std::move(key);
    spec.source = fmt::format("{}:{}", source_, line_no);
    open(spec.key, line_no, std::size(kEntryKeys), /*link=*/false);
    entry_line_ = line_no;
    link_lines_.clear();
  }

  void open_link(std::string_view parent, std::string name, int line_no) {
    const std::string table = fmt::format("{}.link.{}", parent, name);
    if (specs_.empty())
      fail<ConfigError>("{}:{}: [{}] comes before any table [{}]; a level follows the table of its entry", source_,
                        line_no, table, parent);
    AcceleratorSpec& spec = specs_.back();
    if (spec.key != parent)
      fail<ConfigError>("{}:{}: [{}] must follow its table [{}], but the latest table is [{}]", source_, line_no, table,
                        parent, spec.key);
    for (size_t i = 0; i < spec.links.size(); ++i)
      if (spec.links[i].name == name)
        fail<ConfigError>("{}:{}: [{}] is defined twice (first at line {})", source_, line_no, table, link_lines_[i]);
    close_table();
    spec.links.emplace_back().name = std::move(name);
    link_lines_.push_back(line_no);
    open(table, line_no, std::size(kLinkKeys), /*link=*/true);
  }

  void open(std::string table, int line_no, size_t keys, bool link) {
    table_ = std::move(table);
    in_link_ = link;
    table_line_ = line_no;
    key_lines_.assign(keys, 0);
  }

  void set(const std::string& key, std::string_view value, int line_no) {
    const std::string at = fmt::format("{}:{}: [{}] {}", source_, line_no, table_, key);
    auto assign = [&](const auto& rows, auto& target) {
      for (size_t i = 0; i < std::size(rows); ++i) {
        if (rows[i].name != key) continue;
        if (key_lines_[i] != 0) fail<ConfigError>("{}: set twice (first at line {})", at, key_lines_[i]);
        rows[i].set(target, parse_value(value, at), at);
        key_lines_[i] = line_no;
        return;
      }
      fail<ConfigError>("{}:{}: unknown key '{}' in [{}] (expected {})", source_, line_no, key, table_,
                        key_names(rows));
    };
    if (in_link_) {
      assign(kLinkKeys, specs_.back().links.back());
    } else {
      assign(kEntryKeys, specs_.back());
    }
  }

  // The table open now must have set every key; the message uses its header's line.
  template <typename Row, size_t N>
  void check_complete(const Row (&rows)[N]) {
    for (size_t i = 0; i < N; ++i)
      if (key_lines_[i] == 0) fail<ConfigError>("{}:{}: [{}] needs {}", source_, table_line_, table_, rows[i].name);
  }

  void close_table() {
    if (table_.empty()) return;
    if (in_link_) {
      check_complete(kLinkKeys);
    } else {
      check_complete(kEntryKeys);
    }
  }

  // Levels are innermost first: each joins more chips than the one inside it, and only the
  // outermost may be unbounded (devices = 0).
  void close_entry() {
    if (table_.empty()) return;
    close_table();
    const AcceleratorSpec& spec = specs_.back();
    if (spec.links.empty())
      fail<ConfigError>("{}:{}: [{}] needs at least one interconnect level [{}.link.<name>]", source_, entry_line_,
                        spec.key, spec.key);
    for (size_t i = 0; i < spec.links.size(); ++i) {
      const InterconnectLevel& level = spec.links[i];
      if (level.devices == 0 && i + 1 < spec.links.size())
        fail<ConfigError>(
            "{}:{}: [{}.link.{}] devices = 0 (unbounded) is only allowed on the outermost level, but "
            "[{}.link.{}] follows it",
            source_, link_lines_[i], spec.key, level.name, spec.key, spec.links[i + 1].name);
      if (i > 0 && level.devices != 0 && level.devices <= spec.links[i - 1].devices)
        fail<ConfigError>(
            "{}:{}: [{}.link.{}] devices = {} must exceed the {} of the level inside it, [{}.link.{}] "
            "(levels are listed innermost first)",
            source_, link_lines_[i], spec.key, level.name, level.devices, spec.links[i - 1].devices, spec.key,
            spec.links[i - 1].name);
    }
    table_.clear();
  }

  const std::string source_;
  std::vector<AcceleratorSpec> specs_;
  std::string table_;            // the table keys go to now: "h100" or "h100.link.nvlink"; empty before the first
  bool in_link_ = false;         // whether it is a level [entry.link.name]
  int table_line_ = 0;           // its header line
  std::vector<int> key_lines_;   // the line each of its keys was set on, 0 where not yet
  int entry_line_ = 0;           // header line of the open entry
  std::vector<int> link_lines_;  // header lines of the open entry's levels
};

}  // namespace

std::vector<AcceleratorSpec> parse_accelerator_catalog(std::string_view text, const std::string& source) {
  return CatalogParser(source).parse(text);
}

std::vector<AcceleratorSpec> load_accelerator_catalog(const std::filesystem::path& toml_path) {
  std::ifstream in(toml_path);
  if (!in) fail<IOError>("cannot read the accelerator catalog {} ({})", toml_path.string(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_accelerator_catalog(text.str(), toml_path.string());
}

const std::vector<AcceleratorSpec>& builtin_accelerator_catalog() {
  static const std::vector<AcceleratorSpec> catalog =
      parse_accelerator_catalog(accelerators_toml_text(), "configs/accelerators.toml");
  return catalog;
}

std::optional<AcceleratorSpec> find_accelerator(const std::vector<AcceleratorSpec>& catalog, std::string_view key) {
  const std::string wanted = lower(key);
  for (const AcceleratorSpec& spec : catalog)
    if (lower(spec.key) == wanted) return spec;
  for (const AcceleratorSpec& spec : catalog)
    for (const std::string& m : spec.match)
      if (!m.empty() && wanted.find(lower(m)) != std::string::npos) return spec;
  return std::nullopt;
}

}  // namespace tessera::goodput
