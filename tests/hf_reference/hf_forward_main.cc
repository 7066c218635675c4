// hf_forward: one fp32 forward of a token sequence through the engine, for the NumPy reference
// test. Loads --model (a Hugging Face model directory or an engine file) and prints one JSON
// object: "logits" [tokens][vocab], "routes" [tokens][MoE layers][top_k] and "moe_layers"
// (their global indices). A model the engine refuses exits 1 with the reason on stderr.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/cpu_model_ops.h"
#include "engine/hf/hf_model.h"
#include "engine/transformer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory or engine safetensors file.");
ABSL_FLAG(std::string, tokens, "", "Comma-separated token ids of one sequence.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "hf_forward: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tandem::engine::TokenBatch batch;
  std::vector<int> tokens;
  for (absl::string_view id : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    if (!absl::SimpleAtoi(id, &tokens.emplace_back())) return Fail("bad --tokens");
  }
  batch.Add(tokens);
  auto model = tandem::engine::hf::LoadBaseModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(model.status().ToString());
  tandem::engine::Transformer transformer(
      *model, nullptr, std::make_unique<tandem::engine::CpuModelOps>(model->config()));
  auto logits = transformer.Forward(batch);
  if (!logits.ok()) return Fail(logits.status().ToString());

  const tandem::engine::ModelConfig& config = model->config();
  const int rows = batch.num_tokens();
  const int layers = config.num_moe_layers();
  nlohmann::json out = {{"logits", nlohmann::json::array()},
                        {"routes", nlohmann::json::array()},
                        {"moe_layers", config.MoeLayerIndices()}};
  for (int t = 0; t < rows; ++t) {
    out["logits"].push_back(std::vector<float>(*logits + int64_t{t} * config.vocab_size,
                                               *logits + int64_t{t + 1} * config.vocab_size));
    nlohmann::json token_routes = nlohmann::json::array();
    for (int m = 0; m < layers; ++m) {
      const int16_t* row = transformer.routes().data() + (int64_t{t} * layers + m) * config.top_k;
      token_routes.push_back(std::vector<int16_t>(row, row + config.top_k));
    }
    out["routes"].push_back(token_routes);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
