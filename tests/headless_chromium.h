// The HTML reports' rendering check (goodput's and tessera plan's): the page written to
// the build directory, screenshotted by headless Chromium (no network: the reports have
// no external references) into a PNG kept next to it for a person to look at, and the
// DOM Chromium parsed, for the tests' structural checks.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace tessera::chromium_test {

inline constexpr const char* kChromium = "/usr/bin/chromium";

struct ChromiumRender {
  std::filesystem::path png_path;
  int screenshot_status = -1, dom_status = -1;  // Chromium's exit statuses
  std::string png;                              // the screenshot's bytes (empty if none)
  std::string dom;                              // the parsed page
};

inline std::string run_command(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) {
    *status = -1;
    return out;
  }
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  *status = ::pclose(pipe);
  return out;
}

// Writes `html` to BUILD/<name>.html and renders it at width x height (BUILD: the build
// directory, the parent of the test binary's bin/).
inline ChromiumRender render_in_chromium(const std::string& html, const std::string& name, int width, int height) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::read_symlink("/proc/self/exe").parent_path().parent_path();
  const fs::path page = dir / (name + ".html");
  const fs::path profile = fs::temp_directory_path() / ("tessera_chromium_" + name + "_" + std::to_string(::getpid()));
  ChromiumRender r;
  r.png_path = dir / (name + ".png");
  std::ofstream(page) << html;
  fs::remove(r.png_path);
  const std::string chromium = std::string("timeout 60 ") + kChromium +
                               " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions "
                               "--proxy-server=127.0.0.1:9 --user-data-dir=" +
                               profile.string() + " ";
  run_command(chromium + "--window-size=" + std::to_string(width) + "," + std::to_string(height) +
                  " --screenshot=" + r.png_path.string() + " file://" + page.string() + " 2>&1",
              &r.screenshot_status);
  if (std::ifstream in(r.png_path, std::ios::binary); in)
    r.png.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  r.dom = run_command(chromium + "--dump-dom file://" + page.string() + " 2>/dev/null", &r.dom_status);
  fs::remove_all(profile);
  return r;
}

// The big-endian 32-bit word at `at` (a PNG's IHDR width is at 16, its height at 20).
inline uint32_t be32(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes.at(at + i));
  return v;
}

}  // namespace tessera::chromium_test
