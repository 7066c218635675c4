// Figures of the weight-store on loopback: UCX fetch bandwidth against ucx_perftest (ucp_get,
// same transport, same run, see Run), the same from a plan pushed with the version's
// announcement (WatchReadPlans: no round trip before the bytes), gRPC fetch bandwidth, and
// publish -> N subscribers fetched latency for adapters of about 1 MiB, 64 MiB and 1 GiB,
// against the raw transfer time at ucx_perftest's put and get rates (a steady refit:
// subscribers that already fetched a version of that size, as rollout replicas do); then peak
// memory. Every figure is a median over --repeats, against ucx_perftest's median get (see
// PerftestMiBps) taken in turns with the fetches (see UcxFetchesAgainstPerftest): on these
// shared VMs one fetch in a few dozen stalls for 3-8x the others' time (with no page faults, so
// not the code's), which moves a mean of five far more than any change does, and the memory
// bandwidth a process gets drifts from one minute to the next. Prints its figures.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/channel.h"
#include "common/process_status.h"
#include "common/server.h"
#include "common/testing/test_server.h"
#include "services/weight_store/client/adapter_client.h"
#include "services/weight_store/weight_store_service.h"
#include "transfer/lora_testing.h"

ABSL_FLAG(std::string, transports, "tcp", "UCX transports for store and clients (as UCX_TLS).");
ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"1", "64", "1024"}),
          "Approximate adapter sizes to publish, MiB.");
ABSL_FLAG(int, subscribers, 2, "Rollout replicas fetching each published version.");
ABSL_FLAG(std::string, data_dir, "/tmp/tandem-weight-store-bench", "Scratch store directory.");
ABSL_FLAG(int, repeats, 5,
          "Timed steady refits and gRPC fetches per figure; rounds of ucx_perftest's get, each "
          "with three UCX fetches of each kind.");
ABSL_FLAG(bool, shard_checksums, true,
          "Readers watching with WatchReadPlans ask for shard checksums, as rollout replicas "
          "do; false: tensor checksums (the store hashes every version again for them).");

