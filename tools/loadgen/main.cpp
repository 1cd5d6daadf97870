// cxltier-loadgen: a real client for demos, tests and benchmarks. It fills a
// pool with a known pattern, admits blocks, drives the attention workload of
// cxltier-sim through the client library, counts live hits, and finally
// verifies every byte of every block.
//
// The parts: options (the command line), session (the client, the pools and
// the calls to the daemon), workload (the trace and its replay), page_mode
// and copy_pools (the two kinds of pool; copy_mode: copy mode's threads),
// checks and report (the end).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "checks.h"
#include "copy_mode.h"
#include "copy_pools.h"
#include "options.h"
#include "page_mode.h"
#include "report.h"
#include "session.h"
#include "workload.h"

namespace {

using namespace cxltier;

// Sets up the pool(s), connects and registers them (a page pool is filled
// after that), pins them with --pin, and starts copy mode's threads; 0, or
// Fail's exit code.
int SetUp(loadgen::Session& s) {
  const loadgen::Options& o = s.opt;
  if (!o.copy) {
    if (int rc = loadgen::MapPagePool(s); rc != 0) return rc;
  }
  if (int rc = s.Connect(); rc != 0) return rc;
  if (int rc = o.copy ? loadgen::CreateTierPools(s) : loadgen::RegisterPagePool(s); rc != 0) {
    return rc;
  }
  if (!o.copy) loadgen::FillPagePool(s);
  if (o.pin) {
    if (int rc = o.copy ? loadgen::PinTierPools(s) : loadgen::PinPagePool(s); rc != 0) return rc;
  }
  if (o.copy) s.readers = std::make_unique<loadgen::Readers>(*s.client, o.block_bytes, o.checks);
  s.fds_at_start = loadgen::CountFds();
  s.segments_at_start = loadgen::CountSegmentMaps();
  s.mig_before = s.Migrations();
  s.pgmigrate_before = loadgen::PgmigrateSuccess();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  loadgen::Options o;
  if (const auto rc = loadgen::ParseOptions(argc, argv, &o)) return *rc;
  if (o.until_signal) {
    // SA_RESTART, and the library retries on EINTR: the signal never fails a call.
    struct sigaction sa {};
    sa.sa_handler = loadgen::RequestStop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, nullptr);
  }
  loadgen::Session s(o);
  if (int rc = SetUp(s); rc != 0) return rc;

  loadgen::Workload w;
  if (int rc = loadgen::MakeWorkload(s, &w); rc != 0) return rc;
  loadgen::Results r;
  if (int rc = loadgen::ReplayWorkload(s, w, &r.counts); rc != 0) return rc;
  // Let the daemon fold the last observations and finish its moves.
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * s.client->tick_ms() + 50));
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - r.counts.start).count();

  loadgen::CountLiveTiers(s, &r);
  r.placement = loadgen::CheckPlacement(s);
  r.pgmigrate =
      loadgen::PgmigrateSuccess() - std::min(loadgen::PgmigrateSuccess(), s.pgmigrate_before);
  if (o.copy) {
    if (int rc = loadgen::VerifyCopyBlocks(s, &r.verified); rc != 0) return rc;
  } else {
    loadgen::VerifyPagePool(s, &r.verified);
  }
  r.mig_after = s.Migrations();

  const nlohmann::json out = loadgen::Summary(s, r);
  loadgen::PrintSummary(s, r, out);
  const std::vector<std::string> failed = loadgen::FailedChecks(s, r, out);
  for (const std::string& f : failed)
    std::fprintf(stderr, "cxltier-loadgen: CHECK FAILED: %s\n", f.c_str());
  return failed.empty() ? 0 : 1;
}
