#include "services/router_replay/route_queries.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "placement/eplb.h"

namespace tandem::router_replay {
namespace {

constexpr int kMaxNamedRecords = 100000;
constexpr int kMaxGroups = 4096;
constexpr int64_t kMinChunkBytes = int64_t{64} << 10;
constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;
constexpr int32_t kMaxDataParallelSize = 65536;
// Rows one RecordRequest may ask for in all: a bound on the -1 rows a range past an unsealed
// record's end streams, and on the sums below.
constexpr int64_t kMaxRequestedRows = int64_t{1} << 31;
// What a FetchRoutes message holds besides its rows (key, layer indices, counts), so that rows
// filling max_chunk_bytes less this keep the message within a client's default receive limit.
constexpr int64_t kChunkMetadataBytes = int64_t{16} << 10;
// Counts a GetExpertLoad response may hold (groups x layers x num_experts).
constexpr int64_t kMaxLoadCounts = int64_t{1} << 20;

absl::Status CheckDataParallel(int32_t rank, int32_t size) {
  if (size < 0 || size > kMaxDataParallelSize || rank < 0 || rank >= std::max(size, 1)) {
    const bool bad_size = size < 0 || size > kMaxDataParallelSize;
    return InvalidField(bad_size ? "dp_size" : "dp_rank",
                        absl::StrCat("bad dp_rank/dp_size ", rank, "/", size,
                                     "; need 0 <= dp_rank < dp_size <= ", kMaxDataParallelSize));
  }
  return absl::OkStatus();
}

// Positions of `layers` in the record's MoE layers; all of them when `layers` is empty.
// `path` is where the request names `layers` ("layers"), empty when they are the first record's
// (then a record without one of them is not the request's fault alone).
absl::StatusOr<std::vector<int>> LayerPositions(const RecordInfo& record,
                                                absl::Span<const int32_t> layers,
                                                absl::string_view path) {
  std::vector<int> positions;
  const std::vector<int32_t>& stored = record.shape.layers;
  if (layers.empty()) {
    for (size_t i = 0; i < stored.size(); ++i) positions.push_back(static_cast<int>(i));
    return positions;
  }
  std::vector<bool> named(stored.size(), false);
  for (size_t i = 0; i < layers.size(); ++i) {
    const int32_t layer = layers[i];
    const auto it = std::lower_bound(stored.begin(), stored.end(), layer);
    if (it == stored.end() || *it != layer) {
      const std::string message =
          absl::StrCat("layer ", layer, " is not a MoE layer of record ", ToString(record.key));
      if (path.empty()) return InvalidRequest("RECORD_LAYERS_DIFFER", message);
      return InvalidField(IndexPath(path, static_cast<int64_t>(i)), message);
    }
    const int position = static_cast<int>(it - stored.begin());
    if (named[position]) {
      const std::string message = absl::StrCat("layers: layer ", layer, " named twice");
      if (path.empty()) return InvalidRequest("RECORD_LAYERS_DIFFER", message);
      return InvalidField(IndexPath(path, static_cast<int64_t>(i)), message);
    }
    named[position] = true;
    positions.push_back(position);
  }
  return positions;
}

// Checked before the record is looked up, so a missing record's ranges are checked too. `path`
// is the RecordRequest's ("records.records[3]").
absl::Status ValidateRowRanges(const routerreplay::v1::RecordRequest& requested,
                               const RecordKey& key, absl::string_view path) {
  const std::string ranges_path = FieldPath(path, "row_ranges");
  int64_t rows = 0;
  for (int i = 0; i < requested.row_ranges_size(); ++i) {
    const routerreplay::v1::RowRange& range = requested.row_ranges(i);
    if (range.begin() < 0 || range.end() <= range.begin()) {
      return InvalidField(FieldPath(IndexPath(ranges_path, i), range.begin() < 0 ? "begin" : "end"),
                          absl::StrCat("record ", ToString(key), ": bad row range [", range.begin(),
                                       ", ", range.end(), ")"));
    }
    // Both terms are at most kMaxRequestedRows here, so the sum cannot overflow.
    rows += std::min(range.end() - range.begin(), kMaxRequestedRows + 1);
    if (rows > kMaxRequestedRows) {
      return InvalidField(ranges_path, absl::StrCat("record ", ToString(key),
                                                    ": row ranges ask for more than 2^31 rows"));
    }
  }
  return absl::OkStatus();
}

// Requested row spans of a named record; its status becomes PARTIAL if rows are not all there.
absl::Status ResolveSpans(const routerreplay::v1::RecordRequest& requested, FetchItem& item,
                          absl::string_view path) {
  const RecordInfo& record = *item.record;
  if (requested.row_ranges().empty()) {
    item.spans.push_back({0, record.rows});
  }
  for (int i = 0; i < requested.row_ranges_size(); ++i) {
    const routerreplay::v1::RowRange& range = requested.row_ranges(i);
    if (record.sealed && range.end() > record.rows) {
      return InvalidField(
          FieldPath(IndexPath(FieldPath(path, "row_ranges"), i), "end"),
          absl::StrCat("record ", ToString(item.key), ": row range [", range.begin(), ", ",
                       range.end(), ") past its end (sealed at ", record.rows, " rows)"));
    }
    item.spans.push_back({range.begin(), range.end()});
  }
  for (const RowSpan& span : item.spans) {
    item.requested_rows += span.end - span.begin;
    if (span.end > record.rows) item.status = routerreplay::v1::RECORD_STATUS_PARTIAL;
  }
  return absl::OkStatus();
}

// `path` is the RecordRequest's ("records.records[3]").
absl::StatusOr<FetchItem> ResolveNamed(const RouteStore& store,
                                       const routerreplay::v1::RecordRequest& requested,
                                       bool allow_partial, absl::string_view path) {
  FetchItem item;
  item.key = FromProto(requested.key());
  if (absl::Status status = ValidateRecordKey(item.key, FieldPath(path, "key")); !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateRowRanges(requested, item.key, path); !status.ok()) {
    return status;
  }
  absl::StatusOr<RecordInfo> record = store.Get(item.key);
  if (absl::IsNotFound(record.status()) && allow_partial) {
    item.status = routerreplay::v1::RECORD_STATUS_MISSING;
    return item;
  }
  if (!record.ok()) return record.status();
  if (!record->sealed && !allow_partial) {
    return absl::FailedPreconditionError(
        absl::StrCat("record ", ToString(item.key), " not sealed (", record->rows, " rows)"));
  }
  item.record = *std::move(record);
  item.status = item.record->sealed ? routerreplay::v1::RECORD_STATUS_COMPLETE
                                    : routerreplay::v1::RECORD_STATUS_PARTIAL;
  if (absl::Status status = ResolveSpans(requested, item, path); !status.ok()) return status;
  return item;
}

// A job's records in a version range: sealed ones (or all with include_unsealed), and only the
// highest attempt of each sample unless all_attempts. `path` is where the request holds the
// JobRecords' fields: "job", or "" where job_id and versions are the request's own.
absl::StatusOr<std::vector<RecordInfo>> SelectJobRecords(const RouteStore& store,
                                                         const routerreplay::v1::JobRecords& job,
                                                         bool include_unsealed,
                                                         absl::string_view path) {
  if (absl::Status status = ValidateJobId(job.job_id(), FieldPath(path, "job_id")); !status.ok()) {
    return status;
  }
  absl::StatusOr<RowSpan> versions = VersionSpan(job.versions(), FieldPath(path, "versions"));
  if (!versions.ok()) return versions.status();
  absl::StatusOr<std::vector<RecordInfo>> listed =
      store.ListJob(job.job_id(), versions->begin, versions->end);
  if (!listed.ok()) return listed.status();
  std::vector<RecordInfo> selected;
  for (RecordInfo& record : *listed) {
    // Listing is ordered by (version, sample, attempt): a later attempt replaces the one before,
    // so an abandoned attempt is never read, even when the newest one is not sealed yet.
    if (!job.all_attempts() && !selected.empty() &&
        selected.back().key.policy_version == record.key.policy_version &&
        selected.back().key.sample_id == record.key.sample_id) {
      selected.back() = std::move(record);
      continue;
    }
    selected.push_back(std::move(record));
  }
  if (!include_unsealed) {
    std::erase_if(selected, [](const RecordInfo& record) { return !record.sealed; });
  }
  return selected;
}

absl::StatusOr<std::vector<FetchItem>> ResolveSelection(
    const RouteStore& store, const routerreplay::v1::FetchRoutesRequest& request) {
  std::vector<FetchItem> items;
  if (request.has_records()) {
    const int count = request.records().records_size();
    if (count < 1 || count > kMaxNamedRecords) {
      return InvalidField(
          "records.records",
          absl::StrCat("records names ", count, " records; allowed 1..", kMaxNamedRecords));
    }
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<FetchItem> item =
          ResolveNamed(store, request.records().records(i), request.allow_partial(),
                       IndexPath("records.records", i));
      if (!item.ok()) return item.status();
      items.push_back(*std::move(item));
    }
    return items;
  }
  absl::StatusOr<std::vector<RecordInfo>> records =
      SelectJobRecords(store, request.job(), request.allow_partial(), "job");
  if (!records.ok()) return records.status();
  for (RecordInfo& record : *records) {
    FetchItem item{.key = record.key, .record = std::move(record)};
    item.status = item.record->sealed ? routerreplay::v1::RECORD_STATUS_COMPLETE
                                      : routerreplay::v1::RECORD_STATUS_PARTIAL;
    item.spans.push_back({0, item.record->rows});
    item.requested_rows = item.record->rows;
    items.push_back(std::move(item));
  }
  return items;
}

// Adds one record's expert choices in the given layer positions to `load`, reading a bounded
// number of rows at a time.
absl::Status CountRecord(const RouteStore& store, const RecordInfo& record,
                         const std::vector<int>& positions, routerreplay::v1::ExpertLoad& load) {
  constexpr int64_t kRowsPerRead = 4096;
  const int64_t k = record.shape.top_k;
  const int64_t ids_per_row = record.shape.ids_per_row();
  const int64_t experts = record.shape.num_experts;
  std::vector<int16_t> rows;
  for (int64_t begin = 0; begin < record.rows; begin += kRowsPerRead) {
    const int64_t end = std::min(record.rows, begin + kRowsPerRead);
    rows.resize((end - begin) * ids_per_row);
    if (absl::Status status = store.ReadRows(record, begin, end, rows.data()); !status.ok()) {
      return status;
    }
    for (int64_t r = 0; r < end - begin; ++r) {
      for (size_t l = 0; l < positions.size(); ++l) {
        const int16_t* ids = rows.data() + r * ids_per_row + positions[l] * k;
        if (ids[0] < 0) {
          load.set_missing(load.missing() + 1);
          continue;
        }
        int64_t* counts = load.mutable_counts()->mutable_data() + l * experts;
        for (int64_t s = 0; s < k; ++s) ++counts[ids[s]];
      }
    }
  }
  load.set_rows(load.rows() + record.rows);
  return absl::OkStatus();
}

// The records each load group counts: the named keys, or one group of the job's records, whose
// job_id and versions the caller's request holds at `job_path` (see SelectJobRecords).
absl::StatusOr<std::vector<std::vector<RecordInfo>>> LoadGroups(
    const RouteStore& store, const routerreplay::v1::GetExpertLoadRequest& request,
    bool all_attempts, absl::string_view job_path) {
  std::vector<std::vector<RecordInfo>> groups;
  if (request.groups().empty()) {
    routerreplay::v1::JobRecords job;
    job.set_job_id(request.job_id());
    *job.mutable_versions() = request.versions();
    job.set_all_attempts(all_attempts);
    absl::StatusOr<std::vector<RecordInfo>> records =
        SelectJobRecords(store, job, /*include_unsealed=*/true, job_path);
    if (!records.ok()) return records.status();
    groups.push_back(*std::move(records));
    return groups;
  }
  if (request.groups_size() > kMaxGroups) {
    return InvalidField("groups", absl::StrCat("groups has ", request.groups_size(),
                                               " entries; allowed 1..", kMaxGroups));
  }
  for (int g = 0; g < request.groups_size(); ++g) {
    const routerreplay::v1::KeyGroup& group = request.groups(g);
    const std::string keys_path = FieldPath(IndexPath("groups", g), "keys");
    if (group.keys().empty() || group.keys_size() > kMaxNamedRecords) {
      return InvalidField(keys_path, absl::StrCat("a group has ", group.keys_size(),
                                                  " keys; allowed 1..", kMaxNamedRecords));
    }
    std::vector<RecordInfo>& records = groups.emplace_back();
    for (int k = 0; k < group.keys_size(); ++k) {
      const RecordKey key = FromProto(group.keys(k));
      if (absl::Status status = ValidateRecordKey(key, IndexPath(keys_path, k)); !status.ok()) {
        return status;
      }
      absl::StatusOr<RecordInfo> record = store.Get(key);
      if (!record.ok()) return record.status();
      records.push_back(*std::move(record));
    }
  }
  return groups;
}

}  // namespace

