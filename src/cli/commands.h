// The `tessera` subcommands. Each lives in its own command_<name>.cpp and registers
// itself on the top-level app; main.cpp only wires them together and runs the one
// that was chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera::cli {

// A registered subcommand: its CLI11 node (options bound to the command's own
// settings) and the action to run once the command line has parsed. The action
// returns the process exit status.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Prints "warning: <text>" on stderr (skipped checkpoints and the like).
void print_warning(const std::string& text);

// "512 B", "1.5 KB", "498.0 MB": decimal units, for listings (checkpoints, cache entries).
std::string human_bytes(uint64_t bytes);

// The COMMAND ARGS... after `--` of `launch` and `k8s render`, kept verbatim. CLI11 reads
// a value such as "[a,b]" of a vector option that takes extra args as a list (and passes
// on "a", "b"), which would change a worker's `--set key=[1,2]`. Without extra args, a
// positional takes values while it has fewer than its minimum: a minimum never reached,
// with TakeAll so that reaching none is not an error.
CLI::Option* add_verbatim_command(CLI::App* sub, std::vector<std::string>& command, const std::string& help);

Command add_info_command(CLI::App& app);
Command add_goodput_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_sample_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_data_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_ckpt_command(CLI::App& app);
Command add_cache_command(CLI::App& app);
Command add_launch_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_k8s_command(CLI::App& app);

}  // namespace tessera::cli
