// The goodput event log (goodput/events.h): one JSON object per line, damaged lines
// become warnings; the calculator never throws on what the reader accepted. The same
// bytes are also read as the run's metrics.jsonl (goodput/report.h), and both rendered
// as the HTML report.
#include "fuzz_util.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/events.h"
#include "tessera/goodput/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const goodput::EventLog log = goodput::parse_event_log(fuzz::as_text(data, size), "events.jsonl");
  goodput::compute_goodput(log);
  goodput::CalculatorOptions live;
  live.now = 1e9;
  const goodput::GoodputReport report = goodput::compute_goodput(log, live);
  const std::filesystem::path metrics = fuzz::scratch_dir() / "metrics.jsonl";
  fuzz::write_file(metrics, fuzz::as_text(data, size));
  std::vector<std::string> warnings;
  goodput::render_html(report, goodput::read_metrics(metrics, &warnings), "fuzz");
  return 0;
}
