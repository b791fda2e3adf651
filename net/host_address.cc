#include "net/host_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace pstrain {

namespace {

// "[addr]" -> "addr"; anything else as it is.
std::string Unbracketed(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// The numeric form of a socket address ("10.0.0.1", "fd00::11",
// "fe80::1%eth0"); empty if it has none.
std::string NumericHost(const sockaddr* addr, socklen_t len) {
  char buf[NI_MAXHOST] = {0};
  if (getnameinfo(addr, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return buf;
}

bool IsLinkLocal6(const sockaddr* addr) {
  return addr->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
}

}  // namespace

bool IsLoopbackIp(const std::string& ip) {
  if (ip.rfind("127.", 0) == 0) return true;
  in6_addr a6{};
  return inet_pton(AF_INET6, Unbracketed(ip).c_str(), &a6) == 1 &&
         (IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127));
}

std::string JoinHostPort(const std::string& host, const std::string& port) {
  const std::string h = Unbracketed(host);
  return h.find(':') != std::string::npos ? StrCat("[", h, "]:", port) : StrCat(h, ":", port);
}

std::string JoinHostPort(const std::string& host, int port) {
  return JoinHostPort(host, std::to_string(port));
}

StatusOr<std::string> ResolveHost(const std::string& given) {
  const std::string host = Unbracketed(given);
  if (host.empty()) return Status::InvalidArgument("empty host name");
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::NotFound(StrCat("cannot resolve host '", given, "': ", gai_strerror(rc)));
  }
  const addrinfo* pick = nullptr;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
    if (a->ai_family == AF_INET6 && pick == nullptr) pick = a;
  }
  std::string ip;
  if (pick != nullptr && pick->ai_family == AF_INET6 &&
      IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<const sockaddr_in6*>(pick->ai_addr)->sin6_addr)) {
    // "::ffff:10.0.0.1" is the IPv4 address 10.0.0.1.
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in6*>(pick->ai_addr)->sin6_addr.s6_addr[12],
              buf, sizeof(buf));
    ip = buf;
  } else if (pick != nullptr) {
    ip = NumericHost(pick->ai_addr, pick->ai_addrlen);
  }
  freeaddrinfo(res);
  if (ip.empty()) {
    return Status::NotFound(StrCat("host '", given, "' has no IPv4 or IPv6 address"));
  }
  return ip;
}

StatusOr<std::string> AdvertisedHost(const std::string& node_host, const std::string& interface,
                                     const std::string& root_host) {
  if (!node_host.empty()) return node_host;
  const StatusOr<std::string> root_ip = ResolveHost(root_host);
  const bool v6 = root_ip.ok() && root_ip->find(':') != std::string::npos;
  const int family = v6 ? AF_INET6 : AF_INET;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Status::IOError("getifaddrs failed");
  // The first usable address of the scheduler's family, and of the other.
  std::string same, other;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    const sockaddr* a = i->ifa_addr;
    if (a == nullptr || (a->sa_family != AF_INET && a->sa_family != AF_INET6)) continue;
    if (!interface.empty() ? interface != i->ifa_name : (i->ifa_flags & IFF_LOOPBACK) != 0) {
      continue;
    }
    // A link-local IPv6 address needs its interface named to be reached.
    if (IsLinkLocal6(a)) continue;
    std::string* slot = a->sa_family == family ? &same : &other;
    if (slot->empty()) {
      *slot = NumericHost(a, a->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    }
  }
  freeifaddrs(ifs);
  if (!interface.empty()) {
    if (!same.empty()) return same;
    if (!other.empty()) return other;
    return Status::NotFound(StrCat("DMLC_INTERFACE=", interface,
                                   " has no IPv4 or IPv6 address (other than link-local) here"));
  }
  const std::string loopback = v6 ? "::1" : "127.0.0.1";
  if (root_ip.ok() && IsLoopbackIp(*root_ip)) return loopback;
  if (!same.empty()) return same;
  // No address of the scheduler's family: one of the other (where the
  // scheduler's host has both, it is reached so), else loopback as before.
  return !other.empty() ? other : loopback;
}

std::string DefaultBindHost(const std::string& advertised, const std::string& root_host) {
  const StatusOr<std::string> root_ip = ResolveHost(root_host);  // once: it may ask DNS
  const StatusOr<std::string> ip = ResolveHost(advertised);
  if (!ip.ok() || !IsLoopbackIp(*ip) || (root_ip.ok() && IsLoopbackIp(*root_ip))) {
    return advertised;
  }
  return root_ip.ok() && root_ip->find(':') != std::string::npos ? "::" : "0.0.0.0";
}

}  // namespace pstrain
