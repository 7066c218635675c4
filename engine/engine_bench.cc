// Throughput of the embedded engine on the default config: prefill, decode and LoRA
// training tokens/s, KV-cache bytes per token, and, on a trained base model, how often bf16
// rollout routing disagrees with fp32 training routing. Prints its figures.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/generator.h"
#include "engine/hf/hf_model.h"
#include "engine/model.h"
#include "engine/sft.h"
#include "engine/tasks.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/gemm.h"

ABSL_FLAG(std::string, base_model, "",
          "Trained base model (make_base_model); empty uses a random default-config model.");
ABSL_FLAG(int, threads, 1, "OpenBLAS threads.");
ABSL_FLAG(int, sequences, 64, "Sequences per batch.");

namespace tandem::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<GenerationRequest> Requests(const Task& task, int count) {
  std::vector<GenerationRequest> requests;
  int index = 0;
  for (const Sample& sample : GeneratePrompts(task, count, 7)) {
    GenerationRequest request;
    request.prompt = *PromptTokens(sample.prompt);
    request.max_new_tokens = 24;  // No stop token: every sequence decodes the full length.
    request.seed = MixSeed(7, index++);
    requests.push_back(std::move(request));
  }
  return requests;
}

void BenchGeneration(Transformer& transformer, const std::vector<GenerationRequest>& requests) {
  GenerationBatch batch(transformer);
  int64_t prompt_tokens = 0;
  auto start = std::chrono::steady_clock::now();
  for (const GenerationRequest& request : requests) {
    batch.Admit(request).IgnoreError();
    prompt_tokens += static_cast<int64_t>(request.prompt.size());
  }
  const double prefill_seconds = SecondsSince(start);
  start = std::chrono::steady_clock::now();
  int64_t decoded = 0;
  while (batch.active() > 0) {
    decoded += batch.active();
    batch.Step();
  }
  const double decode_seconds = SecondsSince(start);
  std::printf("prefill: %8.0f tokens/s (%lld prompt tokens)\n", prompt_tokens / prefill_seconds,
              static_cast<long long>(prompt_tokens));
  std::printf("decode:  %8.0f tokens/s (batch %zu, %lld tokens)\n", decoded / decode_seconds,
              requests.size(), static_cast<long long>(decoded));
  std::printf("kv cache: %lld bytes per token\n",
              static_cast<long long>(batch.kv_bytes_per_token()));
}

void BenchTraining(BaseModel& model, const std::vector<GeneratedSample>& samples) {
  LoraAdapter adapter = *LoraAdapter::Create(model.config(), LoraConfig{}, 3);
  adapter.parameters().EnableGradients();
  Transformer transformer(model, &adapter);
  TokenBatch batch;
  for (const GeneratedSample& sample : samples) {
    batch.Add(std::vector<int>(sample.tokens.begin(), sample.tokens.end() - 1));
  }
  std::vector<float> dlogits(static_cast<size_t>(batch.num_tokens()) * model.config().vocab_size,
                             1e-3f);
  constexpr int kRepeats = 5;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRepeats; ++i) {
    transformer.Forward(batch, nullptr).IgnoreError();
    transformer.Backward(dlogits.data());
  }
  std::printf("train (LoRA forward+backward): %8.0f tokens/s (%d tokens per batch)\n",
              kRepeats * batch.num_tokens() / SecondsSince(start), batch.num_tokens());
}

void ReportBf16Mismatch(BaseModel& model, const std::vector<GeneratedSample>& samples) {
  BaseModel rounded = model.RoundedToBf16();
  Transformer rollout(rounded, nullptr, Precision::kBF16);
  Transformer trainer(model, nullptr);
  TokenBatch batch;
  for (const GeneratedSample& sample : samples) {
    batch.Add(std::vector<int>(sample.tokens.begin(), sample.tokens.end() - 1));
  }
  rollout.Forward(batch, nullptr).IgnoreError();
  const std::vector<int16_t> rollout_routes = rollout.routes();
  trainer.Forward(batch, &rollout_routes).IgnoreError();
  const RoutingStats& stats = trainer.routing_stats();
  std::printf(
      "bf16 rollout vs fp32 training routing: %.2f%% of token×layer decisions differ, "
      "%.2f%% of tokens differ in some layer\n",
      100 * stats.decision_disagreement(), 100 * stats.token_disagreement());
}

int Main() {
  cpu::SetBlasThreads(absl::GetFlag(FLAGS_threads));
  const std::string path = absl::GetFlag(FLAGS_base_model);
  auto model = path.empty() ? BaseModel::Create(DefaultModelConfig(), 1) : hf::LoadBaseModel(path);
  if (!model.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  std::printf("model: %lld parameters, %s\n",
              static_cast<long long>(model->parameters().num_elements()),
              path.empty() ? "random" : path.c_str());
  auto task = MakeTask("addition", 2);
  const std::vector<GenerationRequest> requests = Requests(**task, absl::GetFlag(FLAGS_sequences));
  Transformer transformer(*model, nullptr);
  BenchGeneration(transformer, requests);
  auto samples = Generate(transformer, requests);
  if (!samples.ok()) return 1;
  BenchTraining(*model, *samples);
  ReportBf16Mismatch(*model, *samples);
  return 0;
}

}  // namespace
}  // namespace tandem::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::engine::Main();
}
