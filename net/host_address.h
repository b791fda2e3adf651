// Host names and the address a node advertises to its peers. IPv4 and IPv6:
// an IPv6 address is kept without brackets ("fd00::11"), and bracketed where
// a port follows it (JoinHostPort).
#ifndef PSTRAIN_NET_HOST_ADDRESS_H_
#define PSTRAIN_NET_HOST_ADDRESS_H_

#include <string>

#include "common/status.h"

namespace pstrain {

// Resolves a host name or IP to an address string: "127.0.0.1", or an IPv6
// one ("::1", "fd00::11"; a literal in brackets, "[::1]", too). A name with
// both kinds resolves to its IPv4 address, one with IPv6 addresses only to
// its first IPv6 address; an IPv4-mapped one ("::ffff:10.0.0.1") is its
// IPv4 address. NotFound naming the host when it cannot be resolved.
StatusOr<std::string> ResolveHost(const std::string& host);

// True for an address of the loopback network: 127.0.0.0/8 or ::1.
bool IsLoopbackIp(const std::string& ip);
// "host:port", or "[host]:port" for an IPv6 address: the form of ZeroMQ's
// tcp:// endpoints and of this code's messages.
std::string JoinHostPort(const std::string& host, const std::string& port);
std::string JoinHostPort(const std::string& host, int port);

// The address this node should advertise: `node_host` if set, else the
// address of `interface` if set (of the scheduler's family where it has one
// of each), else the scheduler's loopback address when the scheduler
// (`root_host`) is on loopback, else the first non-loopback address of the
// scheduler's family (IPv6: not a link-local one, which needs a scope), else
// one of the other family, else the loopback address. A link-local scheduler
// address (fe80::...%eth0) is not supported.
StatusOr<std::string> AdvertisedHost(const std::string& node_host, const std::string& interface,
                                     const std::string& root_host);

// Where a node that advertises `advertised` listens by default: that
// address, or every interface ("0.0.0.0", or "::" when the scheduler has an
// IPv6 address) when it resolves here to a loopback address while the
// scheduler (`root_host`) does not (a host name that /etc/hosts maps to
// 127.0.1.1, as Debian's installer writes it, in a job across hosts: the
// others resolve the name to an address they can reach, which a socket bound
// to 127.0.1.1 does not answer). Names that do not resolve are kept (the bind
// then says why).
std::string DefaultBindHost(const std::string& advertised, const std::string& root_host);

}  // namespace pstrain

#endif  // PSTRAIN_NET_HOST_ADDRESS_H_
