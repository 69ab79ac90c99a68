// TensorBoard event files (train/tensorboard.h): CRC32C against the published vectors;
// a written file parsed back by an independent reader (TFRecord framing, both CRCs,
// protobuf decode) holds every scalar with its step and tag; a flipped byte fails the
// reader's CRC check; the writer still produces the committed fixture byte for byte and
// TensorBoard's own reader (tests/oracles/tensorboard_events.py, committed golden) read
// it as written; the trainer's event files hold exactly the metrics.jsonl figures,
// checked live with TensorBoard's reader when .venv-oracles has it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/train/tensorboard.h"
#include "tessera/train/trainer.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

// ---- an independent reader: TFRecord framing + CRC checks + protobuf decode ----

struct Scalar {
  std::string tag;
  int64_t step = 0;
  float value = 0;
  double wall_time = 0;
};

struct EventFile {
  std::string file_version;  // from the first event
  double first_wall_time = 0;
  std::vector<Scalar> scalars;
};

// Bitwise CRC-32C (no table), so the reader does not share the writer's code.
uint32_t reference_crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t reference_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t read_le(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return v;
}

class ProtoReader {
 public:
  explicit ProtoReader(std::string_view data) : data_(data) {}
  bool done() const { return pos_ >= data_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) throw std::runtime_error("protobuf: truncated varint");
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    throw std::runtime_error("protobuf: varint longer than 10 bytes");
  }
  std::string_view take(size_t n) {
    if (n > data_.size() - pos_) throw std::runtime_error("protobuf: field runs past the message");
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  // Returns (field, wire type); the caller reads or skips the value.
  std::pair<uint32_t, uint32_t> key() {
    const uint64_t k = varint();
    return {static_cast<uint32_t>(k >> 3), static_cast<uint32_t>(k & 7)};
  }
  std::string_view value(uint32_t wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        return {};
      case 1:
        return take(8);
      case 2:
        return take(varint());
      case 5:
        return take(4);
      default:
        throw std::runtime_error("protobuf: unknown wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

double as_double(std::string_view b) {
  const uint64_t bits = read_le(b);
  double d = 0;
  std::memcpy(&d, &bits, 8);
  return d;
}

float as_float(std::string_view b) {
  const auto bits = static_cast<uint32_t>(read_le(b));
  float f = 0;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Throws std::runtime_error naming what is wrong (framing, a CRC, the protobuf).
EventFile read_event_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string_view all(bytes);
  EventFile file;
  size_t pos = 0;
  for (int record = 0; pos < all.size(); ++record) {
    const std::string where = "record " + std::to_string(record) + " at byte " + std::to_string(pos);
    if (all.size() - pos < 12) throw std::runtime_error(where + ": truncated header");
    const std::string_view len_bytes = all.substr(pos, 8);
    if (read_le(all.substr(pos + 8, 4)) != reference_mask(reference_crc32c(len_bytes)))
      throw std::runtime_error(where + ": length CRC mismatch");
    const uint64_t len = read_le(len_bytes);
    if (len > all.size() - pos - 12 || all.size() - pos - 12 - len < 4)
      throw std::runtime_error(where + ": truncated data");
    const std::string_view data = all.substr(pos + 12, len);
    if (read_le(all.substr(pos + 12 + len, 4)) != reference_mask(reference_crc32c(data)))
      throw std::runtime_error(where + ": data CRC mismatch");
    pos += 12 + len + 4;

    double wall_time = 0;
    int64_t step = 0;
    std::string file_version;
    std::vector<std::pair<std::string, float>> values;
    ProtoReader event(data);
    while (!event.done()) {
      const auto [field, wire] = event.key();
      if (wire == 0) {
        const uint64_t v = event.varint();
        if (field == 2) step = static_cast<int64_t>(v);
        continue;
      }
      const std::string_view v = event.value(wire);
      if (field == 1 && wire == 1) {
        wall_time = as_double(v);
      } else if (field == 3 && wire == 2) {
        file_version = std::string(v);
      } else if (field == 5 && wire == 2) {
        ProtoReader summary(v);
        while (!summary.done()) {
          const auto [sf, sw] = summary.key();
          const std::string_view sv = summary.value(sw);
          if (sf != 1 || sw != 2) continue;
          ProtoReader value(sv);
          std::string tag;
          std::optional<float> simple;
          while (!value.done()) {
            const auto [vf, vw] = value.key();
            const std::string_view vv = value.value(vw);
            if (vf == 1 && vw == 2) tag = std::string(vv);
            if (vf == 2 && vw == 5) simple = as_float(vv);
          }
          if (!simple) throw std::runtime_error(where + ": summary value '" + tag + "' has no simple_value");
          values.emplace_back(tag, *simple);
        }
      }
    }
    if (record == 0) {
      if (file_version.empty()) throw std::runtime_error("the first event has no file_version");
      file.file_version = file_version;
      file.first_wall_time = wall_time;
    }
    for (const auto& [tag, value] : values) file.scalars.push_back({tag, step, value, wall_time});
  }
  return file;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {(std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()};
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// A clock that ticks a quarter second per call from a fixed start.
TensorBoardOptions fixed_clock(std::string file_name = "") {
  auto t = std::make_shared<double>(1700000000.0);
  TensorBoardOptions o;
  o.clock = [t] {
    const double now = *t;
    *t += 0.25;
    return now;
  };
  o.file_name = std::move(file_name);
  return o;
}

// ---- CRC32C ----

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("The quick brown fox jumps over the lazy dog"), 0x22620404u);
  // Continuing a CRC equals one pass over the whole input.
  EXPECT_EQ(crc32c("56789", crc32c("1234")), 0xE3069283u);
  // Agrees with the test's bitwise implementation on odd lengths.
  std::string text;
  for (int i = 0; i < 1000; ++i) {
    text.push_back(static_cast<char>((i * 131 + 7) & 0xFF));
    ASSERT_EQ(crc32c(text), reference_crc32c(text)) << "length " << text.size();
  }
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0xE3069283u), reference_mask(0xE3069283u));
}

TEST(TensorBoardEncoding, FramingAndEvents) {
  const std::string frame = tfrecord_frame("abc");
  ASSERT_EQ(frame.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(read_le(std::string_view(frame).substr(0, 8)), 3u);
  EXPECT_EQ(frame.substr(12, 3), "abc");
  // A scalar event, byte for byte: wall_time 1.5, step 300, Value{tag "a", simple_value 2.0}.
  const std::string expected = std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) + "\x10\xac\x02" +
                               std::string("\x2a\x0a\x0a\x08\x0a\x01\x61\x15\x00\x00\x00\x40", 12);
  EXPECT_EQ(encode_scalar_event(1.5, 300, "a", 2.0f), expected);
  EXPECT_EQ(encode_file_version_event(0.0), std::string("\x09\0\0\0\0\0\0\0\0\x1a\x0d", 11) + "brain.Event:2");
}

// ---- the writer ----

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("tessera_tensorboard_"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TensorBoardWriterTest, WrittenFileReadsBackWithEveryScalar) {
  const std::vector<std::tuple<std::string, int64_t, double>> written = {
      {"train/loss", 1, 5.5451},     {"train/lr", 1, 3e-4},
      {"train/grad_norm", 1, 12.25}, {"train/loss", 2, 4.0},
      {"train/lr", 2, 6e-4},         {"val/loss", 2, 3.75},
      {"train/loss", 0, -1.5},       {"train/tokens", 1LL << 40, 1e30},
      {"train/mfu", -3, 1e-9}};
  fs::path path;
  {
    TensorBoardWriter writer(dir_ / "tb", fixed_clock());
    path = writer.path();
    for (const auto& [tag, step, value] : written) writer.add_scalar(tag, value, step);
    writer.close();
  }
  EXPECT_EQ(path.parent_path(), dir_ / "tb");
  EXPECT_TRUE(path.filename().string().starts_with("events.out.tfevents.1700000000.")) << path;
  const EventFile file = read_event_file(path);
  EXPECT_EQ(file.file_version, "brain.Event:2");
  EXPECT_DOUBLE_EQ(file.first_wall_time, 1700000000.0);
  ASSERT_EQ(file.scalars.size(), written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& [tag, step, value] = written[i];
    EXPECT_EQ(file.scalars[i].tag, tag) << i;
    EXPECT_EQ(file.scalars[i].step, step) << tag;
    EXPECT_EQ(file.scalars[i].value, static_cast<float>(value)) << tag;
    EXPECT_DOUBLE_EQ(file.scalars[i].wall_time, 1700000000.0 + 0.25 * static_cast<double>(i + 1)) << tag;
  }
}

TEST_F(TensorBoardWriterTest, AStepsScalarsAreOnDiskBeforeClose) {
  TensorBoardWriter writer(dir_, fixed_clock());
  writer.add_scalars(7, {{"train/loss", 2.5}, {"train/lr", 0.01}});
  // Read while the writer is still open, as a live TensorBoard would.
  const EventFile file = read_event_file(writer.path());
  ASSERT_EQ(file.scalars.size(), 2u);
  EXPECT_EQ(file.scalars[1].tag, "train/lr");
  EXPECT_EQ(file.scalars[1].step, 7);
  writer.add_scalar("train/loss", 1.0, 8);  // buffered until flush
  EXPECT_EQ(read_event_file(writer.path()).scalars.size(), 2u);
  writer.flush();
  EXPECT_EQ(read_event_file(writer.path()).scalars.size(), 3u);
}

TEST_F(TensorBoardWriterTest, CorruptedBytesFailTheCrcCheck) {
  fs::path path;
  {
    TensorBoardWriter writer(dir_, fixed_clock());
    writer.add_scalars(1, {{"train/loss", 2.5}, {"train/lr", 0.01}});
    path = writer.path();
  }
  const std::string good = read_bytes(path);
  ASSERT_NO_THROW(read_event_file(path));
  auto corrupt_and_read = [&](size_t at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    try {
      read_event_file(path);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The last record's tag ("train/lr"): its data CRC no longer matches.
  const size_t tag_at = good.rfind("train/lr");
  ASSERT_NE(tag_at, std::string::npos);
  EXPECT_NE(corrupt_and_read(tag_at + 3).find("data CRC mismatch"), std::string::npos);
  // The second record's length field.
  const size_t first_len = read_le(std::string_view(good).substr(0, 8));
  EXPECT_NE(corrupt_and_read(12 + first_len + 4 + 1).find("length CRC mismatch"), std::string::npos);
  // A stored CRC itself.
  EXPECT_NE(corrupt_and_read(good.size() - 1).find("data CRC mismatch"), std::string::npos);
  // A truncated file.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 3);
  EXPECT_THROW(read_event_file(path), std::runtime_error);
}

TEST_F(TensorBoardWriterTest, EachWriterMakesItsOwnFile) {
  TensorBoardWriter a(dir_), b(dir_);
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(event_files(dir_).size(), 2u);
  // A fixed name is never overwritten.
  TensorBoardWriter c(dir_, fixed_clock("events.out.tfevents.1.fixed"));
  try {
    TensorBoardWriter d(dir_, fixed_clock("events.out.tfevents.1.fixed"));
    ADD_FAILURE() << "a second writer opened " << d.path();
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("events.out.tfevents.1.fixed"), std::string::npos) << e.what();
  }
}

TEST_F(TensorBoardWriterTest, UnwritableDirectoryIsAnIOErrorNamingIt) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a_file") << "x";
  const fs::path bad = dir_ / "a_file" / "tensorboard";
  try {
    TensorBoardWriter writer(bad);
    ADD_FAILURE() << "wrote into " << writer.path();
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
  }
  TensorBoardWriter closed(dir_ / "ok");
  closed.close();
  EXPECT_THROW(closed.add_scalar("train/loss", 1.0, 1), IOError);
}

// ---- the committed fixture and TensorBoard's reading of it (the oracle's golden) ----

const fs::path kFixtureDir = fs::path(TESSERA_SOURCE_DIR) / "tests/train/fixtures/tensorboard";
constexpr const char* kFixtureName = "events.out.tfevents.1700000000.fixture";

struct FixtureScalar {
  const char* tag;
  int64_t step;
  double value;
};
const std::vector<FixtureScalar> kFixtureScalars = {{"train/loss", 1, 5.545177444479562},
                                                    {"train/lr", 1, 1e-4},
                                                    {"train/grad_norm", 1, 3.25},
                                                    {"train/loss", 2, 4.1},
                                                    {"train/lr", 2, 2e-4},
                                                    {"train/grad_norm", 2, 0.1},
                                                    {"val/loss", 2, 3.9},
                                                    {"train/mfu", 2, 0.0123},
                                                    {"train/tokens_per_s", 2, 123456.75},
                                                    {"train/loss", 3, -0.5},
                                                    {"train/lr", 3, 3.0e-12},
                                                    {"train/tokens", 1099511627776, 1e20}};

void write_fixture(const fs::path& dir) {
  TensorBoardWriter writer(dir, fixed_clock(kFixtureName));
  int64_t step = -1;
  std::vector<std::pair<std::string, double>> pending;
  for (const FixtureScalar& s : kFixtureScalars) {
    if (s.step != step && !pending.empty()) {
      writer.add_scalars(step, pending);
      pending.clear();
    }
    step = s.step;
    pending.emplace_back(s.tag, s.value);
  }
  writer.add_scalars(step, pending);
  writer.close();
}

TEST_F(TensorBoardWriterTest, WriterReproducesTheFixtureTensorBoardRead) {
  write_fixture(dir_);
  const std::string bytes = read_bytes(dir_ / kFixtureName);
  if (std::getenv("TESSERA_UPDATE_TENSORBOARD_FIXTURE")) {
    fs::create_directories(kFixtureDir);
    std::ofstream(kFixtureDir / kFixtureName, std::ios::binary | std::ios::trunc) << bytes;
    GTEST_SKIP() << "wrote " << (kFixtureDir / kFixtureName)
                 << "; regenerate the golden: tests/oracles/run_oracle.sh tensorboard_events --update";
  }
  ASSERT_TRUE(fs::exists(kFixtureDir / kFixtureName))
      << "missing fixture: rerun with TESSERA_UPDATE_TENSORBOARD_FIXTURE=1";
  EXPECT_TRUE(bytes == read_bytes(kFixtureDir / kFixtureName))
      << "TensorBoardWriter no longer writes the committed fixture byte for byte; if the change is intended, "
         "rerun with TESSERA_UPDATE_TENSORBOARD_FIXTURE=1 and tests/oracles/run_oracle.sh tensorboard_events --update";

  std::ifstream in(fs::path(TESSERA_SOURCE_DIR) / "tests/oracles/goldens/tensorboard_events.json");
  ASSERT_TRUE(in) << "missing golden: run tests/oracles/run_oracle.sh tensorboard_events";
  const nlohmann::json golden = nlohmann::json::parse(in);
  EXPECT_EQ(golden.at("file_version"), "brain.Event:2");
  const nlohmann::json& read = golden.at("scalars");
  ASSERT_EQ(read.size(), kFixtureScalars.size());
  for (size_t i = 0; i < kFixtureScalars.size(); ++i) {
    const FixtureScalar& s = kFixtureScalars[i];
    // The golden is sorted by (tag, step); find this scalar in it.
    const auto it = std::find_if(read.begin(), read.end(), [&](const nlohmann::json& g) {
      return g.at("tag") == s.tag && g.at("step").get<int64_t>() == s.step;
    });
    ASSERT_NE(it, read.end()) << "TensorBoard did not find " << s.tag << " at step " << s.step;
    EXPECT_EQ(it->at("value").get<double>(), static_cast<double>(static_cast<float>(s.value))) << s.tag;
    EXPECT_DOUBLE_EQ(it->at("wall_time").get<double>(), 1700000000.0 + 0.25 * static_cast<double>(i + 1)) << s.tag;
  }
}

// ---- the trainer ----

class TrainerTensorBoardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("tessera_trainer_tb_");
    test::write_tiny_corpus(dir_, 20000, 18000);
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> overrides = {"model.family=\"gpt2\"",
                                          "model.vocab=256",
                                          "model.dim=16",
                                          "model.layers=1",
                                          "model.heads=2",
                                          "model.context=16",
                                          "train.seq=16",
                                          "train.batch=2",
                                          "train.eval_batches=1",
                                          "train.log_interval=1",
                                          "train.steps=4",
                                          "train.eval_interval=2",
                                          "schedule.warmup_steps=2",
                                          "optimizer.lr=3e-3",
                                          "run.threads=2",
                                          "run.seed=5",
                                          "data.train=\"" + (dir_ / "data/train.bin").string() + "\"",
                                          "data.val=\"" + (dir_ / "data/val.bin").string() + "\"",
                                          "run.dir=\"" + (dir_ / "run").string() + "\""};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return parse_config("", "test", overrides);
  }

  static TrainerOptions quiet(int64_t stop_at = 0) { return test::quiet_trainer(stop_at); }

  // (tag, step) -> the values of every figure in metrics.jsonl, in file order, by the
  // trainer's naming rule (a stopped attempt's final evaluation repeats a step).
  std::map<std::pair<std::string, int64_t>, std::vector<double>> metrics_scalars() const {
    std::map<std::pair<std::string, int64_t>, std::vector<double>> out;
    std::ifstream in(dir_ / "run/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json record = nlohmann::json::parse(line);
      const int64_t step = record.at("step").get<int64_t>();
      for (const auto& [key, value] : record.items()) {
        if (key == "step" || key == "final") continue;
        const std::string tag = key == "val_loss" ? "val/loss" : "train/" + key;
        out[{tag, step}].push_back(value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>());
      }
    }
    return out;
  }

  fs::path dir_;
};

