#include "services/weight_store/client/adapter_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/parallel_tasks.h"
#include "common/proto_time.h"
#include "common/status.h"
#include "common/streaming_copy.h"
#include "services/weight_store/client/read_plan.h"
#include "services/weight_store/client/shard_verifier.h"

namespace tandem::weight_store {
namespace {

constexpr absl::Duration kBeginTimeout = absl::Seconds(60);

absl::Status Checked(const grpc::Status& status) { return FromGrpcStatus(status); }

// DATA_LOSS unless the fetched tensor, whose bytes hash to `checksum`, is the one planned.
absl::Status CheckFetched(const FetchedTensor& fetched, uint64_t checksum) {
  if (fetched.bytes.size() != fetched.tensor.byte_size() || checksum != fetched.tensor.xxh3_64()) {
    return absl::DataLossError(
        absl::StrFormat("tensor %s: got %d bytes with xxh3 0x%016x, expected %d bytes with 0x%016x",
                        fetched.tensor.spec().name(), fetched.bytes.size(), checksum,
                        fetched.tensor.byte_size(), fetched.tensor.xxh3_64()));
  }
  return absl::OkStatus();
}

absl::Status VerifyChecksum(const FetchedTensor& fetched) {
  return CheckFetched(fetched, Xxh3Checksum(fetched.bytes));
}

absl::Status PutByGrpc(weightstore::v1::WeightStoreService::StubInterface& stub,
                       const std::string& upload_id, const std::vector<absl::string_view>& shards,
                       absl::Span<const int> which, const PublishOptions& options) {
  grpc::ClientContext context;
  SetTimeout(context, options.timeout);
  weightstore::v1::PutShardResponse response;
  auto writer = stub.PutShard(&context, &response);
  weightstore::v1::PutShardRequest chunk;
  chunk.set_upload_id(upload_id);
  for (const int i : which) {
    for (size_t offset = 0; offset < shards[i].size(); offset += options.grpc_chunk_bytes) {
      chunk.set_shard_index(i);
      chunk.set_offset(offset);
      const absl::string_view data = shards[i].substr(offset, options.grpc_chunk_bytes);
      chunk.set_data(data.data(), data.size());
      if (!writer->Write(chunk)) return Checked(writer->Finish());
    }
  }
  writer->WritesDone();
  return Checked(writer->Finish());
}

// The store's shard regions as `peer` maps them into this process, each for `length(region)`
// bytes from its start; UNIMPLEMENTED where its transport maps none (tcp, RDMA) or for more
// regions than the peer keeps mapped at once.
absl::StatusOr<std::vector<char*>> MapRegions(
    const std::vector<const internal::v1::ShardRegion*>& regions, transfer::UcxPeer& peer,
    absl::FunctionRef<uint64_t(const internal::v1::ShardRegion&)> length) {
  if (regions.size() > transfer::UcxPeer::kMaxCachedRkeys) {
    return absl::UnimplementedError("more shards than a peer keeps mapped at once");
  }
  std::vector<char*> mapped;
  for (const internal::v1::ShardRegion* region : regions) {
    absl::StatusOr<char*> memory =
        peer.Mapped(region->rkey(), region->remote_address(), length(*region));
    if (!memory.ok()) return memory.status();
    mapped.push_back(*memory);
  }
  return mapped;
}

// Pieces of a shard put by copies: both threads share even a single shard.
constexpr size_t kPutPieceBytes = size_t{4} << 20;

// Puts the shards as copies into the store's memory where the transport maps it into this
// process (shared memory), as mapped fetches read it: streaming stores (no read of the store's
// lines first) on two threads, and no request per fragment. UNIMPLEMENTED as MapRegions.
absl::Status CopyIntoMapped(const std::vector<const internal::v1::ShardRegion*>& targets,
                            const std::vector<absl::string_view>& shards, transfer::UcxPeer& peer) {
  // Mapped for the bytes put, which the peer checks lie inside the region.
  absl::StatusOr<std::vector<char*>> destinations =
      MapRegions(targets, peer, [&shards](const internal::v1::ShardRegion& target) {
        return shards[target.shard_index()].size();
      });
  if (!destinations.ok()) return destinations.status();
  ParallelTasks copies;
  for (size_t i = 0; i < targets.size(); ++i) {
    const absl::string_view shard = shards[targets[i]->shard_index()];
    for (size_t offset = 0; offset < shard.size(); offset += kPutPieceBytes) {
      const absl::string_view piece = shard.substr(offset, kPutPieceBytes);
      copies.Add([destination = (*destinations)[i] + offset, piece] {
        CopyStreaming(destination, piece.data(), piece.size());
        return absl::OkStatus();
      });
    }
  }
  return copies.Finish();
}

absl::Status PutByUcx(const Upload& begun,
                      const std::vector<absl::string_view>& shards, absl::Span<const int> which,
                      const PublishOptions& options) {
  transfer::UcxPeerCache one_publish;
  transfer::UcxPeerCache& peers = options.peers != nullptr ? *options.peers : one_publish;
  absl::StatusOr<transfer::UcxPeer*> peer =
      peers.PeerFor(*options.ucx, begun.store_worker_address());
  if (!peer.ok()) return peer.status();
  std::vector<const internal::v1::ShardRegion*> targets;
  for (const internal::v1::ShardRegion& target : begun.targets()) {
    if (target.shard_index() < 0 || target.shard_index() >= static_cast<int>(shards.size())) {
      return absl::InternalError(
          absl::StrCat("BeginPublish named shard ", target.shard_index(), " of ", shards.size()));
    }
    if (absl::c_linear_search(which, target.shard_index())) targets.push_back(&target);
  }
  absl::Status put = CopyIntoMapped(targets, shards, **peer);
  if (absl::IsUnimplemented(put)) {
    // Every shard's writes in one window and one flush: each region drained and flushed in turn
    // left the connection idle between shards.
    std::vector<transfer::UcxPeer::Transfer> transfers;  // One per shard; writes refer to them.
    transfers.reserve(targets.size());
    std::vector<transfer::UcxPeer::RegionTransfers> writes;
    for (const internal::v1::ShardRegion* target : targets) {
      const absl::string_view bytes = shards[target->shard_index()];
      // UCX reads the source without writing it; the API takes a mutable pointer for both ways.
      transfers.push_back(
          {target->remote_address(), const_cast<char*>(bytes.data()), bytes.size()});
      writes.push_back({target->rkey(), absl::MakeConstSpan(&transfers.back(), 1)});
    }
    put = (*peer)->Put(writes, absl::Now() + options.timeout);
  }
  if (!put.ok()) peers.Forget();  // A broken endpoint is not reused.
  return put;
}

// Copies a staged tensor's blocks from `staging` into its memory.
void Assemble(const internal::v1::PlannedTensor& planned,
              const absl::flat_hash_map<int, std::vector<StagedSpan>>& spans_by_shard,
              const char* staging, FetchedTensor& tensor) {
  for (const internal::v1::CopyOp& op : planned.ops()) {
    const std::vector<StagedSpan>& spans = spans_by_shard.at(op.shard_index());
    const auto span = std::find_if(spans.begin(), spans.end(), [&](const StagedSpan& s) {
      return s.begin <= op.src_offset() && op.src_offset() < s.end;
    });
    const char* source = staging + span->staged_at + (op.src_offset() - span->begin);
    for (uint64_t block = 0; block < op.count(); ++block) {
      std::memcpy(tensor.bytes.data() + op.dst_offset() + block * op.dst_stride(),
                  source + block * op.src_stride(), op.length());
    }
  }
}

// Each shard's first byte, where the store's memory is mapped into this process.
using MappedShards = absl::flat_hash_map<int, const char*>;

// The plan's shards as mapped by `peer`; UNIMPLEMENTED as MapRegions.
absl::StatusOr<MappedShards> MapShards(const internal::v1::GetReadPlanResponse& plan,
                                       transfer::UcxPeer& peer) {
  std::vector<const internal::v1::ShardRegion*> regions;
  for (const internal::v1::ShardRegion& region : plan.shards()) regions.push_back(&region);
  absl::StatusOr<std::vector<char*>> mapped = MapRegions(
      regions, peer, [](const internal::v1::ShardRegion& region) { return region.length(); });
  if (!mapped.ok()) return mapped.status();
  MappedShards shards;
  for (size_t i = 0; i < regions.size(); ++i) shards[regions[i]->shard_index()] = (*mapped)[i];
  return shards;
}

// Copies a tensor's blocks out of the mapped shards in destination order, hashing each one as
// it is read, while it is in the nearest cache (the copy's streaming stores leave the tensor's
// memory out of the cache), then verifies the tensor. Blocks that do not tile the tensor
// exactly (only a faulty plan's) hash differently from its bytes, so then the tensor is hashed
// again as it is.
absl::Status CopyAndVerify(const internal::v1::PlannedTensor& planned,
                           const MappedShards& shards, FetchedTensor& tensor) {
  Xxh3Hasher hasher;
  uint64_t hashed = 0;  // While the blocks tile the tensor: bytes [0, hashed) are hashed.
  bool tiling = true;
  {
    StreamingCopier copier;
    for (const PlannedBlock& block :
         BlocksInDestinationOrder(planned, [&shards](int shard) { return shards.at(shard); })) {
      copier.Copy(tensor.bytes.data() + block.dst_offset, block.source, block.length);
      tiling = tiling && block.dst_offset == hashed;
      if (!tiling) continue;
      hasher.Update(absl::string_view(block.source, block.length));
      hashed += block.length;
    }
  }
  return tiling && hashed == tensor.bytes.size() ? CheckFetched(tensor, hasher.Digest())
                                                 : VerifyChecksum(tensor);
}

// Runs a checked plan as local copies out of the mapped shards: one copy per byte and no
// request per block, where gets would stage the tensors of small blocks and copy them again.
// This thread and a helper share the tensors (or, with verify_shards, the shards); once one
// fails its check, the rest are skipped (ParallelTasks starts none after a failure).
// Copies that end past `deadline` may have read memory the store reused once the lease ran
// out: DEADLINE_EXCEEDED, which the caller treats as transport trouble, not as corruption.
absl::Status CopyMapped(const internal::v1::GetReadPlanResponse& plan,
                        const MappedShards& shards, absl::Time deadline, FetchedAdapter& fetched) {
  ParallelTasks tasks;
  std::optional<ShardVerifier> verifier;
  if (plan.verify_shards()) {
    verifier.emplace(plan);
    // The largest shards first: the two threads end closer together.
    std::vector<const internal::v1::ShardRegion*> regions;
    for (const internal::v1::ShardRegion& region : plan.shards()) regions.push_back(&region);
    absl::c_sort(regions, [](const auto* a, const auto* b) { return a->length() > b->length(); });
    for (const internal::v1::ShardRegion* region : regions) {
      tasks.Add([region, &shards, &fetched, &verifier] {
        verifier->CopyShard(
            region->shard_index(), shards.at(region->shard_index()),
            [&fetched](int tensor) { return fetched.tensors[tensor].bytes.data(); });
        return absl::OkStatus();
      });
    }
    tasks.Add([&plan] { return CheckTiling(plan); });
  } else {
    for (int i = 0; i < plan.tensors_size(); ++i) {
      tasks.Add([&plan, &shards, &fetched, i] {
        return CopyAndVerify(plan.tensors(i), shards, fetched.tensors[i]);
      });
    }
  }
  absl::Status copied = tasks.Finish();
  if (copied.ok() && verifier.has_value()) copied = verifier->Finish();
  if (!copied.ok() && absl::Now() > deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("copies from the store's memory outlasted the lease: ", copied.message()));
  }
  return copied;
}

// A batch's staged tensors not yet copied out of its staging slot.
struct SlotCopies {
  std::atomic<int> left;
  absl::Notification done;
};

// One staged tensor's claim on its batch's slot. Given up once the tensor is copied out, or
// when its task goes without running (ParallelTasks drops the tasks left after a failure), so
// a wait for the slot always ends.
class SlotClaim {
 public:
  explicit SlotClaim(SlotCopies* copies) : copies_(copies) {}
  SlotClaim(SlotClaim&& other) noexcept : copies_(std::exchange(other.copies_, nullptr)) {}
  SlotClaim& operator=(SlotClaim&&) = delete;
  ~SlotClaim() { GiveUp(); }