absl::StatusOr<RowSpan> VersionSpan(const routerreplay::v1::VersionRange& versions,
                                    absl::string_view path) {
  if (versions.begin() < 0 || versions.end() < 0 ||
      (versions.end() != 0 && versions.end() <= versions.begin())) {
    return InvalidField(FieldPath(path, versions.begin() < 0 ? "begin" : "end"),
                        absl::StrCat("bad version range [", versions.begin(), ", ", versions.end(),
                                     "); need begin >= 0 and end 0 or > begin"));
  }
  return RowSpan{versions.begin(), versions.end()};
}

absl::StatusOr<FetchPlan> PlanFetch(const RouteStore& store,
                                    const routerreplay::v1::FetchRoutesRequest& request) {
  if (!request.has_records() && !request.has_job()) {
    // The oneof is required; its name stands for whichever of its fields the client meant.
    return InvalidField("selection", "FetchRoutes needs a selection: records or job");
  }
  if (absl::Status status = CheckDataParallel(request.dp_rank(), request.dp_size()); !status.ok()) {
    return status;
  }
  FetchPlan plan;
  plan.allow_partial = request.allow_partial();
  plan.max_chunk_bytes =
      request.max_chunk_bytes() == 0 ? kMaxChunkBytes : request.max_chunk_bytes();
  if (plan.max_chunk_bytes < kMinChunkBytes || plan.max_chunk_bytes > kMaxChunkBytes) {
    return InvalidField("max_chunk_bytes", absl::StrCat("max_chunk_bytes is ", plan.max_chunk_bytes,
                                                        "; allowed 65536..4194304"));
  }
  absl::StatusOr<std::vector<FetchItem>> items = ResolveSelection(store, request);
  if (!items.ok()) return items.status();
  for (FetchItem& item : *items) {
    if (DataParallelRank(item.key.sample_id, request.dp_size()) != request.dp_rank()) continue;
    if (item.record.has_value()) {
      absl::StatusOr<std::vector<int>> positions = LayerPositions(
          *item.record, absl::MakeConstSpan(request.layers().data(), request.layers_size()),
          "layers");
      if (!positions.ok()) return positions.status();
      item.layer_positions = *std::move(positions);
    }
    plan.items.push_back(std::move(item));
  }
  return plan;
}

