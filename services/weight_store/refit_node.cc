// One node of a refit measured across hosts (tools/cluster/refit_bench.py runs it in network
// namespaces): a trainer rank publishing its shards of a version, or a rollout replica that
// fetches every version it hears of, as replicas fetching by UCX do (WatchReadPlans, then the
// pushed plan). A driver steers it over stdin/stdout, one line each way per step, and takes the
// times itself, so the nodes need no shared clock:
//
//   publish: "begin <version>"  -> begins the version's upload (every rank the same manifest, so
//                                  every rank gets the one upload) and puts this rank's shards
//                                  -> "put <version>"
//            "commit <version>" -> commits (rank 0) -> "committed <version>"
//   fetch:   (no input)         -> "watching" once the watch is open, then for every version
//                                  announced and fetched: "fetched <version> <bytes> <source>"
//                                  (source: ucx or grpc from the store, or relay); a relaying
//                                  replica serves on until its stdin ends
//
// A replica with --relay_port serves what it receives to the next one (AdapterRelayService) as
// it arrives, and one with --upstream reads from such a relay: a chain of replicas then carries
// each version over each link once.
//
// Versions are TestAdapterSpecOfSize(--mib) adapters at TP 2 x EP 2 (4 shards), their bytes
// seeded by the version, so every rank builds the same manifest without talking to the others.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/channel.h"
#include "common/server.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/client/adapter_relay.h"
#include "transfer/lora_testing.h"
#include "transfer/ucx_peer_cache.h"
#include "transfer/ucx_transport.h"

ABSL_FLAG(std::string, mode, "fetch", "publish (a trainer rank) or fetch (a rollout replica).");
ABSL_FLAG(std::string, store, "", "The weight-store's gRPC address, host:port.");
ABSL_FLAG(std::string, adapter, "refit", "Adapter name.");
ABSL_FLAG(double, mib, 64, "Approximate adapter size, MiB.");
ABSL_FLAG(int, ranks, 4, "Publishing ranks; the adapter's 4 shards are dealt among them.");
ABSL_FLAG(int, rank, 0, "This publishing rank; rank 0 commits.");
ABSL_FLAG(int, versions, 1, "Versions a replica fetches before it exits.");
ABSL_FLAG(std::string, ucx_transports, "tcp", "UCX transports (as UCX_TLS).");
ABSL_FLAG(bool, grpc, false, "Replica: fetch by the gRPC stream instead of UCX.");
ABSL_FLAG(int, relay_port, 0,
          "Replica: relay what it receives to other replicas on this port (AdapterRelayService); "
          "0: no relay. A relaying replica fetches by gRPC streams.");
ABSL_FLAG(std::string, upstream, "",
          "Replica: the relay (host:port) to fetch from before the store; empty: the store.");