  void GiveUp() {
    if (copies_ != nullptr && --copies_->left == 0) copies_->done.Notify();
    copies_ = nullptr;
  }

 private:
  SlotCopies* copies_;
};

// Sizes `fetched` for the plan's tensors, keeping the memory of tensors it already held.
void ShapeLike(const internal::v1::GetReadPlanResponse& plan, FetchedAdapter& fetched) {
  fetched.tensors.resize(plan.tensors_size());
  for (int i = 0; i < plan.tensors_size(); ++i) {
    fetched.tensors[i].tensor = plan.tensors(i).tensor();
    fetched.tensors[i].bytes.resize(plan.tensors(i).tensor().byte_size());
  }
}

absl::Status FetchByGrpc(weightstore::v1::WeightStoreService::StubInterface& stub,
                         absl::string_view adapter, int64_t version, const FetchOptions& options,
                         FetchedAdapter& into) {
  weightstore::v1::FetchTensorsRequest request;
  request.set_adapter_name(std::string(adapter));
  request.set_version(version);
  *request.mutable_target() = options.target;
  for (const std::string& name : options.tensor_names) request.add_tensor_names(name);
  grpc::ClientContext context;
  SetTimeout(context, options.timeout);
  auto reader = stub.FetchTensors(&context, request);
  return ReceiveTensors(*reader, context, into,
                        [](const weightstore::v1::FetchTensorsResponse&) {});
}

// Gets a batch: its staged spans into `staging`, its single-block tensors straight into their
// memory, every shard's reads in flight together.
absl::Status GetBatch(const internal::v1::GetReadPlanResponse& plan, const TensorBatch& batch,
                      const absl::flat_hash_map<int, std::vector<StagedSpan>>& spans, char* staging,
                      transfer::UcxPeer& peer, absl::Time deadline, FetchedAdapter& fetched) {
  std::vector<std::vector<transfer::UcxPeer::Transfer>> transfers(plan.shards_size());
  std::vector<transfer::UcxPeer::RegionTransfers> reads;
  for (int r = 0; r < plan.shards_size(); ++r) {
    const internal::v1::ShardRegion& region = plan.shards(r);
    for (const StagedSpan& span : spans.at(region.shard_index())) {
      transfers[r].push_back(
          {region.remote_address() + span.begin, staging + span.staged_at, span.end - span.begin});
    }
    for (int i = batch.first; i < batch.last; ++i) {
      if (!ReadsDirectly(plan.tensors(i))) continue;
      for (const internal::v1::CopyOp& op : plan.tensors(i).ops()) {
        if (op.shard_index() != region.shard_index()) continue;
        transfers[r].push_back({region.remote_address() + op.src_offset(),
                                fetched.tensors[i].bytes.data() + op.dst_offset(),
                                op.count() * op.length()});
      }
    }
    if (!transfers[r].empty()) reads.push_back({region.rkey(), transfers[r]});
  }
  return peer.Get(reads, deadline);
}

}  // namespace