absl::StatusOr<std::optional<routerreplay::v1::FetchRoutesResponse>> FetchCursor::Next() {
  if (item_ >= plan_.items.size()) return std::nullopt;
  const FetchItem& item = plan_.items[item_];
  routerreplay::v1::FetchRoutesResponse response;
  *response.mutable_key() = ToProto(item.key);
  response.set_status(item.status);
  response.set_requested_rows(item.requested_rows);
  response.set_row_offset(row_);
  if (item.record.has_value()) {
    const RecordInfo& record = *item.record;
    for (int position : item.layer_positions)
      response.add_layer_indices(record.shape.layers[position]);
    response.set_top_k(record.shape.top_k);
    response.set_num_experts(record.shape.num_experts);
    response.set_stored_rows(record.rows);
    const int64_t row_bytes =
        static_cast<int64_t>(item.layer_positions.size()) * record.shape.top_k * sizeof(int16_t);
    const int64_t count =
        std::min(item.requested_rows - row_,
                 std::max<int64_t>(1, (plan_.max_chunk_bytes - kChunkMetadataBytes) / row_bytes));
    const absl::Status filled = FillRows(item, row_, count, response);
    if (absl::IsNotFound(filled) && plan_.allow_partial) return EndDeleted();
    if (!filled.ok()) return filled;
    row_ += count;
  }
  if (row_ >= item.requested_rows) {
    ++item_;
    row_ = 0;
  }
  return response;
}