namespace tandem::weight_store {
namespace {

constexpr char kService[] = "tandem.weightstore.v1.WeightStoreService";

weightstore::v1::TargetLayout Stacked() {
  weightstore::v1::TargetLayout target;
  target.set_stack_experts(true);
  return target;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// A command or flag this tool does not understand.
[[noreturn]] void FailBadInput(const std::string& what, const std::string& input) {
  std::fprintf(stderr, "%s: not understood: %s\n", what.c_str(), input.c_str());
  std::exit(1);
}

void WaitForEndOfInput() {
  std::string line;
  while (std::getline(std::cin, line)) {
  }
}

// Reads "<word> <version>" from stdin; false at its end.
bool NextCommand(std::string& word, int64_t& version) {
  std::string line;
  if (!std::getline(std::cin, line)) return false;
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &version)) {
    FailBadInput("command", line);
  }
  word = parts[0];
  return true;
}

void Publish(const WeightStoreStubs& store, transfer::UcxWorker& ucx) {
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int rank = absl::GetFlag(FLAGS_rank);
  transfer::UcxPeerCache peers;
  const PublishOptions options{.ucx = &ucx, .peers = &peers};
  std::optional<transfer::TestAdapter> adapter;
  std::optional<Upload> upload;
  std::string word;
  int64_t version = 0;
  while (NextCommand(word, version)) {
    if (word == "begin") {
      adapter =
          transfer::MakeTestAdapter(absl::GetFlag(FLAGS_adapter), version, version,
                                    transfer::TestAdapterSpecOfSize(absl::GetFlag(FLAGS_mib)));
      absl::StatusOr<Upload> begun = BeginUpload(store, adapter->manifest, /*use_ucx=*/true);
      if (!begun.ok()) Fail("begin", begun.status());
      upload = *std::move(begun);
      std::vector<int> mine;
      for (int shard = rank; shard < adapter->manifest.shards_size(); shard += ranks) {
        mine.push_back(shard);
      }
      if (absl::Status put = PutShards(store, *upload, adapter->shard_views(), mine, options);
          !put.ok()) {
        Fail("put", put);
      }
      Say(absl::StrCat("put ", version));
    } else if (word == "commit" && upload.has_value()) {
      absl::StatusOr<weightstore::v1::VersionInfo> committed =
          CommitUpload(store, upload->upload_id(), options);
      if (!committed.ok()) Fail("commit", committed.status());
      Say(absl::StrCat("committed ", version));
    } else {
      FailBadInput("command", word);
    }
  }
}

uint64_t Bytes(const FetchedAdapter& fetched) {
  uint64_t bytes = 0;
  for (const FetchedTensor& tensor : fetched.tensors) bytes += tensor.bytes.size();
  return bytes;
}

void Fetch(const WeightStoreStubs& store, transfer::UcxWorker& ucx) {
  AdapterFetcher fetcher(store);
  FetchedAdapter fetched;
  const FetchOptions options{.target = Stacked(),
                             .ucx = absl::GetFlag(FLAGS_grpc) ? nullptr : &ucx,
                             .holder = "refit-node"};
  grpc::ClientContext context;
  internal::v1::WatchReadPlansRequest request;
  request.set_adapter_name(absl::GetFlag(FLAGS_adapter));
  *request.mutable_target() = Stacked();
  request.set_holder("refit-node");
  request.set_shard_checksums(true);
  auto reader = store.ucx().WatchReadPlans(&context, request);
  internal::v1::WatchReadPlansResponse event;
  if (!reader->Read(&event)) Fail("watch", absl::UnavailableError("no snapshot"));
  // The version current when the watch began is not wanted.
  if (!event.lease_id().empty()) ReleaseLease(store, event.lease_id());
  Say("watching");
  for (int fetches = 0; fetches < absl::GetFlag(FLAGS_versions); ++fetches) {
    if (!reader->Read(&event)) Fail("watch", absl::UnavailableError("the stream ended"));
    const int64_t version = event.announcement().version().version();
    if (absl::Status status =
            fetcher.FetchAnnounced(absl::GetFlag(FLAGS_adapter), event, options, fetched);
        !status.ok()) {
      Fail("fetch", status);
    }
    Say(absl::StrCat("fetched ", version, " ", Bytes(fetched), fetched.by_ucx ? " ucx" : " grpc"));
  }
  context.TryCancel();
}

// A replica of a chain: watches WatchVersions, fetches each version from its upstream relay (or
// the store) and relays it on.
void FetchRelaying(const WeightStoreStubs& store) {
  RelayedVersions versions(Stacked());
  std::unique_ptr<ServiceServer> relay;
  if (const int port = absl::GetFlag(FLAGS_relay_port); port > 0) {
    std::vector<HostedService> services;
    services.push_back({"tandem.internal.v1.AdapterRelayService",
                        std::make_unique<AdapterRelayServiceImpl>(versions, absl::Seconds(30))});
    absl::StatusOr<std::unique_ptr<ServiceServer>> started =
        ServiceServer::Start("relay", std::move(services), {.port = port, .metrics_port = 0});
    if (!started.ok()) Fail("relay", started.status());
    relay = *std::move(started);
    relay->SetReady();
  }
  std::unique_ptr<internal::v1::AdapterRelayService::Stub> upstream;
  if (const std::string target = absl::GetFlag(FLAGS_upstream); !target.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateChannel({.target = target, .service_name = "tandem.internal.v1.AdapterRelayService"});
    if (!channel.ok()) Fail("upstream", channel.status());
    upstream = internal::v1::AdapterRelayService::NewStub(*channel);
  }
  grpc::ClientContext context;
  weightstore::v1::WatchVersionsRequest request;
  request.set_adapter_name(absl::GetFlag(FLAGS_adapter));
  auto reader = store.api().WatchVersions(&context, request);
  weightstore::v1::WatchVersionsResponse event;
  if (!reader->Read(&event)) Fail("watch", absl::UnavailableError("no snapshot"));
  Say("watching");
  FetchedAdapter fetched;
  for (int fetches = 0; fetches < absl::GetFlag(FLAGS_versions); ++fetches) {
    if (!reader->Read(&event)) Fail("watch", absl::UnavailableError("the stream ended"));
    const int64_t version = event.version().version();
    absl::StatusOr<FetchedFrom> from =
        weight_store::FetchRelaying(store, versions, absl::GetFlag(FLAGS_adapter), version,
                                    {.upstream = upstream.get()}, fetched);
    if (!from.ok()) Fail("fetch", from.status());
    Say(absl::StrCat("fetched ", version, " ", Bytes(fetched),
                     *from == FetchedFrom::kRelay ? " relay" : " grpc"));
  }
  context.TryCancel();
  // Relays on until the driver is done: the next replica may still read the last version.
  WaitForEndOfInput();
  if (relay != nullptr) relay->Drain();
}

void Run() {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateChannel({.target = absl::GetFlag(FLAGS_store),
                     .service_name = kService,
                     .also_services = {"tandem.internal.v1.WeightStoreUcxService"}});
  if (!channel.ok()) Fail("channel", channel.status());
  const WeightStoreStubs store(*channel);
  absl::StatusOr<std::unique_ptr<transfer::UcxWorker>> ucx =
      transfer::UcxWorker::Create({.transports = absl::GetFlag(FLAGS_ucx_transports)});
  if (!ucx.ok()) Fail("ucx", ucx.status());
  if (absl::GetFlag(FLAGS_mode) == "publish") {
    Publish(store, **ucx);
  } else if (absl::GetFlag(FLAGS_mode) == "fetch" &&
             (absl::GetFlag(FLAGS_relay_port) > 0 || !absl::GetFlag(FLAGS_upstream).empty())) {
    FetchRelaying(store);
  } else if (absl::GetFlag(FLAGS_mode) == "fetch") {
    Fetch(store, **ucx);
  } else {
    FailBadInput("--mode", absl::GetFlag(FLAGS_mode));
  }
}

}  // namespace
}  // namespace tandem::weight_store

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tandem::weight_store::Run();
  return 0;
}
