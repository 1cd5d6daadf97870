#include "options.h"

#include <CLI/CLI.hpp>

#include <cstdio>

#include "attention_workload.h"
#include "cxltier/model.h"

namespace cxltier::loadgen {
namespace {

// The options are added in three groups, in the order --help lists them.

// The pool, pinning and copy mode's threads.
void AddPoolOptions(CLI::App& app, Options& o) {
  app.add_option("--socket", o.socket_path, "cxltierd's socket")->required();
  app.add_option("--blocks", o.blocks, "blocks in the pool")->capture_default_str();
  app.add_option("--block-bytes", o.block_bytes_text, "bytes per block (a multiple of 8 KiB)")
      ->capture_default_str();
  app.add_option("--pool", o.pool_kind,
                 "memfd (shared with the daemon), range (this process) or copy (a pool per tier "
                 "from the daemon, blocks moved by copy)")
      ->capture_default_str();
  app.add_flag("--pin", o.pin,
               "pin the pool(s) with io_uring fixed buffers, the long-term pin cudaHostRegister "
               "takes (copy mode: the kernel's placement of each tier pool is checked before and "
               "after)");
  app.add_option("--readers", o.checks.readers,
                 "copy mode: threads that Acquire, check and Release blocks all along")
      ->capture_default_str();
  app.add_option("--hold-ticks", o.checks.hold_ticks,
                 "copy mode: each reader also holds --hold-leases read leases while the daemon "
                 "ticks this many times (moving, releasing and reusing places meanwhile), then "
                 "checks every byte again; a hold ends after max(10 s, 20 times as many "
                 "ticks' time) even if the daemon does not tick (counted, no failure); 0: no "
                 "holds")
      ->capture_default_str();
  app.add_option("--hold-leases", o.checks.hold_leases,
                 "copy mode: read leases each reader holds at once across --hold-ticks (at most "
                 "31)")
      ->capture_default_str();
  app.add_option("--writers", o.checks.writers,
                 "copy mode: threads that rewrite live blocks under write leases, each time with "
                 "the next generation (in the block's bytes), first checking the bytes they "
                 "replace; a block the daemon is copying is rewritten at once, at most one a tick "
                 "(the BeginWrite cancels the copy; every other time the write waits until the "
                 "copy is through), and read again two ticks later; 0: blocks are written once")
      ->capture_default_str();
  app.add_option("--rewrite-us", o.checks.rewrite_us,
                 "copy mode: a writer's pause after rewriting a block the daemon was not copying "
                 "(blocks it is copying are rewritten at once)")
      ->capture_default_str();
  app.add_option(
      "--devdax", o.devdax,
      "copy mode: the last tier is this device-DAX device (/dev/daxX.Y), mapped by both");
  app.add_flag("--expect-pinned", o.expect_pinned,
               "page mode: fail unless the daemon reported a pool of this run pinned");
}

// The workload and how long it runs.
void AddWorkloadOptions(CLI::App& app, Options& o) {
  app.add_option("--steps", o.steps, "decode steps")->capture_default_str();
  app.add_option("--step-ms", o.step_ms, "pause between steps")->capture_default_str();
  app.add_option("--seconds", o.max_seconds,
                 "stop the workload after this long (0: run every step; with --until-moves or "
                 "--until-signal: 120)")
      ->capture_default_str();
  app.add_option("--until-moves", o.until_moves,
                 "after the --steps, replay the workload (fresh keys each pass) until this run saw "
                 "at least N promotions and N demotions, or --seconds pass; a test that expects "
                 "moves waits for them instead of hoping for them in a fixed number of steps");
  app.add_flag("--until-signal", o.until_signal,
               "replay the workload (fresh keys each pass) until SIGUSR1 arrives or --seconds "
               "pass, then run the checks and print the summary");
  app.add_flag("--hints", o.hints,
               "the workload's scheduler hints (attention:hints=1): each session is a group, idle "
               "when its turn ends, done when it ends, soon --hint-lead steps before its next "
               "turn; each is sent as a Hint with the group's live blocks not sent before");
  app.add_option("--hint-lead", o.hint_lead, "steps a soon hint comes before its turn (--hints)")
      ->capture_default_str();
  app.add_option("--sessions", o.sessions, "conversations")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences decoding per step")->capture_default_str();
  app.add_option("--seed", o.seed, "workload seed")->capture_default_str();
  app.add_option("--name", o.name, "client name shown by cxltierctl clients");
  app.add_flag("--json", o.json, "print a JSON summary");
}

// Reconnects and the checks at the end.
void AddCheckOptions(CLI::App& app, Options& o) {
  app.add_flag("--reconnect", o.reconnect,
               "when the daemon goes away, reconnect (re-register the pool, re-admit every block) "
               "and carry on; copy mode: the tier pools are handed to the new daemon and every "
               "block is admitted again where it is, the reader and writer threads wait at safe "
               "points meanwhile (readers keep the leases of their holds, which must read back "
               "the same bytes after it; no writer holds a write lease) and carry on with the "
               "blocks' new slots");
  app.add_flag("--expect-no-leaks", o.expect_no_leaks,
               "fail unless the file descriptors and mapped state segments at the end are what "
               "they were after the first connect");
  app.add_flag("--check-placement", o.check_placement,
               "at the end, ask the kernel (move_pages) where every live block's pages are and "
               "fail if that disagrees with the tier the daemon published");
  app.add_flag("--expect-moves", o.expect_moves,
               "fail unless blocks were both demoted and promoted (at least --until-moves of each "
               "when given)");
  app.add_flag("--expect-restored", o.expect_restored,
               "fail unless some admitted keys got their ghost state back");
  app.add_flag("--expect-slow-tier", o.expect_slow_tier,
               "fail unless the daemon reports a slow tier with at least one node");
  app.add_option("--expect-tiers", o.expect_tiers,
                 "with --check-placement: fail unless the daemon has at least N tiers and, "
                 "at the check, blocks the kernel shows on each of tiers 0 .. N-1's nodes "
                 "(with --until-moves, the run also goes on until live blocks sit in each once the "
                 "daemon is quiet)");
  app.add_flag("--expect-kernel-migrations", o.expect_kernel_migrations,
               "fail unless /proc/vmstat pgmigrate_success grew during the run");
}

}  // namespace

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cxltier-loadgen: %s\n", msg.c_str());
  return 2;
}

std::optional<int> ParseOptions(int argc, char** argv, Options* o) {
  CLI::App app{"cxltier-loadgen: drive cxltierd with a real pool and the attention workload"};
  o->hint_lead = sim::AttentionParams{}.hint_lead;
  AddPoolOptions(app, *o);
  AddWorkloadOptions(app, *o);
  AddCheckOptions(app, *o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const auto bb = ParseSize(o->block_bytes_text);
  if (!bb || *bb == 0 || *bb % 8192 != 0 || *bb > (1ull << 32)) {
    return Fail("--block-bytes must be a positive multiple of 8 KiB (up to 4 GiB)");
  }
  o->block_bytes = *bb;
  if (o->pool_kind != "memfd" && o->pool_kind != "range" && o->pool_kind != "copy") {
    return Fail("--pool must be memfd, range or copy");
  }
  o->copy = o->pool_kind == "copy";
  if (o->blocks < 8 || o->sessions == 0 || o->batch == 0)
    return Fail("need --blocks >= 8 and sessions, batch >= 1");
  if ((o->until_moves > 0 || o->until_signal) && o->max_seconds <= 0) o->max_seconds = 120;
  return std::nullopt;
}

}  // namespace cxltier::loadgen