// Rows of earlier messages were real, but the record is gone now: the reader drops them and
// treats the record as never stored, as for any MISSING one.
routerreplay::v1::FetchRoutesResponse FetchCursor::EndDeleted() {
  routerreplay::v1::FetchRoutesResponse response;
  *response.mutable_key() = ToProto(plan_.items[item_].key);
  response.set_status(routerreplay::v1::RECORD_STATUS_MISSING);
  response.set_row_offset(row_);
  ++item_;
  row_ = 0;
  return response;
}

absl::Status FetchCursor::FillRows(const FetchItem& item, int64_t first, int64_t count,
                                   routerreplay::v1::FetchRoutesResponse& response) {
  const RecordInfo& record = *item.record;
  const int64_t k = record.shape.top_k;
  const int64_t ids_per_row = record.shape.ids_per_row();
  const int64_t out_ids_per_row = static_cast<int64_t>(item.layer_positions.size()) * k;
  std::string& bytes = *response.mutable_rows();
  bytes.resize(count * out_ids_per_row * sizeof(int16_t));
  auto* out = reinterpret_cast<int16_t*>(bytes.data());
  response.set_num_rows(count);
  // Walk the spans that cover requested rows [first, first + count).
  int64_t span_start = 0;  // Requested-row index where the current span begins.
  for (const RowSpan& span : item.spans) {
    const int64_t span_rows = span.end - span.begin;
    const int64_t from = std::max(first, span_start);
    const int64_t to = std::min(first + count, span_start + span_rows);
    if (to > from) {
      const int64_t source_begin = span.begin + (from - span_start);
      record_rows_.resize((to - from) * ids_per_row);
      if (absl::Status status = store_.ReadRows(record, source_begin, source_begin + (to - from),
                                                record_rows_.data());
          !status.ok()) {
        return status;
      }
      for (int64_t r = 0; r < to - from; ++r) {
        int16_t* row_out = out + (from - first + r) * out_ids_per_row;
        for (size_t l = 0; l < item.layer_positions.size(); ++l) {
          std::memcpy(row_out + l * k,
                      record_rows_.data() + r * ids_per_row + item.layer_positions[l] * k,
                      k * sizeof(int16_t));
        }
      }
    }
    span_start += span_rows;
  }
  return absl::OkStatus();
}