bool IsHeartbeat(const weightstore::v1::FetchTensorsResponse& chunk) {
  return !chunk.has_tensor() && chunk.data().empty();
}

// Memory reserved for a tensor before its chunks arrive: its size, up to this.
constexpr uint64_t kMaxReservedBytes = uint64_t{256} << 20;

absl::Status ReceiveTensors(
    grpc::ClientReaderInterface<weightstore::v1::FetchTensorsResponse>& reader,
    grpc::ClientContext& context, FetchedAdapter& into,
    absl::FunctionRef<void(const weightstore::v1::FetchTensorsResponse&)> on_chunk) {
  into.by_ucx = false;
  into.mapped = false;
  size_t count = 0;  // Tensors received; `into` keeps the memory of any beyond.
  weightstore::v1::FetchTensorsResponse chunk;
  while (reader.Read(&chunk)) {
    on_chunk(chunk);
    if (IsHeartbeat(chunk)) continue;
    if (chunk.has_tensor()) {
      if (count > 0) {
        if (absl::Status status = VerifyChecksum(into.tensors[count - 1]); !status.ok()) {
          context.TryCancel();
          return status;
        }
      }
      if (count == into.tensors.size()) into.tensors.emplace_back();
      FetchedTensor& tensor = into.tensors[count++];
      tensor.tensor = chunk.tensor();
      tensor.bytes.clear();  // Keeps its capacity.
      // A header's size is only a claim (a faulty relay's may be anything) until the bytes come.
      tensor.bytes.reserve(std::min<uint64_t>(chunk.tensor().byte_size(), kMaxReservedBytes));
    }
    if (count == 0 || chunk.offset() != into.tensors[count - 1].bytes.size()) {
      context.TryCancel();
      return absl::InternalError("FetchTensors chunks out of order");
    }
    FetchedTensor& tensor = into.tensors[count - 1];
    if (chunk.data().size() > tensor.tensor.byte_size() - tensor.bytes.size()) {
      context.TryCancel();
      return absl::DataLossError(absl::StrFormat("tensor %s: chunks run past its %d bytes",
                                                 tensor.tensor.spec().name(),
                                                 tensor.tensor.byte_size()));
    }
    tensor.bytes.append(chunk.data());
  }
  into.tensors.resize(count);
  if (absl::Status status = Checked(reader.Finish()); !status.ok()) return status;
  if (count > 0) return VerifyChecksum(into.tensors.back());
  return absl::OkStatus();
}

