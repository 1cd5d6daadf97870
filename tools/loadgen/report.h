// cxltier-loadgen's summary: the JSON object (--json) and the text lines.
#pragma once

#include <nlohmann/json.hpp>

#include "checks.h"
#include "session.h"

namespace cxltier::loadgen {

// Everything the run counted, with this run's share of the daemon's counters.
nlohmann::json Summary(const Session& s, const Results& r);
// Prints the summary: the JSON with --json, else a few lines of text.
void PrintSummary(const Session& s, const Results& r, const nlohmann::json& out);

}  // namespace cxltier::loadgen
