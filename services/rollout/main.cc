#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/peer_tls.h"
#include "common/service_main.h"
#include "common/status.h"
#include "engine/blas_threads_flag.h"
#include "engine/cuda/device_engines.h"
#include "services/rollout/relay_upstream.h"
#include "services/rollout/rollout_service.h"
#include "services/weight_store/client/adapter_client.h"

ABSL_FLAG(std::string, base_model, "",
          "Base model: a Hugging Face model directory or an engine safetensors file "
          "(make_base_model). Required.");
ABSL_FLAG(std::string, precision, "bf16",
          "Inference precision: bf16, fp8 (E4M3 linear layers over bf16), int8 (INT8 weight-only "
          "linear layers over bf16) or fp32.");
ABSL_FLAG(std::string, device, "cpu",
          "Where generation computes: cpu, or cuda / cuda:N (a GPU; --precision fp32 or bf16).");
ABSL_FLAG(std::string, weight_store, "",
          "weight-store address (host:port); empty: the base model only, no adapters.");
ABSL_FLAG(std::string, router_replay, "",
          "router-replay address (host:port); empty: requests that record routes get them FAILED.");
ABSL_FLAG(std::vector<std::string>, adapter, {},
          "Adapters to follow from the start (comma-separated); NOT_SERVING until the newest "
          "version of each is loaded.");
ABSL_FLAG(int, resident_versions, 3, "Adapter versions kept servable per adapter.");
ABSL_FLAG(int, max_followed_adapters, 64,
          "Adapters this replica follows at most; a request naming one more is "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, unfollow_idle_after, absl::Minutes(10),
          "An adapter no request has named for this long (nothing in use or loading) is "
          "unfollowed; those named by --adapter are kept.");
