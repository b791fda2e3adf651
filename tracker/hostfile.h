// Host files for the ssh and mpi launchers.
#ifndef PSTRAIN_TRACKER_HOSTFILE_H_
#define PSTRAIN_TRACKER_HOSTFILE_H_

#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain::tracker {

struct Host {
  std::string name;  // as written, what ssh connects to: "host", "10.0.0.2", "user@host"
  int port = 22;     // ssh port
  // The name without a "user@" part: the address the host is known by.
  std::string address() const {
    size_t at = name.rfind('@');
    return at == std::string::npos ? name : name.substr(at + 1);
  }
  // The name with an IPv6 address in brackets ("me@[fd00::12]"), as it is
  // written before a ":port" or a ":path" (rsync).
  std::string bracketed() const {
    const std::string a = address();
    if (a.find(':') == std::string::npos) return name;
    return name.substr(0, name.size() - a.size()) + "[" + a + "]";
  }
};

// One host per line: "name" or "name:port" ("[v6addr]:port" for IPv6; "user@"
// may precede the name). Text
// after '#' is a comment; blank lines are skipped; MPI-style words after the
// host ("slots=4") are ignored. `origin` names the file in errors, which
// carry its line number. An empty list is an error.
StatusOr<std::vector<Host>> ParseHostList(const std::string& text, const std::string& origin);
StatusOr<std::vector<Host>> ReadHostFile(const std::string& path);

// True for localhost, 127.0.0.0/8 and ::1.
bool IsLoopbackHost(const std::string& name);

}  // namespace pstrain::tracker

#endif  // PSTRAIN_TRACKER_HOSTFILE_H_
