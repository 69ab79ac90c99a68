// fileio::expand_home: the "~/" of paths taken from TESSERA_* variables.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "tessera/base/file_io.h"

namespace {

class HomeScope {
 public:
  explicit HomeScope(const char* home) {
    if (const char* old = ::getenv("HOME")) old_ = old;
    home ? ::setenv("HOME", home, 1) : ::unsetenv("HOME");
  }
  ~HomeScope() { old_ ? ::setenv("HOME", old_->c_str(), 1) : ::unsetenv("HOME"); }

 private:
  std::optional<std::string> old_;
};

}  // namespace

TEST(ExpandHome, ALeadingTildeSlashBecomesHome) {
  HomeScope home("/home/newcomer");
  EXPECT_EQ(tessera::fileio::expand_home("~/.cache/tessera/calibration.json"),
            "/home/newcomer/.cache/tessera/calibration.json");
  EXPECT_EQ(tessera::fileio::expand_home("/abs/~/x"), "/abs/~/x");
  EXPECT_EQ(tessera::fileio::expand_home("~user/x"), "~user/x");  // other users' homes are not looked up
  EXPECT_EQ(tessera::fileio::expand_home(""), "");
}

TEST(ExpandHome, WithoutHomeThePathIsUnchanged) {
  HomeScope home(nullptr);
  EXPECT_EQ(tessera::fileio::expand_home("~/x"), "~/x");
}