absl::StatusOr<Upload> BeginUpload(const WeightStoreStubs& store,
                                   const weightstore::v1::Manifest& manifest, bool use_ucx) {
  grpc::ClientContext context;
  SetTimeout(context, kBeginTimeout);
  Upload upload;
  if (use_ucx) {
    internal::v1::BeginUcxPublishRequest begin;
    *begin.mutable_manifest() = manifest;
    if (absl::Status status = Checked(store.ucx().BeginUcxPublish(&context, begin, &upload));
        !status.ok()) {
      return status;
    }
    return upload;
  }
  weightstore::v1::BeginPublishRequest begin;
  *begin.mutable_manifest() = manifest;
  weightstore::v1::BeginPublishResponse begun;
  if (absl::Status status = Checked(store.api().BeginPublish(&context, begin, &begun));
      !status.ok()) {
    return status;
  }
  upload.set_upload_id(begun.upload_id());
  *upload.mutable_expire_time() = begun.expire_time();
  return upload;
}

absl::Status PutShards(const WeightStoreStubs& store,
                       const Upload& begun,
                       const std::vector<absl::string_view>& shards, absl::Span<const int> which,
                       const PublishOptions& options) {
  for (const int i : which) {
    if (i < 0 || i >= static_cast<int>(shards.size())) {
      return InvalidRequest("NO_SUCH_SHARD",
                            absl::StrCat("shard ", i, " to put; there are ", shards.size()));
    }
  }
  return options.ucx != nullptr ? PutByUcx(begun, shards, which, options)
                                : PutByGrpc(store.api(), begun.upload_id(), shards, which, options);
}

