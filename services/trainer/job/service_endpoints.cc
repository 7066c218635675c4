#include "services/trainer/job/service_endpoints.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::trainer {
namespace {

constexpr size_t kMaxRolloutReplicas = 256;

struct NameAndPort {
  std::string name;
  std::string port;
};

absl::StatusOr<NameAndPort> SplitServiceName(absl::string_view name_port) {
  const size_t colon = name_port.rfind(':');
  if (colon == absl::string_view::npos) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("'", name_port, "' has no port (name:port)"));
  }
  NameAndPort split{std::string(name_port.substr(0, colon)),
                    std::string(name_port.substr(colon + 1))};
  int port = 0;
  if (split.name.empty()) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("'", name_port, "' has no name (name:port)"));
  }
  if (!absl::SimpleAtoi(split.port, &port) || port < 1 || port > 65535) {
    return InvalidRequest("INVALID_FLAG",
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
    return absl::UnavailableError(absl::StrCat("--rollout_service ", name_port,
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

absl::Status CheckServiceEndpoints(const ServiceEndpoints& endpoints) {
  if (!endpoints.rollout_service.empty()) {
    if (!endpoints.rollout.empty()) {
      return InvalidRequest("INVALID_FLAG",
                            "--rollout and --rollout_service are exclusive; set one");
    }
    if (absl::Status status = CheckServiceName(endpoints.rollout_service); !status.ok()) {
      return Annotate(status, "--rollout_service: ");
    }
  } else if (endpoints.rollout.empty() || endpoints.rollout.size() > kMaxRolloutReplicas) {
    return InvalidRequest("INVALID_FLAG",
                          absl::StrCat("--rollout: 1..", kMaxRolloutReplicas,
                                       " addresses required (or --rollout_service)"));
  }
  for (const std::string& address : endpoints.rollout) {
    if (address.empty()) return InvalidRequest("INVALID_FLAG", "--rollout: empty address");
  }
  if (endpoints.weight_store.empty()) {
    return InvalidRequest("INVALID_FLAG", "--weight_store is required");
  }
  return absl::OkStatus();
}

absl::Status CheckServiceName(absl::string_view name_port) {
  return SplitServiceName(name_port).status();
}

absl::StatusOr<std::vector<std::string>> RolloutReplicas(const ServiceEndpoints& endpoints) {
  if (endpoints.rollout_service.empty()) return endpoints.rollout;
  auto replicas = ResolveAll(endpoints.rollout_service);
  if (!replicas.ok()) return replicas.status();
  if (replicas->empty()) {
    return absl::UnavailableError(
        absl::StrCat("--rollout_service ", endpoints.rollout_service, ": no replica address"));
  }
  if (replicas->size() > kMaxRolloutReplicas) {
    return absl::FailedPreconditionError(
        absl::StrCat("--rollout_service ", endpoints.rollout_service, " resolves to ",
                     replicas->size(), " addresses; at most ", kMaxRolloutReplicas, " replicas"));
  }
  return replicas;
}

}  // namespace tandem::trainer
