#include "net/doorbell.h"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace pstrain {

DoorbellAddress DoorbellAddress::Of(const std::string& name) {
  DoorbellAddress a;
  if (name.empty() || name.size() + 1 >= sizeof(a.addr_.sun_path)) return a;
  // Abstract: sun_path starts with a 0 byte and the name is not 0-terminated.
  a.addr_.sun_family = AF_UNIX;
  std::memcpy(a.addr_.sun_path + 1, name.data(), name.size());
  a.len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

StatusOr<std::unique_ptr<Doorbell>> Doorbell::Open(const std::string& name) {
  const DoorbellAddress at = DoorbellAddress::Of(name);
  if (!at.valid()) {
    return Status::InvalidArgument(StrCat("doorbell name '", name, "' is empty or too long"));
  }
  std::unique_ptr<Doorbell> bell(new Doorbell());
  bell->name_ = name;
  bell->in_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (bell->in_ < 0 ||
      bind(bell->in_, reinterpret_cast<const sockaddr*>(&at.addr_), at.len_) != 0) {
    return Status::IOError(std::strerror(errno));
  }
  bell->out_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  return bell;
}

Doorbell::~Doorbell() {
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
}

void Doorbell::Drain() {
  char buf[256];
  while (recv(in_, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

Status Doorbell::Ring(const DoorbellAddress& to) const {
  if (out_ < 0) return Status::Unavailable("this node has no socket to ring doorbells with");
  const char bell = 1;
  if (sendto(out_, &bell, 1, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to.addr_), to.len_) <
          0 &&
      errno != EAGAIN && errno != EWOULDBLOCK) {
    return Status::Unavailable(std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace pstrain
