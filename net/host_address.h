// Host names and the address a node advertises to its peers.
#ifndef PSTRAIN_NET_HOST_ADDRESS_H_
#define PSTRAIN_NET_HOST_ADDRESS_H_

#include <string>

#include "common/status.h"

namespace pstrain {

// Resolves a host name or IP to an IPv4 address string ("127.0.0.1").
// NotFound naming the host when it cannot be resolved.
StatusOr<std::string> ResolveHost(const std::string& host);
// The address this node should advertise: `node_host` if set, else the IPv4
// address of `interface` if set, else 127.0.0.1 when the scheduler
// (`root_host`) is on loopback, else the first non-loopback IPv4 address.
StatusOr<std::string> AdvertisedHost(const std::string& node_host, const std::string& interface,
                                     const std::string& root_host);

// Where a node that advertises `advertised` listens by default: that
// address, or "0.0.0.0" when it resolves here to a loopback address while
// the scheduler (`root_host`) does not (a host name that /etc/hosts maps to
// 127.0.1.1, as Debian's installer writes it, in a job across hosts: the
// others resolve the name to an address they can reach, which a socket
// bound to 127.0.1.1 does not answer). Names that do not resolve are kept
// (the bind then says why).
std::string DefaultBindHost(const std::string& advertised, const std::string& root_host);

}  // namespace pstrain

#endif  // PSTRAIN_NET_HOST_ADDRESS_H_
