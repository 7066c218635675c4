#include "engine/sft.h"

#include "absl/strings/str_cat.h"
#include "engine/cpu_model_ops.h"
#include "engine/generator.h"
#include "engine/optimizer.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/loss.h"

namespace tandem::engine {
namespace {

constexpr uint64_t kEvalSeedOffset = 0x5eed;  // Held-out prompts never meet training ones by seed.

// One supervised batch: "<bos> prompt answer <eos>", loss on the answer and <eos>.
struct SupervisedBatch {
  TokenBatch inputs;
  std::vector<int> targets;
  std::vector<float> weights;  // -1/answer_tokens on answer positions: d(mean CE)/d(logprob).
};

absl::StatusOr<SupervisedBatch> MakeBatch(const Task& task, int size, std::mt19937_64& rng) {
  SupervisedBatch batch;
  int answer_tokens = 0;
  for (int i = 0; i < size; ++i) {
    const Sample sample = task.Generate(rng);
    auto prompt = PromptTokens(sample.prompt);
    if (!prompt.ok()) return prompt.status();
    auto answer = Encode(sample.answer);
    if (!answer.ok()) return answer.status();
    std::vector<int> sequence = *prompt;
    sequence.insert(sequence.end(), answer->begin(), answer->end());
    sequence.push_back(kEosId);
    batch.inputs.Add(std::vector<int>(sequence.begin(), sequence.end() - 1));
    for (size_t t = 1; t < sequence.size(); ++t) {
      batch.targets.push_back(sequence[t]);
      const bool in_answer = t >= prompt->size();
      batch.weights.push_back(in_answer ? 1.0f : 0.0f);
      answer_tokens += in_answer;
    }
  }
  for (float& weight : batch.weights) weight *= -1.0f / answer_tokens;
  return batch;
}

}  // namespace

absl::Status SftConfig::Validate() const {
  if (batch_size < 1 || max_steps < 1 || eval_every < 1 || eval_prompts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size, max_steps, eval_every and eval_prompts must be >= 1; got ",
                     batch_size, ", ", max_steps, ", ", eval_every, ", ", eval_prompts));
  }
  return engine::Validate(ScheduleConfig{peak_lr, min_lr, warmup_steps, max_steps});
}

std::string CompletionText(const std::vector<int>& tokens, int prompt_length) {
  return Decode(std::vector<int>(tokens.begin() + prompt_length, tokens.end()),
                SpecialTokens::kRender);
}

absl::StatusOr<double> GreedyAccuracy(Transformer& transformer, const Task& task, int count,
                                      uint64_t seed) {
  const std::vector<Sample> prompts = GeneratePrompts(task, count, seed);
  std::vector<GenerationRequest> requests;
  for (const Sample& sample : prompts) {
    auto prompt = PromptTokens(sample.prompt);
    if (!prompt.ok()) return prompt.status();
    GenerationRequest request;
    request.prompt = *std::move(prompt);
    request.max_new_tokens = static_cast<int>(sample.answer.size()) + 2;
    request.sampling.temperature = 0;
    request.stop_tokens = {kEosId};
    requests.push_back(std::move(request));
  }
  auto samples = Generate(transformer, requests);
  if (!samples.ok()) return samples.status();
  double correct = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GeneratedSample& sample = (*samples)[i];
    correct += task.Reward(prompts[i].prompt, CompletionText(sample.tokens, sample.prompt_length));
  }
  return correct / count;
}

absl::StatusOr<SftProgress> TrainSupervised(
    BaseModel& model, const Task& task, const SftConfig& config,
    const std::function<void(const SftProgress&)>& on_eval) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  model.parameters().EnableGradients();
  auto optimizer = AdamW::Create(AdamWConfig{}, OptimizerParams(model.parameters()));
  if (!optimizer.ok()) return optimizer.status();
  const ScheduleConfig schedule{config.peak_lr, config.min_lr, config.warmup_steps,
                                config.max_steps};
  Transformer transformer(model, nullptr, std::make_unique<CpuModelOps>(model.config()));
  std::mt19937_64 rng(config.seed);
  const int vocab = model.config().vocab_size;
  SftProgress progress;
  double loss_sum = 0;
  int loss_count = 0;
  for (int step = 0; step < config.max_steps; ++step) {
    auto batch = MakeBatch(task, config.batch_size, rng);
    if (!batch.ok()) return batch.status();
    auto logits = transformer.Forward(batch->inputs, nullptr);
    if (!logits.ok()) return logits.status();
    const int rows = batch->inputs.num_tokens();
    std::vector<float> logprobs(rows);
    cpu::TokenLogProbs(*logits, batch->targets.data(), logprobs.data(), nullptr, rows, vocab);
    for (int t = 0; t < rows; ++t) loss_sum += double{batch->weights[t]} * logprobs[t];
    ++loss_count;
    std::vector<float> dlogits(static_cast<size_t>(rows) * vocab, 0.0f);
    cpu::TokenLogProbsBackward(*logits, batch->targets.data(), batch->weights.data(),
                               dlogits.data(), rows, vocab);
    model.parameters().ZeroGradients();
    if (absl::Status status = transformer.Backward(dlogits.data()); !status.ok()) return status;
    ClipGradNorm(optimizer->params(), config.max_grad_norm);
    if (absl::Status status = optimizer->Step(LearningRate(schedule, step)); !status.ok()) {
      return status;
    }
    if ((step + 1) % config.eval_every != 0 && step + 1 != config.max_steps) continue;
    auto accuracy =
        GreedyAccuracy(transformer, task, config.eval_prompts, config.seed + kEvalSeedOffset);
    if (!accuracy.ok()) return accuracy.status();
    progress = {step + 1, loss_sum / loss_count, *accuracy};
    loss_sum = 0;
    loss_count = 0;
    if (on_eval) on_eval(progress);
    if (progress.accuracy >= config.stop_accuracy) break;
  }
  return progress;
}

}  // namespace tandem::engine
