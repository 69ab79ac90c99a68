// The TESSERA_* environment variables: declared once (base/flags.cpp), read only
// through flags::env, listed in docs/flags.md exactly as `tessera info --flags` prints.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"

namespace fs = std::filesystem;
namespace flags = tessera::flags;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every source and header of the library and the command line.
std::vector<fs::path> sources() {
  std::vector<fs::path> out;
  for (const char* root : {"src", "include"})
    for (const auto& e : fs::recursive_directory_iterator(fs::path(TESSERA_SOURCE_DIR) / root)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh") out.push_back(e.path());
    }
  return out;
}

}  // namespace

TEST(Flags, TheTableIsSortedAndEveryEntryIsDocumented) {
  std::string previous;
  for (const flags::Flag& f : flags::all()) {
    EXPECT_TRUE(f.name.starts_with("TESSERA_")) << f.name;
    EXPECT_LT(previous, std::string(f.name)) << "flags.cpp lists flags sorted by name";
    EXPECT_FALSE(f.doc.empty()) << f.name;
    EXPECT_EQ(f.doc.find('|'), std::string_view::npos) << f.name << ": the doc goes into a Markdown table";
    previous = std::string(f.name);
  }
  EXPECT_NE(flags::find("TESSERA_NUM_THREADS"), nullptr);
  EXPECT_EQ(flags::find("TESSERA_NO_SUCH_FLAG"), nullptr);
}

TEST(Flags, ReadingAnUndeclaredFlagIsAnErrorNamingIt) {
  try {
    flags::env("TESSERA_NO_SUCH_FLAG");
    FAIL() << "expected an Error";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TESSERA_NO_SUCH_FLAG"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("src/base/flags.cpp"), std::string::npos) << e.what();
  }
  ::setenv("TESSERA_CPU_DEVICES", "3", 1);
  EXPECT_STREQ(flags::env("TESSERA_CPU_DEVICES"), "3");
  ::unsetenv("TESSERA_CPU_DEVICES");
  EXPECT_EQ(flags::env("TESSERA_CPU_DEVICES"), nullptr);
  // Names that are not tessera's are read as they are.
  ::setenv("OMPI_COMM_WORLD_RANK_TEST", "1", 1);
  EXPECT_STREQ(flags::env("OMPI_COMM_WORLD_RANK_TEST"), "1");
  ::unsetenv("OMPI_COMM_WORLD_RANK_TEST");
}

TEST(Flags, IntegerValuesAreCheckedAndNamed) {
  const char* name = "TESSERA_CPU_DEVICES";
  ::unsetenv(name);
  EXPECT_EQ(flags::env_integer(name, 5, 1, 4096, "a device count"), 5);
  ::setenv(name, "", 1);
  EXPECT_EQ(flags::env_integer(name, 5, 1, 4096, "a device count"), 5);
  ::setenv(name, "4096", 1);
  EXPECT_EQ(flags::env_integer(name, 5, 1, 4096, "a device count"), 4096);
  for (const char* bad : {"0", "4097", "-2", "3.5", "2x", "x", "99999999999999999999"}) {
    ::setenv(name, bad, 1);
    try {
      flags::env_integer(name, 5, 1, 4096, "a device count");
      ADD_FAILURE() << bad << " was taken";
    } catch (const tessera::ValueError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("TESSERA_CPU_DEVICES='") + bad +
                                           "' is not a device count (expected an integer from 1 to 4096)");
    }
  }
  ::unsetenv(name);
}