ABSL_FLAG(int64_t, kv_cache_mib, 256, "KV cache budget of admitted sequences, MiB.");
ABSL_FLAG(int64_t, max_queued_tokens, 1 << 20,
          "KV positions (prompt + max_new_tokens per sample) that may wait for admission; "
          "beyond it Generate is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_batch_sequences, 256, "Sequences decoded together at most.");
ABSL_FLAG(int, max_prefill_tokens_per_step, 1024,
          "Prompt tokens prefilled between two decode steps (at least one prompt).");
ABSL_FLAG(bool, ucx, true, "Fetch adapters by UCX when the weight-store serves it.");
ABSL_FLAG(std::string, ucx_transports, "", "UCX transports (as UCX_TLS); empty: UCX's choice.");
ABSL_FLAG(bool, relay, false,
          "Relay every adapter version to other replicas as it arrives (AdapterRelayService on "
          "this port); adapters then come by gRPC streams, not UCX.");
ABSL_FLAG(std::string, relay_from, "",
          "host:port of the replica to read adapter versions from (its --relay), before the "
          "weight-store; needs --relay. A chain: replica i reads from replica i-1, and "
          "\"{previous}\" in the address stands for i-1 (see --replica_index).");
ABSL_FLAG(int, replica_index, -1,
          "This replica's place in a relay chain (a StatefulSet's pod index): fills "
          "{previous} in --relay_from; replica 0 reads from the weight-store.");

namespace {

using tandem::rollout::RolloutOptions;

absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelTo(
    const std::string& target, const std::string& service, const tandem::ServerOptions& server,
    const std::optional<tandem::ClientTls>& tls, std::vector<std::string> also_services = {}) {
  if (target.empty()) return nullptr;
  return tandem::CreateChannel({.target = target,
                                .service_name = service,
                                .also_services = std::move(also_services),
                                .auth_token = server.auth_token,
                                .auth_token_file = server.auth_token_file,
                                .tls = tls});
}

absl::StatusOr<RolloutOptions> OptionsFromFlags(const tandem::ServerOptions& server) {
  RolloutOptions options;
  options.base_model_path = absl::GetFlag(FLAGS_base_model);
  if (options.base_model_path.empty())
    return tandem::InvalidRequest("INVALID_FLAG", "--base_model is required");
  const std::string precision = absl::GetFlag(FLAGS_precision);
  auto parsed_precision = tandem::engine::PrecisionFromName(precision);
  if (!parsed_precision.ok()) {
    return tandem::InvalidRequest(
        "INVALID_FLAG", absl::StrCat("--precision: ", parsed_precision.status().message()));
  }
  options.precision = *parsed_precision;
  options.device = absl::GetFlag(FLAGS_device);
  absl::StatusOr<std::string> device = tandem::engine::DescribeDevice(options.device);
  if (!device.ok()) {
    return tandem::Annotate(device.status(), absl::StrCat("--device=", options.device, ": "));
  }
  spdlog::info("generation runs on {}", *device);
  auto peer_tls = tandem::PeerTlsFromFlags();
  if (!peer_tls.ok()) return peer_tls.status();
  auto weight_store =
      ChannelTo(absl::GetFlag(FLAGS_weight_store), "tandem.weightstore.v1.WeightStoreService",
                server, *peer_tls, {tandem::weight_store::kUcxServiceName});
  if (!weight_store.ok()) return weight_store.status();
  options.weight_store = *weight_store;
  auto router_replay = ChannelTo(absl::GetFlag(FLAGS_router_replay),
                                 "tandem.routerreplay.v1.RouterReplayService", server, *peer_tls);
  if (!router_replay.ok()) return router_replay.status();
  options.router_replay = *router_replay;
  options.adapters = absl::GetFlag(FLAGS_adapter);
  options.registry.resident_versions = absl::GetFlag(FLAGS_resident_versions);
  options.registry.max_followed_adapters = absl::GetFlag(FLAGS_max_followed_adapters);
  if (options.registry.max_followed_adapters < 1) {
    return tandem::InvalidRequest("INVALID_FLAG", "--max_followed_adapters must be >= 1");
  }
  options.registry.unfollow_idle_after = absl::GetFlag(FLAGS_unfollow_idle_after);
  if (options.registry.unfollow_idle_after <= absl::ZeroDuration()) {
    return tandem::InvalidRequest("INVALID_FLAG", "--unfollow_idle_after must be positive");
  }
  options.scheduler.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_mib) << 20;
  options.scheduler.max_queued_positions = absl::GetFlag(FLAGS_max_queued_tokens);
  options.scheduler.max_batch_sequences = absl::GetFlag(FLAGS_max_batch_sequences);
  options.scheduler.max_prefill_tokens_per_step = absl::GetFlag(FLAGS_max_prefill_tokens_per_step);
  if (options.registry.resident_versions < 1 || options.scheduler.kv_cache_bytes < 1 ||
      options.scheduler.max_queued_positions < 1 || options.scheduler.max_batch_sequences < 1 ||
      options.scheduler.max_prefill_tokens_per_step < 1) {
    return tandem::InvalidRequest(
        "INVALID_FLAG",
        "--resident_versions, --kv_cache_mib, --max_queued_tokens, --max_batch_sequences and "
        "--max_prefill_tokens_per_step must be >= 1");
  }
  options.enable_ucx = absl::GetFlag(FLAGS_ucx);
  options.ucx.transports = absl::GetFlag(FLAGS_ucx_transports);
  options.relay = absl::GetFlag(FLAGS_relay);
  if (!absl::GetFlag(FLAGS_relay_from).empty() && !options.relay) {
    return tandem::InvalidRequest("INVALID_FLAG", "--relay_from needs --relay");
  }
  absl::StatusOr<std::string> upstream = tandem::rollout::RelayUpstream(
      absl::GetFlag(FLAGS_relay_from), absl::GetFlag(FLAGS_replica_index));
  if (!upstream.ok()) return upstream.status();
  auto relay_from =
      ChannelTo(*upstream, "tandem.internal.v1.AdapterRelayService", server, *peer_tls);
  if (!relay_from.ok()) return relay_from.status();
  options.relay_from = *relay_from;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  return tandem::RunServiceMain(
      argc, argv,
      {.name = "rollout",
       .usage = "Tandem rollout service: batched generation with a versioned LoRA adapter, routes "
                "recorded into router-replay, adapters hot-swapped from weight-store.",
       .defaults = {.port = 50052, .metrics_port = 9452, .max_message_bytes = 64 << 20},
       .make_services = [](const tandem::ServerOptions& server)
           -> absl::StatusOr<std::vector<tandem::HostedService>> {
         if (auto threads = tandem::engine::ApplyBlasThreadsFlag(); !threads.ok()) {
           return threads.status();
         }
         absl::StatusOr<RolloutOptions> options = OptionsFromFlags(server);
         if (!options.ok()) return options.status();
         auto replica = tandem::rollout::RolloutReplica::Create(*std::move(options));
         if (!replica.ok()) return replica.status();
         return tandem::rollout::RolloutServices(*std::move(replica));
       }});
}
