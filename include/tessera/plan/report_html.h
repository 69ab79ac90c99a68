// The HTML page of `tessera plan --html FILE`: the job, the per-accelerator summary
// table and inline-SVG charts of strong and weak scaling (step time, tokens/s per chip,
// goodput-adjusted run time and dollars against chips). One self-contained file: no
// scripts, no external resources, every string from the plan HTML-escaped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tessera::plan {

// `plan` is exactly the object `tessera plan --json` prints (model, parameters, batch,
// seq, compute_dtype, remat, tokens, restart_seconds, save_seconds, and the row arrays
// plan, strong_scaling, weak_scaling). Missing or null numbers (JSON has no infinity)
// are left out of the charts and shown as "-".
std::string render_plan_html(const nlohmann::json& plan, const std::string& title);

// The units the text tables and the page print in: "12.3 ms", "4.51 s", "3.2 h",
// "12.4 d" ("-" when not finite); "$812.40", "$12.3k", "$1.25M".
std::string format_duration(double seconds);
std::string format_dollars(double dollars);

}  // namespace tessera::plan
