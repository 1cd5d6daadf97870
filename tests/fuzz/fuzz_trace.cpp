// libFuzzer target: the trace readers (Mooncake JSONL, CXLTRACE binary, CSV).
// The first byte picks the reader. A trace that reads without error must be
// consistent (Validate), and a binary trace must write and read back equal.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  cxltier::sim::TraceResult r;
  switch (data[0] % 3) {
    case 0:
      r = cxltier::sim::ReadMooncake(in, "fuzz.jsonl");
      break;
    case 1:
      r = cxltier::sim::ReadBinary(in, "fuzz.bin");
      break;
    case 2:
      r = cxltier::sim::ReadCsv(in, "fuzz.csv");
      break;
  }
  if (!r.ok()) {
    if (r.error.empty()) std::abort();
    return 0;
  }
  if (!r.trace.Validate().empty()) std::abort();
  std::ostringstream out;
  if (!cxltier::sim::WriteBinary(r.trace, out).empty()) std::abort();
  std::istringstream back(out.str());
  const cxltier::sim::TraceResult again = cxltier::sim::ReadBinary(back, "again.bin");
  if (!again.ok() || again.trace.events.size() != r.trace.events.size() ||
      again.trace.keys != r.trace.keys) {
    std::abort();
  }
  return 0;
}