absl::StatusOr<weightstore::v1::VersionInfo> CommitUpload(
    const WeightStoreStubs& store, const std::string& upload_id,
    const PublishOptions& options) {
  grpc::ClientContext context;
  SetTimeout(context, options.timeout);
  weightstore::v1::CommitPublishRequest commit;
  commit.set_upload_id(upload_id);
  weightstore::v1::CommitPublishResponse committed;
  if (absl::Status status = Checked(store.api().CommitPublish(&context, commit, &committed));
      !status.ok()) {
    return status;
  }
  return committed.version();
}

void AbortUpload(const WeightStoreStubs& store,
                 const std::string& upload_id) {
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  weightstore::v1::AbortPublishRequest request;
  request.set_upload_id(upload_id);
  weightstore::v1::AbortPublishResponse response;
  store.api().AbortPublish(&context, request, &response);
}

absl::StatusOr<weightstore::v1::Manifest> GetManifest(const WeightStoreStubs& store,
                                                      absl::string_view adapter, int64_t version,
                                                      absl::Duration timeout) {
  weightstore::v1::GetManifestRequest request;
  request.mutable_adapter()->set_adapter_name(std::string(adapter));
  if (version > 0) {
    request.mutable_adapter()->set_exact_version(version);
  } else {
    request.mutable_adapter()->set_latest(true);
  }
  weightstore::v1::GetManifestResponse response;
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  if (absl::Status status = FromGrpcStatus(store.api().GetManifest(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return response.manifest();
}

absl::StatusOr<weightstore::v1::VersionInfo> PublishAdapter(
    const WeightStoreStubs& store, const weightstore::v1::Manifest& manifest,
    const std::vector<absl::string_view>& shards, const PublishOptions& options) {
  if (static_cast<int>(shards.size()) != manifest.shards_size()) {
    return InvalidRequest("SHARD_COUNT_MISMATCH",
                          absl::StrCat(shards.size(), " shard buffers for ",
                                       manifest.shards_size(), " manifest shards"));
  }
  absl::StatusOr<Upload> begun = BeginUpload(store, manifest, options.ucx != nullptr);
  if (!begun.ok()) return begun.status();
  std::vector<int> all(shards.size());
  std::iota(all.begin(), all.end(), 0);
  if (absl::Status sent = PutShards(store, *begun, shards, all, options); !sent.ok()) {
    AbortUpload(store, begun->upload_id());
    return sent;
  }
  absl::StatusOr<weightstore::v1::VersionInfo> committed =
      CommitUpload(store, begun->upload_id(), options);
  if (!committed.ok()) AbortUpload(store, begun->upload_id());
  return committed;
}

// The UCX path: lease the version, get the read plan, pull every op, release the lease.
char* AdapterFetcher::Staging(uint64_t bytes) {
  if (bytes > staging_bytes_) {
    staging_ = std::make_unique_for_overwrite<char[]>(bytes);
    staging_bytes_ = bytes;
  }
  return staging_.get();
}

// Pulls what a read plan needs from the store's memory: by copies where the transport maps it
// into this process (shared memory), else by gets, batch by batch. Tensors of single
// blocks land in their memory directly; the others (sliced layouts: many small strided blocks,
// where a round trip per block would cost far more than the bytes) come in a few large gets per
// shard into staging memory and are copied from there. Copies and checksums of arrived batches
// overlap the gets of later ones.
absl::Status AdapterFetcher::PullPlan(const internal::v1::GetReadPlanResponse& plan,
                                      transfer::UcxPeer& peer, absl::Time deadline,
                                      FetchedAdapter& fetched) {
  absl::StatusOr<RegionsByShard> regions = CheckedRegions(plan);
  if (!regions.ok()) return regions.status();
  ShapeLike(plan, fetched);
  fetched.by_ucx = true;
  absl::StatusOr<MappedShards> mapped = MapShards(plan, peer);
  fetched.mapped = mapped.ok();
  if (mapped.ok()) return CopyMapped(plan, *mapped, deadline, fetched);
  if (!absl::IsUnimplemented(mapped.status())) return mapped.status();
  const std::vector<TensorBatch> batches = BatchesOf(plan);
  // Batches take turns in two staging slots, so staging stays bounded by two batches' spans
  // whatever the adapter's size: a get into a slot waits until the copies out of the batch
  // before last, which used it, are done.
  std::vector<absl::flat_hash_map<int, std::vector<StagedSpan>>> spans(batches.size());
  std::vector<int> staged_tensors(batches.size(), 0);
  uint64_t slot_bytes = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    uint64_t batch_bytes = 0;
    for (const internal::v1::ShardRegion& region : plan.shards()) {
      std::vector<StagedSpan>& shard_spans = spans[b][region.shard_index()] =
          SpansOf(plan, batches[b].first, batches[b].last, region.shard_index());
      for (StagedSpan& span : shard_spans) {
        span.staged_at = batch_bytes;
        batch_bytes += span.end - span.begin;
      }
    }
    for (int i = batches[b].first; i < batches[b].last; ++i) {
      staged_tensors[b] += ReadsDirectly(plan.tensors(i)) ? 0 : 1;
    }
    slot_bytes = std::max(slot_bytes, batch_bytes);
  }
  char* const staging = Staging(2 * slot_bytes);
  // Per batch, its staged tensors not yet copied out of its slot (or dropped after a failure).
  std::vector<std::unique_ptr<SlotCopies>> copies(batches.size());
  ParallelTasks finishing;
  absl::Status pulled;
  std::atomic<bool> corrupt = false;  // A tensor failed its check: no need to read on.
  std::optional<ShardVerifier> verifier;
  if (plan.verify_shards()) {
    verifier.emplace(plan);
    finishing.Add([&plan] { return CheckTiling(plan); });
  }
  const auto verify = [&fetched, &corrupt, &verifier](int i) {
    if (verifier.has_value()) {
      verifier->OfferTensor(i, fetched.tensors[i].bytes.data());
      return absl::OkStatus();
    }
    absl::Status status = VerifyChecksum(fetched.tensors[i]);
    if (!status.ok()) corrupt = true;
    return status;
  };
  for (size_t b = 0; b < batches.size() && pulled.ok() && !corrupt; ++b) {
    const int slot = static_cast<int>(b % 2);
    if (b >= 2 && copies[b - 2] != nullptr) {
      // Helps with the copies (oldest first) rather than idling; once none waits, the rest are
      // the helper's.
      while (!copies[b - 2]->done.HasBeenNotified() && finishing.RunOne()) {
      }
      copies[b - 2]->done.WaitForNotification();
    }
    char* const slot_memory = staging + slot * slot_bytes;
    pulled = GetBatch(plan, batches[b], spans[b], slot_memory, peer, deadline, fetched);
    if (!pulled.ok()) break;
    if (staged_tensors[b] > 0) {
      copies[b] = std::make_unique<SlotCopies>();
      copies[b]->left = staged_tensors[b];
    }
    for (int i = batches[b].first; i < batches[b].last; ++i) {
      if (ReadsDirectly(plan.tensors(i))) {
        finishing.Add([&verify, i] { return verify(i); });
        continue;
      }
      finishing.Add([&, b, i, slot_memory, claim = SlotClaim(copies[b].get())]() mutable {
        Assemble(plan.tensors(i), spans[b], slot_memory, fetched.tensors[i]);
        claim.GiveUp();
        return verify(i);
      });
    }
  }
  const absl::Status finished = finishing.Finish();
  if (!pulled.ok()) return pulled;
  if (!finished.ok() || !verifier.has_value()) return finished;
  return verifier->Finish();
}

absl::Status AdapterFetcher::FetchByUcx(absl::string_view adapter, int64_t version,
                                        const FetchOptions& options, FetchedAdapter& fetched) {
  // The lease must outlast every read of the store's memory: the whole fetch ends by the time
  // the lease does, or the version may be retired and its memory reused under the reads.
  const absl::Duration budget = std::clamp(options.timeout, absl::Seconds(1), absl::Seconds(600));
  const absl::Time deadline = absl::Now() + budget;
  absl::StatusOr<std::string> lease =
      AcquireLease(store_, adapter, version, options.holder, budget);
  if (!lease.ok()) return lease.status();
  const auto release = [&] { ReleaseInBackground(*lease); };
  internal::v1::GetReadPlanRequest plan_request;
  plan_request.set_adapter_name(std::string(adapter));
  plan_request.set_version(version);
  plan_request.set_shard_checksums(true);  // Verified in PullPlan.
  *plan_request.mutable_target() = options.target;
  plan_request.set_lease_id(*lease);
  for (const std::string& name : options.tensor_names) plan_request.add_tensor_names(name);
  internal::v1::GetReadPlanResponse plan;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    if (absl::Status status =
            Checked(store_.ucx().GetReadPlan(&context, plan_request, &plan));
        !status.ok()) {
      release();
      return status;
    }
  }
  return FetchLeased(plan, *lease, deadline, options, fetched);
}

absl::Status AdapterFetcher::FetchLeased(const internal::v1::GetReadPlanResponse& plan,
                                         const std::string& lease_id, absl::Time deadline,
                                         const FetchOptions& options, FetchedAdapter& fetched) {
  absl::StatusOr<transfer::UcxPeer*> peer =
      peers_.PeerFor(*options.ucx, plan.store_worker_address());
  const absl::Status pulled = peer.ok() ? PullPlan(plan, **peer, deadline, fetched) : peer.status();
  if (!pulled.ok()) peers_.Forget();  // A broken endpoint is not reused.
  // Copies out of mapped memory leave nothing in flight.
  if (peer.ok() && !pulled.ok() && !fetched.mapped) SetAsideMemoryOf(fetched);
  ReleaseInBackground(lease_id);
  return pulled;
}

absl::Status AdapterFetcher::FetchAnnounced(absl::string_view adapter,
                                            const internal::v1::WatchReadPlansResponse& announced,
                                            const FetchOptions& options, FetchedAdapter& fetched) {
  const int64_t version = announced.announcement().version().version();
  if (!announced.lease_id().empty() && announced.has_plan() && options.ucx != nullptr) {
    // The reads end with the lease (the store may reuse the version's memory after it) or the
    // caller's timeout, whichever is first.
    const absl::Time deadline =
        std::min(FromTimestamp(announced.lease_expire_time()), absl::Now() + options.timeout);
    if (deadline > absl::Now()) {
      const absl::Status status =
          FetchLeased(announced.plan(), announced.lease_id(), deadline, options, fetched);
      return FallBack(adapter, version, options, status, fetched);
    }
  }
  // No plan, or its lease has ended: lease and plan afresh.
  if (!announced.lease_id().empty()) ReleaseInBackground(announced.lease_id());
  return FetchInto(adapter, version, options, fetched);
}

// Over tcp, replies to gets issued on an endpoint that was then force-closed can still arrive
// and land in the memory they were reading into (see UcxPeer::Get). That memory (the tensors'
// and the staging) is set aside instead of being refilled by the gRPC fallback or the next
// fetch; the last kSetAsideFetches failures' memory is kept, older is freed.
void AdapterFetcher::SetAsideMemoryOf(FetchedAdapter& fetched) {
  set_aside_.push_back({std::move(fetched.tensors), std::move(staging_)});
  fetched.tensors.clear();
  staging_bytes_ = 0;
  if (set_aside_.size() > kSetAsideFetches) set_aside_.pop_front();
}

AdapterFetcher::~AdapterFetcher() {
  absl::MutexLock lock(&releases_->mutex);
  const auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(releases_->mutex) {
    return releases_->count == 0;
  };
  if (!releases_->mutex.AwaitWithTimeout(absl::Condition(&done), kReleaseWaitOnExit)) {
    spdlog::warn(
        "weight-store client: {} lease release(s) still pending; the store will expire "
        "them at their TTL",
        releases_->count);
  }
}

// The fetch is complete once its reads are: the release need not hold up the caller. One that
// fails leaves the lease to expire at its TTL, as a failed synchronous one would. Stubs without
// the callback API (test doubles) release synchronously.
void AdapterFetcher::ReleaseInBackground(const std::string& lease_id) {
  weightstore::v1::WeightStoreService::StubInterface::async_interface* async =
      store_.api().async();
  if (async == nullptr) {
    ReleaseLease(store_, lease_id);
    return;
  }
  struct Call {
    grpc::ClientContext context;
    weightstore::v1::ReleaseLeaseRequest request;
    weightstore::v1::ReleaseLeaseResponse response;
  };
  auto call = std::make_unique<Call>();
  SetTimeout(call->context, kReleaseTimeout);
  call->request.set_lease_id(lease_id);
  {
    absl::MutexLock lock(&releases_->mutex);
    ++releases_->count;
  }
  Call* raw = call.release();  // Owned by the callback from here.
  async->ReleaseLease(&raw->context, &raw->request, &raw->response,
                      [raw, releases = releases_](const grpc::Status&) {
                        delete raw;
                        absl::MutexLock lock(&releases->mutex);
                        --releases->count;
                      });
}

absl::Status AdapterFetcher::FetchInto(absl::string_view adapter, int64_t version,
                                       const FetchOptions& options, FetchedAdapter& fetched) {
  if (options.ucx != nullptr) {
    return FallBack(adapter, version, options, FetchByUcx(adapter, version, options, fetched),
                    fetched);
  }
  return FetchByGrpc(store_.api(), adapter, version, options, fetched);
}

absl::Status AdapterFetcher::FallBack(absl::string_view adapter, int64_t version,
                                      const FetchOptions& options, const absl::Status& status,
                                      FetchedAdapter& fetched) {
  // Only transport trouble falls back; a wrong request would fail the same way over gRPC.
  if (status.ok() || !(absl::IsUnavailable(status) || absl::IsFailedPrecondition(status) ||
                       absl::IsDeadlineExceeded(status))) {
    return status;
  }
  spdlog::warn("weight-store client: UCX fetch of {}@{} failed ({}); using gRPC", adapter, version,
               status);
  return FetchByGrpc(store_.api(), adapter, version, options, fetched);
}

absl::StatusOr<FetchedAdapter> AdapterFetcher::Fetch(absl::string_view adapter, int64_t version,
                                                     const FetchOptions& options) {
  FetchedAdapter fetched;
  if (absl::Status status = FetchInto(adapter, version, options, fetched); !status.ok()) {
    return status;
  }
  return fetched;
}

absl::StatusOr<std::string> AcquireLease(const WeightStoreStubs& store,
                                         absl::string_view adapter, int64_t version,
                                         absl::string_view holder, absl::Duration ttl) {
  weightstore::v1::AcquireLeaseRequest request;
  request.set_adapter_name(std::string(adapter));
  request.set_version(version);
  request.set_holder(std::string(holder));
  *request.mutable_ttl() = ToDuration(std::clamp(ttl, absl::Seconds(1), absl::Seconds(600)));
  weightstore::v1::AcquireLeaseResponse response;
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(30));
  if (absl::Status status = Checked(store.api().AcquireLease(&context, request, &response));
      !status.ok()) {
    return status;
  }
  return response.lease_id();
}

void ReleaseLease(const WeightStoreStubs& store,
                  const std::string& lease_id) {
  weightstore::v1::ReleaseLeaseRequest request;
  request.set_lease_id(lease_id);
  weightstore::v1::ReleaseLeaseResponse response;
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  store.api().ReleaseLease(&context, request, &response);
}

absl::StatusOr<FetchedAdapter> FetchAdapter(
    const WeightStoreStubs& store, absl::string_view adapter,
    int64_t version, const FetchOptions& options) {
  return AdapterFetcher(store).Fetch(adapter, version, options);
}

}  // namespace tandem::weight_store
