// cxltierctl: the operator's command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cxltier/model.h"
#include "plan.h"

namespace {

using cxltier::ModelGeometry;

struct PlanFlags {
  std::string model = std::string(cxltier::kDefaultModel.name);
  std::string context = "128k";
  bool json = false;
  bool per_layer = false;
  std::optional<uint32_t> layers, query_heads, kv_heads, head_dim, dtype_bytes, block_tokens;
};

int RunPlan(const PlanFlags& f) {
  std::optional<ModelGeometry> model = cxltier::FindModelPreset(f.model);
  if (!model) {
    std::string names;
    for (const ModelGeometry& m : cxltier::kModelPresets) names += " " + std::string(m.name);
    std::fprintf(stderr, "cxltierctl plan: unknown model '%s'; presets:%s\n", f.model.c_str(),
                 names.c_str());
    return 2;
  }
  bool custom = false;
  auto apply = [&custom](const std::optional<uint32_t>& flag, uint32_t& field) {
    if (flag) {
      field = *flag;
      custom = true;
    }
  };
  apply(f.layers, model->layers);
  apply(f.query_heads, model->query_heads);
  apply(f.kv_heads, model->kv_heads);
  apply(f.head_dim, model->head_dim);
  apply(f.dtype_bytes, model->dtype_bytes);
  apply(f.block_tokens, model->block_tokens);
  if (custom) model->name = "custom";
  if (const std::string err = model->Validate(); !err.empty()) {
    std::fprintf(stderr, "cxltierctl plan: invalid geometry: %s\n", err.c_str());
    return 2;
  }
  const std::optional<uint64_t> tokens = cxltier::ParseSize(f.context);
  if (!tokens || *tokens == 0 || *tokens > (uint64_t{1} << 40)) {
    std::fprintf(stderr,
                 "cxltierctl plan: --context '%s' is not a token count between 1 and 2^40 "
                 "(examples: 131072, 128k, 1M)\n",
                 f.context.c_str());
    return 2;
  }
  if (f.per_layer) {
    std::vector<ModelGeometry> models(std::begin(cxltier::kModelPresets),
                                      std::end(cxltier::kModelPresets));
    if (custom) models.push_back(*model);
    if (f.json) {
      std::cout << cxltier::ctl::PerLayerJson(models, *tokens).dump(2) << "\n";
    } else {
      std::cout << cxltier::ctl::PerLayerTable(models, *tokens);
    }
    return 0;
  }
  if (f.json) {
    std::cout << cxltier::ctl::PlanJson(*model, *tokens).dump(2) << "\n";
  } else {
    std::cout << cxltier::ctl::PlanTable(*model, *tokens);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxltierctl: plan and operate cxltier"};
  app.require_subcommand(1);

  PlanFlags plan;
  CLI::App* plan_cmd =
      app.add_subcommand("plan", "KV-cache and block-state sizes for a model and context");
  plan_cmd->add_option("--model", plan.model, "model preset")->capture_default_str();
  plan_cmd->add_option("--context", plan.context, "context tokens (131072, 128k, 1M)")
      ->capture_default_str();
  plan_cmd->add_flag("--json", plan.json, "print one JSON object");
  plan_cmd->add_flag("--per-layer", plan.per_layer,
                     "per-layer KV bytes at the context for every preset");
  plan_cmd->add_option("--layers", plan.layers, "override: transformer layers");
  plan_cmd->add_option("--query-heads", plan.query_heads, "override: query heads");
  plan_cmd->add_option("--kv-heads", plan.kv_heads, "override: KV heads");
  plan_cmd->add_option("--head-dim", plan.head_dim, "override: head dimension");
  plan_cmd->add_option("--dtype-bytes", plan.dtype_bytes, "override: bytes per element");
  plan_cmd->add_option("--block-tokens", plan.block_tokens, "override: tokens per block");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (plan_cmd->parsed()) return RunPlan(plan);
  return 2;
}
