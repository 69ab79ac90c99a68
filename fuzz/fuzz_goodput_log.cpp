// The goodput event log (goodput/events.h): one JSON object per line, damaged lines
// become warnings; the calculator never throws on what the reader accepted.
#include "fuzz_util.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/events.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const goodput::EventLog log = goodput::parse_event_log(fuzz::as_text(data, size), "events.jsonl");
  goodput::compute_goodput(log);
  goodput::CalculatorOptions live;
  live.now = 1e9;
  goodput::compute_goodput(log, live);
  return 0;
}
