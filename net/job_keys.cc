#include "net/job_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace pstrain {
namespace {

constexpr size_t kZ85KeyChars = 40;

bool IsZ85Key(const std::string& s) {
  if (s.size() != kZ85KeyChars) return false;
  uint8_t decoded[32];
  return zmq_z85_decode(decoded, s.c_str()) != nullptr;
}

}  // namespace

StatusOr<JobKeys> GenerateJobKeys() {
  if (!zmq_has("curve")) {
    return Status::Unavailable("this ZeroMQ was built without CURVE security (libsodium)");
  }
  JobKeys k;
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) return Status::Unavailable("zmq_curve_keypair failed");
  k.server_public = pub;
  k.server_secret = sec;
  if (zmq_curve_keypair(pub, sec) != 0) return Status::Unavailable("zmq_curve_keypair failed");
  k.client_public = pub;
  k.client_secret = sec;
  std::memset(sec, 0, sizeof(sec));
  return k;
}

std::string FormatJobKeys(const JobKeys& keys) {
  return StrCat("# pstrain job keys: whoever can read this file can join the job\n",
                "server-public ", keys.server_public, "\nserver-secret ", keys.server_secret,
                "\nclient-public ", keys.client_public, "\nclient-secret ", keys.client_secret,
                "\n");
}

Status WriteJobKeys(const JobKeys& keys, const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return Status::FailedPrecondition(StrCat("key file ", path, " exists; not overwritten"));
    }
    return Status::IOError(StrCat("cannot create key file ", path, ": ", std::strerror(errno)));
  }
  const std::string text = FormatJobKeys(keys);
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = close(fd) == 0;
  if (!ok || !closed) {
    unlink(path.c_str());
    return Status::IOError(StrCat("cannot write key file ", path));
  }
  return Status::Ok();
}

StatusOr<JobKeys> ReadJobKeys(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return Status::IOError(StrCat("key file ", path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Status::InvalidArgument(StrCat("key file ", path, " is readable by others (mode ",
                                          std::oct, st.st_mode & 0777, std::dec,
                                          "): chmod 600 it; whoever reads it can join the job"));
  }
  std::ifstream in(path);
  if (!in) return Status::IOError(StrCat("cannot read key file ", path));
  std::map<std::string, std::string> found;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string name, value, extra;
    words >> name >> value >> extra;
    const bool known = name == "server-public" || name == "server-secret" ||
                       name == "client-public" || name == "client-secret";
    if (!known || !extra.empty() || !IsZ85Key(value)) {
      return Status::InvalidArgument(
          StrCat(path, ":", n, ": expected '<server|client>-<public|secret> <40 Z85 characters>'"));
    }
    found[name] = value;
  }
  for (const char* name : {"server-public", "server-secret", "client-public", "client-secret"}) {
    if (found.count(name) == 0) {
      return Status::InvalidArgument(StrCat("key file ", path, " has no ", name, " line"));
    }
  }
  JobKeys k;
  k.server_public = found["server-public"];
  k.server_secret = found["server-secret"];
  k.client_public = found["client-public"];
  k.client_secret = found["client-secret"];
  return k;
}

}  // namespace pstrain
