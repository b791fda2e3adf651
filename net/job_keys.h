// A job's keys for ZeroMQ's CURVE security (RFC 26: Curve25519 key exchange,
// every frame encrypted and authenticated): the keypair every node's
// listening socket presents, and the keypair every node connects with. A
// process that cannot read the job's key file cannot complete a handshake
// with any node of the job, so it can neither send nor read anything.
//
// The file is text, made by `pstrain keygen FILE` or by the launcher for each
// job, and must be readable by its owner only (it is refused otherwise):
//
//   # pstrain job keys: whoever can read this file can join the job
//   server-public <40 Z85 characters>
//   server-secret <...>
//   client-public <...>
//   client-secret <...>
#ifndef PSTRAIN_NET_JOB_KEYS_H_
#define PSTRAIN_NET_JOB_KEYS_H_

#include <string>

#include "common/status.h"

namespace pstrain {

struct JobKeys {
  std::string server_public, server_secret;  // Z85, 40 characters each
  std::string client_public, client_secret;
};

// Fresh keys. Unavailable when ZeroMQ was built without CURVE.
StatusOr<JobKeys> GenerateJobKeys();
// The file's text.
std::string FormatJobKeys(const JobKeys& keys);
// Writes `keys` to a new file `path` (mode 0600). AlreadyExists-style
// FailedPrecondition when it exists; IOError naming the path otherwise.
Status WriteJobKeys(const JobKeys& keys, const std::string& path);
// Reads a key file. InvalidArgument naming the file (and line) when it is
// readable by group or others, malformed, or lacks a key; IOError when it
// cannot be read.
StatusOr<JobKeys> ReadJobKeys(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_NET_JOB_KEYS_H_