namespace tandem::weight_store {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double MiB(double bytes) { return bytes / (1 << 20); }

// ucx_perftest `test` (ucp_get, ucp_put_bw) moving `iterations` messages of `message_bytes` on
// the same transports: the transport's own rate, MiB/s; 0 if it could not run. A get completes
// within its iteration, so its rate is its median iteration's; puts are pipelined (a put_bw
// iteration only posts one), so theirs is the overall rate.
double PerftestMiBps(const std::string& test, size_t message_bytes, int iterations) {
  const std::string tls = absl::GetFlag(FLAGS_transports);
  const std::string server =
      absl::StrCat("UCX_TLS=", tls, " ucx_perftest -p 13399 >/dev/null 2>&1 &");
  if (std::system(server.c_str()) != 0) return 0;
  absl::SleepFor(absl::Milliseconds(500));
  const std::string client =
      absl::StrCat("UCX_TLS=", tls, " ucx_perftest 127.0.0.1 -p 13399 -t ", test, " -s ",
                   message_bytes, " -n ", iterations, " 2>/dev/null | grep Final");
  FILE* pipe = popen(client.c_str(), "r");
  char line[512] = {0};
  const bool read = pipe != nullptr && std::fgets(line, sizeof(line), pipe) != nullptr;
  if (pipe != nullptr) pclose(pipe);
  if (!read) return 0;
  // "Final: iterations p50 avg overall bw_avg bw_overall rate_avg rate_overall", latencies in
  // microseconds.
  std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
  double median_microseconds = 0;
  double overall_mibps = 0;
  if (fields.size() < 7 || !absl::SimpleAtod(fields[2], &median_microseconds) ||
      !absl::SimpleAtod(fields[6], &overall_mibps) || median_microseconds <= 0) {
    return 0;
  }
  if (test != "ucp_get") return overall_mibps;
  return MiB(static_cast<double>(message_bytes)) / (median_microseconds * 1e-6);
}

// The largest cache a core of this machine reaches, as the kernel's cache topology gives it
// ("32768K"). sysconf's figure comes from cpuid and may be a whole socket's: in this project's
// VMs (AMD EPYC) it says 320 MiB of L3 where a core reaches 32 MiB, so 59 MiB adapters were
// taken for cache-resident and compared against ucx_perftest copies that mostly were.
size_t LastLevelCacheBytes() {
  size_t largest = 0;
  for (int index = 0;; ++index) {
    std::ifstream file(absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", index, "/size"));
    std::string size;
    if (!(file >> size)) break;
    const size_t unit = absl::EndsWith(size, "K")   ? 1 << 10
                        : absl::EndsWith(size, "M") ? 1 << 20
                                                    : 1;
    size_t value = 0;
    if (absl::SimpleAtoi(absl::StripSuffix(absl::StripSuffix(size, "K"), "M"), &value)) {
      largest = std::max(largest, value * unit);
    }
  }
  if (largest > 0) return largest;
  for (int level : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    if (const long bytes = sysconf(level); bytes > 0) return static_cast<size_t>(bytes);
  }
  return 0;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  if (values.size() % 2 == 1) return values[middle];
  return (values[middle] + *std::max_element(values.begin(), values.begin() + middle)) / 2;
}

using Store = tandem::testing::LoopbackServer;

Store StartStore() {
  std::filesystem::remove_all(absl::GetFlag(FLAGS_data_dir));
  ServerOptions options = tandem::testing::LoopbackOptions();
  options.max_message_bytes = 80 << 20;
  return *tandem::testing::StartLoopbackServer(
      "weight-store",
      *WeightStoreServices({.data_dir = absl::GetFlag(FLAGS_data_dir),
                            .keep_versions = 2,
                            .ucx = {.transports = absl::GetFlag(FLAGS_transports)}}),
      options);
}

std::unique_ptr<WeightStoreStubs> Stub(const Store& store) {
  return std::make_unique<WeightStoreStubs>(store.Channel());
}

weightstore::v1::TargetLayout Stacked() {
  weightstore::v1::TargetLayout target;
  target.set_stack_experts(true);
  return target;
}

// A watch of `adapter`'s read plans for the stacked layout, as a rollout replica's: with shard
// checksums unless --shard_checksums=false.
internal::v1::WatchReadPlansRequest WatchReadPlansFor(const std::string& adapter,
                                                      const std::string& holder) {
  internal::v1::WatchReadPlansRequest request;
  request.set_adapter_name(adapter);
  *request.mutable_target() = Stacked();
  request.set_holder(holder);
  request.set_shard_checksums(absl::GetFlag(FLAGS_shard_checksums));
  return request;
}

// A fetch of the whole adapter's `version` by `fetcher` (endpoint and memory kept from fetch to
// fetch, as a rollout replica's loader keeps them from version to version): its seconds, or
// nullopt after saying why it failed.
std::optional<double> TimedFetch(AdapterFetcher& fetcher, const std::string& adapter,
                                 int64_t version, transfer::UcxWorker* ucx,
                                 FetchedAdapter& fetched) {
  const Clock::time_point start = Clock::now();
  const absl::Status status =
      fetcher.FetchInto(adapter, version, {.target = Stacked(), .ucx = ucx}, fetched);
  if (!status.ok()) {
    std::fprintf(stderr, "fetch: %s\n", status.ToString().c_str());
    return std::nullopt;
  }
  return SecondsSince(start);
}

// The same from a plan pushed with the latest version's announcement (WatchReadPlans): a
// watching replica has the lease and the plan before it fetches, so only the fetch is timed
// (from a fresh watch's snapshot, whose lease the fetch releases).
std::optional<double> TimedPushedFetch(WeightStoreStubs& stub, AdapterFetcher& fetcher,
                                       const std::string& adapter, transfer::UcxWorker* ucx,
                                       FetchedAdapter& fetched) {
  grpc::ClientContext context;
  const auto cancel = absl::MakeCleanup([&] { context.TryCancel(); });
  auto reader =
      stub.ucx().WatchReadPlans(&context, WatchReadPlansFor(adapter, "weight-store-bench"));
  internal::v1::WatchReadPlansResponse announced;
  if (!reader->Read(&announced)) {
    std::fprintf(stderr, "watch read plans: %s\n", reader->Finish().error_message().c_str());
    return std::nullopt;
  }
  const Clock::time_point start = Clock::now();
  const absl::Status status =
      fetcher.FetchAnnounced(adapter, announced, {.target = Stacked(), .ucx = ucx}, fetched);
  const double seconds = SecondsSince(start);
  if (!status.ok()) {
    std::fprintf(stderr, "fetch from a pushed plan: %s\n", status.ToString().c_str());
    return std::nullopt;
  }
  return seconds;
}

// gRPC fetches of the adapter's `version`, after one untimed: MiB/s of the median.
double GrpcFetchMiBps(const Store& store, const std::string& adapter, int64_t version,
                      double bytes) {
  auto stub = Stub(store);
  AdapterFetcher fetcher(*stub);
  FetchedAdapter fetched;
  std::vector<double> seconds;
  for (int i = 0; i <= absl::GetFlag(FLAGS_repeats); ++i) {
    const std::optional<double> fetch = TimedFetch(fetcher, adapter, version, nullptr, fetched);
    if (!fetch.has_value()) return 0;
    if (i > 0) seconds.push_back(*fetch);  // The first is a warm-up.
  }
  return MiB(bytes) / Median(seconds);
}

// UCX fetch rates against ucx_perftest's get on the same transport, MiB/s, each the median
// over the rounds, and each fetch's rate as a fraction of the get's, the median round's.
struct UcxFetchRates {
  double get = 0;     // ucx_perftest's.
  double fetch = 0;   // With its round trips (lease, plan).
  double pushed = 0;  // From a pushed plan.
  double fetch_of_get = 0;
  double pushed_of_get = 0;
};

// The fetches take turns with ucx_perftest's get (`get_bytes` messages, `get_iterations` of
// them), --repeats rounds of a get and kFetchesPerRound fetches of each kind: the memory
// bandwidth this VM gives a process drifts by tens of percent within a minute, so a baseline
// taken after all the fetches compared them with another machine. Each round's fraction is its
// fetches' median rate over its get's.
UcxFetchRates UcxFetchesAgainstPerftest(const Store& store, const std::string& adapter,
                                        int64_t version, double bytes, size_t get_bytes,
                                        int get_iterations, transfer::UcxWorker* ucx) {
  constexpr int kFetchesPerRound = 3;
  auto stub = Stub(store);
  AdapterFetcher fetcher(*stub);
  FetchedAdapter fetched;  // Both kinds fetch into the same memory, as one replica would.
  // Untimed warm-ups.
  if (!TimedFetch(fetcher, adapter, version, ucx, fetched).has_value() ||
      !TimedPushedFetch(*stub, fetcher, adapter, ucx, fetched).has_value()) {
    return {};
  }
  std::vector<double> gets, fetches, pushed, fetch_of_get, pushed_of_get;
  for (int round = 0; round < absl::GetFlag(FLAGS_repeats); ++round) {
    const double get = PerftestMiBps("ucp_get", get_bytes, get_iterations);
    std::vector<double> fetch_seconds, pushed_seconds;
    for (int i = 0; i < kFetchesPerRound; ++i) {
      const std::optional<double> fetch = TimedFetch(fetcher, adapter, version, ucx, fetched);
      const std::optional<double> pushed_fetch =
          TimedPushedFetch(*stub, fetcher, adapter, ucx, fetched);
      if (!fetch.has_value() || !pushed_fetch.has_value()) return {};
      fetch_seconds.push_back(*fetch);
      pushed_seconds.push_back(*pushed_fetch);
    }
    gets.push_back(get);
    fetches.push_back(MiB(bytes) / Median(fetch_seconds));
    pushed.push_back(MiB(bytes) / Median(pushed_seconds));
    fetch_of_get.push_back(get > 0 ? fetches.back() / get : 0);
    pushed_of_get.push_back(get > 0 ? pushed.back() / get : 0);
  }
  return {.get = Median(gets),
          .fetch = Median(fetches),
          .pushed = Median(pushed),
          .fetch_of_get = Median(fetch_of_get),
          .pushed_of_get = Median(pushed_of_get)};
}

// A rollout replica's loader: its UCX worker, fetcher and fetch memory live from version to
// version, as AdapterRegistry keeps them.
struct Subscriber {
  explicit Subscriber(const Store& store)
      : ucx(*transfer::UcxWorker::Create({.transports = absl::GetFlag(FLAGS_transports)})),
        stub(Stub(store)),
        fetcher(*stub) {}

  std::unique_ptr<transfer::UcxWorker> ucx;
  std::unique_ptr<WeightStoreStubs> stub;
  AdapterFetcher fetcher;
  FetchedAdapter fetched;
};

// A trainer's publishing side: its UCX worker and its endpoint to the store live from step to
// step, as StepPublisher keeps them.
struct Producer {
  std::unique_ptr<transfer::UcxWorker> ucx;
  transfer::UcxPeerCache peers;
};

// One steady refit, each time from the start of the publish: when the first subscriber heard of
// the version, when the last had fetched it, and when the publisher's commit returned (the
// version durable).
struct Refit {
  double announced = 0;
  double fetched = 0;
  double durable = 0;
};

// Waits for `version`'s announcement on a subscriber's watch and fetches it: by UCX from the plan
// pushed with the announcement (WatchReadPlans), as rollout replicas fetching by UCX do, or
// (rollout --ucx=false) announced by WatchVersions and fetched by the gRPC stream. `watching`
// is called once the watch's snapshot arrived; `announced` when the version's announcement did.
absl::Status FetchWhenAnnounced(Subscriber& subscriber, const weightstore::v1::Manifest& manifest,
                                bool by_ucx, const std::string& holder,
                                const std::function<void()>& watching,
                                const std::function<void()>& announced) {
  grpc::ClientContext context;
  const auto cancel = absl::MakeCleanup([&] { context.TryCancel(); });
  if (!by_ucx) {
    weightstore::v1::WatchVersionsRequest request;
    request.set_adapter_name(manifest.adapter_name());
    auto reader = subscriber.stub->api().WatchVersions(&context, request);
    weightstore::v1::WatchVersionsResponse event;
    reader->Read(&event);  // The snapshot.
    watching();
    while (reader->Read(&event) && event.version().version() < manifest.version()) {
    }
    announced();
    return subscriber.fetcher.FetchInto(manifest.adapter_name(), manifest.version(),
                                        {.target = Stacked(), .holder = holder},
                                        subscriber.fetched);
  }
  auto reader = subscriber.stub->ucx().WatchReadPlans(
      &context, WatchReadPlansFor(manifest.adapter_name(), holder));
  internal::v1::WatchReadPlansResponse event;
  reader->Read(&event);  // The snapshot: its lease given back, as a replica that holds it does.
  if (!event.lease_id().empty()) ReleaseLease(*subscriber.stub, event.lease_id());
  watching();
  while (reader->Read(&event) && event.announcement().version().version() < manifest.version()) {
  }
  announced();
  return subscriber.fetcher.FetchAnnounced(
      manifest.adapter_name(), event,
      {.target = Stacked(), .ucx = subscriber.ucx.get(), .holder = holder}, subscriber.fetched);
}

// Publishes by UCX while the subscribers watch.
Refit PublishToSubscribers(const transfer::TestAdapter& adapter, Producer& producer,
                           std::vector<std::unique_ptr<Subscriber>>& subscribers,
                           bool subscribers_by_ucx = true) {
  const int count = static_cast<int>(subscribers.size());
  std::vector<std::thread> replicas;
  std::vector<double> done(count, 0);
  std::vector<double> heard(count, 0);
  std::atomic<int> watching{0};
  const auto start = Clock::now();
  for (int r = 0; r < count; ++r) {
    replicas.emplace_back([&, r] {
      const absl::Status fetched = FetchWhenAnnounced(
          *subscribers[r], adapter.manifest, subscribers_by_ucx, absl::StrCat("r", r),
          [&] { ++watching; }, [&] { heard[r] = SecondsSince(start); });
      if (!fetched.ok()) std::fprintf(stderr, "fetch: %s\n", fetched.ToString().c_str());
      done[r] = fetched.ok() ? SecondsSince(start) : -1;
    });
  }
  while (watching < count) absl::SleepFor(absl::Milliseconds(1));
  const double publish_start = SecondsSince(start);
  const WeightStoreStubs& stub = *subscribers.front()->stub;
  if (absl::StatusOr<weightstore::v1::VersionInfo> published =
          PublishAdapter(stub, adapter.manifest, adapter.shard_views(),
                         {.ucx = producer.ucx.get(), .peers = &producer.peers});
      !published.ok()) {
    std::fprintf(stderr, "publish: %s\n", published.status().ToString().c_str());
  }
  const double durable = SecondsSince(start);
  for (std::thread& replica : replicas) replica.join();
  return {.announced = *std::min_element(heard.begin(), heard.end()) - publish_start,
          .fetched = *std::max_element(done.begin(), done.end()) - publish_start,
          .durable = durable - publish_start};
}

void Run() {
  if (absl::GetFlag(FLAGS_repeats) < 1) {
    std::fprintf(stderr, "--repeats must be >= 1\n");
    std::exit(2);
  }
  const std::string transports = absl::GetFlag(FLAGS_transports);
  Store store = StartStore();
  Producer producer{.ucx = *transfer::UcxWorker::Create({.transports = transports})};
  auto consumer = *transfer::UcxWorker::Create({.transports = transports});
  std::printf("transports %s, %d subscribers\n", transports.c_str(),
              absl::GetFlag(FLAGS_subscribers));
  std::vector<std::unique_ptr<Subscriber>> subscribers;
  for (int r = 0; r < absl::GetFlag(FLAGS_subscribers); ++r) {
    subscribers.push_back(std::make_unique<Subscriber>(store));
  }
  int64_t version = 0;
  for (const std::string& size : absl::GetFlag(FLAGS_sizes_mib)) {
    // Each publish is a new version of this size.
    const auto next_adapter = [&] {
      ++version;
      return transfer::MakeTestAdapter("bench", version, version,
                                       transfer::TestAdapterSpecOfSize(std::stod(size)));
    };
    // The first versions of a size warm the subscribers' memory and, once the store retires one
    // (it keeps 2), the store's: the one after them is a steady refit.
    const double first = PublishToSubscribers(next_adapter(), producer, subscribers).fetched;
    for (int warm_up = 0; warm_up < 2; ++warm_up) {
      PublishToSubscribers(next_adapter(), producer, subscribers);
    }
    const transfer::TestAdapter adapter = next_adapter();
    double bytes = 0;
    size_t shard_bytes = 0;
    for (const std::string& shard : adapter.shards) {
      bytes += static_cast<double>(shard.size());
      shard_bytes = std::max(shard_bytes, shard.size());
    }
    const int repeats = absl::GetFlag(FLAGS_repeats);
    std::vector<Refit> ucx_refits = {PublishToSubscribers(adapter, producer, subscribers)};
    while (static_cast<int>(ucx_refits.size()) < repeats) {
      ucx_refits.push_back(PublishToSubscribers(next_adapter(), producer, subscribers));
    }
    // The same steady refits with subscribers that fetch by gRPC (after one warm-up).
    PublishToSubscribers(next_adapter(), producer, subscribers, /*subscribers_by_ucx=*/false);
    std::vector<double> grpc_refits;
    while (static_cast<int>(grpc_refits.size()) < repeats) {
      grpc_refits.push_back(PublishToSubscribers(next_adapter(), producer, subscribers,
                                                 /*subscribers_by_ucx=*/false)
                                .fetched);
    }
    const double grpc = GrpcFetchMiBps(store, "bench", version, bytes);
    // The baselines move at least as many bytes as the fetches, in gets of whole shards, and in
    // puts of the pieces PublishAdapter puts on tcp (larger ones collapse there, see
    // UcxOptions). On shared memory, where a get is a memory copy, an adapter larger than the
    // last-level cache is fetched from and into memory, so then the messages are the whole
    // adapter's size: ucx_perftest gets one message into one buffer again and again, and only
    // with the fetch's working set (the adapter read, the adapter written) is that copy not
    // partly cache-resident. At least 20 messages, since ucx_perftest warms up for a tenth of
    // them: its first touches of fresh buffers would otherwise count.
    const bool tcp = absl::StrContains(transports, "tcp");
    const int shards = static_cast<int>(adapter.shards.size());
    const size_t adapter_bytes = static_cast<size_t>(bytes);
    const size_t cache_bytes = LastLevelCacheBytes();
    const size_t message_bytes =
        !tcp && cache_bytes > 0 && adapter_bytes > cache_bytes ? adapter_bytes : shard_bytes;
    const size_t get_bytes = message_bytes;
    const size_t put_bytes = tcp ? transfer::UcxOptions{}.max_chunk_bytes : message_bytes;
    const auto iterations = [&](size_t message_bytes) {
      return std::max(20, static_cast<int>(repeats * bytes / static_cast<double>(message_bytes)));
    };
    const UcxFetchRates ucx = UcxFetchesAgainstPerftest(store, "bench", version, bytes, get_bytes,
                                                        iterations(get_bytes), consumer.get());
    const double perftest_get = ucx.get;
    const double perftest_put = PerftestMiBps("ucp_put_bw", put_bytes, iterations(put_bytes));
    // The bytes cross loopback once up and once per subscriber down, at the transport's rates.
    const int count = static_cast<int>(subscribers.size());
    const double raw_seconds = perftest_get > 0 && perftest_put > 0
                                   ? MiB(bytes) / perftest_put + count * MiB(bytes) / perftest_get
                                   : 0;
    const auto median_of = [&](double Refit::*phase) {
      std::vector<double> seconds;
      for (const Refit& refit : ucx_refits) seconds.push_back(refit.*phase);
      return Median(seconds);
    };
    const double latency = median_of(&Refit::fetched);
    const double grpc_latency = Median(grpc_refits);
    std::printf(
        "%8.1f MiB in %d shards: fetch ucx %7.1f MiB/s (%5.1f%% of ucx_perftest get %7.1f), "
        "from a pushed plan %7.1f MiB/s (%5.1f%%) | "
        "grpc %7.1f MiB/s | publish->%d fetched %7.3f s = %4.2fx raw transfer %6.3f s "
        "(announced after %.3f s, durable after %.3f s; ucx_perftest "
        "put %.1f MiB/s; first of the size %.3f s; fetched by grpc %.3f s = %4.2fx)\n",
        MiB(bytes), shards, ucx.fetch, 100 * ucx.fetch_of_get, perftest_get, ucx.pushed,
        100 * ucx.pushed_of_get, grpc, count, latency, raw_seconds > 0 ? latency / raw_seconds : 0,
        raw_seconds, median_of(&Refit::announced), median_of(&Refit::durable), perftest_put, first,
        grpc_latency, raw_seconds > 0 ? grpc_latency / raw_seconds : 0);
  }
  store.server->Drain();
  std::printf("peak resident memory (store + clients + source tensors): %.0f MiB\n",
              PeakResidentMiB());
  std::filesystem::remove_all(absl::GetFlag(FLAGS_data_dir));
}

}  // namespace
}  // namespace tandem::weight_store

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tandem::weight_store::Run();
  return 0;
}
