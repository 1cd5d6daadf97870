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
  const cxltier::Result<cxltier::sim::Trace> r = [&]() -> cxltier::Result<cxltier::sim::Trace> {
    switch (data[0] % 3) {
      case 0:
        return cxltier::sim::ReadMooncake(in, "fuzz.jsonl");
      case 1:
        return cxltier::sim::ReadBinary(in, "fuzz.bin");
      default:
        return cxltier::sim::ReadCsv(in, "fuzz.csv");
    }
  }();
  if (!r.ok()) {
    if (r.status().message.empty()) std::abort();
    return 0;
  }
  if (!r->Validate().ok()) std::abort();
  std::ostringstream out;
  if (!cxltier::sim::WriteBinary(*r, out).ok()) std::abort();
  std::istringstream back(out.str());
  const cxltier::Result<cxltier::sim::Trace> again = cxltier::sim::ReadBinary(back, "again.bin");
  if (!again.ok() || again->events.size() != r->events.size() || again->keys != r->keys) {
    std::abort();
  }
  return 0;
}
