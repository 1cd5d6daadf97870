// The `attention` workload: a synthetic model of long-context decoding with
// sparse (Quest-style top-k) attention over blocks. Deterministic for a seed.
// docs/workloads.md explains each parameter and why its default is what it is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "trace.h"

namespace cxltier::sim {

struct AttentionParams {
  uint64_t seed = 1;
  uint32_t steps = 4000;          // decode steps simulated (the workload clock)
  uint32_t sessions = 32;         // conversations alive at once (active or paused)
  uint32_t batch = 8;             // sequences decoding in one step
  uint32_t context_min = 32768;   // tokens of a new session's first prompt (uniform in [min, max])
  uint32_t context_max = 131072;  // a session ends when it reaches this many tokens
  uint32_t topk = 64;          // blocks one sequence attends to per step, sinks and window included
  uint32_t sink_blocks = 1;    // first blocks, attended every step
  uint32_t window_blocks = 4;  // most recent blocks, attended every step
  double sink_weight = 50;     // attention weight of a sink block
  double window_weight = 10;   // attention weight of a window block
  double heavy_alpha = 1.2;    // Pareto tail index of the other blocks' importance (xmin 1)
  double drift = 0.001;  // fraction of a sequence's blocks whose importance is redrawn per step
  uint32_t turn_tokens = 256;          // mean tokens decoded per turn (geometric)
  uint32_t pause_steps = 1000;         // mean steps a session waits between turns (geometric)
  uint32_t user_tokens = 512;          // tokens the user adds at the start of each later turn
  uint32_t turns = 8;                  // mean turns per session (geometric)
  uint32_t shared_prefix_blocks = 64;  // system-prompt blocks shared by every session (same keys)
  double release_on_pause =
      0.0;                     // chance a pause frees the session's blocks (they come back by key)
  uint32_t block_tokens = 16;  // tokens per block (the model's)
  // Scheduler hints (docs/workloads.md): 1 adds each session's group and its
  // hints: idle when a turn ends, done when the session ends, soon `hint_lead`
  // steps before a later turn's first step. 0 leaves the trace as without them.
  uint32_t hints = 0;
  uint32_t hint_lead = 8;

  // Applies "k=v,k=v" overrides. Returns an error naming the bad key or value.
  std::string Parse(std::string_view overrides);
  // Empty when consistent; otherwise what is wrong.
  std::string Validate() const;
  // "steps=4000,sessions=16,..." with every parameter, for reports.
  std::string ToString() const;
};

// Generates the trace. REQUIRES: params.Validate() is empty.
Trace GenerateAttention(const AttentionParams& params);

}  // namespace cxltier::sim