namespace {

// GetExpertLoad, counting every attempt of a job's samples when `all_attempts`
// (placement::PlanPlacement from JobRecords); GetExpertLoad itself counts the highest attempt only.
// `job_path` is where the caller's request holds job_id and versions (see SelectJobRecords).
absl::StatusOr<routerreplay::v1::GetExpertLoadResponse> CountLoad(
    const RouteStore& store, const routerreplay::v1::GetExpertLoadRequest& request,
    bool all_attempts, absl::string_view job_path) {
  absl::StatusOr<std::vector<std::vector<RecordInfo>>> groups =
      LoadGroups(store, request, all_attempts, job_path);
  if (!groups.ok()) return groups.status();
  routerreplay::v1::GetExpertLoadResponse response;
  const RecordInfo* first = nullptr;
  for (const auto& group : *groups) {
    if (first == nullptr && !group.empty()) first = &group.front();
  }
  if (first != nullptr) {
    if (request.layers().empty()) {
      response.mutable_layer_indices()->Add(first->shape.layers.begin(), first->shape.layers.end());
    } else {
      *response.mutable_layer_indices() = request.layers();
    }
    response.set_num_experts(first->shape.num_experts);
  }
  const absl::Span<const int32_t> layers(response.layer_indices().data(),
                                         response.layer_indices_size());
  // In int64: layers x experts x groups overflows int for hostile but valid-looking requests.
  const int64_t counts = static_cast<int64_t>(layers.size()) * response.num_experts() *
                         static_cast<int64_t>(groups->size());
  if (counts > kMaxLoadCounts) {
    return InvalidRequest(
        "RESPONSE_TOO_LARGE",
        absl::StrCat("the response would hold ", counts, " counts (", groups->size(), " groups x ",
                     layers.size(), " layers x ", response.num_experts(),
                     " experts); at most 2^20: ask for fewer layers or groups"));
  }
  for (const auto& group : *groups) {
    routerreplay::v1::ExpertLoad& load = *response.add_loads();
    load.mutable_counts()->Resize(static_cast<int>(layers.size()) * response.num_experts(), 0);
    for (const RecordInfo& record : group) {
      if (record.shape.num_experts != response.num_experts()) {
        return absl::FailedPreconditionError(
            absl::StrCat("record ", ToString(record.key), " has ", record.shape.num_experts,
                         " experts, others ", response.num_experts(), "; count them separately"));
      }
      absl::StatusOr<std::vector<int>> positions =
          LayerPositions(record, layers, request.layers().empty() ? "" : "layers");
      if (!positions.ok()) return positions.status();
      if (absl::Status status = CountRecord(store, record, *positions, load); !status.ok()) {
        return status;
      }
    }
  }
  return response;
}

}  // namespace