// Launchers' variables: the first set to a whole number in range; others skipped.
TEST(Flags, FirstLauncherIntegerSkipsWhatIsNotOne) {
  const char* a = "FLAGS_TEST_LAUNCHER_A";
  const char* b = "FLAGS_TEST_LAUNCHER_B";
  ::unsetenv(a);
  ::unsetenv(b);
  EXPECT_EQ(flags::first_env_integer({a, b}, 1, 64), std::nullopt);
  ::setenv(b, "7", 1);
  EXPECT_EQ(flags::first_env_integer({a, b}, 1, 64), 7);
  for (const char* skipped : {"", "x", "3x", "0", "65", "-1", "99999999999999999999"}) {
    ::setenv(a, skipped, 1);
    EXPECT_EQ(flags::first_env_integer({a, b}, 1, 64), 7) << "'" << skipped << "'";
  }
  ::setenv(a, "64", 1);
  EXPECT_EQ(flags::first_env_integer({a, b}, 1, 64), 64);
  ::unsetenv(a);
  ::unsetenv(b);
}

// A TESSERA_* name anywhere in the sources (code, messages, comments) is a declared
// flag, unless it is a build-time name: #define'd or tested by the preprocessor, or a
// CMake name (options, the TESSERA_HAS_* definitions, variables).
TEST(Flags, EveryTesseraNameInTheSourcesIsDeclared) {
  const std::regex token(R"(TESSERA_[A-Z0-9_]+)");
  const std::regex macro(R"(#\s*(?:define|ifdef|ifndef|if|elif)\b[^\n]*)");
  std::set<std::string> macros;
  const std::string cmake = read_file(fs::path(TESSERA_SOURCE_DIR) / "CMakeLists.txt");
  for (std::sregex_iterator it(cmake.begin(), cmake.end(), token), end; it != end; ++it) macros.insert(it->str());
  std::map<std::string, std::string> used;  // name -> a file using it
  for (const fs::path& path : sources()) {
    const std::string text = read_file(path);
    for (std::sregex_iterator it(text.begin(), text.end(), macro), end; it != end; ++it) {
      const std::string line = it->str();
      for (std::sregex_iterator t(line.begin(), line.end(), token), e; t != e; ++t) macros.insert(t->str());
    }
    for (std::sregex_iterator it(text.begin(), text.end(), token), end; it != end; ++it)
      used.emplace(it->str(), fs::relative(path, TESSERA_SOURCE_DIR).string());
  }
  int checked = 0;
  for (const auto& [name, file] : used) {
    if (macros.count(name)) continue;
    ++checked;
    EXPECT_NE(flags::find(name), nullptr) << name << " (in " << file << ") is not declared in src/base/flags.cpp";
  }
  EXPECT_GE(checked, 20) << "the scan found too few names: is TESSERA_SOURCE_DIR right?";
}

TEST(Flags, NoTesseraVariableIsReadPastTheRegistry) {
  const std::regex direct(R"(getenv\(\s*"TESSERA_)");
  for (const fs::path& path : sources()) {
    if (path.filename() == "flags.cpp") continue;
    EXPECT_FALSE(std::regex_search(read_file(path), direct))
        << fs::relative(path, TESSERA_SOURCE_DIR).string() << " reads a TESSERA_* variable with getenv: use flags::env";
  }
}

TEST(Flags, DocsFlagsMdIsTheListingTesseraInfoPrints) {
  const std::string docs = read_file(fs::path(TESSERA_SOURCE_DIR) / "docs/flags.md");
  EXPECT_NE(docs.find(flags::table(false)), std::string::npos)
      << "docs/flags.md is out of date: regenerate its table with `build/bin/tessera info --flags --markdown`";
}

TEST(Flags, TheTableHasOneRowPerFlagAndTheValuesColumnOnRequest) {
  const std::string plain = flags::table(false);
  EXPECT_EQ(static_cast<size_t>(std::count(plain.begin(), plain.end(), '\n')), flags::all().size() + 2);
  ::setenv("TESSERA_DUMP", "/tmp/dump-here", 1);
  const std::string with_values = flags::table(true);
  ::unsetenv("TESSERA_DUMP");
  EXPECT_NE(with_values.find("`/tmp/dump-here`"), std::string::npos) << with_values;
  EXPECT_NE(with_values.find("value here"), std::string::npos);
}
