#include "services/trainer/service_endpoints.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::trainer {
namespace {

constexpr int kMaxRolloutReplicas = 256;

struct NameAndPort {
  std::string name;
  std::string port;
};

absl::StatusOr<NameAndPort> SplitServiceName(absl::string_view name_port) {
  const size_t colon = name_port.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", name_port, "' has no port (name:port)"));
  }
  NameAndPort split{std::string(name_port.substr(0, colon)),
                    std::string(name_port.substr(colon + 1))};
  int port = 0;
  if (split.name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", name_port, "' has no name (name:port)"));
  }
  if (!absl::SimpleAtoi(split.port, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name_port, "' has no port in 1..65535 (name:port)"));
  }
  return split;
}

// "a.b.c.d:port" or "[v6]:port" of one resolved address.
std::string AddressWithPort(const addrinfo& info, const std::string& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (info.ai_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(info.ai_addr)->sin6_addr, text,
              sizeof(text));
    return absl::StrCat("[", text, "]:", port);
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(info.ai_addr)->sin_addr, text,
            sizeof(text));
  return absl::StrCat(text, ":", port);
}

// Every address `name_port` resolves to now, as "address:port", sorted and without repeats.
absl::StatusOr<std::vector<std::string>> ResolveAll(absl::string_view name_port) {
  auto split = SplitServiceName(name_port);
  if (!split.ok()) return split.status();
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(split->name.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::UnavailableError(absl::StrCat("endpoints.rollout_service ", name_port,
                                               ": no replica address (", gai_strerror(error), ")"));
  }
  std::set<std::string> addresses;
  for (const addrinfo* info = found; info != nullptr; info = info->ai_next) {
    if (info->ai_family == AF_INET || info->ai_family == AF_INET6) {
      addresses.insert(AddressWithPort(*info, split->port));
    }
  }
  freeaddrinfo(found);
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

}  // namespace

void ApplyDefaultEndpoints(const trainer::v1::ServiceEndpoints& defaults, trainer::v1::ServiceEndpoints& endpoints) {
  if (endpoints.rollout().empty() && endpoints.rollout_service().empty()) {
    *endpoints.mutable_rollout() = defaults.rollout();
    endpoints.set_rollout_service(defaults.rollout_service());
  }
  if (endpoints.weight_store().empty()) endpoints.set_weight_store(defaults.weight_store());
  if (endpoints.router_replay().empty()) endpoints.set_router_replay(defaults.router_replay());
}

absl::Status CheckServiceName(absl::string_view name_port) {
  return SplitServiceName(name_port).status();
}

absl::StatusOr<std::vector<std::string>> RolloutReplicas(const trainer::v1::ServiceEndpoints& endpoints) {
  if (endpoints.rollout_service().empty()) {
    return std::vector<std::string>(endpoints.rollout().begin(), endpoints.rollout().end());
  }
  auto replicas = ResolveAll(endpoints.rollout_service());
  if (!replicas.ok()) return replicas.status();
  if (replicas->empty()) {
    return absl::UnavailableError(absl::StrCat(
        "endpoints.rollout_service ", endpoints.rollout_service(), ": no replica address"));
  }
  if (replicas->size() > kMaxRolloutReplicas) {
    return absl::FailedPreconditionError(
        absl::StrCat("endpoints.rollout_service ", endpoints.rollout_service(), " resolves to ",
                     replicas->size(), " addresses; at most ", kMaxRolloutReplicas, " replicas"));
  }
  return replicas;
}

}  // namespace tandem::trainer
