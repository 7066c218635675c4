#include "services/trainer/update/training_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::trainer {

absl::Status CheckSamples(const std::vector<TrainingSample>& samples,
                          const std::vector<int16_t>& rollout_routes, int route_width) {
  int64_t tokens = 0;
  for (const TrainingSample& sample : samples) {
    if (sample.prompt.empty() || sample.response.empty() ||
        sample.rollout_logprobs.size() != sample.response.size()) {
      return InvalidRequest(
          "BAD_TRAINING_SAMPLE",
          "every sample needs a prompt, a response and one rollout log-prob per response token");
    }
    tokens += static_cast<int64_t>(sample.prompt.size() + sample.response.size());
  }
  if (!rollout_routes.empty() &&
      static_cast<int64_t>(rollout_routes.size()) != tokens * route_width) {
    return InvalidRequest("ROUTE_COUNT_MISMATCH",
                          absl::StrCat("rollout routes hold ", rollout_routes.size(),
                                       " ids; the samples need ", tokens * route_width));
  }
  return absl::OkStatus();
}

TrainingBatch MakeTrainingBatch(const std::vector<TrainingSample>& samples,
                                const std::vector<int16_t>& rollout_routes, int route_width) {
  TrainingBatch batch{.samples = samples, .route_width = route_width};
  if (!rollout_routes.empty()) batch.rollout_routes = &rollout_routes;
  batch.offsets.push_back(0);
  for (const TrainingSample& sample : samples) {
    batch.offsets.push_back(batch.offsets.back() +
                            static_cast<int64_t>(sample.prompt.size() + sample.response.size()));
    batch.cols = std::max(batch.cols, static_cast<int>(sample.response.size()));
  }
  const size_t size = static_cast<size_t>(batch.rows()) * batch.cols;
  batch.mask.assign(size, 0);
  batch.advantages.assign(size, 0);
  batch.rollout_logp.assign(size, 0);
  batch.old_logp.assign(size, 0);
  batch.weights.assign(size, 1);
  batch.is_mask.assign(size, 0);
  batch.have_old.assign(samples.size(), false);
  for (int i = 0; i < batch.rows(); ++i) {
    for (size_t t = 0; t < samples[i].response.size(); ++t) {
      batch.mask[batch.at(i, t)] = 1;
      batch.rollout_logp[batch.at(i, t)] = samples[i].rollout_logprobs[t];
    }
  }
  return batch;
}

int64_t ResponseRow(const TrainingBatch& batch, int begin, int i, int t) {
  return batch.offsets[i] - batch.offsets[begin] +
         static_cast<int64_t>(batch.samples[i].prompt.size()) - 1 + t;
}

engine::TokenBatch Sequences(const TrainingBatch& batch, int begin, int end) {
  engine::TokenBatch tokens;
  for (int i = begin; i < end; ++i) {
    std::vector<int> sequence = batch.samples[i].prompt;
    sequence.insert(sequence.end(), batch.samples[i].response.begin(),
                    batch.samples[i].response.end());
    tokens.Add(sequence);
  }
  return tokens;
}

std::vector<int> ResponseTargets(const TrainingBatch& batch, int begin, int end) {
  std::vector<int> targets(batch.offsets[end] - batch.offsets[begin], -1);
  for (int i = begin; i < end; ++i) {
    const std::vector<int>& response = batch.samples[i].response;
    for (size_t t = 0; t < response.size(); ++t) {
      targets[ResponseRow(batch, begin, i, static_cast<int>(t))] = response[t];
    }
  }
  return targets;
}

std::vector<double> ResponseValues(const TrainingBatch& batch, int begin, int end,
                                   const std::vector<float>& rows) {
  std::vector<double> values(static_cast<size_t>(end - begin) * batch.cols, 0);
  for (int i = begin; i < end; ++i) {
    for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
      values[static_cast<size_t>(i - begin) * batch.cols + t] =
          rows[ResponseRow(batch, begin, i, static_cast<int>(t))];
    }
  }
  return values;
}

std::vector<float> PositionValues(const TrainingBatch& batch, int begin, int end,
                                  const std::vector<double>& values) {
  std::vector<float> rows(batch.offsets[end] - batch.offsets[begin], 0.0f);
  for (int i = begin; i < end; ++i) {
    for (size_t t = 0; t < batch.samples[i].response.size(); ++t) {
      rows[ResponseRow(batch, begin, i, static_cast<int>(t))] =
          static_cast<float>(values[static_cast<size_t>(i - begin) * batch.cols + t]);
    }
  }
  return rows;
}

MicroBatch MicroBatchOf(const TrainingBatch& batch, int begin, int end,
                        const std::vector<int16_t>* routes) {
  MicroBatch micro{.sequences = Sequences(batch, begin, end),
                   .targets = ResponseTargets(batch, begin, end)};
  if (routes != nullptr && !routes->empty()) {
    micro.routes.assign(routes->begin() + batch.offsets[begin] * batch.route_width,
                        routes->begin() + batch.offsets[end] * batch.route_width);
  }
  return micro;
}

ScoredSequences MicroBatch::Scored(float temperature) const {
  return {.sequences = &sequences,
          .targets = &targets,
          .routes = routes.empty() ? nullptr : &routes,
          .temperature = temperature};
}

}  // namespace tandem::trainer
