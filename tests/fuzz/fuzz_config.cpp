// libFuzzer target: the TOML config parser. Accepted text must validate, and
// the effective configuration printed back must parse to the same text.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "service/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  cxltier::service::DaemonConfig c;
  const std::string err = cxltier::service::LoadConfigText(text, "fuzz.toml", &c).message;
  if (!err.empty()) return 0;
  if (!c.Validate().ok()) std::abort();  // accepted means valid
  const std::string printed = cxltier::service::ToToml(c);
  cxltier::service::DaemonConfig again;
  if (!cxltier::service::LoadConfigText(printed, "printed.toml", &again).ok()) std::abort();
  if (cxltier::service::ToToml(again) != printed) std::abort();
  return 0;
}
