// The `tessera` command: registers the subcommands (one file each, see commands.h),
// parses the command line and runs the chosen one.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/cpu_check.h"
#include "tessera/base/error.h"
#include "tessera/base/version.h"

namespace tessera::cli {
void print_warning(const std::string& text) { std::fprintf(stderr, "warning: %s\n", text.c_str()); }

CLI::Option* add_verbatim_command(CLI::App* sub, std::vector<std::string>& command, const std::string& help) {
  return sub->add_option("command", command, help)
      ->expected(CLI::detail::expected_max_vector_size - 1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000 && unit < 4) value /= 1000, ++unit;
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}
}  // namespace tessera::cli

namespace {

std::string command_names(const std::vector<tessera::cli::Command>& commands) {
  std::string names;
  for (const auto& command : commands) names += (names.empty() ? "" : ", ") + command.app->get_name();
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything runs kernel code: an AVX2 build on a CPU without AVX2 would die
  // with SIGILL somewhere deep instead.
  if (const std::string mismatch = tessera::cli::cpu_mismatch_message(); !mismatch.empty()) {
    std::fprintf(stderr, "%s\n", mismatch.c_str());
    return 1;
  }

  CLI::App app{"tessera: a C++ framework for training models (arrays, grad, jit, SPMD)", "tessera"};
  app.set_version_flag("--version", std::string("tessera ") + tessera::version());
  app.require_subcommand(0, 1);

  std::vector<tessera::cli::Command> commands;
  commands.push_back(tessera::cli::add_info_command(app));
  commands.push_back(tessera::cli::add_goodput_command(app));
  commands.push_back(tessera::cli::add_train_command(app));
  commands.push_back(tessera::cli::add_sample_command(app));
  commands.push_back(tessera::cli::add_eval_command(app));
  commands.push_back(tessera::cli::add_data_command(app));
  commands.push_back(tessera::cli::add_tokenize_command(app));
  commands.push_back(tessera::cli::add_ckpt_command(app));
  commands.push_back(tessera::cli::add_cache_command(app));
  commands.push_back(tessera::cli::add_launch_command(app));
  commands.push_back(tessera::cli::add_plan_command(app));
  commands.push_back(tessera::cli::add_k8s_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    // CLI11 reports an unknown subcommand as an unexpected extra argument; say what it is.
    const std::vector<std::string> extras = app.remaining();
    const bool chose_command = !app.get_subcommands().empty();
    if (!chose_command && !extras.empty() && !extras.front().starts_with('-')) {
      std::fprintf(stderr, "tessera: unknown command '%s' (commands: %s). Run 'tessera --help'.\n",
                   extras.front().c_str(), command_names(commands).c_str());
      return 2;
    }
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version arrive here with status 0
  }

  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run();
    } catch (const tessera::ConfigError& e) {
      // Exit 2 like a usage error: retrying cannot help (`tessera launch` does not restart it).
      std::fprintf(stderr, "tessera %s: %s\n", command.app->get_name().c_str(), e.what());
      return 2;
    } catch (const tessera::Error& e) {
      std::fprintf(stderr, "tessera %s: %s\n", command.app->get_name().c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera %s: unexpected error: %s\n", command.app->get_name().c_str(), e.what());
      return 1;
    }
  }
  std::fputs(app.help().c_str(), stdout);
  return 1;
}
