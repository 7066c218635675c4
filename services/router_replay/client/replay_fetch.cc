#include "services/router_replay/client/replay_fetch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status.h"
#include "services/router_replay/client/route_wire.h"

namespace tandem::router_replay {
namespace {

routerreplay::v1::FetchRoutesRequest BuildRequest(absl::Span<const ReplaySequence> sequences,
                                                  const ReplayFetchOptions& options) {
  routerreplay::v1::FetchRoutesRequest request;
  for (const ReplaySequence& sequence : sequences) {
    routerreplay::v1::RecordRequest& record = *request.mutable_records()->add_records();
    *record.mutable_key() = ToProto(sequence.key);
    routerreplay::v1::RowRange& range = *record.add_row_ranges();
    range.set_begin(0);
    range.set_end(sequence.num_tokens - 1);
  }
  request.mutable_layers()->Add(options.moe_layers.begin(), options.moe_layers.end());
  request.set_allow_partial(options.allow_partial);
  return request;
}

absl::Status CheckMessage(const routerreplay::v1::FetchRoutesResponse& message,
                          const ReplaySequence& sequence, const ReplayFetchOptions& options) {
  const std::string key = ToString(sequence.key);
  if (FromProto(message.key()) != sequence.key) {
    return absl::InternalError(absl::StrCat("router-replay answered record ",
                                            ToString(FromProto(message.key())), " for ", key));
  }
  if (message.status() == routerreplay::v1::RECORD_STATUS_MISSING) return absl::OkStatus();
  if (message.top_k() != options.top_k || message.num_experts() != options.num_experts) {
    return absl::FailedPreconditionError(absl::StrCat(
        "record ", key, " has top_k ", message.top_k(), " of ", message.num_experts(),
        " experts; the model routes top_k ", options.top_k, " of ", options.num_experts));
  }
  const int64_t expected_bytes =
      message.num_rows() * static_cast<int64_t>(options.moe_layers.size()) * options.top_k * 2;
  if (static_cast<int64_t>(message.rows().size()) != expected_bytes ||
      message.row_offset() + message.num_rows() > sequence.num_tokens - 1) {
    return absl::InternalError(absl::StrCat("malformed FetchRoutes message for record ", key));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReplayRoutes> FetchReplayRoutes(
    routerreplay::v1::RouterReplayService::StubInterface& stub,
    absl::Span<const ReplaySequence> sequences, const ReplayFetchOptions& options) {
  std::vector<int64_t> starts;
  int64_t total_tokens = 0;
  for (const ReplaySequence& sequence : sequences) {
    if (sequence.num_tokens < 2) {
      return InvalidRequest("SEQUENCE_TOO_SHORT",
                            absl::StrCat("sequence of record ", ToString(sequence.key), " has ",
                                         sequence.num_tokens, " tokens; routes need at least 2"));
    }
    starts.push_back(total_tokens);
    total_tokens += sequence.num_tokens;
  }
  const int64_t ids_per_row = static_cast<int64_t>(options.moe_layers.size()) * options.top_k;
  ReplayRoutes result;
  result.routes.assign(total_tokens * ids_per_row, int16_t{-1});
  result.statuses.assign(sequences.size(), routerreplay::v1::RECORD_STATUS_UNSPECIFIED);
  if (sequences.empty()) return result;
  if (options.moe_layers.empty() || options.top_k < 1) {
    return InvalidRequest("MODEL_SHAPE_MISSING",
                          "replay fetch needs the model's MoE layers and top_k");
  }

  grpc::ClientContext context;
  SetTimeout(context, options.timeout);
  std::unique_ptr<grpc::ClientReaderInterface<routerreplay::v1::FetchRoutesResponse>> reader =
      stub.FetchRoutes(&context, BuildRequest(sequences, options));
  // Records come back in request order, the messages of one record consecutive, each record's
  // first message at row offset 0.
  size_t index = 0;
  routerreplay::v1::FetchRoutesResponse message;
  while (reader->Read(&message)) {
    if (result.statuses[index] != routerreplay::v1::RECORD_STATUS_UNSPECIFIED &&
        message.row_offset() == 0) {
      ++index;
    }
    if (index >= sequences.size()) {
      context.TryCancel();
      return absl::InternalError("router-replay sent more records than requested");
    }
    if (absl::Status status = CheckMessage(message, sequences[index], options); !status.ok()) {
      context.TryCancel();
      return status;
    }
    result.statuses[index] = message.status();
    if (message.status() == routerreplay::v1::RECORD_STATUS_MISSING) {
      // After messages with some of its rows when the record was deleted mid-fetch: a missing
      // record has none, so the engine routes all of it live.
      std::fill_n(result.routes.begin() + starts[index] * ids_per_row,
                  sequences[index].num_tokens * ids_per_row, int16_t{-1});
      continue;
    }
    std::memcpy(result.routes.data() + (starts[index] + message.row_offset()) * ids_per_row,
                message.rows().data(), message.rows().size());
  }
  if (absl::Status status = FromGrpcStatus(reader->Finish()); !status.ok()) return status;
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (result.statuses[s] == routerreplay::v1::RECORD_STATUS_UNSPECIFIED) {
      return absl::InternalError(
          absl::StrCat("router-replay sent nothing for record ", ToString(sequences[s].key)));
    }
  }
  const int64_t layers = static_cast<int64_t>(options.moe_layers.size());
  for (int64_t entry = 0; entry < total_tokens * layers; ++entry) {
    result.missing_entries += result.routes[entry * options.top_k] == -1;
  }
  result.missing_entries -= static_cast<int64_t>(sequences.size()) * layers;  // Last tokens.
  return result;
}

}  // namespace tandem::router_replay