TEST_F(TrainerTensorBoardTest, EventFilesHoldTheMetricsJsonlFigures) {
  // A run stopped at step 2 and resumed: two event files in one directory.
  Trainer(config(), quiet(/*stop_at=*/2)).run();
  Trainer(config(), quiet()).run();
  const std::vector<fs::path> files = event_files(dir_ / "run/tensorboard");
  ASSERT_EQ(files.size(), 2u) << "one event file per attempt";

  std::map<std::pair<std::string, int64_t>, std::vector<float>> tb;
  std::set<std::string> goodput_tags;
  for (const fs::path& f : files) {
    const EventFile file = read_event_file(f);
    EXPECT_EQ(file.file_version, "brain.Event:2");
    for (const Scalar& s : file.scalars) {
      if (s.tag.starts_with("goodput/")) {
        goodput_tags.insert(s.tag);
        EXPECT_GT(s.value, 0.0f) << s.tag;
        EXPECT_LE(s.value, 1.0f) << s.tag;
        continue;
      }
      tb[{s.tag, s.step}].push_back(s.value);
    }
  }
  const auto metrics = metrics_scalars();
  EXPECT_EQ(metrics.at({"val/loss", 2}).size(), 2u) << "the stopped attempt's final evaluation repeats step 2";
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu", "val/loss"})
    EXPECT_TRUE(metrics.contains({tag, 2})) << tag << " missing from metrics.jsonl";
  EXPECT_EQ(tb.size(), metrics.size());
  for (const auto& [key, value] : metrics) {
    const auto it = tb.find(key);
    ASSERT_NE(it, tb.end()) << key.first << " at step " << key.second << " is not in the event files";
    std::vector<float> expected;
    for (double v : value) expected.push_back(static_cast<float>(v));
    EXPECT_EQ(it->second, expected) << key.first << " at step " << key.second;
  }
  EXPECT_EQ(goodput_tags, (std::set<std::string>{"goodput/goodput", "goodput/runtime_goodput"}));
}

