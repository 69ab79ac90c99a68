// `tessera info`: what this build is and what it runs on (version, threads, BLAS,
// CPU features, CUDA). The first thing to paste into a bug report. `--flags` lists the
// TESSERA_* environment variables (base/flags.h), `--ops` the primitive table
// (ir/primitive_table.h).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/info_text.h"
#include "tessera/base/flags.h"
#include "tessera/ir/primitive_table.h"

namespace tessera::cli {
namespace {

struct InfoSettings {
  bool ops = false;
  bool flags = false;
  bool markdown = false;
};

int run_info(const InfoSettings& settings) {
  if (settings.ops) {
    // The primitive table (ir/primitive_table.h), as docs/ops.md holds it.
    fmt::print("{}", primitive_table_markdown());
    return 0;
  }
  if (settings.flags) {
    // --markdown: the table docs/flags.md holds (a test compares them); else with this
    // process's values.
    fmt::print("{}", flags::table(!settings.markdown));
    return 0;
  }
  fmt::print("{}", info_text());
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("info", "Show the version, threads, BLAS, CPU features and CUDA support");
  auto settings = std::make_shared<InfoSettings>();
  sub->add_flag("--flags", settings->flags,
                "List every TESSERA_* environment variable: default, who sets it, what it does, its value here");
  sub->add_flag("--markdown", settings->markdown, "With --flags: the table without values (docs/flags.md)");
  sub->add_flag("--ops", settings->ops,
                "List every primitive: its family and where its CPU evaluation, CUDA kernel and sharding rule live "
                "(or why it has none; docs/ops.md)");
  return Command{sub, [settings] { return run_info(*settings); }};
}

}  // namespace tessera::cli
