#include "net/host_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace pstrain {

StatusOr<std::string> ResolveHost(const std::string& host) {
  if (host.empty()) return Status::InvalidArgument("empty host name");
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::NotFound(StrCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::string(buf);
}

StatusOr<std::string> AdvertisedHost(const std::string& node_host, const std::string& interface,
                                     const std::string& root_host) {
  if (!node_host.empty()) return node_host;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Status::IOError("getifaddrs failed");
  std::string found;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    if (!interface.empty()) {
      if (interface == i->ifa_name) {
        found = buf;
        break;
      }
      continue;
    }
    if ((i->ifa_flags & IFF_LOOPBACK) == 0 && found.empty()) found = buf;
  }
  freeifaddrs(ifs);
  if (!interface.empty() && found.empty()) {
    return Status::NotFound(
        StrCat("DMLC_INTERFACE=", interface, " has no IPv4 address on this host"));
  }
  if (interface.empty()) {
    auto root_ip = ResolveHost(root_host);
    if (root_ip.ok() && root_ip->rfind("127.", 0) == 0) return std::string("127.0.0.1");
    if (found.empty()) return std::string("127.0.0.1");
  }
  return found;
}

std::string DefaultBindHost(const std::string& advertised, const std::string& root_host) {
  auto loopback = [](const std::string& host) {
    StatusOr<std::string> ip = ResolveHost(host);
    return ip.ok() && ip->rfind("127.", 0) == 0;
  };
  return loopback(advertised) && !loopback(root_host) ? "0.0.0.0" : advertised;
}

}  // namespace pstrain