TEST_F(TrainerTensorBoardTest, SwitchedOff) {
  Trainer(config({"train.steps=2", "run.tensorboard=false"}), quiet()).run();
  EXPECT_TRUE(fs::exists(dir_ / "run/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir_ / "run/tensorboard"));
}

// TensorBoard's own reader on a trainer run, when the oracle venv has it
// (tests/oracles/run_oracle.sh tensorboard_events installs it).
TEST_F(TrainerTensorBoardTest, TensorBoardReadsTheTrainersEventsLive) {
  const fs::path root(TESSERA_SOURCE_DIR);
  const fs::path python = root / ".venv-oracles/bin/python";
  const std::string probe =
      python.string() + " -c 'import tensorboard.backend.event_processing.event_accumulator' >/dev/null 2>&1";
  if (!fs::exists(python) || std::system(probe.c_str()) != 0)
    GTEST_SKIP() << "no tensorboard in " << python
                 << ": run tests/oracles/run_oracle.sh tensorboard_events to install it and compare live";
  Trainer(config({"train.steps=3"}), quiet()).run();
  const fs::path out = dir_ / "oracle.json";
  const std::string command = python.string() + " " + (root / "tests/oracles/tensorboard_events.py").string() +
                              " --events " + (dir_ / "run/tensorboard").string() + " " + out.string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(out);
  const nlohmann::json read = nlohmann::json::parse(in);
  EXPECT_EQ(read.at("file_version"), "brain.Event:2");
  std::map<std::pair<std::string, int64_t>, double> tb;
  for (const nlohmann::json& s : read.at("scalars"))
    if (!s.at("tag").get<std::string>().starts_with("goodput/"))
      tb[{s.at("tag").get<std::string>(), s.at("step").get<int64_t>()}] = s.at("value").get<double>();
  const auto metrics = metrics_scalars();
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(tb.size(), metrics.size());
  for (const auto& [key, value] : metrics) {
    const auto it = tb.find(key);
    ASSERT_NE(it, tb.end()) << "TensorBoard did not find " << key.first << " at step " << key.second;
    ASSERT_EQ(value.size(), 1u) << key.first << " at step " << key.second;
    EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(value[0]))) << key.first << " at step " << key.second;
  }
}

}  // namespace
}  // namespace tessera::train
