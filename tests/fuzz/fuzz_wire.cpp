// libFuzzer target: the wire codec. The first byte picks a message type; the
// rest is its payload. Whatever decodes must re-encode to the same payload
// bytes (the codec is a bijection on what it accepts), and a frame header is
// decoded from the same bytes.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "cxltier/wire.h"

namespace {

using namespace cxltier::wire;

template <typename M>
void RoundTrip(std::span<const uint8_t> payload) {
  M m;
  if (const cxltier::Status st = Decode(payload, &m); !st.ok()) {
    // Every rejection names its reason, with the codec's code.
    if (st.message.empty() || st.code != ErrorCode::kBadPayload) std::abort();
    return;
  }
  std::vector<uint8_t> out;
  Encode(m, 7, out);
  const std::span<const uint8_t> again(out.data() + kHeaderBytes, out.size() - kHeaderBytes);
  const auto h = DecodeHeader(out);
  if (!h || h->payload_bytes != again.size()) std::abort();
  // Floats: NaN payload bits survive a copy, so bytes compare exactly.
  if (again.size() != payload.size() || !std::equal(again.begin(), again.end(), payload.begin())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  (void)DecodeHeader(std::span(data, size));
  const std::span<const uint8_t> p(data + 1, size - 1);
  switch (data[0] % 21 + 1) {
    case 1:
      RoundTrip<Hello>(p);
      break;
    case 2:
      RoundTrip<HelloOk>(p);
      break;
    case 3:
      RoundTrip<RegisterPool>(p);
      break;
    case 4:
      RoundTrip<RegisterPoolOk>(p);
      break;
    case 5:
      RoundTrip<Admit>(p);
      break;
    case 6:
      RoundTrip<AdmitOk>(p);
      break;
    case 7:
      RoundTrip<Release>(p);
      break;
    case 8:
      RoundTrip<ReleaseOk>(p);
      break;
    case 9:
      RoundTrip<Report>(p);
      break;
    case 10:
      RoundTrip<ReportOk>(p);
      break;
    case 11:
      RoundTrip<QueryTiers>(p);
      break;
    case 12:
      RoundTrip<QueryTiersOk>(p);
      break;
    case 13:
      RoundTrip<Stats>(p);
      break;
    case 14:
      RoundTrip<StatsOk>(p);
      break;
    case 15:
      RoundTrip<Error>(p);
      break;
    case 16:
      RoundTrip<Admin>(p);
      break;
    case 17:
      RoundTrip<AdminOk>(p);
      break;
    case 18:
      RoundTrip<CreateTierPool>(p);
      break;
    case 19:
      RoundTrip<CreateTierPoolOk>(p);
      break;
    case 20:
      RoundTrip<Hint>(p);
      break;
    case 21:
      RoundTrip<HintOk>(p);
      break;
  }
  return 0;
}
