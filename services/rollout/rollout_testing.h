#ifndef TANDEM_SERVICES_ROLLOUT_ROLLOUT_TESTING_H_
#define TANDEM_SERVICES_ROLLOUT_ROLLOUT_TESTING_H_

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/server.h"
#include "common/testing/test_server.h"
#include "engine/model.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/engine_lora.h"

// Shared by the rollout test and benchmark: server options and published adapters.
namespace tandem::rollout {

// Options of the in-process servers of rollout tests: a drain has room to deliver samples.
inline ServerOptions RolloutTestOptions() {
  ServerOptions options = tandem::testing::LoopbackOptions();
  options.drain_timeout = absl::Seconds(2);
  return options;
}

// A rank-4 adapter with every tensor random (B != 0, so it changes outputs).
inline engine::LoraAdapter RandomAdapter(const engine::ModelConfig& model, uint64_t seed) {
  engine::LoraConfig lora;
  lora.rank = 4;
  engine::LoraAdapter adapter = *engine::LoraAdapter::Create(model, lora, seed);
  std::mt19937_64 rng(seed);
  for (const std::string& name : adapter.parameters().names()) {
    engine::ParameterSet::FillNormal(*adapter.parameters().Find(name), 0.2f, rng);
  }
  return adapter;
}

inline absl::Status PublishEngineAdapter(const weight_store::WeightStoreStubs& stub,
                                         const engine::LoraAdapter& adapter,
                                         const engine::ModelConfig& model, const std::string& name,
                                         int64_t version) {
  auto published = weight_store::BuildAdapterVersion(adapter, model, name, version);
  if (!published.ok()) return published.status();
  return weight_store::PublishAdapter(stub, published->manifest, published->shard_views(), {})
      .status();
}

}  // namespace tandem::rollout

#endif  // TANDEM_SERVICES_ROLLOUT_ROLLOUT_TESTING_H_
