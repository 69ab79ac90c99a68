// The manifests of launch/k8s_manifest.h, built as a small tree (maps, lists,
// scalars) and written as YAML or JSON. No YAML library: strings that are not plainly
// safe are double-quoted with escapes, so no value can be read back as another type
// (`yes`, `2`, `null`) or break the structure (`: `, `#`, a newline, a leading `-`).
#include "launch/k8s_manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::launch {
namespace {

constexpr int kMaxDnsLabel = 63;
constexpr const char* kContainer = "tessera";
constexpr const char* kReplicatedJob = "workers";
constexpr const char* kIndexAnnotation = "metadata.annotations['batch.kubernetes.io/job-completion-index']";

struct Node {
  // A map's entry. (Not std::pair<std::string, Node>: a vector of that names a template
  // instantiated while Node is incomplete, which clang refuses.)
  struct Field;
  enum class Kind { kString, kInt, kBool, kMap, kList };
  Kind kind = Kind::kMap;
  std::string text;  // the scalar: a string, or an int or bool as written
  std::vector<Field> fields;
  std::vector<Node> items;
  std::string comment;  // YAML only: comment lines written before this node

  // Chained on a temporary (`map().add(..).add(..)`) they hand the node on by value.
  Node& add(std::string key, Node value) &;
  Node&& add(std::string key, Node value) &&;
  Node& push(Node value) &;
  Node&& push(Node value) &&;
};

struct Node::Field {
  std::string key;
  Node value;
};

// (Defined once Field is complete: a Node parameter's destructor destroys a vector of them.)
Node& Node::add(std::string key, Node value) & {
  fields.push_back(Field{std::move(key), std::move(value)});
  return *this;
}
Node&& Node::add(std::string key, Node value) && { return std::move(add(std::move(key), std::move(value))); }
Node& Node::push(Node value) & {
  items.push_back(std::move(value));
  return *this;
}
Node&& Node::push(Node value) && { return std::move(push(std::move(value))); }

Node str(std::string s) { return Node{Node::Kind::kString, std::move(s), {}, {}, {}}; }
Node num(int64_t v) { return Node{Node::Kind::kInt, std::to_string(v), {}, {}, {}}; }
Node boolean(bool v) { return Node{Node::Kind::kBool, v ? "true" : "false", {}, {}, {}}; }
Node map() { return Node{}; }
Node list() { return Node{Node::Kind::kList, {}, {}, {}, {}}; }
Node commented(std::string comment, Node node) {
  node.comment = std::move(comment);
  return node;
}

// ---- UTF-8 and scalar quoting ----

// Decodes UTF-8 into code points; false when `s` is not valid UTF-8 (overlong forms,
// surrogates and values past U+10FFFF included).
bool decode_utf8(const std::string& s, std::vector<uint32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    int extra = b < 0x80 ? 0 : (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : -1;
    if (extra < 0 || s.size() - i <= static_cast<size_t>(extra)) return false;
    uint32_t cp = extra == 0 ? b : b & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out.push_back(cp);
    i += extra + 1;
  }
  return true;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Plain (unquoted) only for words that YAML 1.1 and 1.2 both read as this very string:
// a letter, '/' or '_' first, then letters, digits and `_./-`, and not a word YAML 1.1
// reads as a boolean or null (Kubernetes' YAML reader is a 1.1 one).
bool yaml_plain_safe(const std::string& s) {
  if (s.empty()) return false;
  const char first = s.front();
  if (!std::isalpha(static_cast<unsigned char>(first)) && first != '/' && first != '_') return false;
  for (const char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' && c != '-') return false;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null"})
    if (lower == word) return false;
  return true;
}

// A double-quoted scalar; the escapes below are the same in YAML and JSON. YAML must
// also escape its non-printable and line-break code points (DEL, C1 controls, NEL, LS,
// PS, BOM, U+FFFE/F), which JSON takes as they are.
std::string quoted(const std::string& s, bool yaml) {
  std::vector<uint32_t> cps;
  if (!decode_utf8(s, cps)) fail<ValueError>("not valid UTF-8: '{}'", s);
  static const std::pair<uint32_t, const char*> kShort[] = {
      {'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\t', "\\t"}, {'\r', "\\r"}};
  std::string out = "\"";
  for (const uint32_t cp : cps) {
    const auto* escape =
        std::find_if(std::begin(kShort), std::end(kShort), [cp](const auto& e) { return e.first == cp; });
    if (escape != std::end(kShort))
      out += escape->second;
    else if (cp < 0x20 || (yaml && (cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
                                    cp == 0xFEFF || cp == 0xFFFE || cp == 0xFFFF)))
      out += fmt::format("\\u{:04x}", cp);
    else
      append_utf8(cp, out);
  }
  return out + "\"";
}

std::string yaml_string(const std::string& s) { return yaml_plain_safe(s) ? s : quoted(s, true); }
std::string json_string(const std::string& s) { return quoted(s, false); }

// ---- writers ----

std::string yaml_scalar(const Node& n) { return n.kind == Node::Kind::kString ? yaml_string(n.text) : n.text; }
bool is_scalar(const Node& n) { return n.kind != Node::Kind::kMap && n.kind != Node::Kind::kList; }
bool is_empty_collection(const Node& n) {
  return (n.kind == Node::Kind::kMap && n.fields.empty()) || (n.kind == Node::Kind::kList && n.items.empty());
}

void write_comment(const std::string& comment, int indent, std::string& out) {
  size_t start = 0;
  while (start < comment.size()) {
    const size_t end = std::min(comment.find('\n', start), comment.size());
    out += std::string(indent, ' ') + "# " + comment.substr(start, end - start) + "\n";
    start = end + 1;
  }
}

void write_yaml(const Node& n, int indent, std::string& out);

// A value after "key:" or "- ": scalars and empty collections on the same line.
void write_yaml_value(const Node& v, int indent, std::string& out) {
  if (is_scalar(v)) {
    out += " " + yaml_scalar(v) + "\n";
  } else if (is_empty_collection(v)) {
    out += v.kind == Node::Kind::kMap ? " {}\n" : " []\n";
  } else {
    out += "\n";
    write_yaml(v, indent + 2, out);
  }
}

void write_yaml(const Node& n, int indent, std::string& out) {
  const std::string pad(indent, ' ');
  if (n.kind == Node::Kind::kMap) {
    for (const auto& [key, value] : n.fields) {
      write_comment(value.comment, indent, out);
      out += pad + yaml_string(key) + ":";
      write_yaml_value(value, indent, out);
    }
    return;
  }
  for (const Node& item : n.items) {  // a list: "- " then the item, its first line beside the dash
    write_comment(item.comment, indent, out);
    if (is_scalar(item) || is_empty_collection(item)) {
      out += pad + "-";
      write_yaml_value(item, indent, out);
      continue;
    }
    std::string body;
    write_yaml(item, indent + 2, body);
    size_t line = 0;  // comment lines of the item's first field stay above the dash
    while (body.compare(line + indent + 2, 1, "#") == 0) line = body.find('\n', line) + 1;
    out += body.substr(0, line) + pad + "- " + body.substr(line + indent + 2);
  }
}

void write_json(const Node& n, int indent, std::string& out) {
  if (is_scalar(n)) {
    out += n.kind == Node::Kind::kString ? json_string(n.text) : n.text;
    return;
  }
  const bool is_map = n.kind == Node::Kind::kMap;
  const size_t size = is_map ? n.fields.size() : n.items.size();
  if (size == 0) {
    out += is_map ? "{}" : "[]";
    return;
  }
  const std::string pad(indent + 2, ' ');
  out += is_map ? "{\n" : "[\n";
  for (size_t i = 0; i < size; ++i) {
    out += pad;
    if (is_map) out += json_string(n.fields[i].key) + ": ";
    write_json(is_map ? n.fields[i].value : n.items[i], indent + 2, out);
    out += i + 1 < size ? ",\n" : "\n";
  }
  out += std::string(indent, ' ') + (is_map ? "}" : "]");
}

// ---- options ----

const TpuType* find_tpu(const std::string& name) {
  for (const TpuType& t : known_tpu_types())
    if (name == t.name) return &t;
  return nullptr;
}

int hosts_of(const K8sRenderOptions& o) {
  if (o.hosts > 0) return o.hosts;
  const TpuType* tpu = find_tpu(o.tpu);
  return tpu != nullptr ? tpu->hosts : o.hosts;
}

int nproc_of(const K8sRenderOptions& o) {
  if (o.nproc_per_host > 0) return o.nproc_per_host;
  return o.gpus_per_host > 0 ? o.gpus_per_host : 1;
}

bool is_dns_label(const std::string& s, bool letter_first) {
  if (s.empty() || s.size() > kMaxDnsLabel || s.back() == '-') return false;
  if (letter_first ? !(s[0] >= 'a' && s[0] <= 'z') : s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

bool is_dns_subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find('.', start), s.size());
    if (!is_dns_label(s.substr(start, end - start), false)) return false;
    start = end + 1;
  }
  return true;
}

// A Kubernetes resource quantity as users write them: 4, 500m, 1.5, 64Gi, 1e3.
bool is_quantity(const std::string& s) {
  size_t i = 0;
  const size_t digits_start = i;
  bool dot = false;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '.' && !dot)))
    dot |= s[i++] == '.';
  if (i == digits_start || (i - digits_start == 1 && dot)) return false;
  const std::string suffix = s.substr(i);
  for (const char* ok : {"", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"})
    if (suffix == ok) return true;
  if (suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    const size_t start = suffix[1] == '-' || suffix[1] == '+' ? 2 : 1;
    return start < suffix.size() && std::all_of(suffix.begin() + start, suffix.end(),
                                                [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  }
  return false;
}

std::string known_tpu_names() {
  std::string names;
  for (const TpuType& t : known_tpu_types()) names += (names.empty() ? "" : ", ") + std::string(t.name);
  return names;
}

// `$` -> `$$`: Kubernetes expands $(VAR) in command and args, and turns $$ into $.
std::string escape_dollars(const std::string& s) {
  std::string out;
  for (const char c : s) out += c == '$' ? "$$" : std::string(1, c);
  return out;
}

std::string pod0_host(const K8sRenderOptions& o) {
  return o.jobset ? fmt::format("{}-{}-0-0.{}", o.name, kReplicatedJob, o.name)
                  : fmt::format("{}-0.{}", o.name, o.name);
}

// ---- the manifests ----

Node labels(const K8sRenderOptions& o) {
  return map().add("app.kubernetes.io/name", str("tessera")).add("app.kubernetes.io/instance", str(o.name));
}

Node metadata(const K8sRenderOptions& o) {
  Node m = map().add("name", str(o.name));
  if (!o.namespace_name.empty()) m.add("namespace", str(o.namespace_name));
  return std::move(m.add("labels", labels(o)));
}

Node exit_code_rule(const char* action, int code, std::string comment) {
  Node codes = map().add("containerName", str(kContainer)).add("operator", str("In"));
  codes.add("values", list().push(num(code)));
  return commented(std::move(comment), map().add("action", str(action)).add("onExitCodes", std::move(codes)));
}

Node disruption_rule(const char* action, std::string comment) {
  Node condition = map().add("type", str("DisruptionTarget")).add("status", str("True"));
  return commented(std::move(comment),
                   map().add("action", str(action)).add("onPodConditions", list().push(std::move(condition))));
}

Node pod_failure_policy(const K8sRenderOptions& o) {
  Node rules = list();
  rules.push(exit_code_rule("FailJob", 2, "exit 2: a usage or config error; retrying cannot help"));
  if (o.jobset) {
    rules.push(disruption_rule("FailJob",
                               "preemption, eviction, node drain: fail this Job so that JobSet restarts the whole set\n"
                               "(rule index 1: the JobSet rule Disruption matches its message)"));
  } else {
    rules.push(disruption_rule("Ignore", "preemption, eviction, node drain: recreate the pod, not counted"));
    rules.push(exit_code_rule("Count", 75,
                              "exit 75: tessera launch spent its restarts in this pod; recreate it, counted against\n"
                              "backoffLimit (Ignore would retry a deterministic crash forever)"));
  }
  return map().add("rules", std::move(rules));
}

Node container(const K8sRenderOptions& o) {
  Node c = map().add("name", str(kContainer)).add("image", str(o.image));
  Node command = list();
  for (const std::string& arg : k8s_pod_command(o)) command.push(str(arg));
  c.add("command", std::move(command));
  Node index = map().add("fieldRef", map().add("fieldPath", str(kIndexAnnotation)));
  Node env_var = map().add("name", str("JOB_COMPLETION_INDEX")).add("valueFrom", std::move(index));
  c.add("env", commented("the pod's index = its --node-rank (expanded in the command by Kubernetes)",
                         list().push(std::move(env_var))));
  c.add("ports", list().push(map().add("name", str("coordinator")).add("containerPort", num(o.port))));
  Node limits = map();
  Node requests = map();
  if (o.gpus_per_host > 0) limits.add("nvidia.com/gpu", num(o.gpus_per_host));
  if (const TpuType* tpu = find_tpu(o.tpu)) limits.add("google.com/tpu", num(tpu->chips_per_host));
  if (!o.cpu.empty()) requests.add("cpu", str(o.cpu));
  if (!o.memory.empty()) requests.add("memory", str(o.memory));
  Node resources = map();
  if (!limits.fields.empty()) resources.add("limits", std::move(limits));
  if (!requests.fields.empty()) resources.add("requests", std::move(requests));
  if (!resources.fields.empty()) c.add("resources", std::move(resources));
  Node mount = map().add("name", str("checkpoints")).add("mountPath", str(o.checkpoint_dir));
  c.add("volumeMounts", list().push(std::move(mount)));
  return c;
}

Node pod_template(const K8sRenderOptions& o) {
  Node spec = map();
  if (!o.jobset)
    spec.add("subdomain", commented("pods resolve as NAME-INDEX.NAME through the headless Service", str(o.name)));
  spec.add("restartPolicy",
           commented("podFailurePolicy needs Never; restarts are the launcher's and the Job's", str("Never")));
  spec.add("terminationGracePeriodSeconds",
           commented("SIGTERM reaches tessera launch, whose workers save a checkpoint before they stop",
                     num(o.termination_grace_s)));
  if (const TpuType* tpu = find_tpu(o.tpu)) {
    spec.add("nodeSelector", map()
                                 .add("cloud.google.com/gke-tpu-accelerator", str(tpu->accelerator))
                                 .add("cloud.google.com/gke-tpu-topology", str(tpu->topology)));
  }
  spec.add("containers", list().push(container(o)));
  Node volume = map().add("name", str("checkpoints"));
  if (o.checkpoint_claim.empty()) {
    volume.add("emptyDir", commented("per pod: checkpoints do not survive the pod (give --checkpoint-claim)", map()));
  } else {
    volume.add("persistentVolumeClaim", commented("shared by every pod: a ReadWriteMany claim",
                                                  map().add("claimName", str(o.checkpoint_claim))));
  }
  spec.add("volumes", list().push(std::move(volume)));
  return map().add("metadata", map().add("labels", labels(o))).add("spec", std::move(spec));
}

Node job_spec(const K8sRenderOptions& o) {
  const int hosts = hosts_of(o);
  Node spec = map().add("completionMode", str("Indexed")).add("completions", num(hosts)).add("parallelism", num(hosts));
  spec.add("backoffLimit", o.jobset
                               ? commented("any pod failure fails this Job; JobSet's failurePolicy decides", num(0))
                               : num(o.max_restarts));
  spec.add("podFailurePolicy", pod_failure_policy(o));
  spec.add("template", pod_template(o));
  return spec;
}

Node service(const K8sRenderOptions& o) {
  Node spec = map().add("clusterIP", str("None"));
  spec.add("publishNotReadyAddresses", commented("peers resolve before they are ready", boolean(true)));
  spec.add("selector", map().add("batch.kubernetes.io/job-name", str(o.name)));
  spec.add("ports", list().push(map().add("name", str("coordinator")).add("port", num(o.port))));
  return map()
      .add("apiVersion", str("v1"))
      .add("kind", str("Service"))
      .add("metadata", metadata(o))
      .add("spec", std::move(spec));
}

Node job(const K8sRenderOptions& o) {
  return map()
      .add("apiVersion", str("batch/v1"))
      .add("kind", str("Job"))
      .add("metadata", metadata(o))
      .add("spec", job_spec(o));
}

Node jobset_rule(const char* name, const char* action, int pod_rule, std::string comment) {
  Node rule = map().add("name", str(name)).add("action", str(action));
  rule.add("onJobFailureReasons", list().push(str("PodFailurePolicy")));
  // The Job controller's message ends "matching FailJob rule at index I".
  rule.add("onJobFailureMessagePatterns",
           list().push(str(fmt::format("matching FailJob rule at index {}$", pod_rule))));
  return commented(std::move(comment), std::move(rule));
}

Node jobset(const K8sRenderOptions& o) {
  Node spec = map();
  spec.add("network",
           commented("pods resolve as NAME-workers-0-INDEX.NAME",
                     map().add("enableDNSHostnames", boolean(true)).add("publishNotReadyAddresses", boolean(true))));
  Node rules = list();
  rules.push(jobset_rule("UsageError", "FailJobSet", 0, "exit 2 in any pod: fail at once"));
  rules.push(jobset_rule("Disruption", "RestartJobSetAndIgnoreMaxRestarts", 1,
                         "preemption or eviction: restart, not counted"));
  spec.add("failurePolicy",
           commented("any other failure (exit 75 included) restarts every pod, at most maxRestarts times",
                     map().add("maxRestarts", num(o.max_restarts)).add("rules", std::move(rules))));
  Node replicated = map().add("name", str(kReplicatedJob)).add("replicas", num(1));
  replicated.add("template", map().add("spec", job_spec(o)));
  spec.add("replicatedJobs", list().push(std::move(replicated)));
  return map()
      .add("apiVersion", str("jobset.x-k8s.io/v1alpha2"))
      .add("kind", str("JobSet"))
      .add("metadata", metadata(o))
      .add("spec", std::move(spec));
}

std::string yaml_header(const K8sRenderOptions& o) {
  std::string h = "Rendered by `tessera k8s render` (docs/orchestration.md).\n";
  h += fmt::format("{} pod(s), one per host, each running `tessera launch` with {} rank(s): --node-rank is the\n",
                   hosts_of(o), nproc_of(o));
  h += fmt::format("pod's completion index, the coordinator pod 0 at {}.\n", k8s_coordinator(o));
  if (o.jobset) h += "Needs the JobSet controller, v0.10 or later (onJobFailureMessagePatterns).\n";
  for (const std::string& warning : k8s_render_warnings(o)) {  // wrapped at 90 columns
    std::string line = "Note:";
    size_t start = 0;
    while (start < warning.size()) {
      const size_t end = std::min(warning.find(' ', start), warning.size());
      if (line.size() + 1 + (end - start) > 90) h += line + "\n", line = " ";
      line += " " + warning.substr(start, end - start);
      start = end + 1;
    }
    h += line + "\n";
  }
  std::string out;
  write_comment(h, 0, out);
  return out;
}

}  // namespace

const std::vector<TpuType>& known_tpu_types() {
  // XPK's system characteristics (src/xpk/core/system_characteristics.py): 4 chips per VM
  // for multi-host slices, hosts = chips / 4; the name counts TensorCores (2 per v4/v5p chip).
  static const std::vector<TpuType> types = {
      {"v4-8", "tpu-v4-podslice", "2x2x1", 1, 4},
      {"v4-16", "tpu-v4-podslice", "2x2x2", 2, 4},
      {"v4-32", "tpu-v4-podslice", "2x2x4", 4, 4},
      {"v5p-8", "tpu-v5p-slice", "2x2x1", 1, 4},
      {"v5p-16", "tpu-v5p-slice", "2x2x2", 2, 4},
      {"v5p-32", "tpu-v5p-slice", "2x2x4", 4, 4},
      {"v5p-64", "tpu-v5p-slice", "2x4x4", 8, 4},
      {"v5p-128", "tpu-v5p-slice", "4x4x4", 16, 4},
      {"v5litepod-8", "tpu-v5-lite-podslice", "2x4", 2, 4},
      {"v5litepod-16", "tpu-v5-lite-podslice", "4x4", 4, 4},
      {"v5litepod-32", "tpu-v5-lite-podslice", "4x8", 8, 4},
      {"v5litepod-64", "tpu-v5-lite-podslice", "8x8", 16, 4},
      {"v6e-4", "tpu-v6e-slice", "2x2", 1, 4},
      {"v6e-8", "tpu-v6e-slice", "2x4", 2, 4},
      {"v6e-16", "tpu-v6e-slice", "4x4", 4, 4},
      {"v6e-32", "tpu-v6e-slice", "4x8", 8, 4},
      {"v6e-64", "tpu-v6e-slice", "8x8", 16, 4},
      {"v6e-256", "tpu-v6e-slice", "16x16", 64, 4},
  };
  return types;
}

void validate_k8s_options(const K8sRenderOptions& o) {
  if (!is_dns_label(o.name, true))
    fail<ValueError>(
        "--name '{}': expected a DNS-1035 label (at most 63 characters: lowercase letters, digits and '-', starting "
        "with a letter and ending with a letter or digit), since it names the Service and the pods' hostnames",
        o.name);
  if (!o.namespace_name.empty() && !is_dns_label(o.namespace_name, false))
    fail<ValueError>(
        "--namespace '{}': expected a DNS-1123 label (at most 63 characters: lowercase letters, digits "
        "and '-', starting and ending with a letter or digit)",
        o.namespace_name);
  if (o.image.empty()) fail<ValueError>("--image is required: the container image that has the tessera binary");
  if (std::any_of(o.image.begin(), o.image.end(), [](unsigned char c) { return c <= ' ' || c == 0x7F; }))
    fail<ValueError>("--image '{}': expected an image reference without spaces or control characters", o.image);
  const TpuType* tpu = nullptr;
  if (!o.tpu.empty()) {
    tpu = find_tpu(o.tpu);
    if (tpu == nullptr) fail<ValueError>("--tpu '{}': unknown TPU type (known: {})", o.tpu, known_tpu_names());
    if (o.gpus_per_host > 0)
      fail<ValueError>("--tpu {} and --gpus-per-host {} exclude each other (a pod gets TPU chips or GPUs)", o.tpu,
                       o.gpus_per_host);
    if (o.hosts > 0 && o.hosts != tpu->hosts)
      fail<ValueError>("--hosts {} disagrees with --tpu {}, a slice of {} host(s) with {} chips each (omit --hosts)",
                       o.hosts, o.tpu, tpu->hosts, tpu->chips_per_host);
  }
  if (o.hosts < 0 || (o.hosts == 0 && tpu == nullptr))
    fail<ValueError>("--hosts {}: expected the number of pods, one per host (>= 1)", o.hosts);
  if (o.gpus_per_host < 0) fail<ValueError>("--gpus-per-host {}: expected 0 or more", o.gpus_per_host);
  if (o.nproc_per_host < 0) fail<ValueError>("--nproc-per-host {}: expected 1 or more", o.nproc_per_host);
  if (o.gpus_per_host > 0 && o.nproc_per_host > 0 && o.nproc_per_host != o.gpus_per_host)
    fail<ValueError>("--nproc-per-host {} disagrees with --gpus-per-host {} (one rank per GPU; omit --nproc-per-host)",
                     o.nproc_per_host, o.gpus_per_host);
  if (o.port < 1 || o.port > 65535) fail<ValueError>("--port {}: expected a TCP port, 1..65535", o.port);
  if (o.max_restarts < 0) fail<ValueError>("--max-restarts {}: expected 0 or more", o.max_restarts);
  if (o.launch_max_restarts < -1)
    fail<ValueError>("--launch-max-restarts {}: expected 0 or more", o.launch_max_restarts);
  if (o.termination_grace_s < 0)
    fail<ValueError>("--termination-grace {}: expected seconds, 0 or more", o.termination_grace_s);
  if (!o.checkpoint_claim.empty() && !is_dns_subdomain(o.checkpoint_claim))
    fail<ValueError>(
        "--checkpoint-claim '{}': expected a PersistentVolumeClaim name (a DNS-1123 subdomain: lowercase "
        "letters, digits, '-' and '.', at most 253 characters)",
        o.checkpoint_claim);
  if (o.checkpoint_dir.empty() || o.checkpoint_dir.front() != '/' || o.checkpoint_dir.find(':') != std::string::npos)
    fail<ValueError>("--checkpoint-dir '{}': expected an absolute path without ':' (where the volume is mounted)",
                     o.checkpoint_dir);
  for (const auto& [flag, value] : {std::pair{"--cpu", &o.cpu}, std::pair{"--memory", &o.memory}})
    if (!value->empty() && !is_quantity(*value))
      fail<ValueError>("{} '{}': expected a Kubernetes quantity (e.g. 8, 500m, 64Gi)", flag, *value);
  if (o.tessera.empty()) fail<ValueError>("--tessera-bin: expected the path of tessera in the image");
  if (o.command.empty())
    fail<ValueError>("no command: usage: tessera k8s render --hosts N --image IMAGE [options] -- COMMAND ARGS...");
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < o.command.size(); ++i)
    if (!decode_utf8(o.command[i], cps))
      fail<ValueError>("command argument {} is not valid UTF-8 (manifests are UTF-8 text)", i + 1);
  for (const auto& [flag, value] : {std::pair{"--run-dir", &o.run_dir}, std::pair{"--tessera-bin", &o.tessera},
                                    std::pair{"--checkpoint-dir", &o.checkpoint_dir}})
    if (!decode_utf8(*value, cps)) fail<ValueError>("{}: not valid UTF-8 (manifests are UTF-8 text)", flag);
  // Pod hostnames are DNS labels: NAME-INDEX for the Job; for the JobSet its webhook
  // also counts the pod name's random suffix: NAME-workers-0-INDEX-xxxxx.
  const int hosts = hosts_of(o);
  const std::string last =
      o.jobset ? fmt::format("NAME-{}-0-{}-xxxxx", kReplicatedJob, hosts - 1) : fmt::format("NAME-{}", hosts - 1);
  const size_t suffix = last.size() - 4;
  if (o.name.size() + suffix > kMaxDnsLabel)
    fail<ValueError>(
        "--name '{}' is too long: the last pod's {} {} must fit in 63 characters, so NAME can have at "
        "most {} here",
        o.name, o.jobset ? "name" : "hostname", last, kMaxDnsLabel - suffix);
}

std::vector<std::string> k8s_render_warnings(const K8sRenderOptions& o) {
  std::vector<std::string> notes;
  if (o.checkpoint_claim.empty())
    notes.push_back(
        fmt::format("no --checkpoint-claim: {} is an emptyDir, one per pod, so checkpoints do not survive "
                    "a pod's recreation and pods do not share them; give a ReadWriteMany claim",
                    o.checkpoint_dir));
  if (o.gpus_per_host > 1)
    notes.push_back(
        fmt::format("--gpus-per-host {}: more than one GPU per pod needs GPU SPMD (issue 27), which has not "
                    "landed",
                    o.gpus_per_host));
  if (!o.tpu.empty())
    notes.push_back("--tpu: tessera has no TPU backend; the pods get the TPU hosts and tessera runs on their CPUs");
  return notes;
}

std::vector<std::string> k8s_pod_command(const K8sRenderOptions& o) {
  std::vector<std::string> argv = {escape_dollars(o.tessera),
                                   "launch",
                                   "--nnodes",
                                   std::to_string(hosts_of(o)),
                                   "--node-rank",
                                   "$(JOB_COMPLETION_INDEX)",
                                   "--coordinator",
                                   k8s_coordinator(o),
                                   "--nproc-per-host",
                                   std::to_string(nproc_of(o))};
  if (o.launch_max_restarts >= 0) argv.insert(argv.end(), {"--max-restarts", std::to_string(o.launch_max_restarts)});
  if (!o.run_dir.empty()) argv.insert(argv.end(), {"--run-dir", escape_dollars(o.run_dir)});
  argv.push_back("--");
  for (const std::string& arg : o.command) argv.push_back(escape_dollars(arg));
  return argv;
}

std::string k8s_coordinator(const K8sRenderOptions& o) { return fmt::format("{}:{}", pod0_host(o), o.port); }

std::string render_k8s_manifests(const K8sRenderOptions& o, ManifestFormat format) {
  validate_k8s_options(o);
  std::vector<Node> documents;
  if (o.jobset) {
    documents.push_back(jobset(o));
  } else {
    documents.push_back(service(o));
    documents.push_back(job(o));
  }
  std::string out;
  if (format == ManifestFormat::kJson) {
    Node items = list();
    for (Node& d : documents) items.push(std::move(d));
    write_json(map().add("apiVersion", str("v1")).add("kind", str("List")).add("items", std::move(items)), 0, out);
    return out + "\n";
  }
  out = yaml_header(o);
  for (size_t i = 0; i < documents.size(); ++i) {
    if (i > 0) out += "---\n";
    write_yaml(documents[i], 0, out);
  }
  return out;
}

}  // namespace tessera::launch
