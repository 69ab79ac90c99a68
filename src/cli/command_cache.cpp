// `tessera cache ls|clear|explain`: what the persistent compilation cache holds, emptying
// it, and why the last lookup missed (compiler/compilation_cache.h).
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/compiler/compilation_cache.h"

namespace fs = std::filesystem;

namespace tessera::cli {
namespace {

struct CacheArgs {
  std::string dir;
};

// --dir, else TESSERA_COMPILATION_CACHE_DIR, else the default ~/.cache/tessera/compilation.
fs::path cache_dir(const CacheArgs& args) {
  if (!args.dir.empty()) return args.dir;
  if (const char* env = flags::env("TESSERA_COMPILATION_CACHE_DIR"); env != nullptr && *env != 0) return env;
  const char* home = std::getenv("HOME");
  if (home == nullptr) fail<ValueError>("no --dir given, TESSERA_COMPILATION_CACHE_DIR and HOME are unset");
  return fs::path(home) / ".cache/tessera/compilation";
}

compiler::CompilationCache open_existing(const CacheArgs& args) {
  const fs::path dir = cache_dir(args);
  if (!fs::is_directory(dir)) fail<IOError>("{} is not a directory (no compilation cache there)", dir.string());
  return compiler::CompilationCache(dir);
}

std::string local_time(fs::file_time_type t) {
  const auto system = std::chrono::time_point_cast<std::chrono::seconds>(t - fs::file_time_type::clock::now() +
                                                                         std::chrono::system_clock::now());
  const std::time_t seconds = std::chrono::system_clock::to_time_t(system);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &tm);
  return text;
}

int run_ls(const CacheArgs& args) {
  compiler::CompilationCache cache = open_existing(args);
  const auto entries = cache.entries();
  uint64_t total = 0;
  fmt::print("{:<16}  {:<24}  {:>9}  {}\n", "key", "program", "size", "last used");
  for (const compiler::CacheEntryInfo& e : entries) {
    fmt::print("{:<16}  {:<24}  {:>9}  {}\n", e.fingerprint.substr(0, 16), e.program, human_bytes(e.bytes),
               local_time(e.last_used));
    total += e.bytes;
  }
  fmt::print("{} entries, {} in {}\n", entries.size(), human_bytes(total), cache.dir().string());
  return 0;
}

int run_clear(const CacheArgs& args) {
  compiler::CompilationCache cache = open_existing(args);
  fmt::print("removed {} entries from {}\n", cache.clear(), cache.dir().string());
  return 0;
}

int run_explain(const CacheArgs& args) {
  fmt::print("{}", open_existing(args).explain());
  return 0;
}

}  // namespace

Command add_cache_command(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "The persistent compilation cache: list, clear, explain a miss");
  cache->require_subcommand(1);
  auto args = std::make_shared<CacheArgs>();
  const std::string dir_help =
      "Cache directory (default: TESSERA_COMPILATION_CACHE_DIR, else ~/.cache/tessera/compilation)";
  CLI::App* ls = cache->add_subcommand("ls", "List entries: key, program, size, last used (most recent first)");
  ls->add_option("--dir", args->dir, dir_help);
  CLI::App* clear = cache->add_subcommand("clear", "Remove every entry");
  clear->add_option("--dir", args->dir, dir_help);
  CLI::App* explain = cache->add_subcommand(
      "explain", "For the most recent miss: which key parts differ from the nearest entry of the same program");
  explain->add_option("--dir", args->dir, dir_help);
  return Command{cache, [args, ls, clear] {
                   if (ls->parsed()) return run_ls(*args);
                   if (clear->parsed()) return run_clear(*args);
                   return run_explain(*args);
                 }};
}

}  // namespace tessera::cli