absl::StatusOr<routerreplay::v1::GetExpertLoadResponse> CountExpertLoad(
    const RouteStore& store, const routerreplay::v1::GetExpertLoadRequest& request) {
  return CountLoad(store, request, /*all_attempts=*/false, /*job_path=*/"");
}

absl::StatusOr<routerreplay::v1::PlanPlacementResponse> PlanExpertPlacement(
    const RouteStore& store, const routerreplay::v1::PlanPlacementRequest& request) {
  placement::PlacementRequest placement{.num_replicas = request.num_replicas(),
                                        .num_groups = request.num_groups(),
                                        .num_nodes = request.num_nodes(),
                                        .num_gpus = request.num_gpus()};
  routerreplay::v1::PlanPlacementResponse response;
  if (request.has_load()) {
    placement.num_layers = request.load().num_layers();
    placement.num_experts = request.load().num_experts();
    placement.load.assign(request.load().load().begin(), request.load().load().end());
  } else if (request.has_job()) {
    routerreplay::v1::GetExpertLoadRequest load_request;
    load_request.set_job_id(request.job().job_id());
    *load_request.mutable_versions() = request.job().versions();
    absl::StatusOr<routerreplay::v1::GetExpertLoadResponse> load =
        CountLoad(store, load_request, request.job().all_attempts(), /*job_path=*/"job");
    if (!load.ok()) return load.status();
    if (load->layer_indices().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", request.job().job_id(), " has no records to plan from"));
    }
    *response.mutable_layer_indices() = load->layer_indices();
    placement.num_layers = load->layer_indices_size();
    placement.num_experts = load->num_experts();
    placement.load.assign(load->loads(0).counts().begin(), load->loads(0).counts().end());
  } else {
    // The oneof is required; its name stands for whichever of its fields the client meant.
    return InvalidField("source", "placement::PlanPlacement needs a source: load or job");
  }
  absl::StatusOr<placement::PlacementPlan> plan = placement::PlanPlacement(placement);
  if (!plan.ok()) return plan.status();
  response.set_num_layers(plan->num_layers);
  response.set_num_experts(plan->num_experts);
  response.set_num_replicas(plan->num_replicas);
  response.set_max_replicas(plan->max_replicas);
  response.mutable_phy2log()->Add(plan->phy2log.begin(), plan->phy2log.end());
  response.mutable_log2phy()->Add(plan->log2phy.begin(), plan->log2phy.end());
  response.mutable_logcnt()->Add(plan->logcnt.begin(), plan->logcnt.end());
  response.mutable_balancedness_before()->Add(plan->balancedness_before.begin(),
                                              plan->balancedness_before.end());
  response.mutable_balancedness_after()->Add(plan->balancedness_after.begin(),
                                             plan->balancedness_after.end());
  response.mutable_gpu_loads()->Add(plan->gpu_loads.begin(), plan->gpu_loads.end());
  return response;
}

}  // namespace tandem::router_replay
