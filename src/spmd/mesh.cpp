#include "tessera/spmd/mesh.h"

#include <fmt/format.h>

#include <cctype>
#include <numeric>

#include "tessera/base/error.h"

namespace tessera::spmd {

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

Mesh::Mesh(std::vector<std::string> axis_names, std::vector<int> axis_sizes)
    : names_(std::move(axis_names)), sizes_(std::move(axis_sizes)) {
  if (names_.size() != sizes_.size())
    fail<ValueError>("Mesh: {} axis names but {} sizes", names_.size(), sizes_.size());
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!is_identifier(names_[i]))
      fail<ValueError>("Mesh: axis name '{}' is not an identifier (letters, digits, '_')", names_[i]);
    if (sizes_[i] < 1) fail<ValueError>("Mesh: axis '{}' has size {} (expected >= 1)", names_[i], sizes_[i]);
    for (size_t j = 0; j < i; ++j)
      if (names_[j] == names_[i]) fail<ValueError>("Mesh: axis '{}' appears twice", names_[i]);
  }
}

Mesh Mesh::parse(std::string_view text) {
  std::vector<std::string> names;
  std::vector<int> sizes;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string entry = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) {
      if (comma == text.size() && !names.empty()) break;
      fail<ValueError>("mesh '{}': empty entry (expected name=size entries separated by commas, e.g. data=2,model=4)",
                       text);
    }
    size_t eq = entry.find('=');
    if (eq == std::string::npos)
      fail<ValueError>("mesh '{}': entry '{}' has no size (expected name=size, e.g. data=2)", text, entry);
    std::string name = trim(entry.substr(0, eq));
    std::string size_text = trim(entry.substr(eq + 1));
    int size = 0;
    bool digits = !size_text.empty() && size_text.size() < 9;
    for (char c : size_text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    if (digits) size = std::stoi(size_text);
    if (!digits || size < 1)
      fail<ValueError>("mesh '{}': size '{}' of axis '{}' is not a positive integer", text, size_text, name);
    names.push_back(name);
    sizes.push_back(size);
    if (comma == text.size()) break;
  }
  return Mesh(std::move(names), std::move(sizes));
}

int Mesh::size() const { return std::accumulate(sizes_.begin(), sizes_.end(), 1, std::multiplies<>()); }

bool Mesh::has_axis(std::string_view name) const {
  for (const std::string& n : names_)
    if (n == name) return true;
  return false;
}

int Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int>(i);
  fail<ValueError>("mesh {} has no axis '{}'", to_string(), name);
}

std::vector<int> Mesh::coords(int device) const {
  if (device < 0 || device >= size())
    fail<ValueError>("mesh {}: device {} out of range [0, {})", to_string(), device, size());
  std::vector<int> c(names_.size());
  for (int a = ndim() - 1; a >= 0; --a) {
    c[static_cast<size_t>(a)] = device % sizes_[static_cast<size_t>(a)];
    device /= sizes_[static_cast<size_t>(a)];
  }
  return c;
}

int Mesh::device(const std::vector<int>& coords) const {
  if (coords.size() != names_.size())
    fail<ValueError>("mesh {}: {} coordinates given (expected {})", to_string(), coords.size(), names_.size());
  int d = 0;
  for (size_t a = 0; a < coords.size(); ++a) {
    if (coords[a] < 0 || coords[a] >= sizes_[a])
      fail<ValueError>("mesh {}: coordinate {} out of range on axis '{}'", to_string(), coords[a], names_[a]);
    d = d * sizes_[a] + coords[a];
  }
  return d;
}

int Mesh::group_size(const std::vector<int>& axes) const {
  int n = 1;
  for (int a : axes) n *= axis_size(a);
  return n;
}

std::vector<int> Mesh::group(int device, const std::vector<int>& axes) const {
  std::vector<int> base = coords(device);
  int n = group_size(axes);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    // i enumerates the coordinates along `axes` row-major (axes[0] major).
    std::vector<int> c = base;
    int rest = i;
    for (int k = static_cast<int>(axes.size()) - 1; k >= 0; --k) {
      int a = axes[static_cast<size_t>(k)];
      c[static_cast<size_t>(a)] = rest % axis_size(a);
      rest /= axis_size(a);
    }
    out.push_back(this->device(c));
  }
  return out;
}

int Mesh::index_in_group(int device, const std::vector<int>& axes) const {
  std::vector<int> c = coords(device);
  int index = 0;
  for (int a : axes) index = index * axis_size(a) + c[static_cast<size_t>(a)];
  return index;
}

std::string Mesh::axes_text(const std::vector<int>& axes) const {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + axis_name(axes[i]);
  return s + "]";
}

std::string Mesh::to_string() const {
  std::string s = "(";
  for (size_t i = 0; i < names_.size(); ++i) s += fmt::format("{}{}={}", i ? ", " : "", names_[i], sizes_[i]);
  return s + ")";
}

}  // namespace tessera::spmd
