// The accelerator catalog (configs/accelerators.toml): what is in it, how complete and
// plausible each entry is, and how a bad file is reported.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tessera/base/error.h"
#include "tessera/goodput/accelerators.h"
#include "tessera/goodput/devices.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::goodput;

namespace {

const fs::path kCatalogPath = fs::path(TESSERA_SOURCE_DIR) / "configs/accelerators.toml";

// The ConfigError message of parsing `text` as file "cat.toml" ("" when it parses).
std::string error_of(const std::string& text) {
  try {
    parse_accelerator_catalog(text, "cat.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A complete entry [x] with one level, to break one line of in each error test.
const std::string kEntry =
    "[x]\n"                                // 1
    "name = \"X\"\n"                       // 2
    "match = [\"X1\", \"X one\"]\n"        // 3
    "kind = \"gpu\"\n"                     // 4
    "peak_flops = 1.0e15\n"                // 5
    "dtype = \"bf16 dense\"\n"             // 6
    "peak_int8 = 2.0e15\n"                 // 7
    "memory = 80.0e9\n"                    // 8
    "memory_bandwidth = 3.0e12\n"          // 9
    "matrix_tile = [128, 128, 64]\n"       // 10
    "matrix_units = 100\n"                 // 11
    "gemm_efficiency = 0.8\n"              // 12
    "memory_efficiency = 0.9\n"            // 13
    "kernel_overhead = 4e-6\n"             // 14
    "failure_rate = 2e-5\n"                // 15
    "price = 3.5   # USD\n"                // 16
    "price_date = \"2026-11\"\n"           // 17
    "collective_overlap = 0.9\n"           // 18
    "attention_efficiency = [0.3, 0.2]\n"  // 19
    "[x.link.nvlink]\n"                    // 20
    "devices = 8\n"                        // 21
    "bandwidth = 450e9\n"                  // 22
    "latency = 3e-6\n"                     // 23
    "topology = \"switch\"\n";             // 24

// kEntry with the first line that starts with `prefix` replaced by `line` ("" drops it).
std::string with_line(const std::string& prefix, const std::string& line) {
  const size_t at = kEntry.find("\n" + prefix) + 1;
  const size_t end = kEntry.find('\n', at) + 1;
  return kEntry.substr(0, at) + (line.empty() ? "" : line + "\n") + kEntry.substr(end);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(AcceleratorCatalog, BuiltInIsTheFileAndHasEveryChip) {
  const std::vector<AcceleratorSpec> file = load_accelerator_catalog(kCatalogPath);
  const std::vector<AcceleratorSpec>& built_in = builtin_accelerator_catalog();
  ASSERT_EQ(built_in.size(), file.size());
  for (size_t i = 0; i < file.size(); ++i) {
    EXPECT_EQ(built_in[i].key, file[i].key);
    EXPECT_EQ(built_in[i].peak_flops, file[i].peak_flops);
    EXPECT_EQ(built_in[i].links.size(), file[i].links.size());
  }
  for (const char* key :
       {"h100_pcie", "h100", "h200", "b200", "a100", "l40s", "tpu_v5e", "tpu_v5p", "tpu_v6e", "cpu_xeon_amx"})
    EXPECT_TRUE(find_accelerator(built_in, key).has_value()) << key;
  EXPECT_EQ(find_accelerator(built_in, "cpu_xeon_amx")->kind, "cpu");
  EXPECT_EQ(built_in[0].source.rfind("configs/accelerators.toml:", 0), 0u) << built_in[0].source;
}

// Every entry is complete and its figures are in the range a real chip has.
TEST(AcceleratorCatalog, EveryEntryIsPlausible) {
  for (const AcceleratorSpec& a : builtin_accelerator_catalog()) {
    SCOPED_TRACE(a.key);
    EXPECT_FALSE(a.name.empty());
    EXPECT_FALSE(a.match.empty());
    EXPECT_TRUE(a.kind == "gpu" || a.kind == "tpu" || a.kind == "cpu");
    EXPECT_EQ(a.dtype, "bf16 dense");
    EXPECT_GE(a.peak_flops, 1e13);
    EXPECT_LE(a.peak_flops, 1e16);
    EXPECT_GE(a.peak_int8, a.peak_flops);  // int8 runs at least at the bf16 rate
    EXPECT_LE(a.peak_int8, 4 * a.peak_flops);
    EXPECT_GE(a.memory, 1e10);
    EXPECT_LE(a.memory, 1e13);
    EXPECT_GE(a.memory_bandwidth, 1e10);
    EXPECT_LE(a.memory_bandwidth, 1e14);
    for (int64_t t : a.matrix_tile) EXPECT_GE(t, 8);
    EXPECT_GE(a.matrix_units, 1);
    EXPECT_GT(a.gemm_efficiency, 0.3);
    EXPECT_LE(a.gemm_efficiency, 1.0);
    EXPECT_GT(a.memory_efficiency, 0.3);
    EXPECT_LE(a.memory_efficiency, 1.0);
    EXPECT_GT(a.kernel_overhead, 0);
    EXPECT_LT(a.kernel_overhead, 1e-4);
    EXPECT_GT(a.failure_rate, 0);
    EXPECT_LT(a.failure_rate, 1e-3);
    EXPECT_GT(a.price, 0);
    EXPECT_LT(a.price, 100);
    EXPECT_EQ(a.price_date.size(), 7u) << a.price_date;  // "YYYY-MM"
    // Levels grow outward, and only the outermost is unbounded.
    ASSERT_FALSE(a.links.empty());
    EXPECT_EQ(a.links.back().devices, 0);
    for (size_t i = 0; i + 1 < a.links.size(); ++i) EXPECT_GT(a.links[i].devices, 0);
    for (size_t i = 1; i + 1 < a.links.size(); ++i) EXPECT_GT(a.links[i].devices, a.links[i - 1].devices);
    for (const InterconnectLevel& level : a.links) {
      EXPECT_GE(level.bandwidth, 1e9) << level.name;
      EXPECT_LE(level.bandwidth, 1e13) << level.name;
      EXPECT_LT(level.latency, 1e-3) << level.name;
    }
    // Within a chip's reach, the inner level is at least as fast as the outer one.
    for (size_t i = 0; i + 1 < a.links.size(); ++i) EXPECT_GE(a.links[i].bandwidth, a.links[i + 1].bandwidth);
  }
}

// The H100 SXM entry is the datasheet's: 989 TFLOP/s dense bf16 (1,979 with sparsity),
// 1,979 TOP/s dense int8, 80 GB at 3.35 TB/s, 132 SMs, NVLink 900 GB/s both ways over 8
// GPUs, then 400 Gb/s per GPU of InfiniBand.
TEST(AcceleratorCatalog, H100IsTheDatasheet) {
  const AcceleratorSpec h100 = *find_accelerator(builtin_accelerator_catalog(), "h100");
  EXPECT_EQ(h100.kind, "gpu");
  EXPECT_EQ(h100.peak_flops, 989e12);
  EXPECT_EQ(h100.peak_int8, 1979e12);
  EXPECT_EQ(h100.memory, 80e9);
  EXPECT_EQ(h100.memory_bandwidth, 3.35e12);
  EXPECT_EQ(h100.matrix_tile, (std::array<int64_t, 3>{128, 128, 64}));
  EXPECT_EQ(h100.matrix_units, 132);
  ASSERT_EQ(h100.links.size(), 2u);
  EXPECT_EQ(h100.links[0].name, "nvlink");
  EXPECT_EQ(h100.links[0].devices, 8);
  EXPECT_EQ(h100.links[0].bandwidth, 450e9);
  EXPECT_EQ(h100.links[0].topology, "switch");
  EXPECT_EQ(h100.links[1].devices, 0);
  EXPECT_EQ(h100.links[1].bandwidth, 50e9);
  EXPECT_EQ(h100.links[1].topology, "network");

  const AcceleratorSpec v5p = *find_accelerator(builtin_accelerator_catalog(), "tpu_v5p");
  EXPECT_EQ(v5p.matrix_tile, (std::array<int64_t, 3>{8, 128, 128}));
  EXPECT_EQ(v5p.links[0].topology, "torus-3d");
  EXPECT_EQ(find_accelerator(builtin_accelerator_catalog(), "tpu_v6e")->matrix_tile[2], 256);
}

// By key (any case), else by a match string inside the name; a variant listed before its
// family wins.
TEST(AcceleratorCatalog, FindByKeyOrName) {
  const std::vector<AcceleratorSpec>& catalog = builtin_accelerator_catalog();
  EXPECT_EQ(find_accelerator(catalog, "H200")->key, "h200");
  EXPECT_EQ(find_accelerator(catalog, "TPU_V5E")->key, "tpu_v5e");
  EXPECT_EQ(find_accelerator(catalog, "NVIDIA H100 80GB HBM3")->key, "h100");
  EXPECT_EQ(find_accelerator(catalog, "NVIDIA H100 PCIe")->key, "h100_pcie");
  EXPECT_EQ(find_accelerator(catalog, "NVIDIA A100-SXM4-80GB")->key, "a100");
  EXPECT_EQ(find_accelerator(catalog, "TPU v6 lite trillium")->key, "tpu_v6e");
  EXPECT_EQ(find_accelerator(catalog, "Intel(R) Xeon(R) Platinum 8480+")->key, "cpu_xeon_amx");
  EXPECT_FALSE(find_accelerator(catalog, "AMD EPYC 7B13").has_value());
  EXPECT_FALSE(find_accelerator(catalog, "").has_value());
}

TEST(AcceleratorCatalog, ParsesAMinimalEntry) {
  const std::vector<AcceleratorSpec> catalog = parse_accelerator_catalog(kEntry, "cat.toml");
  ASSERT_EQ(catalog.size(), 1u);
  const AcceleratorSpec& x = catalog[0];
  EXPECT_EQ(x.source, "cat.toml:1");
  EXPECT_EQ(x.match, (std::vector<std::string>{"X1", "X one"}));
  EXPECT_EQ(x.price, 3.5);
  EXPECT_EQ(x.matrix_units, 100);
  EXPECT_EQ(x.attention_efficiency[0], 0.3);
  EXPECT_EQ(x.attention_efficiency[1], 0.2);
  ASSERT_EQ(x.links.size(), 1u);
  EXPECT_EQ(x.links[0].name, "nvlink");
  EXPECT_EQ(x.links[0].devices, 8);  // a bounded outermost level is allowed
  EXPECT_EQ(x.links[0].latency, 3e-6);
}

TEST(AcceleratorCatalog, BadNumberNamesFileLineAndKey) {
  for (const char* bad : {"lots", "1.0e15x", "1e999", "inf", "nan", "1_000", "\"1e15\"", ""}) {
    const std::string e = error_of(with_line("peak_flops", std::string("peak_flops = ") + bad));
    EXPECT_TRUE(contains(e, "cat.toml:5: [x] peak_flops")) << bad << ": " << e;
  }
  EXPECT_TRUE(contains(error_of(with_line("peak_flops", "peak_flops = -1")), "must be > 0"));
  EXPECT_TRUE(contains(error_of(with_line("gemm_efficiency", "gemm_efficiency = 1.2")), "(0, 1]"));
  EXPECT_TRUE(contains(error_of(with_line("attention_efficiency", "attention_efficiency = [0.3, 1.5]")),
                       "cat.toml:19: [x] attention_efficiency: must be a fraction in (0, 1] (got 1.5)"));
  EXPECT_TRUE(contains(error_of(with_line("attention_efficiency", "attention_efficiency = 0.3")),
                       "cat.toml:19: [x] attention_efficiency: expected 2 fractions in (0, 1], [forward, backward]"));
  // An overlap share may be 0 (nothing hidden) but not above 1.
  EXPECT_EQ(error_of(with_line("collective_overlap", "collective_overlap = 0")), "");
  EXPECT_TRUE(contains(error_of(with_line("collective_overlap", "collective_overlap = 1.5")),
                       "cat.toml:18: [x] collective_overlap: must be in [0, 1] (got 1.5)"));
  EXPECT_TRUE(contains(error_of(with_line("failure_rate", "failure_rate = -1e-5")), "[x] failure_rate: must be >= 0"));
  EXPECT_TRUE(contains(error_of(with_line("matrix_units", "matrix_units = 1.5")), "[x] matrix_units: must be a whole"));
  EXPECT_TRUE(contains(error_of(with_line("devices", "devices = -8")), "cat.toml:21: [x.link.nvlink] devices"));
  EXPECT_TRUE(contains(error_of(with_line("bandwidth", "bandwidth = 0")), "cat.toml:22: [x.link.nvlink] bandwidth"));
  EXPECT_TRUE(contains(error_of(with_line("name", "name = X")), "cat.toml:2: [x] name"));
}

TEST(AcceleratorCatalog, UnknownKeyListsTheExpectedOnes) {
  const std::string e = error_of(with_line("price =", "colour = \"red\""));
  EXPECT_TRUE(contains(e, "cat.toml:16: unknown key 'colour' in [x]")) << e;
  EXPECT_TRUE(contains(e, "name, match, kind, peak_flops")) << e;
  EXPECT_TRUE(contains(e, "price, price_date)")) << e;
  const std::string link = error_of(kEntry + "speed = 1\n");
  EXPECT_TRUE(contains(link,
                       "cat.toml:25: unknown key 'speed' in [x.link.nvlink] (expected devices, bandwidth, "
                       "latency, topology)"))
      << link;
  EXPECT_TRUE(contains(error_of(with_line("price =", "price = 1\nprice = 2")), "cat.toml:17: [x] price: set twice"));
}

TEST(AcceleratorCatalog, LinkHeaderNeedsItsTableJustBefore) {
  const std::string orphan = error_of("[h100.link.nvlink]\ndevices = 8\n");
  EXPECT_TRUE(contains(orphan, "cat.toml:1: [h100.link.nvlink]")) << orphan;
  // [x] is complete, then a level names another entry.
  const std::string other = error_of(kEntry + "[y.link.ib]\n");
  EXPECT_TRUE(contains(other, "cat.toml:25: [y.link.ib] must follow its table [y], but the latest table is [x]"))
      << other;
  EXPECT_TRUE(contains(error_of(kEntry + "[x.links.ib]\n"), "cat.toml:25: bad table header [x.links.ib]"));
  EXPECT_TRUE(contains(error_of(kEntry + "[[x]]\n"), "cat.toml:25: bad table header"));
  EXPECT_TRUE(contains(error_of(kEntry + kEntry), "cat.toml:25: [x] is defined twice (first at cat.toml:1)"));
}

TEST(AcceleratorCatalog, MissingKeyNamesTheHeaderLine) {
  EXPECT_EQ(error_of(with_line("memory_bandwidth", "")), "cat.toml:1: [x] needs memory_bandwidth");
  EXPECT_EQ(error_of(with_line("topology", "")), "cat.toml:20: [x.link.nvlink] needs topology");
  // A table is checked when the next one starts.
  EXPECT_EQ(error_of(with_line("topology", "") + "[y]\n"), "cat.toml:20: [x.link.nvlink] needs topology");
  const std::string no_links = error_of(kEntry.substr(0, kEntry.find("[x.link")));
  EXPECT_TRUE(contains(no_links, "cat.toml:1: [x] needs at least one interconnect level")) << no_links;
  EXPECT_TRUE(contains(error_of("name = \"X\"\n"), "cat.toml:1: key 'name' before any [table]"));
}

TEST(AcceleratorCatalog, BadTopologyAndKind) {
  const std::string topology = error_of(with_line("topology", "topology = \"mesh\""));
  EXPECT_TRUE(contains(topology,
                       "cat.toml:24: [x.link.nvlink] topology: \"mesh\" is not one of switch, ring, "
                       "torus-2d, torus-3d, network"))
      << topology;
  EXPECT_TRUE(contains(error_of(with_line("kind", "kind = \"npu\"")), "cat.toml:4: [x] kind: \"npu\" is not one of"));
}

TEST(AcceleratorCatalog, MatrixTileNeedsThreeWholeNumbers) {
  const std::string two = error_of(with_line("matrix_tile", "matrix_tile = [128, 128]"));
  EXPECT_TRUE(contains(two, "cat.toml:10: [x] matrix_tile: expected 3 positive whole numbers [M, N, K]")) << two;
  EXPECT_TRUE(
      contains(error_of(with_line("matrix_tile", "matrix_tile = [128, 0, 64]")), "cat.toml:10: [x] matrix_tile"));
  EXPECT_TRUE(contains(error_of(with_line("matrix_tile", "matrix_tile = [128, 128, 64")), "must close on its line"));
  EXPECT_TRUE(contains(error_of(with_line("match", "match = []")), "cat.toml:3: [x] match"));
}

TEST(AcceleratorCatalog, LevelsGrowOutward) {
  const std::string ib = "[x.link.ib]\ndevices = 0\nbandwidth = 50e9\nlatency = 5e-6\ntopology = \"network\"\n";
  EXPECT_EQ(parse_accelerator_catalog(kEntry + ib, "cat.toml")[0].links.size(), 2u);
  // devices = 0 (unbounded) only on the outermost level.
  const std::string e = error_of(with_line("devices", "devices = 0") + ib);
  EXPECT_TRUE(contains(e, "cat.toml:20: [x.link.nvlink] devices = 0 (unbounded) is only allowed on the outermost"))
      << e;
  // An outer level must join more chips than the one inside it.
  const std::string pod = "[x.link.pod]\ndevices = 8\nbandwidth = 50e9\nlatency = 5e-6\ntopology = \"switch\"\n";
  const std::string shrink = error_of(kEntry + pod);
  EXPECT_TRUE(contains(shrink, "cat.toml:25: [x.link.pod] devices = 8 must exceed the 8 of the level inside it"))
      << shrink;
  EXPECT_TRUE(contains(error_of(kEntry + "[x.link.nvlink]\n"), "cat.toml:25: [x.link.nvlink] is defined twice"));
}

TEST(AcceleratorCatalog, MissingFileIsAnIOError) {
  EXPECT_THROW(load_accelerator_catalog(fs::path(TESSERA_SOURCE_DIR) / "configs/no-such-catalog.toml"), IOError);
  EXPECT_THROW(load_device_table(fs::path(TESSERA_SOURCE_DIR) / "configs/no-such-catalog.toml"), IOError);
}

// The MFU view (goodput/devices.h) holds the gpu and tpu entries, in catalog order.
TEST(AcceleratorCatalog, DeviceTableIsItsGpuAndTpuEntries) {
  std::vector<std::string> keys;
  for (const AcceleratorSpec& a : builtin_accelerator_catalog())
    if (a.kind != "cpu") keys.push_back(a.key);
  std::vector<std::string> device_keys;
  for (const DeviceSpec& d : builtin_device_table()) device_keys.push_back(d.key);
  EXPECT_EQ(device_keys, keys);
  EXPECT_FALSE(find_device(builtin_device_table(), "Intel(R) Xeon(R) Platinum 8480+").has_value());
}
