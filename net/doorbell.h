// Doorbell: how a co-located peer wakes this node's sleeping receive thread.
//
// A message a peer puts on our shared-memory queue (net/shm_queue.h) makes no
// sound: our receive thread sees it only when it looks. Before it sleeps it
// says so in its arena's header (ShmArena::SetSleeping) and polls its doorbell
// next to its ZeroMQ socket; a peer that finds it asleep after queueing writes
// one byte to the doorbell. The doorbell is an abstract Unix datagram socket
// (no file; it goes with the process) whose name the node table carries with
// the arena (ShmInfo.doorbell). Abstract names live in a network namespace, so
// a peer that cannot reach it is told so at once and sends over ZeroMQ
// instead; a node without a doorbell (absent from ShmInfo) is never sent
// messages through its queue.
//
// Threads: Ring is thread-safe (datagram sends are atomic); fd and Drain are
// for the owner's receive thread.
#ifndef PSTRAIN_NET_DOORBELL_H_
#define PSTRAIN_NET_DOORBELL_H_

#include <sys/socket.h>
#include <sys/un.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace pstrain {

// Where a peer's doorbell is (none by default).
class DoorbellAddress {
 public:
  DoorbellAddress() = default;
  // The doorbell named `name` (ShmInfo.doorbell); none when `name` is empty or
  // too long for a socket address.
  static DoorbellAddress Of(const std::string& name);

  bool valid() const { return len_ > 0; }
  // Forgets the address (a doorbell that could not be rung).
  void Clear() { len_ = 0; }

 private:
  friend class Doorbell;
  sockaddr_un addr_{};
  socklen_t len_ = 0;
};

class Doorbell {
 public:
  // Binds the doorbell `name` and opens a socket to ring others' with.
  // IOError (the system's reason) when the doorbell cannot be bound (the name
  // is taken, no sockets left): the node then has none.
  static StatusOr<std::unique_ptr<Doorbell>> Open(const std::string& name);
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  const std::string& name() const { return name_; }
  // Readable (POLLIN) once rung; poll it, then Drain it.
  int fd() const { return in_; }
  // Forgets every ring so far (never blocks).
  void Drain();

  // Whether this node can ring peers' doorbells.
  bool can_ring() const { return out_ >= 0; }
  // Wakes the owner of `to`. Ok also when its socket is full (rings are
  // pending there, so it wakes anyway). Unavailable (the system's reason)
  // when nothing listens at `to` (the peer is gone or in another network
  // namespace) or this node cannot ring. REQUIRES: to.valid().
  Status Ring(const DoorbellAddress& to) const;

 private:
  Doorbell() = default;
  std::string name_;
  int in_ = -1;   // bound to name_
  int out_ = -1;  // unbound, rings others
};

}  // namespace pstrain

#endif  // PSTRAIN_NET_DOORBELL_H_
